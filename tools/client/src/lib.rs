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
//!   `Busy`, with backoff (`Busy` for up to `Config::busy_for`: a cluster
//!   answers it while a placement group changes hands); every request has
//!   a deadline.
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
mod routes;

use conn::{Conn, Frame};
pub use percore_protocol::cluster_map::{ClientMap, ClientNode};
pub use percore_protocol::native::{BucketEntry, ListEntry, Range, Status};
use percore_protocol::routing;
use routes::Routes;
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
    /// How long an idempotent request answered `Busy` is tried again past
    /// `attempts` (backoff up to `BUSY_BACKOFF_MAX`): a cluster node
    /// answers Busy while it takes a placement group over from a node that
    /// may still serve it, or while it cannot confirm its lease with etcd,
    /// for up to about a lease time after a node fails. Zero: `attempts`
    /// only.
    pub busy_for: Duration,
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
            busy_for: Duration::from_secs(15),
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
    /// The first connection's Hello (limits; the node's own shard map).
    hello: HelloOk,
    /// Where keys go; replaced whole when a cluster map is fetched again.
    routes: std::sync::RwLock<Arc<Routes>>,
    /// One map fetch at a time.
    refreshing: tokio::sync::Mutex<()>,
    /// Requests the server answered from a shard other than the owner the
    /// client computed (a routing disagreement; should stay 0).
    pub misrouted: AtomicU64,
    /// Cluster maps fetched after a WrongNode reply.
    pub map_refreshes: AtomicU64,
}

/// WrongNode answers one request rides out (fetching the map after each)
/// before it fails: a map change reaches every node within a third of the
/// lease, so the last attempt is a few seconds after the first.
const WRONG_NODE_ATTEMPTS: u32 = 8;

impl Client {
    /// Connects to one node. A cluster node (its Hello says so) also
    /// gives its map: the client then sends each key to its placement
    /// group's primary, wherever that is, and fetches the map again when
    /// a node answers WrongNode.
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
        let first = Arc::new(first);
        let routes = if hello.pg_count == 0 {
            let r = Routes::node(addr.ip(), &hello);
            let first_shard = first.shard;
            *r.conns[first_shard].lock().await = Some(first);
            r
        } else {
            let map = fetch_map(&first, &cfg).await?;
            let r = Routes::cluster(map, None)?;
            // Keep the first connection where the map puts it.
            if let Some(i) = r.slots.iter().position(|s| s.addr == addr) {
                *r.conns[i].lock().await = Some(first);
            }
            r
        };
        Ok(Client {
            cfg,
            hello,
            routes: std::sync::RwLock::new(Arc::new(routes)),
            refreshing: tokio::sync::Mutex::new(()),
            misrouted: AtomicU64::new(0),
            map_refreshes: AtomicU64::new(0),
        })
    }

    /// Shards of the node first connected to.
    pub fn shard_count(&self) -> usize {
        self.hello.shard_count as usize
    }

    pub fn hello(&self) -> &HelloOk {
        &self.hello
    }

    /// The cluster map in use (None: a single node).
    pub fn cluster_map(&self) -> Option<ClientMap> {
        self.routes().cluster_ref().map(|c| c.map.clone())
    }

    /// The shard owning (bucket, key) on its node, as the server computes
    /// it.
    pub fn owner(&self, bucket: &str, key: &str) -> usize {
        let r = self.routes();
        r.slot_of(bucket, key).map_or(0, |s| r.slots[s].shard)
    }

    /// The name of the node that owns (bucket, key) on a cluster (its
    /// placement group's primary).
    pub fn owner_node(&self, bucket: &str, key: &str) -> Option<String> {
        let r = self.routes();
        let c = r.cluster_ref()?;
        c.primary_of(bucket, key)
            .map(|i| c.map.nodes[i].name.clone())
    }

    pub(crate) fn routes(&self) -> Arc<Routes> {
        self.routes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The slot a key request goes to (not shard-aware: the node's first
    /// connection, whose shard forwards it).
    pub(crate) fn slot(&self, r: &Routes, bucket: &str, key: &str) -> usize {
        let owner = r.slot_of(bucket, key).unwrap_or(0);
        if self.cfg.shard_aware {
            return owner;
        }
        match r.cluster_ref() {
            None => r.first(),
            Some(_) => owner - r.slots[owner].shard,
        }
    }

    /// The connection to `slot` of `r`, opened on first use and reopened
    /// after a failure.
    async fn conn(&self, r: &Routes, slot: usize) -> Result<Arc<Conn>> {
        let mut held = r.conns[slot].lock().await;
        if let Some(c) = held.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let s = &r.slots[slot];
        let c = Arc::new(Conn::open(s.addr, &self.cfg, s.shard).await?);
        *held = Some(c.clone());
        Ok(c)
    }

    /// Fetches the cluster map again (from the nodes of the current map,
    /// up ones first) and routes by it if it is not older. A refresh that
    /// another request finished meanwhile is not repeated.
    pub async fn refresh_map(&self) -> Result<()> {
        let before = self.routes();
        let _one = self.refreshing.lock().await;
        let now = self.routes();
        let Some(c) = now.cluster_ref() else {
            return Ok(());
        };
        if !Arc::ptr_eq(&before, &now) {
            return Ok(());
        }
        self.map_refreshes.fetch_add(1, Ordering::Relaxed);
        let mut order = c.up_nodes();
        let rest: Vec<usize> = (0..c.map.nodes.len())
            .filter(|i| !order.contains(i))
            .collect();
        order.extend(rest);
        let mut last = Error::Protocol("the cluster map lists no node".into());
        for node in order {
            let slot = c.base[node];
            let got = match self.conn(&now, slot).await {
                Ok(conn) => fetch_map(&conn, &self.cfg).await,
                Err(e) => Err(e),
            };
            match got {
                Ok(map) if map.epoch >= now.epoch => {
                    let routes = Routes::cluster(map, Some(&now))?;
                    *self
                        .routes
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(routes);
                    return Ok(());
                }
                // A node that lags behind: ask another.
                Ok(_) => {}
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Runs `attempt` up to `attempts` times while it fails retryably;
    /// a WrongNode answer fetches the map and tries again (the request
    /// was refused before anything was done).
    async fn retry<T, F, Fut>(&self, idempotent: bool, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.retry_with(idempotent, true, attempt).await
    }

    /// `retry`; with `follow_map` false a WrongNode answer is returned at
    /// once (the caller regroups its keys by the new map).
    async fn retry_with<T, F, Fut>(
        &self,
        idempotent: bool,
        follow_map: bool,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut delay = Duration::from_millis(20);
        let mut tries = 0;
        let mut wrong_node = 0;
        let started = tokio::time::Instant::now();
        loop {
            tries += 1;
            let r = match tokio::time::timeout(self.cfg.timeout, attempt()).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout(self.cfg.timeout)),
            };
            match r {
                Err(e) if follow_map && e.status() == Some(Status::WrongNode) => {
                    wrong_node += 1;
                    if wrong_node >= WRONG_NODE_ATTEMPTS {
                        return Err(e);
                    }
                    self.follow_map(wrong_node).await;
                    tries -= 1;
                }
                Err(e) if idempotent && e.retryable() && tries < self.cfg.attempts.max(1) => {
                    tokio::time::sleep(jittered(delay)).await;
                    delay = (delay * 4).min(BUSY_BACKOFF_MAX);
                }
                Err(e)
                    if idempotent
                        && e.status() == Some(Status::Busy)
                        && started.elapsed() + delay < self.cfg.busy_for =>
                {
                    tokio::time::sleep(jittered(delay)).await;
                    delay = (delay * 4).min(BUSY_BACKOFF_MAX);
                }
                r => return r,
            }
        }
    }

    /// After the `n`th WrongNode answer to one request: fetches the map;
    /// from the second on (or when the fetch failed) also waits a little,
    /// since the nodes' maps disagree for a moment after a change (one has
    /// not read it yet).
    pub(crate) async fn follow_map(&self, n: u32) {
        if self.refresh_map().await.is_err() || n > 1 {
            tokio::time::sleep(Duration::from_millis(50 << n.min(5))).await;
        }
    }

    /// Sends a single-frame request to `slot` of `r` and waits for its
    /// Reply.
    async fn simple(&self, r: &Routes, slot: usize, req: &Request) -> Result<Reply> {
        let conn = self.conn(r, slot).await?;
        simple_on(&conn, req).await
    }

    fn note_owner(&self, computed: usize, reported: i64) {
        if reported >= 0 && reported as usize != computed && self.cfg.shard_aware {
            self.misrouted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Creates `bucket` (BucketExists if it exists). On a cluster, through
    /// one node that is up: buckets are cluster-wide (the node records the
    /// bucket in the cluster's catalog and every up node applies it before
    /// it answers).
    pub async fn create_bucket(&self, bucket: &str) -> Result<()> {
        let req = Request::CreateBucket {
            bucket: bucket.to_string(),
        };
        let r = self.routes();
        let slot = match r.cluster_ref() {
            None => r.first(),
            Some(c) => {
                let Some(&n) = c.up_nodes().first() else {
                    return Err(Error::Protocol(
                        "the cluster map has no node up to create the bucket on".into(),
                    ));
                };
                c.base[n]
            }
        };
        self.simple(&r, slot, &req).await.map(|_| ())
    }

    pub async fn list_buckets(&self) -> Result<Vec<BucketEntry>> {
        self.retry(true, || async {
            let r = self.routes();
            let slot = match r.cluster_ref() {
                None => r.first(),
                Some(c) => c.up_nodes().first().map_or(0, |&n| c.base[n]),
            };
            Ok(self.simple(&r, slot, &Request::ListBuckets).await?.buckets)
        })
        .await
    }

    pub async fn stat(&self, bucket: &str, key: &str) -> Result<Stat> {
        let req = Request::Stat {
            bucket: bucket.into(),
            key: key.into(),
        };
        let r = self
            .retry(true, || async {
                let r = self.routes();
                self.simple(&r, self.slot(&r, bucket, key), &req).await
            })
            .await?;
        self.note_owner(self.owner(bucket, key), r.owner_shard.into());
        Ok(Stat::from(r))
    }

    /// Deletes `key`; returns whether it existed.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<bool> {
        let req = Request::Delete {
            bucket: bucket.into(),
            key: key.into(),
        };
        let r = self
            .retry(true, || async {
                let r = self.routes();
                self.simple(&r, self.slot(&r, bucket, key), &req).await
            })
            .await?;
        Ok(r.existed)
    }

    /// One page of keys (and common prefixes, with a delimiter). On a
    /// cluster, the pages of every node that may hold keys, merged.
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
        self.retry(true, || async {
            let r = self.routes();
            let Some(c) = r.cluster_ref() else {
                let reply = self.simple(&r, r.first(), &req).await?;
                return Ok(ListPage {
                    entries: reply.entries,
                    truncated: reply.truncated,
                    next_start_after: reply.next_start_after,
                });
            };
            let calls = c
                .listing_nodes()
                .into_iter()
                .map(|n| self.simple(&r, c.base[n], &req));
            let mut pages = Vec::new();
            for got in futures::future::join_all(calls).await {
                let reply = got?;
                pages.push(ListPage {
                    entries: reply.entries,
                    truncated: reply.truncated,
                    next_start_after: reply.next_start_after,
                });
            }
            Ok(merge_pages(pages, limit))
        })
        .await
    }
}

/// One node's pages of the same listing merged into one page of at most
/// `limit` (0: the server's default of 1000) entries. A node whose page
/// was truncated has not shown what follows its last entry, so the merged
/// page ends there at the latest; equal common prefixes from several nodes
/// are one entry.
pub(crate) fn merge_pages(pages: Vec<ListPage>, limit: u32) -> ListPage {
    let limit = match limit {
        0 => 1000,
        n => n.min(proto::LIST_LIMIT_MAX),
    } as usize;
    // Where a cut page stopped: its next_start_after (a node may leave out
    // keys it holds but does not own, so its last entry can be earlier).
    let cutoff: Option<String> = pages
        .iter()
        .filter(|p| p.truncated)
        .filter_map(|p| {
            Some(p.next_start_after.clone())
                .filter(|n| !n.is_empty())
                .or_else(|| p.entries.last().map(|e| e.key.clone()))
        })
        .min();
    let mut all: Vec<ListEntry> = pages.into_iter().flat_map(|p| p.entries).collect();
    all.sort_by(|a, b| a.key.cmp(&b.key));
    all.dedup_by(|a, b| a.key == b.key);
    if let Some(cut) = &cutoff {
        all.retain(|e| e.key <= *cut);
    }
    let over = all.len() > limit;
    all.truncate(limit);
    // Cut for the page size: after its last entry; cut where a node's
    // page stopped: there (every node has shown everything up to it).
    let next_start_after = match (&cutoff, over) {
        (_, true) => all.last().map(|e| e.key.clone()).unwrap_or_default(),
        (Some(cut), false) => cut.clone(),
        (None, false) => String::new(),
    };
    let truncated = over || cutoff.is_some();
    ListPage {
        entries: all,
        truncated,
        next_start_after,
    }
}

/// Sends a single-frame request on `conn` and waits for its Reply.
async fn simple_on(conn: &Conn, req: &Request) -> Result<Reply> {
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

/// The longest wait between two tries of a request answered Busy.
pub const BUSY_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// The map of the cluster node at the end of `conn` (retrying Busy: a node
/// that just started may not have read it yet).
async fn fetch_map(conn: &Conn, cfg: &Config) -> Result<ClientMap> {
    let mut delay = Duration::from_millis(20);
    for _ in 0..8 {
        let got = tokio::time::timeout(cfg.timeout, simple_on(conn, &Request::ClusterMap))
            .await
            .map_err(|_| Error::Timeout(cfg.timeout))?;
        match got {
            Ok(r) => return ClientMap::parse(&r.cluster_map).map_err(Error::Protocol),
            Err(e) if e.status() == Some(Status::Busy) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::Protocol(
        "the node has no cluster map yet (is it joined? see `percore cluster status`)".into(),
    ))
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

/// A backoff between half of `d` and `d`, at random: clients refused at
/// once (a takeover, an overloaded node) do not all come back at once.
fn jittered(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn entry(key: &str, is_prefix: bool) -> ListEntry {
        ListEntry {
            key: key.into(),
            is_prefix,
            ..ListEntry::default()
        }
    }

    /// The first `limit` of `keys` after `after`, as one node answers:
    /// keys it holds but does not own (`ghost`) count and mark how far the
    /// page got, but are not listed.
    fn node_page(
        keys: &[String],
        ghost: &dyn Fn(&str) -> bool,
        after: &str,
        limit: usize,
    ) -> ListPage {
        let rest: Vec<&String> = keys.iter().filter(|k| k.as_str() > after).collect();
        let truncated = rest.len() > limit;
        let page: Vec<&String> = rest.into_iter().take(limit).collect();
        let next_start_after = if truncated {
            page.last().map(|k| (*k).clone()).unwrap_or_default()
        } else {
            String::new()
        };
        let entries: Vec<ListEntry> = page
            .into_iter()
            .filter(|k| !ghost(k))
            .map(|k| entry(k, false))
            .collect();
        ListPage {
            entries,
            truncated,
            next_start_after,
        }
    }

    /// Paging through merged pages of keys spread over nodes lists every
    /// key once, in order, whatever the spread and the page size.
    #[test]
    fn merged_pages_list_every_key_once_in_order() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(18);
        for round in 0..300 {
            let nodes = rng.gen_range(1..5);
            let mut per_node: Vec<Vec<String>> = vec![Vec::new(); nodes];
            let count = rng.gen_range(0..120);
            let mut all: Vec<String> = (0..count)
                .map(|i| format!("k{:05}", i * 3 + rng.gen_range(0..3)))
                .collect();
            all.sort();
            all.dedup();
            for k in &all {
                per_node[rng.gen_range(0..nodes)].push(k.clone());
            }
            // Some keys are also left behind on a second node (not listed
            // there), or only there (listed nowhere).
            let ghosts: std::collections::BTreeSet<String> = all
                .iter()
                .filter(|_| rng.gen_range(0..6) == 0)
                .cloned()
                .collect();
            for g in &ghosts {
                let n = rng.gen_range(0..nodes);
                if !per_node[n].contains(g) {
                    per_node[n].push(g.clone());
                    per_node[n].sort();
                }
            }
            let lost: std::collections::BTreeSet<String> = ghosts
                .iter()
                .filter(|_| rng.gen::<bool>())
                .cloned()
                .collect();
            let owner: Vec<std::collections::BTreeSet<String>> = per_node
                .iter()
                .map(|keys| {
                    keys.iter()
                        .filter(|k| !lost.contains(*k))
                        .cloned()
                        .collect()
                })
                .collect();
            // A node's own keys: each key once, on one node, unless lost.
            let mut seen = std::collections::BTreeSet::new();
            let owned: Vec<std::collections::BTreeSet<String>> = owner
                .iter()
                .map(|keys| {
                    keys.iter()
                        .filter(|k| seen.insert((*k).clone()))
                        .cloned()
                        .collect()
                })
                .collect();
            let all: Vec<String> = all.into_iter().filter(|k| !lost.contains(k)).collect();
            let limit = rng.gen_range(1..25);
            let mut after = String::new();
            let mut got = Vec::new();
            for _ in 0..1000 {
                let pages = per_node
                    .iter()
                    .zip(&owned)
                    .map(|(keys, mine)| node_page(keys, &|k| !mine.contains(k), &after, limit))
                    .collect();
                let page = merge_pages(pages, limit as u32);
                assert!(page.entries.len() <= limit, "round {round}");
                got.extend(page.entries.iter().map(|e| e.key.clone()));
                if !page.truncated {
                    break;
                }
                assert!(page.next_start_after > after, "round {round}: no progress");
                after = page.next_start_after;
            }
            assert_eq!(got, all, "round {round}: {nodes} nodes, limit {limit}");
        }
    }

    #[test]
    fn merged_pages_keep_one_of_each_common_prefix() {
        let a = ListPage {
            entries: vec![entry("a/", true), entry("b", false)],
            truncated: false,
            next_start_after: String::new(),
        };
        let b = ListPage {
            entries: vec![entry("a/", true), entry("c/", true)],
            truncated: false,
            next_start_after: String::new(),
        };
        let m = merge_pages(vec![a, b], 10);
        let keys: Vec<&str> = m.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a/", "b", "c/"]);
        assert!(!m.truncated && m.next_start_after.is_empty());
    }
}
