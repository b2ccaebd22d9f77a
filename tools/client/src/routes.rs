//! Where each key goes: the shards of one node (from its Hello), or, on a
//! cluster, every node's shards (from the node's map, `ClusterMap`). A
//! `Routes` is immutable; a refreshed map replaces it whole, keeping the
//! open connections to the addresses that remain.

use std::sync::atomic::AtomicU32;

use percore_protocol::cluster_map::ClientMap;
use percore_protocol::placement::{self, PlacedNode};

use super::*;

/// Not computed yet (`Cluster::primaries`).
const UNSET: u32 = u32::MAX;
/// No eligible node.
const NONE: u32 = u32::MAX - 1;

/// One route: a shard of a node.
pub(crate) struct Slot {
    pub(crate) addr: SocketAddr,
    /// The shard's index on its node.
    pub(crate) shard: usize,
}

pub(crate) struct Routes {
    /// The cluster map's epoch (0 for a single node).
    pub(crate) epoch: u64,
    pub(crate) slots: Vec<Slot>,
    pub(crate) conns: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    pub(crate) place: Place,
}

pub(crate) enum Place {
    /// A single node: `routing::owner_shard`; `first` is the slot of the
    /// first connection (requests that name no key go there).
    Node {
        seed: u64,
        shards: usize,
        first: usize,
    },
    Cluster(Cluster),
}

pub(crate) struct Cluster {
    pub(crate) map: ClientMap,
    seed: u64,
    placed: Vec<PlacedNode>,
    /// The first slot of each node (index as in `map.nodes`).
    pub(crate) base: Vec<usize>,
    /// Each placement group's primary (node index), computed on first use:
    /// a map of 2^20 groups and 1,000 nodes is not placed up front.
    primaries: Vec<AtomicU32>,
}

impl Routes {
    /// The shards of the node that answered `hello` at `host`.
    pub(crate) fn node(host: std::net::IpAddr, hello: &HelloOk) -> Routes {
        let slots: Vec<Slot> = hello
            .shard_ports
            .iter()
            .enumerate()
            .map(|(shard, &p)| Slot {
                addr: SocketAddr::new(host, p),
                shard,
            })
            .collect();
        Routes {
            epoch: 0,
            conns: slots
                .iter()
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            slots,
            place: Place::Node {
                seed: hello.hash_seed,
                shards: hello.shard_count as usize,
                first: hello.shard_id as usize,
            },
        }
    }

    /// Every node's shards from a cluster map. Connections of `old` to the
    /// addresses that remain are kept.
    pub(crate) fn cluster(map: ClientMap, old: Option<&Routes>) -> Result<Routes> {
        let seed = map.seed().map_err(Error::Protocol)?;
        let mut slots = Vec::new();
        let mut base = Vec::with_capacity(map.nodes.len());
        for n in &map.nodes {
            base.push(slots.len());
            for (shard, a) in n.native.iter().enumerate() {
                let addr = a.parse::<SocketAddr>().map_err(|e| {
                    Error::Protocol(format!("cluster map: node {} address {a:?}: {e}", n.name))
                })?;
                slots.push(Slot { addr, shard });
            }
        }
        let conns = slots
            .iter()
            .map(|s| {
                let kept = old.and_then(|o| o.conn_to(s.addr));
                tokio::sync::Mutex::new(kept)
            })
            .collect();
        let primaries = (0..map.pgs).map(|_| AtomicU32::new(UNSET)).collect();
        Ok(Routes {
            epoch: map.epoch,
            slots,
            conns,
            place: Place::Cluster(Cluster {
                placed: map.placed(),
                seed,
                base,
                primaries,
                map,
            }),
        })
    }

    /// An open connection to `addr`, if this table holds one.
    fn conn_to(&self, addr: SocketAddr) -> Option<Arc<Conn>> {
        let i = self.slots.iter().position(|s| s.addr == addr)?;
        let slot = self.conns[i].try_lock().ok()?;
        slot.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// The slot of `(bucket, key)`'s owner: on a cluster, its placement
    /// group's primary's owner shard (None: no node is eligible).
    pub(crate) fn slot_of(&self, bucket: &str, key: &str) -> Option<usize> {
        match &self.place {
            Place::Node { seed, shards, .. } => Some(routing::owner_shard(
                *seed,
                *shards,
                bucket.as_bytes(),
                key.as_bytes(),
            )),
            Place::Cluster(c) => {
                let node = c.primary_of(bucket, key)?;
                let shards = c.map.nodes[node].native.len();
                let shard = placement::cluster_shard(
                    c.seed,
                    c.map.pgs,
                    shards,
                    bucket.as_bytes(),
                    key.as_bytes(),
                );
                Some(c.base[node] + shard)
            }
        }
    }

    /// The slot for requests that name no key on a single node.
    pub(crate) fn first(&self) -> usize {
        match &self.place {
            Place::Node { first, .. } => *first,
            Place::Cluster(_) => 0,
        }
    }

    pub(crate) fn cluster_ref(&self) -> Option<&Cluster> {
        match &self.place {
            Place::Cluster(c) => Some(c),
            Place::Node { .. } => None,
        }
    }
}

impl Cluster {
    /// The node index of the primary of `(bucket, key)`.
    pub(crate) fn primary_of(&self, bucket: &str, key: &str) -> Option<usize> {
        let h = routing::object_hash(self.seed, bucket.as_bytes(), key.as_bytes());
        let (pg, _) = placement::pg_of_hash(h, self.map.pgs);
        let cell = &self.primaries[pg as usize];
        let got = match cell.load(Ordering::Relaxed) {
            UNSET => {
                let p = self
                    .map
                    .primary(self.seed, &self.placed, pg)
                    .map_or(NONE, |i| i as u32);
                cell.store(p, Ordering::Relaxed);
                p
            }
            p => p,
        };
        (got != NONE).then_some(got as usize)
    }

    /// The nodes that are up (single requests that name no key, and map
    /// fetches, go to them first).
    pub(crate) fn up_nodes(&self) -> Vec<usize> {
        self.placed
            .iter()
            .enumerate()
            .filter(|(_, n)| n.state == placement::NodeState::Up)
            .map(|(i, _)| i)
            .collect()
    }

    /// The nodes a listing goes to: those that are up (each key is listed
    /// by its group's acting primary, which is up; a down node's groups
    /// are led by their other replicas).
    pub(crate) fn listing_nodes(&self) -> Vec<usize> {
        self.up_nodes()
    }
}
