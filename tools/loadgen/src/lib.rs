//! `percore bench`: a load generator modelled on MinIO's warp.
//!
//! Operations: get, put, stat, delete, list and mixed (warp's default mix:
//! 45% get, 30% stat, 15% put, 10% delete), plus the two reads AI loaders
//! make: `range` (R small ranges at random offsets of one large object; the
//! native protocol sends them in one request, S3 needs one GET each) and
//! `batch` (B whole small objects; one native BatchGet, or B S3 GETs). Over S3
//! (SigV4-signed, keep-alive connections) or the native protocol (a client
//! per worker). Reports ops/s, units/s (ranges or samples for range and
//! batch), MB/s, latency p50/p90/p99/p99.9, time to first byte, errors, and
//! the server's CPU per unit and per GB when given its pids; as a table and
//! as JSON. Bounded in time (or operations); stops by itself.

pub mod s3;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use percore_client::{Client, Config, Range};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    S3,
    Native,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Get,
    Put,
    Stat,
    Delete,
    List,
    Mixed,
    Range,
    Batch,
}

impl Op {
    pub fn parse(s: &str) -> Result<Op, String> {
        Ok(match s {
            "get" => Op::Get,
            "put" => Op::Put,
            "stat" => Op::Stat,
            "delete" => Op::Delete,
            "list" => Op::List,
            "mixed" => Op::Mixed,
            "range" => Op::Range,
            "batch" => Op::Batch,
            _ => {
                return Err(format!(
                "unknown operation '{s}': use get, put, stat, delete, list, mixed, range or batch"
            ))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
            Op::Stat => "stat",
            Op::Delete => "delete",
            Op::List => "list",
            Op::Mixed => "mixed",
            Op::Range => "range",
            Op::Batch => "batch",
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Spec {
    pub label: String,
    pub mode: Mode,
    pub op: Op,
    /// S3 endpoint (s3 mode) or any shard's native endpoint.
    pub endpoint: String,
    #[serde(skip)]
    pub access_key: String,
    #[serde(skip)]
    pub secret_key: String,
    pub bucket: String,
    pub prefix: String,
    /// Objects prepared for get/stat/delete/batch/mixed/list.
    pub objects: usize,
    /// Object size; random in [size, size_max] when size_max > size.
    pub size: usize,
    pub size_max: usize,
    pub concurrency: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Stop after this many operations (after warm-up) if set.
    pub ops_max: Option<u64>,
    /// range: ranges per operation and bytes per range; the object's size.
    pub ranges: usize,
    pub range_bytes: u64,
    pub large_bytes: u64,
    /// range: ranges come in runs of this many adjacent ones.
    pub range_run: usize,
    /// batch: objects per operation.
    pub batch: usize,
    /// Skip uploading the objects (they exist from an earlier run).
    pub no_prepare: bool,
    /// get: read every prepared object exactly once (workers interleaved),
    /// then stop; with a dropped page cache this measures cold reads.
    pub each_once: bool,
    /// Server processes whose CPU time is charged to the run.
    pub server_pids: Vec<u32>,
    pub seed: u64,
}

impl Spec {
    pub fn new(mode: Mode, op: Op, endpoint: &str) -> Spec {
        Spec {
            label: String::new(),
            mode,
            op,
            endpoint: endpoint.to_string(),
            access_key: std::env::var("PERCORE_ACCESS_KEY").unwrap_or_else(|_| "percore".into()),
            secret_key: std::env::var("PERCORE_SECRET_KEY")
                .unwrap_or_else(|_| "percore-secret".into()),
            bucket: "bench".into(),
            prefix: "obj/".into(),
            objects: 1000,
            size: 64 * 1024,
            size_max: 0,
            concurrency: 16,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            ops_max: None,
            ranges: 16,
            range_bytes: 4096,
            range_run: 1,
            large_bytes: 256 << 20,
            batch: 64,
            no_prepare: false,
            each_once: false,
            server_pids: Vec::new(),
            seed: 1,
        }
    }

    fn key(&self, i: usize) -> String {
        format!("{}{i:08}", self.prefix)
    }

    fn large_key(&self) -> String {
        format!("{}large-{}", self.prefix, self.large_bytes)
    }

    fn size_of(&self, i: usize) -> usize {
        if self.size_max > self.size {
            let mut r = StdRng::seed_from_u64(self.seed ^ i as u64);
            r.gen_range(self.size..=self.size_max)
        } else {
            self.size
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    pub label: String,
    pub mode: String,
    pub op: String,
    pub concurrency: usize,
    pub seconds: f64,
    pub ops: u64,
    pub units: u64,
    pub errors: u64,
    pub bytes: u64,
    pub ops_per_sec: f64,
    pub units_per_sec: f64,
    pub mb_per_sec: f64,
    pub latency_ms: Percentiles,
    pub ttfb_ms: Percentiles,
    /// CPU-seconds of the server processes during the measured window.
    pub server_cpu_seconds: f64,
    pub server_cpu_us_per_unit: f64,
    pub server_cpu_seconds_per_gb: f64,
    pub first_error: String,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
}

fn percentiles(v: &mut [u32]) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64 / 1e3;
    Percentiles {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        p999: at(0.999),
    }
}

/// CPU seconds (user + system) used so far by these processes, all threads.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf reads a system constant; no pointers, no memory.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|s| {
            let rest = &s[s.rfind(')').map_or(0, |i| i + 2)..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let stime: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            (utime + stime) / tick
        })
        .sum()
}

enum Backend {
    S3(s3::Conn),
    Native(Client),
}

fn s3_target(spec: &Spec) -> Result<s3::Target, String> {
    use std::net::ToSocketAddrs;
    let addr: SocketAddr = spec
        .endpoint
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", spec.endpoint))?
        .next()
        .ok_or_else(|| format!("{} resolves to nothing", spec.endpoint))?;
    Ok(s3::Target {
        addr,
        access_key: spec.access_key.clone(),
        secret_key: spec.secret_key.clone(),
        region: "us-east-1".into(),
    })
}

async fn backend(spec: &Spec) -> Result<Backend, String> {
    match spec.mode {
        Mode::S3 => Ok(Backend::S3(
            s3::Conn::open(&s3_target(spec)?)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", spec.endpoint))?,
        )),
        Mode::Native => {
            let cfg = Config::new(
                spec.endpoint.clone(),
                spec.access_key.clone(),
                spec.secret_key.clone(),
            );
            Ok(Backend::Native(
                Client::connect(cfg).await.map_err(|e| e.to_string())?,
            ))
        }
    }
}

/// What one operation did.
struct Done {
    units: u64,
    bytes: u64,
    ttfb: Duration,
}

fn payload(i: usize, size: usize) -> Bytes {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Bytes::from(
        (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>(),
    )
}

fn check(status: u16, what: &str, ok: &[u16]) -> Result<(), String> {
    if ok.contains(&status) {
        Ok(())
    } else {
        Err(format!("{what}: HTTP {status}"))
    }
}

impl Backend {
    async fn put(&mut self, spec: &Spec, key: &str, data: Bytes) -> Result<Done, String> {
        let started = Instant::now();
        let n = data.len() as u64;
        match self {
            Backend::S3(c) => {
                let path = format!("/{}/{}", spec.bucket, s3::encode_path(key));
                let r = c
                    .request("PUT", &path, "", "", &data)
                    .await
                    .map_err(|e| e.to_string())?;
                check(r.status, "PUT", &[200])?;
            }
            Backend::Native(c) => {
                c.put(&spec.bucket, key, data)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(Done {
            units: 1,
            bytes: n,
            ttfb: started.elapsed(),
        })
    }

    async fn get(&mut self, spec: &Spec, key: &str) -> Result<Done, String> {
        let started = Instant::now();
        match self {
            Backend::S3(c) => {
                let path = format!("/{}/{}", spec.bucket, s3::encode_path(key));
                let r = c
                    .request("GET", &path, "", "", b"")
                    .await
                    .map_err(|e| e.to_string())?;
                check(r.status, "GET", &[200])?;
                Ok(Done {
                    units: 1,
                    bytes: r.body.len() as u64,
                    ttfb: r.ttfb,
                })
            }
            Backend::Native(c) => {
                let mut first: Option<Duration> = None;
                let mut bytes = 0u64;
                c.get_stream(&spec.bucket, key, None, |_, d| {
                    first.get_or_insert_with(|| started.elapsed());
                    bytes += d.len() as u64;
                    Ok(())
                })
                .await
                .map_err(|e| e.to_string())?;
                Ok(Done {
                    units: 1,
                    bytes,
                    ttfb: first.unwrap_or_else(|| started.elapsed()),
                })
            }
        }
    }

    async fn stat(&mut self, spec: &Spec, key: &str) -> Result<Done, String> {
        let started = Instant::now();
        match self {
            Backend::S3(c) => {
                let path = format!("/{}/{}", spec.bucket, s3::encode_path(key));
                let r = c
                    .request("HEAD", &path, "", "", b"")
                    .await
                    .map_err(|e| e.to_string())?;
                check(r.status, "HEAD", &[200])?;
            }
            Backend::Native(c) => {
                c.stat(&spec.bucket, key).await.map_err(|e| e.to_string())?;
            }
        }
        Ok(Done {
            units: 1,
            bytes: 0,
            ttfb: started.elapsed(),
        })
    }

    async fn delete(&mut self, spec: &Spec, key: &str) -> Result<Done, String> {
        let started = Instant::now();
        match self {
            Backend::S3(c) => {
                let path = format!("/{}/{}", spec.bucket, s3::encode_path(key));
                let r = c
                    .request("DELETE", &path, "", "", b"")
                    .await
                    .map_err(|e| e.to_string())?;
                check(r.status, "DELETE", &[204, 200])?;
            }
            Backend::Native(c) => {
                c.delete(&spec.bucket, key)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(Done {
            units: 1,
            bytes: 0,
            ttfb: started.elapsed(),
        })
    }

    /// One page of up to 1000 keys under the prefix, from a random start.
    async fn list(&mut self, spec: &Spec, start: usize) -> Result<Done, String> {
        let started = Instant::now();
        let after = if start == 0 {
            String::new()
        } else {
            spec.key(start)
        };
        let keys = match self {
            Backend::S3(c) => {
                let mut q = vec![
                    ("list-type", "2".to_string()),
                    ("max-keys", "1000".into()),
                    ("prefix", s3::encode_path(&spec.prefix).replace('/', "%2F")),
                ];
                if !after.is_empty() {
                    q.push(("start-after", s3::encode_path(&after).replace('/', "%2F")));
                }
                q.sort();
                let query = q
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("&");
                let r = c
                    .request("GET", &format!("/{}", spec.bucket), &query, "", b"")
                    .await
                    .map_err(|e| e.to_string())?;
                check(r.status, "LIST", &[200])?;
                String::from_utf8_lossy(&r.body).matches("<Key>").count() as u64
            }
            Backend::Native(c) => c
                .list(&spec.bucket, &spec.prefix, &after, "", 1000)
                .await
                .map_err(|e| e.to_string())?
                .entries
                .len() as u64,
        };
        Ok(Done {
            units: keys,
            bytes: 0,
            ttfb: started.elapsed(),
        })
    }

    /// `spec.ranges` ranges of `spec.range_bytes` at random offsets of the
    /// large object: one native request, or one S3 GET per range.
    async fn range(&mut self, spec: &Spec, rng: &mut StdRng) -> Result<Done, String> {
        let started = Instant::now();
        let key = spec.large_key();
        let blocks = (spec.large_bytes / spec.range_bytes).max(1);
        let run = (spec.range_run as u64).clamp(1, blocks);
        let mut ranges: Vec<Range> = Vec::with_capacity(spec.ranges);
        while ranges.len() < spec.ranges {
            let first = rng.gen_range(0..=blocks - run);
            for b in first..first + run {
                if ranges.len() < spec.ranges {
                    ranges.push(Range {
                        offset: b * spec.range_bytes,
                        length: spec.range_bytes,
                    });
                }
            }
        }
        let mut bytes = 0;
        let mut ttfb = None;
        match self {
            Backend::S3(c) => {
                let path = format!("/{}/{}", spec.bucket, s3::encode_path(&key));
                for r in &ranges {
                    let h = format!("Range: bytes={}-{}\r\n", r.offset, r.offset + r.length - 1);
                    let resp = c
                        .request("GET", &path, "", &h, b"")
                        .await
                        .map_err(|e| e.to_string())?;
                    check(resp.status, "GET range", &[206])?;
                    ttfb.get_or_insert(resp.ttfb);
                    bytes += resp.body.len() as u64;
                }
            }
            Backend::Native(c) => {
                let o = c
                    .get(&spec.bucket, &key, &ranges)
                    .await
                    .map_err(|e| e.to_string())?;
                bytes = o.ranges.iter().map(|r| r.1.len() as u64).sum();
            }
        }
        if bytes != spec.ranges as u64 * spec.range_bytes {
            return Err(format!("range: got {bytes} bytes"));
        }
        Ok(Done {
            units: spec.ranges as u64,
            bytes,
            ttfb: ttfb.unwrap_or_else(|| started.elapsed()),
        })
    }

    /// `spec.batch` random whole objects: one native BatchGet (split by
    /// owner shard), or one S3 GET each.
    async fn batch(&mut self, spec: &Spec, rng: &mut StdRng) -> Result<Done, String> {
        let started = Instant::now();
        let keys: Vec<String> = (0..spec.batch)
            .map(|_| spec.key(rng.gen_range(0..spec.objects)))
            .collect();
        let mut bytes = 0;
        let mut ttfb = None;
        match self {
            Backend::S3(c) => {
                for k in &keys {
                    let path = format!("/{}/{}", spec.bucket, s3::encode_path(k));
                    let r = c
                        .request("GET", &path, "", "", b"")
                        .await
                        .map_err(|e| e.to_string())?;
                    check(r.status, "GET", &[200])?;
                    ttfb.get_or_insert(r.ttfb);
                    bytes += r.body.len() as u64;
                }
            }
            Backend::Native(c) => {
                let items: Vec<(String, Vec<Range>)> =
                    keys.into_iter().map(|k| (k, Vec::new())).collect();
                for r in c
                    .get_batch(&spec.bucket, &items)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    let o = r.map_err(|e| e.to_string())?;
                    bytes += o.ranges.iter().map(|r| r.1.len() as u64).sum::<u64>();
                }
            }
        }
        Ok(Done {
            units: spec.batch as u64,
            bytes,
            ttfb: ttfb.unwrap_or_else(|| started.elapsed()),
        })
    }
}

async fn create_bucket(b: &mut Backend, spec: &Spec) -> Result<(), String> {
    match b {
        Backend::S3(c) => {
            let r = c
                .request("PUT", &format!("/{}", spec.bucket), "", "", b"")
                .await
                .map_err(|e| e.to_string())?;
            check(r.status, "CreateBucket", &[200, 409])
        }
        Backend::Native(c) => match c.create_bucket(&spec.bucket).await {
            Ok(()) => Ok(()),
            Err(e) if e.status() == Some(percore_client::Status::BucketExists) => Ok(()),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// Uploads what the operation reads, with progress on stderr. With
/// `no_prepare` nothing is written, not even the bucket (a plain HTTP
/// server such as nginx serves files written beforehand and refuses PUTs).
pub async fn prepare(spec: &Spec) -> Result<(), String> {
    if spec.no_prepare {
        return Ok(());
    }
    let mut b = backend(spec).await?;
    create_bucket(&mut b, spec).await?;
    if matches!(spec.op, Op::Put) {
        return Ok(());
    }
    if spec.op == Op::Range {
        let data = payload(usize::MAX, spec.large_bytes as usize);
        eprintln!(
            "  preparing {} ({} MiB)",
            spec.large_key(),
            spec.large_bytes >> 20
        );
        return b.put(spec, &spec.large_key(), data).await.map(|_| ());
    }
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..spec.concurrency.min(16))
        .map(|_| {
            let (spec, next) = (spec.clone(), next.clone());
            tokio::spawn(async move {
                let mut b = backend(&spec).await?;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= spec.objects {
                        return Ok::<(), String>(());
                    }
                    b.put(&spec, &spec.key(i), payload(i, spec.size_of(i)))
                        .await?;
                }
            })
        })
        .collect();
    let mut shown = Instant::now();
    for w in workers {
        while !w.is_finished() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if shown.elapsed() > Duration::from_secs(2) {
                eprintln!(
                    "  prepared {} / {} objects",
                    next.load(Ordering::Relaxed).min(spec.objects as u64),
                    spec.objects
                );
                shown = Instant::now();
            }
        }
        w.await.map_err(|e| e.to_string())??;
    }
    eprintln!(
        "  prepared {} objects in {:.1} s",
        spec.objects,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[derive(Default)]
struct Tally {
    ops: u64,
    units: u64,
    bytes: u64,
    errors: u64,
    lat_us: Vec<u32>,
    ttfb_us: Vec<u32>,
    first_error: String,
}

/// Runs the measured load (after `prepare`).
// Spawn, warm up, measure, stop, merge: one sequence with shared counters.
#[allow(clippy::too_many_lines)]
pub async fn run(spec: &Spec) -> Result<Report, String> {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..spec.concurrency {
        let (spec, measuring, stop, counted) = (
            spec.clone(),
            measuring.clone(),
            stop.clone(),
            counted.clone(),
        );
        let mut b = backend(&spec).await?;
        workers.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(spec.seed.wrapping_add(w as u64 * 7919));
            let mut t = Tally::default();
            let mut mine: Vec<String> = Vec::new();
            let mut n = 0usize;
            let mut next_once = w;
            while !stop.load(Ordering::Relaxed) {
                let op = match spec.op {
                    Op::Mixed => match rng.gen_range(0..100) {
                        0..=44 => Op::Get,
                        45..=74 => Op::Stat,
                        75..=89 => Op::Put,
                        _ if mine.is_empty() => Op::Put,
                        _ => Op::Delete,
                    },
                    op => op,
                };
                let t0 = Instant::now();
                let r = match op {
                    Op::Get if spec.each_once && spec.op == Op::Get => {
                        if next_once >= spec.objects {
                            break;
                        }
                        let key = spec.key(next_once);
                        next_once += spec.concurrency;
                        b.get(&spec, &key).await
                    }
                    Op::Get => {
                        b.get(&spec, &spec.key(rng.gen_range(0..spec.objects)))
                            .await
                    }
                    Op::Stat => {
                        b.stat(&spec, &spec.key(rng.gen_range(0..spec.objects)))
                            .await
                    }
                    Op::Put => {
                        let key = format!("{}w{w}/{n}", spec.prefix);
                        n += 1;
                        let size = spec.size_of(n);
                        let r = b.put(&spec, &key, payload(n, size)).await;
                        if spec.op == Op::Mixed {
                            mine.push(key);
                        }
                        r
                    }
                    Op::Delete if spec.op == Op::Mixed => {
                        let key = mine.swap_remove(rng.gen_range(0..mine.len()));
                        b.delete(&spec, &key).await
                    }
                    Op::Delete => {
                        // Each prepared object once, workers interleaved.
                        if next_once >= spec.objects {
                            break;
                        }
                        let key = spec.key(next_once);
                        next_once += spec.concurrency;
                        b.delete(&spec, &key).await
                    }
                    Op::List => b.list(&spec, rng.gen_range(0..spec.objects.max(1))).await,
                    Op::Range => b.range(&spec, &mut rng).await,
                    Op::Batch => b.batch(&spec, &mut rng).await,
                    Op::Mixed => unreachable!(),
                };
                let lat = t0.elapsed();
                if !measuring.load(Ordering::Relaxed) {
                    continue;
                }
                match r {
                    Ok(d) => {
                        t.ops += 1;
                        t.units += d.units;
                        t.bytes += d.bytes;
                        t.ttfb_us
                            .push(d.ttfb.as_micros().min(u32::MAX as u128) as u32);
                        t.lat_us.push(lat.as_micros().min(u32::MAX as u128) as u32);
                    }
                    Err(e) => {
                        t.errors += 1;
                        if t.first_error.is_empty() {
                            t.first_error = e;
                        }
                        // A broken connection: make a new one.
                        if let Ok(nb) = backend(&spec).await {
                            b = nb;
                        }
                        continue;
                    }
                }
                if let Some(max) = spec.ops_max {
                    if counted.fetch_add(1, Ordering::Relaxed) + 1 >= max {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            t
        }));
    }
    tokio::time::sleep(spec.warmup).await;
    let cpu0 = cpu_seconds(&spec.server_pids);
    let started = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    let deadline = started + spec.duration;
    while Instant::now() < deadline
        && !stop.load(Ordering::Relaxed)
        && !workers.iter().all(|w| w.is_finished())
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(&spec.server_pids) - cpu0;
    let mut all = Tally::default();
    for w in workers {
        let t = w.await.map_err(|e| e.to_string())?;
        all.ops += t.ops;
        all.units += t.units;
        all.bytes += t.bytes;
        all.errors += t.errors;
        all.lat_us.extend(t.lat_us);
        all.ttfb_us.extend(t.ttfb_us);
        if all.first_error.is_empty() {
            all.first_error = t.first_error;
        }
    }
    Ok(Report {
        label: spec.label.clone(),
        mode: format!("{:?}", spec.mode).to_lowercase(),
        op: spec.op.name().into(),
        concurrency: spec.concurrency,
        seconds: secs,
        ops: all.ops,
        units: all.units,
        errors: all.errors,
        bytes: all.bytes,
        ops_per_sec: all.ops as f64 / secs,
        units_per_sec: all.units as f64 / secs,
        mb_per_sec: all.bytes as f64 / secs / 1e6,
        latency_ms: percentiles(&mut all.lat_us),
        ttfb_ms: percentiles(&mut all.ttfb_us),
        server_cpu_seconds: cpu,
        server_cpu_us_per_unit: if all.units > 0 {
            cpu * 1e6 / all.units as f64
        } else {
            0.0
        },
        server_cpu_seconds_per_gb: if all.bytes > 0 {
            cpu / (all.bytes as f64 / 1e9)
        } else {
            0.0
        },
        first_error: all.first_error,
    })
}

pub const TABLE_HEADER: &str = "| label | mode | op | conc | ops/s | units/s | MB/s | p50 ms | p90 ms | p99 ms | p99.9 ms | ttfb p50 ms | errors | server CPU µs/unit | server CPU-s/GB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

impl Report {
    pub fn table_row(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {:.0} | {:.0} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.1} | {:.2} |",
            self.label,
            self.mode,
            self.op,
            self.concurrency,
            self.ops_per_sec,
            self.units_per_sec,
            self.mb_per_sec,
            self.latency_ms.p50,
            self.latency_ms.p90,
            self.latency_ms.p99,
            self.latency_ms.p999,
            self.ttfb_ms.p50,
            self.errors,
            self.server_cpu_us_per_unit,
            self.server_cpu_seconds_per_gb
        )
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("serialisable")
    }
}
