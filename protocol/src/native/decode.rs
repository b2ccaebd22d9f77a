//! Decoding verified flatbuffers message headers into owned messages, with
//! every bound of the protocol checked (keys, buckets, ranges, items).

use flatbuffers::{Verifiable, VerifierOptions};

use super::*;

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
        Kind::ClusterMap => {
            root::<fb::ClusterMap>("ClusterMap", header)?;
            Request::ClusterMap
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
                pg_count: m.pg_count(),
                cluster_epoch: m.cluster_epoch(),
                node_id: m.node_id(),
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
        Kind::Reply => ServerMessage::Reply(decode_reply(header)?),
        other => {
            return Err(DecodeError(format!(
                "{} is not a server frame",
                other.name()
            )))
        }
    })
}

/// A Reply's message header.
fn decode_reply(header: &[u8]) -> Result<Reply, DecodeError> {
    let m = root::<fb::Reply>("Reply", header)?;
    Ok(Reply {
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
        map_epoch: m.map_epoch(),
        cluster_map: s(m.cluster_map()),
    })
}
