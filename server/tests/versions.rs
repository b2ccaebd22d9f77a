//! S3 versioning in the store (`store::versions`), on real files: a seeded
//! model test of versioned and null writes, delete markers, removal of
//! named versions, tag rewrites of named versions, compaction and reopen.
//! Every few steps each key's versions (listed, newest first), its current
//! version and the bytes of every version are checked against the model.

use std::collections::BTreeMap;

use bytes::Bytes;
use percore_server::store::record::ObjectMeta;
use percore_server::store::versions::{Pick, Versioning};
use percore_server::store::{ListItem, Store, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{run, small_config};

const TAGS: &str = "x-amz-tagging";

/// One version: None for a delete marker.
#[derive(Debug, Clone)]
struct V {
    id: Option<u64>,
    object: Option<(Bytes, Option<String>)>,
}

type Model = BTreeMap<String, Vec<V>>;

fn pick(id: Option<u64>) -> Pick {
    id.map_or(Pick::Null, Pick::Id)
}

async fn read_version(store: &Store, key: &str, p: Pick) -> Result<Vec<u8>, StoreError> {
    let found = store.version_to_read("b", key, p)?;
    common::read_all(store, "b", &found.index_key).await
}

async fn check(store: &Store, model: &Model) {
    for (key, vs) in model {
        let got: Vec<(Option<u64>, bool, bool)> = store
            .versions("b", key)
            .iter()
            .map(|v| (v.version, v.object.is_none(), v.latest))
            .collect();
        let want: Vec<(Option<u64>, bool, bool)> = vs
            .iter()
            .enumerate()
            .map(|(i, v)| (v.id, v.object.is_none(), i == 0))
            .collect();
        assert_eq!(got, want, "{key}: versions");
        match vs.first() {
            Some(V {
                object: Some((data, _)),
                id,
            }) => {
                let r = store.resolve("b", key, Pick::Current).unwrap();
                assert_eq!(r.version, *id, "{key}: current");
                let got = read_version(store, key, Pick::Current).await.unwrap();
                assert!(
                    got == data[..],
                    "{key}: current {id:?} read {} bytes, want {}; versions {:?}",
                    got.len(),
                    data.len(),
                    vs.iter()
                        .map(|v| (v.id, v.object.as_ref().map(|o| o.0.len())))
                        .collect::<Vec<_>>()
                );
            }
            Some(V { object: None, id }) => match read_version(store, key, Pick::Current).await {
                Err(StoreError::DeleteMarker { version, named }) => {
                    assert_eq!((version, named), (*id, false), "{key}");
                }
                other => panic!("{key}: current is a marker, read gave {other:?}"),
            },
            None => assert!(store.resolve("b", key, Pick::Current).is_none()),
        }
        for v in vs {
            let got = read_version(store, key, pick(v.id)).await;
            match &v.object {
                Some((data, tags)) => {
                    let got = got.unwrap();
                    assert!(
                        got == data[..],
                        "{key} {:?}: {} bytes, want {}",
                        v.id,
                        got.len(),
                        data.len()
                    );
                    let found = store.version_to_read("b", key, pick(v.id)).unwrap();
                    let r = store.open_read("b", &found.index_key).await.unwrap();
                    let stored = r.meta.headers.iter().find(|(n, _)| n == TAGS);
                    assert_eq!(stored.map(|(_, t)| t), tags.as_ref(), "{key}: tags");
                }
                None => assert!(
                    matches!(got, Err(StoreError::DeleteMarker { named: true, .. })),
                    "{key}: {got:?}"
                ),
            }
        }
    }
    // Listing: current objects only; versions: every key with versions.
    let live: Vec<&String> = model
        .iter()
        .filter(|(_, vs)| vs.first().is_some_and(|v| v.object.is_some()))
        .map(|(k, _)| k)
        .collect();
    let listed = store.list("b", "", "", None, usize::MAX);
    assert_eq!(listed.iter().map(ListItem::name).collect::<Vec<_>>(), live);
    let with_versions = model.values().filter(|vs| !vs.is_empty()).count();
    let all: usize = model.values().map(Vec::len).sum();
    assert_eq!(store.object_count("b"), all);
    // Small pages, resumed within keys, give the same versions.
    let mut seen = Vec::new();
    let (mut after, mut resume) = (String::new(), None);
    for _ in 0..=all + with_versions {
        let page = store.list_keys("b", "", &after, None, 3, Some(resume));
        let Some(last) = page.last() else { break };
        after = last.name().to_string();
        resume = match last {
            ListItem::Versions {
                versions,
                complete: false,
                ..
            } => versions.last().map(|v| pick(v.version)),
            _ => None,
        };
        for item in &page {
            let ListItem::Versions { key, versions, .. } = item else {
                panic!("{item:?}")
            };
            seen.extend(versions.iter().map(|v| (key.clone(), v.version)));
        }
    }
    let want: Vec<(String, Option<u64>)> = model
        .iter()
        .flat_map(|(k, vs)| vs.iter().map(move |v| (k.clone(), v.id)))
        .collect();
    assert_eq!(seen, want, "paged versions");
}

/// One random operation `op` (0..17) on `key`, applied to the store and
/// to the key's versions in the model.
async fn apply(
    store: &Store,
    rng: &mut StdRng,
    key: &str,
    vs: &mut Vec<V>,
    mode: &mut Versioning,
    op: u32,
    step: u64,
) {
    let mode_now = *mode;
    match op {
        0..=6 => {
            let len = if rng.gen_bool(0.6) {
                rng.gen_range(0..3000)
            } else {
                rng.gen_range(20_000..70_000)
            };
            let data = common::seeded_bytes(step, len);
            let meta = ObjectMeta {
                etag: format!("e{step}"),
                ..Default::default()
            };
            let mut w = store.put_stream("b", key, meta);
            if mode_now == Versioning::Enabled {
                w.set_new_version();
            }
            w.write(data.clone()).await.unwrap();
            let (_, id) = w.finish_version().await.unwrap();
            assert_eq!(id.is_some(), mode_now == Versioning::Enabled);
            if id.is_none() {
                vs.retain(|v| v.id.is_some());
            }
            vs.insert(
                0,
                V {
                    id,
                    object: Some((data, None)),
                },
            );
        }
        7..=9 => {
            let done = store
                .delete_object("b", key, mode_now, Pick::Current)
                .await
                .unwrap();
            assert!(done.marker);
            let id = done.version.unwrap();
            if id.is_none() {
                vs.retain(|v| v.id.is_some());
            }
            vs.insert(0, V { id, object: None });
        }
        10..=12 if !vs.is_empty() => {
            let i = rng.gen_range(0..vs.len());
            let id = vs[i].id;
            let done = store
                .delete_object("b", key, mode_now, pick(id))
                .await
                .unwrap();
            assert!(done.existed);
            assert_eq!(done.marker, vs[i].object.is_none());
            vs.remove(i);
        }
        13 => {
            // A version that is not there.
            let done = store
                .delete_object("b", key, mode_now, Pick::Id(u64::MAX - 1))
                .await
                .unwrap();
            assert!(!done.existed);
        }
        14..=15 if !vs.is_empty() => {
            let i = rng.gen_range(0..vs.len());
            let tags = format!("s={step}");
            let r = store
                .set_version_header("b", key, pick(vs[i].id), TAGS, Some(tags.clone()))
                .await;
            let current_is_real = vs[0].id.is_some();
            let (id, is_marker) = (vs[i].id, vs[i].object.is_none());
            if is_marker {
                assert!(matches!(r, Err(StoreError::DeleteMarker { .. })), "{r:?}");
            } else if id.is_none() && i > 0 && current_is_real {
                assert!(matches!(r, Err(StoreError::NotSupported(_))), "{r:?}");
            } else {
                assert_eq!(r.unwrap(), id);
                if let Some((_, t)) = &mut vs[i].object {
                    *t = Some(tags);
                }
            }
        }
        16 => {
            *mode = if mode_now == Versioning::Enabled {
                Versioning::Suspended
            } else {
                Versioning::Enabled
            };
        }
        _ => {}
    }
}

#[test]
fn versions_against_a_model_through_compaction_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut rng = StdRng::seed_from_u64(1);
        let (mut store, _) = Store::open(small_config(&path)).await.unwrap();
        let mut model = Model::new();
        let mut mode = Versioning::Enabled;
        let mut relocated = 0;
        for step in 0..500u64 {
            let key = format!("k{}", rng.gen_range(0..8));
            let vs = model.entry(key.clone()).or_default();
            match rng.gen_range(0..20) {
                17..=18 => {
                    while let Some(r) = store.compact_once().await.unwrap() {
                        relocated += r.records_relocated;
                    }
                }
                19 => {
                    store.shutdown().await;
                    drop(store);
                    store = Store::open(small_config(&path)).await.unwrap().0;
                }
                op => apply(&store, &mut rng, &key, vs, &mut mode, op, step).await,
            }
            if step % 20 == 0 {
                check(&store, &model).await;
            }
        }
        check(&store, &model).await;
        assert!(relocated > 0, "compaction never moved a record");
        while store.compact_once().await.unwrap().is_some() {}
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        check(&store, &model).await;
    });
}

/// ListObjects passes over keys whose current version is a delete marker
/// at a bounded number per page, and still finds the keys after them.
#[test]
fn a_listing_passes_over_many_delete_markers_in_bounded_pages() {
    use percore_server::store::LIST_HIDDEN_MAX;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let markers = LIST_HIDDEN_MAX + 5;
        let writes = (0..markers).map(|i| {
            let store = store.clone();
            async move {
                let key = format!("a{i:06}");
                store
                    .delete_object("b", &key, Versioning::Enabled, Pick::Current)
                    .await
                    .unwrap();
            }
        });
        futures::future::join_all(writes).await;
        store
            .put(
                "b",
                "z-live",
                ObjectMeta::default(),
                Bytes::from_static(b"x"),
            )
            .await
            .unwrap();
        let page = store.list("b", "", "", None, 100);
        let [ListItem::Skipped(at)] = &page[..] else {
            panic!("{page:?}")
        };
        let rest = store.list("b", "", at, None, 100);
        assert_eq!(
            rest.iter().map(ListItem::name).collect::<Vec<_>>(),
            ["z-live"]
        );
    });
}
