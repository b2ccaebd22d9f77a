//! Regression tests from the engine review: each reproduces a way to lose
//! acknowledged data or resurrect a deleted object that was found and fixed
//! (in-progress PUT extents compacted away, resealing over a dropped record,
//! compaction aborts and failed writes under-counting older records, shutdown
//! sealing over an in-flight batch, deletes and overwrites racing compaction).

use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use percore_server::store::file::FaultPoint;
use percore_server::store::record::ObjectMeta;
use percore_server::store::{debug_index, Store, StoreConfig};

mod common;
use common::{read_all, run, small_config};

fn cfg(dir: &Path) -> StoreConfig {
    let mut cfg = small_config(dir);
    cfg.direct_io = false;
    cfg
}

fn data(seed: u8, len: usize) -> Bytes {
    common::seeded_bytes(seed as u64 * 1_000_003 + len as u64, len)
}

fn meta() -> ObjectMeta {
    ObjectMeta {
        etag: "e".into(),
        ..Default::default()
    }
}

fn active(store: &Store) -> u64 {
    store.segment_table().last().unwrap().0
}

/// Writes filler objects until a new segment starts.
async fn roll(store: &Store, tag: &str) {
    let before = active(store);
    let mut i = 0;
    while active(store) == before {
        store
            .put("b", &format!("fill-{tag}-{i}"), meta(), data(1, 15_000))
            .await
            .unwrap();
        i += 1;
    }
}

fn older(store: &Store, key: &str) -> Option<(bool, u32)> {
    debug_index(store)
        .into_iter()
        .find(|e| e.1 == key)
        .map(|e| (e.3, e.4))
}

use common::segment_files as seg_files;

// A: a large PUT whose first extents sit in a segment sealed before finish()
// loses them to compaction.
#[test]
fn compaction_keeps_the_extents_of_a_put_still_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(cfg(&path)).await.unwrap();
        let body = data(7, 600 * 1024);
        let mut w = store.put_stream("b", "big", meta());
        w.write(body.slice(..400 * 1024)).await.unwrap();
        let mut compacted = vec![];
        while let Some(r) = store.compact_once().await.unwrap() {
            compacted.push(r.segment_id);
        }
        eprintln!(
            "A: compacted {compacted:?} during PUT; table {:?}",
            store.segment_table()
        );
        w.write(body.slice(400 * 1024..)).await.unwrap();
        let info = w.finish().await;
        eprintln!("A: finish -> {:?}", info.as_ref().map(|i| i.size_bytes));
        let got = read_all(&store, "b", "big").await;
        eprintln!(
            "A: GET after ack -> {:?}",
            got.as_ref().map(|v| v.len()).map_err(|e| e.to_string())
        );
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(cfg(&path)).await.unwrap();
        eprintln!(
            "A: after reopen head = {:?}",
            store.head("b", "big").map(|i| i.size_bytes)
        );
        assert!(
            got.is_ok() && store.head("b", "big").is_some(),
            "acknowledged PUT lost"
        );
    });
}

// B: a torn record dropped at recovery 1 is accepted at recovery 2 (segment
// now sealed, no payload check) and beats a DELETE that reused its seq.
#[test]
fn resealing_never_turns_a_torn_record_into_a_valid_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let (store, _) = Store::open(cfg(&p)).await.unwrap();
        store.put("b", "x", meta(), data(1, 3000)).await.unwrap();
        store
            .put("b", "x", meta(), Bytes::from(vec![0xABu8; 3000]))
            .await
            .unwrap(); // stands for the in-flight, torn batch
        drop(store); // crash: unsealed
    });
    let seg = seg_files(&path).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let needle = &[0xABu8; 64][..];
    let pos = bytes.windows(64).position(|w| w == needle).unwrap();
    bytes[pos] ^= 0x40;
    std::fs::write(&seg, &bytes).unwrap();
    let p = path.clone();
    run(move || async move {
        let (store, rep) = Store::open(cfg(&p)).await.unwrap();
        eprintln!(
            "B: reopen1 corrupt={} x={:?} idx={:?}",
            rep.corrupt_records,
            store.head("b", "x").map(|i| i.size_bytes),
            debug_index(&store)
        );
        assert!(store.delete("b", "x").await.unwrap());
        eprintln!("B: after delete idx={:?}", debug_index(&store));
        store.shutdown().await;
    });
    run(move || async move {
        let (store, rep) = Store::open(cfg(&path)).await.unwrap();
        let r = read_all(&store, "b", "x").await;
        eprintln!(
            "B: reopen2 corrupt={} idx={:?} read={:?}",
            rep.corrupt_records,
            debug_index(&store),
            r.as_ref().map(|v| v.len()).map_err(|e| e.to_string())
        );
        assert!(store.head("b", "x").is_none(), "deleted object came back");
    });
}

// C: compaction aborting on a corrupt record leaves an orphan tombstone copy;
// compacting the orphan's segment undercounts older_on_disk; the tombstone is
// then dropped while the old version is still on disk.
#[test]
fn a_compaction_aborted_by_a_corrupt_record_does_not_bring_a_deleted_object_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let (store, _) = Store::open(cfg(&p)).await.unwrap();
        store.put("b", "k", meta(), data(1, 1000)).await.unwrap();
        roll(&store, "a").await;
        let v = active(&store);
        assert!(store.delete("b", "k").await.unwrap());
        store.put("b", "c", meta(), data(9, 15_000)).await.unwrap();
        roll(&store, "b").await;
        // bit rot in c's payload in segment v
        let segp = p.join(format!("seg-{v:016x}.pcs"));
        let mut bytes = std::fs::read(&segp).unwrap();
        let pos = bytes
            .windows(64)
            .position(|w| w == &data(9, 15_000)[5000..5064])
            .unwrap();
        bytes[pos] ^= 1;
        std::fs::write(&segp, &bytes).unwrap();
        eprintln!("C: k before = {:?}", older(&store, "k"));
        let r = store.compact_segment(v).await;
        eprintln!(
            "C: compact v -> {:?}",
            r.as_ref().err().map(|e| e.to_string())
        );
        let w = active(&store);
        // settle: let the orphan copy be written
        glommio::timer::sleep(Duration::from_millis(50)).await;
        roll(&store, "c").await;
        let r = store.compact_segment(w).await;
        eprintln!(
            "C: compact orphan seg {w} -> ok={} k = {:?}",
            r.is_ok(),
            older(&store, "k")
        );
        store.put("b", "c", meta(), data(10, 100)).await.unwrap(); // c in v no longer current
        let r = store.compact_segment(v).await.unwrap();
        eprintln!(
            "C: compact v again: tombstones_dropped={} k={:?}",
            r.tombstones_dropped,
            older(&store, "k")
        );
        store.shutdown().await;
    });
    run(move || async move {
        let (store, _) = Store::open(cfg(&path)).await.unwrap();
        eprintln!(
            "C: after reopen k = {:?}",
            store.head("b", "k").map(|i| i.size_bytes)
        );
        assert!(store.head("b", "k").is_none(), "deleted object came back");
    });
}

// D: a batch whose fdatasync fails is on disk but uncounted; compacting its
// segment undercounts older_on_disk.
#[test]
fn a_batch_whose_fdatasync_failed_does_not_bring_a_deleted_object_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let fail = Rc::new(RefCell::new(false));
        let flag = fail.clone();
        let mut c = cfg(&p);
        c.faults = Some(Rc::new(RefCell::new(
            move |pt: FaultPoint| -> Option<io::Error> {
                (*flag.borrow() && matches!(pt, FaultPoint::Sync { .. }))
                    .then(|| io::Error::from_raw_os_error(libc::EIO))
            },
        )));
        let (store, _) = Store::open(c).await.unwrap();
        store.put("b", "k", meta(), data(1, 1000)).await.unwrap();
        roll(&store, "a").await;
        let v = active(&store);
        *fail.borrow_mut() = true;
        assert!(store.put("b", "k", meta(), data(2, 1000)).await.is_err());
        *fail.borrow_mut() = false;
        assert!(store.delete("b", "k").await.unwrap());
        eprintln!("D: k after delete = {:?}", older(&store, "k"));
        store.compact_segment(v).await.unwrap();
        eprintln!(
            "D: after compacting abandoned seg k = {:?}",
            older(&store, "k")
        );
        roll(&store, "b").await;
        let segs: Vec<u64> = store.segment_table().iter().map(|s| s.0).collect();
        let act = active(&store);
        for s in segs {
            if s != act && s != 1 {
                let r = store.compact_segment(s).await.unwrap();
                eprintln!("D: compact {s}: dropped {}", r.tombstones_dropped);
            }
        }
        eprintln!("D: k = {:?}", older(&store, "k"));
        store.shutdown().await;
    });
    run(move || async move {
        let (store, _) = Store::open(cfg(&path)).await.unwrap();
        eprintln!(
            "D: after reopen k = {:?}",
            store.head("b", "k").map(|i| i.size_bytes)
        );
        assert!(store.head("b", "k").is_none(), "deleted object came back");
    });
}

// E: shutdown seals at write_offset while a batch is still in flight.
#[test]
fn shutdown_during_an_in_flight_batch_loses_no_acknowledged_object() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let mut c = cfg(&p);
        c.direct_io = true;
        c.segment_bytes_max = 64 << 20;
        c.batch_bytes_max = 8 << 20;
        c.chunk_bytes = 1 << 20;
        let (store, _) = Store::open(c).await.unwrap();
        store.put("b", "warm", meta(), data(0, 100)).await.unwrap();
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let s = store.clone();
                glommio::spawn_local(async move {
                    s.put("b", &format!("k{i}"), meta(), data(i as u8, 200_000))
                        .await
                        .is_ok()
                })
            })
            .collect();
        glommio::timer::sleep(Duration::from_micros(10)).await;
        store.shutdown().await;
        let mut ok = vec![];
        for (i, t) in tasks.into_iter().enumerate() {
            if t.await {
                ok.push(i);
            }
        }
        eprintln!("E: acked {ok:?}");
        std::fs::write(p.join("acked"), format!("{:?}", ok)).unwrap();
        let _ = ok;
    });
    run(move || async move {
        let ok: String = std::fs::read_to_string(path.join("acked")).unwrap();
        let mut c = cfg(&path);
        c.direct_io = true;
        c.segment_bytes_max = 64 << 20;
        c.chunk_bytes = 1 << 20;
        c.batch_bytes_max = 8 << 20;
        let (store, _) = Store::open(c).await.unwrap();
        let mut lost = vec![];
        for i in 0..32 {
            if ok.contains(&format!("{i}")) && store.head("b", &format!("k{i}")).is_none() {
                lost.push(i);
            }
        }
        eprintln!("E: acked={ok} lost after reopen {lost:?}");
        assert!(lost.is_empty());
    });
}

#[test]
fn shutdown_after_every_ack_loses_no_object() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let mut c = cfg(&p);
        c.direct_io = true;
        c.segment_bytes_max = 64 << 20;
        c.batch_bytes_max = 8 << 20;
        c.chunk_bytes = 1 << 20;
        let (store, _) = Store::open(c).await.unwrap();
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let s = store.clone();
                glommio::spawn_local(async move {
                    s.put("b", &format!("k{i}"), meta(), data(i as u8, 200_000))
                        .await
                        .is_ok()
                })
            })
            .collect();
        for t in tasks {
            assert!(t.await);
        }
        store.shutdown().await;
    });
    run(move || async move {
        let mut c = cfg(&path);
        c.direct_io = true;
        c.segment_bytes_max = 64 << 20;
        c.chunk_bytes = 1 << 20;
        c.batch_bytes_max = 8 << 20;
        let (store, _) = Store::open(c).await.unwrap();
        let lost: Vec<_> = (0..32)
            .filter(|i| store.head("b", &format!("k{i}")).is_none())
            .collect();
        eprintln!("E0: lost {lost:?}");
        assert!(lost.is_empty());
    });
}

// G: a DELETE racing compaction makes rewrite_object fail ("extent owner is
// not an object"); copies made in step 1 are orphaned and uncounted.
#[test]
fn a_delete_racing_compaction_does_not_bring_the_object_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let mut c = cfg(&p);
        c.compaction_bytes_per_sec_max = 1 << 20;
        let (store, _) = Store::open(c).await.unwrap();
        store.put("b", "y", meta(), data(1, 1000)).await.unwrap();
        roll(&store, "a").await;
        let v = active(&store);
        assert!(store.delete("b", "y").await.unwrap());
        store.put("b", "x", meta(), data(3, 100_000)).await.unwrap();
        roll(&store, "b").await;
        let s2 = store.clone();
        let job = glommio::spawn_local(async move {
            s2.compact_segment(v)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        glommio::timer::sleep(Duration::from_millis(5)).await;
        assert!(store.delete("b", "x").await.unwrap());
        let r = job.await;
        eprintln!(
            "G: compaction racing a delete -> {r:?}; y = {:?}",
            older(&store, "y")
        );
        roll(&store, "c").await;
        let act = active(&store);
        let segs: Vec<u64> = store
            .segment_table()
            .iter()
            .map(|s| s.0)
            .filter(|s| *s != act && *s != 1 && *s != v)
            .collect();
        // Some of these may already be gone (compacted by the racing job).
        for w in segs {
            let _ = store.compact_segment(w).await;
        }
        eprintln!(
            "G: after compacting other segs: y = {:?}",
            older(&store, "y")
        );
        if let Ok(r) = store.compact_segment(v).await {
            eprintln!(
                "G: recompact v: dropped {} y = {:?}",
                r.tombstones_dropped,
                older(&store, "y")
            );
        }
        store.shutdown().await;
    });
    run(move || async move {
        let (store, _) = Store::open(cfg(&path)).await.unwrap();
        eprintln!(
            "G: after reopen y = {:?}",
            store.head("b", "y").map(|i| i.size_bytes)
        );
        assert!(store.head("b", "y").is_none(), "deleted object came back");
    });
}

// H: X (extents in V) is overwritten by a small inline object while V is
// being compacted; rewrite_object re-encodes the inline record's header and
// appends it with an empty payload.
#[test]
fn an_inline_overwrite_racing_compaction_loses_no_object() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let mut c = cfg(&p);
        c.compaction_bytes_per_sec_max = 1 << 20;
        let (store, _) = Store::open(c).await.unwrap();
        store.put("b", "y", meta(), data(1, 1000)).await.unwrap();
        roll(&store, "a").await;
        let v = active(&store);
        assert!(store.delete("b", "y").await.unwrap()); // something current to copy in step 1
        store.put("b", "x", meta(), data(3, 100_000)).await.unwrap();
        roll(&store, "b").await;
        let s2 = store.clone();
        let job = glommio::spawn_local(async move {
            s2.compact_segment(v)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        glommio::timer::sleep(Duration::from_millis(5)).await;
        store.put("b", "x", meta(), data(4, 15000)).await.unwrap();
        let r = job.await;
        let got = read_all(&store, "b", "x").await;
        eprintln!(
            "H: compaction -> {r:?}; head x = {:?}; GET x -> {:?}",
            store.head("b", "x").map(|i| i.size_bytes),
            got.as_ref()
                .map(|g| (g.len(), g[..] == data(4, 15000)[..]))
                .map_err(|e| e.to_string())
        );
        for i in 0..20 {
            store
                .put("b", &format!("after{i}"), meta(), data(i as u8, 2000))
                .await
                .unwrap();
        }
        store.shutdown().await;
    });
    run(move || async move {
        let (store, rep) = Store::open(cfg(&path)).await.unwrap();
        let lost: Vec<_> = (0..20)
            .filter(|i| store.head("b", &format!("after{i}")).is_none())
            .collect();
        let got = read_all(&store, "b", "x").await;
        eprintln!(
            "H: reopen {rep:?}\nH: acked 'after*' lost: {lost:?}; GET x -> {:?}",
            got.as_ref()
                .map(|g| (g.len(), g[..] == data(4, 15000)[..]))
                .map_err(|e| e.to_string())
        );
        assert!(lost.is_empty());
    });
}

// C: compaction aborting on a corrupt record leaves an orphan tombstone copy;
// compacting the orphan's segment undercounts older_on_disk; the tombstone is
// then dropped while the old version is still on disk.
#[test]
fn a_compaction_of_a_big_segment_aborted_by_a_corrupt_record_does_not_bring_a_deleted_object_back()
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    run(move || async move {
        let (store, _) = Store::open(cfg(&p)).await.unwrap();
        store.put("b", "k", meta(), data(1, 1000)).await.unwrap();
        roll(&store, "a").await;
        let v = active(&store);
        assert!(store.delete("b", "k").await.unwrap());
        for i in 0..6 {
            store
                .put("b", &format!("live{i}"), meta(), data(50 + i, 15_000))
                .await
                .unwrap();
        }
        store.put("b", "c", meta(), data(9, 15_000)).await.unwrap();
        roll(&store, "b").await;
        // bit rot in c's payload in segment v
        let segp = p.join(format!("seg-{v:016x}.pcs"));
        let mut bytes = std::fs::read(&segp).unwrap();
        let pos = bytes
            .windows(64)
            .position(|w| w == &data(9, 15_000)[5000..5064])
            .unwrap();
        bytes[pos] ^= 1;
        std::fs::write(&segp, &bytes).unwrap();
        eprintln!("C2: k before = {:?}", older(&store, "k"));
        let r = store.compact_segment(v).await;
        eprintln!(
            "C2: compact v -> {:?}",
            r.as_ref().err().map(|e| e.to_string())
        );
        let w = active(&store);
        // settle: let the orphan copy be written
        glommio::timer::sleep(Duration::from_millis(50)).await;
        roll(&store, "c").await;
        let r = store.compact_segment(w).await;
        eprintln!(
            "C2: compact orphan seg {w} -> ok={} k = {:?}",
            r.is_ok(),
            older(&store, "k")
        );
        store.put("b", "c", meta(), data(10, 100)).await.unwrap(); // c in v no longer current
        let r = store.compact_segment(v).await.unwrap();
        eprintln!(
            "C2: compact v again: tombstones_dropped={} k={:?}",
            r.tombstones_dropped,
            older(&store, "k")
        );
        store.shutdown().await;
    });
    run(move || async move {
        let (store, _) = Store::open(cfg(&path)).await.unwrap();
        eprintln!(
            "C2: after reopen k = {:?}",
            store.head("b", "k").map(|i| i.size_bytes)
        );
        assert!(store.head("b", "k").is_none(), "deleted object came back");
    });
}

// I: a multipart completion racing the compaction of the segment V that
// holds its part's extents (found by the power-loss test, seed 291). The
// plan moves the part and an older version of the key, both listing
// extents in V; meanwhile the completion installs a new version of the key
// listing the part's extents in V (and unpins V). Rewriting the older
// version does not move the new one: V must stay, or the completed object
// points into a deleted file.
#[test]
fn a_multipart_completion_racing_compaction_keeps_its_extents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let p = path.clone();
    let part = data(5, 40_000);
    let want = part.clone();
    run(move || async move {
        let mut c = cfg(&p);
        c.compaction_bytes_per_sec_max = 1 << 20;
        let (store, _) = Store::open(c).await.unwrap();
        store
            .put("b", "first", meta(), data(1, 1000))
            .await
            .unwrap();
        roll(&store, "a").await;
        let v = active(&store);
        // An older version of k with extents in V: the plan moves k too.
        store.put("b", "k", meta(), data(2, 40_000)).await.unwrap();
        let id = store.mpu_create("b", "k", meta()).await.unwrap();
        let etag = "0123456789abcdef0123456789abcdef".to_string();
        let mut w = store.put_part_stream("b", "k", &id, 1).unwrap();
        w.write(part.clone()).await.unwrap();
        w.set_etag(etag.clone());
        w.finish().await.unwrap();
        assert_eq!(active(&store), v, "the part's extents are in V");
        roll(&store, "b").await;
        let s2 = store.clone();
        let job = glommio::spawn_local(async move {
            s2.compact_segment(v)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        // The compaction has planned and is copying (throttled).
        glommio::timer::sleep(Duration::from_millis(5)).await;
        store
            .mpu_complete("b", "k", &id, &[(1, etag)])
            .await
            .unwrap();
        let r = job.await;
        eprintln!("I: compaction racing a completion -> {r:?}");
        assert_eq!(read_all(&store, "b", "k").await.unwrap(), part);
        // And again once V is compacted for good.
        let _ = store.compact_segment(v).await;
        assert_eq!(read_all(&store, "b", "k").await.unwrap(), part);
        store.shutdown().await;
    });
    run(move || async move {
        let (store, _) = Store::open(cfg(&path)).await.unwrap();
        assert_eq!(read_all(&store, "b", "k").await.unwrap(), want);
    });
}
