//! S3 XML response bodies: errors, bucket and object listings, location,
//! and the ISO 8601 dates they carry.

use super::*;
use crate::frontend::http::civil_from_days;

/// `<Error>` body for any failed request.
pub fn error_body(code: &str, message: &str, resource: &str, request_id: &str) -> String {
    let mut out = String::with_capacity(
        XML_DECLARATION.len() + 96 + code.len() + message.len() + resource.len() + request_id.len(),
    );
    out.push_str(XML_DECLARATION);
    out.push_str("<Error>");
    push_element(&mut out, "Code", code);
    push_element(&mut out, "Message", message);
    push_element(&mut out, "Resource", resource);
    push_element(&mut out, "RequestId", request_id);
    out.push_str("</Error>");
    out
}

pub struct BucketEntry {
    pub name: String,
    pub created_unix_ms: u64,
}

/// ListBuckets (`GET /`) response.
pub fn list_buckets(owner_id: &str, buckets: &[BucketEntry]) -> String {
    list_buckets_page(owner_id, buckets, None, None)
}

/// ListBuckets with paging: `continuation` when more buckets follow,
/// `prefix` echoed when the request had one.
pub fn list_buckets_page(
    owner_id: &str,
    buckets: &[BucketEntry],
    continuation: Option<&str>,
    prefix: Option<&str>,
) -> String {
    let names_bytes: usize = buckets.iter().map(|b| b.name.len()).sum();
    let mut out = String::with_capacity(256 + names_bytes + buckets.len() * 96);
    push_open_root(&mut out, "ListAllMyBucketsResult");
    push_owner(&mut out, owner_id);
    out.push_str("<Buckets>");
    for bucket in buckets {
        out.push_str("<Bucket>");
        push_element(&mut out, "Name", &bucket.name);
        push_element(
            &mut out,
            "CreationDate",
            &iso8601_ms(bucket.created_unix_ms),
        );
        out.push_str("</Bucket>");
    }
    out.push_str("</Buckets>");
    if let Some(token) = continuation {
        push_element(&mut out, "ContinuationToken", token);
    }
    if let Some(prefix) = prefix {
        push_element(&mut out, "Prefix", prefix);
    }
    out.push_str("</ListAllMyBucketsResult>");
    out
}

pub struct ObjectEntry {
    pub key: String,
    pub size: u64,
    /// With the surrounding quotes, as sent in the ETag header.
    pub etag: String,
    pub last_modified_unix_ms: u64,
}

/// ListObjectsV2 parameters and page.
pub struct ListV2 {
    pub bucket: String,
    pub prefix: String,
    pub delimiter: Option<String>,
    pub max_keys: u32,
    pub key_count: u32,
    pub is_truncated: bool,
    pub continuation_token: Option<String>,
    pub next_continuation_token: Option<String>,
    pub start_after: Option<String>,
    pub encoding_url: bool,
    pub contents: Vec<ObjectEntry>,
    pub common_prefixes: Vec<String>,
    pub fetch_owner: bool,
}

/// ListObjectsV2 (`GET /bucket?list-type=2`) response; owners, if asked
/// for, are [`OWNER_ID_DEFAULT`].
pub fn list_objects_v2(l: &ListV2) -> String {
    list_objects_v2_with_owner(l, OWNER_ID_DEFAULT)
}

/// As [`list_objects_v2`], naming `owner_id` as every object's owner when
/// fetch-owner=true.
pub fn list_objects_v2_with_owner(l: &ListV2, owner_id: &str) -> String {
    // A page never holds more entries than were asked for.
    debug_assert!(l.contents.len() + l.common_prefixes.len() <= l.max_keys as usize);
    let mut out = String::with_capacity(listing_capacity(&l.contents, &l.common_prefixes));
    push_open_root(&mut out, "ListBucketResult");
    push_element(&mut out, "Name", &l.bucket);
    push_key_element(&mut out, "Prefix", &l.prefix, l.encoding_url);
    if let Some(delimiter) = &l.delimiter {
        push_key_element(&mut out, "Delimiter", delimiter, l.encoding_url);
    }
    if let Some(token) = &l.continuation_token {
        push_element(&mut out, "ContinuationToken", token);
    }
    if let Some(token) = &l.next_continuation_token {
        push_element(&mut out, "NextContinuationToken", token);
    }
    if let Some(start_after) = &l.start_after {
        push_key_element(&mut out, "StartAfter", start_after, l.encoding_url);
    }
    push_number_element(&mut out, "KeyCount", u64::from(l.key_count));
    push_number_element(&mut out, "MaxKeys", u64::from(l.max_keys));
    if l.encoding_url {
        push_element(&mut out, "EncodingType", "url");
    }
    push_bool_element(&mut out, "IsTruncated", l.is_truncated);
    let owner = l.fetch_owner.then_some(owner_id);
    push_listing(
        &mut out,
        &l.contents,
        &l.common_prefixes,
        l.encoding_url,
        owner,
    );
    out.push_str("</ListBucketResult>");
    out
}

/// ListObjects (v1) parameters and page.
pub struct ListV1 {
    pub bucket: String,
    pub prefix: String,
    pub delimiter: Option<String>,
    pub marker: String,
    pub next_marker: Option<String>,
    pub max_keys: u32,
    pub is_truncated: bool,
    pub encoding_url: bool,
    pub contents: Vec<ObjectEntry>,
    pub common_prefixes: Vec<String>,
}

/// ListObjects v1 (`GET /bucket`) response.
pub fn list_objects_v1(l: &ListV1) -> String {
    let mut out = String::with_capacity(listing_capacity(&l.contents, &l.common_prefixes));
    push_open_root(&mut out, "ListBucketResult");
    push_element(&mut out, "Name", &l.bucket);
    push_key_element(&mut out, "Prefix", &l.prefix, l.encoding_url);
    push_key_element(&mut out, "Marker", &l.marker, l.encoding_url);
    if let Some(next_marker) = &l.next_marker {
        push_key_element(&mut out, "NextMarker", next_marker, l.encoding_url);
    }
    push_number_element(&mut out, "MaxKeys", u64::from(l.max_keys));
    if let Some(delimiter) = &l.delimiter {
        push_key_element(&mut out, "Delimiter", delimiter, l.encoding_url);
    }
    if l.encoding_url {
        push_element(&mut out, "EncodingType", "url");
    }
    push_bool_element(&mut out, "IsTruncated", l.is_truncated);
    push_listing(
        &mut out,
        &l.contents,
        &l.common_prefixes,
        l.encoding_url,
        None,
    );
    out.push_str("</ListBucketResult>");
    out
}

fn listing_capacity(contents: &[ObjectEntry], common_prefixes: &[String]) -> usize {
    let keys_bytes: usize = contents.iter().map(|o| o.key.len()).sum();
    let prefixes_bytes: usize = common_prefixes.iter().map(|p| p.len() + 40).sum();
    512 + keys_bytes + contents.len() * 240 + prefixes_bytes
}

fn push_listing(
    out: &mut String,
    contents: &[ObjectEntry],
    common_prefixes: &[String],
    encode_url: bool,
    owner_id: Option<&str>,
) {
    for object in contents {
        out.push_str("<Contents>");
        push_key_element(out, "Key", &object.key, encode_url);
        push_element(
            out,
            "LastModified",
            &iso8601_ms(object.last_modified_unix_ms),
        );
        push_element(out, "ETag", &object.etag);
        push_number_element(out, "Size", object.size);
        if let Some(owner_id) = owner_id {
            push_owner(out, owner_id);
        }
        push_element(out, "StorageClass", "STANDARD");
        out.push_str("</Contents>");
    }
    for prefix in common_prefixes {
        out.push_str("<CommonPrefixes>");
        push_key_element(out, "Prefix", prefix, encode_url);
        out.push_str("</CommonPrefixes>");
    }
}

/// GetBucketLocation response; us-east-1 (or no region) is the empty element,
/// as S3 returns it.
pub fn location_constraint(region: &str) -> String {
    let mut out = String::with_capacity(XML_DECLARATION.len() + 96 + region.len());
    out.push_str(XML_DECLARATION);
    out.push_str("<LocationConstraint xmlns=\"");
    out.push_str(S3_XMLNS);
    if region.is_empty() || region == "us-east-1" {
        out.push_str("\"/>");
        return out;
    }
    out.push_str("\">");
    push_escaped(&mut out, region);
    out.push_str("</LocationConstraint>");
    out
}

/// Unix milliseconds as `2013-05-24T00:00:00.000Z`.
pub fn iso8601_ms(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, secs_of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    )
}
