//! Get/PutBucketAcl and Get/PutObjectAcl, for the model percore has today:
//! one owner (the server's credentials), every bucket and object private
//! to it. A Get answers the owner's FULL_CONTROL; a Put that asks for
//! exactly that (`x-amz-acl: private` or `bucket-owner-full-control`, or
//! no canned ACL, grant header or body) succeeds and changes nothing;
//! anything wider (public-read, grants to others) is NotImplemented rather
//! than silently ignored. Users and bucket policies (issue 20, item 2) will
//! replace this with real grants.

use super::serve::BodyCheck;
use super::{Conn, Request, S3Front};
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::auth::Verified;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml::{self, push_element, push_open_root, push_owner, OWNER_ID_DEFAULT};
use crate::shard::object::ObjectSource;

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
        let mut out = String::with_capacity(512);
        push_open_root(&mut out, "AccessControlPolicy");
        push_owner(&mut out, OWNER_ID_DEFAULT);
        out.push_str("<AccessControlList><Grant>");
        out.push_str("<Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"CanonicalUser\">");
        push_element(&mut out, "ID", OWNER_ID_DEFAULT);
        push_element(&mut out, "DisplayName", OWNER_ID_DEFAULT);
        out.push_str("</Grantee>");
        push_element(&mut out, "Permission", "FULL_CONTROL");
        out.push_str("</Grant></AccessControlList></AccessControlPolicy>");
        self.respond_xml(conn, req, &out).await
    }

    pub(super) async fn put_acl(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
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
        let what = if req.key.is_empty() {
            "PutBucketAcl"
        } else {
            "PutObjectAcl"
        };
        if let Some(acl) = req.head.header_str("x-amz-acl") {
            let acl = acl.trim();
            if !OWNER_ONLY.contains(&acl) {
                return Err(S3Error::not_implemented(&format!(
                    "{what} with the {acl} ACL (every bucket and object is private to its owner)"
                )));
            }
        }
        let grants = req.head.headers.iter().any(|(name, _)| {
            name.get(..12)
                .is_some_and(|p| p.eq_ignore_ascii_case("x-amz-grant-"))
        });
        if grants || !body.iter().all(u8::is_ascii_whitespace) {
            return Err(S3Error::not_implemented(&format!(
                "{what} with grants (every bucket and object is private to its owner)"
            )));
        }
        self.respond(conn, req, ResponseHead::new(200), b"").await
    }
}
