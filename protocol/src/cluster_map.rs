//! The cluster map as a node hands it to clients (the native `ClusterMap`
//! request; docs/cluster.md, "The map for clients"): JSON, so that clients
//! in any language read it, and placed with `placement` exactly as the
//! nodes place keys.
//!
//! ```text
//! {"cluster":"percore","epoch":7,"pgs":4096,"replicas":3,"seed":"0x...",
//!  "nodes":[{"id":1,"name":"n1","zone":"a","state":"up",
//!            "s3":"10.0.0.1:9000","native":["10.0.0.1:9100","10.0.0.1:9101"]}, ...]}
//! ```
//!
//! `nodes` is in the order placement walks them (by id). A key's node is
//! the primary of its placement group (`placement::replicas(..)[0]` over
//! every node of the map, states included), its shard there
//! `placement::cluster_shard` with that node's shard count (the length of
//! its `native` list).

use serde::{Deserialize, Serialize};

use crate::placement::{self, NodeState, PlacedNode, PG_COUNT_MAX, REPLICAS_MAX};
use crate::routing::SHARD_COUNT_MAX;

#[derive(Debug, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct ClientMap {
    pub cluster: String,
    pub epoch: u64,
    pub pgs: u32,
    pub replicas: usize,
    /// The placement seed, hex (`0x...`): JSON numbers above 2^53 are
    /// rounded by many readers.
    pub seed: String,
    pub nodes: Vec<ClientNode>,
}

#[derive(Debug, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct ClientNode {
    pub id: u32,
    pub name: String,
    pub zone: String,
    /// `up`, `down`, `draining` or `out`; anything else counts as `out`.
    pub state: String,
    pub s3: String,
    /// Every shard's native address; shard i is the i-th.
    pub native: Vec<String>,
    /// False while the node catches up (it is not a primary then; maps
    /// from nodes older than replication have no field: synced).
    #[serde(default = "synced_default")]
    pub synced: bool,
    /// Whether it is recorded as holding its groups (`PlacedNode::filled`); maps
    /// from nodes older than the field have none: filled (a node taken as
    /// filled is never a settled primary it should not be: see
    /// `NodeRecord::filled` on the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filled: Option<bool>,
}

fn synced_default() -> bool {
    true
}

impl ClientMap {
    /// Parses and checks a map (a hostile or broken node must not make a
    /// client panic or divide by zero).
    pub fn parse(json: &str) -> Result<ClientMap, String> {
        let m: ClientMap =
            serde_json::from_str(json).map_err(|e| format!("bad cluster map: {e}"))?;
        m.seed()?;
        if m.pgs == 0 || m.pgs > PG_COUNT_MAX {
            return Err(format!("bad cluster map: {} placement groups", m.pgs));
        }
        if m.replicas == 0 || m.replicas > REPLICAS_MAX {
            return Err(format!("bad cluster map: {} replicas", m.replicas));
        }
        if m.nodes.is_empty() {
            return Err("bad cluster map: no nodes".into());
        }
        for n in &m.nodes {
            if n.native.is_empty() || n.native.len() > SHARD_COUNT_MAX {
                return Err(format!(
                    "bad cluster map: node {} has {} shards",
                    n.id,
                    n.native.len()
                ));
            }
        }
        Ok(m)
    }

    pub fn seed(&self) -> Result<u64, String> {
        self.seed
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("bad cluster map: seed {:?}", self.seed))
    }

    /// The nodes as placement sees them, in map order.
    #[must_use]
    pub fn placed(&self) -> Vec<PlacedNode> {
        self.nodes
            .iter()
            .map(|n| PlacedNode {
                id: n.id,
                zone: n.zone.clone(),
                state: NodeState::from_name(&n.state).unwrap_or(NodeState::Out),
                synced: n.synced,
                filled: n.filled.unwrap_or(true),
            })
            .collect()
    }

    /// The acting primary of placement group `pg` (`placement::acting_primary`):
    /// an index into `nodes`.
    #[must_use]
    pub fn primary(&self, seed: u64, placed: &[PlacedNode], pg: u32) -> Option<usize> {
        placement::acting_primary(
            seed,
            pg,
            self.replicas,
            &placement::replicas(seed, pg, self.replicas, placed),
            placed,
        )
    }
}
