//! The map as the shards hold it: built by the control thread from each
//! map it reads, handed to every shard through its own channel (one
//! channel per shard, nothing shared between shards), and kept by the
//! shard as an immutable snapshot.
//!
//! A shard uses it to answer `WrongNode` for a key whose placement group
//! this node is not the primary of (the native front door), and to answer
//! `ClusterMap` with the same map as JSON, so that clients compute the
//! same placement (`percore_protocol::placement`) from the same nodes.

use std::sync::mpsc;
use std::sync::Arc;

use percore_protocol::cluster_map::{ClientMap, ClientNode};
use percore_protocol::placement;
use percore_protocol::routing::object_hash;

use super::map::View;

/// No primary: no node is eligible for the placement group.
pub const NO_NODE: u32 = u32::MAX;

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
    /// The map for clients (`ClientMap` as JSON).
    pub json: String,
    /// Every node of the map, in id order.
    pub nodes: Vec<MapNode>,
    /// The way back to the control thread: a shard that caught up under
    /// this map sends its epoch (`replicate::start_catch_up`).
    pub synced_tx: mpsc::Sender<u64>,
}

/// A node as the S3 door needs it (forwarding, fan-out).
#[derive(Debug, Clone)]
pub struct MapNode {
    pub id: u32,
    pub name: String,
    pub state: placement::NodeState,
    /// Its S3 address (None: the record's address does not parse).
    pub s3: Option<std::net::SocketAddr>,
    /// Whether it has caught up (`placement::PlacedNode::synced`).
    pub synced: bool,
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
        synced_tx: mpsc::Sender<u64>,
    ) -> Result<ShardMap, String> {
        let seed = view.config.seed()?;
        let pgs = view.config.pgs;
        let placed = view.placed();
        let r = view.config.replicas;
        let mut primaries = Vec::with_capacity(pgs as usize);
        let mut replicas = Vec::with_capacity(pgs as usize * r);
        for pg in 0..pgs {
            let chosen = placement::replicas(seed, pg, r, &placed);
            primaries.push(
                placement::acting_primary(&chosen, &placed).map_or(NO_NODE, |i| placed[i].id),
            );
            replicas.extend((0..r).map(|k| chosen.get(k).map_or(NO_NODE, |&i| placed[i].id)));
        }
        Ok(ShardMap {
            epoch: view.epoch,
            node_id,
            pgs,
            seed,
            primaries,
            replica_count: r,
            replicas,
            json,
            nodes: view
                .nodes
                .iter()
                .map(|(n, _)| MapNode {
                    id: n.id,
                    name: n.name.clone(),
                    state: n.node_state(),
                    s3: n.s3.parse().ok(),
                    synced: n.synced,
                })
                .collect(),
            synced_tx,
        })
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

    /// The placement group of `(bucket, key)`.
    #[must_use]
    pub fn pg_of(&self, bucket: &str, key: &str) -> u32 {
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

    /// Group `pg`'s replicas (node ids, placement order).
    pub fn replicas_of_pg(&self, pg: u32) -> impl Iterator<Item = u32> + '_ {
        let r = self.replica_count;
        self.replicas[pg as usize * r..(pg as usize + 1) * r]
            .iter()
            .copied()
            .filter(|&n| n != NO_NODE)
    }

    /// Whether this node is one of group `pg`'s replicas.
    #[must_use]
    pub fn holds_pg(&self, pg: u32) -> bool {
        self.replicas_of_pg(pg).any(|n| n == self.node_id)
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
    pub synced_rx: mpsc::Receiver<u64>,
    pub synced_tx: mpsc::Sender<u64>,
    /// The epoch last sent (0: none yet).
    sent_epoch: u64,
    sent_json: String,
}

/// One channel per shard: the feed, and each shard's receiver (index =
/// shard id).
#[must_use]
pub fn feed(shards: usize) -> (MapFeed, Vec<mpsc::Receiver<Arc<ShardMap>>>) {
    let (senders, receivers) = (0..shards).map(|_| mpsc::channel()).unzip();
    let (synced_tx, synced_rx) = mpsc::channel();
    (
        MapFeed {
            senders,
            synced_rx,
            synced_tx,
            sent_epoch: 0,
            sent_json: String::new(),
        },
        receivers,
    )
}

impl MapFeed {
    /// Whether `json` (`ShardMap::client_json`) is the map sent last.
    #[must_use]
    pub fn is_current(&self, json: &str) -> bool {
        self.sent_epoch != 0 && json == self.sent_json
    }

    /// Sends `map` to every shard unless it is the map sent last. A map
    /// is sent only when it changed, so a channel holds at most the few
    /// maps of changes made within one shard poll.
    pub fn publish(&mut self, map: ShardMap) {
        if map.epoch == self.sent_epoch && map.json == self.sent_json {
            return;
        }
        self.sent_epoch = map.epoch;
        self.sent_json.clone_from(&map.json);
        let map = Arc::new(map);
        for s in &self.senders {
            // A shard that stopped has dropped its receiver: nothing to do.
            let _ = s.send(map.clone());
        }
    }
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
            unreadable: Vec::new(),
            epoch_revision: 0,
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

    #[test]
    fn feed_sends_only_changes() {
        let (mut feed, rx) = feed(2);
        let map = |epoch: u64, json: &str| ShardMap {
            epoch,
            node_id: 1,
            pgs: 1,
            seed: 0,
            primaries: vec![1],
            replica_count: 1,
            replicas: vec![1],
            json: json.into(),
            nodes: Vec::new(),
            synced_tx: mpsc::channel().0,
        };
        feed.publish(map(1, "a"));
        feed.publish(map(1, "a"));
        feed.publish(map(2, "b"));
        for r in &rx {
            assert_eq!(r.try_iter().map(|m| m.epoch).collect::<Vec<_>>(), [1, 2]);
        }
    }
}
