//! PNG plots of a report: latency by percentile for each row, and throughput against
//! latency across rows. Drawn to a temporary name and renamed.

use crate::run::{Report, Row};
use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const COLORS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];

/// Writes `latency_percentiles.png` and `throughput_latency.png` into `dir`; returns their
/// paths.
pub fn write(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("--plots {}", dir.display()))?;
    let rows: Vec<_> = report
        .rows
        .iter()
        .filter(|r| !r.latency.curve.is_empty())
        .collect();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let unit = match report.mode {
        "phases" => "users",
        "concurrency" => "concurrency",
        _ => "rate/s",
    };
    let a = dir.join("latency_percentiles.png");
    draw(&a, |root| {
        // x: "nines" — quantile q sits at -log10(1 - q) (50 % → 0.3, 99 % → 2, 99.99 % → 4);
        // the maximum is drawn at 5.
        let x = |q: f64| if q >= 1.0 { 5.0 } else { -(1.0 - q).log10() };
        let y_max = rows.iter().map(|r| r.latency.max_us).max().unwrap_or(1) as f64 / 1000.0;
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("{} latency by percentile", report.model),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0f64..5.2, 0.0..y_max * 1.05)?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency (ms)")
            .x_labels(6)
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() > 0.01 {
                    return String::new();
                }
                match v.round() as i32 {
                    0 => "0".into(),
                    5 => "max".into(),
                    n => format!("{}", 100.0 - 100.0 * 10f64.powi(-n)),
                }
            })
            .draw()?;
        // At most six lines: spread over the rows.
        let step = rows.len().div_ceil(COLORS.len()).max(1);
        let series = rows
            .iter()
            .step_by(step)
            .map(|r| {
                let pts = r
                    .latency
                    .curve
                    .iter()
                    .map(|&(q, us)| (x(q), us as f64 / 1000.0))
                    .collect();
                (format!("{unit} {}", r.level), pts)
            })
            .collect();
        lines(&mut chart, series)
    })?;
    let b = dir.join("throughput_latency.png");
    draw(&b, |root| {
        let x_max = rows.iter().map(|r| r.inferences_per_s).fold(1.0, f64::max);
        let y_max = rows.iter().map(|r| r.latency.p99_us).max().unwrap_or(1) as f64 / 1000.0;
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("{}: throughput against latency ({unit})", report.model),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max * 1.05, 0.0..y_max * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("inferences / s")
            .y_desc("latency (ms)")
            .draw()?;
        lines(
            &mut chart,
            vec![
                (
                    "p50".into(),
                    against_throughput(rows.iter().copied(), |r| r.latency.p50_us),
                ),
                (
                    "p99".into(),
                    against_throughput(rows.iter().copied(), |r| r.latency.p99_us),
                ),
            ],
        )
    })?;
    Ok(vec![a, b])
}

/// Several models' load tests in one chart: p50 and p99 latency against throughput, a
/// line of its own colour for each model and percentile, both axes logarithmic so a
/// large model at tens of inferences per second and a small one at thousands read side by
/// side. Writes `path`.
pub fn compare(path: &Path, title: &str, models: &[(&str, &[Row])]) -> Result<()> {
    let rows = || models.iter().flat_map(|(_, rows)| rows.iter());
    if rows().next().is_none() {
        anyhow::bail!("{}: no load-test rows to plot", path.display());
    }
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (f64::MAX, 0.0f64, f64::MAX, 0.0f64);
    for r in rows() {
        x_lo = x_lo.min(r.inferences_per_s);
        x_hi = x_hi.max(r.inferences_per_s);
        y_lo = y_lo.min(r.latency.p50_us as f64 / 1000.0);
        y_hi = y_hi.max(r.latency.p99_us as f64 / 1000.0);
    }
    // Log axes need positive bounds; pad by a factor either side.
    let (x_lo, y_lo) = (x_lo.max(1e-3) / 1.5, y_lo.max(1e-3) / 1.5);
    let (x_hi, y_hi) = (x_hi.max(x_lo * 2.0) * 1.5, y_hi.max(y_lo * 2.0) * 1.5);
    draw(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (x_lo..x_hi).log_scale().with_key_points(ticks_1_2_5(x_lo, x_hi)),
                (y_lo..y_hi).log_scale().with_key_points(ticks_1_2_5(y_lo, y_hi)),
            )?;
        chart
            .configure_mesh()
            .x_desc("inferences / s (log)")
            .y_desc("latency (ms, log)")
            .x_label_formatter(&tick_label)
            .y_label_formatter(&tick_label)
            .draw()?;
        let series = models
            .iter()
            .flat_map(|(name, rows)| {
                [
                    (
                        format!("{name} p50"),
                        against_throughput(rows.iter(), |r| r.latency.p50_us),
                    ),
                    (
                        format!("{name} p99"),
                        against_throughput(rows.iter(), |r| r.latency.p99_us),
                    ),
                ]
            })
            .collect();
        lines(&mut chart, series)
    })
}

/// 1, 2 and 5 times each power of ten within `lo..=hi`: labels a log axis every few
/// millimetres whatever its span (plotters' own log ticks are powers of ten only, one
/// label on an axis from 300 to 5,000).
fn ticks_1_2_5(lo: f64, hi: f64) -> Vec<f64> {
    let (first, last) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    (first..=last)
        .flat_map(|e| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(e)))
        .filter(|v| (lo..=hi).contains(v))
        .collect()
}

/// A tick value with as many decimals as it needs (0.2, 5, 2000).
fn tick_label(v: &f64) -> String {
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// (inferences/s, latency in ms) for each row, the latency picked by `us`.
fn against_throughput<'r>(rows: impl Iterator<Item = &'r Row>, us: fn(&Row) -> u64) -> Vec<(f64, f64)> {
    rows.map(|r| (r.inferences_per_s, us(r) as f64 / 1000.0))
        .collect()
}

/// Draws each named series as a line with its points, in its own colour, and the legend.
fn lines<'a, X, Y>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    series: Vec<(String, Vec<(f64, f64)>)>,
) -> Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, (name, pts)) in series.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw(path: &Path, f: impl FnOnce(&Area) -> Result<()>) -> Result<()> {
    let tmp = path.with_extension("tmp.png");
    {
        let root = BitMapBackend::new(&tmp, (900, 550)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        f(&root).with_context(|| format!("{}: drawing failed", path.display()))?;
        root.present().map_err(|e| anyhow!("{}: {e}", path.display()))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axis_ticks_are_one_two_five_within_the_range() {
        assert_eq!(ticks_1_2_5(150.0, 6000.0), [200.0, 500.0, 1000.0, 2000.0, 5000.0]);
        assert_eq!(ticks_1_2_5(0.3, 3.0), [0.5, 1.0, 2.0]);
        let labels: Vec<String> = [0.2, 0.5, 5.0, 2000.0].iter().map(tick_label).collect();
        assert_eq!(labels, ["0.2", "0.5", "5", "2000"]);
    }
}
