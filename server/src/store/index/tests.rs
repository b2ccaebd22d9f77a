//! The index's invariants, checked on small sequences of changes.

use super::*;
use crate::store::record::ExtentRef;

fn loc(segment_id: u64, offset: u64) -> Loc {
    Loc {
        segment_id,
        offset,
        header_bytes: 100,
        payload_bytes: 1000,
    }
}

fn live(seq: u64, at: Loc, extents: &[ExtentRef]) -> Entry {
    Entry {
        seq,
        loc: at,
        state: State::Live(ObjectInfo {
            size_bytes: 1,
            etag: "e".into(),
            mtime_ms: 0,
            stamp: 0,
            extents: extents.into(),
        }),
        older_on_disk: 0,
    }
}

fn deleted(seq: u64, at: Loc) -> Entry {
    Entry {
        seq,
        loc: at,
        state: State::Deleted { stamp: 0 },
        older_on_disk: 0,
    }
}

#[test]
fn newest_wins_and_losers_count_as_older_records() {
    let mut index = Index::default();
    index.track_segment(1);
    index.track_segment(2);
    assert!(index.install("b", "k", live(5, loc(1, 0), &[])));
    assert!(!index.install("b", "k", live(4, loc(2, 0), &[])));
    assert_eq!(index.entry("b", "k").unwrap().seq, 5);
    assert_eq!(index.entry("b", "k").unwrap().older_on_disk, 1);
    // The same record again changes nothing.
    assert!(!index.install("b", "k", live(5, loc(1, 0), &[])));
    assert_eq!(index.entry("b", "k").unwrap().older_on_disk, 1);
    assert!(index.install("b", "k", deleted(6, loc(2, 4096))));
    assert_eq!(index.entry("b", "k").unwrap().older_on_disk, 2);
    assert_eq!(index.live_bytes(1), 0);
    assert_eq!(index.live_bytes(2), loc(2, 4096).span_bytes());
    index.check_live_bytes();
}

#[test]
fn live_bytes_follow_extents_and_relocations() {
    let mut index = Index::default();
    for s in 1..=3 {
        index.track_segment(s);
    }
    let extent = ExtentRef {
        segment_id: 1,
        record_offset: 4096,
        header_bytes: 64,
        payload_bytes: 1 << 20,
    };
    index.install("b", "k", live(1, loc(2, 0), &[extent]));
    index.check_live_bytes();
    assert!(index.live_bytes(1) > 1 << 20);
    assert_eq!(index.offsets_in(1), vec![4096]);
    assert_eq!(
        index.extent_owners(1)[&4096],
        vec![("b".into(), "k".into())]
    );
    // Relocate the object record to segment 3; segment 2 is the victim.
    let moved = live(1, loc(3, 0), &[extent]);
    index.relocate("b", "k", loc(2, 0), moved, true);
    assert_eq!(index.entry("b", "k").unwrap().older_on_disk, 0);
    assert_eq!(index.live_bytes(2), 0);
    index.forget_segment(2);
    index.check_live_bytes();
    // Not at the expected place any more: nothing happens.
    index.relocate("b", "k", loc(2, 0), live(1, loc(1, 0), &[]), false);
    assert_eq!(index.entry("b", "k").unwrap().loc, loc(3, 0));
}

#[test]
fn tombstones_drop_only_as_the_same_version_in_the_victim() {
    let mut index = Index::default();
    index.track_segment(1);
    index.install("b", "k", live(1, loc(1, 0), &[]));
    index.install("b", "k", deleted(2, loc(1, 8192)));
    index.count_stale("b", "k");
    assert_eq!(index.entry("b", "k").unwrap().older_on_disk, 2);
    index.uncount_stale("b", "k", 5);
    assert_eq!(index.entry("b", "k").unwrap().older_on_disk, 0);
    index.forget_segment(1);
    assert!(!index.drop_tombstone("b", "k", 1, 1));
    assert!(!index.drop_tombstone("b", "k", 2, 7));
    assert!(index.drop_tombstone("b", "k", 2, 1));
    assert!(index.entry("b", "k").is_none());
}
