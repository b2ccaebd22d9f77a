//! Compaction: relocate the live records of a mostly-dead segment, then
//! delete it.
//!
//! Relocated records keep their sequence number (they are copies of the same
//! version), so a crash half-way leaves two identical versions, which recovery
//! resolves. An object whose extents move gets a re-encoded `Object` record
//! with the same sequence number and the new extent list. Counts of older
//! records (`older_on_disk`) drop only after the victim file is gone, so a
//! tombstone is never dropped while something it hides is still on disk.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;

use super::file::SegFile;
use super::index::{Entry, Key, State};
use super::record::{self, Body, ExtentRef, Kind};
use super::recovery::{scan_segment, verify_payload, ScanResult, Scanned};
use super::{Loc, ObjectInfo, Result, Store, StoreError};

#[derive(Debug, Clone, Default)]
pub struct CompactionReport {
    pub segment_id: u64,
    pub segment_bytes: u64,
    pub live_bytes_before: u64,
    pub records_relocated: u64,
    pub tombstones_dropped: u64,
    pub bytes_copied: u64,
}

/// The segment being compacted, as the table had it when compaction began.
struct Victim {
    segment_id: u64,
    file: Rc<SegFile>,
    key: record::SegKey,
    end_bytes: u64,
    live_bytes: u64,
    sealed: bool,
}

/// What the victim holds, sorted (borrowed from its scan).
struct Plan<'a> {
    /// Current keyed records (objects, tombstones, buckets).
    current: Vec<&'a Scanned>,
    /// Records of keys that are not current: each key loses as many older
    /// records once the file is gone.
    stale: HashMap<Key, u32>,
    /// Per key, the extents in the victim its current version lists.
    moved_extents: HashMap<Key, Vec<&'a Scanned>>,
}

/// An object whose extents moved: (key, its entry before, the place of its
/// rewritten record, what the index will hold).
type Rewritten = (Key, Entry, Loc, ObjectInfo);

/// Phase A's results, not yet in the index.
#[derive(Default)]
struct Copies {
    /// Copies of current records: (key, seq, new place).
    relocated: Vec<(Key, u64, Loc)>,
    rewritten: Vec<Rewritten>,
    /// Tombstones that hide nothing else: dropped once the file is gone.
    drop_tombstones: Vec<(Key, u64)>,
    /// Some record could not be copied: the victim stays.
    keep_victim: bool,
}

impl Store {
    /// Compacts the sealed segment with the most garbage if it passes the
    /// configured ratio. Returns what was done, or None if nothing qualified.
    pub async fn compact_once(&self) -> Result<Option<CompactionReport>> {
        let Some(victim) = self.pick_victim() else {
            return Ok(None);
        };
        self.compact_segment(victim).await.map(Some)
    }

    /// The sealed segment with the most garbage past the ratio; else the
    /// oldest sealed version-1 segment, so that data written before record
    /// version 2 is rewritten in it over time. Never a damaged segment.
    fn pick_victim(&self) -> Option<u64> {
        let active = self.inner.segs.active.get();
        let segments = self.inner.segs.table.borrow();
        let index = self.inner.index.borrow();
        let candidates = || {
            segments.iter().filter(|(id, s)| {
                Some(**id) != active && s.end_bytes > 0 && !s.damaged && !self.is_pinned(**id)
            })
        };
        candidates()
            .map(|(id, s)| {
                let garbage = s.end_bytes.saturating_sub(index.live_bytes(*id));
                (*id, garbage, s.end_bytes)
            })
            .filter(|(_, garbage, end)| {
                *garbage > 0
                    && (*garbage as f64)
                        >= self.inner.cfg.compaction_garbage_ratio_min * (*end as f64)
            })
            .max_by_key(|(_, garbage, _)| *garbage)
            .map(|(id, _, _)| id)
            .or_else(|| {
                candidates()
                    .find(|(_, s)| s.sealed && s.key.version == record::VERSION_1)
                    .map(|(id, _)| *id)
            })
    }

    /// Leaves a segment that a scan found damaged where it is, for good.
    fn keep_damaged(&self, segment_id: u64, at: u64, why: &str) -> StoreError {
        if let Some(seg) = self.inner.segs.table.borrow_mut().get_mut(&segment_id) {
            seg.damaged = true;
        }
        let mut stats = self.inner.stats.borrow_mut();
        stats.compaction_skipped_damaged += 1;
        drop(stats);
        tracing::error!(
            shard = self.inner.cfg.shard_id,
            segment_id,
            at,
            "compaction keeps the segment: {why}"
        );
        StoreError::Corrupt {
            segment_id,
            offset: at,
        }
    }

    fn is_current(&self, key: &Key, segment_id: u64, offset: u64) -> Option<Entry> {
        let entry = self.lookup(&key.0, &key.1)?;
        (entry.loc.segment_id == segment_id && entry.loc.offset == offset).then_some(entry)
    }

    /// Relocates the live records of `segment_id` and deletes it.
    ///
    /// Phase A appends copies and changes nothing in the index. Only if every
    /// current record was copied and every copy is durable does phase B point
    /// the index at the copies and delete the victim. Otherwise the victim
    /// stays, nothing is installed, and each durable copy counts as one more
    /// older record of its key (so no tombstone is dropped too early).
    pub async fn compact_segment(&self, segment_id: u64) -> Result<CompactionReport> {
        let victim = self.victim(segment_id)?;
        let scan = self.scan_victim(&victim).await?;
        let mut report = CompactionReport {
            segment_id,
            segment_bytes: victim.end_bytes,
            live_bytes_before: victim.live_bytes,
            ..Default::default()
        };
        let plan = self.plan(&victim, &scan);
        // Phase A.
        let mut copies = Copies::default();
        self.copy_current(&victim, &plan, &mut copies, &mut report)
            .await;
        self.copy_extents(&victim, &plan, &mut copies, &mut report)
            .await;
        self.check_uncontended(segment_id, &copies)?;
        // Phase B: point the index at the copies, delete the victim, then
        // settle counts and drop tombstones.
        self.switch_index(segment_id, copies.relocated, copies.rewritten);
        self.unlink_victim(segment_id)?;
        self.settle_counts(segment_id, plan.stale, copies.drop_tombstones, &mut report);
        let mut stats = self.inner.stats.borrow_mut();
        stats.segments_compacted += 1;
        stats.compaction_bytes_copied += report.bytes_copied;
        stats.compaction_bytes_freed += victim.end_bytes;
        tracing::info!(
            shard = self.inner.cfg.shard_id,
            segment_id,
            copied = report.bytes_copied,
            "compacted segment"
        );
        Ok(report)
    }

    /// The segment as the table has it, if it may be compacted at all.
    fn victim(&self, segment_id: u64) -> Result<Victim> {
        if self.inner.segs.active.get() == Some(segment_id) {
            return Err(StoreError::Invalid(
                "cannot compact the active segment".into(),
            ));
        }
        if self.is_pinned(segment_id) {
            return Err(StoreError::Invalid(
                "segment holds extents of a PUT in progress".into(),
            ));
        }
        let segments = self.inner.segs.table.borrow();
        let seg = segments.get(&segment_id).ok_or(StoreError::NotFound)?;
        Ok(Victim {
            segment_id,
            file: seg.file.clone(),
            key: seg.key,
            end_bytes: seg.end_bytes,
            live_bytes: self.inner.index.borrow().live_bytes(segment_id),
            sealed: seg.sealed,
        })
    }

    /// Scans the victim; an error (and the segment kept for good) if it
    /// could not be read whole or misses a record the index points to.
    async fn scan_victim(&self, victim: &Victim) -> Result<ScanResult> {
        let segment_id = victim.segment_id;
        let size_bytes = victim.file.size_bytes().await?;
        let scan = scan_segment(self, &victim.file, size_bytes, victim.key).await?;
        // Never delete what could not be read to its end: records after
        // damage that the scan could not find would go with the file.
        if scan.is_damaged(victim.key.version) || (victim.sealed && !scan.sealed) {
            let at = scan
                .damaged
                .first()
                .map(|d| d.0)
                .or(scan.tail_bad_from)
                .unwrap_or(scan.valid_end);
            self.inner.stats.borrow_mut().damaged_regions += scan.damaged.len().max(1) as u64;
            return Err(self.keep_damaged(segment_id, at, "the scan found damaged bytes"));
        }
        // Belt and braces: everything the index holds in the victim was
        // found by the scan (else it would be lost with the file). Nothing
        // is appended to a sealed segment, so this holds for the whole run.
        let seen: std::collections::HashSet<u64> = scan.records.iter().map(|r| r.offset).collect();
        let offsets = self.inner.index.borrow().offsets_in(segment_id);
        if let Some(offset) = offsets.into_iter().find(|o| !seen.contains(o)) {
            return Err(self.keep_damaged(
                segment_id,
                offset,
                "a record the index points to was not found by the scan",
            ));
        }
        Ok(scan)
    }

    /// Sorts the victim's records: current keyed records, stale ones, and
    /// extents by the keys whose current version lists them.
    fn plan<'a>(&self, victim: &Victim, scan: &'a ScanResult) -> Plan<'a> {
        let segment_id = victim.segment_id;
        let mut plan = Plan {
            current: Vec::new(),
            stale: HashMap::new(),
            moved_extents: HashMap::new(),
        };
        let owners = self.inner.index.borrow().extent_owners(segment_id);
        // Records past `end_bytes` belong to batches that failed: never
        // acknowledged, never counted; they vanish with the file.
        for r in scan.records.iter().filter(|r| r.offset < victim.end_bytes) {
            let key = (r.header.bucket.clone(), r.header.key.clone());
            match r.header.kind() {
                Kind::SegmentHeader | Kind::Seal => {}
                Kind::Extent => {
                    // An extent moves with every object that lists it (a
                    // multipart part's extents belong to the completed
                    // object, under another key).
                    for owner in owners.get(&r.offset).into_iter().flatten() {
                        plan.moved_extents.entry(owner.clone()).or_default().push(r);
                    }
                }
                _ => {
                    if self.is_current(&key, segment_id, r.offset).is_some() {
                        plan.current.push(r);
                    } else {
                        *plan.stale.entry(key).or_default() += 1;
                    }
                }
            }
        }
        plan
    }

    /// Phase A, step 1: copies current keyed records (tombstones only while
    /// they still hide something), except objects whose extents move.
    async fn copy_current(
        &self,
        victim: &Victim,
        plan: &Plan<'_>,
        copies: &mut Copies,
        report: &mut CompactionReport,
    ) {
        let segment_id = victim.segment_id;
        let mut pending = Vec::new();
        let mut staged = Vec::new();
        let mut staged_bytes = 0u64;
        for r in &plan.current {
            let key = (r.header.bucket.clone(), r.header.key.clone());
            let Some(entry) = self.is_current(&key, segment_id, r.offset) else {
                continue;
            };
            if plan.moved_extents.contains_key(&key) {
                continue;
            }
            if matches!(entry.state, State::Deleted { .. }) {
                let remaining = entry
                    .older_on_disk
                    .saturating_sub(*plan.stale.get(&key).unwrap_or(&0));
                if remaining == 0 && !self.is_uncertain(&key.0, &key.1) {
                    copies.drop_tombstones.push((key, entry.seq));
                    continue;
                }
            }
            match self.read_for_copy(&victim.file, segment_id, r).await {
                Ok((header, payload)) => {
                    staged_bytes += (header.len() + payload.len()) as u64;
                    staged.push(((key, entry.seq), header, payload));
                }
                Err(e) => {
                    tracing::error!(
                        shard = self.inner.cfg.shard_id,
                        segment_id,
                        offset = r.offset,
                        "compaction keeps the segment: {e}"
                    );
                    copies.keep_victim = true;
                }
            }
            if staged_bytes >= self.inner.cfg.batch_bytes_max {
                pending.extend(
                    self.append_copies(std::mem::take(&mut staged), report)
                        .await,
                );
                staged_bytes = 0;
            }
        }
        pending.extend(self.append_copies(staged, report).await);
        for ((key, seq), rx) in pending {
            match rx {
                Some(rx) => match rx.await {
                    Ok(Ok(loc)) => copies.relocated.push((key, seq, loc)),
                    _ => copies.keep_victim = true, // a failed batch: invisible, uncounted
                },
                None => copies.keep_victim = true,
            }
        }
    }

    /// Phase A, step 2: copies live extents, then writes each affected
    /// object's record again (same seq, new extent list).
    async fn copy_extents(
        &self,
        victim: &Victim,
        plan: &Plan<'_>,
        copies: &mut Copies,
        report: &mut CompactionReport,
    ) {
        let segment_id = victim.segment_id;
        for (key, rs) in &plan.moved_extents {
            match self
                .relocate_extents(&victim.file, segment_id, key, rs, report)
                .await
            {
                Ok(Some(r)) => copies.rewritten.push(r),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(
                        shard = self.inner.cfg.shard_id,
                        segment_id,
                        "compaction keeps the segment: {e}"
                    );
                    copies.keep_victim = true;
                }
            }
        }
    }

    /// Ends phase A. A multipart completion may have started listing the
    /// victim's extents while the copies were made (it pins the segment
    /// first), or a new owner of an extent may have appeared: the victim
    /// stays then, as it does when a copy failed. Nothing is installed, and
    /// every durable keyed copy is one more older record of its key.
    ///
    /// An owner counts as moved only if its current version is the very
    /// version whose record was rewritten (same seq and place) and the
    /// rewrite lists no extent in the victim any more: a key can gain a
    /// newer version that lists victim extents while the copies are made (a
    /// multipart completion listing a part's extents), and that version is
    /// not moved by rewriting the older one, nor wholly by a rewrite planned
    /// from an older version's extents.
    fn check_uncontended(&self, segment_id: u64, copies: &Copies) -> Result<()> {
        let owners = self.inner.index.borrow().extent_owners(segment_id);
        let moved = |owner: &Key| {
            let current = self.lookup(&owner.0, &owner.1);
            copies.rewritten.iter().any(|(key, old, _, info)| {
                key == owner
                    && current
                        .as_ref()
                        .is_some_and(|e| e.seq == old.seq && e.loc == old.loc)
                    && info.extents.iter().all(|e| e.segment_id != segment_id)
            })
        };
        let contended = !copies.keep_victim
            && (self.is_pinned(segment_id) || owners.values().flatten().any(|o| !moved(o)));
        if !copies.keep_victim && !contended {
            return Ok(());
        }
        let mut index = self.inner.index.borrow_mut();
        let keys = copies
            .relocated
            .iter()
            .map(|(k, _, _)| k)
            .chain(copies.rewritten.iter().map(|(k, _, _, _)| k));
        for (bucket, key) in keys {
            index.count_stale(bucket, key);
        }
        if contended {
            return Err(StoreError::Invalid(format!(
                "segment {segment_id} gained a new reference during compaction; kept for a later round"
            )));
        }
        Err(StoreError::Corrupt {
            segment_id,
            offset: 0,
        })
    }

    /// Phase B, step 1: points the index at the copies of records that are
    /// still current; a copy whose key moved on is one more stale record.
    fn switch_index(
        &self,
        segment_id: u64,
        relocated: Vec<(Key, u64, Loc)>,
        rewritten: Vec<Rewritten>,
    ) {
        for ((bucket, key), seq, loc) in relocated {
            self.relocate_entry(&bucket, &key, seq, segment_id, loc);
        }
        for ((bucket, key), old, loc, info) in rewritten {
            let still = self
                .lookup(&bucket, &key)
                .is_some_and(|e| e.seq == old.seq && e.loc == old.loc);
            let mut index = self.inner.index.borrow_mut();
            if still {
                let new = Entry {
                    seq: old.seq,
                    loc,
                    state: State::Live(info),
                    older_on_disk: 0,
                };
                let old_in_victim = old.loc.segment_id == segment_id;
                index.relocate(&bucket, &key, old.loc, new, old_in_victim);
            } else {
                index.count_stale(&bucket, &key);
            }
        }
    }

    /// Phase B, step 2: the victim leaves the table and its file is deleted
    /// (durably: the directory is synced).
    fn unlink_victim(&self, segment_id: u64) -> Result<()> {
        self.remove_segment(segment_id);
        let disk = &self.inner.cfg.disk;
        disk.remove_file(&super::segments::segment_path(
            &self.inner.cfg.dir,
            segment_id,
        ))?;
        disk.sync_dir(&self.inner.cfg.dir)?;
        Ok(())
    }

    /// Phase B, step 3, once the victim's file is gone: its stale records
    /// no longer count for their keys, and tombstones that hid nothing else
    /// are dropped.
    fn settle_counts(
        &self,
        segment_id: u64,
        stale: HashMap<Key, u32>,
        drop_tombstones: Vec<(Key, u64)>,
        report: &mut CompactionReport,
    ) {
        let mut index = self.inner.index.borrow_mut();
        for ((bucket, key), n) in stale {
            index.uncount_stale(&bucket, &key, n);
        }
        for ((bucket, key), seq) in drop_tombstones {
            if index.drop_tombstone(&bucket, &key, seq, segment_id) {
                report.tombstones_dropped += 1;
            }
        }
    }

    pub(super) fn extent_is_live(&self, key: &Key, segment_id: u64, offset: u64) -> bool {
        self.lookup(&key.0, &key.1)
            .is_some_and(|entry| match &entry.state {
                State::Live(info) => info
                    .extents
                    .iter()
                    .any(|e| e.segment_id == segment_id && e.record_offset == offset),
                State::Deleted { .. } | State::Marker { .. } => false,
            })
    }

    /// Copies an object's extents out of the victim and appends its record
    /// again with the new extent list. Nothing in the index changes here.
    /// Returns None if the object changed meanwhile.
    async fn relocate_extents(
        &self,
        file: &SegFile,
        segment_id: u64,
        key: &Key,
        rs: &[&Scanned],
        report: &mut CompactionReport,
    ) -> Result<Option<Rewritten>> {
        let Some(entry) = self.lookup(&key.0, &key.1) else {
            return Ok(None);
        };
        if !rs
            .iter()
            .any(|r| self.extent_is_live(key, segment_id, r.offset))
        {
            return Ok(None);
        }
        let mut staged = Vec::with_capacity(rs.len());
        for r in rs {
            let (header, payload) = self.read_for_copy(file, segment_id, r).await?;
            staged.push((r.offset, header, payload));
        }
        let mut moved: HashMap<u64, ExtentRef> = HashMap::new();
        for (offset, rx) in self.append_copies(staged, report).await {
            let rx = rx.ok_or_else(|| StoreError::Invalid("append refused".into()))?;
            let loc = rx.await.map_err(|_| StoreError::ShuttingDown)??;
            moved.insert(
                offset,
                ExtentRef {
                    segment_id: loc.segment_id,
                    record_offset: loc.offset,
                    header_bytes: loc.header_bytes,
                    payload_bytes: loc.payload_bytes,
                },
            );
        }
        // Re-read the object's record as it is now; it must still be this
        // version and still an object with extents in the victim.
        let (file_now, now_key) = self
            .segment_handle(entry.loc.segment_id)
            .ok_or(StoreError::NotFound)?;
        let raw = file_now
            .read_at(entry.loc.offset, entry.loc.header_bytes as usize)
            .await?;
        let (mut header, _) =
            record::decode_header(&raw, &now_key, entry.loc.offset).map_err(|_| {
                StoreError::Corrupt {
                    segment_id: entry.loc.segment_id,
                    offset: entry.loc.offset,
                }
            })?;
        let still = self
            .lookup(&key.0, &key.1)
            .is_some_and(|e| e.seq == entry.seq && e.loc == entry.loc);
        let Body::Object { extents, .. } = &mut header.body else {
            return Ok(None);
        };
        if !still || header.seq != entry.seq || !extents.iter().any(|e| e.segment_id == segment_id)
        {
            return Ok(None);
        }
        for e in extents.iter_mut() {
            if e.segment_id == segment_id {
                if let Some(new) = moved.get(&e.record_offset) {
                    *e = *new;
                }
            }
        }
        debug_assert_eq!(
            header.payload_bytes, 0,
            "objects with extents have no inline payload"
        );
        let bytes =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = self.append_durable(bytes, Bytes::new()).await?;
        let Body::Object { meta, extents } = header.body else {
            unreachable!()
        };
        let info = ObjectInfo {
            size_bytes: meta.size_bytes,
            stamp: super::meta_stamp(&meta),
            etag: meta.etag.into(),
            mtime_ms: meta.mtime_ms,
            extents: extents.into(),
        };
        report.records_relocated += 1;
        Ok(Some((key.clone(), entry, loc, info)))
    }

    /// Queues a copy of one record's bytes, unchanged, at the end of the log.
    /// Copies are queued together so that group commit packs them densely.
    async fn read_for_copy(
        &self,
        file: &SegFile,
        segment_id: u64,
        r: &Scanned,
    ) -> Result<(Vec<u8>, Bytes)> {
        // Never propagate corruption: a record that fails its CRC stays put
        // (the victim is kept) and the error is reported.
        if r.header.payload_bytes > 0 && !verify_payload(self, file, segment_id, r).await? {
            self.inner.stats.borrow_mut().corrupt_reads += 1;
            return Err(StoreError::Corrupt {
                segment_id,
                offset: r.offset,
            });
        }
        let header_bytes = r.header_bytes as usize;
        let key = self.segment_key(segment_id).ok_or(StoreError::NotFound)?;
        let raw = file
            .read_at(r.offset, header_bytes + r.header.payload_bytes as usize)
            .await?;
        // The copy is bound to its new place when written, which would make
        // any damage since the scan valid there: verify the bytes copied.
        let same = raw.len() == header_bytes + r.header.payload_bytes as usize
            && record::decode_header(&raw[..header_bytes], &key, r.offset)
                .is_ok_and(|(h, n)| n == header_bytes && h == r.header)
            && record::verify_blocks(
                &r.header.block_crcs,
                r.header.block_bytes(),
                0,
                &raw[header_bytes..],
            );
        if !same {
            self.inner.stats.borrow_mut().corrupt_reads += 1;
            return Err(StoreError::Corrupt {
                segment_id,
                offset: r.offset,
            });
        }
        Ok((
            raw[..header_bytes].to_vec(),
            Bytes::copy_from_slice(&raw[header_bytes..]),
        ))
    }

    /// Queues copies back to back, so that group commit packs them into as
    /// few batches as possible, then pauses for the rate limit.
    async fn append_copies<T>(
        &self,
        staged: Vec<(T, Vec<u8>, Bytes)>,
        report: &mut CompactionReport,
    ) -> Vec<(T, Option<oneshot::Receiver<Result<Loc>>>)> {
        let mut out = Vec::with_capacity(staged.len());
        let mut bytes = 0u64;
        for (tag, header, payload) in staged {
            bytes += (header.len() + payload.len()) as u64;
            out.push((tag, self.append(header, payload).await.ok()));
            report.records_relocated += 1;
        }
        report.bytes_copied += bytes;
        self.throttle(bytes).await;
        out
    }

    /// Keeps compaction within its byte rate so foreground I/O keeps going.
    async fn throttle(&self, bytes: u64) {
        let rate = self.inner.cfg.compaction_bytes_per_sec_max;
        if let Some(pause_us) = bytes.saturating_mul(1_000_000).checked_div(rate) {
            if pause_us > 0 {
                glommio::timer::sleep(Duration::from_micros(pause_us)).await;
            }
        }
    }

    /// Points `key` at its relocated copy at `loc` if it is still version
    /// `seq` in the victim; otherwise the copy is one more stale record.
    fn relocate_entry(&self, bucket: &str, key: &str, seq: u64, victim: u64, loc: Loc) {
        let Some(entry) = self.lookup(bucket, key) else {
            return;
        };
        let mut index = self.inner.index.borrow_mut();
        if entry.seq != seq || entry.loc.segment_id != victim {
            // Overwritten meanwhile: the copy is one more stale record.
            index.count_stale(bucket, key);
            return;
        }
        let new = Entry {
            loc,
            ..entry.clone()
        };
        index.relocate(bucket, key, entry.loc, new, true);
    }
}
