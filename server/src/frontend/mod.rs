//! The front doors: S3 over HTTP (`http` is the connection layer, `s3` the
//! API on top) and the native binary range protocol (`native`).

pub mod admin;
pub mod http;
pub mod native;
pub mod s3;
