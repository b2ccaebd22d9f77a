//! The front doors: S3 over HTTP (`http` is the connection layer, `s3` the
//! API on top) and the native binary range protocol (`native`); `common`
//! holds what both doors share (credentials, limits, bucket names).

pub mod common;
pub mod http;
pub mod native;
pub mod s3;
