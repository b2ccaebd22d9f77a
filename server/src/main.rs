//! The `percore` binary.

use clap::{Parser, Subcommand};
use percore_server::config::{ServeArgs, ServerConfig};

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
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PERCORE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Serve(args) => ServerConfig::resolve(&args, &|k| std::env::var(k).ok())
            .and_then(percore_server::server::serve),
    };
    if let Err(msg) = result {
        eprintln!("percore: error: {msg}");
        std::process::exit(1);
    }
}
