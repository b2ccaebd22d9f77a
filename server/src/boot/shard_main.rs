//! One shard's life on its own (pinned) executor: bring up the admin
//! endpoint (bucket-owner shard), recover the store, attach the data ring,
//! wire up with the other shards, start the front doors, report ready, and
//! on the main thread's word drain, then stop.

use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::boot::config::ServerConfig;
use crate::boot::events::{wait_eventfd, Event};
use crate::boot::listen::{self, ConnLimit, Door};
use crate::boot::topology::ShardPlacement;
use crate::frontend::admin::{self, Admin, AdminWrites};
use crate::frontend::native::{NativeConfig, NativeFront};
use crate::frontend::s3::{S3Config, S3Front};
use crate::shard::{Shard, Wiring, BUCKET_OWNER_SHARD};
use crate::store::{Store, StoreConfig};

/// Registered buffers per shard: one 1 MiB extent read plus O_DIRECT
/// alignment slack each.
pub(crate) const RING_BUF_BYTES: usize = (1 << 20) + 4096;
/// Shared by GET reads and batch writes (a batch takes up to 8).
const RING_BUFFERS: usize = 64;
/// Longest wait for requests in flight when draining.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// Everything a shard needs, prepared by the main thread.
pub struct ShardSetup {
    pub placement: ShardPlacement,
    pub count: usize,
    pub seed: u64,
    /// Cluster mode: placement groups (0: a single node), and the channel
    /// the control thread sends maps on.
    pub cluster_pgs: u32,
    pub map_rx: mpsc::Receiver<std::sync::Arc<crate::cluster::shardmap::ShardMap>>,
    /// The bucket-owner shard's: the bucket catalogs the control thread
    /// reads from etcd.
    pub catalog_rx: Option<crate::cluster::shardmap::CatalogRx>,
    pub shard_dir: std::path::PathBuf,
    pub direct_io: bool,
    pub s3_cfg: S3Config,
    pub cfg: ServerConfig,
    pub events: mpsc::Sender<Event>,
    pub drain_fd: RawFd,
    pub stop_fd: RawFd,
    /// This shard's socket of the S3 listener group.
    pub s3_fd: RawFd,
    /// This shard's native-protocol listener.
    pub native_fd: RawFd,
    pub native_ports: Vec<u16>,
}

/// The shard's executor body: runs the shard, reports a failure to start.
/// `wiring` is this shard's end of the channels to every other shard.
pub async fn run_shard(setup: ShardSetup, wiring: Wiring) {
    let id = setup.placement.shard;
    let events = setup.events.clone();
    if let Err(msg) = run_shard_inner(setup, wiring).await {
        let _ = events.send(Event::Failed(id, msg));
    }
}

async fn run_shard_inner(mut s: ShardSetup, wiring: Wiring) -> Result<(), String> {
    let id = s.placement.shard;
    // The admin endpoint comes up first: live during recovery, ready after.
    let admin = start_admin(&s)?;
    let store = open_store(&s).await?;
    let shard = Shard::new(id, s.count, s.seed, store.clone());
    if s.cluster_pgs != 0 {
        shard.set_cluster(s.cluster_pgs);
    }
    shard.set_timeouts(
        Duration::from_secs(s.cfg.cross_shard_timeout_s),
        Duration::from_secs(s.cfg.session_idle_timeout_s),
    );
    if s.cfg.data_ring {
        attach_ring(&s, &store, &shard);
    }
    shard.connect(wiring).await;
    if id == BUCKET_OWNER_SHARD {
        shard.publish_buckets().await;
        shard.start_all().await;
    } else {
        shard.wait_started().await;
    }
    shard.start_lifecycle(crate::shard::lifecycle::LifecycleSettings {
        interval: Duration::from_secs(s.cfg.lifecycle_interval_s),
        actions_per_sec: s.cfg.lifecycle_actions_per_sec,
        day_ms: s.cfg.lifecycle_day_s.saturating_mul(1000),
        cluster_key: (s.cluster_pgs != 0)
            .then(|| crate::cluster::peer_http::cluster_key(&s.s3_cfg.credentials.secret_key)),
    });
    if shard.is_cluster() {
        let (_, rx) = std::sync::mpsc::channel();
        shard.start_map_feed(std::mem::replace(&mut s.map_rx, rx));
        if shard.id == 0 {
            // A node that joined (or came back) takes its placement
            // groups' writes from their primaries before it leads any.
            let ckey = crate::cluster::peer_http::cluster_key(&s.s3_cfg.credentials.secret_key);
            crate::cluster::replicate::start_catch_up(shard.clone(), ckey);
            crate::cluster::replicate::start_repair(shard.clone(), ckey);
            crate::cluster::replicate::start_releases(shard.clone(), ckey);
            crate::cluster::replicate::start_drop_copies(shard.clone(), ckey);
        }
        if let Some(rx) = s.catalog_rx.take() {
            crate::cluster::catalog::start_feed(shard.clone(), rx);
        }
    }
    let fronts = Fronts::start(&s, &shard);
    if let Some((state, _)) = &admin {
        state.set_ready(shard.clone());
    }
    let _ = s.events.send(Event::Ready(id));

    wait_eventfd(s.drain_fd).await;
    if let Some((state, _)) = &admin {
        state.set_draining();
    }
    fronts.drain().await;
    let _ = s.events.send(Event::Drained(id));
    // Other shards may still forward work here until everyone has drained.
    wait_eventfd(s.stop_fd).await;
    store.shutdown().await;
    drop(admin);
    tracing::info!(shard = id, "stopped");
    Ok(())
}

/// The admin endpoint's state and its accept loop (dropped: stops).
type AdminDoor = (Rc<Admin>, glommio::Task<()>);

/// The admin endpoint and its accept loop, on the bucket-owner shard only.
fn start_admin(s: &ShardSetup) -> Result<Option<AdminDoor>, String> {
    if s.placement.shard != BUCKET_OWNER_SHARD {
        return Ok(None);
    }
    let state = Admin::new(AdminWrites {
        secret_key: s.cfg.secret_key.clone(),
        default_credentials: s.cfg.default_credentials,
        open: s.cfg.admin_open_writes,
    });
    let listener = glommio::net::TcpListener::bind(s.cfg.admin)
        .map_err(|e| format!("cannot listen on {} for admin: {e}", s.cfg.admin))?;
    let door = Door {
        name: "admin",
        shard: s.placement.shard,
        limit: None,
    };
    let served = state.clone();
    let task = listen::spawn_accept_loop(listener, door, move |stream| {
        admin::serve_connection(served.clone(), stream)
    });
    Ok(Some((state, task)))
}

/// Recovers the shard's store from its directory.
async fn open_store(s: &ShardSetup) -> Result<Store, String> {
    let id = s.placement.shard;
    let shard_id = u32::try_from(id).map_err(|_| format!("shard id {id} is past u32"))?;
    let mut store_cfg = StoreConfig::new(shard_id, s.shard_dir.clone());
    // A cluster node orders its versions across replicas by stamps.
    store_cfg.write_stamps = s.cluster_pgs != 0;
    store_cfg.direct_io = s.direct_io;
    store_cfg.segment_bytes_max = s.cfg.segment_bytes_max;
    store_cfg.object_cache_bytes_max =
        usize::try_from(s.cfg.object_cache_mb.saturating_mul(1 << 20) / s.count.max(1) as u64)
            .unwrap_or(usize::MAX);
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
    Ok(store)
}

/// Creates the shard's data ring and hands it to the store and the shard;
/// without one (memlock, io_uring refused) GETs use the copy path.
fn attach_ring(s: &ShardSetup, store: &Store, shard: &Shard) {
    let id = s.placement.shard;
    // After pinning: the pool's pages are allocated on this CPU's node.
    let ring = crate::ring::BufferPool::new(RING_BUF_BYTES, RING_BUFFERS).and_then(|pool| {
        let cfg = crate::ring::RingConfig {
            sqpoll_idle_ms: s.cfg.ring_sqpoll_idle_ms,
            // The config refuses CPUs past u32 (`cpu_list`).
            sqpoll_cpu: s
                .cfg
                .ring_sqpoll_cpus
                .as_ref()
                .filter(|c| !c.is_empty())
                .and_then(|c| u32::try_from(c[id % c.len()]).ok()),
            submit_batch_max: s.cfg.ring_submit_batch,
            send_zc_min_bytes: s.cfg.ring_send_zc_min_bytes,
            ..Default::default()
        };
        crate::ring::DataRing::new(cfg, Some(pool))
    });
    match ring {
        Ok(ring) => {
            store.attach_ring(ring.clone());
            shard.set_ring(ring);
        }
        Err(e) => tracing::warn!(
            shard = id,
            "data ring unavailable ({e}); GETs use the copy path. Check memlock (ulimit -l) and io_uring (kernel.io_uring_disabled)"
        ),
    }
}

/// The shard's S3 and native front doors with their accept loops.
struct Fronts {
    s3: Rc<S3Front>,
    native: Rc<NativeFront>,
    accept: Vec<glommio::Task<()>>,
}

impl Fronts {
    fn start(s: &ShardSetup, shard: &Rc<Shard>) -> Fronts {
        let id = s.placement.shard;
        let conns_max = u64::try_from(s.cfg.connections_per_shard_max).unwrap_or(u64::MAX);
        let limit = |accepted, open| ConnLimit {
            shard: shard.clone(),
            conns_max,
            accepted,
            open,
        };
        let s3 = S3Front::new(shard.clone(), Rc::new(s.s3_cfg.clone()));
        let native = NativeFront::new(
            shard.clone(),
            Rc::new(NativeConfig {
                credentials: s3.cfg.credentials.clone(),
                ports: s.native_ports.clone(),
                put_data_timeout: Duration::from_secs(s.cfg.native_put_data_timeout_s),
            }),
        );
        let s3_door = Door {
            name: "S3",
            shard: id,
            limit: Some(limit(|m| &m.connections_accepted, |m| &m.connections_open)),
        };
        let native_door = Door {
            name: "native",
            shard: id,
            limit: Some(limit(
                |m| &m.native_connections_accepted,
                |m| &m.native_connections_open,
            )),
        };
        // SAFETY: both were bound and listening in the main thread
        // (steer::bind_group, listen::bind_native), and this shard is the
        // only owner of its own pair.
        let (s3_listener, native_listener) =
            unsafe { (listen::adopt(s.s3_fd), listen::adopt(s.native_fd)) };
        let front = s3.clone();
        let s3_accept = listen::spawn_accept_loop(s3_listener, s3_door, move |stream| {
            front.clone().serve_connection(stream)
        });
        let front = native.clone();
        let native_accept =
            listen::spawn_accept_loop(native_listener, native_door, move |stream| {
                front.clone().serve_connection(stream)
            });
        Fronts {
            s3,
            native,
            accept: vec![s3_accept, native_accept],
        }
    }

    /// Stops accepting, refuses new requests, and waits (up to DRAIN_WAIT)
    /// for the requests in flight.
    async fn drain(self) {
        self.s3.draining.set(true);
        self.native.draining.set(true);
        drop(self.accept);
        let deadline = Instant::now() + DRAIN_WAIT;
        while self.s3.shard.metrics().requests_in_flight.get() > 0 && Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }
}
