//! Segment files: their names (`seg-<id:016x>.pcs`, shared with
//! `percore fsck`), the table of open segments, the active segment that
//! receives appends (created on demand), seals, and pins that keep a
//! segment from being compacted while a PUT lists its extents.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::file::{FaultPoint, SegFile, WRITE_ALIGN_BYTES};
use super::record::{self, Body, ExtentRef, Header};
use super::{now_ms, Result, Store, StoreError};

/// The segment table and the state of appending to it.
pub(super) struct SegmentState {
    /// Every open segment, by id. `Index` tracks the same set (live bytes).
    pub(super) table: RefCell<BTreeMap<u64, Segment>>,
    /// Segment receiving appends; None until the first write (or after an
    /// error, so that the next write starts a fresh segment).
    pub(super) active: Cell<Option<u64>>,
    /// Where the next batch goes in the active segment.
    pub(super) write_offset: Cell<u64>,
    /// Id of the next segment created (set by recovery).
    pub(super) next_id: Cell<u64>,
    /// Random, per shard, in every version-2 segment header: binds record
    /// headers to their place (see `record`). Set by recovery.
    pub(super) shard_secret: Cell<u64>,
    /// Segments holding extents of PUTs in progress: not compacted.
    pub(super) pins: RefCell<HashMap<u64, u32>>,
}

impl Default for SegmentState {
    fn default() -> SegmentState {
        SegmentState {
            table: RefCell::new(BTreeMap::new()),
            active: Cell::new(None),
            write_offset: Cell::new(0),
            next_id: Cell::new(1),
            shard_secret: Cell::new(0),
            pins: RefCell::new(HashMap::new()),
        }
    }
}

pub(super) struct Segment {
    pub(super) file: Rc<SegFile>,
    /// What its record headers are checked against.
    pub(super) key: record::SegKey,
    /// Bytes up to which the segment holds records (valid data end).
    pub(super) end_bytes: u64,
    pub(super) sealed: bool,
    /// A scan found bytes it could not read as records: compaction leaves
    /// the segment alone (deleting it would lose what a repair could save).
    pub(super) damaged: bool,
}

pub fn segment_path(dir: &Path, segment_id: u64) -> PathBuf {
    dir.join(format!("seg-{segment_id:016x}.pcs"))
}

pub fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("seg-")?.strip_suffix(".pcs")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

impl Store {
    pub(super) fn segment_file(&self, segment_id: u64) -> Option<Rc<SegFile>> {
        self.inner
            .segs
            .table
            .borrow()
            .get(&segment_id)
            .map(|s| s.file.clone())
    }

    pub(super) fn segment_key(&self, segment_id: u64) -> Option<record::SegKey> {
        self.inner
            .segs
            .table
            .borrow()
            .get(&segment_id)
            .map(|s| s.key)
    }

    /// A segment's file and key, taken together before any await: once the
    /// read is under way, compaction may drop the segment from the table
    /// (the file stays open through the Rc, and the key is a copy).
    pub(super) fn segment_handle(&self, segment_id: u64) -> Option<(Rc<SegFile>, record::SegKey)> {
        self.inner
            .segs
            .table
            .borrow()
            .get(&segment_id)
            .map(|s| (s.file.clone(), s.key))
    }

    /// Creates a new active segment if there is none.
    pub(super) async fn ensure_active_segment(&self) -> Result<()> {
        if self.inner.segs.active.get().is_some() {
            return Ok(());
        }
        // Batches of an abandoned segment must settle first: the ordering
        // chain starts afresh with the new segment.
        self.wait_flushes_below(1).await;
        self.inner.commit.previous_flush.borrow_mut().take();
        if self.inner.segs.active.get().is_some() {
            return Ok(());
        }
        let segment_id = self.inner.segs.next_id.get();
        self.fault(FaultPoint::Create { segment_id })
            .map_err(StoreError::from_io)?;
        let path = segment_path(&self.inner.cfg.dir, segment_id);
        let file = (self.inner.cfg.disk)
            .create(&path, self.inner.cfg.direct_io)
            .await
            .map_err(StoreError::from_io)?;
        // Consume the id only once the file exists.
        self.inner.segs.next_id.set(segment_id + 1);
        let key = record::SegKey::v2(self.inner.segs.shard_secret.get(), segment_id);
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
        self.add_segment(
            segment_id,
            Segment {
                file: Rc::new(file),
                key,
                end_bytes: header.len() as u64,
                sealed: false,
                damaged: false,
            },
        );
        self.inner.segs.active.set(Some(segment_id));
        self.inner.segs.write_offset.set(WRITE_ALIGN_BYTES);
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
    pub(super) async fn seal_active(&self) {
        // The seal goes after every batch of the segment is durable.
        self.wait_flushes_below(1).await;
        let Some(segment_id) = self.inner.segs.active.take() else {
            return;
        };
        self.inner.commit.previous_flush.borrow_mut().take();
        let (Some(file), Some(key)) = (self.segment_file(segment_id), self.segment_key(segment_id))
        else {
            return;
        };
        let offset = self.inner.segs.write_offset.get();
        let sealed = self.write_seal(&file, &key, offset, false).await;
        if let Some(seg) = self.inner.segs.table.borrow_mut().get_mut(&segment_id) {
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

    /// The first segment among `extents` that no longer exists (compacted
    /// away before its pin took hold), if any.
    pub(super) fn missing_segment(&self, extents: &[ExtentRef]) -> Option<u64> {
        let segments = self.inner.segs.table.borrow();
        extents
            .iter()
            .map(|e| e.segment_id)
            .find(|id| !segments.contains_key(id))
    }

    /// (segment id, end bytes, live bytes, sealed) for every segment.
    pub fn segment_table(&self) -> Vec<(u64, u64, u64, bool)> {
        let index = self.inner.index.borrow();
        self.inner
            .segs
            .table
            .borrow()
            .iter()
            .map(|(id, s)| (*id, s.end_bytes, index.live_bytes(*id), s.sealed))
            .collect()
    }

    /// Adds a segment to the table (and to the index's live-byte counts,
    /// which follow the table).
    pub(super) fn add_segment(&self, segment_id: u64, segment: Segment) {
        let before = self
            .inner
            .segs
            .table
            .borrow_mut()
            .insert(segment_id, segment);
        debug_assert!(before.is_none(), "segment {segment_id} added twice");
        self.inner.index.borrow_mut().track_segment(segment_id);
    }

    /// Takes a segment out of the table, the index's counts and the read
    /// caches; its file stays open while readers hold it.
    pub(super) fn remove_segment(&self, segment_id: u64) {
        self.inner.segs.table.borrow_mut().remove(&segment_id);
        self.inner.index.borrow_mut().forget_segment(segment_id);
        self.inner.caches.forget_segment(segment_id);
    }

    pub(crate) fn is_pinned(&self, segment_id: u64) -> bool {
        self.inner.segs.pins.borrow().contains_key(&segment_id)
    }

    pub(super) fn pin(&self, segment_id: u64) {
        *self
            .inner
            .segs
            .pins
            .borrow_mut()
            .entry(segment_id)
            .or_default() += 1;
    }

    pub(super) fn unpin(&self, segment_id: u64) {
        let mut pins = self.inner.segs.pins.borrow_mut();
        if let Some(n) = pins.get_mut(&segment_id) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&segment_id);
            }
        }
    }
}
