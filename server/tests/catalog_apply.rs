//! A cluster node's bucket-owner shard making its buckets the cluster's
//! catalog's (`cluster::catalog::apply`), on a real store: buckets the
//! catalog has and the node lacks are made with their owner and
//! documents, changed documents are stored, documents and empty buckets
//! the catalog no longer has are removed, a bucket that still holds keys
//! is kept, a read that carries only what changed leaves the rest as it
//! is, and a document the read should have carried makes the next read a
//! whole one. A bucket the catalog records as deleted goes with what the
//! node still holds of it, if the node made it before the read began.
//! And the hold a cluster DeleteBucket puts on a bucket: clients' writes
//! refused, replicas' copies taken, writes in progress counted.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use percore_server::access::users::User;
use percore_server::bucket_config::ConfigKind;
use percore_server::cluster::catalog::{apply, Catalog, Entry, APPLIED};
use percore_server::shard::msg::{Op, Reply};
use percore_server::shard::object::ObjectSink;
use percore_server::shard::Shard;
use percore_server::store::record::ObjectMeta;
use percore_server::store::Store;

mod common;
use common::{run, small_config};

use ConfigKind::{Cors, Owner, Policy, Tagging};

async fn shard_on(store: &Store) -> Rc<Shard> {
    let shard = Shard::new(0, 1, 7, store.clone());
    shard.publish_buckets().await;
    assert!(matches!(shard.execute(Op::Start).await, Reply::Ok));
    shard
}

/// Every bucket of the shard with its documents, by name.
async fn buckets(shard: &Rc<Shard>) -> BTreeMap<String, BTreeMap<&'static str, String>> {
    let (all, more) = shard.bucket_docs(None, 1 << 30).await.unwrap();
    assert!(!more);
    all.into_iter()
        .map(|b| {
            let docs = b
                .docs
                .into_iter()
                .map(|(k, d)| (k.name(), String::from_utf8(d.to_vec()).unwrap()))
                .collect();
            (b.name, docs)
        })
        .collect()
}

/// A bucket as a catalog read names it: its documents, each with its
/// contents when the read carried them.
type Named<'a> = (&'a str, &'a [(ConfigKind, Option<&'a str>)]);

fn catalog(rev: i64, since: i64, buckets: &[Named]) -> Catalog {
    Catalog {
        rev,
        since,
        seeded: true,
        users_seeded: true,
        buckets: buckets
            .iter()
            .map(|(name, docs)| {
                let docs = docs
                    .iter()
                    .map(|(k, d)| (*k, d.map(|d| Bytes::from(d.to_string()))))
                    .collect();
                let entry = Entry {
                    docs,
                    created_ms: None,
                };
                (name.to_string(), entry)
            })
            .collect(),
        users: BTreeMap::new(),
        deleted: Default::default(),
        read_ms: percore_server::store::now_ms(),
    }
}

/// Puts `key` into `bucket` as a client does.
async fn put(shard: &Rc<Shard>, bucket: &str, key: &str) {
    let mut sink = ObjectSink::open(shard, bucket, key, ObjectMeta::default())
        .await
        .unwrap();
    sink.write(Bytes::from_static(b"x")).await.unwrap();
    sink.finish("etag".into()).await.unwrap();
}

fn docs(pairs: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

#[test]
fn a_node_makes_its_buckets_the_catalogs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let shard = shard_on(&store).await;
        // What the node held when it went down.
        for b in ["keep", "gone", "full"] {
            assert!(shard.create_bucket(b, None).await.unwrap());
        }
        shard
            .set_bucket_config("keep", Policy, Some(Bytes::from_static(b"P1")))
            .await
            .unwrap();
        shard
            .set_bucket_config("keep", Cors, Some(Bytes::from_static(b"C-old")))
            .await
            .unwrap();
        let mut sink = ObjectSink::open(&shard, "full", "k", ObjectMeta::default())
            .await
            .unwrap();
        sink.write(Bytes::from_static(b"x")).await.unwrap();
        sink.finish("etag".into()).await.unwrap();

        // A whole read: "keep" changed, "new" made by bob, "gone" and
        // "full" deleted in the cluster.
        let whole = catalog(
            10,
            0,
            &[
                ("keep", &[(Policy, Some("P2")), (Tagging, Some("T"))]),
                ("new", &[(Owner, Some("bob")), (Cors, Some("C"))]),
            ],
        );
        apply(&shard, &whole).await.unwrap();
        let got = buckets(&shard).await;
        assert_eq!(got["keep"], docs(&[("policy", "P2"), ("tagging", "T")]));
        assert_eq!(got["new"], docs(&[("owner", "bob"), ("cors", "C")]));
        assert!(!got.contains_key("gone"));
        // Still holds a key: kept (logged), not lost.
        assert!(got.contains_key("full"));
        assert_eq!(
            shard.bucket_config("new").unwrap().owner.as_deref(),
            Some("bob")
        );

        // A read of what changed since 10: the tagging went; nothing else
        // is carried, and what is not carried stays as it is.
        let changed = catalog(
            20,
            10,
            &[
                ("keep", &[(Policy, None)]),
                ("new", &[(Owner, None), (Cors, None)]),
            ],
        );
        apply(&shard, &changed).await.unwrap();
        let got = buckets(&shard).await;
        assert_eq!(got["keep"], docs(&[("policy", "P2")]));
        assert_eq!(got["new"], docs(&[("owner", "bob"), ("cors", "C")]));
        assert!(!APPLIED.full.load(Ordering::Acquire));

        // A bucket this node lacks whose owner the read did not carry:
        // not made up; the next read must be whole.
        let short = catalog(
            30,
            20,
            &[
                ("keep", &[(Policy, None)]),
                ("new", &[(Owner, None), (Cors, None)]),
                ("fresh", &[(Owner, None)]),
            ],
        );
        assert!(apply(&shard, &short).await.is_err());
        assert!(APPLIED.full.load(Ordering::Acquire));
        assert!(!buckets(&shard).await.contains_key("fresh"));

        // The catalog's "new" and "full" were deleted and made again by
        // carol, long after this node made its own: the empty one is made
        // again for her; the one still holding a key here is left as it
        // is (its key must not pass to her).
        let later = percore_server::store::now_ms() + 60 * 60 * 1000;
        let mut again = catalog(
            40,
            0,
            &[
                ("keep", &[(Policy, Some("P2"))]),
                ("new", &[(Owner, Some("carol"))]),
                ("full", &[(Owner, Some("carol"))]),
            ],
        );
        for b in ["new", "full"] {
            again.buckets.get_mut(b).unwrap().created_ms = Some(later);
        }
        apply(&shard, &again).await.unwrap();
        let got = buckets(&shard).await;
        assert_eq!(got["new"], docs(&[("owner", "carol")]));
        assert_eq!(got["full"], docs(&[]));
        assert_eq!(shard.bucket_config("full").unwrap().owner.as_deref(), None);

        // Users: one the catalog has is added, one it has not goes.
        let dave = User::generate("dave", 1);
        shard.set_user("dave", Some(&dave)).await.unwrap();
        let erin = User::generate("erin", 2);
        let mut users = catalog(50, 0, &[("keep", &[(Policy, Some("P2"))])]);
        users
            .users
            .insert("erin".into(), Some(Bytes::from(erin.to_doc())));
        apply(&shard, &users).await.unwrap();
        let names: Vec<String> = shard.user_list().iter().map(|u| u.name.clone()).collect();
        assert_eq!(names, ["erin"]);
        assert_eq!(
            shard.user_by_access_key(&erin.access_key).unwrap().name,
            "erin"
        );
        assert!(shard.user_by_access_key(&dave.access_key).is_none());
    });
}

#[test]
fn a_bucket_deleted_in_the_cluster_goes_with_what_the_node_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let shard = shard_on(&store).await;
        // What the node held when it went down: keys of buckets the
        // cluster then emptied and deleted ("gone", "again"), and of one
        // it has no record of deleting ("lost": an etcd restored from an
        // older snapshot).
        for b in ["gone", "again", "lost"] {
            assert!(shard.create_bucket(b, None).await.unwrap());
            for k in ["a", "b/c", "d"] {
                put(&shard, b, k).await;
            }
        }
        let later = percore_server::store::now_ms() + 60 * 60 * 1000;
        let records = |at: u64| -> BTreeMap<String, u64> {
            [("gone".to_string(), at), ("again".to_string(), at)].into()
        };
        // A read that began before the buckets were made here (they could
        // be of the name made since, by a replica's copy): kept.
        let mut early = catalog(10, 0, &[]);
        early.deleted = records(later);
        early.read_ms = 1;
        apply(&shard, &early).await.unwrap();
        // Records of deletions made before the buckets here were (an etcd
        // restored from a snapshot that lacks the buckets made again):
        // kept.
        let mut restored = catalog(11, 0, &[]);
        restored.deleted = records(1);
        apply(&shard, &restored).await.unwrap();
        let got = buckets(&shard).await;
        assert!(["gone", "again", "lost"]
            .iter()
            .all(|b| got.contains_key(*b)));

        // "gone" deleted; "again" deleted and made again by carol long
        // after; "lost" not in the catalog, with no record.
        let mut read = catalog(20, 0, &[("again", &[(Owner, Some("carol"))])]);
        read.buckets.get_mut("again").unwrap().created_ms = Some(later);
        read.deleted = records(later);
        apply(&shard, &read).await.unwrap();
        let got = buckets(&shard).await;
        assert!(!got.contains_key("gone"));
        assert_eq!(got["again"], docs(&[("owner", "carol")]));
        // Kept, logged: nothing says it was deleted.
        assert!(got.contains_key("lost"));
        for b in ["gone", "again"] {
            assert!(
                store.list(b, "", "", None, 10).is_empty(),
                "{b}: {:?}",
                store.list(b, "", "", None, 10)
            );
        }
        assert_eq!(store.list("lost", "", "", None, 10).len(), 3);
        // Carol's bucket is hers and empty, and takes writes.
        put(&shard, "again", "new").await;
        assert_eq!(store.list("again", "", "", None, 10).len(), 1);
    });
}

#[test]
fn a_closed_bucket_refuses_clients_writes_and_takes_copies() {
    use percore_server::shard::msg::ShardError;
    use percore_server::store::PutCondition;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let shard = shard_on(&store).await;
        assert!(shard.create_bucket("b", None).await.unwrap());
        // A write in progress when the hold begins is counted...
        let mut early = ObjectSink::open(&shard, "b", "early", ObjectMeta::default())
            .await
            .unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        assert_eq!(shard.close_bucket("b", 7, until).await.unwrap(), 1);
        // ...and ends; a client's new write is refused (retry), ...
        early.write(Bytes::from_static(b"x")).await.unwrap();
        early.finish("etag".into()).await.unwrap();
        let refused = ObjectSink::open(&shard, "b", "late", ObjectMeta::default()).await;
        assert_eq!(refused.err(), Some(ShardError::BucketClosing));
        // ...a replica's copy (its primary took the write before) is not.
        let mut copy = ObjectSink::open_part(
            &shard,
            "b",
            "copy",
            ObjectMeta::default(),
            None,
            Some(PutCondition::IfNewer(5)),
        )
        .await
        .unwrap();
        copy.write(Bytes::from_static(b"x")).await.unwrap();
        copy.finish("etag".into()).await.unwrap();
        // Each hold stands on its own (doors racing, a client's retry):
        // ending one leaves the other.
        assert_eq!(shard.close_bucket("b", 8, until).await.unwrap(), 0);
        shard.reopen_bucket("b", 8).await;
        assert!(ObjectSink::open(&shard, "b", "late", ObjectMeta::default())
            .await
            .is_err());
        shard.reopen_bucket("b", 7).await;
        put(&shard, "b", "late").await;
        // At most 16 at once.
        for t in 100..116 {
            shard.close_bucket("b", t, until).await.unwrap();
        }
        assert_eq!(
            shard.close_bucket("b", 200, until).await.err(),
            Some(ShardError::Busy)
        );
        for t in 100..116 {
            shard.reopen_bucket("b", t).await;
        }
        // A hold lapses by itself.
        let soon = Instant::now() + Duration::from_millis(50);
        shard.close_bucket("b", 9, soon).await.unwrap();
        assert!(
            ObjectSink::open(&shard, "b", "later", ObjectMeta::default())
                .await
                .is_err()
        );
        glommio::timer::sleep(Duration::from_millis(80)).await;
        put(&shard, "b", "later").await;
        assert_eq!(
            shard.close_bucket("missing", 1, until).await.err(),
            Some(ShardError::NoSuchBucket)
        );
        assert_eq!(store.list("b", "", "", None, 10).len(), 4);
    });
}

#[test]
fn a_dropped_bucket_keeps_what_was_written_after_the_deletion_closed() {
    use percore_server::shard::msg::ShardError;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let shard = shard_on(&store).await;
        assert!(shard.create_bucket("mixed", None).await.unwrap());
        put(&shard, "mixed", "before").await;
        glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        let deleted_ms = percore_server::store::now_ms();
        glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        // A copy of a write into a bucket of the name made again, come
        // before this node read the catalog that has it.
        put(&shard, "mixed", "after").await;
        let mut read = catalog(10, 0, &[]);
        read.deleted = [("mixed".to_string(), deleted_ms)].into();
        read.read_ms = deleted_ms + 60_000;
        apply(&shard, &read).await.unwrap();
        // The older key went; the newer stays, and with it the bucket,
        // closed to clients' writes (none lands to be dropped later).
        let left: Vec<String> = store
            .list("mixed", "", "", None, 10)
            .iter()
            .map(|i| i.name().to_string())
            .collect();
        assert_eq!(left, ["after"]);
        let refused = ObjectSink::open(&shard, "mixed", "x", ObjectMeta::default()).await;
        assert_eq!(refused.err(), Some(ShardError::BucketClosing));
        // The catalog has the bucket again: this one is taken for it, and
        // takes writes.
        apply(&shard, &catalog(20, 0, &[("mixed", &[])]))
            .await
            .unwrap();
        put(&shard, "mixed", "x").await;
        assert_eq!(store.list("mixed", "", "", None, 10).len(), 2);
    });
}
