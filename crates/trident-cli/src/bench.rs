//! `trident bench`: load tests against a KServe v2 / Triton HTTP server.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use trident_bench::inputs::{self, Encoding, Source};
use trident_bench::schedule::{parse_range, parse_rates, Distribution, Phases};
use trident_bench::stats::check_percentile;
use trident_bench::{report, Client, Load, Settings, Target};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Server address: http://host:port or host:port (default: 127.0.0.1:8000 for
    /// HTTP, 127.0.0.1:8001 for gRPC).
    #[arg(short, long)]
    url: Option<String>,
    /// Protocol: http (KServe v2 REST) or grpc (Triton's gRPC), as perf_analyzer's -i.
    #[arg(short = 'i', long, value_enum, default_value_t = Proto::Http)]
    protocol: Proto,
    /// Model to load.
    #[arg(short, long)]
    model: String,
    /// Traffic phases `initial_users:spawn_per_minute:seconds[,…]` (closed loop), e.g.
    /// `2:2:60,10:0:120`: each phase starts with its initial users and adds users evenly.
    #[arg(long, group = "load")]
    phases: Option<String>,
    /// Concurrency sweep `start[:end[:step]]` (closed loop, like perf_analyzer).
    #[arg(long, group = "load")]
    concurrency_range: Option<String>,
    /// Open-loop request rate(s) per second `start[:end[:step]]`; latency is timed from
    /// each request's scheduled send time.
    #[arg(long, group = "load")]
    request_rate: Option<String>,
    /// Spacing of requests in request-rate mode.
    #[arg(long, value_enum, default_value_t = Dist::Constant)]
    distribution: Dist,
    /// The model's KServe v2 metadata (`{"inputs": [{"name", "datatype", "shape"}], …}`,
    /// optionally with `max_batch_size`) from a file, for servers without the metadata
    /// endpoint (TorchServe); default: ask the server.
    #[arg(long)]
    model_metadata: Option<PathBuf>,
    /// Input values: `random`, `zero`, or a JSON file in perf_analyzer's --input-data format.
    #[arg(long, default_value = "random")]
    input_data: String,
    /// Tensor encoding of requests.
    #[arg(long, value_enum, default_value_t = Enc::Binary)]
    encoding: Enc,
    /// Rows per request (inferences), for models with a batch dimension.
    #[arg(short, long, default_value_t = 1)]
    batch_size: u64,
    /// Variable dimensions of an input, without the batch: `NAME:d1,d2` (repeatable).
    #[arg(long)]
    shape: Vec<String>,
    /// Length of a measurement window, ms.
    #[arg(long, default_value_t = 5000)]
    measurement_interval: u64,
    /// Seconds excluded at the start of the run (phases) or of each level (sweeps).
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Stability: the last 3 windows' throughput and latency within ± this %.
    #[arg(long, default_value_t = 10.0)]
    stability_percentage: f64,
    /// Windows per level before giving up on stability.
    #[arg(long, default_value_t = 10)]
    max_trials: usize,
    /// Latency percentile the stability criterion compares (50, 90, 95, 99, 99.9; 0: mean).
    #[arg(long, default_value_t = 99.0)]
    percentile: f64,
    /// Stop when a window's (phases) or level's latency at --stop-percentile exceeds this, ms.
    #[arg(long)]
    stop_latency_ms: Option<f64>,
    /// The percentile of --stop-latency-ms.
    #[arg(long, default_value_t = 99.0)]
    stop_percentile: f64,
    /// Shorthand for --stop-latency-ms X --stop-percentile 99.
    #[arg(long, conflicts_with_all = ["stop_latency_ms"])]
    stop_p99_ms: Option<f64>,
    /// Stop when throughput reaches this many inferences per minute (SageMaker's MaxInvocations).
    #[arg(long)]
    max_invocations: Option<f64>,
    /// Stop when throughput stops growing by 5 % (over windows in phases, between levels in sweeps).
    #[arg(long)]
    stop_on_plateau: bool,
    /// Per-request timeout, ms (a timed-out request counts as an error).
    #[arg(long, default_value_t = 30_000)]
    request_timeout: u64,
    /// Threads of the load generator (keep it below the machine's cores; the server needs them).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// CSV of the rows, with perf_analyzer's column names.
    #[arg(short = 'f', long)]
    output: Option<PathBuf>,
    /// The whole report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Directory for PNG plots: latency by percentile per row, throughput against latency.
    #[arg(long)]
    plots: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Dist {
    Constant,
    Poisson,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Enc {
    Json,
    Binary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Proto {
    Http,
    Grpc,
}

fn parse_shapes(given: &[String]) -> Result<HashMap<String, Vec<i64>>> {
    given
        .iter()
        .map(|s| {
            let (name, dims) = s
                .rsplit_once(':')
                .with_context(|| format!("--shape {s}: expected NAME:d1,d2"))?;
            let dims = dims
                .split(',')
                .map(|d| d.trim().parse::<i64>())
                .collect::<std::result::Result<Vec<_>, _>>()
                .with_context(|| format!("--shape {s}: dimensions must be whole numbers"))?;
            Ok((name.to_string(), dims))
        })
        .collect()
}

pub fn run(args: BenchArgs) -> Result<()> {
    let load = match (&args.phases, &args.concurrency_range, &args.request_rate) {
        (Some(p), None, None) => Load::Phases(Phases::parse(p)?),
        (None, Some(c), None) => Load::Concurrency(parse_range("--concurrency-range", c)?),
        (None, None, Some(r)) => Load::Rate(
            parse_rates(r)?,
            match args.distribution {
                Dist::Constant => Distribution::Constant,
                Dist::Poisson => Distribution::Poisson,
            },
        ),
        _ => Load::Concurrency(vec![1]),
    };
    let (stop_latency_ms, stop_percentile) = match (args.stop_p99_ms, args.stop_latency_ms) {
        (Some(ms), _) => (Some(ms), 99.0),
        (None, ms) => (ms, args.stop_percentile),
    };
    if let Some(ms) = stop_latency_ms {
        if !(ms > 0.0 && ms.is_finite()) {
            bail!("the latency limit {ms} ms is impossible: give a positive number of milliseconds")
        }
    }
    if args.measurement_interval < 100 {
        bail!(
            "--measurement-interval {} ms: use at least 100 ms",
            args.measurement_interval
        )
    }
    if !(args.stability_percentage > 0.0 && args.stability_percentage < 100.0) {
        bail!(
            "--stability-percentage {}: use a value in (0, 100)",
            args.stability_percentage
        )
    }
    if !(args.warmup >= 0.0 && args.warmup.is_finite()) {
        bail!("--warmup {}: use seconds ≥ 0", args.warmup)
    }
    let settings = Settings {
        window: Duration::from_millis(args.measurement_interval),
        warmup: Duration::from_secs_f64(args.warmup),
        stable_windows: 3,
        tolerance: args.stability_percentage / 100.0,
        max_windows: args.max_trials.max(1),
        percentile: check_percentile("--percentile", args.percentile)?,
        stop_latency_us: stop_latency_ms.map(|ms| ms * 1000.0),
        stop_percentile: check_percentile("--stop-percentile", stop_percentile)?,
        max_invocations_per_minute: args.max_invocations,
        stop_on_plateau: args.stop_on_plateau,
        ..Settings::default()
    };
    let source = Source::parse(&args.input_data);
    let encoding = match args.encoding {
        Enc::Json => Encoding::Json,
        Enc::Binary => Encoding::Binary,
    };
    let shapes = parse_shapes(&args.shape)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .thread_name("trident-bench")
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        let target = connect(&args, &source, encoding, &shapes).await?;
        let interrupt = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        anyhow::Ok(trident_bench::run(target, load, settings, interrupt, |line| eprintln!("{line}")).await)
    })?;
    print!("{}", report::table(&report));
    if let Some(path) = &args.output {
        report::write_csv(&report, path)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.json {
        report::write_json(&report, path)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plots {
        for path in trident_bench::plot::write(&report, dir)? {
            eprintln!("wrote {}", path.display());
        }
    }
    if report.rows.is_empty() {
        bail!("nothing was measured")
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct RecommendArgs {
    /// The model repository.
    #[arg(long)]
    model_repository: PathBuf,
    /// The model whose configuration to tune.
    #[arg(short, long)]
    model: String,
    /// Latency SLO: the p99 a configuration must stay within, ms.
    #[arg(long)]
    p99_ms: f64,
    /// Price of one server per hour (any currency), for the cost per 1M inferences.
    #[arg(long)]
    price_per_hour: Option<f64>,
    /// Inferences per second to provision for: how many servers each configuration needs.
    #[arg(long)]
    target_rps: Option<f64>,
    /// Dynamic batching queue delays to try, µs (comma-separated); batching off is always tried.
    #[arg(long, default_value = "100,1000", value_delimiter = ',')]
    queue_delays: Vec<u64>,
    /// Preferred batch sizes to try with the batching settings kept (comma-separated; each
    /// alone; sizes above the model's max_batch_size are skipped), or `none`.
    #[arg(long, default_value = "4,16")]
    preferred_batch_sizes: String,
    /// Instance counts to try (comma-separated), the first with every batching setting.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    instances: Vec<u32>,
    /// ONNX engines to compare first (`ort`, `tract`; comma-separated). Default: the one the
    /// model's configuration and the server pick.
    #[arg(long, value_delimiter = ',')]
    engines: Vec<String>,
    /// Highest concurrency of the ladder 1, 2, 4, …
    #[arg(long, default_value_t = 16)]
    max_concurrency: u32,
    /// Protocols to compare, `http,grpc`: the search runs on the first, the settings it
    /// keeps are measured again over the others.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "http")]
    protocols: Vec<Proto>,
    /// Input values: `random`, `zero`, or a JSON file in perf_analyzer's format.
    #[arg(long, default_value = "random")]
    input_data: String,
    /// Length of a measurement window, ms.
    #[arg(long, default_value_t = 1000)]
    measurement_interval: u64,
    /// Windows per level before giving up on stability.
    #[arg(long, default_value_t = 5)]
    max_trials: usize,
    /// The whole search as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn recommend(args: RecommendArgs) -> Result<()> {
    use trident_bench::recommend::{ranked, rewrite_config, search, Search};
    if !(args.p99_ms > 0.0 && args.p99_ms.is_finite()) {
        bail!(
            "--p99-ms {}: the SLO must be a positive number of milliseconds",
            args.p99_ms
        )
    }
    if args.instances.is_empty() || args.instances.contains(&0) {
        bail!("--instances: give counts ≥ 1")
    }
    let preferred_batch_sizes: Vec<u32> = match args.preferred_batch_sizes.trim() {
        "" | "none" => Vec::new(),
        list => list
            .split(',')
            .map(|p| p.trim().parse::<u32>().ok().filter(|&p| p >= 1))
            .collect::<Option<_>>()
            .with_context(|| {
                format!("--preferred-batch-sizes {list}: give sizes ≥ 1, comma-separated, or `none`")
            })?,
    };
    if let Some(e) = args
        .engines
        .iter()
        .find(|e| !matches!(e.as_str(), "ort" | "tract"))
    {
        bail!("--engines: unknown engine `{e}` (ort or tract)")
    }
    let config_path = args.model_repository.join(&args.model).join("config.pbtxt");
    let config = std::fs::read_to_string(&config_path)
        .with_context(|| format!("model `{}`: cannot read {}", args.model, config_path.display()))?;
    let s = Search {
        trident: std::env::current_exe()?,
        repository: args.model_repository.clone(),
        model: args.model.clone(),
        p99_us: args.p99_ms * 1000.0,
        queue_delays_us: args.queue_delays.clone(),
        instances: args.instances.clone(),
        preferred_batch_sizes,
        engines: args.engines.clone(),
        protocols: args
            .protocols
            .iter()
            .map(|p| match p {
                Proto::Http => trident_bench::client::Protocol::Http,
                Proto::Grpc => trident_bench::client::Protocol::Grpc,
            })
            .collect(),
        max_concurrency: args.max_concurrency.max(1),
        settings: Settings {
            window: Duration::from_millis(args.measurement_interval.max(100)),
            warmup: Duration::from_millis(500),
            max_windows: args.max_trials.max(1),
            ..Settings::default()
        },
        source: Source::parse(&args.input_data),
        price_per_hour: args.price_per_hour,
        target_rps: args.target_rps,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let outcomes = runtime.block_on(search(&s, |line| eprintln!("{line}")))?;
    println!(
        "{:<48} {:>10} {:>8} {:>8} {:>11} {:>8} {:>9} {:>10} {:>9}",
        "configuration",
        "infer/s",
        "p50 ms",
        "p99 ms",
        "concurrency",
        "CPU %",
        "RSS MiB",
        "cost/1M",
        "servers"
    );
    for o in ranked(&outcomes) {
        let (t, p50, p99, c) = match &o.best {
            Some(b) => (
                format!("{:.1}", b.inferences_per_s),
                format!("{:.2}", b.latency.p50_us as f64 / 1000.0),
                format!("{:.2}", b.latency.p99_us as f64 / 1000.0),
                format!("{}", b.level),
            ),
            None => ("SLO missed".into(), "–".into(), "–".into(), "–".into()),
        };
        println!(
            "{:<48} {t:>10} {p50:>8} {p99:>8} {c:>11} {:>8.0} {:>9.0} {:>10} {:>9}",
            o.candidate.name(),
            o.server_cpu_pct,
            o.server_peak_rss_mib,
            o.cost_per_million.map_or("–".into(), |v| format!("{v:.4}")),
            o.instances_for_target.map_or("–".into(), |v| v.to_string()),
        );
    }
    if let Some(path) = &args.json {
        report::write_atomically(path, &serde_json::to_vec_pretty(&outcomes)?)?;
    }
    let Some(best) = ranked(&outcomes).into_iter().find(|o| o.best.is_some()) else {
        bail!(
            "no configuration kept p99 within {} ms at concurrency 1",
            args.p99_ms
        )
    };
    let out = config_path.with_file_name("config.recommended.pbtxt");
    report::write_atomically(&out, rewrite_config(&config, &best.candidate)?.as_bytes())?;
    println!("best: {} -> wrote {}", best.candidate.name(), out.display());
    Ok(())
}

/// The client for `--url` / `-i`, the model's metadata (from the server or
/// `--model-metadata`), the prepared bodies, and one first request that must succeed.
async fn connect(
    args: &BenchArgs,
    source: &Source,
    encoding: Encoding,
    shapes: &HashMap<String, Vec<i64>>,
) -> Result<Target> {
    let timeout = Duration::from_millis(args.request_timeout);
    let client = match (args.protocol, &args.url) {
        (Proto::Http, url) => Client::new(url.as_deref().unwrap_or("http://127.0.0.1:8000"), timeout)?,
        (Proto::Grpc, url) => Client::grpc(url.as_deref().unwrap_or("127.0.0.1:8001"), timeout)?,
    };
    let model = match &args.model_metadata {
        None => client.model(&args.model).await.map_err(|e| {
            if format!("{e:#}").contains("404") {
                e.context(
                    "the server has no KServe v2 metadata for this model (a server without \
                     the metadata endpoint, such as TorchServe, needs --model-metadata FILE)",
                )
            } else {
                e
            }
        })?,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--model-metadata {}", path.display()))?;
            let meta: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--model-metadata {}: not JSON", path.display()))?;
            trident_bench::client::ModelInfo::from_metadata(&args.model, &meta, None)
                .with_context(|| format!("--model-metadata {}", path.display()))?
        }
    };
    let bodies = inputs::prepare(&model, source, encoding, args.batch_size, shapes)?;
    // One request before the load: a model that cannot answer fails here, clearly.
    client
        .infer(&args.model, &bodies[0])
        .await
        .with_context(|| format!("a first request to model `{}` failed", args.model))?;
    Ok(Target {
        client,
        model: args.model.clone(),
        bodies: Arc::new(bodies),
        batch: args.batch_size,
    })
}
