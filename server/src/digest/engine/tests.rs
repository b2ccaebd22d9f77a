use ::md5::Digest as _;
use bytes::Bytes;

use super::*;

fn bytes_of(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Uploads interleaved as a shard interleaves them: each appends what it
/// received, in pieces of any size, and asks for its digest at its end.
#[test]
fn interleaved_uploads_get_their_own_digests() {
    let engine = Md5Engine::new();
    let uploads: Vec<Vec<u8>> = (0..24u64)
        .map(|u| bytes_of(u, (u as usize * 37_777) % 900_000))
        .collect();
    let jobs: Vec<Md5Job> = (0..uploads.len()).map(|_| engine.job()).collect();
    let mut at = vec![0usize; uploads.len()];
    let mut digests = vec![None; uploads.len()];
    let mut piece = 1usize;
    while digests.iter().any(Option::is_none) {
        for u in 0..uploads.len() {
            if digests[u].is_some() {
                continue;
            }
            if at[u] == uploads[u].len() {
                digests[u] = Some(futures_lite::future::block_on(engine.finish(&jobs[u])));
                continue;
            }
            piece = piece * 7 % 150_000 + 1;
            let n = piece.min(uploads[u].len() - at[u]);
            engine.append(
                &jobs[u],
                &Bytes::copy_from_slice(&uploads[u][at[u]..at[u] + n]),
            );
            at[u] += n;
        }
    }
    for (u, data) in uploads.iter().enumerate() {
        let want: [u8; 16] = ::md5::Md5::digest(data).into();
        assert_eq!(digests[u], Some(want), "upload {u} of {} bytes", data.len());
    }
    let s = engine.stats();
    if super::md5::lanes_available() {
        assert!(s.lane_bytes > s.scalar_bytes, "lanes rarely used: {s:?}");
        assert!(s.jobs > 4 * s.runs, "runs of four queues or fewer: {s:?}");
    }
}

#[test]
fn a_dropped_upload_leaves_the_others_right() {
    let engine = Md5Engine::new();
    let a = Bytes::from(bytes_of(1, 200_000));
    let b = Bytes::from(bytes_of(2, 300_001));
    let (ja, jb) = (engine.job(), engine.job());
    engine.append(&ja, &a);
    engine.append(&jb, &b.slice(..100_000));
    drop(ja);
    engine.append(&jb, &b.slice(100_000..));
    let want: [u8; 16] = ::md5::Md5::digest(&b).into();
    assert_eq!(futures_lite::future::block_on(engine.finish(&jb)), want);
}

#[test]
fn a_dropped_job_lets_go_of_its_queued_bytes_at_once() {
    let engine = Md5Engine::new();
    // Under RUN_BYTES: queued, not hashed yet.
    let a = Bytes::from(bytes_of(3, 256 * 1024));
    let ja = engine.job();
    engine.append(&ja, &a);
    assert!(engine.pending_bytes.get() > 0);
    assert!(!a.is_unique(), "the queue holds a slice of the bytes");
    drop(ja);
    assert_eq!(engine.pending_bytes.get(), 0);
    assert!(engine.pending.borrow().is_empty());
    assert!(
        a.is_unique(),
        "the engine still holds the dropped job's bytes"
    );
    // A finished job's drop changes nothing for another's.
    let b = Bytes::from(bytes_of(4, 300_000));
    let (jb, jc) = (engine.job(), engine.job());
    engine.append(&jb, &b);
    engine.append(&jc, &b);
    let want: [u8; 16] = ::md5::Md5::digest(&b).into();
    assert_eq!(futures_lite::future::block_on(engine.finish(&jb)), want);
    drop(jb);
    assert_eq!(futures_lite::future::block_on(engine.finish(&jc)), want);
}

/// Two small uploads finishing in the same turn of the executor, the
/// second receiving its bytes after the first asked for its digest: one
/// run hashes both (before, each ran alone, one after the other).
#[test]
fn uploads_finishing_together_share_a_run() {
    let engine = Md5Engine::new();
    let (a, b) = (bytes_of(1, 64 * 1024), bytes_of(2, 64 * 1024));
    let (ja, jb) = (engine.job(), engine.job());
    engine.append(&ja, &Bytes::copy_from_slice(&a));
    let first = engine.finish(&ja);
    let second = async {
        engine.append(&jb, &Bytes::copy_from_slice(&b));
        engine.finish(&jb).await
    };
    let (da, db) = futures_lite::future::block_on(futures_lite::future::zip(first, second));
    assert_eq!(da, <[u8; 16]>::from(::md5::Md5::digest(&a)));
    assert_eq!(db, <[u8; 16]>::from(::md5::Md5::digest(&b)));
    let s = engine.stats();
    if super::md5::lanes_available() {
        assert_eq!((s.runs, s.jobs), (1, 2), "{s:?}");
        assert_eq!(s.lane_bytes, 2 * 64 * 1024, "{s:?}");
    }
}
