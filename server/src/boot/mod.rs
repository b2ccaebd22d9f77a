//! `percore serve`: start one glommio executor per shard, wire them
//! together, serve until SIGINT/SIGTERM, then drain and stop cleanly.
//!
//! `serve` is the sequence of start-up steps, each a function below;
//! `shard_main` is what runs on each shard, `listen` the listeners and the
//! accept loop, `events` how the main thread and the shards signal.

pub mod checks;
pub mod config;
pub mod datadir;
pub mod events;
pub mod listen;
pub mod shard_main;
pub mod steer;
pub mod topology;

use std::os::fd::RawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use percore_protocol::routing;

use crate::boot::config::ServerConfig;
use crate::frontend::http::Limits;
use crate::frontend::s3::{Credentials, S3Config};
use crate::shard;
use crate::store::file;
use events::{Event, Eventfd};
use shard_main::ShardSetup;
use topology::ShardPlacement;

/// Kept here for callers of the old path; the admin endpoint lives in
/// `frontend::admin`.
pub use crate::frontend::admin::{LOG_FILTER_INITIAL, LOG_FILTER_RELOAD};

/// Longest wait for every shard to report drained after a signal.
const DRAIN_WAIT: Duration = Duration::from_secs(35);

/// What the start-up plan decided (before any listener or thread exists).
struct Plan {
    placements: Vec<ShardPlacement>,
    hash_seed: u64,
    /// Cluster mode: the cluster's placement groups (0: a single node).
    cluster_pgs: u32,
    /// Cluster mode: the data directory was made for this node and has not
    /// joined yet (`datadir::DataMeta::fresh`).
    fresh: bool,
    /// Cluster mode: the data directory's id (`datadir::DataMeta::disk`).
    disk: String,
    io_memory: usize,
    direct_io: bool,
}

/// The listening sockets, bound in the main thread so that a port in use
/// fails start-up with a clear message; shard i owns index i.
struct Listeners {
    s3_fds: Vec<RawFd>,
    native_fds: Vec<RawFd>,
    native_ports: Vec<u16>,
}

/// The running shards, as the main thread sees them.
struct Shards {
    n: usize,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
    events: mpsc::Receiver<Event>,
    drain: Vec<Eventfd>,
    stop: Vec<Eventfd>,
}

pub fn serve(cfg: ServerConfig) -> Result<(), String> {
    checks::io_uring_enabled()?;
    checks::data_dir_writable(&cfg.data)?;
    // A cluster node reads the cluster's placement settings first: its
    // data directory is bound to them, and its shards route by them.
    let binding = match &cfg.cluster {
        Some(s) => Some(crate::cluster::control::binding(s)?),
        None => None,
    };
    let plan = plan(&cfg, binding.as_ref())?;
    let (fresh, disk) = (plan.fresh, plan.disk.clone());
    // Signals go to the main thread only: block them before spawning shards.
    let sigset = block_signals();
    let listeners = bind_listeners(&cfg, &plan)?;
    let (feed, map_rx, catalog_rx) = crate::cluster::shardmap::feed(plan.placements.len());
    let shards = spawn_shards(&cfg, plan, &listeners, map_rx, catalog_rx)?;
    shards.wait_ready(&sigset)?;
    let leaver = match join_cluster(&cfg, &listeners.native_ports, (fresh, disk), feed) {
        Ok(l) => l,
        Err(e) => {
            shards.drain_and_stop();
            return Err(e);
        }
    };
    print_endpoints(&cfg, &listeners.native_ports);
    let sig = wait_for_signal(&sigset);
    // A cluster node stops leading at once, and gives up its lease once
    // its shards have stopped (or the lease margin has passed), so that
    // the others take its groups over without waiting for it to expire.
    let leaving = leaver.as_ref().and_then(|l| l.begin());
    println!("percore: signal {sig}, draining");
    flush_stdout();
    shards.drain_and_stop();
    if let (Some(leaver), Some(done)) = (&leaver, &leaving) {
        match leaver.drained(done) {
            Some(true) => println!("percore: cluster lease given up"),
            Some(false) => println!("percore: could not give up the cluster lease (is etcd reachable?); the other nodes take this node's groups over when it expires"),
            None => println!("percore: giving up the cluster lease took too long; the other nodes take this node's groups over when it expires"),
        }
        flush_stdout();
    }
    println!("percore: stopped");
    Ok(())
}

/// With `--cluster`: joins the cluster (a node that cannot join does not
/// start) and starts its control thread.
fn join_cluster(
    cfg: &ServerConfig,
    native_ports: &[u16],
    (fresh, disk): (bool, String),
    feed: crate::cluster::shardmap::MapFeed,
) -> Result<Option<crate::cluster::control::Leaver>, String> {
    let Some(settings) = cfg.cluster.clone() else {
        return Ok(None);
    };
    // Other nodes and clients reach it at these addresses.
    for (what, a) in [
        ("--s3", cfg.s3),
        ("--native", cfg.native),
        ("--admin", cfg.admin),
    ] {
        if a.ip().is_unspecified() {
            return Err(format!(
                "{what} {a}: a cluster node advertises its addresses; bind to the address others reach it at, not {}",
                a.ip()
            ));
        }
    }
    // With the built-in default keys (which anyone can sign with) a node
    // takes node-to-node requests from loopback only: a cluster on other
    // addresses needs its own keys.
    if cfg.default_credentials {
        for a in [cfg.s3, cfg.native, cfg.admin] {
            if !a.ip().is_loopback() {
                return Err(format!(
                    "{a}: a cluster node on a non-loopback address needs its own keys: start every node with the same PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY (the default ones are public)"
                ));
            }
        }
    }
    let native: Vec<String> = native_ports
        .iter()
        .map(|&p| std::net::SocketAddr::new(cfg.native.ip(), p).to_string())
        .collect();
    let joining = crate::cluster::map::Joining {
        name: settings.node.clone(),
        zone: settings.zone.clone(),
        s3: cfg.s3.to_string(),
        native: native.join(","),
        admin: cfg.admin.to_string(),
        shards: native_ports.len(),
        nonce: Vec::new(),
        ttl_s: settings.lease_ttl_s,
        fresh,
        disk,
    };
    let (status, leaver) = crate::cluster::control::start(settings.clone(), joining, feed)
        .map_err(|e| format!("cannot join the cluster: {e}"))?;
    // The join recorded whether the data was fresh (a node recorded as
    // filled is `empty` until it syncs); from now on it is this node's.
    datadir::joined(&cfg.data, &settings.node)?;
    println!(
        "cluster: joined {} as node {} (id {}) in zone {}",
        settings.cluster,
        settings.node,
        status.node_id.load(std::sync::atomic::Ordering::Relaxed),
        settings.zone
    );
    flush_stdout();
    Ok(Some(leaver))
}

/// Shard placement, data directory, locked memory and O_DIRECT, printed.
fn plan(cfg: &ServerConfig, cluster: Option<&datadir::ClusterBinding>) -> Result<Plan, String> {
    let cores = topology::physical_cores()?;
    let placements = topology::plan(&cores, cfg.cpus.as_deref(), cfg.shards, cfg.unpinned)?;
    let n = placements.len();
    let meta = datadir::open_or_create(&cfg.data, n, cluster)?;
    if let Some(c) = &cfg.cluster {
        datadir::check_node(&cfg.data, &meta, &c.node)?;
    }
    let hash_seed = meta.seed()?;
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
        hash_seed
    );
    if let Some(c) = &meta.cluster {
        println!(
            "  cluster {}: {} placement groups, keys on their group's primary",
            c.name, c.pgs
        );
    }
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
    Ok(Plan {
        placements,
        hash_seed,
        cluster_pgs: meta.cluster.as_ref().map_or(0, |c| c.pgs),
        fresh: meta.fresh,
        disk: meta.disk.clone().unwrap_or_default(),
        io_memory,
        direct_io,
    })
}

/// Blocks SIGINT and SIGTERM in this thread (and the threads it spawns
/// later); returns the set to wait on.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, valid all-zero (sigemptyset then
    // initialises it properly).
    let mut sigset: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `sigset` is a valid, writable sigset_t; pthread_sigmask reads
    // it and takes a null old-set pointer, which it allows.
    unsafe {
        libc::sigemptyset(&mut sigset);
        libc::sigaddset(&mut sigset, libc::SIGINT);
        libc::sigaddset(&mut sigset, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &sigset, std::ptr::null_mut());
    }
    sigset
}

/// The S3 listener group (CPU-steered when every shard is pinned) and the
/// native listeners.
fn bind_listeners(cfg: &ServerConfig, plan: &Plan) -> Result<Listeners, String> {
    let n = plan.placements.len();
    let shard_cpus: Option<Vec<usize>> = plan.placements.iter().map(|p| p.cpu).collect();
    let (s3_fds, steered) = steer::bind_group(cfg.s3, n, shard_cpus.as_deref())?;
    println!(
        "S3 listeners: {n} (SO_REUSEPORT), {}",
        if steered {
            "steered to the shard pinned to the receiving CPU (SO_ATTACH_REUSEPORT_CBPF)"
        } else {
            "spread by the kernel's hash (shards unpinned or a single shard)"
        }
    );
    let (native_fds, native_ports) = listen::bind_native(cfg.native, n)?;
    Ok(Listeners {
        s3_fds,
        native_fds,
        native_ports,
    })
}

/// The S3 front door's settings, shared by every shard.
fn s3_config(cfg: &ServerConfig) -> S3Config {
    S3Config {
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
    }
}

/// Starts one executor per shard, pinned as planned.
fn spawn_shards(
    cfg: &ServerConfig,
    plan: Plan,
    l: &Listeners,
    map_rx: Vec<mpsc::Receiver<std::sync::Arc<crate::cluster::shardmap::ShardMap>>>,
    catalog_rx: crate::cluster::shardmap::CatalogRx,
) -> Result<Shards, String> {
    let mut catalog_rx = Some(catalog_rx);
    let n = plan.placements.len();
    let s3_cfg = s3_config(cfg);
    let (events_tx, events_rx) = mpsc::channel();
    let drain = Eventfd::per_shard(n)?;
    let stop = Eventfd::per_shard(n)?;
    let mut handles = Vec::new();
    let shards = plan.placements.into_iter().zip(shard::wire(n));
    for ((placement, wiring), map_rx) in shards.zip(map_rx) {
        let id = placement.shard;
        let setup = ShardSetup {
            placement: placement.clone(),
            count: n,
            seed: plan.hash_seed,
            cluster_pgs: plan.cluster_pgs,
            map_rx,
            catalog_rx: if id == crate::shard::BUCKET_OWNER_SHARD {
                catalog_rx.take()
            } else {
                None
            },
            shard_dir: cfg.data.join(format!("shard-{id:03}")),
            direct_io: plan.direct_io,
            s3_cfg: s3_cfg.clone(),
            cfg: cfg.clone(),
            events: events_tx.clone(),
            drain_fd: drain[id].0,
            stop_fd: stop[id].0,
            s3_fd: l.s3_fds[id],
            native_fd: l.native_fds[id],
            native_ports: l.native_ports.clone(),
        };
        let builder = LocalExecutorBuilder::new(match placement.cpu {
            Some(cpu) => Placement::Fixed(cpu),
            None => Placement::Unbound,
        })
        .name(&format!("percore-shard-{id}"))
        .io_memory(plan.io_memory);
        // The closure runs on the shard's (pinned) thread: everything the
        // shard allocates from here on is allocated after pinning.
        let handle = builder
            .spawn(move || async move { shard_main::run_shard(setup, wiring).await })
            .map_err(|e| format!("cannot start shard {id}: {e}"))?;
        handles.push(handle);
    }
    Ok(Shards {
        n,
        handles,
        events: events_rx,
        drain,
        stop,
    })
}

impl Shards {
    /// Waits until every shard reported ready; a shard's failure or a
    /// signal ends start-up with an error.
    fn wait_ready(&self, sigset: &libc::sigset_t) -> Result<(), String> {
        let n = self.n;
        let mut ready = 0;
        while ready < n {
            match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Ready(id)) => {
                    tracing::debug!(shard = id, "ready");
                    ready += 1;
                }
                Ok(Event::Failed(id, msg)) => {
                    return Err(format!("shard {id} failed to start: {msg}"))
                }
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
            // SAFETY: `sigset` and `zero` are valid for the call; a null
            // siginfo pointer is allowed.
            let sig = unsafe { libc::sigtimedwait(sigset, std::ptr::null_mut(), &zero) };
            if sig > 0 {
                return Err(format!(
                    "signal {sig} during start-up ({ready} of {n} shards ready); nothing was served"
                ));
            }
        }
        Ok(())
    }

    /// Tells every shard to drain, waits (up to DRAIN_WAIT) for them, then
    /// tells them to stop and joins their threads.
    fn drain_and_stop(self) {
        for fd in &self.drain {
            fd.signal();
        }
        let deadline = Instant::now() + DRAIN_WAIT;
        let mut drained = 0;
        while drained < self.n && Instant::now() < deadline {
            match self.events.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Drained(id)) => {
                    tracing::debug!(shard = id, "drained");
                    drained += 1;
                }
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        for fd in &self.stop {
            fd.signal();
        }
        for h in self.handles {
            let _ = h.join();
        }
    }
}

/// The endpoints and credentials in use, then "percore: ready".
fn print_endpoints(cfg: &ServerConfig, native_ports: &[u16]) {
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
    flush_stdout();
}

/// Blocks until SIGINT or SIGTERM; returns its number.
fn wait_for_signal(sigset: &libc::sigset_t) -> libc::c_int {
    let mut sig: libc::c_int = 0;
    // SAFETY: `sigset` is an initialised set and `sig` a writable int.
    unsafe { libc::sigwait(sigset, &mut sig) };
    sig
}

fn flush_stdout() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
