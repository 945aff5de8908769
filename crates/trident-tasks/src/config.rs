//! The training configuration file (TOML). Unknown keys and wrong types are errors that
//! name the file, line and key; relative paths are relative to the working directory.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use trident_train::TrainConfig;
use trident_zoo::card::ModelConfig;

/// A whole run: where it goes, the data, the model and how to train.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub run: RunSection,
    pub data: DataConfig,
    #[serde(default)]
    pub loader: LoaderSection,
    pub model: ModelConfig,
    pub train: TrainConfig,
    /// `trident distill` only: the teacher and the loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<DistillSection>,
    /// Anomaly detection with an autoencoder: which classes are normal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anomaly: Option<AnomalySection>,
    /// A GAN's scoring: the classifier whose features judge its samples, and how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gan: Option<GanSection>,
}

/// `[gan]`: generated images are scored in the feature space of a trained classifier of
/// the same images (`judge`, a `trident train` checkpoint of a `cnn`): after every epoch
/// the Fréchet distance of `epoch_samples` generated images to the validation images (it
/// picks `best`), and after training the full report on `samples` generated images
/// against the test images, beside the real training images' own figures (the floor).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GanSection {
    /// The judging classifier's checkpoint directory (e.g. `runs/fashion-cnn/best`).
    pub judge: std::path::PathBuf,
    /// Generated images scored after training.
    #[serde(default = "gan_samples")]
    pub samples: usize,
    /// Generated images scored after each epoch (against as many validation images).
    #[serde(default = "gan_epoch_samples")]
    pub epoch_samples: usize,
}

fn gan_samples() -> usize {
    10_000
}
fn gan_epoch_samples() -> usize {
    2_000
}

/// `[anomaly]`: the autoencoder trains and validates on the `normal` classes' examples only;
/// the test split keeps every class, and each example's reconstruction error scores how
/// anomalous it is (AUROC of normal against the rest, and per class).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnomalySection {
    /// Images and tables: class names (as the data names them) that count as normal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub normal: Vec<String>,
    /// A series: the 0/1 column marking anomalous values. The test part's windows are
    /// ranked by reconstruction error; a window is anomalous when it holds a marked value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
}

impl RunConfig {
    /// The indices of `[anomaly] normal` among `classes`; `None` without the section.
    pub fn normal_classes(&self, classes: &[String]) -> anyhow::Result<Option<Vec<usize>>> {
        let Some(a) = &self.anomaly else { return Ok(None) };
        a.normal
            .iter()
            .map(|n| {
                classes.iter().position(|c| c == n).with_context(|| {
                    format!("anomaly.normal: {n:?} is not one of the data's classes {classes:?}")
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .map(Some)
    }
}

/// `[distill]`: a frozen teacher checkpoint teaches the `[model]` student.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistillSection {
    /// A checkpoint directory of `trident train` (`<run>/best`).
    pub teacher: PathBuf,
    /// The loss: `{ kind = "soft", temperature, alpha }` or `{ kind = "hard" }`.
    pub loss: trident_train::distill::KdLoss,
    /// `online`: the teacher runs on every batch; `cached`: its logits are computed once per
    /// example view and kept in `cache`.
    #[serde(default)]
    pub mode: DistillMode,
    /// Cached mode's file (default: `teacher-logits.bin`, or `teacher-logits-top{k}.bin`,
    /// in the teacher's run directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<PathBuf>,
    /// Cached mode with many classes: keep each example's `top_k` largest teacher logits
    /// (and one value standing for the rest) instead of all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    /// Hidden-state matching between transformer layers (online mode):
    /// `[distill.hidden] pairs = [[student state, teacher state], …]`, `weight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<trident_train::distill::HiddenMatch>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DistillMode {
    #[default]
    Online,
    Cached,
}

impl DistillSection {
    /// Where cached mode keeps the teacher's logits.
    pub fn cache_path(&self) -> PathBuf {
        self.cache.clone().unwrap_or_else(|| {
            self.teacher
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .join(match self.top_k {
                    Some(k) => format!("teacher-logits-top{k}.bin"),
                    None => "teacher-logits.bin".into(),
                })
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Run directory (checkpoints, metrics, plots).
    pub dir: PathBuf,
    /// Seed of model initialisation and data splits.
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderSection {
    #[serde(default = "batch")]
    pub batch_size: usize,
    /// Batch size for evaluation (default: `batch_size`).
    #[serde(default)]
    pub eval_batch_size: Option<usize>,
    /// Background loader threads (0: load on the training thread).
    #[serde(default = "one")]
    pub num_workers: usize,
    /// Batches each worker prepares ahead.
    #[serde(default = "two")]
    pub prefetch: usize,
}

impl Default for LoaderSection {
    fn default() -> Self {
        LoaderSection {
            batch_size: batch(),
            eval_batch_size: None,
            num_workers: one(),
            prefetch: two(),
        }
    }
}

fn batch() -> usize {
    32
}
fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn tenth() -> f64 {
    0.1
}
fn max_len() -> usize {
    128
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum DataConfig {
    /// Text classification from CSV/TSV/JSONL files, split into train/val/test by seed.
    Text {
        files: Vec<PathBuf>,
        /// `csv`, `tsv` or `jsonl`.
        format: String,
        text_field: String,
        label_field: String,
        #[serde(default)]
        has_header: bool,
        #[serde(default)]
        classes: Option<Vec<String>>,
        /// `vader`: the label column is a score binned at ±0.5 into negative/neutral/positive.
        #[serde(default)]
        score_bins: Option<String>,
        #[serde(default = "tenth")]
        val_fraction: f64,
        #[serde(default = "tenth")]
        test_fraction: f64,
        /// Longest token sequence (special tokens included).
        #[serde(default = "max_len")]
        max_len: usize,
        /// Cut longer texts to `max_len` instead of refusing them.
        #[serde(default)]
        truncate: bool,
    },
    /// Images in IDX files (MNIST layout): a train pair (split into train/val) and a test pair.
    Idx {
        train_images: PathBuf,
        train_labels: PathBuf,
        test_images: PathBuf,
        test_labels: PathBuf,
        #[serde(default = "tenth")]
        val_fraction: f64,
        /// Class names (default: "0", "1", …).
        #[serde(default)]
        classes: Option<Vec<String>>,
        /// Pixel normalisation (x - mean) / std after scaling to [0, 1].
        #[serde(default)]
        mean: f32,
        #[serde(default = "unit")]
        std: f32,
        /// Use only the first N training images (quick runs); the test set stays whole.
        #[serde(default)]
        max_train: Option<usize>,
        /// Few-shot: train on this many images of each class (a seeded draw from the
        /// training split; validation keeps its own images).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        per_class: Option<usize>,
        /// Augment training images: random crop after 2 px zero padding, then a horizontal
        /// flip with probability ½ (reproducible per seed, epoch and image).
        #[serde(default)]
        augment: bool,
    },
    /// Images in class folders (`<dir>/<class>/*.png|jpg`), as torchvision's ImageFolder:
    /// the train folder is split into train/val, the test folder is the test set.
    Folder {
        train_dir: PathBuf,
        test_dir: PathBuf,
        /// 1 (grey) or 3 (RGB).
        #[serde(default = "one_f")]
        channels: usize,
        /// Images are resized to height × width.
        height: usize,
        width: usize,
        #[serde(default = "tenth")]
        val_fraction: f64,
        /// Class folder names in index order (default: sorted folder names).
        #[serde(default)]
        classes: Option<Vec<String>>,
        #[serde(default)]
        mean: f32,
        #[serde(default = "unit")]
        std: f32,
        #[serde(default)]
        max_train: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        per_class: Option<usize>,
        #[serde(default)]
        augment: bool,
    },
    /// Rows of a CSV table: feature columns (numeric, or categorical one-hot) and a label
    /// column; split into train/val/test by seed, within each class.
    Table {
        file: PathBuf,
        /// The first line is scikit-learn's `n_samples,n_features,class names…` (its
        /// bundled CSVs); the columns are then `x0…` and `label`, the last.
        #[serde(default)]
        sklearn_header: bool,
        /// The cell separator, one character (default: whichever of `,` `;` tab the first
        /// line holds most).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delimiter: Option<char>,
        /// The label column (default: the last column).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label: Option<String>,
        /// The feature columns (default: every column but the label and `ignore`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        features: Option<Vec<String>>,
        /// Columns left out of the default features.
        #[serde(default)]
        ignore: Vec<String>,
        /// Columns read as categories even where every value is a number (a column with a
        /// value that is not a number is categorical anyway).
        #[serde(default)]
        categorical: Vec<String>,
        /// Rows with a missing feature: `drop` them, or `impute` (numeric: the training
        /// mean; categorical: the most frequent training level). A row without a label is
        /// always dropped.
        #[serde(default)]
        missing: trident_data::table::Missing,
        /// Numeric columns: `zscore`, `minmax` or `none`, fitted on the training rows.
        #[serde(default)]
        scaling: trident_data::table::Scaling,
        /// Class names in index order (default: scikit-learn's first line, or the sorted
        /// label values).
        #[serde(default)]
        classes: Option<Vec<String>>,
        #[serde(default = "tenth")]
        val_fraction: f64,
        #[serde(default = "fifth")]
        test_fraction: f64,
    },
    /// A time series: one numeric column of a CSV file in row order, cut into sliding
    /// windows of `window` values whose next `horizon` values are the targets. The last
    /// `test` values are held out and forecast by a rolling-origin backtest; the `val`
    /// values before them are the validation windows' targets; the rest trains.
    Series {
        file: PathBuf,
        /// The value column (default: the last).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        column: Option<String>,
        window: usize,
        #[serde(default = "one_f")]
        horizon: usize,
        /// Training windows start every `step` values.
        #[serde(default = "one_f")]
        step: usize,
        /// Model the natural log of the values (positive series with growing swings).
        #[serde(default)]
        log: bool,
        /// `window` (each window minus its own mean), `global` (minus the training mean) or
        /// `season` (the window minus its mean; each target relative to the value one
        /// `season` before it: the model corrects the seasonal-naive forecast) or
        /// `season-trend` (as `season`, plus the window's last change over a season on every
        /// target: the model corrects "last season, grown as much as the latest
        /// season-on-season change", the airline model's differences held at zero); all
        /// divide by the training part's standard deviation.
        #[serde(default)]
        normalize: trident_zoo::card::SeriesNormalize,
        /// Values held out at the end, forecast by the backtest.
        test: usize,
        /// Values before the test part whose windows validate (0: no validation).
        #[serde(default)]
        val: usize,
        /// The season length of the seasonal-naive baseline and of MASE's scale (1: the
        /// naive forecast).
        #[serde(default = "one_f")]
        season: usize,
        /// Backtest origins every `stride` values of the test part (default: the horizon;
        /// `test` gives one origin forecasting the whole test part). From each origin the
        /// values up to the next are forecast from the actual history, forecasts fed back
        /// as inputs where the lead exceeds the horizon (see `refit`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
        /// Train the model again at each backtest origin on the history up to it (the
        /// same settings, `val` values before the origin validating) instead of forecasting
        /// every origin with the one trained model; the runs go to `<run>/refit/`.
        #[serde(default)]
        refit: bool,
        /// Calendar features: periods in rows (e.g. 12 for months of the year in a monthly
        /// series; 48 and 336 for the time of day and of the week in a half-hourly one).
        /// The model also reads the sine and cosine of each forecast's first row's position
        /// in each period, counted from the series' first row.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calendar: Vec<usize>,
    },
}

fn fifth() -> f64 {
    0.2
}

fn one_f() -> usize {
    1
}

fn unit() -> f32 {
    1.0
}

/// The options the image data kinds share.
pub struct ImageOptions {
    pub val_fraction: f64,
    pub mean: f32,
    pub std: f32,
    pub max_train: Option<usize>,
    pub per_class: Option<usize>,
    pub augment: bool,
}

impl DataConfig {
    /// The shared image options, for the image kinds.
    pub fn image_options(&self) -> Option<ImageOptions> {
        match self {
            DataConfig::Idx {
                val_fraction,
                mean,
                std,
                max_train,
                per_class,
                augment,
                ..
            }
            | DataConfig::Folder {
                val_fraction,
                mean,
                std,
                max_train,
                per_class,
                augment,
                ..
            } => Some(ImageOptions {
                val_fraction: *val_fraction,
                mean: *mean,
                std: *std,
                max_train: *max_train,
                per_class: *per_class,
                augment: *augment,
            }),
            DataConfig::Text { .. } | DataConfig::Table { .. } | DataConfig::Series { .. } => None,
        }
    }
}

impl RunConfig {
    /// Parses `file`; errors name the file, the line and column, and the key.
    pub fn read(file: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let c: RunConfig = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start].matches('\n').count() + 1;
                    format!("line {line}: ")
                })
                .unwrap_or_default();
            anyhow::anyhow!("{at}{}", e.message())
        })?;
        let mut c = c;
        c.monitor_for_the_task(text)?;
        c.validate()?;
        Ok(c)
    }

    /// An autoencoder or a forecaster has no accuracy: it monitors the validation loss
    /// unless the file asked for another metric, which is an error.
    fn monitor_for_the_task(&mut self, text: &str) -> anyhow::Result<()> {
        use trident_train::trainer::Monitor;
        let table: toml::Table = toml::from_str(text)?;
        let given = table.get("train").and_then(|t| t.get("monitor")).is_some();
        let m = &self.train.monitor;
        if matches!(self.model, ModelConfig::Gan(_)) {
            match (given, m.is("val_fd")) {
                (false, _) => self.train.monitor = Monitor::named("val_fd"),
                (true, true) => {}
                (true, false) => anyhow::bail!(
                    "train.monitor = {m:?}: a gan's best epoch has the lowest Fréchet distance of its samples to the validation images (\"val_fd\", from [gan] judge)"
                ),
            }
            return Ok(());
        }
        anyhow::ensure!(
            !m.is("val_fd"),
            "train.monitor = \"val_fd\" judges a gan's samples; this model is not a gan"
        );
        let known = trident_train::trainer::SUPERVISED_METRICS.map(|d| d.name);
        anyhow::ensure!(
            known.iter().any(|k| m.is(k)),
            "train.monitor = {m:?}: one of {known:?} (\"val_fd\" for a gan)"
        );
        if !matches!(
            self.model,
            ModelConfig::Autoencoder(_) | ModelConfig::Forecaster(_)
        ) {
            return Ok(());
        }
        match (given, m.is("val_loss")) {
            (false, _) => self.train.monitor = Monitor::named("val_loss"),
            (true, true) => {}
            (true, false) => anyhow::bail!(
                "train.monitor = {m:?}: this model has no class predictions; it monitors \"val_loss\" (its squared error)"
            ),
        }
        Ok(())
    }

    /// A key the chosen shape or task does not read is refused rather than ignored.
    fn refuse_unused(&self) -> anyhow::Result<()> {
        use trident_zoo::card::{AeShape, ForecastNet};
        let unused = |what: &str, why: &str| anyhow::anyhow!("{what} is not used here: {why}");
        match &self.model {
            ModelConfig::Autoencoder(a) => {
                match (a.shape, &a.hidden, &a.channels) {
                    (AeShape::Dense, _, Some(_)) => {
                        return Err(unused("model.channels", "a dense autoencoder reads model.hidden"))
                    }
                    (AeShape::Conv, Some(_), _) => {
                        return Err(unused("model.hidden", "a conv autoencoder reads model.channels"))
                    }
                    _ => {}
                }
                if let DataConfig::Series {
                    horizon,
                    stride,
                    refit,
                    calendar,
                    ..
                } = &self.data
                {
                    let why = "an autoencoder ranks the test part's windows; it forecasts nothing";
                    for (key, set) in [
                        ("data.horizon", *horizon != 1),
                        ("data.stride", stride.is_some()),
                        ("data.refit", *refit),
                        ("data.calendar", !calendar.is_empty()),
                    ] {
                        if set {
                            return Err(unused(key, why));
                        }
                    }
                }
            }
            ModelConfig::Gan(g) => {
                use trident_zoo::card::GanObjective;
                if g.loss != GanObjective::Wgan && g.clip.is_some() {
                    return Err(unused(
                        "model.clip",
                        "only loss = \"wgan\" clips the critic's weights",
                    ));
                }
                if g.loss != GanObjective::WganGp && g.gp.is_some() {
                    return Err(unused(
                        "model.gp",
                        "only loss = \"wgan-gp\" penalises the critic's gradient",
                    ));
                }
                if g.loss == GanObjective::WganGp {
                    anyhow::ensure!(
                        !g.critic_batch_norm,
                        "model.loss = \"wgan-gp\" needs model.critic_batch_norm = false: batch norm ties each image's score to the rest of its batch, so the per-image gradient the penalty constrains is not the critic's (the paper's critic has none)"
                    );
                    anyhow::ensure!(
                        g.gp.is_none_or(|l| l.is_finite() && l > 0.0),
                        "model.gp = {}: the penalty's weight must be a positive number (the paper's is 10)",
                        g.gp.unwrap_or_default()
                    );
                }
            }
            ModelConfig::Forecaster(f) if f.net != ForecastNet::Mlp && f.activation.is_some() => {
                return Err(unused(
                    "model.activation",
                    "an lstm or gru forecaster has its own gates",
                ))
            }
            _ => {}
        }
        Ok(())
    }

    /// The series settings: sizes, stride, seasonal normalisation and the model kinds a
    /// series takes.
    fn validate_series(&self) -> anyhow::Result<()> {
        let DataConfig::Series {
            window,
            horizon,
            step,
            test,
            season,
            stride,
            normalize,
            calendar,
            ..
        } = &self.data
        else {
            return Ok(());
        };
        if let Some(p) = calendar.iter().find(|&&p| p < 2) {
            anyhow::bail!("data.calendar: period {p}: a period is at least 2 rows");
        }
        anyhow::ensure!(
            *window > 0 && *horizon > 0 && *step > 0 && *test > 0 && *season > 0,
            "data.window, data.horizon, data.step, data.test and data.season must be at least 1"
        );
        anyhow::ensure!(stride.is_none_or(|s| s > 0), "data.stride must be at least 1");
        use trident_zoo::card::SeriesNormalize;
        match normalize {
            SeriesNormalize::Season => anyhow::ensure!(
                season <= window && horizon <= season,
                "data.normalize = \"season\" forecasts relative to the values one season before: \
                     it needs data.horizon ({horizon}) <= data.season ({season}) <= data.window ({window})"
            ),
            SeriesNormalize::SeasonTrend => {
                anyhow::ensure!(
                    season < window && horizon <= season,
                    "data.normalize = \"season-trend\" forecasts relative to the values one season before \
                     plus the window's last change over a season: it needs data.horizon ({horizon}) <= \
                     data.season ({season}) < data.window ({window})"
                );
                anyhow::ensure!(
                    !matches!(self.model, ModelConfig::Autoencoder(_)),
                    "data.normalize = \"season-trend\" is a forecaster's: an autoencoder reconstructs the window itself"
                );
            }
            SeriesNormalize::Window | SeriesNormalize::Global => {}
        }
        anyhow::ensure!(
            matches!(
                self.model,
                ModelConfig::Forecaster(_) | ModelConfig::Autoencoder(_)
            ),
            "model.kind must be \"forecaster\" or \"autoencoder\" for series data"
        );
        Ok(())
    }

    fn validate(&self) -> anyhow::Result<()> {
        self.validate_distill()?;
        self.validate_data()?;
        self.validate_series()?;
        self.refuse_unused()?;
        self.validate_pairings()
    }

    /// `[distill]`: the loss, and the keys only one mode reads.
    fn validate_distill(&self) -> anyhow::Result<()> {
        if let Some(d) = &self.distill {
            d.loss.validate().map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                d.cache.is_none() || d.mode == DistillMode::Cached,
                "distill.cache is only used with distill.mode = \"cached\" (the mode is online)"
            );
            if let Some(h) = &d.hidden {
                anyhow::ensure!(
                    d.mode == DistillMode::Online,
                    "distill.hidden needs distill.mode = \"online\": hidden states are not cached"
                );
                anyhow::ensure!(
                    !h.pairs.is_empty(),
                    "distill.hidden.pairs is empty: list [student state, teacher state] pairs"
                );
                anyhow::ensure!(
                    h.weight >= 0.0 && h.weight.is_finite(),
                    "distill.hidden.weight must be >= 0, got {}",
                    h.weight
                );
            }
            anyhow::ensure!(
                d.top_k.is_none() || d.mode == DistillMode::Cached,
                "distill.top_k is only used with distill.mode = \"cached\" (the mode is online)"
            );
        }
        Ok(())
    }

    /// The loader's batch size, and each data kind's own keys with the model kinds it takes.
    fn validate_data(&self) -> anyhow::Result<()> {
        let l = &self.loader;
        anyhow::ensure!(l.batch_size > 0, "loader.batch_size must be at least 1");
        match &self.data {
            DataConfig::Text {
                val_fraction,
                test_fraction,
                files,
                format,
                score_bins,
                ..
            } => {
                anyhow::ensure!(!files.is_empty(), "data.files is empty");
                anyhow::ensure!(
                    matches!(format.as_str(), "csv" | "tsv" | "jsonl"),
                    "data.format `{format}` is not one of csv, tsv, jsonl"
                );
                if let Some(b) = score_bins {
                    anyhow::ensure!(b == "vader", "data.score_bins `{b}` is unknown (only `vader`)");
                }
                anyhow::ensure!(
                    *val_fraction >= 0.0 && *test_fraction >= 0.0 && val_fraction + test_fraction < 1.0,
                    "data.val_fraction + data.test_fraction must be in [0, 1)"
                );
                anyhow::ensure!(
                    matches!(
                        self.model,
                        ModelConfig::Bert { .. } | ModelConfig::Lstm(_) | ModelConfig::Gru(_)
                    ),
                    "model.kind must be a text model (bert, lstm, gru) for text data"
                );
            }
            DataConfig::Idx {
                val_fraction, std, ..
            }
            | DataConfig::Folder {
                val_fraction, std, ..
            } => {
                if let DataConfig::Folder {
                    channels,
                    height,
                    width,
                    ..
                } = &self.data
                {
                    anyhow::ensure!(
                        matches!(channels, 1 | 3),
                        "data.channels must be 1 or 3, not {channels}"
                    );
                    anyhow::ensure!(
                        *height > 0 && *width > 0,
                        "data.height and data.width must be positive"
                    );
                }
                anyhow::ensure!(
                    (0.0..1.0).contains(val_fraction),
                    "data.val_fraction must be in [0, 1)"
                );
                anyhow::ensure!(*std > 0.0, "data.std must be positive");
                anyhow::ensure!(
                    matches!(
                        self.model,
                        ModelConfig::Vit(_)
                            | ModelConfig::Cnn { .. }
                            | ModelConfig::Autoencoder(_)
                            | ModelConfig::Gan(_)
                            | ModelConfig::EfficientnetLite0(_)
                    ),
                    "model.kind must be an image model (vit, cnn, efficientnet_lite0, autoencoder, gan) for image data"
                );
            }
            DataConfig::Table {
                val_fraction,
                test_fraction,
                delimiter,
                ..
            } => {
                if let Some(d) = delimiter {
                    anyhow::ensure!(
                        d.is_ascii() && !matches!(d, '"' | '\n' | '\r'),
                        "data.delimiter {d:?}: one ASCII character other than a quote or a line break"
                    );
                }
                anyhow::ensure!(
                    *val_fraction >= 0.0 && *test_fraction >= 0.0 && val_fraction + test_fraction < 1.0,
                    "data.val_fraction + data.test_fraction must be in [0, 1)"
                );
                anyhow::ensure!(
                    matches!(
                        self.model,
                        ModelConfig::Mlp { .. } | ModelConfig::Sequential(_) | ModelConfig::Autoencoder(_)
                    ),
                    "model.kind must be mlp, sequential or autoencoder for table data"
                );
            }
            DataConfig::Series { .. } => {} // validate_series
        }
        Ok(())
    }

    /// Which model kinds go with which data, and the sections (`[gan]`, `[anomaly]`,
    /// `[distill]`) that only some model kinds read.
    fn validate_pairings(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !matches!(self.model, ModelConfig::Forecaster(_))
                || matches!(self.data, DataConfig::Series { .. }),
            "model.kind = \"forecaster\" takes a series (data.kind = \"series\")"
        );
        anyhow::ensure!(
            !matches!(self.model, ModelConfig::Mlp { .. } | ModelConfig::Sequential(_))
                || matches!(self.data, DataConfig::Table { .. }),
            "model.kind = \"mlp\" or \"sequential\" takes table data (data.kind = \"table\")"
        );
        let gan = matches!(self.model, ModelConfig::Gan(_));
        anyhow::ensure!(
            !gan || matches!(self.data, DataConfig::Idx { .. } | DataConfig::Folder { .. }),
            "model.kind = \"gan\" generates images: it takes image data (data.kind = \"idx\" or \"folder\")"
        );
        anyhow::ensure!(
            !gan || (self.distill.is_none() && self.anomaly.is_none()),
            "a gan is neither distilled nor an anomaly detector: remove [distill] / [anomaly]"
        );
        anyhow::ensure!(
            self.gan.is_none() || gan,
            "[gan] scores a GAN's samples: it needs model.kind = \"gan\""
        );
        anyhow::ensure!(
            !gan || self.gan.is_some() || self.train.early_stopping_patience.is_none(),
            "train.early_stopping_patience: a gan stops on the Fréchet distance its [gan] judge gives; add [gan] judge = \"<classifier run>/best\""
        );
        if let Some(g) = &self.gan {
            anyhow::ensure!(
                g.samples >= 2 && g.epoch_samples >= 2,
                "gan.samples and gan.epoch_samples must be at least 2"
            );
        }
        let autoencoder = matches!(self.model, ModelConfig::Autoencoder(_));
        anyhow::ensure!(
            self.anomaly.is_none() || autoencoder,
            "[anomaly] scores examples by their reconstruction error: it needs model.kind = \"autoencoder\""
        );
        anyhow::ensure!(
            !autoencoder || self.distill.is_none(),
            "an autoencoder cannot be distilled (distillation matches class predictions)"
        );
        if let Some(a) = &self.anomaly {
            match &self.data {
                DataConfig::Series { .. } => anyhow::ensure!(
                    a.column.is_some() && a.normal.is_empty(),
                    "[anomaly] on a series takes column = \"<the 0/1 column marking anomalous values>\" (not normal classes)"
                ),
                _ => anyhow::ensure!(
                    !a.normal.is_empty() && a.column.is_none(),
                    "anomaly.normal is empty: name the normal classes (anomaly.column is for a series)"
                ),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[run]
dir = "runs/x"
[data]
kind = "text"
files = ["a.tsv"]
format = "tsv"
text_field = "2"
label_field = "1"
score_bins = "vader"
[model]
kind = "bert"
pretrained = "data/minilm"
[train]
epochs = 2
lr = 5e-5
"#;

    #[test]
    fn parses_a_good_config() {
        let c = RunConfig::parse(GOOD).unwrap();
        assert_eq!(c.train.epochs, 2);
        assert_eq!(c.loader.batch_size, 32);
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_line_and_key() {
        let bad = GOOD.replace("epochs = 2", "epochs = 2\nepoch = 3");
        let e = RunConfig::parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains("line 16") && e.contains("unknown field `epoch`"),
            "{e}"
        );
        let bad = GOOD.replace("lr = 5e-5", "lr = \"fast\"");
        let e = RunConfig::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 16") && e.contains("invalid type"), "{e}");
        let bad = GOOD.replace(
            "pretrained = \"data/minilm\"",
            "pretrained = \"data/minilm\"\ndepth = 3",
        );
        let e = RunConfig::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("unknown field `depth`"), "{e}");
        let bad = GOOD.replace(
            "pretrained = \"data/minilm\"",
            "pretrained = \"data/minilm\"\nlayers = 3",
        );
        let e = RunConfig::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 11") && e.contains("expected a sequence"), "{e}");
        let bad = GOOD.replace("kind = \"bert\"\npretrained = \"data/minilm\"", "kind = \"cnn\"");
        let e = RunConfig::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("text model"), "{e}");
    }
}

#[cfg(test)]
mod shipped_examples {
    /// Every run configuration under `examples/` parses and passes validation as shipped
    /// (a key renamed or a rule added must not leave an example that fails at start-up);
    /// `examples/rl/` holds `trident rl`'s, which trident-rl checks.
    #[test]
    fn every_example_configuration_is_accepted() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut dirs = vec![root];
        let mut checked = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() && !path.ends_with("rl") {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "toml")
                    && path.file_name().unwrap() != "Cargo.toml"
                {
                    super::RunConfig::read(&path).unwrap_or_else(|e| panic!("{e:#}"));
                    checked.push(path);
                }
            }
        }
        assert!(checked.len() >= 30, "{checked:?}");
        assert!(checked.iter().any(|p| p.ends_with("gan/fashion-wgan-gp.toml")));
    }
}
