//! `percore-bench s3-list`: loads N empty objects through the S3 endpoint
//! (SigV4-signed PUTs over keep-alive connections, from plain threads), then
//! lists them all with ListObjectsV2 pages of 1000 and reports pages/s and
//! the time to list everything. A minimal HTTP/1.1 client: enough for a
//! benchmark, and independent of the server's code.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use percore_loadgen::s3::Target;
use percore_loadgen::{cpu_seconds, s3::sign};

/// Credentials from PERCORE_ACCESS_KEY / PERCORE_SECRET_KEY, else the
/// server's built-in defaults.
pub fn target_from_env(addr: SocketAddr) -> Target {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    Target {
        addr,
        access_key: var("PERCORE_ACCESS_KEY", "percore"),
        secret_key: var("PERCORE_SECRET_KEY", "percore-secret"),
        region: "us-east-1".into(),
    }
}

struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect to the S3 endpoint");
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Conn {
            reader: BufReader::new(s),
        }
    }

    /// Sends a request, returns (status, body).
    fn request(
        &mut self,
        t: &Target,
        method: &str,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let auth = sign(t, method, path, query);
        let target = if query.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{query}")
        };
        let head = format!(
            "{method} {target} HTTP/1.1\r\n{auth}Content-Length: {}\r\n\r\n",
            body.len()
        );
        let s = self.reader.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((n, v)) = line.split_once(':') {
                if n.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap();
                }
            }
        }
        let mut out = vec![0u8; length];
        self.reader.read_exact(&mut out).unwrap();
        (status, out)
    }
}

fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let a = s.find(open)? + open.len();
    let b = s[a..].find(close)? + a;
    Some(&s[a..b])
}

pub fn run(t: Target, bucket: &str, keys: usize, concurrency: usize, load: bool, runs: usize) {
    let t = Arc::new(t);
    if load {
        let mut c = Conn::open(t.addr);
        let (status, body) = c.request(&t, "PUT", &format!("/{bucket}"), "", b"");
        assert!(
            status == 200 || status == 409,
            "create bucket: {status} {}",
            String::from_utf8_lossy(&body)
        );
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let threads: Vec<_> = (0..concurrency)
            .map(|_| {
                let (t, next, bucket) = (t.clone(), next.clone(), bucket.to_string());
                std::thread::spawn(move || {
                    let mut c = Conn::open(t.addr);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= keys {
                            return;
                        }
                        let path = format!("/{bucket}/obj/{:02x}/{i:08}", i % 251);
                        let (status, body) = c.request(&t, "PUT", &path, "", b"");
                        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                    }
                })
            })
            .collect();
        let mut last = 0;
        while next.load(Ordering::Relaxed) < keys {
            std::thread::sleep(Duration::from_secs(2));
            let done = next.load(Ordering::Relaxed).min(keys);
            if done / 100_000 != last / 100_000 {
                eprintln!("  loaded {done} / {keys} keys");
            }
            last = done;
        }
        for th in threads {
            th.join().unwrap();
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "load: {keys} empty PUTs in {secs:.1} s ({:.0} PUT/s, {concurrency} connections)",
            keys as f64 / secs
        );
    }
    // A fresh connection: the one above may have idled past the server's
    // idle timeout during a long load.
    let mut c = Conn::open(t.addr);
    let mut page_rates = Vec::new();
    let mut totals = Vec::new();
    for run in 0..runs {
        let started = Instant::now();
        let mut token: Option<String> = None;
        let (mut pages, mut listed) = (0usize, 0usize);
        loop {
            let query = match &token {
                Some(tok) => format!("continuation-token={tok}&list-type=2&max-keys=1000"),
                None => "list-type=2&max-keys=1000".to_string(),
            };
            let (status, body) = c.request(&t, "GET", &format!("/{bucket}"), &query, b"");
            assert_eq!(status, 200);
            let body = String::from_utf8(body).unwrap();
            pages += 1;
            listed += body.matches("<Key>").count();
            // No-progress guard: a listing can never need more pages than this.
            assert!(
                pages <= keys / 1000 + 2,
                "listing does not end ({pages} pages for {keys} keys)"
            );
            if between(&body, "<IsTruncated>", "</IsTruncated>") != Some("true") {
                break;
            }
            token = Some(
                between(&body, "<NextContinuationToken>", "</NextContinuationToken>")
                    .expect("truncated page without a token")
                    .to_string(),
            );
        }
        let secs = started.elapsed().as_secs_f64();
        assert_eq!(
            listed, keys,
            "listing returned {listed} keys, expected {keys}"
        );
        eprintln!("  run {run}: {listed} keys in {pages} pages, {secs:.2} s");
        page_rates.push(pages as f64 / secs);
        totals.push(secs);
    }
    page_rates.sort_by(f64::total_cmp);
    totals.sort_by(f64::total_cmp);
    println!(
        "list: {keys} keys, median of {runs}: {:.2} s to list all, {:.0} pages/s (1000 keys per page)",
        totals[runs / 2],
        page_rates[runs / 2]
    );
}

pub struct GetBench {
    pub bucket: String,
    pub prefix: String,
    pub objects: usize,
    pub size: usize,
    pub concurrency: usize,
    pub seconds: f64,
    pub load: bool,
    pub server_pids: Vec<u32>,
    pub label: String,
}

/// Random whole-object GETs of `objects` keys for `seconds`, from
/// `concurrency` keep-alive connections. Prints one markdown table row:
/// label | size | req/s | MB/s | p50 ms | p99 ms | server CPU-s per GB.
pub fn get_bench(t: Target, b: GetBench) {
    let t = Arc::new(t);
    let key = |i: usize| format!("/{}/{}{i:06}", b.bucket, b.prefix);
    if b.load {
        let mut c = Conn::open(t.addr);
        let (status, _) = c.request(&t, "PUT", &format!("/{}", b.bucket), "", b"");
        assert!(status == 200 || status == 409, "create bucket: {status}");
        let body: Vec<u8> = (0..b.size).map(|i| (i * 31 % 251) as u8).collect();
        for i in 0..b.objects {
            let (status, resp) = c.request(&t, "PUT", &key(i), "", &body);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&resp));
        }
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cpu0 = cpu_seconds(&b.server_pids);
    let started = Instant::now();
    let threads: Vec<_> = (0..b.concurrency)
        .map(|w| {
            let (t, stop) = (t.clone(), stop.clone());
            let (bucket, prefix, objects, size) =
                (b.bucket.clone(), b.prefix.clone(), b.objects, b.size);
            std::thread::spawn(move || {
                let mut c = Conn::open(t.addr);
                let mut lat = Vec::new();
                let mut bytes = 0u64;
                let mut i = w * 7919;
                while !stop.load(Ordering::Relaxed) {
                    i = (i * 1_103_515_245 + 12_345) % (1 << 31);
                    let path = format!("/{bucket}/{prefix}{:06}", i % objects);
                    let s = Instant::now();
                    let (status, body) = c.request(&t, "GET", &path, "", b"");
                    lat.push(s.elapsed());
                    assert_eq!(status, 200, "GET {path}");
                    assert_eq!(body.len(), size, "GET {path}: short body");
                    bytes += body.len() as u64;
                }
                (lat, bytes)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(b.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut bytes = 0u64;
    for th in threads {
        let (l, n) = th.join().unwrap();
        lat.extend(l);
        bytes += n;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(&b.server_pids) - cpu0;
    lat.sort();
    let pct =
        |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} |",
        b.label,
        b.size,
        lat.len() as f64 / secs,
        bytes as f64 / secs / 1e6,
        pct(0.5),
        pct(0.99),
        if bytes > 0 {
            cpu / (bytes as f64 / 1e9)
        } else {
            0.0
        }
    );
}
