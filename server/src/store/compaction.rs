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

use super::file::{self, SegFile};
use super::record::{self, Body, ExtentRef, Kind};
use super::recovery::{scan_segment, verify_payload, Scanned};
use super::{Entry, Loc, Result, State, Store, StoreError};

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

    fn pick_victim(&self) -> Option<u64> {
        let active = self.inner.active.get();
        let segments = self.inner.segments.borrow();
        segments
            .iter()
            .filter(|(id, s)| Some(**id) != active && s.end_bytes > 0)
            .map(|(id, s)| (*id, s.end_bytes.saturating_sub(s.live_bytes), s.end_bytes))
            .filter(|(_, garbage, end)| {
                *garbage > 0
                    && (*garbage as f64)
                        >= self.inner.cfg.compaction_garbage_ratio_min * (*end as f64)
            })
            .max_by_key(|(_, garbage, _)| *garbage)
            .map(|(id, _, _)| id)
    }

    fn is_current(&self, key: &Key, segment_id: u64, offset: u64) -> Option<Entry> {
        let entry = self.lookup(&key.0, &key.1)?;
        (entry.loc.segment_id == segment_id && entry.loc.offset == offset).then_some(entry)
    }

    /// Relocates the live records of `segment_id` and deletes it.
    pub async fn compact_segment(&self, segment_id: u64) -> Result<CompactionReport> {
        if self.inner.active.get() == Some(segment_id) {
            return Err(StoreError::Invalid(
                "cannot compact the active segment".into(),
            ));
        }
        let (file, end_bytes, live_bytes) = {
            let segments = self.inner.segments.borrow();
            let seg = segments.get(&segment_id).ok_or(StoreError::NotFound)?;
            (seg.file.clone(), seg.end_bytes, seg.live_bytes)
        };
        let size_bytes = file.size_bytes().await?;
        let scan = scan_segment(&file, size_bytes).await?;
        let mut report = CompactionReport {
            segment_id,
            segment_bytes: end_bytes,
            live_bytes_before: live_bytes,
            ..Default::default()
        };

        // Records in the victim that are not current: their keys lose one
        // older record once the file is gone.
        let mut stale: HashMap<Key, u32> = HashMap::new();
        let mut current: Vec<&Scanned> = Vec::new();
        let mut moved_extents: HashMap<Key, Vec<&Scanned>> = HashMap::new();
        for r in &scan.records {
            let key = (r.header.bucket.clone(), r.header.key.clone());
            match r.header.kind() {
                Kind::SegmentHeader | Kind::Seal => {}
                Kind::Extent => {
                    if let Some(entry) = self.lookup(&key.0, &key.1) {
                        if let State::Live(info) = &entry.state {
                            if info
                                .extents
                                .iter()
                                .any(|e| e.segment_id == segment_id && e.record_offset == r.offset)
                            {
                                moved_extents.entry(key).or_default().push(r);
                            }
                        }
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

        // 1. Copy current keyed records (tombstones only while they still
        //    hide something), except objects whose extents move: those get a
        //    re-encoded record in step 2.
        let mut relocated: Vec<(Key, u64, Loc)> = Vec::new();
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
                if remaining == 0 {
                    drop_tombstones.push((key, entry.seq));
                    continue;
                }
            }
            let (header, payload) = self.read_for_copy(&file, segment_id, r).await?;
            staged_bytes += (header.len() + payload.len()) as u64;
            staged.push(((key, entry.seq), header, payload));
            if staged_bytes >= self.inner.cfg.batch_bytes_max {
                pending.extend(
                    self.append_copies(std::mem::take(&mut staged), &mut report)
                        .await?,
                );
                staged_bytes = 0;
            }
        }
        pending.extend(self.append_copies(staged, &mut report).await?);
        for ((key, seq), rx) in pending {
            let loc = rx.await.map_err(|_| StoreError::ShuttingDown)??;
            relocated.push((key, seq, loc));
        }

        // 2. Copy extents, then write each affected object's record again.
        for (key, rs) in &moved_extents {
            let Some(entry) = self.lookup(&key.0, &key.1) else {
                continue;
            };
            let mut new_extents: HashMap<u64, ExtentRef> = HashMap::new();
            let mut staged = Vec::with_capacity(rs.len());
            for r in rs {
                let (header, payload) = self.read_for_copy(&file, segment_id, r).await?;
                staged.push((r.offset, header, payload));
            }
            for (offset, rx) in self.append_copies(staged, &mut report).await? {
                let loc = rx.await.map_err(|_| StoreError::ShuttingDown)??;
                new_extents.insert(
                    offset,
                    ExtentRef {
                        segment_id: loc.segment_id,
                        record_offset: loc.offset,
                        header_bytes: loc.header_bytes,
                        payload_bytes: loc.payload_bytes,
                    },
                );
            }
            if self
                .rewrite_object(&entry, segment_id, &new_extents)
                .await?
            {
                report.records_relocated += 1;
            }
        }

        // 3. Everything copied is durable: point the index at the copies.
        for ((bucket, key), seq, loc) in relocated {
            self.relocate_entry(&bucket, &key, seq, segment_id, loc)
                .await?;
        }

        // 4. Delete the victim, then settle counts and drop tombstones.
        self.inner.segments.borrow_mut().remove(&segment_id);
        std::fs::remove_file(super::segment_path(&self.inner.cfg.dir, segment_id))?;
        file::sync_dir(&self.inner.cfg.dir)?;
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
        if r.header.payload_bytes > 0 && !verify_payload(file, r).await? {
            self.inner.stats.borrow_mut().corrupt_reads += 1;
            return Err(StoreError::Corrupt {
                segment_id,
                offset: r.offset,
            });
        }
        let header_bytes = r.header_bytes as usize;
        let raw = file
            .read_at(r.offset, header_bytes + r.header.payload_bytes as usize)
            .await?;
        if raw.len() != header_bytes + r.header.payload_bytes as usize {
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
    ) -> Result<Vec<(T, oneshot::Receiver<Result<Loc>>)>> {
        let mut out = Vec::with_capacity(staged.len());
        let mut bytes = 0u64;
        for (tag, header, payload) in staged {
            bytes += (header.len() + payload.len()) as u64;
            out.push((tag, self.append(header, payload).await?));
            report.records_relocated += 1;
        }
        report.bytes_copied += bytes;
        self.throttle(bytes).await;
        Ok(out)
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

    /// Writes the object's record again with extents in `segment_id` replaced
    /// by their copies and points the index at it. Returns false if the
    /// object changed meanwhile (the copies are then garbage).
    async fn rewrite_object(
        &self,
        entry: &Entry,
        segment_id: u64,
        moved: &HashMap<u64, ExtentRef>,
    ) -> Result<bool> {
        let file = self
            .segment_file(entry.loc.segment_id)
            .ok_or(StoreError::NotFound)?;
        let raw = file
            .read_at(entry.loc.offset, entry.loc.header_bytes as usize)
            .await?;
        let (mut header, _) = record::decode_header(&raw).map_err(|_| StoreError::Corrupt {
            segment_id: entry.loc.segment_id,
            offset: entry.loc.offset,
        })?;
        debug_assert_eq!(header.seq, entry.seq);
        let Body::Object { extents, .. } = &mut header.body else {
            return Err(StoreError::Invalid("extent owner is not an object".into()));
        };
        for e in extents.iter_mut() {
            if e.segment_id == segment_id {
                if let Some(new) = moved.get(&e.record_offset) {
                    *e = *new;
                }
            }
        }
        let bytes =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = self.append_durable(bytes, Bytes::new()).await?;
        let Body::Object { meta, extents } = header.body else {
            unreachable!()
        };
        // Still the same version? Then the new record (with new extents) replaces it.
        let still = self
            .lookup(&header.bucket, &header.key)
            .is_some_and(|e| e.seq == entry.seq && e.loc == entry.loc);
        if !still {
            if let Some(e) = self
                .inner
                .index
                .borrow_mut()
                .get_mut(&header.bucket)
                .and_then(|k| k.get_mut(&header.key))
            {
                e.older_on_disk += 1;
            }
            return Ok(false);
        }
        let info = super::ObjectInfo {
            size_bytes: meta.size_bytes,
            etag: meta.etag.into(),
            mtime_ms: meta.mtime_ms,
            extents: extents.into(),
        };
        self.replace_entry(
            &header.bucket,
            &header.key,
            entry.loc,
            Entry {
                seq: entry.seq,
                loc,
                state: State::Live(info),
                older_on_disk: 0,
            },
            segment_id,
        );
        Ok(true)
    }

    async fn relocate_entry(
        &self,
        bucket: &str,
        key: &str,
        seq: u64,
        victim: u64,
        loc: Loc,
    ) -> Result<()> {
        let Some(entry) = self.lookup(bucket, key) else {
            return Ok(());
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
            return Ok(());
        }
        let new = Entry {
            loc,
            ..entry.clone()
        };
        self.replace_entry(bucket, key, entry.loc, new, victim);
        Ok(())
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
