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
mod buckets;
mod handlers;
pub mod msg;
pub mod object;
mod sessions;
mod wire;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use futures::channel::oneshot;
use glommio::channels::shared_channel::ConnectedSender;
use percore_protocol::routing;

use crate::metrics::{ShardMetrics, ShardSnapshot, Stage};
use crate::store::{Store, StoreError};
use msg::{Msg, Reply, SessionId, ShardError};
use sessions::SessionSlot;

pub use buckets::BucketView;
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
    pub(crate) metrics: ShardMetrics,
    /// The shard's own io_uring data ring with its registered buffers (the
    /// zero-copy GET path); None when it could not be set up. Public to the
    /// crate only until the S3 door and boot use `ring()`/`set_ring()`.
    pub(crate) ring: RefCell<Option<Rc<crate::ring::DataRing>>>,
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
        })
    }

    /// Sets the longest wait for another shard (`call`) and the idle time
    /// after which a session held for another shard is closed.
    pub fn set_timeouts(&self, call: Duration, session_idle: Duration) {
        self.call_timeout.set(call.max(Duration::from_millis(1)));
        self.session_idle_timeout
            .set(session_idle.max(Duration::from_millis(1)));
    }

    /// The shard that owns (bucket, key): the one placement function.
    pub fn owner_of(&self, bucket: &str, key: &str) -> usize {
        routing::owner_shard(self.seed, self.count, bucket.as_bytes(), key.as_bytes())
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
        let mut out = ShardSnapshot {
            shard: self.id,
            ..Default::default()
        };
        self.metrics.snapshot_into(&mut out);
        let (write, read) = self.store.device_latency();
        for (name, h) in out.stages.iter_mut() {
            if *name == Stage::DeviceWrite.name() {
                *h = write.clone();
            } else if *name == Stage::DeviceRead.name() {
                *h = read.clone();
            }
        }
        if let Some(ring) = self.ring.borrow().as_ref() {
            let r = ring.stats();
            out.counters.extend([
                ("percore_ring_sends_zero_copy_total", "SEND_ZC sends the kernel completed without copying.", r.sends_zero_copy),
                ("percore_ring_sends_copied_total", "SEND_ZC sends the kernel reported as copied (always so on loopback and veth).", r.sends_copied),
                ("percore_ring_sends_plain_total", "Plain sends from registered buffers (below the SEND_ZC threshold, SEND_ZC unsupported, or declined).", r.sends_plain),
                ("percore_ring_sends_zc_declined_total", "Plain sends at SEND_ZC sizes on sockets whose earlier SEND_ZC the kernel copied (loopback, veth).", r.sends_zc_declined),
                ("percore_ring_reads_fixed_total", "READ_FIXED reads into registered buffers.", r.reads_fixed),
                ("percore_ring_writes_fixed_total", "WRITE_FIXED batch pieces written from registered buffers.", r.writes_fixed),
                ("percore_ring_sq_full_total", "Times the submission queue was full and had to be submitted early.", r.sq_full),
                ("percore_ring_submit_calls_total", "io_uring_enter calls for submission.", r.submit_calls),
                ("percore_ring_sqes_submitted_total", "SQEs submitted.", r.submitted),
            ]);
            out.counters.push((
                "percore_ring_cq_overflow_total",
                "Completions the kernel could not post because the completion queue was full.",
                ring.cq_overflow(),
            ));
            out.gauges.push((
                "percore_ring_files_registered",
                "Segment files in the ring's registered-file table.",
                ring.files_registered() as u64,
            ));
            if let Some(pool) = ring.pool() {
                out.gauges.push((
                    "percore_ring_buffers_in_use",
                    "Registered buffers held by reads and sends in flight.",
                    (pool.count() - pool.free_count()) as u64,
                ));
                out.counters.push((
                    "percore_ring_buffer_waits_total",
                    "Times the pool had no free buffer (a GET waited for one, or a batch write used an unregistered buffer).",
                    pool.exhausted_total(),
                ));
            }
        }
        let st = self.store.stats();
        out.counters.extend([
            (
                "percore_store_flushes_total",
                "Group-commit batches made durable (write + fdatasync).",
                st.flushes,
            ),
            (
                "percore_store_records_written_total",
                "Records appended to segments.",
                st.records_written,
            ),
            (
                "percore_store_bytes_written_total",
                "Bytes written to segments (records and padding).",
                st.bytes_written,
            ),
            (
                "percore_store_write_errors_total",
                "Batches whose write or fdatasync failed (disk errors, ENOSPC).",
                st.write_errors,
            ),
            (
                "percore_store_corrupt_reads_total",
                "Reads that failed a CRC check: never served.",
                st.corrupt_reads,
            ),
            (
                "percore_store_crc_cache_hits_total",
                "Extent block-CRC lookups answered from the shard's cache (no header read).",
                st.crc_cache_hits,
            ),
            (
                "percore_store_crc_cache_misses_total",
                "Extent block-CRC lookups that read the extent's header from disk.",
                st.crc_cache_misses,
            ),
            (
                "percore_store_header_cache_hits_total",
                "Opens of extent-stored objects whose header came from the shard's cache.",
                st.header_cache_hits,
            ),
            (
                "percore_store_header_cache_misses_total",
                "Opens of extent-stored objects that read the object's header from disk.",
                st.header_cache_misses,
            ),
            (
                "percore_compaction_segments_total",
                "Segments compacted and deleted.",
                st.segments_compacted,
            ),
            (
                "percore_compaction_bytes_copied_total",
                "Bytes of live records copied by compaction.",
                st.compaction_bytes_copied,
            ),
            (
                "percore_compaction_bytes_freed_total",
                "Bytes of segment files deleted by compaction.",
                st.compaction_bytes_freed,
            ),
            (
                "percore_store_damaged_regions_total",
                "Ranges of segment bytes that recovery, compaction or the scrubber could not read as records (damaged records; see the error log and percore fsck).",
                st.damaged_regions,
            ),
            (
                "percore_compaction_skipped_damaged_total",
                "Compactions refused because the segment holds damage (it is kept for repair).",
                st.compaction_skipped_damaged,
            ),
            (
                "percore_scrub_passes_total",
                "Background scrub passes over the sealed segments completed.",
                st.scrub_passes,
            ),
            (
                "percore_scrub_bytes_total",
                "Bytes read and checked by the scrubber.",
                st.scrub_bytes,
            ),
            (
                "percore_scrub_corrupt_records_total",
                "Records the scrubber found failing their CRC (see the error log for segment, offset and key).",
                st.scrub_corrupt_records,
            ),
        ]);
        out.gauges.push((
            "percore_scrub_last_pass_timestamp_seconds",
            "Unix time the last scrub pass ended (0: none since start).",
            st.scrub_last_pass_unix_ms / 1000,
        ));
        out.gauges.push((
            "percore_scrub_last_pass_corrupt_records",
            "Damaged records the last scrub pass found (each pass counts them again).",
            st.scrub_last_pass_corrupt,
        ));
        let segments = self.store.segment_table();
        let (live, total) = segments
            .iter()
            .fold((0u64, 0u64), |(l, t), s| (l + s.2, t + s.1));
        out.segment_bytes = vec![("live", live), ("garbage", total.saturating_sub(live))];
        out.gauges.extend([
            (
                "percore_objects",
                "Objects in the shard's index.",
                self.store.objects_total() as u64,
            ),
            (
                "percore_segments",
                "Segment files of the shard.",
                segments.len() as u64,
            ),
            (
                "percore_connections_open",
                "Open S3 connections accepted by the shard.",
                self.metrics.connections_open.get(),
            ),
            (
                "percore_native_connections_open",
                "Open native-protocol connections accepted by the shard.",
                self.metrics.native_connections_open.get(),
            ),
            (
                "percore_requests_in_flight",
                "S3 and native requests being served by the shard.",
                self.metrics.requests_in_flight.get(),
            ),
            (
                "percore_cross_shard_sessions",
                "Streamed GET/PUT sessions held for other shards.",
                self.sessions.borrow().len() as u64,
            ),
            (
                "percore_cross_shard_calls_pending",
                "Calls to other shards awaiting a reply.",
                self.pending.borrow().len() as u64,
            ),
        ]);
        out.counters.extend([
            (
                "percore_cross_shard_calls_timed_out_total",
                "Calls to other shards that got no reply within cross_shard_timeout_s.",
                self.calls_timed_out.get(),
            ),
            (
                "percore_cross_shard_orphaned_sessions_closed_total",
                "Sessions another shard opened for a call that had given up, closed again.",
                self.orphans_closed.get(),
            ),
            (
                "percore_cross_shard_sessions_expired_total",
                "Sessions held for other shards closed after session_idle_timeout_s without use.",
                self.sessions_expired.get(),
            ),
        ]);
        out
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
        other => ShardError::Internal(other.to_string()),
    }
}
