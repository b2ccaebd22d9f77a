//! The data path both front doors share (S3 and native): how received PUT
//! bytes are regrouped into the pieces handed to the store, how a GET piece
//! is read (into a registered buffer of the shard's data ring when it can,
//! else copied), and how a registered buffer is sent on a socket (SEND_ZC
//! with its fallback, within a timeout). The sizes the doors read and write
//! in live here once, with the compile-time checks that tie them to the
//! ring's registered buffers and the store's blocks.

use std::ops::Deref;
use std::os::fd::RawFd;
use std::time::Duration;

use std::rc::Rc;

use bytes::Bytes;

use crate::digest::engine::{Md5Engine, Md5Job};
use crate::frontend::http::within;
use crate::ring::{DataRing, PoolBuf, SendKind};
use crate::shard::msg::ShardError;
use crate::shard::object::{Chunk, ObjectSink, ObjectSource};
use crate::store::file::WRITE_ALIGN_BYTES;
use crate::store::record::BLOCK_BYTES_MAX;

/// Bytes of a PUT body handed to the store at a time (the last piece may
/// be shorter). The store cuts objects into extents of its run-time
/// `chunk_bytes` (1 MiB by default) whatever the piece size, so no
/// compile-time relation to the extent size holds; equal sizes keep one
/// piece per extent.
pub const PUT_PIECE_BYTES: usize = 1 << 20;

/// Object bytes read (and verified) at a time for a GET: one registered
/// buffer's worth, one native Chunk frame.
pub const GET_PIECE_BYTES: u64 = 1 << 20;

// A piece that starts on a block boundary ends on one (of either block
// size), so consecutive pieces never read and CRC-check the same block
// twice (the store verifies whole blocks, `ObjectReader::read_fixed`).
const _: () = assert!(GET_PIECE_BYTES.is_multiple_of(BLOCK_BYTES_MAX));
// A block-aligned GET piece plus the O_DIRECT alignment slack before it
// fits one registered buffer; were it larger, `read_fixed` would refuse
// every piece and all GETs would silently take the copy path.
const _: () =
    assert!(GET_PIECE_BYTES + WRITE_ALIGN_BYTES <= crate::boot::shard_main::RING_BUF_BYTES as u64);

/// Regroups the bytes of a PUT body, as they arrive in reads or frames of
/// any size, into `PUT_PIECE_BYTES` pieces written to the sink, and
/// computes their MD5 (the ETag) on the way: the bytes go to the shard's
/// MD5 engine, which hashes them in lanes with the other uploads' bytes.
pub struct PieceBuilder {
    piece: Vec<u8>,
    md5: Md5Job,
    engine: Rc<Md5Engine>,
}

impl PieceBuilder {
    pub fn new(engine: Rc<Md5Engine>) -> PieceBuilder {
        PieceBuilder {
            piece: Vec::with_capacity(PUT_PIECE_BYTES),
            md5: engine.job(),
            engine,
        }
    }

    /// Adds `data`, writing every piece it completes.
    pub async fn push(&mut self, sink: &mut ObjectSink, data: &Bytes) -> Result<(), ShardError> {
        self.engine.append(&self.md5, data);
        let mut data = &data[..];
        while !data.is_empty() {
            let take = (PUT_PIECE_BYTES - self.piece.len()).min(data.len());
            self.piece.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.piece.len() == PUT_PIECE_BYTES {
                let full = std::mem::replace(&mut self.piece, Vec::with_capacity(PUT_PIECE_BYTES));
                debug_assert_eq!(full.len(), PUT_PIECE_BYTES);
                sink.write(Bytes::from(full)).await?;
            }
        }
        debug_assert!(self.piece.len() < PUT_PIECE_BYTES);
        Ok(())
    }

    /// The MD5 of every byte pushed (call once the body is whole).
    pub async fn md5(&self) -> [u8; 16] {
        self.engine.finish(&self.md5).await
    }

    /// Writes the last, short piece, if any: call once the body is whole
    /// and verified.
    pub async fn finish(self, sink: &mut ObjectSink) -> Result<(), ShardError> {
        if !self.piece.is_empty() {
            sink.write(Bytes::from(self.piece)).await?;
        }
        Ok(())
    }
}

/// Object bytes read for sending.
pub enum Piece {
    /// Read (DMA) and verified in a registered buffer of the shard's ring:
    /// `buf[start..end]`, sent from there.
    Registered {
        buf: PoolBuf,
        start: usize,
        end: usize,
    },
    /// Read through the page cache, or copied from the owner shard.
    Copied(Chunk),
}

impl Deref for Piece {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Piece::Registered { buf, start, end } => &buf.as_slice()[*start..*end],
            Piece::Copied(c) => c,
        }
    }
}

impl From<crate::store::ReadOut> for Piece {
    fn from(out: crate::store::ReadOut) -> Piece {
        match out {
            crate::store::ReadOut::Fixed(buf, start, end) => Piece::Registered { buf, start, end },
            crate::store::ReadOut::Mem(p) => Piece::Copied(Chunk::Local(p)),
        }
    }
}

/// Reads up to `len_bytes` at `offset` (shorter at internal boundaries):
/// into a registered buffer of `ring` when the key is local and a buffer is
/// free, else by copy. A short (empty) copy is the caller's to judge.
pub async fn read_piece(
    source: &mut ObjectSource,
    ring: Option<&DataRing>,
    offset: u64,
    len_bytes: u64,
) -> Result<Piece, ShardError> {
    if let Some(ring) = ring {
        if let Some(read) = source.read_fixed(ring, offset, len_bytes).await {
            let (buf, start, end) = read?;
            debug_assert!(start <= end && end <= buf.len());
            return Ok(Piece::Registered { buf, start, end });
        }
    }
    source.read(offset, len_bytes).await.map(Piece::Copied)
}

/// Sends `head` then `body` on socket `fd` in one non-blocking `sendmsg`
/// (one syscall and one wake-up of the peer where two writes would cost
/// two, and no copy of `body` behind `head`). Returns the bytes the socket
/// took (0 if it would block); the caller writes the rest as usual.
pub fn send_pair_nonblocking(fd: RawFd, head: &[u8], body: &[u8]) -> std::io::Result<usize> {
    let iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        },
    ];
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len();
    // SAFETY: `msg` points at two iovecs over `head` and `body`, which are
    // borrowed for this call; the kernel only reads them. The caller owns
    // the socket `fd` for the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n >= 0 {
        return Ok(n as usize);
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(0),
        _ => Err(e),
    }
}

/// Why `send_registered` stopped.
#[derive(Debug)]
pub enum SendError {
    /// A send made no progress within the timeout; the socket was shut
    /// down (which also hands the buffer back from the kernel).
    TimedOut,
    /// The peer closed the connection (a send of 0 bytes).
    Closed,
    Io(std::io::Error),
}

/// Sends `buf[start..end]` on socket `fd` through the shard's ring, each
/// send within `timeout`. SEND_ZC while `*zc_allowed` (and at the ring's
/// size threshold); once the kernel reports a send as copied (loopback,
/// veth) `*zc_allowed` turns false, so the socket uses plain sends from
/// then on (`DataRing::send`; the ring counts zero-copy, copied and plain
/// sends for the metrics). `sent_bytes` grows with every completed send.
/// The buffer returns to the pool after the kernel's last completion.
#[allow(clippy::too_many_arguments)] // one send's inputs; no natural group
pub async fn send_registered(
    ring: &DataRing,
    fd: RawFd,
    mut buf: PoolBuf,
    mut start: usize,
    end: usize,
    timeout: Duration,
    zc_allowed: &mut bool,
    sent_bytes: &mut u64,
) -> Result<(), SendError> {
    assert!(start <= end && end <= buf.len());
    while start < end {
        let (result, back) =
            match within(timeout, ring.send(fd, buf, start, end, *zc_allowed)).await {
                Some(r) => r,
                None => {
                    // The send (and its buffer) stays with the kernel until it
                    // completes; shutting the socket down completes it now,
                    // even if the peer keeps the connection open.
                    // SAFETY: shutdown(2) on a descriptor the caller's open
                    // connection owns for this whole call; it only changes the
                    // socket's state (no memory is read or written) and does
                    // not close the descriptor.
                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                    return Err(SendError::TimedOut);
                }
            };
        buf = back;
        match result {
            Ok((0, _)) => return Err(SendError::Closed),
            Ok((n, kind)) => {
                debug_assert!(n <= end - start);
                start += n;
                *sent_bytes += n as u64;
                if kind == SendKind::Copied {
                    *zc_allowed = false;
                }
            }
            Err(e) => return Err(SendError::Io(e)),
        }
    }
    Ok(())
}
