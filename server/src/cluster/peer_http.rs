//! Node-to-node HTTP on the S3 port (glommio, on the shard that needs it):
//! S3 requests forwarded to the node that owns their key, bucket changes
//! fanned out to every node, and the internal listing each node answers
//! for its own data. One connection per request (`Connection: close`), so
//! a response ends where the peer closes; except copies to replicas of up
//! to 256 KiB and forwarded GETs and HEADs without a body (the most
//! frequent), whose connections each shard keeps open for the next such
//! request to the same node (`pool_take`, `pool_put`).
//!
//! Every such request carries `x-percore-node`, a MAC keyed with the
//! cluster key (derived from the nodes' shared root secret key) over the
//! sender, the receiver, the time, the method, the request target and the
//! body's SHA-256:
//!
//! ```text
//! x-percore-node: v2 <from node> <to node> <unix ms> <nonce> <body> <hex mac>
//! key  = HMAC-SHA256(root secret, "percore-cluster-key-v1")
//! mac  = HMAC-SHA256(key, "percore-node-v2\n" from "\n" to "\n" ms "\n" nonce "\n" method "\n" target "\n" body)
//! nonce = 16 random hex digits
//! body = hex SHA-256 of the body, or "-" (a forwarded S3 request, whose
//!        body the client's own signature covers)
//! ```
//!
//! A forward sent through a relay (`x-percore-relay: <owner node>`: pass
//! it on to the key's owner) has `"\nrelay " owner` appended to what its
//! MAC covers, so the header cannot be added to a captured forward.
//!
//! Answers to internal requests that the requester acts on (every 2xx,
//! and a fetch's 404) carry a MAC too, bound to the request's own MAC
//! (so an answer fits one request only):
//!
//! ```text
//! x-percore-reply: <hex mac>
//! mac = HMAC-SHA256(key, "percore-reply-v1\n" hex(request mac) "\n" status "\n" covered)
//! covered = hex SHA-256 of the body (JSON answers), or "state " and the
//!           x-percore-state value (a fetch's bytes: the state's MD5
//!           covers them), or "absent" (a fetch's 404)
//! ```
//!
//! The requester refuses an answer whose MAC is missing or wrong (a node
//! of an older version, or someone on the network forging an
//! acknowledgement). Errors carry none: they only make the requester
//! give up or retry, which anyone able to drop packets can make it do.
//!
//! A forwarded S3 request keeps the client's signature, which the owner
//! checks again; the MAC only tells it that another node sent it there
//! (serve it here, do not forward it again). Internal requests
//! (`/_percore/...`) carry no client signature: the MAC is their
//! authentication, so they must name their body's hash, and a receiver
//! takes each MAC once, node-wide (`Replays` on the shard the MAC hashes
//! to: `Shard::take_node_mac`).

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The header of node-to-node requests.
pub const HEADER: &str = "x-percore-node";
/// The header of a relayed forward: the node to pass it on to.
pub const RELAY_HEADER: &str = "x-percore-relay";
/// The header of a signed answer to an internal request.
pub const REPLY_HEADER: &str = "x-percore-reply";
/// How far a node's clock may be from the sender's.
const SKEW_MAX_MS: u64 = 5 * 60 * 1000;
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a peer's next bytes.
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest response head from a peer.
const HEAD_BYTES_MAX: usize = 64 * 1024;
const HEADERS_MAX: usize = 128;
/// How far an internal request's time may be from the receiver's clock
/// (its MAC is remembered that long: `Replays`).
pub const INTERNAL_SKEW_MAX_MS: u64 = 30 * 1000;
/// Internal MACs a shard remembers (`Replays`): 2,000 a second per shard
/// over the window; past that internal requests answer 503 SlowDown until
/// old ones age out.
const REPLAYS_MAX: usize = 1 << 17;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The key node-to-node MACs are made with (never the root secret
/// itself, which also signs S3 requests).
#[must_use]
pub fn cluster_key(root_secret: &str) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(root_secret.as_bytes()).expect("any key length");
    m.update(b"percore-cluster-key-v1");
    m.finalize().into_bytes().into()
}

/// The hex SHA-256 of an internal request's body.
#[must_use]
pub fn body_hash(body: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(Sha256::digest(body))
}

/// What a request is signed over.
pub struct Signed<'a> {
    pub from: u32,
    pub to: u32,
    pub method: &'a str,
    pub target: &'a str,
    /// `body_hash`, or "-" for a forwarded S3 request.
    pub body: &'a str,
    /// A forward sent through a relay: the owner to pass it on to.
    pub relay: Option<u32>,
}

fn mac(key: &[u8; 32], s: &Signed<'_>, ms: u64, nonce: &str) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    m.update(
        format!(
            "percore-node-v2\n{}\n{}\n{ms}\n{nonce}\n{}\n{}\n{}",
            s.from, s.to, s.method, s.target, s.body
        )
        .as_bytes(),
    );
    if let Some(owner) = s.relay {
        m.update(format!("\nrelay {owner}").as_bytes());
    }
    m.finalize().into_bytes().into()
}

/// The `x-percore-node` value of a request.
#[must_use]
pub fn sign(key: &[u8; 32], s: &Signed<'_>) -> String {
    let ms = now_ms();
    let nonce = format!("{:016x}", rand::random::<u64>());
    let tag = hex::encode(mac(key, s, ms, &nonce));
    format!("v2 {} {} {ms} {nonce} {} {tag}", s.from, s.to, s.body)
}

/// What a valid `x-percore-node` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub from: u32,
    /// The body's hash ("-": a forwarded S3 request).
    pub body: String,
    pub ms: u64,
    pub mac: [u8; 32],
    /// Sent through a relay, to pass on to this owner (the MAC covers it).
    pub relay: Option<u32>,
}

/// Checks an `x-percore-node` value of a request to node `me`, with the
/// request's `x-percore-relay` value if it has one.
pub fn verify(
    key: &[u8; 32],
    value: &str,
    me: u32,
    method: &str,
    target: &str,
    relay: Option<&str>,
) -> Result<Claim, String> {
    let parts: Vec<&str> = value.split(' ').collect();
    let ["v2", from, to, ms, nonce, body, tag] = parts[..] else {
        return Err("malformed node header".into());
    };
    let from: u32 = from.parse().map_err(|_| "malformed node id")?;
    let to: u32 = to.parse().map_err(|_| "malformed node id")?;
    let ms: u64 = ms.parse().map_err(|_| "malformed node time")?;
    if to != me {
        return Err(format!(
            "the node header is for node {to}, this is node {me}"
        ));
    }
    if now_ms().abs_diff(ms) > SKEW_MAX_MS {
        return Err("node header too old (or the nodes' clocks are minutes apart)".into());
    }
    let tag = hex::decode(tag).map_err(|_| "malformed node MAC")?;
    let relay = relay
        .map(|r| r.trim().parse::<u32>())
        .transpose()
        .map_err(|_| "malformed relay header")?;
    let signed = Signed {
        from,
        to,
        method,
        target,
        body,
        relay,
    };
    if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("malformed node nonce".into());
    }
    let want = mac(key, &signed, ms, nonce);
    if tag.len() != want.len() || !bool::from(want.ct_eq(&tag[..])) {
        return Err(
            "node MAC does not match (are all nodes started with the same root keys?)".into(),
        );
    }
    Ok(Claim {
        from,
        body: body.to_string(),
        ms,
        mac: want,
        relay,
    })
}

/// The request MAC inside an `x-percore-node` value this node made.
#[must_use]
pub fn request_mac(node_header: &str) -> Option<[u8; 32]> {
    let tag = hex::decode(node_header.rsplit(' ').next()?).ok()?;
    tag.try_into().ok()
}

/// Hex digits of the MAC that ends a copy source's bytes
/// (`frontend::s3::copy_remote`).
pub const OBJECT_MAC_HEX: usize = 64;

/// The MAC that ends a copy source's bytes, before them: HMAC-SHA256
/// keyed with the cluster key over "percore-object-v1\n", the hex request
/// MAC, "\n", then the bytes (the caller adds them).
#[must_use]
pub fn object_mac(key: &[u8; 32], request: &[u8; 32]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    m.update(format!("percore-object-v1\n{}\n", hex::encode(request)).as_bytes());
    m
}

fn reply_mac(key: &[u8; 32], request: &[u8; 32], status: u16, covered: &str) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    m.update(
        format!(
            "percore-reply-v1\n{}\n{status}\n{covered}",
            hex::encode(request)
        )
        .as_bytes(),
    );
    m.finalize().into_bytes().into()
}

/// The `x-percore-reply` value of an answer with `status` to the request
/// whose MAC was `request` (its claim's `mac`); `covered` as in the
/// module docs.
#[must_use]
pub fn sign_reply(key: &[u8; 32], request: &[u8; 32], status: u16, covered: &str) -> String {
    hex::encode(reply_mac(key, request, status, covered))
}

/// Checks the `x-percore-reply` value of an answer to the request this
/// node sent with `node_header`.
pub fn verify_reply(
    key: &[u8; 32],
    node_header: &str,
    status: u16,
    covered: &str,
    value: Option<&str>,
) -> io::Result<()> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the peer's answer ({status}) {why} (a node of another version, or someone on the network between the nodes)"),
        )
    };
    let request = request_mac(node_header).ok_or_else(|| bad("answers a malformed request"))?;
    let value = value.ok_or_else(|| bad("is not signed"))?;
    let tag = hex::decode(value.trim()).map_err(|_| bad("has a malformed signature"))?;
    let want = reply_mac(key, &request, status, covered);
    if tag.len() != want.len() || !bool::from(want.ct_eq(&tag[..])) {
        return Err(bad("has a signature that does not match"));
    }
    Ok(())
}

/// Whether an internal request's time is close enough to this node's
/// clock (tighter than a forwarded request's: its MAC must be remembered
/// that long).
#[must_use]
pub fn internal_time_ok(ms: u64) -> bool {
    now_ms().abs_diff(ms) <= INTERNAL_SKEW_MAX_MS
}

/// What `Replays::take` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    Fresh,
    /// Taken before: a replay.
    Seen,
    /// The table is full of MACs still within the window: retry later.
    Full,
}

/// The internal MACs a shard has taken within the clock window, in
/// arrival order: each is taken once, so a captured internal request
/// cannot be sent again (kept in memory only: a restart forgets them).
#[derive(Default)]
pub struct Replays {
    seen: std::collections::HashSet<[u8; 32]>,
    order: std::collections::VecDeque<(u64, [u8; 32])>,
}

impl Replays {
    pub fn take(&mut self, mac: [u8; 32]) -> Take {
        let now = now_ms();
        // A MAC stays valid until its time is a window past this clock:
        // at most twice the window after it arrived.
        while let Some(&(at, old)) = self.order.front() {
            if now.saturating_sub(at) <= 2 * INTERNAL_SKEW_MAX_MS {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&old);
        }
        if self.seen.contains(&mac) {
            return Take::Seen;
        }
        if self.seen.len() >= REPLAYS_MAX {
            return Take::Full;
        }
        self.seen.insert(mac);
        self.order.push_back((now, mac));
        Take::Fresh
    }
}

/// TCP keepalive on node-to-node connections: a connection on which
/// nothing came for this long while nothing it sent waits for an
/// acknowledgement (a request sent, its answer awaited) is probed every
/// `KEEPALIVE_INTERVAL_S`, and fails after `KEEPALIVE_PROBES` probes go
/// unanswered. A peer cut off while a request waits on it (its packets
/// dropped) so fails the request after about 11 s instead of the 60 s
/// `IO_TIMEOUT`; a network blip of a few seconds does not (each probe
/// lost needs a second lost after it), and a live peer's kernel answers
/// the probes however slow the peer process is. Data sent and not
/// acknowledged is not probed: the I/O timeouts bound that wait (on a
/// kept connection, `read_response_acked` checks the request was).
const KEEPALIVE_IDLE_S: libc::c_int = 5;
const KEEPALIVE_INTERVAL_S: libc::c_int = 2;
const KEEPALIVE_PROBES: libc::c_int = 3;
/// How long a request sent on a kept connection may go unacknowledged by
/// the peer's kernel (`read_response_acked`): a new connection would
/// have been given about that long to connect (room for one SYN sent
/// again).
pub const KEPT_ACK_TIMEOUT: Duration = Duration::from_millis(1200);

/// Turns on `fd`'s keepalive as above; an error is ignored (the I/O
/// timeouts still bound the wait).
fn keepalive(fd: std::os::fd::RawFd) {
    let set = |level: libc::c_int, opt: libc::c_int, v: libc::c_int| {
        // SAFETY: `v` is a live c_int and the length is its size; `fd`
        // is a socket this process owns.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                std::ptr::addr_of!(v).cast::<libc::c_void>(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES);
}

/// Idle connections a shard keeps per peer address (`pool_put`).
const POOL_PER_PEER: usize = 8;
/// How long an idle connection is kept: well under the peers' idle
/// timeout (60 s by default), so that a peer rarely closes one just as
/// it is reused (a request that finds it closed is sent again on a new
/// one: `pool_take`'s callers).
const POOL_IDLE_MAX: Duration = Duration::from_secs(4);

thread_local! {
    /// Per shard: idle connections to peers, newest last.
    static POOL: std::cell::RefCell<std::collections::HashMap<SocketAddr, Vec<(TcpStream, std::time::Instant)>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// An idle connection to `addr` this shard kept (`pool_put`), if one is
/// young enough. The peer may have closed it meanwhile: a request that
/// fails on it before its answer is sent again on a new connection.
#[must_use]
pub fn pool_take(addr: SocketAddr) -> Option<TcpStream> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.get_mut(&addr)?;
        idle.retain(|(_, at)| at.elapsed() < POOL_IDLE_MAX);
        let s = idle.pop().map(|(s, _)| s);
        if idle.is_empty() {
            p.remove(&addr);
        }
        s
    })
}

/// Keeps a connection whose last answer was read to its end for the next
/// request to `addr` (at most `POOL_PER_PEER` per peer: past that it is
/// closed). Connections idle too long are closed here, to every peer (a
/// node removed, or moved to another address, leaves none open).
pub fn pool_put(addr: SocketAddr, s: TcpStream) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        p.retain(|_, idle| {
            idle.retain(|(_, at)| at.elapsed() < POOL_IDLE_MAX);
            !idle.is_empty()
        });
        let idle = p.entry(addr).or_default();
        if idle.len() < POOL_PER_PEER {
            idle.push((s, std::time::Instant::now()));
        }
    });
}

/// Closes every connection kept to `addr`: one of them failed or was
/// refused (the peer restarted, or is stopping), so the others likely
/// would too.
pub fn pool_forget(addr: SocketAddr) {
    POOL.with(|p| p.borrow_mut().remove(&addr));
}

/// `read_response` of a request sent on a kept connection: fails
/// (`TimedOut`) if the peer's kernel has not acknowledged all of it within
/// `KEPT_ACK_TIMEOUT`. A kept connection to a peer cut off since (its
/// packets dropped) takes the request without a word, and would wait out
/// the I/O timeout; a new connection would have failed its connect. The
/// check runs beside the wait for the answer: nothing is added to a
/// request answered in time.
pub async fn read_response_acked(stream: TcpStream) -> io::Result<Response> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    // (`or` polls the read first and ends with it: `fd` is open while the
    // check runs.)
    futures_lite::future::or(read_response(stream), async {
        if acked_within(fd, KEPT_ACK_TIMEOUT).await {
            futures_lite::future::pending::<()>().await;
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer did not acknowledge the request on a kept connection (cut off?)",
        ))
    })
    .await
}

/// Whether the peer's kernel acknowledged every byte sent on `fd` within
/// `limit` (checked every 50 ms; a live peer acknowledges within a round
/// trip however busy its process is, a peer cut off never does).
async fn acked_within(fd: std::os::fd::RawFd, limit: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        let mut unacked: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ on a TCP socket) writes one c_int;
        // `fd` is a socket the caller keeps open while this runs.
        let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, std::ptr::addr_of_mut!(unacked)) };
        if r != 0 || unacked == 0 {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
}

/// A connection to a peer's S3 port, with deadlines and keepalive.
pub async fn open(addr: SocketAddr) -> io::Result<TcpStream> {
    open_within(addr, CONNECT_TIMEOUT).await
}

/// `open`, giving up on the connect after `connect_timeout`.
pub async fn open_within(addr: SocketAddr, connect_timeout: Duration) -> io::Result<TcpStream> {
    // Its kind kept (TimedOut: `frontend::s3::cluster` remembers those).
    let s = TcpStream::connect_timeout(addr, connect_timeout)
        .await
        .map_err(io::Error::from)?;
    let _ = s.set_nodelay(true);
    keepalive(std::os::fd::AsRawFd::as_raw_fd(&s));
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| io::Error::other(e.to_string()))?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(s)
}

/// A peer's response: its head, then its body from `read`.
pub struct Response {
    pub status: u16,
    /// (name lowercased, value).
    pub headers: Vec<(String, String)>,
    stream: TcpStream,
    /// Body bytes that came with the head.
    leftover: Vec<u8>,
    at: usize,
}

/// Reads a response head from `stream`.
pub async fn read_response(mut stream: TcpStream) -> io::Result<Response> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed before answering",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = resp.code.unwrap_or(502);
                let headers = resp
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                return Ok(Response {
                    status,
                    headers,
                    stream,
                    leftover: buf[len..].to_vec(),
                    at: 0,
                });
            }
            Ok(httparse::Status::Partial) if buf.len() < HEAD_BYTES_MAX => {}
            Ok(httparse::Status::Partial) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the peer's response head is too large",
                ))
            }
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the peer's response head is malformed: {e}"),
                ))
            }
        }
    }
}

impl Response {
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[must_use]
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.trim().parse().ok()
    }

    #[must_use]
    pub fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    /// The connection, once this answer was read to its end (what its
    /// head says was read, and nothing more came), if the peer keeps it
    /// open (`pool_put`).
    #[must_use]
    pub fn into_reusable(self) -> Option<TcpStream> {
        (!self.closes() && !self.is_chunked() && self.at >= self.leftover.len())
            .then_some(self.stream)
    }

    /// Whether the peer says it closes the connection after this answer.
    #[must_use]
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"))
    }

    /// Raw body bytes (still chunk-encoded if the peer chunked them);
    /// Ok(0) where the peer closed.
    pub async fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.at < self.leftover.len() {
            let n = out.len().min(self.leftover.len() - self.at);
            out[..n].copy_from_slice(&self.leftover[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.stream.read(out).await
    }

    /// The status and whole body of the answer to an internal request
    /// this node sent with `node_header` (`body`), a 2xx answer's
    /// signature checked over the body (`verify_reply`).
    pub async fn body_signed(
        self,
        key: &[u8; 32],
        node_header: &str,
        max: usize,
    ) -> io::Result<(u16, Vec<u8>)> {
        let (status, body, _) = self.body_signed_reusable(key, node_header, max).await?;
        Ok((status, body))
    }

    /// `body_signed`, with the connection back when it may carry another
    /// request (a signed 2xx answer framed by its length, read to its
    /// end, the peer not closing).
    pub async fn body_signed_reusable(
        mut self,
        key: &[u8; 32],
        node_header: &str,
        max: usize,
    ) -> io::Result<(u16, Vec<u8>, Option<TcpStream>)> {
        let status = self.status;
        let tag = self.header(REPLY_HEADER).map(str::to_string);
        let framed = self.content_length().is_some() && !self.is_chunked() && !self.closes();
        let body = self.body_of(max).await?;
        if (200..300).contains(&status) {
            verify_reply(key, node_header, status, &body_hash(&body), tag.as_deref())?;
        }
        let reusable = framed && (200..300).contains(&status) && self.at >= self.leftover.len();
        Ok((status, body, reusable.then_some(self.stream)))
    }

    /// The whole body of an internal answer (`Content-Length` framed, or
    /// up to the close), at most `max` bytes.
    pub async fn body(mut self, max: usize) -> io::Result<Vec<u8>> {
        self.body_of(max).await
    }

    async fn body_of(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let want = self.content_length();
        let mut out = Vec::new();
        // A small answer (a copy's acknowledgement) zeroes its own size.
        let room = want.map_or(64 * 1024, |w| {
            usize::try_from(w).unwrap_or(usize::MAX).clamp(1, 64 * 1024)
        });
        let mut buf = vec![0u8; room];
        loop {
            if want.is_some_and(|w| out.len() as u64 >= w) {
                break;
            }
            let n = self.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if out.len() > max {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the peer's answer is too large",
                ));
            }
        }
        if let Some(w) = want {
            if out.len() as u64 != w {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer's answer was cut short",
                ));
            }
        }
        Ok(out)
    }
}

/// One internal request with a small body; its status and body (a 2xx
/// answer's signature checked: `verify_reply`).
pub async fn call(
    key: &[u8; 32],
    addr: SocketAddr,
    method: &str,
    target: &str,
    node_header: &str,
    body: &[u8],
    answer_max: usize,
) -> io::Result<(u16, Vec<u8>)> {
    let mut s = open(addr).await?;
    let head = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n{HEADER}: {node_header}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    s.flush().await?;
    let r = read_response(s).await?;
    r.body_signed(key, node_header, answer_max).await
}

/// Sends a GET without a body to `addr` with `node_header` on a new
/// connection (closed after the answer), and reads the answer's head:
/// its body is read from the response as it comes.
pub async fn get(addr: SocketAddr, target: &str, node_header: &str) -> io::Result<Response> {
    let mut s = open(addr).await?;
    let head = format!(
        "GET {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n{HEADER}: {node_header}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await?;
    s.flush().await?;
    read_response(s).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed<'a>(to: u32, method: &'a str, target: &'a str, body: &'a str) -> Signed<'a> {
        Signed {
            from: 7,
            to,
            method,
            target,
            body,
            relay: None,
        }
    }

    #[test]
    fn a_signed_header_verifies_once_for_its_own_request() {
        let key = cluster_key("s3cret");
        let h = body_hash(b"");
        let v = sign(&key, &signed(2, "GET", "/_percore/list?bucket=b", &h));
        let c = verify(&key, &v, 2, "GET", "/_percore/list?bucket=b", None).unwrap();
        assert_eq!((c.from, c.body.as_str()), (7, h.as_str()));
        // Another key, receiver, method, target or body hash: refused.
        assert!(verify(
            &cluster_key("other"),
            &v,
            2,
            "GET",
            "/_percore/list?bucket=b",
            None
        )
        .is_err());
        assert!(verify(&key, &v, 3, "GET", "/_percore/list?bucket=b", None).is_err());
        assert!(verify(&key, &v, 2, "PUT", "/_percore/list?bucket=b", None).is_err());
        assert!(verify(&key, &v, 2, "GET", "/_percore/list?bucket=c", None).is_err());
        let forged = v.replace(&h, &body_hash(b"[]"));
        assert!(verify(&key, &forged, 2, "GET", "/_percore/list?bucket=b", None).is_err());
        // The root secret itself is not the key.
        let raw: [u8; 32] = {
            let mut k = [0u8; 32];
            k[..6].copy_from_slice(b"s3cret");
            k
        };
        assert!(verify(&raw, &v, 2, "GET", "/_percore/list?bucket=b", None).is_err());
        // Garbage and stale values.
        for bad in [
            "",
            "v2",
            "v1 1 2 3 0123456789abcdef - aa",
            "v2 x 2 1 0123456789abcdef - aa",
            "v2 1 2 1 0123456789abcdef - zz",
            "v2 1 2 1 nonce - aa",
            "v2 1 2 1 0123456789abcdef - aa extra",
        ] {
            assert!(verify(&key, bad, 2, "GET", "/", None).is_err(), "{bad}");
        }
        let old = now_ms() - SKEW_MAX_MS - 1000;
        let s = signed(2, "GET", "/", "-");
        let tag = hex::encode(mac(&key, &s, old, "0123456789abcdef"));
        let stale = format!("v2 7 2 {old} 0123456789abcdef - {tag}");
        assert!(verify(&key, &stale, 2, "GET", "/", None).is_err());
        // Each MAC is taken once.
        let mut seen = Replays::default();
        assert_eq!(seen.take(c.mac), Take::Fresh);
        assert_eq!(seen.take(c.mac), Take::Seen);
        let again = verify(
            &key,
            &sign(&key, &signed(2, "GET", "/x", "-")),
            2,
            "GET",
            "/x",
            None,
        )
        .unwrap();
        assert_eq!(seen.take(again.mac), Take::Fresh);
        assert!(internal_time_ok(again.ms));
        assert!(!internal_time_ok(again.ms - INTERNAL_SKEW_MAX_MS - 1000));
    }

    #[test]
    fn the_relay_header_is_covered_by_the_node_mac() {
        let key = cluster_key("s3cret");
        let plain = sign(&key, &signed(2, "GET", "/b/k", "-"));
        let relayed = sign(
            &key,
            &Signed {
                relay: Some(3),
                ..signed(2, "GET", "/b/k", "-")
            },
        );
        let c = verify(&key, &relayed, 2, "GET", "/b/k", Some("3")).unwrap();
        assert_eq!(c.relay, Some(3));
        assert_eq!(
            verify(&key, &plain, 2, "GET", "/b/k", None).unwrap().relay,
            None
        );
        // The header added to a forward signed without it, dropped from a
        // relayed one, or naming another owner: refused.
        assert!(verify(&key, &plain, 2, "GET", "/b/k", Some("3")).is_err());
        assert!(verify(&key, &relayed, 2, "GET", "/b/k", None).is_err());
        assert!(verify(&key, &relayed, 2, "GET", "/b/k", Some("4")).is_err());
        assert!(verify(&key, &relayed, 2, "GET", "/b/k", Some("x")).is_err());
    }

    #[test]
    fn a_signed_reply_fits_its_own_request_status_and_body_only() {
        let key = cluster_key("s3cret");
        let h = body_hash(b"{}");
        let req = sign(&key, &signed(2, "POST", "/_percore/release", &h));
        let claim = verify(&key, &req, 2, "POST", "/_percore/release", None).unwrap();
        let body = body_hash(br#"{"released":5}"#);
        let tag = sign_reply(&key, &claim.mac, 200, &body);
        verify_reply(&key, &req, 200, &body, Some(&tag)).unwrap();
        // Unsigned, another status, body, key or request: refused.
        assert!(verify_reply(&key, &req, 200, &body, None).is_err());
        assert!(verify_reply(&key, &req, 201, &body, Some(&tag)).is_err());
        assert!(verify_reply(&key, &req, 200, &body_hash(b"{}"), Some(&tag)).is_err());
        assert!(verify_reply(&cluster_key("other"), &req, 200, &body, Some(&tag)).is_err());
        let other = sign(&key, &signed(2, "POST", "/_percore/release", &h));
        assert!(verify_reply(&key, &other, 200, &body, Some(&tag)).is_err());
        assert!(verify_reply(&key, &req, 200, &body, Some("zz")).is_err());
    }

    /// A fake peer on a std thread: answers each request of each
    /// connection with what `answer` makes of the request's node header,
    /// until `connections` connections were served.
    fn fake_peer(
        connections: usize,
        answer: impl Fn(&str) -> String + Send + 'static,
    ) -> (SocketAddr, std::thread::JoinHandle<usize>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut requests = 0;
            for _ in 0..connections {
                let (s, _) = listener.accept().unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                loop {
                    let (mut header, mut length, mut line) = (String::new(), 0usize, String::new());
                    let mut any = false;
                    while r.read_line(&mut line).unwrap_or(0) > 0 {
                        any = true;
                        let l = line.trim_end().to_string();
                        line.clear();
                        if l.is_empty() {
                            break;
                        }
                        let (n, v) = l.split_once(": ").unwrap_or((&l, ""));
                        match n.to_ascii_lowercase().as_str() {
                            HEADER => header = v.to_string(),
                            "content-length" => length = v.parse().unwrap(),
                            _ => {}
                        }
                    }
                    if !any {
                        break;
                    }
                    let mut body = vec![0u8; length];
                    std::io::Read::read_exact(&mut r, &mut body).unwrap();
                    requests += 1;
                    w.write_all(answer(&header).as_bytes()).unwrap();
                }
            }
            requests
        });
        (addr, t)
    }

    fn answer_200(body: &str, reply: Option<String>, close: bool) -> String {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{}{}\r\n{body}",
            body.len(),
            reply.map_or(String::new(), |r| format!("{REPLY_HEADER}: {r}\r\n")),
            if close { "connection: close\r\n" } else { "" },
        )
    }

    #[test]
    fn a_requester_refuses_an_answer_not_signed_for_its_request() {
        let key = cluster_key("s3cret");
        let body = r#"{"released":5}"#;
        let right = move |h: &str| {
            let mac = request_mac(h).unwrap();
            answer_200(
                body,
                Some(sign_reply(&key, &mac, 200, &body_hash(body.as_bytes()))),
                true,
            )
        };
        let unsigned = |_: &str| answer_200(body, None, true);
        let other_key = move |h: &str| {
            let mac = request_mac(h).unwrap();
            let k = cluster_key("other");
            answer_200(
                body,
                Some(sign_reply(&k, &mac, 200, &body_hash(body.as_bytes()))),
                true,
            )
        };
        let other_body = move |h: &str| {
            let mac = request_mac(h).unwrap();
            answer_200(
                body,
                Some(sign_reply(&key, &mac, 200, &body_hash(b"{}"))),
                true,
            )
        };
        // An answer signed for another request (replayed): fixed MAC.
        let replayed = {
            let req = sign(
                &key,
                &signed(2, "POST", "/_percore/release", &body_hash(b"{}")),
            );
            let mac = request_mac(&req).unwrap();
            move |_: &str| {
                answer_200(
                    body,
                    Some(sign_reply(&key, &mac, 200, &body_hash(body.as_bytes()))),
                    true,
                )
            }
        };
        type Answer = Box<dyn Fn(&str) -> String + Send>;
        let cases: Vec<(&str, Answer, bool)> = vec![
            ("signed", Box::new(right), true),
            ("unsigned", Box::new(unsigned), false),
            ("another key", Box::new(other_key), false),
            ("another body", Box::new(other_body), false),
            ("another request", Box::new(replayed), false),
        ];
        for (name, answer, ok) in cases {
            let (addr, peer) = fake_peer(1, answer);
            let got = glommio::LocalExecutor::default().run(async move {
                let h = sign(
                    &key,
                    &signed(2, "POST", "/_percore/release", &body_hash(b"{}")),
                );
                call(&key, addr, "POST", "/_percore/release", &h, b"{}", 4096).await
            });
            peer.join().unwrap();
            match got {
                Ok((200, b)) if ok => assert_eq!(b, body.as_bytes()),
                Err(e) if !ok => assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{name}: {e}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_signed_answer_framed_by_its_length_leaves_the_connection_for_the_next() {
        let key = cluster_key("s3cret");
        let body = r#"{"applied":true}"#;
        // Two requests on one connection; then one answered with close.
        let (addr, peer) = fake_peer(2, move |h: &str| {
            let mac = request_mac(h).unwrap();
            let close = h.contains(" 9 ");
            answer_200(
                body,
                Some(sign_reply(&key, &mac, 200, &body_hash(body.as_bytes()))),
                close,
            )
        });
        let kept = glommio::LocalExecutor::default().run(async move {
            let mut s = open(addr).await.unwrap();
            let mut kept = Vec::new();
            for to in [2, 2, 9] {
                let h = sign(&key, &signed(to, "PUT", "/_percore/push", "-"));
                let head = format!(
                    "PUT /_percore/push HTTP/1.1\r\ncontent-length: 0\r\n{HEADER}: {h}\r\n\r\n"
                );
                s.write_all(head.as_bytes()).await.unwrap();
                s.flush().await.unwrap();
                let r = read_response(s).await.unwrap();
                let (status, got, back) = r.body_signed_reusable(&key, &h, 4096).await.unwrap();
                assert_eq!((status, got.as_slice()), (200, body.as_bytes()));
                kept.push(back.is_some());
                match back {
                    Some(b) => s = b,
                    None => {
                        // The peer closes this one: the pool is for
                        // connections that stay open only.
                        pool_put(addr, open(addr).await.unwrap());
                        assert!(pool_take(addr).is_some());
                        assert!(pool_take(addr).is_none());
                        break;
                    }
                }
            }
            kept
        });
        assert_eq!(kept, vec![true, true, false]);
        assert_eq!(peer.join().unwrap(), 3);
    }
}
