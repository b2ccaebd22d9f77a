//! The shard's caches of record headers read on the request path.
//!
//! A ranged read of a large object needs two things from disk before its
//! data: the object's own record header (metadata, extent list) and the
//! block CRCs of the extent it reads, which live in the extent's record
//! header. Without caches every ranged GET pays two device reads before the
//! data read. Records are never rewritten in place and segment ids are
//! never reused while the process runs, so an entry keyed by (segment,
//! record offset) cannot go stale; entries of a deleted segment are dropped
//! with it.
//!
//! Bounded by bytes (each value's own cost plus entry overhead), evicting
//! the oldest entry first. Owned by one shard: no locks.

use std::collections::{BTreeMap, VecDeque};

/// Bytes charged per entry on top of its value (map and queue nodes, key).
const ENTRY_OVERHEAD_BYTES: usize = 96;

pub(crate) struct RecordCache<V> {
    map: BTreeMap<(u64, u64), V>,
    /// Insertion order; may hold keys already dropped (skipped on eviction).
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    bytes_max: usize,
    /// Heap bytes a value holds.
    value_bytes: fn(&V) -> usize,
    pub hits: u64,
    pub misses: u64,
}

impl<V: Clone> RecordCache<V> {
    pub fn new(bytes_max: usize, value_bytes: fn(&V) -> usize) -> RecordCache<V> {
        RecordCache {
            map: BTreeMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            bytes_max,
            value_bytes,
            hits: 0,
            misses: 0,
        }
    }

    fn cost(&self, v: &V) -> usize {
        ENTRY_OVERHEAD_BYTES + (self.value_bytes)(v)
    }

    pub fn get(&mut self, segment_id: u64, record_offset: u64) -> Option<V> {
        let found = self.map.get(&(segment_id, record_offset)).cloned();
        match found {
            Some(_) => self.hits += 1,
            None => self.misses += 1,
        }
        found
    }

    pub fn insert(&mut self, segment_id: u64, record_offset: u64, value: V) {
        let c = self.cost(&value);
        if c > self.bytes_max {
            return;
        }
        if let Some(old) = self.map.insert((segment_id, record_offset), value) {
            self.bytes -= self.cost(&old);
        } else {
            self.order.push_back((segment_id, record_offset));
        }
        self.bytes += c;
        while self.bytes > self.bytes_max {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.map.remove(&key) {
                self.bytes -= self.cost(&old);
            }
        }
        // Keys of dropped segments linger in `order` until popped; keep the
        // queue within a small multiple of the live entries.
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }

    /// Drops every entry of a segment that is being deleted.
    pub fn forget_segment(&mut self, segment_id: u64) {
        let keys: Vec<(u64, u64)> = self
            .map
            .range((segment_id, 0)..=(segment_id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(old) = self.map.remove(&k) {
                self.bytes -= self.cost(&old);
            }
        }
    }

    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn crcs(n: u32) -> Rc<[u32]> {
        (0..n).collect::<Vec<_>>().into()
    }

    #[test]
    fn bounded_oldest_first_and_per_segment_forget() {
        let mut c: RecordCache<Rc<[u32]>> = RecordCache::new(0, |v| std::mem::size_of_val(&v[..]));
        let one = c.cost(&crcs(16));
        c.bytes_max = 3 * one;
        for off in 0..3 {
            c.insert(1, off, crcs(16));
        }
        assert_eq!((c.len(), c.bytes()), (3, 3 * one));
        c.insert(2, 0, crcs(16));
        assert_eq!(c.len(), 3);
        assert!(c.get(1, 0).is_none(), "the oldest entry goes first");
        assert_eq!(c.get(1, 1).as_deref(), Some(&crcs(16)[..]));
        assert_eq!((c.hits, c.misses), (1, 1));
        // Replacing an entry charges it once.
        c.insert(2, 0, crcs(16));
        assert_eq!((c.len(), c.bytes()), (3, 3 * one));
        c.forget_segment(1);
        assert_eq!((c.len(), c.bytes()), (1, one));
        assert!(c.get(1, 2).is_none() && c.get(2, 0).is_some());
        // Too big for the whole cache: not kept, nothing else evicted.
        c.insert(3, 0, crcs(1 << 20));
        assert_eq!(c.len(), 1);
        // Dropped keys do not pile up in the order queue.
        for i in 0..10_000 {
            c.insert(9, i, crcs(1));
            c.forget_segment(9);
        }
        assert!(c.order.len() <= 2 * c.len() + 65);
    }
}
