//! S3 request routing, done once per request: the target is split and
//! percent-decoded into bucket, key and query ([`Target`]) and the request
//! is named as one [`S3Op`]. Dispatch (`serve`) matches on that op and the
//! metrics and access log count it under [`S3Op::name`], so the two cannot
//! disagree about what a request is.

use crate::frontend::common::S3_KEY_BYTES_MAX;
use crate::frontend::http::RequestHead;
use crate::frontend::s3::error::S3Error;

pub(super) fn percent_decode(s: &str) -> Result<String, S3Error> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| S3Error::invalid_argument("URI is not valid UTF-8 after percent-decoding"))
}

pub(super) fn parse_query(raw: &str) -> Result<Vec<(String, String)>, S3Error> {
    let mut out = Vec::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.push((percent_decode(n)?, percent_decode(v)?));
    }
    Ok(out)
}

/// Path-style routing of a raw request target: bucket, key and query, all
/// percent-decoded and checked. (Virtual-host style takes the bucket from
/// the Host header instead; the key and query rules are the same.)
pub fn route_target(raw_path: &str, raw_query: &str) -> Result<Target, S3Error> {
    let path = raw_path.strip_prefix('/').unwrap_or(raw_path);
    let (bucket_raw, key_raw) = path.split_once('/').unwrap_or((path, ""));
    let (bucket, key) = (percent_decode(bucket_raw)?, percent_decode(key_raw)?);
    let query = check_key_and_query(&key, raw_query)?;
    Ok(Target { bucket, key, query })
}

fn check_key_and_query(key: &str, raw_query: &str) -> Result<Vec<(String, String)>, S3Error> {
    if key.len() > S3_KEY_BYTES_MAX {
        return Err(S3Error::new(400, "KeyTooLongError", "Your key is too long"));
    }
    if key.contains('\0') {
        return Err(S3Error::invalid_argument(
            "Object keys may not contain NUL characters",
        ));
    }
    let query = parse_query(raw_query)?;
    if query
        .iter()
        .any(|(n, v)| n.contains('\0') || v.contains('\0'))
    {
        return Err(S3Error::invalid_argument(
            "Query parameters may not contain NUL characters",
        ));
    }
    Ok(query)
}

/// Query parameters naming S3 sub-resources that this slice does not serve;
/// a request carrying one must not be mistaken for a plain GET/PUT.
const SUBRESOURCES: [&str; 31] = [
    "acl",
    "cors",
    "delete",
    "encryption",
    "lifecycle",
    "logging",
    "notification",
    "object-lock",
    "ownershipControls",
    "policy",
    "publicAccessBlock",
    "replication",
    "requestPayment",
    "tagging",
    "uploads",
    "uploadId",
    "versioning",
    "versions",
    "website",
    "attributes",
    "legal-hold",
    "retention",
    "restore",
    "select",
    "accelerate",
    "analytics",
    "metrics",
    "inventory",
    "intelligent-tiering",
    "policyStatus",
    "torrent",
];

/// Declares [`S3Op`] with each variant's metric name beside it, and the
/// table of all variants.
macro_rules! s3_ops {
    ($($(#[$doc:meta])* $op:ident => $name:literal,)*) => {
        /// The S3 API operation a request names. Every variant is answered by
        /// exactly one arm of dispatch; `NotImplemented` and
        /// `MethodNotAllowed` are answered with those errors (after auth).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum S3Op {
            $($(#[$doc])* $op,)*
        }

        impl S3Op {
            /// Every operation, for tests and exhaustive tables.
            pub const ALL: &'static [S3Op] = &[$(S3Op::$op,)*];

            /// The operation's name in metrics (`op` label) and access logs.
            pub fn name(self) -> &'static str {
                match self {
                    $(S3Op::$op => $name,)*
                }
            }
        }
    };
}

s3_ops! {
    ListBuckets => "ListBuckets",
    CreateBucket => "CreateBucket",
    HeadBucket => "HeadBucket",
    DeleteBucket => "DeleteBucket",
    GetBucketLocation => "GetBucketLocation",
    GetBucketVersioning => "GetBucketVersioning",
    PutBucketVersioning => "PutBucketVersioning",
    ListMultipartUploads => "ListMultipartUploads",
    ListObjectVersions => "ListObjectVersions",
    DeleteObjects => "DeleteObjects",
    /// percore's extension: many objects in one tar stream (`batch.rs`).
    BatchGet => "BatchGet",
    GetBucketAcl => "GetBucketAcl",
    PutBucketAcl => "PutBucketAcl",
    GetObjectAcl => "GetObjectAcl",
    PutObjectAcl => "PutObjectAcl",
    GetBucketTagging => "GetBucketTagging",
    PutBucketTagging => "PutBucketTagging",
    DeleteBucketTagging => "DeleteBucketTagging",
    GetBucketCors => "GetBucketCors",
    PutBucketCors => "PutBucketCors",
    DeleteBucketCors => "DeleteBucketCors",
    GetBucketLifecycleConfiguration => "GetBucketLifecycleConfiguration",
    PutBucketLifecycleConfiguration => "PutBucketLifecycleConfiguration",
    DeleteBucketLifecycle => "DeleteBucketLifecycle",
    GetBucketPolicy => "GetBucketPolicy",
    PutBucketPolicy => "PutBucketPolicy",
    DeleteBucketPolicy => "DeleteBucketPolicy",
    GetBucketPolicyStatus => "GetBucketPolicyStatus",
    GetObjectTagging => "GetObjectTagging",
    PutObjectTagging => "PutObjectTagging",
    DeleteObjectTagging => "DeleteObjectTagging",
    /// A browser's CORS preflight (`OPTIONS` on a bucket or object):
    /// answered from the bucket's CORS rules without authentication.
    CorsPreflight => "CorsPreflight",
    ListObjectsV2 => "ListObjectsV2",
    ListObjects => "ListObjects",
    PutObject => "PutObject",
    CopyObject => "CopyObject",
    GetObject => "GetObject",
    HeadObject => "HeadObject",
    DeleteObject => "DeleteObject",
    GetObjectAttributes => "GetObjectAttributes",
    CreateMultipartUpload => "CreateMultipartUpload",
    UploadPart => "UploadPart",
    UploadPartCopy => "UploadPartCopy",
    CompleteMultipartUpload => "CompleteMultipartUpload",
    AbortMultipartUpload => "AbortMultipartUpload",
    ListParts => "ListParts",
    /// A recognised request percore does not serve (a sub-resource such as
    /// `?tagging`, `?acl`, or an unusual method on a bucket): 501.
    NotImplemented => "NotImplemented",
    /// A method the resource does not take (POST on an object without
    /// `?uploads`/`?uploadId`, anything but GET on `/`): 405. Counted as
    /// "Other", its name before the router existed.
    MethodNotAllowed => "Other",
}

impl S3Op {
    /// Names the operation of `method` on a bucket (`bucket` non-empty) or
    /// object (`key` non-empty) with these query pairs; `copy_source` is
    /// whether `x-amz-copy-source` was sent. The one routing table.
    pub fn classify(
        method: &str,
        has_bucket: bool,
        has_key: bool,
        query: &[(&str, &str)],
        copy_source: bool,
    ) -> S3Op {
        let has = |name: &str| query.iter().any(|(n, _)| *n == name);
        let subresource = query.iter().any(|(n, _)| SUBRESOURCES.contains(n));
        if !has_bucket {
            return match method {
                "GET" => S3Op::ListBuckets,
                _ => S3Op::MethodNotAllowed,
            };
        }
        if method == "OPTIONS" {
            return S3Op::CorsPreflight;
        }
        if !has_key {
            let list_type = query.iter().find(|(n, _)| *n == "list-type").map(|p| p.1);
            return match method {
                "PUT" if query.is_empty() => S3Op::CreateBucket,
                "HEAD" => S3Op::HeadBucket,
                "DELETE" if query.is_empty() => S3Op::DeleteBucket,
                "GET" if has("location") => S3Op::GetBucketLocation,
                "GET" if has("acl") => S3Op::GetBucketAcl,
                "PUT" if has("acl") => S3Op::PutBucketAcl,
                "GET" if has("tagging") => S3Op::GetBucketTagging,
                "PUT" if has("tagging") => S3Op::PutBucketTagging,
                "DELETE" if has("tagging") => S3Op::DeleteBucketTagging,
                "GET" if has("cors") => S3Op::GetBucketCors,
                "PUT" if has("cors") => S3Op::PutBucketCors,
                "DELETE" if has("cors") => S3Op::DeleteBucketCors,
                "GET" if has("lifecycle") => S3Op::GetBucketLifecycleConfiguration,
                "PUT" if has("lifecycle") => S3Op::PutBucketLifecycleConfiguration,
                "DELETE" if has("lifecycle") => S3Op::DeleteBucketLifecycle,
                "GET" if has("policy") => S3Op::GetBucketPolicy,
                "PUT" if has("policy") => S3Op::PutBucketPolicy,
                "DELETE" if has("policy") => S3Op::DeleteBucketPolicy,
                "GET" if has("policyStatus") => S3Op::GetBucketPolicyStatus,
                "GET" if has("uploads") => S3Op::ListMultipartUploads,
                "GET" if has("versions") => S3Op::ListObjectVersions,
                "GET" if has("versioning") => S3Op::GetBucketVersioning,
                "PUT" if has("versioning") => S3Op::PutBucketVersioning,
                "POST" if has("delete") => S3Op::DeleteObjects,
                "POST" if has("batchGet") => S3Op::BatchGet,
                "GET" if list_type == Some("2") => S3Op::ListObjectsV2,
                "GET" if !subresource => S3Op::ListObjects,
                _ => S3Op::NotImplemented,
            };
        }
        if has("uploadId") {
            return match method {
                "PUT" if copy_source => S3Op::UploadPartCopy,
                "PUT" => S3Op::UploadPart,
                "POST" => S3Op::CompleteMultipartUpload,
                "DELETE" => S3Op::AbortMultipartUpload,
                "GET" => S3Op::ListParts,
                _ => S3Op::MethodNotAllowed,
            };
        }
        if method == "POST" && has("uploads") {
            return S3Op::CreateMultipartUpload;
        }
        if method == "GET" && has("attributes") {
            return S3Op::GetObjectAttributes;
        }
        if has("acl") {
            return match method {
                "GET" => S3Op::GetObjectAcl,
                "PUT" => S3Op::PutObjectAcl,
                _ => S3Op::NotImplemented,
            };
        }
        if has("tagging") {
            return match method {
                "GET" => S3Op::GetObjectTagging,
                "PUT" => S3Op::PutObjectTagging,
                "DELETE" => S3Op::DeleteObjectTagging,
                _ => S3Op::NotImplemented,
            };
        }
        if subresource {
            return S3Op::NotImplemented;
        }
        match method {
            "PUT" if copy_source => S3Op::CopyObject,
            "PUT" => S3Op::PutObject,
            "GET" => S3Op::GetObject,
            "HEAD" => S3Op::HeadObject,
            "DELETE" => S3Op::DeleteObject,
            _ => S3Op::MethodNotAllowed,
        }
    }
}

/// A request target, percent-decoded and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub bucket: String,
    pub key: String,
    pub query: Vec<(String, String)>,
}

/// A routed request: its operation, and its target or why the target was
/// refused. `op` is known even when decoding failed (see [`route`]), so
/// that a refused request is still counted under the operation it named.
#[derive(Debug)]
pub struct Route {
    pub op: S3Op,
    pub target: Result<Target, S3Error>,
}

/// Routes a request head. `virtual_host` is the bucket the Host header
/// names, if any (then the whole path is the key).
///
/// A target that fails to decode is named from its raw parts: decoding
/// keeps an empty bucket or key empty and a non-empty one non-empty, so
/// only a percent-encoded query name can be read differently, and such a
/// request is refused (400) before dispatch either way.
pub fn route(head: &RequestHead, virtual_host: Option<String>) -> Route {
    let path = head.path.strip_prefix('/').unwrap_or(&head.path);
    let copy_source = head.header("x-amz-copy-source").is_some();
    let is_virtual_host = virtual_host.is_some();
    let target = match virtual_host {
        Some(bucket) => percent_decode(path).and_then(|key| {
            let query = check_key_and_query(&key, &head.query)?;
            Ok(Target { bucket, key, query })
        }),
        None => route_target(path, &head.query),
    };
    let op = match &target {
        Ok(t) => {
            let query: Vec<(&str, &str)> = t
                .query
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            S3Op::classify(
                &head.method,
                !t.bucket.is_empty(),
                !t.key.is_empty(),
                &query,
                copy_source,
            )
        }
        Err(_) => {
            let (has_bucket, has_key) = match path.split_once('/') {
                _ if is_virtual_host => (true, !path.is_empty()),
                Some((bucket, key)) => (!bucket.is_empty(), !key.is_empty()),
                None => (!path.is_empty(), false),
            };
            let query: Vec<(&str, &str)> = head
                .query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once('=').unwrap_or((p, "")))
                .collect();
            S3Op::classify(&head.method, has_bucket, has_key, &query, copy_source)
        }
    };
    Route { op, target }
}

/// The bucket named by the Host header, when a domain is configured and
/// the host is a subdomain of it (virtual-hosted-style requests).
pub fn virtual_host_bucket(head: &RequestHead, domain: Option<&str>) -> Option<String> {
    let domain = domain?;
    let host = head.header_str("host")?.trim();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.to_ascii_lowercase();
    let bucket = host.strip_suffix(domain)?.strip_suffix('.')?;
    (!bucket.is_empty()).then(|| bucket.to_string())
}

mod unimplemented;
pub use unimplemented::unimplemented_name;

#[cfg(test)]
mod tests;
