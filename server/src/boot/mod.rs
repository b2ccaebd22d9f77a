//! `percore serve`: start one glommio executor per shard, wire them
//! together, serve until SIGINT/SIGTERM, then drain and stop cleanly.


pub mod checks;
pub mod config;
pub mod datadir;
pub mod steer;
pub mod topology;

use std::cell::{Cell, RefCell};
use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use percore_protocol::routing;

use crate::boot::config::ServerConfig;
use crate::frontend::http::{HttpConn, Limits, ResponseHead};
use crate::frontend::s3::{Credentials, S3Config, S3Front};
use crate::shard::{self, Shard, Wiring, BUCKET_OWNER_SHARD};
use crate::store::{file, Store, StoreConfig};
use topology::ShardPlacement;


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
    /// This shard's socket of the S3 listener group.
    s3_fd: RawFd,
    /// This shard's native-protocol listener.
    native_fd: RawFd,
    native_ports: Vec<u16>,
}

pub fn serve(cfg: ServerConfig) -> Result<(), String> {
    checks::io_uring_enabled()?;
    checks::data_dir_writable(&cfg.data)?;
    let cores = topology::physical_cores()?;
    let placements = topology::plan(&cores, cfg.cpus.as_deref(), cfg.shards, cfg.unpinned)?;
    let n = placements.len();
    let meta = datadir::open_or_create(&cfg.data, n)?;
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
        access_log: cfg.access_log,
        limits: Limits {
            header_timeout_ms: cfg.header_timeout_s * 1000,
            idle_timeout_ms: cfg.idle_timeout_s * 1000,
            body_timeout_ms: cfg.body_timeout_s * 1000,
            ..Limits::default()
        },
    };
    let shard_cpus: Option<Vec<usize>> = placements.iter().map(|p| p.cpu).collect();
    let (s3_fds, steered) = crate::boot::steer::bind_group(cfg.s3, n, shard_cpus.as_deref())?;
    println!(
        "S3 listeners: {n} (SO_REUSEPORT), {}",
        if steered {
            "steered to the shard pinned to the receiving CPU (SO_ATTACH_REUSEPORT_CBPF)"
        } else {
            "spread by the kernel's hash (shards unpinned or a single shard)"
        }
    );
    let (native_fds, native_ports) = bind_native(cfg.native, n)?;
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
            s3_fd: s3_fds[id],
            native_fd: native_fds[id],
            native_ports: native_ports.clone(),
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
    println!(
        "native endpoint: {}:{} (shard i on port {} + i: {:?})",
        cfg.native.ip(),
        native_ports[0],
        native_ports[0],
        native_ports
    );
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
    // The admin endpoint comes up first: live during recovery, ready after.
    let admin_state = (id == BUCKET_OWNER_SHARD).then(|| {
        Rc::new(Admin {
            phase: Cell::new(Phase::Starting),
            shard: RefCell::new(None),
            log_filter: RefCell::new(LOG_FILTER_INITIAL.get().cloned().unwrap_or_default()),
            writes: AdminWrites {
                secret_key: s.cfg.secret_key.clone(),
                default_credentials: s.cfg.default_credentials,
                open: s.cfg.admin_open_writes,
            },
        })
    });
    let admin = match &admin_state {
        Some(state) => {
            let listener = glommio::net::TcpListener::bind(s.cfg.admin)
                .map_err(|e| format!("cannot listen on {} for admin: {e}", s.cfg.admin))?;
            let state = state.clone();
            Some(glommio::spawn_local(async move {
                while let Ok(stream) = listener.accept().await {
                    glommio::spawn_local(serve_admin(state.clone(), stream)).detach();
                }
            }))
        }
        None => None,
    };
    let mut store_cfg = StoreConfig::new(id as u32, s.shard_dir.clone());
    store_cfg.direct_io = s.direct_io;
    store_cfg.segment_bytes_max = s.cfg.segment_bytes_max;
    store_cfg.scrub_interval_ms = s.cfg.scrub_interval_s.saturating_mul(1000);
    store_cfg.scrub_bytes_per_sec_max = s.cfg.scrub_mb_per_sec.saturating_mul(1_000_000);
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
    shard.set_timeouts(
        Duration::from_secs(s.cfg.cross_shard_timeout_s),
        Duration::from_secs(s.cfg.session_idle_timeout_s),
    );
    if s.cfg.data_ring {
        // After pinning: the pool's pages are allocated on this CPU's node.
        let ring = crate::ring::BufferPool::new(RING_BUF_BYTES, RING_BUFFERS).and_then(|pool| {
            let cfg = crate::ring::RingConfig {
                sqpoll_idle_ms: s.cfg.ring_sqpoll_idle_ms,
                sqpoll_cpu: s
                    .cfg
                    .ring_sqpoll_cpus
                    .as_ref()
                    .filter(|c| !c.is_empty())
                    .map(|c| c[id % c.len()] as u32),
                submit_batch_max: s.cfg.ring_submit_batch,
                send_zc_min_bytes: s.cfg.ring_send_zc_min_bytes,
                ..Default::default()
            };
            crate::ring::DataRing::new(cfg, Some(pool))
        });
        match ring {
            Ok(ring) => {
                store.attach_ring(ring.clone());
                *shard.ring.borrow_mut() = Some(ring);
            }
            Err(e) => tracing::warn!(
                shard = id,
                "data ring unavailable ({e}); GETs use the copy path. Check memlock (ulimit -l) and io_uring (kernel.io_uring_disabled)"
            ),
        }
    }
    shard.connect(s.wiring).await;
    if id == BUCKET_OWNER_SHARD {
        shard.publish_buckets().await;
        shard.call_all(|| shard::msg::Op::Start).await;
    } else {
        shard.wait_started().await;
    }
    // Per front door: past it a new connection is closed at once (clients
    // retry), so the shard keeps serving the others.
    let conns_max = s.cfg.connections_per_shard_max as u64;
    let front = S3Front::new(shard.clone(), Rc::new(s.s3_cfg));
    // Bound and listening already (steer::bind_group), owned from here on.
    let listener =
        unsafe { <glommio::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(s.s3_fd) };
    let accept_front = front.clone();
    let accept = glommio::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    let m = &accept_front.shard.metrics;
                    m.connections_accepted.set(m.connections_accepted.get() + 1);
                    if m.connections_open.get() >= conns_max {
                        m.connections_refused.set(m.connections_refused.get() + 1);
                        tracing::warn!(
                            shard = accept_front.shard.id,
                            "S3 connection limit {conns_max} reached (connections_per_shard_max); closing a new connection"
                        );
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
    let native = crate::frontend::native::NativeFront::new(
        shard.clone(),
        Rc::new(crate::frontend::native::NativeConfig {
            credentials: front.cfg.credentials.clone(),
            ports: s.native_ports.clone(),
            put_data_timeout: Duration::from_secs(s.cfg.native_put_data_timeout_s),
        }),
    );
    let native_listener =
        unsafe { <glommio::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(s.native_fd) };
    let accept_native = native.clone();
    let native_accept = glommio::spawn_local(async move {
        loop {
            match native_listener.accept().await {
                Ok(stream) => {
                    let m = &accept_native.shard.metrics;
                    m.native_connections_accepted
                        .set(m.native_connections_accepted.get() + 1);
                    if m.native_connections_open.get() >= conns_max {
                        m.connections_refused.set(m.connections_refused.get() + 1);
                        tracing::warn!(
                            shard = accept_native.shard.id,
                            "native connection limit {conns_max} reached (connections_per_shard_max); closing a new connection"
                        );
                        drop(stream);
                        continue;
                    }
                    glommio::spawn_local(accept_native.clone().serve_connection(stream)).detach();
                }
                Err(e) => {
                    tracing::warn!(shard = accept_native.shard.id, "native accept failed: {e}");
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    if let Some(a) = &admin_state {
        *a.shard.borrow_mut() = Some(shard.clone());
        a.phase.set(Phase::Ready);
    }
    let _ = s.events.send(Event::Ready(id));

    wait_eventfd(s.drain_fd).await;
    if let Some(a) = &admin_state {
        a.phase.set(Phase::Draining);
    }
    front.draining.set(true);
    native.draining.set(true);
    drop(accept);
    drop(native_accept);
    let deadline = Instant::now() + Duration::from_secs(30);
    while front.shard.metrics.requests_in_flight.get() > 0 && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    let _ = s.events.send(Event::Drained(id));
    // Other shards may still forward work here until everyone has drained.
    wait_eventfd(s.stop_fd).await;
    store.shutdown().await;
    drop(admin);
    tracing::info!(shard = id, "stopped");
    Ok(())
}

/// Binds one native-protocol listener per shard, in the main thread (so a
/// port in use fails start-up with a clear message): shard i on
/// `addr.port() + i`, or an ephemeral port each when `addr.port()` is 0.
fn bind_native(addr: std::net::SocketAddr, n: usize) -> Result<(Vec<RawFd>, Vec<u16>), String> {
    use std::os::fd::IntoRawFd;
    let mut fds = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    for i in 0..n {
        let port = if addr.port() == 0 {
            0
        } else {
            u16::try_from(usize::from(addr.port()) + i).map_err(|_| {
                format!(
                    "native port {} + shard {i} is past 65535; choose a lower --native port",
                    addr.port()
                )
            })?
        };
        let at = std::net::SocketAddr::new(addr.ip(), port);
        let l = std::net::TcpListener::bind(at).map_err(|e| {
            format!("cannot listen on {at} for the native protocol (shard {i}): {e}; choose another --native address (shard i uses port + i)")
        })?;
        ports.push(l.local_addr().map_err(|e| e.to_string())?.port());
        fds.push(l.into_raw_fd());
    }
    Ok((fds, ports))
}

/// Registered buffers per shard: one 1 MiB extent read plus O_DIRECT
/// alignment slack each.
pub(crate) const RING_BUF_BYTES: usize = (1 << 20) + 4096;
/// Shared by GET reads and batch writes (a batch takes up to 8).
const RING_BUFFERS: usize = 64;

/// Where the server is in its life, for /health/ready.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    Ready,
    Draining,
}

/// The admin endpoint's view (shard 0): up from before recovery, so that
/// /health/live answers while /health/ready does not yet.
struct Admin {
    phase: Cell<Phase>,
    shard: RefCell<Option<Rc<Shard>>>,
    log_filter: RefCell<String>,
    writes: AdminWrites,
}

/// Who may change state through the admin endpoint (PUT /log/level): a
/// request with `Authorization: Bearer <S3 secret key>` (the built-in
/// default secret from loopback peers only, as on the S3 port), or anyone
/// when the operator set `admin_open_writes`. Reads (/health, /metrics,
/// GET /log/level) stay open.
struct AdminWrites {
    secret_key: String,
    default_credentials: bool,
    open: bool,
}

impl AdminWrites {
    /// None when allowed, else the refusal (status, message).
    fn refusal(
        &self,
        head: &crate::frontend::http::RequestHead,
        loopback: bool,
    ) -> Option<(u16, &'static str)> {
        use subtle::ConstantTimeEq;
        if self.open {
            return None;
        }
        let Some(value) = head.header_str("authorization") else {
            return Some((
                401,
                "admin writes need 'Authorization: Bearer <PERCORE_SECRET_KEY>' (or admin_open_writes = true)\n",
            ));
        };
        let token = value
            .trim()
            .strip_prefix("Bearer ")
            .map(str::trim)
            .unwrap_or("");
        if !bool::from(token.as_bytes().ct_eq(self.secret_key.as_bytes())) {
            return Some((
                403,
                "wrong admin credentials: send 'Authorization: Bearer <PERCORE_SECRET_KEY>'\n",
            ));
        }
        if self.default_credentials && !loopback {
            return Some((
                403,
                "the default credentials are accepted from loopback only; set PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY\n",
            ));
        }
        None
    }
}

/// Changes the log filter at run time (set once by `main`).
pub static LOG_FILTER_RELOAD: std::sync::OnceLock<
    Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>,
> = std::sync::OnceLock::new();
/// The filter `main` installed, for GET /log/level until changed.
pub static LOG_FILTER_INITIAL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn process_gauges() -> String {
    let rss_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    format!(
        "# HELP process_resident_memory_bytes Resident set size.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n# HELP process_open_fds Open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {fds}\n",
        rss_pages * page
    )
}

async fn serve_admin(admin: Rc<Admin>, stream: glommio::net::TcpStream) {
    let loopback = stream
        .peer_addr()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    let mut conn = HttpConn::new(stream, Limits::default());
    while let Ok(Some(head)) = conn.read_head().await {
        // Refused before any body is read; the connection then closes.
        let refusal = match head.method.as_str() {
            "GET" | "HEAD" => None,
            _ => admin.writes.refusal(&head, loopback),
        };
        if let Some((status, message)) = refusal {
            let mut reply = ResponseHead::new(status).with_header("Content-Type", "text/plain");
            if status == 401 {
                reply.push_header("WWW-Authenticate", "Bearer realm=\"percore-admin\"");
            }
            let _ = conn
                .write_response(&reply, message.len() as u64, true)
                .await;
            let _ = conn.write_body(message.as_bytes()).await;
            let _ = conn.flush().await;
            break;
        }
        let (status, ctype, body): (u16, &str, Vec<u8>) = match (
            head.method.as_str(),
            head.path.as_str(),
        ) {
            (_, "/health/live") => (200, "text/plain", b"ok\n".to_vec()),
            (_, "/health/ready") => match admin.phase.get() {
                Phase::Ready => (200, "text/plain", b"ok\n".to_vec()),
                Phase::Starting => (503, "text/plain", b"starting: recovering shards\n".to_vec()),
                Phase::Draining => (503, "text/plain", b"draining: shutting down\n".to_vec()),
            },
            ("GET", "/metrics") => {
                let shard = admin.shard.borrow().clone();
                match shard {
                    None => (
                        503,
                        "text/plain",
                        b"starting: no metrics before recovery ends\n".to_vec(),
                    ),
                    Some(shard) => {
                        let mut snaps = Vec::with_capacity(shard.count);
                        for reply in shard.call_all(|| shard::msg::Op::Metrics).await {
                            if let shard::msg::Reply::Metrics(s) = reply {
                                snaps.push(*s);
                            }
                        }
                        let mut text = crate::metrics::render(&snaps);
                        text.push_str(&process_gauges());
                        (200, "text/plain; version=0.0.4", text.into_bytes())
                    }
                }
            }
            ("GET", "/log/level") => {
                let current = admin.log_filter.borrow().clone();
                (200, "text/plain", format!("{current}\n").into_bytes())
            }
            ("PUT", "/log/level") => {
                let mut body = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    match conn.read_body(&mut buf).await {
                        Ok(0) => break,
                        Ok(n) if body.len() + n <= 4096 => body.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let filter = String::from_utf8_lossy(&body).trim().to_string();
                match LOG_FILTER_RELOAD.get().map(|f| f(&filter)) {
                    Some(Ok(())) => {
                        *admin.log_filter.borrow_mut() = filter.clone();
                        tracing::info!("log filter set to '{filter}'");
                        (200, "text/plain", format!("{filter}\n").into_bytes())
                    }
                    Some(Err(e)) => (400, "text/plain", format!("invalid filter: {e}; use e.g. info, debug or percore_server=debug,info\n").into_bytes()),
                    None => (501, "text/plain", b"log level cannot be changed in this process\n".to_vec()),
                }
            }
            _ => (
                404,
                "text/plain",
                b"not found: try /health/live, /health/ready, /metrics, /log/level\n".to_vec(),
            ),
        };
        let head = ResponseHead::new(status).with_header("Content-Type", ctype);
        if conn
            .write_response(&head, body.len() as u64, false)
            .await
            .is_err()
            || conn.write_body(&body).await.is_err()
            || conn.flush().await.is_err()
        {
            break;
        }
    }
}
