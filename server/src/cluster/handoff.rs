//! Recorded hand-offs: which nodes are *filled* (`PlacedNode::filled`),
//! the record of where each placement group's data is. A group's
//! *settled replicas* are its replicas as placed over the filled nodes
//! alone (`placement::settled_replicas`; the first is its settled
//! primary). The invariant kept: they hold the group's acknowledged
//! writes, as a majority of a group's replicas does:
//!
//! - only a settled replica leads a group (`placement::acting_primary`:
//!   a replica that is synced but not filled leads nothing, so no write
//!   is acknowledged where the record does not point; with R = 1 the
//!   settled primary leads a group whose replica is not recorded yet);
//! - a catch-up that merges a group (no replica leads it synced) takes a
//!   majority of the settled replicas as well as of the replicas
//!   (`replicate::sources_of`);
//! - a node drops no copy of a group it is a settled replica of
//!   (`replicate::given_up`);
//! - a map change that gives a node groups marks it unsynced in the same
//!   transaction (`map::write_node`, `map::with_gainers`), so that no
//!   reader takes it for holding groups it gained;
//! - the flags change only in steps that keep the invariant (`handoff_ok`):
//!   a node up and synced is filled once every group it becomes a settled
//!   replica of is one it is a replica of (it is synced: it holds them),
//!   in the same transaction that marks it synced when it can be filled
//!   alone (`map::mark_synced`), else by `map::settle` with others (two
//!   nodes added at once: the first to sync is not filled while it would
//!   become a settled replica of a group placed on the other, which it
//!   never held); a draining node is unfilled once every group it is a
//!   settled replica of has, in its place, an up, synced replica of the
//!   group (the drain of those groups is done);
//! - a node joining under a new name is not filled, nor one that was
//!   `out` (its groups were placed elsewhere); a node keeps its flag
//!   across restarts (`map::join`), and a down node keeps it (it holds
//!   its groups until it is marked out, which clears it).
//!
//! Several nodes' flags may have to change at once (a cluster whose nodes
//! all start empty: none may be filled alone, every one together):
//! `changes` tries every candidate together, then without those a try
//! blames.

use percore_protocol::placement::{self, NodeState, PlacedNode};

/// Whether moving from flags `before` to `after` (the same nodes, only
/// `filled` differs) keeps every group's settled replicas
/// (`placement::settled_replicas`) holders of its data: each node that
/// becomes a settled replica of a group is up, synced and one of the
/// group's replicas (it holds every acknowledged write of the group), and
/// no group has fewer settled replicas than before. Err: the nodes (indexes) whose change broke
/// it, for the first group where it is broken: the node that would become
/// a settled replica if it is filled by the move, else the nodes the move
/// unfilled that were the group's settled replicas.
pub fn handoff_ok(
    seed: u64,
    pgs: u32,
    replicas: usize,
    before: &[PlacedNode],
    after: &[PlacedNode],
) -> Result<(), Vec<usize>> {
    debug_assert_eq!(before.len(), after.len());
    let unfilled = |was: &[usize]| -> Vec<usize> {
        was.iter()
            .copied()
            .filter(|&i| before[i].filled && !after[i].filled)
            .collect()
    };
    for pg in 0..pgs {
        let was = placement::settled_replicas(seed, pg, replicas, before);
        let now = placement::settled_replicas(seed, pg, replicas, after);
        // Fewer settled replicas than before (too few nodes left filled,
        // as when a node drains from a cluster of R nodes): those left
        // may not hold a majority's writes (a node marked out was
        // replaced in them by one that never held the group).
        if now.len() < was.len() {
            return Err(unfilled(&was));
        }
        let mut placed: Option<Vec<usize>> = None;
        for j in now.into_iter().filter(|j| !was.contains(j)) {
            let chosen =
                placed.get_or_insert_with(|| placement::replicas(seed, pg, replicas, after));
            if after[j].state != NodeState::Up || !after[j].synced || !chosen.contains(&j) {
                return Err(if after[j].filled && !before[j].filled {
                    vec![j]
                } else {
                    unfilled(&was)
                });
            }
        }
    }
    Ok(())
}

/// The flags to change now (index into `nodes`, new `filled`), checked
/// by `handoff_ok`: candidates are the up, synced nodes not filled and
/// the draining nodes filled. All of them together if that is safe, else
/// without the ones a try blames, until a try is safe (at most
/// `TRIES_MAX` tries: the rest waits for the next map). Empty: nothing to
/// change (yet).
#[must_use]
pub fn changes(seed: u64, pgs: u32, replicas: usize, nodes: &[PlacedNode]) -> Vec<(usize, bool)> {
    let mut candidates: Vec<(usize, bool)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| flip(n).map(|f| (i, f)))
        .collect();
    for _ in 0..TRIES_MAX {
        if candidates.is_empty() {
            break;
        }
        let mut after = nodes.to_vec();
        for &(i, f) in &candidates {
            after[i].filled = f;
        }
        match handoff_ok(seed, pgs, replicas, nodes, &after) {
            Ok(()) => return candidates,
            Err(blamed) if blamed.is_empty() => break,
            Err(blamed) => candidates.retain(|(i, _)| !blamed.contains(i)),
        }
    }
    Vec::new()
}

/// The flag a candidate of `changes` would take: filled for an up, synced
/// node not filled; unfilled for a draining node filled; None otherwise.
fn flip(n: &PlacedNode) -> Option<bool> {
    match n.state {
        NodeState::Up if n.synced && !n.filled => Some(true),
        NodeState::Draining if n.filled => Some(false),
        _ => None,
    }
}

/// Tries of `changes` per map: each places every group twice.
const TRIES_MAX: usize = 8;

/// Whether node `i` of `nodes` runs `changes` for the cluster: a node
/// that is a candidate itself, or the lowest-id up node (for a stopped
/// draining node, or candidates that are not running).
#[must_use]
pub fn settles(nodes: &[PlacedNode], i: usize) -> bool {
    let n = &nodes[i];
    flip(n).is_some()
        || (n.state == NodeState::Up
            && nodes
                .iter()
                .filter(|m| m.state == NodeState::Up)
                .all(|m| m.id >= n.id))
}

/// Whether node `i`, synced now (in `nodes`), may be filled alone
/// (`map::mark_synced` fills it in the same transaction).
#[must_use]
pub fn may_fill(seed: u64, pgs: u32, replicas: usize, nodes: &[PlacedNode], i: usize) -> bool {
    let mut after = nodes.to_vec();
    after[i].filled = true;
    handoff_ok(seed, pgs, replicas, nodes, &after).is_ok()
}

#[cfg(test)]
mod tests;
