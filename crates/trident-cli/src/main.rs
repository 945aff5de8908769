//! `trident`: train, distill, serve and load-test deep-learning models from one binary.

mod serve;

use clap::{Parser, Subcommand};

/// Trident: a deep-learning platform that trains, distills and serves models.
#[derive(Debug, Parser)]
#[command(name = "trident", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a Triton model repository over KServe v2 HTTP, with Prometheus metrics.
    Serve(serve::ServeArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TRIDENT_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Serve(args) => serve::run(args),
    }
}
