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

/// A frame from the server, payload included.
#[derive(Debug)]
struct Frame {
    msg: ServerMessage,
    payload: Bytes,
}

type Pending = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Frame>>>>;

/// One authenticated connection to one shard.
struct Conn {
    shard: usize,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
    hello: HelloOk,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn read_frame(rd: &mut OwnedReadHalf) -> std::io::Result<(FrameHeader, Vec<u8>, Bytes)> {
    let mut h = [0u8; proto::FRAME_HEADER_BYTES];
    rd.read_exact(&mut h).await?;
    let fh = FrameHeader::decode(&h)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut header = vec![0u8; fh.header_len as usize];
    rd.read_exact(&mut header).await?;
    let mut payload = BytesMut::zeroed(fh.payload_len as usize);
    rd.read_exact(&mut payload).await?;
    Ok((fh, header, payload.freeze()))
}

fn decode(fh: &FrameHeader, header: &[u8]) -> std::io::Result<ServerMessage> {
    proto::decode_server(fh.kind, header)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.0))
}

impl Conn {
    // Connect, challenge, hello, check the server's proof: the handshake
    // is one sequence and reads best whole.
    #[allow(clippy::too_many_lines)]
    async fn open(addr: SocketAddr, cfg: &Config, shard_hint: usize) -> Result<Conn> {
        let stream = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Connect {
                addr,
                source: std::io::ErrorKind::TimedOut.into(),
            })?
            .map_err(|source| Error::Connect { addr, source })?;
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let io = |e: std::io::Error| Error::Io(e, shard_hint);
        let hello = async {
            let (fh, header, _) = read_frame(&mut rd).await.map_err(io)?;
            let challenge = match decode(&fh, &header).map_err(io)? {
                ServerMessage::Challenge(c) => c,
                ServerMessage::Reply(r) => return Err(Error::from_reply(&r)),
                other => {
                    return Err(Error::Protocol(format!(
                        "expected Challenge, got {other:?}"
                    )))
                }
            };
            if !challenge.versions.contains(&proto::VERSION) {
                return Err(Error::Protocol(format!(
                    "server speaks protocol versions {:?}, this client {}; upgrade one of them",
                    challenge.versions,
                    proto::VERSION
                )));
            }
            let client_nonce: [u8; proto::NONCE_BYTES] = rand::random();
            let mac = proto::client_mac(
                &cfg.secret_key,
                &cfg.access_key,
                &challenge.server_nonce,
                &client_nonce,
            );
            let req = Request::Hello(proto::Hello {
                version: proto::VERSION,
                access_key: cfg.access_key.clone(),
                client_nonce: client_nonce.to_vec(),
                mac: mac.to_vec(),
                client_name: format!("percore-client/{}", env!("CARGO_PKG_VERSION")),
            });
            let header = req.encode();
            wr.write_all(&proto::frame(Kind::Hello, 1, false, &header, 0))
                .await
                .map_err(io)?;
            let (fh, header, _) = read_frame(&mut rd).await.map_err(io)?;
            match decode(&fh, &header).map_err(io)? {
                ServerMessage::HelloOk(ok) => {
                    let proof = proto::server_proof(
                        &cfg.secret_key,
                        &challenge.server_nonce,
                        &client_nonce,
                    );
                    if !proto::mac_equal(&ok.server_proof, &proof) {
                        return Err(Error::Protocol(
                            "the server could not prove it holds the secret key; wrong server?"
                                .into(),
                        ));
                    }
                    Ok(ok)
                }
                ServerMessage::Reply(r) => Err(Error::from_reply(&r)),
                other => Err(Error::Protocol(format!("expected HelloOk, got {other:?}"))),
            }
        };
        let hello = tokio::time::timeout(cfg.timeout, hello)
            .await
            .map_err(|_| Error::Timeout(cfg.timeout))??;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let reader = {
            let (pending, closed) = (pending.clone(), closed.clone());
            tokio::spawn(async move {
                loop {
                    let (fh, header, payload) = match read_frame(&mut rd).await {
                        Ok(x) => x,
                        Err(_) => break,
                    };
                    let Ok(msg) = decode(&fh, &header) else { break };
                    let mut p = pending.lock().expect("pending lock");
                    let tx = if fh.more() {
                        p.get(&fh.request_id).cloned()
                    } else {
                        p.remove(&fh.request_id)
                    };
                    drop(p);
                    if let Some(tx) = tx {
                        let _ = tx.send(Frame { msg, payload });
                    }
                }
                closed.store(true, Ordering::SeqCst);
                // Waiters see their channel close: a connection error.
                pending.lock().expect("pending lock").clear();
            })
        };
        Ok(Conn {
            shard: hello.shard_id as usize,
            writer: tokio::sync::Mutex::new(wr),
            pending,
            next_id: AtomicU64::new(2),
            closed,
            hello,
            reader,
        })
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Registers a request id and sends its first frame.
    async fn start(
        &self,
        req: &Request,
        payload: &[u8],
        more: bool,
    ) -> Result<(u64, mpsc::UnboundedReceiver<Frame>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        if let Err(e) = self
            .send(req.kind(), id, &req.encode(), payload, more)
            .await
        {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(e);
        }
        Ok((id, rx))
    }

    async fn send(
        &self,
        kind: Kind,
        id: u64,
        header: &[u8],
        payload: &[u8],
        more: bool,
    ) -> Result<()> {
        let mut frame = proto::frame(kind, id, more, header, payload.len());
        let mut w = self.writer.lock().await;
        let r = if payload.len() <= 64 * 1024 {
            frame.extend_from_slice(payload);
            w.write_all(&frame).await
        } else {
            match w.write_all(&frame).await {
                Ok(()) => w.write_all(payload).await,
                Err(e) => Err(e),
            }
        };
        r.map_err(|e| Error::Io(e, self.shard))
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

    /// Stores `data` as `key` (retried on connection failures: the bytes
    /// are in memory).
    pub async fn put(&self, bucket: &str, key: &str, data: Bytes) -> Result<Stat> {
        self.put_with(bucket, key, data, "").await
    }

    pub async fn put_with(
        &self,
        bucket: &str,
        key: &str,
        data: Bytes,
        content_type: &str,
    ) -> Result<Stat> {
        let crc = proto::crc32c(&data);
        self.retry(true, || {
            let data = data.clone();
            async move {
                let mut src: &[u8] = &data;
                self.put_stream_inner(
                    bucket,
                    key,
                    data.len() as u64,
                    content_type,
                    &mut src,
                    Some(crc),
                    &mut |_| {},
                )
                .await
            }
        })
        .await
    }

    /// Streams `size` bytes from `reader` as `key`, computing the CRC32C on
    /// the way (sent in the last frame). `progress` gets bytes sent so far.
    /// Not retried: the reader cannot be rewound.
    pub async fn put_stream<R: AsyncRead + Unpin + Send>(
        &self,
        bucket: &str,
        key: &str,
        size: u64,
        content_type: &str,
        reader: &mut R,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Stat> {
        self.put_stream_inner(bucket, key, size, content_type, reader, None, progress)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn put_stream_inner<R: AsyncRead + Unpin + Send>(
        &self,
        bucket: &str,
        key: &str,
        size: u64,
        content_type: &str,
        reader: &mut R,
        crc_known: Option<u32>,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Stat> {
        let owner = self.owner(bucket, key);
        let conn = self.conn(owner).await?;
        let frame_max = (self.hello.frame_payload_max.min(proto::PAYLOAD_BYTES_MAX) as usize)
            .clamp(64 * 1024, 1 << 20);
        let mut buf = vec![0u8; frame_max];
        let first = fill(reader, &mut buf[..(size.min(frame_max as u64) as usize)])
            .await
            .map_err(|e| Error::Io(e, owner))?;
        let mut crc = proto::crc32c(&buf[..first]);
        let mut sent = first as u64;
        let req = Request::Put(proto::PutRequest {
            bucket: bucket.into(),
            key: key.into(),
            size,
            content_type: content_type.into(),
            crc32c: crc_known,
        });
        let last_in_put = sent >= size;
        if last_in_put && crc_known.is_none() {
            // Small object: the CRC is known now; send it in Put.
            return self
                .put_small(conn, bucket, key, size, content_type, &buf[..first])
                .await;
        }
        let (id, mut rx) = conn.start(&req, &buf[..first], !last_in_put).await?;
        progress(sent);
        while sent < size {
            // An early Reply (an error) stops the upload.
            if let Ok(f) = rx.try_recv() {
                return finish_put(f, owner, self);
            }
            let want = ((size - sent) as usize).min(frame_max);
            let n = fill(reader, &mut buf[..want])
                .await
                .map_err(|e| Error::Io(e, owner))?;
            if n == 0 {
                return Err(Error::Protocol(format!(
                    "the source ended after {sent} of {size} bytes"
                )));
            }
            crc = proto::crc32c_append(crc, &buf[..n]);
            sent += n as u64;
            let last = sent >= size;
            let header = if last && crc_known.is_none() {
                Request::PutData { crc32c: Some(crc) }.encode()
            } else {
                Vec::new()
            };
            conn.send(Kind::PutData, id, &header, &buf[..n], !last)
                .await?;
            progress(sent);
        }
        match rx.recv().await {
            Some(f) => finish_put(f, owner, self),
            None => Err(Error::Io(std::io::ErrorKind::ConnectionReset.into(), owner)),
        }
    }

    async fn put_small(
        &self,
        conn: Arc<Conn>,
        bucket: &str,
        key: &str,
        size: u64,
        content_type: &str,
        data: &[u8],
    ) -> Result<Stat> {
        let req = Request::Put(proto::PutRequest {
            bucket: bucket.into(),
            key: key.into(),
            size,
            content_type: content_type.into(),
            crc32c: Some(proto::crc32c(data)),
        });
        let (_, mut rx) = conn.start(&req, data, false).await?;
        match rx.recv().await {
            Some(f) => finish_put(f, conn.shard, self),
            None => Err(Error::Io(
                std::io::ErrorKind::ConnectionReset.into(),
                conn.shard,
            )),
        }
    }

    /// Reads `ranges` of `key` (none: the whole object) into memory.
    pub async fn get(&self, bucket: &str, key: &str, ranges: &[Range]) -> Result<Object> {
        let item = BatchItem {
            key: key.into(),
            ranges: ranges.to_vec(),
        };
        let owner = self.owner(bucket, key);
        let req = Request::Get {
            bucket: bucket.into(),
            item,
        };
        let mut out = self.retry(true, || self.fetch(owner, &req, 1)).await?;
        let obj = out.pop().expect("one item")?;
        self.note_owner(owner, obj.owner_shard.into());
        Ok(obj)
    }

    /// Reads many objects (each with optional ranges) in one request per
    /// owner shard, all shards in parallel. Results in input order; a
    /// missing key fails only its own item.
    pub async fn get_batch(
        &self,
        bucket: &str,
        items: &[(String, Vec<Range>)],
    ) -> Result<Vec<Result<Object>>> {
        let n = self.shard_count();
        let max = (self.hello.batch_items_max.max(1) as usize).min(proto::BATCH_ITEMS_MAX as usize);
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, (key, _)) in items.iter().enumerate() {
            let s = if self.cfg.shard_aware {
                self.owner(bucket, key)
            } else {
                self.first_shard()
            };
            groups[s].push(i);
        }
        let mut calls = Vec::new();
        for (shard, idx) in groups.iter().enumerate() {
            for part in idx.chunks(max) {
                let req = Request::BatchGet {
                    bucket: bucket.into(),
                    items: part
                        .iter()
                        .map(|&i| BatchItem {
                            key: items[i].0.clone(),
                            ranges: items[i].1.clone(),
                        })
                        .collect(),
                };
                let count = part.len();
                calls.push(async move {
                    let r = self.retry(true, || self.fetch(shard, &req, count)).await;
                    (part, r)
                });
            }
        }
        let mut out: Vec<Option<Result<Object>>> = (0..items.len()).map(|_| None).collect();
        for (part, r) in futures::future::join_all(calls).await {
            let results = r?;
            for (&i, res) in part.iter().zip(results) {
                out[i] = Some(res);
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every item answered"))
            .collect())
    }

    /// One Get/BatchGet round: collects ItemHead and Chunk frames.
    async fn fetch(
        &self,
        shard: usize,
        req: &Request,
        count: usize,
    ) -> Result<Vec<Result<Object>>> {
        let conn = self.conn(shard).await?;
        let (_, mut rx) = conn.start(req, &[], false).await?;
        let mut items: Vec<Option<Result<Object>>> = (0..count).map(|_| None).collect();
        // Bytes still expected per (item, range).
        let mut filled: Vec<Vec<BytesMut>> = (0..count).map(|_| Vec::new()).collect();
        loop {
            let Some(Frame { msg, payload }) = rx.recv().await else {
                return Err(Error::Io(
                    std::io::ErrorKind::ConnectionReset.into(),
                    conn.shard,
                ));
            };
            match msg {
                ServerMessage::ItemHead(h) => {
                    let i = h.item as usize;
                    if i >= count || items[i].is_some() {
                        return Err(Error::Protocol(format!("unexpected item {i}")));
                    }
                    items[i] = Some(item_of(&h));
                    filled[i] = h
                        .ranges
                        .iter()
                        .map(|r| BytesMut::with_capacity(r.length.min(1 << 30) as usize))
                        .collect();
                }
                ServerMessage::Chunk(c) => chunk_into(&c, &payload, &items, &mut filled)?,
                ServerMessage::Reply(r) => {
                    if r.status != Status::Ok.0 {
                        return Err(Error::from_reply(&r));
                    }
                    let mut out = Vec::with_capacity(count);
                    for (i, it) in items.into_iter().enumerate() {
                        let mut it =
                            it.ok_or_else(|| Error::Protocol(format!("item {i} not answered")))?;
                        if let Ok(obj) = &mut it {
                            for (slot, data) in obj.ranges.iter_mut().zip(filled[i].drain(..)) {
                                if data.len() as u64 != slot.0.length {
                                    return Err(Error::Protocol(format!(
                                        "item {i}: {} of {} bytes",
                                        data.len(),
                                        slot.0.length
                                    )));
                                }
                                slot.1 = data.freeze();
                            }
                        }
                        out.push(it);
                    }
                    return Ok(out);
                }
                other => return Err(Error::Protocol(format!("unexpected frame {other:?}"))),
            }
        }
    }

    /// Streams one range of `key` (None: the whole object) chunk by chunk,
    /// for objects too large for memory: `sink` gets each verified chunk in
    /// order. Returns the object's metadata.
    pub async fn get_stream<F>(
        &self,
        bucket: &str,
        key: &str,
        range: Option<Range>,
        mut sink: F,
    ) -> Result<Object>
    where
        F: FnMut(u64, &[u8]) -> std::io::Result<()>,
    {
        let owner = self.owner(bucket, key);
        let conn = self.conn(owner).await?;
        let req = Request::Get {
            bucket: bucket.into(),
            item: BatchItem {
                key: key.into(),
                ranges: range.into_iter().collect(),
            },
        };
        let (_, mut rx) = conn.start(&req, &[], false).await?;
        let mut obj: Option<Object> = None;
        let mut next = 0u64;
        loop {
            let frame = tokio::time::timeout(self.cfg.timeout, rx.recv())
                .await
                .map_err(|_| Error::Timeout(self.cfg.timeout))?;
            let Some(Frame { msg, payload }) = frame else {
                return Err(Error::Io(
                    std::io::ErrorKind::ConnectionReset.into(),
                    conn.shard,
                ));
            };
            match msg {
                ServerMessage::ItemHead(h) => {
                    let o = item_of(&h)?;
                    next = o.ranges.first().map_or(0, |r| r.0.offset);
                    obj = Some(o);
                }
                ServerMessage::Chunk(c) => {
                    let got = proto::crc32c(&payload);
                    if got != c.crc32c {
                        return Err(Error::Checksum {
                            offset: c.offset,
                            got,
                            expected: c.crc32c,
                        });
                    }
                    if c.offset != next {
                        return Err(Error::Protocol(format!(
                            "chunk at {} where {next} was expected",
                            c.offset
                        )));
                    }
                    sink(c.offset, &payload).map_err(|e| Error::Io(e, conn.shard))?;
                    next += payload.len() as u64;
                }
                ServerMessage::Reply(r) => {
                    if r.status != Status::Ok.0 {
                        return Err(Error::from_reply(&r));
                    }
                    let o = obj.ok_or_else(|| Error::Protocol("no ItemHead".into()))?;
                    let end = o.ranges.first().map_or(0, |r| r.0.offset + r.0.length);
                    if next != end {
                        return Err(Error::Protocol(format!(
                            "stream ended at {next}, expected {end}"
                        )));
                    }
                    return Ok(o);
                }
                other => return Err(Error::Protocol(format!("unexpected frame {other:?}"))),
            }
        }
    }
}

fn finish_put(f: Frame, owner: usize, client: &Client) -> Result<Stat> {
    match f.msg {
        ServerMessage::Reply(r) => {
            if r.status != Status::Ok.0 {
                return Err(Error::from_reply(&r));
            }
            client.note_owner(owner, r.owner_shard.into());
            Ok(Stat::from(r))
        }
        other => Err(Error::Protocol(format!("unexpected frame {other:?}"))),
    }
}

fn item_of(h: &ItemHead) -> Result<Object> {
    if h.status != Status::Ok.0 {
        return Err(Error::Server {
            status: h.status,
            message: h.message.clone(),
        });
    }
    Ok(Object {
        size: h.size,
        etag: h.etag.clone(),
        mtime_ms: h.mtime_ms,
        content_type: h.content_type.clone(),
        owner_shard: h.owner_shard,
        ranges: h.ranges.iter().map(|r| (*r, Bytes::new())).collect(),
    })
}

fn chunk_into(
    c: &ChunkHead,
    payload: &Bytes,
    items: &[Option<Result<Object>>],
    filled: &mut [Vec<BytesMut>],
) -> Result<()> {
    let got = proto::crc32c(payload);
    if got != c.crc32c {
        return Err(Error::Checksum {
            offset: c.offset,
            got,
            expected: c.crc32c,
        });
    }
    let (i, r) = (c.item as usize, c.range as usize);
    let Some(Some(Ok(obj))) = items.get(i) else {
        return Err(Error::Protocol(format!("chunk for unknown item {i}")));
    };
    let Some((range, _)) = obj.ranges.get(r) else {
        return Err(Error::Protocol(format!(
            "chunk for unknown range {r} of item {i}"
        )));
    };
    let buf = &mut filled[i][r];
    if c.offset != range.offset + buf.len() as u64
        || buf.len() as u64 + payload.len() as u64 > range.length
    {
        return Err(Error::Protocol(format!(
            "chunk at {} does not continue range {r} of item {i}",
            c.offset
        )));
    }
    buf.extend_from_slice(payload);
    Ok(())
}

async fn fill<R: AsyncRead + Unpin + Send>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        let n = r.read(&mut buf[at..]).await?;
        if n == 0 {
            break;
        }
        at += n;
    }
    Ok(at)
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
