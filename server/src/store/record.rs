//! On-disk record format (byte by byte in `docs/design.md`, "Record format").
//!
//! A record is a 32-byte fixed header, a variable header and a payload:
//!
//! ```text
//! 0  u32 magic  0x52435050 ("PPCR")   8  u32 header_bytes (fixed + variable)
//! 4  u8  version (1)                 12  u32 header_crc32c (this field zeroed)
//! 5  u8  kind                        16  u64 payload_bytes
//! 6  u16 flags (0)                   24  u64 seq
//! ```
//! The variable header holds bucket, key, one CRC32C per payload block and
//! the kind's fields. A block is 4 KiB in records written by data format 3,
//! 64 KiB before; the stored block count says which (`block_bytes`). The header CRC therefore covers the payload too, one
//! block at a time, so a range read verifies only the blocks it touches.
//! Records start at 8-byte aligned offsets; all integers are little-endian.
//!
//! Version 2 binds every header to the place the writer put it: its check
//! field is SipHash-2-4, keyed with the shard secret and the segment id, of
//! `offset (u64)` and the header with the check field zeroed, folded to 32
//! bits (version 1: CRC32C of the header alone). The shard secret is a random
//! value kept in every segment's header (offset 0, where no user byte can
//! be) and nowhere a client can read it, so a header that a user plants in
//! an object's payload does not verify where a scan may find it (after a
//! torn batch or past damage), and a real header copied elsewhere does not
//! verify there either. Version 1 (CRC over the header alone) is still read,
//! only in segments whose own header is version 1.

use thiserror::Error;

pub const MAGIC: u32 = 0x5243_5050;
/// The version written. Segments of version 1 are read (and rewritten to
/// version 2 by compaction), never appended to except for a seal.
pub const VERSION: u8 = 2;
pub const VERSION_1: u8 = 1;
pub const FIXED_HEADER_BYTES: usize = 32;
/// Records start at multiples of this within a segment.
pub const RECORD_ALIGN_BYTES: u64 = 8;
/// Payload CRC granularity of the records written now (data format 3): a
/// 4 KiB range reads and checks at most two blocks.
pub const BLOCK_BYTES: u64 = 4 * 1024;
/// Payload CRC granularity of records written by data format 2 and before.
/// They are read as they are (compaction copies a record's header bytes,
/// so it keeps its blocks).
pub const LEGACY_BLOCK_BYTES: u64 = 64 * 1024;
/// The larger of the two: a span aligned to it is aligned to either.
pub const BLOCK_BYTES_MAX: u64 = LEGACY_BLOCK_BYTES;
/// Upper bound of a header (key, metadata, block CRCs, extent list).
pub const HEADER_BYTES_MAX: usize = 256 * 1024;
/// Store-level bound: S3 keys are at most 1024 bytes; the multipart
/// namespace (`store::mpu`) adds an upload id and part number.
pub const KEY_BYTES_MAX: usize = 1100;
pub const BUCKET_BYTES_MAX: usize = 255;
/// Bound on metadata entries per object (S3 allows 2 KiB of user metadata).
pub const HEADERS_COUNT_MAX: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// An object version: metadata plus inline payload or a list of extents.
    Object = 1,
    /// A chunk of a large object's payload; referenced by an `Object` record.
    Extent = 2,
    /// A delete of (bucket, key).
    Tombstone = 3,
    /// A bucket exists (stored on the bucket-owner shard only).
    Bucket = 4,
    /// A bucket was deleted.
    BucketDelete = 5,
    /// The segment ends here; everything before it was made durable.
    Seal = 6,
    /// First record of every segment: which shard and segment this file is.
    SegmentHeader = 7,
    /// A delete marker: a version of (bucket, key) that reads as deleted
    /// but, unlike a tombstone, is kept (S3 versioning, `store::versions`).
    DeleteMarker = 8,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Object,
            2 => Kind::Extent,
            3 => Kind::Tombstone,
            4 => Kind::Bucket,
            5 => Kind::BucketDelete,
            6 => Kind::Seal,
            7 => Kind::SegmentHeader,
            8 => Kind::DeleteMarker,
            _ => return None,
        })
    }
}

/// Where a large object's chunk lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentRef {
    pub segment_id: u64,
    /// Offset of the `Extent` record (not of its payload) in the segment.
    pub record_offset: u64,
    pub header_bytes: u32,
    pub payload_bytes: u64,
}

/// Object metadata as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectMeta {
    pub size_bytes: u64,
    /// Without quotes: 32 hex digits, or "<hex>-<parts>" for multipart.
    pub etag: String,
    pub mtime_ms: u64,
    pub content_type: String,
    /// Stored response headers (Content-Encoding, Cache-Control, ...) and
    /// `x-amz-meta-*`, names lower-case.
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Object {
        meta: ObjectMeta,
        extents: Vec<ExtentRef>,
    },
    Extent {
        object_offset: u64,
    },
    Tombstone {
        mtime_ms: u64,
    },
    DeleteMarker {
        mtime_ms: u64,
    },
    Bucket {
        created_ms: u64,
    },
    BucketDelete {
        mtime_ms: u64,
    },
    Seal,
    SegmentHeader {
        shard_id: u32,
        segment_id: u64,
        created_ms: u64,
        /// Version 2 only (0 in version 1): see the module doc.
        shard_secret: u64,
    },
}

/// What a segment's headers are checked against: its version and, from
/// version 2, the shard secret and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegKey {
    pub version: u8,
    pub shard_secret: u64,
    pub segment_id: u64,
}

impl SegKey {
    pub fn v2(shard_secret: u64, segment_id: u64) -> SegKey {
        SegKey {
            version: VERSION,
            shard_secret,
            segment_id,
        }
    }

    pub fn v1(segment_id: u64) -> SegKey {
        SegKey {
            version: VERSION_1,
            shard_secret: 0,
            segment_id,
        }
    }
}

impl Body {
    pub fn kind(&self) -> Kind {
        match self {
            Body::Object { .. } => Kind::Object,
            Body::Extent { .. } => Kind::Extent,
            Body::Tombstone { .. } => Kind::Tombstone,
            Body::DeleteMarker { .. } => Kind::DeleteMarker,
            Body::Bucket { .. } => Kind::Bucket,
            Body::BucketDelete { .. } => Kind::BucketDelete,
            Body::Seal => Kind::Seal,
            Body::SegmentHeader { .. } => Kind::SegmentHeader,
        }
    }
}

/// A decoded record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub seq: u64,
    pub bucket: String,
    pub key: String,
    pub payload_bytes: u64,
    pub block_crcs: Vec<u32>,
    pub body: Body,
}

impl Header {
    pub fn kind(&self) -> Kind {
        self.body.kind()
    }

    /// Its payload's CRC block size (`block_bytes()`).
    pub fn block_bytes(&self) -> u64 {
        block_bytes(self.payload_bytes, self.block_crcs.len())
    }

    /// A record of the segment itself (SegmentHeader, Seal): no key, no
    /// payload, seq 0.
    pub fn segment_record(body: Body) -> Header {
        Header {
            seq: 0,
            bucket: String::new(),
            key: String::new(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body,
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Zero bytes where a magic was expected: padding up to the next 4 KiB.
    #[error("padding")]
    Padding,
    #[error("bad magic {0:#x}")]
    BadMagic(u32),
    #[error("unsupported record version {0}")]
    BadVersion(u8),
    #[error("need {0} bytes to decode")]
    Short(usize),
    #[error("header CRC mismatch")]
    HeaderCrc,
    #[error("malformed header: {0}")]
    Malformed(&'static str),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum EncodeError {
    #[error("header too large ({0} bytes)")]
    HeaderTooLarge(usize),
    #[error("field too long: {0}")]
    FieldTooLong(&'static str),
}

/// Number of `BLOCK_BYTES` blocks covering `payload_bytes`.
pub fn block_count(payload_bytes: u64) -> u64 {
    payload_bytes.div_ceil(BLOCK_BYTES)
}

/// The block size of a record with `payload_bytes` and `crc_count` block
/// CRCs: 4 KiB when the count is that of 4 KiB blocks, else 64 KiB (a
/// record of data format 2). The two counts differ for every payload over
/// 4 KiB; at or under it, one block (or none) covers the payload either
/// way, so the choice changes nothing. `parse_header` accepts only these
/// two counts.
pub fn block_bytes(payload_bytes: u64, crc_count: usize) -> u64 {
    if crc_count as u64 == payload_bytes.div_ceil(BLOCK_BYTES) {
        BLOCK_BYTES
    } else {
        LEGACY_BLOCK_BYTES
    }
}

/// The CRCs of `payload`'s `BLOCK_BYTES` blocks, as a record written now
/// stores them.
pub fn block_crcs(payload: &[u8]) -> Vec<u32> {
    payload
        .chunks(BLOCK_BYTES as usize)
        .map(crc32c::crc32c)
        .collect()
}

/// Total on-disk bytes of a record including alignment padding.
pub fn record_span_bytes(header_bytes: u64, payload_bytes: u64) -> u64 {
    (header_bytes + payload_bytes).next_multiple_of(RECORD_ALIGN_BYTES)
}

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn str16(&mut self, s: &str, what: &'static str) -> Result<(), EncodeError> {
        let len = u16::try_from(s.len()).map_err(|_| EncodeError::FieldTooLong(what))?;
        self.u16(len);
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Encodes a header. `block_crcs` must be `block_crcs(payload)` of the payload
/// that will follow it.
pub fn encode_header(h: &Header) -> Result<Vec<u8>, EncodeError> {
    debug_assert!(
        h.block_crcs.len() as u64 == block_count(h.payload_bytes)
            || h.block_crcs.len() as u64 == h.payload_bytes.div_ceil(LEGACY_BLOCK_BYTES)
    );
    if h.bucket.len() > BUCKET_BYTES_MAX {
        return Err(EncodeError::FieldTooLong("bucket"));
    }
    if h.key.len() > KEY_BYTES_MAX {
        return Err(EncodeError::FieldTooLong("key"));
    }
    let mut w = Writer {
        buf: Vec::with_capacity(128 + h.key.len() + 4 * h.block_crcs.len()),
    };
    w.u32(MAGIC);
    w.u8(VERSION);
    w.u8(h.kind() as u8);
    w.u16(0);
    w.u32(0); // header_bytes, patched below
    w.u32(0); // header_crc, patched below
    w.u64(h.payload_bytes);
    w.u64(h.seq);
    debug_assert_eq!(w.buf.len(), FIXED_HEADER_BYTES);
    w.str16(&h.bucket, "bucket")?;
    w.str16(&h.key, "key")?;
    w.u32(h.block_crcs.len() as u32);
    for crc in &h.block_crcs {
        w.u32(*crc);
    }
    encode_body(&mut w, &h.body)?;
    let header_bytes = w.buf.len();
    if header_bytes > HEADER_BYTES_MAX {
        return Err(EncodeError::HeaderTooLarge(header_bytes));
    }
    w.buf[8..12].copy_from_slice(&(header_bytes as u32).to_le_bytes());
    // Not yet valid anywhere: `bind_header` sets the CRC for the place the
    // header is written to.
    Ok(w.buf)
}

/// Encodes a header and binds it to `offset` of the segment `key`.
pub fn encode_header_at(h: &Header, key: &SegKey, offset: u64) -> Result<Vec<u8>, EncodeError> {
    let mut buf = encode_header(h)?;
    bind_header(&mut buf, key, offset);
    Ok(buf)
}

/// The header check of `raw` (a whole header) at `offset` of segment `key`:
/// version 1, CRC32C of the header with the check field zeroed; version 2,
/// SipHash-2-4 keyed with the shard secret and the segment id over the
/// offset and that header, truncated to 32 bits. A keyed hash, not a CRC:
/// a CRC is affine, so one real header and its check would give away what
/// the secret adds; SipHash gives nothing away and still detects damage.
fn header_crc(raw: &[u8], key: &SegKey, offset: u64) -> u32 {
    if key.version == VERSION_1 {
        let mut crc = crc32c::crc32c(&raw[..12]);
        crc = crc32c::crc32c_append(crc, &[0; 4]);
        return crc32c::crc32c_append(crc, &raw[16..]);
    }
    use std::hash::Hasher;
    #[allow(deprecated)] // std's SipHash-2-4: deprecated as a HashMap hasher, sound as a keyed PRF
    let mut h = std::hash::SipHasher::new_with_keys(key.shard_secret, key.segment_id);
    h.write(&offset.to_le_bytes());
    h.write(&raw[..12]);
    h.write(&[0; 4]);
    h.write(&raw[16..]);
    let v = h.finish();
    (v ^ (v >> 32)) as u32
}

/// Makes an encoded header valid at `offset` of segment `key` (and nowhere
/// else): sets its version to the segment's and its CRC for that place.
/// A version-1 segment only ever gets a Seal this way.
pub fn bind_header(buf: &mut [u8], key: &SegKey, offset: u64) {
    debug_assert!(buf.len() >= FIXED_HEADER_BYTES);
    buf[4] = key.version;
    let crc = header_crc(buf, key, offset);
    buf[12..16].copy_from_slice(&crc.to_le_bytes());
}

fn encode_body(w: &mut Writer, body: &Body) -> Result<(), EncodeError> {
    match body {
        Body::Object { meta, extents } => {
            w.u64(meta.size_bytes);
            w.u64(meta.mtime_ms);
            w.str16(&meta.etag, "etag")?;
            w.str16(&meta.content_type, "content-type")?;
            if meta.headers.len() > HEADERS_COUNT_MAX {
                return Err(EncodeError::FieldTooLong("headers"));
            }
            w.u16(meta.headers.len() as u16);
            for (name, value) in &meta.headers {
                w.str16(name, "header name")?;
                w.str16(value, "header value")?;
            }
            w.u32(extents.len() as u32);
            for e in extents {
                w.u64(e.segment_id);
                w.u64(e.record_offset);
                w.u32(e.header_bytes);
                w.u64(e.payload_bytes);
            }
        }
        Body::Extent { object_offset } => w.u64(*object_offset),
        Body::Tombstone { mtime_ms }
        | Body::DeleteMarker { mtime_ms }
        | Body::BucketDelete { mtime_ms } => w.u64(*mtime_ms),
        Body::Bucket { created_ms } => w.u64(*created_ms),
        Body::Seal => {}
        Body::SegmentHeader {
            shard_id,
            segment_id,
            created_ms,
            shard_secret,
        } => {
            w.u32(*shard_id);
            w.u64(*segment_id);
            w.u64(*created_ms);
            w.u64(*shard_secret);
        }
    }
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(DecodeError::Malformed("length overflow"))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::Malformed("field past header end"))?;
        self.pos = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn str16(&mut self) -> Result<String, DecodeError> {
        let len = self.u16()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Malformed("string not UTF-8"))
    }
}

/// Reads the fixed header's length field, checking magic and version; `buf`
/// must hold at least `FIXED_HEADER_BYTES`.
pub fn peek_header_bytes(buf: &[u8]) -> Result<usize, DecodeError> {
    if buf.len() < FIXED_HEADER_BYTES {
        return Err(DecodeError::Short(FIXED_HEADER_BYTES));
    }
    let magic = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    if magic != MAGIC {
        return Err(if magic == 0 {
            DecodeError::Padding
        } else {
            DecodeError::BadMagic(magic)
        });
    }
    if buf[4] != VERSION && buf[4] != VERSION_1 {
        return Err(DecodeError::BadVersion(buf[4]));
    }
    let header_bytes = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
    if !(FIXED_HEADER_BYTES..=HEADER_BYTES_MAX).contains(&header_bytes) {
        return Err(DecodeError::Malformed("header length out of range"));
    }
    Ok(header_bytes)
}

/// Decodes and verifies the header at the start of `buf`, which was read
/// from `offset` of segment `key`. Returns the header and its length in
/// bytes; `Short(n)` asks for at least `n` bytes. A header of another
/// version than its segment's, or bound to another place, fails.
pub fn decode_header(
    buf: &[u8],
    key: &SegKey,
    offset: u64,
) -> Result<(Header, usize), DecodeError> {
    let header_bytes = peek_header_bytes(buf)?;
    if buf.len() < header_bytes {
        return Err(DecodeError::Short(header_bytes));
    }
    let raw = &buf[..header_bytes];
    if raw[4] != key.version {
        return Err(DecodeError::BadVersion(raw[4]));
    }
    let crc_stored = u32::from_le_bytes(raw[12..16].try_into().unwrap());
    if header_crc(raw, key, offset) != crc_stored {
        return Err(DecodeError::HeaderCrc);
    }
    parse_header(raw)
}

/// Decodes the segment header at offset 0 of segment `segment_id`, whose
/// CRC is bound with the shard secret it carries itself (only offset 0 is
/// ever read this way, and no user byte is written there). Returns the
/// header and the key for the rest of the segment.
pub fn decode_segment_header(
    buf: &[u8],
    segment_id: u64,
) -> Result<(Header, usize, SegKey), DecodeError> {
    let header_bytes = peek_header_bytes(buf)?;
    if buf.len() < header_bytes {
        return Err(DecodeError::Short(header_bytes));
    }
    let raw = &buf[..header_bytes];
    let key = if raw[4] == VERSION_1 {
        SegKey::v1(segment_id)
    } else {
        let (h, _) = parse_header(raw)?;
        match h.body {
            Body::SegmentHeader { shard_secret, .. } => SegKey::v2(shard_secret, segment_id),
            _ => return Err(DecodeError::Malformed("not a segment header")),
        }
    };
    let (h, n) = decode_header(buf, &key, 0)?;
    match h.body {
        // The caller checks the ids it carries (a file moved between shards).
        Body::SegmentHeader { .. } => Ok((h, n, key)),
        _ => Err(DecodeError::Malformed("not a segment header")),
    }
}

/// Parses a whole header without checking its CRC: for headers this
/// process encoded itself, or after the CRC was checked.
pub fn parse_header(raw: &[u8]) -> Result<(Header, usize), DecodeError> {
    let header_bytes = peek_header_bytes(raw)?;
    if raw.len() < header_bytes {
        return Err(DecodeError::Short(header_bytes));
    }
    let version = raw[4];
    let raw = &raw[..header_bytes];
    let kind = Kind::from_u8(raw[5]).ok_or(DecodeError::Malformed("unknown kind"))?;
    if raw[6..8] != [0, 0] {
        return Err(DecodeError::Malformed("reserved bytes are not zero"));
    }
    let payload_bytes = u64::from_le_bytes(raw[16..24].try_into().unwrap());
    let seq = u64::from_le_bytes(raw[24..32].try_into().unwrap());
    let mut r = Reader {
        buf: raw,
        pos: FIXED_HEADER_BYTES,
    };
    let bucket = r.str16()?;
    let key = r.str16()?;
    if bucket.len() > BUCKET_BYTES_MAX || key.len() > KEY_BYTES_MAX {
        return Err(DecodeError::Malformed("bucket or key too long"));
    }
    let blocks = r.u32()? as u64;
    if blocks != block_count(payload_bytes) && blocks != payload_bytes.div_ceil(LEGACY_BLOCK_BYTES)
    {
        return Err(DecodeError::Malformed("block count does not match payload"));
    }
    // Bound the allocation by what the header can hold: otherwise a crafted
    // header (valid CRC) could ask for a 16 GiB vector before failing.
    if blocks > ((header_bytes - r.pos) / 4) as u64 {
        return Err(DecodeError::Malformed("block CRCs past header end"));
    }
    let mut block_crcs = Vec::with_capacity(blocks as usize);
    for _ in 0..blocks {
        block_crcs.push(r.u32()?);
    }
    let body = decode_body(&mut r, kind, version)?;
    if r.pos != header_bytes {
        return Err(DecodeError::Malformed("trailing bytes in header"));
    }
    Ok((
        Header {
            seq,
            bucket,
            key,
            payload_bytes,
            block_crcs,
            body,
        },
        header_bytes,
    ))
}

fn decode_body(r: &mut Reader, kind: Kind, version: u8) -> Result<Body, DecodeError> {
    Ok(match kind {
        Kind::Object => {
            let size_bytes = r.u64()?;
            let mtime_ms = r.u64()?;
            let etag = r.str16()?;
            let content_type = r.str16()?;
            let count = r.u16()? as usize;
            if count > HEADERS_COUNT_MAX {
                return Err(DecodeError::Malformed("too many headers"));
            }
            let mut headers = Vec::with_capacity(count);
            for _ in 0..count {
                headers.push((r.str16()?, r.str16()?));
            }
            let extent_count = r.u32()? as usize;
            if extent_count > (r.buf.len() - r.pos) / 28 {
                return Err(DecodeError::Malformed("too many extents"));
            }
            let mut extents = Vec::with_capacity(extent_count);
            for _ in 0..extent_count {
                extents.push(ExtentRef {
                    segment_id: r.u64()?,
                    record_offset: r.u64()?,
                    header_bytes: r.u32()?,
                    payload_bytes: r.u64()?,
                });
            }
            let meta = ObjectMeta {
                size_bytes,
                etag,
                mtime_ms,
                content_type,
                headers,
            };
            Body::Object { meta, extents }
        }
        Kind::Extent => Body::Extent {
            object_offset: r.u64()?,
        },
        Kind::Tombstone => Body::Tombstone { mtime_ms: r.u64()? },
        Kind::DeleteMarker => Body::DeleteMarker { mtime_ms: r.u64()? },
        Kind::Bucket => Body::Bucket {
            created_ms: r.u64()?,
        },
        Kind::BucketDelete => Body::BucketDelete { mtime_ms: r.u64()? },
        Kind::Seal => Body::Seal,
        Kind::SegmentHeader => Body::SegmentHeader {
            shard_id: r.u32()?,
            segment_id: r.u64()?,
            created_ms: r.u64()?,
            shard_secret: if version == VERSION_1 { 0 } else { r.u64()? },
        },
    })
}

/// Verifies payload bytes `data`, which start at payload block `first_block`
/// of `block_bytes` (`block_bytes()`) and cover whole blocks (the last block
/// of the payload may be short).
pub fn verify_blocks(
    block_crcs: &[u32],
    block_bytes: u64,
    first_block: usize,
    data: &[u8],
) -> bool {
    debug_assert!(block_bytes == BLOCK_BYTES || block_bytes == LEGACY_BLOCK_BYTES);
    let mut index = first_block;
    for chunk in data.chunks(block_bytes as usize) {
        match block_crcs.get(index) {
            Some(expected) if *expected == crc32c::crc32c(chunk) => index += 1,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;
