//! The owned messages of the native protocol: what a frame's flatbuffers
//! header decodes to, and what is encoded into one (`decode.rs`,
//! `encode.rs`).

use super::fb::Status;

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
    /// Cluster mode: placement groups (0: a single node).
    pub pg_count: u32,
    /// Cluster mode: the map epoch the node holds.
    pub cluster_epoch: u64,
    /// Cluster mode: the node's id (-1: not a cluster node).
    pub node_id: i32,
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
    /// Cluster mode: the node's map.
    ClusterMap,
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
    /// Cluster mode: the answering node's map epoch.
    pub map_epoch: u64,
    /// ClusterMap: the map as JSON.
    pub cluster_map: String,
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
            map_epoch: 0,
            cluster_map: String::new(),
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
