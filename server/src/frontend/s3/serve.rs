//! The S3 connection loop: reads request heads, routes each once, counts
//! it in the metrics and access log under its [`S3Op`] name, authenticates
//! it and dispatches it to its handler; errors become S3 XML error bodies.

use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use glommio::net::TcpStream;
use md5::{Digest, Md5};
use sha2::Sha256;

use super::conditional::content_md5;
use super::route::{route, unimplemented_name, virtual_host_bucket, Route, S3Op};
use super::{checksum, xml, Conn, Request, S3Front};
use crate::access::Principal;
use crate::bucket_config::ConfigKind::{Cors, Lifecycle, Policy, Tagging};
use crate::frontend::common::peer_is_loopback;
use crate::frontend::http::{HttpConn, RequestHead, ResponseHead};
use crate::frontend::s3::auth::{self, AuthInput, HeaderView, Verified};
use crate::frontend::s3::error::S3Error;
use crate::metrics::ShardMetrics;
use crate::store::versions::Pick;

const CLOCK_SKEW_MAX: Duration = Duration::from_secs(15 * 60);

impl S3Front {
    /// Serves one connection until it closes, errs or the server drains.
    pub async fn serve_connection(self: Rc<Self>, stream: TcpStream) {
        let m = self.shard.metrics();
        m.connections_open.set(m.connections_open.get() + 1);
        self.serve_connection_inner(stream).await;
        m.connections_open.set(m.connections_open.get() - 1);
    }

    async fn serve_connection_inner(&self, stream: TcpStream) {
        let loopback = peer_is_loopback(&stream);
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
            let m = self.shard.metrics();
            m.requests_in_flight.set(m.requests_in_flight.get() + 1);
            let started = Instant::now();
            let (read0, written0) = (conn.body_bytes_read, conn.body_bytes_written);
            let routed = route(
                &head,
                virtual_host_bucket(&head, self.cfg.domain.as_deref()),
            );
            let op = routed.op.name();
            let method = head.method.clone();
            let target = match (self.cfg.access_log, head.query.is_empty()) {
                (false, _) => None,
                (true, true) => Some(head.path.clone()),
                (true, false) => Some(format!("{}?{}", head.path, head.query)),
            };
            conn.last_status = 0;
            let keep_alive = self.handle(&mut conn, head, routed, loopback).await;
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

    /// Handles one routed request; returns whether the connection stays
    /// open.
    async fn handle(
        &self,
        conn: &mut Conn,
        head: RequestHead,
        routed: Route,
        loopback: bool,
    ) -> bool {
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
        if self.shard.is_cluster()
            && head.path.starts_with("/_percore/")
            && head.header(crate::cluster::peer_http::HEADER).is_some()
        {
            return self.handle_internal(conn, head, request_id, loopback).await;
        }
        let req = match routed.target {
            Ok(t) => Request {
                head,
                op: routed.op,
                bucket: t.bucket,
                key: t.key,
                query: t.query,
                request_id: request_id.clone(),
            },
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

    /// A node-to-node request (`/_percore/...`); the connection closes
    /// after it.
    async fn handle_internal(
        &self,
        conn: &mut Conn,
        head: RequestHead,
        request_id: String,
        loopback: bool,
    ) -> bool {
        let query = match super::route::parse_query(&head.query) {
            Ok(q) => q,
            Err(e) => {
                let _ = self
                    .write_error(conn, &e, "", &request_id, true, false)
                    .await;
                return false;
            }
        };
        let req = Request {
            head,
            op: S3Op::NotImplemented,
            bucket: String::new(),
            key: String::new(),
            query,
            request_id,
        };
        match self.internal(conn, &req, loopback).await {
            // A copy answered in full on a connection its sender keeps
            // (`peer_http::pool_put`); every other internal answer closes.
            Ok(()) => {
                req.head.path == "/_percore/push"
                    && req.head.keep_alive()
                    && conn.last_status == 200
                    && conn.body_finished()
            }
            Err(e) => {
                if conn.last_status == 0 {
                    let _ = self
                        .write_error(conn, &e, "", &req.request_id, true, false)
                        .await;
                }
                false
            }
        }
    }

    /// Authenticates the request, then runs its operation. Copies arrive
    /// through the PUT handlers (they check the part number, then the
    /// copy source, in that order).
    async fn dispatch(
        &self,
        conn: &mut Conn,
        req: &Request,
        loopback: bool,
    ) -> Result<(), S3Error> {
        // A cluster node answers by the cluster's buckets only, and only
        // while etcd confirms its copy of them (`catalog::serving`).
        if self.shard.is_cluster() && !crate::cluster::catalog::serving() {
            return Err(S3Error::new(
                503,
                "ServiceUnavailable",
                "This cluster node cannot confirm the cluster's buckets with etcd right now (starting, or etcd unreachable from it); retry shortly, or through another node.",
            ));
        }
        self.add_cors_headers(conn, req);
        if req.op == S3Op::CorsPreflight {
            return self.cors_preflight(conn, req).await;
        }
        let auth = self.authenticate(req, loopback)?;
        self.authorize(req, &auth.principal)?;
        // A version id that names no version percore could have written
        // is refused before any handler, rather than ignored (deleting an
        // old version must never delete the current object).
        if req.q("versionId").is_some_and(|v| Pick::parse(v).is_none()) {
            return Err(S3Error::invalid_argument("Invalid version id specified"));
        }
        // A cluster node: the key's owner serves it; a bucket change goes
        // to the cluster's catalog in etcd (`cluster`).
        let claim = self.node_claim(req, loopback)?;
        match self.plan(req, claim.as_ref())? {
            super::cluster::Plan::Here => {}
            super::cluster::Plan::Forward(peer) => return self.forward(conn, req, peer).await,
        }
        match req.op {
            S3Op::ListBuckets => self.list_buckets(conn, req, &auth).await,
            S3Op::CreateBucket => self.create_bucket(conn, req, &auth).await,
            S3Op::HeadBucket => self.head_bucket(conn, req).await,
            S3Op::DeleteBucket => self.delete_bucket(conn, req).await,
            S3Op::GetBucketLocation => self.get_bucket_location(conn, req).await,
            S3Op::GetBucketVersioning => self.get_bucket_versioning(conn, req).await,
            S3Op::PutBucketVersioning => self.put_bucket_versioning(conn, req, &auth).await,
            S3Op::ListMultipartUploads => self.list_multipart_uploads(conn, req).await,
            S3Op::ListObjectVersions => self.list_object_versions(conn, req).await,
            S3Op::DeleteObjects => self.delete_objects(conn, req, &auth).await,
            S3Op::BatchGet => self.batch_get(conn, req, &auth).await,
            S3Op::GetBucketAcl | S3Op::GetObjectAcl => self.get_acl(conn, req).await,
            S3Op::PutBucketAcl | S3Op::PutObjectAcl => self.put_acl(conn, req, &auth).await,
            S3Op::GetBucketTagging => self.get_bucket_config(conn, req, Tagging).await,
            S3Op::GetBucketCors => self.get_bucket_config(conn, req, Cors).await,
            S3Op::GetBucketLifecycleConfiguration => {
                self.get_bucket_config(conn, req, Lifecycle).await
            }
            S3Op::PutBucketTagging => self.put_bucket_config(conn, req, &auth, Tagging).await,
            S3Op::PutBucketCors => self.put_bucket_config(conn, req, &auth, Cors).await,
            S3Op::PutBucketLifecycleConfiguration => {
                self.put_bucket_config(conn, req, &auth, Lifecycle).await
            }
            S3Op::DeleteBucketTagging => self.delete_bucket_config(conn, req, Tagging).await,
            S3Op::DeleteBucketCors => self.delete_bucket_config(conn, req, Cors).await,
            S3Op::DeleteBucketLifecycle => self.delete_bucket_config(conn, req, Lifecycle).await,
            S3Op::GetBucketPolicy => self.get_bucket_config(conn, req, Policy).await,
            S3Op::PutBucketPolicy => self.put_bucket_config(conn, req, &auth, Policy).await,
            S3Op::DeleteBucketPolicy => self.delete_bucket_config(conn, req, Policy).await,
            S3Op::GetBucketPolicyStatus => self.get_bucket_policy_status(conn, req).await,
            S3Op::GetObjectTagging => self.get_object_tagging(conn, req).await,
            S3Op::PutObjectTagging => self.put_object_tagging(conn, req, &auth).await,
            S3Op::DeleteObjectTagging => self.delete_object_tagging(conn, req).await,
            S3Op::CorsPreflight => self.cors_preflight(conn, req).await,
            S3Op::ListObjectsV2 => self.list_objects(conn, req, true).await,
            S3Op::ListObjects => self.list_objects(conn, req, false).await,
            S3Op::PutObject | S3Op::CopyObject => self.put_object(conn, req, &auth).await,
            S3Op::GetObject => self.get_object(conn, req, false).await,
            S3Op::HeadObject => self.get_object(conn, req, true).await,
            S3Op::DeleteObject => self.delete_object(conn, req).await,
            S3Op::GetObjectAttributes => self.get_object_attributes(conn, req).await,
            S3Op::CreateMultipartUpload => self.create_multipart(conn, req).await,
            S3Op::UploadPart | S3Op::UploadPartCopy => self.upload_part(conn, req, &auth).await,
            S3Op::CompleteMultipartUpload => self.complete_multipart(conn, req, &auth).await,
            S3Op::AbortMultipartUpload => self.abort_multipart(conn, req).await,
            S3Op::ListParts => self.list_parts(conn, req).await,
            S3Op::NotImplemented => {
                let query: Vec<(&str, &str)> = req
                    .query
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                let on_object = !req.key.is_empty();
                let what =
                    unimplemented_name(&req.head.method, on_object, &query).unwrap_or_else(|| {
                        let on = if on_object { "an object" } else { "a bucket" };
                        format!("{} on {on} with this query", req.head.method)
                    });
                Err(S3Error::not_implemented(&what))
            }
            S3Op::MethodNotAllowed => Err(S3Error::new(
                405,
                "MethodNotAllowed",
                "The specified method is not allowed against this resource.",
            )),
        }
    }

    pub(super) async fn write_error(
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

    pub(super) async fn respond(
        &self,
        conn: &mut Conn,
        req: &Request,
        mut head: ResponseHead,
        body: &[u8],
    ) -> Result<(), S3Error> {
        // A cluster node answers a write once its replicas hold it.
        self.replicate_write(req, &head).await?;
        head.push_header("x-amz-request-id", req.request_id.clone());
        conn.write_response(&head, body.len() as u64, false).await?;
        if !body.is_empty() {
            conn.write_body(body).await?;
        }
        conn.flush().await?;
        Ok(())
    }

    pub(super) async fn respond_xml(
        &self,
        conn: &mut Conn,
        req: &Request,
        body: &str,
    ) -> Result<(), S3Error> {
        let head = ResponseHead::new(200).with_header("Content-Type", "application/xml");
        self.respond(conn, req, head, body.as_bytes()).await
    }

    pub(super) fn authenticate(&self, req: &Request, loopback: bool) -> Result<Verified, S3Error> {
        let headers: Vec<HeaderView> = req
            .head
            .headers
            .iter()
            .map(|(n, v)| HeaderView {
                name: n.as_str(),
                value: v.as_slice(),
            })
            .collect();
        let virtual_bucket = virtual_host_bucket(&req.head, self.cfg.domain.as_deref());
        let input = AuthInput {
            method: &req.head.method,
            raw_path: &req.head.path,
            raw_query: &req.head.query,
            headers: &headers,
            virtual_bucket: virtual_bucket.as_deref(),
        };
        let creds = &self.cfg.credentials;
        let lookup = |ak: &str| {
            if ak == creds.access_key {
                Some(creds.secret_key.clone())
            } else {
                self.shard
                    .user_by_access_key(ak)
                    .map(|u| u.secret_key.clone())
            }
        };
        let mut verified = match auth::verify(&input, &lookup, SystemTime::now(), CLOCK_SKEW_MAX) {
            // No signature at all: anonymous, allowed only what a bucket
            // policy or ACL grants to everyone (`authz`).
            Err(auth::AuthError::Missing) => return Ok(Verified::anonymous()),
            other => other?,
        };
        verified.principal = self
            .principal_of(&verified.access_key)
            .ok_or_else(|| S3Error::from(auth::AuthError::InvalidAccessKeyId))?;
        if verified.principal == Principal::Root && !creds.allowed_from(loopback) {
            return Err(S3Error::new(
                403,
                "AccessDenied",
                "The default credentials are accepted from loopback only; start the server with PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY set.",
            ));
        }
        Ok(verified)
    }

    /// Reads a whole request body of at most `max` bytes.
    pub(super) async fn read_small_body(
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

    /// Reads a small request body, verifying its SHA-256 when signed and
    /// its Content-MD5 when sent; see [`BodyCheck`] for checksum headers.
    pub(super) async fn read_verified_body(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
        max: usize,
        check: BodyCheck,
    ) -> Result<Vec<u8>, S3Error> {
        if auth.payload.is_streaming() {
            return Err(S3Error::invalid_argument(
                "aws-chunked encoding is accepted for object and part uploads only",
            ));
        }
        let body = self.read_small_body(conn, req, max).await?;
        let sha: [u8; 32] = Sha256::digest(&body).into();
        auth.payload.check_body_sha256(&sha)?;
        let mut covered = !matches!(auth.payload, auth::PayloadMode::Unsigned);
        if let Some(want) = content_md5(&req.head)? {
            if want[..] != Md5::digest(&body)[..] {
                return Err(S3Error::new(
                    400,
                    "BadDigest",
                    "The Content-MD5 you specified did not match what we received.",
                ));
            }
            // An unsigned Content-MD5 proves nothing: whoever holds a
            // presigned URL can send any body with a matching one.
            covered |= auth.content_md5_signed;
        }
        // x-amz-* headers are signed (the auth layer refuses unsigned ones).
        let checksum_header = match check {
            BodyCheck::Complete => None,
            BodyCheck::Verify | BodyCheck::Covered => checksum::expected(&req.head)?,
        };
        if let Some(expected) = checksum_header {
            if let Some(value) = expected.value {
                let mut h = checksum::Hasher::new(expected.algorithm);
                h.update(&body);
                if h.finish_base64() != value {
                    return Err(checksum::mismatch(expected.algorithm));
                }
                covered = true;
            }
        }
        if matches!(check, BodyCheck::Covered) && !covered {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "Missing required header for this request: Content-MD5 (or an x-amz-checksum-* header, or a signed payload)",
            ));
        }
        Ok(body)
    }
}

/// How `read_verified_body` treats `x-amz-checksum-*` headers.
pub(super) enum BodyCheck {
    /// CompleteMultipartUpload: they are the completed object's checksum,
    /// not the body's; not checked here.
    Complete,
    /// Verified against the body when sent.
    Verify,
    /// Verified when sent, and the body must be covered by the signature,
    /// a signed Content-MD5 or a checksum header (DeleteObjects, as S3
    /// requires): else a request captured in its validity window could be
    /// replayed with another body.
    Covered,
}
