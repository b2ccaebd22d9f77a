//! `percore serve`: start one glommio executor per shard, wire them
//! together, serve until SIGINT/SIGTERM, then drain and stop cleanly.

use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use percore_protocol::routing;

use crate::config::ServerConfig;
use crate::http::{HttpConn, Limits, ResponseHead};
use crate::s3::handler::{Credentials, S3Config, S3Front};
use crate::shard::{self, Shard, Wiring, BUCKET_OWNER_SHARD};
use crate::store::{file, Store, StoreConfig};
use crate::topology::{self, ShardPlacement};
use crate::{checks, metadata};

/// Open S3 connections per shard.
pub const CONNECTIONS_PER_SHARD_MAX: usize = 4096;

/// What shards tell the main thread (start-up and shutdown only).
enum Event {
    Ready(usize),
    Failed(usize, String),
    Drained(usize),
}

struct Eventfd(RawFd);

impl Eventfd {
    fn new() -> std::io::Result<Eventfd> {
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Eventfd(fd))
    }

    fn signal(&self) {
        let one: u64 = 1;
        unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }
}

/// Parks the calling glommio task until `fd` (an eventfd) is signalled.
async fn wait_eventfd(fd: RawFd) {
    let dup = unsafe { libc::dup(fd) };
    let file = unsafe { glommio::io::BufferedFile::from_raw_fd(dup) };
    let _ = file.read_at(0, 8).await;
    let _ = file.close().await;
}

struct ShardSetup {
    placement: ShardPlacement,
    count: usize,
    seed: u64,
    shard_dir: std::path::PathBuf,
    direct_io: bool,
    wiring: Wiring,
    s3_cfg: S3Config,
    cfg: ServerConfig,
    events: mpsc::Sender<Event>,
    drain_fd: RawFd,
    stop_fd: RawFd,
}

pub fn serve(cfg: ServerConfig) -> Result<(), String> {
    checks::io_uring_enabled()?;
    checks::data_dir_writable(&cfg.data)?;
    let cores = topology::physical_cores()?;
    let placements = topology::plan(&cores, cfg.cpus.as_deref(), cfg.shards, cfg.unpinned)?;
    let n = placements.len();
    let meta = metadata::open_or_create(&cfg.data, n)?;
    let io_memory = checks::io_memory_per_shard(n)?;
    let direct_io = file::probe_direct_io(&cfg.data)
        .map_err(|e| format!("cannot probe O_DIRECT in {}: {e}", cfg.data.display()))?;
    if !direct_io {
        tracing::warn!("the filesystem of {} refuses O_DIRECT: falling back to buffered I/O (slower, uses the page cache)", cfg.data.display());
    }
    println!(
        "percore {} — data {} ({}), {n} shard(s), hash {} seed {:#x}",
        env!("CARGO_PKG_VERSION"),
        cfg.data.display(),
        if direct_io {
            "O_DIRECT"
        } else {
            "buffered I/O"
        },
        routing::HASH_ALGORITHM,
        meta.hash_seed
    );
    for p in &placements {
        match (p.cpu, p.numa_node) {
            (Some(cpu), node) => println!(
                "  shard {} -> cpu {cpu} -> numa node {}",
                p.shard,
                node.map_or("?".to_string(), |n| n.to_string())
            ),
            (None, _) => println!("  shard {} -> unpinned", p.shard),
        }
    }

    // Signals go to the main thread only: block them before spawning shards.
    let mut sigset: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut sigset);
        libc::sigaddset(&mut sigset, libc::SIGINT);
        libc::sigaddset(&mut sigset, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &sigset, std::ptr::null_mut());
    }

    let s3_cfg = S3Config {
        credentials: Credentials {
            access_key: cfg.access_key.clone(),
            secret_key: cfg.secret_key.clone(),
            is_default: cfg.default_credentials,
        },
        region: cfg.region.clone(),
        domain: cfg.s3_domain.clone(),
        limits: Limits::default(),
    };
    let (events_tx, events_rx) = mpsc::channel();
    let drain: Vec<Eventfd> = (0..n)
        .map(|_| Eventfd::new())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let stop: Vec<Eventfd> = (0..n)
        .map(|_| Eventfd::new())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut handles = Vec::new();
    for (placement, wiring) in placements.into_iter().zip(shard::wire(n)) {
        let id = placement.shard;
        let setup = ShardSetup {
            placement: placement.clone(),
            count: n,
            seed: meta.hash_seed,
            shard_dir: cfg.data.join(format!("shard-{id:03}")),
            direct_io,
            wiring,
            s3_cfg: s3_cfg.clone(),
            cfg: cfg.clone(),
            events: events_tx.clone(),
            drain_fd: drain[id].0,
            stop_fd: stop[id].0,
        };
        let builder = LocalExecutorBuilder::new(match placement.cpu {
            Some(cpu) => Placement::Fixed(cpu),
            None => Placement::Unbound,
        })
        .name(&format!("percore-shard-{id}"))
        .io_memory(io_memory);
        // The closure runs on the shard's (pinned) thread: everything the
        // shard allocates from here on is allocated after pinning.
        let handle = builder
            .spawn(move || async move { run_shard(setup).await })
            .map_err(|e| format!("cannot start shard {id}: {e}"))?;
        handles.push(handle);
    }
    drop(events_tx);

    let mut ready = 0;
    while ready < n {
        match events_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Ready(id)) => {
                tracing::debug!(shard = id, "ready");
                ready += 1;
            }
            Ok(Event::Failed(id, msg)) => return Err(format!("shard {id} failed to start: {msg}")),
            Ok(Event::Drained(_)) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("a shard exited during start-up".into())
            }
        }
        // Signals are blocked in every thread: poll for one so that a
        // SIGTERM during a long recovery is not ignored.
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let sig = unsafe { libc::sigtimedwait(&sigset, std::ptr::null_mut(), &zero) };
        if sig > 0 {
            return Err(format!(
                "signal {sig} during start-up ({ready} of {n} shards ready); nothing was served"
            ));
        }
    }
    println!(
        "S3 endpoint: http://{}  (path-style, region {})",
        cfg.s3, cfg.region
    );
    if cfg.default_credentials {
        println!("credentials: access key '{}' secret '{}' (built-in defaults, accepted from loopback only; set PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY for anything else)", cfg.access_key, cfg.secret_key);
    } else {
        println!(
            "credentials: access key '{}' (from PERCORE_ACCESS_KEY)",
            cfg.access_key
        );
    }
    println!("admin: http://{}/health/ready", cfg.admin);
    println!("percore: ready");
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let mut sig: libc::c_int = 0;
    unsafe { libc::sigwait(&sigset, &mut sig) };
    println!("percore: signal {sig}, draining");
    let _ = std::io::stdout().flush();
    for fd in &drain {
        fd.signal();
    }
    let deadline = Instant::now() + Duration::from_secs(35);
    let mut drained = 0;
    while drained < n && Instant::now() < deadline {
        match events_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Drained(id)) => {
                tracing::debug!(shard = id, "drained");
                drained += 1;
            }
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for fd in &stop {
        fd.signal();
    }
    for h in handles {
        let _ = h.join();
    }
    println!("percore: stopped");
    Ok(())
}

async fn run_shard(setup: ShardSetup) {
    let id = setup.placement.shard;
    let events = setup.events.clone();
    if let Err(msg) = run_shard_inner(setup).await {
        let _ = events.send(Event::Failed(id, msg));
    }
}

async fn run_shard_inner(s: ShardSetup) -> Result<(), String> {
    let id = s.placement.shard;
    let mut store_cfg = StoreConfig::new(id as u32, s.shard_dir.clone());
    store_cfg.direct_io = s.direct_io;
    store_cfg.segment_bytes_max = s.cfg.segment_bytes_max;
    let (store, report) = Store::open(store_cfg)
        .await
        .map_err(|e| format!("recovery of {} failed: {e}", s.shard_dir.display()))?;
    tracing::info!(
        shard = id,
        segments = report.segments,
        objects = report.objects,
        torn_tails_cut = report.torn_tails_cut,
        corrupt_records = report.corrupt_records,
        elapsed_ms = report.elapsed_ms,
        "recovered"
    );
    let shard = Shard::new(id, s.count, s.seed, store.clone());
    shard.connect(s.wiring).await;
    if id == BUCKET_OWNER_SHARD {
        shard.publish_buckets().await;
        shard.call_all(|| shard::msg::Op::Start).await;
    } else {
        shard.wait_started().await;
    }
    let front = S3Front::new(shard.clone(), Rc::new(s.s3_cfg));
    let listener = bind_reuseport(s.cfg.s3)
        .map_err(|e| format!("cannot listen on {} for S3: {e}", s.cfg.s3))?;
    let accept_front = front.clone();
    let accept = glommio::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    // Bounded: past the limit a connection is closed at once
                    // (clients retry), so the shard keeps serving the others.
                    if accept_front.connections_open.get() >= CONNECTIONS_PER_SHARD_MAX {
                        tracing::warn!(shard = accept_front.shard.id, "connection limit {CONNECTIONS_PER_SHARD_MAX} reached; closing a new connection");
                        drop(stream);
                        continue;
                    }
                    glommio::spawn_local(accept_front.clone().serve_connection(stream)).detach();
                }
                Err(e) => {
                    tracing::warn!(shard = accept_front.shard.id, "accept failed: {e}");
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    let admin = if id == BUCKET_OWNER_SHARD {
        let listener = glommio::net::TcpListener::bind(s.cfg.admin)
            .map_err(|e| format!("cannot listen on {} for admin: {e}", s.cfg.admin))?;
        Some(glommio::spawn_local(async move {
            while let Ok(stream) = listener.accept().await {
                glommio::spawn_local(serve_admin(stream)).detach();
            }
        }))
    } else {
        None
    };
    let _ = s.events.send(Event::Ready(id));

    wait_eventfd(s.drain_fd).await;
    front.draining.set(true);
    drop(accept);
    drop(admin);
    let deadline = Instant::now() + Duration::from_secs(30);
    while front.requests_in_flight.get() > 0 && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    let _ = s.events.send(Event::Drained(id));
    // Other shards may still forward work here until everyone has drained.
    wait_eventfd(s.stop_fd).await;
    store.shutdown().await;
    tracing::info!(shard = id, "stopped");
    Ok(())
}

/// An SO_REUSEPORT listener (one per shard on the same port) handed to glommio.
fn bind_reuseport(addr: std::net::SocketAddr) -> std::io::Result<glommio::net::TcpListener> {
    glommio::net::TcpListener::bind(addr).map_err(std::io::Error::from)
}

async fn serve_admin(stream: glommio::net::TcpStream) {
    let mut conn = HttpConn::new(stream, Limits::default());
    while let Ok(Some(head)) = conn.read_head().await {
        let (status, body): (u16, &[u8]) = match head.path.as_str() {
            "/health/live" | "/health/ready" => (200, b"ok\n"),
            _ => (404, b"not found\n"),
        };
        let head = ResponseHead::new(status).with_header("Content-Type", "text/plain");
        if conn
            .write_response(&head, body.len() as u64, false)
            .await
            .is_err()
            || conn.write_body(body).await.is_err()
            || conn.flush().await.is_err()
        {
            break;
        }
    }
}
