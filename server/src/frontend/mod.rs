//! The front doors: S3 over HTTP (`http` is the connection layer, `s3` the
//! API on top), the native binary range protocol (`native`) and the admin
//! endpoint (`admin`: metrics, health, log level). What both
//! doors share: `common` (credentials, limits, bucket names) and `datapath`
//! (the piece sizes and the zero-copy read and send).

pub mod admin;
pub mod common;
pub mod datapath;
pub mod http;
pub mod native;
pub mod s3;
