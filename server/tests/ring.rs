//! The per-shard data ring on real files and real sockets.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use percore_server::ring::pool::BufferPool;
use percore_server::ring::{DataRing, RingConfig, SendKind};

mod common;
use common::run;

#[test]
fn pool_is_bounded_and_buffers_come_back() {
    run(|| async {
        let pool = BufferPool::new(64 * 1024, 4).unwrap();
        let held: Vec<_> = (0..4).map(|_| pool.try_acquire().unwrap()).collect();
        assert!(
            pool.try_acquire().is_none(),
            "a fifth buffer from a pool of four"
        );
        assert_eq!(pool.exhausted_total(), 1);
        // A waiter is served as soon as a buffer returns.
        let p = pool.clone();
        let waiter = glommio::spawn_local(async move { p.acquire().await.index() });
        glommio::timer::sleep(Duration::from_millis(5)).await;
        drop(held);
        assert_eq!(pool.free_count(), 4);
        assert!(waiter.await < 4);
        assert_eq!(pool.free_count(), 4, "the waiter's buffer came back");
    });
}

#[test]
fn completions_wake_a_parked_executor() {
    run(|| async {
        let ring = DataRing::new(RingConfig::default(), None).unwrap();
        // Nothing else runs: the executor parks until the ring's eventfd fires.
        for _ in 0..20 {
            let started = Instant::now();
            let res = ring.timeout(Duration::from_millis(20)).await;
            let waited = started.elapsed();
            assert_eq!(res, -libc::ETIME);
            assert!(
                waited >= Duration::from_millis(19),
                "woke too early: {waited:?}"
            );
            assert!(waited < Duration::from_secs(2), "not woken: {waited:?}");
        }
        assert!(ring.stats().eventfd_waits >= 20);
        // Many operations queued in one turn go out in few submit calls.
        let before = ring.stats().submit_calls;
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let ring = ring.clone();
                glommio::spawn_local(async move { ring.nop().await })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await, 0);
        }
        let calls = ring.stats().submit_calls - before;
        assert!(calls <= 8, "200 NOPs took {calls} submit calls");
    });
}

#[test]
fn sqpoll_ring_completes_reads_and_wakes() {
    run(|| async {
        let cfg = RingConfig {
            sqpoll_idle_ms: Some(10),
            sqpoll_cpu: Some(0),
            ..Default::default()
        };
        let ring = DataRing::new(cfg, None).unwrap();
        assert_eq!(ring.timeout(Duration::from_millis(30)).await, -libc::ETIME);
        // Past the poller's idle time it sleeps; submitting must wake it.
        glommio::timer::sleep(Duration::from_millis(50)).await;
        assert_eq!(ring.nop().await, 0);
    });
}

#[test]
fn read_fixed_from_an_o_direct_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let content: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &content).unwrap();
    run(move || async move {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let pool = BufferPool::new(256 * 1024, 8).unwrap();
        let ring = DataRing::new(RingConfig::default(), Some(pool.clone())).unwrap();
        for offset in [0u64, 4096, 512 * 1024, 768 * 1024] {
            let buf = pool.acquire().await;
            let (n, buf) = ring
                .read_fixed(file.as_raw_fd(), buf, offset, 256 * 1024)
                .await;
            assert_eq!(n.unwrap(), 256 * 1024);
            assert!(buf.as_slice() == &content[offset as usize..offset as usize + 256 * 1024]);
        }
        assert_eq!(pool.free_count(), 8);
    });
}

/// A storm of sends mixing SEND_ZC and plain sends, verified byte for byte
/// by the receiver. On loopback the kernel copies every SEND_ZC: the
/// counters must say so, and no buffer returns before its notification.
/// The first half always asks for SEND_ZC; the second follows the callers'
/// rule (no SEND_ZC on a socket whose SEND_ZC was copied).
#[test]
fn send_storm_zero_copy_and_plain_verified_byte_for_byte() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sizes: Vec<usize> = (0..300)
        .map(|i| [100, 4096, 20_000, 65_536, 200_000][i % 5])
        .collect();
    let expected: Vec<u8> = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| (0..n).map(move |j| ((i * 31 + j) % 253) as u8))
        .collect();
    let total = expected.len();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::with_capacity(total);
        let mut buf = vec![0u8; 1 << 16];
        while got.len() < total {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "sender closed early");
            got.extend_from_slice(&buf[..n]);
        }
        got
    });
    let sizes2 = sizes.clone();
    run(move || async move {
        let sock = TcpStream::connect(addr).unwrap();
        let pool = BufferPool::new(256 * 1024, 4).unwrap();
        let ring = DataRing::new(RingConfig::default(), Some(pool.clone())).unwrap();
        let fd = sock.as_raw_fd();
        // As the S3 and native senders do: SEND_ZC until the kernel reports
        // a copy, plain sends on this socket after that.
        let mut zc_allowed = true;
        let (mut copied, mut large_after_copy) = (0, 0);
        for (i, n) in sizes2.iter().copied().enumerate() {
            let forced = i < sizes2.len() / 2;
            let mut buf = pool.acquire().await;
            for (j, b) in buf.as_mut_capacity()[..n].iter_mut().enumerate() {
                *b = ((i * 31 + j) % 253) as u8;
            }
            buf.set_len(n);
            let mut at = 0;
            while at < n {
                let (res, b) = ring.send(fd, buf, at, n, forced || zc_allowed).await;
                buf = b;
                let (sent, kind) = res.unwrap();
                if n - at < 16 * 1024 {
                    assert_eq!(kind, SendKind::Plain);
                } else if forced || zc_allowed {
                    // Loopback never sends from user pages.
                    assert_eq!(
                        kind,
                        SendKind::Copied,
                        "loopback send reported as zero-copy"
                    );
                    zc_allowed = false;
                    copied += 1;
                } else {
                    assert_eq!(kind, SendKind::Plain, "SEND_ZC after the kernel copied");
                    large_after_copy += 1;
                }
                at += sent;
            }
        }
        let stats = ring.stats();
        assert!(copied >= 90, "the forced half made {copied} SEND_ZC sends");
        assert_eq!(stats.sends_copied, copied);
        assert!(
            large_after_copy > 0,
            "the test needs large sends after the first"
        );
        assert_eq!(stats.sends_zc_declined, large_after_copy);
        assert_eq!(stats.sends_zero_copy, 0);
        assert_eq!(pool.free_count(), 4, "a buffer is still out");
        assert_eq!(ring.in_flight(), 0);
        drop(sock);
    });
    let got = reader.join().unwrap();
    assert!(got == expected, "received bytes differ");
}

#[test]
fn store_writes_with_write_fixed_and_reads_with_read_fixed() {
    use bytes::Bytes;
    use percore_server::store::record::ObjectMeta;
    use percore_server::store::{Store, StoreConfig};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::new(0, path.clone());
        cfg.compaction_interval_ms = 0;
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        let pool = BufferPool::new((1 << 20) + 4096, 12).unwrap();
        let ring = DataRing::new(RingConfig::default(), Some(pool)).unwrap();
        store.attach_ring(ring.clone());
        let sizes = [
            0usize,
            1,
            4095,
            4097,
            70_000,
            (1 << 20) + 3,
            3 << 20,
            (5 << 20) + 12345,
        ];
        let body = |i: usize, n: usize| -> Bytes {
            Bytes::from(
                (0..n)
                    .map(|j| ((j * 7 + i * 13) % 251) as u8)
                    .collect::<Vec<u8>>(),
            )
        };
        // Concurrent PUTs: batches need several registered buffers at once.
        let puts = sizes.iter().enumerate().map(|(i, &n)| {
            let store = store.clone();
            async move {
                store
                    .put("b", &format!("k{i}"), ObjectMeta::default(), body(i, n))
                    .await
                    .unwrap();
            }
        });
        futures::future::join_all(puts).await;
        let stats = ring.stats();
        assert!(stats.writes_fixed > 0, "no WRITE_FIXED: {stats:?}");
        // Segment files are named by registered slots, not descriptors.
        assert!(ring.files_registered() >= 1);
        // Read back through READ_FIXED where it applies, then reopen without
        // the ring and read everything the ordinary way.
        for (i, &n) in sizes.iter().enumerate() {
            let mut r = store.open_read("b", &format!("k{i}")).await.unwrap();
            let mut got = Vec::new();
            while (got.len() as u64) < r.size_bytes() {
                let at = got.len() as u64;
                match r.read_fixed(&ring, at, 1 << 20).await {
                    Some(res) => {
                        let (buf, a, b) = res.unwrap();
                        got.extend_from_slice(&buf.as_slice()[a..b]);
                    }
                    None => got.extend_from_slice(&r.read(at, 1 << 20).await.unwrap()),
                }
            }
            assert!(got == body(i, n)[..], "k{i} differs");
        }
        assert!(ring.stats().reads_fixed > 0);
        assert_eq!(
            ring.pool().unwrap().free_count(),
            12,
            "every buffer came back"
        );
        store.shutdown().await;
        drop(store);
        // Every slot is freed with its file: none outlives the store.
        assert_eq!(ring.files_registered(), 0);
        let (store, _) = Store::open(cfg).await.unwrap();
        for (i, &n) in sizes.iter().enumerate() {
            let got = common::read_all(&store, "b", &format!("k{i}"))
                .await
                .unwrap();
            assert!(got == body(i, n)[..], "k{i} differs after reopen");
        }
    });
}

#[test]
fn writes_do_not_wait_for_registered_buffers_held_by_reads() {
    use bytes::Bytes;
    use percore_server::store::record::ObjectMeta;
    use percore_server::store::{Store, StoreConfig};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::new(0, path.clone());
        cfg.compaction_interval_ms = 0;
        let (store, _) = Store::open(cfg.clone()).await.unwrap();
        let pool = BufferPool::new((1 << 20) + 4096, 3).unwrap();
        let ring = DataRing::new(RingConfig::default(), Some(pool)).unwrap();
        store.attach_ring(ring.clone());
        // Slow readers hold every registered buffer but one.
        let held: Vec<_> = (0..2)
            .map(|_| ring.pool().unwrap().try_acquire().unwrap())
            .collect();
        let body = Bytes::from(vec![7u8; (3 << 20) + 5]);
        let put = store.put("b", "k", ObjectMeta::default(), body.clone());
        let done = futures::future::select(
            Box::pin(put),
            Box::pin(glommio::timer::sleep(Duration::from_secs(20))),
        )
        .await;
        match done {
            futures::future::Either::Left((r, _)) => {
                r.unwrap();
            }
            futures::future::Either::Right(_) => panic!("a PUT waited on buffers held by reads"),
        }
        drop(held);
        assert!(common::read_all(&store, "b", "k").await.unwrap() == body[..]);
        assert_eq!(ring.pool().unwrap().free_count(), 3);
    });
}
