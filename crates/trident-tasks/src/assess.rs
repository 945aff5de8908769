//! After training: the best checkpoint on the test split — a classifier's metrics and
//! confusion matrix, an autoencoder's reconstruction report, a forecaster's backtest (with
//! `data.refit`, a model trained again up to each origin), a series autoencoder's window
//! ranking — and the run's `report.json` (parameters, size, latency, epoch times, peak
//! memory; a distillation's student beside its teacher).

use crate::config::{DataConfig, RunConfig};
use crate::data::{self as task, InputSpec, Model, ModelCard, Splits};
use crate::{anomaly, forecast, report, write_atomic};
use anyhow::Context;
use std::path::Path;
use trident_data::Dataset;
use trident_train::{evaluate, plot, Trainer};

/// The student (and teacher) on the test split from the best checkpoint: the test report,
/// and `report.json` with parameters, size, latency and the distillation's ratios.
pub fn test_and_report<D: Dataset + 'static>(
    c: &RunConfig,
    model: &Model,
    teacher: Option<&Model>,
    splits: &Splits<D>,
    summary: &trident_train::trainer::FitSummary,
    peak_rss: Option<u64>,
) -> anyhow::Result<()> {
    let (dir, classes) = (&c.run.dir, &model.card.classes);
    let best = dir.join("best");
    trident_train::checkpoint::load_weights(&best, &model.params)?;
    if let InputSpec::Series(spec) = &model.card.input {
        if model.net.is::<trident_nn::autoencoder::Autoencoder>() {
            let out = dir.join("test");
            for l in series_anomaly(c, model, spec, &out)? {
                eprintln!("{l}");
            }
            return Ok(());
        }
        return forecast_test(c, model, spec, summary, peak_rss);
    }
    // The best weights through a twin that records no graph (its forward passes free
    // each activation once read).
    let twin = model.inference_twin()?;
    let t0 = std::time::Instant::now();
    let ev = evaluate(&twin, &splits.test, classes.len())?;
    let eval_seconds = t0.elapsed().as_secs_f64();
    let out = dir.join("test");
    let first = splits.test.epoch(0).next().context("the test split is empty")??;
    let best_epoch = summary.state.best_epoch.map_or(0, |e| e + 1);
    match &ev.report {
        Some(r) => {
            write_report(&out, &ev, classes)?;
            eprintln!(
                "test (best epoch {best_epoch}): accuracy {:.4}  macro-F1 {:.4}  loss {:.4}  → {}",
                r.accuracy,
                r.macro_f1,
                ev.loss,
                out.display()
            );
        }
        None => {
            let lines = write_reconstruction(c, &twin, &ev, &first, &out)?;
            eprintln!("test (best epoch {best_epoch}) → {}", out.display());
            for l in lines {
                eprintln!("{l}");
            }
        }
    }
    let student = report::facts(
        &twin,
        &ev,
        eval_seconds,
        &first,
        Some(&best.join("model.safetensors")),
    )?;
    let distill = match (teacher, &c.distill) {
        (Some(teacher), Some(d)) => {
            let t0 = std::time::Instant::now();
            let tev = evaluate(teacher, &splits.test, classes.len())?;
            let t = report::facts(
                teacher,
                &tev,
                t0.elapsed().as_secs_f64(),
                &first,
                Some(&d.teacher.join("model.safetensors")),
            )?;
            Some(report::DistillFacts {
                mode: format!("{:?}", d.mode).to_lowercase(),
                loss: format!("{:?}", d.loss),
                param_ratio: student.params as f64 / t.params.max(1) as f64,
                accuracy_retained_pct: retained(student.test_accuracy, t.test_accuracy),
                macro_f1_retained_pct: retained(student.test_macro_f1, t.test_macro_f1),
                latency_speedup: t.latency.p50_ms / student.latency.p50_ms.max(1e-12),
                teacher: t,
            })
        }
        _ => None,
    };
    let epochs: Vec<f64> = summary.records.iter().map(|r| r.epoch_seconds).collect();
    let rep = report::RunReport {
        student,
        median_epoch_seconds: trident_train::profile::median(&epochs),
        epoch_seconds: epochs,
        peak_rss_bytes: peak_rss,
        distill,
    };
    write_atomic(
        &dir.join("report.json"),
        serde_json::to_string_pretty(&rep)?.as_bytes(),
    )?;
    eprintln!(
        "report → {}\n{}",
        dir.join("report.json").display(),
        rep.summary()
    );
    Ok(())
}

/// An autoencoder on a series: the test part's windows ranked by reconstruction error
/// against `[anomaly] column`'s marks, written to `out`; returns the lines to show.
pub fn series_anomaly(
    c: &RunConfig,
    model: &Model,
    spec: &trident_zoo::SeriesSpec,
    out: &Path,
) -> anyhow::Result<Vec<String>> {
    let (series, test_start) = task::read_series(c, &spec.column)?;
    let column = c.anomaly.as_ref().and_then(|a| a.column.as_deref()).context(
        "an autoencoder on a series needs [anomaly] column = \"<the 0/1 column of anomalous values>\"",
    )?;
    let marks = trident_data::series::Series::read(&series.file, Some(column))?.values;
    let (ranking, errors) = anomaly::rank_series(model, spec, &series.values, &marks, test_start)?;
    ranking.write(out, &errors, test_start, &marks)?;
    Ok(ranking.lines())
}

/// The backtest of `c`'s series, written to `out`: by `model` at every origin, or with
/// `data.refit` by a model trained again up to each origin.
pub fn backtest_report(
    c: &RunConfig,
    model: &Model,
    spec: &trident_zoo::SeriesSpec,
    values: &[f64],
    out: &Path,
) -> anyhow::Result<(forecast::Backtest, Vec<String>)> {
    let f = |w: &[f64], at: usize| forecast::model_forecast(model, spec, w, at);
    let update = forecast::updating(&f, spec);
    let refit = |origin: usize, history: &[f64], lead: usize| -> anyhow::Result<Vec<f64>> {
        let (m, spec_o) = train_up_to(c, values.len(), origin)?;
        let g = |w: &[f64], at: usize| forecast::model_forecast(&m, &spec_o, w, at);
        forecast::forecast_ahead(&g, &spec_o, history, lead)
    };
    let by: &forecast::OriginFn = if forecast::refit(c) { &refit } else { &update };
    forecast::report(c, spec, values, by, out)
}

/// `refit`: the forecaster trained again on the series up to `origin` (the run's
/// settings; its own scale fitted on that history), in `<run>/refit/o<origin>`; a run
/// found there finished is reused, an interrupted one resumed. `n`: the series' length.
fn train_up_to(c: &RunConfig, n: usize, origin: usize) -> anyhow::Result<(Model, trident_zoo::SeriesSpec)> {
    let mut c = c.clone();
    let dir = c.run.dir.join("refit").join(format!("o{origin}"));
    if let DataConfig::Series { test, .. } = &mut c.data {
        *test = n - origin;
    }
    c.run.dir = dir.clone();
    let s = task::series_splits(&c, None)?;
    let card = ModelCard {
        model: c.model.clone(),
        classes: Vec::new(),
        input: InputSpec::Series(s.spec.clone()),
    };
    let model = Model::build(&card, c.run.seed, None)?;
    let mut trainer = Trainer::new(c.train.clone(), Vec::new(), &dir);
    trainer.progress = false;
    trainer.checkpoint_files = model.checkpoint_files()?;
    let hash = format!("{:?}|{:?}|{:?}|{}|refit", c.data, c.loader, c.model, c.run.seed);
    let resume = dir.join("last").exists();
    trainer.fit(&model, &s.splits.train, s.splits.val.as_ref(), resume, &hash)?;
    trident_train::checkpoint::load_weights(&dir.join("best"), &model.params)?;
    Ok((model, s.spec))
}

/// A forecaster's test: the backtest of the held-out end of the series (test/), and
/// `report.json` with its figures, parameters and epoch times.
fn forecast_test(
    c: &RunConfig,
    model: &Model,
    spec: &trident_zoo::SeriesSpec,
    summary: &trident_train::trainer::FitSummary,
    peak_rss: Option<u64>,
) -> anyhow::Result<()> {
    let dir = &c.run.dir;
    let (series, _) = task::read_series(c, &spec.column)?;
    let out = dir.join("test");
    let (b, lines) = backtest_report(c, model, spec, &series.values, &out)?;
    eprintln!(
        "test (best epoch {}) → {}",
        summary.state.best_epoch.map_or(0, |e| e + 1),
        out.display()
    );
    for l in &lines {
        eprintln!("{l}");
    }
    let epochs: Vec<f64> = summary.records.iter().map(|r| r.epoch_seconds).collect();
    let rep = serde_json::json!({
        "params": model.param_count(),
        "size_bytes": std::fs::metadata(dir.join("best/model.safetensors")).ok().map(|m| m.len()),
        "backtest": b,
        "median_epoch_seconds": trident_train::profile::median(&epochs),
        "epoch_seconds": epochs,
        "peak_rss_bytes": peak_rss,
    });
    write_atomic(
        &dir.join("report.json"),
        serde_json::to_string_pretty(&rep)?.as_bytes(),
    )?;
    Ok(())
}

/// A student's share of its teacher's figure, in % (both are classifiers: the config
/// refuses to distill anything else).
fn retained(student: Option<f64>, teacher: Option<f64>) -> f64 {
    100.0 * student.unwrap_or(f64::NAN) / teacher.unwrap_or(f64::NAN).max(1e-12)
}

/// An autoencoder's report of a split in `out` (with `[anomaly]`, normal against the
/// rest), and for images its reconstructions of `first`'s images; returns the lines to show.
pub fn write_reconstruction(
    c: &RunConfig,
    model: &Model,
    ev: &trident_train::trainer::Evaluation,
    first: &task::Batch,
    out: &Path,
) -> anyhow::Result<Vec<String>> {
    let normal = c.normal_classes(&model.card.classes)?;
    let r = anomaly::ReconstructionReport::new(ev, &model.card.classes, normal.as_deref());
    r.write(out, ev, normal.as_deref())?;
    anomaly::reconstruction_grid(model, first, &out.join("reconstructions.png"))?;
    Ok(r.lines())
}

/// A classifier's report of a split: `metrics.json` and `confusion.png` in `out`.
pub fn write_report(
    out: &Path,
    ev: &trident_train::trainer::Evaluation,
    classes: &[String],
) -> anyhow::Result<()> {
    let report = ev.classification()?;
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let json = serde_json::json!({
        "examples": ev.labels.len(),
        "loss": ev.loss,
        "classes": classes,
        "report": ev.report,
    });
    write_atomic(
        &out.join("metrics.json"),
        serde_json::to_string_pretty(&json)?.as_bytes(),
    )?;
    plot::confusion_matrix(&out.join("confusion.png"), &report.confusion, classes)?;
    Ok(())
}
