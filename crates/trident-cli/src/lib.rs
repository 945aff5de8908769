//! `trident`: train, distill, serve and load-test deep-learning models from one binary.
//!
//! The command line is a library so that a program can register its own layers and
//! activations (`trident_nn::custom`) and then be `trident`, with every command:
//! ```no_run
//! fn main() -> anyhow::Result<()> {
//!     trident_nn::custom::register_activation(
//!         "softsign",
//!         trident_nn::custom::elementwise("softsign", |x| x / (1.0 + x.abs()), |x| 1.0 / (1.0 + x.abs()).powi(2)),
//!     );
//!     trident_cli::run()
//! }
//! ```
//! (`examples/custom_layer` is such a program.)

mod bench;
mod export;
mod learn;
mod package;
mod quickstart;
mod rl;
mod serve;

use clap::{Parser, Subcommand};

/// Trident: a deep-learning platform that trains, distills and serves models.
#[derive(Debug, Parser)]
#[command(
    name = "trident",
    version,
    about = "Trident: train, distill, evaluate, export and serve deep-learning models from one binary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a Triton model repository over KServe v2 HTTP/REST and Triton's gRPC API, with Prometheus metrics.
    Serve(Box<serve::ServeArgs>),
    /// Train a model from a TOML configuration (checkpoints, metrics, TensorBoard, plots).
    Train(learn::TrainArgs),
    /// Distill: a frozen teacher checkpoint teaches the configured student (`[distill]`).
    Distill(learn::TrainArgs),
    /// Train a reinforcement-learning agent on a built-in environment (`[env]`, `[agent]`).
    Rl(rl::RlArgs),
    /// Evaluate a checkpoint or its ONNX export: per-class metrics, ROC-AUC, confusion matrix; forecast backtests, anomaly rankings, GAN sample reports.
    Eval(learn::EvalArgs),
    /// Predict with a checkpoint: classes (or reconstruction errors) of texts, images or table rows, a series' next values; one JSON line each.
    Predict(learn::PredictArgs),
    /// Export a checkpoint as an ONNX file (portable or ONNX Runtime-fused, fp32 or int8).
    Export(export::ExportArgs),
    /// Package a checkpoint for `trident serve`: ensemble, native pre-processing, ONNX model.
    Package(package::PackageArgs),
    /// Load-test a KServe v2 / Triton server: traffic phases, concurrency sweeps, request rates.
    Bench(Box<bench::BenchArgs>),
    /// Measure candidate serving configurations of a model and write the best config.pbtxt.
    Recommend(Box<bench::RecommendArgs>),
    /// The whole story on VADER: train, distill, evaluate, package, serve, load-test, report.
    Quickstart(quickstart::QuickstartArgs),
}

/// Commands whose output is read by another program (`trident predict … | head`) end
/// quietly when it stops reading, as Unix tools do, instead of panicking on a write to a
/// closed pipe (Rust ignores SIGPIPE, so the write fails). Not for the server, whose
/// sockets must not end the process.
fn quiet_on_closed_stdout() {
    // SAFETY: restores the default disposition of one signal, before any thread is started
    // by these commands; no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Parses `args` (the program's name first) as [`run`] would, running nothing: clap's error
/// names an unknown subcommand or flag, or a value it refuses. The documentation's commands
/// are checked with it.
pub fn check_args<I, T>(args: I) -> Result<(), clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args).map(|_| ())
}

/// The `trident` command line: parses the process's arguments and runs the command.
pub fn run() -> anyhow::Result<()> {
    // ONNX Runtime writes a usage database under $HOME/.cache unless this is set (the
    // environment option `with_telemetry(false)` does not stop it). Set here, before any
    // thread exists, so no other thread can be reading the environment meanwhile.
    if std::env::var_os("ORT_DISABLE_TELEMETRY").is_none() {
        std::env::set_var("ORT_DISABLE_TELEMETRY", "1");
    }
    // candle's own kernels on the calling thread (see there), also before any thread.
    trident_nn::runtime::candle_on_one_thread();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TRIDENT_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let command = Cli::parse().command;
    // The commands that run models set the allocator before any thread allocates: a thread's
    // first allocation picks its arena, and their loops run on rayon's workers
    // (`runtime::on_pool`).
    if matches!(
        command,
        Command::Train(_) | Command::Distill(_) | Command::Eval(_) | Command::Predict(_)
    ) {
        trident_nn::runtime::keep_freed_memory();
    }
    match command {
        Command::Serve(args) => serve::run(*args),
        Command::Train(args) => learn::train(args, false),
        Command::Distill(args) => learn::train(args, true),
        Command::Rl(args) => rl::run(args),
        Command::Eval(args) => {
            quiet_on_closed_stdout();
            trident_nn::runtime::on_pool(|| learn::eval(args))
        }
        Command::Predict(args) => {
            quiet_on_closed_stdout();
            trident_nn::runtime::on_pool(|| learn::predict(args))
        }
        Command::Export(args) => export::run(args),
        Command::Package(args) => package::run(args),
        Command::Bench(args) => bench::run(*args),
        Command::Recommend(args) => bench::recommend(*args),
        Command::Quickstart(args) => quickstart::run(args),
    }
}
