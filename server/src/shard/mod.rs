//! The per-core shard: its store, its replicated bucket view, and the
//! channels to every other shard.
//!
//! A request that arrives on shard A for a key owned by shard B is sent to B as
//! an `Op` over a bounded single-producer channel (A -> B); B runs it on its
//! own executor and the `Reply` comes back over B -> A. Nothing is shared
//! between shards but these channels.
//!
//! Buckets live on the bucket-owner shard (shard 0) as durable records; every
//! shard keeps a read-only copy of the bucket set, updated by shard 0 before
//! it acknowledges a CreateBucket or DeleteBucket.
//!
//! Files: `api` (the typed API the front doors use), `object` (streaming one
//! object's bytes from or to its owner), `handlers` (running each `Op` on its
//! owner), `buckets` (the bucket view and bucket operations), `sessions`
//! (sessions held for other shards), `wire` (channels, `call`), `msg` (the
//! messages).

pub mod api;
mod bucket_config;
mod buckets;
mod cluster;
mod handlers;
pub mod lifecycle;
pub mod msg;
pub mod object;
mod sessions;
mod users;
mod wire;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use futures::channel::oneshot;
use glommio::channels::shared_channel::ConnectedSender;
use percore_protocol::routing;

use crate::metrics::{ShardMetrics, ShardSnapshot};
use crate::store::{Store, StoreError};
use msg::{Msg, Reply, SessionId, ShardError};
use sessions::SessionSlot;

pub use buckets::BucketView;
pub use cluster::Ownership;
pub use wire::{wire, Wiring};

/// The shard that holds bucket records.
pub const BUCKET_OWNER_SHARD: usize = 0;
/// Messages queued per directed shard pair before senders wait.
pub const CHANNEL_CAPACITY: usize = 1024;
/// Longest wait for another shard to take a message and reply, by default
/// (`cross_shard_timeout_s`; `Shard::set_timeouts`).
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// A session held for another shard that sees no operation for this long is
/// closed, by default (`session_idle_timeout_s`; `Shard::set_timeouts`):
/// the backstop for a caller that went away without closing it.
pub const SESSION_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);
/// Open read/put sessions held for other shards, per shard.
pub const SESSIONS_MAX: usize = 4096;

/// One core's shard. Its state is private: front doors use the typed API
/// (`api`), `ObjectSource`/`ObjectSink`, and the accessors below.
pub struct Shard {
    /// This shard's index, `0..count`.
    pub id: usize,
    /// Shards in the process.
    pub count: usize,
    /// The placement seed (`owner_of`).
    pub seed: u64,
    store: Store,
    senders: RefCell<Vec<Option<Rc<ConnectedSender<Msg>>>>>,
    pending: RefCell<HashMap<u64, oneshot::Sender<Reply>>>,
    next_request_id: Cell<u64>,
    buckets: RefCell<BTreeMap<String, BucketView>>,
    /// Users and their keys (see `access::users`), the same on every shard.
    users: RefCell<crate::access::users::Users>,
    /// Bucket names being created (bucket-owner shard): a concurrent
    /// create of the same name is refused, not raced.
    creating: RefCell<std::collections::HashSet<String>>,
    /// Serializes the bucket-owner shard's writes of configuration
    /// documents and users (this shard's own lock; no other shard takes
    /// it): each write reads back its own seq and is applied everywhere
    /// before the next starts, so every shard applies them in one order.
    config_writes: futures::lock::Mutex<()>,
    /// PUTs in progress per bucket on this shard (for DeleteBucket).
    puts_in_flight: RefCell<HashMap<String, usize>>,
    sessions: RefCell<HashMap<SessionId, SessionSlot>>,
    next_session: Cell<SessionId>,
    /// Longest wait for another shard (CALL_TIMEOUT_DEFAULT).
    call_timeout: Cell<Duration>,
    /// Idle sessions are closed after this (SESSION_IDLE_TIMEOUT_DEFAULT).
    session_idle_timeout: Cell<Duration>,
    /// Calls to other shards that timed out.
    calls_timed_out: Cell<u64>,
    /// Sessions opened for this shard whose open reply came after the call
    /// gave up (or after its caller went away), and which this shard then
    /// told the owner to close.
    orphans_closed: Cell<u64>,
    /// Sessions held for other shards closed for being idle too long.
    sessions_expired: Cell<u64>,
    started: Cell<bool>,
    start_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// Public to the crate only until the S3 door and boot use `metrics()`
    /// (they are being rewritten); then private.
    metrics: ShardMetrics,
    /// The shard's own io_uring data ring with its registered buffers (the
    /// zero-copy GET path); None when it could not be set up. Public to the
    /// crate only until the S3 door and boot use `ring()`/`set_ring()`.
    ring: RefCell<Option<Rc<crate::ring::DataRing>>>,
    /// MD5 for the ETags of the uploads this shard receives, in lanes.
    md5: Rc<crate::digest::engine::Md5Engine>,
    /// Cluster mode: placement groups (0: a single node), fixed at start.
    cluster_pgs: Cell<u32>,
    /// Cluster mode: node-to-node MACs taken on this shard (`cluster`).
    node_macs: RefCell<crate::cluster::peer_http::Replays>,
    /// Cluster mode: the latest map from the control thread (`cluster`).
    map: RefCell<Option<std::sync::Arc<crate::cluster::shardmap::ShardMap>>>,
    /// Cluster mode: the highest epoch a node catching up read this
    /// shard's digest at (`cluster`): copies pushed under an older map
    /// are refused, so a write acknowledged by an older primary is either
    /// in the digest or not acknowledged.
    fence: Cell<u64>,
}

impl Shard {
    pub fn new(id: usize, count: usize, seed: u64, store: Store) -> Rc<Shard> {
        assert!(id < count);
        Rc::new(Shard {
            id,
            count,
            seed,
            store,
            senders: RefCell::new(Vec::new()),
            pending: RefCell::new(HashMap::new()),
            next_request_id: Cell::new(1),
            buckets: RefCell::new(BTreeMap::new()),
            users: RefCell::new(Default::default()),
            creating: RefCell::new(Default::default()),
            config_writes: futures::lock::Mutex::new(()),
            puts_in_flight: RefCell::new(HashMap::new()),
            sessions: RefCell::new(HashMap::new()),
            next_session: Cell::new(1),
            call_timeout: Cell::new(CALL_TIMEOUT_DEFAULT),
            session_idle_timeout: Cell::new(SESSION_IDLE_TIMEOUT_DEFAULT),
            calls_timed_out: Cell::new(0),
            orphans_closed: Cell::new(0),
            sessions_expired: Cell::new(0),
            started: Cell::new(false),
            start_waiters: RefCell::new(Vec::new()),
            metrics: ShardMetrics::default(),
            ring: RefCell::new(None),
            md5: crate::digest::engine::Md5Engine::new(),
            cluster_pgs: Cell::new(0),
            node_macs: RefCell::new(Default::default()),
            map: RefCell::new(None),
            fence: Cell::new(0),
        })
    }

    /// The shard's MD5 engine (uploads' ETags).
    pub fn md5_engine(&self) -> Rc<crate::digest::engine::Md5Engine> {
        self.md5.clone()
    }

    /// Sets the longest wait for another shard (`call`) and the idle time
    /// after which a session held for another shard is closed.
    pub fn set_timeouts(&self, call: Duration, session_idle: Duration) {
        self.call_timeout.set(call.max(Duration::from_millis(1)));
        self.session_idle_timeout
            .set(session_idle.max(Duration::from_millis(1)));
    }

    /// The shard that owns (bucket, key): the one placement function.
    /// In a cluster the shard comes from the key's position within its
    /// placement group (`placement::cluster_shard`), so that a node's few
    /// placement groups still spread over all its shards.
    /// A real version's index key (`\0v/KEY\0ID`) is placed as its key.
    pub fn owner_of(&self, bucket: &str, key: &str) -> usize {
        let key = crate::store::versions::base_key(key);
        match self.cluster_pgs.get() {
            0 => routing::owner_shard(self.seed, self.count, bucket.as_bytes(), key.as_bytes()),
            pgs => percore_protocol::placement::cluster_shard(
                self.seed,
                pgs,
                self.count,
                bucket.as_bytes(),
                key.as_bytes(),
            ),
        }
    }

    /// Waits for the bucket-owner shard's start signal.
    pub async fn wait_started(&self) {
        if self.started.get() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.start_waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }

    /// The shard's store (for the shard's own layers: start-up, metrics).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The shard's counters and histograms.
    pub fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    /// The shard's data ring, if it has one (the zero-copy path).
    pub fn ring(&self) -> Option<Rc<crate::ring::DataRing>> {
        self.ring.borrow().clone()
    }

    /// Installs the data ring set up at start-up.
    pub fn set_ring(&self, ring: Rc<crate::ring::DataRing>) {
        *self.ring.borrow_mut() = Some(ring);
    }

    /// The cross-shard messaging and session gauges and counters, for a
    /// scrape.
    pub fn cross_shard_stats(&self) -> CrossShardStats {
        CrossShardStats {
            sessions_open: self.sessions.borrow().len() as u64,
            calls_pending: self.pending.borrow().len() as u64,
            calls_timed_out: self.calls_timed_out.get(),
            orphans_closed: self.orphans_closed.get(),
            sessions_expired: self.sessions_expired.get(),
        }
    }
}

/// What `Shard::cross_shard_stats` reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct CrossShardStats {
    /// Sessions held for other shards.
    pub sessions_open: u64,
    /// Calls to other shards awaiting a reply.
    pub calls_pending: u64,
    /// Calls to other shards that got no reply in time.
    pub calls_timed_out: u64,
    /// Sessions opened for calls that had given up, closed again.
    pub orphans_closed: u64,
    /// Sessions held for other shards closed for being idle.
    pub sessions_expired: u64,
}

impl Shard {
    /// This shard's counters, gauges and histograms, for a scrape.
    pub fn metrics_snapshot(&self) -> ShardSnapshot {
        use crate::metrics::catalogue::{CrossShardRaw, PoolRaw, RingRaw, SegmentUsage, ShardRaw};
        let (device_write, device_read) = self.store.device_latency();
        let ring = self.ring.borrow().as_ref().map(|ring| RingRaw {
            stats: ring.stats(),
            cq_overflow: ring.cq_overflow(),
            files_registered: ring.files_registered() as u64,
            pool: ring.pool().map(|pool| PoolRaw {
                buffers_in_use: (pool.count() - pool.free_count()) as u64,
                buffer_waits: pool.exhausted_total(),
            }),
        });
        let raw = ShardRaw {
            device_write,
            device_read,
            ring,
            store: self.store.stats(),
            segments: SegmentUsage::from_table(&self.store.segment_table()),
            objects: self.store.objects_total() as u64,
            connections_open: self.metrics.connections_open.get(),
            native_connections_open: self.metrics.native_connections_open.get(),
            requests_in_flight: self.metrics.requests_in_flight.get(),
            cross_shard: CrossShardRaw {
                sessions_open: self.sessions.borrow().len() as u64,
                calls_pending: self.pending.borrow().len() as u64,
                calls_timed_out: self.calls_timed_out.get(),
                orphaned_sessions_closed: self.orphans_closed.get(),
                sessions_expired: self.sessions_expired.get(),
            },
            md5: self.md5.stats(),
        };
        let mut snap = crate::metrics::catalogue::shard_snapshot(self.id, &self.metrics, &raw);
        if let Some(map) = self.cluster_map() {
            snap.replica_missed = crate::cluster::replicate::missed_now(&self.metrics, &map);
        }
        snap
    }
}

pub fn store_error(e: StoreError) -> ShardError {
    match e {
        StoreError::NotFound => ShardError::NoSuchKey,
        StoreError::NoSpace(e) => ShardError::NoSpace(e.to_string()),
        StoreError::Corrupt { .. } => ShardError::Corrupt(e.to_string()),
        StoreError::ShuttingDown => ShardError::ShuttingDown,
        StoreError::Busy => ShardError::Busy,
        StoreError::Upload(e) => ShardError::Upload(e),
        StoreError::PreconditionFailed => ShardError::PreconditionFailed,
        StoreError::ConditionalConflict => ShardError::ConditionalConflict,
        StoreError::NoSuchVersion => ShardError::NoSuchVersion,
        StoreError::DeleteMarker { version, named } => ShardError::DeleteMarker {
            version_id: crate::store::versions::version_id(version),
            named,
        },
        StoreError::NotSupported(what) => ShardError::NotImplemented(what.to_string()),
        other => ShardError::Internal(other.to_string()),
    }
}
