//! The control thread of a cluster node (`percore serve --cluster`): joins
//! the map, keeps the node's lease alive, and marks nodes whose lease
//! expired `down` (then `out` after the grace period). One plain thread
//! with blocking etcd calls: nothing here touches a shard, and a slow or
//! lost etcd stalls only this thread (the node keeps serving).
//!
//! Not built yet (issue 18): handing the map to the shards, replication,
//! forwarding and backfill; see docs/cluster.md.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use percore_protocol::placement::NodeState;
use tracing::{info, warn};

use super::etcd::Etcd;
use super::map::{self, Joining, Keys};

/// A node's cluster settings (`serve --cluster URLS --node NAME ...`).
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub urls: String,
    pub cluster: String,
    pub node: String,
    pub zone: String,
    /// Lease time: a node silent this long is marked down.
    pub lease_ttl_s: u64,
    /// A down node is marked out (its placement groups move) after this.
    pub down_out_s: u64,
}

/// What the control thread shares with the admin endpoint: plain atomics,
/// written by the control thread only.
#[derive(Default)]
pub struct ClusterStatus {
    pub epoch: AtomicU64,
    pub node_id: AtomicU64,
    /// Whether the lease is held (the node counts as up).
    pub leased: AtomicBool,
    pub nodes_up: AtomicU64,
    pub nodes_down: AtomicU64,
    pub etcd_errors: AtomicU64,
}

/// Joins the cluster (before the node serves: a node that cannot join does
/// not start) and starts the control thread.
pub fn start(settings: ClusterSettings, joining: Joining) -> Result<Arc<ClusterStatus>, String> {
    let etcd = Etcd::new(&settings.urls)?;
    let keys = Keys::new(&settings.cluster)?;
    let record = map::join(&etcd, &keys, &joining)?;
    let ttl = i64::try_from(settings.lease_ttl_s.clamp(2, 3600)).unwrap_or(10);
    let lease = etcd.lease_grant(ttl)?;
    etcd.put(&keys.alive(record.id), b"", lease)?;
    let status = Arc::new(ClusterStatus::default());
    status
        .node_id
        .store(u64::from(record.id), Ordering::Relaxed);
    status.leased.store(true, Ordering::Relaxed);
    info!(
        node = %record.name,
        id = record.id,
        zone = %record.zone,
        cluster = %settings.cluster,
        "joined the cluster"
    );
    let shared = status.clone();
    std::thread::Builder::new()
        .name("percore-cluster".into())
        .spawn(move || run(&etcd, &keys, &settings, &joining, record.id, lease, &shared))
        .map_err(|e| format!("cannot start the cluster control thread: {e}"))?;
    Ok(status)
}

#[allow(clippy::needless_pass_by_value)]
fn run(
    etcd: &Etcd,
    keys: &Keys,
    settings: &ClusterSettings,
    joining: &Joining,
    id: u32,
    mut lease: i64,
    status: &ClusterStatus,
) {
    let ttl = settings.lease_ttl_s.clamp(2, 3600);
    // A third of the lease: two renewals may fail before it expires. The
    // map is read as often (a watch would scale better: see
    // docs/cluster.md, "Not yet").
    let period = Duration::from_millis(ttl * 1000 / 3);
    loop {
        std::thread::sleep(period);
        if let Err(e) = keep_lease(etcd, keys, joining, id, &mut lease, ttl) {
            status.etcd_errors.fetch_add(1, Ordering::Relaxed);
            status.leased.store(false, Ordering::Relaxed);
            warn!(error = %e, "cluster: cannot renew this node's lease; retrying");
            continue;
        }
        status.leased.store(true, Ordering::Relaxed);
        if let Err(e) = watch_others(etcd, keys, settings, status) {
            status.etcd_errors.fetch_add(1, Ordering::Relaxed);
            warn!(error = %e, "cluster: cannot read the map; retrying");
        }
    }
}

/// Renews the lease; if it expired (etcd lost it, or this node was cut off
/// longer than the TTL), takes a new one and joins again.
fn keep_lease(
    etcd: &Etcd,
    keys: &Keys,
    joining: &Joining,
    id: u32,
    lease: &mut i64,
    ttl: u64,
) -> Result<(), String> {
    if etcd.lease_keepalive(*lease)? > 0 {
        return Ok(());
    }
    warn!("cluster: this node's lease had expired; joining again");
    let record = map::join(etcd, keys, joining)?;
    debug_assert_eq!(record.id, id);
    *lease = etcd.lease_grant(i64::try_from(ttl).unwrap_or(10))?;
    etcd.put(&keys.alive(id), b"", *lease)
}

/// Reads the map, publishes its figures, and marks failed nodes.
fn watch_others(
    etcd: &Etcd,
    keys: &Keys,
    settings: &ClusterSettings,
    status: &ClusterStatus,
) -> Result<(), String> {
    let view = map::load(etcd, keys)?;
    status.epoch.store(view.epoch, Ordering::Relaxed);
    let up = view
        .nodes
        .iter()
        .filter(|(n, _)| n.node_state() == NodeState::Up)
        .count();
    let down = view
        .nodes
        .iter()
        .filter(|(n, _)| n.node_state() == NodeState::Down)
        .count();
    status.nodes_up.store(up as u64, Ordering::Relaxed);
    status.nodes_down.store(down as u64, Ordering::Relaxed);
    if let Some((name, state)) =
        map::detect_failures(etcd, keys, &view, settings.down_out_s * 1000)?
    {
        warn!(node = %name, state = state.name(), "cluster: node marked {}", state.name());
    }
    Ok(())
}
