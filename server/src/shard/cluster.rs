//! Cluster mode on a shard: the placement mode fixed at start, and the map
//! the control thread sends through this shard's channel (polled here:
//! the control thread is a plain thread, not an executor).

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::peer_http::Take;
use crate::cluster::shardmap::ShardMap;

use super::msg::{Op, Reply, ShardError};
use super::Shard;
use crate::store::DigestItem;

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
    /// This node leads the key's group in its map but may not serve it
    /// now (`control::may_lead`): why.
    Lapsed(&'static str),
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
    /// acting primary must be this node, and it must be allowed to lead.
    pub fn ownership(&self, bucket: &str, key: &str) -> Ownership {
        if !self.is_cluster() {
            return Ownership::Mine;
        }
        let Some(map) = self.map.borrow().clone() else {
            return Ownership::NoMap;
        };
        let pg = map.pg_of(bucket, key);
        if map.primary_of_pg(pg) == map.node_id {
            match crate::cluster::control::may_lead(&map, Some(pg)) {
                Ok(()) => Ownership::Mine,
                Err(why) => Ownership::Lapsed(why),
            }
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

    /// A key's replication state on this node (its owner shard).
    pub async fn key_state(
        self: &std::rc::Rc<Self>,
        bucket: &str,
        key: &str,
    ) -> Result<Option<(u64, Option<String>, bool)>, ShardError> {
        let op = Op::KeyState {
            bucket: bucket.into(),
            key: key.into(),
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::KeyState(s) => Ok(s),
            other => Err(super::api::unexpected(other)),
        }
    }

    /// The stamp, ETag (None: a tombstone or a delete marker) and marker
    /// flag of the index key `key` itself: a plain key's null version, not
    /// its key's current version (`cluster::replicate` copies each index
    /// key).
    pub(super) fn key_state_here(
        &self,
        bucket: &str,
        key: &str,
    ) -> Option<(u64, Option<String>, bool)> {
        self.store.index_key_state(bucket, key)
    }

    /// A replica's copy of its primary's delete, under `condition`
    /// (`Store::delete_stamped`): Ok(true) if the tombstone was written;
    /// Ok(false) also when the key's shard is fenced above `fence_max`
    /// (`u64::MAX`: whatever its fence).
    pub async fn delete_stamped(
        self: &std::rc::Rc<Self>,
        bucket: &str,
        key: &str,
        condition: crate::store::PutCondition,
        fence_max: u64,
    ) -> Result<bool, ShardError> {
        self.bodiless_stamped(bucket, key, condition, fence_max, false)
            .await
    }

    /// `delete_stamped`, of a delete marker with `marker` (at the index
    /// key `key` names: the null version's place or a real version's).
    pub async fn bodiless_stamped(
        self: &std::rc::Rc<Self>,
        bucket: &str,
        key: &str,
        condition: crate::store::PutCondition,
        fence_max: u64,
        marker: bool,
    ) -> Result<bool, ShardError> {
        let op = Op::DeleteStamped {
            bucket: bucket.into(),
            key: key.into(),
            condition,
            fence_max,
            marker,
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Count(n) => Ok(n == 1),
            other => Err(super::api::unexpected(other)),
        }
    }

    /// Raises (epoch > 0) and reads the fence of the shard that owns
    /// `(bucket, key)`.
    pub async fn key_fence(self: &std::rc::Rc<Self>, bucket: &str, key: &str, epoch: u64) -> u64 {
        match self
            .call(self.owner_of(bucket, key), Op::Fence { epoch })
            .await
        {
            Reply::Count(n) => n as u64,
            // A shard that does not answer: as if fenced at every epoch.
            _ => u64::MAX,
        }
    }

    pub(super) fn raise_fence(&self, epoch: u64) -> u64 {
        self.fence.set(self.fence.get().max(epoch));
        self.fence.get()
    }

    /// One page of this node's replication digest (every shard's, merged
    /// in (bucket, key) order), of the keys in `pgs` (sorted; None: all),
    /// after raising every shard's fence to `epoch`. Returns the items and
    /// where to resume (None: done).
    pub async fn digest(
        self: &std::rc::Rc<Self>,
        after: Option<(String, String)>,
        limit: usize,
        pgs: Option<Vec<u32>>,
        epoch: u64,
    ) -> Result<(Vec<DigestItem>, Option<(String, String)>), ShardError> {
        let limit = limit.clamp(1, 10_000);
        let calls = (0..self.count).map(|s| {
            self.call(
                s,
                Op::Digest {
                    after: after.clone(),
                    limit,
                    pgs: pgs.clone(),
                    epoch,
                },
            )
        });
        let mut items = Vec::new();
        // The least place a shard stopped before its end: nothing past it
        // is complete in this page.
        let mut cut: Option<(String, String)> = None;
        for r in futures::future::join_all(calls).await {
            match r {
                Reply::Digest(got, resume) => {
                    items.extend(got);
                    if let Some(r) = resume {
                        if cut.as_ref().is_none_or(|c| r < *c) {
                            cut = Some(r);
                        }
                    }
                }
                other => return Err(super::api::unexpected(other)),
            }
        }
        items.sort_by(|a, b| (&a.bucket, &a.key).cmp(&(&b.bucket, &b.key)));
        if let Some(c) = &cut {
            items.retain(|i| (&i.bucket, &i.key) <= (&c.0, &c.1));
        }
        if items.len() > limit {
            items.truncate(limit);
            let last = items.last().expect("limit >= 1");
            return Ok((items.clone(), Some((last.bucket.clone(), last.key.clone()))));
        }
        Ok((items, cut))
    }

    pub(super) fn digest_here(
        &self,
        after: Option<(String, String)>,
        limit: usize,
        pgs: Option<&[u32]>,
        epoch: u64,
    ) -> Reply {
        self.raise_fence(epoch);
        let map = self.map.borrow().clone();
        let keep = |b: &str, k: &str| match (pgs, &map) {
            (None, _) => true,
            (Some(pgs), Some(m)) => pgs.binary_search(&m.pg_of(b, k)).is_ok(),
            (Some(_), None) => false,
        };
        let (items, resume) = self.store.digest(
            after.as_ref().map(|(b, k)| (b.as_str(), k.as_str())),
            limit,
            keep,
        );
        Reply::Digest(items, resume)
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
                        Ok(m) => {
                            // Each map, also one the next replaces at once.
                            crate::cluster::replicate::prune_missed(shard.metrics(), &m);
                            latest = Some(m);
                        }
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
