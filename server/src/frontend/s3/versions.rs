//! The S3 front door's side of versioning (the store keeps the versions,
//! `store::versions`): the `x-amz-version-id` header of answers, and the
//! headers of the errors a delete marker gives.

use super::{Conn, S3Front};
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::error::S3Error;
use crate::shard::msg::ShardError;

/// `head` with `x-amz-version-id` when the bucket is versioned.
pub(super) fn with_version(head: ResponseHead, version_id: Option<String>) -> ResponseHead {
    match version_id {
        Some(v) => head.with_header("x-amz-version-id", v),
        None => head,
    }
}

impl S3Front {
    /// `result` as an S3 result. A delete marker read (the current version,
    /// or one named) answers 404 NoSuchKey or 405 MethodNotAllowed with
    /// `x-amz-delete-marker: true` and the marker's `x-amz-version-id`, as
    /// S3 does.
    pub(super) fn versioned<T>(
        &self,
        conn: &mut Conn,
        result: Result<T, ShardError>,
    ) -> Result<T, S3Error> {
        if let Err(ShardError::DeleteMarker { version_id, .. }) = &result {
            conn.extra_headers
                .push(("x-amz-delete-marker".into(), "true".to_string()));
            conn.extra_headers
                .push(("x-amz-version-id".into(), version_id.clone()));
        }
        result.map_err(S3Error::from)
    }
}
