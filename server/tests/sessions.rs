//! Cross-shard sessions against a stalled owner, in process: two shards on
//! two executor threads, wired like the server wires them, with a short
//! cross-shard call timeout. The owner shard (1) is stalled by blocking its
//! thread (as a long synchronous stretch or an overloaded core would), so
//! calls from shard 0 time out while their messages wait in the channel, and
//! the owner runs them late.
//!
//! What must hold afterwards: every session the late opens created is
//! closed again, a close that arrived while a chunk operation held its
//! session takes effect, idle sessions expire, the bucket can be deleted,
//! the PUT's segments can be compacted, and forwarded GET/PUT work.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::LocalExecutorBuilder;
use percore_server::shard::msg::{Op, Reply, ShardError};
use percore_server::shard::object::{ObjectSink, ObjectSource};
use percore_server::shard::{wire, Shard};
use percore_server::store::record::ObjectMeta;
use percore_server::store::Store;

mod common;
use common::small_config;

const OWNER: usize = 1;
const SEED: u64 = 0x5eed;

type Job = Box<dyn FnOnce(Rc<Shard>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// A handle, used on shard 0, to run work on the owner shard's executor.
#[derive(Clone)]
struct Owner {
    jobs: Arc<Mutex<VecDeque<Job>>>,
    stalled: Arc<AtomicBool>,
}

impl Owner {
    /// Runs `f` on the owner's executor and waits (on shard 0's executor,
    /// without blocking it) for its result.
    async fn run<T, F, Fut>(&self, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let (tx, rx) = mpsc::channel();
        self.jobs.lock().unwrap().push_back(Box::new(move |shard| {
            Box::pin(async move {
                let _ = tx.send(f(shard).await);
            })
        }));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match rx.try_recv() {
                Ok(v) => return v,
                Err(mpsc::TryRecvError::Disconnected) => panic!("the owner's job failed"),
                Err(mpsc::TryRecvError::Empty) => {}
            }
            assert!(Instant::now() < deadline, "the owner did not answer");
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Blocks the owner's thread for `d` and returns once the stall began:
    /// nothing runs there meanwhile (no message is received, no task
    /// polled).
    async fn stall(&self, d: Duration) {
        let stalled = self.stalled.clone();
        self.jobs.lock().unwrap().push_back(Box::new(move |_| {
            Box::pin(async move {
                stalled.store(true, Ordering::SeqCst);
                std::thread::sleep(d);
                stalled.store(false, Ordering::SeqCst);
            })
        }));
        while !self.stalled.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn meta() -> ObjectMeta {
    ObjectMeta {
        content_type: "application/octet-stream".into(),
        ..Default::default()
    }
}

/// Two shards; `scenario` runs on shard 0 with a handle to the owner.
/// `owner_session_idle`: the owner's idle-session timeout.
fn two_shards<F, Fut>(owner_session_idle: Duration, scenario: F)
where
    F: FnOnce(Rc<Shard>, Owner) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let mut wirings = wire(2);
    let w1 = wirings.pop().unwrap();
    let w0 = wirings.pop().unwrap();
    let owner = Owner {
        jobs: Arc::new(Mutex::new(VecDeque::new())),
        stalled: Arc::new(AtomicBool::new(false)),
    };
    let quit = Arc::new(AtomicBool::new(false));
    fn store_config(id: u32, dir: &std::path::Path) -> percore_server::store::StoreConfig {
        let mut cfg = small_config(dir);
        cfg.shard_id = id;
        cfg.compaction_interval_ms = 0;
        cfg
    }
    let (d0, d1) = (dir.path().join("0"), dir.path().join("1"));
    std::fs::create_dir_all(&d0).unwrap();
    std::fs::create_dir_all(&d1).unwrap();
    let (jobs, q1) = (owner.jobs.clone(), quit.clone());
    let t1 = LocalExecutorBuilder::default()
        .name("owner")
        .spawn(move || async move {
            let (store, _) = Store::open(store_config(1, &d1)).await.unwrap();
            let shard = Shard::new(OWNER, 2, SEED, store.clone());
            shard.set_timeouts(Duration::from_secs(60), owner_session_idle);
            shard.connect(w1).await;
            shard.wait_started().await;
            while !q1.load(Ordering::SeqCst) {
                let job = jobs.lock().unwrap().pop_front();
                match job {
                    Some(job) => job(shard.clone()).await,
                    None => glommio::timer::sleep(Duration::from_millis(2)).await,
                }
            }
            store.shutdown().await;
        })
        .unwrap();
    let q0 = quit.clone();
    let t0 = LocalExecutorBuilder::default()
        .name("caller")
        .spawn(move || async move {
            let (store, _) = Store::open(store_config(0, &d0)).await.unwrap();
            let shard = Shard::new(0, 2, SEED, store.clone());
            shard.connect(w0).await;
            shard.publish_buckets().await;
            shard.call_all(|| Op::Start).await;
            scenario(shard.clone(), owner).await;
            q0.store(true, Ordering::SeqCst);
            store.shutdown().await;
        })
        .unwrap();
    let r0 = t0.join();
    quit.store(true, Ordering::SeqCst);
    let r1 = t1.join();
    r0.expect("caller shard");
    r1.expect("owner shard");
}

/// Keys of `bucket` owned by the owner shard.
fn owned_keys(shard: &Shard, bucket: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| shard.owner_of(bucket, k) == OWNER)
        .take(n)
        .collect()
}

async fn create_bucket(shard: &Rc<Shard>, name: &str) {
    match shard
        .call(
            0,
            Op::BucketCreate {
                name: name.into(),
                owner: None,
            },
        )
        .await
    {
        Reply::Created(true) => {}
        other => panic!("create bucket {name}: {other:?}"),
    }
}

async fn delete_bucket(shard: &Rc<Shard>, name: &str) -> Reply {
    shard.call(0, Op::BucketDelete { name: name.into() }).await
}

/// A forwarded PUT of `data`, in pieces.
async fn put(shard: &Rc<Shard>, bucket: &str, key: &str, data: &[u8]) {
    let mut sink = ObjectSink::open(shard, bucket, key, meta()).await.unwrap();
    for piece in data.chunks(256 << 10) {
        sink.write(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    sink.finish("etag".into()).await.unwrap();
}

async fn get(shard: &Rc<Shard>, bucket: &str, key: &str) -> Vec<u8> {
    let (mut src, meta) = ObjectSource::open(shard, bucket, key).await.unwrap();
    let mut out = Vec::new();
    while (out.len() as u64) < meta.size_bytes {
        let c = src.read(out.len() as u64, 100_000).await.unwrap();
        out.extend_from_slice(&c);
    }
    out
}

/// The owner's sessions, counted on the owner.
async fn owner_sessions(owner: &Owner) -> usize {
    owner.run(|s| async move { s.sessions_open() }).await
}

/// Waits for the owner's stall to end and for it to have run what queued
/// up meanwhile (a round trip behind it, then a pause for work that the
/// queued operations started), then up to `within` for it to hold no
/// sessions.
async fn owner_sessions_drain(owner: &Owner, within: Duration) -> usize {
    while owner.stalled.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    owner
        .run(|s| async move {
            // Let the receive loop take in and start everything queued.
            glommio::timer::sleep(Duration::from_millis(300)).await;
            drop(s);
        })
        .await;
    let deadline = Instant::now() + within;
    loop {
        let n = owner_sessions(owner).await;
        if n == 0 || Instant::now() > deadline {
            return n;
        }
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

/// On the owner: rotates the active segment (writes until it seals) and
/// tries to compact every sealed segment; returns the refusals because a
/// PUT in progress pins the segment.
async fn pinned_refusals(owner: &Owner, bucket: &str) -> Vec<String> {
    let bucket = bucket.to_string();
    owner
        .run(move |s| async move {
            let before: Vec<u64> = s.store().segment_table().iter().map(|t| t.0).collect();
            let mut i = 0;
            loop {
                let sealed_all = s
                    .store()
                    .segment_table()
                    .iter()
                    .filter(|t| before.contains(&t.0))
                    .all(|t| t.3);
                if sealed_all {
                    break;
                }
                s.store()
                    .put(
                        &bucket,
                        &format!("filler-{i}"),
                        meta(),
                        Bytes::from(vec![7u8; 60_000]),
                    )
                    .await
                    .unwrap();
                i += 1;
            }
            let mut refusals = Vec::new();
            for (id, _, _, sealed) in s.store().segment_table() {
                if !sealed || !before.contains(&id) {
                    continue;
                }
                if let Err(e) = s.store().compact_segment(id).await {
                    let e = e.to_string();
                    if e.contains("PUT in progress") {
                        refusals.push(format!("segment {id}: {e}"));
                    }
                }
            }
            for j in 0..i {
                s.store()
                    .delete(&bucket, &format!("filler-{j}"))
                    .await
                    .unwrap();
            }
            refusals
        })
        .await
}

async fn delete_all(shard: &Rc<Shard>, bucket: &str, keys: &[String]) {
    for k in keys {
        let owner = shard.owner_of(bucket, k);
        shard
            .call(
                owner,
                Op::Delete {
                    pick: percore_server::store::versions::Pick::Current,
                    bucket: bucket.into(),
                    key: k.clone(),
                },
            )
            .await;
    }
}

fn counter(shard: &Shard, name: &str) -> u64 {
    let snap = shard.metrics_snapshot();
    snap.counters
        .iter()
        .chain(snap.gauges.iter())
        .find(|c| c.0 == name)
        .map_or(0, |c| c.2)
}

/// Item 7 of issue 15: ReadOpen/PutOpen replies that come after the caller's
/// call timed out find no waiter; the sessions they opened must be closed
/// (they held readers, PUT writers and the bucket's in-flight count: 409 on
/// DeleteBucket forever, and 4096 of them make every forwarded GET/PUT 503).
#[test]
fn late_open_replies_after_a_call_timeout_close_their_sessions() {
    two_shards(Duration::from_secs(300), |shard, owner| async move {
        create_bucket(&shard, "late").await;
        let keys = owned_keys(&shard, "late", 21);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        put(&shard, "late", &keys[0], &data).await;
        shard.set_timeouts(Duration::from_millis(200), Duration::from_secs(300));

        owner.stall(Duration::from_millis(1500)).await;
        let started = Instant::now();
        let reads = (0..20).map(|_| ObjectSource::open(&shard, "late", &keys[0]));
        let writes = keys[1..]
            .iter()
            .map(|k| ObjectSink::open(&shard, "late", k, meta()));
        let (reads, writes) = futures::future::join(
            futures::future::join_all(reads),
            futures::future::join_all(writes),
        )
        .await;
        assert!(
            started.elapsed() < Duration::from_millis(1200),
            "calls did not time out"
        );
        for r in &reads {
            assert_eq!(r.as_ref().err(), Some(&ShardError::Busy));
        }
        for w in &writes {
            assert_eq!(w.as_ref().err(), Some(&ShardError::Busy));
        }
        drop((reads, writes));

        // The owner wakes, runs the 40 opens and replies to nobody.
        let left = owner_sessions_drain(&owner, Duration::from_secs(5)).await;
        assert_eq!(left, 0, "sessions left open on the owner by late opens");
        assert_eq!(
            counter(&shard, "percore_cross_shard_orphaned_sessions_closed_total"),
            40
        );
        assert_eq!(counter(&shard, "percore_cross_shard_calls_pending"), 0);

        // Forwarded GET and PUT work; the bucket can be deleted once empty.
        shard.set_timeouts(Duration::from_secs(60), Duration::from_secs(300));
        assert!(get(&shard, "late", &keys[0]).await == data);
        put(&shard, "late", &keys[1], b"after").await;
        delete_all(&shard, "late", &keys).await;
        match delete_bucket(&shard, "late").await {
            Reply::Ok => {}
            other => panic!("DeleteBucket after the stall: {other:?}"),
        }
    });
}

/// Item 7: a ReadChunk/PutData that times out on the caller is still queued
/// on the owner; the caller's close (sent when it drops the source/sink)
/// arrives while that operation holds the session and must not be lost.
#[test]
fn a_close_that_arrives_during_a_chunk_op_takes_effect_when_it_ends() {
    two_shards(Duration::from_secs(300), |shard, owner| async move {
        create_bucket(&shard, "busy").await;
        let keys = owned_keys(&shard, "busy", 2);
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        put(&shard, "busy", &keys[0], &data).await;

        let (mut src, _) = ObjectSource::open(&shard, "busy", &keys[0]).await.unwrap();
        let mut sink = ObjectSink::open(&shard, "busy", &keys[1], meta())
            .await
            .unwrap();
        sink.write(Bytes::from(vec![1u8; 1 << 20])).await.unwrap();
        assert_eq!(owner_sessions(&owner).await, 2);

        shard.set_timeouts(Duration::from_millis(200), Duration::from_secs(300));
        owner.stall(Duration::from_millis(1000)).await;
        let (r, w) = futures::future::join(
            src.read(0, 1 << 20),
            sink.write(Bytes::from(vec![2u8; 2 << 20])),
        )
        .await;
        assert_eq!(r.err(), Some(ShardError::Busy));
        assert_eq!(w.err(), Some(ShardError::Busy));
        // What the front doors do after an error: drop them (close/abort).
        drop(src);
        drop(sink);

        let left = owner_sessions_drain(&owner, Duration::from_secs(5)).await;
        assert_eq!(left, 0, "a close that raced a chunk operation was lost");
        let refusals = pinned_refusals(&owner, "busy").await;
        assert!(refusals.is_empty(), "segments still pinned: {refusals:?}");

        shard.set_timeouts(Duration::from_secs(60), Duration::from_secs(300));
        assert!(get(&shard, "busy", &keys[0]).await == data);
        delete_all(&shard, "busy", &keys).await;
        match delete_bucket(&shard, "busy").await {
            Reply::Ok => {}
            other => panic!("DeleteBucket: {other:?}"),
        }
    });
}

/// Item 7: a session whose caller went away without closing it (here:
/// forgotten, so no close is ever sent) is closed after the owner's idle
/// timeout, releasing its PUT's pins and the bucket; a session in use is
/// not.
#[test]
fn idle_sessions_expire_and_release_their_put() {
    two_shards(Duration::from_millis(400), |shard, owner| async move {
        create_bucket(&shard, "idle").await;
        let keys = owned_keys(&shard, "idle", 2);
        let data: Vec<u8> = (0..1_500_000u32).map(|i| (i % 253) as u8).collect();
        put(&shard, "idle", &keys[0], &data).await;

        let (src, _) = ObjectSource::open(&shard, "idle", &keys[0]).await.unwrap();
        let mut sink = ObjectSink::open(&shard, "idle", &keys[1], meta())
            .await
            .unwrap();
        sink.write(Bytes::from(vec![1u8; 1 << 20])).await.unwrap();
        std::mem::forget(src);
        std::mem::forget(sink);
        assert_eq!(owner_sessions(&owner).await, 2);

        // A reader that keeps using its session outlives the timeout.
        let (mut busy, meta) = ObjectSource::open(&shard, "idle", &keys[0]).await.unwrap();
        for i in 0..15u64 {
            let off = (i * 100_000) % meta.size_bytes;
            let c = busy
                .read(off, 1000)
                .await
                .expect("a session in use expired");
            assert_eq!(&c[..], &data[off as usize..off as usize + 1000]);
            glommio::timer::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            owner_sessions(&owner).await,
            1,
            "the forgotten sessions were not expired"
        );
        drop(busy);
        assert_eq!(
            owner_sessions_drain(&owner, Duration::from_secs(2)).await,
            0
        );
        let expired = owner
            .run(|s| async move {
                s.metrics_snapshot()
                    .counters
                    .iter()
                    .find(|c| c.0 == "percore_cross_shard_sessions_expired_total")
                    .map_or(0, |c| c.2)
            })
            .await;
        assert_eq!(expired, 2);
        let refusals = pinned_refusals(&owner, "idle").await;
        assert!(refusals.is_empty(), "segments still pinned: {refusals:?}");
        delete_all(&shard, "idle", &keys).await;
        match delete_bucket(&shard, "idle").await {
            Reply::Ok => {}
            other => panic!("DeleteBucket: {other:?}"),
        }
    });
}

/// A call whose caller goes away (its future dropped: a cancelled request)
/// before the reply must not leave its reply slot behind, nor the session
/// the late reply opened.
#[test]
fn a_cancelled_forwarded_open_leaves_no_session_or_pending_call() {
    two_shards(Duration::from_secs(300), |shard, owner| async move {
        create_bucket(&shard, "cancel").await;
        let keys = owned_keys(&shard, "cancel", 11);
        put(&shard, "cancel", &keys[0], b"hello").await;

        owner.stall(Duration::from_millis(800)).await;
        for k in &keys[1..] {
            let open = Box::pin(ObjectSink::open(&shard, "cancel", k, meta()));
            let r = futures::future::select(
                open,
                Box::pin(glommio::timer::sleep(Duration::from_millis(20))),
            )
            .await;
            assert!(matches!(r, futures::future::Either::Right(_)));
        }
        let open = Box::pin(ObjectSource::open(&shard, "cancel", &keys[0]));
        let r = futures::future::select(
            open,
            Box::pin(glommio::timer::sleep(Duration::from_millis(20))),
        )
        .await;
        assert!(matches!(r, futures::future::Either::Right(_)));
        drop(r);

        assert_eq!(
            owner_sessions_drain(&owner, Duration::from_secs(5)).await,
            0
        );
        assert_eq!(counter(&shard, "percore_cross_shard_calls_pending"), 0);
        delete_all(&shard, "cancel", &keys).await;
        match delete_bucket(&shard, "cancel").await {
            Reply::Ok => {}
            other => panic!("DeleteBucket: {other:?}"),
        }
    });
}

/// The call timeout covers queueing too: with the owner stalled and its
/// channel full (1024 messages), further calls must still time out on time
/// instead of waiting for room until the owner wakes.
#[test]
fn calls_to_a_stalled_owner_time_out_even_when_its_channel_is_full() {
    two_shards(Duration::from_secs(300), |shard, owner| async move {
        create_bucket(&shard, "full").await;
        let key = owned_keys(&shard, "full", 1).remove(0);
        shard.set_timeouts(Duration::from_millis(300), Duration::from_secs(300));
        owner.stall(Duration::from_secs(4)).await;
        let started = Instant::now();
        let calls = (0..1200).map(|_| {
            shard.call(
                OWNER,
                Op::Head {
                    bucket: "full".into(),
                    key: key.clone(),
                },
            )
        });
        let replies = futures::future::join_all(calls).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "calls waited {took:?} for a stalled owner (timeout 300 ms)"
        );
        assert!(replies
            .iter()
            .all(|r| matches!(r, Reply::Err(ShardError::Busy))));
        // Wait the stall out, then the owner answers again.
        glommio::timer::sleep(Duration::from_secs(4)).await;
        shard.set_timeouts(Duration::from_secs(60), Duration::from_secs(300));
        assert!(matches!(
            shard
                .call(
                    OWNER,
                    Op::Head {
                        bucket: "full".into(),
                        key
                    }
                )
                .await,
            Reply::Head(None)
        ));
        assert_eq!(counter(&shard, "percore_cross_shard_calls_pending"), 0);
    });
}

/// A close must reach the owner even when its channel was full when the
/// close was sent (the call timeout covers queueing for ordinary calls, so
/// a close that could not be queued in time would otherwise be dropped and
/// its session left open).
#[test]
fn a_close_sent_while_the_owners_channel_is_full_is_still_delivered() {
    two_shards(Duration::from_secs(300), |shard, owner| async move {
        create_bucket(&shard, "fullclose").await;
        let key = owned_keys(&shard, "fullclose", 1).remove(0);
        put(&shard, "fullclose", &key, b"data").await;
        let (src, _) = ObjectSource::open(&shard, "fullclose", &key).await.unwrap();
        assert_eq!(owner_sessions(&owner).await, 1);
        shard.set_timeouts(Duration::from_millis(300), Duration::from_secs(300));
        owner.stall(Duration::from_secs(2)).await;
        let calls = (0..1100).map(|_| {
            shard.call(
                OWNER,
                Op::Head {
                    bucket: "fullclose".into(),
                    key: key.clone(),
                },
            )
        });
        let fill = futures::future::join_all(calls);
        // The close is queued behind a full channel while the Heads wait.
        let close = async {
            glommio::timer::sleep(Duration::from_millis(50)).await;
            drop(src);
            glommio::timer::sleep(Duration::from_millis(600)).await;
        };
        futures::future::join(fill, close).await;
        assert_eq!(
            owner_sessions_drain(&owner, Duration::from_secs(5)).await,
            0,
            "the close was dropped"
        );
    });
}

/// A multipart completion run on the shard itself executes in its caller's
/// future; if the caller goes away mid-way (a dropped request), the bucket's
/// in-flight PUT count must not stay raised (DeleteBucket would answer
/// BucketNotEmpty forever).
#[test]
fn a_cancelled_local_multipart_completion_does_not_pin_the_bucket() {
    use futures::FutureExt;
    two_shards(Duration::from_secs(300), |shard, _owner| async move {
        create_bucket(&shard, "mpu").await;
        let key = (0..)
            .map(|i| format!("m{i}"))
            .find(|k| shard.owner_of("mpu", k) == 0)
            .unwrap();
        let upload_id = match shard
            .call(
                0,
                Op::MpuCreate {
                    bucket: "mpu".into(),
                    key: key.clone(),
                    meta: meta(),
                    checksum: None,
                },
            )
            .await
        {
            Reply::Upload(id) => id,
            other => panic!("{other:?}"),
        };
        let etag = "0123456789abcdef0123456789abcdef".to_string();
        let mut part = ObjectSink::open_part(
            &shard,
            "mpu",
            &key,
            meta(),
            Some((upload_id.clone(), 1)),
            None,
        )
        .await
        .unwrap();
        part.write(Bytes::from(vec![5u8; 100_000])).await.unwrap();
        part.finish(etag.clone()).await.unwrap();
        // Polled once (it starts, then waits for the disk), then dropped.
        let complete = shard.call(
            0,
            Op::MpuComplete {
                bucket: "mpu".into(),
                key: key.clone(),
                upload_id: upload_id.clone(),
                parts: vec![(1, etag)],
                checks: Box::default(),
            },
        );
        assert!(
            complete.now_or_never().is_none(),
            "completed without waiting"
        );
        glommio::timer::sleep(Duration::from_millis(200)).await;
        shard
            .call(
                0,
                Op::MpuAbort {
                    bucket: "mpu".into(),
                    key: key.clone(),
                    upload_id,
                },
            )
            .await;
        delete_all(&shard, "mpu", &[key]).await;
        match delete_bucket(&shard, "mpu").await {
            Reply::Ok => {}
            other => panic!("DeleteBucket after a cancelled completion: {other:?}"),
        }
    });
}
