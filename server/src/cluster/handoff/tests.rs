//! A model of a cluster's groups moving between nodes (adds, drains,
//! deaths, returns, catch-ups, drops and removals, in random orders),
//! checking after every step that no group's data is lost and that every
//! node that serves a group (up, synced, its acting primary or a replica)
//! holds it. The catch-up and drop rules are those of `replicate`
//! (`sources_of`, `given_up`), the flags those of `changes`. The model
//! has no writes: a group's data is whether a node holds it.

use super::*;
use percore_protocol::routing::HASH_SEED_DEFAULT;

const PGS: u32 = 64;

struct Sim {
    r: usize,
    nodes: Vec<PlacedNode>,
    /// Per node (index), per group: holds the group's data.
    has: Vec<Vec<bool>>,
    /// The rule before hand-offs were recorded: a node is filled when it
    /// first syncs (kept to show the model catches it).
    fill_on_sync: bool,
    log: Vec<String>,
}

impl Sim {
    /// `n` nodes in zones a, b, c..., up, synced and filled, each holding
    /// its groups.
    fn new(n: u32, r: usize) -> Sim {
        let mut s = Sim {
            r,
            nodes: Vec::new(),
            has: Vec::new(),
            fill_on_sync: false,
            log: Vec::new(),
        };
        for id in 1..=n {
            s.nodes.push(PlacedNode {
                id,
                zone: zone(id),
                state: NodeState::Up,
                synced: true,
                filled: true,
            });
            s.has.push(vec![false; PGS as usize]);
        }
        for pg in 0..PGS {
            for i in s.replicas(pg) {
                s.has[i][pg as usize] = true;
            }
        }
        s
    }

    fn replicas(&self, pg: u32) -> Vec<usize> {
        placement::replicas(HASH_SEED_DEFAULT, pg, self.r, &self.nodes)
    }

    fn acting(&self, pg: u32) -> Option<usize> {
        placement::acting_primary(HASH_SEED_DEFAULT, pg, &self.replicas(pg), &self.nodes)
    }

    fn index(&self, id: u32) -> usize {
        self.nodes.iter().position(|n| n.id == id).unwrap()
    }

    /// A map change: an up node placed on a group it does not hold is
    /// not synced (the node marks itself so before it takes the map).
    fn regain(&mut self) {
        for pg in 0..PGS {
            for i in self.replicas(pg) {
                if self.nodes[i].state == NodeState::Up && !self.has[i][pg as usize] {
                    self.nodes[i].synced = false;
                }
            }
        }
    }

    fn add(&mut self) {
        let id = self.nodes.iter().map(|n| n.id).max().unwrap() + 1;
        self.log.push(format!("add n{id}"));
        self.nodes.push(PlacedNode {
            id,
            zone: zone(id),
            state: NodeState::Up,
            synced: false,
            filled: false,
        });
        self.has.push(vec![false; PGS as usize]);
        self.regain();
    }

    fn drain(&mut self, id: u32) {
        self.log.push(format!("drain n{id}"));
        let i = self.index(id);
        self.nodes[i].state = NodeState::Draining;
        self.regain();
    }

    fn kill(&mut self, id: u32) {
        self.log.push(format!("kill n{id}"));
        let i = self.index(id);
        self.nodes[i].state = NodeState::Down;
        self.nodes[i].synced = false;
    }

    fn revive(&mut self, id: u32) {
        self.log.push(format!("revive n{id}"));
        let i = self.index(id);
        self.nodes[i].state = NodeState::Up;
        self.nodes[i].synced = false;
    }

    /// Removal of a drained node that holds nothing (the runbook's rule:
    /// its copies are dropped, none stranded).
    fn remove(&mut self, id: u32) {
        self.log.push(format!("remove n{id}"));
        let i = self.index(id);
        assert!(self.has[i].iter().all(|h| !h));
        self.nodes[i].state = NodeState::Out;
        self.regain();
    }

    /// A catch-up of node `id` (`replicate::sources_of`): each group it
    /// is placed on from the acting primary when that one is synced, else
    /// merged from the other up replicas and the up settled replicas (a
    /// majority of each needed) (waited for while it is down). False:
    /// it waits.
    fn sync(&mut self, id: u32) -> bool {
        let i = self.index(id);
        if self.nodes[i].state != NodeState::Up || self.nodes[i].synced {
            return false;
        }
        let mut got = self.has[i].clone();
        for pg in 0..PGS {
            let reps = self.replicas(pg);
            if !reps.contains(&i) {
                continue;
            }
            let p = self.acting(pg);
            let sources: Vec<usize> = match p {
                Some(p) if p != i && self.nodes[p].synced => vec![p],
                _ => {
                    let mut up: Vec<usize> = reps
                        .iter()
                        .copied()
                        .filter(|&r| r != i && self.nodes[r].state == NodeState::Up)
                        .collect();
                    if up.len() + 1 < self.r / 2 + 1 {
                        return false;
                    }
                    // And a majority of the settled replicas.
                    let settled = Settled::of(&self.nodes).replicas(HASH_SEED_DEFAULT, pg, self.r);
                    let mut count = usize::from(settled.contains(&i));
                    for &s in settled.iter().filter(|&&s| s != i) {
                        if matches!(self.nodes[s].state, NodeState::Up | NodeState::Draining) {
                            count += 1;
                            up.push(s);
                        }
                    }
                    if !settled.is_empty() && count < settled.len() / 2 + 1 {
                        return false;
                    }
                    up
                }
            };
            if sources.iter().any(|&s| self.has[s][pg as usize]) {
                got[pg as usize] = true;
            }
        }
        self.log.push(format!("n{id} syncs"));
        self.has[i] = got;
        self.nodes[i].synced = true;
        if self.fill_on_sync {
            self.nodes[i].filled = true;
        }
        true
    }

    fn settle(&mut self) {
        if self.fill_on_sync {
            return;
        }
        let c = changes(HASH_SEED_DEFAULT, PGS, self.r, &self.nodes);
        if !c.is_empty() {
            let names: Vec<String> = c
                .iter()
                .map(|&(i, f)| format!("n{}={f}", self.nodes[i].id))
                .collect();
            self.log.push(format!("settle {}", names.join(" ")));
        }
        for (i, f) in c {
            self.nodes[i].filled = f;
        }
    }

    /// Node `id` drops its copies of the groups it gave up
    /// (`replicate::given_up`), each only if the acting primary holds it
    /// (the digest check: else the copy is stranded).
    fn drop_copies(&mut self, id: u32) {
        let i = self.index(id);
        if !matches!(self.nodes[i].state, NodeState::Up | NodeState::Draining) {
            return;
        }
        for pg in 0..PGS {
            let reps = self.replicas(pg);
            let p = self.acting(pg);
            if reps.contains(&i) || p == Some(i) || !self.has[i][pg as usize] {
                continue;
            }
            let whole = reps.len() == self.r
                && reps
                    .iter()
                    .all(|&r| self.nodes[r].state == NodeState::Up && self.nodes[r].synced)
                && p.is_some_and(|p| reps.contains(&p));
            let recorded = self.fill_on_sync
                || !Settled::of(&self.nodes)
                    .replicas(HASH_SEED_DEFAULT, pg, self.r)
                    .contains(&i);
            if whole && recorded && p.is_some_and(|p| self.has[p][pg as usize]) {
                self.has[i][pg as usize] = false;
            }
        }
    }

    /// Every group held somewhere; every node serving a group holds it.
    fn check(&self) -> Result<(), String> {
        for pg in 0..PGS {
            let held = self
                .nodes
                .iter()
                .enumerate()
                .any(|(i, n)| n.state != NodeState::Out && self.has[i][pg as usize]);
            if !held {
                return Err(format!("group {pg} is held nowhere"));
            }
            if let Some(p) = self.acting(pg) {
                let n = &self.nodes[p];
                if n.state == NodeState::Up && n.synced && !self.has[p][pg as usize] {
                    return Err(format!("n{} leads group {pg} without its data", n.id));
                }
            }
            for i in self.replicas(pg) {
                let n = &self.nodes[i];
                if n.state == NodeState::Up && n.synced && !self.has[i][pg as usize] {
                    return Err(format!("n{} is synced without group {pg}", n.id));
                }
            }
        }
        Ok(())
    }

    fn fail(&self, why: &str) -> String {
        format!("{why} after: {}", self.log.join(", "))
    }
}

fn zone(id: u32) -> String {
    ["a", "b", "c"][id as usize % 3].to_string()
}

/// Two nodes added at once to an R = 1 cluster, the first to sync with
/// groups it outscores the old holders for but that are placed on the
/// second: filled on its sync (the rule before), it became their settled
/// primary and led them empty.
fn two_adds(fill_on_sync: bool) -> Result<(), String> {
    let mut s = Sim::new(3, 1);
    s.fill_on_sync = fill_on_sync;
    s.add();
    s.add();
    for step in 0..4 {
        // n4 first, then n5; the settled flags and drops between.
        let id = if step < 2 { 4 } else { 5 };
        s.sync(id);
        s.settle();
        for n in 1..=5 {
            s.drop_copies(n);
        }
        s.check().map_err(|e| s.fail(&e))?;
    }
    s.settle();
    s.check().map_err(|e| s.fail(&e))?;
    Ok(())
}

#[test]
fn two_nodes_added_at_once_to_a_single_replica_cluster() {
    two_adds(false).unwrap();
    let e = two_adds(true).unwrap_err();
    assert!(e.contains("without its data"), "{e}");
}

/// A drain while an earlier drained node still runs: the earlier one
/// must not be taken for the settled primary of groups it handed off.
#[test]
fn a_drain_while_an_earlier_drained_node_still_runs() {
    for fill_on_sync in [false, true] {
        let mut s = Sim::new(4, 1);
        s.fill_on_sync = fill_on_sync;
        s.drain(2);
        for id in [1, 3, 4] {
            s.sync(id);
        }
        s.settle();
        for id in 1..=4 {
            s.drop_copies(id);
        }
        s.check().unwrap();
        s.drain(3);
        let mut bad = None;
        for id in [1, 4] {
            s.sync(id);
            s.settle();
            if let Err(e) = s.check() {
                bad = Some(s.fail(&e));
            }
        }
        assert_eq!(bad.is_some(), fill_on_sync, "{bad:?}");
    }
}

#[test]
fn nodes_that_all_start_empty_are_filled_together() {
    let mut nodes: Vec<PlacedNode> = (1..=3)
        .map(|id| PlacedNode {
            id,
            zone: zone(id),
            state: NodeState::Up,
            synced: true,
            filled: false,
        })
        .collect();
    nodes[2].synced = false;
    // Two of three synced: neither may be filled alone (each would
    // become the settled primary of the third's groups).
    assert!(changes(HASH_SEED_DEFAULT, PGS, 1, &nodes).is_empty());
    nodes[2].synced = true;
    assert_eq!(
        changes(HASH_SEED_DEFAULT, PGS, 1, &nodes),
        vec![(0, true), (1, true), (2, true)]
    );
}

/// splitmix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Random histories: adds, drains, deaths and returns (never two nodes
/// down at once with R = 1... any number with R > 1 only while a
/// majority of each group may still be up is not modelled: one at a
/// time), catch-ups in any order, settles and drops at any time, removals
/// of drained nodes that hold nothing.
#[test]
fn random_histories_lose_no_group_and_lead_none_empty() {
    for r in [1usize, 2, 3] {
        for seed in 0..300u64 {
            let mut rng = seed * 7 + r as u64;
            let mut s = Sim::new(3 + (seed % 2) as u32, r);
            for _ in 0..60 {
                let live: Vec<u32> = s
                    .nodes
                    .iter()
                    .filter(|n| n.state != NodeState::Out)
                    .map(|n| n.id)
                    .collect();
                let pick = live[(next(&mut rng) % live.len() as u64) as usize];
                let i = s.index(pick);
                let state = s.nodes[i].state;
                let ups = s.nodes.iter().filter(|n| n.state == NodeState::Up).count();
                let downs = s
                    .nodes
                    .iter()
                    .filter(|n| n.state == NodeState::Down)
                    .count();
                match next(&mut rng) % 10 {
                    0 if s.nodes.len() < 8 => s.add(),
                    1 if state == NodeState::Up && ups > r + 1 && downs == 0 => s.drain(pick),
                    2 if state == NodeState::Up && downs == 0 && ups > r => s.kill(pick),
                    3 if state == NodeState::Down => s.revive(pick),
                    4 if state == NodeState::Draining && s.has[i].iter().all(|h| !h) => {
                        s.remove(pick);
                    }
                    5 | 6 => {
                        s.sync(pick);
                    }
                    7 => s.settle(),
                    _ => s.drop_copies(pick),
                }
                if let Err(e) = s.check() {
                    panic!("R = {r}, seed {seed}: {}", s.fail(&e));
                }
            }
        }
    }
}
