//! Data written by record format version 1 (percore before the v2 record
//! format) stays readable: `tests/fixtures/v1-shard` is a shard directory
//! written by the v1 engine (commit 8d25a67) with `make_v1_fixture` below;
//! `v1-manifest.json` beside it says what it must hold.
//!
//! Regenerate only with a v1 build:
//! `PERCORE_MAKE_V1_FIXTURE=1 cargo test --release --test v1_format make_v1_fixture -- --ignored`

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use percore_server::store::record::ObjectMeta;
use percore_server::store::Store;
use sha2::{Digest, Sha256};

mod common;
use common::{read_all, run, small_config};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-shard")
}

fn data(seed: u64, len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    Bytes::from(v)
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn meta(etag: &str) -> ObjectMeta {
    ObjectMeta {
        etag: etag.into(),
        content_type: "application/x-fixture".into(),
        headers: vec![("x-amz-meta-origin".into(), "v1".into())],
        ..Default::default()
    }
}

#[test]
#[ignore]
fn make_v1_fixture() {
    if std::env::var("PERCORE_MAKE_V1_FIXTURE").is_err() {
        return;
    }
    let dir = fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.clone();
    run(move || async move {
        let mut cfg = small_config(&path);
        cfg.direct_io = true;
        let (store, _) = Store::open(cfg).await.unwrap();
        let mut expect: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        assert!(store.bucket_create("fixture").await.unwrap());
        assert!(store.bucket_create("gone").await.unwrap());
        assert!(store.bucket_delete("gone").await.unwrap());
        // Inline objects, objects in extents (chunk 16 KiB), overwrites, deletes.
        let sizes = [
            0usize,
            1,
            100,
            4000,
            16 * 1024,
            16 * 1024 + 1,
            50_000,
            70_000,
        ];
        for (i, len) in sizes.iter().enumerate() {
            let key = format!("obj/{i:02}");
            let body = data(i as u64, *len);
            let etag = format!("{:032x}", i);
            let info = store
                .put("fixture", &key, meta(&etag), body.clone())
                .await
                .unwrap();
            expect.insert(
                key,
                serde_json::json!({"sha256": sha(&body), "size": len, "etag": info.etag.to_string()}),
            );
        }
        for i in 0..6u64 {
            let key = format!("over/{i}");
            for v in 0..3u64 {
                let body = data(100 + i * 10 + v, (20_000 * v as usize) + 10);
                let info = store
                    .put("fixture", &key, meta(&format!("{:032x}", v)), body.clone())
                    .await
                    .unwrap();
                expect.insert(
                    key.clone(),
                    serde_json::json!({"sha256": sha(&body), "size": body.len(), "etag": info.etag.to_string()}),
                );
            }
        }
        for i in 0..4u64 {
            let key = format!("del/{i}");
            store
                .put("fixture", &key, meta("d"), data(200 + i, 30_000))
                .await
                .unwrap();
            assert!(store.delete("fixture", &key).await.unwrap());
            expect.insert(key, serde_json::Value::Null);
        }
        // A completed one-part multipart upload and one left open.
        let id = store
            .mpu_create("fixture", "mpu/done", meta(""))
            .await
            .unwrap();
        let part = data(300, 40_000);
        let mut w = store
            .put_part_stream("fixture", "mpu/done", &id, 1)
            .unwrap();
        w.set_etag(format!("{:032x}", 77));
        w.write(part.clone()).await.unwrap();
        let pinfo = w.finish().await.unwrap();
        let info = store
            .mpu_complete("fixture", "mpu/done", &id, &[(1, pinfo.etag.to_string())])
            .await
            .unwrap();
        expect.insert(
            "mpu/done".into(),
            serde_json::json!({"sha256": sha(&part), "size": part.len(), "etag": info.etag.to_string()}),
        );
        let open_id = store
            .mpu_create("fixture", "mpu/open", meta(""))
            .await
            .unwrap();
        let mut w = store
            .put_part_stream("fixture", "mpu/open", &open_id, 1)
            .unwrap();
        w.set_etag(format!("{:032x}", 78));
        w.write(data(301, 20_000)).await.unwrap();
        w.finish().await.unwrap();
        store.shutdown().await;
        let manifest = serde_json::json!({
            "objects": expect,
            "buckets": ["fixture"],
            "open_uploads": [["mpu/open", open_id]],
        });
        std::fs::write(
            path.parent().unwrap().join("v1-manifest.json"),
            serde_json::to_string_pretty(&manifest).unwrap(),
        )
        .unwrap();
    });
}

fn copy_fixture(to: &Path) {
    for e in std::fs::read_dir(fixture_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn manifest() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture_dir().parent().unwrap().join("v1-manifest.json"))
        .expect("fixture manifest");
    serde_json::from_str(&text).unwrap()
}

async fn check_fixture(store: &Store) {
    let m = manifest();
    let objects = m["objects"].as_object().unwrap();
    assert!(objects.len() >= 15);
    for (key, want) in objects {
        if want.is_null() {
            assert!(store.head("fixture", key).is_none(), "{key} was deleted");
            continue;
        }
        let got = read_all(store, "fixture", key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(got.len() as u64, want["size"].as_u64().unwrap(), "{key}");
        assert_eq!(sha(&got), want["sha256"].as_str().unwrap(), "{key}");
        let info = store.head("fixture", key).unwrap();
        assert_eq!(&*info.etag, want["etag"].as_str().unwrap(), "{key}");
    }
    let live: Vec<String> = store
        .list("fixture", "", "", None, usize::MAX)
        .into_iter()
        .map(|i| i.name().to_string())
        .collect();
    let expected: Vec<String> = objects
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(live, expected);
    let buckets: Vec<String> = store.bucket_records().into_iter().map(|(n, _)| n).collect();
    assert_eq!(buckets, vec!["fixture".to_string()]);
    let open = &m["open_uploads"][0];
    let (key, id) = (open[0].as_str().unwrap(), open[1].as_str().unwrap());
    let parts = store.mpu_parts("fixture", key, id, 0, 10).unwrap();
    assert_eq!(parts.len(), 1, "the open upload keeps its part");
}

/// A version-1 shard directory opens and serves everything it held.
#[test]
fn v1_directory_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture(dir.path());
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, report) = Store::open(small_config(&path)).await.unwrap();
        assert_eq!(report.corrupt_records, 0);
        check_fixture(&store).await;
        store.shutdown().await;
        // And again after a restart.
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        check_fixture(&store).await;
        store.shutdown().await;
    });
}
