//! Multipart uploads in the engine: completion without copying, abort,
//! validation, compaction of parts and of completed objects, reopen.

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use bytes::Bytes;
use percore_server::store::mpu::{UploadError, PART_BYTES_MIN};
use percore_server::store::record::ObjectMeta;
use percore_server::store::{debug_index, Store, StoreError};

mod common;
use common::{read_all, run, small_config};

use common::seeded_bytes as data;

fn md5_hex(b: &[u8]) -> String {
    use md5::{Digest, Md5};
    hex::encode(Md5::digest(b))
}

async fn put_part(store: &Store, key: &str, id: &str, n: u32, body: Bytes) -> String {
    let mut w = store.put_part_stream("b", key, id, n).unwrap();
    let etag = md5_hex(&body);
    // Odd-sized writes, so extents do not line up with the writes.
    for piece in body.chunks(100_003) {
        w.write(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    w.set_etag(etag.clone());
    let info = w.finish().await.unwrap();
    assert_eq!(info.size_bytes, body.len() as u64);
    etag
}

fn internal_live_keys(store: &Store) -> Vec<String> {
    debug_index(store)
        .into_iter()
        .filter(|(_, k, _, deleted, _)| k.starts_with('\0') && !deleted)
        .map(|(_, k, ..)| k)
        .collect()
}

/// Compacts every sealed segment once, whatever its garbage; returns how
/// many records were relocated.
async fn compact_everything(store: &Store) -> u64 {
    let mut relocated = 0;
    for (id, _, _, sealed) in store.segment_table() {
        if sealed {
            if let Ok(r) = store.compact_segment(id).await {
                relocated += r.records_relocated;
            }
        }
    }
    relocated
}

fn upload_err(r: Result<impl std::fmt::Debug, StoreError>) -> UploadError {
    match r {
        Err(StoreError::Upload(e)) => e,
        other => panic!("expected an upload error, got {other:?}"),
    }
}

#[test]
fn complete_concatenates_parts_and_survives_compaction_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let meta = ObjectMeta {
            content_type: "text/csv".into(),
            headers: vec![("x-amz-meta-a".into(), "1".into())],
            ..Default::default()
        };
        let id = store.mpu_create("b", "big/obj", meta).await.unwrap();
        assert_eq!(store.mpu_list("b", "", "", "", 100).len(), 1);
        let p1 = data(1, PART_BYTES_MIN as usize);
        let p2 = data(2, PART_BYTES_MIN as usize + 12345);
        let p3 = data(3, 777);
        // Part 2 is uploaded twice: the second upload replaces the first.
        put_part(&store, "big/obj", &id, 2, data(99, 1000)).await;
        let e3 = put_part(&store, "big/obj", &id, 3, p3.clone()).await;
        let e1 = put_part(&store, "big/obj", &id, 1, p1.clone()).await;
        let e2 = put_part(&store, "big/obj", &id, 2, p2.clone()).await;
        let parts = store.mpu_parts("b", "big/obj", &id, 0, 100).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.number).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(parts[1].size_bytes, p2.len() as u64);
        assert_eq!(
            store.mpu_parts("b", "big/obj", &id, 1, 1).unwrap()[0].number,
            2
        );
        // Nothing of the upload is listed as an object.
        assert!(store.list("b", "", "", None, 100).is_empty());
        assert_eq!(store.objects_total(), 0);

        // Compact while the upload is in progress: the parts move.
        assert!(compact_everything(&store).await > 0);
        assert_eq!(
            store.mpu_parts("b", "big/obj", &id, 0, 100).unwrap().len(),
            3
        );

        // Validation, none of which ends the upload.
        let bad = |n: u32, e: &str| (n, e.to_string());
        assert_eq!(
            upload_err(
                store
                    .mpu_complete("b", "big/obj", &id, &[bad(2, &e2), bad(1, &e1)])
                    .await
            ),
            UploadError::InvalidPartOrder
        );
        assert_eq!(
            upload_err(
                store
                    .mpu_complete("b", "big/obj", &id, &[bad(1, &e2)])
                    .await
            ),
            UploadError::InvalidPart(1)
        );
        assert_eq!(
            upload_err(
                store
                    .mpu_complete("b", "big/obj", &id, &[bad(3, &e3), bad(4, &e3)])
                    .await
            ),
            UploadError::EntityTooSmall(3)
        );
        assert_eq!(
            upload_err(store.mpu_complete("b", "big/obj", &id, &[]).await),
            UploadError::NoParts
        );
        assert_eq!(
            upload_err(
                store
                    .mpu_complete(
                        "b",
                        "big/obj",
                        "0123456789abcdef0123456789abcdef",
                        &[bad(1, &e1)]
                    )
                    .await
            ),
            UploadError::NoSuchUpload
        );

        let written_before = store.stats().bytes_written;
        let info = store
            .mpu_complete(
                "b",
                "big/obj",
                &id,
                &[bad(1, &e1), bad(2, &e2), bad(3, &e3)],
            )
            .await
            .unwrap();
        // No part byte was copied: completion wrote a few KiB of records.
        assert!(store.stats().bytes_written - written_before < 64 * 1024);
        let mut md5s = Vec::new();
        for e in [&e1, &e2, &e3] {
            md5s.extend(hex::decode(e).unwrap());
        }
        assert_eq!(&*info.etag, format!("{}-3", md5_hex(&md5s)));
        let whole: Vec<u8> = [p1, p2, p3].concat();
        assert_eq!(info.size_bytes, whole.len() as u64);
        assert!(read_all(&store, "b", "big/obj").await.unwrap() == whole);
        let reader = store.open_read("b", "big/obj").await.unwrap();
        assert_eq!(reader.meta.content_type, "text/csv");
        // The upload's headers, and the part sizes for GET partNumber.
        let sizes = format!("{PART_BYTES_MIN}*1,{}*1,777*1", PART_BYTES_MIN + 12345);
        assert_eq!(
            reader.meta.headers,
            vec![
                ("x-amz-meta-a".to_string(), "1".to_string()),
                ("x-percore-parts".to_string(), sizes)
            ]
        );
        drop(reader);
        assert!(internal_live_keys(&store).is_empty());
        assert!(store.mpu_list("b", "", "", "", 100).is_empty());
        assert_eq!(
            upload_err(store.mpu_parts("b", "big/obj", &id, 0, 10)),
            UploadError::NoSuchUpload
        );

        // Compaction now moves the extents with the completed object.
        assert!(compact_everything(&store).await > 0);
        assert!(read_all(&store, "b", "big/obj").await.unwrap() == whole);
        let mut rounds = 0;
        while store.compact_once().await.unwrap().is_some() {
            rounds += 1;
            assert!(rounds < 1000);
        }
        assert!(read_all(&store, "b", "big/obj").await.unwrap() == whole);
        store.shutdown().await;
        drop(store);
        let (store, report) = Store::open(small_config(&path)).await.unwrap();
        assert_eq!(report.objects, 1);
        assert!(read_all(&store, "b", "big/obj").await.unwrap() == whole);
        assert!(internal_live_keys(&store).is_empty());
        assert_eq!(&*store.head("b", "big/obj").unwrap().etag, &*info.etag);
    });
}

#[test]
fn abort_drops_parts_and_late_parts_stay_invisible() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let a = store
            .mpu_create("b", "k", ObjectMeta::default())
            .await
            .unwrap();
        let b = store
            .mpu_create("b", "k", ObjectMeta::default())
            .await
            .unwrap();
        let c = store
            .mpu_create("b", "j/x", ObjectMeta::default())
            .await
            .unwrap();
        assert_ne!(a, b);
        put_part(&store, "k", &a, 1, data(1, 50_000)).await;
        put_part(&store, "k", &b, 1, data(2, 50_000)).await;
        // A part in flight while its upload is aborted.
        let mut late = store.put_part_stream("b", "k", &a, 2).unwrap();
        late.write(data(3, 70_000)).await.unwrap();

        let listed = store.mpu_list("b", "", "", "", 100);
        let mut expect = vec![("j/x".to_string(), c.clone())];
        let mut ks = vec![("k".to_string(), a.clone()), ("k".to_string(), b.clone())];
        ks.sort();
        expect.extend(ks.clone());
        assert_eq!(
            listed
                .iter()
                .map(|u| (u.key.clone(), u.upload_id.clone()))
                .collect::<Vec<_>>(),
            expect
        );
        // Markers and prefixes.
        assert_eq!(store.mpu_list("b", "k", "", "", 100).len(), 2);
        assert_eq!(store.mpu_list("b", "", "j/x", "", 100).len(), 2);
        let after_first = store.mpu_list("b", "", &ks[0].0, &ks[0].1, 100);
        assert_eq!(after_first.len(), 1);
        assert_eq!(after_first[0].upload_id, ks[1].1);
        assert_eq!(store.mpu_list("b", "", "", "", 1).len(), 1);

        store.mpu_abort("b", "k", &a).await.unwrap();
        assert_eq!(
            upload_err(store.mpu_abort("b", "k", &a).await),
            UploadError::NoSuchUpload
        );
        late.set_etag("x".into());
        assert_eq!(upload_err(late.finish().await), UploadError::NoSuchUpload);
        assert!(matches!(
            store.put_part_stream("b", "k", &a, 3),
            Err(StoreError::Upload(UploadError::NoSuchUpload))
        ));
        assert_eq!(store.mpu_list("b", "", "", "", 100).len(), 2);
        store.mpu_abort("b", "k", &b).await.unwrap();
        store.mpu_abort("b", "j/x", &c).await.unwrap();
        assert!(internal_live_keys(&store).is_empty());
        store.shutdown().await;
        drop(store);
        // The late part's record is on disk; recovery sees it live, and the
        // start-up sweep drops it because its upload is gone.
        let (store, report) = Store::open(small_config(&path)).await.unwrap();
        assert_eq!(report.objects, 0);
        assert!(
            internal_live_keys(&store).is_empty(),
            "{:?}",
            internal_live_keys(&store)
        );
        assert!(store.mpu_list("b", "", "", "", 100).is_empty());
        while store.compact_once().await.unwrap().is_some() {}
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        assert!(internal_live_keys(&store).is_empty());
    });
}

// ---------------------------------------------------------------------------
// Issue 15: retried completions, DeleteBucket with uploads in progress
// ---------------------------------------------------------------------------

use percore_server::shard::msg::{Op, Reply, ShardError};
use percore_server::shard::Shard;
use std::rc::Rc;

fn e(n: u32, etag: &str) -> (u32, String) {
    (n, etag.to_string())
}

#[test]
fn retried_complete_answers_the_same_etag_until_the_key_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let id = store
            .mpu_create("b", "k", ObjectMeta::default())
            .await
            .unwrap();
        let p1 = data(1, PART_BYTES_MIN as usize);
        let p2 = data(2, 3000);
        let e1 = put_part(&store, "k", &id, 1, p1.clone()).await;
        let e2 = put_part(&store, "k", &id, 2, p2.clone()).await;
        let parts = [e(1, &e1), e(2, &e2)];
        let first = store.mpu_complete("b", "k", &id, &parts).await.unwrap();
        let whole: Vec<u8> = [p1, p2].concat();

        // The retry (an SDK after a timeout) answers as the first did.
        let again = store.mpu_complete("b", "k", &id, &parts).await.unwrap();
        assert_eq!(again.etag, first.etag);
        assert_eq!(again.size_bytes, first.size_bytes);
        // Another part list is not a retry of that completion.
        for other in [vec![e(1, &e1)], vec![e(1, &e1), e(3, &e2)]] {
            assert_eq!(
                upload_err(store.mpu_complete("b", "k", &id, &other).await),
                UploadError::NoSuchUpload
            );
        }
        // Abort and ListParts of a completed upload: NoSuchUpload (as S3),
        // and the object is untouched.
        assert_eq!(
            upload_err(store.mpu_abort("b", "k", &id).await),
            UploadError::NoSuchUpload
        );
        assert_eq!(
            upload_err(store.mpu_parts("b", "k", &id, 0, 10)),
            UploadError::NoSuchUpload
        );
        assert!(read_all(&store, "b", "k").await.unwrap() == whole);
        assert_eq!(
            store
                .mpu_complete("b", "k", &id, &parts)
                .await
                .unwrap()
                .etag,
            first.etag
        );

        // After a restart (nothing remembered in memory) the retry is
        // recognised from the index.
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let again = store.mpu_complete("b", "k", &id, &parts).await.unwrap();
        assert_eq!(again.etag, first.etag);
        assert_eq!(
            upload_err(store.mpu_complete("b", "k", &id, &[e(1, &e1)]).await),
            UploadError::NoSuchUpload
        );
        // Once the key is written again, the completion is over for good,
        // in memory and after a restart.
        store
            .put("b", "k", ObjectMeta::default(), data(5, 10))
            .await
            .unwrap();
        assert_eq!(
            upload_err(store.mpu_complete("b", "k", &id, &parts).await),
            UploadError::NoSuchUpload
        );
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        assert_eq!(
            upload_err(store.mpu_complete("b", "k", &id, &parts).await),
            UploadError::NoSuchUpload
        );

        // A completion overwritten by another completion of the same key.
        let id2 = store
            .mpu_create("b", "k", ObjectMeta::default())
            .await
            .unwrap();
        let f1 = put_part(&store, "k", &id2, 1, data(7, 100)).await;
        store
            .mpu_complete("b", "k", &id2, &[e(1, &f1)])
            .await
            .unwrap();
        let id3 = store
            .mpu_create("b", "k", ObjectMeta::default())
            .await
            .unwrap();
        let g1 = put_part(&store, "k", &id3, 1, data(8, 100)).await;
        store
            .mpu_complete("b", "k", &id3, &[e(1, &g1)])
            .await
            .unwrap();
        assert_eq!(
            upload_err(store.mpu_complete("b", "k", &id2, &[e(1, &f1)]).await),
            UploadError::NoSuchUpload
        );
        store
            .mpu_complete("b", "k", &id3, &[e(1, &g1)])
            .await
            .unwrap();
    });
}

#[test]
fn complete_or_abort_during_a_completion_waits_for_its_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let id = store
            .mpu_create("b", "k", ObjectMeta::default())
            .await
            .unwrap();
        let e1 = put_part(&store, "k", &id, 1, data(1, 40_000)).await;
        let parts = [e(1, &e1)];
        // The first completion is under way (waiting for its record to be
        // durable) when a retry and an abort arrive.
        let mut first = Box::pin(store.mpu_complete("b", "k", &id, &parts));
        assert!(futures::poll!(first.as_mut()).is_pending());
        let (first, retry, abort) = futures::join!(
            first,
            store.mpu_complete("b", "k", &id, &parts),
            store.mpu_abort("b", "k", &id)
        );
        let first = first.unwrap();
        assert_eq!(retry.unwrap().etag, first.etag);
        // The upload was completed, not aborted.
        assert_eq!(upload_err(abort), UploadError::NoSuchUpload);
        assert_eq!(store.head("b", "k").unwrap().etag, first.etag);
        assert!(internal_live_keys(&store).is_empty());
    });
}

/// A started single-shard server core on `store`, its buckets published.
async fn shard_on(store: &Store) -> Rc<Shard> {
    let shard = Shard::new(0, 1, 7, store.clone());
    shard.publish_buckets().await;
    assert!(matches!(shard.execute(Op::Start).await, Reply::Ok));
    shard
}

async fn create_bucket(shard: &Rc<Shard>, name: &str) {
    let name = name.to_string();
    assert!(matches!(
        shard.execute(Op::BucketCreate { name, owner: None }).await,
        Reply::Created(true)
    ));
}

async fn delete_bucket(shard: &Rc<Shard>, name: &str) -> Reply {
    let name = name.to_string();
    shard.execute(Op::BucketDelete { name }).await
}

async fn create_upload(shard: &Rc<Shard>, bucket: &str, key: &str) -> String {
    let op = Op::MpuCreate {
        bucket: bucket.into(),
        key: key.into(),
        meta: ObjectMeta::default(),
        checksum: None,
    };
    match shard.execute(op).await {
        Reply::Upload(id) => id,
        other => panic!("CreateMultipartUpload: {other:?}"),
    }
}

async fn uploads(shard: &Rc<Shard>, bucket: &str) -> Vec<String> {
    let op = Op::MpuList {
        bucket: bucket.into(),
        prefix: String::new(),
        key_marker: String::new(),
        upload_id_marker: String::new(),
        limit: 1000,
    };
    match shard.execute(op).await {
        Reply::Uploads(v) => v.into_iter().map(|u| u.upload_id).collect(),
        other => panic!("ListMultipartUploads: {other:?}"),
    }
}

fn no_such_upload(reply: Reply) {
    assert!(
        matches!(
            reply,
            Reply::Err(ShardError::Upload(UploadError::NoSuchUpload))
        ),
        "{reply:?}"
    );
}

#[test]
fn delete_bucket_discards_its_uploads_and_a_new_bucket_of_that_name_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let shard = shard_on(&store).await;
        create_bucket(&shard, "b").await;
        let a = create_upload(&shard, "b", "k").await;
        let b = create_upload(&shard, "b", "dir/x").await;
        let ea = put_part(&store, "k", &a, 1, data(1, 30_000)).await;
        put_part(&store, "dir/x", &b, 1, data(2, 30_000)).await;

        // An object keeps the bucket; its uploads stay too.
        store
            .put("b", "obj", ObjectMeta::default(), data(3, 10))
            .await
            .unwrap();
        assert!(matches!(
            delete_bucket(&shard, "b").await,
            Reply::Err(ShardError::BucketNotEmpty)
        ));
        assert_eq!(uploads(&shard, "b").await.len(), 2);
        store.delete("b", "obj").await.unwrap();

        // Only uploads: the bucket goes, and its uploads with it.
        let reply = delete_bucket(&shard, "b").await;
        assert!(matches!(reply, Reply::Ok), "{reply:?}");
        assert!(!shard.bucket_exists("b"));
        assert!(internal_live_keys(&store).is_empty());

        create_bucket(&shard, "b").await;
        assert!(uploads(&shard, "b").await.is_empty());
        no_such_upload(
            shard
                .execute(Op::MpuParts {
                    bucket: "b".into(),
                    key: "k".into(),
                    upload_id: a.clone(),
                    after: 0,
                    limit: 10,
                })
                .await,
        );
        no_such_upload(
            shard
                .execute(Op::PutOpen {
                    bucket: "b".into(),
                    key: "k".into(),
                    meta: ObjectMeta::default(),
                    part: Some((a.clone(), 2)),
                    condition: None,
                })
                .await,
        );
        no_such_upload(
            shard
                .execute(Op::MpuComplete {
                    bucket: "b".into(),
                    key: "k".into(),
                    upload_id: a.clone(),
                    parts: vec![e(1, &ea)],
                    checks: Box::default(),
                })
                .await,
        );
        assert!(store.head("b", "k").is_none());

        // Nothing comes back after a restart.
        store.shutdown().await;
        drop((shard, store));
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let shard = shard_on(&store).await;
        assert!(shard.bucket_exists("b"));
        assert!(uploads(&shard, "b").await.is_empty());
        assert!(internal_live_keys(&store).is_empty());
    });
}

#[test]
fn delete_bucket_refuses_while_an_upload_is_being_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        let shard = shard_on(&store).await;
        create_bucket(&shard, "b").await;
        // CreateMultipartUpload waits for its record to be durable...
        let mut create = Box::pin(create_upload(&shard, "b", "k"));
        assert!(futures::poll!(create.as_mut()).is_pending());
        // ...and counts as a write in progress meanwhile, like a PUT.
        assert!(matches!(
            delete_bucket(&shard, "b").await,
            Reply::Err(ShardError::BucketNotEmpty)
        ));
        let id = create.await;
        assert_eq!(uploads(&shard, "b").await, vec![id]);
        assert!(matches!(delete_bucket(&shard, "b").await, Reply::Ok));
        create_bucket(&shard, "b").await;
        assert!(uploads(&shard, "b").await.is_empty());
        assert!(internal_live_keys(&store).is_empty());

        // A part being uploaded is a write in progress too (uploads no
        // longer count as objects, so this is what keeps it from racing).
        let id = create_upload(&shard, "b", "k").await;
        let session = match shard
            .execute(Op::PutOpen {
                bucket: "b".into(),
                key: "k".into(),
                meta: ObjectMeta::default(),
                part: Some((id.clone(), 1)),
                condition: None,
            })
            .await
        {
            Reply::Session(s) => s,
            other => panic!("UploadPart: {other:?}"),
        };
        assert!(matches!(
            delete_bucket(&shard, "b").await,
            Reply::Err(ShardError::BucketNotEmpty)
        ));
        assert!(matches!(
            shard
                .execute(Op::PutData {
                    session,
                    data: data(4, 1000)
                })
                .await,
            Reply::Ok
        ));
        let finished = shard
            .execute(Op::PutFinish {
                session,
                etag: md5_hex(&data(4, 1000)),
                headers: Vec::new(),
            })
            .await;
        assert!(matches!(finished, Reply::Put(..)), "{finished:?}");
        assert!(matches!(delete_bucket(&shard, "b").await, Reply::Ok));
        create_bucket(&shard, "b").await;
        assert!(internal_live_keys(&store).is_empty());

        // A request dropped half-way does not leave its count behind (the
        // bucket could never be deleted again).
        let mut create = Box::pin(create_upload(&shard, "b", "k"));
        assert!(futures::poll!(create.as_mut()).is_pending());
        drop(create);
        let reply = delete_bucket(&shard, "b").await;
        assert!(matches!(reply, Reply::Ok), "{reply:?}");
    });
}

#[test]
fn uploads_left_by_a_bucket_deletion_cut_short_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        store.bucket_create("b").await.unwrap();
        let id = store
            .mpu_create("b", "k", ObjectMeta::default())
            .await
            .unwrap();
        put_part(&store, "k", &id, 1, data(1, 30_000)).await;
        // The bucket's record is deleted, then a crash before its uploads
        // are dropped.
        store.bucket_delete("b").await.unwrap();
        store.shutdown().await;
        drop(store);
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        assert!(!internal_live_keys(&store).is_empty());
        // Dropped at start-up, before anything is served.
        let shard = shard_on(&store).await;
        assert!(internal_live_keys(&store).is_empty());

        // Leftovers in a bucket that does not exist (a purge that failed):
        // dropped before a bucket of that name becomes visible.
        assert!(!shard.bucket_exists("b"));
        let id = store
            .mpu_create("b", "k2", ObjectMeta::default())
            .await
            .unwrap();
        put_part(&store, "k2", &id, 1, data(2, 30_000)).await;
        create_bucket(&shard, "b").await;
        assert!(uploads(&shard, "b").await.is_empty());
        assert!(internal_live_keys(&store).is_empty());
        store.shutdown().await;
        drop((shard, store));
        let (store, _) = Store::open(small_config(&path)).await.unwrap();
        assert!(internal_live_keys(&store).is_empty());
    });
}
