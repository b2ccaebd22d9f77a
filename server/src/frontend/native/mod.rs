//! The native front door: percore's binary range protocol
//! (`percore_protocol::native`, `docs/native.md`), one listener per shard.
//!
//! A connection has one reader (this task) and one writer task. The reader
//! decodes frames, authenticates the connection (HMAC challenge with the S3
//! keys), and starts one task per request, at most `IN_FLIGHT_MAX` at a time:
//! past that it stops reading, so TCP pushes back on the client. Request tasks
//! hand whole frames to the writer through a bounded channel, so replies of
//! different requests interleave at frame boundaries and may finish in any
//! order (the client matches them by request id). Object bytes read into a
//! registered buffer of the shard's data ring are sent from that buffer
//! (SEND_ZC above the ring's threshold); small payloads are coalesced with
//! their frame headers into one send.
//!
//! Any shard serves any key: a key owned elsewhere is forwarded to its owner
//! (`ObjectSource`/`ObjectSink`) and the reply names the owner, so a
//! shard-aware client learns where to go next time.
//!
//! Files: `conn` (the connection loop: frames in, the authentication state
//! machine, dispatch), `writer` (the ordered frame writer), `get` (range
//! reads), `put` (streamed uploads), `meta` (stat, delete, list, buckets).

mod conn;
mod get;
mod meta;
mod put;
#[cfg(test)]
mod tests;
mod writer;

use crate::access::Principal;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::SinkExt;
use glommio::net::TcpStream;
use percore_protocol::native::{self as proto, Kind, Reply, Request, Status};

use crate::frontend::common::Credentials;
use crate::frontend::datapath::GET_PIECE_BYTES;
use crate::shard::msg::ShardError;
use crate::shard::Shard;
use writer::{reply_frame, Out};

pub use get::resolve_ranges;

/// Object bytes per Chunk frame: one GET piece (one extent read).
const CHUNK_BYTES: u64 = GET_PIECE_BYTES;
/// Payloads up to this size are copied next to their frame header and sent
/// together; larger ones go out from their own buffer.
const COALESCE_BYTES_MAX: usize = 64 * 1024;
/// Bytes gathered before the writer sends.
const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// Frames queued to the writer per connection.
const OUT_QUEUE: usize = 64;
/// PUT payload frames queued per upload.
const PUT_QUEUE: usize = 4;
/// A native connection may sit idle this long between frames (clients keep
/// connections per shard).
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// One frame's remaining bytes, and every write, must progress within this.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Object bytes queued or being read for sending, or received and not yet
/// stored, per connection: a client that stops reading holds at most this.
const CONNECTION_BYTES_MAX: u64 = 8 << 20;
/// The same across all of a shard's native connections.
const SHARD_BYTES_MAX: u64 = 256 << 20;
/// Authentication must finish within this after connecting: every byte of
/// every frame before HelloOk arrives under this one deadline.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Before authentication only a Hello is read, with at most this many
/// message header bytes and no payload: an unauthenticated peer gets no
/// byte budget and no large buffer (a Hello is about 200 bytes).
const PRE_AUTH_HEADER_BYTES_MAX: u32 = 4096;
/// Longest wait for the next PutData frame of a streamed Put, by default
/// (`native_put_data_timeout_s`); past it the upload is aborted.
pub const PUT_DATA_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

// Every frame's payload, and every Chunk, must fit the connection's byte
// budget, and that the shard's: `Budget::take` waits for permits, and a
// request for more than a semaphore holds would wait forever.
const _: () = assert!(proto::PAYLOAD_BYTES_MAX as u64 <= CONNECTION_BYTES_MAX);
const _: () = assert!(CHUNK_BYTES <= CONNECTION_BYTES_MAX);
const _: () = assert!(CONNECTION_BYTES_MAX <= SHARD_BYTES_MAX);
// A Chunk is one frame: it must fit a frame's payload, which clients
// size their buffers by (HelloOk.frame_payload_max).
const _: () = assert!(CHUNK_BYTES <= proto::PAYLOAD_BYTES_MAX as u64);
// A coalesced payload never alone fills a send batch (the batch buffer is
// allocated for WRITE_BATCH_BYTES + COALESCE_BYTES_MAX).
const _: () = assert!(COALESCE_BYTES_MAX <= WRITE_BATCH_BYTES);
// The pre-authentication header limit is tighter than the protocol's.
const _: () = assert!(PRE_AUTH_HEADER_BYTES_MAX <= proto::HEADER_BYTES_MAX);

pub struct NativeConfig {
    pub credentials: Credentials,
    /// The native port of every shard, in shard order.
    pub ports: Vec<u16>,
    /// Longest wait for the next PutData frame of a Put
    /// (PUT_DATA_TIMEOUT_DEFAULT).
    pub put_data_timeout: Duration,
}

/// A shard's native front door: its configuration, draining flag and
/// shard-wide byte budget. One per shard; each connection is served by
/// `serve_connection`.
pub struct NativeFront {
    pub shard: Rc<Shard>,
    cfg: Rc<NativeConfig>,
    pub draining: Cell<bool>,
    /// Shard-wide byte budget (SHARD_BYTES_MAX).
    bytes: Rc<glommio::sync::Semaphore>,
}

/// Byte budgets a request draws on: its connection's and the shard's.
/// Permits are held until the bytes left (were sent, or were stored).
#[derive(Clone)]
struct Budget {
    conn: Rc<glommio::sync::Semaphore>,
    shard: Rc<glommio::sync::Semaphore>,
}

/// Permits taken from both budgets; returned when dropped.
struct Held(
    #[allow(dead_code)] glommio::sync::StaticPermit,
    #[allow(dead_code)] glommio::sync::StaticPermit,
);

impl Budget {
    /// Waits for `bytes` (at least 1) of both budgets; None when the
    /// semaphores are closed.
    async fn take(&self, bytes: u64) -> Option<Held> {
        let bytes = bytes.max(1);
        let c = self.conn.acquire_static_permit(bytes).await.ok()?;
        let s = self.shard.acquire_static_permit(bytes).await.ok()?;
        Some(Held(c, s))
    }

    /// `take` without waiting: None unless both budgets have `bytes` now.
    fn try_take(&self, bytes: u64) -> Option<Held> {
        let bytes = bytes.max(1);
        let c = self.conn.try_acquire_static_permit(bytes).ok()?;
        let s = self.shard.try_acquire_static_permit(bytes).ok()?;
        Some(Held(c, s))
    }
}

/// The native status and message for a shard error.
fn status_of(e: &ShardError) -> (Status, String) {
    match e {
        ShardError::NoSuchKey => (Status::NoSuchKey, "no such key".into()),
        ShardError::NoSuchVersion => (Status::NoSuchKey, "no such version".into()),
        ShardError::DeleteMarker { version_id, .. } => (
            Status::NoSuchKey,
            format!("no such key: its current version is delete marker {version_id}"),
        ),
        ShardError::NotImplemented(m) => (Status::InvalidRequest, format!("not supported: {m}")),
        ShardError::NoSuchBucket => (
            Status::NoSuchBucket,
            "no such bucket; create it first (percore mb)".into(),
        ),
        ShardError::BucketNotEmpty => (Status::BucketNotEmpty, "bucket not empty".into()),
        ShardError::Busy => (Status::Busy, "server busy; retry later".into()),
        ShardError::BucketClosing => (
            Status::Busy,
            "the bucket is being deleted (DeleteBucket checks that it is empty); retry".into(),
        ),
        ShardError::NoSpace(m) => (
            Status::NoSpace,
            format!("out of disk space ({m}); free space, then retry"),
        ),
        ShardError::Corrupt(m) => (
            Status::Corrupt,
            format!("stored data failed its checksum and was not served: {m}"),
        ),
        ShardError::Internal(m) => (Status::Internal, m.clone()),
        ShardError::ShuttingDown => (
            Status::ShuttingDown,
            "server shutting down; retry on another connection".into(),
        ),
        ShardError::Upload(u) => (Status::InvalidRequest, u.to_string()),
        ShardError::PreconditionFailed => {
            (Status::PreconditionFailed, "precondition failed".into())
        }
        ShardError::ConditionalConflict => (
            Status::Busy,
            "a conflicting write of this key is in flight; retry".into(),
        ),
    }
}

fn shard_error_reply(e: &ShardError) -> Reply {
    let (s, m) = status_of(e);
    Reply::error(s, m)
}

impl NativeFront {
    pub fn new(shard: Rc<Shard>, cfg: Rc<NativeConfig>) -> Rc<NativeFront> {
        Rc::new(NativeFront {
            shard,
            cfg,
            draining: Cell::new(false),
            bytes: Rc::new(glommio::sync::Semaphore::new(SHARD_BYTES_MAX)),
        })
    }

    /// Serves one accepted connection to its end (`conn`).
    pub async fn serve_connection(self: Rc<Self>, stream: TcpStream) {
        let m = self.shard.metrics();
        m.native_connections_open
            .set(m.native_connections_open.get() + 1);
        self.clone().serve_connection_inner(stream).await;
        let m = self.shard.metrics();
        m.native_connections_open
            .set(m.native_connections_open.get() - 1);
    }

    /// Runs one request to its final Reply frame and records it.
    async fn run(
        &self,
        mut tx: mpsc::Sender<Out>,
        id: u64,
        kind: Kind,
        fut: impl std::future::Future<Output = Reply>,
    ) {
        let m = self.shard.metrics();
        m.requests_in_flight.set(m.requests_in_flight.get() + 1);
        let started = Instant::now();
        let reply = fut.await;
        m.record_native(kind.name(), reply.status, started.elapsed());
        let _ = tx.send(reply_frame(id, reply)).await;
        m.requests_in_flight.set(m.requests_in_flight.get() - 1);
    }

    /// A request that is neither part of the handshake nor an upload: to
    /// its handler (`get`, `meta`).
    async fn request(
        &self,
        tx: mpsc::Sender<Out>,
        id: u64,
        req: Request,
        budget: Budget,
        principal: Principal,
    ) -> Reply {
        if let Some(refusal) = self.refusal(&principal, &req) {
            return refusal;
        }
        match req {
            Request::Get { bucket, item } => self.get(tx, id, &bucket, vec![item], &budget).await,
            Request::BatchGet { bucket, items } => self.get(tx, id, &bucket, items, &budget).await,
            Request::Delete { bucket, key } => self.delete(&bucket, &key).await,
            Request::Stat { bucket, key } => self.stat(&bucket, &key).await,
            Request::List(l) => self.list(l).await,
            Request::CreateBucket { bucket } => self.create_bucket(bucket, &principal).await,
            Request::ListBuckets => self.list_buckets(&principal),
            Request::ClusterMap => self.cluster_map(),
            Request::Hello(_) | Request::Put(_) | Request::PutData { .. } => {
                Reply::error(Status::Internal, "not dispatched here")
            }
        }
    }

    /// The refusal of a request `principal` may not make (see `access`),
    /// as Unauthenticated with a message naming what was denied.
    pub(super) fn refusal(&self, principal: &Principal, req: &Request) -> Option<Reply> {
        if let Some(wrong) = self.wrong_node(req) {
            return Some(wrong);
        }
        let checks: Vec<(&str, &str, Option<&str>)> = match req {
            Request::Get { bucket, item } => vec![("s3:GetObject", bucket, Some(&item.key))],
            Request::BatchGet { bucket, items } => items
                .iter()
                .map(|i| ("s3:GetObject", bucket.as_str(), Some(i.key.as_str())))
                .collect(),
            Request::Delete { bucket, key } => vec![("s3:DeleteObject", bucket, Some(key))],
            Request::Stat { bucket, key } => vec![("s3:GetObject", bucket, Some(key))],
            Request::List(l) => vec![("s3:ListBucket", &l.bucket, None)],
            Request::Put(p) => vec![("s3:PutObject", &p.bucket, Some(&p.key))],
            Request::CreateBucket { .. } | Request::ListBuckets | Request::ClusterMap => Vec::new(),
            Request::Hello(_) | Request::PutData { .. } => Vec::new(),
        };
        for (action, bucket, key) in checks {
            let allowed = self.shard.decide_access(principal, action, bucket, key);
            let Some(allowed) = allowed else {
                return Some(Reply::error(
                    Status::NoSuchBucket,
                    format!("no bucket {bucket}"),
                ));
            };
            if !allowed {
                let what = key.map_or_else(|| bucket.to_string(), |k| format!("{bucket}/{k}"));
                return Some(Reply::error(
                    Status::Unauthenticated,
                    format!("access denied: {action} on {what} (the bucket's owner can grant it with a bucket policy)"),
                ));
            }
        }
        None
    }

    /// Cluster mode: the refusal of a key request this node does not
    /// serve (WrongNode with the node's map epoch; Busy before its first
    /// map). A batch is refused whole if any key is elsewhere: the client
    /// fetches the map and groups the keys again.
    fn wrong_node(&self, req: &Request) -> Option<Reply> {
        use crate::shard::Ownership;
        if !self.shard.is_cluster() {
            return None;
        }
        if !crate::cluster::catalog::serving() && !matches!(req, Request::ClusterMap) {
            // Every answer goes by the cluster's buckets, confirmed with
            // etcd (`catalog::serving`).
            return Some(Reply::error(
                Status::Busy,
                "this cluster node cannot confirm the cluster's buckets with etcd right now (starting, or etcd unreachable from it); retry shortly, or through another node",
            ));
        }
        let keys: Vec<(&str, &str)> = match req {
            Request::Get { bucket, item } => vec![(bucket, &item.key)],
            Request::BatchGet { bucket, items } => items
                .iter()
                .map(|i| (bucket.as_str(), i.key.as_str()))
                .collect(),
            Request::Delete { bucket, key } | Request::Stat { bucket, key } => vec![(bucket, key)],
            Request::Put(p) => vec![(&p.bucket, &p.key)],
            _ => Vec::new(),
        };
        for (bucket, key) in keys {
            match self.shard.ownership(bucket, key) {
                Ownership::Mine => {}
                Ownership::NoMap => {
                    return Some(Reply::error(
                        Status::Busy,
                        "this cluster node has no map yet; retry shortly",
                    ))
                }
                Ownership::Lapsed(why) => return Some(Reply::error(Status::Busy, why)),
                Ownership::Elsewhere { epoch } => {
                    return Some(Reply {
                        map_epoch: epoch,
                        ..Reply::error(
                            Status::WrongNode,
                            format!("{bucket}/{key} is not on this node at map epoch {epoch}; fetch the map (ClusterMap) and send it to its primary"),
                        )
                    })
                }
            }
        }
        None
    }

    /// ClusterMap: the map this node holds, as JSON.
    fn cluster_map(&self) -> Reply {
        if !self.shard.is_cluster() {
            return Reply::error(
                Status::InvalidRequest,
                "not a cluster node (started without --cluster)",
            );
        }
        match self.shard.cluster_map() {
            None => Reply::error(
                Status::Busy,
                "this cluster node has no map yet; retry shortly",
            ),
            Some(m) => Reply {
                map_epoch: m.epoch,
                cluster_map: m.json.clone(),
                ..Reply::default()
            },
        }
    }

    fn count_bad_frame(&self) {
        let m = self.shard.metrics();
        m.native_bad_frames.set(m.native_bad_frames.get() + 1);
    }
}
