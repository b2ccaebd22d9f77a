//! Multipart uploads in the engine: completion without copying, abort,
//! validation, compaction of parts and of completed objects, reopen.

use bytes::Bytes;
use percore_server::store::mpu::{UploadError, PART_BYTES_MIN};
use percore_server::store::record::ObjectMeta;
use percore_server::store::{debug_index, Store, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{read_all, run, small_config};

fn data(seed: u64, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill(&mut v[..]);
    Bytes::from(v)
}

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
        assert_eq!(
            reader.meta.headers,
            vec![("x-amz-meta-a".to_string(), "1".to_string())]
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
