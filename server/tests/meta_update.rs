//! Rewriting an object's metadata without its bytes (tags), version-checked
//! deletes (lifecycle) and bucket configuration documents, on real files:
//! a seeded model test with compaction and reopen, so that a record that
//! lists another record's extents is proven to keep them alive.

use std::collections::BTreeMap;

use bytes::Bytes;
use percore_server::store::record::ObjectMeta;
use percore_server::store::versions::Versioning;
use percore_server::store::{Store, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{read_all, run, small_config};

const TAGS: &str = "x-amz-tagging";

#[derive(Debug, Clone)]
struct Version {
    data: Bytes,
    etag: String,
    mtime_ms: u64,
    tags: Option<String>,
}

async fn check(store: &Store, model: &BTreeMap<String, Version>) {
    for (key, v) in model {
        let got = read_all(store, "b", key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(got == v.data[..], "{key}: bytes differ");
        let r = store.open_read("b", key).await.unwrap();
        assert_eq!(r.meta.etag, v.etag, "{key}");
        assert_eq!(r.meta.mtime_ms, v.mtime_ms, "{key}: mtime moved");
        let tags = r
            .meta
            .headers
            .iter()
            .find(|(n, _)| n == TAGS)
            .map(|(_, v)| v.clone());
        assert_eq!(tags, v.tags, "{key}: tags");
        assert_eq!(
            r.meta
                .headers
                .iter()
                .filter(|(n, _)| n == "x-amz-meta-kept")
                .count(),
            1
        );
    }
    let listed = store.list("b", "", "", None, usize::MAX).len();
    assert_eq!(listed, model.len());
}

#[test]
fn tag_rewrites_keep_bytes_through_compaction_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut rng = StdRng::seed_from_u64(20);
        let (mut store, _) = Store::open(small_config(&path)).await.unwrap();
        let mut model: BTreeMap<String, Version> = BTreeMap::new();
        let mut relocated = 0;
        for step in 0..400u64 {
            let key = format!("k{}", rng.gen_range(0..12));
            match rng.gen_range(0..10) {
                0..=2 => {
                    // Inline (< 16 KiB chunk) or in extents.
                    let len = if rng.gen_bool(0.5) {
                        rng.gen_range(0..4000)
                    } else {
                        rng.gen_range(20_000..90_000)
                    };
                    let data = common::seeded_bytes(step, len);
                    let tags = rng.gen_bool(0.5).then(|| format!("s={step}"));
                    let mut headers = vec![("x-amz-meta-kept".to_string(), "1".to_string())];
                    if let Some(t) = &tags {
                        headers.push((TAGS.to_string(), t.clone()));
                    }
                    let meta = ObjectMeta {
                        etag: format!("e{step}"),
                        headers,
                        ..Default::default()
                    };
                    let info = store.put("b", &key, meta, data.clone()).await.unwrap();
                    model.insert(
                        key,
                        Version {
                            data,
                            etag: format!("e{step}"),
                            mtime_ms: info.mtime_ms,
                            tags,
                        },
                    );
                }
                3..=5 => {
                    let tags = rng.gen_bool(0.7).then(|| format!("t={step}"));
                    let r = store.set_object_header("b", &key, TAGS, tags.clone()).await;
                    match model.get_mut(&key) {
                        Some(v) => {
                            r.unwrap();
                            v.tags = tags;
                        }
                        None => assert!(matches!(r, Err(StoreError::NotFound)), "{r:?}"),
                    }
                }
                6 => {
                    let existed = store.delete("b", &key).await.unwrap();
                    assert_eq!(existed, model.remove(&key).is_some());
                }
                7 => {
                    // A stale version is never deleted; the current one is.
                    let seq = store.live_seq("b", &key);
                    assert_eq!(seq.is_some(), model.contains_key(&key));
                    if let Some(seq) = seq {
                        assert!(store
                            .delete_if_current("b", &key, seq - 1, Versioning::Off)
                            .await
                            .unwrap()
                            .is_none());
                        if rng.gen_bool(0.3) {
                            assert!(store
                                .delete_if_current("b", &key, seq, Versioning::Off)
                                .await
                                .unwrap()
                                .is_some());
                            model.remove(&key);
                        }
                    }
                }
                8 => {
                    while let Some(r) = store.compact_once().await.unwrap() {
                        relocated += r.records_relocated;
                    }
                }
                _ => {
                    if rng.gen_bool(0.3) {
                        store.shutdown().await;
                        drop(store);
                        store = Store::open(small_config(&path)).await.unwrap().0;
                    }
                }
            }
            if step % 25 == 0 {
                check(&store, &model).await;
            }
        }
        check(&store, &model).await;
        assert!(
            relocated > 0,
            "compaction never moved a record: the test proves nothing"
        );
        while store.compact_once().await.unwrap().is_some() {}
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        check(&store, &model).await;
    });
}

#[test]
fn bucket_configuration_documents_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let s1 = store
            .bucket_config_set("photos", 11, "cors", Some(Bytes::from_static(b"<a/>")))
            .await
            .unwrap();
        let s2 = store
            .bucket_config_set("photos", 11, "cors", Some(Bytes::from_static(b"<b/>")))
            .await
            .unwrap();
        assert!(s2 > s1);
        store
            .bucket_config_set("photos", 11, "tagging", Some(Bytes::from_static(b"<t/>")))
            .await
            .unwrap();
        store
            .bucket_config_set("other", 5, "lifecycle", Some(Bytes::from_static(b"<l/>")))
            .await
            .unwrap();
        store
            .bucket_config_set("other", 5, "lifecycle", None)
            .await
            .unwrap();
        // Documents are not objects.
        assert_eq!(store.objects_total(), 0);
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let mut docs: Vec<(String, String, u64, Vec<u8>)> = store
            .bucket_configs()
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.bucket, d.kind, d.bucket_created_ms, d.doc.to_vec()))
            .collect();
        docs.sort();
        assert_eq!(
            docs,
            vec![
                ("photos".into(), "cors".into(), 11, b"<b/>".to_vec()),
                ("photos".into(), "tagging".into(), 11, b"<t/>".to_vec()),
            ]
        );
        assert_eq!(store.bucket_configs_drop("photos", 12).await.unwrap(), 0);
        assert_eq!(store.bucket_configs_drop("photos", 11).await.unwrap(), 2);
        assert!(store.bucket_configs().await.unwrap().is_empty());
    });
}
