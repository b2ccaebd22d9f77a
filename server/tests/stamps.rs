//! Replication stamps on real files (issue 18, `cluster::replicate`): a
//! primary store orders writes (PUT, tag rewrites, DELETE); their states
//! reach a replica store late, twice and out of order under
//! `PutCondition::IfNewer`, and the replica must end with exactly the
//! primary's state, also after compaction and reopening both stores.
//! Stamps must strictly increase per key on the primary, and
//! `PutCondition::Replace` installs an older state only over the version
//! it names.

use std::collections::BTreeMap;

use bytes::Bytes;
use percore_server::store::record::ObjectMeta;
use percore_server::store::{PutCondition, Store, StoreError};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};

mod common;
use common::{read_all, run};

/// `common::small_config`, as a cluster node's store (stamps kept).
fn small_config(dir: &std::path::Path) -> percore_server::store::StoreConfig {
    let mut cfg = common::small_config(dir);
    cfg.write_stamps = true;
    cfg
}

const TAGS: &str = "x-amz-tagging";

/// A key's state as it would be copied: (stamp, Some((meta, bytes)) or
/// None for a tombstone).
type State = (u64, Option<(ObjectMeta, Bytes)>);

async fn state_of(store: &Store, key: &str) -> Option<State> {
    let stamp = store.key_stamp("b", key)?;
    match store.open_read("b", key).await {
        Ok(r) => {
            let meta = ObjectMeta::clone(&r.meta);
            drop(r);
            let bytes = Bytes::from(read_all(store, "b", key).await.unwrap());
            Some((stamp, Some((meta, bytes))))
        }
        Err(StoreError::NotFound) => Some((stamp, None)),
        Err(e) => panic!("{key}: {e}"),
    }
}

/// Applies a copied state under `condition`: Ok(true) if installed.
async fn apply(store: &Store, key: &str, state: &State, condition: PutCondition) -> bool {
    match &state.1 {
        None => store.delete_stamped("b", key, condition).await.unwrap(),
        Some((meta, bytes)) => {
            let mut w = store.put_stream("b", key, meta.clone());
            w.set_condition(condition);
            w.write(bytes.clone()).await.unwrap();
            match w.finish().await {
                Ok(_) => true,
                Err(StoreError::PreconditionFailed) => false,
                Err(e) => panic!("{key}: {e}"),
            }
        }
    }
}

async fn assert_same(primary: &Store, replica: &Store, keys: usize) {
    for k in 0..keys {
        let key = format!("k{k}");
        let (p, r) = (state_of(primary, &key).await, state_of(replica, &key).await);
        match (&p, &r) {
            (None, None) => {}
            // A tombstone and nothing both read as absent; the replica
            // may keep a tombstone the primary compacted away.
            (None | Some((_, None)), None | Some((_, None))) => {}
            (Some((ps, Some((pm, pb)))), Some((rs, Some((rm, rb))))) => {
                assert_eq!(ps, rs, "{key}: stamps differ");
                assert_eq!(pm.etag, rm.etag, "{key}");
                assert_eq!(pm.mtime_ms, rm.mtime_ms, "{key}: mtime differs");
                assert_eq!(pm.headers, rm.headers, "{key}: headers differ");
                assert!(pb == rb, "{key}: bytes differ");
            }
            _ => panic!("{key}: primary {p:?} vs replica {r:?}"),
        }
    }
}

/// `Replace` installs only over the version it names, also an older
/// stamp (a catching-up node dropping an unacknowledged write); an older
/// copy then does not go over it, a newer tombstone does.
async fn replace_checks(replica: &Store) {
    // stamp (a catching-up node dropping an unacknowledged write).
    let key = "k0";
    let mine = replica.key_stamp("b", key);
    let meta = ObjectMeta {
        etag: "old".into(),
        ..Default::default()
    };
    let older: State = (1, Some((meta, Bytes::from_static(b"old"))));
    let wrong = PutCondition::Replace {
        seen: Some(mine.unwrap_or(0) + 7),
        stamp: 1,
    };
    assert!(!apply(replica, key, &older, wrong).await);
    let right = PutCondition::Replace {
        seen: mine,
        stamp: 1,
    };
    assert!(apply(replica, key, &older, right).await);
    assert_eq!(replica.key_stamp("b", key), Some(1));
    assert_eq!(read_all(replica, "b", key).await.unwrap(), b"old");
    // An older copy does not go over it; a tombstone with a newer
    // stamp does, and keeps its stamp.
    assert!(!apply(replica, key, &older, PutCondition::IfNewer(1)).await);
    assert!(apply(replica, key, &(5, None), PutCondition::IfNewer(5)).await);
    assert_eq!(replica.key_stamp("b", key), Some(5));
    assert!(matches!(
        replica.open_read("b", key).await,
        Err(StoreError::NotFound)
    ));
}

/// Delivers a few copies in flight, in random order, some twice:
/// (installed, refused).
async fn deliver_some(
    replica: &Store,
    in_flight: &mut Vec<(String, State)>,
    rng: &mut StdRng,
) -> (u64, u64) {
    let (mut installed, mut refused) = (0, 0);
    in_flight.shuffle(rng);
    let n = rng.gen_range(0..=in_flight.len().min(3));
    for (k, s) in in_flight.drain(..n).collect::<Vec<_>>() {
        let copies = if rng.gen_bool(0.2) { 2 } else { 1 };
        for _ in 0..copies {
            if apply(replica, &k, &s, PutCondition::IfNewer(s.0)).await {
                installed += 1;
            } else {
                refused += 1;
            }
        }
    }
    (installed, refused)
}

#[test]
fn copies_in_any_order_converge_to_the_primary() {
    let (pdir, rdir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pp, rp) = (pdir.path().to_path_buf(), rdir.path().to_path_buf());
    run(move || async move {
        let mut rng = StdRng::seed_from_u64(32);
        let (mut primary, _) = Store::open(small_config(&pp)).await.unwrap();
        let (mut replica, _) = Store::open(small_config(&rp)).await.unwrap();
        primary.bucket_create("b").await.unwrap();
        replica.bucket_create("b").await.unwrap();
        const KEYS: usize = 10;
        let mut last_stamp: BTreeMap<String, u64> = BTreeMap::new();
        let mut in_flight: Vec<(String, State)> = Vec::new();
        let (mut installed, mut refused) = (0, 0);
        for step in 0..600u64 {
            let key = format!("k{}", rng.gen_range(0..KEYS));
            match rng.gen_range(0..10) {
                0..=3 => {
                    let len = if rng.gen_bool(0.6) {
                        rng.gen_range(0..3000)
                    } else {
                        rng.gen_range(20_000..70_000)
                    };
                    let meta = ObjectMeta {
                        etag: format!("e{step}"),
                        headers: vec![("x-amz-meta-s".into(), step.to_string())],
                        ..Default::default()
                    };
                    primary
                        .put("b", &key, meta, common::seeded_bytes(step, len))
                        .await
                        .unwrap();
                }
                4..=5 => {
                    let tags = Some(format!("t={step}"));
                    let _ = primary.set_object_header("b", &key, TAGS, tags).await;
                }
                6..=7 => {
                    primary.delete("b", &key).await.unwrap();
                }
                8 => {
                    // Compaction on either side, between copies.
                    let s = if rng.gen_bool(0.5) {
                        &primary
                    } else {
                        &replica
                    };
                    while s.compact_once().await.unwrap().is_some() {}
                }
                _ => {
                    // Restart one store: stamps come back from the records.
                    if rng.gen_bool(0.5) {
                        primary = reopen(primary, &pp).await;
                    } else {
                        replica = reopen(replica, &rp).await;
                    }
                }
            }
            if let Some(state) = state_of(&primary, &key).await {
                let before = last_stamp.insert(key.clone(), state.0);
                assert!(
                    before.is_none_or(|b| b <= state.0),
                    "{key}: stamp went back from {before:?} to {}",
                    state.0
                );
                in_flight.push((key.clone(), state));
            }
            let (i, r) = deliver_some(&replica, &mut in_flight, &mut rng).await;
            installed += i;
            refused += r;
        }
        // The rest, then each key's latest (as a primary's last copy).
        in_flight.shuffle(&mut rng);
        for (k, s) in std::mem::take(&mut in_flight) {
            apply(&replica, &k, &s, PutCondition::IfNewer(s.0)).await;
        }
        for k in 0..KEYS {
            let key = format!("k{k}");
            if let Some(s) = state_of(&primary, &key).await {
                apply(&replica, &key, &s, PutCondition::IfNewer(s.0)).await;
            }
        }
        assert!(installed > 100 && refused > 20, "{installed} {refused}");
        assert_same(&primary, &replica, KEYS).await;
        primary.shutdown().await;
        replica.shutdown().await;
        drop((primary, replica));
        let (primary, _) = Store::open(small_config(&pp)).await.unwrap();
        let (replica, _) = Store::open(small_config(&rp)).await.unwrap();
        assert_same(&primary, &replica, KEYS).await;

        replace_checks(&replica).await;
        primary.shutdown().await;
        replica.shutdown().await;
    });
}

#[test]
fn stamps_of_concurrent_writes_follow_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        store.bucket_create("b").await.unwrap();
        // Many writes of one key within the same milliseconds, in flight
        // together: every one gets its own stamp, and the one installed
        // last (the highest seq) has the highest.
        let writes = (0..64u64).map(|i| {
            let store = store.clone();
            async move {
                let meta = ObjectMeta {
                    etag: format!("e{i}"),
                    ..Default::default()
                };
                store
                    .put("b", "k", meta, common::seeded_bytes(i, 100))
                    .await
                    .unwrap()
            }
        });
        let infos = futures::future::join_all(writes).await;
        let mut stamps: Vec<u64> = infos.iter().map(|i| i.stamp).collect();
        stamps.sort_unstable();
        stamps.dedup();
        assert_eq!(stamps.len(), 64, "two writes shared a stamp");
        let current = store.key_stamp("b", "k").unwrap();
        assert_eq!(current, *stamps.last().unwrap());
        let winner = infos.iter().find(|i| i.stamp == current).unwrap();
        assert_eq!(store.current_info("b", "k").unwrap().etag, winner.etag);
        store.shutdown().await;
    });
}

/// `store` shut down and opened again (its stamps come back from its
/// records).
async fn reopen(store: Store, dir: &std::path::Path) -> Store {
    store.shutdown().await;
    drop(store);
    Store::open(small_config(dir)).await.unwrap().0
}

/// An index key's state as `cluster::replicate` copies it: (stamp, what
/// it holds).
#[derive(Debug, Clone)]
enum Held {
    Object(ObjectMeta, Bytes),
    Marker,
    Tombstone,
}

async fn index_state(store: &Store, index_key: &str) -> Option<(u64, Held)> {
    let (stamp, etag, marker) = store.index_key_state("b", index_key)?;
    let held = match (etag, marker) {
        (Some(_), _) => {
            let r = store.open_read("b", index_key).await.unwrap();
            let meta = ObjectMeta::clone(&r.meta);
            drop(r);
            Held::Object(
                meta,
                Bytes::from(read_all(store, "b", index_key).await.unwrap()),
            )
        }
        (None, true) => Held::Marker,
        (None, false) => Held::Tombstone,
    };
    Some((stamp, held))
}

async fn apply_index(store: &Store, index_key: &str, (stamp, held): &(u64, Held)) {
    let condition = PutCondition::IfNewer(*stamp);
    match held {
        Held::Tombstone => drop(
            store
                .delete_stamped("b", index_key, condition)
                .await
                .unwrap(),
        ),
        Held::Marker => drop(
            store
                .marker_stamped("b", index_key, condition)
                .await
                .unwrap(),
        ),
        Held::Object(meta, bytes) => {
            let mut w = store.put_stream("b", index_key, meta.clone());
            w.set_condition(condition);
            w.write(bytes.clone()).await.unwrap();
            match w.finish().await {
                Ok(_) | Err(StoreError::PreconditionFailed) => {}
                Err(e) => panic!("{index_key}: {e}"),
            }
        }
    }
}

/// One client write of `key` on `primary` (a versioned or null PUT, a
/// delete marker, a version removed): the index key it changed (None:
/// nothing to remove). Checks that real version ids are stamps and
/// increase per key.
async fn versioned_write(
    primary: &Store,
    rng: &mut StdRng,
    (key, step): (&str, u64),
    last_id: &mut BTreeMap<String, u64>,
) -> Option<String> {
    use percore_server::store::versions::{version_key, Pick, Versioning, STAMP_ID_MIN};
    let key = key.to_string();
    Some(match rng.gen_range(0..8) {
        0..=3 => {
            // A PUT: a new real version, or (suspended) the null one.
            let real = rng.gen_bool(0.75);
            let meta = ObjectMeta {
                etag: format!("e{step}"),
                ..Default::default()
            };
            let mut w = primary.put_stream("b", &key, meta);
            if real {
                w.set_new_version();
            }
            w.write(common::seeded_bytes(step, rng.gen_range(0..2000)))
                .await
                .unwrap();
            let (_, version) = w.finish_version().await.unwrap();
            match version {
                Some(id) => {
                    assert!(id >= STAMP_ID_MIN, "{key}: id {id} is not a stamp");
                    let last = last_id.insert(key.clone(), id).unwrap_or(0);
                    assert!(id > last, "{key}: id {id} after {last}");
                    version_key(&key, id)
                }
                None => key.clone(),
            }
        }
        4..=5 => {
            let mode = if rng.gen_bool(0.7) {
                Versioning::Enabled
            } else {
                Versioning::Suspended
            };
            let done = primary
                .delete_object("b", &key, mode, Pick::Current)
                .await
                .unwrap();
            match done.version {
                Some(Some(id)) => {
                    let last = last_id.insert(key.clone(), id).unwrap_or(0);
                    assert!(id > last, "{key}: marker id {id} after {last}");
                    version_key(&key, id)
                }
                _ => key.clone(),
            }
        }
        6..=7 => {
            // A version removed for good (or the null one).
            let versions = primary.versions("b", &key);
            let v = versions.get(rng.gen_range(0..versions.len().max(1)))?;
            let pick = v.version.map_or(Pick::Null, Pick::Id);
            primary
                .delete_object("b", &key, Versioning::Enabled, pick)
                .await
                .unwrap();
            v.version.map_or(key.clone(), |id| version_key(&key, id))
        }
        _ => unreachable!(),
    })
}

/// S3 versioning on a cluster (issue 18): each version is an index key
/// of its own (`\0v/KEY\0ID`), copied like a key. On a cluster node a real
/// version's id is its stamp (above `STAMP_ID_MIN`, increasing per key
/// across writes), and the null version is placed among the real ones by
/// its stamp, so a replica that took the copies late, twice and out of
/// order lists the same versions, in the same order, with the same
/// current version, as the primary (also after both reopen). With ids
/// from each store's own seqs the replica's order was its own.
#[test]
fn versions_copied_in_any_order_list_alike_on_a_replica() {
    use percore_server::store::versions::Pick;
    let (pdir, rdir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pp, rp) = (pdir.path().to_path_buf(), rdir.path().to_path_buf());
    run(move || async move {
        let mut rng = StdRng::seed_from_u64(18);
        let (mut primary, _) = Store::open(small_config(&pp)).await.unwrap();
        let (mut replica, _) = Store::open(small_config(&rp)).await.unwrap();
        // The replica's seqs run ahead of the primary's, as they would.
        replica.bucket_create("b").await.unwrap();
        for i in 0..50 {
            let pad = common::seeded_bytes(i, 10);
            replica
                .put("b", "pad", ObjectMeta::default(), pad)
                .await
                .unwrap();
        }
        primary.bucket_create("b").await.unwrap();
        const KEYS: usize = 3;
        let mut last_id: BTreeMap<String, u64> = BTreeMap::new();
        let mut in_flight: Vec<(String, (u64, Held))> = Vec::new();
        for step in 0..400u64 {
            let key = format!("k{}", rng.gen_range(0..KEYS));
            let index_key = match rng.gen_range(0..10) {
                0..=7 => {
                    match versioned_write(&primary, &mut rng, (&key, step), &mut last_id).await {
                        Some(k) => k,
                        None => continue,
                    }
                }
                8 => {
                    let s = if rng.gen_bool(0.5) {
                        &primary
                    } else {
                        &replica
                    };
                    while s.compact_once().await.unwrap().is_some() {}
                    continue;
                }
                _ => {
                    if rng.gen_bool(0.5) {
                        primary = reopen(primary, &pp).await;
                    } else {
                        replica = reopen(replica, &rp).await;
                    }
                    continue;
                }
            };
            if let Some(state) = index_state(&primary, &index_key).await {
                in_flight.push((index_key, state));
            }
            // Deliver some copies, in any order, some twice.
            in_flight.shuffle(&mut rng);
            let n = rng.gen_range(0..=in_flight.len());
            for (k, s) in in_flight.iter().take(n) {
                apply_index(&replica, k, s).await;
            }
            in_flight.drain(..n.saturating_sub(usize::from(rng.gen_bool(0.2))));
        }
        // The rest arrive (every copy has now arrived once or more, in any
        // order: the replica must hold what the primary does).
        for (k, s) in &in_flight {
            apply_index(&replica, k, s).await;
        }
        for round in 0..2 {
            for k in 0..KEYS {
                let key = format!("k{k}");
                let (p, r) = (primary.versions("b", &key), replica.versions("b", &key));
                assert_eq!(
                    p, r,
                    "{key} (round {round}): the replica lists other versions"
                );
                let current = |s: &Store| {
                    s.resolve("b", &key, Pick::Current)
                        .map(|c| (c.version, c.marker))
                };
                assert_eq!(
                    current(&primary),
                    current(&replica),
                    "{key}: another current version"
                );
            }
            replica = reopen(replica, &rp).await;
            primary = reopen(primary, &pp).await;
        }
    });
}
