//! Damage on disk costs only the damaged record, and nothing a user wrote
//! is ever taken for a record (issue 15 items 2 and 6):
//! - one flipped byte in one record header of a sealed segment;
//! - damaged headers in several sealed segments, then compaction (which
//!   must never delete a segment it could not read to its end);
//! - a batch torn at a crash whose later bytes landed, over a payload full
//!   of planted headers (version 1 CRCs and version 2 ones bound with a
//!   guessed secret): none is accepted, and sequence numbers stay sane;
//! - a record with the largest sequence number makes writes fail loudly
//!   instead of wrapping to 0 and installing as stale;
//! - version-1 segments are rewritten to version 2 by compaction.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use percore_server::store::record::{self, Body, Header, ObjectMeta, SegKey};
use percore_server::store::{Store, StoreConfig};

mod common;
use common::{pattern, read_all, run};

fn config(dir: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(0, dir.to_path_buf());
    cfg.segment_bytes_max = 4 << 20;
    cfg.chunk_bytes = 1 << 20;
    cfg.batch_bytes_max = 1 << 20;
    cfg.compaction_interval_ms = 0;
    cfg.compaction_garbage_ratio_min = 0.3;
    cfg.compaction_bytes_per_sec_max = 0;
    cfg
}

/// About a dozen segments for the 400 objects.
fn small_segments(dir: &Path) -> StoreConfig {
    let mut cfg = config(dir);
    cfg.segment_bytes_max = 1 << 20;
    cfg.batch_bytes_max = 256 << 10;
    cfg
}

fn body(i: u64, len: usize) -> Bytes {
    Bytes::from(pattern(i, len))
}

use common::segment_files as segments;

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Flips one byte of the record header of `key` (bucket "b"), wherever it
/// is. Returns the segment file it was in.
fn damage_header_of(dir: &Path, key: &str) -> PathBuf {
    let mut needle = (key.len() as u16).to_le_bytes().to_vec();
    needle.extend_from_slice(key.as_bytes());
    for path in segments(dir) {
        let mut data = std::fs::read(&path).unwrap();
        if let Some(at) = find(&data, &needle) {
            // fixed header (32) + bucket "b" (2 + 1), then the key.
            let header_start = at - 35;
            assert_eq!(
                &data[header_start..header_start + 4],
                &record::MAGIC.to_le_bytes()
            );
            data[header_start + 20] ^= 0x40; // payload length: a lie
            std::fs::write(&path, &data).unwrap();
            return path;
        }
    }
    panic!("no record of {key} found");
}

const OBJECTS: u64 = 400;
const OBJECT_BYTES: usize = 30 * 1024;

async fn fill(store: &Store) {
    for i in 0..OBJECTS {
        store
            .put(
                "b",
                &format!("obj/{i:04}"),
                ObjectMeta::default(),
                body(i, OBJECT_BYTES),
            )
            .await
            .unwrap();
    }
}

async fn check_all(store: &Store, lost: &[String], deleted: &[String]) {
    for i in 0..OBJECTS {
        let key = format!("obj/{i:04}");
        if lost.contains(&key) || deleted.contains(&key) {
            assert!(store.head("b", &key).is_none(), "{key} should be gone");
            continue;
        }
        let got = read_all(store, "b", &key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(got == body(i, OBJECT_BYTES), "{key}: wrong bytes");
    }
}

/// The reported case: 400 objects of 30 KiB in 4 MiB segments, a clean
/// stop, one byte flipped in one object's record header. Version 1 lost
/// the rest of the segment (85 objects); now only that object is gone.
#[test]
fn one_damaged_header_in_a_sealed_segment_loses_only_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(config(&path)).await.unwrap();
        store.bucket_create("b").await.unwrap();
        fill(&store).await;
        store.shutdown().await;
        drop(store);
        let victim = "obj/0050".to_string();
        let seg = damage_header_of(&path, &victim);
        let size_before = std::fs::metadata(&seg).unwrap().len();

        let (store, report) = Store::open(config(&path)).await.unwrap();
        assert_eq!(report.damaged_regions, 1, "{report:?}");
        check_all(&store, std::slice::from_ref(&victim), &[]).await;
        assert_eq!(
            std::fs::metadata(&seg).unwrap().len(),
            size_before,
            "a sealed segment is never cut"
        );
        // The scrubber finds the damage too.
        let scrub = store.scrub_pass().await.unwrap();
        assert!(
            scrub.findings.iter().any(|f| f.what == "damaged bytes"),
            "{:?}",
            scrub.findings
        );
        store.shutdown().await;
        drop(store);
        // And a second restart changes nothing.
        let (store, report) = Store::open(config(&path)).await.unwrap();
        assert_eq!(report.damaged_regions, 1);
        check_all(&store, &[victim], &[]).await;
        store.shutdown().await;
    });
}

/// Damaged headers in several sealed segments, most keys deleted, then
/// compaction until nothing qualifies: no undamaged object is lost, the
/// damaged segments stay on disk, and the rest is compacted.
#[test]
fn compaction_never_deletes_a_damaged_segment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_segments(&path)).await.unwrap();
        store.bucket_create("b").await.unwrap();
        fill(&store).await;
        store.shutdown().await;
        drop(store);
        // One damaged record in each of three different sealed segments.
        let mut lost = Vec::new();
        let mut damaged_files = Vec::new();
        for i in [10u64, 150, 290] {
            let key = format!("obj/{i:04}");
            let seg = damage_header_of(&path, &key);
            assert!(!damaged_files.contains(&seg), "one damage per segment");
            damaged_files.push(seg);
            lost.push(key);
        }
        let (store, report) = Store::open(small_segments(&path)).await.unwrap();
        assert_eq!(report.damaged_regions, 3);
        // Delete two of every three keys: every segment qualifies.
        let mut deleted = Vec::new();
        for i in 0..OBJECTS {
            let key = format!("obj/{i:04}");
            if i % 3 != 0 && !lost.contains(&key) {
                assert!(store.delete("b", &key).await.unwrap());
                deleted.push(key);
            }
        }
        let mut compacted = 0;
        for _ in 0..100 {
            match store.compact_once().await {
                Ok(Some(_)) => compacted += 1,
                Ok(None) => break,
                Err(e) => panic!("compaction picked a segment it could not compact: {e}"),
            }
        }
        assert!(
            compacted >= 5,
            "undamaged segments are compacted ({compacted})"
        );
        // Asked directly, compaction reads the damaged segment, finds the
        // damage and keeps the file.
        for f in &damaged_files {
            let name = f.file_name().unwrap().to_str().unwrap();
            let id = u64::from_str_radix(&name[4..20], 16).unwrap();
            assert!(store.compact_segment(id).await.is_err());
            assert!(f.exists(), "{f:?} was deleted by compaction");
        }
        check_all(&store, &lost, &deleted).await;
        assert_eq!(store.stats().compaction_skipped_damaged, 3);
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_segments(&path)).await.unwrap();
        check_all(&store, &lost, &deleted).await;
        store.shutdown().await;
    });
}

/// A header as a user could plant it: version 1 (CRC over itself), or
/// version 2 bound with a guessed secret at the exact place.
fn planted(version: u8, segment_id: u64, offset: u64) -> Vec<u8> {
    let h = Header {
        seq: u64::MAX,
        bucket: "b".into(),
        key: "victim".into(),
        payload_bytes: 0,
        block_crcs: Vec::new(),
        body: Body::Object {
            meta: ObjectMeta {
                etag: "00000000000000000000000000000000".into(),
                ..Default::default()
            },
            extents: Vec::new(),
        },
    };
    let key = if version == 1 {
        SegKey::v1(segment_id)
    } else {
        SegKey::v2(0, segment_id)
    };
    record::encode_header_at(&h, &key, offset).unwrap()
}

const MARK: &[u8] = b"<<payload-start-marker>>";

/// A batch torn at a crash (its first piece lost, later bytes landed): the
/// scan must not resume inside the payload and accept a planted header.
/// Version 1 jumped to the next 4 KiB boundary, found a planted header
/// there with seq u64::MAX, and every later write on the shard installed
/// below it (seq wrapped to 0).
#[test]
fn headers_planted_in_a_payload_are_never_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = config(&path);
        cfg.direct_io = false;
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        // A probe of the same shape tells where the payload lands relative
        // to its batch's 4 KiB boundary (each awaited PUT is its own batch).
        let mut probe = MARK.to_vec();
        probe.resize(256 * 1024, 7);
        store
            .put("b", "probe/1", ObjectMeta::default(), Bytes::from(probe))
            .await
            .unwrap();
        let seg = segments(&path)[0].clone();
        let data = std::fs::read(&seg).unwrap();
        let p1 = find(&data, MARK).unwrap() as u64;
        let header_len = p1 % 4096;
        // The attack payload: planted headers at every place a scan could
        // land after a hole (every 8 bytes would overlap; every 4 KiB
        // boundary of the file, as version 1 jumped to, plus every 512).
        let mut attack = MARK.to_vec();
        attack.resize(256 * 1024, 0x5a);
        let segment_id = 1;
        let p2_guess = (p1 + 256 * 1024 + 8).next_multiple_of(4096) + header_len;
        let mut q = (512 - header_len % 512) % 512;
        let mut n = 0u64;
        while q as usize + 200 < attack.len() {
            if q >= MARK.len() as u64 {
                // Version 1 where version 1's scan would land (4 KiB
                // boundaries), else both kinds in turn.
                let on_block = (p2_guess + q).is_multiple_of(4096);
                let version = if on_block || n.is_multiple_of(2) {
                    1
                } else {
                    2
                };
                let h = planted(version, segment_id, p2_guess + q);
                attack[q as usize..q as usize + h.len()].copy_from_slice(&h);
                n += 1;
            }
            q += 512;
        }
        store
            .put("b", "probe/2", ObjectMeta::default(), Bytes::from(attack))
            .await
            .unwrap();
        // A crash: no seal. Then the batch's first bytes (the header of
        // probe/2) did not reach the disk.
        drop(store);
        let mut data = std::fs::read(&seg).unwrap();
        let marks: Vec<usize> = data
            .windows(MARK.len())
            .enumerate()
            .filter(|(_, w)| *w == MARK)
            .map(|(i, _)| i)
            .collect();
        let p2 = marks[1] as u64;
        assert_eq!(p2, p2_guess, "the layout is as computed");
        let r2 = (p2 - header_len) as usize;
        assert_eq!(r2 % 4096, 0);
        data[r2..r2 + header_len as usize].fill(0);
        std::fs::write(&seg, &data).unwrap();

        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        assert!(
            store.head("b", "victim").is_none(),
            "a planted header was taken for a record"
        );
        assert!(store.head("b", "probe/2").is_none());
        assert!(store.head("b", "probe/1").is_some());
        // Writes after recovery are ordered after everything before them.
        store
            .put("b", "probe/1", ObjectMeta::default(), body(1, 100))
            .await
            .unwrap();
        store
            .put("b", "after", ObjectMeta::default(), body(2, 100))
            .await
            .unwrap();
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(cfg).await.unwrap();
        assert!(store.head("b", "victim").is_none());
        assert_eq!(
            read_all(&store, "b", "probe/1").await.unwrap(),
            body(1, 100)
        );
        assert_eq!(read_all(&store, "b", "after").await.unwrap(), body(2, 100));
        store.shutdown().await;
    });
}

fn fixture_segment_header() -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/v1-shard/seg-0000000000000001.pcs");
    std::fs::read(p).unwrap()[..4096].to_vec()
}

/// A record with the largest sequence number (a version-1 segment, whose
/// CRCs anyone can compute, could hold one): writes then fail with a
/// clear error instead of wrapping to 0 and installing below it.
#[test]
fn the_largest_sequence_number_stops_writes_instead_of_wrapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let mut seg = fixture_segment_header();
    seg.extend_from_slice(&planted(1, 1, 4096));
    seg.resize(8192, 0);
    let seal = Header {
        seq: 0,
        bucket: String::new(),
        key: String::new(),
        payload_bytes: 0,
        block_crcs: Vec::new(),
        body: Body::Seal,
    };
    seg.extend_from_slice(&record::encode_header_at(&seal, &SegKey::v1(1), 8192).unwrap());
    seg.resize(12288, 0);
    std::fs::write(path.join("seg-0000000000000001.pcs"), &seg).unwrap();
    run(move || async move {
        let (store, _) = Store::open(config(&path)).await.unwrap();
        assert!(store.head("b", "victim").is_some());
        let e = store
            .put("b", "next", ObjectMeta::default(), body(3, 10))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("sequence number"), "{e}");
        assert!(store.head("b", "next").is_none());
        store.shutdown().await;
    });
}

/// Compaction rewrites a version-1 directory's segments to version 2 (even
/// with no garbage) and everything stays readable, before and after a
/// restart.
#[test]
fn compaction_rewrites_version_1_segments() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-shard");
    for e in std::fs::read_dir(&fixture).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let version_of = |p: &Path| std::fs::read(p).unwrap()[4];
    let path = dir.path().to_path_buf();
    assert!(segments(&path).iter().all(|p| version_of(p) == 1));
    run(move || async move {
        let mut cfg = common::small_config(&path);
        cfg.compaction_garbage_ratio_min = 0.99;
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        let keys: Vec<String> = store
            .list("fixture", "", "", None, usize::MAX)
            .into_iter()
            .map(|i| i.name().to_string())
            .collect();
        let mut contents = Vec::new();
        for k in &keys {
            contents.push(read_all(&store, "fixture", k).await.unwrap());
        }
        // A write first, so that the active segment is a version-2 one.
        store
            .put("fixture", "new", ObjectMeta::default(), body(9, 1000))
            .await
            .unwrap();
        for _ in 0..20 {
            if store.compact_once().await.unwrap().is_none() {
                break;
            }
        }
        store.shutdown().await;
        drop(store);
        for p in segments(&path) {
            assert_eq!(version_of(&p), 2, "{p:?} is still version 1");
        }
        let (store, report) = Store::open(cfg).await.unwrap();
        assert_eq!(report.damaged_regions, 0);
        for (k, c) in keys.iter().zip(&contents) {
            assert_eq!(&read_all(&store, "fixture", k).await.unwrap(), c, "{k}");
        }
        assert_eq!(
            read_all(&store, "fixture", "new").await.unwrap(),
            body(9, 1000)
        );
        store.shutdown().await;
    });
}

fn flip(path: &Path, at: usize) {
    let mut data = std::fs::read(path).unwrap();
    data[at] ^= 0x10;
    std::fs::write(path, &data).unwrap();
}

/// A damaged segment header costs no record: the segment is read with the
/// shard's key (from the other segments, or `shard.secret` when it is the
/// only one), and without any key it is left exactly as it is.
#[test]
fn a_damaged_segment_header_costs_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        // Several segments: the first and a middle one lose their header.
        let (store, _) = Store::open(small_segments(&path)).await.unwrap();
        store.bucket_create("b").await.unwrap();
        fill(&store).await;
        store.shutdown().await;
        drop(store);
        let segs = segments(&path);
        assert!(segs.len() >= 6);
        flip(&segs[0], 40);
        flip(&segs[3], 40);
        let (store, report) = Store::open(small_segments(&path)).await.unwrap();
        assert!(report.damaged_regions >= 2, "{report:?}");
        check_all(&store, &[], &[]).await;
        store.shutdown().await;
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        // One segment: its secret comes from shard.secret.
        let mut cfg = config(&path);
        cfg.segment_bytes_max = 64 << 20;
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        store.bucket_create("b").await.unwrap();
        fill(&store).await;
        store.shutdown().await;
        drop(store);
        let seg = segments(&path)[0].clone();
        flip(&seg, 40);
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        check_all(&store, &[], &[]).await;
        store.shutdown().await;
        drop(store);
        // Without any copy of the key nothing verifies: the segment is
        // neither served nor cut, and comes back whole once repaired.
        std::fs::remove_file(path.join("shard.secret")).unwrap();
        let size = std::fs::metadata(&seg).unwrap().len();
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        assert!(store.head("b", "obj/0001").is_none());
        store.shutdown().await;
        drop(store);
        assert_eq!(
            std::fs::metadata(&seg).unwrap().len(),
            size,
            "an unreadable segment was cut"
        );
        flip(&seg, 40);
        std::fs::remove_file(path.join("shard.secret")).unwrap();
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        check_all(&store, &[], &[]).await;
        // The newest segment, unsealed (a crash): a damaged header is not
        // a torn batch, and nothing is cut.
        store
            .put("b", "extra", ObjectMeta::default(), body(7, 100))
            .await
            .unwrap();
        drop(store);
        let newest = segments(&path).last().unwrap().clone();
        flip(&newest, 40);
        let (store, _) = Store::open(cfg).await.unwrap();
        check_all(&store, &[], &[]).await;
        assert_eq!(read_all(&store, "b", "extra").await.unwrap(), body(7, 100));
        store.shutdown().await;
    });
}

/// Version-1 segments are never cut: damage in the newest one (as the
/// first start after an upgrade finds it) keeps the records after it on
/// disk.
#[test]
fn a_damaged_version_1_segment_is_never_cut() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-shard");
    for e in std::fs::read_dir(&fixture).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let path = dir.path().to_path_buf();
    let newest = segments(&path).last().unwrap().clone();
    let data = std::fs::read(&newest).unwrap();
    // The second record header after the segment's first batch.
    let magic = record::MAGIC.to_le_bytes();
    let second = (4104..data.len() - 4)
        .step_by(8)
        .find(|&i| data[i..i + 4] == magic)
        .unwrap();
    flip(&newest, second + 20);
    let size = data.len() as u64;
    run(move || async move {
        let (store, report) = Store::open(common::small_config(&path)).await.unwrap();
        assert!(report.damaged_regions >= 1);
        store.shutdown().await;
        drop(store);
        assert_eq!(
            std::fs::metadata(&newest).unwrap().len(),
            size,
            "a version-1 segment was cut"
        );
    });
}

/// An unsealed version-1 segment with a hole (a batch torn by a crash of
/// the version-1 engine) followed by a planted header: the scan ends at
/// the whole block of zeros and never reaches it.
#[test]
fn a_version_1_hole_is_the_end_of_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let v1 = SegKey::v1(1);
    let mut seg = fixture_segment_header();
    let obj = Header {
        seq: 5,
        bucket: "b".into(),
        key: "kept".into(),
        payload_bytes: 3,
        block_crcs: record::block_crcs(b"abc"),
        body: Body::Object {
            meta: ObjectMeta {
                size_bytes: 3,
                etag: "900150983cd24fb0d6963f7d28e17f72".into(),
                ..Default::default()
            },
            extents: Vec::new(),
        },
    };
    seg.extend_from_slice(&record::encode_header_at(&obj, &v1, 4096).unwrap());
    seg.extend_from_slice(b"abc");
    seg.resize(8192, 0); // padding, then a whole block lost
    seg.resize(12288, 0);
    seg.extend_from_slice(&planted(1, 1, 12288));
    seg.resize(16384, 0);
    std::fs::write(path.join("seg-0000000000000001.pcs"), &seg).unwrap();
    run(move || async move {
        let (store, _) = Store::open(config(&path)).await.unwrap();
        assert!(
            store.head("b", "victim").is_none(),
            "a planted header was taken for a record"
        );
        assert_eq!(read_all(&store, "b", "kept").await.unwrap(), b"abc");
        store
            .put("b", "after", ObjectMeta::default(), body(4, 10))
            .await
            .unwrap();
        store.shutdown().await;
    });
}

/// A reader opened before compaction moves its object keeps reading the
/// old file it holds, checked with that segment's key (taken with the
/// file): it must not find the segment gone from the table and fail. Found
/// by the soak test as GETs answering 404 while compaction ran.
#[test]
fn a_reader_outlives_the_compaction_of_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(config(&path)).await.unwrap();
        let big = body(11, (2 << 20) + 12345);
        store
            .put("b", "big", ObjectMeta::default(), big.clone())
            .await
            .unwrap();
        store
            .put("b", "small", ObjectMeta::default(), body(12, 3000))
            .await
            .unwrap();
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(config(&path)).await.unwrap();
        let mut big_reader = store.open_read("b", "big").await.unwrap();
        let table = store.segment_table();
        for (id, ..) in table {
            store.compact_segment(id).await.unwrap();
        }
        assert!(store.segment_table().iter().all(|(id, ..)| *id > 1));
        let mut got = Vec::new();
        while (got.len() as u64) < big_reader.size_bytes() {
            let piece = big_reader.read(got.len() as u64, 100_000).await.unwrap();
            got.extend_from_slice(&piece);
        }
        assert!(got == big);
        assert_eq!(
            read_all(&store, "b", "small").await.unwrap(),
            body(12, 3000)
        );
        store.shutdown().await;
    });
}

/// A record torn at a crash whose header landed but whose payload was cut
/// short by the end of the file, in the same 4 KiB block as the record
/// before it: recovery must cut it away (at the exact end of the last whole
/// record) before it seals the segment. A seal written in the next block
/// made the file long enough for the torn header to look whole to the next
/// recovery, which trusts sealed segments: the torn, never acknowledged
/// version then hid the acknowledged one, and its reads failed their CRC.
/// Found by the power-loss test (`power_loss.rs`); this replays it on
/// O_DIRECT files, where the cut leaves an unaligned file length.
#[test]
fn a_record_torn_by_the_end_of_the_file_stays_gone_after_two_restarts() {
    const KEY: &str = "torn-key-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(config(&path)).await.unwrap();
        let acked = body(1, 3000);
        store
            .put("b", KEY, ObjectMeta::default(), acked.clone())
            .await
            .unwrap();
        // One batch: a small record, then the next version of KEY.
        let (pad, next) = futures::join!(
            store.put("b", "pad", ObjectMeta::default(), body(2, 100)),
            store.put("b", KEY, ObjectMeta::default(), body(3, 3000)),
        );
        pad.unwrap();
        next.unwrap();
        drop(store); // a crash: the segment stays unsealed
        let seg = segments(&path).pop().unwrap();
        let data = std::fs::read(&seg).unwrap();
        let mut needle = (KEY.len() as u16).to_le_bytes().to_vec();
        needle.extend_from_slice(KEY.as_bytes());
        let last = data
            .windows(needle.len())
            .rposition(|w| w == needle)
            .expect("the second version's header");
        let header_start = last - 35;
        assert_eq!(
            &data[header_start..header_start + 4],
            &record::MAGIC.to_le_bytes()
        );
        assert_ne!(
            header_start % 4096,
            0,
            "setup: the torn record must share its block with the record before it"
        );
        // The crash left the header and the start of the payload.
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(header_start as u64 + 400).unwrap();
        f.sync_all().unwrap();
        drop(f);
        for restart in 0..2 {
            let (store, _) = Store::open(config(&path)).await.unwrap();
            assert_eq!(
                read_all(&store, "b", KEY)
                    .await
                    .expect("the acknowledged version"),
                acked,
                "restart {restart}"
            );
            store.shutdown().await;
        }
    });
}
