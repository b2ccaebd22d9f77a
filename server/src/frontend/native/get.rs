//! Get and BatchGet: many ranges of many objects per request. Per item an
//! ItemHead frame (its status, metadata and resolved ranges), then each
//! range as Chunk frames of at most `CHUNK_BYTES`, in order; the final
//! Reply says whether everything was sent.
//!
//! An item whose key this shard owns is read in windows of pieces
//! (`WINDOW_PIECES`, `WINDOW_BYTES`): the pieces of a window are read
//! together (`ObjectReader::read_many`: sorted by place, adjacent ones
//! merged, all in flight at once), so a Get of many small ranges keeps the
//! device busy. Large pieces land in registered buffers and are sent from
//! there (`datapath`).

use std::collections::VecDeque;
use std::rc::Rc;

use futures::channel::mpsc;
use futures::SinkExt;
use percore_protocol::native::{
    self as proto, BatchItem, ChunkHead, ItemHead, Kind, Range, Reply, Status,
};

use super::writer::{send_head, Out};
use super::CONNECTION_BYTES_MAX;
use super::{shard_error_reply, status_of, Budget, Held, NativeFront, CHUNK_BYTES};
use crate::frontend::datapath::{read_piece, Piece};
use crate::ring::DataRing;
use crate::shard::msg::ShardError;
use crate::shard::object::{Chunk, ObjectSource};
use crate::shard::store_error;
use crate::store::{ObjectReader, FIXED_MIN_BYTES};

/// Pieces of one item read together: at most this many (by default; see
/// `window_pieces`) ...
const WINDOW_PIECES: usize = 32;
/// ... and at most this many bytes: one chunk. Pieces of a chunk each (a
/// large range, a stream) go one at a time, as reading them four at once
/// measured 0.86-0.93x as fast on loopback (`bench/ranges.sh`): the writer's
/// queue already lets the reader run ahead of the socket by the
/// connection's byte budget (8 MiB).
const WINDOW_BYTES: u64 = CHUNK_BYTES;
const _: () = assert!(WINDOW_BYTES <= CONNECTION_BYTES_MAX / 2);
// A window's first piece waits for its budget; the others join only if
// their budget is free now (`Budget::try_take`), so a window never waits
// for bytes that only its own unsent pieces hold.
const _: () = assert!(CHUNK_BYTES <= WINDOW_BYTES);

/// `WINDOW_PIECES`, unless `PERCORE_GET_WINDOW_PIECES` (1 to 256, read once)
/// says otherwise: 1 reads and sends one piece at a time, as native Gets
/// did before windows (for benchmarks that compare, `bench/ranges.sh`).
fn window_pieces() -> usize {
    static PIECES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PIECES.get_or_init(|| {
        std::env::var("PERCORE_GET_WINDOW_PIECES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(WINDOW_PIECES, |n| n.clamp(1, 256))
    })
}

/// A piece of an item: (range index, object offset, length).
type PieceAt = (u32, u64, u64);

/// Walks an item's ranges as pieces of at most `CHUNK_BYTES`, cut where
/// the object's parts end (so that `read_many` never shortens one).
struct Pieces<'a> {
    ranges: &'a [Range],
    range: usize,
    at: Option<u64>,
}

impl Pieces<'_> {
    fn next(&mut self, reader: &ObjectReader) -> Option<PieceAt> {
        while let Some(r) = self.ranges.get(self.range) {
            let at = *self.at.get_or_insert(r.offset);
            let end = r.offset + r.length;
            if at < end {
                let mut len = (end - at).min(CHUNK_BYTES);
                let cut = reader.part_end(at);
                if cut > at {
                    len = len.min(cut - at);
                }
                self.at = Some(at + len);
                return Some((self.range as u32, at, len));
            }
            self.range += 1;
            self.at = None;
        }
        None
    }
}

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
        if let ObjectSource::Local(reader) = &mut source {
            return self
                .send_windows(out, reader, &item.key, index, &ranges)
                .await;
        }
        for (ri, r) in ranges.iter().enumerate() {
            self.send_range(out, &mut source, &item.key, index, ri as u32, r)
                .await?;
        }
        Ok(())
    }

    /// An item this shard owns: its ranges' pieces in windows, each window
    /// read at once (`read_many`) and sent in order.
    async fn send_windows(
        &self,
        out: &mut GetStream<'_>,
        reader: &mut ObjectReader,
        key: &str,
        index: u32,
        ranges: &[Range],
    ) -> Result<(), Reply> {
        let mut pieces = Pieces {
            ranges,
            range: 0,
            at: None,
        };
        // Pieces taken from `pieces` and not yet sent, in order.
        let mut pending: VecDeque<PieceAt> = VecDeque::new();
        let pieces_max = window_pieces();
        let mut window: Vec<PieceAt> = Vec::with_capacity(pieces_max);
        let mut held: Vec<Held> = Vec::with_capacity(pieces_max);
        loop {
            let mut bytes = 0;
            while window.len() < pieces_max {
                let Some(p) = pending.pop_front().or_else(|| pieces.next(reader)) else {
                    break;
                };
                let h = if window.is_empty() {
                    let Some(h) = out.budget.take(p.2).await else {
                        return Err(Reply::error(Status::ShuttingDown, "server shutting down"));
                    };
                    Some(h)
                } else if bytes + p.2 <= WINDOW_BYTES {
                    out.budget.try_take(p.2)
                } else {
                    None
                };
                let Some(h) = h else {
                    pending.push_front(p);
                    break;
                };
                bytes += p.2;
                window.push(p);
                held.push(h);
            }
            if window.is_empty() {
                return Ok(());
            }
            if let [(ri, offset, len)] = window[..] {
                if len >= FIXED_MIN_BYTES {
                    // A large piece alone (a stream): the reader's own path,
                    // which keeps its part and the part's CRCs between pieces.
                    let h = held.pop().expect("one budget per piece");
                    window.clear();
                    let fixed = match out.ring.as_deref() {
                        Some(ring) => reader.read_fixed(ring, offset, len).await,
                        None => None,
                    };
                    let piece = match fixed {
                        Some(r) => r.map(|(buf, start, end)| Piece::Registered { buf, start, end }),
                        None => reader
                            .read(offset, len)
                            .await
                            .map(|p| Piece::Copied(Chunk::Local(p))),
                    };
                    let piece = piece
                        .map_err(|e| self.mid_read_failure(out.bucket, key, store_error(e)))?;
                    let n = piece.len() as u64;
                    self.send_piece(out, index, ri, offset, piece, h).await?;
                    if n < len {
                        pending.push_front((ri, offset + n, len - n));
                    }
                    continue;
                }
            }
            let wants: Vec<(u64, u64)> = window.iter().map(|&(_, o, l)| (o, l)).collect();
            let results = reader.read_many(out.ring.as_deref(), &wants).await;
            // A piece read short (not expected: pieces end where parts do)
            // is sent, and its rest and every later piece go again.
            let mut again: Vec<PieceAt> = Vec::new();
            for ((&(ri, offset, len), result), h) in window.iter().zip(results).zip(held.drain(..))
            {
                if !again.is_empty() {
                    again.push((ri, offset, len));
                    continue;
                }
                let piece: Piece = match result {
                    Ok(p) => p.into(),
                    Err(e) => return Err(self.mid_read_failure(out.bucket, key, store_error(e))),
                };
                let n = piece.len() as u64;
                self.send_piece(out, index, ri, offset, piece, h).await?;
                if n < len {
                    again.push((ri, offset + n, len - n));
                }
            }
            for p in again.into_iter().rev() {
                pending.push_front(p);
            }
            window.clear();
        }
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
            // The key lives on another shard: its bytes come by copy.
            let piece = match read_piece(source, out.ring.as_deref(), offset, want).await {
                Ok(p) => p,
                Err(e) => return Err(self.mid_read_failure(out.bucket, key, e)),
            };
            let n = piece.len();
            debug_assert!(n as u64 <= want);
            self.send_piece(out, index, range, offset, piece, held)
                .await?;
            offset += n as u64;
        }
        Ok(())
    }

    /// One Chunk frame: `piece` at `offset` of range `range` of item
    /// `index`, holding `held` of the budgets until sent. An empty piece
    /// inside the object is an error.
    async fn send_piece(
        &self,
        out: &mut GetStream<'_>,
        index: u32,
        range: u32,
        offset: u64,
        piece: Piece,
        held: Held,
    ) -> Result<(), Reply> {
        if piece.is_empty() {
            return Err(Reply::error(
                Status::Internal,
                "object shorter than its metadata",
            ));
        }
        let n = piece.len();
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
        let m = self.shard.metrics();
        crate::metrics::ShardMetrics::add(&m.native_bytes_out, n as u64);
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
