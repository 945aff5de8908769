//! What an autoencoder's evaluation reports: the reconstruction error (mean squared error
//! per value) overall and per class, and with `[anomaly]` how well that error separates
//! the normal classes from the others (ROC-AUC, overall and per anomalous class). Written
//! as `metrics.json`, a histogram of the errors (`scores.png`) and, for images, the first
//! test images above their reconstructions (`reconstructions.png`).

use crate::data::{Batch, Model};
use anyhow::Context;
use serde::Serialize;
use std::path::Path;
use trident_nn::autoencoder::Autoencoder;
use trident_train::metrics::roc_auc;
use trident_train::plot;
use trident_train::trainer::Evaluation;

/// One class's reconstruction figures.
#[derive(Debug, Serialize)]
pub struct ClassErrors {
    pub class: String,
    pub examples: usize,
    /// Mean squared error per value.
    pub mse: f64,
    /// Whether the class is normal (`[anomaly]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normal: Option<bool>,
    /// An anomalous class's ROC-AUC against the normal examples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auroc_vs_normal: Option<f64>,
}

/// Normal against anomalous examples.
#[derive(Debug, Serialize)]
pub struct AnomalyFigures {
    pub normal: Vec<String>,
    pub normal_examples: usize,
    pub anomalous_examples: usize,
    /// ROC-AUC of the reconstruction error, anomalous examples positive; `None` when one
    /// side has no example.
    pub auroc: Option<f64>,
}

/// The whole report of a split.
#[derive(Debug, Serialize)]
pub struct ReconstructionReport {
    pub examples: usize,
    /// Mean squared error per value over the split.
    pub mse: f64,
    pub per_class: Vec<ClassErrors>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anomaly: Option<AnomalyFigures>,
}

impl ReconstructionReport {
    /// From an evaluation's per-example errors and labels; `normal` lists the normal classes.
    pub fn new(ev: &Evaluation, classes: &[String], normal: Option<&[usize]>) -> Self {
        let (scores, labels) = (&ev.scores, &ev.labels);
        let mean = |f: &dyn Fn(usize) -> bool| -> (usize, f64) {
            let v: Vec<f64> = (0..scores.len())
                .filter(|&i| f(i))
                .map(|i| scores[i] as f64)
                .collect();
            (v.len(), v.iter().sum::<f64>() / v.len().max(1) as f64)
        };
        let is_normal = |c: usize| normal.is_some_and(|n| n.contains(&c));
        let per_class = classes
            .iter()
            .enumerate()
            .filter_map(|(c, name)| {
                let (examples, mse) = mean(&|i| labels[i] == c);
                (examples > 0).then(|| {
                    let auroc_vs_normal = match normal {
                        Some(_) if !is_normal(c) => {
                            let keep: Vec<usize> = (0..scores.len())
                                .filter(|&i| labels[i] == c || is_normal(labels[i]))
                                .collect();
                            let s: Vec<f32> = keep.iter().map(|&i| scores[i]).collect();
                            let p: Vec<bool> = keep.iter().map(|&i| labels[i] == c).collect();
                            roc_auc(&s, &p)
                        }
                        _ => None,
                    };
                    ClassErrors {
                        class: name.clone(),
                        examples,
                        mse,
                        normal: normal.map(|_| is_normal(c)),
                        auroc_vs_normal,
                    }
                })
            })
            .collect();
        let anomaly = normal.map(|n| {
            let positive: Vec<bool> = labels.iter().map(|l| !n.contains(l)).collect();
            let anomalous = positive.iter().filter(|&&p| p).count();
            AnomalyFigures {
                normal: n.iter().map(|&c| classes[c].clone()).collect(),
                normal_examples: labels.len() - anomalous,
                anomalous_examples: anomalous,
                auroc: roc_auc(scores, &positive),
            }
        });
        ReconstructionReport {
            examples: scores.len(),
            mse: mean(&|_| true).1,
            per_class,
            anomaly,
        }
    }

    /// The report as lines for the terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "examples {}  reconstruction MSE per value {:.5}",
            self.examples, self.mse
        )];
        if let Some(a) = &self.anomaly {
            out.push(format!(
                "  anomaly ROC-AUC {}  (normal {:?}: {} examples; anomalous: {})",
                a.auroc.map_or("undefined".into(), |v| format!("{v:.4}")),
                a.normal,
                a.normal_examples,
                a.anomalous_examples
            ));
        }
        for c in &self.per_class {
            let mut line = format!("  {:>14}  MSE {:.5}  examples {}", c.class, c.mse, c.examples);
            match (c.normal, c.auroc_vs_normal) {
                (Some(true), _) => line += "  (normal)",
                (_, Some(auc)) => line += &format!("  ROC-AUC vs normal {auc:.4}"),
                _ => {}
            }
            out.push(line);
        }
        out
    }

    /// `metrics.json` and `scores.png` in `out`.
    pub fn write(&self, out: &Path, ev: &Evaluation, normal: Option<&[usize]>) -> anyhow::Result<()> {
        std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
        crate::write_atomic(
            &out.join("metrics.json"),
            serde_json::to_string_pretty(&serde_json::json!({
                "loss": ev.loss,
                "reconstruction": self,
            }))?
            .as_bytes(),
        )?;
        let file = out.join("scores.png");
        match normal {
            Some(n) => {
                let side = |normal: bool| -> Vec<f32> {
                    ev.scores
                        .iter()
                        .zip(&ev.labels)
                        .filter(|(_, l)| n.contains(l) == normal)
                        .map(|(&s, _)| s)
                        .collect()
                };
                let (a, b) = (side(true), side(false));
                plot::score_histogram(
                    &file,
                    "reconstruction error (MSE per value)",
                    &[("normal", &a), ("anomalous", &b)],
                )?
            }
            None => plot::score_histogram(
                &file,
                "reconstruction error (MSE per value)",
                &[("all", &ev.scores)],
            )?,
        }
        Ok(())
    }
}

/// For an image autoencoder: the first (up to) 12 images of `batch` above their
/// reconstructions, in `[0, 1]` pixels, as `path`.
pub fn reconstruction_grid(model: &Model, batch: &Batch, path: &Path) -> anyhow::Result<()> {
    let (Some(ae), Batch::Image(x, _)) = (model.net.get::<Autoencoder>(), batch) else {
        return Ok(());
    };
    let trident_zoo::InputSpec::Image { mean, std, .. } = model.card.input else {
        return Ok(());
    };
    let (n, c, h, w) = x.dims4()?;
    let x = x.narrow(0, 0, n.min(12))?;
    let y = ae.forward(&x, &trident_nn::Ctx::eval())?;
    let pixels = |t: &trident_nn::Tensor| -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(t.affine(std as f64, mean as f64)?
            .flatten_from(1)?
            .to_vec2::<f32>()?)
    };
    plot::image_grid(path, &[pixels(&x)?, pixels(&y)?], (c, h, w), 3)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_class_and_overall_figures_follow_the_scores() {
        let ev = Evaluation {
            loss: 0.0,
            report: None,
            probs: Vec::new(),
            // Class 0 normal (low errors), class 1 fully separated, class 2 overlapping.
            scores: vec![0.1, 0.2, 0.3, 0.9, 0.8, 0.25, 0.05],
            labels: vec![0, 0, 0, 1, 1, 2, 2],
        };
        let classes: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let r = ReconstructionReport::new(&ev, &classes, Some(&[0]));
        let a = r.anomaly.as_ref().unwrap();
        assert_eq!((a.normal_examples, a.anomalous_examples), (3, 4));
        // Pairs (anomalous, normal) ranked right: b beats all 3 twice (6), c's 0.25 beats 2,
        // its 0.05 none: 8 of 12.
        assert!((a.auroc.unwrap() - 8.0 / 12.0).abs() < 1e-12);
        assert_eq!(r.per_class[1].auroc_vs_normal, Some(1.0));
        assert!((r.per_class[2].auroc_vs_normal.unwrap() - 2.0 / 6.0).abs() < 1e-12);
        assert_eq!(r.per_class[0].normal, Some(true));
        assert!((r.per_class[0].mse - 0.2).abs() < 1e-6);
        assert!((r.mse - 2.6 / 7.0).abs() < 1e-6);
        let plain = ReconstructionReport::new(&ev, &classes, None);
        assert!(plain.anomaly.is_none() && plain.per_class.iter().all(|c| c.auroc_vs_normal.is_none()));
    }
}

/// An autoencoder on a series: every window of the test part scored by its reconstruction
/// error, ranked, and held against the values the anomaly column marks.
#[derive(Debug, Serialize)]
pub struct SeriesRanking {
    pub window: usize,
    pub windows: usize,
    /// The marked values' index ranges `[start, end)` in the test part.
    pub marked: Vec<(usize, usize)>,
    /// The highest-scoring windows, none overlapping a higher one: (first index, error).
    pub top: Vec<(usize, f32)>,
    /// Whether the top window holds a marked value.
    pub top_is_marked: bool,
    /// The rank (1 = highest error) of the best window holding a marked value.
    pub best_marked_rank: Option<usize>,
    /// ROC-AUC of the error over windows, a window being anomalous when it holds a marked value.
    pub auroc: Option<f64>,
}

/// Scores every window of `values[test_start..]` with `model` (an autoencoder on
/// `spec`'s windows); `marks` is the anomaly column (non-zero = anomalous).
pub fn rank_series(
    model: &Model,
    spec: &trident_zoo::SeriesSpec,
    values: &[f64],
    marks: &[f64],
    test_start: usize,
) -> anyhow::Result<(SeriesRanking, Vec<f32>)> {
    let Some(ae) = model.net.get::<Autoencoder>() else {
        anyhow::bail!("not an autoencoder")
    };
    let w = spec.window;
    let n = values.len();
    anyhow::ensure!(
        n >= test_start + w,
        "the test part is shorter than a window of {w}"
    );
    let starts: Vec<usize> = (test_start..=n - w).collect();
    let mut errors = Vec::with_capacity(starts.len());
    for chunk in starts.chunks(512) {
        let mut x = Vec::with_capacity(chunk.len() * w);
        for &s in chunk {
            // An autoencoder's spec has no calendar features (refused by the config).
            x.extend(spec.encode(&values[s..s + w], s + w).0);
        }
        let x = trident_nn::Tensor::from_vec(x, (chunk.len(), w), &trident_nn::Device::Cpu)?;
        let y = ae.forward(&x, &trident_nn::Ctx::eval())?;
        errors.extend(trident_nn::layers::mse_per_example(&x, &y)?.to_vec1::<f32>()?);
    }
    let marked_window = |s: usize| marks[s..s + w].iter().any(|&m| m != 0.0);
    let positive: Vec<bool> = starts.iter().map(|&s| marked_window(s)).collect();
    let mut order: Vec<usize> = (0..starts.len()).collect();
    order.sort_by(|&a, &b| errors[b].total_cmp(&errors[a]));
    let mut top: Vec<(usize, f32)> = Vec::new();
    for &i in &order {
        if top.len() == 5 {
            break;
        }
        if top.iter().all(|&(s, _)| starts[i] + w <= s || s + w <= starts[i]) {
            top.push((starts[i], errors[i]));
        }
    }
    let mut marked = Vec::new();
    let mut i = test_start;
    while i < n {
        if marks[i] != 0.0 {
            let from = i;
            while i < n && marks[i] != 0.0 {
                i += 1;
            }
            marked.push((from, i));
        } else {
            i += 1;
        }
    }
    let ranking = SeriesRanking {
        window: w,
        windows: starts.len(),
        top_is_marked: top.first().is_some_and(|&(s, _)| marked_window(s)),
        best_marked_rank: order.iter().position(|&i| positive[i]).map(|r| r + 1),
        auroc: roc_auc(&errors, &positive),
        marked,
        top,
    };
    Ok((ranking, errors))
}

impl SeriesRanking {
    /// The lines for the terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "{} windows of {} in the test part; marked values at {:?}",
            self.windows, self.window, self.marked
        )];
        out.push(format!(
            "  top-ranked window: values {}..{} — {}",
            self.top.first().map_or(0, |t| t.0),
            self.top.first().map_or(0, |t| t.0 + self.window),
            if self.top_is_marked {
                "holds the marked anomaly"
            } else {
                "does NOT hold a marked value"
            }
        ));
        out.push(format!(
            "  best window holding a marked value: rank {}; ROC-AUC over windows {}",
            self.best_marked_rank.map_or("-".into(), |r| r.to_string()),
            self.auroc.map_or("undefined".into(), |a| format!("{a:.4}"))
        ));
        let top: Vec<String> = self.top.iter().map(|(s, e)| format!("{s} ({e:.4})")).collect();
        out.push(format!("  top windows, none overlapping: {}", top.join(", ")));
        out
    }

    /// `metrics.json` and `scores.png` (each window's error by its first index, with the
    /// marked values) in `out`.
    pub fn write(&self, out: &Path, errors: &[f32], first: usize, marks: &[f64]) -> anyhow::Result<()> {
        std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
        crate::write_atomic(
            &out.join("metrics.json"),
            serde_json::to_string_pretty(&serde_json::json!({ "series_anomaly": self }))?.as_bytes(),
        )?;
        let top = errors.iter().copied().fold(0f32, f32::max) as f64;
        let curve: Vec<(f64, f64)> = errors
            .iter()
            .enumerate()
            .map(|(i, &e)| ((first + i) as f64, e as f64))
            .collect();
        let mark: Vec<(f64, f64)> = (first..marks.len())
            .map(|i| (i as f64, if marks[i] != 0.0 { top } else { 0.0 }))
            .collect();
        plot::xy_chart(
            &out.join("scores.png"),
            "reconstruction error of each window, by its first value",
            "first value of the window",
            "MSE per value",
            &[("window error", curve), ("marked anomaly", mark)],
        )?;
        Ok(())
    }
}
