use super::*;

fn part(n: usize) -> Rc<CachedPart> {
    Rc::new(CachedPart {
        seq: n as u64,
        meta: None,
        payload: Payload::Heap(Bytes::from(vec![n as u8; n])),
    })
}

/// A cache of `entries` entries of 1000 bytes each (plus overhead).
fn cache_of(entries: usize) -> ObjectCache {
    ObjectCache::new(entries * (1000 + ENTRY_OVERHEAD_BYTES))
}

fn put(c: &mut ObjectCache, place: Place) {
    c.insert(place, part(1000), 1000 + ENTRY_OVERHEAD_BYTES);
    c.check();
}

#[test]
fn a_hit_returns_what_was_inserted_and_counts() {
    let mut c = cache_of(10);
    assert!(c.get((1, 0)).is_none());
    c.insert((1, 0), part(7), 500);
    let hit = c.get((1, 0)).expect("hit");
    assert_eq!(&hit.payload[..], &[7u8; 7][..]);
    assert!(c.get((1, 4096)).is_none());
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.inserts, s.entries), (1, 2, 1, 1));
    assert_eq!(s.bytes, 500);
}

#[test]
fn bytes_never_exceed_the_budget() {
    let mut c = cache_of(20);
    let mut x = 1u64;
    for i in 0..20_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let place = (x % 7, (x >> 8) % 100);
        match x % 5 {
            0 | 1 => {
                let size = (x >> 20) as usize % 3000;
                c.insert(place, part(size), size + ENTRY_OVERHEAD_BYTES);
            }
            2 | 3 => {
                let _ = c.get(place);
            }
            _ if i % 97 == 0 => c.forget_segment(place.0),
            _ => c.forget(place),
        }
        c.check();
    }
    assert!(c.stats().evictions > 0);
}

#[test]
fn a_one_pass_scan_does_not_flush_the_working_set() {
    let mut c = cache_of(100);
    // A working set of 50 entries, each read a few times.
    for round in 0..4 {
        for k in 0..50 {
            if c.get((1, k)).is_none() {
                assert!(round < 2, "working-set entry {k} lost in round {round}");
                put(&mut c, (1, k));
            }
        }
    }
    // A scan of 10,000 entries, each read once.
    for k in 0..10_000 {
        assert!(c.get((2, k)).is_none());
        put(&mut c, (2, k));
    }
    let hits = (0..50).filter(|k| c.get((1, *k)).is_some()).count();
    assert_eq!(hits, 50, "the scan evicted part of the working set");
}

#[test]
fn an_entry_evicted_from_small_comes_back_into_main() {
    let mut c = cache_of(10);
    put(&mut c, (1, 0));
    for k in 1..100 {
        put(&mut c, (2, k));
    }
    assert!(c.get((1, 0)).is_none(), "a one-hit entry should have left");
    // Its key is in the ghost: the next insert goes to main and survives a
    // scan as long as it is read.
    put(&mut c, (1, 0));
    for k in 100..200 {
        put(&mut c, (2, k));
        if k % 4 == 0 {
            assert!(c.get((1, 0)).is_some(), "lost at {k}");
        }
    }
}

#[test]
fn costly_inserts_wait_for_a_second_miss() {
    let mut c = cache_of(10);
    assert!(!c.admit_costly((3, 0)));
    assert_eq!(c.stats().declined, 1);
    assert!(c.admit_costly((3, 0)));
    put(&mut c, (3, 0));
    assert!(!c.admit_costly((3, 0)), "already cached");
    assert!(c.get((3, 0)).is_some());
}

#[test]
fn forget_and_forget_segment_drop_entries_and_their_bytes() {
    let mut c = cache_of(10);
    put(&mut c, (1, 0));
    put(&mut c, (1, 4096));
    put(&mut c, (2, 0));
    c.forget((1, 0));
    assert!(c.get((1, 0)).is_none());
    c.forget_segment(2);
    assert!(c.get((2, 0)).is_none());
    assert!(c.get((1, 4096)).is_some());
    let s = c.stats();
    assert_eq!((s.entries, s.invalidations), (1, 2));
    assert_eq!(s.bytes, (1000 + ENTRY_OVERHEAD_BYTES) as u64);
    // A key forgotten and inserted again is one entry, counted once, and
    // its stale queue position does not disturb the accounting.
    put(&mut c, (1, 0));
    c.forget((1, 0));
    put(&mut c, (1, 0));
    for k in 0..50 {
        put(&mut c, (5, k));
    }
    c.clear();
    assert_eq!(c.stats().bytes, 0);
    assert!(c.get((1, 4096)).is_none());
}

#[test]
fn an_entry_too_large_for_the_budget_is_not_cached() {
    let mut c = ObjectCache::new(80_000);
    c.insert((1, 0), part(20_000), 20_000);
    assert!(c.get((1, 0)).is_none());
    let mut off = ObjectCache::new(0);
    off.insert((1, 0), part(10), 10);
    assert!(off.get((1, 0)).is_none());
    assert!(!off.admit_costly((1, 0)));
    assert_eq!(off.stats().misses, 0, "a disabled cache counts nothing");
}

#[test]
fn queues_and_ghost_stay_bounded_under_churn() {
    let mut c = cache_of(10);
    for k in 0..100_000u64 {
        put(&mut c, (k % 3, k));
        c.forget((k % 3, k));
        let _ = c.admit_costly((9, k));
    }
    assert!(c.small.len() + c.main.len() <= 2 * (c.map.len() + 64) + 1);
    assert!(c.ghost.len() <= 2 * (c.ghost_set.len() + 64) + 1);
    assert!(c.ghost_set.len() <= c.ghost_max);
}
