//! Listings: ListObjects (v1), ListObjectsV2 and ListObjectVersions, all
//! merged across shards by `Shard::list_merged`.

use std::fmt::Write as _;

use base64::Engine as _;

use super::{parse_limit, quoted, Conn, Request, S3Front, LIST_KEYS_MAX};
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml::{
    self, iso8601_ms, push_bool_element, push_element, push_key_element, push_number_element,
    push_open_root, push_owner, OWNER_ID_DEFAULT,
};
use crate::store::versions::{version_id, Pick, VersionEntry};
use crate::store::ListItem;

/// A ListObjectsV2 continuation token back to the key it resumes after.
/// Tokens are keys we handed out (URL-safe base64), and keys never hold NUL
/// (`check_key_and_query`): keys starting with NUL are the store's internal
/// multipart state, so a token with a NUL in it is forged and must not
/// resume a listing among them.
pub(super) fn decode_continuation_token(token: &str) -> Result<String, S3Error> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|t| !t.contains('\0'))
        .ok_or_else(|| S3Error::invalid_argument("The continuation token provided is incorrect"))
}

impl S3Front {
    pub(super) async fn list_merged(
        &self,
        bucket: &str,
        prefix: &str,
        from: &str,
        delimiter: Option<String>,
        max: usize,
    ) -> Result<(Vec<ListItem>, bool), S3Error> {
        let local = self
            .shard
            .list_merged(bucket, prefix, from, delimiter.clone(), max, None)
            .await?;
        // A cluster node: every serving node's page too.
        self.list_cluster(local, bucket, prefix, from, delimiter.as_deref(), max)
            .await
    }

    /// ListObjects V1/V2: each shard returns its first `max_keys + 1` items
    /// after the marker; the page is the merged first `max_keys`.
    pub(super) async fn list_objects(
        &self,
        conn: &mut Conn,
        req: &Request,
        v2: bool,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let prefix = req.q("prefix").unwrap_or("").to_string();
        let delimiter = req
            .q("delimiter")
            .filter(|d| !d.is_empty())
            .map(str::to_string);
        let max_keys = parse_max_keys(req)?;
        let encoding_url = parse_encoding_url(req)?;
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
        // A page that ends on a mark (a key not listed: a delete marker, or
        // on a cluster a key left behind by a placement change) names
        // where to resume, also without a delimiter: clients resume from
        // the last key listed otherwise, which may be none.
        let ends_on_mark = matches!(items.last(), Some(ListItem::Skipped(_)));
        let (contents, common_prefixes) = split_items(items);
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
                next_marker: if is_truncated && (delimiter.is_some() || ends_on_mark) {
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

    /// ListObjectVersions: every version and delete marker, newest first
    /// within a key, keys in order, merged across shards. A page holds
    /// `max-keys` versions and prefixes; it may end within a key (then
    /// `NextVersionIdMarker` says where the next one resumes).
    pub(super) async fn list_object_versions(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let prefix = req.q("prefix").unwrap_or("").to_string();
        let delimiter = req
            .q("delimiter")
            .filter(|d| !d.is_empty())
            .map(str::to_string);
        let max_keys = parse_limit(req.q("max-keys"), "max-keys", 1000)?;
        let key_marker = req.q("key-marker").unwrap_or("").to_string();
        let version_marker = req.q("version-id-marker").filter(|v| !v.is_empty());
        let resume = match version_marker {
            None => None,
            Some(_) if key_marker.is_empty() => {
                return Err(S3Error::invalid_argument(
                    "A version-id marker cannot be specified without a key marker.",
                ))
            }
            Some(v) => Some(
                Pick::parse(v)
                    .ok_or_else(|| S3Error::invalid_argument("Invalid version id specified"))?,
            ),
        };
        let encoding_url = parse_encoding_url(req)?;
        let local = self
            .shard
            .list_merged(
                &req.bucket,
                &prefix,
                &key_marker,
                delimiter.clone(),
                max_keys.max(1),
                Some(resume),
            )
            .await?;
        // A cluster node: every serving node's versions of the keys it
        // leads too.
        let (items, more) = self
            .list_cluster_of(
                local,
                (&req.bucket, &prefix, &key_marker, delimiter.as_deref()),
                max_keys.max(1),
                Some(resume),
            )
            .await?;
        let page = VersionPage::cut(items, more, max_keys);
        let mut out = String::with_capacity(512 + page.entries.len() * 300);
        push_open_root(&mut out, "ListVersionsResult");
        push_element(&mut out, "Name", &req.bucket);
        push_key_element(&mut out, "Prefix", &prefix, encoding_url);
        push_key_element(&mut out, "KeyMarker", &key_marker, encoding_url);
        push_element(&mut out, "VersionIdMarker", version_marker.unwrap_or(""));
        if let Some((key, version)) = &page.next {
            push_key_element(&mut out, "NextKeyMarker", key, encoding_url);
            if let Some(v) = version {
                push_element(&mut out, "NextVersionIdMarker", v);
            }
        }
        push_number_element(&mut out, "MaxKeys", max_keys as u64);
        if let Some(d) = &delimiter {
            push_key_element(&mut out, "Delimiter", d, encoding_url);
        }
        if encoding_url {
            push_element(&mut out, "EncodingType", "url");
        }
        push_bool_element(&mut out, "IsTruncated", page.next.is_some());
        for (key, v) in &page.entries {
            let tag = if v.object.is_some() {
                "Version"
            } else {
                "DeleteMarker"
            };
            let _ = write!(out, "<{tag}>");
            push_key_element(&mut out, "Key", key, encoding_url);
            push_element(&mut out, "VersionId", &version_id(v.version));
            push_bool_element(&mut out, "IsLatest", v.latest);
            push_element(&mut out, "LastModified", &iso8601_ms(v.mtime_ms));
            if let Some((size, etag)) = &v.object {
                push_element(&mut out, "ETag", &quoted(etag));
                let _ = write!(out, "<Size>{size}</Size>");
            }
            push_owner(&mut out, OWNER_ID_DEFAULT);
            if v.object.is_some() {
                push_element(&mut out, "StorageClass", "STANDARD");
            }
            let _ = write!(out, "</{tag}>");
        }
        for p in &page.prefixes {
            out.push_str("<CommonPrefixes>");
            push_key_element(&mut out, "Prefix", p, encoding_url);
            out.push_str("</CommonPrefixes>");
        }
        out.push_str("</ListVersionsResult>");
        self.respond_xml(conn, req, &out).await
    }
}

/// One page of ListObjectVersions cut from the merged items.
#[derive(Debug, Default, PartialEq)]
struct VersionPage {
    entries: Vec<(String, VersionEntry)>,
    prefixes: Vec<String>,
    /// Where the next page resumes: key marker and version-id marker
    /// (None after a common prefix). None: this is the last page.
    next: Option<(String, Option<String>)>,
}

impl VersionPage {
    /// At most `max` versions and prefixes from `items` (in order); `more`:
    /// whether items follow those given.
    fn cut(items: Vec<ListItem>, more: bool, max: usize) -> VersionPage {
        let mut page = VersionPage::default();
        let mut taken = 0;
        let mut last: Option<(String, Option<String>)> = None;
        let mut stopped = false;
        'items: for item in items {
            match item {
                ListItem::Prefix(p) => {
                    if taken == max {
                        stopped = true;
                        break;
                    }
                    taken += 1;
                    last = Some((p.clone(), None));
                    page.prefixes.push(p);
                }
                ListItem::Versions {
                    key,
                    versions,
                    complete,
                } => {
                    for v in versions {
                        if taken == max {
                            stopped = true;
                            break 'items;
                        }
                        taken += 1;
                        last = Some((key.clone(), Some(version_id(v.version))));
                        page.entries.push((key.clone(), v));
                    }
                    if !complete {
                        // Nothing of the page follows a cut key.
                        stopped = true;
                        break;
                    }
                }
                // Nothing to list up to here (a cluster's merged page: no
                // node listed the key): the next page resumes after it.
                ListItem::Skipped(k) => {
                    if taken == max {
                        stopped = true;
                        break;
                    }
                    last = Some((k, None));
                }
                ListItem::Object { .. } => {}
            }
        }
        if stopped || more {
            page.next = last;
        }
        page
    }
}

/// `max-keys`: a non-negative integer, capped at [`LIST_KEYS_MAX`].
fn parse_max_keys(req: &Request) -> Result<u32, S3Error> {
    let max_keys = match req.q("max-keys") {
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| S3Error::invalid_argument("max-keys must be a non-negative integer"))?
            .min(i64::from(LIST_KEYS_MAX)) as u32,
        None => LIST_KEYS_MAX,
    };
    Ok(max_keys)
}

/// `encoding-type`: absent, or `url`.
fn parse_encoding_url(req: &Request) -> Result<bool, S3Error> {
    let encoding_url = match req.q("encoding-type") {
        None => false,
        Some("url") => true,
        Some(_) => {
            return Err(S3Error::invalid_argument(
                "Invalid Encoding Method specified in Request",
            ))
        }
    };
    Ok(encoding_url)
}

/// A page's items as listing entries (ETags quoted) and common prefixes.
fn split_items(items: Vec<ListItem>) -> (Vec<xml::ObjectEntry>, Vec<String>) {
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
            ListItem::Versions { .. } | ListItem::Skipped(_) => {}
        }
    }
    (contents, common_prefixes)
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
