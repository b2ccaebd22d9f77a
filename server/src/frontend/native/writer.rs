//! The ordered frame writer of a native connection: one task per
//! connection takes whole frames from a bounded channel and sends them in
//! order. Small payloads are copied next to their headers and sent in
//! batches; larger ones go out from their own buffer, a registered one
//! through the shard's ring (`datapath::send_registered`).

use std::rc::Rc;

use futures::channel::mpsc;
use futures::io::WriteHalf;
use futures::{AsyncWriteExt, SinkExt, StreamExt};
use glommio::net::TcpStream;
use percore_protocol::native::{self as proto, ItemHead, Kind, Reply, ServerMessage};

use super::{Held, COALESCE_BYTES_MAX, IO_TIMEOUT, WRITE_BATCH_BYTES};
use crate::frontend::datapath::{self, Piece};
use crate::frontend::http::within;
use crate::ring::DataRing;

/// One whole frame for the writer.
pub(super) struct Out {
    pub(super) head: Vec<u8>,
    /// Object bytes after the head, if any.
    pub(super) payload: Option<Piece>,
    /// Budget for the payload, returned when the frame is dropped after
    /// its bytes were sent (or copied into the send batch).
    #[allow(dead_code)]
    pub(super) held: Option<Held>,
}

/// A frame carrying `msg` (and `payload`).
pub(super) fn out(
    kind: Kind,
    request_id: u64,
    more: bool,
    msg: &ServerMessage,
    payload: Option<Piece>,
) -> Out {
    let header = msg.encode();
    let payload_len = payload.as_ref().map_or(0, |p| p.len());
    Out {
        head: proto::frame(kind, request_id, more, &header, payload_len),
        payload,
        held: None,
    }
}

/// The final Reply frame of request `request_id`.
pub(super) fn reply_frame(request_id: u64, reply: Reply) -> Out {
    out(
        Kind::Reply,
        request_id,
        false,
        &ServerMessage::Reply(reply),
        None,
    )
}

/// Queues an ItemHead frame (more frames of the request follow).
pub(super) async fn send_head(
    tx: &mut mpsc::Sender<Out>,
    id: u64,
    head: ItemHead,
) -> Result<(), mpsc::SendError> {
    tx.send(out(
        Kind::ItemHead,
        id,
        true,
        &ServerMessage::ItemHead(head),
        None,
    ))
    .await
}

async fn write_within(wr: &mut WriteHalf<TcpStream>, bytes: &[u8]) -> bool {
    matches!(within(IO_TIMEOUT, wr.write_all(bytes)).await, Some(Ok(())))
}

/// Sends the batch and keeps its allocation.
async fn flush_batch(wr: &mut WriteHalf<TcpStream>, buf: &mut Vec<u8>) -> bool {
    let ok = write_within(wr, buf).await;
    buf.clear();
    ok
}

/// The writer's state: the socket, the batch being gathered, and the
/// socket's SEND_ZC verdict.
struct FrameWriter {
    wr: WriteHalf<TcpStream>,
    fd: i32,
    ring: Option<Rc<DataRing>>,
    buf: Vec<u8>,
    send_zc: bool,
}

impl FrameWriter {
    /// Adds `frame` to the batch, or sends the batch and then the frame's
    /// own payload. False: the connection failed (or a send timed out and
    /// the socket was shut down); stop. The frame (and the budget it holds)
    /// is the caller's to drop.
    async fn push(&mut self, frame: &mut Out) -> bool {
        self.buf.extend_from_slice(&frame.head);
        match frame.payload.take() {
            None => true,
            Some(p) if p.len() <= COALESCE_BYTES_MAX => {
                self.buf.extend_from_slice(&p);
                true
            }
            Some(Piece::Copied(c)) => {
                // The batch and the payload in one sendmsg; what the socket
                // does not take at once is written as usual.
                let sent = match datapath::send_pair_nonblocking(self.fd, &self.buf, &c) {
                    Ok(n) => n,
                    Err(_) => return false,
                };
                let head_sent = sent.min(self.buf.len());
                let ok = write_within(&mut self.wr, &self.buf[head_sent..]).await
                    && write_within(&mut self.wr, &c[sent - head_sent..]).await;
                self.buf.clear();
                ok
            }
            Some(Piece::Registered { buf, start, end }) => {
                let ok = flush_batch(&mut self.wr, &mut self.buf).await;
                let ring = self
                    .ring
                    .as_deref()
                    .expect("registered buffers come from the ring");
                if !ok {
                    return false;
                }
                let mut sent_bytes = 0u64;
                let sent = datapath::send_registered(
                    ring,
                    self.fd,
                    buf,
                    start,
                    end,
                    IO_TIMEOUT,
                    &mut self.send_zc,
                    &mut sent_bytes,
                )
                .await;
                // Timed out (the socket is shut down), closed or failed:
                // the connection is done either way.
                sent.is_ok()
            }
        }
    }
}

/// Sends every queued frame; ends when all senders are gone or the peer
/// stops reading (then the socket is shut down so the reader ends too).
pub(super) async fn writer(
    wr: WriteHalf<TcpStream>,
    mut rx: mpsc::Receiver<Out>,
    fd: i32,
    ring: Option<Rc<DataRing>>,
) {
    let mut w = FrameWriter {
        wr,
        fd,
        ring,
        buf: Vec::with_capacity(WRITE_BATCH_BYTES + COALESCE_BYTES_MAX),
        send_zc: true,
    };
    'outer: while let Some(first) = rx.next().await {
        let mut next = Some(first);
        while let Some(mut frame) = next.take() {
            if !w.push(&mut frame).await {
                break 'outer;
            }
            if w.buf.len() >= WRITE_BATCH_BYTES && !flush_batch(&mut w.wr, &mut w.buf).await {
                break 'outer;
            }
            next = rx.try_recv().ok();
        }
        if !w.buf.is_empty() && !flush_batch(&mut w.wr, &mut w.buf).await {
            break;
        }
        let _ = w.wr.flush().await;
    }
    // SAFETY: shutdown(2) on the connection's socket, which `w.wr` keeps
    // open (the descriptor is closed only when both halves are dropped);
    // it changes socket state only and touches no memory.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}
