//! percore's S3 extension for many objects in one request: BatchGet over
//! HTTP, for clients that cannot speak the native protocol.
//!
//! `POST /{bucket}?batchGet` (SigV4 with a signed payload hash: the body
//! names what is read) with an XML body
//! (at most 1 MiB, 1000 `Object`s):
//!
//! ```xml
//! <BatchGet>
//!   <Object><Key>train/0001.jpg</Key></Object>
//!   <Object><Key>big.parquet</Key><Range>bytes=0-65535</Range></Object>
//! </BatchGet>
//! ```
//!
//! The answer is `200`, `Content-Type: application/x-tar`, chunked: a POSIX
//! (pax) tar stream with one member per `Object`, in request order. Each
//! member has a pax header carrying the exact key (`path`), its position in
//! the request (`PERCORE.index`), the object's ETag and size, and for a
//! ranged item `PERCORE.range` (`start-end/size`). An item that cannot be
//! served (missing key, unsatisfiable range) is a zero-length member with
//! `PERCORE.error` (the S3 error code) and `PERCORE.message`: it does not
//! fail the batch. Why tar (as AIStore does) and not multipart/mixed: any
//! tar reader (Python's `tarfile`, `tar -x`, WebDataset) consumes it as a
//! stream, sizes come before the bytes (no boundary scanning), and pax
//! records carry per-item metadata in a standard way.
//!
//! Items are opened and read on their owner shards up to
//! `BATCH_IN_FLIGHT` at a time, as tasks that run while earlier members are
//! being written; an item up
//! to `BATCH_INLINE_BYTES_MAX` is read whole ahead, a larger one is opened
//! again and streamed piece by piece when its turn comes. A read that fails after its
//! member's header is out cuts the connection (a short tar), so wrong
//! bytes are never served.

use std::collections::VecDeque;

use super::serve::BodyCheck;
use super::{malformed, Conn, Request, S3Front};
use crate::frontend::common::S3_KEY_BYTES_MAX;
use crate::frontend::datapath::GET_PIECE_BYTES;
use crate::frontend::http::{parse_range, RangeSpec, ResponseHead};
use crate::frontend::s3::auth::{PayloadMode, Verified};
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::xml;
use crate::shard::object::ObjectSource;
use crate::shard::Shard;
use crate::store::record::ObjectMeta;
use std::rc::Rc;

/// Objects in one BatchGet (as DeleteObjects).
pub const BATCH_ITEMS_MAX: usize = 1000;
/// Items opened and read ahead of the one being sent.
const BATCH_IN_FLIGHT: usize = 8;
/// Items up to this size are read whole ahead of their turn; larger ones
/// stream when they are reached (so at most `BATCH_IN_FLIGHT` of these
/// are held per request).
const BATCH_INLINE_BYTES_MAX: u64 = 1 << 20;

/// One requested item: key and optional `Range` value.
pub type BatchItem = (String, Option<String>);

/// Parses the request body.
pub fn parse_batch(body: &[u8]) -> Result<Vec<BatchItem>, String> {
    let root = xml::parse_xml(body)?
        .filter(|r| r.name == "BatchGet")
        .ok_or("The body must be a BatchGet element")?;
    let items: Vec<BatchItem> = root
        .children
        .iter()
        .filter(|c| c.name == "Object")
        .map(|o| {
            (
                o.child("Key").map(|k| k.text.clone()).unwrap_or_default(),
                o.child("Range").map(|r| r.text.trim().to_string()),
            )
        })
        .collect();
    if items.is_empty() {
        return Err("The BatchGet element lists no Object".into());
    }
    if items.len() > BATCH_ITEMS_MAX {
        return Err(format!(
            "A BatchGet request takes at most {BATCH_ITEMS_MAX} objects"
        ));
    }
    Ok(items)
}

/// What an item turned into before its turn to be sent.
enum Fetched {
    Failed(S3Error),
    /// Read whole ahead.
    Bytes {
        meta: Rc<ObjectMeta>,
        start: u64,
        data: Vec<u8>,
    },
    /// Too large to read ahead: opened again, and streamed, when its turn
    /// comes (holding it open meanwhile would pin a session on its owner
    /// for as long as the members before it take to send).
    Large,
}

/// `start..start+len` of an object of `size` bytes for a `Range` value.
fn item_range(range: Option<&str>, size: u64) -> Result<(u64, u64), S3Error> {
    let Some(value) = range else {
        return Ok((0, size));
    };
    match parse_range(value.as_bytes(), size) {
        Ok(RangeSpec::Single(a, b)) => Ok((a, b - a + 1)),
        Ok(RangeSpec::Multi(_)) => Err(S3Error::invalid_argument(
            "one range per Object (list the key again for another range)",
        )),
        // An unparseable value, which a GET would ignore: here it is an
        // error, the caller asked for a range.
        Ok(RangeSpec::Whole) => Err(S3Error::invalid_argument(
            "Range must be bytes=first-last, bytes=first- or bytes=-suffix",
        )),
        Err(_) => Err(S3Error::new(
            416,
            "InvalidRange",
            "The requested range is not satisfiable",
        )),
    }
}

/// Opens an item on its owner and, when small, reads it whole. A task of
/// its own (owned arguments), so that it runs while earlier members are
/// being written.
async fn fetch_item(
    shard: Rc<Shard>,
    bucket: String,
    key: String,
    range: Option<String>,
) -> Fetched {
    let (bucket, key, range) = (bucket.as_str(), key.as_str(), range.as_deref());
    if key.is_empty() || key.len() > S3_KEY_BYTES_MAX || key.contains('\0') {
        return Fetched::Failed(S3Error::invalid_argument("Invalid key"));
    }
    let (mut source, meta) = match ObjectSource::open(&shard, bucket, key).await {
        Ok(x) => x,
        Err(e) => return Fetched::Failed(e.into()),
    };
    let (start, len) = match item_range(range, meta.size_bytes) {
        Ok(r) => r,
        Err(e) => return Fetched::Failed(e),
    };
    if len > BATCH_INLINE_BYTES_MAX {
        return Fetched::Large;
    }
    let mut data = Vec::with_capacity(len as usize);
    let end = start + len;
    while start + (data.len() as u64) < end {
        let at = start + data.len() as u64;
        match source.read(at, end - at).await {
            Ok(chunk) if chunk.is_empty() => {
                return Fetched::Failed(S3Error::internal("object shorter than its metadata"))
            }
            Ok(chunk) => data.extend_from_slice(&chunk),
            Err(e) => return Fetched::Failed(e.into()),
        }
    }
    Fetched::Bytes { meta, start, data }
}

impl S3Front {
    /// `POST /{bucket}?batchGet`: see the module doc.
    pub(super) async fn batch_get(
        &self,
        conn: &mut Conn,
        req: &Request,
        auth: &Verified,
    ) -> Result<(), S3Error> {
        // The body names what is read, and only a signature covers it:
        // nothing is granted to anonymous requests here.
        if auth.principal == crate::access::Principal::Anonymous {
            return Err(super::authz::access_denied());
        }
        self.require_bucket(req)?;
        // SigV2 signs only the sub-resources it knows, and `batchGet` is
        // not one of them: accept SigV4 only (its scope is never empty).
        if auth.scope.is_empty() {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "BatchGet requires Signature Version 4 (AWS4-HMAC-SHA256)",
            ));
        }
        // The body names what is read: an unsigned body (UNSIGNED-PAYLOAD,
        // a presigned URL) would let whoever holds the request read any key
        // of the bucket. The payload hash must be signed.
        if !matches!(auth.payload, PayloadMode::Sha256(_)) {
            return Err(S3Error::new(
                400,
                "InvalidRequest",
                "BatchGet needs a signed body: x-amz-content-sha256 (or a presigned X-Amz-Content-Sha256) with the body's SHA-256; UNSIGNED-PAYLOAD is refused",
            ));
        }
        if !conn.request_is_http11() {
            return Err(S3Error::invalid_argument(
                "BatchGet answers with a chunked body: send it over HTTP/1.1",
            ));
        }
        let body = self
            .read_verified_body(
                conn,
                req,
                auth,
                xml::PARSE_BODY_BYTES_MAX,
                BodyCheck::Verify,
            )
            .await?;
        let items = parse_batch(&body).map_err(malformed)?;
        let head = ResponseHead::new(200)
            .with_header("Content-Type", "application/x-tar")
            .with_header("x-percore-batch-items", items.len().to_string())
            .with_header("x-amz-request-id", req.request_id.clone());
        conn.write_response_chunked(&head).await?;
        // Up to BATCH_IN_FLIGHT fetches run as tasks ahead of the member
        // being written (dropped, hence cancelled, if the request ends).
        let mut ahead: VecDeque<glommio::Task<Fetched>> = VecDeque::new();
        let mut started = 0usize;
        for (index, (key, range)) in items.iter().enumerate() {
            while started < items.len() && ahead.len() < BATCH_IN_FLIGHT {
                let (k, r) = &items[started];
                glommio::yield_if_needed().await;
                if self.allowed(&auth.principal, "s3:GetObject", &req.bucket, Some(k)) {
                    ahead.push_back(glommio::spawn_local(fetch_item(
                        self.shard.clone(),
                        req.bucket.clone(),
                        k.clone(),
                        r.clone(),
                    )));
                } else {
                    let denied = Fetched::Failed(super::authz::access_denied());
                    ahead.push_back(glommio::spawn_local(async move { denied }));
                }
                started += 1;
            }
            let item = ahead
                .pop_front()
                .expect("the item's task was started")
                .await;
            self.send_member(conn, req, index, key, range.as_deref(), item)
                .await?;
        }
        conn.write_chunk(&[0u8; 2 * tar::BLOCK]).await?;
        conn.finish_chunks().await?;
        Ok(())
    }

    async fn send_member(
        &self,
        conn: &mut Conn,
        req: &Request,
        index: usize,
        key: &str,
        range: Option<&str>,
        item: Fetched,
    ) -> Result<(), S3Error> {
        let ranged = range.is_some();
        let mut records: Vec<(&str, String)> = vec![
            ("path", key.to_string()),
            ("PERCORE.index", index.to_string()),
        ];
        // A large item is opened now: the version whose size goes into
        // its header is the version streamed.
        let mut large = None;
        if let Fetched::Large = item {
            large = Some(
                match ObjectSource::open(&self.shard, &req.bucket, key).await {
                    Err(e) => Err(S3Error::from(e)),
                    Ok((source, meta)) => match item_range(range, meta.size_bytes) {
                        Ok((start, len)) => Ok((source, meta, start, len)),
                        Err(e) => Err(e),
                    },
                },
            );
        }
        let (meta, start, len) = match (&item, &large) {
            (Fetched::Failed(e), _) | (Fetched::Large, Some(Err(e))) => {
                records.push(("PERCORE.error", e.code.to_string()));
                records.push(("PERCORE.message", e.message.clone()));
                let header = tar::member_header(index, &records, 0, 0);
                conn.write_chunk(&header).await?;
                return Ok(());
            }
            (Fetched::Bytes { meta, start, data }, _) => (meta.clone(), *start, data.len() as u64),
            (Fetched::Large, Some(Ok((_, meta, start, len)))) => (meta.clone(), *start, *len),
            (Fetched::Large, None) => unreachable!("opened above"),
        };
        records.push(("PERCORE.etag", meta.etag.clone()));
        records.push(("PERCORE.size", meta.size_bytes.to_string()));
        if ranged {
            let last = (start + len).saturating_sub(1);
            records.push((
                "PERCORE.range",
                format!("{start}-{last}/{}", meta.size_bytes),
            ));
        }
        let header = tar::member_header(index, &records, len, meta.mtime_ms / 1000);
        conn.write_chunk(&header).await?;
        match (item, large) {
            (Fetched::Bytes { data, .. }, _) => conn.write_chunk(&data).await?,
            (Fetched::Large, Some(Ok((mut source, _, start, len)))) => {
                let end = start + len;
                let mut at = start;
                while at < end {
                    let want = (end - at).min(GET_PIECE_BYTES);
                    match source.read(at, want).await {
                        // Never more than asked: the member's size is out.
                        Ok(chunk) if !chunk.is_empty() && chunk.len() as u64 <= want => {
                            conn.write_chunk(&chunk).await?;
                            at += chunk.len() as u64;
                        }
                        other => {
                            // The member's size is out: cut the stream.
                            tracing::error!(shard = self.shard.id, request_id = %req.request_id, bucket = %req.bucket, key, "BatchGet failed mid-member: {:?}", other.err());
                            return Err(S3Error::internal("read failed mid-body"));
                        }
                    }
                }
            }
            _ => unreachable!("failures are answered above"),
        }
        let pad = tar::padding(len);
        if pad > 0 {
            conn.write_chunk(&[0u8; tar::BLOCK][..pad]).await?;
        }
        Ok(())
    }
}

/// Just enough of POSIX.1-2001 (pax) tar to write members.
pub mod tar {
    pub const BLOCK: usize = 512;

    /// Zero bytes after `len` bytes of member data, to the next block.
    pub fn padding(len: u64) -> usize {
        ((BLOCK as u64 - len % BLOCK as u64) % BLOCK as u64) as usize
    }

    /// One pax record: `"<len> <name>=<value>\n"`, where `<len>` counts
    /// the whole record, its own digits included.
    pub fn pax_record(out: &mut Vec<u8>, name: &str, value: &str) {
        let body = name.len() + value.len() + 3; // ' ', '=', '\n'
        let mut len = body + 1;
        while len != body + len.to_string().len() {
            len = body + len.to_string().len();
        }
        out.extend_from_slice(len.to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }

    fn octal(field: &mut [u8], value: u64) {
        // `field.len() - 1` octal digits and a NUL; callers keep values in
        // range (sizes past 8 GiB travel in the pax `size` record).
        let digits = field.len() - 1;
        let s = format!("{value:0digits$o}");
        let s = &s.as_bytes()[s.len().saturating_sub(digits)..];
        field[..digits].copy_from_slice(s);
        field[digits] = 0;
    }

    /// A ustar header block.
    pub fn ustar(name: &str, size: u64, mtime: u64, typeflag: u8) -> [u8; BLOCK] {
        let mut h = [0u8; BLOCK];
        let name = name.as_bytes();
        let n = name.len().min(99);
        h[..n].copy_from_slice(&name[..n]);
        octal(&mut h[100..108], 0o644);
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], size.min(0o77777777777));
        octal(&mut h[136..148], mtime.min(0o77777777777));
        h[156] = typeflag;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        octal(&mut h[148..155], u64::from(sum));
        h[155] = b' ';
        h
    }

    /// The pax extended header (its header block, records and padding)
    /// and the ustar header of member `index` with `size` data bytes. The
    /// ustar name is a safe placeholder (`percore-batch/<index>`): the
    /// key, whatever its bytes, travels in the pax `path` record.
    pub fn member_header(
        index: usize,
        records: &[(&str, String)],
        size: u64,
        mtime: u64,
    ) -> Vec<u8> {
        let mut pax = Vec::with_capacity(256);
        for (name, value) in records {
            pax_record(&mut pax, name, value);
        }
        if size > 0o77777777777 {
            pax_record(&mut pax, "size", &size.to_string());
        }
        let mut out = Vec::with_capacity(3 * BLOCK + pax.len());
        out.extend_from_slice(&ustar(
            &format!("PaxHeaders/{index}"),
            pax.len() as u64,
            mtime,
            b'x',
        ));
        out.extend_from_slice(&pax);
        out.resize(out.len() + padding(pax.len() as u64), 0);
        out.extend_from_slice(&ustar(&format!("percore-batch/{index}"), size, mtime, b'0'));
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn pax_record_lengths_count_their_own_digits() {
            for value_len in [
                0usize, 1, 4, 5, 6, 90, 94, 95, 96, 990, 994, 995, 996, 9_990,
            ] {
                let mut out = Vec::new();
                let value = "v".repeat(value_len);
                pax_record(&mut out, "path", &value);
                let text = std::str::from_utf8(&out).unwrap();
                let (len, _) = text.split_once(' ').unwrap();
                assert_eq!(len.parse::<usize>().unwrap(), out.len(), "{value_len}");
            }
        }

        #[test]
        fn ustar_checksum_and_fields() {
            let h = ustar("a/b", 1234, 1_700_000_000, b'0');
            let stored = std::str::from_utf8(&h[148..154]).unwrap();
            let mut copy = h;
            copy[148..156].fill(b' ');
            let sum: u32 = copy.iter().map(|&b| u32::from(b)).sum();
            assert_eq!(u32::from_str_radix(stored, 8).unwrap(), sum);
            assert_eq!(&h[124..135], format!("{:011o}", 1234).as_bytes());
            assert_eq!(&h[..3], b"a/b");
            assert_eq!(padding(0), 0);
            assert_eq!(padding(1), 511);
            assert_eq!(padding(512), 0);
        }

        #[test]
        fn member_header_is_whole_blocks() {
            let recs = vec![("path", "k".repeat(2000)), ("PERCORE.index", "7".into())];
            let h = member_header(7, &recs, 10, 0);
            assert_eq!(h.len() % BLOCK, 0);
            assert_eq!(h[156], b'x');
            assert_eq!(h[h.len() - BLOCK + 156], b'0');
        }
    }
}
