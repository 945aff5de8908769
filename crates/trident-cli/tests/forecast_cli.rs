//! `[data] kind = "series"` and `[model] kind = "forecaster"` end to end on a series made
//! here: training on sliding windows, the rolling-origin backtest with its baselines,
//! `eval` (also of the exported graph), `predict`, `package`, exact resume, and the errors
//! for configurations that cannot work.

mod common;
use common::{assert_same_checkpoints, failed, ok, trident};

use std::path::{Path, PathBuf};

/// 400 values: a trend, a period-10 season and a little noise (a positive series).
fn write_series(dir: &Path) -> PathBuf {
    let mut s = 99u64;
    let mut text = String::from("t,value\n");
    for t in 0..400 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let noise = ((s >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.4;
        let v = 50.0 + 0.05 * t as f64 + 8.0 * (2.0 * std::f64::consts::PI * t as f64 / 10.0).sin() + noise;
        text += &format!("{t},{v:.4}\n");
    }
    let path = dir.join("series.csv");
    std::fs::write(&path, text).unwrap();
    path
}

fn config(dir: &Path, run: &str, data: &str, model: &str) -> PathBuf {
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 1
[data]
kind = "series"
file = "series.csv"
window = 20
horizon = 5
test = 30
val = 20
season = 10
{data}
[loader]
batch_size = 16
num_workers = 0
[model]
kind = "forecaster"
{model}
[train]
epochs = 15
lr = 3e-3
log_every = 5
"#
    );
    let path = dir.join(format!("{run}.toml"));
    std::fs::write(&path, cfg).unwrap();
    path
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// (model, naive, seasonal naive) MAE of a backtest's metrics.json.
fn maes(m: &serde_json::Value) -> Vec<f64> {
    m["backtest"]["forecasts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["metrics"]["mae"].as_f64().unwrap())
        .collect()
}

/// Exports run `run`'s best checkpoint and repeats its backtest with the graph in tract
/// and (with the `ort` feature) ONNX Runtime: the model's MAE within 1e-3 of the
/// checkpoint's, the baselines' equal.
fn export_forecasts_alike(d: &Path, run: &str) {
    let best = d.join(run).join("best");
    let bs = best.to_str().unwrap();
    let onnx = format!("{run}.onnx");
    ok(&trident(&["export", "--model", bs, "--out", &onnx], d));
    let mae = maes(&json(&d.join(run).join("test/metrics.json")));
    for engine in ["tract", "ort"] {
        if engine == "ort" && !cfg!(feature = "ort") {
            continue;
        }
        ok(&trident(
            &["eval", "--model", bs, "--onnx", &onnx, "--engine", engine],
            d,
        ));
        let theirs = maes(&json(&best.join("eval-test-onnx/metrics.json")));
        assert!(
            (theirs[0] - mae[0]).abs() < 1e-3 * mae[0],
            "{run} {engine}: {theirs:?} vs {mae:?}"
        );
        assert_eq!(theirs[1..], mae[1..], "{run} {engine}: the baselines");
    }
}

#[test]
fn a_forecaster_beats_the_naive_forecasts_and_every_tool_agrees() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_series(d);
    let cfg = config(d, "f", "stride = 10", "hidden = [32]");
    let log = String::from_utf8_lossy(&trident(&["train", "--config", cfg.to_str().unwrap()], d).stderr)
        .into_owned();
    // 350 training values → windows of 20 + 5 every value; 20 validation targets; 30 test.
    assert!(log.contains("data 326 train / 16 val / 26 test"), "{log}");
    let m = json(&d.join("f/test/metrics.json"));
    let b = &m["backtest"];
    assert_eq!(b["origins"], serde_json::json!([370, 380, 390]));
    assert_eq!(m["actual"].as_array().unwrap().len(), 30);
    let mae = maes(&m);
    assert!(
        mae[0] < mae[2] && mae[0] < mae[1],
        "the model learns trend and season: MAE {mae:?}\n{log}"
    );
    assert!(d.join("f/test/forecast.png").is_file() && d.join("f/loss.png").is_file());
    let report = json(&d.join("f/report.json"));
    assert_eq!(
        report["backtest"]["forecasts"][0]["metrics"]["mae"],
        b["forecasts"][0]["metrics"]["mae"]
    );

    // `eval` repeats the backtest from the checkpoint; the exported graph forecasts alike.
    let best = d.join("f/best");
    let bs = best.to_str().unwrap();
    let out = ok(&trident(&["eval", "--model", bs], d));
    assert!(
        out.contains("backtest: the last 30 values from 3 origin(s) every 10"),
        "{out}"
    );
    assert_eq!(maes(&json(&best.join("eval-test/metrics.json"))), mae);
    export_forecasts_alike(d, "f");

    // `predict`: the next 5 values after a file's series, or after values given inline.
    let out = ok(&trident(&["predict", "--model", bs, "series.csv"], d));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let f: Vec<f64> = v["forecast"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(f.len(), 5);
    // Near the continuation of the generating curve (t = 400..404), far from a constant.
    for (k, y) in f.iter().enumerate() {
        let t = 400.0 + k as f64;
        let truth = 50.0 + 0.05 * t + 8.0 * (2.0 * std::f64::consts::PI * t / 10.0).sin();
        assert!((y - truth).abs() < 3.0, "t = {t}: {y} vs {truth}");
    }
    let err = failed(&trident(&["predict", "--model", bs, "1,2,3"], d));
    assert!(err.contains("3 values") && err.contains("last 20"), "{err}");

    // `package`: one ONNX model taking raw values, no pre-processing step.
    ok(&trident(
        &["package", "--model", bs, "--repository", "repo", "--name", "fc"],
        d,
    ));
    let config = std::fs::read_to_string(d.join("repo/fc/config.pbtxt")).unwrap();
    assert!(
        config.contains("\"values\"") && config.contains("\"forecast\""),
        "{config}"
    );
    assert!(!d.join("repo/fc_preprocess").exists());
}

#[test]
fn refit_trains_a_model_per_origin_and_eval_reuses_them() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_series(d);
    let cfg = config(d, "r", "stride = 10\nrefit = true", "hidden = [16]");
    ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let m = json(&d.join("r/test/metrics.json"));
    assert_eq!(m["backtest"]["refit"], true);
    // One run per origin, each trained on the history before it (the first is the main
    // run's own split).
    for o in [370, 380, 390] {
        let run = d.join(format!("r/refit/o{o}"));
        assert!(run.join("best/model.safetensors").is_file(), "{}", run.display());
        let card = json(&run.join("best/trident.json"));
        assert!(card["input"]["mean"].is_number());
    }
    let mae = maes(&m);
    assert!(mae[0] < mae[2], "{mae:?}");
    // eval finds the finished runs (it would train a missing one) and repeats the backtest.
    let t0 = std::time::Instant::now();
    let out = ok(&trident(&["eval", "--model", "r/best"], d));
    assert!(out.contains("the model trained again up to each origin"), "{out}");
    assert_eq!(maes(&json(&d.join("r/best/eval-test/metrics.json"))), mae);
    eprintln!("eval of a refit run: {:.1} s", t0.elapsed().as_secs_f64());
    ok(&trident(&["export", "--model", "r/best", "--out", "r.onnx"], d));
    let err = failed(&trident(&["eval", "--model", "r/best", "--onnx", "r.onnx"], d));
    assert!(err.contains("data.refit"), "{err}");
}

#[test]
fn recurrent_forecasters_train_and_resume_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_series(d);
    let runs = [
        ("lstm", "normalize = \"season\""),
        ("gru", "log = true"),
        ("gru", "normalize = \"season-trend\""),
    ];
    for (i, (net, data)) in runs.iter().enumerate() {
        let model = format!("net = \"{net}\"\nhidden = [8, 8]");
        let whole = config(d, &format!("{net}{i}-whole"), data, &model);
        ok(&trident(&["train", "--config", whole.to_str().unwrap()], d));
        let m = json(&d.join(format!("{net}{i}-whole/test/metrics.json")));
        assert!(maes(&m)[0].is_finite());
        let parts = config(d, &format!("{net}{i}-parts"), data, &model);
        let p = parts.to_str().unwrap();
        ok(&trident(&["train", "--config", p, "--stop-after-steps", "30"], d));
        ok(&trident(&["train", "--config", p, "--resume"], d));
        assert_same_checkpoints(
            &d.join(format!("{net}{i}-whole")),
            &d.join(format!("{net}{i}-parts")),
        );
    }
    // Exported, each forecasts the backtest as its checkpoint does, in both engines.
    for (i, (net, _)) in runs.iter().enumerate() {
        export_forecasts_alike(d, &format!("{net}{i}-whole"));
    }
}

/// 400 values of a period-10 profile that is flat but for a spike at phases 5 and 6, with
/// a little noise: two values before a forecast do not tell where in the period it falls
/// (a run of flat values), its calendar position does.
fn write_profile(dir: &Path) {
    let mut s = 7u64;
    let mut text = String::from("t,value\n");
    for t in 0..400 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let noise = ((s >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.2;
        let v = 10.0 + if matches!(t % 10, 5 | 6) { 5.0 } else { 0.0 } + noise;
        text += &format!("{t},{v:.4}\n");
    }
    std::fs::write(dir.join("profile.csv"), text).unwrap();
}

#[test]
fn calendar_features_place_a_forecast_in_its_period_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_profile(d);
    let run = |name: &str, data: &str, model: &str| -> Vec<f64> {
        let cfg = config(d, name, data, model);
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("series.csv", "profile.csv")
            .replace("window = 20", "window = 2")
            .replace("horizon = 5", "horizon = 1")
            .replace("epochs = 15", "epochs = 40");
        std::fs::write(&cfg, text).unwrap();
        ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
        maes(&json(&d.join(name).join("test/metrics.json")))
    };
    let without = run("plain", "normalize = \"global\"", "hidden = [16]");
    let with = run("cal", "normalize = \"global\"\ncalendar = [10]", "hidden = [16]");
    let lstm = run(
        "cal-lstm",
        "normalize = \"global\"\ncalendar = [10]",
        "net = \"lstm\"\nhidden = [8]",
    );
    // One-step forecasts of the last 30 values: without the position the spike's start
    // cannot be foreseen; with it the model is near the noise, as the seasonal naive is.
    assert!(with[0] < 0.5 * without[0], "with {with:?}, without {without:?}");
    assert!(lstm[0] < 0.5 * without[0], "lstm {lstm:?}, without {without:?}");
    assert_eq!(
        json(&d.join("cal/best/trident.json"))["input"]["calendar"],
        serde_json::json!([10])
    );

    // The exported graphs take the position as a second input and forecast alike.
    for name in ["cal", "cal-lstm"] {
        export_forecasts_alike(d, name);
    }
    ok(&trident(
        &[
            "package",
            "--model",
            "cal/best",
            "--repository",
            "repo",
            "--name",
            "cal",
        ],
        d,
    ));
    let pbtxt = std::fs::read_to_string(d.join("repo/cal/config.pbtxt")).unwrap();
    assert!(
        pbtxt.contains("\"position\"") && pbtxt.contains("TYPE_INT64"),
        "{pbtxt}"
    );

    // `predict` places a file's next value in the calendar by the file's length (400:
    // phase 0, flat); bare values have no position and are refused.
    let out = ok(&trident(&["predict", "--model", "cal/best", "profile.csv"], d));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let f = v["forecast"][0].as_f64().unwrap();
    assert!((f - 10.0).abs() < 1.0, "{f}");
    let err = failed(&trident(&["predict", "--model", "cal/best", "10,10"], d));
    assert!(err.contains("calendar") && err.contains("CSV file"), "{err}");
    let err = failed(&trident(
        &[
            "train",
            "--config",
            config(d, "bad", "calendar = [1]", "").to_str().unwrap(),
        ],
        d,
    ));
    assert!(err.contains("data.calendar: period 1"), "{err}");
}

#[test]
fn series_configurations_that_cannot_work_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_series(d);
    let run = |data: &str, model: &str, name: &str| {
        let cfg = config(d, name, data, model);
        failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d))
    };
    let cfg = config(d, "a", "normalize = \"season\"", "hidden = [4]");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("season = 10", "season = 3");
    std::fs::write(&cfg, text).unwrap();
    let e = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(e.contains("data.horizon (5) <= data.season (3)"), "{e}");
    let cfg = config(d, "a2", "normalize = \"season-trend\"", "hidden = [4]");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("window = 20", "window = 10");
    std::fs::write(&cfg, text).unwrap();
    let e = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(e.contains("data.season (10) < data.window (10)"), "{e}");
    // A value below zero where the log is asked for.
    let series = std::fs::read_to_string(d.join("series.csv")).unwrap();
    let mut lines: Vec<String> = series.lines().map(String::from).collect();
    lines[3] = "2,-4".into();
    std::fs::write(d.join("neg.csv"), lines.join("\n") + "\n").unwrap();
    let cfg = config(d, "b", "log = true", "hidden = [4]");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("series.csv", "neg.csv");
    std::fs::write(&cfg, text).unwrap();
    let e = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(e.contains("value -4 (row 3) is not positive"), "{e}");
    let e = run("", "hidden = [4]\n[anomaly]\nnormal = [\"x\"]", "c");
    assert!(e.contains("[anomaly]"), "{e}");
    let e = run("", "net = \"lstm\"\nhidden = [4, 8]", "d");
    assert!(e.contains("one width for every layer"), "{e}");
    let e = run("", "net = \"gru\"\nhidden = [4]\nactivation = \"tanh\"", "f");
    assert!(e.contains("model.activation is not used here"), "{e}");
    let cfg = config(d, "e", "", "hidden = [4]");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("test = 30", "test = 390");
    std::fs::write(&cfg, text).unwrap();
    let e = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(e.contains("leave no training window"), "{e}");
}

/// Trains the shipped `examples/forecast/<name>.toml` on its real series
/// (`scripts/fetch-data.sh series`) in a temporary folder: its test metrics and log, or
/// `None` when the data is absent (unless TRIDENT_SERIES_REQUIRED is set: CI sets it).
fn train_example(name: &str) -> Option<(serde_json::Value, String)> {
    train_example_seeded(name, 0)
}

/// [`train_example`] with the config's `seed = 0` set to `seed`.
fn train_example_seeded(name: &str, seed: u64) -> Option<(serde_json::Value, String)> {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cfg = common::real_example(
        &format!("examples/forecast/{name}.toml"),
        &format!("series/{name}.csv"),
        "series",
        "TRIDENT_SERIES_REQUIRED",
        d,
    )?;
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.contains("\nseed = 0\n"),
        "{name}: the example's seed is not 0"
    );
    std::fs::write(&cfg, text.replace("\nseed = 0\n", &format!("\nseed = {seed}\n"))).unwrap();
    let log = common::ok_log(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    Some((json(&d.join(name).join("test/metrics.json")), log))
}

/// The shipped sunspots example on the real series (`scripts/fetch-data.sh series`):
/// rolling one-step forecasts of 1990–2008 below AR(9)'s MAE of 11.9 (measured: 9.9).
/// Skipped when the data is absent, unless TRIDENT_SERIES_REQUIRED is set (CI sets it).
#[test]
fn the_sunspots_example_beats_the_autoregression() {
    let Some((m, log)) = train_example("sunspots") else {
        return;
    };
    assert_eq!(
        m["backtest"]["origins"].as_array().unwrap().len(),
        19,
        "one origin per year of 1990–2008"
    );
    let mae = maes(&m);
    assert!(mae[0] < 11.9, "MAE {mae:?}\n{log}");
}

/// The shipped taylor example on the real series, trained with seeds 0–4: the last week
/// from one origin, against the weekly seasonal naive's 370.1 MW (the anchor; reproduced
/// exactly by the baseline column in every run). What holds over seeds and product
/// libraries is level with the anchor, not below it: one run's MAE spreads over 305–468 MW,
/// and the mean over seeds 0–9 was 346.8–369.0 with OpenBLAS, MKL and the gemm crate
/// (docs/RESULTS.md). So the test guards that level: the five seeds' mean within 5 % of the
/// anchor (measured 344–360 on seeds 0–4), which a broken forecaster (the naive forecast
/// scores 6,691) or a lost calendar feature (mean 390.7 without) would miss.
#[test]
fn the_taylor_example_is_level_with_the_weekly_seasonal_naive_over_five_seeds() {
    // Five trainings at once, each in its own folder, in the seeds' order.
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..5u64)
            .map(|seed| s.spawn(move || train_example_seeded("taylor", seed)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let Some(runs) = results.into_iter().collect::<Option<Vec<_>>>() else {
        return; // the data is absent (and not required)
    };
    let per_seed: Vec<Vec<f64>> = runs.iter().map(|(m, _)| maes(m)).collect();
    for (seed, mae) in per_seed.iter().enumerate() {
        assert!(
            (mae[2] - 370.1).abs() < 0.1,
            "seed {seed}: seasonal naive {mae:?}"
        );
    }
    let model: Vec<f64> = per_seed.iter().map(|mae| mae[0]).collect();
    let mean = model.iter().sum::<f64>() / model.len() as f64;
    assert!(
        mean < 1.05 * 370.1,
        "mean MAE {mean:.1} over seeds 0-4 ({model:?}) is more than 5 % above the seasonal naive's 370.1\n{}",
        runs[0].1
    );
}

/// The shipped AirPassengers example on the real series: 1958–1960 from one origin below
/// SARIMA's MAE of 33.7 (measured: 27.7 on this seed, 21.3–27.7 over seeds 0–4), with its
/// normalisation's own forecast ("last year plus the latest change", 17.56) printed beside.
#[test]
fn the_airline_example_beats_sarima() {
    let Some((m, log)) = train_example("airline") else {
        return;
    };
    let mae = maes(&m);
    // The seasonal naive reproduces the anchor (60.08); the fourth row is the offset alone.
    assert!((mae[2] - 60.08).abs() < 0.01, "seasonal naive {mae:?}");
    assert_eq!(mae.len(), 4, "{mae:?}");
    assert!((mae[3] - 17.56).abs() < 0.01, "season + last change {mae:?}");
    assert!(mae[0] < 33.7, "MAE {mae:?}\n{log}");
}
