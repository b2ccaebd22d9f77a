//! Engine tests on real files: a seeded model test against a BTreeMap with
//! compaction and reopen, and recovery from torn and corrupted tails.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::rc::Rc;

use bytes::Bytes;
use glommio::LocalExecutorBuilder;
use percore_server::store::file::FaultPoint;
use percore_server::store::record::ObjectMeta;
use percore_server::store::{ListItem, Store, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{read_all, run, small_config};

fn payload(key: &str, version: u64, len: usize) -> Bytes {
    common::seeded_bytes(version ^ (key.len() as u64 * 7919), len)
}

fn meta(etag: &str) -> ObjectMeta {
    ObjectMeta {
        etag: etag.into(),
        content_type: "application/octet-stream".into(),
        ..Default::default()
    }
}

async fn check_model(store: &Store, model: &BTreeMap<String, Bytes>) {
    for (key, data) in model {
        let got = read_all(store, "b", key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(got == data[..], "{key}: content differs");
        assert_eq!(store.head("b", key).unwrap().size_bytes, data.len() as u64);
    }
    let listed: Vec<String> = store
        .list("b", "", "", None, usize::MAX)
        .into_iter()
        .map(|i| i.name().to_string())
        .collect();
    let expected: Vec<String> = model.keys().cloned().collect();
    assert_eq!(listed, expected);
}

#[test]
fn model_test_with_compaction_and_reopen() {
    for seed in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let (mut store, _) = Store::open(small_config(&path)).await.unwrap();
            let mut model: BTreeMap<String, Bytes> = BTreeMap::new();
            let mut compactions = 0;
            for step in 0..600u64 {
                let key = format!("k/{:02}", rng.gen_range(0..40));
                match rng.gen_range(0..100) {
                    0..=44 => {
                        let len = match rng.gen_range(0..10) {
                            0 => 0,
                            1..=6 => rng.gen_range(1..4000),
                            _ => rng.gen_range(16 * 1024..80 * 1024),
                        };
                        let data = payload(&key, step, len);
                        store.put("b", &key, meta("e"), data.clone()).await.unwrap();
                        model.insert(key, data);
                    }
                    45..=64 => {
                        let existed = store.delete("b", &key).await.unwrap();
                        assert_eq!(existed, model.remove(&key).is_some());
                    }
                    65..=84 => match model.get(&key) {
                        Some(data) => {
                            assert!(read_all(&store, "b", &key).await.unwrap() == data[..])
                        }
                        None => assert!(matches!(
                            store.open_read("b", &key).await,
                            Err(StoreError::NotFound)
                        )),
                    },
                    85..=94 => {
                        if store.compact_once().await.unwrap().is_some() {
                            compactions += 1;
                        }
                    }
                    _ => {
                        store.shutdown().await;
                        drop(store);
                        store = Store::open(small_config(&path)).await.unwrap().0;
                        check_model(&store, &model).await;
                    }
                }
            }
            // Compact until nothing qualifies, then check and reopen.
            let mut rounds = 0;
            while store.compact_once().await.unwrap().is_some() {
                compactions += 1;
                rounds += 1;
                assert!(
                    rounds < 1000,
                    "compaction does not converge: {:?}",
                    store.segment_table()
                );
            }
            check_model(&store, &model).await;
            store.shutdown().await;
            drop(store);
            let (store, report) = Store::open(small_config(&path)).await.unwrap();
            check_model(&store, &model).await;
            assert_eq!(report.objects as usize, model.len());
            assert!(compactions > 0, "seed {seed}: compaction never ran");
            // Deleted keys stay deleted after all that compaction (no resurrection).
            for i in 0..40 {
                let key = format!("k/{i:02}");
                assert_eq!(
                    store.head("b", &key).is_some(),
                    model.contains_key(&key),
                    "{key}"
                );
            }
        });
    }
}

#[test]
fn list_with_prefix_delimiter_and_start_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        for key in ["a", "a/b", "a/c/d", "a/c/e", "b/x", "b/y", "c"] {
            store
                .put("b", key, meta("e"), Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        let names = |items: Vec<ListItem>| {
            items
                .into_iter()
                .map(|i| i.name().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(store.list("b", "", "", Some("/"), 100)),
            ["a", "a/", "b/", "c"]
        );
        assert_eq!(
            names(store.list("b", "a/", "", Some("/"), 100)),
            ["a/b", "a/c/"]
        );
        assert_eq!(
            names(store.list("b", "", "a/", Some("/"), 100)),
            ["b/", "c"]
        );
        assert_eq!(
            names(store.list("b", "", "a", None, 3)),
            ["a/b", "a/c/d", "a/c/e"]
        );
        assert_eq!(names(store.list("b", "b", "", None, 100)), ["b/x", "b/y"]);
        assert!(store.list("other", "", "", None, 100).is_empty());
    });
}

use common::segment_files;

/// Writes objects, then damages the end of the newest segment and reopens.
fn damage_and_reopen(damage: impl FnOnce(&Path) + Send + 'static) -> (usize, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let (store, _) = Store::open(small_config(&p)).await.unwrap();
        for i in 0..10 {
            store
                .put("b", &format!("k{i}"), meta("e"), payload("k", i, 3000))
                .await
                .unwrap();
        }
        // Leave the segment unsealed, as a crash would.
        drop(store);
    });
    damage(&path);
    let out = Rc::new(RefCell::new((0usize, 0u64, 0u64)));
    let p = path.clone();
    let result = std::thread::spawn(move || {
        let mut res = (0, 0, 0);
        LocalExecutorBuilder::default()
            .spawn(move || async move {
                let (store, report) = Store::open(small_config(&p)).await.unwrap();
                let mut good = 0;
                for i in 0..10 {
                    let key = format!("k{i}");
                    if let Ok(data) = read_all(&store, "b", &key).await {
                        assert!(
                            data == payload("k", i, 3000)[..],
                            "wrong bytes served for {key}"
                        );
                        good += 1;
                    }
                }
                (good, report.torn_tails_cut, report.corrupt_records)
            })
            .unwrap()
            .join()
            .map(|r| res = r)
            .unwrap();
        res
    })
    .join()
    .unwrap();
    drop(out);
    result
}

#[test]
fn recovery_cuts_a_truncated_tail() {
    let (good, _, _) = damage_and_reopen(|dir| {
        let seg = segment_files(dir).pop().unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        let len = f.metadata().unwrap().len();
        // Each acknowledged PUT was its own 4 KiB-aligned batch; the last one
        // starts 4 KiB before the end. Cut in the middle of its payload.
        f.set_len(len - 4096 + 1500).unwrap();
    });
    assert_eq!(good, 9, "expected the first 9 objects");
}

#[test]
fn recovery_drops_a_corrupted_tail_record_and_never_serves_it() {
    let (good, _, corrupt) = damage_and_reopen(|dir| {
        let seg = segment_files(dir).pop().unwrap();
        let mut bytes = std::fs::read(&seg).unwrap();
        // Flip one byte inside the payload of the last object.
        let pos = bytes.len() - 4096 + 200;
        let pos = bytes[..pos].iter().rposition(|b| *b != 0).unwrap() - 100;
        bytes[pos] ^= 0x40;
        std::fs::write(&seg, &bytes).unwrap();
    });
    assert_eq!(good, 9);
    assert!(corrupt >= 1);
}

#[test]
fn recovery_ignores_garbage_after_the_tail() {
    let (good, cut, _) = damage_and_reopen(|dir| {
        let seg = segment_files(dir).pop().unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
        use std::io::Write;
        f.write_all(&[0xAB; 8192]).unwrap();
    });
    assert_eq!(good, 10);
    assert_eq!(cut, 1);
}

#[test]
fn bit_rot_in_a_sealed_segment_is_detected_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let (store, _) = Store::open(small_config(&p)).await.unwrap();
        store
            .put("b", "big", meta("e"), payload("big", 1, 100_000))
            .await
            .unwrap();
        store
            .put("b", "small", meta("e"), payload("small", 1, 1000))
            .await
            .unwrap();
        store.shutdown().await;
    });
    // Flip a byte in the big object's second extent payload.
    let seg = segment_files(&path).remove(0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let needle = &payload("big", 1, 100_000)[40_000..40_064];
    let pos = bytes.windows(64).position(|w| w == needle).unwrap();
    bytes[pos + 10] ^= 1;
    std::fs::write(&seg, &bytes).unwrap();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let mut r = store.open_read("b", "big").await.unwrap();
        let first = r.read(0, 16 * 1024).await.unwrap();
        assert!(first[..] == payload("big", 1, 100_000)[..16 * 1024]);
        let bad = r.read(32 * 1024, 16 * 1024).await;
        assert!(
            matches!(bad, Err(StoreError::Corrupt { .. })),
            "corrupt extent must not be served"
        );
        assert!(read_all(&store, "b", "small").await.is_ok());
        assert!(store.stats().corrupt_reads >= 1);
    });
}

/// The header and block-CRC caches: a second ranged read of an object makes
/// no header reads; bytes that rot on disk after the caches are warm are
/// still refused (the cached CRCs check them); once compaction moves the
/// object, reads follow it with correct bytes.
#[test]
fn header_caches_save_reads_and_never_hide_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        // The header and CRC caches alone: with the object cache, the
        // ranged reads below would be served from memory (16 KiB extents
        // fit in one CRC block, so a read caches the whole extent).
        let mut cfg = small_config(&path);
        cfg.object_cache_bytes_max = 0;
        let (store, _) = Store::open(cfg).await.unwrap();
        let big = payload("big", 1, 100_000);
        store.put("b", "big", meta("e"), big.clone()).await.unwrap();
        // Garbage so that compaction has a reason to move "big".
        for i in 0..40 {
            let k = format!("junk/{i}");
            store
                .put("b", &k, meta("e"), payload(&k, 1, 9000))
                .await
                .unwrap();
            store.delete("b", &k).await.unwrap();
        }
        let ranged = |at: u64| {
            let store = store.clone();
            async move {
                let mut r = store.open_read("b", "big").await?;
                r.read(at, 4096).await.map(|b| b.to_vec())
            }
        };
        assert!(ranged(40_000).await.unwrap()[..] == big[40_000..44_096]);
        let before = store.stats();
        let reads = 20;
        for _ in 0..reads {
            assert!(ranged(40_000).await.unwrap()[..] == big[40_000..44_096]);
        }
        let after = store.stats();
        assert_eq!(after.header_cache_hits - before.header_cache_hits, reads);
        assert_eq!(after.crc_cache_hits - before.crc_cache_hits, reads);
        assert_eq!(after.header_cache_misses, before.header_cache_misses);
        assert_eq!(after.crc_cache_misses, before.crc_cache_misses);

        // Rot a byte of that extent on disk, caches warm: refused.
        let needle = &big[40_000..40_064];
        let mut damaged = None;
        for seg in segment_files(&path) {
            let mut bytes = std::fs::read(&seg).unwrap();
            if let Some(pos) = bytes.windows(64).position(|w| w == needle) {
                bytes[pos + 10] ^= 1;
                std::fs::write(&seg, &bytes).unwrap();
                damaged = Some((seg, pos + 10));
                break;
            }
        }
        let (seg, pos) = damaged.expect("extent bytes on disk");
        assert!(matches!(
            ranged(40_000).await,
            Err(StoreError::Corrupt { .. })
        ));
        // Repair it, compact everything that can be: "big" moves; its old
        // segments (and their cache entries) go.
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[pos] ^= 1;
        std::fs::write(&seg, &bytes).unwrap();
        let mut compacted = 0;
        while let Ok(Some(_)) = store.compact_once().await {
            compacted += 1;
        }
        assert!(compacted > 0, "nothing was compacted");
        let moved = store.stats().header_cache_misses;
        assert!(ranged(0).await.unwrap()[..] == big[..4096]);
        assert_eq!(
            store.stats().header_cache_misses,
            moved + 1,
            "compaction did not move \"big\" (the test needs it to)"
        );
        // (Ranges within one 16 KiB extent: a read stops at a part boundary.)
        for at in [0usize, 40_000, 90_000] {
            let got = ranged(at as u64).await.unwrap();
            assert!(got[..] == big[at..at + 4096], "at {at} after compaction");
        }
        assert!(read_all(&store, "b", "big").await.unwrap() == big[..]);
        store.shutdown().await;
    });
}

#[test]
fn enospc_fails_the_write_and_the_store_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let fail = Rc::new(RefCell::new(false));
        let flag = fail.clone();
        let mut cfg = small_config(&path);
        cfg.faults = Some(Rc::new(RefCell::new(
            move |p: FaultPoint| -> Option<io::Error> {
                (*flag.borrow()
                    && matches!(
                        p,
                        FaultPoint::Write { .. }
                            | FaultPoint::Create { .. }
                            | FaultPoint::Seal { .. }
                    ))
                .then(|| io::Error::from_raw_os_error(libc::ENOSPC))
            },
        )));
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        store
            .put("b", "before", meta("e"), payload("before", 1, 5000))
            .await
            .unwrap();
        *fail.borrow_mut() = true;
        let err = store
            .put("b", "during", meta("e"), payload("during", 1, 5000))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NoSpace(_)), "{err}");
        assert!(store.delete("b", "before").await.is_err());
        // Reads go on.
        assert!(read_all(&store, "b", "before").await.unwrap() == payload("before", 1, 5000)[..]);
        assert!(store.head("b", "during").is_none());
        *fail.borrow_mut() = false;
        store
            .put("b", "after", meta("e"), payload("after", 1, 5000))
            .await
            .unwrap();
        store.shutdown().await;
        drop(store);
        cfg.faults = None;
        let (store, _) = Store::open(cfg).await.unwrap();
        assert!(read_all(&store, "b", "before").await.is_ok());
        assert!(read_all(&store, "b", "after").await.is_ok());
        assert!(store.head("b", "during").is_none());
    });
}

#[test]
fn group_commit_shares_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let before = store.stats().flushes;
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let s = store.clone();
                glommio::spawn_local(async move {
                    s.put("b", &format!("g{i}"), meta("e"), payload("g", i, 500))
                        .await
                        .unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        let flushes = store.stats().flushes - before;
        assert!(
            flushes < 32,
            "64 concurrent PUTs took {flushes} flushes: no group commit"
        );
        assert_eq!(store.object_count("b"), 64);
    });
}
