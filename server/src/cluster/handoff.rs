//! Recorded hand-offs: which nodes are *filled* (`PlacedNode::filled`),
//! the record that says where each placement group's data is when none of
//! its replicas is up and synced (`placement::settled_primary`: the
//! best-scoring filled node that is up, down or draining).
//!
//! A group's *settled replicas* are its replicas as placed over the
//! filled nodes alone (`Settled`; the first is its settled primary). The
//! invariant kept: they hold the group's acknowledged writes (its data),
//! as a majority of a group's replicas does. A catch-up that merges a
//! group (no replica is up and synced) takes a majority of the settled
//! replicas as well as of the replicas (`replicate::sources_of`), and a
//! node drops no copy of a group it is a settled replica of
//! (`replicate::given_up`). The flags change only in steps that keep the
//! invariant (`handoff_ok`):
//!
//! - a node up and synced is filled once every group it becomes a
//!   settled replica of is one it is a replica of (it is synced: it holds
//!   them). Two nodes added at once: the first to sync is not filled
//!   while it would become a settled replica of a group placed on the
//!   other, which it never held;
//! - a draining node is unfilled once every group it is a settled
//!   replica of has, in its place, a node that is an up, synced replica
//!   of the group (the drain of those groups is done);
//! - a node joining under a new name is not filled; a node keeps its flag
//!   across restarts (`map::join`); a down node keeps it (it holds its
//!   groups until marked out).
//!
//! Several nodes' flags may have to change at once (a cluster whose nodes
//! all start empty: none may be filled alone, every one together):
//! `changes` tries every candidate together, then adds them one at a time.

use percore_protocol::placement::{self, NodeState, PlacedNode};

/// Placement over the filled nodes only (`settled_replicas`): the nodes
/// and the index in the whole list of each.
pub struct Settled {
    nodes: Vec<PlacedNode>,
    index: Vec<usize>,
}

impl Settled {
    /// The filled nodes that are up, down or draining, each taken as
    /// eligible (a draining node holds its groups until it is unfilled).
    #[must_use]
    pub fn of(nodes: &[PlacedNode]) -> Settled {
        let (index, nodes) = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.filled && settled_state(n.state))
            .map(|(i, n)| {
                let mut n = n.clone();
                n.state = NodeState::Up;
                (i, n)
            })
            .unzip();
        Settled { nodes, index }
    }

    /// Group `pg`'s settled replicas (indexes into the whole list, the
    /// settled primary first): its replicas as placed over the filled
    /// nodes, where the group's acknowledged writes were before the
    /// placement moved (nodes that did not hold their groups yet joined, or a node
    /// began to drain). Empty if no node is filled.
    #[must_use]
    pub fn replicas(&self, seed: u64, pg: u32, replicas: usize) -> Vec<usize> {
        if self.nodes.is_empty() {
            return Vec::new();
        }
        placement::replicas(seed, pg, replicas, &self.nodes)
            .into_iter()
            .map(|i| self.index[i])
            .collect()
    }
}

/// Whether moving from flags `before` to `after` (the same nodes, only
/// `filled` differs) keeps every group's settled replicas holders of its
/// data: each node that becomes a settled replica of a group is up,
/// synced and one of the group's replicas (it holds every acknowledged
/// write of the group). Err: the first group where one is not.
pub fn handoff_ok(
    seed: u64,
    pgs: u32,
    replicas: usize,
    before: &[PlacedNode],
    after: &[PlacedNode],
) -> Result<(), u32> {
    debug_assert_eq!(before.len(), after.len());
    let (s0, s1) = (Settled::of(before), Settled::of(after));
    for pg in 0..pgs {
        let was = s0.replicas(seed, pg, replicas);
        let now = s1.replicas(seed, pg, replicas);
        // Fewer settled replicas than before (too few nodes filled): the
        // ones left may not hold a majority's writes.
        if now.len() < was.len() {
            return Err(pg);
        }
        let mut placed: Option<Vec<usize>> = None;
        for j in now.into_iter().filter(|j| !was.contains(j)) {
            let chosen =
                placed.get_or_insert_with(|| placement::replicas(seed, pg, replicas, after));
            if after[j].state != NodeState::Up || !after[j].synced || !chosen.contains(&j) {
                return Err(pg);
            }
        }
    }
    Ok(())
}

/// The states `placement::settled_primary` takes a filled node in.
fn settled_state(state: NodeState) -> bool {
    matches!(state, NodeState::Up | NodeState::Down | NodeState::Draining)
}

/// The flags to change now (index into `nodes`, new `filled`), each step
/// checked by `handoff_ok`: candidates are the up, synced nodes not
/// filled and the draining nodes filled. All of them together if that is
/// safe, else as many as can be taken one after another. Empty: nothing
/// to change (yet).
#[must_use]
pub fn changes(seed: u64, pgs: u32, replicas: usize, nodes: &[PlacedNode]) -> Vec<(usize, bool)> {
    let candidates: Vec<(usize, bool)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match n.state {
            NodeState::Up if n.synced && !n.filled => Some((i, true)),
            NodeState::Draining if n.filled => Some((i, false)),
            _ => None,
        })
        .collect();
    if candidates.is_empty() {
        return candidates;
    }
    let apply = |set: &[(usize, bool)]| {
        let mut after = nodes.to_vec();
        for &(i, f) in set {
            after[i].filled = f;
        }
        after
    };
    if handoff_ok(seed, pgs, replicas, nodes, &apply(&candidates)).is_ok() {
        return candidates;
    }
    let mut taken: Vec<(usize, bool)> = Vec::new();
    let mut now = nodes.to_vec();
    for &c in &candidates {
        let mut next = now.clone();
        next[c.0].filled = c.1;
        if handoff_ok(seed, pgs, replicas, &now, &next).is_ok() {
            taken.push(c);
            now = next;
        }
    }
    taken
}

/// Whether node `i` of `nodes` runs `changes` for the cluster: a node
/// that is a candidate itself, or the lowest-id up node (for a stopped
/// draining node, or candidates that are not running).
#[must_use]
pub fn settles(nodes: &[PlacedNode], i: usize) -> bool {
    let n = &nodes[i];
    let candidate = match n.state {
        NodeState::Up => n.synced && !n.filled,
        NodeState::Draining => n.filled,
        _ => false,
    };
    candidate
        || (n.state == NodeState::Up
            && nodes
                .iter()
                .filter(|m| m.state == NodeState::Up)
                .all(|m| m.id >= n.id))
}

#[cfg(test)]
mod tests;
