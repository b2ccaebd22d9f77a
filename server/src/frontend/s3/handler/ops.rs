//! Multipart uploads, CopyObject / UploadPartCopy, DeleteObjects and
//! ListObjectVersions (unversioned form).

use std::fmt::Write as _;

use bytes::Bytes;
use md5::{Digest, Md5};
use sha2::Sha256;

use super::{
    check_conditions_with, content_md5, percent_decode, Conn, Request, S3Front, GET_PIECE_BYTES,
    PUT_BYTES_MAX, S3_KEY_BYTES_MAX,
};
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::sigv4::Verified;
use crate::frontend::s3::xml::{
    self, iso8601_ms, push_bool_element, push_element, push_key_element, push_number_element,
    push_open_root, push_owner, OWNER_ID_DEFAULT,
};
use crate::shard::msg::{Op, Reply};
use crate::shard::object::{ObjectSink, ObjectSource};
use crate::store::mpu::{PartItem, UploadItem, PART_NUMBER_MAX};
use crate::store::record::ObjectMeta;
use crate::store::ListItem;

/// CompleteMultipartUpload bodies list up to 10,000 parts.
const COMPLETE_BODY_BYTES_MAX: usize = xml::PARSE_BODY_BYTES_MAX;
/// DeleteObjects takes at most 1000 keys (S3's limit).
const DELETE_BODY_BYTES_MAX: usize = xml::PARSE_BODY_BYTES_MAX;
const LIST_PARTS_MAX: usize = 1000;
const LIST_UPLOADS_MAX: usize = 1000;
/// Deletes of one DeleteObjects request in flight at once.
const DELETES_IN_FLIGHT_MAX: usize = 64;

fn unexpected(other: Reply) -> S3Error {
    match other {
        Reply::Err(e) => e.into(),
        other => S3Error::internal(format!("unexpected reply {other:?}")),
    }
}

fn malformed(message: impl Into<String>) -> S3Error {
    S3Error::new(400, "MalformedXML", message)
}

fn quoted(etag: &str) -> String {
    format!("\"{etag}\"")
}

/// Parses `max-parts`-style limits: a non-negative integer, capped.
fn parse_limit(value: Option<&str>, name: &str, cap: usize) -> Result<usize, S3Error> {
    match value {
        None => Ok(cap),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(|n| (n as usize).min(cap))
            .ok_or_else(|| {
                S3Error::invalid_argument(format!("{name} must be a non-negative integer"))
            }),
    }
}

fn parse_part_number(req: &Request) -> Result<u32, S3Error> {
    req.q("partNumber")
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| (1..=PART_NUMBER_MAX).contains(n))
        .ok_or_else(|| {
            S3Error::invalid_argument(format!(
                "Part number must be an integer between 1 and {PART_NUMBER_MAX}, inclusive"
            ))
        })
}

fn upload_id(req: &Request) -> String {
    req.q("uploadId").unwrap_or("").to_string()
}

/// `x-amz-copy-source`: `[/]bucket/key[?versionId=null]`, URL-encoded.
fn parse_copy_source(req: &Request) -> Result<(String, String), S3Error> {
    let raw = req.head.header_str("x-amz-copy-source").unwrap_or("");
    let (path, query) = raw.split_once('?').unwrap_or((raw, ""));
    if !query.is_empty() && query != "versionId=null" {
        return Err(S3Error::new(
            400,
            "InvalidArgument",
            "Copy source versions other than null are not supported: percore keeps no versions",
        ));
    }
    let path = path.strip_prefix('/').unwrap_or(path);
    let (bucket, key) = path.split_once('/').ok_or_else(|| {
        S3Error::invalid_argument(
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
        )
    })?;
    let (bucket, key) = (percent_decode(bucket)?, percent_decode(key)?);
    if bucket.is_empty() || key.is_empty() || key.len() > S3_KEY_BYTES_MAX || key.contains('\0') {
        return Err(S3Error::invalid_argument(
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
        ));
    }
    Ok((bucket, key))
}

/// `x-amz-copy-source-range: bytes=first-last` (both required, inclusive).
fn parse_copy_range(value: &str, size: u64) -> Result<(u64, u64), S3Error> {
    let bad = || {
        S3Error::new(
            400,
            "InvalidArgument",
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy",
        )
    };
    let spec = value.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let (a, b) = (
        a.trim().parse::<u64>().map_err(|_| bad())?,
        b.trim().parse::<u64>().map_err(|_| bad())?,
    );
    if a > b {
        return Err(bad());
    }
    if b >= size {
        return Err(S3Error::new(
            416,
            "InvalidRange",
            "The requested range is not satisfiable",
        ));
    }
    Ok((a, b - a + 1))
}

impl S3Front {
    /// Reads a small request body, verifying its SHA-256 when signed and
    /// its Content-MD5 when sent.
    async fn read_verified_body(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
        max: usize,
    ) -> Result<Vec<u8>, S3Error> {
        if auth.payload.is_streaming() {
            return Err(S3Error::invalid_argument(
                "aws-chunked encoding is accepted for object and part uploads only",
            ));
        }
        let body = self.read_small_body(conn, req, max).await?;
        let sha: [u8; 32] = Sha256::digest(&body).into();
        auth.payload.check_body_sha256(&sha)?;
        if content_md5(&req.head)?.is_some_and(|want| want[..] != Md5::digest(&body)[..]) {
            return Err(S3Error::new(
                400,
                "BadDigest",
                "The Content-MD5 you specified did not match what we received.",
            ));
        }
        Ok(body)
    }

    fn owner(&self, req: &Request) -> usize {
        self.shard.owner_of(&req.bucket, &req.key)
    }

    // ------------------------------------------------------------------
    // Multipart
    // ------------------------------------------------------------------

    pub(super) async fn create_multipart(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let meta = self.object_meta_from_request(req)?;
        let op = Op::MpuCreate {
            bucket: req.bucket.clone(),
            key: req.key.clone(),
            meta,
        };
        let id = match self.shard.call(self.owner(req), op).await {
            Reply::Upload(id) => id,
            other => return Err(unexpected(other)),
        };
        let mut out = String::with_capacity(256 + req.key.len());
        push_open_root(&mut out, "InitiateMultipartUploadResult");
        push_element(&mut out, "Bucket", &req.bucket);
        push_element(&mut out, "Key", &req.key);
        push_element(&mut out, "UploadId", &id);
        out.push_str("</InitiateMultipartUploadResult>");
        self.respond_xml(conn, req, &out).await
    }

    pub(super) async fn upload_part(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        let number = parse_part_number(req)?;
        let part = Some((upload_id(req), number));
        if req.head.header("x-amz-copy-source").is_some() {
            return self.upload_part_copy(conn, req, part).await;
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
        let info = self.receive_object(conn, req, auth, sink).await?;
        let head = ResponseHead::new(200).with_header("ETag", quoted(&info.etag));
        self.respond(conn, req, head, b"").await
    }

    pub(super) async fn complete_multipart(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        let body = self
            .read_verified_body(conn, req, auth, COMPLETE_BODY_BYTES_MAX)
            .await?;
        let parts = xml::parse_complete_multipart(&body).map_err(malformed)?;
        let op = Op::MpuComplete {
            bucket: req.bucket.clone(),
            key: req.key.clone(),
            upload_id: upload_id(req),
            parts,
        };
        let info = match self.shard.call(self.owner(req), op).await {
            Reply::Put(info) => info,
            other => return Err(unexpected(other)),
        };
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
        out.push_str("</CompleteMultipartUploadResult>");
        self.respond_xml(conn, req, &out).await
    }

    pub(super) async fn abort_multipart(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let op = Op::MpuAbort {
            bucket: req.bucket.clone(),
            key: req.key.clone(),
            upload_id: upload_id(req),
        };
        match self.shard.call(self.owner(req), op).await {
            Reply::Ok => self.respond(conn, req, ResponseHead::new(204), b"").await,
            other => Err(unexpected(other)),
        }
    }

    pub(super) async fn list_parts(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let max_parts = parse_limit(req.q("max-parts"), "max-parts", LIST_PARTS_MAX)?;
        let marker = match req.q("part-number-marker") {
            None | Some("") => 0,
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| S3Error::invalid_argument("part-number-marker must be an integer"))?,
        };
        let id = upload_id(req);
        let op = Op::MpuParts {
            bucket: req.bucket.clone(),
            key: req.key.clone(),
            upload_id: id.clone(),
            after: marker,
            limit: max_parts + 1,
        };
        let mut parts: Vec<PartItem> = match self.shard.call(self.owner(req), op).await {
            Reply::Parts(p) => p,
            other => return Err(unexpected(other)),
        };
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
            out.push_str("</Part>");
        }
        out.push_str("</ListPartsResult>");
        self.respond_xml(conn, req, &out).await
    }

    pub(super) async fn list_multipart_uploads(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let max = parse_limit(req.q("max-uploads"), "max-uploads", LIST_UPLOADS_MAX)?;
        let prefix = req.q("prefix").unwrap_or("").to_string();
        let delimiter = req.q("delimiter").filter(|d| !d.is_empty());
        let key_marker = req.q("key-marker").unwrap_or("").to_string();
        let id_marker = if key_marker.is_empty() {
            String::new()
        } else {
            req.q("upload-id-marker").unwrap_or("").to_string()
        };
        let encoding_url = req.q("encoding-type") == Some("url");
        let replies = self
            .shard
            .call_all(|| Op::MpuList {
                bucket: req.bucket.clone(),
                prefix: prefix.clone(),
                key_marker: key_marker.clone(),
                upload_id_marker: id_marker.clone(),
                limit: max + 1,
            })
            .await;
        let mut uploads: Vec<UploadItem> = Vec::new();
        // A shard that filled its limit may hold more uploads after its last
        // one: nothing beyond the least such last upload is certain yet.
        let mut frontier: Option<(String, String)> = None;
        for r in replies {
            match r {
                Reply::Uploads(mut v) => {
                    if v.len() > max {
                        let last = v.last().expect("non-empty");
                        let last = (last.key.clone(), last.upload_id.clone());
                        if frontier.as_ref().is_none_or(|f| last < *f) {
                            frontier = Some(last);
                        }
                    }
                    uploads.append(&mut v);
                }
                other => return Err(unexpected(other)),
            }
        }
        uploads.sort_by(|a, b| (&a.key, &a.upload_id).cmp(&(&b.key, &b.upload_id)));
        let cut = frontier.is_some();
        if let Some((fk, fid)) = &frontier {
            uploads.retain(|u| (&u.key, &u.upload_id) <= (fk, fid));
        }
        // Collapse keys with the delimiter after the prefix into CommonPrefixes.
        let mut entries: Vec<Result<UploadItem, String>> = Vec::new();
        for u in uploads {
            if let Some(d) = delimiter {
                if let Some(pos) = u.key[prefix.len()..].find(d) {
                    let common = u.key[..prefix.len() + pos + d.len()].to_string();
                    if !matches!(entries.last(), Some(Err(p)) if *p == common) {
                        entries.push(Err(common));
                    }
                    continue;
                }
            }
            entries.push(Ok(u));
        }
        let truncated = entries.len() > max || cut;
        entries.truncate(max);
        let mut out = String::with_capacity(512 + entries.len() * 300);
        push_open_root(&mut out, "ListMultipartUploadsResult");
        push_element(&mut out, "Bucket", &req.bucket);
        push_key_element(&mut out, "KeyMarker", &key_marker, encoding_url);
        push_element(&mut out, "UploadIdMarker", &id_marker);
        if truncated {
            match entries.last() {
                Some(Ok(u)) => {
                    push_key_element(&mut out, "NextKeyMarker", &u.key, encoding_url);
                    push_element(&mut out, "NextUploadIdMarker", &u.upload_id);
                }
                Some(Err(p)) => {
                    // Resume after every upload under this prefix.
                    let mut next = p.clone();
                    next.push(char::MAX);
                    push_key_element(&mut out, "NextKeyMarker", &next, encoding_url);
                }
                None => {}
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
        for e in &entries {
            if let Ok(u) = e {
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
                out.push_str("</Upload>");
            }
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

    // ------------------------------------------------------------------
    // Copies
    // ------------------------------------------------------------------

    /// Opens the copy source and applies the x-amz-copy-source-if-* tests.
    async fn open_copy_source(
        &self,
        req: &Request,
    ) -> Result<(ObjectSource, ObjectMeta, String, String), S3Error> {
        let (bucket, key) = parse_copy_source(req)?;
        if !self.shard.bucket_exists(&bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let (source, meta) = ObjectSource::open(&self.shard, &bucket, &key).await?;
        let cond = |name: &str| req.head.header_str(&format!("x-amz-copy-source-{name}"));
        if check_conditions_with(
            cond("if-match"),
            cond("if-none-match"),
            cond("if-modified-since"),
            cond("if-unmodified-since"),
            &meta,
        )?
        .is_some()
        {
            // For copies every failed condition is a 412 (S3 has no 304 here).
            return Err(S3Error::new(
                412,
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
            ));
        }
        Ok((source, meta, bucket, key))
    }

    /// Streams `len` bytes from `source` at `start` into `sink`; returns
    /// the MD5 of the bytes copied.
    async fn copy_bytes(
        &self,
        source: &mut ObjectSource,
        sink: &mut ObjectSink,
        start: u64,
        len: u64,
    ) -> Result<String, S3Error> {
        let mut md5 = Md5::new();
        let mut offset = start;
        let end = start + len;
        while offset < end {
            let chunk = source
                .read(offset, (end - offset).min(GET_PIECE_BYTES))
                .await?;
            if chunk.is_empty() {
                return Err(S3Error::internal("copy source shorter than its metadata"));
            }
            md5.update(&chunk[..]);
            offset += chunk.len() as u64;
            sink.write(Bytes::copy_from_slice(&chunk)).await?;
        }
        Ok(hex::encode(md5.finalize()))
    }

    pub(super) async fn copy_object(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        let (mut source, src_meta, src_bucket, src_key) = self.open_copy_source(req).await?;
        if src_meta.size_bytes > PUT_BYTES_MAX {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "The specified copy source is larger than the maximum allowable size for a copy source: 5368709120. Use UploadPartCopy.",
            ));
        }
        let replace = match req.head.header_str("x-amz-metadata-directive") {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("COPY") => false,
            Some(v) if v.eq_ignore_ascii_case("REPLACE") => true,
            Some(_) => {
                return Err(S3Error::invalid_argument(
                    "Unknown metadata directive: use COPY or REPLACE",
                ))
            }
        };
        if !replace && src_bucket == req.bucket && src_key == req.key {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes.",
            ));
        }
        let meta = if replace {
            self.object_meta_from_request(req)?
        } else {
            ObjectMeta {
                content_type: src_meta.content_type.clone(),
                headers: src_meta.headers.clone(),
                ..Default::default()
            }
        };
        let mut sink = ObjectSink::open(&self.shard, &req.bucket, &req.key, meta).await?;
        let etag = self
            .copy_bytes(&mut source, &mut sink, 0, src_meta.size_bytes)
            .await?;
        drop(source);
        let info = sink.finish(etag).await?;
        let mut out = String::with_capacity(256);
        push_open_root(&mut out, "CopyObjectResult");
        push_element(&mut out, "LastModified", &iso8601_ms(info.mtime_ms));
        push_element(&mut out, "ETag", &quoted(&info.etag));
        out.push_str("</CopyObjectResult>");
        self.respond_xml(conn, req, &out).await
    }

    async fn upload_part_copy(
        &self,
        conn: &mut Conn,
        req: &Request,
        part: Option<(String, u32)>,
    ) -> Result<(), S3Error> {
        let (mut source, src_meta, _, _) = self.open_copy_source(req).await?;
        let (start, len) = match req.head.header_str("x-amz-copy-source-range") {
            Some(v) => parse_copy_range(v, src_meta.size_bytes)?,
            None => (0, src_meta.size_bytes),
        };
        if len > PUT_BYTES_MAX {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "A part copied with UploadPartCopy may be at most 5 GiB; use x-amz-copy-source-range.",
            ));
        }
        let mut sink = ObjectSink::open_part(
            &self.shard,
            &req.bucket,
            &req.key,
            ObjectMeta::default(),
            part,
            None,
        )
        .await?;
        let etag = self.copy_bytes(&mut source, &mut sink, start, len).await?;
        drop(source);
        let info = sink.finish(etag).await?;
        let mut out = String::with_capacity(256);
        push_open_root(&mut out, "CopyPartResult");
        push_element(&mut out, "LastModified", &iso8601_ms(info.mtime_ms));
        push_element(&mut out, "ETag", &quoted(&info.etag));
        out.push_str("</CopyPartResult>");
        self.respond_xml(conn, req, &out).await
    }

    // ------------------------------------------------------------------
    // GetObjectAttributes
    // ------------------------------------------------------------------

    pub(super) async fn get_object_attributes(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let wanted: Vec<String> = req
            .head
            .header_str("x-amz-object-attributes")
            .unwrap_or("")
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        const KNOWN: [&str; 5] = [
            "ETag",
            "Checksum",
            "ObjectParts",
            "StorageClass",
            "ObjectSize",
        ];
        if wanted.is_empty() {
            return Err(S3Error::invalid_argument(
                "x-amz-object-attributes must name at least one of ETag, Checksum, ObjectParts, StorageClass, ObjectSize",
            ));
        }
        if let Some(bad) = wanted.iter().find(|a| !KNOWN.contains(&a.as_str())) {
            return Err(S3Error::invalid_argument(format!(
                "Invalid attribute name specified: {bad}"
            )));
        }
        let (source, meta) = ObjectSource::open(&self.shard, &req.bucket, &req.key).await?;
        drop(source);
        let has = |a: &str| wanted.iter().any(|w| w == a);
        let mut out = String::with_capacity(512);
        push_open_root(&mut out, "GetObjectAttributesResponse");
        if has("ETag") {
            push_element(&mut out, "ETag", &meta.etag);
        }
        if has("Checksum") {
            let stored: Vec<&(String, String)> = meta
                .headers
                .iter()
                .filter(|(n, _)| n.starts_with(crate::frontend::s3::checksum::HEADER_PREFIX))
                .collect();
            if !stored.is_empty() {
                out.push_str("<Checksum>");
                for (name, value) in stored {
                    let alg = name[crate::frontend::s3::checksum::HEADER_PREFIX.len()..].to_ascii_uppercase();
                    push_element(&mut out, &format!("Checksum{alg}"), value);
                }
                push_element(&mut out, "ChecksumType", "FULL_OBJECT");
                out.push_str("</Checksum>");
            }
        }
        if has("ObjectParts") {
            if let Some(n) = meta
                .etag
                .rsplit_once('-')
                .and_then(|(_, n)| n.parse::<u64>().ok())
            {
                out.push_str("<ObjectParts>");
                push_number_element(&mut out, "PartsCount", n);
                out.push_str("</ObjectParts>");
            }
        }
        if has("StorageClass") {
            push_element(&mut out, "StorageClass", "STANDARD");
        }
        if has("ObjectSize") {
            push_number_element(&mut out, "ObjectSize", meta.size_bytes);
        }
        out.push_str("</GetObjectAttributesResponse>");
        let head = ResponseHead::new(200)
            .with_header("Content-Type", "application/xml")
            .with_header("Last-Modified", super::http_date(meta.mtime_ms));
        self.respond(conn, req, head, out.as_bytes()).await
    }

    // ------------------------------------------------------------------
    // DeleteObjects
    // ------------------------------------------------------------------

    pub(super) async fn delete_objects(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let body = self
            .read_verified_body(conn, req, auth, DELETE_BODY_BYTES_MAX)
            .await?;
        let (quiet, keys) = xml::parse_delete(&body).map_err(malformed)?;
        if keys.is_empty() {
            return Err(malformed("The Delete element lists no Object"));
        }
        // Each key on its owner, a bounded number at once.
        let mut results: Vec<Result<(), S3Error>> = Vec::with_capacity(keys.len());
        for batch in keys.chunks(DELETES_IN_FLIGHT_MAX) {
            let calls = batch.iter().map(|key| async move {
                if key.is_empty() || key.len() > S3_KEY_BYTES_MAX || key.contains('\0') {
                    return Err(S3Error::invalid_argument("Invalid key"));
                }
                let owner = self.shard.owner_of(&req.bucket, key);
                let op = Op::Delete {
                    bucket: req.bucket.clone(),
                    key: key.clone(),
                };
                match self.shard.call(owner, op).await {
                    Reply::Deleted(_) => Ok(()),
                    other => Err(unexpected(other)),
                }
            });
            results.extend(futures::future::join_all(calls).await);
        }
        let mut out = String::with_capacity(128 + keys.len() * 80);
        push_open_root(&mut out, "DeleteResult");
        for (key, result) in keys.iter().zip(&results) {
            match result {
                Ok(()) if quiet => {}
                Ok(()) => {
                    out.push_str("<Deleted>");
                    push_element(&mut out, "Key", key);
                    out.push_str("</Deleted>");
                }
                Err(e) => {
                    out.push_str("<Error>");
                    push_element(&mut out, "Key", key);
                    push_element(&mut out, "Code", e.code);
                    push_element(&mut out, "Message", &e.message);
                    out.push_str("</Error>");
                }
            }
        }
        out.push_str("</DeleteResult>");
        self.respond_xml(conn, req, &out).await
    }

    // ------------------------------------------------------------------
    // ListObjectVersions (unversioned buckets: every version is "null")
    // ------------------------------------------------------------------

    pub(super) async fn list_object_versions(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        if !self.shard.bucket_exists(&req.bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let prefix = req.q("prefix").unwrap_or("").to_string();
        let delimiter = req
            .q("delimiter")
            .filter(|d| !d.is_empty())
            .map(str::to_string);
        let max_keys = parse_limit(req.q("max-keys"), "max-keys", 1000)?;
        let key_marker = req.q("key-marker").unwrap_or("").to_string();
        // With version-id-marker=null the marker key itself was listed.
        let encoding_url = req.q("encoding-type") == Some("url");
        let (items, truncated) = self
            .list_merged(
                &req.bucket,
                &prefix,
                &key_marker,
                delimiter.clone(),
                max_keys,
            )
            .await?;
        let mut out = String::with_capacity(512 + items.len() * 300);
        push_open_root(&mut out, "ListVersionsResult");
        push_element(&mut out, "Name", &req.bucket);
        push_key_element(&mut out, "Prefix", &prefix, encoding_url);
        push_key_element(&mut out, "KeyMarker", &key_marker, encoding_url);
        push_element(
            &mut out,
            "VersionIdMarker",
            req.q("version-id-marker").unwrap_or(""),
        );
        if truncated {
            if let Some(last) = items.last() {
                push_key_element(&mut out, "NextKeyMarker", last.name(), encoding_url);
                push_element(&mut out, "NextVersionIdMarker", "null");
            }
        }
        push_number_element(&mut out, "MaxKeys", max_keys as u64);
        if let Some(d) = &delimiter {
            push_key_element(&mut out, "Delimiter", d, encoding_url);
        }
        if encoding_url {
            push_element(&mut out, "EncodingType", "url");
        }
        push_bool_element(&mut out, "IsTruncated", truncated);
        for item in &items {
            if let ListItem::Object {
                key,
                size_bytes,
                etag,
                mtime_ms,
            } = item
            {
                out.push_str("<Version>");
                push_key_element(&mut out, "Key", key, encoding_url);
                push_element(&mut out, "VersionId", "null");
                push_bool_element(&mut out, "IsLatest", true);
                push_element(&mut out, "LastModified", &iso8601_ms(*mtime_ms));
                push_element(&mut out, "ETag", &quoted(etag));
                let _ = write!(out, "<Size>{size_bytes}</Size>");
                push_owner(&mut out, OWNER_ID_DEFAULT);
                push_element(&mut out, "StorageClass", "STANDARD");
                out.push_str("</Version>");
            }
        }
        for item in &items {
            if let ListItem::Prefix(p) = item {
                out.push_str("<CommonPrefixes>");
                push_key_element(&mut out, "Prefix", p, encoding_url);
                out.push_str("</CommonPrefixes>");
            }
        }
        out.push_str("</ListVersionsResult>");
        self.respond_xml(conn, req, &out).await
    }
}

#[cfg(test)]
mod tests {
    use super::parse_copy_range;

    #[test]
    fn copy_ranges() {
        assert_eq!(parse_copy_range("bytes=0-9", 100).unwrap(), (0, 10));
        assert_eq!(parse_copy_range("bytes=10-10", 100).unwrap(), (10, 1));
        assert_eq!(
            parse_copy_range("bytes=90-100", 100).unwrap_err().status,
            416
        );
        for bad in ["bytes=5-1", "bytes=-5", "bytes=5-", "5-6", "bytes=a-b"] {
            assert_eq!(parse_copy_range(bad, 100).unwrap_err().status, 400, "{bad}");
        }
    }
}
