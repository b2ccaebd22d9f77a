//! Deterministic simulation of the cluster placement contract
//! (`percore_protocol::placement`) for large clusters: balance, data moved
//! on node add/remove and zone loss against the optimum, map size and etcd
//! traffic per change, the time to compute a whole placement table, and
//! what a map change costs a node's control thread at that size (the map
//! build, and the hand-off checks of `cluster::handoff`).
//!
//!     cargo run --release -p percore-bench --bin placement-sim -- \
//!         [--nodes 1000] [--zones 50] [--replicas 3] [--pgs 4096,16384,65536]
//!
//! Prints a Markdown report (docs/cluster.md quotes it; bench/results keeps
//! one run). No randomness: every figure follows from the hashes.

use std::time::Instant;

use clap::Parser;
use percore_protocol::placement::{
    acting_primary_of, replicas, replicas_by_walks, settled_as_placed, settled_replicas, NodeState,
    PlacedNode,
};
use percore_protocol::routing::HASH_SEED_DEFAULT;
use percore_server::cluster::handoff;

#[derive(Parser)]
#[command(about = "Simulates percore's cluster placement for a large cluster")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    nodes: u32,
    #[arg(long, default_value_t = 50)]
    zones: u32,
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Placement group counts to compare, comma-separated.
    #[arg(long, default_value = "4096,16384,65536", value_delimiter = ',')]
    pgs: Vec<u32>,
}

type Table = Vec<Vec<usize>>;

fn table(pgs: u32, r: usize, nodes: &[PlacedNode]) -> Table {
    (0..pgs)
        .map(|pg| replicas(HASH_SEED_DEFAULT, pg, r, nodes))
        .collect()
}

/// Replica slots whose node changed (a slot moves the PG's data once).
fn moved_slots(before: &Table, after: &Table) -> usize {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| b.iter().filter(|i| !a.contains(i)).count())
        .sum()
}

/// (max/mean, min/mean) replicas per eligible node, and max/mean primaries.
fn balance(t: &Table, nodes: &[PlacedNode]) -> (f64, f64, f64) {
    let mut slots = vec![0u32; nodes.len()];
    let mut primaries = vec![0u32; nodes.len()];
    for r in t {
        for &i in r {
            slots[i] += 1;
        }
        primaries[r[0]] += 1;
    }
    let eligible: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].state.eligible())
        .collect();
    let n = eligible.len() as f64;
    let mean = eligible.iter().map(|&i| f64::from(slots[i])).sum::<f64>() / n;
    let max = eligible.iter().map(|&i| slots[i]).max().unwrap_or(0);
    let min = eligible.iter().map(|&i| slots[i]).min().unwrap_or(0);
    let pmean = t.len() as f64 / n;
    let pmax = eligible.iter().map(|&i| primaries[i]).max().unwrap_or(0);
    (
        f64::from(max) / mean,
        f64::from(min) / mean,
        f64::from(pmax) / pmean,
    )
}

/// The median of `runs` timings of `f`, in ms.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The shard map build of `ShardMap::build`: every group's replicas,
/// settled replicas and acting primary (with no hand-off pending, the
/// settled replicas are the replicas: each group placed once).
fn map_build(seed: u64, pgs: u32, r: usize, nodes: &[PlacedNode]) {
    let as_placed = settled_as_placed(nodes);
    let mut led = 0usize;
    for pg in 0..pgs {
        let chosen = replicas(seed, pg, r, nodes);
        let settled = if as_placed {
            chosen.clone()
        } else {
            settled_replicas(seed, pg, r, nodes)
        };
        led += usize::from(acting_primary_of(r, &chosen, &settled, nodes).is_some());
    }
    assert_eq!(led, pgs as usize);
}

/// What a map change costs a node's control thread (ms, medians of 3):
/// the shard map build with no hand-off pending and with one (a node
/// added, not filled yet), and the hand-off check when that node has
/// synced (one candidate) and when a new cluster's nodes have all synced
/// (every node a candidate, filled together).
fn control_costs(pgs: u32, r: usize, nodes: &[PlacedNode]) -> [f64; 4] {
    let seed = HASH_SEED_DEFAULT;
    let steady = median_ms(3, || map_build(seed, pgs, r, nodes));
    let mut added = nodes.to_vec();
    let last = added.len() - 1;
    added[last].filled = false;
    let pending = median_ms(3, || map_build(seed, pgs, r, &added));
    let add = median_ms(3, || {
        assert_eq!(handoff::changes(seed, pgs, r, &added), vec![(last, true)]);
    });
    let fresh: Vec<PlacedNode> = nodes
        .iter()
        .map(|n| PlacedNode {
            filled: false,
            ..n.clone()
        })
        .collect();
    let start = median_ms(3, || {
        assert_eq!(handoff::changes(seed, pgs, r, &fresh).len(), fresh.len());
    });
    [steady, pending, add, start]
}

/// One node's record as the map keeps it in etcd (JSON; see docs/cluster.md).
fn node_record(id: u32, zone: &str) -> String {
    format!(
        r#"{{"id":{id},"name":"node-{id:04}","zone":"{zone}","state":"up","s3":"10.1.{a}.{b}:9000","native":"10.1.{a}.{b}:9100","admin":"10.1.{a}.{b}:9900","shards":64,"since_ms":1796315545775}}"#,
        a = id / 250,
        b = id % 250
    )
}

/// The control-thread cost table (`control_costs`) for each PG count.
fn print_control_costs(pg_counts: &[u32], r: usize, nodes: &[PlacedNode]) {
    println!();
    println!("Control-thread cost of a map change on each node (one core, medians of 3): the shard map build (every group's replicas, settled replicas and acting primary), with no hand-off pending (each group placed once) and with one (a node added, not filled yet: twice); the hand-off check (`cluster::handoff::changes`) when that node has synced, and when every node of a new cluster has (all filled together, one etcd transaction of three operations: the `filled` key and the epoch).\n");
    println!("| PGs | map build | map build, a hand-off pending | hand-off check: a node added | hand-off check: a new cluster |");
    println!("|---|---|---|---|---|");
    for &pgs in pg_counts {
        let [steady, pending, add, start] = control_costs(pgs, r, nodes);
        println!("| {pgs} | {steady:.0} ms | {pending:.0} ms | {add:.0} ms | {start:.0} ms |");
    }
}

fn main() {
    let args = Args::parse();
    let zone = |id: u32| format!("z{:02}", id % args.zones);
    let nodes: Vec<PlacedNode> = (0..args.nodes)
        .map(|id| PlacedNode {
            id,
            zone: zone(id),
            state: NodeState::Up,
            synced: true,
            filled: true,
        })
        .collect();
    let r = args.replicas;
    println!(
        "# Placement simulation: {} nodes in {} zones, R = {r}\n",
        args.nodes, args.zones
    );
    println!("Moved: replica slots whose node changed, as a share of all R x PGs slots; optimum: the share that must move (the new node's fair share on add, the lost nodes' slots on removal). On add, every moved slot goes to the new node (checked: no replica moves between old nodes), so moved below the optimum means the new node got less than its share (balance, see max/mean).\n");
    println!("Table time: one core computing every PG's replicas in one pass per PG (the zones' best nodes kept, `placement::replicas`), and as the contract reads it (every node ranked, then the walks: `replicas_by_walks`, checked equal for every PG), medians of 3.\n");
    println!("| PGs | PGs/node (R x PGs / N) | max/mean | min/mean | primaries max/mean | add 1 node: moved (optimum) | remove 1 node: moved (optimum) | lose a zone: moved (optimum) | table time (one pass) | table time (walks) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &pgs in &args.pgs {
        let base = table(pgs, r, &nodes);
        let table_ms = median_ms(3, || {
            assert_eq!(table(pgs, r, &nodes).len(), pgs as usize);
        });
        let mut walked = Vec::new();
        let walks_ms = median_ms(3, || {
            walked = (0..pgs)
                .map(|pg| replicas_by_walks(HASH_SEED_DEFAULT, pg, r, &nodes))
                .collect();
        });
        assert_eq!(walked, base, "the one pass places as the walks do");
        let (max, min, pmax) = balance(&base, &nodes);
        let total = (pgs as usize * r) as f64;

        let mut grown = nodes.clone();
        grown.push(PlacedNode {
            id: args.nodes,
            zone: zone(7),
            state: NodeState::Up,
            synced: true,
            filled: true,
        });
        let grown_table = table(pgs, r, &grown);
        let add = moved_slots(&base, &grown_table) as f64 / total;
        // Slots that changed to a node other than the new one: none, if
        // adding moves only what the new node takes.
        let new_index = grown.len() - 1;
        let collateral: usize = base
            .iter()
            .zip(&grown_table)
            .map(|(b, a)| {
                a.iter()
                    .filter(|&&i| i != new_index && !b.contains(&i))
                    .count()
            })
            .sum();
        let add_opt = 1.0 / f64::from(args.nodes + 1);

        assert_eq!(
            collateral, 0,
            "adding a node moved replicas between old nodes"
        );
        let mut shrunk = nodes.clone();
        shrunk[17].state = NodeState::Out;
        let must = base.iter().filter(|s| s.contains(&17)).count() as f64 / total;
        let remove = moved_slots(&base, &table(pgs, r, &shrunk)) as f64 / total;

        let mut zone_lost = nodes.clone();
        for n in zone_lost.iter_mut().filter(|n| n.zone == zone(0)) {
            n.state = NodeState::Out;
        }
        let lost: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes[i].zone == zone(0))
            .collect();
        let must_zone = base
            .iter()
            .map(|s| s.iter().filter(|i| lost.contains(i)).count())
            .sum::<usize>() as f64
            / total;
        let zone_moved = moved_slots(&base, &table(pgs, r, &zone_lost)) as f64 / total;
        println!(
            "| {pgs} | {:.1} | {max:.2} | {min:.2} | {pmax:.2} | {:.3}% ({:.3}%) | {:.3}% ({:.3}%) | {:.2}% ({:.2}%) | {table_ms:.0} ms | {walks_ms:.0} ms |",
            total / f64::from(args.nodes),
            add * 100.0,
            add_opt * 100.0,
            remove * 100.0,
            must * 100.0,
            zone_moved * 100.0,
            must_zone * 100.0,
        );
    }
    print_control_costs(&args.pgs, r, &nodes);
    let record_bytes: usize = (0..args.nodes)
        .map(|id| node_record(id, &zone(id)).len())
        .sum();
    let one = record_bytes / args.nodes as usize;
    println!();
    println!("Map: one record per node (about {one} bytes of JSON each, with one native address; a node lists one per shard), plus a name and an alive key per node, the cluster record and the epoch; {} nodes: {:.0} KiB of records. No PG table is stored (placement is computed from the node list).\n", args.nodes, record_bytes as f64 / 1024.0);
    println!("etcd traffic per map change with a watch (not built yet: nodes poll today, docs/cluster.md): one transaction writing a node's record and the epoch, about {} bytes, and each of the {} watching nodes receives about as much: {:.0} KiB in all, independent of the PG count.", one + 64, args.nodes, ((one + 64) * (args.nodes as usize + 1)) as f64 / 1024.0);
}
