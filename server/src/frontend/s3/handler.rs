//! S3 over HTTP/1.1: one task per connection on the shard that accepted it;
//! object operations go to the key's owner through `ObjectSource` /
//! `ObjectSink`.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use glommio::net::TcpStream;
use md5::{Digest, Md5};
use sha2::Sha256;

use crate::frontend::http::{
    content_range, parse_range, BodyFraming, HttpConn, Limits, RangeSpec, RequestHead, ResponseHead,
};
use crate::metrics::ShardMetrics;
use crate::frontend::s3::checksum;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::sigv4::{self, AuthInput, ChunkedDecoder, HeaderView, PayloadMode, Verified};
use crate::frontend::s3::xml;
use crate::shard::msg::{Op, Reply};
use crate::shard::object::{ObjectSink, ObjectSource};
use crate::shard::{Shard, BUCKET_OWNER_SHARD};
use crate::store::record::ObjectMeta;
use crate::store::{ListItem, ObjectInfo, PutCondition};

mod ops;

/// S3's key length limit (bytes of UTF-8).
pub const S3_KEY_BYTES_MAX: usize = 1024;
/// S3's single-PUT limit.
pub const PUT_BYTES_MAX: u64 = 5 << 30;
/// Bytes handed to the owner shard per message.
const PUT_PIECE_BYTES: usize = 1 << 20;
/// Bytes sent per GET read.
const GET_PIECE_BYTES: u64 = 1 << 20;
/// S3 allows 2 KiB of user metadata.
const USER_METADATA_BYTES_MAX: usize = 2048;
/// Metadata entries (x-amz-meta-* plus STORED_HEADERS) kept with an object:
/// the record format's bound, less one for the verified checksum header
/// added when the body is in. Checked before the body is read.
const METADATA_HEADERS_MAX: usize = crate::store::record::HEADERS_COUNT_MAX - 1;
const CLOCK_SKEW_MAX: Duration = Duration::from_secs(15 * 60);
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
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    /// The built-in defaults: accepted from loopback peers only.
    pub is_default: bool,
}

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
}

struct Request {
    head: RequestHead,
    bucket: String,
    key: String,
    query: Vec<(String, String)>,
    request_id: String,
}

impl Request {
    fn q(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    fn has_q(&self, name: &str) -> bool {
        self.query.iter().any(|(n, _)| n == name)
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

fn percent_decode(s: &str) -> Result<String, S3Error> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| S3Error::invalid_argument("URI is not valid UTF-8 after percent-decoding"))
}

fn parse_query(raw: &str) -> Result<Vec<(String, String)>, S3Error> {
    let mut out = Vec::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.push((percent_decode(n)?, percent_decode(v)?));
    }
    Ok(out)
}

/// Path-style routing of a raw request target: (bucket, key, query), all
/// percent-decoded and checked. (Virtual-host style takes the bucket from
/// the Host header instead; the key and query rules are the same.)
pub fn route_target(
    raw_path: &str,
    raw_query: &str,
) -> Result<(String, String, Vec<(String, String)>), S3Error> {
    let path = raw_path.strip_prefix('/').unwrap_or(raw_path);
    let (bucket_raw, key_raw) = path.split_once('/').unwrap_or((path, ""));
    let (bucket, key) = (percent_decode(bucket_raw)?, percent_decode(key_raw)?);
    let query = check_key_and_query(&key, raw_query)?;
    Ok((bucket, key, query))
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

/// A ListObjectsV2 continuation token back to the key it resumes after.
/// Tokens are keys we handed out (URL-safe base64), and keys never hold NUL
/// (`check_key_and_query`): keys starting with NUL are the store's internal
/// multipart state, so a token with a NUL in it is forged and must not
/// resume a listing among them.
fn decode_continuation_token(token: &str) -> Result<String, S3Error> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|t| !t.contains('\0'))
        .ok_or_else(|| S3Error::invalid_argument("The continuation token provided is incorrect"))
}

/// S3 bucket naming rules (the strict, DNS-compatible ones).
pub fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
        && name.parse::<std::net::Ipv4Addr>().is_err()
}

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

    /// Serves one connection until it closes, errs or the server drains.
    pub async fn serve_connection(self: Rc<Self>, stream: TcpStream) {
        let m = &self.shard.metrics;
        m.connections_open.set(m.connections_open.get() + 1);
        self.serve_connection_inner(stream).await;
        m.connections_open.set(m.connections_open.get() - 1);
    }

    async fn serve_connection_inner(&self, stream: TcpStream) {
        let loopback = stream
            .peer_addr()
            .map(|a| a.ip().is_loopback())
            .unwrap_or(false);
        let _ = stream.set_nodelay(true);
        let mut conn = HttpConn::new(stream, self.cfg.limits.clone());
        loop {
            let head = match conn.read_head().await {
                Ok(Some(head)) => head,
                Ok(None) => break,
                Err(e) => {
                    if e.should_reply() {
                        let err = S3Error::from(e);
                        let _ = self
                            .write_error(&mut conn, &err, "", &self.next_request_id(), true, false)
                            .await;
                    }
                    break;
                }
            };
            let m = &self.shard.metrics;
            m.requests_in_flight.set(m.requests_in_flight.get() + 1);
            let started = Instant::now();
            let (read0, written0) = (conn.body_bytes_read, conn.body_bytes_written);
            let op = operation_name(&head, self.virtual_host_bucket(&head).is_some());
            let method = head.method.clone();
            let target = match (self.cfg.access_log, head.query.is_empty()) {
                (false, _) => None,
                (true, true) => Some(head.path.clone()),
                (true, false) => Some(format!("{}?{}", head.path, head.query)),
            };
            conn.last_status = 0;
            let keep_alive = self.handle(&mut conn, head, loopback).await;
            let elapsed = started.elapsed();
            let (bytes_in, bytes_out) = (
                conn.body_bytes_read - read0,
                conn.body_bytes_written - written0,
            );
            m.record_request(op, conn.last_status, elapsed);
            ShardMetrics::add(&m.bytes_in, bytes_in);
            ShardMetrics::add(&m.bytes_out, bytes_out);
            m.requests_in_flight.set(m.requests_in_flight.get() - 1);
            if let Some(target) = target {
                tracing::info!(
                    target: "percore::access",
                    shard = self.shard.id,
                    request_id = %self.last_request_id(),
                    op,
                    method = %method,
                    target = %target,
                    status = conn.last_status,
                    bytes_in,
                    bytes_out,
                    micros = elapsed.as_micros() as u64,
                    "request"
                );
            }
            if !keep_alive || self.draining.get() {
                break;
            }
        }
        let _ = conn.flush().await;
    }

    /// Handles one request; returns whether the connection stays open.
    async fn handle(&self, conn: &mut Conn, head: RequestHead, loopback: bool) -> bool {
        let request_id = self.next_request_id();
        let is_head = head.method == "HEAD";
        if self.draining.get() {
            // A request that arrives on a kept-alive connection after
            // SIGTERM is not started: the shard stops once the requests
            // already in flight are done, and would cut it off.
            let e = S3Error::new(
                503,
                "ServiceUnavailable",
                "The server is shutting down; retry on a new connection.",
            );
            let _ = self
                .write_error(conn, &e, "", &request_id, true, is_head)
                .await;
            return false;
        }
        let keep = head.keep_alive();
        let req = match self.parse_request(head, request_id.clone()) {
            Ok(req) => req,
            Err(e) => {
                let close = !conn.body_discardable();
                return self
                    .write_error(conn, &e, "", &request_id, close || !keep, is_head)
                    .await
                    && keep
                    && !close;
            }
        };
        match self.dispatch(conn, &req, loopback).await {
            Ok(()) => keep && conn.body_finished(),
            Err(_) if conn.last_status != 0 => {
                // The response head is out (a GET that failed mid-body): an
                // error response now would land inside that body as object
                // bytes. Close instead, so the client sees a short body.
                false
            }
            Err(e) => {
                // An early error may leave a body unread: drain it if small,
                // else close so the stream stays in sync.
                let mut close = !keep;
                if !conn.body_finished() {
                    if conn.body_discardable() {
                        close |= conn.discard_body().await.is_err();
                    } else {
                        close = true;
                    }
                }
                let written = self
                    .write_error(conn, &e, &req.resource(), &req.request_id, close, is_head)
                    .await;
                written && !close
            }
        }
    }

    /// The bucket named by the Host header, when a domain is configured
    /// and the host is a subdomain of it.
    fn virtual_host_bucket(&self, head: &RequestHead) -> Option<String> {
        let domain = self.cfg.domain.as_deref()?;
        let host = head.header_str("host")?.trim();
        let host = match host.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        let host = host.to_ascii_lowercase();
        let bucket = host.strip_suffix(domain)?.strip_suffix('.')?;
        (!bucket.is_empty()).then(|| bucket.to_string())
    }

    fn parse_request(&self, head: RequestHead, request_id: String) -> Result<Request, S3Error> {
        let path = head
            .path
            .strip_prefix('/')
            .unwrap_or(&head.path)
            .to_string();
        let (bucket, key) = match self.virtual_host_bucket(&head) {
            Some(bucket) => (bucket, percent_decode(&path)?),
            None => {
                let (bucket_raw, key_raw) = path.split_once('/').unwrap_or((&path, ""));
                (percent_decode(bucket_raw)?, percent_decode(key_raw)?)
            }
        };
        let query = check_key_and_query(&key, &head.query)?;
        Ok(Request {
            head,
            bucket,
            key,
            query,
            request_id,
        })
    }

    async fn write_error(
        &self,
        conn: &mut Conn,
        e: &S3Error,
        resource: &str,
        request_id: &str,
        close: bool,
        is_head: bool,
    ) -> bool {
        if e.status >= 500 {
            tracing::warn!(
                shard = self.shard.id,
                status = e.status,
                code = e.code,
                "{}",
                e.message
            );
        }
        let mut head = ResponseHead::new(e.status);
        head.push_header("x-amz-request-id", request_id.to_string());
        if is_head {
            return conn.write_response(&head, 0, close).await.is_ok()
                && conn.flush().await.is_ok();
        }
        head.push_header("Content-Type", "application/xml");
        let body = xml::error_body(e.code, &e.message, resource, request_id);
        conn.write_response(&head, body.len() as u64, close)
            .await
            .is_ok()
            && conn.write_body(body.as_bytes()).await.is_ok()
            && conn.flush().await.is_ok()
    }

    async fn respond(
        &self,
        conn: &mut Conn,
        req: &Request,
        mut head: ResponseHead,
        body: &[u8],
    ) -> Result<(), S3Error> {
        head.push_header("x-amz-request-id", req.request_id.clone());
        conn.write_response(&head, body.len() as u64, false).await?;
        if !body.is_empty() {
            conn.write_body(body).await?;
        }
        conn.flush().await?;
        Ok(())
    }

    async fn respond_xml(&self, conn: &mut Conn, req: &Request, body: &str) -> Result<(), S3Error> {
        let head = ResponseHead::new(200).with_header("Content-Type", "application/xml");
        self.respond(conn, req, head, body.as_bytes()).await
    }

    fn authenticate(&self, req: &Request, loopback: bool) -> Result<Verified, S3Error> {
        let headers: Vec<HeaderView> = req
            .head
            .headers
            .iter()
            .map(|(n, v)| HeaderView {
                name: n.as_str(),
                value: v.as_slice(),
            })
            .collect();
        let input = AuthInput {
            method: &req.head.method,
            raw_path: &req.head.path,
            raw_query: &req.head.query,
            headers: &headers,
        };
        let creds = &self.cfg.credentials;
        let lookup = |ak: &str| (ak == creds.access_key).then(|| creds.secret_key.clone());
        let verified = sigv4::verify(&input, &lookup, SystemTime::now(), CLOCK_SKEW_MAX)?;
        if creds.is_default && !loopback {
            return Err(S3Error::new(
                403,
                "AccessDenied",
                "The default credentials are accepted from loopback only; start the server with PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY set.",
            ));
        }
        Ok(verified)
    }

    async fn dispatch(
        &self,
        conn: &mut Conn,
        req: &Request,
        loopback: bool,
    ) -> Result<(), S3Error> {
        let auth = self.authenticate(req, loopback)?;
        let method = req.head.method.as_str();
        if req.bucket.is_empty() {
            return match method {
                "GET" => self.list_buckets(conn, req).await,
                _ => Err(S3Error::new(
                    405,
                    "MethodNotAllowed",
                    "The specified method is not allowed against this resource.",
                )),
            };
        }
        if req.key.is_empty() {
            return match method {
                "PUT" if req.query.is_empty() => self.create_bucket(conn, req).await,
                "HEAD" => self.head_bucket(conn, req).await,
                "DELETE" if req.query.is_empty() => self.delete_bucket(conn, req).await,
                "GET" if req.has_q("location") => self.get_bucket_location(conn, req).await,
                "GET" if req.has_q("uploads") => self.list_multipart_uploads(conn, req).await,
                "GET" if req.has_q("versions") => self.list_object_versions(conn, req).await,
                "GET" if req.has_q("versioning") => {
                    if !self.shard.bucket_exists(&req.bucket) {
                        return Err(S3Error::no_such_bucket());
                    }
                    let body = format!(
                        "{}<VersioningConfiguration xmlns=\"{}\"/>",
                        xml::XML_DECLARATION,
                        xml::S3_XMLNS
                    );
                    self.respond_xml(conn, req, &body).await
                }
                "POST" if req.has_q("delete") => self.delete_objects(conn, req, &auth).await,
                "GET" if req.q("list-type") == Some("2") => {
                    self.list_objects(conn, req, true).await
                }
                "GET"
                    if !req
                        .query
                        .iter()
                        .any(|(n, _)| SUBRESOURCES.contains(&n.as_str())) =>
                {
                    self.list_objects(conn, req, false).await
                }
                _ => Err(S3Error::not_implemented(&format!(
                    "{method} on a bucket with this query"
                ))),
            };
        }
        if req.has_q("uploadId") {
            return match method {
                "PUT" => self.upload_part(conn, req, &auth).await,
                "POST" => self.complete_multipart(conn, req, &auth).await,
                "DELETE" => self.abort_multipart(conn, req).await,
                "GET" => self.list_parts(conn, req).await,
                _ => Err(S3Error::new(
                    405,
                    "MethodNotAllowed",
                    "The specified method is not allowed against this resource.",
                )),
            };
        }
        if method == "POST" && req.has_q("uploads") {
            return self.create_multipart(conn, req).await;
        }
        if method == "GET" && req.has_q("attributes") {
            return self.get_object_attributes(conn, req).await;
        }
        if req
            .query
            .iter()
            .any(|(n, _)| SUBRESOURCES.contains(&n.as_str()))
        {
            return Err(S3Error::not_implemented(&format!(
                "{method} on an object with this query"
            )));
        }
        match method {
            "PUT" => self.put_object(conn, req, &auth).await,
            "GET" => self.get_object(conn, req, false).await,
            "HEAD" => self.get_object(conn, req, true).await,
            "DELETE" => self.delete_object(conn, req).await,
            _ => Err(S3Error::new(
                405,
                "MethodNotAllowed",
                "The specified method is not allowed against this resource.",
            )),
        }
    }

    // ------------------------------------------------------------------
    // Buckets
    // ------------------------------------------------------------------

    async fn list_buckets(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        let buckets: Vec<xml::BucketEntry> = self
            .shard
            .bucket_list()
            .into_iter()
            .map(|(name, created_unix_ms)| xml::BucketEntry {
                name,
                created_unix_ms,
            })
            .collect();
        let body = xml::list_buckets(xml::OWNER_ID_DEFAULT, &buckets);
        self.respond_xml(conn, req, &body).await
    }

    /// Reads a whole request body of at most `max` bytes.
    async fn read_small_body(
        &self,
        conn: &mut Conn,
        req: &Request,
        max: usize,
    ) -> Result<Vec<u8>, S3Error> {
        if req.head.expects_continue() {
            conn.send_continue().await?;
        }
        let mut body = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = conn.read_body(&mut buf).await?;
            if n == 0 {
                return Ok(body);
            }
            if body.len() + n > max {
                return Err(S3Error::new(
                    400,
                    "MaxMessageLengthExceeded",
                    "Your request was too big.",
                ));
            }
            body.extend_from_slice(&buf[..n]);
        }
    }

    async fn create_bucket(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        if !valid_bucket_name(&req.bucket) {
            return Err(S3Error::new(
                400,
                "InvalidBucketName",
                "The specified bucket is not valid.",
            ));
        }
        let body = self
            .read_small_body(conn, req, SMALL_BODY_BYTES_MAX)
            .await?;
        xml::parse_create_bucket(&body).map_err(|e| S3Error::new(400, "MalformedXML", e))?;
        match self.shard.call(BUCKET_OWNER_SHARD, Op::BucketCreate { name: req.bucket.clone() }).await {
            Reply::Created(true) => {
                let head = ResponseHead::new(200).with_header("Location", format!("/{}", req.bucket));
                self.respond(conn, req, head, b"").await
            }
            Reply::Created(false) => Err(S3Error::new(
                409,
                "BucketAlreadyOwnedByYou",
                "Your previous request to create the named bucket succeeded and you already own it.",
            )),
            Reply::Err(e) => Err(e.into()),
            other => Err(S3Error::internal(format!("unexpected reply {other:?}"))),
        }
    }

    async fn head_bucket(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let head =
            ResponseHead::new(200).with_header("x-amz-bucket-region", self.cfg.region.clone());
        self.respond(conn, req, head, b"").await
    }

    async fn delete_bucket(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        match self
            .shard
            .call(
                BUCKET_OWNER_SHARD,
                Op::BucketDelete {
                    name: req.bucket.clone(),
                },
            )
            .await
        {
            Reply::Ok => self.respond(conn, req, ResponseHead::new(204), b"").await,
            Reply::Err(e) => Err(e.into()),
            other => Err(S3Error::internal(format!("unexpected reply {other:?}"))),
        }
    }

    async fn get_bucket_location(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let region = if self.cfg.region == "us-east-1" {
            ""
        } else {
            self.cfg.region.as_str()
        };
        let body = xml::location_constraint(region);
        self.respond_xml(conn, req, &body).await
    }

    async fn list_merged(
        &self,
        bucket: &str,
        prefix: &str,
        from: &str,
        delimiter: Option<String>,
        max: usize,
    ) -> Result<(Vec<ListItem>, bool), S3Error> {
        Ok(self
            .shard
            .list_merged(bucket, prefix, from, delimiter, max)
            .await?)
    }

    /// ListObjects V1/V2: each shard returns its first `max_keys + 1` items
    /// after the marker; the page is the merged first `max_keys`.
    async fn list_objects(&self, conn: &mut Conn, req: &Request, v2: bool) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let prefix = req.q("prefix").unwrap_or("").to_string();
        let delimiter = req
            .q("delimiter")
            .filter(|d| !d.is_empty())
            .map(str::to_string);
        let max_keys = match req.q("max-keys") {
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    S3Error::invalid_argument("max-keys must be a non-negative integer")
                })?
                .min(i64::from(LIST_KEYS_MAX)) as u32,
            None => LIST_KEYS_MAX,
        };
        let encoding_url = match req.q("encoding-type") {
            None => false,
            Some("url") => true,
            Some(_) => {
                return Err(S3Error::invalid_argument(
                    "Invalid Encoding Method specified in Request",
                ))
            }
        };
        let token = match req.q("continuation-token").filter(|_| v2) {
            Some(t) => Some(decode_continuation_token(t)?),
            None => None,
        };
        let start_after = if v2 {
            req.q("start-after").unwrap_or("").to_string()
        } else {
            req.q("marker").unwrap_or("").to_string()
        };
        let from = match &token {
            Some(t) if *t > start_after => t.clone(),
            _ => start_after.clone(),
        };
        let (items, is_truncated) = self
            .list_merged(
                &req.bucket,
                &prefix,
                &from,
                delimiter.clone(),
                max_keys as usize,
            )
            .await?;
        let last = items.last().map(|i| i.name().to_string());
        let mut contents = Vec::new();
        let mut common_prefixes = Vec::new();
        for item in items {
            match item {
                ListItem::Object {
                    key,
                    size_bytes,
                    etag,
                    mtime_ms,
                } => contents.push(xml::ObjectEntry {
                    key,
                    size: size_bytes,
                    etag: format!("\"{etag}\""),
                    last_modified_unix_ms: mtime_ms,
                }),
                ListItem::Prefix(p) => common_prefixes.push(p),
            }
        }
        let body = if v2 {
            xml::list_objects_v2(&xml::ListV2 {
                bucket: req.bucket.clone(),
                prefix,
                delimiter,
                max_keys,
                key_count: (contents.len() + common_prefixes.len()) as u32,
                is_truncated,
                continuation_token: req.q("continuation-token").map(str::to_string),
                next_continuation_token: is_truncated
                    .then(|| {
                        last.map(|l| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(l))
                    })
                    .flatten(),
                start_after: req.q("start-after").map(str::to_string),
                encoding_url,
                contents,
                common_prefixes,
                fetch_owner: req.q("fetch-owner") == Some("true"),
            })
        } else {
            xml::list_objects_v1(&xml::ListV1 {
                bucket: req.bucket.clone(),
                prefix,
                next_marker: if is_truncated && delimiter.is_some() {
                    last
                } else {
                    None
                },
                delimiter,
                marker: start_after,
                max_keys,
                is_truncated,
                encoding_url,
                contents,
                common_prefixes,
            })
        };
        self.respond_xml(conn, req, &body).await
    }

    // ------------------------------------------------------------------
    // Objects
    // ------------------------------------------------------------------

    fn object_meta_from_request(&self, req: &Request) -> Result<ObjectMeta, S3Error> {
        let content_type = req
            .head
            .header_str("content-type")
            .unwrap_or("binary/octet-stream")
            .to_string();
        let mut headers = Vec::new();
        let mut user_bytes = 0;
        for (name, value) in &req.head.headers {
            let stored = STORED_HEADERS.contains(&name.as_str());
            let user = name.starts_with("x-amz-meta-");
            if !stored && !user {
                continue;
            }
            let mut value = String::from_utf8(value.clone()).map_err(|_| {
                S3Error::invalid_argument(format!("header {name} is not valid UTF-8"))
            })?;
            if name == "content-encoding" {
                // aws-chunked describes the transfer, not the object.
                value = value
                    .split(',')
                    .map(str::trim)
                    .filter(|v| !v.eq_ignore_ascii_case("aws-chunked"))
                    .collect::<Vec<_>>()
                    .join(",");
                if value.is_empty() {
                    continue;
                }
            }
            if user {
                user_bytes += name.len() - "x-amz-meta-".len() + value.len();
            }
            headers.push((name.clone(), value));
        }
        if headers.len() > METADATA_HEADERS_MAX {
            return Err(S3Error::new(
                400,
                "MetadataTooLarge",
                format!(
                    "Too many metadata headers: {} x-amz-meta-* and stored headers \
                     (Content-Encoding, Content-Disposition, Cache-Control, \
                     Content-Language, Expires) were sent, at most {METADATA_HEADERS_MAX} are allowed.",
                    headers.len()
                ),
            ));
        }
        if user_bytes > USER_METADATA_BYTES_MAX {
            return Err(S3Error::new(
                400,
                "MetadataTooLarge",
                "Your metadata headers exceed the maximum allowed metadata size.",
            ));
        }
        Ok(ObjectMeta {
            content_type,
            headers,
            ..Default::default()
        })
    }

    async fn put_object(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        if req.head.header("x-amz-copy-source").is_some() {
            return self.copy_object(conn, req).await;
        }
        let meta = self.object_meta_from_request(req)?;
        let condition = put_condition(&req.head)?;
        let sink = ObjectSink::open_part(&self.shard, &req.bucket, &req.key, meta, None, condition)
            .await?;
        let info = self.receive_object(conn, req, auth, sink).await?;
        let head = ResponseHead::new(200).with_header("ETag", format!("\"{}\"", info.etag));
        self.respond(conn, req, head, b"").await
    }

    /// Streams the request body into `sink`, verifying every signature and
    /// digest before the object (or part) becomes visible.
    async fn receive_object(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
        mut sink: ObjectSink,
    ) -> Result<ObjectInfo, S3Error> {
        let framing = req.head.body_framing()?;
        if matches!(framing, BodyFraming::Empty) && req.head.header("content-length").is_none() {
            // As S3: an object (or part) needs a declared length; without
            // one HTTP reads no body, and an empty object was stored.
            return Err(S3Error::new(
                411,
                "MissingContentLength",
                "You must provide the Content-Length HTTP header.",
            ));
        }
        let declared = match framing {
            BodyFraming::Empty => Some(0),
            BodyFraming::Length(n) => Some(n),
            BodyFraming::Chunked => None,
        };
        let streaming = auth.payload.is_streaming();
        let decoded_len =
            match req.head.header_str("x-amz-decoded-content-length") {
                Some(v) => Some(v.parse::<u64>().map_err(|_| {
                    S3Error::invalid_argument("invalid x-amz-decoded-content-length")
                })?),
                None => None,
            };
        let size_hint = if streaming { decoded_len } else { declared };
        if size_hint.is_some_and(|n| n > PUT_BYTES_MAX) {
            return Err(S3Error::new(
                400,
                "EntityTooLarge",
                "Your proposed upload exceeds the maximum allowed object size.",
            ));
        }
        if streaming && decoded_len.is_none() && auth.payload == PayloadMode::StreamingSigned {
            return Err(S3Error::new(
                411,
                "MissingContentLength",
                "x-amz-decoded-content-length is required for aws-chunked uploads",
            ));
        }
        let content_md5 = content_md5(&req.head)?;
        if req.head.expects_continue() {
            conn.send_continue().await?;
        }
        let mut decoder = streaming.then(|| ChunkedDecoder::new(&auth.payload, auth, decoded_len));
        let expected_checksum = checksum::expected(&req.head)?;
        let mut checksum_hasher = expected_checksum
            .as_ref()
            .map(|e| checksum::Hasher::new(e.algorithm));
        let mut md5 = Md5::new();
        let mut sha = matches!(auth.payload, PayloadMode::Sha256(_)).then(Sha256::new);
        let mut input = vec![0u8; 256 * 1024];
        let mut decoded = Vec::new();
        let mut piece: Vec<u8> = Vec::with_capacity(PUT_PIECE_BYTES);
        let mut total = 0u64;
        loop {
            let n = conn.read_body(&mut input).await?;
            if n == 0 {
                break;
            }
            let data: &[u8] = match decoder.as_mut() {
                Some(d) => {
                    decoded.clear();
                    let mut at = 0;
                    while at < n {
                        let used = d.feed(&input[at..n], &mut decoded)?;
                        if used == 0 {
                            // The final chunk was seen and bytes follow it.
                            return Err(S3Error::new(
                                400,
                                "IncompleteBody",
                                "Unexpected data after the final aws-chunked chunk.",
                            ));
                        }
                        at += used;
                    }
                    &decoded
                }
                None => &input[..n],
            };
            total += data.len() as u64;
            if total > PUT_BYTES_MAX {
                return Err(S3Error::new(
                    400,
                    "EntityTooLarge",
                    "Your proposed upload exceeds the maximum allowed object size.",
                ));
            }
            md5.update(data);
            if let Some(h) = checksum_hasher.as_mut() {
                h.update(data);
            }
            if let Some(sha) = sha.as_mut() {
                sha.update(data);
            }
            let mut rest = data;
            while !rest.is_empty() {
                let take = (PUT_PIECE_BYTES - piece.len()).min(rest.len());
                piece.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if piece.len() == PUT_PIECE_BYTES {
                    let full = std::mem::replace(&mut piece, Vec::with_capacity(PUT_PIECE_BYTES));
                    sink.write(Bytes::from(full)).await?;
                }
            }
        }
        // Everything is verified before the object becomes visible.
        if let Some(d) = &decoder {
            d.finish()?;
            if decoded_len.is_some_and(|n| n != total) {
                return Err(S3Error::new(400, "IncompleteBody", "You did not provide the number of bytes specified by the Content-Length HTTP header."));
            }
        }
        if let (Some(sha), PayloadMode::Sha256(expected)) = (sha, &auth.payload) {
            let got: [u8; 32] = sha.finalize().into();
            auth.payload.check_body_sha256(&got)?;
            debug_assert_eq!(&got, expected);
        }
        let digest: [u8; 16] = md5.finalize().into();
        if content_md5.is_some_and(|m| m[..] != digest[..]) {
            return Err(S3Error::new(
                400,
                "BadDigest",
                "The Content-MD5 you specified did not match what we received.",
            ));
        }
        let mut stored = Vec::new();
        if let (Some(expected), Some(hasher)) = (expected_checksum, checksum_hasher) {
            let name = expected.algorithm.header();
            let sent = match expected.value {
                Some(v) => Some(v),
                None => decoder
                    .as_ref()
                    .and_then(|d| d.trailers().iter().find(|(n, _)| n == name))
                    .map(|(_, v)| v.clone()),
            };
            if sent.is_none() && req.head.header_str("x-amz-trailer").is_some() {
                return Err(S3Error::new(
                    400,
                    "InvalidRequest",
                    format!("The {name} trailer announced in x-amz-trailer was not sent."),
                ));
            }
            let got = hasher.finish_base64();
            if sent.as_ref().is_some_and(|v| *v != got) {
                return Err(checksum::mismatch(expected.algorithm));
            }
            stored.push((name.to_string(), got));
        }
        if !piece.is_empty() {
            sink.write(Bytes::from(piece)).await?;
        }
        let etag = hex::encode(digest);
        let info = sink.finish_with(etag, stored).await?;
        debug_assert_eq!(info.size_bytes, total);
        Ok(info)
    }

    async fn get_object(
        &self,
        conn: &mut Conn,
        req: &Request,
        head_only: bool,
    ) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let (mut source, meta) = ObjectSource::open(&self.shard, &req.bucket, &req.key).await?;
        let size = meta.size_bytes;
        if let Some(status) = check_conditions(&req.head, &meta)? {
            let mut head = ResponseHead::new(status);
            head.push_header("ETag", format!("\"{}\"", meta.etag));
            head.push_header("Last-Modified", http_date(meta.mtime_ms));
            return self.respond(conn, req, head, b"").await;
        }
        let (status, start, len) = match req.head.header("range") {
            None => (200, 0, size),
            Some(value) => match parse_range(value, size) {
                Ok(RangeSpec::Single(a, b)) => (206, a, b - a + 1),
                Ok(RangeSpec::Multi(ranges)) => {
                    return self
                        .get_byteranges(conn, req, source, &meta, &ranges, head_only)
                        .await;
                }
                Ok(RangeSpec::Whole) => (200, 0, size),
                // HEAD answers with the status alone (write_error sends no body).
                Err(_) => {
                    return Err(S3Error::new(
                        416,
                        "InvalidRange",
                        "The requested range is not satisfiable",
                    ));
                }
            },
        };
        let mut head = ResponseHead::new(status);
        head.push_header("ETag", format!("\"{}\"", meta.etag));
        head.push_header("Last-Modified", http_date(meta.mtime_ms));
        head.push_header("Accept-Ranges", "bytes");
        head.push_header("Content-Type", meta.content_type.clone());
        // Whole-object checksums only in checksum mode and for whole bodies
        // (a client would check a range against them and fail).
        let checksums = status == 200
            && req
                .head
                .header_str("x-amz-checksum-mode")
                .is_some_and(|m| m.eq_ignore_ascii_case("enabled"));
        for (name, value) in &meta.headers {
            if name.starts_with(checksum::HEADER_PREFIX) {
                if checksums {
                    head.push_header(name.clone(), value.clone());
                    head.push_header("x-amz-checksum-type", "FULL_OBJECT");
                }
                continue;
            }
            head.push_header(name.clone(), value.clone());
        }
        if status == 206 {
            head.push_header("Content-Range", content_range(start, start + len - 1, size));
        }
        head.push_header("x-amz-request-id", req.request_id.clone());
        conn.write_response(&head, len, false).await?;
        if head_only {
            conn.flush().await?;
            return Ok(());
        }
        let send_started = Instant::now();
        let mut offset = start;
        let end = start + len;
        let ring = self.shard.ring.borrow().clone();
        while offset < end {
            // The data path: DMA into a registered buffer, CRC check there,
            // send from that buffer (SEND_ZC above the threshold).
            if let Some(ring) = ring.as_deref() {
                let want = (end - offset).min(GET_PIECE_BYTES);
                if let Some(r) = source.read_fixed(ring, offset, want).await {
                    let (buf, a, b) = match r {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::error!(shard = self.shard.id, request_id = %req.request_id, bucket = %req.bucket, key = %req.key, "GET failed mid-body: {e:?}");
                            return Err(S3Error::internal("read failed mid-body"));
                        }
                    };
                    conn.flush().await?;
                    self.send_registered(conn, ring, buf, a, b).await?;
                    offset += (b - a) as u64;
                    continue;
                }
            }
            let chunk = match source
                .read(offset, (end - offset).min(GET_PIECE_BYTES))
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    // The status line is gone: cut the connection so the client
                    // sees a short body, never wrong bytes.
                    tracing::error!(shard = self.shard.id, bucket = %req.bucket, key = %req.key, "GET failed mid-body: {e:?}");
                    return Err(S3Error::internal("read failed mid-body"));
                }
            };
            if chunk.is_empty() {
                return Err(S3Error::internal("object shorter than its metadata"));
            }
            conn.write_body(&chunk).await?;
            offset += chunk.len() as u64;
        }
        conn.flush().await?;
        self.shard
            .metrics
            .stage(crate::metrics::Stage::Send)
            .record(send_started.elapsed());
        Ok(())
    }

    /// Sends `buf[a..b]` on the connection's socket through the shard's
    /// ring, within the body timeout. The buffer returns to the pool only
    /// after the kernel's last completion (SEND_ZC's notification).
    async fn send_registered(
        &self,
        conn: &mut Conn,
        ring: &crate::ring::DataRing,
        mut buf: crate::ring::PoolBuf,
        mut a: usize,
        b: usize,
    ) -> Result<(), S3Error> {
        use std::os::fd::AsRawFd;
        let fd = conn.get_ref().as_raw_fd();
        let limit = Duration::from_millis(conn.limits().body_timeout_ms.max(1));
        while a < b {
            let send = Box::pin(ring.send(fd, buf, a, b, conn.send_zc));
            let timer = Box::pin(glommio::timer::sleep(limit));
            let (result, back) = match futures::future::select(send, timer).await {
                futures::future::Either::Left((r, _)) => r,
                futures::future::Either::Right(_) => {
                    // The send (and its buffer) stays with the kernel until
                    // it completes; shutting the socket down completes it
                    // now, even if the client keeps the connection open.
                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                    return Err(S3Error::new(
                        408,
                        "RequestTimeout",
                        "The client stopped reading the response",
                    ));
                }
            };
            buf = back;
            match result {
                Ok((0, _)) => return Err(S3Error::internal("connection closed mid-body")),
                Ok((n, kind)) => {
                    a += n;
                    conn.body_bytes_written += n as u64;
                    if kind == crate::ring::SendKind::Copied {
                        conn.send_zc = false;
                    }
                }
                Err(e) => {
                    tracing::debug!(shard = self.shard.id, "send failed: {e}");
                    return Err(S3Error::internal(format!("send failed: {e}")));
                }
            }
        }
        Ok(())
    }

    /// Several ranges in one answer: `206 multipart/byteranges` (RFC 9110
    /// section 14.6), parts in request order.
    async fn get_byteranges(
        &self,
        conn: &mut Conn,
        req: &Request,
        mut source: ObjectSource,
        meta: &ObjectMeta,
        ranges: &[(u64, u64)],
        head_only: bool,
    ) -> Result<(), S3Error> {
        let size = meta.size_bytes;
        let boundary = format!("percore-{}", req.request_id);
        let part_heads: Vec<String> = ranges
            .iter()
            .map(|&(a, b)| {
                format!(
                    "--{boundary}\r\nContent-Type: {}\r\nContent-Range: {}\r\n\r\n",
                    meta.content_type,
                    content_range(a, b, size)
                )
            })
            .collect();
        let closing = format!("--{boundary}--\r\n");
        let total: u64 = ranges
            .iter()
            .zip(&part_heads)
            .map(|(&(a, b), h)| h.len() as u64 + (b - a + 1) + 2)
            .sum::<u64>()
            + closing.len() as u64;
        let mut head = ResponseHead::new(206);
        head.push_header("ETag", format!("\"{}\"", meta.etag));
        head.push_header("Last-Modified", http_date(meta.mtime_ms));
        head.push_header("Accept-Ranges", "bytes");
        head.push_header(
            "Content-Type",
            format!("multipart/byteranges; boundary={boundary}"),
        );
        head.push_header("x-amz-request-id", req.request_id.clone());
        conn.write_response(&head, total, false).await?;
        if head_only {
            conn.flush().await?;
            return Ok(());
        }
        for (&(a, b), part_head) in ranges.iter().zip(&part_heads) {
            conn.write_body(part_head.as_bytes()).await?;
            let mut offset = a;
            while offset <= b {
                let chunk = match source
                    .read(offset, (b + 1 - offset).min(GET_PIECE_BYTES))
                    .await
                {
                    Ok(c) if !c.is_empty() => c,
                    Ok(_) => return Err(S3Error::internal("object shorter than its metadata")),
                    Err(e) => {
                        tracing::error!(shard = self.shard.id, bucket = %req.bucket, key = %req.key, "GET failed mid-body: {e:?}");
                        return Err(S3Error::internal("read failed mid-body"));
                    }
                };
                conn.write_body(&chunk).await?;
                offset += chunk.len() as u64;
            }
            conn.write_body(b"\r\n").await?;
        }
        conn.write_body(closing.as_bytes()).await?;
        conn.flush().await?;
        Ok(())
    }

    async fn delete_object(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let owner = self.shard.owner_of(&req.bucket, &req.key);
        match self
            .shard
            .call(
                owner,
                Op::Delete {
                    bucket: req.bucket.clone(),
                    key: req.key.clone(),
                },
            )
            .await
        {
            Reply::Deleted(_) => self.respond(conn, req, ResponseHead::new(204), b"").await,
            Reply::Err(e) => Err(e.into()),
            other => Err(S3Error::internal(format!("unexpected reply {other:?}"))),
        }
    }
}

/// Query parameters naming S3 sub-resources that this slice does not serve;
/// a request carrying one must not be mistaken for a plain GET/PUT.
const SUBRESOURCES: [&str; 24] = [
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
];

/// The S3 API operation a request head names, for metrics and logs. Bucket
/// vs object is told by the path (virtual-hosted requests count as the
/// bucket form when their path is `/`).
fn operation_name(head: &RequestHead, virtual_host: bool) -> &'static str {
    let path = head.path.trim_start_matches('/');
    let (path, object) = if virtual_host {
        ("bucket", !path.is_empty())
    } else {
        (
            path,
            path.split_once('/').is_some_and(|(_, k)| !k.is_empty()),
        )
    };
    let has = |name: &str| {
        head.query
            .split('&')
            .any(|p| p.split('=').next() == Some(name))
    };
    let method = head.method.as_str();
    if path.is_empty() {
        return if method == "GET" {
            "ListBuckets"
        } else {
            "Other"
        };
    }
    if !object {
        return match method {
            "PUT" => "CreateBucket",
            "HEAD" => "HeadBucket",
            "DELETE" => "DeleteBucket",
            "POST" if has("delete") => "DeleteObjects",
            "GET" if has("location") => "GetBucketLocation",
            "GET" if has("uploads") => "ListMultipartUploads",
            "GET" if has("versions") => "ListObjectVersions",
            "GET" if has("versioning") => "GetBucketVersioning",
            "GET" if has("list-type") => "ListObjectsV2",
            "GET" => "ListObjects",
            _ => "Other",
        };
    }
    let copy = head.header("x-amz-copy-source").is_some();
    match method {
        "PUT" if has("uploadId") && copy => "UploadPartCopy",
        "PUT" if has("uploadId") => "UploadPart",
        "PUT" if copy => "CopyObject",
        "PUT" => "PutObject",
        "POST" if has("uploads") => "CreateMultipartUpload",
        "POST" if has("uploadId") => "CompleteMultipartUpload",
        "DELETE" if has("uploadId") => "AbortMultipartUpload",
        "DELETE" => "DeleteObject",
        "GET" if has("uploadId") => "ListParts",
        "GET" if has("attributes") => "GetObjectAttributes",
        "GET" => "GetObject",
        "HEAD" => "HeadObject",
        _ => "Other",
    }
}

fn etag_matches(list: &str, etag: &str) -> bool {
    super::etag::etag_list_matches(list, etag)
}

/// The decoded Content-MD5 header, if sent; InvalidDigest if malformed.
fn content_md5(head: &RequestHead) -> Result<Option<Vec<u8>>, S3Error> {
    head.header_str("content-md5")
        .map(|v| {
            base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .ok()
                .filter(|d| d.len() == 16)
                .ok_or_else(|| {
                    S3Error::new(
                        400,
                        "InvalidDigest",
                        "The Content-MD5 you specified is not valid.",
                    )
                })
        })
        .transpose()
}

/// PutObject's If-None-Match (only `*`) and If-Match.
fn put_condition(head: &RequestHead) -> Result<Option<PutCondition>, S3Error> {
    match (
        head.header_str("if-none-match"),
        head.header_str("if-match"),
    ) {
        (None, None) => Ok(None),
        (Some(v), None) if v.trim() == "*" => Ok(Some(PutCondition::IfNoneMatchAny)),
        (Some(_), None) => Err(S3Error::new(
            501,
            "NotImplemented",
            "PutObject accepts If-None-Match: * only",
        )),
        (None, Some(v)) => Ok(Some(PutCondition::IfMatch(super::etag::parse_list(v)))),
        (Some(_), Some(_)) => Err(S3Error::invalid_argument(
            "If-Match and If-None-Match cannot be combined on PutObject",
        )),
    }
}

fn parse_http_date_ms(v: &str) -> Option<u64> {
    httpdate::parse_http_date(v)
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// RFC 7232 evaluation order as S3 applies it. Some(status) ends the request.
fn check_conditions(head: &RequestHead, meta: &ObjectMeta) -> Result<Option<u16>, S3Error> {
    check_conditions_with(
        head.header_str("if-match"),
        head.header_str("if-none-match"),
        head.header_str("if-modified-since"),
        head.header_str("if-unmodified-since"),
        meta,
    )
}

/// The same tests on explicit header values (CopyObject's
/// x-amz-copy-source-if-* headers use them too).
fn check_conditions_with(
    if_match: Option<&str>,
    if_none_match: Option<&str>,
    if_modified_since: Option<&str>,
    if_unmodified_since: Option<&str>,
    meta: &ObjectMeta,
) -> Result<Option<u16>, S3Error> {
    let mtime_s = meta.mtime_ms / 1000;
    if let Some(v) = if_match {
        if !etag_matches(v, &meta.etag) {
            return Err(S3Error::new(
                412,
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
            ));
        }
    } else if let Some(since) = if_unmodified_since.and_then(parse_http_date_ms) {
        if mtime_s > since / 1000 {
            return Err(S3Error::new(
                412,
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
            ));
        }
    }
    if let Some(v) = if_none_match {
        if etag_matches(v, &meta.etag) {
            return Ok(Some(304));
        }
    } else if let Some(since) = if_modified_since.and_then(parse_http_date_ms) {
        if mtime_s <= since / 1000 {
            return Ok(Some(304));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_token_with_nul_is_refused() {
        let encode = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        assert_eq!(
            decode_continuation_token(&encode("dir/a")).unwrap(),
            "dir/a"
        );
        // Internal multipart keys start with NUL ("\0u/", "\0p/"): a forged
        // token among them (with a delimiter it ends on) listed them.
        for forged in ["\0", "\0!", "\0u/", "a\0b"] {
            let err = decode_continuation_token(&encode(forged)).unwrap_err();
            assert_eq!(
                (err.status, err.code),
                (400, "InvalidArgument"),
                "{forged:?}"
            );
        }
        assert!(decode_continuation_token("not base64!").is_err());
    }
}
