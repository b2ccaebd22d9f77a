//! The in-memory index: bucket -> key -> newest version, ordered, and the
//! counts that must stay consistent with it.
//!
//! `Index` is the only owner of the map. Readers get shared views
//! (`get`, `iter`, `entry`); every change goes through a method below, which
//! keeps these invariants:
//!
//! 1. **Newest wins.** An entry is only replaced by a version with a higher
//!    seq, or the same seq at another place (a relocated copy of the same
//!    version). A version that loses is counted as an older record instead.
//! 2. **Live bytes.** For every segment in the store's segment table (and
//!    only those: `track_segment` / `forget_segment` mirror the table),
//!    `live_bytes(s)` is the sum of the record spans in `s` of every current
//!    entry: its own record and, for a live object, its extents. Compaction
//!    picks victims by `end - live`.
//! 3. **Older records.** `Entry::older_on_disk` counts the records of the
//!    key on disk other than `loc` (older versions, stale copies, refused
//!    writes). It may over-count (a tombstone then lives longer), never
//!    under-count: a tombstone is dropped (`drop_tombstone`) only once
//!    compaction has found the count at zero, or else a record it hides
//!    would come back at recovery. It drops (`uncount_stale`) only after the
//!    file holding those records is gone.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};

use super::{record, Loc, ObjectInfo, Store};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    Live(ObjectInfo),
    /// A tombstone, with its replication stamp (`ObjectInfo::stamp`).
    Deleted {
        stamp: u64,
    },
    /// A delete marker (S3 versioning): reads as deleted, but is a version
    /// of its own that compaction keeps, like a live object without bytes.
    Marker {
        mtime_ms: u64,
    },
}

impl State {
    /// Live object or delete marker: a version that exists (a tombstone
    /// is the absence of one).
    pub(super) fn is_version(&self) -> bool {
        !matches!(self, State::Deleted { .. })
    }

    /// Its replication stamp (`Store::key_stamp`): a delete marker's time
    /// is its stamp.
    pub(super) fn stamp(&self) -> u64 {
        match self {
            State::Live(info) => info.stamp,
            State::Deleted { stamp } => *stamp,
            State::Marker { mtime_ms } => *mtime_ms,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) seq: u64,
    pub(super) loc: Loc,
    pub(super) state: State,
    /// Records of this key on disk other than `loc` (older versions, stale
    /// copies). A tombstone may only be dropped when this reaches zero.
    pub(super) older_on_disk: u32,
}

impl Entry {
    /// (segment, record offset) of every record this version reads from.
    fn places(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let extents = match &self.state {
            State::Live(info) => &info.extents[..],
            State::Deleted { .. } | State::Marker { .. } => &[],
        };
        std::iter::once((self.loc.segment_id, self.loc.offset))
            .chain(extents.iter().map(|e| (e.segment_id, e.record_offset)))
    }

    /// (segment, span bytes) of every record this version keeps live.
    fn spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let extents = match &self.state {
            State::Live(info) => &info.extents[..],
            State::Deleted { .. } | State::Marker { .. } => &[],
        };
        std::iter::once((self.loc.segment_id, self.loc.span_bytes())).chain(extents.iter().map(
            |e| {
                (
                    e.segment_id,
                    record::record_span_bytes(u64::from(e.header_bytes), e.payload_bytes),
                )
            },
        ))
    }
}

pub(super) type Key = (String, String);

/// See the module documentation for the invariants.
#[derive(Default)]
pub(super) struct Index {
    keys: BTreeMap<String, BTreeMap<String, Entry>>,
    /// Invariant 2: live bytes per segment of the segment table.
    live_bytes: HashMap<u64, u64>,
    /// Places (segment, offset) of the records of versions `install`
    /// replaced, for the store to drop from its object cache.
    released: Vec<(u64, u64)>,
}

impl Index {
    // ---- reading ----

    /// The keys of `bucket`, in order.
    pub(super) fn get(&self, bucket: &str) -> Option<&BTreeMap<String, Entry>> {
        self.keys.get(bucket)
    }

    /// Every bucket with its keys, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &BTreeMap<String, Entry>)> {
        self.keys.iter()
    }

    /// Every (bucket, key, entry) after `after` (exclusive), in order.
    pub(super) fn walk_after<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
    ) -> impl Iterator<Item = (&'a String, &'a String, &'a Entry)> + 'a {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, |(b, _)| Bound::Included(b));
        self.keys
            .range::<str, _>((from, Bound::Unbounded))
            .flat_map(move |(b, keys)| {
                let start = match after {
                    Some((ab, ak)) if ab == b.as_str() => Bound::Excluded(ak),
                    _ => Bound::Unbounded,
                };
                keys.range::<str, _>((start, Bound::Unbounded))
                    .map(move |(k, e)| (b, k, e))
            })
    }

    pub(super) fn entry(&self, bucket: &str, key: &str) -> Option<&Entry> {
        self.keys.get(bucket)?.get(key)
    }

    /// Bytes of current records in `segment_id` (0 for an unknown segment).
    pub(super) fn live_bytes(&self, segment_id: u64) -> u64 {
        self.live_bytes.get(&segment_id).copied().unwrap_or(0)
    }

    /// Offsets in `segment_id` of every record the index points to (current
    /// versions and their extents).
    pub(super) fn offsets_in(&self, segment_id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for keys in self.keys.values() {
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

    /// Record offsets of extents in `segment_id` → the keys whose current
    /// version lists them. One pass over the index.
    pub(super) fn extent_owners(&self, segment_id: u64) -> HashMap<u64, Vec<Key>> {
        let mut owners: HashMap<u64, Vec<Key>> = HashMap::new();
        for (bucket, keys) in &self.keys {
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

    // ---- segments (invariant 2) ----

    /// A segment joined the segment table (empty, or before recovery
    /// installs anything in it).
    pub(super) fn track_segment(&mut self, segment_id: u64) {
        let before = self.live_bytes.insert(segment_id, 0);
        debug_assert!(before.is_none(), "segment {segment_id} tracked twice");
    }

    /// A segment left the segment table (compacted away): no current entry
    /// points into it any more.
    pub(super) fn forget_segment(&mut self, segment_id: u64) {
        self.live_bytes.remove(&segment_id);
    }

    fn adjust_live(&mut self, entry: &Entry, add: bool) {
        for (segment_id, bytes) in entry.spans() {
            if let Some(live) = self.live_bytes.get_mut(&segment_id) {
                if add {
                    *live += bytes;
                } else {
                    debug_assert!(*live >= bytes, "live bytes underflow");
                    *live = live.saturating_sub(bytes);
                }
            }
        }
    }

    // ---- versions (invariants 1 and 3) ----

    /// Installs a durable record version if it is newer than what the index
    /// holds. Returns true if it became the current version. `new`'s own
    /// `older_on_disk` counts only when the key is new (recovery sets it).
    pub(super) fn install(&mut self, bucket: &str, key: &str, new: Entry) -> bool {
        let keys = self.keys.entry(bucket.to_string()).or_default();
        match keys.get_mut(key) {
            Some(old) if old.seq > new.seq || (old.seq == new.seq && old.loc == new.loc) => {
                // A newer version won the race; this record is stale on disk.
                if old.loc != new.loc {
                    old.older_on_disk += 1;
                }
                false
            }
            Some(old) => {
                debug_assert!(new.seq >= old.seq, "an older version replaced a newer");
                let older_on_disk = old.older_on_disk + 1;
                let old = std::mem::replace(
                    old,
                    Entry {
                        older_on_disk,
                        ..new
                    },
                );
                let current = keys[key].clone();
                self.released.extend(old.places());
                self.adjust_live(&old, false);
                self.adjust_live(&current, true);
                true
            }
            None => {
                let added = new.clone();
                keys.insert(key.to_string(), new);
                self.adjust_live(&added, true);
                true
            }
        }
    }

    /// Points `key` at `new` (same version, another place: a relocated
    /// copy) if it is still at `old_loc`. The record left at `old_loc`
    /// counts as an older record unless `old_goes_with_victim` (its segment
    /// is about to be deleted).
    pub(super) fn relocate(
        &mut self,
        bucket: &str,
        key: &str,
        old_loc: Loc,
        mut new: Entry,
        old_goes_with_victim: bool,
    ) {
        let Some(slot) = self.keys.get_mut(bucket).and_then(|k| k.get_mut(key)) else {
            return;
        };
        if slot.loc != old_loc {
            return;
        }
        debug_assert_eq!(slot.seq, new.seq, "a relocated copy is the same version");
        new.older_on_disk = slot.older_on_disk + u32::from(!old_goes_with_victim);
        let old = std::mem::replace(slot, new.clone());
        self.adjust_live(&old, false);
        self.adjust_live(&new, true);
    }

    /// A durable record of `key` that will never be installed: one more
    /// older record on disk, so that its tombstone is kept long enough.
    pub(super) fn count_stale(&mut self, bucket: &str, key: &str) {
        if let Some(entry) = self.keys.get_mut(bucket).and_then(|k| k.get_mut(key)) {
            entry.older_on_disk += 1;
        }
    }

    /// `n` older records of `key` are gone from disk (their file deleted).
    pub(super) fn uncount_stale(&mut self, bucket: &str, key: &str, n: u32) {
        if let Some(e) = self.keys.get_mut(bucket).and_then(|k| k.get_mut(key)) {
            e.older_on_disk = e.older_on_disk.saturating_sub(n);
        }
    }

    /// Forgets the tombstone of `key` if it is still version `seq` in
    /// `segment_id` (compaction decided it hides nothing any more). Returns
    /// whether it was dropped.
    pub(super) fn drop_tombstone(
        &mut self,
        bucket: &str,
        key: &str,
        seq: u64,
        segment_id: u64,
    ) -> bool {
        let Some(keys) = self.keys.get_mut(bucket) else {
            return false;
        };
        let still = keys.get(key).is_some_and(|e| {
            e.seq == seq
                && matches!(e.state, State::Deleted { .. })
                && e.loc.segment_id == segment_id
        });
        if still {
            // A tombstone keeps no bytes live but its own record's, in the
            // victim: no live-byte change to make.
            // (The victim has left the segment table by now.)
            debug_assert!(!self.live_bytes.contains_key(&segment_id));
            keys.remove(key);
        }
        still
    }

    /// Recomputes invariant 2 from scratch; for tests.
    #[cfg(test)]
    pub(super) fn check_live_bytes(&self) {
        let mut want: HashMap<u64, u64> = self.live_bytes.keys().map(|s| (*s, 0)).collect();
        for keys in self.keys.values() {
            for entry in keys.values() {
                for (s, bytes) in entry.spans() {
                    if let Some(w) = want.get_mut(&s) {
                        *w += bytes;
                    }
                }
            }
        }
        assert_eq!(want, self.live_bytes);
    }
}

/// Marks on keys, kept beside the index (in their own cells: a guard may
/// drop while the index is borrowed).
#[derive(Default)]
pub(super) struct KeyMarks {
    /// Keys with a new version between taking its seq and installing it.
    /// A conditional write may only start when its key has none: then no
    /// refused conditional record can carry a higher seq than the version
    /// that won (recovery picks the highest seq).
    pub(super) writing: RefCell<HashMap<Key, u32>>,
    /// The last stamp handed to a write of each key being written (see
    /// `Store::next_stamp`): dropped with the key's last writing mark.
    pub(super) stamps: RefCell<HashMap<Key, u64>>,
    /// Multipart uploads being completed or aborted: no part may be
    /// installed for them any more (bucket, upload index key).
    pub(super) uploads_ending: RefCell<HashSet<Key>>,
    /// Keys with records of a failed batch that could not be cut off the
    /// file (see `cut_failed_batch`): such a record may come back at
    /// recovery, so a DELETE of the key writes a tombstone even when the key
    /// looks absent, and compaction keeps the key's tombstones. Until restart.
    pub(super) uncertain: RefCell<HashSet<Key>>,
}

impl Store {
    /// See `Index::install`.
    /// The records of the version it replaces leave the object cache.
    pub(super) fn install(&self, bucket: &str, key: &str, new: Entry) -> bool {
        let mut index = self.inner.index.borrow_mut();
        let installed = index.install(bucket, key, new);
        if !index.released.is_empty() {
            let mut cache = self.inner.caches.object.borrow_mut();
            for place in index.released.drain(..) {
                cache.forget(place);
            }
        }
        installed
    }

    /// See `Index::count_stale`.
    pub(super) fn count_stale(&self, bucket: &str, key: &str) {
        self.inner.index.borrow_mut().count_stale(bucket, key);
    }

    pub(super) fn lookup(&self, bucket: &str, key: &str) -> Option<Entry> {
        self.inner.index.borrow().entry(bucket, key).cloned()
    }
}

#[cfg(test)]
mod tests;
