//! `trident-bench` against a real Trident server (in process, port 0) serving the `simple`
//! fixture model (two INT32[16] inputs, batch up to 8): each load mode, the outputs, the
//! stop conditions, Ctrl-C, and the errors a user meets first.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use trident_bench::inputs::{prepare, Encoding, Source};
use trident_bench::schedule::{Distribution, Phases};
use trident_bench::{report, Client, Load, Report, Settings, Target};
use trident_serve::{ControlMode, OnnxEngine, Repository, RepositoryOptions};

struct Server {
    url: String,
    grpc_url: String,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start_server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/simple");
    trident_bench::recommend::copy_dir(&fixtures, &dir.path().join("simple")).unwrap();
    let repo = Arc::new(Repository::new(RepositoryOptions {
        root: dir.path().to_path_buf(),
        mode: ControlMode::None,
        startup_models: vec![],
        cores: 1,
        cache: None,
        onnx_engine: OnnxEngine::Auto,
    }));
    repo.load_startup_models().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_url = format!("{}", grpc.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(trident_server::run(
        repo,
        Default::default(),
        Default::default(),
        trident_server::Listeners {
            http: listener,
            grpc: Some(grpc),
            metrics: None,
        },
        async {
            let _ = stopped.await;
        },
    ));
    Server {
        url,
        grpc_url,
        _dir: dir,
        _stop: stop,
    }
}

async fn target(url: &str, encoding: Encoding) -> Target {
    let client = Client::new(url, Duration::from_secs(10)).unwrap();
    let model = client.model("simple").await.unwrap();
    assert_eq!(model.max_batch_size, 8);
    let bodies = prepare(&model, &Source::Random, encoding, 2, &HashMap::new()).unwrap();
    Target {
        client,
        model: "simple".into(),
        bodies: Arc::new(bodies),
        batch: 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_protocol_reads_metadata_infers_and_reads_statistics() {
    let server = start_server().await;
    let client = Client::grpc(&server.grpc_url, Duration::from_secs(10)).unwrap();
    assert_eq!(client.protocol(), trident_bench::client::Protocol::Grpc);
    let model = client.model("simple").await.unwrap();
    assert_eq!(model.max_batch_size, 8);
    assert_eq!(model.inputs.len(), 2);
    let bodies = prepare(&model, &Source::Random, Encoding::Binary, 2, &HashMap::new()).unwrap();
    let t = Target {
        client: client.clone(),
        model: "simple".into(),
        bodies: Arc::new(bodies),
        batch: 2,
    };
    let r = run(t, Load::Concurrency(vec![2]), quick()).await;
    assert!(r.first_error.is_none(), "{:?}", r.first_error);
    assert_eq!(
        r.protocol,
        trident_bench::client::Protocol::Grpc,
        "the report names the protocol"
    );
    let row = &r.rows[0];
    assert!(row.latency.count > 0 && row.latency.errors == 0, "{row:?}");
    let s = row.server.expect("statistics over gRPC");
    assert!(s.requests > 0 && s.request_us < row.latency.mean_us, "{s:?}");
    let err = client.model("no_such_model").await.unwrap_err();
    assert!(
        format!("{err:#}").contains("Request for unknown model"),
        "{err:#}"
    );
    let json = prepare(&model, &Source::Random, Encoding::Json, 1, &HashMap::new()).unwrap();
    let err = client.infer("simple", &json[0]).await.unwrap_err();
    assert!(format!("{err:#}").contains("--encoding binary"), "{err:#}");
}

fn quick() -> Settings {
    Settings {
        window: Duration::from_millis(200),
        warmup: Duration::from_millis(100),
        max_windows: 3,
        ..Settings::default()
    }
}

async fn run(t: Target, load: Load, s: Settings) -> Report {
    trident_bench::run(t, load, s, std::future::pending(), |_| {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_sweep_measures_every_level_and_writes_perf_analyzer_csv() {
    let server = start_server().await;
    let r = run(
        target(&server.url, Encoding::Binary).await,
        Load::Concurrency(vec![1, 2]),
        quick(),
    )
    .await;
    assert_eq!(r.rows.len(), 2, "{r:#?}");
    assert!(r.first_error.is_none(), "{:?}", r.first_error);
    for (row, level) in r.rows.iter().zip([1.0, 2.0]) {
        assert_eq!(row.level, level);
        assert!(row.latency.count > 0 && row.latency.errors == 0, "{row:?}");
        assert!(
            (row.inferences_per_s - 2.0 * row.latency.throughput).abs() < 1e-6,
            "batch of 2"
        );
        let l = &row.latency;
        assert!(
            l.p50_us <= l.p90_us && l.p90_us <= l.p99_us && l.p99_us <= l.max_us,
            "{l:?}"
        );
        // The server's own statistics: it saw requests, and its time is within the client's.
        let s = row.server.expect("the server has the statistics API");
        assert!(s.requests > 0 && s.request_us > 0.0, "{s:?}");
        assert!(s.request_us < l.mean_us, "server {s:?} vs client {l:?}");
        assert!(row.windows >= 1 && row.windows <= 3);
    }
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    report::write_csv(&r, &csv).unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(&header[..13], &report::PERF_ANALYZER_COLUMNS);
    let first: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(first.len(), header.len());
    assert_eq!(first[0], "1");
    assert!(first[1].parse::<f64>().unwrap() > 0.0);
    assert_eq!(lines.count(), 1);
    let json = dir.path().join("out.json");
    report::write_json(&r, &json).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 2);
    assert!(report::table(&r).contains("concurrency"));
    let plots = trident_bench::plot::write(&r, &dir.path().join("plots")).unwrap();
    assert_eq!(plots.len(), 2);
    for p in plots {
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{}", p.display());
    }
    // The latency-by-percentile curve ends at the maximum.
    let curve = &r.rows[0].latency.curve;
    assert_eq!(curve.last().unwrap(), &(1.0, r.rows[0].latency.max_us));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phases_follow_the_schedule_and_summarise_each_phase() {
    let server = start_server().await;
    // Phase 1: 1 user, +60/min for 0.6 s (no spawn lands); phase 2: 3 users for 0.6 s.
    let phases = Phases::parse("1:60:0.6,3:0:0.6").unwrap();
    let s = Settings {
        warmup: Duration::ZERO,
        ..quick()
    };
    let r = run(target(&server.url, Encoding::Json).await, Load::Phases(phases), s).await;
    let levels: Vec<(Option<usize>, f64)> = r.rows.iter().map(|r| (r.phase, r.level)).collect();
    assert!(
        levels.contains(&(Some(0), 1.0)) && levels.contains(&(Some(1), 3.0)),
        "{levels:?}"
    );
    assert_eq!(r.phases.len(), 2, "{r:#?}");
    assert!(r
        .rows
        .iter()
        .all(|row| row.latency.count > 0 && row.latency.errors == 0));
    assert!(r.stopped.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rate_is_kept() {
    let server = start_server().await;
    let s = Settings {
        window: Duration::from_millis(500),
        ..quick()
    };
    let r = run(
        target(&server.url, Encoding::Binary).await,
        Load::Rate(vec![100.0], Distribution::Constant),
        s,
    )
    .await;
    let row = &r.rows[0];
    // 100 requests per second over ≥ 1 s of windows: within 30 % (a window's edges cut
    // in-flight requests, and the test shares the machine with others).
    assert!((row.latency.throughput - 100.0).abs() < 30.0, "{row:?}");
    assert_eq!(row.latency.errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_conditions_and_interrupt_end_the_run_with_what_was_measured() {
    let server = start_server().await;
    // A 1 µs p99 limit cannot be met: the sweep stops at its first level.
    let s = Settings {
        stop_latency_us: Some(1.0),
        ..quick()
    };
    let r = run(
        target(&server.url, Encoding::Binary).await,
        Load::Concurrency(vec![1, 2, 3]),
        s,
    )
    .await;
    assert_eq!(r.rows.len(), 1);
    let why = r.stopped.unwrap();
    assert!(
        why.contains("p99 latency") && why.contains("exceeded the limit of 0.00 ms"),
        "{why}"
    );

    let s = Settings {
        max_invocations_per_minute: Some(60.0),
        ..quick()
    };
    let r = run(
        target(&server.url, Encoding::Binary).await,
        Load::Concurrency(vec![1, 2]),
        s,
    )
    .await;
    assert_eq!(r.rows.len(), 1);
    assert!(r
        .stopped
        .unwrap()
        .contains("inferences per minute reached the maximum of 60"));

    // Ctrl-C (here: a timer) during a 60 s run returns the windows measured so far.
    let t = target(&server.url, Encoding::Binary).await;
    let load = Load::Phases(Phases::parse("1:0:60").unwrap());
    let interrupt = tokio::time::sleep(Duration::from_millis(700));
    let s = Settings {
        warmup: Duration::ZERO,
        ..quick()
    };
    let r = trident_bench::run(t, load, s, interrupt, |_| {}).await;
    assert!(r.interrupted);
    assert!(!r.rows.is_empty() && r.rows.len() <= 4, "{}", r.rows.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_and_unknown_model_are_named() {
    let server = start_server().await;
    let client = Client::new(&server.url, Duration::from_secs(5)).unwrap();
    let e = format!("{:#}", client.model("nope").await.unwrap_err());
    assert!(e.contains("model `nope`") && e.contains("404"), "{e}");
    // A port nobody listens on: bind one, then close it.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let client = Client::new(&closed.to_string(), Duration::from_secs(5)).unwrap();
    let e = format!("{:#}", client.model("simple").await.unwrap_err());
    assert!(e.contains("cannot reach the server at http://127.0.0.1:"), "{e}");
    assert!(Client::new("https://example.com", Duration::from_secs(1)).is_err());
}
