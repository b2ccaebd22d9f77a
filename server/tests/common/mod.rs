//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use glommio::LocalExecutorBuilder;
use percore_server::store::StoreConfig;

/// Runs `f` to completion on a fresh glommio executor thread.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    LocalExecutorBuilder::default()
        .spawn(f)
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
