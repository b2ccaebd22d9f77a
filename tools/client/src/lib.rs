//! Rust client for percore's native protocol, for ordinary tokio programs.
//!
//! - **Shard-aware**: the first connection's Hello reply gives the shard
//!   count, the routing hash and seed, and every shard's port; each key
//!   operation goes straight to its owner shard (`percore_protocol::routing`,
//!   the same function the server uses) over a connection kept per shard.
//! - **Pipelined**: any number of requests share a connection; replies are
//!   matched by request id and may arrive in any order.
//! - **Checked**: every chunk of a read carries a CRC32C, verified here;
//!   every PUT sends the object's CRC32C, verified by the server before the
//!   object becomes visible.
//! - **Retries and timeouts**: idempotent requests (reads, Stat, List,
//!   Delete, and PUTs from memory) are retried on connection failures and
//!   `Busy`, with backoff; every request has a deadline.
//!
//! ```no_run
//! # async fn demo() -> Result<(), percore_client::Error> {
//! use percore_client::{Client, Config, Range};
//! let client = Client::connect(Config::new("127.0.0.1:9100", "percore", "percore-secret")).await?;
//! client.create_bucket("data").await.ok();
//! client.put("data", "a", bytes::Bytes::from_static(b"hello world")).await?;
//! let obj = client.get("data", "a", &[Range { offset: 6, length: 5 }]).await?;
//! assert_eq!(&obj.ranges[0].1[..], b"world");
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use percore_protocol::native::{
    self as proto, BatchItem, ChunkHead, FrameHeader, HelloOk, ItemHead, Kind, Reply, Request,
    ServerMessage,
};

mod conn;
mod get;
mod put;

use conn::{Conn, Frame};
pub use percore_protocol::native::{BucketEntry, ListEntry, Range, Status};
use percore_protocol::routing;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach {addr}: {source}; is `percore serve` running there (native port, see its start-up lines)?")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connection to shard {shard} failed: {0}", shard = .1)]
    Io(std::io::Error, usize),
    #[error("no reply within {0:?}; the server may be overloaded or unreachable")]
    Timeout(Duration),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("{} ({status}): {message}", proto::status_name(*.status))]
    Server { status: u16, message: String },
    #[error("chunk at offset {offset} failed its CRC32C (got {got:#010x}, expected {expected:#010x}); bytes were discarded")]
    Checksum {
        offset: u64,
        got: u32,
        expected: u32,
    },
}

impl Error {
    /// The server status, if the server refused the request.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Server { status, .. } => Some(Status(*status)),
            _ => None,
        }
    }

    fn retryable(&self) -> bool {
        match self {
            Error::Io(..) | Error::Connect { .. } | Error::Timeout(_) => true,
            Error::Server { status, .. } => {
                *status == Status::Busy.0 || *status == Status::ShuttingDown.0
            }
            _ => false,
        }
    }

    fn from_reply(r: &Reply) -> Error {
        Error::Server {
            status: r.status,
            message: r.message.clone(),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, Clone)]
pub struct Config {
    /// Any shard's native address; the others are learned from Hello.
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    /// Deadline of one attempt of one request (a large transfer must make
    /// progress within it per frame, not finish within it).
    pub timeout: Duration,
    /// Attempts of an idempotent request.
    pub attempts: u32,
    pub connect_timeout: Duration,
    /// Connect to the shard that owns each key (else everything goes over
    /// the first connection and the server forwards).
    pub shard_aware: bool,
}

impl Config {
    pub fn new(
        endpoint: impl Into<String>,
        access_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> Config {
        Config {
            endpoint: endpoint.into(),
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            timeout: Duration::from_secs(30),
            attempts: 3,
            connect_timeout: Duration::from_secs(5),
            shard_aware: true,
        }
    }
}

/// An object read by `get`: its metadata and the requested ranges' bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub size: u64,
    pub etag: String,
    pub mtime_ms: u64,
    pub content_type: String,
    /// The shard that owns the key.
    pub owner_shard: u32,
    /// (range as served, bytes), in request order.
    pub ranges: Vec<(Range, Bytes)>,
}

/// Metadata of a stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub size: u64,
    pub etag: String,
    pub mtime_ms: u64,
    pub content_type: String,
    pub crc32c: u32,
    pub owner_shard: i32,
}

impl From<Reply> for Stat {
    fn from(r: Reply) -> Stat {
        Stat {
            size: r.size,
            etag: r.etag,
            mtime_ms: r.mtime_ms,
            content_type: r.content_type,
            crc32c: r.crc32c,
            owner_shard: r.owner_shard,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    pub entries: Vec<ListEntry>,
    pub truncated: bool,
    /// Pass as `start_after` for the next page.
    pub next_start_after: String,
}

pub struct Client {
    cfg: Config,
    host: std::net::IpAddr,
    hello: HelloOk,
    conns: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    /// Requests the server answered from a shard other than the owner the
    /// client computed (a routing disagreement; should stay 0).
    pub misrouted: AtomicU64,
}

impl Client {
    pub async fn connect(cfg: Config) -> Result<Client> {
        let addr = resolve(&cfg.endpoint)?;
        let first = Conn::open(addr, &cfg, 0).await?;
        let hello = first.hello.clone();
        if hello.hash_algorithm != routing::HASH_ALGORITHM {
            return Err(Error::Protocol(format!(
                "server routes with '{}', this client with '{}'; upgrade the client",
                hello.hash_algorithm,
                routing::HASH_ALGORITHM
            )));
        }
        let n = hello.shard_count as usize;
        if n == 0 || n > routing::SHARD_COUNT_MAX || hello.shard_ports.len() != n {
            return Err(Error::Protocol(format!(
                "bad shard map: {n} shards, {} ports",
                hello.shard_ports.len()
            )));
        }
        let conns: Vec<_> = (0..n).map(|_| tokio::sync::Mutex::new(None)).collect();
        let first_shard = first.shard;
        *conns[first_shard].lock().await = Some(Arc::new(first));
        Ok(Client {
            cfg,
            host: addr.ip(),
            hello,
            conns,
            misrouted: AtomicU64::new(0),
        })
    }

    pub fn shard_count(&self) -> usize {
        self.hello.shard_count as usize
    }

    pub fn hello(&self) -> &HelloOk {
        &self.hello
    }

    /// The shard owning (bucket, key), as the server computes it.
    pub fn owner(&self, bucket: &str, key: &str) -> usize {
        routing::owner_shard(
            self.hello.hash_seed,
            self.shard_count(),
            bucket.as_bytes(),
            key.as_bytes(),
        )
    }

    fn first_shard(&self) -> usize {
        self.hello.shard_id as usize
    }

    /// The connection to `shard`, opened on first use and reopened after a
    /// failure.
    async fn conn(&self, shard: usize) -> Result<Arc<Conn>> {
        let shard = if self.cfg.shard_aware {
            shard
        } else {
            self.first_shard()
        };
        let mut slot = self.conns[shard].lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr = SocketAddr::new(self.host, self.hello.shard_ports[shard]);
        let c = Arc::new(Conn::open(addr, &self.cfg, shard).await?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs `attempt` up to `attempts` times while it fails retryably.
    async fn retry<T, F, Fut>(&self, idempotent: bool, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut delay = Duration::from_millis(20);
        let mut tries = 0;
        loop {
            tries += 1;
            let r = match tokio::time::timeout(self.cfg.timeout, attempt()).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout(self.cfg.timeout)),
            };
            match r {
                Err(e) if idempotent && e.retryable() && tries < self.cfg.attempts.max(1) => {
                    tokio::time::sleep(delay).await;
                    delay *= 4;
                }
                r => return r,
            }
        }
    }

    /// Sends a single-frame request to `shard` and waits for its Reply.
    async fn simple(&self, shard: usize, req: &Request) -> Result<Reply> {
        let conn = self.conn(shard).await?;
        let (_, mut rx) = conn.start(req, &[], false).await?;
        match rx.recv().await {
            Some(Frame {
                msg: ServerMessage::Reply(r),
                ..
            }) if r.status != Status::Ok.0 => Err(Error::from_reply(&r)),
            Some(Frame {
                msg: ServerMessage::Reply(r),
                ..
            }) => Ok(r),
            Some(other) => Err(Error::Protocol(format!("unexpected frame {:?}", other.msg))),
            None => Err(Error::Io(
                std::io::ErrorKind::ConnectionReset.into(),
                conn.shard,
            )),
        }
    }

    fn note_owner(&self, computed: usize, reported: i64) {
        if reported >= 0 && reported as usize != computed && self.cfg.shard_aware {
            self.misrouted.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub async fn create_bucket(&self, bucket: &str) -> Result<()> {
        let req = Request::CreateBucket {
            bucket: bucket.to_string(),
        };
        self.simple(self.first_shard(), &req).await.map(|_| ())
    }

    pub async fn list_buckets(&self) -> Result<Vec<BucketEntry>> {
        self.retry(true, || async {
            Ok(self
                .simple(self.first_shard(), &Request::ListBuckets)
                .await?
                .buckets)
        })
        .await
    }

    pub async fn stat(&self, bucket: &str, key: &str) -> Result<Stat> {
        let owner = self.owner(bucket, key);
        let req = Request::Stat {
            bucket: bucket.into(),
            key: key.into(),
        };
        let r = self.retry(true, || self.simple(owner, &req)).await?;
        self.note_owner(owner, r.owner_shard.into());
        Ok(Stat::from(r))
    }

    /// Deletes `key`; returns whether it existed.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<bool> {
        let owner = self.owner(bucket, key);
        let req = Request::Delete {
            bucket: bucket.into(),
            key: key.into(),
        };
        let r = self.retry(true, || self.simple(owner, &req)).await?;
        Ok(r.existed)
    }

    /// One page of keys (and common prefixes, with a delimiter).
    pub async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: &str,
        delimiter: &str,
        limit: u32,
    ) -> Result<ListPage> {
        let req = Request::List(proto::ListRequest {
            bucket: bucket.into(),
            prefix: prefix.into(),
            start_after: start_after.into(),
            delimiter: delimiter.into(),
            limit,
        });
        let r = self
            .retry(true, || self.simple(self.first_shard(), &req))
            .await?;
        Ok(ListPage {
            entries: r.entries,
            truncated: r.truncated,
            next_start_after: r.next_start_after,
        })
    }
}

fn resolve(endpoint: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    endpoint
        .to_socket_addrs()
        .map_err(|e| {
            Error::Protocol(format!(
                "cannot resolve '{endpoint}': {e} (expected host:port, e.g. 127.0.0.1:9100)"
            ))
        })?
        .next()
        .ok_or_else(|| Error::Protocol(format!("'{endpoint}' resolves to no address")))
}
