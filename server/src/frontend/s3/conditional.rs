//! Request preconditions and digests: If-Match / If-None-Match /
//! If-(Un)Modified-Since on reads and copies (RFC 7232 as S3 applies it),
//! PutObject's conditional writes, and the Content-MD5 header.

use std::time::SystemTime;

use base64::Engine as _;

use crate::frontend::http::RequestHead;
use crate::frontend::s3::error::S3Error;
use crate::store::record::ObjectMeta;
use crate::store::PutCondition;

pub(super) fn etag_matches(list: &str, etag: &str) -> bool {
    super::etag::etag_list_matches(list, etag)
}

/// The decoded Content-MD5 header, if sent; InvalidDigest if malformed.
pub(super) fn content_md5(head: &RequestHead) -> Result<Option<Vec<u8>>, S3Error> {
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
pub(super) fn put_condition(head: &RequestHead) -> Result<Option<PutCondition>, S3Error> {
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

pub(super) fn parse_http_date_ms(v: &str) -> Option<u64> {
    httpdate::parse_http_date(v)
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// RFC 7232 evaluation order as S3 applies it. Some(status) ends the request.
pub(super) fn check_conditions(
    head: &RequestHead,
    meta: &ObjectMeta,
) -> Result<Option<u16>, S3Error> {
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
pub(super) fn check_conditions_with(
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
