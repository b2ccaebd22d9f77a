//! Digests computed on the request path, written for throughput: MD5 for
//! ETags in lanes across a shard's concurrent uploads (`md5`, `engine`).

pub mod engine;
pub mod md5;
