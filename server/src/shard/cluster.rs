//! Cluster mode on a shard: the placement mode fixed at start, and the map
//! the control thread sends through this shard's channel (polled here:
//! the control thread is a plain thread, not an executor).

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::peer_http::Take;
use crate::cluster::shardmap::ShardMap;

use super::Shard;

/// How often a shard looks for a new map. Map changes are rare and a node
/// learns of them a third of the lease late at worst; this adds little.
const MAP_POLL: Duration = Duration::from_millis(50);

/// Whether a key is this node's to serve.
pub enum Ownership {
    /// Not a cluster node, or this node is the key's primary.
    Mine,
    /// Another node is the primary (or none is): the map's epoch.
    Elsewhere { epoch: u64 },
    /// A cluster node that has no map yet.
    NoMap,
}

impl Shard {
    /// Makes this shard a cluster node's (before it routes any key):
    /// owners come from `placement::cluster_shard` with `pgs` groups.
    pub fn set_cluster(&self, pgs: u32) {
        assert!(pgs > 0);
        self.cluster_pgs.set(pgs);
    }

    /// Cluster mode: placement groups (0: a single node).
    pub fn cluster_pgs(&self) -> u32 {
        self.cluster_pgs.get()
    }

    /// Whether this shard belongs to a cluster node.
    pub fn is_cluster(&self) -> bool {
        self.cluster_pgs.get() != 0
    }

    /// The map this shard holds (cluster mode, once one arrived).
    pub fn cluster_map(&self) -> Option<Arc<ShardMap>> {
        self.map.borrow().clone()
    }

    /// Whether this node serves `(bucket, key)`: its placement group's
    /// primary must be this node (no replication yet, so the primary holds
    /// the only copy).
    pub fn ownership(&self, bucket: &str, key: &str) -> Ownership {
        if !self.is_cluster() {
            return Ownership::Mine;
        }
        let Some(map) = self.map.borrow().clone() else {
            return Ownership::NoMap;
        };
        if map.primary_of(bucket, key) == map.node_id {
            Ownership::Mine
        } else {
            Ownership::Elsewhere { epoch: map.epoch }
        }
    }

    /// Takes a node-to-node MAC once, node-wide: the shard it hashes to
    /// keeps it. A call that fails (the owner shard does not answer)
    /// counts as `Full` (retry), not as a replay.
    pub async fn take_node_mac(self: &std::rc::Rc<Self>, mac: [u8; 32]) -> Take {
        let owner = (u64::from_le_bytes(mac[..8].try_into().expect("8 bytes")) % self.count as u64)
            as usize;
        match self.call(owner, super::msg::Op::TakeNodeMac { mac }).await {
            super::msg::Reply::Count(0) => Take::Fresh,
            super::msg::Reply::Count(1) => Take::Seen,
            _ => Take::Full,
        }
    }

    /// `take_node_mac` on the owner shard: 0 fresh, 1 seen, 2 full.
    pub(super) fn take_node_mac_here(&self, mac: [u8; 32]) -> u8 {
        match self.node_macs.borrow_mut().take(mac) {
            Take::Fresh => 0,
            Take::Seen => 1,
            Take::Full => 2,
        }
    }

    /// Keeps taking maps from the control thread's channel until it
    /// closes (the task ends with the shard).
    pub fn start_map_feed(self: &std::rc::Rc<Self>, rx: Receiver<Arc<ShardMap>>) {
        let shard = self.clone();
        glommio::spawn_local(async move {
            loop {
                let mut latest = None;
                let closed = loop {
                    match rx.try_recv() {
                        Ok(m) => latest = Some(m),
                        Err(TryRecvError::Empty) => break false,
                        Err(TryRecvError::Disconnected) => break true,
                    }
                };
                if let Some(m) = latest {
                    tracing::info!(shard = shard.id, epoch = m.epoch, "cluster map");
                    *shard.map.borrow_mut() = Some(m);
                }
                if closed {
                    return;
                }
                glommio::timer::sleep(MAP_POLL).await;
            }
        })
        .detach();
    }
}
