//! The in-memory index: bucket -> key -> newest version.

use super::{record, Loc, ObjectInfo, Store};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    Live(ObjectInfo),
    Deleted,
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

impl Store {
    pub(super) fn entry_spans(entry: &Entry) -> Vec<(u64, u64)> {
        let mut spans = vec![(entry.loc.segment_id, entry.loc.span_bytes())];
        if let State::Live(info) = &entry.state {
            for e in info.extents.iter() {
                spans.push((
                    e.segment_id,
                    record::record_span_bytes(u64::from(e.header_bytes), e.payload_bytes),
                ));
            }
        }
        spans
    }

    pub(super) fn adjust_live(&self, entry: &Entry, add: bool) {
        let mut segments = self.inner.segments.borrow_mut();
        for (segment_id, bytes) in Self::entry_spans(entry) {
            if let Some(seg) = segments.get_mut(&segment_id) {
                if add {
                    seg.live_bytes += bytes;
                } else {
                    debug_assert!(seg.live_bytes >= bytes, "live bytes underflow");
                    seg.live_bytes = seg.live_bytes.saturating_sub(bytes);
                }
            }
        }
    }

    /// Installs a durable record version if it is newer than what the index
    /// holds. Returns true if it became the current version.
    pub(super) fn install(&self, bucket: &str, key: &str, new: Entry) -> bool {
        let mut index = self.inner.index.borrow_mut();
        let keys = index.entry(bucket.to_string()).or_default();
        match keys.get_mut(key) {
            Some(old) if old.seq > new.seq || (old.seq == new.seq && old.loc == new.loc) => {
                // A newer version won the race; this record is stale on disk.
                if old.loc != new.loc {
                    old.older_on_disk += 1;
                }
                false
            }
            Some(old) => {
                let old = std::mem::replace(old, new);
                let current = keys.get_mut(key).unwrap();
                current.older_on_disk = old.older_on_disk + 1;
                let current = current.clone();
                drop(index);
                self.adjust_live(&old, false);
                self.adjust_live(&current, true);
                true
            }
            None => {
                let added = new.clone();
                keys.insert(key.to_string(), new);
                drop(index);
                self.adjust_live(&added, true);
                true
            }
        }
    }

    /// A durable record of `key` that will never be installed: one more
    /// older record on disk, so that its tombstone is kept long enough.
    pub(super) fn count_stale(&self, bucket: &str, key: &str) {
        if let Some(entry) = self
            .inner
            .index
            .borrow_mut()
            .get_mut(bucket)
            .and_then(|k| k.get_mut(key))
        {
            entry.older_on_disk += 1;
        }
    }

    pub(super) fn lookup(&self, bucket: &str, key: &str) -> Option<Entry> {
        self.inner.index.borrow().get(bucket)?.get(key).cloned()
    }
}
