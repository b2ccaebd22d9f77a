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
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;

use super::file::SegFile;
use super::index::{Entry, State};
use super::record::{self, Body, ExtentRef, Kind};
use super::recovery::{scan_segment, verify_payload, Scanned};
use super::{Loc, Result, Store, StoreError};

#[derive(Debug, Clone, Default)]
pub struct CompactionReport {
    pub segment_id: u64,
    pub segment_bytes: u64,
    pub live_bytes_before: u64,
    pub records_relocated: u64,
    pub tombstones_dropped: u64,
    pub bytes_copied: u64,
}

type Key = (String, String);

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
        let active = self.inner.active.get();
        let segments = self.inner.segments.borrow();
        let candidates = || {
            segments.iter().filter(|(id, s)| {
                Some(**id) != active && s.end_bytes > 0 && !s.damaged && !self.is_pinned(**id)
            })
        };
        candidates()
            .map(|(id, s)| (*id, s.end_bytes.saturating_sub(s.live_bytes), s.end_bytes))
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
        if let Some(seg) = self.inner.segments.borrow_mut().get_mut(&segment_id) {
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
        if self.inner.active.get() == Some(segment_id) {
            return Err(StoreError::Invalid(
                "cannot compact the active segment".into(),
            ));
        }
        if self.is_pinned(segment_id) {
            return Err(StoreError::Invalid(
                "segment holds extents of a PUT in progress".into(),
            ));
        }
        let (file, end_bytes, live_bytes, seg_key, sealed) = {
            let segments = self.inner.segments.borrow();
            let seg = segments.get(&segment_id).ok_or(StoreError::NotFound)?;
            (
                seg.file.clone(),
                seg.end_bytes,
                seg.live_bytes,
                seg.key,
                seg.sealed,
            )
        };
        let size_bytes = file.size_bytes().await?;
        let scan = scan_segment(self, &file, size_bytes, seg_key).await?;
        // Never delete what could not be read to its end: records after
        // damage that the scan could not find would go with the file.
        if scan.is_damaged(seg_key.version) || (sealed && !scan.sealed) {
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
        if let Some(offset) = self
            .index_offsets_in(segment_id)
            .into_iter()
            .find(|o| !seen.contains(o))
        {
            return Err(self.keep_damaged(
                segment_id,
                offset,
                "a record the index points to was not found by the scan",
            ));
        }
        let mut report = CompactionReport {
            segment_id,
            segment_bytes: end_bytes,
            live_bytes_before: live_bytes,
            ..Default::default()
        };

        // Records past `end_bytes` belong to batches that failed: never
        // acknowledged, never counted; they vanish with the file.
        let records: Vec<&Scanned> = scan
            .records
            .iter()
            .filter(|r| r.offset < end_bytes)
            .collect();
        // Records in the victim that are not current: their keys lose one
        // older record once the file is gone.
        let mut stale: HashMap<Key, u32> = HashMap::new();
        let mut current: Vec<&Scanned> = Vec::new();
        let mut moved_extents: HashMap<Key, Vec<&Scanned>> = HashMap::new();
        let owners = self.extent_owners(segment_id);
        for r in records {
            let key = (r.header.bucket.clone(), r.header.key.clone());
            match r.header.kind() {
                Kind::SegmentHeader | Kind::Seal => {}
                Kind::Extent => {
                    // An extent moves with every object that lists it (a
                    // multipart part's extents belong to the completed
                    // object, under another key).
                    for owner in owners.get(&r.offset).into_iter().flatten() {
                        moved_extents.entry(owner.clone()).or_default().push(r);
                    }
                }
                _ => {
                    if self.is_current(&key, segment_id, r.offset).is_some() {
                        current.push(r);
                    } else {
                        *stale.entry(key).or_default() += 1;
                    }
                }
            }
        }

        // Phase A, step 1: copy current keyed records (tombstones only while
        // they still hide something), except objects whose extents move.
        let mut keep_victim = false;
        let mut drop_tombstones: Vec<(Key, u64)> = Vec::new();
        let mut pending = Vec::new();
        let mut staged = Vec::new();
        let mut staged_bytes = 0u64;
        for r in current {
            let key = (r.header.bucket.clone(), r.header.key.clone());
            let Some(entry) = self.is_current(&key, segment_id, r.offset) else {
                continue;
            };
            if moved_extents.contains_key(&key) {
                continue;
            }
            if entry.state == State::Deleted {
                let remaining = entry
                    .older_on_disk
                    .saturating_sub(*stale.get(&key).unwrap_or(&0));
                if remaining == 0 && !self.is_uncertain(&key.0, &key.1) {
                    drop_tombstones.push((key, entry.seq));
                    continue;
                }
            }
            match self.read_for_copy(&file, segment_id, r).await {
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
                    keep_victim = true;
                }
            }
            if staged_bytes >= self.inner.cfg.batch_bytes_max {
                pending.extend(
                    self.append_copies(std::mem::take(&mut staged), &mut report)
                        .await,
                );
                staged_bytes = 0;
            }
        }
        pending.extend(self.append_copies(staged, &mut report).await);
        let mut relocated: Vec<(Key, u64, Loc)> = Vec::new();
        for ((key, seq), rx) in pending {
            match rx {
                Some(rx) => match rx.await {
                    Ok(Ok(loc)) => relocated.push((key, seq, loc)),
                    _ => keep_victim = true, // a failed batch: invisible, uncounted
                },
                None => keep_victim = true,
            }
        }

        // Phase A, step 2: copy live extents, then write each affected
        // object's record again (same seq, new extent list).
        let mut rewritten: Vec<(Key, Entry, Loc, super::ObjectInfo)> = Vec::new();
        for (key, rs) in &moved_extents {
            match self
                .relocate_extents(&file, segment_id, key, rs, &mut report)
                .await
            {
                Ok(Some(r)) => rewritten.push(r),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(
                        shard = self.inner.cfg.shard_id,
                        segment_id,
                        "compaction keeps the segment: {e}"
                    );
                    keep_victim = true;
                }
            }
        }

        // A multipart completion may have started listing this segment's
        // extents while the copies were made (it pins the segment first), or
        // a new owner of an extent may have appeared: keep the victim then.
        let contended = !keep_victim
            && (self.is_pinned(segment_id)
                || self
                    .extent_owners(segment_id)
                    .values()
                    .flatten()
                    .any(|owner| !moved_extents.contains_key(owner)));
        if keep_victim || contended {
            // Nothing installed: every durable keyed copy is one more older
            // record of its key.
            let mut index = self.inner.index.borrow_mut();
            let keys = relocated
                .iter()
                .map(|(k, _, _)| k)
                .chain(rewritten.iter().map(|(k, _, _, _)| k));
            for (bucket, key) in keys {
                if let Some(e) = index.get_mut(bucket).and_then(|k| k.get_mut(key)) {
                    e.older_on_disk += 1;
                }
            }
            if contended {
                return Err(StoreError::Invalid(format!(
                    "segment {segment_id} gained a new reference during compaction; kept for a later round"
                )));
            }
            return Err(StoreError::Corrupt {
                segment_id,
                offset: 0,
            });
        }

        // Phase B: point the index at the copies, delete the victim, then
        // settle counts and drop tombstones.
        for ((bucket, key), seq, loc) in relocated {
            self.relocate_entry(&bucket, &key, seq, segment_id, loc);
        }
        for ((bucket, key), old, loc, info) in rewritten {
            let still = self
                .lookup(&bucket, &key)
                .is_some_and(|e| e.seq == old.seq && e.loc == old.loc);
            if still {
                let new = Entry {
                    seq: old.seq,
                    loc,
                    state: State::Live(info),
                    older_on_disk: 0,
                };
                self.replace_entry(&bucket, &key, old.loc, new, segment_id);
            } else if let Some(e) = self
                .inner
                .index
                .borrow_mut()
                .get_mut(&bucket)
                .and_then(|k| k.get_mut(&key))
            {
                e.older_on_disk += 1;
            }
        }
        self.inner.segments.borrow_mut().remove(&segment_id);
        self.inner.crc_cache.borrow_mut().forget_segment(segment_id);
        self.inner
            .header_cache
            .borrow_mut()
            .forget_segment(segment_id);
        let disk = &self.inner.cfg.disk;
        disk.remove_file(&super::segments::segment_path(
            &self.inner.cfg.dir,
            segment_id,
        ))?;
        disk.sync_dir(&self.inner.cfg.dir)?;
        {
            let mut index = self.inner.index.borrow_mut();
            for ((bucket, key), n) in stale {
                if let Some(e) = index.get_mut(&bucket).and_then(|keys| keys.get_mut(&key)) {
                    e.older_on_disk = e.older_on_disk.saturating_sub(n);
                }
            }
            for ((bucket, key), seq) in drop_tombstones {
                if let Some(keys) = index.get_mut(&bucket) {
                    if keys.get(&key).is_some_and(|e| {
                        e.seq == seq && e.state == State::Deleted && e.loc.segment_id == segment_id
                    }) {
                        keys.remove(&key);
                        report.tombstones_dropped += 1;
                    }
                }
            }
        }
        let mut stats = self.inner.stats.borrow_mut();
        stats.segments_compacted += 1;
        stats.compaction_bytes_copied += report.bytes_copied;
        stats.compaction_bytes_freed += end_bytes;
        tracing::info!(
            shard = self.inner.cfg.shard_id,
            segment_id,
            copied = report.bytes_copied,
            "compacted segment"
        );
        Ok(report)
    }

    /// Offsets in `segment_id` of every record the index points to (current
    /// versions and their extents).
    fn index_offsets_in(&self, segment_id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for keys in self.inner.index.borrow().values() {
            for entry in keys.values() {
                if entry.loc.segment_id == segment_id {
                    out.push(entry.loc.offset);
                }
                if let State::Live(info) = &entry.state {
                    out.extend(
                        info.extents
                            .iter()
                            .filter(|e| e.segment_id == segment_id)
                            .map(|e| e.record_offset),
                    );
                }
            }
        }
        out
    }

    /// Is the extent at (`segment_id`, `offset`) part of the current version of `key`?
    /// Record offsets of extents in `segment_id` → the keys whose current
    /// version lists them. One pass over the index per compacted segment.
    fn extent_owners(&self, segment_id: u64) -> HashMap<u64, Vec<Key>> {
        let mut owners: HashMap<u64, Vec<Key>> = HashMap::new();
        for (bucket, keys) in self.inner.index.borrow().iter() {
            for (key, entry) in keys {
                let State::Live(info) = &entry.state else {
                    continue;
                };
                for e in info.extents.iter().filter(|e| e.segment_id == segment_id) {
                    owners
                        .entry(e.record_offset)
                        .or_default()
                        .push((bucket.clone(), key.clone()));
                }
            }
        }
        owners
    }

    pub(super) fn extent_is_live(&self, key: &Key, segment_id: u64, offset: u64) -> bool {
        self.lookup(&key.0, &key.1)
            .is_some_and(|entry| match &entry.state {
                State::Live(info) => info
                    .extents
                    .iter()
                    .any(|e| e.segment_id == segment_id && e.record_offset == offset),
                State::Deleted => false,
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
    ) -> Result<Option<(Key, Entry, Loc, super::ObjectInfo)>> {
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
        let info = super::ObjectInfo {
            size_bytes: meta.size_bytes,
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
            && record::verify_blocks(&r.header.block_crcs, 0, &raw[header_bytes..]);
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

    fn relocate_entry(&self, bucket: &str, key: &str, seq: u64, victim: u64, loc: Loc) {
        let Some(entry) = self.lookup(bucket, key) else {
            return;
        };
        if entry.seq != seq || entry.loc.segment_id != victim {
            // Overwritten meanwhile: the copy is one more stale record.
            if let Some(e) = self
                .inner
                .index
                .borrow_mut()
                .get_mut(bucket)
                .and_then(|k| k.get_mut(key))
            {
                e.older_on_disk += 1;
            }
            return;
        }
        let new = Entry {
            loc,
            ..entry.clone()
        };
        self.replace_entry(bucket, key, entry.loc, new, victim);
    }

    /// Swaps the entry at `old_loc` for `new`, moving live-byte accounting.
    /// The old record counts as an older record unless it sits in `victim`.
    fn replace_entry(&self, bucket: &str, key: &str, old_loc: Loc, mut new: Entry, victim: u64) {
        let old = {
            let mut index = self.inner.index.borrow_mut();
            let Some(slot) = index.get_mut(bucket).and_then(|k| k.get_mut(key)) else {
                return;
            };
            if slot.loc != old_loc {
                return;
            }
            new.older_on_disk = slot.older_on_disk + u32::from(old_loc.segment_id != victim);
            std::mem::replace(slot, new.clone())
        };
        self.adjust_live(&old, false);
        self.adjust_live(&new, true);
    }
}
