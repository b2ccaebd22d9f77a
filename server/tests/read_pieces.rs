//! `ObjectReader::read_many` (the ranges of a native Get, read together:
//! sorted by place, adjacent ones merged into one device read) and the CRC
//! blocks it checks: 4 KiB in records written now, 64 KiB in records of
//! data format 2 (`tests/fixtures/v2-shard`, written by percore a1ae93d
//! with `tests/fixtures/make-v2-fixture.sh`; `v2-manifest.json` says what
//! it holds).
//!
//! Every piece is compared with the bytes written; a flipped byte on disk
//! fails exactly the pieces whose blocks hold it, also inside a merged read.

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use std::path::{Path, PathBuf};

use bytes::Bytes;
use percore_server::ring::{BufferPool, DataRing, RingConfig};
use percore_server::store::record::ObjectMeta;
use percore_server::store::{ReadOut, Store, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};
use sha2::{Digest, Sha256};

mod common;
use common::{read_all, run, seeded_bytes, segment_files, small_config};

fn bytes_of(out: &ReadOut) -> &[u8] {
    match out {
        ReadOut::Fixed(buf, start, end) => &buf.as_slice()[*start..*end],
        ReadOut::Mem(p) => p,
    }
}

/// Reads `wants` with `read_many` and checks each piece against `whole`:
/// the bytes at its offset, cut at most at the end of its part (never
/// longer than asked, never empty inside the object).
async fn check_many(
    store: &Store,
    key: &str,
    whole: &[u8],
    ring: Option<&DataRing>,
    wants: &[(u64, u64)],
) {
    let mut r = store.open_read("b", key).await.unwrap();
    let got = r.read_many(ring, wants).await;
    assert_eq!(got.len(), wants.len());
    for (&(offset, len), out) in wants.iter().zip(got) {
        let out = out.unwrap_or_else(|e| panic!("{key} [{offset}, +{len}): {e}"));
        let b = bytes_of(&out);
        let end = (offset + len).min(whole.len() as u64);
        if offset >= whole.len() as u64 {
            assert!(b.is_empty());
            continue;
        }
        assert!(
            !b.is_empty() && b.len() as u64 <= end - offset,
            "{key} at {offset}"
        );
        let o = offset as usize;
        assert!(
            b == &whole[o..o + b.len()],
            "{key}: wrong bytes for [{offset}, +{len})"
        );
    }
}

/// Random range sets: 4 KiB samples (aligned and not), runs of adjacent
/// ranges (merged on disk), overlaps, duplicates, ranges across extent
/// boundaries and past the end.
fn random_wants(rng: &mut StdRng, size: u64) -> Vec<(u64, u64)> {
    let n = rng.gen_range(1..=24);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let offset = rng.gen_range(0..size.max(1) + 10);
        let len = match rng.gen_range(0..4) {
            0 => 4096,
            1 => rng.gen_range(1..70_000),
            2 => 1,
            _ => size,
        };
        v.push((offset, len));
        if rng.gen_bool(0.4) {
            // The next range, adjacent.
            v.push((offset + len, rng.gen_range(1..20_000)));
        }
        if rng.gen_bool(0.1) {
            v.push((offset, len));
        }
    }
    v
}

fn ring() -> std::rc::Rc<DataRing> {
    let pool = BufferPool::new((1 << 20) + 4096, 4).unwrap();
    DataRing::new(RingConfig::default(), Some(pool)).unwrap()
}

/// read_many returns, for any set of ranges, exactly the bytes written:
/// inline objects small and large, objects in many extents, with and
/// without a registered-buffer ring, from the device and from the object
/// cache.
#[test]
fn read_many_serves_exactly_the_bytes_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = small_config(&path);
        cfg.chunk_bytes = 96 * 1024;
        cfg.segment_bytes_max = 4 << 20;
        let (store, _) = Store::open(cfg).await.unwrap();
        store.bucket_create("b").await.unwrap();
        let sizes = [0usize, 1, 4095, 4096, 4097, 70_000, 300_000, 1_000_000];
        let mut objects = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let body = seeded_bytes(i as u64, n);
            let key = format!("k{i}");
            store
                .put("b", &key, ObjectMeta::default(), body.clone())
                .await
                .unwrap();
            objects.push((key, body));
        }
        let ring = ring();
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..60 {
            for (key, body) in &objects {
                let wants = random_wants(&mut rng, body.len() as u64);
                let r = (round % 2 == 0).then_some(&*ring);
                check_many(&store, key, body, r, &wants).await;
            }
        }
        assert_eq!(store.stats().corrupt_reads, 0);
        // Pieces of 64 KiB and more went by READ_FIXED (the store's files
        // are O_DIRECT here), and every registered buffer came back.
        assert!(
            ring.stats().reads_fixed > 0,
            "no piece took the registered path"
        );
        assert_eq!(ring.pool().unwrap().free_count(), 4);
        store.shutdown().await;
    });
}

/// A byte flipped on disk fails the pieces whose 4 KiB block holds it,
/// and only those, also when they were read in one merged device read
/// with good pieces.
#[test]
fn a_flipped_byte_fails_only_the_pieces_over_its_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = small_config(&path);
        cfg.chunk_bytes = 1 << 20;
        cfg.segment_bytes_max = 4 << 20;
        cfg.object_cache_bytes_max = 0;
        cfg.direct_io = false;
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        store.bucket_create("b").await.unwrap();
        let body = seeded_bytes(99, 512 * 1024);
        store
            .put("b", "obj", ObjectMeta::default(), body.clone())
            .await
            .unwrap();
        store.shutdown().await;
        drop(store);
        // Flip one payload byte: object byte 100_000, in 4 KiB block 24
        // ([98_304, 102_400)).
        let seg = segment_files(&path)
            .into_iter()
            .find(|p| {
                let data = std::fs::read(p).unwrap();
                data.windows(64).any(|w| w == &body[100_000..100_064])
            })
            .expect("the object's segment");
        let mut data = std::fs::read(&seg).unwrap();
        let at = data
            .windows(64)
            .position(|w| w == &body[100_000..100_064])
            .unwrap();
        data[at] ^= 0x40;
        std::fs::write(&seg, &data).unwrap();
        let (store, _) = Store::open(cfg).await.unwrap();
        let mut r = store.open_read("b", "obj").await.unwrap();
        // Adjacent 4 KiB ranges from 90_112 to 110_592: one merged read.
        let wants: Vec<(u64, u64)> = (0..5).map(|i| (90_112 + i * 4096, 4096)).collect();
        let device_reads = |s: &Store| s.device_latency().1.counts.iter().sum::<u64>();
        let reads_before = device_reads(&store);
        let got = r.read_many(None, &wants).await;
        assert_eq!(
            device_reads(&store) - reads_before,
            1,
            "five adjacent ranges take one merged device read"
        );
        for (&(offset, len), out) in wants.iter().zip(got) {
            let bad = offset <= 100_000 && 100_000 < offset + len;
            match out {
                Err(StoreError::Corrupt { .. }) => assert!(bad, "good piece at {offset} failed"),
                Ok(out) => {
                    assert!(!bad, "the piece over the flipped byte was served");
                    let o = offset as usize;
                    assert_eq!(bytes_of(&out), &body[o..o + len as usize]);
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        // Far from the flipped byte, the object still reads.
        check_many(
            &store,
            "obj",
            &body,
            None,
            &[(0, 90_000), (110_592, 100_000)],
        )
        .await;
        assert!(store.stats().corrupt_reads >= 1);
        store.shutdown().await;
    });
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v2-shard")
}

fn manifest() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture_dir().parent().unwrap().join("v2-manifest.json"))
        .expect("fixture manifest");
    serde_json::from_str(&text).unwrap()
}

/// Checks every object of the fixture whole (SHA-256, ETag), then random
/// ranges of each (64 KiB CRC blocks: a 4 KiB range reads its block).
async fn check_fixture(store: &Store, rng: &mut StdRng) {
    let m = manifest();
    let objects = m["objects"].as_object().unwrap();
    assert_eq!(objects.len(), 6);
    for (key, want) in objects {
        let whole = read_all(store, "fixture", key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(whole.len() as u64, want["size"].as_u64().unwrap(), "{key}");
        assert_eq!(
            hex::encode(Sha256::digest(&whole)),
            want["sha256"].as_str().unwrap(),
            "{key}"
        );
        let info = store.head("fixture", key).unwrap();
        assert_eq!(&*info.etag, want["etag"].as_str().unwrap(), "{key}");
        for _ in 0..8 {
            let wants = random_wants(rng, whole.len() as u64);
            let mut r = store.open_read("fixture", key).await.unwrap();
            for (&(offset, len), out) in wants.iter().zip(r.read_many(None, &wants).await) {
                let out = out.unwrap();
                let b = bytes_of(&out);
                let o = (offset as usize).min(whole.len());
                let left = (whole.len() - o) as u64;
                assert_eq!(b.is_empty(), left == 0, "{key} at {offset}+{len}");
                assert!(b.len() as u64 <= len.min(left), "{key} at {offset}+{len}");
                assert!(b == &whole[o..o + b.len()], "{key} at {offset}+{len}");
            }
        }
    }
}

/// A data-format-2 shard directory (64 KiB CRC blocks) opens and serves
/// every byte, whole and in ranges; compaction copies its records (they
/// keep their blocks), new writes next to them use 4 KiB blocks, and all
/// of it reads again after a restart.
#[test]
fn format_2_records_stay_readable() {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = small_config(&path);
        cfg.segment_bytes_max = 4 << 20;
        cfg.chunk_bytes = 1 << 20;
        let mut rng = StdRng::seed_from_u64(2);
        let (store, report) = Store::open(cfg.clone()).await.unwrap();
        assert_eq!(report.corrupt_records, 0);
        check_fixture(&store, &mut rng).await;
        let fresh = Bytes::from(seeded_bytes(5, 200_000).to_vec());
        store
            .put("fixture", "fresh", ObjectMeta::default(), fresh.clone())
            .await
            .unwrap();
        store.delete("fixture", "fresh").await.unwrap();
        store
            .put("fixture", "fresh", ObjectMeta::default(), fresh.clone())
            .await
            .unwrap();
        // The fixture's segment (sealed by the old percore's shutdown) is
        // copied record by record: each checked with its own 64 KiB blocks.
        let report = store
            .compact_segment(1)
            .await
            .expect("the format-2 segment compacts");
        assert!(
            report.records_relocated >= 6 && report.bytes_copied > 2_600_000,
            "{report:?}"
        );
        check_fixture(&store, &mut rng).await;
        assert_eq!(read_all(&store, "fixture", "fresh").await.unwrap(), fresh);
        assert_eq!(store.stats().corrupt_reads, 0);
        store.shutdown().await;
        drop(store);
        let (store, report) = Store::open(cfg).await.unwrap();
        assert_eq!(report.corrupt_records, 0);
        check_fixture(&store, &mut rng).await;
        assert_eq!(read_all(&store, "fixture", "fresh").await.unwrap(), fresh);
        assert_eq!(store.stats().corrupt_reads, 0);
        store.shutdown().await;
    });
}
