//! Object operations: PutObject (the streamed, verified body), GetObject
//! and HeadObject (single range, multiple ranges, zero-copy sends from the
//! shard ring's registered buffers), DeleteObject and GetObjectAttributes.

use bytes::{Bytes, BytesMut};
use std::time::{Duration, Instant};

use md5::Digest;
use sha2::Sha256;

use super::conditional::{check_conditions, content_md5, put_condition};
use super::versions::with_version;
use super::{
    http_date, quoted, Conn, Request, S3Front, METADATA_HEADERS_MAX, STORED_HEADERS,
    USER_METADATA_BYTES_MAX,
};
use crate::bucket_config::tagging::{TagSet, OBJECT_TAGS_HEADER, OBJECT_TAGS_MAX};
use crate::frontend::common::PUT_BYTES_MAX;
use crate::frontend::datapath::{
    self, read_piece, Piece, PieceBuilder, SendError, GET_PIECE_BYTES,
};
use crate::frontend::http::{content_range, parse_range, BodyFraming, RangeSpec, ResponseHead};
use crate::frontend::s3::auth::{ChunkedDecoder, PayloadMode, Verified};
use crate::frontend::s3::checksum;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml::{push_element, push_number_element, push_open_root};
use crate::shard::object::{ObjectSink, ObjectSource};
use crate::store::mpu::{is_reserved_header, part_range, PARTS_HEADER};
use crate::store::record::ObjectMeta;
use crate::store::ObjectInfo;

impl S3Front {
    pub(super) fn object_meta_from_request(&self, req: &Request) -> Result<ObjectMeta, S3Error> {
        let content_type = req
            .head
            .header_str("content-type")
            .unwrap_or("binary/octet-stream")
            .to_string();
        let mut headers = Vec::new();
        let mut user_bytes = 0;
        for (name, value) in &req.head.headers {
            let stored = STORED_HEADERS.contains(&name.as_str());
            let user = name.starts_with("x-amz-meta-");
            if !stored && !user {
                continue;
            }
            let mut value = String::from_utf8(value.clone()).map_err(|_| {
                S3Error::invalid_argument(format!("header {name} is not valid UTF-8"))
            })?;
            if name == "content-encoding" {
                // aws-chunked describes the transfer, not the object.
                value = value
                    .split(',')
                    .map(str::trim)
                    .filter(|v| !v.eq_ignore_ascii_case("aws-chunked"))
                    .collect::<Vec<_>>()
                    .join(",");
                if value.is_empty() {
                    continue;
                }
            }
            if user {
                user_bytes += name.len() - "x-amz-meta-".len() + value.len();
            }
            headers.push((name.clone(), value));
        }
        if let Some(tags) = request_tags(req)? {
            headers.push((OBJECT_TAGS_HEADER.to_string(), tags));
        }
        if headers.len() > METADATA_HEADERS_MAX {
            return Err(S3Error::new(
                400,
                "MetadataTooLarge",
                format!(
                    "Too many metadata headers: {} x-amz-meta-* and stored headers \
                     (Content-Encoding, Content-Disposition, Cache-Control, \
                     Content-Language, Expires) were sent, at most {METADATA_HEADERS_MAX} are allowed.",
                    headers.len()
                ),
            ));
        }
        if user_bytes > USER_METADATA_BYTES_MAX {
            return Err(S3Error::new(
                400,
                "MetadataTooLarge",
                "Your metadata headers exceed the maximum allowed metadata size.",
            ));
        }
        Ok(ObjectMeta {
            content_type,
            headers,
            ..Default::default()
        })
    }

    pub(super) async fn put_object(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        if req.head.header("x-amz-copy-source").is_some() {
            return self.copy_object(conn, req, &auth.principal).await;
        }
        let meta = self.object_meta_from_request(req)?;
        let condition = put_condition(&req.head)?;
        let sink = ObjectSink::open_part(&self.shard, &req.bucket, &req.key, meta, None, condition)
            .await?;
        let (info, version, checksums) = self.receive_object(conn, req, auth, sink, None).await?;
        let mut head = ResponseHead::new(200).with_header("ETag", quoted(&info.etag));
        for (name, value) in checksums {
            head.push_header(name, value);
        }
        self.respond(conn, req, with_version(head, version), b"")
            .await
    }

    /// Streams the request body into `sink`, verifying every signature and
    /// digest before the object (or part) becomes visible. With `required`
    /// (a part of an upload created with a checksum algorithm) the body is
    /// summed with that algorithm whether or not the client sends a
    /// checksum. Returns the object, its version id to show and its stored
    /// checksum headers.
    pub(super) async fn receive_object(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
        mut sink: ObjectSink,
        required: Option<checksum::Algorithm>,
    ) -> Result<(ObjectInfo, Option<String>, Vec<(String, String)>), S3Error> {
        let decoded_len = check_put_length(req, auth)?;
        let content_md5 = content_md5(&req.head)?;
        if req.head.expects_continue() {
            conn.send_continue().await?;
        }
        let mut decoder = auth
            .payload
            .is_streaming()
            .then(|| ChunkedDecoder::new(&auth.payload, auth, decoded_len));
        let sent = checksum::expected(&req.head)?;
        // A checksum of another algorithm (SDKs add CRC32 to every part
        // unless told otherwise) is verified, and the upload's is summed
        // too.
        let also = required.filter(|c| sent.as_ref().is_some_and(|s| s.algorithm != *c));
        let expected_checksum = sent.or(required.map(|algorithm| checksum::Expected {
            algorithm,
            value: None,
        }));
        let mut digests = BodyDigests::new(auth, expected_checksum.as_ref(), also);
        // Reads land in `input` and are cut off it as owned chunks (the MD5
        // engine hashes them later, in lanes with other uploads); a fresh
        // buffer once the room left is short.
        let mut input = BytesMut::new();
        let mut decoded = Vec::new();
        let mut pieces = PieceBuilder::new(self.shard.md5_engine());
        let mut total = 0u64;
        loop {
            if input.len() < INPUT_ROOM_MIN_BYTES {
                input = BytesMut::zeroed(INPUT_BYTES);
            }
            let n = conn.read_body(&mut input[..]).await?;
            if n == 0 {
                break;
            }
            let raw = input.split_to(n).freeze();
            let data = match decoder.as_mut() {
                None => raw,
                Some(_) => {
                    Bytes::copy_from_slice(decode_input(decoder.as_mut(), &raw, &mut decoded)?)
                }
            };
            total += data.len() as u64;
            if total > PUT_BYTES_MAX {
                return Err(entity_too_large());
            }
            digests.update(&data);
            pieces.push(&mut sink, &data).await?;
        }
        // Everything is verified before the object becomes visible.
        if let Some(d) = &decoder {
            d.finish()?;
            if decoded_len.is_some_and(|n| n != total) {
                return Err(S3Error::new(400, "IncompleteBody", "You did not provide the number of bytes specified by the Content-Length HTTP header."));
            }
        }
        let md5 = pieces.md5().await;
        let (etag, stored) = digests.verify(
            req,
            auth,
            md5,
            content_md5,
            expected_checksum,
            decoder.as_ref(),
        )?;
        pieces.finish(&mut sink).await?;
        let checksums = stored.clone();
        let (info, version) = sink.finish_version(etag, stored).await?;
        debug_assert_eq!(info.size_bytes, total);
        Ok((info, version, checksums))
    }

    /// DeleteObject: of the current version (a delete marker where the
    /// bucket is versioned), or of the version `versionId` names, for good.
    pub(super) async fn delete_object(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let removed = self
            .shard
            .delete_version(&req.bucket, &req.key, req.pick())
            .await?;
        let mut head = with_version(ResponseHead::new(204), removed.version_id);
        if removed.marker {
            head.push_header("x-amz-delete-marker", "true");
        }
        self.respond(conn, req, head, b"").await
    }

    pub(super) async fn get_object_attributes(
        &self,
        conn: &mut Conn,
        req: &Request,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
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
        let opened =
            ObjectSource::open_version(&self.shard, &req.bucket, &req.key, req.pick()).await;
        let (source, meta, version) = self.versioned(conn, opened)?;
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
                .filter(|(n, _)| n.starts_with(checksum::HEADER_PREFIX))
                .collect();
            if let Some((_, first)) = stored.first() {
                out.push_str("<Checksum>");
                for (name, value) in &stored {
                    let alg = name[checksum::HEADER_PREFIX.len()..].to_ascii_uppercase();
                    // As S3: a COMPOSITE value without its `-N` here
                    // (ObjectParts gives the count).
                    let digest = value.split('-').next().unwrap_or(value);
                    push_element(&mut out, &format!("Checksum{alg}"), digest);
                }
                let kind = checksum::ChecksumType::of_value(first);
                push_element(&mut out, "ChecksumType", kind.name());
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
            .with_header("Last-Modified", http_date(meta.mtime_ms));
        self.respond(conn, req, with_version(head, version), out.as_bytes())
            .await
    }
    /// GET/HEAD `partNumber`: (offset, length, parts count) of that part.
    /// An object not uploaded in parts is its own part 1 (no count).
    fn part_of(
        &self,
        req: &Request,
        meta: &ObjectMeta,
    ) -> Result<Option<(u64, u64, Option<u32>)>, S3Error> {
        if req.q("partNumber").is_none() {
            return Ok(None);
        }
        if req.head.header("range").is_some() {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "Cannot specify both Range header and partNumber query parameter",
            ));
        }
        let number = super::multipart::parse_part_number(req)?;
        let not_satisfiable = || {
            S3Error::new(
                416,
                "InvalidPartNumber",
                "The requested partnumber is not satisfiable",
            )
        };
        let sizes = meta.headers.iter().find(|(n, _)| n == PARTS_HEADER);
        match sizes {
            Some((_, runs)) => match part_range(runs, number) {
                Some((a, n, count)) if a.checked_add(n).is_some_and(|e| e <= meta.size_bytes) => {
                    Ok(Some((a, n, Some(count))))
                }
                Some(_) => Err(S3Error::internal(
                    "the object's part sizes disagree with its size",
                )),
                None => Err(not_satisfiable()),
            },
            None if !meta.etag.contains('-') => match number {
                1 => Ok(Some((0, meta.size_bytes, None))),
                _ => Err(not_satisfiable()),
            },
            // Completed by an older percore, or with part sizes too
            // varied to keep.
            None => Err(S3Error::not_implemented(
                "partNumber on a multipart object whose part sizes percore did not keep",
            )),
        }
    }

    pub(super) async fn get_object(
        &self,
        conn: &mut Conn,
        req: &Request,
        head_only: bool,
    ) -> Result<(), S3Error> {
        self.require_bucket(req)?;
        let opened =
            ObjectSource::open_version(&self.shard, &req.bucket, &req.key, req.pick()).await;
        let (mut source, meta, version) = self.versioned(conn, opened)?;
        let size = meta.size_bytes;
        if let Some(status) = check_conditions(&req.head, &meta)? {
            let mut head = with_version(ResponseHead::new(status), version);
            head.push_header("ETag", quoted(&meta.etag));
            head.push_header("Last-Modified", http_date(meta.mtime_ms));
            return self.respond(conn, req, head, b"").await;
        }
        let part = self.part_of(req, &meta)?;
        let (status, start, len) = match req.head.header("range") {
            // An empty part has no byte range to name.
            None if part.is_some() => part.map_or((200, 0, size), |(a, n, _)| {
                (if n == 0 { 200 } else { 206 }, a, n)
            }),
            None => (200, 0, size),
            Some(value) => match parse_range(value, size) {
                Ok(RangeSpec::Single(a, b)) => (206, a, b - a + 1),
                Ok(RangeSpec::Multi(ranges)) => {
                    return self
                        .get_byteranges(conn, req, source, &meta, &ranges, head_only)
                        .await;
                }
                Ok(RangeSpec::Whole) => (200, 0, size),
                // HEAD answers with the status alone (write_error sends no body).
                Err(_) => {
                    return Err(S3Error::new(
                        416,
                        "InvalidRange",
                        "The requested range is not satisfiable",
                    ));
                }
            },
        };
        let mut head = with_version(ResponseHead::new(status), version);
        head.push_header("ETag", quoted(&meta.etag));
        head.push_header("Last-Modified", http_date(meta.mtime_ms));
        head.push_header("Accept-Ranges", "bytes");
        head.push_header("Content-Type", meta.content_type.clone());
        // Whole-object checksums only in checksum mode and for whole bodies
        // (a client would check a range against them and fail).
        let checksums = status == 200
            && req
                .head
                .header_str("x-amz-checksum-mode")
                .is_some_and(|m| m.eq_ignore_ascii_case("enabled"));
        if let Some((_, _, Some(count))) = part {
            head.push_header("x-amz-mp-parts-count", count.to_string());
        }
        for (name, value) in &meta.headers {
            if is_reserved_header(name) {
                continue;
            }
            if name.starts_with(checksum::HEADER_PREFIX) {
                if checksums {
                    head.push_header(name.clone(), value.clone());
                    let kind = checksum::ChecksumType::of_value(value);
                    head.push_header("x-amz-checksum-type", kind.name());
                }
                continue;
            }
            if name == OBJECT_TAGS_HEADER {
                let count = value.split('&').filter(|p| !p.is_empty()).count();
                head.push_header("x-amz-tagging-count", count.to_string());
                continue;
            }
            head.push_header(name.clone(), value.clone());
        }
        apply_response_overrides(req, &mut head)?;
        if status == 206 {
            head.push_header("Content-Range", content_range(start, start + len - 1, size));
        }
        head.push_header("x-amz-request-id", req.request_id.clone());
        conn.write_response(&head, len, false).await?;
        if head_only {
            conn.flush().await?;
            return Ok(());
        }
        self.send_object_bytes(conn, req, &mut source, start, start + len)
            .await
    }

    /// Sends the object's bytes `start..end` as the response body (its head
    /// is out): from the ring's registered buffers where the source can
    /// read into them, else through the connection's buffer.
    async fn send_object_bytes(
        &self,
        conn: &mut Conn,
        req: &Request,
        source: &mut ObjectSource,
        start: u64,
        end: u64,
    ) -> Result<(), S3Error> {
        let send_started = Instant::now();
        let mut offset = start;

        let ring = self.shard.ring();
        while offset < end {
            // The data path: DMA into a registered buffer, CRC check there,
            // send from that buffer (SEND_ZC above the threshold); else a
            // verified copy.
            let want = (end - offset).min(GET_PIECE_BYTES);
            match read_piece(source, ring.as_deref(), offset, want).await {
                Ok(Piece::Registered {
                    buf,
                    start,
                    end: stop,
                }) => {
                    if stop == start {
                        // Never today (the store reads at least a byte
                        // below the end); a zero-length piece must not spin.
                        return Err(S3Error::internal("object shorter than its metadata"));
                    }
                    conn.flush().await?;
                    let ring = ring
                        .as_deref()
                        .expect("a registered piece comes from the ring");
                    self.send_registered(conn, ring, buf, start, stop).await?;
                    offset += (stop - start) as u64;
                }
                Ok(Piece::Copied(chunk)) => {
                    if chunk.is_empty() {
                        return Err(S3Error::internal("object shorter than its metadata"));
                    }
                    conn.write_body_direct(&chunk).await?;
                    offset += chunk.len() as u64;
                }
                Err(e) => {
                    // The status line is gone: cut the connection so the
                    // client sees a short body, never wrong bytes.
                    tracing::error!(shard = self.shard.id, request_id = %req.request_id, bucket = %req.bucket, key = %req.key, "GET failed mid-body: {e:?}");
                    return Err(S3Error::internal("read failed mid-body"));
                }
            }
        }
        conn.flush().await?;
        self.shard
            .metrics()
            .stage(crate::metrics::Stage::Send)
            .record(send_started.elapsed());
        Ok(())
    }

    /// Sends `buf[a..b]` on the connection's socket through the shard's
    /// ring, within the body timeout. The buffer returns to the pool only
    /// after the kernel's last completion (SEND_ZC's notification).
    pub(super) async fn send_registered(
        &self,
        conn: &mut Conn,
        ring: &crate::ring::DataRing,
        buf: crate::ring::PoolBuf,
        a: usize,
        b: usize,
    ) -> Result<(), S3Error> {
        use std::os::fd::AsRawFd;
        let fd = conn.get_ref().as_raw_fd();
        let limit = Duration::from_millis(conn.limits().body_timeout_ms.max(1));
        let mut zc = conn.send_zc;
        let mut sent = 0u64;
        let r = datapath::send_registered(ring, fd, buf, a, b, limit, &mut zc, &mut sent).await;
        conn.send_zc = zc;
        conn.body_bytes_written += sent;
        match r {
            Ok(()) => Ok(()),
            // The socket is shut down already (which also hands the buffer
            // back from the kernel).
            Err(SendError::TimedOut) => Err(S3Error::new(
                408,
                "RequestTimeout",
                "The client stopped reading the response",
            )),
            Err(SendError::Closed) => Err(S3Error::internal("connection closed mid-body")),
            Err(SendError::Io(e)) => {
                tracing::debug!(shard = self.shard.id, "send failed: {e}");
                Err(S3Error::internal(format!("send failed: {e}")))
            }
        }
    }

    /// Several ranges in one answer: `206 multipart/byteranges` (RFC 9110
    /// section 14.6), parts in request order.
    pub(super) async fn get_byteranges(
        &self,
        conn: &mut Conn,
        req: &Request,
        mut source: ObjectSource,
        meta: &ObjectMeta,
        ranges: &[(u64, u64)],
        head_only: bool,
    ) -> Result<(), S3Error> {
        let size = meta.size_bytes;
        let boundary = format!("percore-{}", req.request_id);
        let part_heads: Vec<String> = ranges
            .iter()
            .map(|&(a, b)| {
                format!(
                    "--{boundary}\r\nContent-Type: {}\r\nContent-Range: {}\r\n\r\n",
                    meta.content_type,
                    content_range(a, b, size)
                )
            })
            .collect();
        let closing = format!("--{boundary}--\r\n");
        let total: u64 = ranges
            .iter()
            .zip(&part_heads)
            .map(|(&(a, b), h)| h.len() as u64 + (b - a + 1) + 2)
            .sum::<u64>()
            + closing.len() as u64;
        let mut head = ResponseHead::new(206);
        head.push_header("ETag", quoted(&meta.etag));
        head.push_header("Last-Modified", http_date(meta.mtime_ms));
        head.push_header("Accept-Ranges", "bytes");
        head.push_header(
            "Content-Type",
            format!("multipart/byteranges; boundary={boundary}"),
        );
        head.push_header("x-amz-request-id", req.request_id.clone());
        conn.write_response(&head, total, false).await?;
        if head_only {
            conn.flush().await?;
            return Ok(());
        }
        for (&(a, b), part_head) in ranges.iter().zip(&part_heads) {
            conn.write_body(part_head.as_bytes()).await?;
            let mut offset = a;
            while offset <= b {
                let chunk = match source
                    .read(offset, (b + 1 - offset).min(GET_PIECE_BYTES))
                    .await
                {
                    Ok(c) if !c.is_empty() => c,
                    Ok(_) => return Err(S3Error::internal("object shorter than its metadata")),
                    Err(e) => {
                        tracing::error!(shard = self.shard.id, bucket = %req.bucket, key = %req.key, "GET failed mid-body: {e:?}");
                        return Err(S3Error::internal("read failed mid-body"));
                    }
                };
                conn.write_body(&chunk).await?;
                offset += chunk.len() as u64;
            }
            conn.write_body(b"\r\n").await?;
        }
        conn.write_body(closing.as_bytes()).await?;
        conn.flush().await?;
        Ok(())
    }
}

/// A PUT body's read buffer, and the room below which a fresh one is
/// taken.
const INPUT_BYTES: usize = 256 * 1024;
const INPUT_ROOM_MIN_BYTES: usize = 32 * 1024;

/// GET and HEAD query parameters that replace a response header (S3's
/// `response-*` overrides: what a presigned download link uses to name the
/// file a browser saves), and the header each replaces.
const RESPONSE_OVERRIDES: [(&str, &str); 6] = [
    ("response-cache-control", "Cache-Control"),
    ("response-content-disposition", "Content-Disposition"),
    ("response-content-encoding", "Content-Encoding"),
    ("response-content-language", "Content-Language"),
    ("response-content-type", "Content-Type"),
    ("response-expires", "Expires"),
];

/// Applies the request's `response-*` overrides to `head`: each replaces
/// the header of its name, stored with the object or not. A value with a
/// control character is refused (it would split the response head).
fn apply_response_overrides(req: &Request, head: &mut ResponseHead) -> Result<(), S3Error> {
    for (param, header) in RESPONSE_OVERRIDES {
        let Some(value) = req.q(param) else {
            continue;
        };
        if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(S3Error::invalid_argument(format!(
                "{param} must not hold control characters"
            )));
        }
        head.headers
            .retain(|(n, _)| !n.eq_ignore_ascii_case(header));
        head.push_header(header, value.to_string());
    }
    Ok(())
}

fn entity_too_large() -> S3Error {
    S3Error::new(
        400,
        "EntityTooLarge",
        "Your proposed upload exceeds the maximum allowed object size.",
    )
}

/// The checks on an upload's declared length made before its body is read;
/// returns x-amz-decoded-content-length (aws-chunked uploads), if sent.
fn check_put_length(req: &Request, auth: &Verified) -> Result<Option<u64>, S3Error> {
    let framing = req.head.body_framing()?;
    if matches!(framing, BodyFraming::Empty) && req.head.header("content-length").is_none() {
        // As S3: an object (or part) needs a declared length; without
        // one HTTP reads no body, and an empty object was stored.
        return Err(S3Error::new(
            411,
            "MissingContentLength",
            "You must provide the Content-Length HTTP header.",
        ));
    }
    let declared = match framing {
        BodyFraming::Empty => Some(0),
        BodyFraming::Length(n) => Some(n),
        BodyFraming::Chunked => None,
    };
    let streaming = auth.payload.is_streaming();
    let decoded_len = match req.head.header_str("x-amz-decoded-content-length") {
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| S3Error::invalid_argument("invalid x-amz-decoded-content-length"))?,
        ),
        None => None,
    };
    let size_hint = if streaming { decoded_len } else { declared };
    if size_hint.is_some_and(|n| n > PUT_BYTES_MAX) {
        return Err(entity_too_large());
    }
    if streaming && decoded_len.is_none() && auth.payload == PayloadMode::StreamingSigned {
        return Err(S3Error::new(
            411,
            "MissingContentLength",
            "x-amz-decoded-content-length is required for aws-chunked uploads",
        ));
    }
    Ok(decoded_len)
}

/// One read of the body as object bytes: through the aws-chunked decoder
/// (into `decoded`) when there is one, else as read.
fn decode_input<'a>(
    decoder: Option<&mut ChunkedDecoder>,
    input: &'a [u8],
    decoded: &'a mut Vec<u8>,
) -> Result<&'a [u8], S3Error> {
    let Some(d) = decoder else {
        return Ok(input);
    };
    decoded.clear();
    let mut at = 0;
    while at < input.len() {
        let used = d.feed(&input[at..], decoded)?;
        if used == 0 {
            // The final chunk was seen and bytes follow it.
            return Err(S3Error::new(
                400,
                "IncompleteBody",
                "Unexpected data after the final aws-chunked chunk.",
            ));
        }
        at += used;
    }
    Ok(decoded)
}

/// The digests computed over an upload's bytes as they arrive: SHA-256
/// when the payload hash was signed, and the x-amz-checksum-* algorithm
/// when one was asked for, and a second algorithm's to store (`also`).
/// (MD5, the ETag, is the `PieceBuilder`'s.)
struct BodyDigests {
    sha: Option<Sha256>,
    checksum: Option<checksum::Hasher>,
    also: Option<(checksum::Algorithm, checksum::Hasher)>,
}

impl BodyDigests {
    fn new(
        auth: &Verified,
        expected: Option<&checksum::Expected>,
        also: Option<checksum::Algorithm>,
    ) -> BodyDigests {
        BodyDigests {
            sha: matches!(auth.payload, PayloadMode::Sha256(_)).then(Sha256::new),
            checksum: expected.map(|e| checksum::Hasher::new(e.algorithm)),
            also: also.map(|a| (a, checksum::Hasher::new(a))),
        }
    }

    fn update(&mut self, data: &[u8]) {
        if let Some(h) = self.checksum.as_mut() {
            h.update(data);
        }
        if let Some((_, h)) = self.also.as_mut() {
            h.update(data);
        }
        if let Some(sha) = self.sha.as_mut() {
            sha.update(data);
        }
    }

    /// Checks every digest against what the client sent (signed payload
    /// hash, Content-MD5, checksum header or trailer); returns the ETag and
    /// the checksum header to store with the object.
    fn verify(
        self,
        req: &Request,
        auth: &Verified,
        digest: [u8; 16],
        content_md5: Option<Vec<u8>>,
        expected_checksum: Option<checksum::Expected>,
        decoder: Option<&ChunkedDecoder>,
    ) -> Result<(String, Vec<(String, String)>), S3Error> {
        if let (Some(sha), PayloadMode::Sha256(expected)) = (self.sha, &auth.payload) {
            let got: [u8; 32] = sha.finalize().into();
            auth.payload.check_body_sha256(&got)?;
            debug_assert_eq!(&got, expected);
        }
        if content_md5.is_some_and(|m| m[..] != digest[..]) {
            return Err(S3Error::new(
                400,
                "BadDigest",
                "The Content-MD5 you specified did not match what we received.",
            ));
        }
        let mut stored = Vec::new();
        if let (Some(expected), Some(hasher)) = (expected_checksum, self.checksum) {
            let name = expected.algorithm.header();
            let sent = match expected.value {
                Some(v) => Some(v),
                None => decoder
                    .and_then(|d| d.trailers().iter().find(|(n, _)| n == name))
                    .map(|(_, v)| v.clone()),
            };
            if sent.is_none() && req.head.header_str("x-amz-trailer").is_some() {
                return Err(S3Error::new(
                    400,
                    "InvalidRequest",
                    format!("The {name} trailer announced in x-amz-trailer was not sent."),
                ));
            }
            let got = hasher.finish_base64();
            if sent.as_ref().is_some_and(|v| *v != got) {
                return Err(checksum::mismatch(expected.algorithm));
            }
            stored.push((name.to_string(), got));
        }
        if let Some((algorithm, hasher)) = self.also {
            stored.push((algorithm.header().to_string(), hasher.finish_base64()));
        }
        Ok((hex::encode(digest), stored))
    }
}

/// The request's `x-amz-tagging`, checked and normalized (None: absent or
/// empty).
pub(super) fn request_tags(req: &Request) -> Result<Option<String>, S3Error> {
    let Some(raw) = req.head.header_str("x-amz-tagging") else {
        return Ok(None);
    };
    let tags = TagSet::parse_query(raw, OBJECT_TAGS_MAX)?;
    Ok((!tags.0.is_empty()).then(|| tags.to_query()))
}
