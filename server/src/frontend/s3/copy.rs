//! CopyObject and UploadPartCopy: the copy source header, its range and
//! its x-amz-copy-source-if-* preconditions, and the byte copy itself.

use std::rc::Rc;

use bytes::Bytes;
use md5::{Digest, Md5};

use super::conditional::check_conditions_with;
use super::copy_remote::RemoteSource;
use super::route::percent_decode;
use super::versions::with_version;
use super::{checksum, quoted, Conn, Request, S3Front};
use crate::access::Principal;
use crate::bucket_config::tagging::OBJECT_TAGS_HEADER;
use crate::frontend::common::{PUT_BYTES_MAX, S3_KEY_BYTES_MAX};
use crate::frontend::datapath::GET_PIECE_BYTES;
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml::{iso8601_ms, push_element, push_open_root};
use crate::shard::object::{ObjectSink, ObjectSource};
use crate::store::mpu::is_reserved_header;
use crate::store::record::ObjectMeta;
use crate::store::versions::Pick;

/// `x-amz-copy-source`: `[/]bucket/key[?versionId=id]`, URL-encoded.
pub(super) fn parse_copy_source(req: &Request) -> Result<(String, String, Pick), S3Error> {
    let raw = req.head.header_str("x-amz-copy-source").unwrap_or("");
    let (path, query) = raw.split_once('?').unwrap_or((raw, ""));
    let pick = match query {
        "" => Pick::Current,
        q => q
            .strip_prefix("versionId=")
            .and_then(Pick::parse)
            .ok_or_else(|| S3Error::invalid_argument("Invalid version id specified"))?,
    };
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
    Ok((bucket, key, pick))
}

/// `x-amz-copy-source-range: bytes=first-last` (both required, inclusive).
pub(super) fn parse_copy_range(value: &str, size: u64) -> Result<(u64, u64), S3Error> {
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

/// Where a copy source's bytes are read.
pub(super) enum CopyReader {
    /// On this node.
    Local(ObjectSource),
    /// On the cluster node that leads the source (`copy_remote`).
    Remote(RemoteSource),
}

/// An opened copy source.
pub(super) struct CopySource {
    pub(super) source: CopyReader,
    pub(super) meta: ObjectMeta,
    pub(super) bucket: String,
    pub(super) key: String,
    pub(super) pick: Pick,
    /// Its version id (None: its bucket was never versioned).
    pub(super) version_id: Option<String>,
}

/// `head` with the copy source's version id, if it has one.
fn with_source_version(head: ResponseHead, version_id: Option<String>) -> ResponseHead {
    match version_id {
        Some(v) => head.with_header("x-amz-copy-source-version-id", v),
        None => head,
    }
}

impl S3Front {
    /// Opens the copy source and applies the x-amz-copy-source-if-* tests.
    pub(super) async fn open_copy_source(
        &self,
        req: &Request,
        principal: &Principal,
    ) -> Result<CopySource, S3Error> {
        let (bucket, key, pick) = parse_copy_source(req)?;
        // Permission first: a source bucket's existence is not told to
        // whoever may not read it.
        let action = if pick == Pick::Current {
            "s3:GetObject"
        } else {
            "s3:GetObjectVersion"
        };
        if !self.allowed(principal, action, &bucket, Some(&key)) {
            return Err(super::authz::access_denied());
        }
        if !self.shard.bucket_exists(&bucket) {
            return Err(S3Error::no_such_bucket());
        }
        let (source, meta, version_id) = match self.remote_owner(&bucket, &key)? {
            Some(peer) => {
                let (source, meta, version_id) =
                    self.open_remote(peer, (&bucket, &key, pick)).await?;
                (CopyReader::Remote(source), Rc::new(meta), version_id)
            }
            None => {
                let (source, meta, version_id) =
                    ObjectSource::open_version(&self.shard, &bucket, &key, pick).await?;
                (CopyReader::Local(source), meta, version_id)
            }
        };
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
        Ok(CopySource {
            source,
            meta: ObjectMeta::clone(&meta),
            bucket,
            key,
            pick,
            version_id,
        })
    }

    /// Streams `len` bytes from `source` at `start` into `sink`; returns
    /// the MD5 of the bytes copied.
    pub(super) async fn copy_bytes(
        &self,
        source: &mut CopyReader,
        sink: &mut ObjectSink,
        start: u64,
        len: u64,
        mut checksum: Option<&mut checksum::Hasher>,
    ) -> Result<String, S3Error> {
        let source = match source {
            CopyReader::Local(source) => source,
            CopyReader::Remote(remote) => {
                return self
                    .copy_remote_bytes(remote, sink, (start, len), checksum)
                    .await
            }
        };
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
            if let Some(h) = checksum.as_deref_mut() {
                h.update(&chunk[..]);
            }
            offset += chunk.len() as u64;
            sink.write(Bytes::copy_from_slice(&chunk)).await?;
        }
        Ok(hex::encode(md5.finalize()))
    }

    pub(super) async fn copy_object(
        &self,
        conn: &mut Conn,
        req: &Request,
        principal: &Principal,
    ) -> Result<(), S3Error> {
        let CopySource {
            mut source,
            meta: src_meta,
            bucket: src_bucket,
            key: src_key,
            pick: src_pick,
            version_id: src_version,
        } = self.open_copy_source(req, principal).await?;
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
        if !replace && src_bucket == req.bucket && src_key == req.key && src_pick == Pick::Current {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes.",
            ));
        }
        let mut meta = if replace {
            self.object_meta_from_request(req)?
        } else {
            ObjectMeta {
                content_type: src_meta.content_type.clone(),
                headers: src_meta.headers.clone(),
                ..Default::default()
            }
        };
        // Tags follow x-amz-tagging-directive, apart from the metadata.
        // A COMPOSITE checksum describes the source's parts, which the copy
        // does not keep; with x-amz-checksum-algorithm the copy is summed
        // anew.
        let summed = copy_checksum(req)?;
        meta.headers.retain(|(n, v)| {
            n != OBJECT_TAGS_HEADER
                && !is_reserved_header(n)
                && !(n.starts_with(checksum::HEADER_PREFIX)
                    && (summed.is_some()
                        || checksum::ChecksumType::of_value(v)
                            == checksum::ChecksumType::Composite))
        });
        let tags = match req.head.header_str("x-amz-tagging-directive") {
            None => src_tags(&src_meta),
            Some(v) if v.eq_ignore_ascii_case("COPY") => src_tags(&src_meta),
            Some(v) if v.eq_ignore_ascii_case("REPLACE") => super::object::request_tags(req)?,
            Some(_) => {
                return Err(S3Error::invalid_argument(
                    "Unknown tagging directive: use COPY or REPLACE",
                ))
            }
        };
        if let Some(tags) = tags {
            meta.headers.push((OBJECT_TAGS_HEADER.to_string(), tags));
        }
        let mut sink = ObjectSink::open(&self.shard, &req.bucket, &req.key, meta).await?;
        let mut hasher = summed.map(checksum::Hasher::new);
        let etag = self
            .copy_bytes(
                &mut source,
                &mut sink,
                0,
                src_meta.size_bytes,
                hasher.as_mut(),
            )
            .await?;
        drop(source);
        let stored: Vec<(String, String)> = summed
            .zip(hasher)
            .map(|(a, h)| (a.header().to_string(), h.finish_base64()))
            .into_iter()
            .collect();
        let sum = stored.first().cloned();
        let (info, version_id) = sink.finish_version(etag, stored).await?;
        let mut out = String::with_capacity(256);
        push_open_root(&mut out, "CopyObjectResult");
        push_element(&mut out, "LastModified", &iso8601_ms(info.mtime_ms));
        push_element(&mut out, "ETag", &quoted(&info.etag));
        if let (Some(a), Some((_, value))) = (summed, &sum) {
            push_element(&mut out, &format!("Checksum{}", a.name()), value);
            push_element(&mut out, "ChecksumType", "FULL_OBJECT");
        }
        out.push_str("</CopyObjectResult>");
        let head = ResponseHead::new(200).with_header("Content-Type", "application/xml");
        let head = with_source_version(with_version(head, version_id), src_version);
        self.respond(conn, req, head, out.as_bytes()).await
    }

    pub(super) async fn upload_part_copy(
        &self,
        conn: &mut Conn,
        req: &Request,
        part: Option<(String, u32)>,
        principal: &Principal,
        chosen: Option<checksum::UploadChecksum>,
    ) -> Result<(), S3Error> {
        let CopySource {
            mut source,
            meta: src_meta,
            version_id: src_version,
            ..
        } = self.open_copy_source(req, principal).await?;
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
        // A part of an upload with a checksum carries one, as uploaded
        // parts do.
        let algorithm = chosen.map(|c| c.algorithm);
        let mut hasher = algorithm.map(checksum::Hasher::new);
        let etag = self
            .copy_bytes(&mut source, &mut sink, start, len, hasher.as_mut())
            .await?;
        drop(source);
        let sum = algorithm.zip(hasher).map(|(a, h)| (a, h.finish_base64()));
        let stored = sum
            .iter()
            .map(|(a, v)| (a.header().to_string(), v.clone()))
            .collect();
        let info = sink.finish_with(etag, stored).await?;
        let mut out = String::with_capacity(256);
        push_open_root(&mut out, "CopyPartResult");
        push_element(&mut out, "LastModified", &iso8601_ms(info.mtime_ms));
        push_element(&mut out, "ETag", &quoted(&info.etag));
        if let Some((a, value)) = &sum {
            push_element(&mut out, &format!("Checksum{}", a.name()), value);
        }
        out.push_str("</CopyPartResult>");
        let head = ResponseHead::new(200).with_header("Content-Type", "application/xml");
        self.respond(
            conn,
            req,
            with_source_version(head, src_version),
            out.as_bytes(),
        )
        .await
    }
}

/// CopyObject's `x-amz-checksum-algorithm`: the copy is summed with it.
fn copy_checksum(req: &Request) -> Result<Option<checksum::Algorithm>, S3Error> {
    match req.head.header_str("x-amz-checksum-algorithm") {
        None => Ok(None),
        Some(name) => checksum::Algorithm::from_name(name.trim())
            .map(Some)
            .ok_or_else(|| {
                S3Error::new(
                    400,
                    "InvalidRequest",
                    format!("Checksum algorithm {name} is not supported; use CRC32, CRC32C, CRC64NVME, SHA1 or SHA256"),
                )
            }),
    }
}

fn src_tags(meta: &ObjectMeta) -> Option<String> {
    meta.headers
        .iter()
        .find(|(n, _)| n == OBJECT_TAGS_HEADER)
        .map(|(_, v)| v.clone())
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
