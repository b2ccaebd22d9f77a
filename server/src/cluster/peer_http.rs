//! Node-to-node HTTP on the S3 port (glommio, on the shard that needs it):
//! S3 requests forwarded to the node that owns their key, bucket changes
//! fanned out to every node, and the internal listing each node answers
//! for its own data. One connection per request (`Connection: close`), so
//! a response ends where the peer closes.
//!
//! Every such request carries `x-percore-node`, a MAC with the cluster's
//! shared secret (the nodes' root secret key) over the time, the method,
//! the request target and the principal it acts for:
//!
//! ```text
//! x-percore-node: v1 <node id> <unix ms> <hex HMAC-SHA256> <principal>
//! mac = HMAC-SHA256(secret, "percore-node-v1\n" node "\n" ms "\n" method "\n" target "\n" principal)
//! ```
//!
//! A forwarded S3 request keeps the client's own signature, which the
//! owner checks again; the MAC only tells it that another node sent it
//! there (serve it here, do not forward it again). Internal requests
//! (`/_percore/...`) carry no client signature: the MAC is their
//! authentication, and the principal the one the sending node checked.

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
/// How far a node's clock may be from the sender's.
const SKEW_MAX_MS: u64 = 5 * 60 * 1000;
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a peer's next bytes.
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest response head from a peer.
const HEAD_BYTES_MAX: usize = 64 * 1024;
const HEADERS_MAX: usize = 128;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn mac(secret: &str, node: u32, ms: u64, method: &str, target: &str, principal: &str) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    m.update(format!("percore-node-v1\n{node}\n{ms}\n{method}\n{target}\n{principal}").as_bytes());
    m.finalize().into_bytes().into()
}

/// The `x-percore-node` value for a request from `node`.
#[must_use]
pub fn sign(secret: &str, node: u32, method: &str, target: &str, principal: &str) -> String {
    let ms = now_ms();
    let tag = hex::encode(mac(secret, node, ms, method, target, principal));
    format!("v1 {node} {ms} {tag} {principal}")
}

/// What a valid `x-percore-node` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub node: u32,
    pub principal: String,
}

/// Checks an `x-percore-node` value for `method` and `target`.
pub fn verify(secret: &str, value: &str, method: &str, target: &str) -> Result<Claim, String> {
    let mut parts = value.splitn(5, ' ');
    let (Some("v1"), Some(node), Some(ms), Some(tag), Some(principal)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err("malformed node header".into());
    };
    let node: u32 = node.parse().map_err(|_| "malformed node id")?;
    let ms: u64 = ms.parse().map_err(|_| "malformed node time")?;
    if now_ms().abs_diff(ms) > SKEW_MAX_MS {
        return Err("node header too old (or the clocks are apart)".into());
    }
    let tag = hex::decode(tag).map_err(|_| "malformed node MAC")?;
    let want = mac(secret, node, ms, method, target, principal);
    if tag.len() != want.len() || !bool::from(want.ct_eq(&tag[..])) {
        return Err("node MAC does not match (do the nodes share one secret key?)".into());
    }
    Ok(Claim {
        node,
        principal: principal.to_string(),
    })
}

/// A connection to a peer's S3 port, with deadlines.
pub async fn open(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(addr, CONNECT_TIMEOUT)
        .await
        .map_err(|e| io::Error::other(e.to_string()))?;
    let _ = s.set_nodelay(true);
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

    /// The whole body of an internal answer (`Content-Length` framed, or
    /// up to the close), at most `max` bytes.
    pub async fn body(mut self, max: usize) -> io::Result<Vec<u8>> {
        let want = self.content_length();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
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

/// One internal request with a small body; its status and body.
pub async fn call(
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
    let status = r.status;
    Ok((status, r.body(answer_max).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_header_verifies_once_for_its_own_request() {
        let v = sign("s3cret", 7, "GET", "/_percore/list?bucket=b", "root");
        let c = verify("s3cret", &v, "GET", "/_percore/list?bucket=b").unwrap();
        assert_eq!(
            c,
            Claim {
                node: 7,
                principal: "root".into()
            }
        );
        // Another secret, method, target or principal: refused.
        assert!(verify("other", &v, "GET", "/_percore/list?bucket=b").is_err());
        assert!(verify("s3cret", &v, "PUT", "/_percore/list?bucket=b").is_err());
        assert!(verify("s3cret", &v, "GET", "/_percore/list?bucket=c").is_err());
        let forged = v.replace(" root", " user:alice");
        assert!(verify("s3cret", &forged, "GET", "/_percore/list?bucket=b").is_err());
        // Garbage and stale values.
        for bad in [
            "",
            "v1",
            "v2 1 2 3 root",
            "v1 x 1 aa root",
            "v1 1 1 zz root",
        ] {
            assert!(verify("s3cret", bad, "GET", "/").is_err(), "{bad}");
        }
        let ms = now_ms() - SKEW_MAX_MS - 1000;
        let tag = hex::encode(mac("s3cret", 7, ms, "GET", "/", "root"));
        assert!(verify("s3cret", &format!("v1 7 {ms} {tag} root"), "GET", "/").is_err());
        // Principals may hold spaces.
        let v = sign("s3cret", 1, "PUT", "/x", "user:a b");
        assert_eq!(
            verify("s3cret", &v, "PUT", "/x").unwrap().principal,
            "user:a b"
        );
    }
}
