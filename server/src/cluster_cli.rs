//! `percore cluster init|status|drain|remove`: the cluster map in etcd.

use clap::{Args, Subcommand};
use percore_protocol::placement::NodeState;
use percore_protocol::routing::HASH_SEED_DEFAULT;
use percore_server::cluster::etcd::Etcd;
use percore_server::cluster::map::{self, Keys};

#[derive(Args, Debug)]
pub struct EtcdArgs {
    /// etcd endpoints (http://HOST:PORT,...).
    #[arg(long, env = "PERCORE_CLUSTER")]
    pub cluster: String,
    /// The cluster's name (its prefix in etcd).
    #[arg(long, env = "PERCORE_CLUSTER_NAME", default_value = "percore")]
    pub name: String,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Create the cluster in etcd (once).
    Init {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Copies of every object (fixed at creation).
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Placement groups (fixed at creation): keep replicas x pgs / nodes
        /// above about 100 at the largest planned size (docs/cluster.md).
        #[arg(long, default_value_t = 4096)]
        pgs: u32,
        /// A node down this long is marked out and its placement groups
        /// get other replicas.
        #[arg(long, default_value_t = map::DOWN_OUT_S_DEFAULT)]
        down_out_s: u64,
    },
    /// One line per node (name, state, addresses, placement groups), then
    /// the map's epoch.
    Status {
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Move a node's placement groups elsewhere; it keeps serving meanwhile.
    Drain {
        node: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Give a drained node placement groups again.
    Undrain {
        node: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Remove a stopped node from the map for good.
    Remove {
        node: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
}

fn open(args: &EtcdArgs) -> Result<(Etcd, Keys), String> {
    Ok((Etcd::new(&args.cluster)?, Keys::new(&args.name)?))
}

pub fn run(cmd: ClusterCommand) -> Result<(), String> {
    match cmd {
        ClusterCommand::Init {
            etcd,
            replicas,
            pgs,
            down_out_s,
        } => {
            let (client, keys) = open(&etcd)?;
            if !(1..=30 * 86_400).contains(&down_out_s) {
                return Err(format!("--down-out-s {down_out_s}: use 1 to 2592000"));
            }
            let c = map::init(
                &client,
                &keys,
                (replicas, pgs, down_out_s),
                HASH_SEED_DEFAULT,
            )?;
            println!(
                "cluster {} created: {} replicas, {} placement groups, seed {}, down nodes out after {} s; start nodes with `percore serve --cluster {} --node NAME --zone ZONE`",
                etcd.name, c.replicas, c.pgs, c.seed, c.down_out_s, etcd.cluster
            );
            Ok(())
        }
        ClusterCommand::Status { etcd } => {
            let (client, keys) = open(&etcd)?;
            print!("{}", status_text(&map::load(&client, &keys)?)?);
            Ok(())
        }
        ClusterCommand::Drain { node, etcd } => {
            let (client, keys) = open(&etcd)?;
            let changed = map::update_node(&client, &keys, &node, &|_, r| {
                Ok(
                    (r.node_state() != NodeState::Draining).then(|| map::NodeRecord {
                        state: NodeState::Draining.name().into(),
                        since_ms: map::now_ms(),
                        ..r.clone()
                    }),
                )
            })?;
            match changed {
                Some(_) => println!("node {node} is draining: it gets no new placement groups"),
                None => println!("node {node} was draining already"),
            }
            Ok(())
        }
        ClusterCommand::Undrain { node, etcd } => {
            let (client, keys) = open(&etcd)?;
            let changed = map::update_node(&client, &keys, &node, &|_, r| {
                Ok(
                    (r.node_state() == NodeState::Draining).then(|| map::NodeRecord {
                        // Marked down at once if it is not running.
                        state: NodeState::Up.name().into(),
                        since_ms: map::now_ms(),
                        // It gets its groups back, without the writes made
                        // while it drained: it catches up before it leads.
                        synced: false,
                        ..r.clone()
                    }),
                )
            })?;
            match changed {
                Some(_) => println!("node {node} takes placement groups again"),
                None => println!("node {node} was not draining"),
            }
            Ok(())
        }
        ClusterCommand::Remove { node, etcd } => {
            let (client, keys) = open(&etcd)?;
            let r = map::remove(&client, &keys, &node)?;
            println!("node {node} (id {}) removed from the map", r.id);
            Ok(())
        }
    }
}

/// The status lines: one per node, then the epoch and placement.
fn status_text(view: &map::View) -> Result<String, String> {
    let counts = view.placement_counts()?;
    let mut out = String::new();
    for ((n, _), (pgs, primaries)) in view.nodes.iter().zip(counts) {
        let lease = if view.alive.contains_key(&n.id) {
            "leased"
        } else {
            "no-lease"
        };
        out.push_str(&format!(
            "{} {} zone={} sync={} filled={} empty={} s3={} native={} admin={} shards={} pgs={pgs} primary={primaries} id={} {lease}\n",
            n.name,
            n.state,
            n.zone,
            if n.synced { "yes" } else { "no" },
            if n.filled() { "yes" } else { "no" },
            if n.empty.is_some() { "yes" } else { "no" },
            n.s3,
            n.native,
            n.admin,
            n.shards,
            n.id
        ));
    }
    for (key, why) in &view.unreadable {
        out.push_str(&format!("unreadable {key}: {why}\n"));
    }
    let catching_up: Vec<&str> = view
        .nodes
        .iter()
        .filter(|(n, _)| !n.synced && n.node_state() == NodeState::Up)
        .map(|(n, _)| n.name.as_str())
        .collect();
    out.push_str(&format!(
        "epoch {} nodes {} replicas {} pgs {}\n",
        view.epoch,
        view.nodes.len(),
        view.config.replicas,
        view.config.pgs
    ));
    if catching_up.is_empty() {
        out.push_str("backfill: none in progress\n");
    } else {
        out.push_str(&format!(
            "backfill: catching up: {}\n",
            catching_up.join(" ")
        ));
    }
    Ok(out)
}
