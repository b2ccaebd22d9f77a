//! The cluster map in etcd: its keys, records and the transactions that
//! change it (`docs/cluster.md`, "etcd layout").
//!
//! ```text
//! /percore/<cluster>/config        {"pgs":..,"replicas":..,"seed":..}   created once
//! /percore/<cluster>/epoch         decimal map epoch, +1 with every change to nodes/
//! /percore/<cluster>/next_id       decimal, the next node id
//! /percore/<cluster>/names/<name>  decimal id of a node name
//! /percore/<cluster>/nodes/<id>    NodeRecord (JSON)
//! /percore/<cluster>/alive/<id>    attached to the node's lease
//! ```
//!
//! Every change to `nodes/` is one transaction that also moves the epoch,
//! with compares on the revisions it read (optimistic: on a conflict the
//! caller reads again and retries), so each change is made once, by one
//! writer, whoever else tries.

use std::collections::HashSet;

use percore_protocol::placement::{self, NodeState, PlacedNode};
use serde::{Deserialize, Serialize};

use super::etcd::{prefix_end, txn, Etcd};

/// Most placement groups `cluster init` takes.
pub const PGS_MAX: u32 = placement::PG_COUNT_MAX;
/// Tries of an optimistic transaction before giving up.
const CONFLICT_RETRIES: usize = 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterConfig {
    pub pgs: u32,
    pub replicas: usize,
    pub seed: u64,
    pub created_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeRecord {
    pub id: u32,
    pub name: String,
    pub zone: String,
    /// `up`, `down`, `draining` or `out` (`NodeState`).
    pub state: String,
    pub s3: String,
    pub native: String,
    pub admin: String,
    pub shards: usize,
    /// When `state` last changed (ms since the epoch).
    pub since_ms: u64,
}

impl NodeRecord {
    #[must_use]
    pub fn node_state(&self) -> NodeState {
        NodeState::from_name(&self.state).unwrap_or(NodeState::Out)
    }
}

/// The map as read from etcd at one revision.
#[derive(Debug, Clone)]
pub struct View {
    pub config: ClusterConfig,
    pub epoch: u64,
    /// With the mod revision of each record.
    pub nodes: Vec<(NodeRecord, i64)>,
    /// Nodes whose lease key exists.
    pub alive: HashSet<u32>,
    pub epoch_revision: i64,
}

impl View {
    /// Placement groups per node (replicas, primaries), by index in `nodes`.
    #[must_use]
    pub fn placement_counts(&self) -> Vec<(usize, usize)> {
        let placed: Vec<PlacedNode> = self
            .nodes
            .iter()
            .map(|(n, _)| PlacedNode {
                id: n.id,
                zone: n.zone.clone(),
                state: n.node_state(),
            })
            .collect();
        let mut counts = vec![(0, 0); placed.len()];
        for pg in 0..self.config.pgs {
            let r = placement::replicas(self.config.seed, pg, self.config.replicas, &placed);
            for (i, &n) in r.iter().enumerate() {
                counts[n].0 += 1;
                if i == 0 {
                    counts[n].1 += 1;
                }
            }
        }
        counts
    }

    #[must_use]
    pub fn node_named(&self, name: &str) -> Option<&(NodeRecord, i64)> {
        self.nodes.iter().find(|(n, _)| n.name == name)
    }

    /// The node `name` and its record's revision, or an error naming it.
    pub fn named(&self, name: &str) -> Result<(NodeRecord, i64), String> {
        self.node_named(name)
            .cloned()
            .ok_or_else(|| format!("no node named {name} in the cluster"))
    }
}

/// The keys of one cluster.
pub struct Keys {
    root: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Result<Keys, String> {
        if cluster.is_empty()
            || cluster.len() > 64
            || !cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "cluster name {cluster:?}: use 1-64 letters, digits, - and _"
            ));
        }
        Ok(Keys {
            root: format!("/percore/{cluster}/"),
        })
    }

    fn key(&self, rest: &str) -> Vec<u8> {
        format!("{}{rest}", self.root).into_bytes()
    }

    fn config(&self) -> Vec<u8> {
        self.key("config")
    }
    fn epoch(&self) -> Vec<u8> {
        self.key("epoch")
    }
    fn next_id(&self) -> Vec<u8> {
        self.key("next_id")
    }
    fn name(&self, name: &str) -> Vec<u8> {
        self.key(&format!("names/{name}"))
    }
    fn node(&self, id: u32) -> Vec<u8> {
        self.key(&format!("nodes/{id}"))
    }
    fn nodes(&self) -> Vec<u8> {
        self.key("nodes/")
    }
    #[must_use]
    pub fn alive(&self, id: u32) -> Vec<u8> {
        self.key(&format!("alive/{id}"))
    }
    fn alives(&self) -> Vec<u8> {
        self.key("alive/")
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn decimal(bytes: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not a number in etcd: {:?}", String::from_utf8_lossy(bytes)))
}

/// Whether a node name is usable (it is an etcd key component and shows in
/// status lines).
pub fn check_node_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(format!(
            "node name {name:?}: use 1-64 letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

/// Creates the cluster; refuses if it exists.
pub fn init(
    etcd: &Etcd,
    keys: &Keys,
    replicas: usize,
    pgs: u32,
    seed: u64,
) -> Result<ClusterConfig, String> {
    if !(1..=placement::REPLICAS_MAX).contains(&replicas) {
        return Err(format!(
            "--replicas {replicas}: use 1 to {}",
            placement::REPLICAS_MAX
        ));
    }
    if !(1..=PGS_MAX).contains(&pgs) {
        return Err(format!("--pgs {pgs}: use 1 to {PGS_MAX}"));
    }
    let config = ClusterConfig {
        pgs,
        replicas,
        seed,
        created_ms: now_ms(),
    };
    let json = serde_json::to_vec(&config).map_err(|e| e.to_string())?;
    let created = etcd.txn(
        vec![txn::absent(&keys.config())],
        vec![
            txn::put(&keys.config(), &json),
            txn::put(&keys.epoch(), b"1"),
            txn::put(&keys.next_id(), b"1"),
        ],
        vec![],
    )?;
    if !created {
        return Err("the cluster exists already (percore cluster status shows it)".into());
    }
    Ok(config)
}

/// Reads the whole map.
pub fn load(etcd: &Etcd, keys: &Keys) -> Result<View, String> {
    let config = etcd.get(&keys.config())?.ok_or(
        "no such cluster in etcd: create it with `percore cluster init --cluster URLS --replicas R`",
    )?;
    let config: ClusterConfig =
        serde_json::from_slice(&config.value).map_err(|e| format!("cluster config: {e}"))?;
    let epoch = etcd
        .get(&keys.epoch())?
        .ok_or("the cluster has no epoch key")?;
    let (nodes, _) = etcd.range(&keys.nodes(), Some(&prefix_end(&keys.nodes())))?;
    let mut records = Vec::with_capacity(nodes.len());
    for kv in nodes {
        let record: NodeRecord = serde_json::from_slice(&kv.value)
            .map_err(|e| format!("node record {}: {e}", String::from_utf8_lossy(&kv.key)))?;
        records.push((record, kv.mod_revision));
    }
    records.sort_by_key(|(n, _)| n.id);
    let (alive, _) = etcd.range(&keys.alives(), Some(&prefix_end(&keys.alives())))?;
    let prefix = keys.alives();
    let alive = alive
        .iter()
        .filter_map(|kv| decimal(&kv.key[prefix.len()..]).ok())
        .map(|id| id as u32)
        .collect();
    Ok(View {
        config,
        epoch: decimal(&epoch.value)?,
        nodes: records,
        alive,
        epoch_revision: epoch.mod_revision,
    })
}

/// Writes `record` (compared against the revision `seen` it was read at;
/// 0: it must not exist yet) and moves the epoch, in one transaction.
/// Whether it was written (false: the map changed meanwhile).
fn write_node(
    etcd: &Etcd,
    keys: &Keys,
    view: &View,
    record: &NodeRecord,
    seen: i64,
) -> Result<bool, String> {
    let json = serde_json::to_vec(record).map_err(|e| e.to_string())?;
    let next = (view.epoch + 1).to_string();
    etcd.txn(
        vec![
            txn::unchanged(&keys.epoch(), view.epoch_revision),
            txn::unchanged(&keys.node(record.id), seen),
        ],
        vec![
            txn::put(&keys.node(record.id), &json),
            txn::put(&keys.epoch(), next.as_bytes()),
        ],
        vec![],
    )
}

/// A change to a node's record: the new record, or None to leave it.
pub type NodeChange<'a> = &'a dyn Fn(&View, &NodeRecord) -> Result<Option<NodeRecord>, String>;

/// Changes one node's record with `change` (None: leave it), retrying on
/// conflicts. Returns the record written, if any.
pub fn update_node(
    etcd: &Etcd,
    keys: &Keys,
    name: &str,
    change: NodeChange<'_>,
) -> Result<Option<NodeRecord>, String> {
    for _ in 0..CONFLICT_RETRIES {
        let view = load(etcd, keys)?;
        let (record, seen) = view.named(name)?;
        let Some(new) = change(&view, &record)? else {
            return Ok(None);
        };
        if write_node(etcd, keys, &view, &new, seen)? {
            return Ok(Some(new));
        }
    }
    Err("the cluster map kept changing; try again".into())
}

/// What a node advertises when it joins.
#[derive(Debug, Clone)]
pub struct Joining {
    pub name: String,
    pub zone: String,
    pub s3: String,
    pub native: String,
    pub admin: String,
    pub shards: usize,
}

/// Registers (or re-registers) a node, `up`; its id. A name keeps its id.
pub fn join(etcd: &Etcd, keys: &Keys, joining: &Joining) -> Result<NodeRecord, String> {
    check_node_name(&joining.name)?;
    for _ in 0..CONFLICT_RETRIES {
        let view = load(etcd, keys)?;
        let (id, seen) = match etcd.get(&keys.name(&joining.name))? {
            Some(kv) => {
                let id = decimal(&kv.value)? as u32;
                let seen = view
                    .nodes
                    .iter()
                    .find(|(n, _)| n.id == id)
                    .map_or(0, |(_, r)| *r);
                (id, seen)
            }
            None => {
                // Reserve a fresh id for the name.
                let next = etcd
                    .get(&keys.next_id())?
                    .ok_or("the cluster has no next_id key")?;
                let id = decimal(&next.value)? as u32;
                let reserved = etcd.txn(
                    vec![
                        txn::unchanged(&keys.next_id(), next.mod_revision),
                        txn::absent(&keys.name(&joining.name)),
                    ],
                    vec![
                        txn::put(&keys.next_id(), (id + 1).to_string().as_bytes()),
                        txn::put(&keys.name(&joining.name), id.to_string().as_bytes()),
                    ],
                    vec![],
                )?;
                if !reserved {
                    continue;
                }
                (id, 0)
            }
        };
        let record = NodeRecord {
            id,
            name: joining.name.clone(),
            zone: joining.zone.clone(),
            state: NodeState::Up.name().into(),
            s3: joining.s3.clone(),
            native: joining.native.clone(),
            admin: joining.admin.clone(),
            shards: joining.shards,
            since_ms: now_ms(),
        };
        let old = view.nodes.iter().find(|(n, _)| n.id == id).map(|(n, _)| n);
        // A draining node stays draining when it restarts.
        let record = match old {
            Some(o) if o.node_state() == NodeState::Draining => NodeRecord {
                state: o.state.clone(),
                since_ms: o.since_ms,
                ..record
            },
            _ => record,
        };
        if old == Some(&record) || write_node(etcd, keys, &view, &record, seen)? {
            return Ok(record);
        }
    }
    Err("the cluster map kept changing while this node joined; try again".into())
}

/// Removes a node from the map for good (its name may join again, as a new
/// node). Refused while it is alive.
pub fn remove(etcd: &Etcd, keys: &Keys, name: &str) -> Result<NodeRecord, String> {
    for _ in 0..CONFLICT_RETRIES {
        let view = load(etcd, keys)?;
        let (record, seen) = view.named(name)?;
        if view.alive.contains(&record.id) {
            return Err(format!(
                "node {name} is running; stop it first (drain it before, so that its data moves)"
            ));
        }
        let next = (view.epoch + 1).to_string();
        let done = etcd.txn(
            vec![
                txn::unchanged(&keys.epoch(), view.epoch_revision),
                txn::unchanged(&keys.node(record.id), seen),
                txn::absent(&keys.alive(record.id)),
            ],
            vec![
                txn::delete(&keys.node(record.id)),
                txn::delete(&keys.name(name)),
                txn::put(&keys.epoch(), next.as_bytes()),
            ],
            vec![],
        )?;
        if done {
            return Ok(record);
        }
    }
    Err("the cluster map kept changing; try again".into())
}

/// Marks nodes whose lease is gone `down`, and nodes down for longer than
/// `out_after_ms` `out`; at most one change per call (the caller calls
/// again). Returns the change made, as (name, new state).
pub fn detect_failures(
    etcd: &Etcd,
    keys: &Keys,
    view: &View,
    out_after_ms: u64,
) -> Result<Option<(String, NodeState)>, String> {
    let now = now_ms();
    for (record, seen) in &view.nodes {
        let alive = view.alive.contains(&record.id);
        let next = match record.node_state() {
            NodeState::Up | NodeState::Draining if !alive => NodeState::Down,
            NodeState::Down if !alive && now.saturating_sub(record.since_ms) >= out_after_ms => {
                NodeState::Out
            }
            _ => continue,
        };
        let new = NodeRecord {
            state: next.name().into(),
            since_ms: now,
            ..record.clone()
        };
        // The lease must still be gone when the change is made.
        let json = serde_json::to_vec(&new).map_err(|e| e.to_string())?;
        let epoch = (view.epoch + 1).to_string();
        let done = etcd.txn(
            vec![
                txn::unchanged(&keys.epoch(), view.epoch_revision),
                txn::unchanged(&keys.node(record.id), *seen),
                txn::absent(&keys.alive(record.id)),
            ],
            vec![
                txn::put(&keys.node(record.id), &json),
                txn::put(&keys.epoch(), epoch.as_bytes()),
            ],
            vec![],
        )?;
        return Ok(done.then(|| (record.name.clone(), next)));
    }
    Ok(None)
}
