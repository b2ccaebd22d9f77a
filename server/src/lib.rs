//! percore: a thread-per-core, shared-nothing object storage server.
//!
//! The tree follows the architecture: `store` is the per-shard storage engine,
//! `shard` the per-core runtime and cross-shard messaging, `http` and `s3` the
//! S3 front door.

pub mod checks;
pub mod config;
pub mod doctor;
pub mod fsck;
pub mod fuzz;
pub mod http;
pub mod metadata;
pub mod metrics;
pub mod native;
pub mod ring;
pub mod s3;
pub mod server;
pub mod shard;
pub mod steer;
pub mod store;
pub mod topology;
