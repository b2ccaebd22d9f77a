//! percore: a thread-per-core, shared-nothing object storage server.
//!
//! One folder per layer (docs/design.md opens with the map):
//! - `boot`: process start-up: configuration, CPU/NUMA plan, listeners,
//!   the data directory, one executor per shard.
//! - `frontend`: the two front doors (`http` + `s3`, `native`), the admin
//!   endpoint and what the doors share.
//! - `shard`: the per-core runtime: the shard's typed API, cross-shard
//!   messages, object streaming.
//! - `store`: the per-shard storage engine (log-structured segments, index,
//!   recovery, compaction, scrub).
//! - `ring`: the per-shard io_uring data ring and registered buffer pool.
//! - `digest`: MD5 for ETags, in SIMD lanes across a shard's uploads.
//! - `metrics`: counters, histograms and the catalogue of metric names.
//! - `tools`: offline tools run by the binary (`fsck`, `doctor`).

pub mod access;
pub mod boot;
pub mod bucket_config;
pub mod cluster;
pub mod digest;
pub mod frontend;
#[cfg(any(test, fuzzing))]
pub mod fuzz;
pub mod metrics;
pub mod ring;
pub mod shard;
pub mod store;
pub mod tools;
