//! Classification metrics: accuracy, per-class and macro precision / recall / F1,
//! confusion matrix, and one-vs-rest ROC-AUC. Definitions follow scikit-learn (a class
//! never predicted has precision 0, as `zero_division=0`), and the tests compare with
//! values scikit-learn computed (`tests/fixtures/make_metrics_reference.py`).

use serde::Serialize;

/// Counts of (true class, predicted class) pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfusionMatrix {
    classes: usize,
    /// Row-major `classes × classes`: row = true class, column = predicted class.
    counts: Vec<u64>,
}

impl ConfusionMatrix {
    /// An empty matrix for `classes` classes.
    pub fn new(classes: usize) -> Self {
        ConfusionMatrix {
            classes,
            counts: vec![0; classes * classes],
        }
    }

    /// Counts one prediction. Panics if a class is out of range (a caller bug).
    pub fn add(&mut self, truth: usize, predicted: usize) {
        assert!(
            truth < self.classes && predicted < self.classes,
            "class out of range"
        );
        self.counts[truth * self.classes + predicted] += 1;
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Examples of class `truth` predicted as `predicted`.
    pub fn count(&self, truth: usize, predicted: usize) -> u64 {
        self.counts[truth * self.classes + predicted]
    }

    fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn predicted_as(&self, c: usize) -> u64 {
        (0..self.classes).map(|t| self.count(t, c)).sum()
    }

    /// Examples whose true class is `c`.
    pub fn support(&self, c: usize) -> u64 {
        (0..self.classes).map(|p| self.count(c, p)).sum()
    }

    /// Fraction predicted correctly.
    pub fn accuracy(&self) -> f64 {
        let correct: u64 = (0..self.classes).map(|c| self.count(c, c)).sum();
        ratio(correct, self.total())
    }

    /// Of those predicted `c`, the fraction that are `c` (0 when none is predicted `c`).
    pub fn precision(&self, c: usize) -> f64 {
        ratio(self.count(c, c), self.predicted_as(c))
    }

    /// Of those that are `c`, the fraction predicted `c`.
    pub fn recall(&self, c: usize) -> f64 {
        ratio(self.count(c, c), self.support(c))
    }

    /// Harmonic mean of precision and recall (0 when both are 0).
    pub fn f1(&self, c: usize) -> f64 {
        let (p, r) = (self.precision(c), self.recall(c));
        if p + r == 0.0 {
            0.0
        } else {
            2.0 * p * r / (p + r)
        }
    }

    /// Unweighted means over classes of precision, recall and F1.
    pub fn macro_scores(&self) -> (f64, f64, f64) {
        let k = self.classes as f64;
        let mean = |f: &dyn Fn(usize) -> f64| (0..self.classes).map(f).sum::<f64>() / k;
        (
            mean(&|c| self.precision(c)),
            mean(&|c| self.recall(c)),
            mean(&|c| self.f1(c)),
        )
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Index of the largest score of each row of a row-major `n × classes` matrix.
pub fn argmax_rows(scores: &[f32], classes: usize) -> Vec<usize> {
    scores
        .chunks_exact(classes)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
        })
        .collect()
}

/// Area under the ROC curve of `scores` for `positive` examples: the probability that a
/// random positive scores above a random negative, ties counting one half (Mann–Whitney
/// with average ranks; equal to scikit-learn's trapezoidal ROC-AUC). `None` when either
/// class is absent.
pub fn roc_auc(scores: &[f32], positive: &[bool]) -> Option<f64> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut i) = (0.0f64, 0);
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let average_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += average_rank * order[i..=j].iter().filter(|&&k| positive[k]).count() as f64;
        i = j + 1;
    }
    let p = positive.iter().filter(|&&x| x).count() as f64;
    let n = positive.len() as f64 - p;
    (p > 0.0 && n > 0.0).then(|| (rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// Macro-averaged one-vs-rest ROC-AUC of row-major `n × classes` probabilities; `None`
/// if some class has no example (its AUC is undefined).
pub fn roc_auc_ovr_macro(probs: &[f32], labels: &[usize], classes: usize) -> Option<f64> {
    let mut sum = 0.0;
    for c in 0..classes {
        let scores: Vec<f32> = probs.chunks_exact(classes).map(|row| row[c]).collect();
        let positive: Vec<bool> = labels.iter().map(|&l| l == c).collect();
        sum += roc_auc(&scores, &positive)?;
    }
    Some(sum / classes as f64)
}

/// Everything an evaluation reports, ready to serialise next to a run.
#[derive(Debug, Clone, Serialize)]
pub struct ClassificationReport {
    /// Fraction correct.
    pub accuracy: f64,
    /// Per class.
    pub precision: Vec<f64>,
    /// Per class.
    pub recall: Vec<f64>,
    /// Per class.
    pub f1: Vec<f64>,
    /// Examples per true class.
    pub support: Vec<u64>,
    /// Macro averages (precision, recall, F1).
    pub macro_precision: f64,
    /// Macro recall.
    pub macro_recall: f64,
    /// Macro F1.
    pub macro_f1: f64,
    /// One-vs-rest macro ROC-AUC (`None` if a class is missing).
    pub roc_auc_ovr_macro: Option<f64>,
    /// The confusion matrix.
    pub confusion: ConfusionMatrix,
}

impl ClassificationReport {
    /// Evaluates predicted probabilities (row-major `n × classes`) against labels.
    pub fn new(probs: &[f32], labels: &[usize], classes: usize) -> Self {
        let mut confusion = ConfusionMatrix::new(classes);
        for (&truth, predicted) in labels.iter().zip(argmax_rows(probs, classes)) {
            confusion.add(truth, predicted);
        }
        let per_class = |f: &dyn Fn(usize) -> f64| (0..classes).map(f).collect::<Vec<_>>();
        let (macro_precision, macro_recall, macro_f1) = confusion.macro_scores();
        ClassificationReport {
            accuracy: confusion.accuracy(),
            precision: per_class(&|c| confusion.precision(c)),
            recall: per_class(&|c| confusion.recall(c)),
            f1: per_class(&|c| confusion.f1(c)),
            support: (0..classes).map(|c| confusion.support(c)).collect(),
            macro_precision,
            macro_recall,
            macro_f1,
            roc_auc_ovr_macro: roc_auc_ovr_macro(probs, labels, classes),
            confusion,
        }
    }
}
