//! The front doors: S3 over HTTP (`http` is the connection layer, `s3` the
//! API on top) and the native binary range protocol (`native`). What both
//! doors share: `common` (credentials, limits, bucket names) and `datapath`
//! (the piece sizes and the zero-copy read and send).

pub mod common;
pub mod datapath;
pub mod http;
pub mod native;
pub mod s3;
