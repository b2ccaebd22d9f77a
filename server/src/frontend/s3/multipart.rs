//! Multipart uploads: CreateMultipartUpload, UploadPart (UploadPartCopy is
//! in `copy`), CompleteMultipartUpload, AbortMultipartUpload, ListParts and
//! ListMultipartUploads (merged across shards).

use super::serve::BodyCheck;
use super::uploads::UploadPage;
use super::{malformed, parse_limit, quoted, Conn, Request, S3Front};
use crate::frontend::common::S3_KEY_BYTES_MAX;
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::auth::Verified;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml::{
    self, iso8601_ms, push_bool_element, push_element, push_key_element, push_number_element,
    push_open_root, push_owner, OWNER_ID_DEFAULT,
};
use crate::shard::msg::ShardError;
use crate::shard::object::ObjectSink;
use crate::store::checksum::{Algorithm, ChecksumType, UploadChecksum};
use crate::store::mpu::{CompletionChecks, PartItem, UploadItem, PART_NUMBER_MAX};
use crate::store::record::ObjectMeta;

/// CompleteMultipartUpload bodies list up to 10,000 parts.
const COMPLETE_BODY_BYTES_MAX: usize = xml::COMPLETE_BODY_BYTES_MAX;
const LIST_PARTS_MAX: usize = 1000;
pub(super) const LIST_UPLOADS_MAX: usize = 1000;

pub(super) fn parse_part_number(req: &Request) -> Result<u32, S3Error> {
    req.q("partNumber")
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| (1..=PART_NUMBER_MAX).contains(n))
        .ok_or_else(|| {
            S3Error::invalid_argument(format!(
                "Part number must be an integer between 1 and {PART_NUMBER_MAX}, inclusive"
            ))
        })
}

/// The request's `x-amz-checksum-type`, if any.
fn checksum_type(req: &Request) -> Result<Option<ChecksumType>, S3Error> {
    let Some(v) = req.head.header_str("x-amz-checksum-type") else {
        return Ok(None);
    };
    ChecksumType::from_name(v.trim()).map(Some).ok_or_else(|| {
        S3Error::new(
            400,
            "InvalidRequest",
            format!("Value for x-amz-checksum-type header is invalid: {v}; use COMPOSITE or FULL_OBJECT"),
        )
    })
}

/// CreateMultipartUpload's `x-amz-checksum-algorithm` and
/// `x-amz-checksum-type`.
fn upload_checksum(req: &Request) -> Result<Option<UploadChecksum>, S3Error> {
    let invalid = |m: String| S3Error::new(400, "InvalidRequest", m);
    let kind = checksum_type(req)?;
    let Some(name) = req.head.header_str("x-amz-checksum-algorithm") else {
        return match kind {
            None => Ok(None),
            Some(_) => Err(invalid(
                "The x-amz-checksum-type header can only be used with the x-amz-checksum-algorithm header".into(),
            )),
        };
    };
    let algorithm = Algorithm::from_name(name.trim()).ok_or_else(|| {
        invalid(format!(
            "Checksum algorithm {name} is not supported; use CRC32, CRC32C, CRC64NVME, SHA1 or SHA256"
        ))
    })?;
    UploadChecksum::new(algorithm, kind)
        .map(Some)
        .map_err(invalid)
}

/// What CompleteMultipartUpload asks to be checked: the parts' listed
/// checksums, and the object's checksum, checksum type and size headers.
fn completion_checks(
    req: &Request,
    part_checksums: Vec<Vec<(Algorithm, String)>>,
) -> Result<CompletionChecks, S3Error> {
    let invalid = |m: String| S3Error::new(400, "InvalidRequest", m);
    let mut object = None;
    for a in Algorithm::ALL {
        if let Some(v) = req.head.header_str(a.header()) {
            if object.is_some() {
                return Err(invalid(
                    "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.".into(),
                ));
            }
            object = Some((a, v.trim().to_string()));
        }
    }
    let kind = checksum_type(req)?;
    let size_bytes = match req.head.header_str("x-amz-mp-object-size") {
        None => None,
        Some(v) => Some(v.trim().parse::<u64>().map_err(|_| {
            invalid(format!(
                "Value for x-amz-mp-object-size header is invalid: {v}"
            ))
        })?),
    };
    Ok(CompletionChecks {
        part_checksums,
        object,
        kind,
        size_bytes,
    })
}

pub(super) fn upload_id(req: &Request) -> String {
    req.q("uploadId").unwrap_or("").to_string()
}

impl S3Front {
    pub(super) async fn create_multipart(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let meta = self.object_meta_from_request(req)?;
        let chosen = upload_checksum(req)?;
        let id = self
            .shard
            .mpu_create(&req.bucket, &req.key, meta, chosen)
            .await?;
        let mut out = String::with_capacity(256 + req.key.len());
        push_open_root(&mut out, "InitiateMultipartUploadResult");
        push_element(&mut out, "Bucket", &req.bucket);
        push_element(&mut out, "Key", &req.key);
        push_element(&mut out, "UploadId", &id);
        out.push_str("</InitiateMultipartUploadResult>");
        let mut head = ResponseHead::new(200).with_header("Content-Type", "application/xml");
        if let Some(c) = chosen {
            head.push_header("x-amz-checksum-algorithm", c.algorithm.name());
            head.push_header("x-amz-checksum-type", c.kind.name());
        }
        self.respond(conn, req, head, out.as_bytes()).await
    }

    pub(super) async fn upload_part(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        let number = parse_part_number(req)?;
        let part = Some((upload_id(req), number));
        let chosen = self
            .shard
            .mpu_checksum(&req.bucket, &req.key, &upload_id(req))
            .await?;
        if req.head.header("x-amz-copy-source").is_some() {
            return self
                .upload_part_copy(conn, req, part, &auth.principal, chosen)
                .await;
        }
        let sink = ObjectSink::open_part(
            &self.shard,
            &req.bucket,
            &req.key,
            ObjectMeta::default(),
            part,
            None,
        )
        .await?;
        let (info, _, checksums) = self
            .receive_object(conn, req, auth, sink, chosen.map(|c| c.algorithm))
            .await?;
        let mut head = ResponseHead::new(200).with_header("ETag", quoted(&info.etag));
        for (name, value) in checksums {
            head.push_header(name, value);
        }
        self.respond(conn, req, head, b"").await
    }

    pub(super) async fn complete_multipart(
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
                COMPLETE_BODY_BYTES_MAX,
                BodyCheck::Complete,
            )
            .await?;
        let (parts, part_checksums) = xml::parse_complete_multipart(&body).map_err(malformed)?;
        let checks = completion_checks(req, part_checksums)?;
        let (info, version, checksum) = self
            .shard
            .mpu_complete(&req.bucket, &req.key, &upload_id(req), parts, checks)
            .await?;
        let mut out = String::with_capacity(320 + 2 * req.key.len());
        push_open_root(&mut out, "CompleteMultipartUploadResult");
        push_element(
            &mut out,
            "Location",
            &format!("/{}/{}", req.bucket, req.key),
        );
        push_element(&mut out, "Bucket", &req.bucket);
        push_element(&mut out, "Key", &req.key);
        push_element(&mut out, "ETag", &quoted(&info.etag));
        if let Some((algorithm, value)) = &checksum {
            push_element(&mut out, &format!("Checksum{}", algorithm.name()), value);
            push_element(
                &mut out,
                "ChecksumType",
                ChecksumType::of_value(value).name(),
            );
        }
        out.push_str("</CompleteMultipartUploadResult>");
        let head = ResponseHead::new(200).with_header("Content-Type", "application/xml");
        self.respond(
            conn,
            req,
            super::versions::with_version(head, version),
            out.as_bytes(),
        )
        .await
    }

    pub(super) async fn abort_multipart(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        self.shard
            .mpu_abort(&req.bucket, &req.key, &upload_id(req))
            .await?;
        self.respond(conn, req, ResponseHead::new(204), b"").await
    }

    pub(super) async fn list_parts(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let max_parts = parse_limit(req.q("max-parts"), "max-parts", LIST_PARTS_MAX)?;
        let marker = match req.q("part-number-marker") {
            None | Some("") => 0,
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| S3Error::invalid_argument("part-number-marker must be an integer"))?,
        };
        let id = upload_id(req);
        let (mut parts, chosen): (Vec<PartItem>, _) = self
            .shard
            .mpu_parts(&req.bucket, &req.key, &id, marker, max_parts + 1)
            .await?;
        let truncated = parts.len() > max_parts;
        parts.truncate(max_parts);
        let mut out = String::with_capacity(512 + parts.len() * 200);
        push_open_root(&mut out, "ListPartsResult");
        push_element(&mut out, "Bucket", &req.bucket);
        push_element(&mut out, "Key", &req.key);
        push_element(&mut out, "UploadId", &id);
        out.push_str("<Initiator>");
        push_element(&mut out, "ID", OWNER_ID_DEFAULT);
        push_element(&mut out, "DisplayName", OWNER_ID_DEFAULT);
        out.push_str("</Initiator>");
        push_owner(&mut out, OWNER_ID_DEFAULT);
        push_element(&mut out, "StorageClass", "STANDARD");
        if let Some(c) = chosen {
            push_element(&mut out, "ChecksumAlgorithm", c.algorithm.name());
            push_element(&mut out, "ChecksumType", c.kind.name());
        }
        push_number_element(&mut out, "PartNumberMarker", u64::from(marker));
        if let Some(last) = parts.last() {
            push_number_element(&mut out, "NextPartNumberMarker", u64::from(last.number));
        }
        push_number_element(&mut out, "MaxParts", max_parts as u64);
        push_bool_element(&mut out, "IsTruncated", truncated);
        for p in &parts {
            out.push_str("<Part>");
            push_number_element(&mut out, "PartNumber", u64::from(p.number));
            push_element(&mut out, "LastModified", &iso8601_ms(p.mtime_ms));
            push_element(&mut out, "ETag", &quoted(&p.etag));
            push_number_element(&mut out, "Size", p.size_bytes);
            if let (Some(c), Some(value)) = (chosen, &p.checksum) {
                push_element(&mut out, &format!("Checksum{}", c.algorithm.name()), value);
            }
            out.push_str("</Part>");
        }
        out.push_str("</ListPartsResult>");
        self.respond_xml(conn, req, &out).await
    }

    /// This node's uploads after the markers, its shards' pages merged
    /// (`UploadPage`).
    pub(super) async fn node_uploads(
        &self,
        bucket: &str,
        prefix: &str,
        (key_marker, id_marker): (&str, &str),
        max: usize,
    ) -> Result<UploadPage, ShardError> {
        let mut pages = Vec::new();
        for r in self
            .shard
            .mpu_list_all(bucket, prefix, key_marker, id_marker, max + 1)
            .await
        {
            pages.push(UploadPage::of_shard(r?, max));
        }
        Ok(UploadPage::merge(pages))
    }

    pub(super) async fn list_multipart_uploads(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let max = parse_limit(req.q("max-uploads"), "max-uploads", LIST_UPLOADS_MAX)?;
        let prefix = req.q("prefix").unwrap_or("").to_string();
        // A key marker may end in char::MAX (4 bytes: after a common
        // prefix, below).
        for (name, v, max) in [
            ("prefix", req.q("prefix"), S3_KEY_BYTES_MAX),
            ("key-marker", req.q("key-marker"), S3_KEY_BYTES_MAX + 4),
            (
                "upload-id-marker",
                req.q("upload-id-marker"),
                S3_KEY_BYTES_MAX,
            ),
        ] {
            if v.is_some_and(|v| v.len() > max) {
                return Err(S3Error::invalid_argument(format!(
                    "{name} is longer than any key ({S3_KEY_BYTES_MAX} bytes)"
                )));
            }
        }
        let delimiter = req.q("delimiter").filter(|d| !d.is_empty());
        let key_marker = req.q("key-marker").unwrap_or("").to_string();
        let id_marker = if key_marker.is_empty() {
            String::new()
        } else {
            req.q("upload-id-marker").unwrap_or("").to_string()
        };
        let encoding_url = req.q("encoding-type") == Some("url");
        let page = self
            .uploads_cluster((&req.bucket, &prefix, &key_marker, &id_marker), max)
            .await?;
        let mut entries = collapse_prefixes(page.uploads, &prefix, delimiter);
        let cut_by_max = entries.len() > max;
        let truncated = cut_by_max || page.frontier.is_some();
        entries.truncate(max);
        let mut out = String::with_capacity(512 + entries.len() * 300);
        push_open_root(&mut out, "ListMultipartUploadsResult");
        push_element(&mut out, "Bucket", &req.bucket);
        push_key_element(&mut out, "KeyMarker", &key_marker, encoding_url);
        push_element(&mut out, "UploadIdMarker", &id_marker);
        if truncated {
            match (entries.last(), page.frontier) {
                (Some(Err(p)), _) => {
                    // Resume after every upload under this prefix.
                    let mut next = p.clone();
                    next.push(char::MAX);
                    push_key_element(&mut out, "NextKeyMarker", &next, encoding_url);
                }
                // Cut by a frontier, at most max shown: resume after it
                // (on a cluster it may be an upload no node shows: a
                // leftover of a key another node leads).
                (_, Some((key, id))) if !cut_by_max => {
                    push_key_element(&mut out, "NextKeyMarker", &key, encoding_url);
                    push_element(&mut out, "NextUploadIdMarker", &id);
                }
                (Some(Ok(u)), _) => {
                    push_key_element(&mut out, "NextKeyMarker", &u.key, encoding_url);
                    push_element(&mut out, "NextUploadIdMarker", &u.upload_id);
                }
                (None, _) => {}
            }
        }
        push_key_element(&mut out, "Prefix", &prefix, encoding_url);
        if let Some(d) = delimiter {
            push_key_element(&mut out, "Delimiter", d, encoding_url);
        }
        push_number_element(&mut out, "MaxUploads", max as u64);
        if encoding_url {
            push_element(&mut out, "EncodingType", "url");
        }
        push_bool_element(&mut out, "IsTruncated", truncated);
        for u in entries.iter().flatten() {
            out.push_str("<Upload>");
            push_key_element(&mut out, "Key", &u.key, encoding_url);
            push_element(&mut out, "UploadId", &u.upload_id);
            out.push_str("<Initiator>");
            push_element(&mut out, "ID", OWNER_ID_DEFAULT);
            push_element(&mut out, "DisplayName", OWNER_ID_DEFAULT);
            out.push_str("</Initiator>");
            push_owner(&mut out, OWNER_ID_DEFAULT);
            push_element(&mut out, "StorageClass", "STANDARD");
            push_element(&mut out, "Initiated", &iso8601_ms(u.initiated_ms));
            if let Some(c) = u.checksum {
                push_element(&mut out, "ChecksumAlgorithm", c.algorithm.name());
                push_element(&mut out, "ChecksumType", c.kind.name());
            }
            out.push_str("</Upload>");
        }
        for e in &entries {
            if let Err(p) = e {
                out.push_str("<CommonPrefixes>");
                push_key_element(&mut out, "Prefix", p, encoding_url);
                out.push_str("</CommonPrefixes>");
            }
        }
        out.push_str("</ListMultipartUploadsResult>");
        self.respond_xml(conn, req, &out).await
    }
}

/// Collapses keys with the delimiter after the prefix into common prefixes
/// (`Err(prefix)`), in order; other uploads stay `Ok`.
fn collapse_prefixes(
    uploads: Vec<UploadItem>,
    prefix: &str,
    delimiter: Option<&str>,
) -> Vec<Result<UploadItem, String>> {
    let mut entries: Vec<Result<UploadItem, String>> = Vec::new();
    for u in uploads {
        if let Some(d) = delimiter {
            // Every key is under the prefix (`UploadPage::check` keeps a
            // peer's so); one that is not is listed as it is.
            let Some(rest) = u.key.strip_prefix(prefix) else {
                entries.push(Ok(u));
                continue;
            };
            if let Some(pos) = rest.find(d) {
                let common = u.key[..prefix.len() + pos + d.len()].to_string();
                if !matches!(entries.last(), Some(Err(p)) if *p == common) {
                    entries.push(Err(common));
                }
                continue;
            }
        }
        entries.push(Ok(u));
    }
    entries
}
