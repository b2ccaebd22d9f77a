//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod server;

use std::path::Path;

use glommio::LocalExecutorBuilder;
use percore_server::store::{Store, StoreConfig, StoreError};

/// Runs `f` to completion on a fresh glommio executor thread.
///
/// Files that `f` drops without closing (a dropped store's segments) are
/// closed by glommio at its next I/O cycle; one more cycle after `f` ends
/// lets those closes happen before the executor exits, so a test that runs
/// hundreds of executors does not run out of descriptors.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    LocalExecutorBuilder::default()
        .spawn(|| async move {
            f().await;
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        })
        .unwrap()
        .join()
        .unwrap();
}

/// Tiny segments, chunks and batches so that rotation, extents and
/// compaction happen within a few hundred small operations.
pub fn small_config(dir: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(0, dir.to_path_buf());
    cfg.segment_bytes_max = 256 * 1024;
    cfg.chunk_bytes = 16 * 1024;
    cfg.batch_bytes_max = 64 * 1024;
    cfg.compaction_interval_ms = 0;
    cfg.compaction_garbage_ratio_min = 0.3;
    cfg.compaction_bytes_per_sec_max = 0;
    cfg
}

/// Reads a whole object through `ObjectReader` in 7 KiB pieces (an odd size,
/// so reads straddle 64 KiB CRC blocks and extent boundaries).
pub async fn read_all(store: &Store, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError> {
    let mut r = store.open_read(bucket, key).await?;
    let mut out = Vec::new();
    while (out.len() as u64) < r.size_bytes() {
        let piece = r.read(out.len() as u64, 7 * 1024).await?;
        assert!(
            !piece.is_empty(),
            "empty read at {} of {}",
            out.len(),
            r.size_bytes()
        );
        out.extend_from_slice(&piece);
    }
    Ok(out)
}

/// A two-worker tokio runtime, for the client library's async API.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `len` deterministic pseudo-random bytes (xorshift64) from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The names of every object in `bucket`, in listing order.
pub fn list_names(store: &Store, bucket: &str) -> Vec<String> {
    store
        .list(bucket, "", "", None, usize::MAX)
        .into_iter()
        .map(|i| i.name().to_string())
        .collect()
}

/// `len` bytes from a `StdRng` seeded with `seed`: the payload generator of
/// the store tests (each test maps its own key/version to a seed).
pub fn seeded_bytes(seed: u64, len: usize) -> bytes::Bytes {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill(&mut v[..]);
    bytes::Bytes::from(v)
}

/// The segment files (`*.pcs`) of a store directory, sorted by name (which
/// is segment id order).
pub fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcs"))
        .collect();
    v.sort();
    v
}
