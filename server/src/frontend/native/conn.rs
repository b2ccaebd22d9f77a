//! One native connection's reader: frames in (each under a deadline), the
//! authentication state machine (Challenge sent, then only a small Hello
//! is read; after HelloOk, requests), and dispatch: streamed PUT data to its
//! upload task, every other request to a task of its own, at most
//! `IN_FLIGHT_MAX` at a time (past that the reader stops, and TCP pushes
//! back on the client).

use crate::access::Principal;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::io::ReadHalf;
use futures::{AsyncReadExt, SinkExt};
use glommio::net::TcpStream;
use percore_protocol::native::{
    self as proto, FrameError, FrameHeader, Kind, Reply, Request, ServerMessage, Status,
};
use percore_protocol::routing;

use super::writer::{out, reply_frame, writer, Out};
use super::{
    Budget, Held, NativeFront, CONNECTION_BYTES_MAX, HELLO_TIMEOUT, IDLE_TIMEOUT, IO_TIMEOUT,
    OUT_QUEUE, PRE_AUTH_HEADER_BYTES_MAX, PUT_QUEUE,
};
use crate::frontend::common::PUT_BYTES_MAX;
use crate::frontend::http::within;

/// One PutData frame for an upload task: its bytes, the CRC32C it may
/// carry, and the budget they hold until stored.
pub(super) type PutFrame = (Bytes, Option<u32>, Held);

/// Where a connection is in its handshake.
enum Auth {
    /// The Challenge is out: only a Hello is read, every byte of it before
    /// `deadline`.
    AwaitingHello {
        server_nonce: [u8; proto::NONCE_BYTES],
        deadline: Instant,
    },
    /// HelloOk is out: requests flow, as this principal, signed in with
    /// this access key (checked again for every request: removed keys stop
    /// working on open connections too).
    Authenticated(Principal, String),
}

impl Auth {
    fn is_authenticated(&self) -> bool {
        matches!(self, Auth::Authenticated(..))
    }

    /// By when the next frame's header must have arrived.
    fn header_deadline(&self) -> Instant {
        match self {
            Auth::AwaitingHello { deadline, .. } => *deadline,
            Auth::Authenticated(..) => Instant::now() + IDLE_TIMEOUT,
        }
    }

    /// By when the rest of a frame whose header just arrived must have.
    fn frame_deadline(&self) -> Instant {
        match self {
            Auth::AwaitingHello { deadline, .. } => *deadline,
            Auth::Authenticated(..) => Instant::now() + IO_TIMEOUT,
        }
    }
}

/// What the reader does after a frame.
enum Step {
    /// Read the next frame.
    Next,
    /// Close the connection.
    Stop,
    /// Close the connection while the open uploads' inputs are still held
    /// (a frame could not be skipped; as before the split, their tasks end
    /// by their PutData timeout, not at once).
    StopKeepingPuts,
}

/// The reader's state for one connection.
struct Conn {
    front: Rc<NativeFront>,
    rd: ReadHalf<TcpStream>,
    /// To the writer task.
    tx: mpsc::Sender<Out>,
    loopback: bool,
    auth: Auth,
    /// Requests running (IN_FLIGHT_MAX).
    in_flight: Rc<glommio::sync::Semaphore>,
    budget: Budget,
    /// Streamed PUTs in progress: request id -> the upload task's input.
    puts: HashMap<u64, mpsc::Sender<PutFrame>>,
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
        match within(left, rd.read(&mut buf[at..])).await {
            Some(Ok(0)) => {
                if at == 0 && eof_ok {
                    return Ok(false);
                }
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            Some(Ok(n)) => at += n,
            Some(Err(e)) => return Err(e),
            None => return Err(std::io::ErrorKind::TimedOut.into()),
        }
    }
    debug_assert_eq!(at, buf.len());
    Ok(true)
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

impl NativeFront {
    /// Sends the Challenge, then reads frames until the connection ends;
    /// waits for the writer to send what was queued.
    pub(super) async fn serve_connection_inner(self: Rc<Self>, stream: TcpStream) {
        let loopback = crate::frontend::common::peer_is_loopback(&stream);
        let _ = stream.set_nodelay(true);
        let fd = stream.as_raw_fd();
        let (rd, wr) = stream.split();
        let (mut tx, rx) = mpsc::channel::<Out>(OUT_QUEUE);
        let writer_task = glommio::spawn_local(writer(wr, rx, fd, self.shard.ring()));

        let server_nonce: [u8; proto::NONCE_BYTES] = rand::random();
        let challenge = ServerMessage::Challenge(proto::Challenge {
            versions: vec![proto::VERSION],
            server_nonce: server_nonce.to_vec(),
        });
        if tx
            .send(out(Kind::Challenge, 0, false, &challenge, None))
            .await
            .is_err()
        {
            // Dropping the writer's task handle cancels it.
            return;
        }
        let connected = Instant::now();
        let budget = Budget {
            conn: Rc::new(glommio::sync::Semaphore::new(CONNECTION_BYTES_MAX)),
            shard: self.bytes.clone(),
        };
        let mut conn = Conn {
            front: self,
            rd,
            tx,
            loopback,
            auth: Auth::AwaitingHello {
                server_nonce,
                deadline: connected + HELLO_TIMEOUT,
            },
            in_flight: Rc::new(glommio::sync::Semaphore::new(proto::IN_FLIGHT_MAX as u64)),
            budget,
            puts: HashMap::new(),
        };
        let keep_puts = conn.run().await;
        let puts = std::mem::take(&mut conn.puts);
        let puts = if keep_puts {
            Some(puts)
        } else {
            drop(puts);
            None
        };
        // The writer ends when every request task has dropped its sender.
        drop(conn.tx);
        writer_task.await;
        drop(puts);
    }

    /// Checks a Hello: version, nonce, and the MAC over both nonces with
    /// the S3 keys (constant time). The HelloOk, or the Reply refusing it.
    #[allow(clippy::result_large_err)] // the refusal is sent as is, once per connection
    fn hello(
        &self,
        h: &proto::Hello,
        server_nonce: &[u8],
        loopback: bool,
    ) -> Result<(proto::HelloOk, Principal), Reply> {
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
        // The root keys, or a user's; an unknown key is checked against the
        // root secret all the same and fails (no timing difference).
        let is_root = proto::mac_equal(h.access_key.as_bytes(), creds.access_key.as_bytes());
        if !is_root && self.shard.is_cluster() && !crate::cluster::catalog::serving() {
            // Its users may not be the cluster's (a user just made would
            // be refused for good): Busy, which a client retries. (The
            // root keys are every node's own; its requests but
            // ClusterMap are answered Busy until the node serves.)
            return Err(Reply::error(
                Status::Busy,
                "this cluster node cannot confirm the cluster's users with etcd right now; retry shortly, or through another node",
            ));
        }
        let (secret, principal) = if is_root {
            (creds.secret_key.clone(), Some(Principal::Root))
        } else {
            match self.shard.user_by_access_key(&h.access_key) {
                Some(u) => (
                    u.secret_key.clone(),
                    Some(Principal::User(std::rc::Rc::from(u.name.as_str()))),
                ),
                None => (creds.secret_key.clone(), None),
            }
        };
        let expected = proto::client_mac(&secret, &h.access_key, server_nonce, &h.client_nonce);
        let mac_ok = proto::mac_equal(&h.mac, &expected);
        let Some(principal) = principal.filter(|_| mac_ok) else {
            let m = self.shard.metrics();
            m.native_auth_failures.set(m.native_auth_failures.get() + 1);
            return Err(Reply::error(Status::Unauthenticated, "authentication failed: check the access key and secret (PERCORE_ACCESS_KEY / PERCORE_SECRET_KEY, or a user's keys)"));
        };
        if principal == Principal::Root && !creds.allowed_from(loopback) {
            return Err(Reply::error(Status::Unauthenticated, "the default credentials are accepted from loopback only; start the server with PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY set"));
        }
        let secret_key = secret;
        let map = self.shard.cluster_map();
        Ok((
            proto::HelloOk {
                version: proto::VERSION,
                server_proof: proto::server_proof(&secret_key, server_nonce, &h.client_nonce)
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
                pg_count: self.shard.cluster_pgs(),
                cluster_epoch: map.as_ref().map_or(0, |m| m.epoch),
                node_id: map
                    .as_ref()
                    .and_then(|m| i32::try_from(m.node_id).ok())
                    .unwrap_or(-1),
            },
            principal,
        ))
    }
}

impl Conn {
    /// Reads and handles frames until the connection is to close. True:
    /// close while the open uploads' inputs are still held (`Step`).
    async fn run(&mut self) -> bool {
        loop {
            if self.front.draining.get() && self.puts.values().all(|up| up.is_closed()) {
                return false;
            }
            match self.next_frame().await {
                Step::Next => {}
                Step::Stop => return false,
                Step::StopKeepingPuts => return true,
            }
        }
    }

    /// Queues a Reply frame; Stop if the writer is gone.
    async fn reply(&mut self, request_id: u64, reply: Reply) -> Step {
        match self.tx.send(reply_frame(request_id, reply)).await {
            Ok(()) => Step::Next,
            Err(_) => Step::Stop,
        }
    }

    /// Queues a last Reply frame, then closes.
    async fn reply_and_close(&mut self, request_id: u64, reply: Reply) -> Step {
        let _ = self.tx.send(reply_frame(request_id, reply)).await;
        Step::Stop
    }

    /// One frame: read it whole, decode it, hand it on.
    async fn next_frame(&mut self) -> Step {
        let (fh, deadline) = match self.read_frame_header().await {
            Ok(x) => x,
            Err(step) => return step,
        };
        // PUT bytes count against the budgets until they are stored
        // (none before authentication: such frames have no payload).
        let held = if self.auth.is_authenticated() {
            match self.budget.take(u64::from(fh.payload_len)).await {
                Some(held) => Some(held),
                None => return Step::Stop,
            }
        } else {
            None
        };
        let mut header = vec![0u8; fh.header_len as usize];
        let mut payload = vec![0u8; fh.payload_len as usize];
        if read_full(&mut self.rd, &mut header, deadline, false)
            .await
            .is_err()
            || read_full(&mut self.rd, &mut payload, deadline, false)
                .await
                .is_err()
        {
            return Step::Stop;
        }
        let payload = Bytes::from(payload);
        if !fh.kind.is_request() {
            self.front.count_bad_frame();
            let r = Reply::error(
                Status::BadFrame,
                format!("{} is a server frame", fh.kind.name()),
            );
            return self.reply(fh.request_id, r).await;
        }
        let req = match proto::decode_request(fh.kind, &header) {
            Ok(r) => r,
            Err(e) => {
                self.front.count_bad_frame();
                let r = Reply::error(Status::InvalidRequest, e.0);
                if !self.auth.is_authenticated() {
                    return self.reply_and_close(fh.request_id, r).await;
                }
                // A Put whose header failed: its data frames find no
                // upload and are answered one by one; clients stop
                // sending on the first error.
                return self.reply(fh.request_id, r).await;
            }
        };
        if !self.auth.is_authenticated() {
            return self.handshake(fh.request_id, req).await;
        }
        let held = held.expect("budget taken for every authenticated frame");
        if self.front.draining.get() && !matches!(req, Request::PutData { .. }) {
            // Draining: uploads already open may finish; nothing new
            // starts (the shard stops once those are done).
            drop(held);
            let r = Reply::error(
                Status::ShuttingDown,
                "server shutting down; retry on another connection",
            );
            return self.reply(fh.request_id, r).await;
        }
        self.dispatch(&fh, req, payload, held).await
    }

    /// Reads and decodes a frame header under the connection's deadline;
    /// answers (and skips, or closes on) the frames it cannot accept. The
    /// header and the deadline for the rest of the frame.
    async fn read_frame_header(&mut self) -> Result<(FrameHeader, Instant), Step> {
        let mut hdr = [0u8; proto::FRAME_HEADER_BYTES];
        match read_full(&mut self.rd, &mut hdr, self.auth.header_deadline(), true).await {
            Ok(true) => {}
            Ok(false) | Err(_) => return Err(Step::Stop),
        }
        // The rest of the frame must arrive within one deadline.
        let deadline = self.auth.frame_deadline();
        let authenticated = self.auth.is_authenticated();
        match FrameHeader::decode(&hdr) {
            Ok(fh) if !authenticated => match pre_auth_refusal(&fh) {
                None => Ok((fh, deadline)),
                Some((status, message)) => {
                    // Refused unread (no budget, no buffer for it).
                    if status == Status::BadFrame {
                        self.front.count_bad_frame();
                    }
                    let r = Reply::error(status, message);
                    Err(self.reply_and_close(fh.request_id, r).await)
                }
            },
            Ok(fh) => Ok((fh, deadline)),
            Err(FrameError::UnknownKind { request_id, .. }) if !authenticated => {
                self.front.count_bad_frame();
                let r = Reply::error(
                    Status::BadFrame,
                    "unknown message kind before authentication; send Hello first; closing the connection",
                );
                Err(self.reply_and_close(request_id, r).await)
            }
            Err(FrameError::UnknownKind {
                kind,
                request_id,
                header_len,
                payload_len,
            }) => {
                // The lengths are sound: skip the frame, answer, go on.
                let len = header_len as usize + payload_len as usize;
                if self.skip(len, deadline).await.is_err() {
                    return Err(Step::StopKeepingPuts);
                }
                self.front.count_bad_frame();
                let r = Reply::error(
                    Status::BadFrame,
                    format!(
                        "unknown message kind {kind:#04x}; this server speaks protocol version {}",
                        proto::VERSION
                    ),
                );
                Err(self.reply(request_id, r).await)
            }
            Err(e) => {
                // Cannot resynchronise: answer and close.
                self.front.count_bad_frame();
                let status = if matches!(e, FrameError::UnsupportedVersion(_)) {
                    Status::UnsupportedVersion
                } else {
                    Status::BadFrame
                };
                let r = Reply::error(status, format!("{e}; closing the connection"));
                Err(self.reply_and_close(0, r).await)
            }
        }
    }

    /// Reads and drops `len` bytes before `deadline`, 64 KiB at a time.
    async fn skip(&mut self, len: usize, deadline: Instant) -> std::io::Result<()> {
        let mut skip = vec![0u8; len.min(1 << 16)];
        let mut left = len;
        while left > 0 {
            let n = left.min(skip.len());
            read_full(&mut self.rd, &mut skip[..n], deadline, false).await?;
            left -= n;
        }
        Ok(())
    }

    /// Before authentication: a Hello is answered with HelloOk (the
    /// connection is then authenticated) or refused; anything else closes.
    async fn handshake(&mut self, request_id: u64, req: Request) -> Step {
        let Auth::AwaitingHello { server_nonce, .. } = self.auth else {
            unreachable!("a handshake only before authentication");
        };
        let Request::Hello(h) = req else {
            let r = Reply::error(
                Status::Unauthenticated,
                "send Hello first (answer the Challenge)",
            );
            return self.reply_and_close(request_id, r).await;
        };
        match self.front.hello(&h, &server_nonce, self.loopback) {
            Ok((ok, principal)) => {
                self.auth = Auth::Authenticated(principal, h.access_key.clone());
                let msg = ServerMessage::HelloOk(ok);
                match self
                    .tx
                    .send(out(Kind::HelloOk, request_id, false, &msg, None))
                    .await
                {
                    Ok(()) => Step::Next,
                    Err(_) => Step::Stop,
                }
            }
            Err(r) => self.reply_and_close(request_id, r).await,
        }
    }

    /// Who this connection authenticated as (Anonymous before the Hello:
    /// the fail-closed value; requests flow only after it).
    /// None: the user's keys were removed since the Hello.
    fn principal(&self) -> Option<Principal> {
        match &self.auth {
            Auth::Authenticated(Principal::User(name), key) => {
                let user = self.front.shard.user_by_access_key(key)?;
                (*user.name == **name).then(|| Principal::User(name.clone()))
            }
            Auth::Authenticated(p, _) => Some(p.clone()),
            Auth::AwaitingHello { .. } => Some(Principal::Anonymous),
        }
    }

    /// The answer to a request on a connection whose keys were removed.
    fn revoked() -> Reply {
        Reply::error(
            Status::Unauthenticated,
            "this connection's access key was removed: connect again with valid keys",
        )
    }

    /// An authenticated request: PutData to its upload, a Put to a new
    /// upload task, anything else to a task of its own.
    async fn dispatch(
        &mut self,
        fh: &FrameHeader,
        req: Request,
        payload: Bytes,
        held: Held,
    ) -> Step {
        match req {
            Request::Hello(_) => {
                let r = Reply::error(Status::InvalidRequest, "already authenticated");
                self.reply(fh.request_id, r).await
            }
            Request::PutData { crc32c } => self.put_data(fh, crc32c, payload, held).await,
            Request::Put(p) => self.put_start(fh, p, payload, held).await,
            req => {
                let Ok(permit) = self.in_flight.clone().acquire_static_permit(1).await else {
                    return Step::Stop;
                };
                let (me, tx) = (self.front.clone(), self.tx.clone());
                let (id, kind) = (fh.request_id, fh.kind);
                let budget = self.budget.clone();
                let Some(principal) = self.principal() else {
                    return self.reply_and_close(fh.request_id, Self::revoked()).await;
                };
                glommio::spawn_local(async move {
                    let _permit = permit;
                    let reply_tx = tx.clone();
                    let fut = me.request(tx, id, req, budget, principal);
                    me.run(reply_tx, id, kind, fut).await;
                })
                .detach();
                Step::Next
            }
        }
    }

    /// A PutData frame: to its upload task, which may make this wait (flow
    /// control); an upload that already failed has dropped its receiver.
    async fn put_data(
        &mut self,
        fh: &FrameHeader,
        crc32c: Option<u32>,
        payload: Bytes,
        held: Held,
    ) -> Step {
        let Some(up) = self.puts.get_mut(&fh.request_id) else {
            let r = Reply::error(
                Status::InvalidRequest,
                "PutData without an open Put of this request id",
            );
            return self.reply(fh.request_id, r).await;
        };
        let _ = up.send((payload, crc32c, held)).await;
        if !fh.more() {
            self.puts.remove(&fh.request_id);
        }
        Step::Next
    }

    /// A Put: starts its upload task with the frame's payload; later
    /// PutData frames of the request id follow while `more` is set.
    async fn put_start(
        &mut self,
        fh: &FrameHeader,
        p: proto::PutRequest,
        payload: Bytes,
        held: Held,
    ) -> Step {
        if self.puts.len() >= proto::IN_FLIGHT_MAX as usize {
            // Uploads that ended early (an error, a timeout)
            // whose last PutData never came.
            self.puts.retain(|_, up| !up.is_closed());
        }
        if self.puts.contains_key(&fh.request_id) {
            let r = Reply::error(
                Status::InvalidRequest,
                "request id already in use by an open Put",
            );
            return self.reply(fh.request_id, r).await;
        }
        let Ok(permit) = self.in_flight.clone().acquire_static_permit(1).await else {
            return Step::Stop;
        };
        let (mut up_tx, up_rx) = mpsc::channel::<PutFrame>(PUT_QUEUE);
        let _ = up_tx.try_send((payload, None, held));
        if fh.more() {
            self.puts.insert(fh.request_id, up_tx);
        } else {
            drop(up_tx);
        }
        let (me, tx) = (self.front.clone(), self.tx.clone());
        let id = fh.request_id;
        let Some(principal) = self.principal() else {
            return self.reply_and_close(id, Self::revoked()).await;
        };
        glommio::spawn_local(async move {
            let _permit = permit;
            me.run(tx, id, Kind::Put, me.put(id, p, up_rx, principal))
                .await;
        })
        .detach();
        Step::Next
    }
}
