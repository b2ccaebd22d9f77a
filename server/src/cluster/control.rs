//! The control thread of a cluster node (`percore serve --cluster`): joins
//! the map, checks its own entry, and marks nodes whose lease expired
//! `down` (then `out` after the grace period). One plain thread with
//! blocking etcd calls: nothing here touches a shard, and a slow or lost
//! etcd stalls only this thread (the node keeps serving, but not the keys
//! it leads once its lease is not confirmed). The lease's keepalives run
//! on a thread of their own (`keep_lease`): a map change costs this thread
//! CPU time that grows with the cluster (every group placed: seconds at
//! 1,000 nodes and 65,536 groups), which must not delay a renewal.
//! It hands each new map to the shards and says how long the
//! node may lead keys (`may_lead`: its lease and map confirmed by etcd).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use percore_protocol::placement::NodeState;
use tracing::{error, info, warn};

use super::catalog;
use super::etcd::Etcd;
use super::handoff;
use super::map::{self, JoinError, Joining, Keys, View};
use super::shardmap::{MapFeed, Report, ShardMap, SkipAsk, SKIP_DONE, SKIP_FAILED};
use crate::boot::datadir::ClusterBinding;

/// A node's cluster settings (`serve --cluster URLS --node NAME ...`).
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub urls: String,
    pub cluster: String,
    pub node: String,
    pub zone: String,
    /// Lease time: a node silent this long is marked down.
    pub lease_ttl_s: u64,
    /// The most a catch-up (backfill) takes per second, MiB (0: no bound).
    pub backfill_mib_s: u64,
}

/// What the control thread shares with the rest of the node: plain
/// atomics, written by the control thread and the lease keeper
/// (`keep_lease`: `leased`, `lead_until_ms`, `etcd_errors`).
#[derive(Default)]
pub struct ClusterStatus {
    pub epoch: AtomicU64,
    /// The epoch of the first map read after this process's latest join
    /// (0: none yet). A node on a replaced disk (`MapNode::empty`) refuses
    /// copies sent under older maps: their senders may count them
    /// (`replicate::check_push`).
    pub joined_epoch: AtomicU64,
    pub node_id: AtomicU64,
    /// Whether the lease is held (the node counts as up).
    pub leased: AtomicBool,
    /// Until when this node may lead keys (`mono_ms`): the send time of
    /// the last keepalive etcd answered plus the lease less `lead_margin_ms`.
    /// etcd expires the lease no sooner than that send time plus the
    /// lease, and only then can another node be made acting primary of
    /// this node's groups; so a node cut off from etcd stops serving the
    /// keys it led before anyone may take them over (no stale read, no
    /// write acknowledged on two sides). 0: not yet.
    pub lead_until_ms: AtomicU64,
    /// The oldest map under which this node may lead: the map read right
    /// after it joined again (shards still running an older map, in which
    /// it may have led groups it no longer leads, serve none of them).
    pub lead_epoch: AtomicU64,
    /// Until when this node may lead under the map it holds (`mono_ms`):
    /// the send time of its last map read plus `map_fresh_ms`. A node
    /// that takes a group over from one that is still up waits longer
    /// than that (`ShardMap::set_takeovers`), so the two never serve a
    /// group at once. 0: not yet.
    pub map_until_ms: AtomicU64,
    /// The backfill rate bound, bytes per second (0: none).
    pub backfill_bytes_s: AtomicU64,
    /// This node's lease time (`cluster_lease_ttl_s`), ms.
    pub ttl_ms: AtomicU64,
    /// Bytes taken by catch-ups (backfill) since start.
    pub backfill_bytes: AtomicU64,
    /// Groups (times their sources, when merged) the running catch-up
    /// pass has still to take.
    pub backfill_groups_left: AtomicU64,
    /// Per placement group, the sources the running catch-up pass has
    /// still to take it from (0: none running, or taken). Sized once, by
    /// the first pass (a cluster's group count never changes).
    backfill_sources_left: std::sync::OnceLock<Box<[AtomicU32]>>,
    /// The node was removed from the map while it ran: it no longer takes
    /// part (restart it to join as a new node).
    pub removed: AtomicBool,
    pub etcd_errors: AtomicU64,
    /// Map reads by `check_map`: the whole map read, the last one
    /// confirmed unchanged.
    pub map_reads: [AtomicU64; 2],
    /// Nodes in the map by state, as of the last map read: up, down,
    /// draining, out.
    pub nodes: [AtomicU64; 4],
    /// Live copies of keys of groups this node gave up that the groups'
    /// primaries do not hold, as of the last pass that dropped copies
    /// (`replicate::start_drop_copies`): kept, never dropped.
    pub copies_stranded: AtomicU64,
}

/// The node's cluster status, once it has joined (for `/metrics`, and
/// `may_lead` on the shards: plain atomics written by the control thread).
pub static STATUS: std::sync::OnceLock<Arc<ClusterStatus>> = std::sync::OnceLock::new();

/// A node as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    id: u32,
    state: String,
    /// When it took that state.
    since_ms: u64,
    zone: String,
}

/// What places groups on nodes, per node: its id, state and when it took
/// that state (`since_ms` moves on every state change, so a change and
/// its reversal in maps a node never saw still show). A node's `synced`
/// flag is not in it: it moves primaries, not replicas.
fn membership(view: &View) -> Vec<Member> {
    view.nodes
        .iter()
        .map(|(n, _)| Member {
            id: n.id,
            state: n.state.clone(),
            since_ms: n.since_ms,
            zone: n.zone.clone(),
        })
        .collect()
}

/// Whether maps between `before` and `now` (both of node `me`) may have
/// taken a group from `me` and given it back. A group leaves a node only
/// when another node enters its replicas (placed: `up` or `down`), or
/// when the node itself stops holding (drained, out); to give it back,
/// that node must leave again. So some node that holds nothing now
/// (draining, out) changed since `before` (its state or `since_ms`), or
/// any node moved to another zone, or one was removed, or `me` itself
/// changed; a node added and removed unseen needs half a lease or more
/// without a map read (`publish`'s `blind`). A node that returned
/// (`down` to `up`), or was added and holds groups now, gives nothing
/// back: no catch-up for those.
fn may_have_left_and_returned(me: u32, before: &[Member], now: &[Member]) -> bool {
    let removed = before.iter().any(|b| !now.iter().any(|n| n.id == b.id));
    removed
        || now.iter().any(|n| {
            let placed = matches!(
                NodeState::from_name(&n.state),
                Some(NodeState::Up | NodeState::Down)
            );
            let rezoned = before.iter().any(|b| b.id == n.id && b.zone != n.zone);
            rezoned || ((n.id == me || !placed) && !before.contains(n))
        })
}

/// How much sooner than etcd a node gives up leading: room for a request
/// that checked `may_lead` to finish, for clock rate differences and for
/// a paused process. A quarter of the lease, at least 500 ms.
fn lead_margin_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 4).max(500).min(ttl_ms / 2)
}

/// A monotonic clock in ms, shared by the control thread and the shards.
#[must_use]
pub fn mono_ms() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(BASE.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// How long a map read stays good for leading: two thirds of the lease
/// (the control thread reads the map every third).
fn map_fresh_ms(ttl_ms: u64) -> u64 {
    ttl_ms.saturating_mul(2) / 3
}

/// The least time between two rounds of skips recorded in etcd: under
/// load with a replica failing, a round per this many writes' worth of
/// time, not one per write.
const SKIP_GAP: Duration = Duration::from_millis(50);

/// The longest a map confirmed unchanged by its revision alone is kept
/// before the map is read in full again.
const WHOLE_READ_MAX: Duration = Duration::from_secs(30);

/// The least time between map reads made to answer releases.
const RELEASE_READ_GAP: Duration = Duration::from_millis(100);

/// How long a node that takes a group over from a node still up waits:
/// longer than that node may go on leading under the older map.
pub fn takeover_wait_ms(ttl_ms: u64) -> u64 {
    map_fresh_ms(ttl_ms) + lead_margin_ms(ttl_ms)
}

/// Whether this node may act as the primary of group `pg` (`None`: of
/// every group it leads) under `map` now: its lease is known to be alive
/// at etcd (`ClusterStatus::lead_until_ms`), its last map read is recent
/// (`map_until_ms`), `map` is not older than its last join, and it is not
/// waiting to take the group over (`ShardMap::lead_after`), and it is
/// synced. Always Ok on a single node. Err: why not, for a 503's message.
pub fn may_lead(map: &ShardMap, pg: Option<u32>) -> Result<(), &'static str> {
    if !confirmed(map) {
        return Err(LAPSED);
    }
    if map.lead_after(pg) > mono_ms() {
        return Err(TAKING_OVER);
    }
    // The acting primary of a group with no synced replica up is its
    // first up replica, which may lack writes a majority acknowledged
    // (it was down, or skipped): it serves the group only once its
    // catch-up merged it from a majority and it turned synced.
    if !map.node(map.node_id).is_some_and(|n| n.synced) && (pg.is_some() || map.leads_any()) {
        return Err(NOT_SYNCED);
    }
    Ok(())
}

/// Whether this node's lease is known to be alive at etcd and its last
/// map read is recent, and `map` is not older than its last join (the
/// first of `may_lead`'s conditions). Always true on a single node.
pub fn confirmed(map: &ShardMap) -> bool {
    let Some(s) = STATUS.get() else {
        return true;
    };
    let now = mono_ms();
    map.epoch >= s.lead_epoch.load(Ordering::Acquire)
        && now < s.lead_until_ms.load(Ordering::Acquire)
        && now < s.map_until_ms.load(Ordering::Acquire)
}

/// Why `may_lead` refused: this node leads a group unsynced.
pub const NOT_SYNCED: &str = "no synced replica of the key's placement group is up: this node leads it once it has caught up from a majority of the group's replicas (not counting replicas on a replaced, empty disk); retry";

/// Why `may_lead` refused: the lease or the map is not confirmed.
pub const LAPSED: &str = "this node cannot confirm its cluster lease and map with etcd (is etcd reachable from it?): it serves no keys until it does, and another replica takes over its keys once its lease expires; retry";
/// Why `may_lead` refused: a takeover wait.
pub const TAKING_OVER: &str = "this node is taking over the key's placement group from a node that may still serve it for a moment; retry";

impl ClusterStatus {
    /// `backfill_sources_left` (empty before the first catch-up pass).
    pub fn backfill_sources_left(&self) -> &[AtomicU32] {
        self.backfill_sources_left.get().map_or(&[], |v| v)
    }

    /// `backfill_sources_left`, sized for `pgs` groups if it is not yet.
    pub fn backfill_sources_sized(&self, pgs: u32) -> &[AtomicU32] {
        self.backfill_sources_left
            .get_or_init(|| (0..pgs).map(|_| AtomicU32::new(0)).collect())
    }

    /// Lets this node lead under maps of `epoch` or newer (0: keeps the
    /// current floor) until `ttl_s` after `sent` (less the margin): etcd
    /// confirmed at or after `sent` that the lease lives `ttl_s` more.
    fn lead(&self, epoch: u64, sent: u64, ttl_s: u64) {
        let ttl_ms = ttl_s.saturating_mul(1000);
        if epoch > 0 {
            self.lead_epoch.fetch_max(epoch, Ordering::AcqRel);
        }
        let until = sent.saturating_add(ttl_ms.saturating_sub(lead_margin_ms(ttl_ms)));
        self.lead_until_ms.store(until, Ordering::Release);
    }

    /// A map read sent at `sent` (`mono_ms`) succeeded: this node may lead
    /// under it for `map_fresh_ms`.
    fn map_read(&self, sent: u64, ttl_s: u64) {
        let until = sent.saturating_add(map_fresh_ms(ttl_s.saturating_mul(1000)));
        self.map_until_ms.store(until, Ordering::Release);
    }

    /// `percore_cluster_serving`, and
    /// `percore_cluster_backfill_group_sources_left`: the groups the
    /// running catch-up has sources left for.
    fn render_serving_and_groups(&self, out: &mut String) {
        metric(
            out,
            "percore_cluster_serving",
            "1 while this node answers requests: etcd confirmed its copy of the cluster's buckets and users, and its lease, recently enough (0: it answers 503; is etcd reachable from it?).",
            "gauge",
            &[(String::new(), u64::from(super::catalog::serving()))],
        );
        metric(
            out,
            "percore_cluster_copies_stranded",
            "Live copies of keys of placement groups this node gave up that the groups' acting primaries do not hold (as of the last look, every 10 minutes or at a map change): kept, never dropped. Nonzero: a placement went wrong (docs/cluster.md, 'Recorded hand-offs') or writes were never acknowledged; do not remove this node before it is 0 or the keys are checked.",
            "gauge",
            &[(String::new(), self.copies_stranded.load(Ordering::Relaxed))],
        );
        let per_group: Vec<(String, u64)> = self
            .backfill_sources_left()
            .iter()
            .enumerate()
            .filter_map(|(pg, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then(|| (format!("{{pg=\"{pg}\"}}"), u64::from(n)))
            })
            .take(super::shardmap::GROUP_SERIES_MAX)
            .collect();
        metric(
            out,
            "percore_cluster_backfill_group_sources_left",
            "Per placement group the running catch-up still has to take (at most 4096 groups, the lowest): the nodes it has still to take it from (1, or more when it merges from several replicas). No series: no catch-up runs, or the group is taken.",
            "gauge",
            &per_group,
        );
    }

    /// The Prometheus text of the cluster gauges.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(1024);
        let mut gauge = |name: &str, help: &str, kind: &str, samples: &[(String, u64)]| {
            metric(&mut out, name, help, kind, samples);
        };
        let plain = |v: u64| vec![(String::new(), v)];
        gauge(
            "percore_cluster_epoch",
            "The cluster map epoch this node last read.",
            "gauge",
            &plain(self.epoch.load(Ordering::Relaxed)),
        );
        gauge(
            "percore_cluster_node_id",
            "This node's id in the cluster.",
            "gauge",
            &plain(self.node_id.load(Ordering::Relaxed)),
        );
        gauge(
            "percore_cluster_leased",
            "1 while this node holds its etcd lease (it counts as up).",
            "gauge",
            &plain(u64::from(self.leased.load(Ordering::Relaxed))),
        );
        gauge(
            "percore_cluster_may_lead",
            "1 while etcd has confirmed this node's lease recently enough for it to serve the keys it leads (0: it answers 503 for them; is etcd reachable from it?).",
            "gauge",
            &plain(u64::from({
                let now = mono_ms();
                now < self.lead_until_ms.load(Ordering::Acquire)
                    && now < self.map_until_ms.load(Ordering::Acquire)
            })),
        );
        gauge(
            "percore_cluster_backfill_bytes_total",
            "Bytes this node took from other nodes to catch up (backfill).",
            "counter",
            &plain(self.backfill_bytes.load(Ordering::Relaxed)),
        );
        gauge(
            "percore_cluster_backfill_groups_left",
            "Placement groups (times their sources, when merged) this node's running catch-up has still to take (0: none running).",
            "gauge",
            &plain(self.backfill_groups_left.load(Ordering::Relaxed)),
        );
        gauge(
            "percore_cluster_backfill_limit_bytes_per_second",
            "The backfill rate bound (cluster_backfill_mib_s; 0: none).",
            "gauge",
            &plain(self.backfill_bytes_s.load(Ordering::Relaxed)),
        );
        gauge(
            "percore_cluster_removed",
            "1 if this node was removed from the cluster while it ran.",
            "gauge",
            &plain(u64::from(self.removed.load(Ordering::Relaxed))),
        );
        gauge(
            "percore_cluster_etcd_errors_total",
            "Failed calls to etcd of the control thread and the lease keeper.",
            "counter",
            &plain(self.etcd_errors.load(Ordering::Relaxed)),
        );
        let reads: Vec<(String, u64)> = ["full", "unchanged"]
            .iter()
            .zip(&self.map_reads)
            .map(|(k, n)| (format!("{{kind=\"{k}\"}}"), n.load(Ordering::Relaxed)))
            .collect();
        gauge(
            "percore_cluster_map_reads_total",
            "Periodic map reads: `full` (the whole map read: etcd changed since the last, or that one is 30 s old), `unchanged` (one small read found no change).",
            "counter",
            &reads,
        );
        let states = [
            NodeState::Up,
            NodeState::Down,
            NodeState::Draining,
            NodeState::Out,
        ];
        let by_state: Vec<(String, u64)> = states
            .iter()
            .zip(&self.nodes)
            .map(|(s, n)| {
                (
                    format!("{{state=\"{}\"}}", s.name()),
                    n.load(Ordering::Relaxed),
                )
            })
            .collect();
        gauge(
            "percore_cluster_nodes",
            "Nodes in the cluster map by state, as this node last read it.",
            "gauge",
            &by_state,
        );
        self.render_serving_and_groups(&mut out);
        out
    }
}

/// One metric family in Prometheus text: its help and type, then its
/// samples (labels, value).
fn metric(out: &mut String, name: &str, help: &str, kind: &str, samples: &[(String, u64)]) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    for (labels, v) in samples {
        out.push_str(&format!("{name}{labels} {v}\n"));
    }
}

/// The control thread's etcd client and identity.
struct Control {
    etcd: Etcd,
    keys: Keys,
    joining: Joining,
    id: u32,
    /// The lease this node's `alive/` key is on (its keeper renews it).
    lease: i64,
    share: Arc<LeaseShare>,
    ttl_s: u64,
    cluster: String,
    feed: MapFeed,
    /// The placement groups this node held under the map last handed to
    /// the shards (None: none handed yet), sorted.
    held: Option<Vec<u32>>,
    /// The epoch of the map last handed to the shards and what moves
    /// placement groups in it (`membership`): a gap in epochs across
    /// which it changed may have taken a group away and back.
    membership: Option<(u64, Vec<Member>)>,
    /// When `publish` last ran (a map read succeeded).
    published_at: Option<Instant>,
    /// Its lease expired and it has not yet joined again and handed the
    /// map read after that join to its shards: it leads nothing until it
    /// has (`renew`).
    rejoining: bool,
    /// The newest epoch another node asked this one to release at, not
    /// yet answered (0: none): the next map read answers it (`release`).
    release_wanted: u64,
    /// When the last map read was sent (None: none yet).
    read_sent: Option<Instant>,
    /// When the last round of skips was recorded (`skip`).
    skipped_at: Option<Instant>,
    /// The map as last read (`check_map`), tried first by `skip`; None
    /// once a skip may have moved it.
    view: Option<View>,
    /// When `view` was read in full.
    view_read_at: Instant,
    /// The node stops: who to tell once the lease is given up, and when
    /// to give it up at the latest (`leave`).
    leaving: Option<(std::sync::mpsc::Sender<bool>, Instant)>,
    /// The bucket catalog last handed to the bucket-owner shard: its
    /// revision, when, and whether it was a whole read (`sync_catalog`).
    catalog_sent: Option<(i64, Instant, bool)>,
    /// The catalog's revision as last read from etcd (0: none yet, or no
    /// catalog: a cluster made before it).
    catalog_seen: i64,
    /// The map epoch `settle` last ran under (it runs once per map).
    settled_epoch: u64,
}

/// A catalog handed to the bucket-owner shard and not applied within
/// this is handed again (the shard failed to apply it, or it is slow).
const CATALOG_RESEND: Duration = Duration::from_secs(5);

/// Lets the node leave the cluster when it stops (`Report::Leave`).
pub struct Leaver {
    tx: std::sync::mpsc::Sender<Report>,
}

/// How long a stopping node waits, once its shards have stopped, for the
/// control thread to give up the lease (an etcd call in progress, then
/// the revoke, each on every etcd URL in turn at worst).
const LEAVE_WAIT: Duration = Duration::from_secs(15);

impl Leaver {
    /// The node stops: it leads nothing from now on (its shards answer 503
    /// for the keys it led; a write in progress checks again before it is
    /// acknowledged). Call `drained` once the shards have stopped.
    #[must_use]
    pub fn begin(&self) -> Option<std::sync::mpsc::Receiver<bool>> {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        self.tx.send(Report::Leave(done_tx)).ok()?;
        Some(done_rx)
    }

    /// The shards have stopped (nothing that checked `may_lead` runs any
    /// more): the control thread gives up the lease now, so that the other
    /// nodes mark this one down at their next map read and take its groups
    /// over, instead of once the lease expires. Waits for it (at most
    /// `LEAVE_WAIT`): Some(whether the lease was given up), None if that
    /// did not come in time (it then expires as after a crash).
    pub fn drained(&self, done: &std::sync::mpsc::Receiver<bool>) -> Option<bool> {
        let _ = self.tx.send(Report::Drained);
        done.recv_timeout(LEAVE_WAIT).ok()
    }
}

/// The placement settings of the cluster (read before the node's data
/// directory is opened: the data is bound to them).
pub fn binding(settings: &ClusterSettings) -> Result<ClusterBinding, String> {
    let etcd = Etcd::with_timeout(&settings.urls, Duration::from_secs(5))?;
    let keys = Keys::new(&settings.cluster)?;
    let config = map::config(&etcd, &keys)?;
    config.seed()?;
    Ok(ClusterBinding {
        name: settings.cluster.clone(),
        created_ms: config.created_ms,
        pgs: config.pgs,
        seed: config.seed,
    })
}

/// Joins the cluster (before the node serves: a node that cannot join does
/// not start) and starts the control thread. A previous process of this
/// node whose lease has not expired yet (a restart after kill -9) is
/// waited for, up to the lease time.
pub fn start(
    settings: ClusterSettings,
    mut joining: Joining,
    feed: MapFeed,
) -> Result<(Arc<ClusterStatus>, Leaver), String> {
    let ttl_s = settings.lease_ttl_s.clamp(3, 3600);
    // Each call to etcd well within a third of the lease.
    let timeout = Duration::from_millis((ttl_s * 1000 / 8).clamp(500, 5000));
    let etcd = Etcd::with_timeout(&settings.urls, timeout)?;
    let keys = Keys::new(&settings.cluster)?;
    joining.nonce = format!("{:032x}", rand::random::<u128>()).into_bytes();
    let (record, lease, lease_from) = first_join(&etcd, &keys, &joining, ttl_s)?;
    // Recorded (`NodeRecord::empty`); a later join of this process keeps
    // the record's flag until the node syncs.
    joining.fresh = false;
    let status = Arc::new(ClusterStatus::default());
    status
        .ttl_ms
        .store(ttl_s.saturating_mul(1000), Ordering::Relaxed);
    status
        .node_id
        .store(u64::from(record.id), Ordering::Relaxed);
    status.leased.store(true, Ordering::Relaxed);
    status.backfill_bytes_s.store(
        settings.backfill_mib_s.saturating_mul(1 << 20),
        Ordering::Relaxed,
    );
    let _ = STATUS.set(status.clone());
    info!(
        node = %record.name,
        id = record.id,
        zone = %record.zone,
        cluster = %settings.cluster,
        "joined the cluster"
    );
    let shared = status.clone();
    // The lease is renewed from now on, by its own thread (the first map
    // read below may take seconds on a large map).
    let share = Arc::new(LeaseShare::new(lease));
    spawn_keeper(
        &share,
        &status,
        feed.synced_tx.clone(),
        &settings.urls,
        timeout,
    )?;
    let mut control = Control {
        etcd,
        keys,
        joining,
        id: record.id,
        lease,
        share,
        ttl_s,
        cluster: settings.cluster.clone(),
        feed,
        held: None,
        membership: None,
        published_at: None,
        rejoining: false,
        release_wanted: 0,
        read_sent: None,
        skipped_at: None,
        view: None,
        view_read_at: Instant::now(),
        leaving: None,
        catalog_sent: None,
        catalog_seen: 0,
        settled_epoch: 0,
    };
    // The shards' first map, before the node says it is ready (a failed
    // read is retried by the control loop; until then key requests on the
    // native door answer Busy).
    let sent = mono_ms();
    match map::load(&control.etcd, &control.keys) {
        Ok(view) => {
            status.joined_epoch.store(view.epoch, Ordering::Release);
            control.publish(&view);
            if control.feed.sent_epoch() >= view.epoch {
                status.map_read(sent, control.ttl_s);
            }
            // Unless the keeper found the lease gone meanwhile (the
            // control thread joins again).
            let held = control.share.held();
            if held.lease == lease {
                status.lead(view.epoch, lease_from, control.ttl_s);
            }
        }
        Err(e) => warn!(error = %e, "cluster: cannot read the map yet; retrying"),
    }
    // And the cluster's buckets (until the bucket-owner shard applied
    // them, the node answers no bucket change and no bucket list).
    let _ = control.check_catalog(mono_ms());
    let leaver = Leaver {
        tx: control.feed.synced_tx.clone(),
    };
    std::thread::Builder::new()
        .name("percore-cluster".into())
        .spawn(move || control.run(&shared))
        .map_err(|e| format!("cannot start the cluster control thread: {e}"))?;
    Ok((status, leaver))
}

/// A node's first join: a new lease, and its record joined on it (waiting
/// up to the lease time for a previous process's `alive/` key to expire).
/// Returns the record, the lease and when it was last renewed (`mono_ms`).
fn first_join(
    etcd: &Etcd,
    keys: &Keys,
    joining: &Joining,
    ttl_s: u64,
) -> Result<(map::NodeRecord, i64, u64), String> {
    let mut lease_from = mono_ms();
    let lease = etcd.lease_grant(i64::try_from(ttl_s).unwrap_or(10))?;
    let deadline = Instant::now() + Duration::from_secs(ttl_s + 2);
    loop {
        match map::join(etcd, keys, joining, lease, None) {
            Ok(r) => return Ok((r, lease, lease_from)),
            Err(JoinError::AliveElsewhere) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500));
                // Our own lease must outlive the wait.
                lease_from = mono_ms();
                etcd.lease_keepalive(lease)?;
            }
            Err(JoinError::AliveElsewhere) => {
                let _ = etcd.lease_revoke(lease);
                return Err(format!(
                    "another process runs as node {} (its lease is still renewed); stop it, or give this one another --node",
                    joining.name
                ));
            }
            Err(JoinError::Removed) => unreachable!("a first join takes any id"),
            Err(JoinError::Etcd(e)) => {
                let _ = etcd.lease_revoke(lease);
                return Err(e);
            }
        }
    }
}

/// Starts the lease keeper's thread.
fn spawn_keeper(
    share: &Arc<LeaseShare>,
    status: &Arc<ClusterStatus>,
    wake: std::sync::mpsc::Sender<Report>,
    urls: &str,
    timeout: Duration,
) -> Result<(), String> {
    let keeper = Etcd::with_timeout(urls, timeout)?;
    let (share, status) = (share.clone(), status.clone());
    let ttl_s = status.ttl_ms.load(Ordering::Relaxed) / 1000;
    std::thread::Builder::new()
        .name("percore-lease".into())
        .spawn(move || keep_lease(&keeper, &share, &status, ttl_s, &wake))
        .map(drop)
        .map_err(|e| format!("cannot start the cluster lease thread: {e}"))
}

/// The lease the keeper renews (0: none), and whether a renewal of it
/// lets the node lead (not while the node joins again: until the map read
/// after that join is with its shards; not while it stops).
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    lease: i64,
    leads: bool,
}

/// What the control thread and the lease keeper (`keep_lease`) share.
struct LeaseShare {
    /// Held while `ClusterStatus::lead_until_ms` is set from a renewal,
    /// so that a renewal of a lease being replaced, or of one that no
    /// longer leads, never lets the node lead again.
    held: Mutex<Held>,
    /// The keeper found the lease gone: the control thread joins again.
    expired: AtomicBool,
    /// The control thread ended: so does the keeper.
    stop: AtomicBool,
    /// When the control loop last went round (`mono_ms`): a control
    /// thread stuck for longer than `stuck_ms` lets the lease expire, so
    /// that the other nodes take its groups over (its map, no longer
    /// confirmed, lets it lead nothing).
    beat_ms: AtomicU64,
}

impl LeaseShare {
    fn new(lease: i64) -> LeaseShare {
        LeaseShare {
            held: Mutex::new(Held { lease, leads: true }),
            expired: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            beat_ms: AtomicU64::new(mono_ms()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        // A panic while held leaves plain values: still good.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How long the control loop may go without a turn before the keeper
/// stops renewing the lease: six leases, at least 60 s (a map change at
/// 1,000 nodes and 65,536 groups takes the loop a few seconds, a failure
/// mark made in parts a few times that).
fn stuck_ms(ttl_ms: u64) -> u64 {
    ttl_ms.saturating_mul(6).max(60_000)
}

/// Ends the keeper when the control thread ends, however it ends.
struct StopKeeper(Arc<LeaseShare>);

impl Drop for StopKeeper {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Release);
    }
}

/// The lease keeper's thread: renews the lease every third of its time
/// (two renewals may fail before it expires), whatever the control thread
/// is doing unless it is stuck (`stuck_ms`), and says until when the node
/// may lead (`ClusterStatus::lead`). A lease etcd says is gone: the node
/// leads nothing, and the control thread is woken (`Report::LeaseLost`)
/// to join again with a new one. The first renewal is at once (the join
/// and first map read before took some of the lease).
fn keep_lease(
    etcd: &Etcd,
    share: &LeaseShare,
    status: &ClusterStatus,
    ttl_s: u64,
    wake: &std::sync::mpsc::Sender<Report>,
) {
    let period = Duration::from_millis(ttl_s * 1000 / 3);
    let stuck = stuck_ms(ttl_s.saturating_mul(1000));
    let mut next = Instant::now();
    // When each kind of failure was last logged (stuck, renewal failed):
    // at most one line of each per 10 s.
    let mut logged: [Option<Instant>; 2] = [None; 2];
    let mut log = |kind: usize, what: &dyn Fn()| {
        if logged[kind].is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            what();
            logged[kind] = Some(Instant::now());
        }
    };
    while !share.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep((next - now).min(Duration::from_millis(100)));
            continue;
        }
        let lease = share.held().lease;
        if lease == 0 {
            next = now + Duration::from_millis(100);
            continue;
        }
        let quiet = mono_ms().saturating_sub(share.beat_ms.load(Ordering::Acquire));
        if quiet > stuck {
            log(0, &|| {
                error!(quiet_ms = quiet, "cluster: the control thread has not gone round for this long; the lease is left to expire, so that the other nodes take this node's groups over")
            });
            next = now + Duration::from_millis(500);
            continue;
        }
        // Scheduled from when each call was sent: a slow etcd does not
        // stretch the time between renewals.
        let sent = mono_ms();
        let renewed = catch_unwind(AssertUnwindSafe(|| etcd.lease_keepalive(lease)));
        let mut held = share.held();
        match renewed {
            Ok(Ok(ttl)) if ttl > 0 => {
                if held.lease == lease {
                    status.leased.store(true, Ordering::Relaxed);
                    if held.leads {
                        let ttl_s = u64::try_from(ttl).unwrap_or(0).min(ttl_s);
                        status.lead(0, sent, ttl_s);
                    }
                }
                next = now + period;
            }
            Ok(Ok(_)) => {
                if held.lease == lease {
                    *held = Held::default();
                    status.lead_until_ms.store(0, Ordering::Release);
                    status.leased.store(false, Ordering::Relaxed);
                    share.expired.store(true, Ordering::Release);
                    warn!("cluster: this node's lease had expired; joining again (it leads no keys until it has caught up)");
                    let _ = wake.send(Report::LeaseLost);
                }
                next = now + Duration::from_millis(100);
            }
            Ok(Err(e)) => {
                drop(held);
                status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                status.leased.store(false, Ordering::Relaxed);
                log(
                    1,
                    &|| warn!(error = %e, "cluster: lease renewal failed; retrying every 500 ms"),
                );
                next = Instant::now() + Duration::from_millis(500);
            }
            Err(_) => {
                drop(held);
                status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                error!("cluster: the lease renewal panicked; going on");
                next = Instant::now() + Duration::from_millis(500);
            }
        }
    }
}

impl Control {
    fn run(&mut self, status: &ClusterStatus) {
        let _stop = StopKeeper(self.share.clone());
        // A third of the lease (a watch would scale better: see
        // docs/cluster.md, "Not yet"). The lease is renewed by its keeper;
        // this thread joins again when the keeper found it gone.
        let period = Duration::from_millis(self.ttl_s * 1000 / 3);
        let mut renew_at = Instant::now() + period;
        let mut read_at = Instant::now() + period / 2;
        loop {
            self.share.beat_ms.store(mono_ms(), Ordering::Release);
            if let Some((done, until)) = self.leaving.take() {
                let gave_up = self.leave(status, until);
                let _ = done.send(gave_up);
                return;
            }
            if self.share.expired.swap(false, Ordering::AcqRel) {
                self.rejoining = true;
                renew_at = Instant::now();
            }
            let now = Instant::now();
            let next = if self.rejoining {
                renew_at.min(read_at)
            } else {
                read_at
            };
            if next > now {
                // A shard that caught up, or was asked to release groups,
                // wakes this thread early.
                if let Ok(report) = self.feed.synced_rx.recv_timeout(next - now) {
                    if let Some(at) = self.on_report(status, report) {
                        read_at = read_at.min(at);
                    }
                }
                continue;
            }
            let renewing = self.rejoining && renew_at <= read_at;
            // Scheduled from when each call was sent: a slow etcd does not
            // stretch the time between confirmations.
            let started = Instant::now();
            let tick = catch_unwind(AssertUnwindSafe(|| {
                if renewing {
                    self.renew(status)
                } else {
                    self.check_map(status)
                }
            }));
            match tick {
                Ok(Ok(())) if renewing => {
                    status.leased.store(true, Ordering::Relaxed);
                    renew_at = started + period;
                    if self.catalog_seen == 0 {
                        // A join again whose catalog read failed (or a
                        // catalog not made yet): the node answers 503
                        // until a map read confirms it.
                        read_at = read_at.min(Instant::now() + Duration::from_millis(500));
                    }
                }
                Ok(Ok(())) => read_at = started + period,
                Ok(Err(JoinError::Removed)) => {
                    {
                        let mut held = self.share.held();
                        *held = Held::default();
                        status.lead_until_ms.store(0, Ordering::Release);
                    }
                    status.leased.store(false, Ordering::Relaxed);
                    status.removed.store(true, Ordering::Relaxed);
                    error!(
                        node = %self.joining.name,
                        "cluster: this node was removed from the cluster while it ran; it no longer takes part (restart it to join as a new node)"
                    );
                    let _ = self.etcd.lease_revoke(self.lease);
                    return;
                }
                Ok(Err(e)) => {
                    status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                    // Soon: the node stops leading when neither its lease
                    // nor its map was confirmed for a while.
                    if renewing {
                        status.leased.store(false, Ordering::Relaxed);
                        renew_at = Instant::now() + Duration::from_millis(500);
                    } else {
                        read_at = Instant::now() + Duration::from_millis(500);
                    }
                    warn!(error = ?e, "cluster: etcd call failed; retrying");
                }
                Err(_) => {
                    status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                    error!("cluster: the control loop panicked; going on");
                    renew_at = Instant::now();
                    read_at = Instant::now() + period;
                }
            }
        }
    }

    /// The lease expired (etcd lost it, or this node was cut off longer
    /// than the TTL; its keeper found it gone and leads nothing since):
    /// takes a new one and joins again. The keeper renews the new lease
    /// from its grant (the join and map read may take seconds on a large
    /// map) but it lets the node lead only under the map read after that
    /// join (which says it is not synced: others may have taken writes
    /// meanwhile). A try that failed leaves its lease with the keeper,
    /// not leading: the next try takes it up again while it lives.
    fn renew(&mut self, status: &ClusterStatus) -> Result<(), JoinError> {
        let sent = mono_ms();
        let kept = {
            let held = self.share.held();
            held.lease != 0 && held.lease == self.lease && !held.leads
        };
        if !kept {
            let lease = self
                .etcd
                .lease_grant(i64::try_from(self.ttl_s).unwrap_or(10))?;
            self.lease = lease;
            let mut held = self.share.held();
            *held = Held {
                lease,
                leads: false,
            };
            status.lead_until_ms.store(0, Ordering::Release);
        }
        self.rejoin()?;
        // Its copy of the catalog counts from a read after the join only:
        // a door that found it without a lease did not wait for it.
        catalog::lapse();
        let read = mono_ms();
        self.read_sent = Some(Instant::now());
        let view = map::load(&self.etcd, &self.keys)?;
        status.epoch.store(view.epoch, Ordering::Relaxed);
        status.joined_epoch.fetch_max(view.epoch, Ordering::AcqRel);
        self.publish(&view);
        if self.feed.sent_epoch() >= view.epoch {
            status.map_read(read, self.ttl_s);
        }
        {
            let mut held = self.share.held();
            if held.lease != self.lease {
                return Err(JoinError::Etcd(
                    "the new lease was lost while this node joined again; joining again".into(),
                ));
            }
            if kept {
                // Renewed by the keeper since an earlier try, at a time
                // not known here: the keeper's next renewal says until
                // when it may lead (`sent` may be later than etcd's
                // expiry less the margin).
                status.lead_epoch.fetch_max(view.epoch, Ordering::AcqRel);
            } else {
                status.lead(view.epoch, sent, self.ttl_s);
            }
            held.leads = true;
        }
        self.rejoining = false;
        // Bucket changes made while it was cut off (a failed read is
        // made again at the next map read).
        let _ = self.check_catalog(read);
        Ok(())
    }

    fn rejoin(&mut self) -> Result<(), JoinError> {
        map::join(
            &self.etcd,
            &self.keys,
            &self.joining,
            self.lease,
            Some(self.id),
        )
        .map(|_| ())
    }

    /// Reads the map: checks this node's own entry (rejoins if it was
    /// marked down or its alive key is gone), publishes the epoch, and
    /// marks failed nodes.
    fn check_map(&mut self, status: &ClusterStatus) -> Result<(), JoinError> {
        let sent = mono_ms();
        self.read_sent = Some(Instant::now());
        // Nothing written to etcd since the last read began (one small
        // linearizable read): that map is etcd's now. Otherwise the whole
        // map is read (a watch would send only the change: "Not yet").
        // At least every WHOLE_READ_MAX in full all the same: an etcd
        // restored from a snapshot (against the runbook, with nodes
        // running) could reach the same revision with other contents.
        let unchanged = match self.view.take() {
            Some(v)
                if v.revision > 0
                    && self.view_read_at.elapsed() < WHOLE_READ_MAX
                    && map::revision(&self.etcd, &self.keys)? == v.revision =>
            {
                Some(v)
            }
            _ => None,
        };
        let catalog_unchanged = unchanged.is_some();
        let view = match unchanged {
            Some(v) => {
                status.map_reads[1].fetch_add(1, Ordering::Relaxed);
                v
            }
            None => {
                let began = Instant::now();
                let v = map::load(&self.etcd, &self.keys)?;
                status.map_reads[0].fetch_add(1, Ordering::Relaxed);
                self.view_read_at = began;
                v
            }
        };
        // Nothing written since the last whole read: the bucket catalog is
        // unchanged too, and the copy this node applied is current as of
        // this read (the catalog's revision was read after that whole
        // read: `check_catalog` below). Else, or while this node has not
        // applied what it last saw, its revision is read again (after the
        // whole read: a change between the two is then seen now, or moves
        // etcd's revision past the view's, so the next read looks again).
        // A failed catalog read fails this map read too (retried soon),
        // once the rest of it is done.
        let catalog_read = if catalog_unchanged
            && self.catalog_seen > 0
            && catalog::APPLIED.rev.load(Ordering::Acquire) >= self.catalog_seen
        {
            catalog::confirmed(self.catalog_seen, sent, self.fresh_ms());
            Ok(())
        } else {
            self.check_catalog(sent)
        };
        status.epoch.store(view.epoch, Ordering::Relaxed);
        // The first map read after the first join (when the one right
        // after it failed).
        if status.joined_epoch.load(Ordering::Acquire) == 0 {
            status.joined_epoch.store(view.epoch, Ordering::Release);
        }
        self.publish(&view);
        self.view = Some(view.clone());
        // Only a map the shards hold counts (one that gave this node
        // groups is held back until etcd says it is not synced).
        if self.feed.sent_epoch() >= view.epoch {
            status.map_read(sent, self.ttl_s);
        }
        if self.release_wanted > 0 && !self.rejoining {
            // Answers every release asked since the last read at once.
            status
                .lead_epoch
                .fetch_max(self.feed.sent_epoch(), Ordering::AcqRel);
            self.release_wanted = 0;
        }
        let states = [
            NodeState::Up,
            NodeState::Down,
            NodeState::Draining,
            NodeState::Out,
        ];
        for (slot, state) in status.nodes.iter().zip(states) {
            let n = view
                .nodes
                .iter()
                .filter(|(r, _)| r.node_state() == state)
                .count();
            slot.store(n as u64, Ordering::Relaxed);
        }
        self.check_self(&view)?;
        for (key, why) in &view.unreadable {
            warn!(key = %key, error = %why, "cluster: a node record cannot be read; skipped");
        }
        if let Some((name, state)) = map::detect_failures(&self.etcd, &self.keys, &view)? {
            warn!(node = %name, state = state.name(), "cluster: node marked {}", state.name());
        } else {
            self.settle(status, &view);
        }
        catalog_read.map_err(JoinError::Etcd)
    }

    /// Records the hand-offs the map allows (`map::settle`), once per map,
    /// on a node that is a candidate itself or the lowest-id up node.
    fn settle(&mut self, status: &ClusterStatus, view: &View) {
        if self.settled_epoch == view.epoch {
            return;
        }
        self.settled_epoch = view.epoch;
        let placed = view.placed();
        let Some(me) = view.nodes.iter().position(|(n, _)| n.id == self.id) else {
            return;
        };
        if !handoff::settles(&placed, me) {
            return;
        }
        match map::settle(&self.etcd, &self.keys, view) {
            Ok(made) => {
                for (node, filled) in made {
                    info!(node = %node, filled, "cluster: hand-off recorded: node {}", if filled { "filled (it holds its groups)" } else { "unfilled (its groups are held elsewhere)" });
                }
            }
            Err(e) => {
                status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                // The next map read tries again.
                self.settled_epoch = 0;
                warn!(error = %e, "cluster: cannot record hand-offs; the next map read tries again");
            }
        }
    }

    /// Another node leads groups this one may have led, under map
    /// `epoch`: lets this node lead under none older than the newest its
    /// shards have (shards still on an older map lead nothing until they
    /// take it, within a shard's map poll) once that is at least `epoch`.
    /// The asking shard sees `lead_epoch` reach `epoch`. If the shards'
    /// map is older, the release waits for the next map read: when to read
    /// (soon, but no more than one read per `RELEASE_READ_GAP` however
    /// many nodes ask).
    fn release(&mut self, status: &ClusterStatus, epoch: u64) -> Option<Instant> {
        if self.feed.sent_epoch() >= epoch {
            status
                .lead_epoch
                .fetch_max(self.feed.sent_epoch(), Ordering::AcqRel);
            return None;
        }
        self.release_wanted = self.release_wanted.max(epoch);
        let now = Instant::now();
        Some(
            self.read_sent
                .map_or(now, |t| (t + RELEASE_READ_GAP).max(now)),
        )
    }

    /// Acts on a shard's report; Some: when to read the map next.
    fn on_report(&mut self, status: &ClusterStatus, report: Report) -> Option<Instant> {
        match report {
            Report::Synced { epoch, skipped } => {
                match map::mark_synced(&self.etcd, &self.keys, self.id, epoch, skipped) {
                    Ok(true) => {
                        info!(node = %self.joining.name, epoch, "cluster: caught up; this node is synced");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(error = %e, "cluster: cannot mark this node synced; its shards report again");
                    }
                }
                // The map changed (or moved on under the catch-up): read
                // it soon.
                Some(Instant::now() + Duration::from_millis(100))
            }
            Report::Release(epoch) => self.release(status, epoch),
            Report::Skip(ask) => self.skip(status, ask),
            Report::Bucket(ask) => {
                if Instant::now() > ask.until {
                    let _ = ask.reply.send(Err(
                        "this node's control thread was busy; not recorded".into(),
                    ));
                    return None;
                }
                let got = catalog::commit(&self.etcd, &self.keys, &ask.change)
                    .map(|(outcome, rev)| catalog::committed(&self.etcd, &self.keys, outcome, rev));
                if got.is_err() {
                    status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                }
                let rev = got.as_ref().map(|c| c.rev).ok();
                let _ = ask.reply.send(got);
                // This node's own shard first: the door waits for it.
                if let Some(rev) = rev {
                    self.sync_catalog(rev);
                }
                None
            }
            Report::CatalogSync(rev) => {
                self.sync_catalog(rev);
                None
            }
            Report::Seed(buckets, users) => {
                let budget = Duration::from_millis(self.ttl_s.saturating_mul(1000) / 8);
                let lists = (buckets.as_deref(), users.as_deref());
                match catalog::seed(&self.etcd, &self.keys, self.id, lists, budget) {
                    Ok(true) => {
                        info!(
                            buckets = buckets.as_ref().map(Vec::len),
                            users = users.as_ref().map(Vec::len),
                            "cluster: this node's users (and, for a cluster made before the catalog, its buckets) are in the catalog"
                        );
                        self.catalog_sent = None;
                        let _ = self.check_catalog(mono_ms());
                    }
                    Ok(false) => {}
                    Err(e) => {
                        status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(error = %e, "cluster: cannot seed the bucket catalog; the next map read tries again");
                    }
                }
                None
            }
            Report::LeaseLost => None,
            Report::Leave(done) => {
                // Leads nothing from now on (and the keeper leaves the
                // lease alone: it is given up in `leave`).
                let mut held = self.share.held();
                held.leads = false;
                status.lead_until_ms.store(0, Ordering::Release);
                drop(held);
                status.map_until_ms.store(0, Ordering::Release);
                let margin = lead_margin_ms(self.ttl_s.saturating_mul(1000));
                self.leaving = Some((done, Instant::now() + Duration::from_millis(margin)));
                Some(Instant::now())
            }
            // After a Leave (in `leave`, or here when a skip round took
            // it first): the lease goes now.
            Report::Drained => {
                if let Some((_, until)) = &mut self.leaving {
                    *until = Instant::now();
                }
                None
            }
        }
    }

    /// The node stops (it leads nothing since `Report::Leave`): once its
    /// shards have stopped (`Report::Drained`), or at `until` (the lease
    /// margin after it stopped leading: requests that checked `may_lead`
    /// before have ended, as when a lease runs out), it gives up its
    /// lease, so that the others mark it down at their next map read.
    /// Skips asked meanwhile fail (their writes are not acknowledged).
    /// Returns whether the lease was given up.
    fn leave(&mut self, status: &ClusterStatus, until: Instant) -> bool {
        while let Some(wait) = until.checked_duration_since(Instant::now()) {
            match self.feed.synced_rx.recv_timeout(wait) {
                Ok(Report::Drained) => break,
                Ok(Report::Skip(ask)) => ask.done.store(SKIP_FAILED, Ordering::Release),
                Ok(Report::Bucket(ask)) => {
                    let _ = ask.reply.send(Err("this node is stopping".into()));
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        // The keeper leaves a lease being given up alone.
        *self.share.held() = Held::default();
        let gave_up = match self.etcd.lease_revoke(self.lease) {
            Ok(()) => {
                status.leased.store(false, Ordering::Relaxed);
                info!(
                    node = %self.joining.name,
                    "cluster: stopping: lease given up; the other nodes take this node's groups over at their next map read"
                );
                true
            }
            Err(e) => {
                warn!(
                    error = %e,
                    "cluster: stopping: cannot give up the lease; the other nodes take this node's groups over once it expires"
                );
                false
            }
        };
        while let Ok(r) = self.feed.synced_rx.try_recv() {
            match r {
                Report::Skip(ask) => ask.done.store(SKIP_FAILED, Ordering::Release),
                Report::Bucket(ask) => {
                    let _ = ask.reply.send(Err("this node is stopping".into()));
                }
                _ => {}
            }
        }
        gave_up
    }

    /// Records in etcd that writes are acknowledged without `nodes`'
    /// copies (`map::skip`), with every other skip the shards asked for
    /// meanwhile (at most one round per `SKIP_GAP`, and a round stops
    /// after an eighth of the lease: what is left is refused, so that the
    /// map reads on this thread keep their time); then tells the
    /// asking shards. An ask past its write's deadline fails unrecorded.
    /// Some: when to read the map next (a node was marked not synced).
    fn skip(&mut self, status: &ClusterStatus, first: SkipAsk) -> Option<Instant> {
        if let Some(wait) = self
            .skipped_at
            .and_then(|t| SKIP_GAP.checked_sub(t.elapsed()))
        {
            std::thread::sleep(wait);
        }
        let started = Instant::now();
        let round_max = Duration::from_millis(self.ttl_s.saturating_mul(1000) / 8);
        let mut asks = vec![first];
        let mut others = Vec::new();
        while let Ok(r) = self.feed.synced_rx.try_recv() {
            match r {
                Report::Skip(ask) => asks.push(ask),
                r => others.push(r),
            }
        }
        // Each (node, map the writes were copied under) once, with every
        // group it missed writes of.
        let mut ids: std::collections::BTreeMap<(u32, u64), Vec<u32>> =
            std::collections::BTreeMap::new();
        for ask in asks.iter().filter(|a| a.until > started) {
            for &n in &ask.nodes {
                let pgs = ids.entry((n, ask.epoch)).or_default();
                if !pgs.contains(&ask.pg) {
                    pgs.push(ask.pg);
                }
            }
        }
        let mut done_ids: Vec<(u32, u64)> = Vec::new();
        // Epochs this round made, each from the one before it.
        let mut made: Vec<(u64, u64)> = Vec::new();
        let mut read_at = None;
        for ((id, epoch), pgs) in ids {
            if started.elapsed() > round_max {
                continue;
            }
            let mut chain = vec![epoch];
            while let Some(&(_, next)) = made.iter().find(|(from, _)| Some(from) == chain.last()) {
                chain.push(next);
            }
            match map::skip(
                &self.etcd,
                &self.keys,
                self.view.as_ref(),
                (id, self.id, &pgs),
                &chain,
            ) {
                Ok(marked) => {
                    if let Some(e) = marked {
                        warn!(node = id, "cluster: a replica missed a write acknowledged without it; marked not synced (it catches up before it leads)");
                        made.push((e - 1, e));
                        read_at = Some(Instant::now() + Duration::from_millis(100));
                    }
                    done_ids.push((id, epoch));
                }
                Err(e) => {
                    status.etcd_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(node = id, error = %e, "cluster: cannot record a write acknowledged without a replica; the write is refused");
                    // This node's map may be behind: read it soon.
                    read_at = Some(Instant::now() + Duration::from_millis(100));
                }
            }
            // Later calls read the map again (a mark moved it).
            self.view = None;
        }
        self.skipped_at = Some(Instant::now());
        for ask in asks {
            let recorded = ask
                .nodes
                .iter()
                .all(|&n| done_ids.contains(&(n, ask.epoch)));
            ask.done.store(
                if recorded { SKIP_DONE } else { SKIP_FAILED },
                Ordering::Release,
            );
        }
        for r in others {
            if let Some(at) = self.on_report(status, r) {
                read_at = Some(read_at.map_or(at, |a: Instant| a.min(at)));
            }
        }
        read_at
    }

    /// How long a read of etcd keeps this node's map and catalog current.
    fn fresh_ms(&self) -> u64 {
        map_fresh_ms(self.ttl_s.saturating_mul(1000))
    }

    /// Reads the bucket catalog's revision (a read sent at `sent` or
    /// after: its finding holds from then, `catalog::confirmed`), and hands the catalog to the
    /// bucket-owner shard if it has not applied that one (or etcd has no
    /// catalog yet: the shard then seeds it). An etcd error is logged:
    /// the next map read tries again.
    fn check_catalog(&mut self, sent: u64) -> Result<(), String> {
        match catalog::revision(&self.etcd, &self.keys) {
            Ok(0) => {
                // Not made yet (a cluster made by an older percore): the
                // shard seeds it from its own; nothing to read.
                self.catalog_seen = 0;
                let _ = self
                    .feed
                    .catalog_tx
                    .send(std::sync::Arc::new(catalog::Catalog::default()));
                Ok(())
            }
            Ok(rev) => {
                self.catalog_seen = rev;
                catalog::confirmed(rev, sent, self.fresh_ms());
                self.sync_catalog(rev);
                Ok(())
            }
            Err(e) => {
                // Not known to be current: a map read that finds etcd
                // unchanged must not confirm the last revision seen (it
                // was seen before the whole map read that came since).
                self.catalog_seen = 0;
                warn!(error = %e, "cluster: cannot read the bucket catalog's revision; retrying");
                Err(format!("cannot read the bucket catalog's revision: {e}"))
            }
        }
    }

    /// Hands the bucket catalog to the bucket-owner shard unless it has
    /// applied revision `want` already, or was handed one at least that
    /// new within `CATALOG_RESEND`. The read carries the contents of what
    /// changed since the revision the shard applied (everything if it
    /// asked for a whole read).
    fn sync_catalog(&mut self, want: i64) {
        let applied = catalog::APPLIED.rev.load(Ordering::Acquire);
        if applied >= want {
            return;
        }
        let full = catalog::APPLIED.full.load(Ordering::Acquire);
        // (A read that carried only what changed is not waited for once
        // the shard wants whole ones.)
        if self.catalog_sent.is_some_and(|(rev, at, whole)| {
            rev >= want && at.elapsed() < CATALOG_RESEND && (whole || !full)
        }) {
            return;
        }
        let since = if full { 0 } else { applied };
        match catalog::read(&self.etcd, &self.keys, self.id, since) {
            Ok(cat) => {
                self.catalog_sent = Some((
                    if cat.seeded { cat.rev } else { 0 },
                    Instant::now(),
                    since == 0,
                ));
                let _ = self.feed.catalog_tx.send(std::sync::Arc::new(cat));
            }
            Err(e) => {
                warn!(error = %e, "cluster: cannot read the bucket catalog; retrying at the next map read")
            }
        }
    }

    /// Hands the map to the shards (when it changed).
    fn publish(&mut self, view: &View) {
        // Read again by the next skip (`check_map` keeps the view it
        // publishes; other paths may publish a newer map than `view`).
        self.view = None;
        // A read after half a lease or more without one: maps may have
        // come and gone meanwhile (a node added, stopped and removed; its
        // lease had to expire first), unseen.
        let now = Instant::now();
        let blind = self.published_at.is_some_and(|t| {
            now.duration_since(t) >= Duration::from_millis(self.ttl_s.saturating_mul(500))
        });
        self.published_at = Some(now);
        // Placing every group costs up to seconds on a large map: only
        // when the map changed (this thread also renews the lease).
        let built = ShardMap::client_json(&self.cluster, view).and_then(|json| {
            if self
                .feed
                .is_current(&json, view.skipped.get(&self.id).copied().unwrap_or(0))
            {
                return Ok(None);
            }
            ShardMap::build_with(json, self.id, view, self.feed.synced_tx.clone()).map(Some)
        });
        match built {
            Ok(None) => {}
            Ok(Some(m)) => {
                let held: Vec<u32> = (0..m.pgs).filter(|&pg| m.holds_pg(pg)).collect();
                // Gained: a group held now and not under the last map; or,
                // across a gap in epochs, any group, if one may have left
                // this node in maps it never saw and come back, with
                // writes it never got.
                let members = membership(view);
                // (A node that holds no group, draining, has nothing to
                // catch up: it would stay unsynced, as only up nodes
                // catch up.)
                let gap = self.membership.as_ref().is_some_and(|(epoch, before)| {
                    !held.is_empty()
                        && m.epoch > epoch.saturating_add(1)
                        && (blind || may_have_left_and_returned(self.id, before, &members))
                });
                let gained = gap
                    || self
                        .held
                        .as_ref()
                        .is_some_and(|prev| held.iter().any(|pg| prev.binary_search(pg).is_err()));
                if gained && m.node(m.node_id).is_some_and(|n| n.synced) {
                    // New groups hold nothing here yet: this node must not
                    // lead them (nor repair their replicas from empty)
                    // before it caught up. The shards keep the previous
                    // map until etcd says so.
                    match self.set_synced(false) {
                        Ok(()) => {
                            warn!(node = %self.joining.name, "cluster: this node gained placement groups; it catches up before it leads any");
                            if let Ok(view) = map::load(&self.etcd, &self.keys) {
                                self.publish(&view);
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, "cluster: cannot mark this node unsynced; the shards keep the previous map");
                        }
                    }
                    return;
                }
                self.held = Some(held);
                self.membership = Some((m.epoch, members));
                let wait = takeover_wait_ms(self.ttl_s.saturating_mul(1000));
                self.feed.publish(m, mono_ms(), wait);
            }
            Err(e) => error!(error = %e, "cluster: cannot build the shards' map"),
        }
    }

    /// Marks this node not synced in etcd (it gained placement groups).
    /// See `membership` for when a missed map may have moved groups.
    fn set_synced(&mut self, synced: bool) -> Result<(), String> {
        map::update_node(&self.etcd, &self.keys, &self.joining.name, &|_, r| {
            Ok(
                (r.synced != synced && r.id == self.id).then(|| map::NodeRecord {
                    synced,
                    ..r.clone()
                }),
            )
        })
        .map(drop)
    }

    fn check_self(&mut self, view: &View) -> Result<(), JoinError> {
        let Some((me, _)) = view.node(self.id) else {
            return Err(JoinError::Removed);
        };
        let mine = view.alive.get(&self.id);
        let state_ok = matches!(me.node_state(), NodeState::Up | NodeState::Draining);
        match mine {
            Some(a) if a.nonce != self.joining.nonce => {
                error!(
                    node = %self.joining.name,
                    "cluster: another process holds this node's alive key (same --node twice?); not taking it back"
                );
                Ok(())
            }
            Some(a) if a.lease == self.lease && state_ok => Ok(()),
            _ => {
                warn!(node = %self.joining.name, state = %me.state, "cluster: this node's entry was not up with its lease; joining again");
                // A door that found it without an alive key did not wait
                // for it: its copy counts from the next read on.
                catalog::lapse();
                self.rejoin()?;
                // Read after the join: its copy counts again (a failed
                // read is made again at the next map read).
                let _ = self.check_catalog(mono_ms());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::may_have_left_and_returned;

    /// Against a real etcd, with a 4 s lease: the keeper renews it while
    /// the control thread goes no round for more than two leases (a long
    /// map build), lets the node lead only while the lease leads, and a
    /// lease etcd no longer has makes the node lead nothing and wakes the
    /// control thread.
    #[test]
    fn the_keeper_renews_alone_and_stops_leading_on_a_lost_lease() {
        use super::{mono_ms, spawn_keeper, ClusterStatus, LeaseShare, Report};
        use crate::cluster::etcd::Etcd;
        use std::sync::atomic::Ordering;
        use std::sync::Arc;
        use std::time::Duration;
        let Some(e) = crate::cluster::map::tests::start_etcd() else {
            return;
        };
        let etcd = Etcd::new(&e.urls).unwrap();
        let lease = etcd.lease_grant(4).unwrap();
        let share = Arc::new(LeaseShare::new(lease));
        let _stop = super::StopKeeper(share.clone());
        let status = Arc::new(ClusterStatus::default());
        status.ttl_ms.store(4000, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_keeper(&share, &status, tx, &e.urls, Duration::from_millis(500)).unwrap();
        // No beat for 9 s: busy, not stuck.
        std::thread::sleep(Duration::from_secs(9));
        assert!(
            status.lead_until_ms.load(Ordering::Acquire) > mono_ms(),
            "may lead"
        );
        assert!(status.leased.load(Ordering::Relaxed));
        assert!(
            etcd.lease_keepalive(lease).unwrap() > 0,
            "the lease outlived two TTLs"
        );
        // A lease that does not lead (a node joining again, or stopping).
        share.held().leads = false;
        status.lead_until_ms.store(0, Ordering::Release);
        std::thread::sleep(Duration::from_millis(3000));
        assert_eq!(
            status.lead_until_ms.load(Ordering::Acquire),
            0,
            "renewed, not leading"
        );
        assert!(etcd.lease_keepalive(lease).unwrap() > 0);
        // Lost at etcd.
        share.held().leads = true;
        etcd.lease_revoke(lease).unwrap();
        let woken = rx.recv_timeout(Duration::from_secs(5));
        assert!(
            matches!(woken, Ok(Report::LeaseLost)),
            "the control thread is woken"
        );
        assert!(share.expired.load(Ordering::Acquire));
        assert_eq!(share.held().lease, 0);
        assert_eq!(status.lead_until_ms.load(Ordering::Acquire), 0);
        assert!(!status.leased.load(Ordering::Relaxed));
    }

    fn m(nodes: &[(u32, &str, u64)]) -> Vec<super::Member> {
        nodes
            .iter()
            .map(|&(id, state, since_ms)| super::Member {
                id,
                state: state.into(),
                since_ms,
                zone: format!("z{id}"),
            })
            .collect()
    }

    /// Across a gap, a catch-up is needed only when a group may have left
    /// this node (1) and come back: some node that holds nothing now
    /// changed, or this node did.
    #[test]
    fn a_gap_needs_a_catch_up_only_when_a_group_may_have_come_back() {
        let before = m(&[(1, "up", 10), (2, "up", 10), (3, "draining", 10)]);
        // Only synced flags moved (not in the membership), or a node went
        // down and came back up, or a node was added and holds groups.
        assert!(!may_have_left_and_returned(1, &before, &before));
        let returned = m(&[(1, "up", 10), (2, "up", 30), (3, "draining", 10)]);
        assert!(!may_have_left_and_returned(1, &before, &returned));
        let added = m(&[
            (1, "up", 10),
            (2, "up", 10),
            (3, "draining", 10),
            (4, "up", 40),
        ]);
        assert!(!may_have_left_and_returned(1, &before, &added));
        // Node 3 undrained and drained again, node 4 added and drained,
        // node 2 out and back out, this node drained and undrained.
        let again = m(&[(1, "up", 10), (2, "up", 10), (3, "draining", 50)]);
        assert!(may_have_left_and_returned(1, &before, &again));
        let drained = m(&[
            (1, "up", 10),
            (2, "up", 10),
            (3, "draining", 10),
            (4, "draining", 60),
        ]);
        assert!(may_have_left_and_returned(1, &before, &drained));
        let out = m(&[(1, "up", 10), (2, "out", 70), (3, "draining", 10)]);
        assert!(may_have_left_and_returned(1, &before, &out));
        let me = m(&[(1, "up", 80), (2, "up", 10), (3, "draining", 10)]);
        assert!(may_have_left_and_returned(1, &before, &me));
        // Node 2 removed: it may have been undrained (taking groups) and
        // removed in between (giving them back).
        let removed = m(&[(1, "up", 10), (3, "draining", 10)]);
        assert!(may_have_left_and_returned(1, &before, &removed));
        // Node 2 moved to another zone (its groups may move).
        let mut moved = before.clone();
        moved[1].zone = "z9".into();
        assert!(may_have_left_and_returned(1, &before, &moved));
    }
}
