//! The cluster placement contract: which nodes hold an object, and which
//! shard of each node owns it.
//!
//! Server nodes and cluster-aware clients compute exactly the same thing
//! from the same map, so the contract is small, integer-only (no floating
//! point: bit-identical in every language) and fixed (`docs/cluster.md`,
//! "Placement contract"):
//!
//! ```text
//! h        = object_hash(S, bucket, key)              (routing.rs)
//! wide     = h * pg_count                             (128-bit product)
//! pg       = wide >> 64                               (the placement group)
//! position = wide mod 2^64                            (uniform within the PG)
//! shard    = (position * shard_count) >> 64          (on each replica node)
//!
//! score(pg, node) = XXH3-64(S, "pg" ++ le_u32(pg) ++ le_u32(node.id))
//! replicas(pg)    = walk the eligible nodes by score, highest first (ties:
//!                   lower id first); take a node whose zone is not taken
//!                   yet, until R are taken; if fewer than R zones have
//!                   eligible nodes, walk again and take nodes not taken
//!                   yet, until R (or every eligible node) are taken.
//!                   replicas[0] is the primary.
//! settled(pg)     = replicas(pg) walked over the filled nodes (recorded
//!                   as holding their groups) that are up, down or
//!                   draining, each taken as eligible: where the group
//!                   was before nodes that did not hold it yet joined or
//!                   a node began to drain. settled(pg)[0] is the
//!                   group's settled primary.
//! acting(pg)      = the first replica that is up, synced and in
//!                   settled(pg) (any replica if settled(pg) is empty);
//!                   if none is and R = 1, settled(pg)[0] when it is up
//!                   and synced; else the first replica that is up and
//!                   not synced; else none.
//! ```
//!
//! - The shard within a node uses the hash's position inside its PG, not
//!   the hash itself: a node holds few PGs of a large cluster, and the top
//!   bits that chose the PG would send all of a PG's keys to one shard.
//! - Rendezvous (highest random weight) hashing moves only what must move:
//!   a node added takes the replica slots where it now scores in the top R
//!   (about R/N of them, the 1/N optimum of the data), a node removed gives
//!   up only its own. No table of PGs is stored: the map is the node list.
//! - Eligible nodes are those `in` the placement (`NodeState::Up`,
//!   `NodeState::Down` until its grace period ends); `Draining` and `Out`
//!   nodes hold no new replicas.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::routing::{object_hash, SHARD_COUNT_MAX};

/// Most placement groups a cluster may have (fixed at creation).
pub const PG_COUNT_MAX: u32 = 1 << 20;
/// Most replicas of a placement group.
pub const REPLICAS_MAX: usize = 7;

/// A node's place in the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Serving; holds its replicas.
    Up,
    /// Its lease expired: still holds its replicas (the others serve) until
    /// the grace period ends and it is marked `Out`.
    Down,
    /// Being emptied: holds no new replicas; serves until its PGs are
    /// backfilled elsewhere.
    Draining,
    /// Not part of the placement.
    Out,
}

impl NodeState {
    /// Whether the node is a placement target.
    #[must_use]
    pub fn eligible(self) -> bool {
        matches!(self, NodeState::Up | NodeState::Down)
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Down => "down",
            NodeState::Draining => "draining",
            NodeState::Out => "out",
        }
    }

    #[must_use]
    pub fn from_name(name: &str) -> Option<NodeState> {
        [
            NodeState::Up,
            NodeState::Down,
            NodeState::Draining,
            NodeState::Out,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// What placement needs of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedNode {
    /// Unique in the cluster, never reused.
    pub id: u32,
    /// Failure domain: replicas go to distinct zones where possible.
    pub zone: String,
    pub state: NodeState,
    /// Whether the node holds every write of the placement groups it is a
    /// replica of (false while it catches up after joining or gaining
    /// groups): only a synced node acts as a group's primary while one is up.
    pub synced: bool,
    /// Whether the node is recorded as holding the groups it would be the
    /// settled primary of (the cluster sets it once the node is synced
    /// and that is true, and clears it once a draining node's groups are
    /// held elsewhere): a node just added holds nothing yet, so a group
    /// placed on it alone is led by its settled primary (`acting_primary`).
    pub filled: bool,
}

/// The placement group of a 64-bit object hash, and the hash's position
/// within it.
#[must_use]
pub fn pg_of_hash(hash: u64, pg_count: u32) -> (u32, u64) {
    assert!(pg_count > 0 && pg_count <= PG_COUNT_MAX);
    let wide = u128::from(hash) * u128::from(pg_count);
    ((wide >> 64) as u32, wide as u64)
}

/// The placement group of `(bucket, key)`.
#[must_use]
pub fn pg_of(seed: u64, pg_count: u32, bucket: &[u8], key: &[u8]) -> u32 {
    pg_of_hash(object_hash(seed, bucket, key), pg_count).0
}

/// The shard of a replica node that owns `(bucket, key)`.
#[must_use]
pub fn cluster_shard(
    seed: u64,
    pg_count: u32,
    shard_count: usize,
    bucket: &[u8],
    key: &[u8],
) -> usize {
    assert!(shard_count > 0 && shard_count <= SHARD_COUNT_MAX);
    let (_, position) = pg_of_hash(object_hash(seed, bucket, key), pg_count);
    ((u128::from(position) * shard_count as u128) >> 64) as usize
}

/// A node's rendezvous score for a placement group.
#[must_use]
pub fn score(seed: u64, pg: u32, node_id: u32) -> u64 {
    // One call over the 10 bytes (the same digest as streaming them in
    // three updates, as the contract reads; pinned by the tests).
    let mut input = [0u8; 10];
    input[..2].copy_from_slice(b"pg");
    input[2..6].copy_from_slice(&pg.to_le_bytes());
    input[6..].copy_from_slice(&node_id.to_le_bytes());
    xxh3_64_with_seed(&input, seed)
}

/// The ordered replica list (indexes into `nodes`, primary first) of `pg`:
/// at most `replicas`, fewer only if fewer nodes are eligible.
#[must_use]
pub fn replicas(seed: u64, pg: u32, replicas: usize, nodes: &[PlacedNode]) -> Vec<usize> {
    replicas_among(seed, pg, replicas, nodes, |n| n.state.eligible())
}

/// Group `pg`'s *settled replicas* (indexes into `nodes`, the settled
/// primary first): its replicas as placed over the filled nodes that are
/// up, down or draining, each taken as eligible. That is where the
/// group's acknowledged writes were before the placement moved (nodes
/// joined that do not hold their groups yet, or a node began to drain);
/// `filled` only changes when the nodes that enter a group's settled
/// replicas hold it. Empty if no node is filled.
#[must_use]
pub fn settled_replicas(seed: u64, pg: u32, replicas: usize, nodes: &[PlacedNode]) -> Vec<usize> {
    replicas_among(seed, pg, replicas, nodes, |n| {
        n.filled
            && matches!(
                n.state,
                NodeState::Up | NodeState::Down | NodeState::Draining
            )
    })
}

/// Whether every group's settled replicas are its replicas: each node is
/// taken by both walks or by neither (every up or down node filled, no
/// draining node filled), as in a cluster with no hand-off pending. A map
/// build then places each group once.
#[must_use]
pub fn settled_as_placed(nodes: &[PlacedNode]) -> bool {
    nodes.iter().all(|n| {
        let settles = n.filled
            && matches!(
                n.state,
                NodeState::Up | NodeState::Down | NodeState::Draining
            );
        settles == n.state.eligible()
    })
}

/// `replicas` over the nodes `eligible` takes. One pass: the first walk
/// takes the best node of each of the `replicas` zones whose best nodes
/// rank highest, in that order, so only those are kept (at most
/// `replicas` entries, each the best seen so far of a distinct zone).
/// Where the eligible nodes span fewer zones, the second walk needs the
/// whole ranking (`replicas_walked`). A placement pass over every group
/// is what a map change costs each node (N hashes per group, no sort).
fn replicas_among(
    seed: u64,
    pg: u32,
    replicas: usize,
    nodes: &[PlacedNode],
    eligible: impl Fn(&PlacedNode) -> bool,
) -> Vec<usize> {
    assert!(replicas > 0 && replicas <= REPLICAS_MAX);
    // (score, id, index), best first: higher score, then lower id.
    let ahead = |a: &(u64, u32, usize), b: &(u64, u32, usize)| (a.0, b.1) > (b.0, a.1);
    let mut best: Vec<(u64, u32, usize)> = Vec::with_capacity(replicas + 1);
    let mut eligible_count = 0usize;
    for (i, n) in nodes.iter().enumerate() {
        if !eligible(n) {
            continue;
        }
        eligible_count += 1;
        let candidate = (score(seed, pg, n.id), n.id, i);
        if let Some(k) = best.iter().position(|e| nodes[e.2].zone == n.zone) {
            // Its zone is kept: only its best node stays.
            if !ahead(&candidate, &best[k]) {
                continue;
            }
            best.remove(k);
        } else if best.len() == replicas {
            // A new zone enters only ahead of the last kept; the last's
            // zone leaves (its best is behind `replicas` zones' bests).
            if !best.last().is_some_and(|last| ahead(&candidate, last)) {
                continue;
            }
            best.pop();
        }
        let at = best
            .iter()
            .position(|e| ahead(&candidate, e))
            .unwrap_or(best.len());
        best.insert(at, candidate);
    }
    if best.len() < replicas && eligible_count > best.len() {
        return replicas_walked(seed, pg, replicas, nodes, eligible);
    }
    best.into_iter().map(|(_, _, i)| i).collect()
}

/// `replicas`, computed as the contract reads (every eligible node
/// ranked, then the two walks): the reference the simulation times and
/// checks the one pass against at scale (`bench/src/bin/placement-sim.rs`).
#[doc(hidden)]
#[must_use]
pub fn replicas_by_walks(seed: u64, pg: u32, replicas: usize, nodes: &[PlacedNode]) -> Vec<usize> {
    assert!(replicas > 0 && replicas <= REPLICAS_MAX);
    replicas_walked(seed, pg, replicas, nodes, |n| n.state.eligible())
}

/// `replicas` over the nodes `eligible` takes, as the contract reads:
/// every eligible node ranked, then the two walks. The reference for
/// `replicas_among`, which it calls only when the eligible nodes span
/// fewer zones than `replicas` (the second walk).
fn replicas_walked(
    seed: u64,
    pg: u32,
    replicas: usize,
    nodes: &[PlacedNode],
    eligible: impl Fn(&PlacedNode) -> bool,
) -> Vec<usize> {
    let mut ranked: Vec<(u64, u32, usize)> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| eligible(n))
        .map(|(i, n)| (score(seed, pg, n.id), n.id, i))
        .collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<usize> = Vec::with_capacity(replicas);
    let mut zones: Vec<&str> = Vec::with_capacity(replicas);
    for &(_, _, i) in &ranked {
        if chosen.len() == replicas {
            return chosen;
        }
        let zone = nodes[i].zone.as_str();
        if !zones.contains(&zone) {
            zones.push(zone);
            chosen.push(i);
        }
    }
    for &(_, _, i) in &ranked {
        if chosen.len() == replicas {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    chosen
}

/// The acting primary of placement group `pg` (an index into `nodes`),
/// from its replica list (`replicas`, as `replicas(seed, pg, r, nodes)`
/// made it, `r` the cluster's replica count): the first replica that is
/// up, synced and one of the group's settled replicas (`settled_replicas`;
/// any replica when no node is filled). A replica that is not (a node
/// added, synced but not yet recorded as holding the group) leads nothing:
/// its writes would be missing from the record that says where the group
/// is. If none is, with R = 1, the group's settled primary when it is up
/// and synced (with R = 1 an added node's groups are led, and filled from,
/// by the node that held them). Otherwise the first replica that is up
/// and not synced (every replica is catching up, as when a whole cluster
/// starts: it serves nothing until it is); None if there is none (the
/// group cannot be served).
#[must_use]
pub fn acting_primary(
    seed: u64,
    pg: u32,
    r: usize,
    replicas: &[usize],
    nodes: &[PlacedNode],
) -> Option<usize> {
    acting_primary_of(r, replicas, &settled_replicas(seed, pg, r, nodes), nodes)
}

/// `acting_primary`, given the group's settled replicas (as
/// `settled_replicas` made them): a map build that keeps both places each
/// group twice, not three times.
#[must_use]
pub fn acting_primary_of(
    r: usize,
    replicas: &[usize],
    settled: &[usize],
    nodes: &[PlacedNode],
) -> Option<usize> {
    let up = |i: usize| nodes[i].state == NodeState::Up;
    let leads = |i: usize| settled.is_empty() || settled.contains(&i);
    if let Some(&i) = replicas
        .iter()
        .find(|&&i| up(i) && nodes[i].synced && leads(i))
    {
        return Some(i);
    }
    if r == 1 {
        if let Some(&s) = settled.first() {
            if up(s) && nodes[s].synced {
                return Some(s);
            }
        }
    }
    replicas
        .iter()
        .find(|&&i| up(i) && !nodes[i].synced)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::HASH_SEED_DEFAULT;

    fn node(id: u32, zone: &str) -> PlacedNode {
        PlacedNode {
            id,
            zone: zone.into(),
            state: NodeState::Up,
            synced: true,
            filled: true,
        }
    }

    /// Pinned values: clients in other languages must compute these
    /// exactly. Never change them casually.
    #[test]
    fn pinned_vectors() {
        let h = object_hash(HASH_SEED_DEFAULT, b"bucket", b"key");
        assert_eq!(pg_of_hash(h, 4096), (PINNED_PG, PINNED_POSITION));
        assert_eq!(
            cluster_shard(HASH_SEED_DEFAULT, 4096, 64, b"bucket", b"key"),
            PINNED_SHARD
        );
        assert_eq!(score(HASH_SEED_DEFAULT, 7, 3), PINNED_SCORE);
        let nodes: Vec<PlacedNode> = (1..=6)
            .map(|id| node(id, ["a", "b", "c"][(id % 3) as usize]))
            .collect();
        let ids: Vec<u32> = replicas(HASH_SEED_DEFAULT, PINNED_PG, 3, &nodes)
            .into_iter()
            .map(|i| nodes[i].id)
            .collect();
        assert_eq!(ids, PINNED_REPLICAS);
    }

    /// `score` hashes the 10 bytes in one call: the digest of streaming
    /// them as the contract reads, for any seed.
    #[test]
    fn score_is_the_streamed_digest() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..10_000 {
            let (seed, pg, id) = (rng.gen::<u64>(), rng.gen::<u32>(), rng.gen::<u32>());
            let mut h = xxhash_rust::xxh3::Xxh3::with_seed(seed);
            h.update(b"pg");
            h.update(&pg.to_le_bytes());
            h.update(&id.to_le_bytes());
            assert_eq!(score(seed, pg, id), h.digest(), "seed {seed:#x}");
        }
    }

    /// The one-pass selection is the contract's two walks over the whole
    /// ranking, on random maps: few and many zones (fewer zones than
    /// replicas takes the second walk), every state, filled or not.
    #[test]
    fn one_pass_is_the_walk() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e37_79b9);
        let states = [
            NodeState::Up,
            NodeState::Down,
            NodeState::Draining,
            NodeState::Out,
        ];
        for round in 0..3000 {
            let count = rng.gen_range(0..40usize);
            let zones = rng.gen_range(1..9u32);
            let mut ids: Vec<u32> = Vec::new();
            while ids.len() < count {
                let id = rng.gen_range(1..200u32);
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            let nodes: Vec<PlacedNode> = ids
                .iter()
                .map(|&id| PlacedNode {
                    id,
                    zone: format!("z{}", rng.gen_range(0..zones)),
                    state: states[rng.gen_range(0..states.len())],
                    synced: rng.gen_bool(0.5),
                    filled: rng.gen_bool(0.5),
                })
                .collect();
            let mut nodes = nodes;
            if round % 3 == 0 {
                // No hand-off pending: filled as placed.
                for n in &mut nodes {
                    n.filled = n.state.eligible();
                }
                assert!(settled_as_placed(&nodes));
            }
            let seed = rng.gen::<u64>();
            let r = rng.gen_range(1..=REPLICAS_MAX);
            for pg in 0..8 {
                let eligible = |n: &PlacedNode| n.state.eligible();
                assert_eq!(
                    replicas_among(seed, pg, r, &nodes, eligible),
                    replicas_walked(seed, pg, r, &nodes, eligible),
                    "round {round}, pg {pg}, r {r}"
                );
                let settles = |n: &PlacedNode| n.filled && n.state != NodeState::Out;
                assert_eq!(
                    replicas_among(seed, pg, r, &nodes, settles),
                    replicas_walked(seed, pg, r, &nodes, settles),
                    "settled: round {round}, pg {pg}, r {r}"
                );
                if settled_as_placed(&nodes) {
                    assert_eq!(
                        settled_replicas(seed, pg, r, &nodes),
                        replicas(seed, pg, r, &nodes)
                    );
                }
            }
        }
    }

    // pg = the top 12 bits of object_hash = 0x5dcd_05cf_acfd_11ce, the
    // position its other bits, the shard the position's top 6 bits.
    /// More pinned cases: a PG count that is not a power of two, fewer
    /// zones than replicas (the second walk), and ineligible nodes.
    #[test]
    fn pinned_edge_vectors() {
        let h = object_hash(HASH_SEED_DEFAULT, b"bucket", b"key");
        assert_eq!(pg_of_hash(h, 1000), PINNED_PG_1000);
        let mut nodes: Vec<PlacedNode> = (1..=6)
            .map(|id| node(id, ["a", "b"][(id % 2) as usize]))
            .collect();
        let ids = |nodes: &[PlacedNode]| -> Vec<u32> {
            replicas(HASH_SEED_DEFAULT, 42, 3, nodes)
                .into_iter()
                .map(|i| nodes[i].id)
                .collect()
        };
        assert_eq!(ids(&nodes), PINNED_TWO_ZONES);
        nodes[0].state = NodeState::Draining;
        nodes[1].state = NodeState::Out;
        nodes[2].state = NodeState::Down;
        assert_eq!(ids(&nodes), PINNED_INELIGIBLE);
    }

    const PINNED_PG_1000: (u32, u64) = (366, 7_556_674_293_922_106_544);
    const PINNED_TWO_ZONES: [u32; 3] = [5, 6, 1];
    // Node 1 draining and 2 out are skipped; 3, down, still counts.
    const PINNED_INELIGIBLE: [u32; 3] = [5, 6, 3];

    const PINNED_PG: u32 = 1500;
    const PINNED_POSITION: u64 = 0xd05c_facf_d11c_e000;
    const PINNED_SHARD: usize = 52;
    const PINNED_SCORE: u64 = 0x2335_cea8_4c8e_b50d;
    // Nodes 1-6 in zones b, c, a, b, c, a.
    const PINNED_REPLICAS: [u32; 3] = [1, 3, 2];

    /// A group placed only on nodes that never held data is led by its
    /// settled primary while that one is up and synced: with R = 1, the
    /// node that held it before the new node joined.
    #[test]
    fn a_new_nodes_groups_are_led_by_their_settled_primary() {
        let mut nodes: Vec<PlacedNode> = (1..=4).map(|id| node(id, "a")).collect();
        let before: Vec<usize> = (0..256).map(|pg| replicas(9, pg, 1, &nodes)[0]).collect();
        nodes.push(PlacedNode {
            synced: false,
            filled: false,
            ..node(5, "b")
        });
        let mut moved = 0;
        for pg in 0..256 {
            let placed = replicas(9, pg, 1, &nodes);
            let acting = acting_primary(9, pg, 1, &placed, &nodes);
            if placed == [4] {
                moved += 1;
                assert_eq!(acting, Some(before[pg as usize]), "pg {pg}");
            } else {
                assert_eq!(acting, Some(placed[0]), "pg {pg}");
            }
        }
        assert!(moved > 20, "{moved}");
        let pg = (0..256)
            .find(|&pg| replicas(9, pg, 1, &nodes) == [4])
            .unwrap();
        let held = before[pg as usize];
        // Synced, the new node leads once it is filled (recorded as
        // holding its groups), not before.
        nodes[4].synced = true;
        assert_eq!(acting_primary(9, pg, 1, &[4], &nodes), Some(held));
        nodes[4].filled = true;
        assert_eq!(acting_primary(9, pg, 1, &[4], &nodes), Some(4));
        nodes[4].filled = false;
        nodes[4].synced = false;
        // The holder unsynced, down or draining: the first up replica.
        for (state, synced) in [
            (NodeState::Up, false),
            (NodeState::Down, true),
            (NodeState::Draining, true),
        ] {
            nodes[held].state = state;
            nodes[held].synced = synced;
            assert_eq!(acting_primary(9, pg, 1, &[4], &nodes), Some(4), "{state:?}");
        }
        // Out: no longer where the data is; the next filled node is not
        // taken for it either unless it scores best among the filled.
        nodes[held].state = NodeState::Out;
        let next = acting_primary(9, pg, 1, &[4], &nodes).unwrap();
        let filled: Vec<PlacedNode> = nodes
            .iter()
            .filter(|n| n.filled && n.state != NodeState::Out)
            .cloned()
            .collect();
        assert_eq!(nodes[next].id, filled[replicas(9, pg, 1, &filled)[0]].id);
    }

    #[test]
    fn zones_are_distinct_while_there_are_enough() {
        let nodes: Vec<PlacedNode> = (0..30)
            .map(|id| node(id, &format!("z{}", id % 5)))
            .collect();
        for pg in 0..2000 {
            let r = replicas(1, pg, 3, &nodes);
            assert_eq!(r.len(), 3);
            let mut zones: Vec<&str> = r.iter().map(|&i| nodes[i].zone.as_str()).collect();
            zones.sort_unstable();
            zones.dedup();
            assert_eq!(zones.len(), 3, "pg {pg}");
        }
        // Two zones for three replicas: both zones, three distinct nodes.
        let two: Vec<PlacedNode> = (0..6)
            .map(|id| node(id, ["x", "y"][id as usize % 2]))
            .collect();
        for pg in 0..500 {
            let mut r = replicas(1, pg, 3, &two);
            let zones: Vec<&str> = r.iter().map(|&i| two[i].zone.as_str()).collect();
            assert!(zones.contains(&"x") && zones.contains(&"y"));
            r.sort_unstable();
            r.dedup();
            assert_eq!(r.len(), 3);
        }
        // Fewer eligible nodes than replicas: all of them.
        let mut few = vec![node(1, "a"), node(2, "a")];
        few[1].state = NodeState::Out;
        assert_eq!(replicas(1, 0, 3, &few), vec![0]);
    }

    #[test]
    fn adding_a_node_moves_only_the_slots_it_takes() {
        let mut nodes: Vec<PlacedNode> = (0..40)
            .map(|id| node(id, &format!("z{}", id % 8)))
            .collect();
        let pgs = 4096;
        let before: Vec<Vec<usize>> = (0..pgs).map(|pg| replicas(9, pg, 3, &nodes)).collect();
        nodes.push(node(40, "z3"));
        let mut moved = 0;
        for pg in 0..pgs {
            let after = replicas(9, pg, 3, &nodes);
            let gone: Vec<&usize> = before[pg as usize]
                .iter()
                .filter(|i| !after.contains(i))
                .collect();
            // Every replica that left was replaced by the new node.
            assert!(gone.len() <= 1, "pg {pg}");
            if gone.len() == 1 {
                assert!(after.contains(&40));
                moved += 1;
            }
        }
        // About R/N of the slots, 3 * 4096 / 41 = 300.
        assert!((200..400).contains(&moved), "{moved}");
    }

    #[test]
    fn shards_within_a_pg_are_uniform() {
        // All keys of one PG spread over every shard of a node.
        let mut counts = [0u32; 16];
        let mut found = 0;
        for i in 0..400_000u32 {
            let key = i.to_le_bytes();
            if pg_of(5, 64, b"b", &key) == 7 {
                counts[cluster_shard(5, 64, 16, b"b", &key)] += 1;
                found += 1;
            }
        }
        let mean = found / 16;
        assert!(
            counts.iter().all(|&c| c > mean * 3 / 4 && c < mean * 5 / 4),
            "{counts:?}"
        );
    }
}
