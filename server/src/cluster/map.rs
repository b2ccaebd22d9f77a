//! The cluster map in etcd: its keys, records and the transactions that
//! change it (`docs/cluster.md`, "etcd layout").
//!
//! ```text
//! /percore/<cluster>/config        {"pgs":..,"replicas":..,"seed":"0x..",..}   created once
//! /percore/<cluster>/epoch         decimal map epoch, +1 with every change to nodes/
//! /percore/<cluster>/next_id       decimal, the next node id
//! /percore/<cluster>/names/<name>  decimal id of a node name
//! /percore/<cluster>/nodes/<id>    NodeRecord (JSON)
//! /percore/<cluster>/filled        JSON array of the filled node ids (the
//!                                  record of hand-offs, handoff.rs): one
//!                                  key, so that one transaction of a few
//!                                  operations fills any number of nodes
//! /percore/<cluster>/alive/<id>    the running process's nonce, on its lease
//! /percore/<cluster>/down/<id>     on a lease of the grace period, from when the
//!                                  node was marked down
//! /percore/<cluster>/skipped/<id>  written (by a primary) each time a write is
//!                                  acknowledged without the node's copy; its
//!                                  revision fences the node's catch-up
//! ```
//!
//! Every change to `nodes/` is one transaction that also moves the epoch,
//! with compares on the revisions it read (optimistic: on a conflict the
//! caller reads again and retries), so each change is made once, by one
//! writer, whoever else tries. Time is etcd's: the grace period is a lease,
//! not a comparison of two nodes' clocks.

use std::collections::{BTreeSet, HashMap, HashSet};

use percore_protocol::placement::{self, NodeState, PlacedNode};
use serde::{Deserialize, Serialize};

use super::etcd::{prefix_end, txn, Etcd};
use super::handoff;

/// Most placement groups `cluster init` takes.
pub const PGS_MAX: u32 = placement::PG_COUNT_MAX;
/// Tries of an optimistic transaction before giving up.
const CONFLICT_RETRIES: usize = 20;
/// Most node records one transaction marks unsynced (`with_gainers`):
/// etcd refuses a transaction of more than `--max-txn-ops` operations
/// (128 by default) in its compares or its puts.
const GAINERS_PER_TXN: usize = 100;
/// Default grace period before a down node is marked out.
pub const DOWN_OUT_S_DEFAULT: u64 = 600;

fn down_out_default() -> u64 {
    DOWN_OUT_S_DEFAULT
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterConfig {
    pub pgs: u32,
    pub replicas: usize,
    /// The placement seed as a hex string (`0x...`): a JSON number above
    /// 2^53 is rounded by many JSON readers.
    pub seed: String,
    /// A node down this long is marked out (cluster-wide).
    #[serde(default = "down_out_default")]
    pub down_out_s: u64,
    pub created_ms: u64,
}

impl ClusterConfig {
    pub fn seed(&self) -> Result<u64, String> {
        self.seed
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("cluster config: bad seed {:?}", self.seed))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeRecord {
    pub id: u32,
    pub name: String,
    pub zone: String,
    /// `up`, `down`, `draining` or `out` (`NodeState`).
    pub state: String,
    pub s3: String,
    /// Every shard's native address, comma-separated (shard i is the i-th).
    pub native: String,
    pub admin: String,
    pub shards: usize,
    /// When `state` last changed (ms since the epoch, the writer's clock;
    /// shown, never compared).
    pub since_ms: u64,
    /// Whether the node holds every write of its placement groups: false
    /// from its join (or a map change that gave it groups) until it has
    /// caught up from the groups' primaries. Records written before
    /// replication have none: synced.
    #[serde(default = "synced_default")]
    pub synced: bool,
    /// Whether it is recorded as holding its groups
    /// (`placement::PlacedNode::filled`, `handoff`): false for a node that
    /// joins under a new name or after it was out; set with `synced`
    /// (`mark_synced`) or by `settle` when the hand-off allows it, cleared
    /// by `settle` (drained) and when marked out; kept across joins.
    /// Kept in the `filled` key (`load` sets it here from that key; records
    /// are stored without it: `record_json`). A cluster without the key
    /// (made before it) has it in its records, and records without it
    /// there count as filled (every node of a cluster made before hand-offs
    /// were recorded held its groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filled: Option<bool>,
    /// Some(the data directory it runs on) when it is filled but that is
    /// not `disk` (a replaced disk under its old name, or a disk that did
    /// not mount): it lacks the writes acknowledged before, so its copies
    /// count toward no write's majority (`replicate::counts`) and it
    /// toward no merge's (`replicate::sources_of`). Set by `join`; cleared
    /// once it is synced and placed on every group it is a settled
    /// replica of (`holds_settled`: by `mark_synced`, or by `settle` once
    /// a hand-off pending then is done), `disk` becoming that directory;
    /// cleared when it joins unfilled or is marked out. Records without
    /// it: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty: Option<String>,
    /// The data directory (`datadir::DataMeta::disk`) its data is on: the
    /// one it joined with, unless that one was `empty`. Records without
    /// it: not known (a fresh directory is then the only one known empty).
    /// Kept in the record: a version before it rewrites records without
    /// it or `empty` (upgrade every node before replacing a disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Its lease time (`cluster_lease_ttl_s`), seconds (0: a record
    /// written before it was kept). A door waits for the longest of
    /// its map's before it counts a node's copy of the catalog lapsed.
    #[serde(default)]
    pub ttl_s: u64,
}

fn synced_default() -> bool {
    true
}

impl NodeRecord {
    #[must_use]
    pub fn node_state(&self) -> NodeState {
        NodeState::from_name(&self.state).unwrap_or(NodeState::Out)
    }

    /// `filled`; a record without it: true.
    #[must_use]
    pub fn filled(&self) -> bool {
        self.filled.unwrap_or(true)
    }
}

/// The `alive/<id>` key of a running node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alive {
    pub lease: i64,
    /// The process's nonce.
    pub nonce: Vec<u8>,
    pub mod_revision: i64,
}

/// The map as read from etcd.
#[derive(Debug, Clone)]
pub struct View {
    pub config: ClusterConfig,
    pub epoch: u64,
    /// With the mod revision of each record.
    pub nodes: Vec<(NodeRecord, i64)>,
    /// Running nodes.
    pub alive: HashMap<u32, Alive>,
    /// Nodes in their grace period.
    pub downs: HashSet<u32>,
    /// The revision of each node's `skipped/<id>` key (absent: never
    /// skipped): a catch-up that began under a map read at one revision
    /// marks the node synced only if it has not moved (`mark_synced`).
    pub skipped: HashMap<u32, i64>,
    /// Records that could not be read (key, error): skipped.
    pub unreadable: Vec<(String, String)>,
    /// The `filled` key's ids (None: the key is absent, each record says).
    pub filled_ids: Option<BTreeSet<u32>>,
    pub epoch_revision: i64,
    /// The store's revision when the read began: a later read that finds
    /// the same revision finds this map (`Control::check_map`).
    pub revision: i64,
}

impl View {
    /// The nodes as placement sees them, in `nodes` order.
    #[must_use]
    pub fn placed(&self) -> Vec<PlacedNode> {
        self.nodes
            .iter()
            .map(|(n, _)| PlacedNode {
                id: n.id,
                zone: n.zone.clone(),
                state: n.node_state(),
                synced: n.synced,
                filled: n.filled(),
            })
            .collect()
    }

    /// Placement groups per node (replicas, groups it is the acting
    /// primary of), by index in `nodes`.
    pub fn placement_counts(&self) -> Result<Vec<(usize, usize)>, String> {
        let seed = self.config.seed()?;
        let placed = self.placed();
        let mut counts = vec![(0, 0); placed.len()];
        for pg in 0..self.config.pgs {
            let r = placement::replicas(seed, pg, self.config.replicas, &placed);
            for &n in &r {
                counts[n].0 += 1;
            }
            if let Some(p) = placement::acting_primary(seed, pg, self.config.replicas, &r, &placed)
            {
                counts[p].1 += 1;
            }
        }
        Ok(counts)
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

    #[must_use]
    pub fn node(&self, id: u32) -> Option<&(NodeRecord, i64)> {
        self.nodes.iter().find(|(n, _)| n.id == id)
    }
}

/// The keys of one cluster.
pub struct Keys {
    root: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Result<Keys, String> {
        check_name("cluster name", cluster)?;
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
    /// The map's epoch (its value: the epoch, in decimal).
    pub(crate) fn epoch(&self) -> Vec<u8> {
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
    fn filled(&self) -> Vec<u8> {
        self.key("filled")
    }
    fn alive(&self, id: u32) -> Vec<u8> {
        self.key(&format!("alive/{id}"))
    }
    pub(crate) fn alives(&self) -> Vec<u8> {
        self.key("alive/")
    }
    fn down(&self, id: u32) -> Vec<u8> {
        self.key(&format!("down/{id}"))
    }
    fn downs(&self) -> Vec<u8> {
        self.key("down/")
    }
    fn skipped(&self, id: u32) -> Vec<u8> {
        self.key(&format!("skipped/{id}"))
    }
    fn skips(&self) -> Vec<u8> {
        self.key("skipped/")
    }
    /// The bucket catalog (`catalog`): written by every bucket change, so
    /// its revision is the catalog's; its presence says the catalog holds
    /// the cluster's buckets (a cluster made before it had none: its nodes
    /// seed it from theirs).
    pub(crate) fn catalog(&self) -> Vec<u8> {
        self.key("catalog")
    }
    /// Every bucket's record (`buckets/NAME`) and documents
    /// (`buckets/NAME/KIND`).
    pub(crate) fn buckets(&self) -> Vec<u8> {
        self.key("buckets/")
    }
    pub(crate) fn bucket(&self, name: &str) -> Vec<u8> {
        self.key(&format!("buckets/{name}"))
    }
    /// The prefix of a bucket's documents.
    pub(crate) fn bucket_docs(&self, name: &str) -> Vec<u8> {
        self.key(&format!("buckets/{name}/"))
    }
    pub(crate) fn bucket_doc(&self, name: &str, kind: &str) -> Vec<u8> {
        self.key(&format!("buckets/{name}/{kind}"))
    }
    /// A bucket deleted through the catalog (`buckets-deleted/NAME`, on a
    /// lease of `catalog::DELETED_TTL_S`).
    pub(crate) fn bucket_deleted(&self, name: &str) -> Vec<u8> {
        self.key(&format!("buckets-deleted/{name}"))
    }
    pub(crate) fn buckets_deleted(&self) -> Vec<u8> {
        self.key("buckets-deleted/")
    }
    /// Every user (`users/NAME`: its record, keys included).
    pub(crate) fn users(&self) -> Vec<u8> {
        self.key("users/")
    }
    pub(crate) fn user(&self, name: &str) -> Vec<u8> {
        self.key(&format!("users/{name}"))
    }
    /// Node ID put its buckets and users into a catalog being made
    /// (`catalog::seed`).
    pub(crate) fn seeded(&self, id: u32) -> Vec<u8> {
        self.key(&format!("seeded/{id}"))
    }
    /// A user removed through the catalog: a node's first seed of its
    /// own users does not bring it back.
    pub(crate) fn user_removed(&self, name: &str) -> Vec<u8> {
        self.key(&format!("users-removed/{name}"))
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

/// Names of clusters, nodes and zones: etcd key components and words of
/// the status lines; compared as bytes (so `rack-a` and `Rack-A` differ).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(format!(
            "{what} {name:?}: use 1-64 letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

/// Creates the cluster; refuses if it exists, or if keys of an earlier
/// cluster of that name are left.
pub fn init(
    etcd: &Etcd,
    keys: &Keys,
    (replicas, pgs, down_out_s): (usize, u32, u64),
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
        seed: format!("{seed:#018x}"),
        down_out_s,
        created_ms: now_ms(),
    };
    let json = serde_json::to_vec(&config).map_err(|e| e.to_string())?;
    let created = etcd.txn(
        vec![
            txn::absent(&keys.config()),
            txn::absent(&keys.epoch()),
            txn::absent(&keys.next_id()),
            txn::absent(&keys.catalog()),
            txn::absent(&keys.filled()),
        ],
        vec![
            txn::put(&keys.config(), &json),
            txn::put(&keys.epoch(), b"1"),
            txn::put(&keys.next_id(), b"1"),
            txn::put(&keys.filled(), b"[]"),
            // No buckets yet: the catalog holds them from the start.
            txn::put(&keys.catalog(), b"1"),
        ],
        vec![],
    )?;
    if !created {
        return Err(
            "the cluster exists already, or keys of an earlier cluster of this name are left (percore cluster status shows it; pick another --name)"
                .into(),
        );
    }
    Ok(config)
}

/// Reads the whole map. Unreadable node records are skipped and listed.
/// The cluster's configuration (fixed at creation).
pub fn config(etcd: &Etcd, keys: &Keys) -> Result<ClusterConfig, String> {
    let config = etcd.get(&keys.config())?.ok_or(
        "no such cluster in etcd: create it with `percore cluster init --cluster URLS --replicas R`",
    )?;
    let config: ClusterConfig =
        serde_json::from_slice(&config.value).map_err(|e| format!("cluster config: {e}"))?;
    config.seed()?;
    if config.pgs == 0 || config.pgs > placement::PG_COUNT_MAX {
        return Err(format!("cluster config: {} placement groups", config.pgs));
    }
    if config.replicas == 0 || config.replicas > placement::REPLICAS_MAX {
        return Err(format!("cluster config: {} replicas", config.replicas));
    }
    Ok(config)
}

/// etcd's revision now: `View::revision` unchanged means the map is too.
pub fn revision(etcd: &Etcd, keys: &Keys) -> Result<i64, String> {
    etcd.revision(&keys.epoch())
}

pub fn load(etcd: &Etcd, keys: &Keys) -> Result<View, String> {
    // The epoch first: its revision dates the whole read (a write during
    // it makes the next confirmation read everything again).
    let (epoch, revision) = etcd.range(&keys.epoch(), None)?;
    let config = config(etcd, keys)?;
    let epoch = epoch
        .into_iter()
        .next()
        .ok_or("the cluster has no epoch key")?;
    let (nodes, nodes_revision) = etcd.range(&keys.nodes(), Some(&prefix_end(&keys.nodes())))?;
    let mut records = Vec::with_capacity(nodes.len());
    let mut unreadable = Vec::new();
    for kv in nodes {
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        match serde_json::from_slice::<NodeRecord>(&kv.value) {
            Ok(r) if key.ends_with(&format!("/{}", r.id)) => records.push((r, kv.mod_revision)),
            Ok(r) => unreadable.push((key, format!("holds the record of id {}", r.id))),
            Err(e) => unreadable.push((key, e.to_string())),
        }
    }
    records.sort_by_key(|(n, _)| n.id);
    // At the records' revision: flags and states as they were together
    // (a change since moved the epoch, which every write compares; the
    // shards' map, though, is built from this read).
    let (filled, _, _) = etcd.range_page((&keys.filled(), &[]), 0, nodes_revision, false)?;
    let filled_ids = match filled.into_iter().next() {
        Some(kv) => {
            let ids: BTreeSet<u32> = serde_json::from_slice(&kv.value)
                .map_err(|e| format!("the cluster's filled key cannot be read: {e}"))?;
            for (r, _) in &mut records {
                r.filled = Some(ids.contains(&r.id));
            }
            Some(ids)
        }
        None => None,
    };
    let ids = |prefix: &[u8], kvs: &[super::etcd::Kv]| -> Vec<(u32, usize)> {
        kvs.iter()
            .enumerate()
            .filter_map(|(i, kv)| {
                let id = decimal(kv.key.get(prefix.len()..)?).ok()?;
                Some((u32::try_from(id).ok()?, i))
            })
            .collect()
    };
    let (alives, _) = etcd.range(&keys.alives(), Some(&prefix_end(&keys.alives())))?;
    let alive = ids(&keys.alives(), &alives)
        .into_iter()
        .map(|(id, i)| {
            let kv = &alives[i];
            (
                id,
                Alive {
                    lease: kv.lease,
                    nonce: kv.value.clone(),
                    mod_revision: kv.mod_revision,
                },
            )
        })
        .collect();
    let (downs, _) = etcd.range(&keys.downs(), Some(&prefix_end(&keys.downs())))?;
    let downs = ids(&keys.downs(), &downs)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let (skips, _) = etcd.range(&keys.skips(), Some(&prefix_end(&keys.skips())))?;
    let skipped = ids(&keys.skips(), &skips)
        .into_iter()
        .map(|(id, i)| (id, skips[i].mod_revision))
        .collect();
    Ok(View {
        config,
        epoch: decimal(&epoch.value)?,
        nodes: records,
        alive,
        downs,
        skipped,
        unreadable,
        filled_ids,
        epoch_revision: epoch.mod_revision,
        revision,
    })
}

/// The epoch after `view`'s, as etcd stores it.
fn next_epoch(view: &View) -> Result<String, String> {
    view.epoch
        .checked_add(1)
        .map(|e| e.to_string())
        .ok_or_else(|| "the map epoch is exhausted".into())
}

/// A node record as stored: without its `filled` flag, which the `filled`
/// key holds (`filled_put`).
fn record_json(record: &NodeRecord) -> Result<Vec<u8>, String> {
    serde_json::to_vec(&NodeRecord {
        filled: None,
        ..record.clone()
    })
    .map_err(|e| e.to_string())
}

/// The put of the `filled` key for a transaction under `view` that sets
/// the flags `changes` (node id, filled): None if the key holds them
/// already. Every transaction that writes a node record calls it with
/// that record's flag: records are stored without theirs (`record_json`),
/// so a cluster made before the key has it written then, from its
/// records' flags. (No compare of its own: every writer compares the
/// epoch, and moves it.)
fn filled_put(
    keys: &Keys,
    view: &View,
    changes: &[(u32, bool)],
) -> Result<Option<serde_json::Value>, String> {
    let before: BTreeSet<u32> = match &view.filled_ids {
        Some(ids) => ids.clone(),
        None => view
            .nodes
            .iter()
            .filter(|(r, _)| r.filled())
            .map(|(r, _)| r.id)
            .collect(),
    };
    let mut after = before.clone();
    for &(id, filled) in changes {
        if filled {
            after.insert(id);
        } else {
            after.remove(&id);
        }
    }
    if view.filled_ids.is_some() && after == before {
        return Ok(None);
    }
    let json = serde_json::to_vec(&after).map_err(|e| e.to_string())?;
    Ok(Some(txn::put(&keys.filled(), &json)))
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
    let json = record_json(record)?;
    let after = placed_with(view, record);
    let compare = vec![
        txn::unchanged(&keys.epoch(), view.epoch_revision),
        txn::unchanged(&keys.node(record.id), seen),
    ];
    let Some(mut success) = with_gainers(etcd, keys, view, (&after, record.id), &compare)? else {
        return Ok(false);
    };
    success.push(txn::put(&keys.node(record.id), &json));
    success.extend(filled_put(keys, view, &[(record.id, record.filled())])?);
    success.push(txn::put(&keys.epoch(), next_epoch(view)?.as_bytes()));
    etcd.txn(compare, success, vec![])
}

/// The nodes of `view` as placement sees them once `record` is written
/// (its state and zone; added if it is new).
fn placed_with(view: &View, record: &NodeRecord) -> Vec<PlacedNode> {
    let mut after = view.placed();
    match after.iter_mut().find(|n| n.id == record.id) {
        Some(n) => {
            n.state = record.node_state();
            n.zone.clone_from(&record.zone);
        }
        None => after.push(PlacedNode {
            id: record.id,
            zone: record.zone.clone(),
            state: record.node_state(),
            synced: false,
            filled: false,
        }),
    }
    after
}

/// The nodes other than `except` that gain a placement group (a replica
/// slot) when the map `view` holds becomes `after` (its nodes as placement
/// sees them after the change; ids compared) and are marked synced: each
/// one's record marked unsynced, as puts to add to the change's
/// transaction (which compares the epoch: every change to a record moves
/// it). A map change that gives a node groups marks it unsynced in the
/// same transaction, so that no reader of the new map takes it for
/// holding them: the node marks itself unsynced too when it reads such a
/// map, but a hand-off recorded on the word of its flag in between
/// (`settle`) would point at a node without the group's data.
///
/// More than `GAINERS_PER_TXN` of them (a node of a cluster of a few
/// hundred, with many groups, drained): the first ones are marked
/// unsynced in a transaction of their own (early is safe: an unsynced
/// node leads nothing and catches up again), and None says so; the caller
/// reads the map again and retries. `guard`: the compares of the
/// caller's change (the epoch's among them), made by that transaction too
/// (the change it is a part of must still be due).
fn with_gainers(
    etcd: &Etcd,
    keys: &Keys,
    view: &View,
    (after, except): (&[PlacedNode], u32),
    guard: &[serde_json::Value],
) -> Result<Option<Vec<serde_json::Value>>, String> {
    let seed = view.config.seed()?;
    let r = view.config.replicas;
    let before = view.placed();
    let mut gain: HashSet<u32> = HashSet::new();
    for pg in 0..view.config.pgs {
        let was: Vec<u32> = placement::replicas(seed, pg, r, &before)
            .into_iter()
            .map(|i| before[i].id)
            .collect();
        for i in placement::replicas(seed, pg, r, after) {
            if !was.contains(&after[i].id) {
                gain.insert(after[i].id);
            }
        }
    }
    let mut success = Vec::new();
    for (record, _) in &view.nodes {
        if record.id == except || !record.synced || !gain.contains(&record.id) {
            continue;
        }
        success.push(txn::put(
            &keys.node(record.id),
            &record_json(&NodeRecord {
                synced: false,
                ..record.clone()
            })?,
        ));
    }
    if success.len() <= GAINERS_PER_TXN {
        return Ok(Some(success));
    }
    success.truncate(GAINERS_PER_TXN);
    success.extend(filled_put(keys, view, &[])?);
    success.push(txn::put(&keys.epoch(), next_epoch(view)?.as_bytes()));
    etcd.txn(guard.to_vec(), success, vec![])?;
    Ok(None)
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

/// Marks node `id` synced (it caught up under the map of `epoch`, read
/// when its `skipped/` key had revision `skipped`), if the map is still at
/// that epoch and no write was acknowledged without its copy since (a
/// primary that did moved the key: `skip`). Whether it was marked.
pub fn mark_synced(
    etcd: &Etcd,
    keys: &Keys,
    id: u32,
    epoch: u64,
    skipped: i64,
) -> Result<bool, String> {
    for _ in 0..CONFLICT_RETRIES {
        let view = load(etcd, keys)?;
        let Some((record, seen)) = view.node(id).cloned() else {
            return Ok(false);
        };
        let now = view.skipped.get(&id).copied().unwrap_or(0);
        if view.epoch != epoch || record.synced || now != skipped {
            return Ok(false);
        }
        // Filled in the same transaction when the hand-off allows it
        // alone (else by `settle`, with others): a node synced but not
        // filled leads nothing.
        let mut placed = view.placed();
        let me = placed.iter().position(|n| n.id == id);
        let filled = match me {
            Some(i) => {
                placed[i].synced = true;
                placed[i].filled
                    || handoff::may_fill(
                        view.config.seed()?,
                        view.config.pgs,
                        view.config.replicas,
                        &placed,
                        i,
                    )
            }
            None => record.filled(),
        };
        // A node on a replaced disk holds its groups' writes now; it lacks
        // those of groups it is a settled replica of but not placed on (a
        // hand-off pending): it counts once it holds all of those.
        let (empty, disk) = match (&record.empty, me) {
            (Some(dir), Some(i)) => {
                placed[i].filled = filled;
                if holds_settled(&view, &placed, i)? {
                    (None, Some(dir.clone()))
                } else {
                    (record.empty.clone(), record.disk.clone())
                }
            }
            _ => (record.empty.clone(), record.disk.clone()),
        };
        let json = record_json(&NodeRecord {
            synced: true,
            empty,
            disk,
            ..record
        })?;
        let mut success = vec![txn::put(&keys.node(id), &json)];
        success.extend(filled_put(keys, &view, &[(id, filled)])?);
        success.push(txn::put(&keys.epoch(), next_epoch(&view)?.as_bytes()));
        let done = etcd.txn(
            vec![
                txn::unchanged(&keys.epoch(), view.epoch_revision),
                txn::unchanged(&keys.node(id), seen),
                txn::unchanged(&keys.skipped(id), skipped),
            ],
            success,
            vec![],
        )?;
        if done {
            return Ok(true);
        }
    }
    Err("the cluster map kept changing; try again".into())
}

/// Changes the nodes' `filled` flags as far as the hand-off of their
/// groups allows (`handoff::changes`: nodes synced since they joined or
/// gained groups are filled, drained nodes unfilled), in one transaction
/// with the epoch (the `filled` key and the epoch, however many nodes
/// change), compared on the epoch `view` was read at. Returns the changes
/// made (node name, filled); empty if none (or the map moved: the next
/// read tries again).
pub fn settle(etcd: &Etcd, keys: &Keys, view: &View) -> Result<Vec<(String, bool)>, String> {
    let seed = view.config.seed()?;
    let mut placed = view.placed();
    let changes = handoff::changes(seed, view.config.pgs, view.config.replicas, &placed);
    for &(i, filled) in &changes {
        placed[i].filled = filled;
    }
    // Nodes on a replaced disk that are synced and now hold every group
    // they are settled replicas of (a hand-off pending when they synced is
    // done): their directory is where their data is.
    let mut cleared = Vec::new();
    for (i, (record, _)) in view.nodes.iter().enumerate() {
        if let Some(dir) = &record.empty {
            // (Unfilled, it is a settled replica of nothing: it counts as
            // it is, as in `mark_synced`.)
            if record.synced && holds_settled(view, &placed, i)? {
                cleared.push(NodeRecord {
                    empty: None,
                    disk: Some(dir.clone()),
                    ..record.clone()
                });
            }
        }
    }
    if changes.is_empty() && cleared.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<(u32, bool)> = changes
        .iter()
        .map(|&(i, filled)| (view.nodes[i].0.id, filled))
        .collect();
    let made = changes
        .iter()
        .map(|&(i, filled)| (view.nodes[i].0.name.clone(), filled))
        .collect();
    let mut success = vec![txn::put(&keys.epoch(), next_epoch(view)?.as_bytes())];
    success.extend(filled_put(keys, view, &ids)?);
    // A few a change (etcd's operation limit); the rest at the next.
    for r in cleared.iter().take(EMPTY_CLEARED_PER_TXN) {
        success.push(txn::put(&keys.node(r.id), &record_json(r)?));
    }
    if etcd.txn(
        vec![txn::unchanged(&keys.epoch(), view.epoch_revision)],
        success,
        vec![],
    )? {
        Ok(made)
    } else {
        Ok(Vec::new())
    }
}

/// Records of nodes no longer `empty` that one `settle` writes.
const EMPTY_CLEARED_PER_TXN: usize = 32;

/// Whether node `i` of `placed` is placed on every group it is a settled
/// replica of (so, synced, it holds their writes). Every group is placed
/// twice unless no hand-off is pending (`placement::settled_as_placed`):
/// only for a node on a replaced disk (`NodeRecord::empty`).
fn holds_settled(view: &View, placed: &[PlacedNode], i: usize) -> Result<bool, String> {
    if placement::settled_as_placed(placed) {
        return Ok(true);
    }
    let seed = view.config.seed()?;
    let r = view.config.replicas;
    Ok((0..view.config.pgs).all(|pg| {
        !placement::settled_replicas(seed, pg, r, placed).contains(&i)
            || placement::replicas(seed, pg, r, placed).contains(&i)
    }))
}

/// Records that node `by` is about to acknowledge writes of groups `pgs`
/// without node `id`'s copy (its copy failed; a majority holds the
/// writes), the writes having been copied under the map of `epochs[0]`
/// (the rest: the epochs the caller made since, each from the one
/// before): moves `id`'s `skipped/` key, and if `id` is synced, marks
/// it not synced in the same transaction (Some: the epoch it made). Refused unless etcd's map is one of `epochs` (a write
/// copied under an older map may have missed a node that led the group
/// since) and makes `by` the acting primary of every group of `pgs`; both
/// compared in the transaction. `view` (the caller's last read, if any)
/// is tried first; a conflict reads the map again. Once this returns Ok,
/// `id` leads no group before it caught up again from a synced primary,
/// which holds the writes: a catch-up that began before the key moved
/// cannot mark it synced (`mark_synced` compares the key), and one that
/// begins after sees the writes. A node no longer in the map needs
/// nothing (ids are never reused).
pub fn skip(
    etcd: &Etcd,
    keys: &Keys,
    view: Option<&View>,
    (id, by, pgs): (u32, u32, &[u32]),
    epochs: &[u64],
) -> Result<Option<u64>, String> {
    let value = by.to_string();
    let mut loaded;
    let mut view = view;
    for _ in 0..CONFLICT_RETRIES {
        let v = match view.take() {
            Some(v) => v,
            None => {
                loaded = load(etcd, keys)?;
                &loaded
            }
        };
        if !epochs.contains(&v.epoch) {
            return Err(format!(
                "the map moved on (to {}) since the write was copied; retry",
                v.epoch
            ));
        }
        let seed = v.config.seed()?;
        let placed = v.placed();
        for &pg in pgs {
            let chosen = placement::replicas(seed, pg, v.config.replicas, &placed);
            let primary = placement::acting_primary(seed, pg, v.config.replicas, &chosen, &placed)
                .map(|i| placed[i].id);
            if primary != Some(by) {
                return Err(format!(
                    "this node no longer leads placement group {pg} in map {}",
                    v.epoch
                ));
            }
        }
        let Some((record, seen)) = v.node(id).cloned() else {
            return Ok(None);
        };
        let marks = record.synced;
        let mut success = vec![txn::put(&keys.skipped(id), value.as_bytes())];
        if marks {
            let filled = record.filled();
            let json = record_json(&NodeRecord {
                synced: false,
                ..record
            })?;
            success.push(txn::put(&keys.node(id), &json));
            success.extend(filled_put(keys, v, &[(id, filled)])?);
            success.push(txn::put(&keys.epoch(), next_epoch(v)?.as_bytes()));
        }
        // Compared: a node that turned synced since needs the mark, and a
        // map that moved may lead the group elsewhere.
        if etcd.txn(
            vec![
                txn::unchanged(&keys.epoch(), v.epoch_revision),
                txn::unchanged(&keys.node(id), seen),
            ],
            success,
            vec![],
        )? {
            return Ok(marks.then_some(v.epoch + 1));
        }
    }
    Err("the cluster map kept changing; try again".into())
}

/// What a node advertises when it joins, and who it is.
#[derive(Debug, Clone)]
pub struct Joining {
    pub name: String,
    pub zone: String,
    pub s3: String,
    /// Every shard's native address, comma-separated.
    pub native: String,
    pub admin: String,
    pub shards: usize,
    /// This process's nonce, the value of its `alive/` key.
    pub nonce: Vec<u8>,
    /// Its lease time, seconds.
    pub ttl_s: u64,
    /// Whether its data directory is new (made for this node and never
    /// joined with): a node recorded as filled that joins with one lacks
    /// its groups' writes (`NodeRecord::empty`).
    pub fresh: bool,
    /// Its data directory's id (`datadir::DataMeta::disk`; empty: none).
    pub disk: String,
}

/// Why a join did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// Another process holds the node's `alive/` key (a previous process
    /// whose lease has not expired yet, or a second one with the same
    /// name).
    AliveElsewhere,
    /// The node was removed from the map while this process ran.
    Removed,
    Etcd(String),
}

impl From<String> for JoinError {
    fn from(e: String) -> JoinError {
        JoinError::Etcd(e)
    }
}

impl From<&str> for JoinError {
    fn from(e: &str) -> JoinError {
        JoinError::Etcd(e.to_string())
    }
}

/// Whether a node of record `old` that joins as `joining` runs on another
/// data directory than its data is recorded on (a replaced disk, or one
/// that did not mount): if it stays filled it is still recorded (settled)
/// where its groups' writes are, and holds none of them until it syncs
/// (`NodeRecord::empty`). A record that names no directory (written
/// before they were kept, or empty since) knows only a fresh one for
/// empty, and keeps the flag.
fn on_other_disk(old: &NodeRecord, joining: &Joining) -> bool {
    match &old.disk {
        Some(d) => *d != joining.disk,
        None => joining.fresh || old.empty.is_some(),
    }
}

/// Registers (or re-registers) a node, `up` (a draining node stays
/// draining), and puts its `alive/` key on `lease`, in one transaction
/// with the epoch. A name keeps its id; `expect_id` (a rejoin) refuses to
/// take another.
pub fn join(
    etcd: &Etcd,
    keys: &Keys,
    joining: &Joining,
    lease: i64,
    expect_id: Option<u32>,
) -> Result<NodeRecord, JoinError> {
    check_name("node name", &joining.name)?;
    check_name("zone", &joining.zone)?;
    for _ in 0..CONFLICT_RETRIES {
        let view = load(etcd, keys)?;
        let named = etcd.get(&keys.name(&joining.name))?;
        let id = match (named, expect_id) {
            (Some(kv), expected) => {
                let id = u32::try_from(decimal(&kv.value)?).map_err(|e| e.to_string())?;
                if expected.is_some_and(|e| e != id) {
                    return Err(JoinError::Removed);
                }
                id
            }
            (None, Some(_)) => return Err(JoinError::Removed),
            (None, None) => {
                // Reserve a fresh id for the name.
                let next = etcd
                    .get(&keys.next_id())?
                    .ok_or("the cluster has no next_id key")?;
                let id = u32::try_from(decimal(&next.value)?).map_err(|e| e.to_string())?;
                let after = id.checked_add(1).ok_or("node ids are exhausted")?;
                let reserved = etcd.txn(
                    vec![
                        txn::unchanged(&keys.next_id(), next.mod_revision),
                        txn::absent(&keys.name(&joining.name)),
                    ],
                    vec![
                        txn::put(&keys.next_id(), after.to_string().as_bytes()),
                        txn::put(&keys.name(&joining.name), id.to_string().as_bytes()),
                    ],
                    vec![],
                )?;
                if !reserved {
                    continue;
                }
                id
            }
        };
        let alive_seen = match view.alive.get(&id) {
            Some(a) if a.nonce != joining.nonce => return Err(JoinError::AliveElsewhere),
            Some(a) => a.mod_revision,
            None => 0,
        };
        let old = view.node(id);
        let state = match old {
            Some((o, _)) if o.node_state() == NodeState::Draining => NodeState::Draining,
            _ => NodeState::Up,
        };
        // Its data, if any, is still there, unless it was `out` (its
        // groups were placed elsewhere and written there since).
        let filled = old.is_some_and(|(o, _)| o.filled() && o.node_state() != NodeState::Out);
        let empty = filled && old.is_some_and(|(o, _)| on_other_disk(o, joining));
        let record = NodeRecord {
            id,
            name: joining.name.clone(),
            zone: joining.zone.clone(),
            state: state.name().into(),
            s3: joining.s3.clone(),
            native: joining.native.clone(),
            admin: joining.admin.clone(),
            shards: joining.shards,
            since_ms: match old {
                Some((o, _)) if o.state == state.name() => o.since_ms,
                _ => now_ms(),
            },
            // A process that joins has not caught up: its data may be
            // new, or older than the map (it may have gained groups while
            // it was gone). It leads nothing until it has.
            synced: false,
            filled: Some(filled),
            empty: empty.then(|| joining.disk.clone()),
            disk: if empty {
                old.and_then(|(o, _)| o.disk.clone())
            } else {
                Some(joining.disk.clone()).filter(|d| !d.is_empty())
            },
            ttl_s: joining.ttl_s,
        };
        let seen = old.map_or(0, |(_, r)| *r);
        let mut success = vec![txn::put_leased(&keys.alive(id), &joining.nonce, lease)];
        let mut compare = vec![
            txn::unchanged(&keys.alive(id), alive_seen),
            txn::unchanged(&keys.node(id), seen),
        ];
        if old.map(|(o, _)| o) != Some(&record) {
            let json = record_json(&record)?;
            // Placement moves if its state or zone did (or it is new).
            let after = placed_with(&view, &record);
            compare.push(txn::unchanged(&keys.epoch(), view.epoch_revision));
            let Some(gainers) = with_gainers(etcd, keys, &view, (&after, id), &compare)? else {
                continue;
            };
            success.extend(gainers);
            success.push(txn::put(&keys.node(id), &json));
            success.extend(filled_put(keys, &view, &[(id, record.filled())])?);
            success.push(txn::put(&keys.epoch(), next_epoch(&view)?.as_bytes()));
            success.push(txn::delete(&keys.down(id)));
        }
        if etcd.txn(compare, success, vec![])? {
            return Ok(record);
        }
    }
    Err(JoinError::Etcd(
        "the cluster map kept changing while this node joined; try again".into(),
    ))
}

/// Removes a node from the map for good (its name may join again, as a new
/// node). Refused while it is alive.
pub fn remove(etcd: &Etcd, keys: &Keys, name: &str) -> Result<NodeRecord, String> {
    for _ in 0..CONFLICT_RETRIES {
        let view = load(etcd, keys)?;
        let (record, seen) = view.named(name)?;
        if view.alive.contains_key(&record.id) {
            return Err(format!(
                "node {name} is running (or stopped less than its lease time ago, cluster_lease_ttl_s): stop it, wait that long and retry; drain it first so that its data moves"
            ));
        }
        let mut after = view.placed();
        if let Some(i) = after.iter().position(|n| n.id == record.id) {
            after[i].state = NodeState::Out;
        }
        let compare = vec![
            txn::unchanged(&keys.epoch(), view.epoch_revision),
            txn::unchanged(&keys.node(record.id), seen),
            txn::absent(&keys.alive(record.id)),
        ];
        let Some(mut success) = with_gainers(etcd, keys, &view, (&after, record.id), &compare)?
        else {
            continue;
        };
        success.extend(filled_put(keys, &view, &[(record.id, false)])?);
        success.extend([
            txn::delete(&keys.node(record.id)),
            txn::delete(&keys.name(name)),
            txn::delete(&keys.down(record.id)),
            txn::delete(&keys.skipped(record.id)),
            txn::put(&keys.epoch(), next_epoch(&view)?.as_bytes()),
        ]);
        let done = etcd.txn(compare, success, vec![])?;
        if done {
            return Ok(record);
        }
    }
    Err("the cluster map kept changing; try again".into())
}

/// Marks an `up` node whose lease is gone `down` (starting its grace
/// period, a lease of `config.down_out_s` on `down/<id>`), and a `down`
/// node whose grace period ended `out`. Draining nodes stay draining (they
/// hold no placement groups either way). At most one change per call (the
/// caller calls again). Returns the change made, as (name, new state).
/// A change that gives many nodes groups is made in parts, back to back
/// (`with_gainers`: the map is read again after each).
pub fn detect_failures(
    etcd: &Etcd,
    keys: &Keys,
    view: &View,
) -> Result<Option<(String, NodeState)>, String> {
    let mut loaded;
    let mut view = view;
    // A few parts a turn (each reads the map and places every group
    // twice); the next map read goes on.
    for _ in 0..PARTS_PER_TURN {
        match detect_one(etcd, keys, view)? {
            Some(done) => return Ok(done),
            None => {
                loaded = load(etcd, keys)?;
                view = &loaded;
            }
        }
    }
    Ok(None)
}

/// Parts of a failure mark made per call of `detect_failures`.
const PARTS_PER_TURN: usize = 4;

/// `detect_failures` under `view`: Some(the change made, if any), or None
/// when a part of a change was made (read the map again and go on).
#[allow(clippy::option_option)]
fn detect_one(
    etcd: &Etcd,
    keys: &Keys,
    view: &View,
) -> Result<Option<Option<(String, NodeState)>>, String> {
    for (record, seen) in &view.nodes {
        if view.alive.contains_key(&record.id) {
            continue;
        }
        let next = match record.node_state() {
            NodeState::Up => NodeState::Down,
            NodeState::Down if !view.downs.contains(&record.id) => NodeState::Out,
            _ => continue,
        };
        let new = NodeRecord {
            state: next.name().into(),
            since_ms: now_ms(),
            // Writes go on without it: it must catch up when it returns.
            synced: false,
            // Out: its groups are placed elsewhere (and written there).
            filled: if next == NodeState::Out {
                Some(false)
            } else {
                record.filled
            },
            empty: record.empty.clone().filter(|_| next != NodeState::Out),
            ..record.clone()
        };
        let json = record_json(&new)?;
        let mut after = view.placed();
        if let Some(i) = after.iter().position(|n| n.id == record.id) {
            after[i].state = next;
        }
        let mut compare = vec![
            txn::unchanged(&keys.epoch(), view.epoch_revision),
            txn::unchanged(&keys.node(record.id), *seen),
            // The lease must still be gone when the change is made.
            txn::absent(&keys.alive(record.id)),
        ];
        if next == NodeState::Out {
            compare.push(txn::absent(&keys.down(record.id)));
        }
        let Some(mut success) = with_gainers(etcd, keys, view, (&after, record.id), &compare)?
        else {
            return Ok(None);
        };
        success.extend(filled_put(keys, view, &[(record.id, new.filled())])?);
        success.extend([
            txn::put(&keys.node(record.id), &json),
            txn::put(&keys.epoch(), next_epoch(view)?.as_bytes()),
        ]);
        // Granted last: nothing before the transaction leaves it behind.
        let grace = if next == NodeState::Down {
            let ttl = i64::try_from(view.config.down_out_s.max(1)).unwrap_or(i64::MAX);
            Some(etcd.lease_grant(ttl)?)
        } else {
            None
        };
        if let Some(lease) = grace {
            success.push(txn::put_leased(&keys.down(record.id), b"", lease));
        }
        let done = etcd.txn(compare, success, vec![])?;
        if !done {
            if let Some(lease) = grace {
                let _ = etcd.lease_revoke(lease);
            }
        }
        return Ok(Some(done.then(|| (record.name.clone(), next))));
    }
    Ok(Some(None))
}

#[cfg(test)]
pub(crate) mod tests;
