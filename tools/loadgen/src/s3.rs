//! A minimal S3 client for load generation: HTTP/1.1 keep-alive over tokio,
//! SigV4 header signing with UNSIGNED-PAYLOAD. Independent of the server's
//! code, so a benchmark cannot share a bug with what it measures.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
}

fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = HmacSha256::new_from_slice(key).expect("any key length");
    m.update(msg);
    m.finalize().into_bytes().to_vec()
}

/// (days since 1970-01-01) -> (year, month, day), proleptic Gregorian.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn amz_date() -> String {
    let s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (y, m, d) = civil(s.div_euclid(86_400));
    let t = s.rem_euclid(86_400);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// SigV4 headers (UNSIGNED-PAYLOAD) for a request, ending in CRLF. `path`
/// must be URI-encoded and `query` canonical (sorted, encoded).
pub fn sign(t: &Target, method: &str, path: &str, query: &str) -> String {
    let date = amz_date();
    let host = t.addr.to_string();
    let canonical = format!(
        "{method}\n{path}\n{query}\nhost:{host}\nx-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:{date}\n\nhost;x-amz-content-sha256;x-amz-date\nUNSIGNED-PAYLOAD"
    );
    let scope = format!("{}/{}/s3/aws4_request", &date[..8], t.region);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut k = hmac(
        format!("AWS4{}", t.secret_key).as_bytes(),
        &date.as_bytes()[..8],
    );
    for part in [t.region.as_str(), "s3", "aws4_request"] {
        k = hmac(&k, part.as_bytes());
    }
    let signature = hex::encode(hmac(&k, to_sign.as_bytes()));
    format!(
        "Host: {host}\r\nx-amz-date: {date}\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\nAuthorization: AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}\r\n",
        t.access_key
    )
}

/// One response: status, body, and the time from sending to the end of the
/// response head (time to first byte).
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    pub ttfb: Duration,
}

pub struct Conn {
    t: Target,
    rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
    wr: tokio::net::tcp::OwnedWriteHalf,
}

impl Conn {
    pub async fn open(t: &Target) -> std::io::Result<Conn> {
        let s = TcpStream::connect(t.addr).await?;
        s.set_nodelay(true)?;
        let (rd, wr) = s.into_split();
        Ok(Conn {
            t: t.clone(),
            rd: BufReader::with_capacity(256 * 1024, rd),
            wr,
        })
    }

    /// Sends a request and reads the whole response (Content-Length bodies;
    /// HEAD responses have none).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        query: &str,
        extra: &str,
        body: &[u8],
    ) -> std::io::Result<Response> {
        let auth = sign(&self.t, method, path, query);
        let target = if query.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{query}")
        };
        let head = format!(
            "{method} {target} HTTP/1.1\r\n{auth}{extra}Content-Length: {}\r\n\r\n",
            body.len()
        );
        let started = Instant::now();
        if body.len() <= 64 * 1024 {
            let mut all = head.into_bytes();
            all.extend_from_slice(body);
            self.wr.write_all(&all).await?;
        } else {
            self.wr.write_all(head.as_bytes()).await?;
            self.wr.write_all(body).await?;
        }
        let mut line = String::new();
        self.rd.read_line(&mut line).await?;
        let ttfb = started.elapsed();
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bad status line {line:?}"),
                )
            })?;
        let mut length = 0usize;
        loop {
            line.clear();
            if self.rd.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if line == "\r\n" {
                break;
            }
            if let Some((n, v)) = line.split_once(':') {
                if n.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        if method == "HEAD" {
            length = 0;
        }
        let mut out = vec![0u8; length];
        self.rd.read_exact(&mut out).await?;
        Ok(Response {
            status,
            body: out,
            ttfb,
        })
    }
}

/// Percent-encodes a key for a path (unreserved and '/' kept).
pub fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
