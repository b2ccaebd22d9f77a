//! A model of a cluster's groups moving between nodes under writes (adds,
//! drains, undrains, deaths, returns, nodes marked out and back, catch-ups,
//! hand-offs, drops and removals, in random orders), checking after every
//! step that no acknowledged write is lost, that the node leading a group
//! (up and synced) holds its newest acknowledged write, and that every
//! synced replica does. The rules are those of the server: placement and
//! leading (`placement::acting_primary`), copies to the up replicas, a
//! write acknowledged by a majority of its replicas (the settled primary
//! counting its own copy with R = 1: `replicate::own_count`), catch-ups
//! (`replicate::sources_of`: a mirror of a synced primary, else a merge of
//! majorities of the replicas and of the settled replicas), the flags
//! (`map::mark_synced`, `changes`), nodes that gain groups marked unsynced
//! with the change (`map::with_gainers`), and drops
//! (`replicate::given_up`, checked against the primary's digest). A
//! group's data is the set of writes (keys) a node holds: a mirror takes
//! the primary's set (dropping what the primary lacks), a merge the
//! union.

use std::collections::BTreeSet;

use super::*;
use percore_protocol::routing::HASH_SEED_DEFAULT;

const PGS: u32 = 64;

struct Sim {
    r: usize,
    nodes: Vec<PlacedNode>,
    /// Per node (index), per group: the writes it holds.
    ver: Vec<Vec<BTreeSet<u32>>>,
    /// Per group: the acknowledged writes.
    acked: Vec<BTreeSet<u32>>,
    /// The next write's number.
    next_write: u32,
    /// The rule before hand-offs were recorded: a node is filled when it
    /// first syncs (kept to show the model catches it).
    fill_on_sync: bool,
    /// Every replica's copy counts toward a write's majority (the rule
    /// before `replicate::counts`).
    count_all: bool,
    /// A node whose copies fail (it is skipped).
    slow: Option<u32>,
    /// Per node (index): it runs filled on a replaced disk and has not
    /// synced since holding every group it is a settled replica of
    /// (`NodeRecord::empty`): its copies do not count, nor it in merges.
    empty: Vec<bool>,
    /// A replica on a replaced disk counts like any other, in writes and
    /// merges (the rule before `NodeRecord::empty`).
    count_empty: bool,
    /// Per node: the disk it runs on, the disk its record says its data is
    /// on (`NodeRecord::disk`), and the other disk, set aside with what it
    /// holds (a disk replaced, which may be put back).
    disk: Vec<u32>,
    recorded: Vec<u32>,
    shelf: Vec<Option<(u32, Vec<BTreeSet<u32>>)>>,
    log: Vec<String>,
}

impl Sim {
    /// `n` nodes in zones a, b, c..., up, synced and filled, each holding
    /// write 0 of its groups.
    fn new(n: u32, r: usize) -> Sim {
        let mut s = Sim {
            r,
            nodes: Vec::new(),
            ver: Vec::new(),
            acked: vec![BTreeSet::from([0]); PGS as usize],
            next_write: 1,
            fill_on_sync: false,
            count_all: false,
            slow: None,
            empty: Vec::new(),
            count_empty: false,
            disk: Vec::new(),
            recorded: Vec::new(),
            shelf: Vec::new(),
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
            s.ver.push(vec![BTreeSet::new(); PGS as usize]);
            s.empty.push(false);
            s.disk.push(id);
            s.recorded.push(id);
            s.shelf.push(None);
        }
        for pg in 0..PGS {
            for i in s.replicas(pg) {
                s.ver[i][pg as usize].insert(0);
            }
        }
        s
    }

    fn replicas(&self, pg: u32) -> Vec<usize> {
        placement::replicas(HASH_SEED_DEFAULT, pg, self.r, &self.nodes)
    }

    fn settled(&self, pg: u32) -> Vec<usize> {
        placement::settled_replicas(HASH_SEED_DEFAULT, pg, self.r, &self.nodes)
    }

    fn acting(&self, pg: u32) -> Option<usize> {
        placement::acting_primary(
            HASH_SEED_DEFAULT,
            pg,
            self.r,
            &self.replicas(pg),
            &self.nodes,
        )
    }

    fn index(&self, id: u32) -> usize {
        self.nodes.iter().position(|n| n.id == id).unwrap()
    }

    /// A map change: nodes that gain a group are marked unsynced with it.
    fn change(&mut self, f: impl FnOnce(&mut Vec<PlacedNode>)) {
        let before: Vec<Vec<u32>> = (0..PGS)
            .map(|pg| {
                self.replicas(pg)
                    .iter()
                    .map(|&i| self.nodes[i].id)
                    .collect()
            })
            .collect();
        f(&mut self.nodes);
        while self.ver.len() < self.nodes.len() {
            self.ver.push(vec![BTreeSet::new(); PGS as usize]);
            self.empty.push(false);
            let id = self.nodes[self.disk.len()].id;
            self.disk.push(id);
            self.recorded.push(id);
            self.shelf.push(None);
        }
        for pg in 0..PGS {
            for i in self.replicas(pg) {
                if !before[pg as usize].contains(&self.nodes[i].id) {
                    self.nodes[i].synced = false;
                }
            }
        }
    }

    fn add(&mut self) {
        let id = self.nodes.iter().map(|n| n.id).max().unwrap() + 1;
        self.log.push(format!("add n{id}"));
        self.change(|nodes| {
            nodes.push(PlacedNode {
                id,
                zone: zone(id),
                state: NodeState::Up,
                synced: false,
                filled: false,
            });
        });
    }

    fn set_state(&mut self, id: u32, state: NodeState) {
        let i = self.index(id);
        self.log.push(format!("n{id} {}", state.name()));
        self.change(|nodes| {
            let n = &mut nodes[i];
            match (n.state, state) {
                // Joins again (`map::join`): unsynced; unfilled if it was out.
                (old, NodeState::Up) => {
                    n.synced = false;
                    n.filled &= old != NodeState::Out;
                }
                (_, NodeState::Down) => n.synced = false,
                (_, NodeState::Out) => {
                    n.synced = false;
                    n.filled = false;
                }
                _ => {}
            }
            n.state = state;
        });
        // `map::join`: empty if it stays filled on a disk other than the
        // recorded one (else that disk is recorded); cleared when marked
        // out.
        self.rejoined(i);
    }

    fn rejoined(&mut self, i: usize) {
        let n = &self.nodes[i];
        self.empty[i] = n.filled && n.state != NodeState::Out && self.disk[i] != self.recorded[i];
        if !self.empty[i] && n.state == NodeState::Up {
            self.recorded[i] = self.disk[i];
        }
    }

    /// Node `i` counts again (`map::mark_synced`, `map::settle`): its
    /// disk is where its data is.
    fn counts_again(&mut self, i: usize) {
        self.empty[i] = false;
        self.recorded[i] = self.disk[i];
    }

    /// A down node comes back with an empty disk under its name
    /// (`map::join` with a fresh directory): it holds nothing, and is
    /// empty if it stays filled.
    fn wipe(&mut self, id: u32) {
        let i = self.index(id);
        assert_eq!(self.nodes[i].state, NodeState::Down);
        self.log.push(format!("n{id} wiped"));
        let old = std::mem::replace(&mut self.ver[i], vec![BTreeSet::new(); PGS as usize]);
        let new_disk = 1000 + self.next_write;
        self.shelf[i] = Some((std::mem::replace(&mut self.disk[i], new_disk), old));
        self.set_state(id, NodeState::Up);
    }

    /// A down node comes back on the disk set aside (a disk that did not
    /// mount, mounted again): what it held then, the other disk set aside.
    fn swap_back(&mut self, id: u32) {
        let i = self.index(id);
        assert_eq!(self.nodes[i].state, NodeState::Down);
        let (disk, ver) = self.shelf[i].take().expect("a disk set aside");
        self.log.push(format!("n{id} back on disk {disk}"));
        let old_ver = std::mem::replace(&mut self.ver[i], ver);
        self.shelf[i] = Some((std::mem::replace(&mut self.disk[i], disk), old_ver));
        self.set_state(id, NodeState::Up);
    }

    /// Removal of a drained node that holds nothing (the runbook's rule:
    /// its copies are dropped, none stranded).
    fn remove(&mut self, id: u32) {
        let i = self.index(id);
        assert!(self.ver[i].iter().all(BTreeSet::is_empty));
        self.log.push(format!("remove n{id}"));
        self.change(|nodes| nodes[i].state = NodeState::Out);
    }

    /// A write of group `pg` through its acting primary, when it leads
    /// (up and synced): copied to the up replicas (one in five copies
    /// fails: that replica is skipped, unsynced), acknowledged by a
    /// majority of the copies that count (`replicate::counts`: the
    /// settled replicas').
    fn write(&mut self, pg: u32) {
        let Some(a) = self.acting(pg) else {
            return;
        };
        if self.nodes[a].state != NodeState::Up || !self.nodes[a].synced {
            return;
        }
        let v = self.next_write;
        self.next_write += 1;
        let reps = self.replicas(pg);
        let settled = self.settled(pg);
        let counts = |i: usize| {
            (self.count_empty || !self.empty[i])
                && (self.count_all || settled.is_empty() || settled.contains(&i))
        };
        self.ver[a][pg as usize].insert(v);
        let mut acks = usize::from((reps.contains(&a) || self.r == 1) && counts(a));
        for &i in reps.iter().filter(|&&i| i != a) {
            // A slow replica misses some copies (it is skipped: unsynced).
            let slow = self.slow.map_or((v + i as u32).is_multiple_of(5), |id| {
                id == self.nodes[i].id
            });
            if self.nodes[i].state == NodeState::Up && !slow {
                self.ver[i][pg as usize].insert(v);
                acks += usize::from(counts(i));
            } else if self.nodes[i].state == NodeState::Up {
                self.nodes[i].synced = false;
            }
        }
        if acks > self.r / 2 {
            self.acked[pg as usize].insert(v);
        }
    }

    /// A catch-up of node `id` (`replicate::sources_of`): each group it is
    /// placed on mirrored from the acting primary when that one is synced,
    /// else merged from the other up replicas and the up or draining
    /// settled replicas (a majority of each needed, waited for
    /// otherwise). False: it waits. Marked synced, and filled with it if
    /// the hand-off allows it alone (`map::mark_synced`).
    fn sync(&mut self, id: u32) -> bool {
        let i = self.index(id);
        if self.nodes[i].state != NodeState::Up || self.nodes[i].synced {
            return false;
        }
        let mut got = self.ver[i].clone();
        for pg in 0..PGS {
            let reps = self.replicas(pg);
            if !reps.contains(&i) {
                continue;
            }
            let held = |s: usize| self.ver[s][pg as usize].clone();
            match self.acting(pg) {
                Some(p) if p != i && self.nodes[p].synced => got[pg as usize] = held(p),
                _ => {
                    let up: Vec<usize> = reps
                        .iter()
                        .copied()
                        .filter(|&r| r != i && self.nodes[r].state == NodeState::Up)
                        .collect();
                    let majority = self.r / 2 + 1;
                    if up.len() + 1 < majority {
                        return false;
                    }
                    // Without the replicas that joined with an empty
                    // disk, every majority must still be met.
                    let full = |of: &[usize]| of.iter().filter(|&&n| !self.empty[n]).count();
                    let me = usize::from(!self.empty[i]);
                    if !self.count_empty && full(&up) + me < reps.len().saturating_sub(majority) + 1
                    {
                        return false;
                    }
                    let settled = self.settled(pg);
                    let from: Vec<usize> = settled
                        .iter()
                        .copied()
                        .filter(|&s| {
                            s != i
                                && matches!(
                                    self.nodes[s].state,
                                    NodeState::Up | NodeState::Draining
                                )
                        })
                        .collect();
                    let mine = settled.contains(&i);
                    let have = from.len() + usize::from(mine);
                    let need = settled.len() / 2 + 1;
                    if !settled.is_empty() && have < need {
                        return false;
                    }
                    let full_have = full(&from) + usize::from(mine && !self.empty[i]);
                    if !self.count_empty
                        && !settled.is_empty()
                        && full_have < settled.len() - need + 1
                    {
                        return false;
                    }
                    for s in up.into_iter().chain(from) {
                        got[pg as usize].extend(held(s));
                    }
                }
            }
        }
        self.log.push(format!("n{id} syncs"));
        self.ver[i] = got;
        self.nodes[i].synced = true;
        if self.fill_on_sync || may_fill(HASH_SEED_DEFAULT, PGS, self.r, &self.nodes, i) {
            self.nodes[i].filled = true;
        }
        if self.empty[i] && self.holds_settled(i) {
            self.counts_again(i);
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
        // `map::settle`: a synced node on a replaced disk that now holds
        // every group it is a settled replica of counts again.
        for i in 0..self.nodes.len() {
            if self.empty[i] && self.nodes[i].synced && self.holds_settled(i) {
                self.log.push(format!("n{} counts again", self.nodes[i].id));
                self.counts_again(i);
            }
        }
    }

    /// `map::holds_settled`: node `i` is placed on every group it is a
    /// settled replica of.
    fn holds_settled(&self, i: usize) -> bool {
        (0..PGS).all(|pg| !self.settled(pg).contains(&i) || self.replicas(pg).contains(&i))
    }

    /// Node `id` drops its copies of the groups it gave up
    /// (`replicate::given_up`), each write only if the acting primary
    /// holds it (its digest: else the copy is stranded).
    fn drop_copies(&mut self, id: u32) {
        let i = self.index(id);
        if !matches!(self.nodes[i].state, NodeState::Up | NodeState::Draining) {
            return;
        }
        for pg in 0..PGS {
            let reps = self.replicas(pg);
            let p = self.acting(pg);
            if reps.contains(&i) || p == Some(i) || self.settled(pg).contains(&i) {
                continue;
            }
            let whole = reps.len() == self.r
                && reps
                    .iter()
                    .all(|&r| self.nodes[r].state == NodeState::Up && self.nodes[r].synced)
                && p.is_some_and(|p| reps.contains(&p));
            if let Some(p) = p.filter(|_| whole) {
                let theirs = self.ver[p][pg as usize].clone();
                self.ver[i][pg as usize].retain(|v| !theirs.contains(v));
            }
        }
    }

    /// No acknowledged write lost; the leader and every synced replica
    /// hold each group's acknowledged writes.
    fn check(&self) -> Result<(), String> {
        for pg in 0..PGS {
            let acked = &self.acked[pg as usize];
            let lacks = |i: usize| acked.difference(&self.ver[i][pg as usize]).next().copied();
            for &v in acked {
                let held = (0..self.nodes.len()).any(|i| {
                    self.nodes[i].state != NodeState::Out && self.ver[i][pg as usize].contains(&v)
                });
                if !held {
                    return Err(format!("group {pg} lost write {v}"));
                }
            }
            if let Some(p) = self.acting(pg) {
                let n = &self.nodes[p];
                if let Some(v) = lacks(p).filter(|_| n.state == NodeState::Up && n.synced) {
                    return Err(format!("n{} leads group {pg} without write {v}", n.id));
                }
            }
            for i in self.replicas(pg) {
                let n = &self.nodes[i];
                if let Some(v) = lacks(i).filter(|_| n.state == NodeState::Up && n.synced) {
                    return Err(format!(
                        "n{} is synced without group {pg}'s write {v}",
                        n.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether every acknowledged write node `i` holds is also held by a
    /// node that is not out.
    fn held_elsewhere(&self, i: usize) -> bool {
        (0..PGS).all(|pg| {
            self.acked[pg as usize]
                .intersection(&self.ver[i][pg as usize])
                .all(|v| {
                    (0..self.nodes.len()).any(|n| {
                        n != i
                            && self.nodes[n].state != NodeState::Out
                            && self.ver[n][pg as usize].contains(v)
                    })
                })
        })
    }

    /// Whether every group's acknowledged writes are each on two up nodes
    /// or more (one more failure loses none: R > 1 promises no more).
    fn survives(&self) -> bool {
        (0..PGS).all(|pg| {
            self.acked[pg as usize].iter().all(|v| {
                (0..self.nodes.len())
                    .filter(|&i| {
                        self.nodes[i].state == NodeState::Up && self.ver[i][pg as usize].contains(v)
                    })
                    .count()
                    >= 2
            })
        })
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
        // n4 first, then n5; writes, the flags and drops between.
        let id = if step < 2 { 4 } else { 5 };
        s.sync(id);
        s.settle();
        for pg in 0..PGS {
            s.write(pg);
        }
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
    assert!(e.contains("leads group"), "{e}");
}

/// A drain while an earlier drained node still runs: the earlier one,
/// unfilled once its groups were held elsewhere, is not taken for where
/// the groups it handed off are.
#[test]
fn a_drain_while_an_earlier_drained_node_still_runs() {
    let mut s = Sim::new(4, 1);
    s.set_state(2, NodeState::Draining);
    for id in [1, 3, 4] {
        s.sync(id);
    }
    s.settle();
    assert!(!s.nodes[s.index(2)].filled, "{:?}", s.log);
    for pg in 0..PGS {
        s.write(pg);
    }
    for id in 1..=4 {
        s.drop_copies(id);
    }
    s.check().unwrap();
    s.set_state(3, NodeState::Draining);
    for id in [1, 4] {
        s.sync(id);
        s.settle();
        for pg in 0..PGS {
            s.write(pg);
        }
        s.check().map_err(|e| s.fail(&e)).unwrap();
    }
    assert!(!s.nodes[s.index(3)].filled, "{:?}", s.log);
}

/// R = 3: a write acknowledged with the copy of a replica added and not
/// yet filled (another replica skipped), then the group moves off that
/// replica (more nodes added) and its primary dies: the merge of the
/// replicas and the settled replicas must still find the write. Unless
/// the new replica's copy does not count (`replicate::counts`), the
/// write is acknowledged on two nodes of which neither is merged.
fn write_on_a_new_replica(count_all: bool) -> Result<(), String> {
    let ids =
        |s: &Sim, pg: u32| -> Vec<u32> { s.replicas(pg).iter().map(|&i| s.nodes[i].id).collect() };
    // A group n4 takes, and the nodes added after it that take it off n4.
    let (pg, more) = {
        let mut t = Sim::new(3, 3);
        t.add();
        let mine: Vec<u32> = (0..PGS).filter(|&pg| ids(&t, pg).contains(&4)).collect();
        let mut found = None;
        for k in 1..=8 {
            t.add();
            if let Some(&pg) = mine.iter().find(|&&pg| !ids(&t, pg).contains(&4)) {
                found = Some((pg, k));
                break;
            }
        }
        found.ok_or("no group leaves n4")?
    };
    let mut s = Sim::new(3, 3);
    s.count_all = count_all;
    s.add();
    let primary = s.nodes[s.acting(pg).ok_or("no primary")?].id;
    let other = *ids(&s, pg)
        .iter()
        .find(|&&n| n != primary && n != 4)
        .ok_or("no other replica")?;
    s.slow = Some(other);
    s.write(pg);
    s.slow = None;
    for _ in 0..more {
        s.add();
    }
    s.set_state(primary, NodeState::Down);
    for id in 1..=s.nodes.len() as u32 {
        s.sync(id);
        s.check().map_err(|e| s.fail(&e))?;
    }
    Ok(())
}

#[test]
fn a_write_on_a_replica_not_yet_filled_does_not_count() {
    write_on_a_new_replica(false).unwrap();
    let e = write_on_a_new_replica(true).unwrap_err();
    assert!(e.contains("without"), "{e}");
}

/// R = 3, every group on all three nodes (A its primary, B and C): `lose`
/// runs on C before a write acknowledged by A and C (B skipped), `then`
/// after it; then A goes down, and B and C must not merge the group from
/// each other (the write is on A alone). Once A is back every node syncs
/// and counts again.
fn c_loses_a_write(
    count_empty: bool,
    lose: impl Fn(&mut Sim, u32) -> Result<(), String>,
    then: impl Fn(&mut Sim, u32),
) -> Result<(), String> {
    let mut s = Sim::new(3, 3);
    s.count_empty = count_empty;
    let pg = 0;
    let a = s.nodes[s.acting(pg).ok_or("no primary")?].id;
    let others: Vec<u32> = s
        .replicas(pg)
        .iter()
        .map(|&i| s.nodes[i].id)
        .filter(|&n| n != a)
        .collect();
    let (b, c) = (others[0], others[1]);
    lose(&mut s, c)?;
    s.slow = Some(b);
    s.write(pg);
    s.slow = None;
    if s.acked[pg as usize].len() != 2 {
        return Err("the write was not acknowledged".into());
    }
    then(&mut s, c);
    s.set_state(a, NodeState::Down);
    for id in [b, c] {
        s.sync(id);
        s.check().map_err(|e| s.fail(&e))?;
    }
    s.set_state(a, NodeState::Up);
    for id in [b, c, a, b, c] {
        s.sync(id);
        s.check().map_err(|e| s.fail(&e))?;
    }
    if !s.nodes.iter().all(|n| n.synced) || s.empty.iter().any(|&e| e) {
        return Err(s.fail("not every node synced and counted again"));
    }
    Ok(())
}

/// C's disk replaced after the write (it joins again empty, under its
/// name). Unless a merge leaves C out of its majorities
/// (`NodeRecord::empty`), B syncs without the write.
fn a_wiped_replica(count_empty: bool) -> Result<(), String> {
    c_loses_a_write(
        count_empty,
        |_, _| Ok(()),
        |s, c| {
            s.set_state(c, NodeState::Down);
            s.wipe(c);
        },
    )
}

/// C's disk replaced and caught up on (it counts again) before the write;
/// after it, C's old disk is put back (one that did not mount, mounted
/// again): it lacks the write, so C is empty again (its record names the
/// new disk).
fn a_disk_put_back(count_empty: bool) -> Result<(), String> {
    c_loses_a_write(
        count_empty,
        |s, c| {
            s.set_state(c, NodeState::Down);
            s.wipe(c);
            if !s.sync(c) || s.empty[s.index(c)] {
                return Err(s.fail("C did not catch up on its new disk"));
            }
            Ok(())
        },
        |s, c| {
            s.set_state(c, NodeState::Down);
            s.swap_back(c);
        },
    )
}

#[test]
fn a_disk_put_back_after_its_replacement_caught_up_is_empty() {
    a_disk_put_back(false).unwrap();
    let e = a_disk_put_back(true).unwrap_err();
    assert!(e.contains("without"), "{e}");
}

#[test]
fn a_replica_that_joined_with_an_empty_disk_counts_toward_no_merge() {
    a_wiped_replica(false).unwrap();
    let e = a_wiped_replica(true).unwrap_err();
    assert!(e.contains("without"), "{e}");
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

/// One random step of node `pick`: membership changes within what the
/// cluster survives (one node down at a time, and only while every up
/// node is synced; out, and back from out, only with R > 1), catch-ups,
/// writes,
/// hand-offs and drops at any time.
fn step(s: &mut Sim, rng: &mut u64, pick: u32) {
    let r = s.r;
    let i = s.index(pick);
    let state = s.nodes[i].state;
    let count = |st: NodeState| s.nodes.iter().filter(|n| n.state == st).count();
    let (ups, downs) = (count(NodeState::Up), count(NodeState::Down));
    // A second failure before the first one's groups are whole again
    // loses what only the two held: not modelled.
    let all_synced = s.nodes.iter().all(|n| n.state != NodeState::Up || n.synced);
    match next(rng) % 15 {
        0 if s.nodes.len() < 8 => s.add(),
        1 if state == NodeState::Up && ups > r + 1 && downs == 0 => {
            s.set_state(pick, NodeState::Draining);
        }
        2 if state == NodeState::Draining => s.set_state(pick, NodeState::Up),
        3 if state == NodeState::Up && downs == 0 && ups > r && all_synced && s.survives() => {
            s.set_state(pick, NodeState::Down);
        }
        4 if state == NodeState::Down || (state == NodeState::Out && r > 1) => {
            s.set_state(pick, NodeState::Up);
        }
        5 if state == NodeState::Down && r > 1 => s.set_state(pick, NodeState::Out),
        // Its disk replaced, if what it holds is held elsewhere too (else
        // the loss is a second failure).
        13 if state == NodeState::Down && r > 1 && s.held_elsewhere(i) => {
            if s.shelf[i].is_some() && next(rng).is_multiple_of(2) {
                s.swap_back(pick);
            } else {
                s.wipe(pick);
            }
        }
        6 if state == NodeState::Draining && s.ver[i].iter().all(BTreeSet::is_empty) => {
            s.remove(pick);
        }
        7 | 8 => {
            s.sync(pick);
        }
        9 => s.settle(),
        10 | 11 => {
            let pg = (next(rng) % u64::from(PGS)) as u32;
            s.write(pg);
        }
        _ => s.drop_copies(pick),
    }
}

/// Random histories (R = 1 to 3, 300 each): no acknowledged write lost,
/// none missing where a group is led or synced.
#[test]
fn random_histories_lose_no_write_and_lead_none_stale() {
    for r in [1usize, 2, 3] {
        for seed in 0..300u64 {
            let mut rng = seed * 7 + r as u64;
            let mut s = Sim::new(3 + (seed % 2) as u32, r);
            for _ in 0..80 {
                let live: Vec<u32> = s
                    .nodes
                    .iter()
                    .filter(|n| n.state != NodeState::Out || r > 1)
                    .map(|n| n.id)
                    .collect();
                let pick = live[(next(&mut rng) % live.len() as u64) as usize];
                step(&mut s, &mut rng, pick);
                if let Err(e) = s.check() {
                    panic!("R = {r}, seed {seed}: {}", s.fail(&e));
                }
            }
        }
    }
}
