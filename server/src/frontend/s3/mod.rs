//! The S3 front door: SigV4 auth, XML bodies, request handling.

pub mod checksum;
pub mod error;
pub mod etag;
pub mod handler;
pub mod sigv4;
pub mod xml;
