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
//!
//! Where things are (this file is the facade: `Store`, its configuration,
//! errors and public types, `open`, and small accessors):
//!
//! | file | responsible for |
//! |------|-----------------|
//! | `record.rs` | the on-disk record format (encode, decode, CRCs) |
//! | `file.rs` | segment file I/O, fault-injection points, the `Disk` |
//! | `sim.rs` | a power-loss model of the file system (tests) |
//! | `scan.rs` | reading a segment's bytes as records (pure, fuzzed) |
//! | `segments.rs` | segment names, the segment table, the active segment, seals, pins |
//! | `index.rs` | the in-memory index and the counts kept consistent with it |
//! | `commit.rs` | append queue, group-commit batches, write + fdatasync, failed batches |
//! | `put.rs` | `PutWriter`: streamed PUTs, PUT conditions |
//! | `read.rs` | `open_read`, `ObjectReader`, the header and CRC caches' use |
//! | `delete.rs` | DELETE (tombstones) |
//! | `meta_update.rs` | rewriting an object's metadata (tags) without its bytes |
//! | `list.rs` | listing keys, counting objects |
//! | `buckets.rs` | bucket records on the bucket-owner shard |
//! | `bucket_config.rs` | bucket configuration documents (CORS, lifecycle, tagging) |
//! | `mpu.rs` | multipart uploads |
//! | `versions.rs` | S3 versioning: version index keys, delete markers, the current version |
//! | `recovery.rs` | rebuilding the index from the segments at start-up |
//! | `compaction.rs` | relocating live records out of mostly-dead segments |
//! | `scrub.rs` | background re-reading of sealed segments |
//! | `record_cache.rs` | bounded caches keyed by record place |
//! | `object_cache.rs` | the object cache: verified payloads, S3-FIFO, keyed by record place |

pub mod bucket_config;
mod buckets;
pub mod checksum;
mod commit;
mod compaction;
mod delete;
pub mod file;
mod index;
mod list;
mod meta_update;
pub mod mpu;
mod object_cache;
mod put;
mod read;
pub mod record;
mod record_cache;
mod recovery;
pub mod scan;
pub mod scrub;
pub(crate) mod segments;
pub mod sim;
pub mod versions;

pub use compaction::CompactionReport;
pub use list::{
    is_replicated_key, prefix_successor, DigestItem, LIST_HIDDEN_MAX, MARKER_DIGEST_ETAG,
};
pub use object_cache::{ObjectCacheStats, Payload};
pub use put::PutWriter;
pub use read::{ObjectReader, ReadOut, FIXED_MIN_BYTES, MERGE_BYTES_MAX};

use std::cell::{Cell, RefCell};
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use thiserror::Error;

use file::{FaultHook, FaultPoint};
use index::{Entry, State};
use record::ExtentRef;

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
    #[error("no such version")]
    NoSuchVersion,
    /// The version named (`named`) or the current version is a delete
    /// marker: `version` is its id.
    #[error("the version is a delete marker")]
    DeleteMarker { version: Option<u64>, named: bool },
    #[error("not supported: {0}")]
    NotSupported(&'static str),
}

/// A conditional PUT (If-None-Match: * or If-Match), decided atomically on
/// the owner shard when the new version is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutCondition {
    /// Only if no object exists.
    IfNoneMatchAny,
    /// Only if the current ETag is one of these (`*`: any). The S3 front
    /// door parses the header's list (`frontend::s3::etag`).
    IfMatch(Vec<String>),
    /// Only if the current version is still the one of this seq (a
    /// rewrite of an object's metadata, see `meta_update`).
    IfSeq(u64),
    /// A replica's copy of its primary's version with this stamp: only
    /// over older versions and tombstones (`Store::key_stamp`); the
    /// version keeps the stamp.
    IfNewer(u64),
    /// A node catching up takes its primary's version (stamped `stamp`)
    /// over its own, only if the key's stamp here is still `seen` (None:
    /// nothing stored): a copy pushed meanwhile is newer and stays.
    Replace { seen: Option<u64>, stamp: u64 },
}

impl PutCondition {
    /// The stamp a replica's copy keeps (None: the store issues one).
    #[must_use]
    pub fn preset_stamp(&self) -> Option<u64> {
        match self {
            PutCondition::IfNewer(stamp) | PutCondition::Replace { stamp, .. } => Some(*stamp),
            _ => None,
        }
    }

    /// Whether a replica's copy may be installed over a key stamped
    /// `have` here (true for conditions that are not a replica's).
    #[must_use]
    pub fn stamp_allows(&self, have: Option<u64>) -> bool {
        match self {
            PutCondition::IfNewer(stamp) => have < Some(*stamp),
            PutCondition::Replace { seen, .. } => have == *seen,
            _ => true,
        }
    }
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
    /// Memory for cached extent block CRCs (see `record_cache`); about 1.1
    /// KiB per 1 MiB extent of 4 KiB blocks, so the default (64 MiB)
    /// covers ~60k extents.
    pub crc_cache_bytes_max: usize,
    /// Memory for cached headers of objects stored in extents (metadata
    /// and extent list: ~200 bytes plus ~24 per MiB of object).
    pub header_cache_bytes_max: usize,
    /// Memory for the object cache (verified payloads of hot objects, see
    /// `object_cache`); 0 turns it off.
    pub object_cache_bytes_max: usize,
    pub faults: Option<FaultHook>,
    /// The file system, or a power-loss model of it (tests).
    pub disk: file::Disk,
    /// Keep each version's replication stamp in `STAMP_HEADER` (a cluster
    /// node's store). A single node stamps versions with their
    /// modification time and writes no header, so its objects keep every
    /// metadata slot they had.
    pub write_stamps: bool,
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
            crc_cache_bytes_max: 64 << 20,
            header_cache_bytes_max: 16 << 20,
            object_cache_bytes_max: 64 << 20,
            faults: None,
            disk: file::Disk::Real,
            write_stamps: false,
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
    /// The version's replication stamp (`meta_stamp`): versions of a key
    /// are ordered by it across a cluster's replicas.
    pub stamp: u64,
    pub extents: Box<[ExtentRef]>,
}

/// Everything a shard's store holds, grouped by concern; each group's
/// fields are documented where the group is defined.
struct Inner {
    cfg: StoreConfig,
    /// The index and its counts (see `index`).
    index: RefCell<index::Index>,
    /// Marks on keys kept beside the index (writes in progress, uploads
    /// ending, keys whose failed records may come back).
    marks: index::KeyMarks,
    /// Open segments, the active one, pins (see `segments`).
    segs: segments::SegmentState,
    /// The append queue and the batches in flight (see `commit`).
    commit: commit::CommitQueue,
    /// Extent block CRCs and object headers (see `read`).
    caches: read::ReadCaches,
    /// None once every sequence number is used (never, short of a u64's
    /// worth of writes): writes then fail instead of wrapping to 0.
    next_seq: Cell<Option<u64>>,
    shutting_down: Cell<bool>,
    stats: RefCell<StoreStats>,
    /// Completions under way and recently completed uploads (see `mpu`).
    mpu: mpu::MpuState,
    /// Batch write + fdatasync, and request-path segment reads.
    device_write: crate::metrics::Histogram,
    device_read: crate::metrics::Histogram,
    /// The shard's data ring: batches are written with WRITE_FIXED from its
    /// registered buffers when attached (O_DIRECT files only).
    ring: RefCell<Option<Rc<crate::ring::DataRing>>>,
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
    /// The object cache's counters and size.
    pub object_cache: ObjectCacheStats,
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
    /// A key's versions, newest first (a listing of versions); not
    /// `complete` when the page ran out within them (nothing of the page
    /// follows it then).
    Versions {
        key: String,
        versions: Vec<versions::VersionEntry>,
        complete: bool,
    },
    /// Nothing to list up to this key (a page that examined its bound of
    /// keys whose current version is a delete marker): resume after it.
    Skipped(String),
}

impl ListItem {
    pub fn name(&self) -> &str {
        match self {
            ListItem::Object { key, .. } | ListItem::Versions { key, .. } => key,
            ListItem::Prefix(p) | ListItem::Skipped(p) => p,
        }
    }
}

#[derive(Clone)]
pub struct Store {
    inner: Rc<Inner>,
}

/// The reserved header (never sent to clients) that holds an object
/// version's replication stamp: a hybrid clock, milliseconds, strictly
/// increasing per key on the node that orders its writes
/// (`Store::issue_stamp`). A tag rewrite gets a new stamp but keeps the
/// modification time, so the two differ. Versions written without one
/// (before clusters replicated) stamp with their modification time.
pub const STAMP_HEADER: &str = "x-percore-stamp";

/// The stamp of a stored version's metadata.
#[must_use]
pub fn meta_stamp(meta: &record::ObjectMeta) -> u64 {
    meta.headers
        .iter()
        .find(|(n, _)| n == STAMP_HEADER)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(meta.mtime_ms)
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
        let inner = Rc::new(Inner {
            index: Default::default(),
            marks: Default::default(),
            segs: Default::default(),
            commit: commit::CommitQueue::new(),
            caches: read::ReadCaches::new(&cfg),
            next_seq: Cell::new(Some(1)),
            shutting_down: Cell::new(false),
            stats: RefCell::new(StoreStats::default()),
            mpu: Default::default(),
            device_write: Default::default(),
            device_read: Default::default(),
            ring: RefCell::new(None),
            cfg,
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
            .commit
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
            self.inner.caches.crc.borrow(),
            self.inner.caches.header.borrow(),
        );
        StoreStats {
            crc_cache_hits: crcs.hits,
            crc_cache_misses: crcs.misses,
            header_cache_hits: headers.hits,
            header_cache_misses: headers.misses,
            object_cache: self.inner.caches.object.borrow().stats(),
            ..self.inner.stats.borrow().clone()
        }
    }

    /// Empties the object cache (operators; benchmarks of cold reads).
    pub fn drop_object_cache(&self) {
        self.inner.caches.object.borrow_mut().clear();
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

    fn take_seq(&self) -> Result<u64> {
        let seq = self.inner.next_seq.get().ok_or_else(|| {
            StoreError::Invalid("this shard has used every sequence number; no write can be ordered after the last one".into())
        })?;
        self.inner.next_seq.set(seq.checked_add(1));
        Ok(seq)
    }
}

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
                matches!(e.state, State::Deleted { .. }),
                e.older_on_disk,
            ));
        }
    }
    out
}
