//! A small, blocking etcd v3 client over etcd's JSON gateway (`/v3/...`,
//! keys and values base64), for the control thread and the `percore
//! cluster` commands. No object byte goes through etcd, and nothing here
//! runs on a shard: a request blocks only the thread that makes it.
//!
//! Every call tries the endpoints in turn, starting from the one that
//! answered last, so one etcd member down costs one connection attempt.
//! Responses are bounded (`RESPONSE_BYTES_MAX`) and every socket operation
//! has a timeout.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

/// Largest response read from etcd (a range of every node of a large
/// cluster is well under this).
const RESPONSE_BYTES_MAX: usize = 64 << 20;

/// One key of a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub lease: i64,
}

pub struct Etcd {
    /// host:port of each member.
    endpoints: Vec<String>,
    timeout: Duration,
    /// The endpoint that answered last.
    current: std::cell::Cell<usize>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// etcd's int64s come as JSON strings (absent when zero).
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of the range of keys that start with `prefix`.
#[must_use]
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// Transaction compares and operations, as the JSON gateway takes them.
pub mod txn {
    use super::{b64, json, Value};

    /// The key does not exist.
    #[must_use]
    pub fn absent(key: &[u8]) -> Value {
        json!({"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"})
    }

    /// The key exists.
    #[must_use]
    pub fn present(key: &[u8]) -> Value {
        json!({"key": b64(key), "target": "CREATE", "result": "GREATER", "create_revision": "0"})
    }

    /// The key holds `value`.
    #[must_use]
    pub fn value_is(key: &[u8], value: &[u8]) -> Value {
        json!({"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)})
    }

    /// The key was last modified at `revision` (0: does not exist).
    #[must_use]
    pub fn unchanged(key: &[u8], revision: i64) -> Value {
        json!({"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": revision.to_string()})
    }

    #[must_use]
    pub fn put(key: &[u8], value: &[u8]) -> Value {
        json!({"request_put": {"key": b64(key), "value": b64(value)}})
    }

    /// A put attached to a lease.
    #[must_use]
    pub fn put_leased(key: &[u8], value: &[u8], lease: i64) -> Value {
        json!({"request_put": {"key": b64(key), "value": b64(value), "lease": lease.to_string()}})
    }

    #[must_use]
    pub fn delete(key: &[u8]) -> Value {
        json!({"request_delete_range": {"key": b64(key)}})
    }

    /// Every key that starts with `prefix`.
    #[must_use]
    pub fn delete_prefix(prefix: &[u8]) -> Value {
        delete_range(prefix, &super::prefix_end(prefix))
    }

    /// Every key in `[key, range_end)` (etcd refuses a transaction whose
    /// puts and deletes overlap).
    #[must_use]
    pub fn delete_range(key: &[u8], range_end: &[u8]) -> Value {
        json!({"request_delete_range": {"key": b64(key), "range_end": b64(range_end)}})
    }
}

impl Etcd {
    /// `urls`: comma-separated `http://host:port` (or `host:port`).
    pub fn new(urls: &str) -> Result<Etcd, String> {
        Self::with_timeout(urls, Duration::from_secs(5))
    }

    /// `new`, with `timeout` for each connect, read and write (and a whole
    /// call to one endpoint takes at most about twice that).
    pub fn with_timeout(urls: &str, timeout: Duration) -> Result<Etcd, String> {
        let endpoints: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                if u.starts_with("https://") {
                    return Err(format!(
                        "{u}: TLS to etcd is not supported yet; use http:// on a private network"
                    ));
                }
                let hostport = u.trim_start_matches("http://").trim_end_matches('/');
                if hostport.contains('/') || !hostport.contains(':') {
                    return Err(format!("{u}: give etcd endpoints as http://HOST:PORT"));
                }
                Ok(hostport.to_string())
            })
            .collect::<Result<_, _>>()?;
        if endpoints.is_empty() {
            return Err("no etcd endpoint given (--cluster http://HOST:PORT,...)".into());
        }
        Ok(Etcd {
            endpoints,
            timeout,
            current: std::cell::Cell::new(0),
        })
    }

    /// POSTs `body` to `path` on the first endpoint that answers.
    fn call(&self, path: &str, body: &Value) -> Result<Value, String> {
        let body = body.to_string();
        let n = self.endpoints.len();
        let mut errors = Vec::new();
        for i in 0..n {
            let at = (self.current.get() + i) % n;
            match self.call_one(&self.endpoints[at], path, &body) {
                Ok(v) => {
                    self.current.set(at);
                    return Ok(v);
                }
                Err(Failure::Endpoint(e)) => errors.push(format!("{}: {e}", self.endpoints[at])),
                Err(Failure::Request(e)) => return Err(e),
            }
        }
        Err(format!(
            "no etcd endpoint answered ({}); is etcd running, and is --cluster (PERCORE_CLUSTER) right?",
            errors.join("; ")
        ))
    }

    fn call_one(&self, endpoint: &str, path: &str, body: &str) -> Result<Value, Failure> {
        let addr = endpoint
            .to_socket_addrs()
            .map_err(|e| Failure::Endpoint(e.to_string()))?
            .next()
            .ok_or_else(|| Failure::Endpoint("no address".into()))?;
        let mut s = TcpStream::connect_timeout(&addr, self.timeout)
            .map_err(|e| Failure::Endpoint(e.to_string()))?;
        let io = |e: std::io::Error| Failure::Endpoint(e.to_string());
        s.set_read_timeout(Some(self.timeout)).map_err(io)?;
        s.set_write_timeout(Some(self.timeout)).map_err(io)?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).map_err(io)?;
        let raw = read_response(&mut s, self.timeout).map_err(Failure::Endpoint)?;
        let (status, chunked, body) = split_response(&raw).map_err(Failure::Endpoint)?;
        let body = if chunked {
            dechunk(body).map_err(Failure::Endpoint)?
        } else {
            body.to_vec()
        };
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| Failure::Endpoint(format!("not JSON ({e})")))?;
        if status == 200 {
            return Ok(v);
        }
        let message = v
            .get("message")
            .or_else(|| v.get("error"))
            .and_then(Value::as_str)
            .unwrap_or("error")
            .to_string();
        // Not the leader, no quorum, unavailable: another member may do.
        if status >= 500 {
            return Err(Failure::Endpoint(format!("HTTP {status}: {message}")));
        }
        Err(Failure::Request(format!(
            "etcd refused {path}: HTTP {status}: {message}"
        )))
    }

    /// Keys in `[key, range_end)` (just `key` when None), and the store's
    /// revision.
    pub fn range(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<(Vec<Kv>, i64), String> {
        let mut body = json!({"key": b64(key)});
        if let Some(end) = range_end {
            body["range_end"] = json!(b64(end));
        }
        let v = self.call("/v3/kv/range", &body)?;
        let kvs = kvs_of(&v);
        Ok((kvs, int(&v["header"]["revision"])))
    }

    /// One page of keys in `[key, range_end)`, in key order: at most
    /// `limit`, as of `revision` (0: now), without their values if
    /// `keys_only`. The store's revision, and whether more keys follow.
    pub fn range_page(
        &self,
        (key, range_end): (&[u8], &[u8]),
        limit: usize,
        revision: i64,
        keys_only: bool,
    ) -> Result<(Vec<Kv>, i64, bool), String> {
        let mut body =
            json!({"key": b64(key), "range_end": b64(range_end), "limit": limit.to_string()});
        if revision > 0 {
            body["revision"] = json!(revision.to_string());
        }
        if keys_only {
            body["keys_only"] = json!(true);
        }
        let v = self.call("/v3/kv/range", &body)?;
        let kvs = kvs_of(&v);
        let more = v.get("more").and_then(Value::as_bool).unwrap_or(false);
        Ok((kvs, int(&v["header"]["revision"]), more))
    }

    /// The store's revision now (a linearizable read of nothing: a count
    /// of `key`). Any write to etcd since a read at revision `r` makes it
    /// larger than `r`.
    pub fn revision(&self, key: &[u8]) -> Result<i64, String> {
        let v = self.call(
            "/v3/kv/range",
            &json!({"key": b64(key), "count_only": true}),
        )?;
        match int(&v["header"]["revision"]) {
            0 => Err("etcd answered no revision".into()),
            r => Ok(r),
        }
    }

    /// One key, if it exists.
    pub fn get(&self, key: &[u8]) -> Result<Option<Kv>, String> {
        Ok(self.range(key, None)?.0.into_iter().next())
    }

    /// Puts `key`, attached to `lease` if not 0.
    pub fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<(), String> {
        let mut body = json!({"key": b64(key), "value": b64(value)});
        if lease != 0 {
            body["lease"] = json!(lease.to_string());
        }
        self.call("/v3/kv/put", &body).map(|_| ())
    }

    /// Runs `success` if every compare holds, else `failure`; whether the
    /// compares held.
    pub fn txn(
        &self,
        compare: Vec<Value>,
        success: Vec<Value>,
        failure: Vec<Value>,
    ) -> Result<bool, String> {
        let v = self.call(
            "/v3/kv/txn",
            &json!({"compare": compare, "success": success, "failure": failure}),
        )?;
        Ok(v.get("succeeded").and_then(Value::as_bool).unwrap_or(false))
    }

    /// `txn`, with the store's revision after it (the revision of its
    /// writes when the compares held).
    pub fn txn_rev(
        &self,
        compare: Vec<Value>,
        success: Vec<Value>,
        failure: Vec<Value>,
    ) -> Result<(bool, i64), String> {
        let v = self.call(
            "/v3/kv/txn",
            &json!({"compare": compare, "success": success, "failure": failure}),
        )?;
        Ok((
            v.get("succeeded").and_then(Value::as_bool).unwrap_or(false),
            int(&v["header"]["revision"]),
        ))
    }

    /// A lease of `ttl_s` seconds; its id.
    pub fn lease_grant(&self, ttl_s: i64) -> Result<i64, String> {
        let v = self.call("/v3/lease/grant", &json!({"TTL": ttl_s.to_string()}))?;
        match int(&v["ID"]) {
            0 => Err(format!("etcd granted no lease: {v}")),
            id => Ok(id),
        }
    }

    /// Renews a lease; its remaining TTL (0: it had expired).
    pub fn lease_keepalive(&self, id: i64) -> Result<i64, String> {
        let v = self.call("/v3/lease/keepalive", &json!({"ID": id.to_string()}))?;
        match v.get("result") {
            Some(r) => Ok(int(&r["TTL"])),
            None => Err(format!("etcd answered a keepalive without a result: {v}")),
        }
    }

    pub fn lease_revoke(&self, id: i64) -> Result<(), String> {
        self.call("/v3/lease/revoke", &json!({"ID": id.to_string()}))
            .map(|_| ())
    }
}

/// The keys of a range answer.
fn kvs_of(v: &Value) -> Vec<Kv> {
    v.get("kvs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|kv| Kv {
                    key: unb64(&kv["key"]),
                    value: unb64(&kv["value"]),
                    mod_revision: int(&kv["mod_revision"]),
                    lease: int(&kv["lease"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

enum Failure {
    /// This endpoint did not answer usefully: try another.
    Endpoint(String),
    /// etcd answered and refused: another member would too.
    Request(String),
}

/// Reads one response: up to its Content-Length, or to the end of the
/// connection (we ask for `Connection: close`); at most
/// `RESPONSE_BYTES_MAX`, and in at most about twice `timeout` in all (a
/// server that dribbles bytes does not hold the thread).
fn read_response(s: &mut TcpStream, timeout: Duration) -> Result<Vec<u8>, String> {
    let deadline = std::time::Instant::now() + timeout * 2;
    let mut raw = Vec::with_capacity(4096);
    let mut buf = [0u8; 16 * 1024];
    loop {
        if std::time::Instant::now() > deadline {
            return Err("response too slow".into());
        }
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            // A signal (the process blocks its signals on the main thread
            // only once the shards start): read again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        };
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > RESPONSE_BYTES_MAX {
            return Err("response too large".into());
        }
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let length = head.lines().find_map(|l| {
                l.strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            if length.is_some_and(|len| raw.len() >= end + 4 + len) {
                raw.truncate(end + 4 + length.unwrap_or(0));
                return Ok(raw);
            }
        }
    }
}

/// (status, chunked, body) of a raw HTTP/1.1 response.
fn split_response(raw: &[u8]) -> Result<(u16, bool, &[u8]), String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("truncated HTTP response")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "HTTP head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("bad HTTP status line")?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(n, v)| {
            n.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    Ok((status, chunked, &raw[end + 4..]))
}

/// The body of a chunked transfer encoding.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk")?;
        let size = std::str::from_utf8(&body[..line_end])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
            .ok_or("bad chunk size")?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size.saturating_add(2) {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn responses() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        let (status, chunked, body) = split_response(raw).unwrap();
        assert_eq!((status, chunked), (200, true));
        assert_eq!(dechunk(body).unwrap(), b"{\"a\":1}");
        assert!(dechunk(b"5\r\nab").is_err());
        assert!(split_response(b"HTTP/1.1 200").is_err());
        assert!(Etcd::new("").is_err());
        assert!(Etcd::new("https://x:1").is_err());
        assert!(Etcd::new("http://127.0.0.1:2379,127.0.0.2:2379").is_ok());
    }
}
