//! percore: a thread-per-core, shared-nothing object storage server.
//!
//! The tree follows the architecture: `store` is the per-shard storage engine,
//! `shard` the per-core runtime and cross-shard messaging, `http` and `s3` the
//! S3 front door.

pub mod store;
