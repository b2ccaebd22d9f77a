//! The native binary range protocol: frames, messages, authentication.
//!
//! A frame is a fixed 24-byte little-endian header, a flatbuffers message
//! header (`schema/native.fbs`, verified before use), then raw payload bytes
//! that never pass through flatbuffers, so object bytes go to and from the
//! socket without a copy into an encoder. The byte-by-byte description is in
//! `docs/native.md`.
//!
//! ```text
//! offset size field
//!      0    4 magic        "PCN1"
//!      4    1 version      1
//!      5    1 kind         message kind (requests < 0x80 <= server frames)
//!      6    2 flags        bit 0 MORE: more frames of this request id follow
//!      8    8 request_id   chosen by the client; replies carry it back
//!     16    4 header_len   flatbuffers bytes that follow (<= HEADER_BYTES_MAX)
//!     20    4 payload_len  raw bytes after the header (<= PAYLOAD_BYTES_MAX)
//! ```
//!
//! This module is runtime-free: the server (glommio) and the client (tokio)
//! both encode and decode through it, so they cannot disagree.

use flatbuffers::{FlatBufferBuilder, Verifiable, VerifierOptions, WIPOffset};
use hmac::{Hmac, Mac};
use sha2::Sha256;

#[allow(clippy::all, unsafe_op_in_unsafe_fn, mismatched_lifetime_syntaxes)]
#[rustfmt::skip]
#[path = "native_generated.rs"]
mod native_generated;
pub use fb::Status;
pub use native_generated::percore::native::fb;

pub const MAGIC: [u8; 4] = *b"PCN1";
pub const VERSION: u8 = 1;
pub const FRAME_HEADER_BYTES: usize = 24;
/// Largest flatbuffers header in a frame (a BatchGet of many keys is the
/// largest header a client sends).
pub const HEADER_BYTES_MAX: u32 = 1 << 20;
/// Largest raw payload in one frame; larger objects stream over frames.
pub const PAYLOAD_BYTES_MAX: u32 = 4 << 20;
/// Requests in flight per connection; the server stops reading beyond.
pub const IN_FLIGHT_MAX: u32 = 64;
/// Ranges in one Get or one BatchGet item.
pub const RANGES_MAX: u32 = 1024;
/// Items in one BatchGet.
pub const BATCH_ITEMS_MAX: u32 = 1024;
/// Entries in one List reply.
pub const LIST_LIMIT_MAX: u32 = 10_000;
/// Longest key (same as S3).
pub const KEY_BYTES_MAX: usize = 1024;
pub const NONCE_BYTES: usize = 32;

/// Flag: more frames of this request id follow.
pub const FLAG_MORE: u16 = 1;
const FLAGS_KNOWN: u16 = FLAG_MORE;

/// Message kinds. Requests (client -> server) are below 0x80.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Get = 2,
    BatchGet = 3,
    Put = 4,
    PutData = 5,
    Delete = 6,
    Stat = 7,
    List = 8,
    CreateBucket = 9,
    ListBuckets = 10,
    Challenge = 0x80,
    HelloOk = 0x81,
    ItemHead = 0x82,
    Chunk = 0x83,
    Reply = 0x84,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Get,
            3 => Kind::BatchGet,
            4 => Kind::Put,
            5 => Kind::PutData,
            6 => Kind::Delete,
            7 => Kind::Stat,
            8 => Kind::List,
            9 => Kind::CreateBucket,
            10 => Kind::ListBuckets,
            0x80 => Kind::Challenge,
            0x81 => Kind::HelloOk,
            0x82 => Kind::ItemHead,
            0x83 => Kind::Chunk,
            0x84 => Kind::Reply,
            _ => return None,
        })
    }

    pub fn is_request(self) -> bool {
        (self as u8) < 0x80
    }

    /// Name for metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "Hello",
            Kind::Get => "Get",
            Kind::BatchGet => "BatchGet",
            Kind::Put => "Put",
            Kind::PutData => "PutData",
            Kind::Delete => "Delete",
            Kind::Stat => "Stat",
            Kind::List => "List",
            Kind::CreateBucket => "CreateBucket",
            Kind::ListBuckets => "ListBuckets",
            Kind::Challenge => "Challenge",
            Kind::HelloOk => "HelloOk",
            Kind::ItemHead => "ItemHead",
            Kind::Chunk => "Chunk",
            Kind::Reply => "Reply",
        }
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: Kind,
    pub flags: u16,
    pub request_id: u64,
    pub header_len: u32,
    pub payload_len: u32,
}

/// Why a frame header was refused. After one of these the stream cannot be
/// resynchronised: the receiver answers (if it can) and closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    BadMagic([u8; 4]),
    UnsupportedVersion(u8),
    /// A known frame layout but an unknown kind: the lengths are valid, so
    /// the receiver may skip the frame and carry on.
    UnknownKind {
        kind: u8,
        request_id: u64,
        header_len: u32,
        payload_len: u32,
    },
    UnknownFlags(u16),
    HeaderTooLarge(u32),
    PayloadTooLarge(u32),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadMagic(m) => {
                write!(f, "bad magic {m:02x?} (not a percore native connection?)")
            }
            FrameError::UnsupportedVersion(v) => write!(
                f,
                "unsupported frame version {v} (this side speaks {VERSION})"
            ),
            FrameError::UnknownKind { kind, .. } => write!(f, "unknown message kind {kind:#04x}"),
            FrameError::UnknownFlags(x) => write!(f, "unknown flags {x:#06x}"),
            FrameError::HeaderTooLarge(n) => {
                write!(f, "header of {n} bytes exceeds {HEADER_BYTES_MAX}")
            }
            FrameError::PayloadTooLarge(n) => {
                write!(f, "payload of {n} bytes exceeds {PAYLOAD_BYTES_MAX}")
            }
        }
    }
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut b = [0u8; FRAME_HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.header_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Decodes and bounds-checks a frame header.
    pub fn decode(b: &[u8; FRAME_HEADER_BYTES]) -> Result<FrameHeader, FrameError> {
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(FrameError::UnsupportedVersion(b[4]));
        }
        let flags = u16::from_le_bytes([b[6], b[7]]);
        let request_id = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        let header_len = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
        let payload_len = u32::from_le_bytes(b[20..24].try_into().expect("4 bytes"));
        if header_len > HEADER_BYTES_MAX {
            return Err(FrameError::HeaderTooLarge(header_len));
        }
        if payload_len > PAYLOAD_BYTES_MAX {
            return Err(FrameError::PayloadTooLarge(payload_len));
        }
        if flags & !FLAGS_KNOWN != 0 {
            return Err(FrameError::UnknownFlags(flags));
        }
        let Some(kind) = Kind::from_u8(b[5]) else {
            return Err(FrameError::UnknownKind {
                kind: b[5],
                request_id,
                header_len,
                payload_len,
            });
        };
        Ok(FrameHeader {
            kind,
            flags,
            request_id,
            header_len,
            payload_len,
        })
    }

    pub fn more(&self) -> bool {
        self.flags & FLAG_MORE != 0
    }
}

/// Frame header + message header bytes, ready to write before `payload_len`
/// payload bytes.
pub fn frame(
    kind: Kind,
    request_id: u64,
    more: bool,
    header: &[u8],
    payload_len: usize,
) -> Vec<u8> {
    assert!(
        header.len() <= HEADER_BYTES_MAX as usize,
        "header too large"
    );
    assert!(
        payload_len <= PAYLOAD_BYTES_MAX as usize,
        "payload too large"
    );
    let fh = FrameHeader {
        kind,
        flags: if more { FLAG_MORE } else { 0 },
        request_id,
        header_len: header.len() as u32,
        payload_len: payload_len as u32,
    };
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + header.len());
    out.extend_from_slice(&fh.encode());
    out.extend_from_slice(header);
    out
}

// ----------------------------------------------------------------------
// Owned messages
// ----------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Range {
    pub offset: u64,
    /// 0: to the end of the object.
    pub length: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub versions: Vec<u8>,
    pub server_nonce: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u8,
    pub access_key: String,
    pub client_nonce: Vec<u8>,
    pub mac: Vec<u8>,
    pub client_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HelloOk {
    pub version: u8,
    pub server_proof: Vec<u8>,
    pub shard_id: u32,
    pub shard_count: u32,
    pub hash_algorithm: String,
    pub hash_seed: u64,
    pub shard_ports: Vec<u16>,
    pub frame_payload_max: u32,
    pub in_flight_max: u32,
    pub ranges_max: u32,
    pub batch_items_max: u32,
    pub list_limit_max: u32,
    pub object_bytes_max: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    pub key: String,
    /// Empty: the whole object.
    pub ranges: Vec<Range>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRequest {
    pub bucket: String,
    pub prefix: String,
    pub start_after: String,
    pub delimiter: String,
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRequest {
    pub bucket: String,
    pub key: String,
    pub size: u64,
    pub content_type: String,
    /// CRC32C of the whole object, when known before sending.
    pub crc32c: Option<u32>,
}

/// A request's message header, owned (decoded from a verified flatbuffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Hello(Hello),
    /// A Get is a BatchGet of one item: same reply frames.
    Get {
        bucket: String,
        item: BatchItem,
    },
    BatchGet {
        bucket: String,
        items: Vec<BatchItem>,
    },
    Put(PutRequest),
    /// `crc32c`: on the last frame when the Put did not carry it.
    PutData {
        crc32c: Option<u32>,
    },
    Delete {
        bucket: String,
        key: String,
    },
    Stat {
        bucket: String,
        key: String,
    },
    List(ListRequest),
    CreateBucket {
        bucket: String,
    },
    ListBuckets,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ItemHead {
    pub item: u32,
    pub status: u16,
    pub message: String,
    pub owner_shard: u32,
    pub size: u64,
    pub etag: String,
    pub mtime_ms: u64,
    pub content_type: String,
    pub ranges: Vec<Range>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkHead {
    pub item: u32,
    pub range: u32,
    pub offset: u64,
    pub crc32c: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListEntry {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub mtime_ms: u64,
    pub is_prefix: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketEntry {
    pub name: String,
    pub created_ms: u64,
}

/// The last frame of every reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub message: String,
    pub owner_shard: i32,
    pub size: u64,
    pub etag: String,
    pub mtime_ms: u64,
    pub content_type: String,
    pub crc32c: u32,
    pub existed: bool,
    pub entries: Vec<ListEntry>,
    pub truncated: bool,
    pub next_start_after: String,
    pub buckets: Vec<BucketEntry>,
}

impl Default for Reply {
    fn default() -> Reply {
        Reply {
            status: Status::Ok.0,
            message: String::new(),
            owner_shard: -1,
            size: 0,
            etag: String::new(),
            mtime_ms: 0,
            content_type: String::new(),
            crc32c: 0,
            existed: false,
            entries: Vec::new(),
            truncated: false,
            next_start_after: String::new(),
            buckets: Vec::new(),
        }
    }
}

impl Reply {
    pub fn error(status: Status, message: impl Into<String>) -> Reply {
        Reply {
            status: status.0,
            message: message.into(),
            ..Reply::default()
        }
    }
}

/// A frame from the server, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMessage {
    Challenge(Challenge),
    HelloOk(HelloOk),
    ItemHead(ItemHead),
    Chunk(ChunkHead),
    Reply(Reply),
}

/// Why a message header was refused. The frame itself was well formed, so
/// the connection survives: the receiver answers with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn verifier_options() -> VerifierOptions {
    VerifierOptions {
        max_depth: 8,
        max_tables: 100_000,
        max_apparent_size: HEADER_BYTES_MAX as usize * 2,
        ignore_missing_null_terminator: false,
    }
}

fn root<'a, T: flatbuffers::Follow<'a, Inner = T> + Verifiable + 'a>(
    what: &str,
    bytes: &'a [u8],
) -> Result<T, DecodeError> {
    flatbuffers::root_with_opts::<T>(&verifier_options(), bytes)
        .map_err(|e| DecodeError(format!("{what}: flatbuffer verification failed: {e}")))
}

fn s(v: Option<&str>) -> String {
    v.unwrap_or_default().to_string()
}

fn bytes(v: Option<flatbuffers::Vector<'_, u8>>) -> Vec<u8> {
    v.map(|v| v.bytes().to_vec()).unwrap_or_default()
}

fn ranges(v: Option<flatbuffers::Vector<'_, fb::Range>>) -> Result<Vec<Range>, DecodeError> {
    let v = match v {
        Some(v) => v,
        None => return Ok(Vec::new()),
    };
    if v.len() > RANGES_MAX as usize {
        return Err(DecodeError(format!(
            "{} ranges exceed the limit of {RANGES_MAX}",
            v.len()
        )));
    }
    Ok(v.iter()
        .map(|r| Range {
            offset: r.offset(),
            length: r.length(),
        })
        .collect())
}

fn key_of(what: &str, v: Option<&str>) -> Result<String, DecodeError> {
    let k = v.ok_or_else(|| DecodeError(format!("{what}: key missing")))?;
    if k.is_empty() || k.len() > KEY_BYTES_MAX || k.contains('\0') {
        return Err(DecodeError(format!(
            "{what}: key must be 1..={KEY_BYTES_MAX} bytes of UTF-8 without NUL"
        )));
    }
    Ok(k.to_string())
}

fn bucket_of(what: &str, v: Option<&str>) -> Result<String, DecodeError> {
    match v {
        Some(b) if !b.is_empty() && b.len() <= 63 => Ok(b.to_string()),
        _ => Err(DecodeError(format!(
            "{what}: bucket missing or longer than 63 bytes"
        ))),
    }
}

/// Decodes a request's message header. `PutData` frames carry none.
pub fn decode_request(kind: Kind, header: &[u8]) -> Result<Request, DecodeError> {
    Ok(match kind {
        Kind::Hello => {
            let m = root::<fb::Hello>("Hello", header)?;
            Request::Hello(Hello {
                version: m.version(),
                access_key: s(m.access_key()),
                client_nonce: bytes(m.client_nonce()),
                mac: bytes(m.mac()),
                client_name: s(m.client_name()),
            })
        }
        Kind::Get => {
            let m = root::<fb::Get>("Get", header)?;
            Request::Get {
                bucket: bucket_of("Get", m.bucket())?,
                item: BatchItem {
                    key: key_of("Get", m.key())?,
                    ranges: ranges(m.ranges())?,
                },
            }
        }
        Kind::BatchGet => {
            let m = root::<fb::BatchGet>("BatchGet", header)?;
            let items = m.items().map(|v| v.len()).unwrap_or(0);
            if items == 0 || items > BATCH_ITEMS_MAX as usize {
                return Err(DecodeError(format!(
                    "BatchGet: {items} items; send 1..={BATCH_ITEMS_MAX}"
                )));
            }
            let mut out = Vec::with_capacity(items);
            for it in m.items().into_iter().flatten() {
                out.push(BatchItem {
                    key: key_of("BatchGet", it.key())?,
                    ranges: ranges(it.ranges())?,
                });
            }
            Request::BatchGet {
                bucket: bucket_of("BatchGet", m.bucket())?,
                items: out,
            }
        }
        Kind::Put => {
            let m = root::<fb::Put>("Put", header)?;
            Request::Put(PutRequest {
                bucket: bucket_of("Put", m.bucket())?,
                key: key_of("Put", m.key())?,
                size: m.size(),
                content_type: s(m.content_type()),
                crc32c: m.crc32c(),
            })
        }
        Kind::PutData => {
            if header.is_empty() {
                Request::PutData { crc32c: None }
            } else {
                let m = root::<fb::PutData>("PutData", header)?;
                Request::PutData { crc32c: m.crc32c() }
            }
        }
        Kind::Delete => {
            let m = root::<fb::Delete>("Delete", header)?;
            Request::Delete {
                bucket: bucket_of("Delete", m.bucket())?,
                key: key_of("Delete", m.key())?,
            }
        }
        Kind::Stat => {
            let m = root::<fb::Stat>("Stat", header)?;
            Request::Stat {
                bucket: bucket_of("Stat", m.bucket())?,
                key: key_of("Stat", m.key())?,
            }
        }
        Kind::List => {
            let m = root::<fb::List>("List", header)?;
            Request::List(ListRequest {
                bucket: bucket_of("List", m.bucket())?,
                prefix: s(m.prefix()),
                start_after: s(m.start_after()),
                delimiter: s(m.delimiter()),
                limit: m.limit(),
            })
        }
        Kind::CreateBucket => {
            let m = root::<fb::CreateBucket>("CreateBucket", header)?;
            Request::CreateBucket {
                bucket: s(m.bucket()),
            }
        }
        Kind::ListBuckets => {
            root::<fb::ListBuckets>("ListBuckets", header)?;
            Request::ListBuckets
        }
        other => return Err(DecodeError(format!("{} is not a request", other.name()))),
    })
}

/// Decodes a server frame's message header.
pub fn decode_server(kind: Kind, header: &[u8]) -> Result<ServerMessage, DecodeError> {
    Ok(match kind {
        Kind::Challenge => {
            let m = root::<fb::Challenge>("Challenge", header)?;
            ServerMessage::Challenge(Challenge {
                versions: bytes(m.versions()),
                server_nonce: bytes(m.server_nonce()),
            })
        }
        Kind::HelloOk => {
            let m = root::<fb::HelloOk>("HelloOk", header)?;
            ServerMessage::HelloOk(HelloOk {
                version: m.version(),
                server_proof: bytes(m.server_proof()),
                shard_id: m.shard_id(),
                shard_count: m.shard_count(),
                hash_algorithm: s(m.hash_algorithm()),
                hash_seed: m.hash_seed(),
                shard_ports: m
                    .shard_ports()
                    .map(|v| v.iter().collect())
                    .unwrap_or_default(),
                frame_payload_max: m.frame_payload_max(),
                in_flight_max: m.in_flight_max(),
                ranges_max: m.ranges_max(),
                batch_items_max: m.batch_items_max(),
                list_limit_max: m.list_limit_max(),
                object_bytes_max: m.object_bytes_max(),
            })
        }
        Kind::ItemHead => {
            let m = root::<fb::ItemHead>("ItemHead", header)?;
            ServerMessage::ItemHead(ItemHead {
                item: m.item(),
                status: m.status().0,
                message: s(m.message()),
                owner_shard: m.owner_shard(),
                size: m.size(),
                etag: s(m.etag()),
                mtime_ms: m.mtime_ms(),
                content_type: s(m.content_type()),
                ranges: ranges(m.ranges())?,
            })
        }
        Kind::Chunk => {
            let m = root::<fb::Chunk>("Chunk", header)?;
            ServerMessage::Chunk(ChunkHead {
                item: m.item(),
                range: m.range(),
                offset: m.offset(),
                crc32c: m.crc32c(),
            })
        }
        Kind::Reply => {
            let m = root::<fb::Reply>("Reply", header)?;
            ServerMessage::Reply(Reply {
                status: m.status().0,
                message: s(m.message()),
                owner_shard: m.owner_shard(),
                size: m.size(),
                etag: s(m.etag()),
                mtime_ms: m.mtime_ms(),
                content_type: s(m.content_type()),
                crc32c: m.crc32c(),
                existed: m.existed(),
                entries: m
                    .entries()
                    .map(|v| {
                        v.iter()
                            .map(|e| ListEntry {
                                key: s(e.key()),
                                size: e.size(),
                                etag: s(e.etag()),
                                mtime_ms: e.mtime_ms(),
                                is_prefix: e.is_prefix(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                truncated: m.truncated(),
                next_start_after: s(m.next_start_after()),
                buckets: m
                    .buckets()
                    .map(|v| {
                        v.iter()
                            .map(|b| BucketEntry {
                                name: s(b.name()),
                                created_ms: b.created_ms(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        other => {
            return Err(DecodeError(format!(
                "{} is not a server frame",
                other.name()
            )))
        }
    })
}

// ----------------------------------------------------------------------
// Encoding
// ----------------------------------------------------------------------

fn fb_ranges<'a>(
    b: &mut FlatBufferBuilder<'a>,
    r: &[Range],
) -> WIPOffset<flatbuffers::Vector<'a, fb::Range>> {
    let v: Vec<fb::Range> = r
        .iter()
        .map(|r| fb::Range::new(r.offset, r.length))
        .collect();
    b.create_vector(&v)
}

fn opt_str<'a>(b: &mut FlatBufferBuilder<'a>, v: &str) -> Option<WIPOffset<&'a str>> {
    (!v.is_empty()).then(|| b.create_string(v))
}

impl Request {
    pub fn kind(&self) -> Kind {
        match self {
            Request::Hello(_) => Kind::Hello,
            Request::Get { .. } => Kind::Get,
            Request::BatchGet { .. } => Kind::BatchGet,
            Request::Put(_) => Kind::Put,
            Request::PutData { .. } => Kind::PutData,
            Request::Delete { .. } => Kind::Delete,
            Request::Stat { .. } => Kind::Stat,
            Request::List(_) => Kind::List,
            Request::CreateBucket { .. } => Kind::CreateBucket,
            Request::ListBuckets => Kind::ListBuckets,
        }
    }

    /// The message header bytes (empty for a PutData without CRC).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = FlatBufferBuilder::with_capacity(256);
        match self {
            Request::Hello(h) => {
                let args = fb::HelloArgs {
                    version: h.version,
                    access_key: Some(b.create_string(&h.access_key)),
                    client_nonce: Some(b.create_vector(&h.client_nonce)),
                    mac: Some(b.create_vector(&h.mac)),
                    client_name: opt_str(&mut b, &h.client_name),
                };
                let o = fb::Hello::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::Get { bucket, item } => {
                let args = fb::GetArgs {
                    bucket: Some(b.create_string(bucket)),
                    key: Some(b.create_string(&item.key)),
                    ranges: (!item.ranges.is_empty()).then(|| fb_ranges(&mut b, &item.ranges)),
                };
                let o = fb::Get::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::BatchGet { bucket, items } => {
                let items: Vec<_> = items
                    .iter()
                    .map(|it| {
                        let args = fb::BatchItemArgs {
                            key: Some(b.create_string(&it.key)),
                            ranges: (!it.ranges.is_empty()).then(|| fb_ranges(&mut b, &it.ranges)),
                        };
                        fb::BatchItem::create(&mut b, &args)
                    })
                    .collect();
                let args = fb::BatchGetArgs {
                    bucket: Some(b.create_string(bucket)),
                    items: Some(b.create_vector(&items)),
                };
                let o = fb::BatchGet::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::Put(p) => {
                let args = fb::PutArgs {
                    bucket: Some(b.create_string(&p.bucket)),
                    key: Some(b.create_string(&p.key)),
                    size: p.size,
                    content_type: opt_str(&mut b, &p.content_type),
                    crc32c: p.crc32c,
                };
                let o = fb::Put::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::PutData { crc32c: None } => return Vec::new(),
            Request::PutData { crc32c } => {
                let o = fb::PutData::create(&mut b, &fb::PutDataArgs { crc32c: *crc32c });
                b.finish_minimal(o);
            }
            Request::Delete { bucket, key } => {
                let args = fb::DeleteArgs {
                    bucket: Some(b.create_string(bucket)),
                    key: Some(b.create_string(key)),
                };
                let o = fb::Delete::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::Stat { bucket, key } => {
                let args = fb::StatArgs {
                    bucket: Some(b.create_string(bucket)),
                    key: Some(b.create_string(key)),
                };
                let o = fb::Stat::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::List(l) => {
                let args = fb::ListArgs {
                    bucket: Some(b.create_string(&l.bucket)),
                    prefix: opt_str(&mut b, &l.prefix),
                    start_after: opt_str(&mut b, &l.start_after),
                    delimiter: opt_str(&mut b, &l.delimiter),
                    limit: l.limit,
                };
                let o = fb::List::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::CreateBucket { bucket } => {
                let args = fb::CreateBucketArgs {
                    bucket: Some(b.create_string(bucket)),
                };
                let o = fb::CreateBucket::create(&mut b, &args);
                b.finish_minimal(o);
            }
            Request::ListBuckets => {
                let o = fb::ListBuckets::create(&mut b, &fb::ListBucketsArgs {});
                b.finish_minimal(o);
            }
        }
        b.finished_data().to_vec()
    }
}

impl ServerMessage {
    pub fn kind(&self) -> Kind {
        match self {
            ServerMessage::Challenge(_) => Kind::Challenge,
            ServerMessage::HelloOk(_) => Kind::HelloOk,
            ServerMessage::ItemHead(_) => Kind::ItemHead,
            ServerMessage::Chunk(_) => Kind::Chunk,
            ServerMessage::Reply(_) => Kind::Reply,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = FlatBufferBuilder::with_capacity(256);
        match self {
            ServerMessage::Challenge(c) => {
                let args = fb::ChallengeArgs {
                    versions: Some(b.create_vector(&c.versions)),
                    server_nonce: Some(b.create_vector(&c.server_nonce)),
                };
                let o = fb::Challenge::create(&mut b, &args);
                b.finish_minimal(o);
            }
            ServerMessage::HelloOk(h) => {
                let args = fb::HelloOkArgs {
                    version: h.version,
                    server_proof: Some(b.create_vector(&h.server_proof)),
                    shard_id: h.shard_id,
                    shard_count: h.shard_count,
                    hash_algorithm: Some(b.create_string(&h.hash_algorithm)),
                    hash_seed: h.hash_seed,
                    shard_ports: Some(b.create_vector(&h.shard_ports)),
                    frame_payload_max: h.frame_payload_max,
                    in_flight_max: h.in_flight_max,
                    ranges_max: h.ranges_max,
                    batch_items_max: h.batch_items_max,
                    list_limit_max: h.list_limit_max,
                    object_bytes_max: h.object_bytes_max,
                };
                let o = fb::HelloOk::create(&mut b, &args);
                b.finish_minimal(o);
            }
            ServerMessage::ItemHead(h) => {
                let args = fb::ItemHeadArgs {
                    item: h.item,
                    status: Status(h.status),
                    message: opt_str(&mut b, &h.message),
                    owner_shard: h.owner_shard,
                    size: h.size,
                    etag: opt_str(&mut b, &h.etag),
                    mtime_ms: h.mtime_ms,
                    content_type: opt_str(&mut b, &h.content_type),
                    ranges: (!h.ranges.is_empty()).then(|| fb_ranges(&mut b, &h.ranges)),
                };
                let o = fb::ItemHead::create(&mut b, &args);
                b.finish_minimal(o);
            }
            ServerMessage::Chunk(c) => return encode_chunk(c),
            ServerMessage::Reply(r) => {
                let entries = (!r.entries.is_empty()).then(|| {
                    let v: Vec<_> = r
                        .entries
                        .iter()
                        .map(|e| {
                            let args = fb::ListEntryArgs {
                                key: Some(b.create_string(&e.key)),
                                size: e.size,
                                etag: opt_str(&mut b, &e.etag),
                                mtime_ms: e.mtime_ms,
                                is_prefix: e.is_prefix,
                            };
                            fb::ListEntry::create(&mut b, &args)
                        })
                        .collect();
                    b.create_vector(&v)
                });
                let buckets = (!r.buckets.is_empty()).then(|| {
                    let v: Vec<_> = r
                        .buckets
                        .iter()
                        .map(|e| {
                            let args = fb::BucketEntryArgs {
                                name: Some(b.create_string(&e.name)),
                                created_ms: e.created_ms,
                            };
                            fb::BucketEntry::create(&mut b, &args)
                        })
                        .collect();
                    b.create_vector(&v)
                });
                let args = fb::ReplyArgs {
                    status: Status(r.status),
                    message: opt_str(&mut b, &r.message),
                    owner_shard: r.owner_shard,
                    size: r.size,
                    etag: opt_str(&mut b, &r.etag),
                    mtime_ms: r.mtime_ms,
                    content_type: opt_str(&mut b, &r.content_type),
                    crc32c: r.crc32c,
                    existed: r.existed,
                    entries,
                    truncated: r.truncated,
                    next_start_after: opt_str(&mut b, &r.next_start_after),
                    buckets,
                };
                let o = fb::Reply::create(&mut b, &args);
                b.finish_minimal(o);
            }
        }
        b.finished_data().to_vec()
    }
}

/// The Chunk header is on the hot path of every read: built without
/// allocating a builder per call beyond one small buffer.
pub fn encode_chunk(c: &ChunkHead) -> Vec<u8> {
    let mut b = FlatBufferBuilder::with_capacity(64);
    let args = fb::ChunkArgs {
        item: c.item,
        range: c.range,
        offset: c.offset,
        crc32c: c.crc32c,
    };
    let o = fb::Chunk::create(&mut b, &args);
    b.finish_minimal(o);
    b.finished_data().to_vec()
}

/// A status's name, for messages.
pub fn status_name(status: u16) -> &'static str {
    Status(status).variant_name().unwrap_or("Unknown")
}

// ----------------------------------------------------------------------
// Authentication: an HMAC challenge with the S3 access keys
// ----------------------------------------------------------------------

type HmacSha256 = Hmac<Sha256>;

fn hmac(secret: &str, parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(secret.as_bytes()).expect("any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// What the client proves: it holds the secret of `access_key` and answers
/// this very challenge (the server nonce is fresh per connection).
pub fn client_mac(
    secret: &str,
    access_key: &str,
    server_nonce: &[u8],
    client_nonce: &[u8],
) -> [u8; 32] {
    hmac(
        secret,
        &[
            b"percore-native-v1\n",
            access_key.as_bytes(),
            b"\n",
            server_nonce,
            client_nonce,
        ],
    )
}

/// What the server proves back: it holds the same secret (mutual auth).
pub fn server_proof(secret: &str, server_nonce: &[u8], client_nonce: &[u8]) -> [u8; 32] {
    hmac(
        secret,
        &[b"percore-native-v1/server\n", client_nonce, server_nonce],
    )
}

/// Constant-time comparison of two MACs.
pub fn mac_equal(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// CRC32C (Castagnoli), the checksum of chunks and PUT bodies.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// The fuzz property (fuzz/fuzz_targets/native_frame.rs; replayed over the
/// committed corpus by a unit test): the decoders never panic on any bytes,
/// and whatever decodes re-encodes to something that decodes to the same.
#[doc(hidden)]
pub fn fuzz_decode(data: &[u8]) {
    if data.len() >= FRAME_HEADER_BYTES {
        let head: [u8; FRAME_HEADER_BYTES] =
            data[..FRAME_HEADER_BYTES].try_into().expect("24 bytes");
        if let Ok(fh) = FrameHeader::decode(&head) {
            assert_eq!(FrameHeader::decode(&fh.encode()), Ok(fh));
            assert!(fh.header_len <= HEADER_BYTES_MAX);
            assert!(fh.payload_len <= PAYLOAD_BYTES_MAX);
        }
    }
    let Some((&k, body)) = data.split_first() else {
        return;
    };
    let Some(kind) = Kind::from_u8(k) else { return };
    if kind.is_request() {
        if let Ok(req) = decode_request(kind, body) {
            assert_eq!(decode_request(req.kind(), &req.encode()), Ok(req));
        }
    } else if let Ok(msg) = decode_server(kind, body) {
        assert_eq!(decode_server(msg.kind(), &msg.encode()), Ok(msg));
    }
}

#[cfg(test)]
mod tests;
