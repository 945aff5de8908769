//! A forecaster's test: the rolling-origin backtest over the held-out end of the series,
//! with the naive and seasonal-naive forecasts from the same origins beside it, the
//! metrics (MAE, RMSE, MAPE, sMAPE, MASE), `metrics.json` and the forecast-against-actual
//! plot (`forecast.png`).

use crate::config::{DataConfig, RunConfig};
use crate::data::Model;
use anyhow::{bail, Context};
use serde::Serialize;
use std::path::Path;
use trident_data::series::{naive, seasonal_naive, ForecastMetrics};
use trident_zoo::card::SeriesNormalize;
use trident_zoo::SeriesSpec;

/// Raw values of the next `horizon` after a raw window, the first of them at the given row
/// of the series (its calendar position): the checkpoint, or its exported graph.
pub type ForecastFn<'a> = dyn Fn(&[f64], usize) -> anyhow::Result<Vec<f64>> + 'a;

/// The checkpoint's forecast of the values after `window` (raw values, oldest first), the
/// first of them at row `position` of the series.
pub fn model_forecast(
    model: &Model,
    spec: &SeriesSpec,
    window: &[f64],
    position: usize,
) -> anyhow::Result<Vec<f64>> {
    let Some(f) = model.net.get::<trident_nn::forecast::Forecaster>() else {
        bail!("not a forecaster")
    };
    let (x, offsets) = spec.encode(window, position);
    let x = trident_nn::Tensor::from_vec(x, (1, spec.inputs()), &trident_nn::Device::Cpu)?;
    let y = f
        .forward(&x, &trident_nn::Ctx::eval())?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(spec.decode(&y, &offsets))
}

/// `lead` values after `history` (the series from its first row), `horizon` at a time,
/// each chunk's forecasts fed back as the next chunk's inputs.
pub fn forecast_ahead(
    forecast: &ForecastFn,
    spec: &SeriesSpec,
    history: &[f64],
    lead: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut seen = history.to_vec();
    let mut out = Vec::with_capacity(lead);
    while out.len() < lead {
        if seen.len() < spec.window {
            bail!(
                "a forecast needs the last {} values; the history has {}",
                spec.window,
                seen.len()
            );
        }
        let next = forecast(&seen[seen.len() - spec.window..], seen.len())?;
        let take = next.len().min(lead - out.len());
        out.extend_from_slice(&next[..take]);
        seen.extend_from_slice(&next[..take]);
    }
    Ok(out)
}

/// One forecaster's figures.
#[derive(Debug, Serialize)]
pub struct Scored {
    pub name: String,
    pub metrics: ForecastMetrics,
    #[serde(skip)]
    pub values: Vec<f64>,
}

/// The backtest of a series' test part.
#[derive(Debug, Serialize)]
pub struct Backtest {
    pub test_values: usize,
    /// The model was trained again up to each origin.
    pub refit: bool,
    pub origins: Vec<usize>,
    pub stride: usize,
    pub horizon: usize,
    pub season: usize,
    /// The model, then the naive and seasonal-naive forecasts from the same origins (and,
    /// with `season-trend` normalisation, that normalisation's own forecast).
    pub forecasts: Vec<Scored>,
    #[serde(skip)]
    pub actual: Vec<f64>,
}

/// The model's forecasts of `lead` values after the history up to `origin`: the trained
/// model's (update), or a model trained again up to the origin (refit).
pub type OriginFn<'a> = dyn Fn(usize, &[f64], usize) -> anyhow::Result<Vec<f64>> + 'a;

/// [`OriginFn`] of one model at every origin (`update`): its forecasts of the actual
/// history, fed back beyond the horizon.
pub fn updating<'a>(
    forecast: &'a ForecastFn<'a>,
    spec: &'a SeriesSpec,
) -> impl Fn(usize, &[f64], usize) -> anyhow::Result<Vec<f64>> + 'a {
    move |_, history, lead| forecast_ahead(forecast, spec, history, lead)
}

/// Forecasts `values[test_start..]` from origins every `stride` values (each from the
/// actual history before it) with `forecast` and the two baselines.
pub fn backtest(
    forecast: &OriginFn,
    spec: &SeriesSpec,
    values: &[f64],
    test_start: usize,
    stride: usize,
    season: usize,
) -> anyhow::Result<Backtest> {
    let n = values.len();
    let origins: Vec<usize> = (test_start..n).step_by(stride.max(1)).collect();
    let mut runs: Vec<(String, Vec<f64>)> = vec![
        ("model".into(), Vec::new()),
        ("naive".into(), Vec::new()),
        (format!("seasonal naive (m = {season})"), Vec::new()),
    ];
    // With `season-trend` the model's outputs are corrections to a forecast of its own:
    // that forecast alone (every output 0) is printed too, so what the network adds shows.
    let trend = spec.normalize == SeriesNormalize::SeasonTrend;
    let offsets_only = |window: &[f64], position: usize| {
        let (_, offsets) = spec.encode(window, position);
        Ok(spec.decode(&vec![0.0; offsets.len()], &offsets))
    };
    if trend {
        runs.push(("season + last change".into(), Vec::new()));
    }
    for &o in &origins {
        let lead = stride.min(n - o);
        let history = &values[..o];
        runs[0].1.extend(forecast(o, history, lead)?);
        runs[1].1.extend(naive(history, lead));
        runs[2].1.extend(seasonal_naive(history, lead, season));
        if trend {
            runs[3]
                .1
                .extend(forecast_ahead(&offsets_only, spec, history, lead)?);
        }
    }
    let actual = values[test_start..].to_vec();
    let train = &values[..test_start];
    Ok(Backtest {
        refit: false,
        test_values: actual.len(),
        stride,
        horizon: spec.horizon,
        season,
        forecasts: runs
            .into_iter()
            .map(|(name, v)| Scored {
                metrics: ForecastMetrics::new(&actual, &v, train, season),
                name,
                values: v,
            })
            .collect(),
        origins,
        actual,
    })
}

impl Backtest {
    /// The table for the terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "backtest: the last {} values from {} origin(s) every {} (horizon {}{}; {})",
            self.test_values,
            self.origins.len(),
            self.stride,
            self.horizon,
            if self.stride > self.horizon {
                ", forecasts fed back beyond it"
            } else {
                ""
            },
            if self.refit {
                "the model trained again up to each origin"
            } else {
                "not refitted"
            }
        )];
        out.push(format!(
            "  {:<26} {:>10} {:>10} {:>8} {:>8} {:>7}",
            "", "MAE", "RMSE", "MAPE %", "sMAPE %", "MASE"
        ));
        for s in &self.forecasts {
            let m = &s.metrics;
            out.push(format!(
                "  {:<26} {:>10.3} {:>10.3} {:>8} {:>8.2} {:>7}",
                s.name,
                m.mae,
                m.rmse,
                m.mape.map_or("-".into(), |v| format!("{v:.2}")),
                m.smape,
                m.mase.map_or("-".into(), |v| format!("{v:.3}"))
            ));
        }
        out
    }

    /// `metrics.json` and `forecast.png` (the end of the series, the forecasts over it) in
    /// `out`.
    pub fn write(&self, out: &Path, values: &[f64], column: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
        let json = serde_json::json!({
            "backtest": self,
            "actual": self.actual,
            "forecast": self
                .forecasts
                .iter()
                .map(|s| (s.name.clone(), serde_json::json!(s.values)))
                .collect::<serde_json::Map<_, _>>(),
        });
        crate::write_atomic(
            &out.join("metrics.json"),
            serde_json::to_string_pretty(&json)?.as_bytes(),
        )?;
        let n = values.len();
        let start = n - self.test_values;
        let from = start.saturating_sub((4 * self.test_values).max(3 * self.season));
        let points = |range: std::ops::Range<usize>, v: &[f64]| -> Vec<(f64, f64)> {
            range.zip(v).map(|(i, &y)| (i as f64, y)).collect()
        };
        let mut lines = vec![("actual".to_string(), points(from..n, &values[from..]))];
        for s in &self.forecasts {
            lines.push((s.name.clone(), points(start..n, &s.values)));
        }
        let lines: Vec<(&str, Vec<(f64, f64)>)> =
            lines.iter().map(|(n, p)| (n.as_str(), p.clone())).collect();
        trident_train::plot::xy_chart(
            &out.join("forecast.png"),
            &format!("{column}: forecasts over the last {} values", self.test_values),
            "index",
            column,
            &lines,
        )?;
        Ok(())
    }
}

/// Whether `c` trains the model again up to each backtest origin.
pub fn refit(c: &RunConfig) -> bool {
    matches!(c.data, DataConfig::Series { refit: true, .. })
}

/// The backtest settings of a run: (test values, stride, season).
pub fn settings(c: &RunConfig) -> anyhow::Result<(usize, usize, usize)> {
    let DataConfig::Series {
        test,
        stride,
        season,
        horizon,
        ..
    } = &c.data
    else {
        bail!("not series data")
    };
    Ok((*test, stride.unwrap_or(*horizon), *season))
}

/// The backtest of `c`'s series with `forecast`, written to `out`; returns its lines.
pub fn report(
    c: &RunConfig,
    spec: &SeriesSpec,
    values: &[f64],
    forecast: &OriginFn,
    out: &Path,
) -> anyhow::Result<(Backtest, Vec<String>)> {
    let (test, stride, season) = settings(c)?;
    if test >= values.len() {
        bail!("data.test = {test}: the series has only {} values", values.len());
    }
    let mut b = backtest(forecast, spec, values, values.len() - test, stride, season)?;
    b.refit = refit(c);
    b.write(out, values, &spec.column)?;
    let lines = b.lines();
    Ok((b, lines))
}
