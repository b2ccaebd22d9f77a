//! Get/PutBucketAcl and Get/PutObjectAcl over the ownership model of
//! `access`: a Get answers the owner's FULL_CONTROL (plus READ for
//! AllUsers on a bucket with the public-read canned ACL). A Put takes the
//! canned ACLs `private` and `bucket-owner-full-control` (objects and
//! buckets: nothing to change) and `public-read` (buckets: anyone may list
//! it); wider ACLs, grant headers and ACL bodies are NotImplemented rather
//! than silently ignored: a bucket policy grants the rest.

use bytes::Bytes;

use super::serve::BodyCheck;
use super::{Conn, Request, S3Front};
use crate::bucket_config::ConfigKind;
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::auth::Verified;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml::{self, push_element, push_open_root, push_owner, OWNER_ID_DEFAULT};
use crate::shard::object::ObjectSource;

/// The group every request belongs to, anonymous ones included.
const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";

/// Canned ACLs that grant nothing beyond the owner's FULL_CONTROL.
const OWNER_ONLY: [&str; 2] = ["private", "bucket-owner-full-control"];

impl S3Front {
    /// The bucket or object must exist (NoSuchBucket / NoSuchKey).
    async fn require_target(&self, req: &Request) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        if !req.key.is_empty() {
            let (source, _) = ObjectSource::open(&self.shard, &req.bucket, &req.key).await?;
            drop(source);
        }
        Ok(())
    }

    pub(super) async fn get_acl(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        self.require_target(req).await?;
        let config = self.shard.bucket_config(&req.bucket).unwrap_or_default();
        let owner = config
            .owner
            .as_deref()
            .unwrap_or(OWNER_ID_DEFAULT)
            .to_string();
        let mut out = String::with_capacity(768);
        push_open_root(&mut out, "AccessControlPolicy");
        push_owner(&mut out, &owner);
        out.push_str("<AccessControlList><Grant>");
        out.push_str("<Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"CanonicalUser\">");
        push_element(&mut out, "ID", &owner);
        push_element(&mut out, "DisplayName", &owner);
        out.push_str("</Grantee>");
        push_element(&mut out, "Permission", "FULL_CONTROL");
        out.push_str("</Grant>");
        if config.public_read && req.key.is_empty() {
            out.push_str("<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"Group\">");
            push_element(&mut out, "URI", ALL_USERS);
            out.push_str("</Grantee>");
            push_element(&mut out, "Permission", "READ");
            out.push_str("</Grant>");
        }
        out.push_str("</AccessControlList></AccessControlPolicy>");
        self.respond_xml(conn, req, &out).await
    }

    pub(super) async fn put_acl(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        let owner = self.authorized_owner(&req.bucket);
        let body = self
            .read_verified_body(
                conn,
                req,
                auth,
                xml::PARSE_BODY_BYTES_MAX,
                BodyCheck::Verify,
            )
            .await?;
        self.require_target(req).await?;
        let on_bucket = req.key.is_empty();
        let what = if on_bucket {
            "PutBucketAcl"
        } else {
            "PutObjectAcl"
        };
        let grants = req.head.headers.iter().any(|(name, _)| {
            name.get(..12)
                .is_some_and(|p| p.eq_ignore_ascii_case("x-amz-grant-"))
        });
        if grants || !body.iter().all(u8::is_ascii_whitespace) {
            return Err(S3Error::not_implemented(&format!(
                "{what} with grants (use a canned ACL or a bucket policy)"
            )));
        }
        let acl = req.head.header_str("x-amz-acl").map(str::trim);
        let public = match acl {
            None => return self.respond(conn, req, ResponseHead::new(200), b"").await,
            Some(a) if OWNER_ONLY.contains(&a) => false,
            Some("public-read") if on_bucket => true,
            Some(a) => {
                return Err(S3Error::not_implemented(&format!(
                    "{what} with the {a} ACL (buckets take private and public-read; objects private; a bucket policy grants the rest)"
                )));
            }
        };
        if on_bucket {
            let doc = public.then(|| Bytes::from_static(b"public-read"));
            self.set_bucket_doc((&req.bucket, owner), ConfigKind::Acl, doc)
                .await?;
        }
        self.respond(conn, req, ResponseHead::new(200), b"").await
    }
}
