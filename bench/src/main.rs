//! percore-bench: storage-engine benchmarks on one shard (one pinned glommio
//! executor), for comparison with fio on the same disk (`bench/engine.sh`).
//!
//!   percore-bench engine   --dir D [--sizes 4096,65536,1048576] [--bytes 1073741824] [--concurrency 64] [--cpu 1]
//!   percore-bench recovery --dir D [--objects 1000000] [--size 128] [--cpu 1]
//!   percore-bench s3-list  --endpoint 127.0.0.1:9000 [--keys 1000000] [--concurrency 16]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use glommio::{LocalExecutorBuilder, Placement};
use percore_server::store::record::ObjectMeta;
use percore_server::store::{Store, StoreConfig};
use rand::seq::SliceRandom;
use rand::SeedableRng;

mod s3list;

/// Counts live heap bytes, to measure index bytes per object.
struct Counting;
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: every method forwards to System unchanged; the counter is only
// bookkeeping and never touches the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwards the caller's contract (GlobalAlloc::alloc) to System.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc`/`realloc` above, i.e. from System, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from System with `layout`; the caller upholds realloc's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// MD5 throughput on one core: the md-5 crate, percore's scalar
    /// kernel (one stream), and its lanes kernel over 1..16 streams.
    Md5 {
        /// Bytes per stream.
        #[arg(long, default_value_t = 64 << 20)]
        bytes: usize,
    },
    /// PUT then GET throughput per object size on one shard.
    Engine {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "4096,65536,1048576", value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Bytes written per size.
        #[arg(long, default_value_t = 1 << 30)]
        bytes: u64,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Data ring: NOP round trip through the eventfd bridge, and 4 KiB
    /// random O_DIRECT reads with glommio's DMA path vs READ_FIXED on the
    /// shard's own ring, same file, same concurrency.
    Ring {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 200_000)]
        reads: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Use SQPOLL with the poller on this CPU.
        #[arg(long)]
        sqpoll_cpu: Option<u32>,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Through the S3 endpoint: load N empty objects, then ListObjectsV2
    /// over all of them (pages/s, seconds to list everything).
    S3List {
        #[arg(long)]
        endpoint: std::net::SocketAddr,
        #[arg(long, default_value = "list-bench")]
        bucket: String,
        #[arg(long, default_value_t = 1_000_000)]
        keys: usize,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Skip loading (the keys are already there).
        #[arg(long)]
        no_load: bool,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Through an HTTP endpoint (percore's S3, or nginx serving the same
    /// objects as files): random whole-object GETs for a while; prints a
    /// markdown row with req/s, MB/s, p50/p99 and server CPU-s per GB.
    S3Get {
        #[arg(long)]
        endpoint: std::net::SocketAddr,
        #[arg(long, default_value = "get-bench")]
        bucket: String,
        #[arg(long, default_value = "obj-")]
        prefix: String,
        #[arg(long, default_value_t = 256)]
        objects: usize,
        #[arg(long)]
        size: usize,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// PUT the objects first.
        #[arg(long)]
        load: bool,
        /// Server processes whose CPU time is charged to the run.
        #[arg(long, value_delimiter = ',')]
        server_pids: Vec<u32>,
        #[arg(long, default_value = "percore")]
        label: String,
    },
    /// Recovery time and index bytes per object.
    Recovery {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1_000_000)]
        objects: usize,
        #[arg(long, default_value_t = 128)]
        size: usize,
        #[arg(long)]
        cpu: Option<usize>,
    },
}

fn executor(cpu: Option<usize>) -> LocalExecutorBuilder {
    LocalExecutorBuilder::new(cpu.map_or(Placement::Unbound, Placement::Fixed)).io_memory(4 << 20)
}

fn config(dir: &std::path::Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(0, dir.to_path_buf());
    cfg.compaction_interval_ms = 0;
    cfg
}

fn key(i: usize) -> String {
    format!("bench/{i:010}")
}

async fn run_parallel(
    store: &Store,
    count: usize,
    concurrency: usize,
    op: impl Fn(Store, usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
        + Clone
        + 'static,
) -> f64 {
    let started = Instant::now();
    let next = std::rc::Rc::new(std::cell::Cell::new(0usize));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (store, next, op) = (store.clone(), next.clone(), op.clone());
            glommio::spawn_local(async move {
                loop {
                    let i = next.get();
                    if i >= count {
                        break;
                    }
                    next.set(i + 1);
                    op(store.clone(), i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await;
    }
    started.elapsed().as_secs_f64()
}

fn engine(dir: PathBuf, sizes: Vec<usize>, bytes: u64, concurrency: usize, cpu: Option<usize>) {
    println!("| object size | objects | PUT MB/s | PUT ops/s | GET MB/s | GET ops/s | flushes | bytes written / payload |");
    println!("|---|---|---|---|---|---|---|---|");
    for size in sizes {
        let dir = dir.join(format!("engine-{size}"));
        let _ = std::fs::remove_dir_all(&dir);
        let count = (bytes / size as u64).max(1) as usize;
        let d = dir.clone();
        executor(cpu)
            .spawn(move || async move {
                let (store, _) = Store::open(config(&d)).await.unwrap();
                let payload = Bytes::from(vec![0x5au8; size]);
                let p = payload.clone();
                let put_s = run_parallel(&store, count, concurrency, move |s, i| {
                    let p = p.clone();
                    Box::pin(async move {
                        let meta = ObjectMeta {
                            etag: "e".into(),
                            ..Default::default()
                        };
                        s.put("b", &key(i), meta, p).await.unwrap();
                    })
                })
                .await;
                let stats = store.stats();
                let mut order: Vec<usize> = (0..count).collect();
                order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
                let order = std::rc::Rc::new(order);
                let get_s = run_parallel(&store, count, concurrency, move |s, i| {
                    let order = order.clone();
                    Box::pin(async move {
                        let mut r = s.open_read("b", &key(order[i])).await.unwrap();
                        let mut at = 0;
                        while at < r.size_bytes() {
                            at += r.read(at, 1 << 20).await.unwrap().len() as u64;
                        }
                    })
                })
                .await;
                let total_mb = (count * size) as f64 / 1e6;
                println!(
                    "| {size} | {count} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {:.2} |",
                    total_mb / put_s,
                    count as f64 / put_s,
                    total_mb / get_s,
                    count as f64 / get_s,
                    stats.flushes,
                    stats.bytes_written as f64 / (count * size) as f64
                );
                store.shutdown().await;
            })
            .unwrap()
            .join()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn recovery(dir: PathBuf, objects: usize, size: usize, cpu: Option<usize>) {
    let dir = dir.join("recovery");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.clone();
    executor(cpu)
        .spawn(move || async move {
            let (store, _) = Store::open(config(&d)).await.unwrap();
            let payload = Bytes::from(vec![0x33u8; size]);
            let started = Instant::now();
            let step = (objects / 20).max(1);
            run_parallel(&store, objects, 256, move |s, i| {
                let p = payload.clone();
                Box::pin(async move {
                    let meta = ObjectMeta {
                        etag: "0123456789abcdef0123456789abcdef".into(),
                        content_type: "application/octet-stream".into(),
                        ..Default::default()
                    };
                    s.put("b", &key(i), meta, p).await.unwrap();
                    if i % step == 0 {
                        eprint!("\rwriting {i}/{objects}");
                    }
                })
            })
            .await;
            eprintln!(
                "\rwrote {objects} objects of {size} B in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            store.shutdown().await;
        })
        .unwrap()
        .join()
        .unwrap();
    let d = dir.clone();
    executor(cpu)
        .spawn(move || async move {
            let heap_before = LIVE_BYTES.load(Ordering::Relaxed);
            let started = Instant::now();
            let (store, report) = Store::open(config(&d)).await.unwrap();
            let elapsed = started.elapsed().as_secs_f64();
            let heap_after = LIVE_BYTES.load(Ordering::Relaxed);
            assert_eq!(report.objects as usize, objects);
            let key_bytes = key(0).len();
            println!("| objects | object size | segments | bytes scanned | recovery s | objects/s | index heap bytes/object (key {key_bytes} B) |");
            println!("|---|---|---|---|---|---|---|");
            println!(
                "| {objects} | {size} | {} | {} | {elapsed:.2} | {:.0} | {:.0} |",
                report.segments,
                report.bytes_scanned,
                objects as f64 / elapsed,
                (heap_after - heap_before) as f64 / objects as f64
            );
            drop(store);
        })
        .unwrap()
        .join()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn ring(
    dir: PathBuf,
    reads: usize,
    concurrency: usize,
    sqpoll_cpu: Option<u32>,
    cpu: Option<usize>,
) {
    use percore_server::ring::{pool::BufferPool, DataRing, RingConfig};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file_bytes: u64 = 1 << 30;
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ring-bench.dat");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 1 << 20];
        for _ in 0..file_bytes >> 20 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let p = path.clone();
    executor(cpu)
        .spawn(move || async move {
            let mut cfg = RingConfig::default();
            if let Some(c) = sqpoll_cpu {
                cfg.sqpoll_idle_ms = Some(100);
                cfg.sqpoll_cpu = Some(c);
            }
            let pool = BufferPool::new(4096, concurrency.max(1)).unwrap();
            let ring = DataRing::new(cfg, Some(pool.clone())).unwrap();
            // Round trips: one NOP at a time, through submit + eventfd + wake.
            let mut lat = Vec::with_capacity(20_000);
            for _ in 0..20_000 {
                let t = Instant::now();
                ring.nop().await;
                lat.push(t.elapsed().as_secs_f64() * 1e6);
            }
            lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!("| NOP round trip (sqpoll {}) | p50 {:.1} us | p99 {:.1} us |", sqpoll_cpu.is_some(), percentile(&lat, 0.5), percentile(&lat, 0.99));
            let offsets: Vec<u64> = {
                use rand::Rng;
                let mut rng = rand::rngs::StdRng::seed_from_u64(7);
                (0..reads).map(|_| rng.gen_range(0..file_bytes / 4096) * 4096).collect()
            };
            let offsets = std::rc::Rc::new(offsets);
            // glommio DMA path.
            let dma = std::rc::Rc::new(glommio::io::DmaFile::open(&p).await.unwrap());
            let next = std::rc::Rc::new(std::cell::Cell::new(0usize));
            let t = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|_| {
                    let (dma, next, offsets) = (dma.clone(), next.clone(), offsets.clone());
                    glommio::spawn_local(async move {
                        loop {
                            let i = next.get();
                            if i >= offsets.len() {
                                break;
                            }
                            next.set(i + 1);
                            let r = dma.read_at_aligned(offsets[i], 4096).await.unwrap();
                            assert_eq!(r.len(), 4096);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
            let glommio_s = t.elapsed().as_secs_f64();
            // Our ring, READ_FIXED into registered buffers.
            let file = std::rc::Rc::new(std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&p).unwrap());
            next.set(0);
            let t = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|_| {
                    let (ring, pool, file, next, offsets) = (ring.clone(), pool.clone(), file.clone(), next.clone(), offsets.clone());
                    glommio::spawn_local(async move {
                        loop {
                            let i = next.get();
                            if i >= offsets.len() {
                                break;
                            }
                            next.set(i + 1);
                            let buf = pool.acquire().await;
                            let (n, _buf) = ring.read_fixed(file.as_raw_fd(), buf, offsets[i], 4096).await;
                            assert_eq!(n.unwrap(), 4096);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
            let ring_s = t.elapsed().as_secs_f64();
            let stats = ring.stats();
            println!("| 4 KiB random reads, depth {concurrency} | glommio DMA {:.0} IOPS | ring READ_FIXED {:.0} IOPS | ratio {:.2} | SQEs per submit {:.1} |",
                reads as f64 / glommio_s, reads as f64 / ring_s, glommio_s / ring_s, stats.submitted as f64 / stats.submit_calls.max(1) as f64);
        })
        .unwrap()
        .join()
        .unwrap();
    let _ = std::fs::remove_file(&path);
}

fn main() {
    match Cli::parse().command {
        Cmd::Md5 { bytes } => md5_speed(bytes),
        Cmd::Engine {
            dir,
            sizes,
            bytes,
            concurrency,
            cpu,
        } => engine(dir, sizes, bytes, concurrency, cpu),
        Cmd::Recovery {
            dir,
            objects,
            size,
            cpu,
        } => recovery(dir, objects, size, cpu),
        Cmd::Ring {
            dir,
            reads,
            concurrency,
            sqpoll_cpu,
            cpu,
        } => ring(dir, reads, concurrency, sqpoll_cpu, cpu),
        Cmd::S3Get {
            endpoint,
            bucket,
            prefix,
            objects,
            size,
            concurrency,
            seconds,
            load,
            server_pids,
            label,
        } => s3list::get_bench(
            s3list::target_from_env(endpoint),
            s3list::GetBench {
                bucket,
                prefix,
                objects,
                size,
                concurrency,
                seconds,
                load,
                server_pids,
                label,
            },
        ),
        Cmd::S3List {
            endpoint,
            bucket,
            keys,
            concurrency,
            no_load,
            runs,
        } => s3list::run(
            s3list::target_from_env(endpoint),
            &bucket,
            keys,
            concurrency,
            !no_load,
            runs.max(1),
        ),
    }
}

/// Prints MB/s of MD5 for one stream (md-5 crate, percore scalar) and for
/// n streams hashed together in lanes (aggregate).
fn md5_speed(bytes: usize) {
    use md5::Digest as _;
    use percore_server::digest::md5::{compress, compress_many, lanes_available, Job};
    let bytes = bytes - bytes % 64;
    let data: Vec<Vec<u8>> = (0..16)
        .map(|s| (0..bytes).map(|i| (i * 31 + s * 7) as u8).collect())
        .collect();
    let rate = |total: usize, t: std::time::Instant| total as f64 / t.elapsed().as_secs_f64() / 1e6;
    let t = std::time::Instant::now();
    let d = md5::Md5::digest(&data[0]);
    println!(
        "md-5 crate, 1 stream: {:.0} MB/s ({:02x})",
        rate(bytes, t),
        d[0]
    );
    let mut st = [0u32; 4];
    let t = std::time::Instant::now();
    compress(&mut st, &data[0]);
    println!(
        "percore scalar, 1 stream: {:.0} MB/s ({:x})",
        rate(bytes, t),
        st[0]
    );
    println!("lanes available: {}", lanes_available());
    for n in [2, 4, 8, 16] {
        let mut states = vec![[0u32; 4]; n];
        let t = std::time::Instant::now();
        let mut jobs: Vec<Job<'_>> = states
            .iter_mut()
            .zip(&data)
            .map(|(state, d)| Job {
                state,
                slices: vec![&d[..]],
            })
            .collect();
        compress_many(&mut jobs);
        println!(
            "percore lanes, {n} streams: {:.0} MB/s aggregate",
            rate(n * bytes, t)
        );
    }
}
