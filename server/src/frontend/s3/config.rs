//! Bucket configurations and object tags over S3: Get/Put/Delete of
//! BucketTagging, BucketCors and BucketLifecycle(Configuration), of
//! ObjectTagging, and CORS itself: the browser's preflight (`OPTIONS`,
//! unauthenticated, answered from the bucket's rules) and the headers an
//! actual request with `Origin` gets back.
//!
//! A Put's body is parsed into its model (`bucket_config`), and its
//! normalized XML is what is stored and what a Get answers.

use bytes::Bytes;

use super::serve::BodyCheck;
use super::versions::with_version;
use super::{Conn, Request, S3Front};
use crate::access::policy::Policy;
use crate::bucket_config::cors::CorsRule;
use crate::bucket_config::lifecycle::Lifecycle;
use crate::bucket_config::tagging::{TagSet, BUCKET_TAGS_MAX, OBJECT_TAGS_HEADER, OBJECT_TAGS_MAX};
use crate::bucket_config::{cors::Cors, ConfigKind};
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::auth::Verified;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml;
use crate::shard::object::ObjectSource;

fn no_such(kind: ConfigKind) -> S3Error {
    match kind {
        ConfigKind::Tagging => S3Error::new(404, "NoSuchTagSet", "The TagSet does not exist"),
        ConfigKind::Cors => S3Error::new(
            404,
            "NoSuchCORSConfiguration",
            "The CORS configuration does not exist",
        ),
        ConfigKind::Lifecycle => S3Error::new(
            404,
            "NoSuchLifecycleConfiguration",
            "The lifecycle configuration does not exist",
        ),
        ConfigKind::Policy => S3Error::new(
            404,
            "NoSuchBucketPolicy",
            "The bucket policy does not exist",
        ),
        ConfigKind::Owner | ConfigKind::Acl | ConfigKind::Versioning => {
            S3Error::internal("not a document kind")
        }
    }
}

fn cors_forbidden(message: &str) -> S3Error {
    S3Error::new(403, "AccessForbidden", format!("CORSResponse: {message}"))
}

/// Response headers for a request from `origin` that `rule` allows.
fn cors_headers(rule: &CorsRule, origin: &str) -> Vec<(std::borrow::Cow<'static, str>, String)> {
    let allow_origin = rule.allow_origin(origin);
    let mut h: Vec<(std::borrow::Cow<'static, str>, String)> = vec![
        (
            "Access-Control-Allow-Origin".into(),
            allow_origin.to_string(),
        ),
        (
            "Access-Control-Allow-Methods".into(),
            rule.methods.join(", "),
        ),
    ];
    if allow_origin != "*" {
        h.push(("Access-Control-Allow-Credentials".into(), "true".into()));
    }
    if !rule.expose.is_empty() {
        h.push((
            "Access-Control-Expose-Headers".into(),
            rule.expose.join(", "),
        ));
    }
    if let Some(age) = rule.max_age_secs {
        h.push(("Access-Control-Max-Age".into(), age.to_string()));
    }
    h.push((
        "Vary".into(),
        "Origin, Access-Control-Request-Headers, Access-Control-Request-Method".into(),
    ));
    h
}

impl S3Front {
    /// An actual request carrying `Origin` to a bucket whose CORS rules
    /// allow it: every response to it (errors too, so that a page can read
    /// them) gets the CORS headers.
    pub(super) fn add_cors_headers(&self, conn: &mut Conn, req: &Request) {
        let Some(origin) = req.head.header_str("origin") else {
            return;
        };
        if req.bucket.is_empty() {
            return;
        }
        let Some(cors) = self.shard.bucket_config(&req.bucket).and_then(|c| c.cors) else {
            return;
        };
        if let Some(rule) = cors.find(origin, &req.head.method, &[]) {
            conn.extra_headers = cors_headers(rule, origin);
        }
    }

    /// `OPTIONS`: a browser asks whether it may send a request.
    pub(super) async fn cors_preflight(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        let origin = req.head.header_str("origin").ok_or_else(|| {
            S3Error::new(
                400,
                "BadRequest",
                "Insufficient information. Origin request header needed.",
            )
        })?;
        let method = req
            .head
            .header_str("access-control-request-method")
            .ok_or_else(|| {
                S3Error::new(
                    400,
                    "BadRequest",
                    "Invalid Access-Control-Request-Method: null",
                )
            })?;
        let requested = req
            .head
            .header_str("access-control-request-headers")
            .unwrap_or("");
        let requested: Vec<&str> = requested
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .collect();
        // A missing bucket answers as one without rules: the preflight is
        // unauthenticated and must not tell which buckets exist.
        let cors = self
            .shard
            .bucket_config(&req.bucket)
            .and_then(|c| c.cors)
            .ok_or_else(|| cors_forbidden("CORS is not enabled for this bucket."))?;
        let rule = cors
            .find(origin, method, &requested)
            .ok_or_else(|| cors_forbidden("This CORS request is not allowed. This is usually because the evalution of Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers are not whitelisted by the resource's CORS spec."))?;
        let mut head = ResponseHead::new(200);
        for (name, value) in cors_headers(rule, origin) {
            head.push_header(name, value);
        }
        if !requested.is_empty() {
            head.push_header("Access-Control-Allow-Headers", requested.join(", "));
        }
        self.respond(conn, req, head, b"").await
    }

    /// A configuration or tagging body of an existing bucket: as S3 asks,
    /// covered by the signature or by a checksum header that is verified.
    pub(super) async fn read_config_body(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<Vec<u8>, S3Error> {
        self.require_bucket(req)?;
        self.read_verified_body(
            conn,
            req,
            auth,
            xml::PARSE_BODY_BYTES_MAX,
            BodyCheck::Covered,
        )
        .await
    }

    pub(super) async fn get_bucket_config(
        &self,
        conn: &mut Conn,
        req: &Request,
        kind: ConfigKind,
    ) -> Result<(), S3Error> {
        let config = self
            .shard
            .bucket_config(&req.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        let body = match kind {
            ConfigKind::Tagging => config.tagging.map(|t| t.to_xml()),
            ConfigKind::Cors => config.cors.map(|c| c.to_xml()),
            ConfigKind::Lifecycle => config.lifecycle.map(|l| l.to_xml()),
            ConfigKind::Policy => {
                let text = config.policy_text.ok_or_else(|| no_such(kind))?;
                let head = ResponseHead::new(200).with_header("Content-Type", "application/json");
                return self.respond(conn, req, head, text.as_bytes()).await;
            }
            ConfigKind::Owner | ConfigKind::Acl | ConfigKind::Versioning => None,
        };
        let body = body.ok_or_else(|| no_such(kind))?;
        self.respond_xml(conn, req, &body).await
    }

    pub(super) async fn put_bucket_config(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
        kind: ConfigKind,
    ) -> Result<(), S3Error> {
        let owner = self.authorized_owner(&req.bucket);
        let body = self.read_config_body(conn, req, auth).await?;
        let doc = match kind {
            ConfigKind::Tagging => TagSet::parse_xml(&body, BUCKET_TAGS_MAX)?.to_xml(),
            ConfigKind::Cors => Cors::parse(&body)?.to_xml(),
            ConfigKind::Lifecycle => Lifecycle::parse(&body)?.to_xml(),
            ConfigKind::Policy => {
                // Checked, then kept as given: GetBucketPolicy answers it.
                Policy::parse(&body, &req.bucket)?;
                String::from_utf8(body)
                    .map_err(|_| S3Error::new(400, "MalformedPolicy", "A policy is UTF-8 JSON"))?
            }
            ConfigKind::Owner | ConfigKind::Acl | ConfigKind::Versioning => {
                return Err(S3Error::internal("not a document kind"))
            }
        };
        self.set_bucket_doc((&req.bucket, owner), kind, Some(Bytes::from(doc)))
            .await?;
        let status = if matches!(kind, ConfigKind::Tagging | ConfigKind::Policy) {
            204
        } else {
            200
        };
        self.respond(conn, req, ResponseHead::new(status), b"")
            .await
    }

    pub(super) async fn delete_bucket_config(
        &self,
        conn: &mut Conn,
        req: &Request,
        kind: ConfigKind,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let owner = self.authorized_owner(&req.bucket);
        self.set_bucket_doc((&req.bucket, owner), kind, None)
            .await?;
        self.respond(conn, req, ResponseHead::new(204), b"").await
    }

    /// GetBucketPolicyStatus: public when an Allow names everyone.
    pub(super) async fn get_bucket_policy_status(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        let config = self
            .shard
            .bucket_config(&req.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        let policy = config.policy.ok_or_else(|| no_such(ConfigKind::Policy))?;
        let mut out = String::with_capacity(160);
        xml::push_open_root(&mut out, "PolicyStatus");
        xml::push_bool_element(&mut out, "IsPublic", policy.is_public());
        out.push_str("</PolicyStatus>");
        self.respond_xml(conn, req, &out).await
    }

    pub(super) async fn get_object_tagging(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let opened =
            ObjectSource::open_version(&self.shard, &req.bucket, &req.key, req.pick()).await;
        let (source, meta, version) = self.versioned(conn, opened)?;
        drop(source);
        let tags = match meta.headers.iter().find(|(n, _)| n == OBJECT_TAGS_HEADER) {
            // Stored tags were checked when written; read them leniently.
            Some((_, v)) => TagSet::parse_query(v, usize::MAX)?,
            None => TagSet::default(),
        };
        let mut head = ResponseHead::new(200).with_header("Content-Type", "application/xml");
        if let Some(v) = version {
            head = head.with_header("x-amz-version-id", &v);
        }
        self.respond(conn, req, head, tags.to_xml().as_bytes())
            .await
    }

    pub(super) async fn put_object_tagging(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        let body = self.read_config_body(conn, req, auth).await?;
        let tags = TagSet::parse_xml(&body, OBJECT_TAGS_MAX)?;
        let value = (!tags.0.is_empty()).then(|| tags.to_query());
        let set = self
            .shard
            .set_object_tags(&req.bucket, &req.key, req.pick(), value)
            .await;
        let version = self.versioned(conn, set)?;
        self.respond(
            conn,
            req,
            with_version(ResponseHead::new(200), version),
            b"",
        )
        .await
    }

    pub(super) async fn delete_object_tagging(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let set = self
            .shard
            .set_object_tags(&req.bucket, &req.key, req.pick(), None)
            .await;
        let version = self.versioned(conn, set)?;
        self.respond(
            conn,
            req,
            with_version(ResponseHead::new(204), version),
            b"",
        )
        .await
    }
}
