//! How an `ObjectReader` reads payload bytes: a piece of a part is planned
//! (its part's block CRCs loaded, the whole blocks around it found), then
//! read from the device and checked block by block, either by DMA into a
//! registered buffer of the shard's data ring (`READ_FIXED`) or through
//! glommio into a buffer of its own.
//!
//! `read_many` reads many pieces of one object at once (the ranges of a
//! native Get, read-ahead of a stream): memory first (the object cache),
//! then one device read per run of pieces that are adjacent or overlapping
//! on disk (sorted by segment and offset, merged up to `MERGE_BYTES_MAX`),
//! all in flight together.

use std::rc::Rc;

use glommio::io::ReadResult;

use super::{ObjectReader, Part, DIRECT_ALIGN_BYTES};
use crate::ring::{DataRing, PoolBuf};
use crate::store::file::FaultPoint;
use crate::store::object_cache::{CachedPart, Payload};
use crate::store::record;
use crate::store::{Result, Store, StoreError};

/// Pieces adjacent on disk are read in one device read of at most this
/// (by default; see `merge_bytes_max`).
pub const MERGE_BYTES_MAX: u64 = 256 * 1024;

/// `MERGE_BYTES_MAX`, unless `PERCORE_READ_MERGE_BYTES` (read once) says
/// otherwise: 0 reads every piece on its own (for benchmarks that compare,
/// `bench/ranges.sh`).
fn merge_bytes_max() -> u64 {
    static BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("PERCORE_READ_MERGE_BYTES")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(MERGE_BYTES_MAX, |n| n.min(1 << 20))
    })
}
/// `read_many` reads a piece into a registered buffer (1 MiB each, 64 per
/// shard) only from this size: smaller ones are copied next to their
/// frame header when sent anyway, and a Get of many small ranges would
/// otherwise hold a buffer per range.
pub const FIXED_MIN_BYTES: u64 = 64 * 1024;

/// One piece read by `read_many`.
pub enum ReadOut {
    /// In a registered buffer of the ring: `buf[start..end]`.
    Fixed(PoolBuf, usize, usize),
    /// In memory: the object cache's copy, or a device read's buffer.
    Mem(Payload),
}

/// A piece of one part, planned for a device read: the whole blocks
/// around it, and where they are on disk.
pub(in crate::store) struct Planned {
    part: usize,
    /// The piece, within the part.
    within: u64,
    len: u64,
    /// The blocks read: `[read_start, read_end)` of the part's payload.
    read_start: u64,
    read_end: u64,
    first_block: usize,
    block_bytes: u64,
    crcs: Rc<[u32]>,
    /// Segment offset of `read_start`.
    file_offset: u64,
}

impl Planned {
    fn file_end(&self) -> u64 {
        self.file_offset + (self.read_end - self.read_start)
    }
}

impl Part {
    /// The error for a part whose bytes fail their check.
    fn corrupt(&self) -> StoreError {
        StoreError::Corrupt {
            segment_id: self.segment_id,
            offset: self.record_offset,
        }
    }
}

impl ObjectReader {
    /// The part holding object byte `offset`, if any.
    pub(super) fn part_at(&self, offset: u64) -> Option<usize> {
        self.parts
            .iter()
            .position(|p| offset < p.object_offset + p.payload_bytes)
    }

    /// The object offset where the part holding `offset` ends (the object's
    /// size past its end): a piece cut there is never shortened by
    /// `read_many`.
    pub fn part_end(&self, offset: u64) -> u64 {
        self.part_at(offset).map_or(self.meta.size_bytes, |i| {
            let p = &self.parts[i];
            p.object_offset + p.payload_bytes
        })
    }

    /// Plans the piece of part `index` at part offset `within` of at most
    /// `len_bytes` (cut at the part's end).
    pub(super) async fn plan(
        &mut self,
        index: usize,
        within: u64,
        len_bytes: u64,
    ) -> Result<Planned> {
        let store = self.store.clone();
        let part = &mut self.parts[index];
        let len = len_bytes.min(part.payload_bytes - within);
        let crcs = part.load_block_crcs(&store).await?;
        let block_bytes = record::block_bytes(part.payload_bytes, crcs.len());
        let first_block = within / block_bytes;
        let end_block = (within + len).div_ceil(block_bytes);
        let read_start = first_block * block_bytes;
        let read_end = (end_block * block_bytes).min(part.payload_bytes);
        Ok(Planned {
            part: index,
            within,
            len,
            read_start,
            read_end,
            first_block: first_block as usize,
            block_bytes,
            crcs,
            file_offset: part.record_offset + u64::from(part.header_bytes) + read_start,
        })
    }

    /// The planned piece by DMA into a registered buffer of `ring`,
    /// checked there. None when it cannot go that way (buffered file, span
    /// larger than a pool buffer, no buffer free): read it with
    /// `read_planned`.
    pub(super) async fn read_planned_fixed(
        &self,
        ring: &DataRing,
        w: &Planned,
    ) -> Option<Result<(PoolBuf, usize, usize)>> {
        let pool = ring.pool()?;
        let part = &self.parts[w.part];
        let target = part.file.ring_target(ring)?;
        let aligned = w.file_offset - w.file_offset % DIRECT_ALIGN_BYTES;
        let skew = (w.file_offset - aligned) as usize;
        let want = (skew as u64 + w.read_end - w.read_start).next_multiple_of(DIRECT_ALIGN_BYTES);
        if want > pool.buf_bytes() as u64 {
            return None;
        }
        let store = &self.store;
        if let Err(e) = store.fault(FaultPoint::Read {
            segment_id: part.segment_id,
            offset: w.file_offset,
        }) {
            return Some(Err(e.into()));
        }
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
        let data_len = (w.read_end - w.read_start) as usize;
        let data = buf
            .as_slice()
            .get(skew..skew + data_len)
            .filter(|_| n >= skew + data_len);
        if !data.is_some_and(|d| record::verify_blocks(&w.crcs, w.block_bytes, w.first_block, d)) {
            store.inner.stats.borrow_mut().corrupt_reads += 1;
            return Some(Err(part.corrupt()));
        }
        self.offer_whole(w, &buf.as_slice()[skew..skew + data_len]);
        let start = skew + (w.within - w.read_start) as usize;
        Some(Ok((buf, start, start + w.len as usize)))
    }

    /// Planned pieces of parts in one segment, overlapping or adjacent on
    /// disk and sorted by offset, read in one device read into a buffer of
    /// glommio's; each piece is checked against its own part's CRCs.
    pub(super) async fn read_planned(&self, ws: &[&Planned]) -> Vec<Result<Payload>> {
        let first = ws[0];
        let part = &self.parts[first.part];
        let start = first.file_offset;
        let end = ws.iter().map(|w| w.file_end()).max().unwrap_or(start);
        let store = &self.store;
        let read = async {
            store.fault(FaultPoint::Read {
                segment_id: part.segment_id,
                offset: start,
            })?;
            let started = std::time::Instant::now();
            let raw = part.file.read_at(start, (end - start) as usize).await?;
            store.inner.device_read.record(started.elapsed());
            Ok::<_, StoreError>(raw)
        };
        let raw = match read.await {
            Ok(raw) => raw,
            // Every piece of the run fails the same way.
            Err(e) => return ws.iter().map(|_| Err(same_error(&e))).collect(),
        };
        ws.iter()
            .map(|w| {
                let at = (w.file_offset - start) as usize;
                let data_len = (w.read_end - w.read_start) as usize;
                let blocks = ReadResult::slice(&raw, at, data_len)
                    .filter(|d| record::verify_blocks(&w.crcs, w.block_bytes, w.first_block, d));
                let Some(blocks) = blocks else {
                    store.inner.stats.borrow_mut().corrupt_reads += 1;
                    return Err(self.parts[w.part].corrupt());
                };
                self.offer_whole(w, &blocks);
                let skip = (w.within - w.read_start) as usize;
                ReadResult::slice(&blocks, skip, w.len as usize)
                    .map(Payload::Dma)
                    .ok_or_else(|| self.parts[w.part].corrupt())
            })
            .collect()
    }

    /// A whole part just read and verified goes into the object cache on
    /// its second miss, copied out of the device read's buffer (glommio's
    /// and the ring's buffers stay with them).
    fn offer_whole(&self, w: &Planned, verified: &[u8]) {
        let part = &self.parts[w.part];
        if w.read_start != 0 || w.read_end != part.payload_bytes {
            return;
        }
        let place = part.place();
        if self
            .store
            .inner
            .caches
            .object
            .borrow_mut()
            .admit_costly(place)
        {
            let value = CachedPart {
                seq: 0,
                meta: None,
                payload: Payload::Heap(bytes::Bytes::copy_from_slice(verified)),
            };
            self.store.cache_payload(place, value, verified.len());
        }
    }

    /// Loads the block CRCs of every part that `wants` touch and the reader
    /// holds no bytes of, all at once: with the CRC cache cold, one header
    /// read per extent, in flight together rather than one after another.
    /// A failure is met again, and reported, by `plan`.
    async fn load_crcs_for(&mut self, wants: &[(u64, u64)]) {
        let mut need = vec![false; self.parts.len()];
        for &(offset, _) in wants {
            if let Some(i) = self.part_at(offset) {
                need[i] = true;
            }
        }
        let store = self.store.clone();
        let loads = self
            .parts
            .iter_mut()
            .zip(need)
            .filter(|(p, n)| *n && p.block_crcs.is_none() && p.cached.is_none())
            .map(|(p, _)| p.load_block_crcs(&store));
        let _ = futures::future::join_all(loads).await;
    }

    /// Reads the pieces `wants` (object offset, length) of this object at
    /// once, each cut at its part's end like `read`. Pieces held in memory
    /// come from there; the rest are read from the device, sorted by place
    /// and merged where adjacent (`MERGE_BYTES_MAX`), all reads in flight
    /// together. A lone piece of at least `FIXED_MIN_BYTES` goes by DMA
    /// into a registered buffer of `ring` where it can. Results are in the order of `wants`.
    pub async fn read_many(
        &mut self,
        ring: Option<&DataRing>,
        wants: &[(u64, u64)],
    ) -> Vec<Result<ReadOut>> {
        let mut out: Vec<Option<Result<ReadOut>>> = wants.iter().map(|_| None).collect();
        self.load_crcs_for(wants).await;
        let mut planned: Vec<(usize, Planned)> = Vec::with_capacity(wants.len());
        for (i, &(offset, len)) in wants.iter().enumerate() {
            let Some(index) = self.part_at(offset) else {
                out[i] = Some(Ok(ReadOut::Mem(Payload::default())));
                continue;
            };
            let part = &self.parts[index];
            let within = offset - part.object_offset;
            let len = len.min(part.payload_bytes - within);
            if let Some(mem) = part.in_memory(&self.store) {
                out[i] = Some(Ok(ReadOut::Mem(
                    mem.slice(within as usize, len as usize)
                        .expect("slice in range"),
                )));
                continue;
            }
            match self.plan(index, within, len).await {
                Ok(w) => planned.push((i, w)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        planned.sort_by_key(|(_, w)| (self.parts[w.part].segment_id, w.file_offset));
        // Runs of pieces read together: same segment, each starting at or
        // before the run's end, the run within MERGE_BYTES_MAX.
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        let merge_max = merge_bytes_max();
        for (k, (_, w)) in planned.iter().enumerate() {
            let seg = self.parts[w.part].segment_id;
            let joins = runs.last().is_some_and(|r| {
                let head = &planned[r.start].1;
                let end = planned[r.clone()].iter().map(|(_, x)| x.file_end()).max();
                self.parts[head.part].segment_id == seg
                    && end.is_some_and(|end| w.file_offset <= end)
                    && w.file_end().max(end.unwrap_or(0)) - head.file_offset <= merge_max
            });
            match runs.last_mut() {
                Some(r) if joins => r.end = k + 1,
                _ => runs.push(k..k + 1),
            }
        }
        let this = &*self;
        let reads = runs.iter().map(|r| {
            let ws: Vec<&Planned> = planned[r.clone()].iter().map(|(_, w)| w).collect();
            async move {
                if let (Some(ring), [w]) = (ring, &ws[..]) {
                    if w.len < FIXED_MIN_BYTES {
                        // (the copy path below)
                    } else if let Some(fixed) = this.read_planned_fixed(ring, w).await {
                        return vec![fixed.map(|(b, s, e)| ReadOut::Fixed(b, s, e))];
                    }
                }
                this.read_planned(&ws)
                    .await
                    .into_iter()
                    .map(|r| r.map(ReadOut::Mem))
                    .collect::<Vec<_>>()
            }
        });
        let done = futures::future::join_all(reads).await;
        for (r, results) in runs.iter().zip(done) {
            for ((i, _), result) in planned[r.clone()].iter().zip(results) {
                out[*i] = Some(result);
            }
        }
        // Held by the caches, not by the reader (see `Part::let_go`).
        for p in self.parts.iter_mut().filter(|p| p.extent) {
            p.block_crcs = None;
        }
        out.into_iter()
            .map(|o| o.expect("every piece answered"))
            .collect()
    }
}

impl Part {
    /// The part's verified payload if memory holds it: kept by the reader,
    /// or in the shard's object cache (not kept: `read_many` holds no part).
    fn in_memory(&self, store: &Store) -> Option<Payload> {
        if let Some(c) = &self.cached {
            return Some(c.clone());
        }
        let hit = store.inner.caches.object.borrow_mut().get(self.place())?;
        (hit.payload.len() as u64 == self.payload_bytes).then(|| hit.payload.clone())
    }
}

/// A copy of a read's error, for each piece the read was for.
fn same_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Io(x) => StoreError::Io(std::io::Error::new(x.kind(), x.to_string())),
        StoreError::Corrupt { segment_id, offset } => StoreError::Corrupt {
            segment_id: *segment_id,
            offset: *offset,
        },
        StoreError::ShuttingDown => StoreError::ShuttingDown,
        other => StoreError::Io(std::io::Error::other(other.to_string())),
    }
}
