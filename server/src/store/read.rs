//! GET: `open_read` takes a consistent view of an object version (its
//! metadata and handles on the files holding its bytes) as an
//! `ObjectReader`, which reads byte ranges and checks every block against
//! its CRC (copying, or by DMA into a registered buffer: `read_fixed`).
//! Headers of objects not read whole are kept in the shard's header cache;
//! verified payloads in its object cache (`object_cache`), consulted before
//! any device read.

use std::cell::RefCell;
use std::rc::Rc;

use glommio::io::ReadResult;

use super::file::{FaultPoint, SegFile};
use super::index::State;
use super::object_cache::{CachedPart, ObjectCache, Payload};
use super::record::{self, Body, Header, Kind, ObjectMeta};
use super::record_cache::RecordCache;
use super::{Loc, ObjectInfo, Result, Store, StoreConfig, StoreError};

mod pieces;
pub use pieces::{ReadOut, FIXED_MIN_BYTES, MERGE_BYTES_MAX};

/// The shard's read caches, keyed by record place (segment, offset).
pub(super) struct ReadCaches {
    /// Extent block CRCs.
    pub(super) crc: RefCell<RecordCache<Rc<[u32]>>>,
    /// Headers of objects not read whole with them.
    pub(super) header: RefCell<RecordCache<Rc<CachedHeader>>>,
    /// Verified payloads (see `object_cache`).
    pub(super) object: RefCell<ObjectCache>,
}

impl ReadCaches {
    pub(super) fn new(cfg: &StoreConfig) -> ReadCaches {
        ReadCaches {
            crc: RefCell::new(RecordCache::new(
                cfg.crc_cache_bytes_max,
                |c: &Rc<[u32]>| std::mem::size_of_val(&c[..]),
            )),
            header: RefCell::new(RecordCache::new(
                cfg.header_cache_bytes_max,
                CachedHeader::heap_bytes,
            )),
            object: RefCell::new(ObjectCache::new(cfg.object_cache_bytes_max)),
        }
    }

    /// A segment is gone: forget what was cached of its records.
    pub(super) fn forget_segment(&self, segment_id: u64) {
        self.crc.borrow_mut().forget_segment(segment_id);
        self.header.borrow_mut().forget_segment(segment_id);
        self.object.borrow_mut().forget_segment(segment_id);
    }
}

/// What a read needs of an object's record header when the object is not
/// read whole with it (stored in extents, or inline but large).
pub(super) struct CachedHeader {
    pub(super) seq: u64,
    pub(super) meta: Rc<ObjectMeta>,
    pub(super) extents: Vec<record::ExtentRef>,
    /// The record's own payload CRCs (inline objects; empty otherwise).
    pub(super) block_crcs: Rc<[u32]>,
}

impl CachedHeader {
    pub(super) fn heap_bytes(h: &Rc<CachedHeader>) -> usize {
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

pub(super) struct Part {
    pub(super) file: Rc<SegFile>,
    /// The key of the part's segment, taken with `file` (the segment may
    /// leave the table while the reader holds its file).
    pub(super) key: record::SegKey,
    pub(super) segment_id: u64,
    pub(super) record_offset: u64,
    pub(super) header_bytes: u32,
    pub(super) object_offset: u64,
    pub(super) payload_bytes: u64,
    /// Loaded with the header; None for extents until first read.
    pub(super) block_crcs: Option<Rc<[u32]>>,
    /// Whole payload, already verified (small inline objects, and parts
    /// found in or put into the object cache).
    pub(super) cached: Option<Payload>,
    /// The object cache was looked up for this part (once per visit).
    pub(super) cache_checked: bool,
    /// `cached` is the whole object, kept for the reader's life (a small
    /// inline object); else it is let go once the reader moves to another
    /// part, so that a reader holds at most one part's bytes.
    pub(super) keep: bool,
    /// An extent record: its block CRCs can be read again from its header
    /// (and are kept in the byte-bounded CRC cache), so the reader lets go
    /// of them with the part's bytes.
    pub(super) extent: bool,
}

impl Part {
    /// The reader moves on from this part: it keeps neither its bytes (the
    /// object cache may) nor, for an extent, its block CRCs (the CRC cache
    /// may), so that a stream over a huge object holds one part's worth.
    pub(super) fn let_go(&mut self) {
        if !self.keep {
            self.cached = None;
            self.cache_checked = false;
        }
        if self.extent {
            self.block_crcs = None;
        }
    }

    /// The place of the part's record: its key in the object cache.
    fn place(&self) -> (u64, u64) {
        (self.segment_id, self.record_offset)
    }

    /// Takes the part's payload from the shard's object cache if it is
    /// there (looked up once per reader). True if the part is cached now.
    fn try_cache(&mut self, store: &Store) -> bool {
        if self.cached.is_some() {
            return true;
        }
        if std::mem::replace(&mut self.cache_checked, true) {
            return false;
        }
        let hit = store.inner.caches.object.borrow_mut().get(self.place());
        match hit {
            Some(c) if c.payload.len() as u64 == self.payload_bytes => {
                self.cached = Some(c.payload.clone());
                true
            }
            _ => false,
        }
    }

    /// The part's block CRCs: kept from the object's header (inline), else
    /// from the shard's cache, else read from the extent's header on disk
    /// (and cached).
    pub(super) async fn load_block_crcs(&mut self, store: &Store) -> Result<Rc<[u32]>> {
        if let Some(c) = &self.block_crcs {
            return Ok(c.clone());
        }
        let cached = store
            .inner
            .caches
            .crc
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
                store.inner.caches.crc.borrow_mut().insert(
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
    pub(super) store: Store,
    pub seq: u64,
    /// Shared with the caches that hold it (no copy per GET).
    pub meta: Rc<ObjectMeta>,
    pub(super) parts: Vec<Part>,
    /// The part the last read was in.
    pub(super) current: usize,
}

impl ObjectReader {
    pub fn size_bytes(&self) -> u64 {
        self.meta.size_bytes
    }

    /// A read goes to part `index`: the part read before lets go of its
    /// bytes (the object cache may still hold them).
    fn visit(&mut self, index: usize) {
        if self.current != index {
            if let Some(p) = self.parts.get_mut(self.current) {
                p.let_go();
            }
            self.current = index;
        }
    }

    /// Returns up to `len_bytes` starting at `offset` (fewer at a part
    /// boundary; call again for the rest). Empty only at or past the end.
    pub async fn read(&mut self, offset: u64, len_bytes: u64) -> Result<Payload> {
        let Some(index) = self.part_at(offset) else {
            return Ok(Payload::default());
        };
        self.visit(index);
        let part = &mut self.parts[index];
        let within = offset - part.object_offset;
        let len = len_bytes.min(part.payload_bytes - within);
        part.try_cache(&self.store);
        if let Some(cached) = &part.cached {
            return Ok(cached
                .slice(within as usize, len as usize)
                .expect("slice in range"));
        }
        let w = self.plan(index, within, len).await?;
        self.read_planned(&[&w]).await.pop().expect("one piece")
    }

    /// Like `read`, but the bytes land by DMA in a registered buffer of the
    /// shard's data ring (READ_FIXED), are CRC-checked there, and are
    /// returned as (buffer, start, end) so that the caller can send that
    /// very buffer. None when this part cannot go that way (cached or
    /// inline object, buffered file, range larger than a pool buffer, no
    /// buffer free): use `read`.
    pub async fn read_fixed(
        &mut self,
        ring: &crate::ring::DataRing,
        offset: u64,
        len_bytes: u64,
    ) -> Option<Result<(crate::ring::PoolBuf, usize, usize)>> {
        ring.pool()?;
        let index = self.part_at(offset)?;
        self.visit(index);
        if self.parts[index].try_cache(&self.store) {
            // Served from memory by `read`.
            return None;
        }
        self.parts[index].file.ring_target(ring)?;
        let within = offset - self.parts[index].object_offset;
        let w = match self.plan(index, within, len_bytes).await {
            Ok(w) => w,
            Err(e) => return Some(Err(e)),
        };
        self.read_planned_fixed(ring, &w).await
    }
}

/// The version of an object the index names: its seq and record place.
#[derive(Clone, Copy)]
pub(super) struct Version {
    pub(super) seq: u64,
    pub(super) loc: Loc,
}

/// O_DIRECT reads on the data ring need 4 KiB-aligned offsets and lengths.
pub(super) const DIRECT_ALIGN_BYTES: u64 = 4096;

impl Store {
    /// Index-only metadata (size, ETag, mtime).
    pub fn head(&self, bucket: &str, key: &str) -> Option<ObjectInfo> {
        match self.lookup(bucket, key)?.state {
            State::Live(info) => Some(info),
            State::Deleted { .. } | State::Marker { .. } => None,
        }
    }

    /// Opens a consistent reader on the current version: full metadata plus
    /// handles on the files holding its bytes (valid even if compaction
    /// later removes them).
    pub async fn open_read(&self, bucket: &str, key: &str) -> Result<ObjectReader> {
        let (entry, whole) = {
            // Borrowed, not cloned: a GET served from the cache allocates
            // nothing for the lookup.
            let index = self.inner.index.borrow();
            let e = index.entry(bucket, key).ok_or(StoreError::NotFound)?;
            let State::Live(info) = &e.state else {
                return Err(StoreError::NotFound);
            };
            // Small inline records are read whole at once: one I/O per GET.
            let whole = info.extents.is_empty() && e.loc.span_bytes() <= 256 * 1024;
            (
                Version {
                    seq: e.seq,
                    loc: e.loc,
                },
                whole,
            )
        };
        if !whole {
            return self.open_by_header(bucket, key, &entry).await;
        }
        if let Some(reader) = self.open_cached(&entry) {
            return Ok(reader);
        }
        let read_len = entry.loc.header_bytes as u64 + entry.loc.payload_bytes;
        let (file, seg_key, raw, header, header_bytes) = self
            .read_object_header(bucket, key, &entry, read_len)
            .await?;
        let block_bytes = header.block_bytes();
        let Body::Object { meta, .. } = header.body else {
            unreachable!("checked by read_object_header")
        };
        let corrupt = || StoreError::Corrupt {
            segment_id: entry.loc.segment_id,
            offset: entry.loc.offset,
        };
        let cached = ReadResult::slice(&raw, header_bytes, entry.loc.payload_bytes as usize)
            .ok_or_else(corrupt)?;
        if !record::verify_blocks(&header.block_crcs, block_bytes, 0, &cached) {
            self.inner.stats.borrow_mut().corrupt_reads += 1;
            return Err(corrupt());
        }
        let cached = Payload::Dma(cached);
        let meta = Rc::new(meta);
        // Copied into a buffer of its own size (the device read's buffer is
        // glommio's, and larger), on the payload's second miss: a one-pass
        // scan copies nothing and grows no memory (admitting small objects
        // on their first read cost cold 10 KiB GETs 24%: page faults of the
        // growing cache, `bench/cache-cold.sh`).
        let place = (entry.loc.segment_id, entry.loc.offset);
        let admit = self.inner.caches.object.borrow_mut().admit_costly(place);
        let value = admit.then(|| CachedPart {
            seq: entry.seq,
            meta: Some(meta.clone()),
            payload: Payload::Heap(bytes::Bytes::copy_from_slice(&cached)),
        });
        // Not if the key moved on while the read waited (that version's
        // place will never be looked up again).
        let current = self
            .inner
            .index
            .borrow()
            .entry(bucket, key)
            .is_some_and(|e| e.seq == entry.seq && e.loc == entry.loc);
        if let (true, Some(value)) = (current, value) {
            self.cache_payload(place, value, cached.len());
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
                cache_checked: true,
                keep: true,
                extent: false,
            }],
            current: 0,
        })
    }

    /// A reader on a small inline object served from the object cache, if
    /// the cache holds the very version `entry` names.
    fn open_cached(&self, entry: &Version) -> Option<ObjectReader> {
        let place = (entry.loc.segment_id, entry.loc.offset);
        let hit = self.inner.caches.object.borrow_mut().get(place)?;
        let meta = hit.meta.as_ref()?;
        if hit.seq != entry.seq || hit.payload.len() as u64 != entry.loc.payload_bytes {
            return None;
        }
        let (file, key) = self.segment_handle(entry.loc.segment_id)?;
        Some(ObjectReader {
            store: self.clone(),
            seq: entry.seq,
            meta: meta.clone(),
            parts: vec![Part {
                file,
                key,
                segment_id: entry.loc.segment_id,
                record_offset: entry.loc.offset,
                header_bytes: entry.loc.header_bytes,
                object_offset: 0,
                payload_bytes: entry.loc.payload_bytes,
                block_crcs: None,
                cached: Some(hit.payload.clone()),
                cache_checked: true,
                keep: true,
                extent: false,
            }],
            current: 0,
        })
    }

    /// Offers a verified payload to the object cache, charged its buffer of
    /// `buffer_bytes`. A payload read from a segment that is gone by now
    /// (compacted while the read waited) is not cached: nothing could ever
    /// look it up again.
    pub(super) fn cache_payload(&self, place: (u64, u64), value: CachedPart, buffer_bytes: usize) {
        let live = self.inner.segs.table.borrow().contains_key(&place.0);
        let mut cache = self.inner.caches.object.borrow_mut();
        if cache.enabled() && live {
            let cost = ObjectCache::cost(buffer_bytes, &value);
            cache.insert(place, Rc::new(value), cost);
        }
    }

    /// Reads `read_len` bytes at the record of `entry` and decodes its
    /// header, which must be the object record the index points at. Returns
    /// the segment file too.
    pub(super) async fn read_object_header(
        &self,
        bucket: &str,
        key: &str,
        entry: &Version,
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
    pub(super) async fn open_by_header(
        &self,
        bucket: &str,
        key: &str,
        entry: &Version,
    ) -> Result<ObjectReader> {
        let (seg, off) = (entry.loc.segment_id, entry.loc.offset);
        let cached = self.inner.caches.header.borrow_mut().get(seg, off);
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
                    meta: Rc::new(meta),
                    extents,
                    block_crcs,
                });
                self.inner
                    .caches
                    .header
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
                cache_checked: false,
                keep: false,
                extent: false,
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
                cache_checked: false,
                keep: false,
                extent: true,
            });
            object_offset += e.payload_bytes;
        }
        Ok(ObjectReader {
            store: self.clone(),
            seq: entry.seq,
            meta: header.meta.clone(),
            parts,
            current: 0,
        })
    }
}
