//! The shard's object cache: verified payload bytes of records, in the
//! shard's own memory (not the kernel's page cache: segment files are read
//! with O_DIRECT), so that hot objects are served without a device read.
//!
//! **Keyed by record place** (segment id, record offset). Records are never
//! rewritten in place and segment ids are never reused while the process
//! runs, so an entry cannot go stale: an overwrite, a delete or a multipart
//! completion installs a record at a new place, and a read always starts
//! from the index, which names the current place. Entries of places that
//! stopped being current are dropped eagerly to free their memory
//! (`forget`, fed by the index on every replaced version) and with their
//! segment (`forget_segment`, when compaction or a drop deletes it).
//!
//! **Admission on the second miss, eviction S3-FIFO** (Yang et al., SOSP
//! 2023), weighted by bytes. The store offers a payload only on its second
//! miss (`admit_costly`: a first miss leaves the key in the ghost FIFO), so
//! a one-pass scan copies nothing into the cache and grows no memory;
//! inserting on the first read cost cold 10 KiB GETs a quarter of their
//! throughput (`bench/cache-cold.sh`). An entry offered without that check
//! (`insert` of a key not in the ghost) goes to a small FIFO (a tenth of
//! the budget), where one read again before it leaves moves it to main and
//! one that is not leaves only its key in the ghost; a key found in the
//! ghost goes straight to main. Main evicts in FIFO order, giving an entry
//! read since its last pass another pass (up to three). A scan therefore
//! cannot flush the working set in main.
//!
//! Owned by one shard: no locks. Bounded by bytes (each entry's buffer
//! plus `ENTRY_OVERHEAD_BYTES`) and the ghost by entries.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Deref;
use std::rc::Rc;

use bytes::Bytes;
use glommio::io::ReadResult;

use super::record::ObjectMeta;

/// Bytes charged per entry on top of its buffer (map slot, queue slots,
/// the entry itself).
pub(super) const ENTRY_OVERHEAD_BYTES: usize = 160;

/// Highest read count an entry keeps (S3-FIFO's two-bit counter).
const FREQ_MAX: u8 = 3;

/// Verified bytes of an object: a view of a buffer the device read into,
/// or of one the cache copied them into.
#[derive(Clone, Debug)]
pub enum Payload {
    Dma(ReadResult),
    Heap(Bytes),
}

impl Payload {
    /// `self[start..start + len]`, sharing the buffer.
    pub fn slice(&self, start: usize, len: usize) -> Option<Payload> {
        if start.checked_add(len)? > self.len() {
            return None;
        }
        Some(match self {
            Payload::Dma(r) => Payload::Dma(ReadResult::slice(r, start, len)?),
            Payload::Heap(b) => Payload::Heap(b.slice(start..start + len)),
        })
    }
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Heap(Bytes::new())
    }
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Payload::Dma(r) => r,
            Payload::Heap(b) => b,
        }
    }
}

/// What the cache keeps of one record.
pub(super) struct CachedPart {
    /// The record's version (the object's seq; an extent's own seq).
    pub(super) seq: u64,
    /// The object's metadata, for object records read whole with their
    /// header (small inline objects); None for extents and objects read
    /// through the header cache.
    pub(super) meta: Option<Rc<ObjectMeta>>,
    /// The record's whole payload, verified against its block CRCs.
    pub(super) payload: Payload,
}

/// (segment id, record offset).
pub(super) type Place = (u64, u64);

/// A multiply-rotate hash (FxHash): places are not attacker-chosen (the
/// store assigns them), so no keyed hash is needed.
#[derive(Default)]
pub(super) struct PlaceHasher(u64);

impl Hasher for PlaceHasher {
    fn finish(&self) -> u64 {
        // hashbrown takes buckets from the low bits: fold the high bits in
        // (records are 8-byte aligned, often 4 KiB apart).
        self.0 ^ (self.0 >> 29) ^ (self.0 >> 47)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type PlaceMap<V> = HashMap<Place, V, BuildHasherDefault<PlaceHasher>>;
type OffsetSet = std::collections::HashSet<u64, BuildHasherDefault<PlaceHasher>>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Queue {
    Small,
    Main,
}

struct Slot {
    value: Rc<CachedPart>,
    cost: usize,
    freq: u8,
    queue: Queue,
    /// Matches this slot's current position in its queue (a key removed
    /// and inserted again leaves a stale position behind).
    generation: u64,
}

/// Counters for /metrics.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ObjectCacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries admitted (into small or main).
    pub inserts: u64,
    /// Entries evicted for room (not counting `forget`).
    pub evictions: u64,
    /// Entries dropped because their place stopped being current.
    pub invalidations: u64,
    /// Payloads declined on their first miss (key left in the ghost).
    pub declined: u64,
    pub bytes: u64,
    pub bytes_max: u64,
    pub entries: u64,
}

pub(super) struct ObjectCache {
    map: PlaceMap<Slot>,
    /// The record offsets cached per segment, so that a deleted segment's
    /// entries go without a scan of the whole map.
    by_segment: HashMap<u64, OffsetSet, BuildHasherDefault<PlaceHasher>>,
    small: VecDeque<(Place, u64)>,
    main: VecDeque<(Place, u64)>,
    ghost: VecDeque<(Place, u64)>,
    ghost_set: PlaceMap<u64>,
    small_bytes: usize,
    main_bytes: usize,
    bytes_max: usize,
    ghost_max: usize,
    generation: u64,
    stats: ObjectCacheStats,
}

impl ObjectCache {
    /// A cache of at most `bytes_max` bytes (0: disabled).
    pub(super) fn new(bytes_max: usize) -> ObjectCache {
        ObjectCache {
            map: PlaceMap::default(),
            by_segment: HashMap::default(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghost_set: PlaceMap::default(),
            small_bytes: 0,
            main_bytes: 0,
            bytes_max,
            // About as many keys as main holds entries of 16 KiB.
            ghost_max: (bytes_max / (16 << 10)).clamp(1024, 1 << 20),
            generation: 0,
            stats: ObjectCacheStats::default(),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.bytes_max > 0
    }

    pub(super) fn stats(&self) -> ObjectCacheStats {
        ObjectCacheStats {
            bytes: (self.small_bytes + self.main_bytes) as u64,
            bytes_max: self.bytes_max as u64,
            entries: self.map.len() as u64,
            ..self.stats
        }
    }

    /// The bytes charged for `value` held in a buffer of `buffer_bytes`.
    pub(super) fn cost(buffer_bytes: usize, value: &CachedPart) -> usize {
        let meta = value.meta.as_ref().map_or(0, |m| {
            m.etag.len()
                + m.content_type.len()
                + m.headers
                    .iter()
                    .map(|(k, v)| 48 + k.len() + v.len())
                    .sum::<usize>()
        });
        ENTRY_OVERHEAD_BYTES + buffer_bytes + meta
    }

    /// The entry at `place`, counted as a hit or a miss.
    pub(super) fn get(&mut self, place: Place) -> Option<Rc<CachedPart>> {
        if !self.enabled() {
            return None;
        }
        match self.map.get_mut(&place) {
            Some(slot) => {
                slot.freq = (slot.freq + 1).min(FREQ_MAX);
                self.stats.hits += 1;
                Some(slot.value.clone())
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Whether an insert that costs a copy should be made now: yes if the
    /// key was seen recently (it is in the ghost), else the key is left in
    /// the ghost and the answer is no.
    pub(super) fn admit_costly(&mut self, place: Place) -> bool {
        if !self.enabled() || self.map.contains_key(&place) {
            return false;
        }
        if self.ghost_set.contains_key(&place) {
            return true;
        }
        self.stats.declined += 1;
        self.remember_ghost(place);
        false
    }

    /// Adds `value` at `place`, charged `cost` bytes (see `cost`). An entry
    /// larger than an eighth of the budget is not cached (it would evict
    /// too much for one object).
    pub(super) fn insert(&mut self, place: Place, value: Rc<CachedPart>, cost: usize) {
        if !self.enabled() || cost > self.bytes_max / 8 || self.map.contains_key(&place) {
            return;
        }
        let queue = if self.ghost_set.remove(&place).is_some() {
            Queue::Main
        } else {
            Queue::Small
        };
        self.make_room(cost);
        self.generation += 1;
        let generation = self.generation;
        match queue {
            Queue::Small => {
                self.small.push_back((place, generation));
                self.small_bytes += cost;
            }
            Queue::Main => {
                self.main.push_back((place, generation));
                self.main_bytes += cost;
            }
        }
        self.by_segment.entry(place.0).or_default().insert(place.1);
        self.map.insert(
            place,
            Slot {
                value,
                cost,
                freq: 0,
                queue,
                generation,
            },
        );
        self.stats.inserts += 1;
        self.trim_queues();
    }

    /// The record at `place` stopped being current: drop it.
    pub(super) fn forget(&mut self, place: Place) {
        if let Some(slot) = self.remove(place) {
            self.uncharge(&slot);
            self.stats.invalidations += 1;
        }
        self.ghost_set.remove(&place);
    }

    /// Segment `segment_id` is gone: drop every entry in it.
    pub(super) fn forget_segment(&mut self, segment_id: u64) {
        // Ghost keys of the segment are left to age out: no place in it
        // can be looked up again.
        let offsets = self.by_segment.remove(&segment_id).unwrap_or_default();
        for offset in offsets {
            self.forget((segment_id, offset));
        }
        self.trim_queues();
    }

    /// Removes the entry at `place` from the map and the segment index.
    fn remove(&mut self, place: Place) -> Option<Slot> {
        let slot = self.map.remove(&place)?;
        if let Some(set) = self.by_segment.get_mut(&place.0) {
            set.remove(&place.1);
            if set.is_empty() {
                self.by_segment.remove(&place.0);
            }
        }
        Some(slot)
    }

    /// Drops every entry and ghost key (operators, benchmarks of cold
    /// reads).
    pub(super) fn clear(&mut self) {
        self.stats.invalidations += self.map.len() as u64;
        self.map.clear();
        self.by_segment.clear();
        self.small.clear();
        self.main.clear();
        self.ghost.clear();
        self.ghost_set.clear();
        self.small_bytes = 0;
        self.main_bytes = 0;
    }

    fn uncharge(&mut self, slot: &Slot) {
        match slot.queue {
            Queue::Small => self.small_bytes -= slot.cost,
            Queue::Main => self.main_bytes -= slot.cost,
        }
    }

    fn make_room(&mut self, cost: usize) {
        while self.small_bytes + self.main_bytes + cost > self.bytes_max {
            let small_over = self.small_bytes > self.bytes_max / 10;
            // Small first when it is over its tenth (or main is empty);
            // either way the other queue when the first has nothing.
            let small_first = small_over || self.main_bytes == 0;
            let evicted = if small_first {
                self.evict_small() || self.evict_main()
            } else {
                let from_main = self.evict_main();
                from_main || self.evict_small()
            };
            if !evicted {
                debug_assert_eq!(self.small_bytes + self.main_bytes, 0);
                break;
            }
        }
    }

    /// Takes the oldest live entry of the small FIFO: read again since it
    /// came in, it moves to main; else it leaves and its key goes to the
    /// ghost. False if the small FIFO is empty.
    fn evict_small(&mut self) -> bool {
        while let Some((place, generation)) = self.small.pop_front() {
            let Some(slot) = self.map.get_mut(&place) else {
                continue;
            };
            if slot.generation != generation || slot.queue != Queue::Small {
                continue;
            }
            if slot.freq > 0 {
                slot.freq = 0;
                slot.queue = Queue::Main;
                self.small_bytes -= slot.cost;
                self.main_bytes += slot.cost;
                self.main.push_back((place, generation));
                // Moving frees no memory; keep going until something left.
                continue;
            }
            let slot = self.remove(place).expect("present");
            self.small_bytes -= slot.cost;
            self.stats.evictions += 1;
            self.remember_ghost(place);
            return true;
        }
        false
    }

    /// Takes the oldest entry of main: read since its last pass, it gets
    /// another (its count drops by one); else it leaves. False if main is
    /// empty.
    fn evict_main(&mut self) -> bool {
        while let Some((place, generation)) = self.main.pop_front() {
            let Some(slot) = self.map.get_mut(&place) else {
                continue;
            };
            if slot.generation != generation || slot.queue != Queue::Main {
                continue;
            }
            if slot.freq > 0 {
                slot.freq -= 1;
                self.main.push_back((place, generation));
                continue;
            }
            let slot = self.remove(place).expect("present");
            self.main_bytes -= slot.cost;
            self.stats.evictions += 1;
            return true;
        }
        false
    }

    fn remember_ghost(&mut self, place: Place) {
        self.generation += 1;
        self.ghost_set.insert(place, self.generation);
        self.ghost.push_back((place, self.generation));
        while self.ghost_set.len() > self.ghost_max {
            let Some((old, generation)) = self.ghost.pop_front() else {
                break;
            };
            if self.ghost_set.get(&old) == Some(&generation) {
                self.ghost_set.remove(&old);
            }
        }
        self.trim_queues();
    }

    /// Stale positions (entries forgotten or moved) linger in the queues
    /// until popped; keep each queue within a small multiple of what is
    /// live so that a workload of overwrites cannot grow them without
    /// bound.
    fn trim_queues(&mut self) {
        let live = self.map.len() + 64;
        if self.small.len() + self.main.len() > 2 * live {
            let map = &self.map;
            let current = |(place, generation): &(Place, u64), queue: Queue| {
                map.get(place)
                    .is_some_and(|s| s.generation == *generation && s.queue == queue)
            };
            self.small.retain(|p| current(p, Queue::Small));
            self.main.retain(|p| current(p, Queue::Main));
        }
        if self.ghost.len() > 2 * (self.ghost_set.len() + 64) {
            let set = &self.ghost_set;
            self.ghost.retain(|(p, g)| set.get(p) == Some(g));
        }
    }

    /// Checks the byte counts against the entries (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        let (mut small, mut main) = (0, 0);
        for slot in self.map.values() {
            match slot.queue {
                Queue::Small => small += slot.cost,
                Queue::Main => main += slot.cost,
            }
        }
        assert_eq!((small, main), (self.small_bytes, self.main_bytes));
        let indexed: usize = self.by_segment.values().map(|s| s.len()).sum();
        assert_eq!(indexed, self.map.len(), "segment index out of step");
        for (seg, offsets) in &self.by_segment {
            assert!(!offsets.is_empty());
            for off in offsets {
                assert!(self.map.contains_key(&(*seg, *off)));
            }
        }
        assert!(small + main <= self.bytes_max);
        assert!(self.ghost_set.len() <= self.ghost_max);
    }
}

#[cfg(test)]
mod tests;
