//! Encoding owned messages into flatbuffers message headers.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::*;

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
            Request::ClusterMap => Kind::ClusterMap,
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
            Request::ClusterMap => {
                let o = fb::ClusterMap::create(&mut b, &fb::ClusterMapArgs {});
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
                    pg_count: h.pg_count,
                    cluster_epoch: h.cluster_epoch,
                    node_id: h.node_id,
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
            ServerMessage::Reply(r) => encode_reply(&mut b, r),
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

/// A Reply's message header, into `b`.
fn encode_reply(b: &mut flatbuffers::FlatBufferBuilder<'_>, r: &Reply) {
    let entries = (!r.entries.is_empty()).then(|| {
        let v: Vec<_> = r
            .entries
            .iter()
            .map(|e| {
                let args = fb::ListEntryArgs {
                    key: Some(b.create_string(&e.key)),
                    size: e.size,
                    etag: opt_str(b, &e.etag),
                    mtime_ms: e.mtime_ms,
                    is_prefix: e.is_prefix,
                };
                fb::ListEntry::create(b, &args)
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
                fb::BucketEntry::create(b, &args)
            })
            .collect();
        b.create_vector(&v)
    });
    let args = fb::ReplyArgs {
        status: Status(r.status),
        message: opt_str(b, &r.message),
        owner_shard: r.owner_shard,
        size: r.size,
        etag: opt_str(b, &r.etag),
        mtime_ms: r.mtime_ms,
        content_type: opt_str(b, &r.content_type),
        crc32c: r.crc32c,
        existed: r.existed,
        entries,
        truncated: r.truncated,
        next_start_after: opt_str(b, &r.next_start_after),
        map_epoch: r.map_epoch,
        cluster_map: opt_str(b, &r.cluster_map),
        buckets,
    };
    let o = fb::Reply::create(b, &args);
    b.finish_minimal(o);
}
