//! The native front door: percore's binary range protocol
//! (`percore_protocol::native`, `docs/native.md`), one listener per shard.
//!
//! A connection has one reader (this task) and one writer task. The reader
//! decodes frames, authenticates the connection (HMAC challenge with the S3
//! keys), and starts one task per request, at most `IN_FLIGHT_MAX` at a time:
//! past that it stops reading, so TCP pushes back on the client. Request tasks
//! hand whole frames to the writer through a bounded channel, so replies of
//! different requests interleave at frame boundaries and may finish in any
//! order (the client matches them by request id). Object bytes read into a
//! registered buffer of the shard's data ring are sent from that buffer
//! (SEND_ZC above the ring's threshold); small payloads are coalesced with
//! their frame headers into one send.
//!
//! Any shard serves any key: a key owned elsewhere is forwarded to its owner
//! (`ObjectSource`/`ObjectSink`) and the reply names the owner, so a
//! shard-aware client learns where to go next time.

use std::cell::Cell;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::io::{ReadHalf, WriteHalf};
use futures::{AsyncReadExt, AsyncWriteExt, SinkExt, StreamExt};
use glommio::net::TcpStream;
use md5::{Digest, Md5};
use percore_protocol::native::{
    self as proto, BatchItem, ChunkHead, FrameError, FrameHeader, ItemHead, Kind, Range, Reply,
    Request, ServerMessage, Status,
};
use percore_protocol::routing;

use crate::frontend::s3::handler::{valid_bucket_name, Credentials, PUT_BYTES_MAX};
use crate::shard::msg::{Op, Reply as ShardReply, ShardError};
use crate::shard::object::{ObjectSink, ObjectSource};
use crate::shard::{Shard, BUCKET_OWNER_SHARD};
use crate::store::record::ObjectMeta;
use crate::store::ListItem;

/// Object bytes per Chunk frame (one extent read).
const CHUNK_BYTES: u64 = 1 << 20;
/// Payloads up to this size are copied next to their frame header and sent
/// together; larger ones go out from their own buffer.
const COALESCE_BYTES_MAX: usize = 64 * 1024;
/// Bytes gathered before the writer sends.
const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// Frames queued to the writer per connection.
const OUT_QUEUE: usize = 64;
/// PUT payload frames queued per upload.
const PUT_QUEUE: usize = 4;
/// Pieces handed to the store.
const PUT_PIECE_BYTES: usize = 1 << 20;
/// A native connection may sit idle this long between frames (clients keep
/// connections per shard).
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// One frame's remaining bytes, and every write, must progress within this.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Object bytes queued or being read for sending, or received and not yet
/// stored, per connection: a client that stops reading holds at most this.
const CONNECTION_BYTES_MAX: u64 = 8 << 20;
/// The same across all of a shard's native connections.
const SHARD_BYTES_MAX: u64 = 256 << 20;
/// Authentication must finish within this after connecting: every byte of
/// every frame before HelloOk arrives under this one deadline.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Before authentication only a Hello is read, with at most this many
/// message header bytes and no payload: an unauthenticated peer gets no
/// byte budget and no large buffer (a Hello is about 200 bytes).
const PRE_AUTH_HEADER_BYTES_MAX: u32 = 4096;
/// Longest wait for the next PutData frame of a streamed Put, by default
/// (`native_put_data_timeout_s`); past it the upload is aborted.
pub const PUT_DATA_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

pub struct NativeConfig {
    pub credentials: Credentials,
    /// The native port of every shard, in shard order.
    pub ports: Vec<u16>,
    /// Longest wait for the next PutData frame of a Put
    /// (PUT_DATA_TIMEOUT_DEFAULT).
    pub put_data_timeout: Duration,
}

pub struct NativeFront {
    pub shard: Rc<Shard>,
    cfg: Rc<NativeConfig>,
    pub draining: Cell<bool>,
    /// Shard-wide byte budget (SHARD_BYTES_MAX).
    bytes: Rc<glommio::sync::Semaphore>,
}

/// Byte budgets a request draws on: its connection's and the shard's.
/// Permits are held until the bytes left (were sent, or were stored).
#[derive(Clone)]
struct Budget {
    conn: Rc<glommio::sync::Semaphore>,
    shard: Rc<glommio::sync::Semaphore>,
}

struct Held(
    #[allow(dead_code)] glommio::sync::StaticPermit,
    #[allow(dead_code)] glommio::sync::StaticPermit,
);

impl Budget {
    async fn take(&self, bytes: u64) -> Option<Held> {
        let bytes = bytes.max(1);
        let c = self.conn.acquire_static_permit(bytes).await.ok()?;
        let s = self.shard.acquire_static_permit(bytes).await.ok()?;
        Some(Held(c, s))
    }
}

enum Payload {
    None,
    Chunk(crate::shard::object::Chunk),
    Registered(crate::ring::PoolBuf, usize, usize),
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::Chunk(c) => c.len(),
            Payload::Registered(_, a, b) => b - a,
        }
    }
}

/// One whole frame for the writer.
struct Out {
    head: Vec<u8>,
    payload: Payload,
    /// Budget for the payload, returned when the frame is dropped after
    /// its bytes were sent (or copied into the send batch).
    #[allow(dead_code)]
    held: Option<Held>,
}

fn out(kind: Kind, request_id: u64, more: bool, msg: &ServerMessage, payload: Payload) -> Out {
    let header = msg.encode();
    Out {
        head: proto::frame(kind, request_id, more, &header, payload.len()),
        payload,
        held: None,
    }
}

fn reply_frame(request_id: u64, reply: Reply) -> Out {
    out(
        Kind::Reply,
        request_id,
        false,
        &ServerMessage::Reply(reply),
        Payload::None,
    )
}

fn status_of(e: &ShardError) -> (Status, String) {
    match e {
        ShardError::NoSuchKey => (Status::NoSuchKey, "no such key".into()),
        ShardError::NoSuchBucket => (
            Status::NoSuchBucket,
            "no such bucket; create it first (percore mb)".into(),
        ),
        ShardError::BucketNotEmpty => (Status::BucketNotEmpty, "bucket not empty".into()),
        ShardError::Busy => (Status::Busy, "server busy; retry later".into()),
        ShardError::NoSpace(m) => (
            Status::NoSpace,
            format!("out of disk space ({m}); free space, then retry"),
        ),
        ShardError::Corrupt(m) => (
            Status::Corrupt,
            format!("stored data failed its checksum and was not served: {m}"),
        ),
        ShardError::Internal(m) => (Status::Internal, m.clone()),
        ShardError::ShuttingDown => (
            Status::ShuttingDown,
            "server shutting down; retry on another connection".into(),
        ),
        ShardError::Upload(u) => (Status::InvalidRequest, u.to_string()),
        ShardError::PreconditionFailed => {
            (Status::PreconditionFailed, "precondition failed".into())
        }
        ShardError::ConditionalConflict => (
            Status::Busy,
            "a conflicting write of this key is in flight; retry".into(),
        ),
    }
}

fn shard_error_reply(e: &ShardError) -> Reply {
    let (s, m) = status_of(e);
    Reply::error(s, m)
}

/// Reads exactly `buf.len()` bytes before `deadline` (one deadline for the
/// whole buffer, however the peer dribbles). Ok(false): clean end of stream
/// before the first byte (only when `eof_ok`).
async fn read_full(
    rd: &mut ReadHalf<TcpStream>,
    buf: &mut [u8],
    deadline: Instant,
    eof_ok: bool,
) -> std::io::Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let read = Box::pin(rd.read(&mut buf[at..]));
        let timer = Box::pin(glommio::timer::sleep(left));
        match futures::future::select(read, timer).await {
            futures::future::Either::Left((Ok(0), _)) => {
                if at == 0 && eof_ok {
                    return Ok(false);
                }
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            futures::future::Either::Left((Ok(n), _)) => at += n,
            futures::future::Either::Left((Err(e), _)) => return Err(e),
            futures::future::Either::Right(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        }
    }
    Ok(true)
}

/// Sends every queued frame; ends when all senders are gone or the peer
/// stops reading (then the socket is shut down so the reader ends too).
async fn writer(
    mut wr: WriteHalf<TcpStream>,
    mut rx: mpsc::Receiver<Out>,
    fd: i32,
    ring: Option<Rc<crate::ring::DataRing>>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BATCH_BYTES + COALESCE_BYTES_MAX);
    let mut send_zc = true;
    async fn write_within(wr: &mut WriteHalf<TcpStream>, bytes: &[u8]) -> bool {
        let write = Box::pin(wr.write_all(bytes));
        let timer = Box::pin(glommio::timer::sleep(IO_TIMEOUT));
        matches!(
            futures::future::select(write, timer).await,
            futures::future::Either::Left((Ok(()), _))
        )
    }
    /// Sends the batch and keeps its allocation.
    async fn flush_batch(wr: &mut WriteHalf<TcpStream>, buf: &mut Vec<u8>) -> bool {
        let ok = write_within(wr, buf).await;
        buf.clear();
        ok
    }
    'outer: while let Some(first) = rx.next().await {
        let mut next = Some(first);
        while let Some(frame) = next.take() {
            buf.extend_from_slice(&frame.head);
            let ok = match frame.payload {
                Payload::None => true,
                p if p.len() <= COALESCE_BYTES_MAX => {
                    match &p {
                        Payload::Chunk(c) => buf.extend_from_slice(c),
                        Payload::Registered(r, a, b) => {
                            buf.extend_from_slice(&r.as_slice()[*a..*b])
                        }
                        Payload::None => {}
                    }
                    true
                }
                Payload::Chunk(c) => {
                    flush_batch(&mut wr, &mut buf).await && write_within(&mut wr, &c).await
                }
                Payload::Registered(mut r, mut a, b) => {
                    let mut ok = flush_batch(&mut wr, &mut buf).await;
                    let ring = ring
                        .as_deref()
                        .expect("registered buffers come from the ring");
                    while ok && a < b {
                        let send = Box::pin(ring.send(fd, r, a, b, send_zc));
                        let timer = Box::pin(glommio::timer::sleep(IO_TIMEOUT));
                        match futures::future::select(send, timer).await {
                            futures::future::Either::Left(((Ok((n, kind)), back), _)) if n > 0 => {
                                a += n;
                                r = back;
                                // Copied by the kernel (loopback, veth):
                                // plain sends from now on (DataRing::send).
                                send_zc &= kind != crate::ring::SendKind::Copied;
                            }
                            futures::future::Either::Left(_) => {
                                ok = false;
                                break;
                            }
                            futures::future::Either::Right(_) => {
                                // The buffer returns when the kernel lets go
                                // of it: shut the socket down to make it so.
                                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                                break 'outer;
                            }
                        }
                    }
                    ok
                }
            };
            if !ok {
                break 'outer;
            }
            if buf.len() >= WRITE_BATCH_BYTES && !flush_batch(&mut wr, &mut buf).await {
                break 'outer;
            }
            next = rx.try_recv().ok();
        }
        if !buf.is_empty() && !flush_batch(&mut wr, &mut buf).await {
            break;
        }
        let _ = wr.flush().await;
    }
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

impl NativeFront {
    pub fn new(shard: Rc<Shard>, cfg: Rc<NativeConfig>) -> Rc<NativeFront> {
        Rc::new(NativeFront {
            shard,
            cfg,
            draining: Cell::new(false),
            bytes: Rc::new(glommio::sync::Semaphore::new(SHARD_BYTES_MAX)),
        })
    }

    pub async fn serve_connection(self: Rc<Self>, stream: TcpStream) {
        let m = &self.shard.metrics;
        m.native_connections_open
            .set(m.native_connections_open.get() + 1);
        self.clone().serve_connection_inner(stream).await;
        let m = &self.shard.metrics;
        m.native_connections_open
            .set(m.native_connections_open.get() - 1);
    }

    async fn serve_connection_inner(self: Rc<Self>, stream: TcpStream) {
        let loopback = stream
            .peer_addr()
            .map(|a| a.ip().is_loopback())
            .unwrap_or(false);
        let _ = stream.set_nodelay(true);
        let fd = stream.as_raw_fd();
        let (mut rd, wr) = stream.split();
        let (mut tx, rx) = mpsc::channel::<Out>(OUT_QUEUE);
        let ring = self.shard.ring.borrow().clone();
        let writer_task = glommio::spawn_local(writer(wr, rx, fd, ring));

        let server_nonce: [u8; proto::NONCE_BYTES] = rand::random();
        let challenge = ServerMessage::Challenge(proto::Challenge {
            versions: vec![proto::VERSION],
            server_nonce: server_nonce.to_vec(),
        });
        if tx
            .send(out(Kind::Challenge, 0, false, &challenge, Payload::None))
            .await
            .is_err()
        {
            return;
        }
        let in_flight = Rc::new(glommio::sync::Semaphore::new(proto::IN_FLIGHT_MAX as u64));
        let budget = Budget {
            conn: Rc::new(glommio::sync::Semaphore::new(CONNECTION_BYTES_MAX)),
            shard: self.bytes.clone(),
        };
        let mut authenticated = false;
        let connected = Instant::now();
        // Streamed PUTs in progress: request id -> the upload task's input.
        let mut puts: HashMap<u64, mpsc::Sender<(Bytes, Option<u32>, Held)>> = HashMap::new();
        let mut hdr = [0u8; proto::FRAME_HEADER_BYTES];
        loop {
            if self.draining.get() && puts.values().all(|up| up.is_closed()) {
                break;
            }
            let hello_deadline = connected + HELLO_TIMEOUT;
            let wait = if authenticated {
                Instant::now() + IDLE_TIMEOUT
            } else {
                hello_deadline
            };
            match read_full(&mut rd, &mut hdr, wait, true).await {
                Ok(true) => {}
                Ok(false) | Err(_) => break,
            }
            // The rest of the frame must arrive within one deadline.
            let frame_deadline = if authenticated {
                Instant::now() + IO_TIMEOUT
            } else {
                hello_deadline
            };
            let fh = match FrameHeader::decode(&hdr) {
                Ok(fh) if !authenticated => match pre_auth_refusal(&fh) {
                    None => fh,
                    Some((status, message)) => {
                        // Refused unread (no budget, no buffer for it).
                        if status == Status::BadFrame {
                            self.count_bad_frame();
                        }
                        let _ = tx
                            .send(reply_frame(fh.request_id, Reply::error(status, message)))
                            .await;
                        break;
                    }
                },
                Ok(fh) => fh,
                Err(FrameError::UnknownKind { request_id, .. }) if !authenticated => {
                    self.count_bad_frame();
                    let r = Reply::error(
                        Status::BadFrame,
                        "unknown message kind before authentication; send Hello first; closing the connection",
                    );
                    let _ = tx.send(reply_frame(request_id, r)).await;
                    break;
                }
                Err(FrameError::UnknownKind {
                    kind,
                    request_id,
                    header_len,
                    payload_len,
                }) => {
                    // The lengths are sound: skip the frame, answer, go on.
                    let mut skip =
                        vec![0u8; (header_len as usize + payload_len as usize).min(1 << 16)];
                    let mut left = header_len as usize + payload_len as usize;
                    while left > 0 {
                        let n = left.min(skip.len());
                        if read_full(&mut rd, &mut skip[..n], frame_deadline, false)
                            .await
                            .is_err()
                        {
                            return self.close(tx, writer_task).await;
                        }
                        left -= n;
                    }
                    self.count_bad_frame();
                    let r = Reply::error(Status::BadFrame, format!("unknown message kind {kind:#04x}; this server speaks protocol version {}", proto::VERSION));
                    if tx.send(reply_frame(request_id, r)).await.is_err() {
                        break;
                    }
                    continue;
                }
                Err(e) => {
                    // Cannot resynchronise: answer and close.
                    self.count_bad_frame();
                    let status = if matches!(e, FrameError::UnsupportedVersion(_)) {
                        Status::UnsupportedVersion
                    } else {
                        Status::BadFrame
                    };
                    let _ = tx
                        .send(reply_frame(
                            0,
                            Reply::error(status, format!("{e}; closing the connection")),
                        ))
                        .await;
                    break;
                }
            };
            // PUT bytes count against the budgets until they are stored
            // (none before authentication: such frames have no payload).
            let held = if authenticated {
                match budget.take(u64::from(fh.payload_len)).await {
                    Some(held) => Some(held),
                    None => break,
                }
            } else {
                None
            };
            let mut header = vec![0u8; fh.header_len as usize];
            let mut payload = vec![0u8; fh.payload_len as usize];
            if read_full(&mut rd, &mut header, frame_deadline, false)
                .await
                .is_err()
                || read_full(&mut rd, &mut payload, frame_deadline, false)
                    .await
                    .is_err()
            {
                break;
            }
            let payload = Bytes::from(payload);
            if !fh.kind.is_request() {
                self.count_bad_frame();
                let r = Reply::error(
                    Status::BadFrame,
                    format!("{} is a server frame", fh.kind.name()),
                );
                if tx.send(reply_frame(fh.request_id, r)).await.is_err() {
                    break;
                }
                continue;
            }
            let req = match proto::decode_request(fh.kind, &header) {
                Ok(r) => r,
                Err(e) => {
                    self.count_bad_frame();
                    let close = !authenticated;
                    if tx
                        .send(reply_frame(
                            fh.request_id,
                            Reply::error(Status::InvalidRequest, e.0),
                        ))
                        .await
                        .is_err()
                        || close
                    {
                        break;
                    }
                    // A Put whose header failed: its data frames find no
                    // upload and are answered one by one; clients stop
                    // sending on the first error.
                    continue;
                }
            };
            if !authenticated {
                match req {
                    Request::Hello(h) => match self.hello(&h, &server_nonce, loopback) {
                        Ok(ok) => {
                            authenticated = true;
                            let msg = ServerMessage::HelloOk(ok);
                            if tx
                                .send(out(
                                    Kind::HelloOk,
                                    fh.request_id,
                                    false,
                                    &msg,
                                    Payload::None,
                                ))
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                        Err(r) => {
                            let _ = tx.send(reply_frame(fh.request_id, r)).await;
                            break;
                        }
                    },
                    _ => {
                        let r = Reply::error(
                            Status::Unauthenticated,
                            "send Hello first (answer the Challenge)",
                        );
                        let _ = tx.send(reply_frame(fh.request_id, r)).await;
                        break;
                    }
                }
                continue;
            }
            let held = held.expect("budget taken for every authenticated frame");
            if self.draining.get() && !matches!(req, Request::PutData { .. }) {
                // Draining: uploads already open may finish; nothing new
                // starts (the shard stops once those are done).
                drop(held);
                let r = Reply::error(
                    Status::ShuttingDown,
                    "server shutting down; retry on another connection",
                );
                if tx.send(reply_frame(fh.request_id, r)).await.is_err() {
                    break;
                }
                continue;
            }
            match req {
                Request::Hello(_) => {
                    let r = Reply::error(Status::InvalidRequest, "already authenticated");
                    if tx.send(reply_frame(fh.request_id, r)).await.is_err() {
                        break;
                    }
                }
                Request::PutData { crc32c } => {
                    let Some(up) = puts.get_mut(&fh.request_id) else {
                        let r = Reply::error(
                            Status::InvalidRequest,
                            "PutData without an open Put of this request id",
                        );
                        if tx.send(reply_frame(fh.request_id, r)).await.is_err() {
                            break;
                        }
                        continue;
                    };
                    // Waits while the upload is behind (flow control); an
                    // upload that already failed has dropped its receiver.
                    let _ = up.send((payload, crc32c, held)).await;
                    if !fh.more() {
                        puts.remove(&fh.request_id);
                    }
                }
                Request::Put(p) => {
                    if puts.len() >= proto::IN_FLIGHT_MAX as usize {
                        // Uploads that ended early (an error, a timeout)
                        // whose last PutData never came.
                        puts.retain(|_, up| !up.is_closed());
                    }
                    if puts.contains_key(&fh.request_id) {
                        let r = Reply::error(
                            Status::InvalidRequest,
                            "request id already in use by an open Put",
                        );
                        if tx.send(reply_frame(fh.request_id, r)).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    let permit = match in_flight.clone().acquire_static_permit(1).await {
                        Ok(p) => p,
                        Err(_) => break,
                    };
                    let (mut up_tx, up_rx) = mpsc::channel::<(Bytes, Option<u32>, Held)>(PUT_QUEUE);
                    let _ = up_tx.try_send((payload, None, held));
                    if fh.more() {
                        puts.insert(fh.request_id, up_tx);
                    } else {
                        drop(up_tx);
                    }
                    let (me, tx) = (self.clone(), tx.clone());
                    let id = fh.request_id;
                    glommio::spawn_local(async move {
                        let _permit = permit;
                        me.run(tx, id, Kind::Put, me.put(id, p, up_rx)).await;
                    })
                    .detach();
                }
                req => {
                    let permit = match in_flight.clone().acquire_static_permit(1).await {
                        Ok(p) => p,
                        Err(_) => break,
                    };
                    let (me, tx2) = (self.clone(), tx.clone());
                    let id = fh.request_id;
                    let kind = fh.kind;
                    let budget = budget.clone();
                    glommio::spawn_local(async move {
                        let _permit = permit;
                        let reply_tx = tx2.clone();
                        let fut = me.request(tx2, id, req, budget);
                        me.run(reply_tx, id, kind, fut).await;
                    })
                    .detach();
                }
            }
        }
        drop(puts);
        self.close(tx, writer_task).await;
    }

    async fn close(&self, tx: mpsc::Sender<Out>, writer_task: glommio::Task<()>) {
        // The writer ends when every request task has dropped its sender.
        drop(tx);
        writer_task.await;
    }

    fn count_bad_frame(&self) {
        let m = &self.shard.metrics;
        m.native_bad_frames.set(m.native_bad_frames.get() + 1);
    }

    fn hello(
        &self,
        h: &proto::Hello,
        server_nonce: &[u8],
        loopback: bool,
    ) -> Result<proto::HelloOk, Reply> {
        if h.version != proto::VERSION {
            return Err(Reply::error(
                Status::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported; this server speaks {}",
                    h.version,
                    proto::VERSION
                ),
            ));
        }
        if !(16..=64).contains(&h.client_nonce.len()) {
            return Err(Reply::error(
                Status::InvalidRequest,
                "client nonce must be 16..=64 bytes",
            ));
        }
        let creds = &self.cfg.credentials;
        let expected = proto::client_mac(
            &creds.secret_key,
            &h.access_key,
            server_nonce,
            &h.client_nonce,
        );
        // Compare the key in constant time too; one message for both, so a
        // prober learns nothing about which part was wrong.
        let key_ok = proto::mac_equal(h.access_key.as_bytes(), creds.access_key.as_bytes());
        let mac_ok = proto::mac_equal(&h.mac, &expected);
        if !(key_ok && mac_ok) {
            let m = &self.shard.metrics;
            m.native_auth_failures.set(m.native_auth_failures.get() + 1);
            return Err(Reply::error(Status::Unauthenticated, "authentication failed: check the access key and secret (PERCORE_ACCESS_KEY / PERCORE_SECRET_KEY)"));
        }
        if creds.is_default && !loopback {
            return Err(Reply::error(Status::Unauthenticated, "the default credentials are accepted from loopback only; start the server with PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY set"));
        }
        Ok(proto::HelloOk {
            version: proto::VERSION,
            server_proof: proto::server_proof(&creds.secret_key, server_nonce, &h.client_nonce)
                .to_vec(),
            shard_id: self.shard.id as u32,
            shard_count: self.shard.count as u32,
            hash_algorithm: routing::HASH_ALGORITHM.to_string(),
            hash_seed: self.shard.seed,
            shard_ports: self.cfg.ports.clone(),
            frame_payload_max: proto::PAYLOAD_BYTES_MAX,
            in_flight_max: proto::IN_FLIGHT_MAX,
            ranges_max: proto::RANGES_MAX,
            batch_items_max: proto::BATCH_ITEMS_MAX,
            list_limit_max: proto::LIST_LIMIT_MAX,
            object_bytes_max: PUT_BYTES_MAX,
        })
    }

    /// Runs one request to its final Reply frame and records it.
    async fn run(
        &self,
        mut tx: mpsc::Sender<Out>,
        id: u64,
        kind: Kind,
        fut: impl std::future::Future<Output = Reply>,
    ) {
        let m = &self.shard.metrics;
        m.requests_in_flight.set(m.requests_in_flight.get() + 1);
        let started = Instant::now();
        let reply = fut.await;
        self.shard
            .metrics
            .record_native(kind.name(), reply.status, started.elapsed());
        let _ = tx.send(reply_frame(id, reply)).await;
        let m = &self.shard.metrics;
        m.requests_in_flight.set(m.requests_in_flight.get() - 1);
    }

    async fn request(&self, tx: mpsc::Sender<Out>, id: u64, req: Request, budget: Budget) -> Reply {
        match req {
            Request::Get { bucket, item } => self.get(tx, id, &bucket, vec![item], &budget).await,
            Request::BatchGet { bucket, items } => self.get(tx, id, &bucket, items, &budget).await,
            Request::Delete { bucket, key } => self.delete(&bucket, &key).await,
            Request::Stat { bucket, key } => self.stat(&bucket, &key).await,
            Request::List(l) => self.list(l).await,
            Request::CreateBucket { bucket } => self.create_bucket(bucket).await,
            Request::ListBuckets => Reply {
                buckets: self
                    .shard
                    .bucket_list()
                    .into_iter()
                    .map(|(name, created_ms)| proto::BucketEntry { name, created_ms })
                    .collect(),
                ..Reply::default()
            },
            Request::Hello(_) | Request::Put(_) | Request::PutData { .. } => {
                Reply::error(Status::Internal, "not dispatched here")
            }
        }
    }

    fn owner_reply(&self, bucket: &str, key: &str) -> Reply {
        Reply {
            owner_shard: self.shard.owner_of(bucket, key) as i32,
            ..Reply::default()
        }
    }

    /// Get and BatchGet: per item an ItemHead, then its ranges as Chunk
    /// frames; the final Reply says whether everything was sent.
    async fn get(
        &self,
        mut tx: mpsc::Sender<Out>,
        id: u64,
        bucket: &str,
        items: Vec<BatchItem>,
        budget: &Budget,
    ) -> Reply {
        if !self.shard.bucket_exists(bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        let ring = self.shard.ring.borrow().clone();
        for (index, item) in items.iter().enumerate() {
            let owner = self.shard.owner_of(bucket, &item.key) as u32;
            let mut head = ItemHead {
                item: index as u32,
                owner_shard: owner,
                ..ItemHead::default()
            };
            let opened = ObjectSource::open(&self.shard, bucket, &item.key).await;
            let (mut source, meta) = match opened {
                Ok(x) => x,
                Err(e) => {
                    let (s, m) = status_of(&e);
                    head.status = s.0;
                    head.message = m;
                    if send_head(&mut tx, id, head).await.is_err() {
                        return Reply::error(Status::Internal, "connection closed");
                    }
                    continue;
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
                    if send_head(&mut tx, id, head).await.is_err() {
                        return Reply::error(Status::Internal, "connection closed");
                    }
                    continue;
                }
            }
            let ranges = head.ranges.clone();
            if send_head(&mut tx, id, head).await.is_err() {
                return Reply::error(Status::Internal, "connection closed");
            }
            for (ri, r) in ranges.iter().enumerate() {
                let (mut offset, end) = (r.offset, r.offset + r.length);
                while offset < end {
                    let want = (end - offset).min(CHUNK_BYTES);
                    let Some(held) = budget.take(want).await else {
                        return Reply::error(Status::ShuttingDown, "server shutting down");
                    };
                    let chunk = ChunkHead {
                        item: index as u32,
                        range: ri as u32,
                        offset,
                        crc32c: 0,
                    };
                    // The data path: DMA into a registered buffer, CRC there,
                    // send from there. Falls back to the copy path when no
                    // registered buffer is free or the key lives elsewhere.
                    let fixed = match ring.as_deref() {
                        Some(ring) => source.read_fixed(ring, offset, want).await,
                        None => None,
                    };
                    let (payload, n) = match fixed {
                        Some(Ok((buf, a, b))) => {
                            let n = b - a;
                            (Payload::Registered(buf, a, b), n)
                        }
                        Some(Err(e)) => return self.mid_read_failure(bucket, &item.key, e),
                        None => match source.read(offset, want).await {
                            Ok(c) if !c.is_empty() => {
                                let n = c.len();
                                (Payload::Chunk(c), n)
                            }
                            Ok(_) => {
                                return Reply::error(
                                    Status::Internal,
                                    "object shorter than its metadata",
                                )
                            }
                            Err(e) => return self.mid_read_failure(bucket, &item.key, e),
                        },
                    };
                    let crc = match &payload {
                        Payload::Registered(b, x, y) => proto::crc32c(&b.as_slice()[*x..*y]),
                        Payload::Chunk(c) => proto::crc32c(c),
                        _ => 0,
                    };
                    let chunk = ChunkHead {
                        crc32c: crc,
                        ..chunk
                    };
                    let frame = Out {
                        head: proto::frame(Kind::Chunk, id, true, &proto::encode_chunk(&chunk), n),
                        payload,
                        held: Some(held),
                    };
                    if tx.send(frame).await.is_err() {
                        return Reply::error(Status::Internal, "connection closed");
                    }
                    offset += n as u64;
                    let m = &self.shard.metrics;
                    crate::metrics::ShardMetrics::add(&m.native_bytes_out, n as u64);
                }
            }
        }
        Reply::default()
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

    async fn put(
        &self,
        id: u64,
        p: proto::PutRequest,
        mut data: mpsc::Receiver<(Bytes, Option<u32>, Held)>,
    ) -> Reply {
        let mut reply = self.owner_reply(&p.bucket, &p.key);
        if p.size > PUT_BYTES_MAX {
            let (s, m) = (
                Status::TooLarge,
                format!(
                    "object of {} bytes exceeds the limit of {PUT_BYTES_MAX}",
                    p.size
                ),
            );
            return Reply {
                status: s.0,
                message: m,
                ..reply
            };
        }
        let meta = ObjectMeta {
            size_bytes: 0,
            etag: String::new(),
            mtime_ms: 0,
            content_type: if p.content_type.is_empty() {
                "binary/octet-stream".into()
            } else {
                p.content_type.clone()
            },
            headers: Vec::new(),
        };
        let mut sink = match ObjectSink::open(&self.shard, &p.bucket, &p.key, meta).await {
            Ok(s) => s,
            Err(e) => {
                let (s, m) = status_of(&e);
                return Reply {
                    status: s.0,
                    message: m,
                    ..reply
                };
            }
        };
        let mut md5 = Md5::new();
        let mut crc = 0u32;
        let mut total = 0u64;
        let mut piece: Vec<u8> = Vec::with_capacity(PUT_PIECE_BYTES);
        let mut declared_crc = p.crc32c;
        let wait = self.cfg.put_data_timeout;
        loop {
            // A client that stops sending mid-upload must not hold the
            // upload (its writer, pinned segments, a session on the owner,
            // the bucket's in-flight count) until the connection ends.
            let next = futures::future::select(data.next(), Box::pin(glommio::timer::sleep(wait)));
            let (bytes, crc_sent, _held) = match next.await {
                futures::future::Either::Left((Some(frame), _)) => frame,
                futures::future::Either::Left((None, _)) => break,
                futures::future::Either::Right(_) => {
                    tracing::warn!(
                        shard = self.shard.id,
                        request_id = id,
                        bucket = %p.bucket,
                        key = %p.key,
                        "native Put aborted: no PutData within {wait:?}"
                    );
                    // Dropping `sink` aborts the upload; dropping `data`
                    // returns the budget of frames still queued.
                    return Reply {
                        status: Status::InvalidRequest.0,
                        message: format!(
                            "no PutData for this Put within {} s; the upload was aborted and nothing was stored",
                            wait.as_secs_f64()
                        ),
                        ..reply
                    };
                }
            };
            if let Some(c) = crc_sent {
                if declared_crc.replace(c).is_some() {
                    return Reply {
                        status: Status::InvalidRequest.0,
                        message: "the CRC32C was sent twice (in Put and in PutData)".into(),
                        ..reply
                    };
                }
            }
            total += bytes.len() as u64;
            if total > p.size {
                return Reply {
                    status: Status::InvalidRequest.0,
                    message: format!("more than the declared {} bytes were sent", p.size),
                    ..reply
                };
            }
            md5.update(&bytes);
            crc = proto::crc32c_append(crc, &bytes);
            crate::metrics::ShardMetrics::add(
                &self.shard.metrics.native_bytes_in,
                bytes.len() as u64,
            );
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let take = (PUT_PIECE_BYTES - piece.len()).min(rest.len());
                piece.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if piece.len() == PUT_PIECE_BYTES {
                    let full = std::mem::replace(&mut piece, Vec::with_capacity(PUT_PIECE_BYTES));
                    if let Err(e) = sink.write(Bytes::from(full)).await {
                        let (s, m) = status_of(&e);
                        return Reply {
                            status: s.0,
                            message: m,
                            ..reply
                        };
                    }
                }
            }
        }
        // Everything is checked before the object becomes visible.
        if total != p.size {
            return Reply {
                status: Status::InvalidRequest.0,
                message: format!(
                    "{total} bytes were sent, {} declared (connection cut?)",
                    p.size
                ),
                ..reply
            };
        }
        let Some(declared_crc) = declared_crc else {
            return Reply {
                status: Status::InvalidRequest.0,
                message: "a Put must carry the object's CRC32C, in Put or in its last PutData"
                    .into(),
                ..reply
            };
        };
        if crc != declared_crc {
            return Reply { status: Status::ChecksumMismatch.0, message: format!("CRC32C of the received bytes is {crc:#010x}, the request says {declared_crc:#010x}; nothing was stored"), ..reply };
        }
        if !piece.is_empty() {
            if let Err(e) = sink.write(Bytes::from(piece)).await {
                let (s, m) = status_of(&e);
                return Reply {
                    status: s.0,
                    message: m,
                    ..reply
                };
            }
        }
        use base64::Engine;
        let crc_b64 = base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes());
        let etag = hex::encode(md5.finalize());
        match sink
            .finish_with(etag, vec![("x-amz-checksum-crc32c".to_string(), crc_b64)])
            .await
        {
            Ok(info) => {
                reply.size = info.size_bytes;
                reply.etag = info.etag.to_string();
                reply.mtime_ms = info.mtime_ms;
                reply.crc32c = crc;
                reply
            }
            Err(e) => {
                let (s, m) = status_of(&e);
                Reply {
                    status: s.0,
                    message: m,
                    ..reply
                }
            }
        }
    }

    async fn delete(&self, bucket: &str, key: &str) -> Reply {
        if !self.shard.bucket_exists(bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        let reply = self.owner_reply(bucket, key);
        let owner = reply.owner_shard as usize;
        match self
            .shard
            .call(
                owner,
                Op::Delete {
                    bucket: bucket.into(),
                    key: key.into(),
                },
            )
            .await
        {
            ShardReply::Deleted(existed) => Reply { existed, ..reply },
            ShardReply::Err(e) => Reply {
                owner_shard: owner as i32,
                ..shard_error_reply(&e)
            },
            other => Reply::error(Status::Internal, format!("unexpected reply {other:?}")),
        }
    }

    async fn stat(&self, bucket: &str, key: &str) -> Reply {
        if !self.shard.bucket_exists(bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        let reply = self.owner_reply(bucket, key);
        match ObjectSource::open(&self.shard, bucket, key).await {
            Ok((_, meta)) => {
                use base64::Engine;
                let crc = meta
                    .headers
                    .iter()
                    .find(|(n, _)| n == "x-amz-checksum-crc32c")
                    .and_then(|(_, v)| base64::engine::general_purpose::STANDARD.decode(v).ok())
                    .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
                    .map_or(0, u32::from_be_bytes);
                Reply {
                    size: meta.size_bytes,
                    etag: meta.etag,
                    mtime_ms: meta.mtime_ms,
                    content_type: meta.content_type,
                    crc32c: crc,
                    ..reply
                }
            }
            Err(e) => Reply {
                owner_shard: reply.owner_shard,
                ..shard_error_reply(&e)
            },
        }
    }

    async fn list(&self, l: proto::ListRequest) -> Reply {
        if !self.shard.bucket_exists(&l.bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        let limit = match l.limit {
            0 => 1000,
            n => n.min(proto::LIST_LIMIT_MAX),
        } as usize;
        let delimiter = (!l.delimiter.is_empty()).then(|| l.delimiter.clone());
        // A start_after inside a common prefix resumes after the prefix.
        let from = match &delimiter {
            Some(d) if l.start_after.starts_with(&l.prefix) => {
                let rest = &l.start_after[l.prefix.len()..];
                match rest.find(d.as_str()) {
                    // The common prefix itself: the store resumes after
                    // every key under a marker that ends on a delimiter.
                    Some(i) => l.start_after[..l.prefix.len() + i + d.len()].to_string(),
                    None => l.start_after.clone(),
                }
            }
            _ => l.start_after.clone(),
        };
        match self
            .shard
            .list_merged(&l.bucket, &l.prefix, &from, delimiter, limit)
            .await
        {
            Ok((items, truncated)) => {
                let next = if truncated {
                    items
                        .last()
                        .map(|i| i.name().to_string())
                        .unwrap_or_default()
                } else {
                    String::new()
                };
                Reply {
                    entries: items
                        .into_iter()
                        .map(|i| match i {
                            ListItem::Object {
                                key,
                                size_bytes,
                                etag,
                                mtime_ms,
                            } => proto::ListEntry {
                                key,
                                size: size_bytes,
                                etag: etag.to_string(),
                                mtime_ms,
                                is_prefix: false,
                            },
                            ListItem::Prefix(p) => proto::ListEntry {
                                key: p,
                                is_prefix: true,
                                ..Default::default()
                            },
                        })
                        .collect(),
                    truncated,
                    next_start_after: next,
                    ..Reply::default()
                }
            }
            Err(e) => shard_error_reply(&e),
        }
    }

    async fn create_bucket(&self, bucket: String) -> Reply {
        if !valid_bucket_name(&bucket) {
            return Reply::error(Status::InvalidBucketName, "bucket names are 3-63 characters of a-z, 0-9, '.' and '-', starting and ending with a letter or digit");
        }
        match self
            .shard
            .call(BUCKET_OWNER_SHARD, Op::BucketCreate { name: bucket })
            .await
        {
            ShardReply::Created(true) => Reply::default(),
            ShardReply::Created(false) => {
                Reply::error(Status::BucketExists, "bucket already exists")
            }
            ShardReply::Err(e) => shard_error_reply(&e),
            other => Reply::error(Status::Internal, format!("unexpected reply {other:?}")),
        }
    }
}

/// Why a frame is refused unread before authentication, if it is: only a
/// small Hello without payload is read from an unauthenticated peer.
fn pre_auth_refusal(fh: &FrameHeader) -> Option<(Status, String)> {
    if fh.kind != Kind::Hello {
        return Some((
            Status::Unauthenticated,
            format!(
                "{} before authentication: send Hello first (answer the Challenge); closing the connection",
                fh.kind.name()
            ),
        ));
    }
    if fh.payload_len > 0 || fh.header_len > PRE_AUTH_HEADER_BYTES_MAX {
        return Some((
            Status::BadFrame,
            format!(
                "a Hello has no payload and at most {PRE_AUTH_HEADER_BYTES_MAX} header bytes (got {} and {}); closing the connection",
                fh.header_len, fh.payload_len
            ),
        ));
    }
    None
}

async fn send_head(
    tx: &mut mpsc::Sender<Out>,
    id: u64,
    head: ItemHead,
) -> Result<(), mpsc::SendError> {
    tx.send(out(
        Kind::ItemHead,
        id,
        true,
        &ServerMessage::ItemHead(head),
        Payload::None,
    ))
    .await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_like_http() {
        let r = |o, l| Range {
            offset: o,
            length: l,
        };
        assert_eq!(resolve_ranges(&[], 10), Ok(vec![r(0, 10)]));
        assert_eq!(resolve_ranges(&[], 0), Ok(vec![r(0, 0)]));
        assert_eq!(
            resolve_ranges(&[r(2, 3), r(8, 100), r(4, 0)], 10),
            Ok(vec![r(2, 3), r(8, 2), r(4, 6)])
        );
        assert!(resolve_ranges(&[r(10, 1)], 10).is_err());
        assert!(resolve_ranges(&[r(11, 1)], 10).is_err());
        assert_eq!(resolve_ranges(&[r(0, 5)], 0), Ok(vec![r(0, 0)]));
    }
}
