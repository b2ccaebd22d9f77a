//! Get and BatchGet: many ranges of many objects per request. Per item an
//! ItemHead frame (its status, metadata and resolved ranges), then each
//! range as Chunk frames of at most `CHUNK_BYTES`, read into a registered
//! buffer where possible and sent from there (`datapath`); the final Reply
//! says whether everything was sent.

use std::rc::Rc;

use futures::channel::mpsc;
use futures::SinkExt;
use percore_protocol::native::{
    self as proto, BatchItem, ChunkHead, ItemHead, Kind, Range, Reply, Status,
};

use super::writer::{send_head, Out};
use super::{shard_error_reply, status_of, Budget, NativeFront, CHUNK_BYTES};
use crate::frontend::datapath::read_piece;
use crate::ring::DataRing;
use crate::shard::msg::ShardError;
use crate::shard::object::ObjectSource;

/// One Get request's output: where its frames go and what they draw on.
struct GetStream<'a> {
    tx: mpsc::Sender<Out>,
    id: u64,
    bucket: &'a str,
    budget: &'a Budget,
    ring: Option<Rc<DataRing>>,
}

/// The Reply when the writer is gone.
fn connection_closed() -> Reply {
    Reply::error(Status::Internal, "connection closed")
}

impl NativeFront {
    /// Get and BatchGet: per item an ItemHead, then its ranges as Chunk
    /// frames; the final Reply says whether everything was sent.
    pub(super) async fn get(
        &self,
        tx: mpsc::Sender<Out>,
        id: u64,
        bucket: &str,
        items: Vec<BatchItem>,
        budget: &Budget,
    ) -> Reply {
        if !self.shard.bucket_exists(bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        let mut out = GetStream {
            tx,
            id,
            bucket,
            budget,
            ring: self.shard.ring(),
        };
        for (index, item) in items.iter().enumerate() {
            if let Err(reply) = self.get_item(&mut out, index as u32, item).await {
                return reply;
            }
        }
        Reply::default()
    }

    /// One item: its ItemHead, then its ranges. Err: the request ends with
    /// this Reply (an item that cannot be opened or whose ranges are
    /// invalid is answered in its ItemHead, and the request goes on).
    async fn get_item(
        &self,
        out: &mut GetStream<'_>,
        index: u32,
        item: &BatchItem,
    ) -> Result<(), Reply> {
        let owner = self.shard.owner_of(out.bucket, &item.key) as u32;
        let mut head = ItemHead {
            item: index,
            owner_shard: owner,
            ..ItemHead::default()
        };
        let opened = ObjectSource::open(&self.shard, out.bucket, &item.key).await;
        let (mut source, meta) = match opened {
            Ok(x) => x,
            Err(e) => {
                let (s, m) = status_of(&e);
                head.status = s.0;
                head.message = m;
                return send_head(&mut out.tx, out.id, head)
                    .await
                    .map_err(|_| connection_closed());
            }
        };
        head.size = meta.size_bytes;
        head.etag = meta.etag.clone();
        head.mtime_ms = meta.mtime_ms;
        head.content_type = meta.content_type.clone();
        match resolve_ranges(&item.ranges, meta.size_bytes) {
            Ok(r) => head.ranges = r,
            Err(msg) => {
                head.status = Status::InvalidRange.0;
                head.message = msg;
                return send_head(&mut out.tx, out.id, head)
                    .await
                    .map_err(|_| connection_closed());
            }
        }
        let ranges = head.ranges.clone();
        if send_head(&mut out.tx, out.id, head).await.is_err() {
            return Err(connection_closed());
        }
        for (ri, r) in ranges.iter().enumerate() {
            self.send_range(out, &mut source, &item.key, index, ri as u32, r)
                .await?;
        }
        Ok(())
    }

    /// One resolved range of an item as Chunk frames, each drawing its
    /// bytes from the budgets until sent.
    async fn send_range(
        &self,
        out: &mut GetStream<'_>,
        source: &mut ObjectSource,
        key: &str,
        index: u32,
        range: u32,
        r: &Range,
    ) -> Result<(), Reply> {
        let (mut offset, end) = (r.offset, r.offset + r.length);
        while offset < end {
            let want = (end - offset).min(CHUNK_BYTES);
            let Some(held) = out.budget.take(want).await else {
                return Err(Reply::error(Status::ShuttingDown, "server shutting down"));
            };
            // The data path: DMA into a registered buffer, CRC there,
            // send from there. Falls back to the copy path when no
            // registered buffer is free or the key lives elsewhere.
            let piece = match read_piece(source, out.ring.as_deref(), offset, want).await {
                Ok(p) if !p.is_empty() => p,
                Ok(_) => {
                    return Err(Reply::error(
                        Status::Internal,
                        "object shorter than its metadata",
                    ))
                }
                Err(e) => return Err(self.mid_read_failure(out.bucket, key, e)),
            };
            let n = piece.len();
            debug_assert!(n as u64 <= want);
            let chunk = ChunkHead {
                item: index,
                range,
                offset,
                crc32c: proto::crc32c(&piece),
            };
            let frame = Out {
                head: proto::frame(Kind::Chunk, out.id, true, &proto::encode_chunk(&chunk), n),
                payload: Some(piece),
                held: Some(held),
            };
            if out.tx.send(frame).await.is_err() {
                return Err(connection_closed());
            }
            offset += n as u64;
            let m = self.shard.metrics();
            crate::metrics::ShardMetrics::add(&m.native_bytes_out, n as u64);
        }
        Ok(())
    }

    fn mid_read_failure(&self, bucket: &str, key: &str, e: ShardError) -> Reply {
        tracing::error!(
            shard = self.shard.id,
            bucket,
            key,
            "native read failed mid-object: {e:?}"
        );
        let (s, m) = status_of(&e);
        Reply::error(
            s,
            format!("reading {key} failed after part of it was sent: {m}"),
        )
    }
}

/// Clamps requested ranges to an object of `size` bytes (HTTP-like: a
/// range starting at or past the end is refused, one running past it is
/// cut). No ranges: the whole object.
pub fn resolve_ranges(ranges: &[Range], size: u64) -> Result<Vec<Range>, String> {
    if ranges.is_empty() {
        return Ok(vec![Range {
            offset: 0,
            length: size,
        }]);
    }
    ranges
        .iter()
        .map(|r| {
            if r.offset > size || (r.offset == size && size > 0) {
                return Err(format!(
                    "range at offset {} is past the end of an object of {size} bytes",
                    r.offset
                ));
            }
            let left = size - r.offset;
            let length = if r.length == 0 {
                left
            } else {
                r.length.min(left)
            };
            Ok(Range {
                offset: r.offset,
                length,
            })
        })
        .collect()
}
