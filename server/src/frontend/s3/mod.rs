//! The S3 front door: one task per connection on the shard that accepted it
//! (`serve`), each request routed once to an [`S3Op`] (`route`), checked by
//! SigV4 (`auth`) and handled by resource: buckets (`bucket`), listings
//! (`list`), objects (`object`), multipart uploads (`multipart`), copies
//! (`copy`), with preconditions in `conditional` (ETag lists in `etag`)
//! and bodies in `xml`.
//! Object operations go to the key's owner through `ObjectSource` /
//! `ObjectSink`.

use std::cell::Cell;
use std::rc::Rc;

use glommio::net::TcpStream;

// Part of `S3Config`; defined in `common` with what the native door shares.
pub use crate::frontend::common::Credentials;
use crate::frontend::http::{HttpConn, Limits, RequestHead};
use crate::frontend::s3::error::S3Error;
use crate::shard::Shard;

pub mod auth;
pub mod checksum;
pub mod error;
pub mod etag;
pub mod route;
pub mod xml;

mod acl;
mod authz;
mod batch;
mod bucket;
mod cluster;
mod conditional;
mod config;
mod copy;
mod copy_remote;
mod list;
mod multipart;
mod object;
mod replica;
mod serve;
mod uploads;
mod versions;

pub use route::S3Op;

/// S3 allows 2 KiB of user metadata.
const USER_METADATA_BYTES_MAX: usize = 2048;
/// Metadata entries (x-amz-meta-* plus STORED_HEADERS) kept with an object:
/// the record format's bound, less one for the verified checksum header
/// added when the body is in. Checked before the body is read.
const METADATA_HEADERS_MAX: usize = crate::store::record::HEADERS_COUNT_MAX - 1;
/// Small request bodies (CreateBucket configuration).
const SMALL_BODY_BYTES_MAX: usize = 64 * 1024;
const LIST_KEYS_MAX: u32 = 1000;
/// Response headers kept with an object and returned on GET/HEAD.
const STORED_HEADERS: [&str; 5] = [
    "content-encoding",
    "content-disposition",
    "cache-control",
    "content-language",
    "expires",
];

#[derive(Clone)]
pub struct S3Config {
    pub credentials: Credentials,
    pub region: String,
    /// Virtual-hosted-style requests: `Host: BUCKET.DOMAIN[:PORT]`.
    pub domain: Option<String>,
    /// One log line per request (target `percore::access`).
    pub access_log: bool,
    pub limits: Limits,
}

/// Per-shard S3 front door state.
pub struct S3Front {
    pub shard: Rc<Shard>,
    pub cfg: Rc<S3Config>,
    requests_total: Cell<u64>,
    pub draining: Cell<bool>,
    /// Cluster: node-to-node requests this shard has open at once.
    peer_calls: Rc<glommio::sync::Semaphore>,
}

/// Node-to-node requests one shard has open at once (forwards, fan-outs,
/// listings); more wait.
const PEER_CALLS_MAX: u64 = 256;

/// One request, routed: its head, the decoded bucket, key and query, and
/// the operation they name.
struct Request {
    head: RequestHead,
    op: S3Op,
    bucket: String,
    key: String,
    query: Vec<(String, String)>,
    request_id: String,
}

impl Request {
    /// The version `versionId` names (checked in dispatch; Current if
    /// absent).
    fn pick(&self) -> crate::store::versions::Pick {
        self.q("versionId")
            .and_then(crate::store::versions::Pick::parse)
            .unwrap_or(crate::store::versions::Pick::Current)
    }

    fn q(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    fn resource(&self) -> String {
        if self.key.is_empty() {
            format!("/{}", self.bucket)
        } else {
            format!("/{}/{}", self.bucket, self.key)
        }
    }
}

type Conn = HttpConn<TcpStream>;

fn http_date(unix_ms: u64) -> String {
    String::from_utf8_lossy(&crate::frontend::http::imf_fixdate(unix_ms / 1000)).into_owned()
}

impl S3Front {
    pub fn new(shard: Rc<Shard>, cfg: Rc<S3Config>) -> Rc<S3Front> {
        Rc::new(S3Front {
            shard,
            cfg,
            requests_total: Cell::new(0),
            draining: Cell::new(false),
            peer_calls: Rc::new(glommio::sync::Semaphore::new(PEER_CALLS_MAX)),
        })
    }

    fn next_request_id(&self) -> String {
        let n = self.requests_total.get() + 1;
        self.requests_total.set(n);
        format!("{:04X}{:012X}", self.shard.id, n)
    }

    fn last_request_id(&self) -> String {
        format!("{:04X}{:012X}", self.shard.id, self.requests_total.get())
    }
}

fn malformed(message: impl Into<String>) -> S3Error {
    S3Error::new(400, "MalformedXML", message)
}

impl S3Front {
    /// NoSuchBucket unless this shard's copy of the bucket set has it.
    fn require_bucket(&self, req: &Request) -> Result<(), S3Error> {
        if self.shard.bucket_exists(&req.bucket) {
            Ok(())
        } else {
            Err(S3Error::no_such_bucket())
        }
    }
}

fn quoted(etag: &str) -> String {
    format!("\"{etag}\"")
}

/// Parses `max-parts`-style limits: a non-negative integer, capped.
fn parse_limit(value: Option<&str>, name: &str, cap: usize) -> Result<usize, S3Error> {
    match value {
        None => Ok(cap),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(|n| (n as usize).min(cap))
            .ok_or_else(|| {
                S3Error::invalid_argument(format!("{name} must be a non-negative integer"))
            }),
    }
}
