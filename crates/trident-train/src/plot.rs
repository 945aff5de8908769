//! PNG plots of a run: loss and accuracy curves per epoch, and confusion matrices.
//! Each file is drawn to a temporary name and renamed, so a reader never sees half a plot.

use crate::metrics::ConfusionMatrix;
use crate::record::EpochRecord;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Why a plot was not written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The drawing backend failed.
    #[error("{}: drawing failed: {message}", path.display())]
    Draw {
        /// The plot's file.
        path: PathBuf,
        /// What the backend said.
        message: String,
    },
    /// The finished file could not be put in place.
    #[error("{}: {source}", path.display())]
    Io {
        /// The plot's file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn draw_err(path: &Path, e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw {
        path: path.into(),
        message: e.to_string(),
    }
}

fn publish(tmp: &Path, path: &Path) -> Result<(), PlotError> {
    std::fs::rename(tmp, path).map_err(|source| PlotError::Io {
        path: path.into(),
        source,
    })
}

/// `loss.png` (train and validation loss; a GAN's two losses) and, for a classifier,
/// `accuracy.png` in `dir`; a GAN judged each epoch also gets `fd.png`.
pub fn training_curves(dir: &Path, records: &[EpochRecord]) -> Result<(), PlotError> {
    if records.is_empty() {
        return Ok(());
    }
    let series = |f: &dyn Fn(&EpochRecord) -> Option<f64>| -> Vec<(f64, f64)> {
        records
            .iter()
            .filter_map(|r| f(r).map(|v| ((r.epoch + 1) as f64, v)))
            .collect()
    };
    let figure = |name: &'static str| move |r: &EpochRecord| r.metric(name);
    let generator = series(&figure("generator_loss"));
    if generator.is_empty() {
        line_chart(
            &dir.join("loss.png"),
            "loss",
            &[
                ("train", series(&|r| Some(r.train_loss()))),
                ("validation", series(&|r| r.metric("val_loss"))),
            ],
        )?;
    } else {
        // A GAN: both networks' losses, and the judge's distance when there is one.
        line_chart(
            &dir.join("loss.png"),
            "loss",
            &[
                ("discriminator", series(&|r| Some(r.train_loss()))),
                ("generator", generator),
            ],
        )?;
        let fd = series(&figure("val_fd"));
        if !fd.is_empty() {
            line_chart(
                &dir.join("fd.png"),
                "Fréchet distance to validation images",
                &[("generated", fd)],
            )?;
        }
    }
    let greedy = series(&figure("eval_return"));
    if !greedy.is_empty() {
        // An agent: its returns, training episodes and greedy evaluation.
        line_chart(
            &dir.join("returns.png"),
            "return",
            &[
                ("training episodes", series(&figure("episodic_return"))),
                ("greedy evaluation", greedy),
            ],
        )?;
    }
    if records
        .iter()
        .all(|r| r.metric("train_accuracy").is_none() && r.metric("val_accuracy").is_none())
    {
        // A model without classes (reconstruction): its loss is the whole story.
        return Ok(());
    }
    line_chart(
        &dir.join("accuracy.png"),
        "accuracy",
        &[
            ("train", series(&|r| r.metric("train_accuracy"))),
            ("validation", series(&|r| r.metric("val_accuracy"))),
            ("validation macro-F1", series(&|r| r.metric("val_macro_f1"))),
        ],
    )
}

fn line_chart(path: &Path, y_label: &str, lines: &[(&str, Vec<(f64, f64)>)]) -> Result<(), PlotError> {
    chart(
        path,
        &format!("{y_label} per epoch"),
        ("epoch", y_label),
        lines,
        true,
    )
}

/// Line and group colours in order: distinct for up to seven series (a forecast plot has
/// the actual values, the model and up to three baselines).
const PALETTE: [RGBColor; 7] = [
    BLUE,
    RED,
    GREEN,
    MAGENTA,
    RGBColor(255, 140, 0),
    RGBColor(0, 170, 170),
    RGBColor(90, 90, 90),
];

/// Lines of (x, y) points, e.g. a series and forecasts of its end.
pub fn xy_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[(&str, Vec<(f64, f64)>)],
) -> Result<(), PlotError> {
    chart(path, title, (x_label, y_label), lines, false)
}

/// Epoch curves (`markers`: a dot per point, x from 0.5) or any lines.
fn chart(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    lines: &[(&str, Vec<(f64, f64)>)],
    markers: bool,
) -> Result<(), PlotError> {
    let tmp = path.with_extension("tmp.png");
    {
        let root = BitMapBackend::new(&tmp, (800, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
        let points = lines.iter().flat_map(|(_, s)| s.iter());
        let (mut x_min, mut x_max) = if markers {
            (0.5, 1.5)
        } else {
            (f64::INFINITY, f64::NEG_INFINITY)
        };
        let (mut y_min, mut y_max) = (f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in points {
            x_max = x_max.max(x + if markers { 0.5 } else { 0.0 });
            x_min = x_min.min(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
        if !y_min.is_finite() {
            (x_min, x_max, y_min, y_max) = (0.0, 1.0, 0.0, 1.0);
        }
        if x_max <= x_min {
            x_max = x_min + 1.0;
        }
        let pad = ((y_max - y_min) * 0.1).max(1e-3);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_min..x_max, (y_min - pad)..(y_max + pad))
            .map_err(|e| draw_err(path, e))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(|e| draw_err(path, e))?;
        for (i, (name, s)) in lines.iter().enumerate().filter(|(_, (_, s))| !s.is_empty()) {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(s.iter().copied(), color.stroke_width(2)))
                .map_err(|e| draw_err(path, e))?
                .label(*name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
            if markers {
                chart
                    .draw_series(s.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| draw_err(path, e))?;
            }
        }
        let corner = legend_corner(
            lines.iter().flat_map(|(_, s)| s.iter().copied()),
            (x_min, x_max),
            (y_min - pad, y_max + pad),
        );
        chart
            .configure_series_labels()
            .position(corner)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| draw_err(path, e))?;
        root.present().map_err(|e| draw_err(path, e))?;
    }
    publish(&tmp, path)
}

/// The corner of the plot where the legend hides the fewest points: each corner's box is
/// the outer 40 % of the width and 35 % of the height (a rising series leaves the upper
/// left free, a falling loss curve the upper right); ties go in the order upper right,
/// upper left, lower right, lower left.
fn legend_corner(
    points: impl Iterator<Item = (f64, f64)>,
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
) -> SeriesLabelPosition {
    let (w, h) = ((x1 - x0).max(f64::MIN_POSITIVE), (y1 - y0).max(f64::MIN_POSITIVE));
    // Upper right, upper left, lower right, lower left.
    let mut hidden = [0usize; 4];
    for (x, y) in points {
        let (fx, fy) = ((x - x0) / w, (y - y0) / h);
        let (left, right, low, high) = (fx < 0.4, fx > 0.6, fy < 0.35, fy > 0.65);
        for (i, inside) in [right && high, left && high, right && low, left && low]
            .into_iter()
            .enumerate()
        {
            hidden[i] += inside as usize;
        }
    }
    match (0..4).min_by_key(|&i| hidden[i]) {
        Some(1) => SeriesLabelPosition::UpperLeft,
        Some(2) => SeriesLabelPosition::LowerRight,
        Some(3) => SeriesLabelPosition::LowerLeft,
        _ => SeriesLabelPosition::UpperRight,
    }
}

/// A confusion matrix as a heat map with counts, rows = truth, columns = prediction.
pub fn confusion_matrix(path: &Path, m: &ConfusionMatrix, classes: &[String]) -> Result<(), PlotError> {
    let n = m.classes();
    let tmp = path.with_extension("tmp.png");
    {
        let cell = 60u32;
        let size = (cell * n as u32 + 220, cell * n as u32 + 200);
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
        let max = (0..n)
            .flat_map(|t| (0..n).map(move |p| (t, p)))
            .map(|(t, p)| m.count(t, p))
            .max()
            .unwrap_or(1)
            .max(1);
        let (x0, y0) = (160i32, 60i32);
        root.draw(&Text::new(
            "confusion matrix (rows: truth, columns: predicted)",
            (10, 15),
            ("sans-serif", 18),
        ))
        .map_err(|e| draw_err(path, e))?;
        for t in 0..n {
            for p in 0..n {
                let v = m.count(t, p);
                let shade = 1.0 - v as f64 / max as f64;
                let c = RGBColor((255.0 * shade) as u8, (255.0 * shade) as u8, 255);
                let (x, y) = (x0 + (p as i32) * cell as i32, y0 + (t as i32) * cell as i32);
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell as i32, y + cell as i32)],
                    c.filled(),
                ))
                .map_err(|e| draw_err(path, e))?;
                let text_color = if shade < 0.5 { WHITE } else { BLACK };
                root.draw(&Text::new(
                    v.to_string(),
                    (x + 8, y + cell as i32 / 2 - 8),
                    ("sans-serif", 16).into_font().color(&text_color),
                ))
                .map_err(|e| draw_err(path, e))?;
            }
            let name: String = classes
                .get(t)
                .map(String::as_str)
                .unwrap_or("?")
                .chars()
                .take(14)
                .collect();
            root.draw(&Text::new(
                name.clone(),
                (5, y0 + (t as i32) * cell as i32 + cell as i32 / 2 - 8),
                ("sans-serif", 15),
            ))
            .map_err(|e| draw_err(path, e))?;
            root.draw(&Text::new(
                name,
                (
                    x0 + (t as i32) * cell as i32 + 2,
                    y0 + (n as i32) * cell as i32 + 8,
                ),
                ("sans-serif", 13).into_font().transform(FontTransform::Rotate90),
            ))
            .map_err(|e| draw_err(path, e))?;
        }
        root.present().map_err(|e| draw_err(path, e))?;
    }
    publish(&tmp, path)
}

/// Histograms of scores, one per group (e.g. normal and anomalous examples' reconstruction
/// errors), over shared bins on a common axis.
pub fn score_histogram(path: &Path, title: &str, groups: &[(&str, &[f32])]) -> Result<(), PlotError> {
    let all = groups
        .iter()
        .flat_map(|(_, s)| s.iter().copied())
        .filter(|v| v.is_finite());
    let (lo, hi) = all.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if !lo.is_finite() {
        return Ok(());
    }
    let bins = 40usize;
    let width = ((hi - lo) / bins as f32).max(f32::MIN_POSITIVE);
    // Each group's share of its own examples per bin, so groups of different sizes compare.
    let shares: Vec<Vec<f64>> = groups
        .iter()
        .map(|(_, s)| {
            let mut h = vec![0f64; bins];
            for &v in s.iter().filter(|v| v.is_finite()) {
                h[(((v - lo) / width) as usize).min(bins - 1)] += 1.0 / s.len().max(1) as f64;
            }
            h
        })
        .collect();
    let top = shares.iter().flatten().copied().fold(0f64, f64::max).max(1e-9);
    let tmp = path.with_extension("tmp.png");
    {
        let root = BitMapBackend::new(&tmp, (800, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(lo as f64..(lo + width * bins as f32) as f64, 0f64..top * 1.1)
            .map_err(|e| draw_err(path, e))?;
        chart
            .configure_mesh()
            .x_desc("score")
            .y_desc("share of the group")
            .draw()
            .map_err(|e| draw_err(path, e))?;
        for (g, ((name, _), h)) in groups.iter().zip(&shares).enumerate() {
            let color = PALETTE[g % PALETTE.len()];
            chart
                .draw_series(h.iter().enumerate().map(|(i, &v)| {
                    let x0 = (lo + width * i as f32) as f64;
                    Rectangle::new([(x0, 0.0), (x0 + width as f64, v)], color.mix(0.35).filled())
                }))
                .map_err(|e| draw_err(path, e))?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.mix(0.35).filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| draw_err(path, e))?;
        root.present().map_err(|e| draw_err(path, e))?;
    }
    publish(&tmp, path)
}

/// Rows of images side by side (e.g. inputs above their reconstructions): each image
/// `channels × h × w` values in [0, 1] (grey or RGB), drawn `scale` times larger.
pub fn image_grid(
    path: &Path,
    rows: &[Vec<Vec<f32>>],
    (c, h, w): (usize, usize, usize),
    scale: u32,
) -> Result<(), PlotError> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    if cols == 0 {
        return Ok(());
    }
    let gap = 2u32;
    let (cw, ch) = (w as u32 * scale + gap, h as u32 * scale + gap);
    let tmp = path.with_extension("tmp.png");
    {
        let size = (cw * cols as u32 + gap, ch * rows.len() as u32 + gap);
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
        for (r, row) in rows.iter().enumerate() {
            for (k, im) in row.iter().enumerate() {
                let (x0, y0) = (gap + k as u32 * cw, gap + r as u32 * ch);
                for y in 0..h {
                    for x in 0..w {
                        let v = |ch: usize| {
                            (im.get(ch * h * w + y * w + x)
                                .copied()
                                .unwrap_or(0.0)
                                .clamp(0.0, 1.0)
                                * 255.0) as u8
                        };
                        let color = if c == 3 {
                            RGBColor(v(0), v(1), v(2))
                        } else {
                            RGBColor(v(0), v(0), v(0))
                        };
                        let (px, py) = ((x0 + x as u32 * scale) as i32, (y0 + y as u32 * scale) as i32);
                        root.draw(&Rectangle::new(
                            [(px, py), (px + scale as i32, py + scale as i32)],
                            color.filled(),
                        ))
                        .map_err(|e| draw_err(path, e))?;
                    }
                }
            }
        }
        root.present().map_err(|e| draw_err(path, e))?;
    }
    publish(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legend_goes_where_the_lines_are_not() {
        let pos = |pts: Vec<(f64, f64)>| legend_corner(pts.into_iter(), (0.0, 10.0), (0.0, 10.0));
        let rising: Vec<(f64, f64)> = (0..=10).map(|i| (i as f64, i as f64)).collect();
        let falling: Vec<(f64, f64)> = (0..=10).map(|i| (i as f64, 10.0 - i as f64)).collect();
        assert!(matches!(pos(rising), SeriesLabelPosition::UpperLeft));
        assert!(matches!(pos(falling), SeriesLabelPosition::UpperRight));
        // A line along the top leaves the lower corners; the right one first.
        let top: Vec<(f64, f64)> = (0..=10).map(|i| (i as f64, 9.5)).collect();
        assert!(matches!(pos(top), SeriesLabelPosition::LowerRight));
    }
}
