//! The per-shard storage engine.
//!
//! One `Store` per shard, owned by that shard's executor thread: no locks,
//! `Rc<RefCell<..>>` only. Layout on disk (see `docs/design.md`):
//!
//! - append-only segment files `seg-<id:016x>.pcs` in the shard directory;
//! - small objects are packed into segments as single `Object` records with the
//!   payload inline; large ones are written as `Extent` records of
//!   `chunk_bytes` each, followed by an `Object` record listing them;
//! - writes are batched (group commit): every record appended while a flush is
//!   in progress rides on the next `write + fdatasync`;
//! - the in-memory index maps bucket -> key -> newest version, ordered;
//! - recovery scans the segments; compaction relocates live records out of
//!   mostly-dead segments and deletes them.

pub mod file;
pub mod mpu;
pub mod record;
mod record_cache;
mod recovery;
pub mod scan;
pub mod scrub;
pub mod sim;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;
use glommio::io::ReadResult;
use thiserror::Error;

use file::{FaultHook, FaultPoint, SegFile, WRITE_ALIGN_BYTES};
use record::{Body, ExtentRef, Header, Kind, ObjectMeta};

/// Namespace of bucket records in the index of the bucket-owner shard.
/// Real bucket names are 3..=63 characters, so "" never collides.
const BUCKETS_NAMESPACE: &str = "";

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("no such key")]
    NotFound,
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("no space left on the device: {0}")]
    NoSpace(io::Error),
    #[error("stored data failed its checksum at segment {segment_id} offset {offset}")]
    Corrupt { segment_id: u64, offset: u64 },
    #[error("invalid record: {0}")]
    Invalid(String),
    #[error("the store is shutting down")]
    ShuttingDown,
    #[error("write queue full")]
    Busy,
    #[error("{0}")]
    Upload(#[from] mpu::UploadError),
    #[error("a precondition of the write did not hold")]
    PreconditionFailed,
    #[error("another write of this key is in progress")]
    ConditionalConflict,
}

/// A conditional PUT (If-None-Match: * or If-Match), decided atomically on
/// the owner shard when the new version is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutCondition {
    /// Only if no object exists.
    IfNoneMatchAny,
    /// Only if the current ETag is in this (comma-separated) list, or `*`.
    IfMatch(String),
}

/// Whether an If-Match / If-None-Match list names `etag` (or is `*`).
pub fn etag_list_matches(list: &str, etag: &str) -> bool {
    list.split(',')
        .map(|t| t.trim().trim_start_matches("W/").trim_matches('"'))
        .any(|t| t == "*" || t == etag)
}

impl StoreError {
    fn from_io(e: io::Error) -> StoreError {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            StoreError::NoSpace(e)
        } else {
            StoreError::Io(e)
        }
    }

    fn clone_for_waiter(&self) -> StoreError {
        match self {
            StoreError::NoSpace(e) => StoreError::NoSpace(io::Error::new(e.kind(), e.to_string())),
            StoreError::Io(e) => StoreError::Io(io::Error::new(e.kind(), e.to_string())),
            other => StoreError::Invalid(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

#[derive(Clone)]
pub struct StoreConfig {
    pub shard_id: u32,
    pub dir: PathBuf,
    pub direct_io: bool,
    /// A segment is sealed and a new one started beyond this size.
    pub segment_bytes_max: u64,
    /// Objects up to this size are stored inline; larger ones in extents of
    /// this size.
    pub chunk_bytes: u64,
    /// Upper bound of one group-commit write.
    pub batch_bytes_max: u64,
    /// Upper bound of bytes queued for writing; appends beyond it wait.
    pub queue_bytes_max: u64,
    /// Compact a sealed segment once this fraction of it is garbage.
    pub compaction_garbage_ratio_min: f64,
    /// Compaction copy rate limit, so that foreground I/O is not starved.
    pub compaction_bytes_per_sec_max: u64,
    /// How often the compactor looks for work (0: never in background).
    pub compaction_interval_ms: u64,
    /// Pause between scrub passes over the sealed segments (0: no
    /// background scrubbing).
    pub scrub_interval_ms: u64,
    /// Scrub read rate limit.
    pub scrub_bytes_per_sec_max: u64,
    /// Memory for cached extent block CRCs (see `record_cache`); about 160
    /// bytes per 1 MiB extent, so the default covers ~100k extents.
    pub crc_cache_bytes_max: usize,
    /// Memory for cached headers of objects stored in extents (metadata
    /// and extent list: ~200 bytes plus ~24 per MiB of object).
    pub header_cache_bytes_max: usize,
    pub faults: Option<FaultHook>,
    /// The file system, or a power-loss model of it (tests).
    pub disk: file::Disk,
}

impl StoreConfig {
    pub fn new(shard_id: u32, dir: PathBuf) -> StoreConfig {
        StoreConfig {
            shard_id,
            dir,
            direct_io: true,
            segment_bytes_max: 256 << 20,
            chunk_bytes: 1 << 20,
            batch_bytes_max: 8 << 20,
            queue_bytes_max: 64 << 20,
            compaction_garbage_ratio_min: 0.5,
            compaction_bytes_per_sec_max: 256 << 20,
            compaction_interval_ms: 1000,
            scrub_interval_ms: 0,
            scrub_bytes_per_sec_max: 64 << 20,
            crc_cache_bytes_max: 16 << 20,
            header_cache_bytes_max: 16 << 20,
            faults: None,
            disk: file::Disk::Real,
        }
    }
}

/// Where a record lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub segment_id: u64,
    pub offset: u64,
    pub header_bytes: u32,
    pub payload_bytes: u64,
}

impl Loc {
    pub fn span_bytes(&self) -> u64 {
        record::record_span_bytes(u64::from(self.header_bytes), self.payload_bytes)
    }
}

/// What the index keeps of an object version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size_bytes: u64,
    pub etag: Box<str>,
    pub mtime_ms: u64,
    pub extents: Box<[ExtentRef]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Live(ObjectInfo),
    Deleted,
}

#[derive(Debug, Clone)]
struct Entry {
    seq: u64,
    loc: Loc,
    state: State,
    /// Records of this key on disk other than `loc` (older versions, stale
    /// copies). A tombstone may only be dropped when this reaches zero.
    older_on_disk: u32,
}

struct Segment {
    file: Rc<SegFile>,
    /// What its record headers are checked against.
    key: record::SegKey,
    /// Bytes up to which the segment holds records (valid data end).
    end_bytes: u64,
    live_bytes: u64,
    sealed: bool,
    /// A scan found bytes it could not read as records: compaction leaves
    /// the segment alone (deleting it would lose what a repair could save).
    damaged: bool,
}

/// Batches being written at once (pipelined group commit).
const FLUSHES_IN_FLIGHT_MAX: usize = 2;

/// Record locations of a batch written at `start`, and the end of its data.
fn layout(segment_id: u64, start: u64, batch: &[Pending]) -> (Vec<Loc>, u64) {
    let mut locs = Vec::with_capacity(batch.len());
    let mut end = start;
    for p in batch {
        locs.push(Loc {
            segment_id,
            offset: end,
            header_bytes: p.header.len() as u32,
            payload_bytes: p.payload.len() as u64,
        });
        end += p.span_bytes();
    }
    (locs, end)
}

/// Largest single write of a group-commit batch.
const WRITE_PIECE_BYTES: u64 = 1 << 20;

/// Copies `data` to byte `at` of the batch made of consecutive `pieces`.
fn copy_into_pieces(pieces: &mut [file::WriteBuf], mut at: u64, mut data: &[u8]) {
    while !data.is_empty() {
        let index = (at / WRITE_PIECE_BYTES) as usize;
        let within = (at % WRITE_PIECE_BYTES) as usize;
        let out = pieces[index].as_mut_slice();
        let take = (out.len() - within).min(data.len());
        out[within..within + take].copy_from_slice(&data[..take]);
        data = &data[take..];
        at += take as u64;
    }
}

/// A record waiting to be written.
struct Pending {
    header: Vec<u8>,
    payload: Bytes,
    done: oneshot::Sender<Result<Loc>>,
}

impl Pending {
    fn span_bytes(&self) -> u64 {
        record::record_span_bytes(self.header.len() as u64, self.payload.len() as u64)
    }
}

struct Inner {
    cfg: StoreConfig,
    index: RefCell<BTreeMap<String, BTreeMap<String, Entry>>>,
    segments: RefCell<BTreeMap<u64, Segment>>,
    /// Segment receiving appends; None until the first write (or after an
    /// error, so that the next write starts a fresh segment).
    active: Cell<Option<u64>>,
    write_offset: Cell<u64>,
    next_segment_id: Cell<u64>,
    /// None once every sequence number is used (never, short of a u64's
    /// worth of writes): writes then fail instead of wrapping to 0.
    next_seq: Cell<Option<u64>>,
    /// Random, per shard, in every version-2 segment header: binds record
    /// headers to their place (see `record`). Set by recovery.
    shard_secret: Cell<u64>,
    queue: RefCell<VecDeque<Pending>>,
    queue_bytes: Cell<u64>,
    /// Wakes the flusher; capacity 1, a full doorbell means "already rung".
    doorbell: glommio::channels::local_channel::LocalSender<()>,
    doorbell_rx: RefCell<Option<glommio::channels::local_channel::LocalReceiver<()>>>,
    /// Woken when the queue shrinks, for appenders waiting on back-pressure.
    space_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    shutting_down: Cell<bool>,
    /// Keys with records of a failed batch that could not be cut off the
    /// file (see `cut_failed_batch`): such a record may come back at
    /// recovery, so a DELETE of the key writes a tombstone even when the key
    /// looks absent, and compaction keeps the key's tombstones. Until restart.
    uncertain: RefCell<std::collections::HashSet<(String, String)>>,
    stats: RefCell<StoreStats>,
    /// Segments holding extents of PUTs in progress: not compacted.
    pins: RefCell<std::collections::HashMap<u64, u32>>,
    flushes_in_flight: Cell<usize>,
    flush_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// Completion of the last batch started (true: durable).
    previous_flush: RefCell<Option<oneshot::Receiver<bool>>>,
    /// Keys with a new version between taking its seq and installing it.
    /// A conditional write may only start when its key has none: then no
    /// refused conditional record can carry a higher seq than the version
    /// that won (recovery picks the highest seq).
    keys_writing: RefCell<std::collections::HashMap<(String, String), u32>>,
    /// Multipart uploads being completed or aborted: no part may be
    /// installed for them any more (bucket, upload index key).
    uploads_ending: RefCell<std::collections::HashSet<(String, String)>>,
    /// Completions under way and recently completed uploads (see `mpu`).
    mpu: mpu::MpuState,
    /// Batch write + fdatasync, and request-path segment reads.
    device_write: crate::metrics::Histogram,
    device_read: crate::metrics::Histogram,
    /// The shard's data ring: batches are written with WRITE_FIXED from its
    /// registered buffers when attached (O_DIRECT files only).
    ring: RefCell<Option<Rc<crate::ring::DataRing>>>,
    crc_cache: RefCell<record_cache::RecordCache<Rc<[u32]>>>,
    header_cache: RefCell<record_cache::RecordCache<Rc<CachedHeader>>>,
}

/// What a read needs of an object's record header when the object is not
/// read whole with it (stored in extents, or inline but large).
struct CachedHeader {
    seq: u64,
    meta: ObjectMeta,
    extents: Vec<record::ExtentRef>,
    /// The record's own payload CRCs (inline objects; empty otherwise).
    block_crcs: Rc<[u32]>,
}

impl CachedHeader {
    fn heap_bytes(h: &Rc<CachedHeader>) -> usize {
        let m = &h.meta;
        std::mem::size_of::<CachedHeader>()
            + m.etag.len()
            + m.content_type.len()
            + m.headers
                .iter()
                .map(|(k, v)| 48 + k.len() + v.len())
                .sum::<usize>()
            + h.extents.len() * std::mem::size_of::<record::ExtentRef>()
            + std::mem::size_of_val(&h.block_crcs[..])
    }
}

/// Counters, read by tests, benchmarks and (later) /metrics.
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    pub flushes: u64,
    pub records_written: u64,
    pub bytes_written: u64,
    pub write_errors: u64,
    pub corrupt_reads: u64,
    pub segments_compacted: u64,
    pub compaction_bytes_copied: u64,
    pub compaction_bytes_freed: u64,
    pub scrub_passes: u64,
    pub scrub_bytes: u64,
    pub scrub_corrupt_records: u64,
    pub scrub_last_pass_unix_ms: u64,
    pub scrub_last_pass_corrupt: u64,
    /// Extent block-CRC lookups answered from memory / read from disk.
    pub crc_cache_hits: u64,
    pub crc_cache_misses: u64,
    /// The same for extent-stored objects' headers.
    pub header_cache_hits: u64,
    pub header_cache_misses: u64,
    /// Ranges of segment bytes that scans (recovery, compaction, scrub)
    /// could not read as records: damaged records, each lost on its own.
    pub damaged_regions: u64,
    /// Segments compaction left alone because a scan found damage.
    pub compaction_skipped_damaged: u64,
}

/// Summary of a recovery, printed at start-up.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub segments: u64,
    pub records: u64,
    pub objects: u64,
    pub bytes_scanned: u64,
    pub torn_tails_cut: u64,
    pub corrupt_records: u64,
    /// Damaged byte ranges found inside segments (see `scan`).
    pub damaged_regions: u64,
    pub elapsed_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListItem {
    Object {
        key: String,
        size_bytes: u64,
        etag: Box<str>,
        mtime_ms: u64,
    },
    Prefix(String),
}

impl ListItem {
    pub fn name(&self) -> &str {
        match self {
            ListItem::Object { key, .. } => key,
            ListItem::Prefix(p) => p,
        }
    }
}

#[derive(Clone)]
pub struct Store {
    inner: Rc<Inner>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn segment_path(dir: &Path, segment_id: u64) -> PathBuf {
    dir.join(format!("seg-{segment_id:016x}.pcs"))
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("seg-")?.strip_suffix(".pcs")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

impl Store {
    /// Opens (recovering) the store in `cfg.dir` and starts its flusher and
    /// compactor tasks on the current executor.
    pub async fn open(cfg: StoreConfig) -> Result<(Store, RecoveryReport)> {
        if !cfg.dir.is_dir() {
            std::fs::create_dir_all(&cfg.dir)?;
            // The new directory's entry must be durable before any segment
            // in it is acknowledged.
            if let Some(parent) = cfg.dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                file::sync_dir_real(parent)?;
            }
        }
        if cfg.direct_io {
            file::prime_iopoll_probe(&cfg.dir).await?;
        }
        let (doorbell, doorbell_rx) = glommio::channels::local_channel::new_bounded(1);
        let crc_cache = RefCell::new(record_cache::RecordCache::new(
            cfg.crc_cache_bytes_max,
            |c: &Rc<[u32]>| std::mem::size_of_val(&c[..]),
        ));
        let header_cache = RefCell::new(record_cache::RecordCache::new(
            cfg.header_cache_bytes_max,
            CachedHeader::heap_bytes,
        ));
        let inner = Rc::new(Inner {
            cfg,
            index: RefCell::new(BTreeMap::new()),
            segments: RefCell::new(BTreeMap::new()),
            active: Cell::new(None),
            write_offset: Cell::new(0),
            next_segment_id: Cell::new(1),
            next_seq: Cell::new(Some(1)),
            shard_secret: Cell::new(0),
            queue: RefCell::new(VecDeque::new()),
            queue_bytes: Cell::new(0),
            doorbell,
            doorbell_rx: RefCell::new(Some(doorbell_rx)),
            space_waiters: RefCell::new(Vec::new()),
            shutting_down: Cell::new(false),
            uncertain: RefCell::new(Default::default()),
            stats: RefCell::new(StoreStats::default()),
            pins: RefCell::new(std::collections::HashMap::new()),
            flushes_in_flight: Cell::new(0),
            flush_waiters: RefCell::new(Vec::new()),
            previous_flush: RefCell::new(None),
            keys_writing: RefCell::new(std::collections::HashMap::new()),
            uploads_ending: RefCell::new(std::collections::HashSet::new()),
            mpu: Default::default(),
            device_write: Default::default(),
            device_read: Default::default(),
            ring: RefCell::new(None),
            crc_cache,
            header_cache,
        });
        let store = Store { inner };
        let report = recovery::recover(&store).await?;
        store.spawn_tasks();
        match store.sweep_orphan_parts().await {
            Ok(0) => {}
            Ok(swept) => tracing::info!(
                shard = store.inner.cfg.shard_id,
                swept,
                "dropped multipart parts whose upload had ended"
            ),
            // A full disk must not keep the server from starting (to delete
            // data); the sweep runs again at the next start.
            Err(e) => tracing::warn!(
                shard = store.inner.cfg.shard_id,
                "could not drop multipart parts whose upload had ended: {e}"
            ),
        }
        Ok((store, report))
    }

    fn spawn_tasks(&self) {
        let rx = self
            .inner
            .doorbell_rx
            .borrow_mut()
            .take()
            .expect("tasks spawned once");
        let flusher = self.clone();
        glommio::spawn_local(async move { flusher.flush_loop(rx).await }).detach();
        self.spawn_periodic(self.inner.cfg.compaction_interval_ms, |store| async move {
            if let Err(e) = store.compact_once().await {
                tracing::warn!(shard = store.inner.cfg.shard_id, "compaction failed: {e}");
            }
        });
        self.spawn_periodic(self.inner.cfg.scrub_interval_ms, |store| async move {
            match store.scrub_pass().await {
                Ok(r) => tracing::info!(
                    shard = store.inner.cfg.shard_id,
                    segments = r.segments,
                    bytes = r.bytes_read,
                    corrupt = r.findings.len(),
                    elapsed_ms = r.elapsed_ms,
                    "scrub pass done"
                ),
                Err(e) => tracing::warn!(shard = store.inner.cfg.shard_id, "scrub failed: {e}"),
            }
        });
    }

    /// Runs `job` every `interval_ms` (0: never) until the store is dropped
    /// or shuts down; the task holds only a weak reference between runs.
    fn spawn_periodic<F, Fut>(&self, interval_ms: u64, job: F)
    where
        F: Fn(Store) -> Fut + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        if interval_ms == 0 {
            return;
        }
        let weak = Rc::downgrade(&self.inner);
        let interval = Duration::from_millis(interval_ms);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.shutting_down.get() {
                    return;
                }
                job(Store { inner }).await;
            }
        })
        .detach();
    }

    pub fn shard_id(&self) -> u32 {
        self.inner.cfg.shard_id
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    pub fn stats(&self) -> StoreStats {
        let (crcs, headers) = (
            self.inner.crc_cache.borrow(),
            self.inner.header_cache.borrow(),
        );
        StoreStats {
            crc_cache_hits: crcs.hits,
            crc_cache_misses: crcs.misses,
            header_cache_hits: headers.hits,
            header_cache_misses: headers.misses,
            ..self.inner.stats.borrow().clone()
        }
    }

    /// Writes batches through `ring` (WRITE_FIXED) from now on.
    pub fn attach_ring(&self, ring: Rc<crate::ring::DataRing>) {
        *self.inner.ring.borrow_mut() = Some(ring);
    }

    /// (device write, device read) latency histograms.
    pub fn device_latency(
        &self,
    ) -> (
        crate::metrics::HistogramSnapshot,
        crate::metrics::HistogramSnapshot,
    ) {
        (
            self.inner.device_write.snapshot(),
            self.inner.device_read.snapshot(),
        )
    }

    fn fault(&self, point: FaultPoint) -> io::Result<()> {
        if let Some(hook) = &self.inner.cfg.faults {
            if let Some(e) = (hook.borrow_mut())(point) {
                return Err(e);
            }
        }
        Ok(())
    }

    pub(crate) fn is_pinned(&self, segment_id: u64) -> bool {
        self.inner.pins.borrow().contains_key(&segment_id)
    }

    fn pin(&self, segment_id: u64) {
        *self.inner.pins.borrow_mut().entry(segment_id).or_default() += 1;
    }

    fn unpin(&self, segment_id: u64) {
        let mut pins = self.inner.pins.borrow_mut();
        if let Some(n) = pins.get_mut(&segment_id) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&segment_id);
            }
        }
    }

    fn take_seq(&self) -> Result<u64> {
        let seq = self.inner.next_seq.get().ok_or_else(|| {
            StoreError::Invalid("this shard has used every sequence number; no write can be ordered after the last one".into())
        })?;
        self.inner.next_seq.set(seq.checked_add(1));
        Ok(seq)
    }

    // ----------------------------------------------------------------------
    // Write path
    // ----------------------------------------------------------------------

    /// Queues a record; the receiver resolves once it is durable.
    async fn append(
        &self,
        header: Vec<u8>,
        payload: Bytes,
    ) -> Result<oneshot::Receiver<Result<Loc>>> {
        // A header whose payload length disagrees with the bytes that follow
        // would make every later record in the segment unreadable.
        if header.len() < record::FIXED_HEADER_BYTES
            || u64::from_le_bytes(header[16..24].try_into().unwrap()) != payload.len() as u64
        {
            return Err(StoreError::Invalid(
                "record payload length does not match its header".into(),
            ));
        }
        let span = record::record_span_bytes(header.len() as u64, payload.len() as u64);
        debug_assert!(
            span <= self
                .inner
                .cfg
                .batch_bytes_max
                .max(self.inner.cfg.chunk_bytes * 2)
        );
        // Back-pressure: wait while the queue is over its bound.
        while self.inner.queue_bytes.get() + span > self.inner.cfg.queue_bytes_max
            && !self.inner.queue.borrow().is_empty()
        {
            if self.inner.shutting_down.get() {
                return Err(StoreError::ShuttingDown);
            }
            let (tx, rx) = oneshot::channel();
            self.inner.space_waiters.borrow_mut().push(tx);
            let _ = rx.await;
        }
        if self.inner.shutting_down.get() {
            return Err(StoreError::ShuttingDown);
        }
        let (done, rx) = oneshot::channel();
        self.inner
            .queue_bytes
            .set(self.inner.queue_bytes.get() + span);
        self.inner.queue.borrow_mut().push_back(Pending {
            header,
            payload,
            done,
        });
        let _ = self.inner.doorbell.try_send(());
        Ok(rx)
    }

    async fn append_durable(&self, header: Vec<u8>, payload: Bytes) -> Result<Loc> {
        let rx = self.append(header, payload).await?;
        rx.await.map_err(|_| StoreError::ShuttingDown)?
    }

    async fn flush_loop(self, rx: glommio::channels::local_channel::LocalReceiver<()>) {
        loop {
            if self.inner.queue.borrow().is_empty() {
                if self.inner.shutting_down.get() {
                    self.wait_flushes_below(1).await;
                    return;
                }
                if rx.recv().await.is_none() {
                    return;
                }
                continue;
            }
            // A second batch goes out while one is in flight only when enough
            // is queued to fill it; otherwise waiting packs more into it
            // (each batch wastes up to 4 KiB of padding).
            if self.inner.queue_bytes.get() < self.inner.cfg.batch_bytes_max / 2 {
                self.wait_flushes_below(1).await;
            } else {
                self.wait_flushes_below(FLUSHES_IN_FLIGHT_MAX).await;
            }
            self.start_flush().await;
        }
    }

    /// Waits until fewer than `n` batches are being written.
    async fn wait_flushes_below(&self, n: usize) {
        while self.inner.flushes_in_flight.get() >= n {
            let (tx, rx) = oneshot::channel();
            self.inner.flush_waiters.borrow_mut().push(tx);
            let _ = rx.await;
        }
    }

    /// Takes up to `batch_bytes_max` of queued records that fit in the active
    /// segment, lays them out after the previous batch and starts writing
    /// them (one write per MiB, then one fdatasync). Batches are written
    /// concurrently but acknowledged strictly in order: a batch completes only
    /// after every batch before it in the segment is durable, so recovery
    /// never finds a torn batch in front of an acknowledged one.
    async fn start_flush(&self) {
        if let Err(e) = self.ensure_active_segment().await {
            self.fail_queue_front(e);
            return;
        }
        let segment_id = self.inner.active.get().expect("active segment");
        let start = self.inner.write_offset.get();
        debug_assert_eq!(start % WRITE_ALIGN_BYTES, 0);
        let room = self
            .inner
            .cfg
            .segment_bytes_max
            .saturating_sub(start + WRITE_ALIGN_BYTES);
        let mut batch = self.take_batch(room);
        if batch.is_empty() {
            // The next record does not fit: seal and move on.
            self.seal_active().await;
            return;
        }
        let (locs, end) = layout(segment_id, start, &batch);
        let key = self
            .segment_key(segment_id)
            .expect("active segment is open");
        for (p, loc) in batch.iter_mut().zip(&locs) {
            record::bind_header(&mut p.header, &key, loc.offset);
        }
        let len = (end - start).next_multiple_of(WRITE_ALIGN_BYTES);
        self.inner.write_offset.set(start + len);
        let previous = self.inner.previous_flush.borrow_mut().take();
        let (done_tx, done_rx) = oneshot::channel();
        *self.inner.previous_flush.borrow_mut() = Some(done_rx);
        self.inner
            .flushes_in_flight
            .set(self.inner.flushes_in_flight.get() + 1);
        let store = self.clone();
        glommio::spawn_local(async move {
            let written = store
                .write_batch(segment_id, start, len, &batch, &locs)
                .await;
            let previous_ok = match previous {
                Some(rx) => rx.await.unwrap_or(false),
                None => true,
            };
            let ok = written.is_ok() && previous_ok;
            if ok {
                store.batch_durable(segment_id, end, len, batch, locs);
            } else {
                store.cut_failed_batch(segment_id, start, &batch).await;
                let e = written.err().unwrap_or_else(|| {
                    StoreError::Io(io::Error::other("an earlier write of this segment failed"))
                });
                store.batch_failed(segment_id, e, batch);
            }
            let _ = done_tx.send(ok);
            store
                .inner
                .flushes_in_flight
                .set(store.inner.flushes_in_flight.get() - 1);
            for w in store.inner.flush_waiters.borrow_mut().drain(..) {
                let _ = w.send(());
            }
        })
        .detach();
    }

    fn batch_durable(
        &self,
        segment_id: u64,
        end: u64,
        len: u64,
        batch: Vec<Pending>,
        locs: Vec<Loc>,
    ) {
        if let Some(seg) = self.inner.segments.borrow_mut().get_mut(&segment_id) {
            seg.end_bytes = seg.end_bytes.max(end);
        }
        {
            let mut stats = self.inner.stats.borrow_mut();
            stats.flushes += 1;
            stats.records_written += batch.len() as u64;
            stats.bytes_written += len;
        }
        for (p, loc) in batch.into_iter().zip(locs) {
            let _ = p.done.send(Ok(loc));
        }
    }

    /// A failed batch may still have reached the file whole (the fsync
    /// failed, or a later batch's write landed while an earlier one failed).
    /// Its records were never acknowledged, but recovery would find them and
    /// let one win over what was acknowledged later: a DELETE of a key that
    /// looked absent writes no tombstone. So the batch is cut off the
    /// abandoned segment (each failed batch cuts at its own start, after its
    /// own write finished; batches fail in order, so the file ends up cut at
    /// the first failed batch, later space reading as zero padding). Found by
    /// the fault-injection model test (server/tests/faults.rs).
    async fn cut_failed_batch(&self, segment_id: u64, start: u64, batch: &[Pending]) {
        let Some(file) = self.segment_file(segment_id) else {
            return;
        };
        let cut = async {
            self.fault(FaultPoint::Write {
                segment_id,
                offset: start,
                len_bytes: 0,
            })?;
            file.truncate(start).await?;
            file.sync().await
        }
        .await;
        if let Err(e) = cut {
            tracing::error!(
                shard = self.inner.cfg.shard_id,
                segment_id,
                start,
                "cannot cut a failed batch off its segment ({e}); its keys keep tombstones until restart"
            );
            let mut uncertain = self.inner.uncertain.borrow_mut();
            for p in batch {
                if let Ok((h, _)) = record::parse_header(&p.header) {
                    if matches!(h.kind(), Kind::Object | Kind::Tombstone) {
                        uncertain.insert((h.bucket, h.key));
                    }
                }
            }
        }
    }

    pub(crate) fn is_uncertain(&self, bucket: &str, key: &str) -> bool {
        let u = self.inner.uncertain.borrow();
        !u.is_empty() && u.contains(&(bucket.to_string(), key.to_string()))
    }

    fn batch_failed(&self, segment_id: u64, e: StoreError, batch: Vec<Pending>) {
        self.inner.stats.borrow_mut().write_errors += 1;
        tracing::error!(
            shard = self.inner.cfg.shard_id,
            segment_id,
            "write failed: {e}"
        );
        // Abandon this segment: later writes go to a fresh one, so a partial
        // write never sits in front of acknowledged data.
        if self.inner.active.get() == Some(segment_id) {
            self.inner.active.set(None);
        }
        for p in batch {
            let _ = p.done.send(Err(e.clone_for_waiter()));
        }
    }

    fn take_batch(&self, room_bytes: u64) -> Vec<Pending> {
        let mut queue = self.inner.queue.borrow_mut();
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        while let Some(p) = queue.front() {
            let span = p.span_bytes();
            if bytes + span > room_bytes
                || (bytes > 0 && bytes + span > self.inner.cfg.batch_bytes_max)
            {
                break;
            }
            bytes += span;
            batch.push(queue.pop_front().unwrap());
        }
        drop(queue);
        self.inner
            .queue_bytes
            .set(self.inner.queue_bytes.get() - bytes);
        for w in self.inner.space_waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
        batch
    }

    fn fail_queue_front(&self, e: StoreError) {
        let batch = self.take_batch(u64::MAX);
        self.inner.stats.borrow_mut().write_errors += 1;
        for p in batch {
            let _ = p.done.send(Err(e.clone_for_waiter()));
        }
    }

    /// Writes one laid-out batch and makes it durable.
    async fn write_batch(
        &self,
        segment_id: u64,
        start: u64,
        len: u64,
        batch: &[Pending],
        locs: &[Loc],
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let result = self
            .write_batch_inner(segment_id, start, len, batch, locs)
            .await;
        self.inner.device_write.record(started.elapsed());
        result
    }

    async fn write_batch_inner(
        &self,
        segment_id: u64,
        start: u64,
        len: u64,
        batch: &[Pending],
        locs: &[Loc],
    ) -> Result<()> {
        let file = self
            .segment_file(segment_id)
            .expect("segment with batches in flight is open");
        // Several concurrent writes of at most WRITE_PIECE_BYTES give the
        // device queue depth; then one fdatasync.
        let piece_len = |i: u64| (len - i * WRITE_PIECE_BYTES).min(WRITE_PIECE_BYTES) as usize;
        let count = len.div_ceil(WRITE_PIECE_BYTES);
        let ring = self.inner.ring.borrow().clone().filter(|r| {
            file.direct_fd().is_some()
                && r.pool()
                    .is_some_and(|p| p.buf_bytes() as u64 >= WRITE_PIECE_BYTES)
        });
        let mut pieces: Vec<file::WriteBuf> = Vec::with_capacity(count as usize);
        for i in 0..count {
            // Never wait for a registered buffer here: GETs to slow clients
            // may hold them all, and durable writes must not wait on reads.
            let registered = ring
                .as_ref()
                .and_then(|r| r.pool().expect("checked").try_acquire());
            pieces.push(match registered {
                Some(buf) => file::WriteBuf::pool(buf, piece_len(i)),
                None => file.alloc_write_buf(piece_len(i)),
            });
        }
        for (p, loc) in batch.iter().zip(locs) {
            let at = loc.offset - start;
            copy_into_pieces(&mut pieces, at, &p.header);
            copy_into_pieces(&mut pieces, at + p.header.len() as u64, &p.payload);
        }
        let mut torn = None;
        if let Err(e) = self.fault(FaultPoint::Write {
            segment_id,
            offset: start,
            len_bytes: len,
        }) {
            // A torn write goes to the file (damaged) and then fails; a
            // short one stops early, leaving nothing beyond its end.
            let t = file::TornWrite::of(&e).ok_or_else(|| StoreError::from_io(e))?;
            let fill = if t.garbage { 0xA5 } else { 0 };
            let keep_bytes = if t.short {
                t.bytes / WRITE_ALIGN_BYTES * WRITE_ALIGN_BYTES
            } else {
                t.bytes
            };
            for (i, piece) in pieces.iter_mut().enumerate() {
                let piece_start = i as u64 * WRITE_PIECE_BYTES;
                let keep = keep_bytes.saturating_sub(piece_start) as usize;
                if t.short {
                    piece.truncate(keep);
                    continue;
                }
                let out = piece.as_mut_slice();
                if keep < out.len() {
                    out[keep..].fill(fill);
                }
            }
            if t.short {
                pieces.retain_mut(|p| !p.as_mut_slice().is_empty());
            }
            torn = Some(t);
        }
        let fd = ring.as_ref().and_then(|r| file.ring_target(r));
        let writes = pieces.into_iter().enumerate().map(|(i, piece)| {
            let (file, ring) = (file.clone(), ring.clone());
            async move {
                let offset = start + i as u64 * WRITE_PIECE_BYTES;
                match (piece, ring, fd) {
                    (file::WriteBuf::Pool(buf), Some(ring), Some(fd)) => {
                        let expected = buf.len();
                        let (result, _buf) = ring.write_fixed(fd, buf, offset).await;
                        match result? {
                            n if n == expected => Ok(()),
                            n => Err(io::Error::new(
                                io::ErrorKind::WriteZero,
                                format!("short write: {n} of {expected} bytes"),
                            )),
                        }
                    }
                    (piece, _, _) => file.write_at(piece, offset).await,
                }
            }
        });
        for result in futures::future::join_all(writes).await {
            result.map_err(StoreError::from_io)?;
        }
        if let Some(t) = torn {
            let kind = if t.short {
                io::ErrorKind::WriteZero
            } else {
                io::ErrorKind::Other
            };
            return Err(StoreError::from_io(io::Error::new(
                kind,
                format!("{t}: EIO"),
            )));
        }
        self.fault(FaultPoint::Sync { segment_id })
            .map_err(StoreError::from_io)?;
        file.sync().await.map_err(StoreError::from_io)?;
        Ok(())
    }

    fn segment_file(&self, segment_id: u64) -> Option<Rc<SegFile>> {
        self.inner
            .segments
            .borrow()
            .get(&segment_id)
            .map(|s| s.file.clone())
    }

    fn segment_key(&self, segment_id: u64) -> Option<record::SegKey> {
        self.inner.segments.borrow().get(&segment_id).map(|s| s.key)
    }

    /// A segment's file and key, taken together before any await: once the
    /// read is under way, compaction may drop the segment from the table
    /// (the file stays open through the Rc, and the key is a copy).
    fn segment_handle(&self, segment_id: u64) -> Option<(Rc<SegFile>, record::SegKey)> {
        self.inner
            .segments
            .borrow()
            .get(&segment_id)
            .map(|s| (s.file.clone(), s.key))
    }

    /// Creates a new active segment if there is none.
    async fn ensure_active_segment(&self) -> Result<()> {
        if self.inner.active.get().is_some() {
            return Ok(());
        }
        // Batches of an abandoned segment must settle first: the ordering
        // chain starts afresh with the new segment.
        self.wait_flushes_below(1).await;
        self.inner.previous_flush.borrow_mut().take();
        if self.inner.active.get().is_some() {
            return Ok(());
        }
        let segment_id = self.inner.next_segment_id.get();
        self.fault(FaultPoint::Create { segment_id })
            .map_err(StoreError::from_io)?;
        let path = segment_path(&self.inner.cfg.dir, segment_id);
        let file = (self.inner.cfg.disk)
            .create(&path, self.inner.cfg.direct_io)
            .await
            .map_err(StoreError::from_io)?;
        // Consume the id only once the file exists.
        self.inner.next_segment_id.set(segment_id + 1);
        let key = record::SegKey::v2(self.inner.shard_secret.get(), segment_id);
        let header = record::encode_header_at(
            &Header::segment_record(Body::SegmentHeader {
                shard_id: self.inner.cfg.shard_id,
                segment_id,
                created_ms: now_ms(),
                shard_secret: key.shard_secret,
            }),
            &key,
            0,
        )
        .expect("segment header encodes");
        let mut buf = file.alloc_write_buf(WRITE_ALIGN_BYTES as usize);
        buf.as_mut_slice()[..header.len()].copy_from_slice(&header);
        let written = async {
            self.fault(FaultPoint::Write {
                segment_id,
                offset: 0,
                len_bytes: WRITE_ALIGN_BYTES,
            })?;
            file.write_at(buf, 0).await?;
            file.sync().await?;
            self.inner.cfg.disk.sync_dir(&self.inner.cfg.dir)
        }
        .await;
        if let Err(e) = written {
            let _ = self.inner.cfg.disk.remove_file(&path);
            return Err(StoreError::from_io(e));
        }
        self.inner.segments.borrow_mut().insert(
            segment_id,
            Segment {
                file: Rc::new(file),
                key,
                end_bytes: header.len() as u64,
                live_bytes: 0,
                sealed: false,
                damaged: false,
            },
        );
        self.inner.active.set(Some(segment_id));
        self.inner.write_offset.set(WRITE_ALIGN_BYTES);
        tracing::debug!(shard = self.inner.cfg.shard_id, segment_id, "new segment");
        Ok(())
    }

    /// Writes a Seal record in its own block at `offset` (optionally cutting
    /// the file after it) and syncs. Returns the end of the seal record.
    pub(crate) async fn write_seal(
        &self,
        file: &SegFile,
        key: &record::SegKey,
        offset: u64,
        truncate: bool,
    ) -> io::Result<u64> {
        debug_assert_eq!(offset % WRITE_ALIGN_BYTES, 0);
        let segment_id = key.segment_id;
        let header = record::encode_header_at(&Header::segment_record(Body::Seal), key, offset)
            .expect("seal encodes");
        let mut buf = file.alloc_write_buf(WRITE_ALIGN_BYTES as usize);
        buf.as_mut_slice()[..header.len()].copy_from_slice(&header);
        self.fault(FaultPoint::Seal { segment_id, offset })?;
        file.write_at(buf, offset).await?;
        if truncate {
            file.truncate(offset + WRITE_ALIGN_BYTES).await?;
        }
        file.sync().await?;
        Ok(offset + header.len() as u64)
    }

    /// Writes a Seal record at the end of the active segment. Best effort: a
    /// segment without a seal is fully verified at recovery instead.
    async fn seal_active(&self) {
        // The seal goes after every batch of the segment is durable.
        self.wait_flushes_below(1).await;
        let Some(segment_id) = self.inner.active.take() else {
            return;
        };
        self.inner.previous_flush.borrow_mut().take();
        let (Some(file), Some(key)) = (self.segment_file(segment_id), self.segment_key(segment_id))
        else {
            return;
        };
        let offset = self.inner.write_offset.get();
        let sealed = self.write_seal(&file, &key, offset, false).await;
        if let Some(seg) = self.inner.segments.borrow_mut().get_mut(&segment_id) {
            if let Ok(end) = sealed {
                seg.sealed = true;
                seg.end_bytes = end;
            }
        }
        if let Err(e) = sealed {
            tracing::warn!(
                shard = self.inner.cfg.shard_id,
                segment_id,
                "sealing failed: {e}"
            );
        }
    }

    // ----------------------------------------------------------------------
    // Index maintenance
    // ----------------------------------------------------------------------

    fn entry_spans(entry: &Entry) -> Vec<(u64, u64)> {
        let mut spans = vec![(entry.loc.segment_id, entry.loc.span_bytes())];
        if let State::Live(info) = &entry.state {
            for e in info.extents.iter() {
                spans.push((
                    e.segment_id,
                    record::record_span_bytes(u64::from(e.header_bytes), e.payload_bytes),
                ));
            }
        }
        spans
    }

    fn adjust_live(&self, entry: &Entry, add: bool) {
        let mut segments = self.inner.segments.borrow_mut();
        for (segment_id, bytes) in Self::entry_spans(entry) {
            if let Some(seg) = segments.get_mut(&segment_id) {
                if add {
                    seg.live_bytes += bytes;
                } else {
                    debug_assert!(seg.live_bytes >= bytes, "live bytes underflow");
                    seg.live_bytes = seg.live_bytes.saturating_sub(bytes);
                }
            }
        }
    }

    /// Installs a durable record version if it is newer than what the index
    /// holds. Returns true if it became the current version.
    fn install(&self, bucket: &str, key: &str, new: Entry) -> bool {
        let mut index = self.inner.index.borrow_mut();
        let keys = index.entry(bucket.to_string()).or_default();
        match keys.get_mut(key) {
            Some(old) if old.seq > new.seq || (old.seq == new.seq && old.loc == new.loc) => {
                // A newer version won the race; this record is stale on disk.
                if old.loc != new.loc {
                    old.older_on_disk += 1;
                }
                false
            }
            Some(old) => {
                let old = std::mem::replace(old, new);
                let current = keys.get_mut(key).unwrap();
                current.older_on_disk = old.older_on_disk + 1;
                let current = current.clone();
                drop(index);
                self.adjust_live(&old, false);
                self.adjust_live(&current, true);
                true
            }
            None => {
                let added = new.clone();
                keys.insert(key.to_string(), new);
                drop(index);
                self.adjust_live(&added, true);
                true
            }
        }
    }

    /// The first segment among `extents` that no longer exists (compacted
    /// away before its pin took hold), if any.
    fn missing_segment(&self, extents: &[ExtentRef]) -> Option<u64> {
        let segments = self.inner.segments.borrow();
        extents
            .iter()
            .map(|e| e.segment_id)
            .find(|id| !segments.contains_key(id))
    }

    /// Marks `key` as being written until the guard drops.
    fn start_writing(&self, bucket: &str, key: &str) -> WritingKey {
        let k = (bucket.to_string(), key.to_string());
        *self
            .inner
            .keys_writing
            .borrow_mut()
            .entry(k.clone())
            .or_default() += 1;
        WritingKey {
            store: self.clone(),
            key: k,
        }
    }

    fn is_writing(&self, bucket: &str, key: &str) -> bool {
        self.inner
            .keys_writing
            .borrow()
            .contains_key(&(bucket.to_string(), key.to_string()))
    }

    /// A durable record of `key` that will never be installed: one more
    /// older record on disk, so that its tombstone is kept long enough.
    fn count_stale(&self, bucket: &str, key: &str) {
        if let Some(entry) = self
            .inner
            .index
            .borrow_mut()
            .get_mut(bucket)
            .and_then(|k| k.get_mut(key))
        {
            entry.older_on_disk += 1;
        }
    }

    fn lookup(&self, bucket: &str, key: &str) -> Option<Entry> {
        self.inner.index.borrow().get(bucket)?.get(key).cloned()
    }

    // ----------------------------------------------------------------------
    // Public object API
    // ----------------------------------------------------------------------

    /// Stores a whole object held in memory.
    pub async fn put(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        data: Bytes,
    ) -> Result<ObjectInfo> {
        let mut w = self.put_stream(bucket, key, meta);
        w.write(data).await?;
        w.finish().await
    }

    /// Starts a streamed PUT; nothing is visible until `finish` returns.
    pub fn put_stream(&self, bucket: &str, key: &str, meta: ObjectMeta) -> PutWriter {
        PutWriter {
            store: self.clone(),
            bucket: bucket.to_string(),
            key: key.to_string(),
            meta,
            buffer: Vec::new(),
            written_bytes: 0,
            extents: Vec::new(),
            in_flight: VecDeque::new(),
            pinned: Vec::new(),
            part_of: None,
            condition: None,
        }
    }

    /// Checks a PUT condition against the current version; Ok carries the
    /// current version's seq, to be found unchanged at install time.
    pub fn check_put_condition(
        &self,
        bucket: &str,
        key: &str,
        condition: &PutCondition,
    ) -> Result<Option<u64>> {
        let live = self.lookup(bucket, key).and_then(|e| match e.state {
            State::Live(info) => Some((e.seq, info)),
            State::Deleted => None,
        });
        match (condition, live) {
            (PutCondition::IfNoneMatchAny, None) => Ok(None),
            (PutCondition::IfNoneMatchAny, Some(_)) => Err(StoreError::PreconditionFailed),
            (PutCondition::IfMatch(_), None) => Err(StoreError::NotFound),
            (PutCondition::IfMatch(list), Some((seq, info))) => {
                if etag_list_matches(list, &info.etag) {
                    Ok(Some(seq))
                } else {
                    Err(StoreError::PreconditionFailed)
                }
            }
        }
    }

    /// Index-only metadata (size, ETag, mtime).
    pub fn head(&self, bucket: &str, key: &str) -> Option<ObjectInfo> {
        match self.lookup(bucket, key)?.state {
            State::Live(info) => Some(info),
            State::Deleted => None,
        }
    }

    /// Opens a consistent reader on the current version: full metadata plus
    /// handles on the files holding its bytes (valid even if compaction
    /// later removes them).
    pub async fn open_read(&self, bucket: &str, key: &str) -> Result<ObjectReader> {
        let entry = self.lookup(bucket, key).ok_or(StoreError::NotFound)?;
        let State::Live(info) = &entry.state else {
            return Err(StoreError::NotFound);
        };
        // Small inline records are read whole at once: one I/O per GET.
        let whole = info.extents.is_empty() && entry.loc.span_bytes() <= 256 * 1024;
        if !whole {
            return self.open_by_header(bucket, key, &entry).await;
        }
        let read_len = entry.loc.header_bytes as u64 + entry.loc.payload_bytes;
        let (file, seg_key, raw, header, header_bytes) = self
            .read_object_header(bucket, key, &entry, read_len)
            .await?;
        let Body::Object { meta, .. } = header.body else {
            unreachable!("checked by read_object_header")
        };
        let corrupt = || StoreError::Corrupt {
            segment_id: entry.loc.segment_id,
            offset: entry.loc.offset,
        };
        let cached = ReadResult::slice(&raw, header_bytes, entry.loc.payload_bytes as usize)
            .ok_or_else(corrupt)?;
        if !record::verify_blocks(&header.block_crcs, 0, &cached) {
            self.inner.stats.borrow_mut().corrupt_reads += 1;
            return Err(corrupt());
        }
        Ok(ObjectReader {
            store: self.clone(),
            seq: entry.seq,
            meta,
            parts: vec![Part {
                file,
                key: seg_key,
                segment_id: entry.loc.segment_id,
                record_offset: entry.loc.offset,
                header_bytes: header_bytes as u32,
                object_offset: 0,
                payload_bytes: entry.loc.payload_bytes,
                block_crcs: Some(header.block_crcs.into()),
                cached: Some(cached),
            }],
        })
    }

    /// Reads `read_len` bytes at the record of `entry` and decodes its
    /// header, which must be the object record the index points at. Returns
    /// the segment file too.
    async fn read_object_header(
        &self,
        bucket: &str,
        key: &str,
        entry: &Entry,
        read_len: u64,
    ) -> Result<(Rc<SegFile>, record::SegKey, ReadResult, Header, usize)> {
        let (file, seg_key) = self
            .segment_handle(entry.loc.segment_id)
            .ok_or(StoreError::NotFound)?;
        self.fault(FaultPoint::Read {
            segment_id: entry.loc.segment_id,
            offset: entry.loc.offset,
        })?;
        let read_started = std::time::Instant::now();
        let raw = file.read_at(entry.loc.offset, read_len as usize).await?;
        self.inner.device_read.record(read_started.elapsed());
        let corrupt = || StoreError::Corrupt {
            segment_id: entry.loc.segment_id,
            offset: entry.loc.offset,
        };
        let (header, header_bytes) = record::decode_header(&raw, &seg_key, entry.loc.offset)
            .map_err(|_| {
                self.inner.stats.borrow_mut().corrupt_reads += 1;
                corrupt()
            })?;
        if !matches!(header.body, Body::Object { .. })
            || header.seq != entry.seq
            || header.bucket != bucket
            || header.key != key
        {
            return Err(corrupt());
        }
        Ok((file, seg_key, raw, header, header_bytes))
    }

    /// Opens an object that is not read whole with its header (stored in
    /// extents, or inline but large): the header (metadata, extent list,
    /// inline CRCs) from the shard's header cache, else from disk (then
    /// cached); the payload is read later, piece by piece.
    async fn open_by_header(&self, bucket: &str, key: &str, entry: &Entry) -> Result<ObjectReader> {
        let (seg, off) = (entry.loc.segment_id, entry.loc.offset);
        let cached = self.inner.header_cache.borrow_mut().get(seg, off);
        let header = match cached {
            // (segment, offset) names one record for the life of the
            // process; the seq check is belt and braces.
            Some(h) if h.seq == entry.seq => h,
            _ => {
                let (_, _, _, header, _) = self
                    .read_object_header(bucket, key, entry, u64::from(entry.loc.header_bytes))
                    .await?;
                let Body::Object { meta, extents } = header.body else {
                    unreachable!("checked by read_object_header")
                };
                let block_crcs = if extents.is_empty() {
                    header.block_crcs.into()
                } else {
                    Rc::from([])
                };
                let h = Rc::new(CachedHeader {
                    seq: entry.seq,
                    meta,
                    extents,
                    block_crcs,
                });
                self.inner
                    .header_cache
                    .borrow_mut()
                    .insert(seg, off, h.clone());
                h
            }
        };
        let corrupt = || StoreError::Corrupt {
            segment_id: seg,
            offset: off,
        };
        let mut parts = Vec::with_capacity(header.extents.len().max(1));
        if header.extents.is_empty() {
            let (file, key) = self.segment_handle(seg).ok_or_else(corrupt)?;
            parts.push(Part {
                file,
                key,
                segment_id: seg,
                record_offset: off,
                header_bytes: entry.loc.header_bytes,
                object_offset: 0,
                payload_bytes: entry.loc.payload_bytes,
                block_crcs: Some(header.block_crcs.clone()),
                cached: None,
            });
        }
        let mut object_offset = 0;
        for e in &header.extents {
            let (file, key) = self.segment_handle(e.segment_id).ok_or_else(corrupt)?;
            parts.push(Part {
                file,
                key,
                segment_id: e.segment_id,
                record_offset: e.record_offset,
                header_bytes: e.header_bytes,
                object_offset,
                payload_bytes: e.payload_bytes,
                block_crcs: None,
                cached: None,
            });
            object_offset += e.payload_bytes;
        }
        Ok(ObjectReader {
            store: self.clone(),
            seq: entry.seq,
            meta: header.meta.clone(),
            parts,
        })
    }

    /// Deletes the current version. Returns whether a live object existed.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<bool> {
        match self.lookup(bucket, key) {
            Some(Entry {
                state: State::Live(_),
                ..
            }) => {}
            _ if self.is_uncertain(bucket, key) => {
                self.write_tombstone(bucket, key, Kind::Tombstone).await?;
                return Ok(false);
            }
            _ => return Ok(false),
        }
        self.write_tombstone(bucket, key, Kind::Tombstone).await?;
        Ok(true)
    }

    async fn write_tombstone(&self, bucket: &str, key: &str, kind: Kind) -> Result<()> {
        let _writing = self.start_writing(bucket, key);
        let seq = self.take_seq()?;
        let body = match kind {
            Kind::BucketDelete => Body::BucketDelete { mtime_ms: now_ms() },
            _ => Body::Tombstone { mtime_ms: now_ms() },
        };
        let header = Header {
            seq,
            bucket: bucket.into(),
            key: key.into(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body,
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = self.append_durable(header, Bytes::new()).await?;
        self.install(
            bucket,
            key,
            Entry {
                seq,
                loc,
                state: State::Deleted,
                older_on_disk: 0,
            },
        );
        Ok(())
    }

    /// Keys of `bucket` in order, after `start_after`, starting with
    /// `prefix`; with a delimiter, keys sharing the part up to the next
    /// delimiter collapse into one `Prefix` item. At most `limit` items.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: &str,
        delimiter: Option<&str>,
        limit: usize,
    ) -> Vec<ListItem> {
        let index = self.inner.index.borrow();
        let Some(keys) = index.get(bucket) else {
            return Vec::new();
        };
        let mut items = Vec::new();
        let mut lower: Bound<String> = if start_after >= prefix {
            Bound::Excluded(start_after.to_string())
        } else {
            Bound::Included(prefix.to_string())
        };
        // A continuation that ends on a common prefix resumes after all of it.
        if let Some(d) = delimiter.filter(|d| !d.is_empty()) {
            if let Some(rest) = start_after.strip_prefix(prefix) {
                if rest.ends_with(d) && !rest.is_empty() {
                    match prefix_successor(start_after) {
                        Some(next) => lower = Bound::Included(next),
                        None => return items,
                    }
                }
            }
        }
        // Keys starting with NUL are internal (multipart state), never
        // listed. Applied last, so that no bound computed above (from a
        // token holding a NUL, say) can reach into them.
        if matches!(&lower, Bound::Included(p) | Bound::Excluded(p) if p.starts_with('\0') || p.is_empty())
        {
            lower = Bound::Included("\u{1}".to_string());
        }
        'outer: while items.len() < limit {
            let mut range = keys.range::<String, _>((lower.clone(), Bound::Unbounded));
            loop {
                let Some((key, entry)) = range.next() else {
                    break 'outer;
                };
                if !key.starts_with(prefix) {
                    break 'outer;
                }
                debug_assert!(!key.starts_with('\0'));
                if key.starts_with('\0') {
                    continue;
                }
                let State::Live(info) = &entry.state else {
                    continue;
                };
                if let Some(d) = delimiter.filter(|d| !d.is_empty()) {
                    if let Some(pos) = key[prefix.len()..].find(d) {
                        let common = key[..prefix.len() + pos + d.len()].to_string();
                        let next = prefix_successor(&common);
                        // Every later item sorts after this one: a page
                        // can never hold the same prefix twice.
                        debug_assert!(next.as_deref().is_none_or(|n| n > key.as_str()));
                        items.push(ListItem::Prefix(common));
                        match next {
                            Some(next) => lower = Bound::Included(next),
                            None => break 'outer,
                        }
                        continue 'outer;
                    }
                }
                items.push(ListItem::Object {
                    key: key.clone(),
                    size_bytes: info.size_bytes,
                    etag: info.etag.clone(),
                    mtime_ms: info.mtime_ms,
                });
                if items.len() >= limit {
                    break 'outer;
                }
            }
        }
        items
    }

    /// Live objects in `bucket` on this shard (multipart uploads and parts
    /// are not objects: DeleteBucket discards them).
    pub fn object_count(&self, bucket: &str) -> usize {
        let index = self.inner.index.borrow();
        index.get(bucket).map_or(0, |keys| {
            keys.iter()
                .filter(|(k, e)| matches!(e.state, State::Live(_)) && !mpu::is_internal_key(k))
                .count()
        })
    }

    /// Live objects on this shard, all buckets.
    pub fn objects_total(&self) -> usize {
        let index = self.inner.index.borrow();
        index
            .iter()
            .filter(|(b, _)| b.as_str() != BUCKETS_NAMESPACE)
            .map(|(_, keys)| {
                keys.iter()
                    .filter(|(k, e)| matches!(e.state, State::Live(_)) && !mpu::is_internal_key(k))
                    .count()
            })
            .sum()
    }

    // ----------------------------------------------------------------------
    // Bucket records (on the bucket-owner shard)
    // ----------------------------------------------------------------------

    /// Durably records that `name` exists. Returns false if it already did.
    pub async fn bucket_create(&self, name: &str) -> Result<bool> {
        if self.head(BUCKETS_NAMESPACE, name).is_some() {
            return Ok(false);
        }
        let seq = self.take_seq()?;
        let created_ms = now_ms();
        let header = Header {
            seq,
            bucket: BUCKETS_NAMESPACE.into(),
            key: name.into(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body: Body::Bucket { created_ms },
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = self.append_durable(header, Bytes::new()).await?;
        let info = ObjectInfo {
            size_bytes: 0,
            etag: "".into(),
            mtime_ms: created_ms,
            extents: Box::new([]),
        };
        self.install(
            BUCKETS_NAMESPACE,
            name,
            Entry {
                seq,
                loc,
                state: State::Live(info),
                older_on_disk: 0,
            },
        );
        Ok(true)
    }

    pub async fn bucket_delete(&self, name: &str) -> Result<bool> {
        if self.head(BUCKETS_NAMESPACE, name).is_none() {
            return Ok(false);
        }
        self.write_tombstone(BUCKETS_NAMESPACE, name, Kind::BucketDelete)
            .await?;
        Ok(true)
    }

    /// (name, created_ms) of every bucket recorded here, by name.
    pub fn bucket_records(&self) -> Vec<(String, u64)> {
        self.list(BUCKETS_NAMESPACE, "", "", None, usize::MAX)
            .into_iter()
            .filter_map(|item| match item {
                ListItem::Object { key, mtime_ms, .. } => Some((key, mtime_ms)),
                ListItem::Prefix(_) => None,
            })
            .collect()
    }

    // ----------------------------------------------------------------------
    // Shutdown
    // ----------------------------------------------------------------------

    /// Flushes everything queued and stops the background tasks.
    pub async fn shutdown(&self) {
        while !self.inner.queue.borrow().is_empty() {
            let _ = self.inner.doorbell.try_send(());
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        self.inner.shutting_down.set(true);
        let _ = self.inner.doorbell.try_send(());
        // A sealed segment needs no payload verification at the next start.
        self.seal_active().await;
    }

    /// (segment id, end bytes, live bytes, sealed) for every segment.
    pub fn segment_table(&self) -> Vec<(u64, u64, u64, bool)> {
        self.inner
            .segments
            .borrow()
            .iter()
            .map(|(id, s)| (*id, s.end_bytes, s.live_bytes, s.sealed))
            .collect()
    }
}

/// The least string greater than every string that starts with `prefix`,
/// or None if there is none (`prefix` is empty or all U+10FFFF).
///
/// Keys compare byte-wise, which for UTF-8 is code-point order, so the
/// successor is `prefix` with its last character replaced by the next
/// code point (skipping surrogates), after dropping trailing U+10FFFF.
/// Appending `char::MAX` instead (the old rule) is not an upper bound:
/// `"dir/\u{10FFFF}x"` sorts after `"dir/\u{10FFFF}"`, and a listing
/// that resumed there found the same common prefix forever.
pub fn prefix_successor(prefix: &str) -> Option<String> {
    let mut s = prefix.to_string();
    while let Some(last) = s.pop() {
        let next = match last as u32 + 1 {
            0xD800 => Some('\u{E000}'),
            n => char::from_u32(n),
        };
        if let Some(c) = next {
            s.push(c);
            debug_assert!(s.as_str() > prefix && !s.starts_with(prefix));
            return Some(s);
        }
    }
    None
}

/// See `Inner::keys_writing`.
struct WritingKey {
    store: Store,
    key: (String, String),
}

impl Drop for WritingKey {
    fn drop(&mut self) {
        let mut writing = self.store.inner.keys_writing.borrow_mut();
        if let Some(n) = writing.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                writing.remove(&self.key);
            }
        }
    }
}

/// A streamed PUT in progress.
pub struct PutWriter {
    store: Store,
    bucket: String,
    key: String,
    meta: ObjectMeta,
    buffer: Vec<u8>,
    written_bytes: u64,
    extents: Vec<ExtentRef>,
    in_flight: VecDeque<(u64, oneshot::Receiver<Result<Loc>>)>,
    /// Segments pinned by this PUT's durable extents.
    pinned: Vec<u64>,
    /// For a multipart part: the upload's index key, which must still be
    /// live when the part is installed. Parts always use extents.
    part_of: Option<String>,
    condition: Option<PutCondition>,
}

impl Drop for PutWriter {
    fn drop(&mut self) {
        for segment_id in self.pinned.drain(..) {
            self.store.unpin(segment_id);
        }
    }
}

/// Extent writes in flight per PUT: enough to keep the disk busy.
const PUT_EXTENTS_IN_FLIGHT_MAX: usize = 4;

impl PutWriter {
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn set_etag(&mut self, etag: String) {
        self.meta.etag = etag;
    }

    pub fn set_condition(&mut self, condition: PutCondition) {
        self.condition = Some(condition);
    }

    /// Headers known only once the body is in (a verified checksum).
    pub fn add_headers(&mut self, headers: Vec<(String, String)>) {
        self.meta.headers.extend(headers);
    }

    pub fn written_bytes(&self) -> u64 {
        self.written_bytes + self.buffer.len() as u64
    }

    pub async fn write(&mut self, mut data: Bytes) -> Result<()> {
        let chunk = self.store.inner.cfg.chunk_bytes as usize;
        while !data.is_empty() {
            if self.buffer.len() == chunk {
                let piece = Bytes::from(std::mem::take(&mut self.buffer));
                self.write_extent(piece).await?;
            }
            if self.buffer.is_empty() && data.len() > chunk {
                // Whole chunks pass through without a staging copy.
                let piece = data.split_to(chunk);
                self.write_extent(piece).await?;
                continue;
            }
            let take = (chunk - self.buffer.len()).min(data.len());
            if self.buffer.capacity() == 0 {
                self.buffer.reserve_exact(chunk.min(take.max(64 * 1024)));
            }
            self.buffer.extend_from_slice(&data.split_to(take));
        }
        Ok(())
    }

    async fn write_extent(&mut self, piece: Bytes) -> Result<()> {
        while self.in_flight.len() >= PUT_EXTENTS_IN_FLIGHT_MAX {
            self.collect_one().await?;
        }
        let object_offset = self.written_bytes;
        let header = Header {
            seq: 0,
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            payload_bytes: piece.len() as u64,
            block_crcs: record::block_crcs(&piece),
            body: Body::Extent { object_offset },
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        self.written_bytes += piece.len() as u64;
        let rx = self.store.append(header, piece).await?;
        self.in_flight.push_back((object_offset, rx));
        Ok(())
    }

    async fn collect_one(&mut self) -> Result<()> {
        let (_, rx) = self.in_flight.pop_front().expect("in flight");
        let loc = rx.await.map_err(|_| StoreError::ShuttingDown)??;
        self.store.pin(loc.segment_id);
        self.pinned.push(loc.segment_id);
        self.extents.push(ExtentRef {
            segment_id: loc.segment_id,
            record_offset: loc.offset,
            header_bytes: loc.header_bytes,
            payload_bytes: loc.payload_bytes,
        });
        Ok(())
    }

    /// Makes the object durable and visible. `meta.size_bytes` is set here;
    /// `meta.etag` must be set by the caller.
    pub async fn finish(mut self) -> Result<ObjectInfo> {
        let inline = self.extents.is_empty() && self.in_flight.is_empty() && self.part_of.is_none();
        let payload = if inline {
            Bytes::from(std::mem::take(&mut self.buffer))
        } else {
            if !self.buffer.is_empty() {
                let piece = Bytes::from(std::mem::take(&mut self.buffer));
                self.write_extent(piece).await?;
            }
            while !self.in_flight.is_empty() {
                self.collect_one().await?;
            }
            Bytes::new()
        };
        let store = self.store.clone();
        let size_bytes = if inline {
            payload.len() as u64
        } else {
            self.written_bytes
        };

        self.meta.size_bytes = size_bytes;
        if self.meta.mtime_ms == 0 {
            self.meta.mtime_ms = now_ms();
        }
        let seen = match &self.condition {
            Some(_) if store.is_writing(&self.bucket, &self.key) => {
                return Err(StoreError::ConditionalConflict);
            }
            Some(c) => Some(store.check_put_condition(&self.bucket, &self.key, c)?),
            None => None,
        };
        let _writing = store.start_writing(&self.bucket, &self.key);
        let seq = store.take_seq()?;
        let info = ObjectInfo {
            size_bytes,
            etag: self.meta.etag.clone().into(),
            mtime_ms: self.meta.mtime_ms,
            extents: self.extents.clone().into(),
        };
        let header = Header {
            seq,
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            payload_bytes: payload.len() as u64,
            block_crcs: record::block_crcs(&payload),
            body: Body::Object {
                meta: self.meta.clone(),
                extents: self.extents.clone(),
            },
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = store.append_durable(header, payload).await?;
        // An extent made durable just before its segment was pinned could
        // have been compacted away: then this version must not become visible
        // (recovery drops it too, its extents being gone).
        if let Some(missing) = store.missing_segment(&self.extents) {
            // The record is on disk all the same: count it for the key.
            store.count_stale(&self.bucket, &self.key);
            return Err(StoreError::Invalid(format!(
                "extent segment {missing} vanished during the PUT; retry"
            )));
        }
        // Another write won the race since the condition was checked.
        if let Some(seen) = seen {
            let now = store
                .lookup(&self.bucket, &self.key)
                .filter(|e| matches!(e.state, State::Live(_)))
                .map(|e| e.seq);
            if now != seen {
                store.count_stale(&self.bucket, &self.key);
                return Err(StoreError::PreconditionFailed);
            }
        }
        // A part whose upload was aborted or completed meanwhile stays
        // invisible (start-up sweeps such records, see `mpu`).
        if let Some(upload) = &self.part_of {
            if store.head(&self.bucket, upload).is_none()
                || store.upload_ending(&self.bucket, upload)
            {
                store.count_stale(&self.bucket, &self.key);
                return Err(mpu::UploadError::NoSuchUpload.into());
            }
        }
        store.install(
            &self.bucket,
            &self.key,
            Entry {
                seq,
                loc,
                state: State::Live(info.clone()),
                older_on_disk: 0,
            },
        );
        Ok(info)
    }
}

struct Part {
    file: Rc<SegFile>,
    /// The key of the part's segment, taken with `file` (the segment may
    /// leave the table while the reader holds its file).
    key: record::SegKey,
    segment_id: u64,
    record_offset: u64,
    header_bytes: u32,
    object_offset: u64,
    payload_bytes: u64,
    /// Loaded with the header; None for extents until first read.
    block_crcs: Option<Rc<[u32]>>,
    /// Whole payload, already verified (small inline objects).
    cached: Option<ReadResult>,
}

impl Part {
    /// The part's block CRCs: kept from the object's header (inline), else
    /// from the shard's cache, else read from the extent's header on disk
    /// (and cached).
    async fn load_block_crcs(&mut self, store: &Store) -> Result<Rc<[u32]>> {
        if let Some(c) = &self.block_crcs {
            return Ok(c.clone());
        }
        let cached = store
            .inner
            .crc_cache
            .borrow_mut()
            .get(self.segment_id, self.record_offset);
        let crcs = match cached {
            Some(c) => c,
            None => {
                store.fault(FaultPoint::Read {
                    segment_id: self.segment_id,
                    offset: self.record_offset,
                })?;
                let raw = self
                    .file
                    .read_at(self.record_offset, self.header_bytes as usize)
                    .await?;
                let header = match record::decode_header(&raw, &self.key, self.record_offset) {
                    Ok((h, _))
                        if h.kind() == Kind::Extent && h.payload_bytes == self.payload_bytes =>
                    {
                        h
                    }
                    _ => {
                        store.inner.stats.borrow_mut().corrupt_reads += 1;
                        return Err(StoreError::Corrupt {
                            segment_id: self.segment_id,
                            offset: self.record_offset,
                        });
                    }
                };
                let crcs: Rc<[u32]> = header.block_crcs.into();
                store.inner.crc_cache.borrow_mut().insert(
                    self.segment_id,
                    self.record_offset,
                    crcs.clone(),
                );
                crcs
            }
        };
        self.block_crcs = Some(crcs.clone());
        Ok(crcs)
    }
}

/// Reads one object version; every byte returned has passed its block CRC.
pub struct ObjectReader {
    store: Store,
    pub seq: u64,
    pub meta: ObjectMeta,
    parts: Vec<Part>,
}

impl ObjectReader {
    pub fn size_bytes(&self) -> u64 {
        self.meta.size_bytes
    }

    /// Returns up to `len_bytes` starting at `offset` (fewer at a part
    /// boundary; call again for the rest). Empty only at or past the end.
    pub async fn read(&mut self, offset: u64, len_bytes: u64) -> Result<ReadResult> {
        let Some(index) = self
            .parts
            .iter()
            .position(|p| offset < p.object_offset + p.payload_bytes)
        else {
            return Ok(ReadResult::default());
        };
        let store = self.store.clone();
        let part = &mut self.parts[index];
        let within = offset - part.object_offset;
        let len = len_bytes.min(part.payload_bytes - within);
        if let Some(cached) = &part.cached {
            return Ok(
                ReadResult::slice(cached, within as usize, len as usize).expect("slice in range")
            );
        }
        let corrupt = StoreError::Corrupt {
            segment_id: part.segment_id,
            offset: part.record_offset,
        };
        let crcs = part.load_block_crcs(&store).await?;
        let first_block = within / record::BLOCK_BYTES;
        let end_block = (within + len).div_ceil(record::BLOCK_BYTES);
        let read_start = first_block * record::BLOCK_BYTES;
        let read_end = (end_block * record::BLOCK_BYTES).min(part.payload_bytes);
        let file_offset = part.record_offset + u64::from(part.header_bytes) + read_start;
        store.fault(FaultPoint::Read {
            segment_id: part.segment_id,
            offset: file_offset,
        })?;
        let read_started = std::time::Instant::now();
        let raw = part
            .file
            .read_at(file_offset, (read_end - read_start) as usize)
            .await?;
        store.inner.device_read.record(read_started.elapsed());
        if raw.len() as u64 != read_end - read_start
            || !record::verify_blocks(&crcs, first_block as usize, &raw)
        {
            store.inner.stats.borrow_mut().corrupt_reads += 1;
            return Err(corrupt);
        }
        Ok(
            ReadResult::slice(&raw, (within - read_start) as usize, len as usize)
                .expect("slice in range"),
        )
    }
}

/// O_DIRECT reads on the data ring need 4 KiB-aligned offsets and lengths.
const DIRECT_ALIGN_BYTES: u64 = 4096;

impl ObjectReader {
    /// Like `read`, but the bytes land by DMA in a registered buffer of the
    /// shard's data ring (READ_FIXED), are CRC-checked there, and are
    /// returned as (buffer, start, end) so that the caller can send that
    /// very buffer. None when this part cannot go that way (inline object,
    /// buffered file, range larger than a pool buffer): use `read`.
    pub async fn read_fixed(
        &mut self,
        ring: &crate::ring::DataRing,
        offset: u64,
        len_bytes: u64,
    ) -> Option<Result<(crate::ring::PoolBuf, usize, usize)>> {
        let pool = ring.pool()?;
        let index = self
            .parts
            .iter()
            .position(|p| offset < p.object_offset + p.payload_bytes)?;
        if self.parts[index].cached.is_some() {
            return None;
        }
        let target = self.parts[index].file.ring_target(ring)?;
        let store = self.store.clone();
        let crcs = match self.parts[index].load_block_crcs(&store).await {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        let part = &self.parts[index];
        let within = offset - part.object_offset;
        let len = len_bytes.min(part.payload_bytes - within);
        let first_block = within / record::BLOCK_BYTES;
        let end_block = (within + len).div_ceil(record::BLOCK_BYTES);
        let read_start = first_block * record::BLOCK_BYTES;
        let read_end = (end_block * record::BLOCK_BYTES).min(part.payload_bytes);
        let file_offset = part.record_offset + u64::from(part.header_bytes) + read_start;
        let aligned = file_offset - file_offset % DIRECT_ALIGN_BYTES;
        let skew = (file_offset - aligned) as usize;
        let want = (skew as u64 + read_end - read_start).next_multiple_of(DIRECT_ALIGN_BYTES);
        if want > pool.buf_bytes() as u64 {
            return None;
        }
        if let Err(e) = store.fault(FaultPoint::Read {
            segment_id: part.segment_id,
            offset: file_offset,
        }) {
            return Some(Err(e.into()));
        }
        let corrupt = StoreError::Corrupt {
            segment_id: part.segment_id,
            offset: part.record_offset,
        };
        // No waiting for a buffer: with the pool out (slow clients hold
        // buffers until their sends finish), the caller uses the copy path.
        let buf = pool.try_acquire()?;
        let started = std::time::Instant::now();
        let (result, buf) = ring.read_fixed(target, buf, aligned, want as usize).await;
        store.inner.device_read.record(started.elapsed());
        let n = match result {
            Ok(n) => n,
            Err(e) => return Some(Err(e.into())),
        };
        let data_len = (read_end - read_start) as usize;
        if n < skew + data_len
            || !record::verify_blocks(
                &crcs,
                first_block as usize,
                &buf.as_slice()[skew..skew + data_len],
            )
        {
            store.inner.stats.borrow_mut().corrupt_reads += 1;
            return Some(Err(corrupt));
        }
        let start = skew + (within - read_start) as usize;
        Some(Ok((buf, start, start + len as usize)))
    }
}

pub use compaction::CompactionReport;
mod compaction;

/// For tests and tools: the per-key records currently indexed (bucket, key,
/// seq, deleted).
#[doc(hidden)]
pub fn debug_index(store: &Store) -> Vec<(String, String, u64, bool, u32)> {
    let index = store.inner.index.borrow();
    let mut out = Vec::new();
    for (b, keys) in index.iter() {
        for (k, e) in keys {
            out.push((
                b.clone(),
                k.clone(),
                e.seq,
                e.state == State::Deleted,
                e.older_on_disk,
            ));
        }
    }
    out
}
