//! Authorization of S3 requests (see `access` for the rules): the IAM
//! action each operation needs, the principal of a request, and the
//! checks of dispatch and of the handlers that touch more than one key
//! (DeleteObjects, BatchGet, the source of a copy).

use std::rc::Rc;

use super::route::S3Op;
use super::{Request, S3Front};
use crate::access::Principal;
use crate::frontend::s3::error::S3Error;

/// What an operation needs. None: decided elsewhere (ListBuckets and
/// CreateBucket need a signed request; DeleteObjects and BatchGet check
/// each key; NotImplemented and MethodNotAllowed answer their error; a
/// preflight is answered from the CORS rules).
pub(super) fn action_of(op: S3Op) -> Option<&'static str> {
    use S3Op::*;
    Some(match op {
        HeadBucket | ListObjects | ListObjectsV2 => "s3:ListBucket",
        DeleteBucket => "s3:DeleteBucket",
        GetBucketLocation => "s3:GetBucketLocation",
        GetBucketVersioning => "s3:GetBucketVersioning",
        PutBucketVersioning => "s3:PutBucketVersioning",
        ListMultipartUploads => "s3:ListBucketMultipartUploads",
        ListObjectVersions => "s3:ListBucketVersions",
        GetBucketAcl => "s3:GetBucketAcl",
        PutBucketAcl => "s3:PutBucketAcl",
        GetObjectAcl => "s3:GetObjectAcl",
        PutObjectAcl => "s3:PutObjectAcl",
        GetBucketTagging => "s3:GetBucketTagging",
        PutBucketTagging | DeleteBucketTagging => "s3:PutBucketTagging",
        GetBucketCors => "s3:GetBucketCORS",
        PutBucketCors | DeleteBucketCors => "s3:PutBucketCORS",
        GetBucketLifecycleConfiguration => "s3:GetLifecycleConfiguration",
        PutBucketLifecycleConfiguration | DeleteBucketLifecycle => "s3:PutLifecycleConfiguration",
        GetBucketPolicy => "s3:GetBucketPolicy",
        PutBucketPolicy => "s3:PutBucketPolicy",
        DeleteBucketPolicy => "s3:DeleteBucketPolicy",
        GetBucketPolicyStatus => "s3:GetBucketPolicyStatus",
        GetObjectTagging => "s3:GetObjectTagging",
        PutObjectTagging => "s3:PutObjectTagging",
        DeleteObjectTagging => "s3:DeleteObjectTagging",
        PutObject
        | CopyObject
        | CreateMultipartUpload
        | UploadPart
        | UploadPartCopy
        | CompleteMultipartUpload => "s3:PutObject",
        GetObject | HeadObject | GetObjectAttributes => "s3:GetObject",
        DeleteObject => "s3:DeleteObject",
        AbortMultipartUpload => "s3:AbortMultipartUpload",
        ListParts => "s3:ListMultipartUploadParts",
        ListBuckets | CreateBucket | DeleteObjects | BatchGet | CorsPreflight | NotImplemented
        | MethodNotAllowed => return None,
    })
}

/// What an operation on one named version (`versionId`) needs instead.
fn version_action_of(op: S3Op) -> Option<&'static str> {
    use S3Op::*;
    Some(match op {
        GetObject | HeadObject | GetObjectAttributes => "s3:GetObjectVersion",
        DeleteObject => "s3:DeleteObjectVersion",
        GetObjectTagging => "s3:GetObjectVersionTagging",
        PutObjectTagging => "s3:PutObjectVersionTagging",
        DeleteObjectTagging => "s3:DeleteObjectVersionTagging",
        GetObjectAcl => "s3:GetObjectVersionAcl",
        _ => return None,
    })
}

/// Whether an operation acts on an object (its resource is the key).
fn on_object(op: S3Op) -> bool {
    use S3Op::*;
    matches!(
        op,
        GetObjectAcl
            | PutObjectAcl
            | GetObjectTagging
            | PutObjectTagging
            | DeleteObjectTagging
            | PutObject
            | CopyObject
            | CreateMultipartUpload
            | UploadPart
            | UploadPartCopy
            | CompleteMultipartUpload
            | GetObject
            | HeadObject
            | GetObjectAttributes
            | DeleteObject
            | AbortMultipartUpload
            | ListParts
    )
}

pub(super) fn access_denied() -> S3Error {
    S3Error::new(403, "AccessDenied", "Access Denied")
}

impl S3Front {
    /// The principal of a verified access key: the root keys, or a user's
    /// (None: no such key any more).
    pub(super) fn principal_of(&self, access_key: &str) -> Option<Principal> {
        if access_key == self.cfg.credentials.access_key {
            return Some(Principal::Root);
        }
        self.shard
            .user_by_access_key(access_key)
            .map(|u| Principal::User(Rc::from(u.name.as_str())))
    }

    /// Whether `principal` may do `action` on `key` (None: the bucket
    /// itself) of `bucket`; a bucket this shard does not know allows
    /// nothing but to root.
    pub(super) fn allowed(
        &self,
        principal: &Principal,
        action: &str,
        bucket: &str,
        key: Option<&str>,
    ) -> bool {
        self.shard
            .decide_access(principal, action, bucket, key)
            .unwrap_or(false)
    }

    /// The check of dispatch, before the handler runs.
    pub(super) fn authorize(&self, req: &Request, principal: &Principal) -> Result<(), S3Error> {
        match req.op {
            S3Op::ListBuckets | S3Op::CreateBucket if *principal == Principal::Anonymous => {
                return Err(access_denied())
            }
            _ => {}
        }
        let Some(mut action) = action_of(req.op) else {
            return Ok(());
        };
        if req.q("versionId").is_some() {
            action = version_action_of(req.op).unwrap_or(action);
        }
        let key = on_object(req.op).then_some(req.key.as_str());
        match self
            .shard
            .decide_access(principal, action, &req.bucket, key)
        {
            None => return Err(S3Error::no_such_bucket()),
            Some(false) => return Err(access_denied()),
            Some(true) => {}
        }
        // Setting tags while writing needs the tagging permission too
        // (a tag-filtered lifecycle rule acts on them).
        let sets_tags = matches!(
            req.op,
            S3Op::PutObject | S3Op::CopyObject | S3Op::CreateMultipartUpload
        ) && req.head.header("x-amz-tagging").is_some();
        if sets_tags && !self.allowed(principal, "s3:PutObjectTagging", &req.bucket, key) {
            return Err(access_denied());
        }
        Ok(())
    }
}
