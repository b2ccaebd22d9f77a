//! The `percore` binary.

mod cli;
mod cluster_cli;
mod users_cli;

use clap::{Parser, Subcommand};
use percore_server::boot::config::{ServeArgs, ServerConfig};

#[derive(Parser)]
#[command(
    name = "percore",
    version,
    about = "Thread-per-core, shared-nothing object storage server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Check this machine for percore: kernel and io_uring features,
    /// memlock, huge pages, CPU/NUMA plan, NIC IRQ and XPS placement, the
    /// data directory's filesystem and O_DIRECT. Each finding with its fix.
    Doctor {
        /// Data directory to check (default ./percore-data).
        #[arg(long, default_value = "./percore-data")]
        data: std::path::PathBuf,
        /// Shard count to plan for (default: one per physical core).
        #[arg(long)]
        shards: Option<usize>,
        /// CPU list to plan for, e.g. 2-17.
        #[arg(long)]
        cpus: Option<String>,
    },
    /// Check a data directory offline (stop the server first): every record
    /// header and payload CRC, seals, torn tails, and that every live
    /// object's extents exist. Read-only. Exit 0 clean, 1 damage, 2 error.
    Fsck {
        /// Data directory (default ./percore-data).
        #[arg(long, default_value = "./percore-data")]
        data: std::path::PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The cluster map in etcd: init, status, drain, remove.
    #[command(subcommand)]
    Cluster(cluster_cli::ClusterCommand),
    /// Users and their keys (through the admin endpoint).
    #[command(subcommand)]
    User(users_cli::UserCommand),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

fn main() {
    let cli = Cli::parse();
    use tracing_subscriber::prelude::*;
    let initial = std::env::var("PERCORE_LOG").unwrap_or_else(|_| "info".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&initial).unwrap_or_else(|e| {
        eprintln!("percore: PERCORE_LOG='{initial}' is not a valid filter ({e}); using info");
        "info".into()
    });
    let (filter, reload) = tracing_subscriber::reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    let _ = percore_server::frontend::admin::LOG_FILTER_INITIAL.set(initial);
    let _ = percore_server::frontend::admin::LOG_FILTER_RELOAD.set(Box::new(move |f: &str| {
        let filter = tracing_subscriber::EnvFilter::try_new(f).map_err(|e| e.to_string())?;
        reload.reload(filter).map_err(|e| e.to_string())
    }));
    let result = match cli.command {
        Command::Client(cmd) => cli::run(cmd),
        Command::User(cmd) => users_cli::run(cmd),
        Command::Cluster(cmd) => cluster_cli::run(cmd),
        Command::Serve(args) => ServerConfig::resolve(&args, &|k| std::env::var(k).ok())
            .and_then(percore_server::boot::serve),
        Command::Fsck { data, json } => {
            std::process::exit(percore_server::tools::fsck::run_cli(&data, json));
        }
        Command::Doctor { data, shards, cpus } => {
            let cpus = match cpus
                .as_deref()
                .map(percore_server::boot::topology::parse_cpu_list)
            {
                Some(Err(e)) => {
                    eprintln!("percore: error: --cpus: {e}");
                    std::process::exit(2);
                }
                other => other.map(Result::unwrap),
            };
            let (text, worst) = percore_server::tools::doctor::run(&data, shards, cpus.as_deref());
            print!("{text}");
            if worst == percore_server::tools::doctor::Level::Fail {
                std::process::exit(1);
            }
            Ok(())
        }
    };
    if let Err(msg) = result {
        eprintln!("percore: error: {msg}");
        std::process::exit(1);
    }
}
