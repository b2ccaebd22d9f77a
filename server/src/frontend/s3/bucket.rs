//! Bucket operations: ListBuckets, CreateBucket, HeadBucket, DeleteBucket,
//! GetBucketLocation, Get/PutBucketVersioning, and DeleteObjects (a POST on
//! the bucket that deletes many keys or versions, each on its owner shard).

use bytes::Bytes;

use super::serve::BodyCheck;
use super::{malformed, Conn, Request, S3Front, SMALL_BODY_BYTES_MAX};
use crate::access::Principal;
use crate::bucket_config::ConfigKind;
use crate::frontend::common::{valid_bucket_name, S3_KEY_BYTES_MAX};
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::auth::Verified;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml::{self, push_bool_element, push_element, push_open_root};
use crate::shard::msg::Removed;
use crate::store::versions::{Pick, Versioning};

/// DeleteObjects takes at most 1000 keys (S3's limit).
const DELETE_BODY_BYTES_MAX: usize = xml::PARSE_BODY_BYTES_MAX;
/// Deletes of one DeleteObjects request in flight at once.
const DELETES_IN_FLIGHT_MAX: usize = 64;

impl S3Front {
    /// ListBuckets, in name order: all of them, or pages of `max-buckets`
    /// (1 to 10,000) after `continuation-token` (the last name of the page
    /// before, base64url), of the names starting with `prefix`.
    pub(super) async fn list_buckets(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let max = match req.q("max-buckets") {
            None => usize::MAX,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=10_000).contains(n))
                .ok_or_else(|| {
                    S3Error::invalid_argument("max-buckets must be an integer from 1 to 10000")
                })?,
        };
        let after = match req.q("continuation-token") {
            None => None,
            Some(t) => Some(
                b64.decode(t)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| {
                        S3Error::invalid_argument("The continuation token provided is incorrect")
                    })?,
            ),
        };
        let prefix = req.q("prefix").unwrap_or("");
        // Each user lists the buckets it owns; the root principal all.
        let mut names = self.shard.buckets_of(&auth.principal);
        names.sort();
        let mut matching = names
            .into_iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .filter(|(n, _)| after.as_ref().is_none_or(|a| n > a));
        let buckets: Vec<xml::BucketEntry> = matching
            .by_ref()
            .take(max)
            .map(|(name, created_unix_ms)| xml::BucketEntry {
                name,
                created_unix_ms,
            })
            .collect();
        let token = match (matching.next(), buckets.last()) {
            (Some(_), Some(last)) => Some(b64.encode(&last.name)),
            _ => None,
        };
        let body = xml::list_buckets_page(
            xml::OWNER_ID_DEFAULT,
            &buckets,
            token.as_deref(),
            req.q("prefix"),
        );
        self.respond_xml(conn, req, &body).await
    }

    pub(super) async fn create_bucket(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
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
        let owner = match &auth.principal {
            Principal::User(name) => Some(&**name),
            _ => None,
        };
        let change = crate::cluster::catalog::Change::Create {
            name: req.bucket.clone(),
            owner: owner.map(str::to_string),
        };
        let existing_owner = match self.cluster_bucket_change(change).await? {
            None if self.shard.create_bucket(&req.bucket, owner).await? => None,
            None => Some(
                self.shard
                    .bucket_config(&req.bucket)
                    .and_then(|c| c.owner.as_deref().map(str::to_string)),
            ),
            Some(crate::cluster::catalog::Outcome::Exists(o)) => Some(o),
            Some(_) => None,
        };
        let Some(existing_owner) = existing_owner else {
            let head = ResponseHead::new(200).with_header("Location", format!("/{}", req.bucket));
            return self.respond(conn, req, head, b"").await;
        };
        if auth.principal.owns(existing_owner.as_deref()) {
            Err(S3Error::new(
                409,
                "BucketAlreadyOwnedByYou",
                "Your previous request to create the named bucket succeeded and you already own it.",
            ))
        } else {
            Err(S3Error::new(
                409,
                "BucketAlreadyExists",
                "The requested bucket name is not available. The bucket namespace is shared by all users of the system. Please select a different name and try again.",
            ))
        }
    }

    pub(super) async fn head_bucket(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let head =
            ResponseHead::new(200).with_header("x-amz-bucket-region", self.cfg.region.clone());
        self.respond(conn, req, head, b"").await
    }

    pub(super) async fn delete_bucket(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        if !self.cluster_delete_bucket(&req.bucket).await? {
            self.shard.delete_bucket(&req.bucket).await?;
        }
        self.respond(conn, req, ResponseHead::new(204), b"").await
    }

    /// The bucket's versioning state (an empty configuration if it was
    /// never versioned).
    pub(super) async fn get_bucket_versioning(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        let config = self
            .shard
            .bucket_config(&req.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        let status = match config.versioning {
            Versioning::Off => None,
            Versioning::Enabled => Some("Enabled"),
            Versioning::Suspended => Some("Suspended"),
        };
        let mut body = String::with_capacity(160);
        push_open_root(&mut body, "VersioningConfiguration");
        if let Some(status) = status {
            push_element(&mut body, "Status", status);
        }
        body.push_str("</VersioningConfiguration>");
        self.respond_xml(conn, req, &body).await
    }

    /// PutBucketVersioning: Enabled or Suspended (a bucket never goes back
    /// to unversioned, as in S3). MFA delete is not offered.
    pub(super) async fn put_bucket_versioning(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        let owner = self.authorized_owner(&req.bucket);
        let body = self.read_config_body(conn, req, auth).await?;
        let root = crate::bucket_config::parse_root(&body, "VersioningConfiguration")?;
        if let Some(mfa) = crate::bucket_config::only_child(&root, "MfaDelete")? {
            if mfa.text.trim() == "Enabled" {
                return Err(S3Error::not_implemented("MFA delete"));
            }
        }
        let status = crate::bucket_config::only_child(&root, "Status")?
            .map(|s| s.text.trim().to_string())
            .ok_or_else(|| malformed("VersioningConfiguration needs a Status"))?;
        if status != "Enabled" && status != "Suspended" {
            return Err(malformed("Status must be Enabled or Suspended"));
        }
        self.set_bucket_doc(
            (&req.bucket, owner),
            ConfigKind::Versioning,
            Some(Bytes::from(status)),
        )
        .await?;
        self.respond(conn, req, ResponseHead::new(200), b"").await
    }

    pub(super) async fn get_bucket_location(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let region = if self.cfg.region == "us-east-1" {
            ""
        } else {
            self.cfg.region.as_str()
        };
        let body = xml::location_constraint(region);
        self.respond_xml(conn, req, &body).await
    }

    pub(super) async fn delete_objects(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let body = self
            .read_verified_body(conn, req, auth, DELETE_BODY_BYTES_MAX, BodyCheck::Covered)
            .await?;
        let (quiet, keys) = xml::parse_delete(&body).map_err(malformed)?;
        if keys.is_empty() {
            return Err(malformed("The Delete element lists no Object"));
        }
        // On a cluster, keys another node owns are deleted there.
        let mut results: Vec<Option<Result<Removed, S3Error>>> = vec![None; keys.len()];
        let mut remote = Vec::new();
        let mut local = Vec::new();
        for (i, (key, version)) in keys.iter().enumerate() {
            if self.owns_key(&req.bucket, key) {
                local.push(i);
                continue;
            }
            // Policy matching costs CPU: let other requests run.
            glommio::yield_if_needed().await;
            match self.delete_check(req, auth, key, version.as_deref()) {
                Ok(_) => remote.push((i, key.clone(), version.clone())),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        for (i, r) in self.delete_remote(&req.bucket, remote).await? {
            results[i] = Some(r);
        }
        // Each key on its owner shard, a bounded number at once.
        let keys_ref = &keys;
        for batch in local.chunks(DELETES_IN_FLIGHT_MAX) {
            let calls = batch.iter().map(|&i| async move {
                let (key, version) = &keys_ref[i];
                // Policy matching costs CPU: let other requests run.
                glommio::yield_if_needed().await;
                let pick = self.delete_check(req, auth, key, version.as_deref())?;
                let removed = self.shard.delete_version(&req.bucket, key, pick).await?;
                // A cluster node: the delete's copies first.
                if self.shard.is_cluster() {
                    let index_key =
                        crate::cluster::replicate::index_key_of(key, removed.version_id.as_deref());
                    self.replicate_key(&req.bucket, &index_key).await?;
                }
                Ok(removed)
            });
            let done = futures::future::join_all(calls).await;
            for (&i, r) in batch.iter().zip(done) {
                results[i] = Some(r);
            }
        }
        let results: Vec<Result<Removed, S3Error>> = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(S3Error::internal("key not deleted"))))
            .collect();
        let mut out = String::with_capacity(128 + keys.len() * 80);
        push_open_root(&mut out, "DeleteResult");
        for ((key, version), result) in keys.iter().zip(&results) {
            match result {
                Ok(_) if quiet => {}
                Ok(removed) => {
                    out.push_str("<Deleted>");
                    push_element(&mut out, "Key", key);
                    if let Some(v) = version {
                        push_element(&mut out, "VersionId", v);
                    }
                    if removed.marker {
                        push_bool_element(&mut out, "DeleteMarker", true);
                        if let Some(id) = &removed.version_id {
                            push_element(&mut out, "DeleteMarkerVersionId", id);
                        }
                    }
                    out.push_str("</Deleted>");
                }
                Err(e) => {
                    out.push_str("<Error>");
                    push_element(&mut out, "Key", key);
                    if let Some(v) = version {
                        push_element(&mut out, "VersionId", v);
                    }
                    push_element(&mut out, "Code", e.code);
                    push_element(&mut out, "Message", &e.message);
                    out.push_str("</Error>");
                }
            }
        }
        out.push_str("</DeleteResult>");
        self.respond_xml(conn, req, &out).await
    }

    /// A key of DeleteObjects: valid, and deletable by the signer (as
    /// DeleteObject: a named version needs the version action).
    fn delete_check(
        &self,
        req: &Request,
        auth: &Verified,
        key: &str,
        version: Option<&str>,
    ) -> Result<Pick, S3Error> {
        if key.is_empty() || key.len() > S3_KEY_BYTES_MAX || key.contains('\0') {
            return Err(S3Error::invalid_argument("Invalid key"));
        }
        let pick = match version {
            None => Pick::Current,
            Some(v) => Pick::parse(v)
                .ok_or_else(|| S3Error::invalid_argument("Invalid version id specified"))?,
        };
        let action = if pick == Pick::Current {
            "s3:DeleteObject"
        } else {
            "s3:DeleteObjectVersion"
        };
        if !self.allowed(&auth.principal, action, &req.bucket, Some(key)) {
            return Err(super::authz::access_denied());
        }
        Ok(pick)
    }
}
