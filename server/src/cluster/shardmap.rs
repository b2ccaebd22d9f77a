//! The map as the shards hold it: built by the control thread from each
//! map it reads, handed to every shard through its own channel (one
//! channel per shard, nothing shared between shards), and kept by the
//! shard as an immutable snapshot.
//!
//! A shard uses it to answer `WrongNode` for a key whose placement group
//! this node is not the primary of (the native front door), and to answer
//! `ClusterMap` with the same map as JSON, so that clients compute the
//! same placement (`percore_protocol::placement`) from the same nodes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use percore_protocol::cluster_map::{ClientMap, ClientNode};
use percore_protocol::placement;
use percore_protocol::routing::object_hash;

use super::map::View;

/// No primary: no node is eligible for the placement group.
pub const NO_NODE: u32 = u32::MAX;

/// What the shards tell the control thread.
#[derive(Debug, Clone)]
pub enum Report {
    /// The node caught up under the map of this epoch, read when its
    /// `skipped/` key had revision `skipped` (`ShardMap::skipped`).
    Synced { epoch: u64, skipped: i64 },
    /// Another node takes groups over from this one under the map of this
    /// epoch: read the map now and lead under no older one.
    Release(u64),
    /// A write is to be acknowledged without some replicas' copies
    /// (`SkipAsk`).
    Skip(SkipAsk),
    /// etcd said the lease is gone (`control::Keeper`): join again.
    LeaseLost,
    /// The node stops (SIGTERM): lead nothing more from now on; give the
    /// lease up once the shards have stopped (`Drained`) or the lease
    /// margin has passed, say on the channel whether that worked, and end
    /// the control thread (`control::Leaver`).
    Leave(std::sync::mpsc::Sender<bool>),
    /// The stopping node's shards have stopped: nothing is served any more.
    Drained,
    /// A door's bucket change, to record in etcd (`catalog::commit`).
    Bucket(super::catalog::Ask),
    /// Read the bucket catalog and hand it to the bucket-owner shard, if
    /// it has not applied this revision yet.
    CatalogSync(i64),
    /// This node's buckets (for a catalog not made yet) and users (not
    /// put in yet), to seed the catalog (`catalog::seed`; None: not to
    /// seed).
    Seed(
        Option<Vec<crate::shard::msg::BucketDocs>>,
        Option<Vec<(String, bytes::Bytes)>>,
    ),
}

/// A write of group `pg` is to be acknowledged without `nodes`' copies
/// (theirs failed; a majority holds it): the control thread records that
/// in etcd first (`map::skip`, only while etcd's map makes this node the
/// group's acting primary), then sets `done` (`SKIP_DONE` or
/// `SKIP_FAILED`).
#[derive(Debug, Clone)]
pub struct SkipAsk {
    pub pg: u32,
    /// The map the write was copied under.
    pub epoch: u64,
    /// The write's deadline: an ask not recorded by then fails.
    pub until: std::time::Instant,
    pub nodes: Vec<u32>,
    pub done: Arc<std::sync::atomic::AtomicU8>,
}

/// `Report::Skip`'s outcome: recorded in etcd.
pub const SKIP_DONE: u8 = 1;
/// `Report::Skip`'s outcome: etcd could not be told (not acknowledged).
pub const SKIP_FAILED: u8 = 2;

/// One map, as a shard holds it.
#[derive(Debug)]
pub struct ShardMap {
    pub epoch: u64,
    /// This node's id.
    pub node_id: u32,
    pub pgs: u32,
    pub seed: u64,
    /// The acting primary's node id of each placement group (`NO_NODE`:
    /// none: no replica is up).
    primaries: Vec<u32>,
    /// Replicas per group (the cluster's R).
    pub replica_count: usize,
    /// Each group's replicas' node ids in placement order, `replica_count`
    /// per group (`NO_NODE` where fewer nodes are eligible).
    replicas: Vec<u32>,
    /// Each group's settled replicas' node ids
    /// (`placement::settled_replicas`), as `replicas`.
    settled: Vec<u32>,
    /// The map for clients (`ClientMap` as JSON).
    pub json: String,
    /// Every node of the map, in id order.
    pub nodes: Vec<MapNode>,
    /// The way back to the control thread: a shard that caught up under
    /// this map sends its epoch (`replicate::start_catch_up`), one asked
    /// to release groups the epoch (`replicate::answer_release`).
    pub synced_tx: mpsc::Sender<Report>,
    /// Per group: the nodes that led it under a map this node held and may
    /// still lead it under that map (until their own map read is due:
    /// `control::may_lead`). Kept across maps until they expire or release.
    stale: Vec<Vec<Stale>>,
    /// Nodes that may still lead any group under a map this node never
    /// held: every other node up when this node took its first map, or a
    /// map after a gap in epochs.
    stale_any: Vec<Stale>,
    /// Per group this node leads: not before this time (`control::mono_ms`;
    /// 0: at once): the latest `until` of the nodes in `stale` and
    /// `stale_any` that are still up (a node whose lease expired stopped
    /// leading before etcd let it be marked down), except a `covered`
    /// one that holds the group now while this node is synced (see
    /// `Stale::covered`). Set by `MapFeed::publish`; atomics: a release
    /// (`released`) ends a wait early, seen by every shard holding this
    /// map.
    lead_after: Vec<AtomicU64>,
    /// The latest of `lead_after`.
    lead_after_max: AtomicU64,
    /// The revision of this node's `skipped/` key when the map was read
    /// (0: none): its catch-up under this map counts only if it has not
    /// moved since (`map::mark_synced`).
    pub skipped: i64,
}

/// A node that may still lead a group under a map older than epoch
/// `need`, until `until` (`control::mono_ms`; 0 once it released).
#[derive(Debug)]
struct Stale {
    node: u32,
    need: u64,
    until: AtomicU64,
    /// Known to be harmless while `node` holds the group and this node is
    /// synced: the map `node` led the group under (the one before `need`)
    /// made this node an up replica of it, so `node` can acknowledge no
    /// write without this node's copy, which this node refuses (its map is
    /// newer); and `node`, a replica now, gets every write this node
    /// acknowledges (a node that may still lead is never skipped:
    /// `ShardMap::may_still_lead`), so its reads are not stale either. Never set for a
    /// map this node did not hold (`stale_any`): a node that joined a
    /// group in it may lead it with writes this node never got.
    covered: bool,
}

/// Adds `node` (may lead under maps older than `need` until `until`) to
/// `list`, merged with its entry there if any (covered only if both are).
fn add_stale(list: &mut Vec<Stale>, node: u32, need: u64, until: u64, covered: bool) {
    if let Some(s) = list.iter_mut().find(|s| s.node == node) {
        s.need = s.need.max(need);
        s.covered &= covered;
        let u = s.until.get_mut();
        *u = (*u).max(until);
    } else {
        list.push(Stale {
            node,
            need,
            until: AtomicU64::new(until),
            covered,
        });
    }
}

/// The entries of `list` still in force at `now`, added to `out`.
fn carry_stale(list: &[Stale], now: u64, out: &mut Vec<Stale>) {
    for s in list {
        let until = s.until.load(Ordering::Acquire);
        if until > now {
            add_stale(out, s.node, s.need, until, s.covered);
        }
    }
}

/// A node as the S3 door needs it (forwarding, fan-out).
#[derive(Debug, Clone)]
pub struct MapNode {
    pub id: u32,
    pub name: String,
    pub state: placement::NodeState,
    /// Its failure domain (`--zone`).
    pub zone: String,
    /// Its S3 address (None: the record's address does not parse).
    pub s3: Option<std::net::SocketAddr>,
    /// Whether it has caught up (`placement::PlacedNode::synced`).
    pub synced: bool,
    /// Its lease time, ms (0: not known).
    pub ttl_ms: u64,
    /// Whether it is recorded as holding its groups (`placement::PlacedNode::filled`).
    pub filled: bool,
    /// Whether it runs on a data directory its data is not recorded on
    /// (`NodeRecord::empty`: a replaced disk, until it syncs): its copies
    /// count toward no write's majority, and it toward no merge's.
    pub empty: bool,
}

impl ShardMap {
    /// The map for clients of a map read from etcd, as JSON (cheap: the
    /// control thread compares it with the last one before it builds).
    pub fn client_json(cluster: &str, view: &View) -> Result<String, String> {
        let client = ClientMap {
            cluster: cluster.to_string(),
            epoch: view.epoch,
            pgs: view.config.pgs,
            replicas: view.config.replicas,
            seed: view.config.seed.clone(),
            nodes: view
                .nodes
                .iter()
                .map(|(n, _)| ClientNode {
                    id: n.id,
                    name: n.name.clone(),
                    zone: n.zone.clone(),
                    state: n.state.clone(),
                    s3: n.s3.clone(),
                    native: n
                        .native
                        .split(',')
                        .filter(|a| !a.is_empty())
                        .map(str::to_string)
                        .collect(),
                    synced: n.synced,
                    filled: Some(n.filled()),
                })
                .collect(),
        };
        serde_json::to_string(&client).map_err(|e| e.to_string())
    }

    /// Builds the shard map of node `node_id` from a map read from etcd
    /// (every placement group's primary: N hashes per group).
    pub fn build(cluster: &str, node_id: u32, view: &View) -> Result<ShardMap, String> {
        Self::build_with(
            Self::client_json(cluster, view)?,
            node_id,
            view,
            mpsc::channel().0,
        )
    }

    /// `build`, given the view's `client_json` already made.
    pub fn build_with(
        json: String,
        node_id: u32,
        view: &View,
        synced_tx: mpsc::Sender<Report>,
    ) -> Result<ShardMap, String> {
        let seed = view.config.seed()?;
        let pgs = view.config.pgs;
        let placed = view.placed();
        let r = view.config.replicas;
        let mut primaries = Vec::with_capacity(pgs as usize);
        let mut replicas = Vec::with_capacity(pgs as usize * r);
        let mut settled = Vec::with_capacity(pgs as usize * r);
        // No hand-off pending: each group placed once.
        let as_placed = placement::settled_as_placed(&placed);
        for pg in 0..pgs {
            let chosen = placement::replicas(seed, pg, r, &placed);
            let held = if as_placed {
                chosen.clone()
            } else {
                placement::settled_replicas(seed, pg, r, &placed)
            };
            primaries.push(
                placement::acting_primary_of(r, &chosen, &held, &placed)
                    .map_or(NO_NODE, |i| placed[i].id),
            );
            replicas.extend((0..r).map(|k| chosen.get(k).map_or(NO_NODE, |&i| placed[i].id)));
            settled.extend((0..r).map(|k| held.get(k).map_or(NO_NODE, |&i| placed[i].id)));
        }
        Ok(ShardMap {
            epoch: view.epoch,
            node_id,
            pgs,
            seed,
            primaries,
            replica_count: r,
            replicas,
            settled,
            json,
            nodes: view
                .nodes
                .iter()
                .map(|(n, _)| MapNode {
                    id: n.id,
                    name: n.name.clone(),
                    state: n.node_state(),
                    zone: n.zone.clone(),
                    s3: n.s3.parse().ok(),
                    synced: n.synced,
                    // As a node's own setting is bounded.
                    ttl_ms: n.ttl_s.min(3600) * 1000,
                    filled: n.filled(),
                    empty: n.empty.is_some(),
                })
                .collect(),
            synced_tx,
            stale: Vec::new(),
            stale_any: Vec::new(),
            lead_after: Vec::new(),
            lead_after_max: AtomicU64::new(0),
            skipped: view.skipped.get(&node_id).copied().unwrap_or(0),
        })
    }

    /// When this node may start to lead group `pg` (`control::mono_ms`;
    /// 0: at once), or every group it leads (`None`).
    #[must_use]
    pub fn lead_after(&self, pg: Option<u32>) -> u64 {
        match pg {
            Some(pg) => self
                .lead_after
                .get(pg as usize)
                .map_or(0, |a| a.load(Ordering::Acquire)),
            None => self.lead_after_max.load(Ordering::Acquire),
        }
    }

    /// Placement groups by health, as this node's map has them (the
    /// `percore_cluster_groups` gauge): held here, led here, led here but
    /// still in a takeover wait at `now`, with fewer than R replicas up
    /// (cluster-wide), and with no replica up (cluster-wide).
    #[must_use]
    pub fn group_counts(&self, now: u64) -> [(&'static str, u64); 5] {
        let (mut held, mut led, mut waiting, mut degraded, mut dark) = (0, 0, 0, 0, 0);
        for pg in 0..self.pgs {
            if self.holds_pg(pg) {
                held += 1;
            }
            if self.primary_of_pg(pg) == self.node_id {
                led += 1;
                if self.lead_after(Some(pg)) > now {
                    waiting += 1;
                }
            }
            let up = self
                .replicas_of_pg(pg)
                .filter(|&n| {
                    self.node(n)
                        .is_some_and(|n| n.state == placement::NodeState::Up)
                })
                .count();
            if up == 0 {
                dark += 1;
            } else if up < self.replica_count {
                degraded += 1;
            }
        }
        [
            ("held", held),
            ("led", led),
            ("waiting", waiting),
            ("degraded", degraded),
            ("unavailable", dark),
        ]
    }

    /// The cluster's health as this node's map has it, as Prometheus text:
    /// `percore_cluster_groups` (`group_counts`); per node its state,
    /// whether it is synced, and the groups it holds and leads; and per
    /// group this node leads (so each group is shown by one node, its
    /// acting primary) its replicas placed, up, and up and synced (the
    /// ones that hold every acknowledged write: fewer than placed means
    /// replicas behind, catching up).
    pub fn render_health(&self, now: u64, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "# HELP percore_cluster_groups Placement groups by health, as this node's map has them: held and led by this node, led but waiting to take over, and cluster-wide those with fewer than R replicas up (degraded) or none (unavailable).\n# TYPE percore_cluster_groups gauge\n"
        );
        for (kind, n) in self.group_counts(now) {
            let _ = writeln!(out, "percore_cluster_groups{{kind=\"{kind}\"}} {n}");
        }
        let mut held: BTreeMap<u32, u64> = BTreeMap::new();
        let mut led: BTreeMap<u32, u64> = BTreeMap::new();
        for pg in 0..self.pgs {
            for n in self.replicas_of_pg(pg) {
                *held.entry(n).or_default() += 1;
            }
            *led.entry(self.primary_of_pg(pg)).or_default() += 1;
        }
        let _ = write!(
            out,
            "# HELP percore_cluster_node_state Each node's state in this node's map (1: the state it is in).\n# TYPE percore_cluster_node_state gauge\n"
        );
        let states = [
            placement::NodeState::Up,
            placement::NodeState::Down,
            placement::NodeState::Draining,
            placement::NodeState::Out,
        ];
        for n in &self.nodes {
            for s in states {
                let _ = writeln!(
                    out,
                    "percore_cluster_node_state{{node=\"{}\",zone=\"{}\",state=\"{}\"}} {}",
                    label(&n.name),
                    label(&n.zone),
                    s.name(),
                    u8::from(n.state == s)
                );
            }
        }
        let _ = write!(
            out,
            "# HELP percore_cluster_node_synced 1 if the node holds every acknowledged write of its groups, 0 while it catches up (it leads none of them then).\n# TYPE percore_cluster_node_synced gauge\n"
        );
        for n in &self.nodes {
            let _ = writeln!(
                out,
                "percore_cluster_node_synced{{node=\"{}\"}} {}",
                label(&n.name),
                u8::from(n.synced)
            );
        }
        let _ = write!(
            out,
            "# HELP percore_cluster_node_groups Placement groups each node holds (is a replica of) and leads (is the acting primary of), in this node's map.\n# TYPE percore_cluster_node_groups gauge\n"
        );
        for n in &self.nodes {
            for (role, counts) in [("held", &held), ("led", &led)] {
                let _ = writeln!(
                    out,
                    "percore_cluster_node_groups{{node=\"{}\",role=\"{role}\"}} {}",
                    label(&n.name),
                    counts.get(&n.id).copied().unwrap_or(0)
                );
            }
        }
        let _ = write!(
            out,
            "# HELP percore_cluster_group_replicas Per placement group this node leads that is not whole (fewer than R replicas placed, or fewer up and synced than placed; at most 4096 groups, the lowest): its replicas placed, up, and up and synced (holding every acknowledged write; placed minus synced replicas are behind).\n# TYPE percore_cluster_group_replicas gauge\n"
        );
        let mut shown = 0;
        for pg in 0..self.pgs {
            if self.primary_of_pg(pg) != self.node_id || shown == GROUP_SERIES_MAX {
                continue;
            }
            let (mut placed, mut up, mut synced) = (0, 0, 0);
            for r in self.replicas_of_pg(pg) {
                placed += 1;
                if let Some(n) = self.node(r).filter(|n| n.state == placement::NodeState::Up) {
                    up += 1;
                    synced += usize::from(n.synced);
                }
            }
            if placed == self.replica_count && synced == placed {
                continue;
            }
            shown += 1;
            for (kind, v) in [("placed", placed), ("up", up), ("synced", synced)] {
                let _ = writeln!(
                    out,
                    "percore_cluster_group_replicas{{pg=\"{pg}\",kind=\"{kind}\"}} {v}"
                );
            }
        }
    }

    /// How far behind each other node in the map is, as this node saw
    /// it as a primary (`missed`: every shard's `replicate::missed_now`):
    /// `percore_cluster_replica_missed_writes{node}`, the writes this
    /// node acknowledged without that node's copy (it was down, or its
    /// copy failed) since a map showed it up and synced after them, and
    /// `percore_cluster_replica_lag_seconds{node}`, how long ago the
    /// oldest of them was acknowledged (0 with none). Summed over the
    /// nodes (which lead groups apart), the writes are all the node lacks
    /// of those acknowledged; the largest lag is its lag.
    pub fn render_lag(&self, now: u64, missed: &[(u32, u64, u64)], out: &mut String) {
        use std::fmt::Write as _;
        let mut per: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for &(n, writes, since) in missed {
            let e = per.entry(n).or_insert((0, since));
            e.0 = e.0.saturating_add(writes);
            e.1 = e.1.min(since);
        }
        let others = || self.nodes.iter().filter(|n| n.id != self.node_id);
        let _ = write!(
            out,
            "# HELP percore_cluster_replica_missed_writes Writes this node acknowledged as a placement group's primary without a replica's copy (the replica was down, or its copy failed and etcd recorded it), per replica, until a newer map shows that replica up and synced (caught up); summed over the primaries, all the replica lacks.\n# TYPE percore_cluster_replica_missed_writes gauge\n"
        );
        for n in others() {
            let writes = per.get(&n.id).map_or(0, |p| p.0);
            let _ = writeln!(
                out,
                "percore_cluster_replica_missed_writes{{node=\"{}\"}} {writes}",
                label(&n.name)
            );
        }
        let _ = write!(
            out,
            "# HELP percore_cluster_replica_lag_seconds How long ago this node acknowledged, as a primary, the oldest write a replica lacks (percore_cluster_replica_missed_writes), per replica; 0 when it lacks none.\n# TYPE percore_cluster_replica_lag_seconds gauge\n"
        );
        for n in others() {
            let lag_ms = per
                .get(&n.id)
                .filter(|p| p.0 > 0)
                .map_or(0, |p| now.saturating_sub(p.1));
            let _ = writeln!(
                out,
                "percore_cluster_replica_lag_seconds{{node=\"{}\"}} {:.3}",
                label(&n.name),
                lag_ms as f64 / 1000.0
            );
        }
    }

    /// The ids of the nodes this node still waits for at `now`: each may
    /// go on leading, under an older map, a group this node leads now.
    #[must_use]
    pub fn pending_takeovers(&self, now: u64) -> Vec<u32> {
        let mut nodes = Vec::new();
        if self.lead_after(None) <= now {
            return nodes;
        }
        let up = self.up_ids();
        for pg in 0..self.pgs {
            if self.lead_after(Some(pg)) <= now {
                continue;
            }
            for s in self.waits_of(pg, &up) {
                if s.until.load(Ordering::Acquire) > now && !nodes.contains(&s.node) {
                    nodes.push(s.node);
                }
            }
        }
        nodes.sort_unstable();
        nodes
    }

    /// Whether `node` may still lead group `pg` under an older map at
    /// `now` (`control::mono_ms`), as far as this node knows: an entry of
    /// `stale` or `stale_any`, covered or not. Such a node is never
    /// skipped (`replicate`): it may be serving the group's reads, and a
    /// covered one is harmless only while it gets every write.
    #[must_use]
    pub fn may_still_lead(&self, pg: u32, node: u32, now: u64) -> bool {
        self.stale
            .get(pg as usize)
            .into_iter()
            .flatten()
            .chain(&self.stale_any)
            .any(|s| s.node == node && s.until.load(Ordering::Acquire) > now)
    }

    /// Node `from` released at `epoch` (it leads under no map older than
    /// that): it no longer holds up any group that waits for it to see a
    /// map no newer than `epoch`.
    pub fn released(&self, from: u32, epoch: u64) {
        for s in self.stale.iter().flatten().chain(&self.stale_any) {
            if s.node == from && s.need <= epoch {
                s.until.store(0, Ordering::Release);
            }
        }
        self.refresh_waits();
    }

    /// The ids of the nodes that may lead: up or draining (sorted).
    fn up_ids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|n| {
                matches!(
                    n.state,
                    placement::NodeState::Up | placement::NodeState::Draining
                )
            })
            .map(|n| n.id)
            .collect()
    }

    /// The entries that hold up group `pg` (led here): nodes other than
    /// this one, up (`up`: `up_ids`), unless covered (`Stale::covered`),
    /// holding the group now, while this node is synced.
    fn waits_of<'a>(&'a self, pg: u32, up: &'a [u32]) -> impl Iterator<Item = &'a Stale> + 'a {
        let synced = self.node(self.node_id).is_some_and(|n| n.synced);
        self.stale
            .get(pg as usize)
            .into_iter()
            .flatten()
            .chain(&self.stale_any)
            .filter(move |s| {
                s.node != self.node_id
                    && up.binary_search(&s.node).is_ok()
                    && !(s.covered && synced && self.replicas_of_pg(pg).any(|r| r == s.node))
            })
    }

    /// Sets `lead_after` from `stale` and `stale_any`.
    fn refresh_waits(&self) {
        let up = self.up_ids();
        let mut max = 0;
        for (pg, after) in (0u32..).zip(&self.lead_after) {
            let at = if self.primary_of_pg(pg) == self.node_id {
                self.waits_of(pg, &up)
                    .map(|s| s.until.load(Ordering::Acquire))
                    .max()
                    .unwrap_or(0)
            } else {
                0
            };
            after.store(at, Ordering::Release);
            max = max.max(at);
        }
        self.lead_after_max.store(max, Ordering::Release);
    }

    /// Sets the takeover waits, given the map this node's shards held
    /// before (`prev`), the time now and how long a node may lead under a
    /// map older than the newest (`stale_ms`). A group's acting primary in
    /// `prev`, if this map is the next epoch and gives the group another
    /// primary, may lead it under `prev` for `stale_ms` more (`covered`
    /// when `prev` made this node an up replica of the group); so may any
    /// other up node, under a map this node never held, after a gap in
    /// epochs or with no previous map. These entries carry over to later
    /// maps while they last, so a chain of takeovers (a drained node, then
    /// its successor unsynced) waits for every node that may still lead.
    fn set_takeovers(&mut self, prev: Option<&ShardMap>, now: u64, stale_ms: u64) {
        let prev = prev.filter(|p| p.pgs == self.pgs && p.node_id == self.node_id);
        let next_epoch = prev.is_some_and(|p| p.epoch.checked_add(1) == Some(self.epoch));
        // The same epoch again (only this node's `skipped` moved): the
        // same placement, nothing new may lead.
        let same_epoch = prev.is_some_and(|p| p.epoch == self.epoch);
        let until = now.saturating_add(stale_ms);
        let mut any = Vec::new();
        if let Some(p) = prev {
            carry_stale(&p.stale_any, now, &mut any);
        }
        if !next_epoch && !same_epoch {
            for id in self.up_ids() {
                if id != self.node_id {
                    add_stale(&mut any, id, self.epoch, until, false);
                }
            }
        }
        let mut stale = Vec::with_capacity(self.pgs as usize);
        for pg in 0..self.pgs {
            let mut list = Vec::new();
            if let Some(p) = prev {
                if let Some(old) = p.stale.get(pg as usize) {
                    carry_stale(old, now, &mut list);
                }
                let o = p.primary_of_pg(pg);
                if next_epoch && o != NO_NODE && o != self.node_id && o != self.primary_of_pg(pg) {
                    let covered = p.replicas_of_pg(pg).any(|r| r == self.node_id)
                        && p.node(self.node_id)
                            .is_some_and(|n| n.state == placement::NodeState::Up);
                    add_stale(&mut list, o, self.epoch, until, covered);
                }
            }
            stale.push(list);
        }
        self.stale = stale;
        self.stale_any = any;
        self.lead_after = (0..self.pgs).map(|_| AtomicU64::new(0)).collect();
        self.refresh_waits();
    }

    #[must_use]
    pub fn node(&self, id: u32) -> Option<&MapNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The other nodes that may hold keys: up, draining, and down ones
    /// (a down node is still its groups' primary and holds their only
    /// copy). Listings and bucket changes need every one of them: one that
    /// cannot be reached fails the request rather than leave it partial.
    pub fn holding_peers(&self) -> impl Iterator<Item = &MapNode> {
        self.nodes.iter().filter(move |n| {
            n.id != self.node_id
                && matches!(
                    n.state,
                    placement::NodeState::Up
                        | placement::NodeState::Draining
                        | placement::NodeState::Down
                )
        })
    }

    /// The other nodes a listing asks: those that are up (each key is
    /// listed by its group's acting primary, always an up node).
    pub fn listing_peers(&self) -> impl Iterator<Item = &MapNode> {
        self.nodes
            .iter()
            .filter(move |n| n.id != self.node_id && n.state == placement::NodeState::Up)
    }

    /// Whether every placement group has an acting primary (an up
    /// replica): else a listing would silently miss its keys.
    #[must_use]
    pub fn all_groups_served(&self) -> bool {
        !self.primaries.contains(&NO_NODE)
    }

    /// The placement group of `(bucket, key)`; a real version's index key
    /// (`\0v/KEY\0ID`, replicated as a key of its own) is in its key's.
    #[must_use]
    pub fn pg_of(&self, bucket: &str, key: &str) -> u32 {
        let key = crate::store::versions::base_key(key);
        let h = object_hash(self.seed, bucket.as_bytes(), key.as_bytes());
        placement::pg_of_hash(h, self.pgs).0
    }

    /// The node id of the acting primary of `(bucket, key)`'s placement
    /// group (`NO_NODE`: none is up).
    #[must_use]
    pub fn primary_of(&self, bucket: &str, key: &str) -> u32 {
        self.primaries[self.pg_of(bucket, key) as usize]
    }

    /// The acting primary of group `pg`.
    #[must_use]
    pub fn primary_of_pg(&self, pg: u32) -> u32 {
        self.primaries[pg as usize]
    }

    /// Whether this node is the acting primary of any group.
    #[must_use]
    pub fn leads_any(&self) -> bool {
        self.primaries.contains(&self.node_id)
    }

    /// Group `pg`'s replicas (node ids, placement order).
    pub fn replicas_of_pg(&self, pg: u32) -> impl Iterator<Item = u32> + '_ {
        self.slots(&self.replicas, pg)
    }

    /// Group `pg`'s settled replicas (node ids, settled primary first:
    /// `placement::settled_replicas`); none if no node is filled.
    pub fn settled_of_pg(&self, pg: u32) -> impl Iterator<Item = u32> + '_ {
        self.slots(&self.settled, pg)
    }

    /// Group `pg`'s node ids in `per_group` (`replica_count` per group,
    /// `NO_NODE` left out).
    fn slots<'a>(&self, per_group: &'a [u32], pg: u32) -> impl Iterator<Item = u32> + 'a {
        let r = self.replica_count;
        per_group[pg as usize * r..(pg as usize + 1) * r]
            .iter()
            .copied()
            .filter(|&n| n != NO_NODE)
    }

    /// Whether this node is one of group `pg`'s replicas.
    #[must_use]
    pub fn holds_pg(&self, pg: u32) -> bool {
        self.replicas_of_pg(pg).any(|n| n == self.node_id)
    }

    /// The nodes as placement sees them, in map order.
    #[must_use]
    pub fn placed(&self) -> Vec<placement::PlacedNode> {
        self.nodes
            .iter()
            .map(|n| placement::PlacedNode {
                id: n.id,
                zone: n.zone.clone(),
                state: n.state,
                synced: n.synced,
                filled: n.filled,
            })
            .collect()
    }

    /// The acks a write needs: a majority of the group's replica count.
    #[must_use]
    pub fn majority(&self) -> usize {
        self.replica_count / 2 + 1
    }
}

/// The control thread's end of the shards' map channels.
pub struct MapFeed {
    senders: Vec<mpsc::Sender<Arc<ShardMap>>>,
    /// Epochs a node caught up under, from its shards.
    pub synced_rx: mpsc::Receiver<Report>,
    pub synced_tx: mpsc::Sender<Report>,
    /// The epoch last sent (0: none yet).
    sent_epoch: u64,
    sent_json: String,
    /// The `ShardMap::skipped` sent last.
    sent_skipped: i64,
    /// The map last sent.
    last: Option<Arc<ShardMap>>,
    /// The bucket-owner shard's catalog channel.
    pub catalog_tx: mpsc::Sender<Arc<super::catalog::Catalog>>,
}

/// The bucket-owner shard's end of the catalog channel.
pub type CatalogRx = mpsc::Receiver<Arc<super::catalog::Catalog>>;

/// One channel per shard: the feed, each shard's receiver (index =
/// shard id), and the bucket-owner shard's catalog receiver.
#[must_use]
pub fn feed(shards: usize) -> (MapFeed, Vec<mpsc::Receiver<Arc<ShardMap>>>, CatalogRx) {
    let (senders, receivers) = (0..shards).map(|_| mpsc::channel()).unzip();
    let (synced_tx, synced_rx) = mpsc::channel();
    let (catalog_tx, catalog_rx) = mpsc::channel();
    (
        MapFeed {
            senders,
            synced_rx,
            synced_tx,
            sent_epoch: 0,
            sent_json: String::new(),
            sent_skipped: 0,
            last: None,
            catalog_tx,
        },
        receivers,
        catalog_rx,
    )
}

impl MapFeed {
    /// The epoch of the map sent last (0: none yet).
    #[must_use]
    pub fn sent_epoch(&self) -> u64 {
        self.sent_epoch
    }

    /// Whether `json` (`ShardMap::client_json`), with this node's
    /// `skipped/` revision, is the map sent last.
    #[must_use]
    pub fn is_current(&self, json: &str, skipped: i64) -> bool {
        self.sent_epoch != 0 && json == self.sent_json && skipped == self.sent_skipped
    }

    /// Sends `map` to every shard unless it is the map sent last. A map
    /// is sent only when it changed, so a channel holds at most the few
    /// maps of changes made within one shard poll. Groups it makes this
    /// node take over from another node that may still serve them wait
    /// `stale_ms` (`ShardMap::set_takeovers`).
    pub fn publish(&mut self, mut map: ShardMap, now: u64, stale_ms: u64) {
        if map.epoch == self.sent_epoch
            && map.json == self.sent_json
            && map.skipped == self.sent_skipped
        {
            return;
        }
        map.set_takeovers(self.last.as_deref(), now, stale_ms);
        self.sent_epoch = map.epoch;
        self.sent_skipped = map.skipped;
        self.sent_json.clone_from(&map.json);
        let map = Arc::new(map);
        self.last = Some(map.clone());
        for s in &self.senders {
            // A shard that stopped has dropped its receiver: nothing to do.
            let _ = s.send(map.clone());
        }
    }
}

/// Per-group series a node's /metrics shows at most, per metric.
pub const GROUP_SERIES_MAX: usize = 4096;

/// A Prometheus label value: backslash, double quote and newline escaped
/// (names in the map are checked at join, but etcd is read as it is).
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::map::{ClusterConfig, NodeRecord};

    fn record(id: u32, zone: &str, state: &str, shards: usize) -> (NodeRecord, i64) {
        let native: Vec<String> = (0..shards)
            .map(|s| format!("127.0.0.{id}:{}", 9100 + s))
            .collect();
        (
            NodeRecord {
                id,
                name: format!("n{id}"),
                zone: zone.into(),
                state: state.into(),
                s3: format!("127.0.0.{id}:9000"),
                native: native.join(","),
                admin: format!("127.0.0.{id}:9200"),
                shards,
                since_ms: 0,
                synced: true,
                filled: None,
                empty: None,
                disk: None,
                ttl_s: 0,
            },
            1,
        )
    }

    /// The map a node hands to clients places every key where the node's
    /// own table does: the client computes the same primaries.
    #[test]
    fn client_map_places_keys_as_the_node() {
        let view = View {
            config: ClusterConfig {
                pgs: 256,
                replicas: 3,
                seed: "0x00000000deadbeef".into(),
                down_out_s: 60,
                created_ms: 1,
            },
            epoch: 9,
            nodes: vec![
                record(1, "a", "up", 2),
                record(2, "a", "down", 4),
                record(3, "b", "draining", 1),
                record(4, "c", "up", 3),
                record(5, "c", "out", 2),
                record(6, "d", "weird", 2),
            ],
            alive: Default::default(),
            downs: Default::default(),
            skipped: Default::default(),
            unreadable: Vec::new(),
            filled_ids: None,
            epoch_revision: 0,
            revision: 0,
        };
        let m = ShardMap::build("c1", 4, &view).unwrap();
        let client = ClientMap::parse(&m.json).unwrap();
        assert_eq!(client.epoch, 9);
        assert_eq!(client.nodes.len(), 6);
        assert_eq!(client.nodes[1].native.len(), 4);
        let seed = client.seed().unwrap();
        assert_eq!(seed, 0xdead_beef);
        let placed = client.placed();
        let mut seen = std::collections::HashSet::new();
        for i in 0..2000 {
            let key = format!("key-{i}");
            let h = object_hash(seed, b"bkt", key.as_bytes());
            let (pg, _) = placement::pg_of_hash(h, client.pgs);
            let node = client.primary(seed, &placed, pg).unwrap();
            assert_eq!(m.primary_of("bkt", &key), client.nodes[node].id);
            seen.insert(client.nodes[node].id);
        }
        // Up nodes lead groups; a down node keeps its replica slots but
        // leads none (its groups' next replica does); draining, out and
        // unknown nodes hold none.
        assert_eq!(seen, [1, 4].into_iter().collect());
        let held: std::collections::HashSet<u32> = (0..256)
            .flat_map(|pg| m.replicas_of_pg(pg).collect::<Vec<_>>())
            .collect();
        assert_eq!(held, [1, 2, 4].into_iter().collect());
    }

    fn view(epoch: u64, states: &[&str]) -> View {
        View {
            config: ClusterConfig {
                pgs: 128,
                replicas: 2,
                seed: "0x0000000000c0ffee".into(),
                down_out_s: 60,
                created_ms: 1,
            },
            epoch,
            nodes: states
                .iter()
                .enumerate()
                .map(|(i, st)| {
                    let id = u32::try_from(i).unwrap() + 1;
                    let mut r = record(id, &format!("z{id}"), st, 1);
                    // Drained: its hand-offs recorded (`handoff`).
                    if *st == "draining" {
                        r.0.filled = Some(false);
                    }
                    r
                })
                .collect(),
            alive: Default::default(),
            downs: Default::default(),
            skipped: Default::default(),
            unreadable: Vec::new(),
            filled_ids: None,
            epoch_revision: 0,
            revision: 0,
        }
    }

    /// The samples of Prometheus text: (name, labels, value); every line
    /// but `#` comments is one well-formed sample.
    fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, u64)> {
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}').unwrap()),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            let mut rest = labels;
            while !rest.is_empty() {
                let (k, v) = rest.split_once("=\"").unwrap();
                let mut value = String::new();
                let mut chars = v.char_indices();
                let end = loop {
                    match chars.next().unwrap() {
                        (_, '\\') => value.push(chars.next().unwrap().1),
                        (i, '"') => break i,
                        (_, c) => value.push(c),
                    }
                };
                map.insert(k.to_string(), value);
                rest = v[end + 1..].strip_prefix(',').unwrap_or(&v[end + 1..]);
            }
            out.push((name.to_string(), map, value.parse().unwrap()));
        }
        out
    }

    /// `/metrics`' view of the map: each node's state, sync and groups,
    /// and each group this node leads with its replicas placed, up and
    /// synced, all agreeing with the map itself.
    #[test]
    fn health_metrics_agree_with_the_map() {
        let mut v = view(5, &["up", "down", "up", "draining", "up"]);
        v.nodes[2].0.synced = false;
        v.nodes[4].0.name = "odd\"name\\".into();
        let m = ShardMap::build("c1", 1, &v).unwrap();
        let mut text = String::new();
        m.render_health(0, &mut text);
        let all = samples(&text);
        let one = |name: &str, want: &[(&str, &str)]| -> u64 {
            let hits: Vec<u64> = all
                .iter()
                .filter(|(n, l, _)| {
                    n == name
                        && want
                            .iter()
                            .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|s| s.2)
                .collect();
            assert_eq!(hits.len(), 1, "{name} {want:?}: {hits:?}\n{text}");
            hits[0]
        };
        for (i, n) in m.nodes.iter().enumerate() {
            for st in ["up", "down", "draining", "out"] {
                let want = u64::from(n.state.name() == st);
                assert_eq!(
                    one(
                        "percore_cluster_node_state",
                        &[("node", &n.name), ("state", st)]
                    ),
                    want
                );
            }
            assert_eq!(
                one("percore_cluster_node_synced", &[("node", &n.name)]),
                u64::from(i != 2)
            );
            let held = (0..m.pgs)
                .filter(|&pg| m.replicas_of_pg(pg).any(|r| r == n.id))
                .count();
            let led = (0..m.pgs).filter(|&pg| m.primary_of_pg(pg) == n.id).count();
            for (role, want) in [("held", held), ("led", led)] {
                let got = one(
                    "percore_cluster_node_groups",
                    &[("node", &n.name), ("role", role)],
                );
                assert_eq!(got, want as u64);
            }
        }
        assert_eq!(
            one(
                "percore_cluster_node_state",
                &[("node", "odd\"name\\"), ("state", "up")]
            ),
            1
        );
        let mine = led(&m);
        assert!(!mine.is_empty());
        let shown: Vec<u32> = all
            .iter()
            .filter(|s| s.0 == "percore_cluster_group_replicas" && s.1["kind"] == "placed")
            .map(|s| s.1["pg"].parse().unwrap())
            .collect();
        let (mut behind, mut whole) = (0, 0);
        for pg in mine {
            let ups = m
                .replicas_of_pg(pg)
                .filter(|&r| [1, 3, 5].contains(&r))
                .count() as u64;
            let synced = ups - u64::from(m.replicas_of_pg(pg).any(|r| r == 3));
            if synced == 2 {
                // Whole: not shown.
                assert!(!shown.contains(&pg), "{pg}");
                whole += 1;
                continue;
            }
            let p = pg.to_string();
            let got = |kind: &str| {
                one(
                    "percore_cluster_group_replicas",
                    &[("pg", &p), ("kind", kind)],
                )
            };
            assert_eq!(got("placed"), 2, "{pg}");
            assert_eq!(got("up"), ups, "{pg}");
            assert_eq!(got("synced"), synced, "{pg}");
            behind += 1;
        }
        assert_eq!(shown.len(), behind, "{shown:?}");
        assert!(behind > 0 && whole > 0, "{behind} {whole}");
    }

    /// A replica's lag as a primary counts it: writes acknowledged while
    /// it was down or without its failed copy count against it, a copy it
    /// took does not; the count goes once a newer map shows it up and
    /// synced (not an unsynced one, nor the same map); `/metrics` sums
    /// the shards' counts and ages the oldest.
    #[test]
    fn replica_lag_counts_missed_writes_until_a_newer_map_shows_it_synced() {
        use crate::cluster::replicate::{missed_now, note_missed};
        let metrics = crate::metrics::ShardMetrics::default();
        let m = ShardMap::build("c1", 1, &view(5, &["up", "down", "up", "up", "up"])).unwrap();
        let other = |pg: u32| m.replicas_of_pg(pg).find(|&r| r != 1).unwrap();
        let mine = led(&m);
        let to_down = *mine.iter().find(|&&pg| other(pg) == 2).unwrap();
        let to_three: Vec<u32> = mine.iter().copied().filter(|&pg| other(pg) == 3).collect();
        assert!(to_three.len() >= 2, "{mine:?}");
        let n3 = m.node(3).unwrap();
        let t0 = crate::cluster::control::mono_ms();
        // Node 2 is down: not sent a copy, it lacks the write (twice).
        note_missed(&metrics, &m, to_down, &[], &[]);
        note_missed(&metrics, &m, to_down, &[], &[]);
        // Node 3 took one copy and failed another (skipped).
        note_missed(&metrics, &m, to_three[0], &[n3], &[]);
        note_missed(&metrics, &m, to_three[1], &[n3], &[3]);
        let now = missed_now(&metrics, &m);
        let counts: Vec<(u32, u64)> = now.iter().map(|&(n, w, _)| (n, w)).collect();
        assert_eq!(counts, vec![(2, 2), (3, 1)]);
        assert!(now.iter().all(|&(_, _, since)| since >= t0));

        // Another shard's count for node 2, older: summed, and the lag is
        // the oldest's age.
        let oldest = now[0].2.saturating_sub(5000);
        let mut all = now.clone();
        all.push((2, 4, oldest));
        let mut text = String::new();
        m.render_lag(oldest + 2500, &all, &mut text);
        for want in [
            "percore_cluster_replica_missed_writes{node=\"n2\"} 6",
            "percore_cluster_replica_missed_writes{node=\"n3\"} 1",
            "percore_cluster_replica_missed_writes{node=\"n4\"} 0",
            "percore_cluster_replica_lag_seconds{node=\"n2\"} 2.500",
            "percore_cluster_replica_lag_seconds{node=\"n5\"} 0.000",
        ] {
            assert!(text.lines().any(|l| l == want), "{want}\n{text}");
        }
        assert!(!text.contains("node=\"n1\""), "{text}");

        // The same map showing them synced is not news; a newer map with
        // node 2 back and synced, node 3 up but catching up, drops node 2
        // only; then node 3 synced drops it; a node gone from the map goes.
        let same = ShardMap::build("c1", 1, &view(5, &["up"; 5])).unwrap();
        assert_eq!(missed_now(&metrics, &same).len(), 2);
        let mut v = view(6, &["up"; 5]);
        v.nodes[2].0.synced = false;
        let newer = ShardMap::build("c1", 1, &v).unwrap();
        let left: Vec<u32> = missed_now(&metrics, &newer).iter().map(|e| e.0).collect();
        assert_eq!(left, vec![3]);
        let synced = ShardMap::build("c1", 1, &view(7, &["up"; 5])).unwrap();
        assert!(missed_now(&metrics, &synced).is_empty());

        // Missed again after catching up, with no scrape between: the
        // count starts again (from the write's map, newer than the last
        // miss, showing it synced), its time with it.
        note_missed(&metrics, &m, to_down, &[], &[]);
        metrics
            .replica_missed
            .borrow_mut()
            .get_mut(&2)
            .unwrap()
            .since_ms = 0;
        let pg = led(&synced)
            .into_iter()
            .find(|&pg| synced.replicas_of_pg(pg).any(|r| r == 2))
            .unwrap();
        note_missed(&metrics, &synced, pg, &[synced.node(2).unwrap()], &[2]);
        let mut v = view(8, &["up"; 5]);
        v.nodes[1].0.state = "down".into();
        let down_again = ShardMap::build("c1", 1, &v).unwrap();
        let now = missed_now(&metrics, &down_again);
        assert_eq!(now.len(), 1);
        assert_eq!((now[0].0, now[0].1), (2, 1), "{now:?}");
        assert!(now[0].2 >= t0, "{now:?}");
        // Draining or out: placed on no group, its count goes; so does a
        // node gone from the map.
        for (i, state) in [(1, "draining"), (1, "out")] {
            note_missed(&metrics, &down_again, pg, &[], &[]);
            let mut v = view(9, &["up"; 5]);
            v.nodes[i].0.state = state.into();
            let gone = ShardMap::build("c1", 1, &v).unwrap();
            assert!(missed_now(&metrics, &gone).is_empty(), "{state}");
        }
        note_missed(&metrics, &down_again, pg, &[], &[]);
        let fewer = ShardMap::build("c1", 1, &view(9, &["up"])).unwrap();
        assert!(missed_now(&metrics, &fewer).is_empty());
    }

    /// The groups `m`'s node leads.
    fn led(m: &ShardMap) -> Vec<u32> {
        (0..m.pgs)
            .filter(|&pg| m.primary_of_pg(pg) == m.node_id)
            .collect()
    }

    /// Releases every wait of `m` (as if every node answered).
    fn release_all(m: &ShardMap) {
        for n in m.pending_takeovers(0) {
            m.released(n, m.epoch);
        }
        assert_eq!(m.lead_after(None), 0);
    }

    /// A node waits before it leads a group that another node may still
    /// lead under an older map: on its first map, every other up node
    /// that does not hold the group now; on the next epoch, the group's
    /// previous primary if it is still up and no longer holds it (drained),
    /// not if it is down; after a gap in epochs, every such node again,
    /// groups it led before included. Waits carry over to later maps, so
    /// a chain of takeovers waits for the first node too; a release clears
    /// only the waits of the node that released, for maps it has seen.
    #[test]
    fn takeovers_wait_for_every_node_that_may_still_lead() {
        let me = 1;
        let all_up = ["up", "up", "up", "up"];
        // The first map: with 4 nodes and 2 replicas, every group this node
        // leads has an up node that does not hold it: all wait.
        let mut first = ShardMap::build("c", me, &view(5, &all_up)).unwrap();
        first.set_takeovers(None, 1000, 500);
        assert!(!led(&first).is_empty());
        assert!(led(&first)
            .iter()
            .all(|&pg| first.lead_after(Some(pg)) == 1500));
        assert!((0..128)
            .filter(|&pg| first.primary_of_pg(pg) != me)
            .all(|pg| first.lead_after(Some(pg)) == 0));
        assert_eq!(first.pending_takeovers(1000), [2, 3, 4]);
        // A release for an older map clears nothing; one node's release
        // clears only the groups no other node holds up.
        first.released(2, 4);
        assert_eq!(first.lead_after(None), 1500);
        first.released(2, 5);
        assert_eq!(first.pending_takeovers(1000), [3, 4]);
        // Nodes 3 and 4 may have led any group under a map this node never
        // held (holding it now proves nothing): every group still waits.
        assert!(led(&first)
            .iter()
            .all(|&pg| first.lead_after(Some(pg)) == 1500));
        release_all(&first);
        // Past the wait: nothing carried.
        let mut later = ShardMap::build("c", me, &view(6, &all_up)).unwrap();
        later.set_takeovers(Some(&first), 2000, 500);
        assert_eq!(later.lead_after(None), 0);

        // Every node holds every group (R = node count): a first map waits
        // all the same (the other may have led under a map in which this
        // node held nothing, with writes it never got).
        let mut small = ShardMap::build("c", me, &view(5, &["up", "up"])).unwrap();
        small.set_takeovers(None, 1000, 500);
        assert!(led(&small)
            .iter()
            .all(|&pg| small.lead_after(Some(pg)) == 1500));
        assert_eq!(small.pending_takeovers(1000), [2]);

        let mut base = ShardMap::build("c", me, &view(5, &all_up)).unwrap();
        base.set_takeovers(None, 1000, 500);
        release_all(&base);
        // Node 2 drained (up, holds nothing) or down (its lease expired).
        for (state, waits) in [("draining", true), ("down", false)] {
            let mut next = ShardMap::build("c", me, &view(6, &["up", state, "up", "up"])).unwrap();
            next.set_takeovers(Some(&base), 1200, 500);
            let mut taken = 0;
            for pg in 0..128 {
                let expect = if next.primary_of_pg(pg) == me && base.primary_of_pg(pg) == 2 && waits
                {
                    taken += 1;
                    1700
                } else {
                    0
                };
                assert_eq!(next.lead_after(Some(pg)), expect, "{state} pg {pg}");
            }
            assert_eq!(taken > 0, waits, "{state}");
            if waits {
                assert_eq!(next.pending_takeovers(1200), [2]);
                next.released(3, 6);
                next.released(2, 5);
                assert_eq!(next.lead_after(None), 1700);
                next.released(2, 6);
                assert_eq!(next.lead_after(None), 0);
            } else {
                assert!(next.pending_takeovers(1200).is_empty());
            }
            // A gap in epochs: every group this node leads waits for every
            // other up node, those it led before included.
            let mut gap = ShardMap::build("c", me, &view(8, &["up", state, "up", "up"])).unwrap();
            gap.set_takeovers(Some(&base), 1200, 500);
            let up_others: &[u32] = if waits { &[2, 3, 4] } else { &[3, 4] };
            assert_eq!(gap.pending_takeovers(1200), up_others);
            assert!(led(&gap).iter().all(|&pg| gap.lead_after(Some(pg)) == 1700));
        }
    }

    /// The old primary still holds the group: not waited for when this node
    /// was an up replica of it in the map the old primary led under (that
    /// one cannot acknowledge without this node's copy) and is synced;
    /// waited for when this node was not (it was down in that map), and
    /// when this node is not synced.
    #[test]
    fn a_holder_waits_unless_it_could_not_write_without_this_node() {
        let me = 1;
        let all_up = ["up", "up", "up", "up"];
        let mut base = ShardMap::build("c", me, &view(5, &all_up)).unwrap();
        base.set_takeovers(None, 1000, 500);
        release_all(&base);
        // Node 2 turns unsynced (it still holds its groups): the groups it
        // led go to their next replica, this node for some.
        let mut v = view(6, &all_up);
        v.nodes[1].0.synced = false;
        let mut next = ShardMap::build("c", me, &v).unwrap();
        next.set_takeovers(Some(&base), 1200, 500);
        let moved: Vec<u32> = led(&next)
            .into_iter()
            .filter(|&pg| base.primary_of_pg(pg) == 2)
            .collect();
        assert!(!moved.is_empty());
        for &pg in &moved {
            assert!(next.replicas_of_pg(pg).any(|r| r == 2));
            assert_eq!(next.lead_after(Some(pg)), 0, "pg {pg}");
            // Not waited for, but node 2 may still lead the group: it
            // must not be skipped (it may serve reads) until its map read
            // is due.
            assert!(next.may_still_lead(pg, 2, 1600));
            assert!(!next.may_still_lead(pg, 2, 1700));
            assert!(!next.may_still_lead(pg, 3, 1600));
        }
        // The same map again with this node's skipped/ revision moved: the
        // same epoch adds no waits (it is no gap).
        let mut again = ShardMap::build("c", me, &v).unwrap();
        again.skipped = 9;
        again.set_takeovers(Some(&next), 1300, 500);
        assert_eq!(again.lead_after(None), 0);
        assert!(again.stale_any.is_empty());
        // This node was down in the map node 2 led under: it waits.
        let mut was_down = ShardMap::build("c", me, &view(5, &["down", "up", "up", "up"])).unwrap();
        was_down.set_takeovers(None, 1000, 500);
        let mut back = ShardMap::build("c", me, &view(6, &all_up)).unwrap();
        back.set_takeovers(Some(&was_down), 1200, 500);
        let taken: Vec<u32> = led(&back)
            .into_iter()
            .filter(|&pg| was_down.primary_of_pg(pg) != me)
            .collect();
        assert!(!taken.is_empty());
        assert!(taken.iter().all(|&pg| back.lead_after(Some(pg)) == 1700));
        // This node unsynced (an up replica all the same): node 2 turns
        // unsynced too, so groups with no synced replica fall to their
        // first up replica, this node for some: they wait.
        let mut v = view(5, &all_up);
        v.nodes[0].0.synced = false;
        let mut unsynced = ShardMap::build("c", me, &v).unwrap();
        unsynced.set_takeovers(None, 1000, 500);
        release_all(&unsynced);
        let mut v = view(6, &all_up);
        v.nodes[0].0.synced = false;
        v.nodes[1].0.synced = false;
        let mut both = ShardMap::build("c", me, &v).unwrap();
        both.set_takeovers(Some(&unsynced), 1200, 500);
        let moved: Vec<u32> = led(&both)
            .into_iter()
            .filter(|&pg| unsynced.primary_of_pg(pg) == 2)
            .collect();
        assert!(!moved.is_empty());
        for &pg in &moved {
            assert!(both.replicas_of_pg(pg).any(|r| r == 2));
            assert_eq!(both.lead_after(Some(pg)), 1700, "pg {pg}");
        }
    }

    /// A chain: node 2 drains (its groups go to others, unreleased), then
    /// node 3 too: a group 2 led at epoch 5 and this node leads at epoch 7
    /// waits for 2 as well as for 3; 2's release leaves only the waits for 3.
    #[test]
    fn chained_takeovers_wait_for_every_earlier_primary() {
        let me = 1;
        let mut base = ShardMap::build("c", me, &view(5, &["up", "up", "up", "up"])).unwrap();
        base.set_takeovers(None, 1000, 500);
        release_all(&base);
        let mut six = ShardMap::build("c", me, &view(6, &["up", "draining", "up", "up"])).unwrap();
        six.set_takeovers(Some(&base), 1200, 500);
        let mut seven =
            ShardMap::build("c", me, &view(7, &["up", "draining", "draining", "up"])).unwrap();
        seven.set_takeovers(Some(&six), 1300, 500);
        let mut chained = 0;
        for pg in led(&seven) {
            let from2 = base.primary_of_pg(pg) == 2;
            let from3 = six.primary_of_pg(pg) == 3;
            if from2 && six.primary_of_pg(pg) != me {
                chained += 1;
            }
            let expect = if from3 {
                1800
            } else if from2 {
                1700
            } else {
                0
            };
            assert_eq!(seven.lead_after(Some(pg)), expect, "pg {pg}");
        }
        assert!(chained > 0);
        // 2 releases: only the waits for 3 remain.
        seven.released(2, 7);
        assert_eq!(seven.pending_takeovers(1300), [3]);
        for pg in led(&seven) {
            let expect = if six.primary_of_pg(pg) == 3 { 1800 } else { 0 };
            assert_eq!(seven.lead_after(Some(pg)), expect);
        }
    }

    #[test]
    fn feed_sends_only_changes() {
        let (mut feed, rx, _catalog) = feed(2);
        let map = |epoch: u64, json: &str, skipped: i64| ShardMap {
            epoch,
            node_id: 1,
            pgs: 1,
            seed: 0,
            primaries: vec![1],
            replica_count: 1,
            replicas: vec![1],
            settled: vec![1],
            json: json.into(),
            nodes: Vec::new(),
            synced_tx: mpsc::channel().0,
            stale: Vec::new(),
            stale_any: Vec::new(),
            lead_after: Vec::new(),
            lead_after_max: AtomicU64::new(0),
            skipped,
        };
        feed.publish(map(1, "a", 0), 0, 0);
        feed.publish(map(1, "a", 0), 0, 0);
        assert!(feed.is_current("a", 0));
        // The same map with this node's skipped/ key moved: sent again (a
        // catch-up under it must run again).
        assert!(!feed.is_current("a", 7));
        feed.publish(map(1, "a", 7), 0, 0);
        feed.publish(map(2, "b", 7), 0, 0);
        for r in &rx {
            let sent: Vec<_> = r.try_iter().map(|m| (m.epoch, m.skipped)).collect();
            assert_eq!(sent, [(1, 0), (1, 7), (2, 7)]);
        }
    }
}
