//! percore-bench: storage-engine benchmarks on one shard (one pinned glommio
//! executor), for comparison with fio on the same disk (`bench/engine.sh`).
//!
//!   percore-bench engine   --dir D [--sizes 4096,65536,1048576] [--bytes 1073741824] [--concurrency 64] [--cpu 1]
//!   percore-bench recovery --dir D [--objects 1000000] [--size 128] [--cpu 1]

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

/// Counts live heap bytes, to measure index bytes per object.
struct Counting;
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
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

fn config(dir: &PathBuf) -> StoreConfig {
    let mut cfg = StoreConfig::new(0, dir.clone());
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

fn main() {
    match Cli::parse().command {
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
    }
}
