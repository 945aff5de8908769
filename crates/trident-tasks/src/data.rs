//! Builds datasets and loaders from a [`RunConfig`]; the models themselves are
//! [`trident_zoo`]'s.

use crate::config::{DataConfig, RunConfig};
use anyhow::{bail, Context};
use std::sync::Arc;
use trident_data::folder::ImageFolder;
use trident_data::idx::IdxImages;
use trident_data::sampler::{split_indices, stratified_split, Subset};
use trident_data::table::{Encoder, Missing, Table, TableSpec};
use trident_data::text::{ScoreBins, TextClassification, TextFormat, TextSpec};
use trident_data::{DataError, DataLoader, Dataset, LoaderConfig};
use trident_nn::bert::TextBatch;
pub use trident_zoo::model::{Gan, Net};
pub use trident_zoo::{image_collate, Batch, InputSpec, Model, ModelCard};

/// Tokenised texts with labels.
pub struct TokenSet {
    ids: Vec<Vec<u32>>,
    labels: Vec<usize>,
}

impl Dataset for TokenSet {
    type Item = (Vec<u32>, usize);
    fn len(&self) -> usize {
        self.ids.len()
    }
    fn get(&self, i: usize) -> Result<Self::Item, DataError> {
        Ok((self.ids[i].clone(), self.labels[i]))
    }
}

/// Where images come from.
pub enum ImageSource {
    /// IDX files.
    Idx(Arc<IdxImages>),
    /// A class-per-folder tree of PNG/JPEG files.
    Folder(Arc<ImageFolder>),
}

/// Images, normalised at collate time; training images optionally augmented (random
/// crop after `pad` pixels of zero padding, then a horizontal flip with probability ½, the
/// same for every channel), drawn from (seed, epoch, index) so a resumed run sees the same
/// views.
pub struct ImageSet {
    source: ImageSource,
    shape: (usize, usize, usize),
    augment: Option<(usize, u64)>,
}

impl ImageSet {
    fn with_augment(&self, augment: Option<(usize, u64)>) -> Self {
        let source = match &self.source {
            ImageSource::Idx(i) => ImageSource::Idx(i.clone()),
            ImageSource::Folder(f) => ImageSource::Folder(f.clone()),
        };
        ImageSet {
            source,
            shape: self.shape,
            augment,
        }
    }
}

impl ImageSource {
    /// The class of image `i`, without decoding it.
    fn label(&self, i: usize) -> usize {
        match self {
            ImageSource::Idx(s) => s.label(i),
            ImageSource::Folder(f) => f.label(i),
        }
    }
}

/// `[anomaly]`: keeps the examples of the normal classes (training and validation splits).
fn keep_normal(idx: &mut Vec<usize>, normal: Option<&[usize]>, label: impl Fn(usize) -> usize) {
    if let Some(normal) = normal {
        idx.retain(|&i| normal.contains(&label(i)));
    }
}

impl Dataset for ImageSet {
    type Item = trident_data::idx::Image;
    fn len(&self) -> usize {
        match &self.source {
            ImageSource::Idx(i) => i.len(),
            ImageSource::Folder(f) => f.len(),
        }
    }
    fn get(&self, i: usize) -> Result<Self::Item, DataError> {
        match &self.source {
            ImageSource::Idx(s) => s.get(i),
            ImageSource::Folder(f) => f.get(i),
        }
    }
    fn get_in_epoch(&self, i: usize, epoch: u64) -> Result<Self::Item, DataError> {
        let mut im = self.get(i)?;
        if let Some((pad, seed)) = self.augment {
            let (c, h, w) = self.shape;
            let mut out = Vec::with_capacity(im.pixels.len());
            for plane in im.pixels.chunks(h * w).take(c) {
                out.extend(trident_data::transform::augment(
                    plane, h, w, pad, seed, epoch, i as u64,
                ));
            }
            im.pixels = out;
        }
        Ok(im)
    }
}

/// Train, validation and test loaders for a run.
pub struct Splits<D: Dataset> {
    pub train: DataLoader<Subset<D>, Batch>,
    pub val: Option<DataLoader<Subset<D>, Batch>>,
    pub test: DataLoader<Subset<D>, Batch>,
    pub sizes: (usize, usize, usize),
}

fn loader_config(c: &RunConfig, train: bool) -> LoaderConfig {
    LoaderConfig {
        batch_size: if train {
            c.loader.batch_size
        } else {
            c.loader.eval_batch_size.unwrap_or(c.loader.batch_size)
        },
        shuffle: train,
        seed: c.run.seed,
        drop_last: false,
        num_workers: c.loader.num_workers,
        prefetch: c.loader.prefetch,
    }
}

/// Classes and input spec the data implies (before reading it whole).
pub fn read_text(c: &RunConfig) -> anyhow::Result<TextClassification> {
    let DataConfig::Text {
        files,
        format,
        text_field,
        label_field,
        has_header,
        classes,
        score_bins,
        ..
    } = &c.data
    else {
        bail!("not text data")
    };
    let spec = TextSpec {
        format: match format.as_str() {
            "csv" => TextFormat::Csv,
            "tsv" => TextFormat::Tsv,
            _ => TextFormat::Jsonl,
        },
        text_field: text_field.clone(),
        label_field: label_field.clone(),
        has_header: *has_header,
        classes: classes.clone(),
        score_bins: score_bins.as_ref().map(|_| ScoreBins::vader()),
    };
    Ok(TextClassification::read_all(files, &spec)?)
}

/// Tokenises a whole text set, refusing over-long texts with their file and line.
pub fn tokenize_all(model: &Model, set: &TextClassification) -> anyhow::Result<TokenSet> {
    let mut ids = Vec::with_capacity(set.len());
    let mut labels = Vec::with_capacity(set.len());
    for i in 0..set.len() {
        let ex = set.get(i)?;
        let what = || {
            let (f, l) = set.source(i);
            format!("{}:{l}", f.display())
        };
        ids.push(model.tokenize(&ex.text, &what)?);
        labels.push(ex.label);
    }
    Ok(TokenSet { ids, labels })
}

fn text_collate(
    pad_id: u32,
) -> impl Fn(Vec<(Vec<u32>, usize)>) -> Result<Batch, DataError> + Send + Sync + 'static {
    move |items| {
        let (seqs, labels): (Vec<_>, Vec<_>) = items.into_iter().unzip();
        let len = seqs.iter().map(Vec::len).max().unwrap_or(1);
        let (ids, mask, len) = trident_data::transform::pad_sequences(&seqs, pad_id, len);
        let n = seqs.len();
        let b = TextBatch::new(ids, vec![0; n * len], mask, n, len)
            .map_err(|e| DataError::Batch(e.to_string()))?;
        Ok(Batch::Text(b, labels))
    }
}

/// Text splits (seeded) and their loaders.
pub fn text_splits(
    c: &RunConfig,
    model: &Model,
    set: &TextClassification,
) -> anyhow::Result<Splits<TokenSet>> {
    let DataConfig::Text {
        val_fraction,
        test_fraction,
        ..
    } = &c.data
    else {
        bail!("not text data")
    };
    let tokens = Arc::new(tokenize_all(model, set)?);
    let (tr, va, te) = split_indices(tokens.len(), *val_fraction, *test_fraction, c.run.seed);
    let pad = model.tokenizer.as_ref().map(|t| t.pad_id).unwrap_or(0);
    let sizes = (tr.len(), va.len(), te.len());
    let mk = |idx: Vec<usize>, train: bool| {
        DataLoader::new(
            Arc::new(Subset::new(tokens.clone(), idx)),
            loader_config(c, train),
            text_collate(pad),
        )
    };
    Ok(Splits {
        val: (!va.is_empty()).then(|| mk(va, false)),
        test: mk(te, false),
        train: mk(tr, true),
        sizes,
    })
}

/// Image loaders, class names and (channels, height, width).
pub type ImageSplits = (Splits<ImageSet>, Vec<String>, (usize, usize, usize));

/// The images of a run: train set → train/val (seeded), test set → test. Returns the
/// loaders, the class names and the (channels, height, width) of every image.
pub fn image_splits(c: &RunConfig) -> anyhow::Result<ImageSplits> {
    let opts = c.data.image_options().context("not image data")?;
    let (train, test, classes, shape) = match &c.data {
        DataConfig::Idx {
            train_images,
            train_labels,
            test_images,
            test_labels,
            classes,
            ..
        } => {
            let train = Arc::new(IdxImages::open(train_images, train_labels)?);
            let test = Arc::new(IdxImages::open(test_images, test_labels)?);
            let (h, w) = train.image_size();
            if test.image_size() != (h, w) {
                bail!(
                    "{}: images are {:?}, the training images {:?}",
                    test_images.display(),
                    test.image_size(),
                    (h, w)
                );
            }
            let classes = classes
                .clone()
                .unwrap_or_else(|| (0..10).map(|i| i.to_string()).collect());
            (
                ImageSource::Idx(train),
                ImageSource::Idx(test),
                classes,
                (1, h, w),
            )
        }
        DataConfig::Folder {
            train_dir,
            test_dir,
            channels,
            height,
            width,
            classes,
            ..
        } => {
            let size = (*height, *width);
            let train = ImageFolder::open(train_dir, *channels, size, classes.as_deref())?;
            let classes = train.classes().to_vec();
            let test = ImageFolder::open(test_dir, *channels, size, Some(&classes))?;
            let shape = (*channels, *height, *width);
            (
                ImageSource::Folder(Arc::new(train)),
                ImageSource::Folder(Arc::new(test)),
                classes,
                shape,
            )
        }
        DataConfig::Text { .. } | DataConfig::Table { .. } | DataConfig::Series { .. } => {
            bail!("not image data")
        }
    };
    let (train, test) = (
        ImageSet {
            source: train,
            shape,
            augment: None,
        },
        ImageSet {
            source: test,
            shape,
            augment: None,
        },
    );
    // Validation images come from the training set but are never augmented.
    let plain = Arc::new(train.with_augment(None));
    let train = Arc::new(train.with_augment(opts.augment.then_some((2, c.run.seed))));
    let test = Arc::new(test);
    let n = opts.max_train.map_or(train.len(), |m| m.min(train.len()));
    let (mut tr, mut va, _) = split_indices(n, opts.val_fraction, 0.0, c.run.seed);
    tr.sort_unstable(); // the loader shuffles per epoch; keep the split itself ordered
    if let Some(k) = opts.per_class {
        tr = per_class_draw(&tr, k, classes.len(), c.run.seed, |i| train.source.label(i))?;
    }
    let normal = c.normal_classes(&classes)?;
    keep_normal(&mut tr, normal.as_deref(), |i| train.source.label(i));
    keep_normal(&mut va, normal.as_deref(), |i| train.source.label(i));
    if tr.is_empty() {
        bail!(
            "no training image is left of the normal classes {:?}",
            c.anomaly.as_ref().map(|a| &a.normal)
        );
    }
    let sizes = (tr.len(), va.len(), test.len());
    let mk = |d: &Arc<ImageSet>, idx: Vec<usize>, train: bool| {
        DataLoader::new(
            Arc::new(Subset::new(d.clone(), idx)),
            loader_config(c, train),
            image_collate(shape, opts.mean, opts.std),
        )
    };
    Ok((
        Splits {
            val: (!va.is_empty()).then(|| mk(&plain, va, false)),
            test: mk(&test, (0..test.len()).collect(), false),
            train: mk(&train, tr, true),
            sizes,
        },
        classes,
        shape,
    ))
}

/// Encoded table rows (`width` features each) with labels.
pub struct FeatureSet {
    x: Vec<f32>,
    width: usize,
    labels: Vec<usize>,
}

impl Dataset for FeatureSet {
    type Item = (Vec<f32>, usize);
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn get(&self, i: usize) -> Result<Self::Item, DataError> {
        Ok((
            self.x[i * self.width..(i + 1) * self.width].to_vec(),
            self.labels[i],
        ))
    }
}

/// Stacks encoded rows into a `[n, width]` batch.
pub fn features_collate(
    width: usize,
) -> impl Fn(Vec<(Vec<f32>, usize)>) -> Result<Batch, DataError> + Send + Sync + 'static {
    move |items| {
        let n = items.len();
        let mut x = Vec::with_capacity(n * width);
        let mut labels = Vec::with_capacity(n);
        for (row, label) in items {
            x.extend(row);
            labels.push(label);
        }
        let x = trident_nn::Tensor::from_vec(x, (n, width), &trident_nn::Device::Cpu)
            .map_err(|e| DataError::Batch(e.to_string()))?;
        Ok(Batch::Features(x, labels))
    }
}

/// A checkpoint's table model: what it reads, to encode new rows the way it was trained.
pub struct Fitted<'a> {
    pub label: &'a str,
    pub encoder: &'a Encoder,
    pub classes: &'a [String],
}

/// A run's table: loaders, class names, the label column and the feature encoder.
pub struct TableData {
    pub splits: Splits<FeatureSet>,
    pub classes: Vec<String>,
    pub label: String,
    pub encoder: Encoder,
}

/// The rows of a `table` run, split within each class by the run's seed. Without `fitted`
/// the encoder is fitted on the training rows only (those kept by the missing-value
/// policy); with it (evaluation of a checkpoint), the checkpoint's encoder, label column
/// and classes are used as they are.
pub fn table_splits(c: &RunConfig, fitted: Option<Fitted>) -> anyhow::Result<TableData> {
    let DataConfig::Table {
        file,
        sklearn_header,
        delimiter,
        label,
        classes,
        val_fraction,
        test_fraction,
        ..
    } = &c.data
    else {
        bail!("not table data")
    };
    let spec = TableSpec {
        sklearn_header: *sklearn_header,
        delimiter: delimiter.map(|d| d as u8),
    };
    let table = Table::read(file, &spec)?;
    let label_name = match (&fitted, label) {
        (Some(f), _) => f.label.to_string(),
        (None, Some(l)) => l.clone(),
        (None, None) => table.columns.last().cloned().context("the table has no column")?,
    };
    let label_col = column_of(&table, &label_name, "data.label")?;
    let wanted = fitted.as_ref().map(|f| f.classes).or(classes.as_deref());
    let (classes, labels) = table.class_labels(label_col, wanted)?;
    if classes.len() < 2 {
        bail!(
            "{}: the label column {label_name:?} holds {} class(es) {classes:?}; a classifier needs at least 2",
            file.display(),
            classes.len()
        );
    }
    // (table row, class) of every row that has a label, split within each class.
    let labelled: Vec<(usize, usize)> = labels
        .iter()
        .enumerate()
        .filter_map(|(r, l)| l.map(|l| (r, l)))
        .collect();
    let unlabelled = table.rows.len() - labelled.len();
    let y: Vec<usize> = labelled.iter().map(|&(_, l)| l).collect();
    let mut splits = stratified_split(&y, *val_fraction, *test_fraction, c.run.seed);
    let normal = c.normal_classes(&classes)?;
    keep_normal(&mut splits.0, normal.as_deref(), |i| y[i]);
    keep_normal(&mut splits.1, normal.as_deref(), |i| y[i]);
    let rows = |split: &[usize]| -> Vec<(usize, usize)> { split.iter().map(|&i| labelled[i]).collect() };
    let encoder = match &fitted {
        Some(f) => f.encoder.clone(),
        None => fit_encoder(&c.data, &table, label_col, &rows(&splits.0))?,
    };
    let at = encoder.locate(&table)?;
    let (mut x, mut ys) = (Vec::new(), Vec::new());
    let (tr, d_tr) = encode_rows(&encoder, &table, &at, &rows(&splits.0), &mut x, &mut ys)?;
    let (va, d_va) = encode_rows(&encoder, &table, &at, &rows(&splits.1), &mut x, &mut ys)?;
    let (te, d_te) = encode_rows(&encoder, &table, &at, &rows(&splits.2), &mut x, &mut ys)?;
    let dropped = d_tr + d_va + d_te;
    eprintln!(
        "table {}: {} rows; {}{}{}",
        file.display(),
        table.rows.len(),
        encoder.summary(),
        if dropped > 0 {
            format!(" ({dropped} rows dropped: {d_tr} train / {d_va} val / {d_te} test)")
        } else {
            String::new()
        },
        if unlabelled > 0 {
            format!("; {unlabelled} rows without a label left out")
        } else {
            String::new()
        },
    );
    if tr.is_empty() && fitted.is_none() {
        bail!("{}: no training row is left", file.display());
    }
    let width = encoder.width();
    let set = Arc::new(FeatureSet { x, width, labels: ys });
    let sizes = (tr.len(), va.len(), te.len());
    let mk = |idx: Vec<usize>, train: bool| {
        DataLoader::new(
            Arc::new(Subset::new(set.clone(), idx)),
            loader_config(c, train),
            features_collate(width),
        )
    };
    Ok(TableData {
        splits: Splits {
            val: (!va.is_empty()).then(|| mk(va, false)),
            test: mk(te, false),
            train: mk(tr, true),
            sizes,
        },
        classes,
        label: label_name,
        encoder,
    })
}

/// The column `name` of `table`; the error names the config key and the file's columns.
fn column_of(table: &Table, name: &str, key: &str) -> anyhow::Result<usize> {
    table.column_index(name).with_context(|| {
        format!(
            "{key} = {name:?}: {} has no such column (its columns: {:?})",
            table.file.display(),
            table.columns
        )
    })
}

/// A new encoder for a `table` run: its feature columns (`data.features`, or every column
/// but the label and `data.ignore`), fitted on the training rows `train` ((row, class)) —
/// under `missing = "drop"` on the complete ones, the rows the model will train on.
fn fit_encoder(
    data: &DataConfig,
    table: &Table,
    label_col: usize,
    train: &[(usize, usize)],
) -> anyhow::Result<Encoder> {
    let DataConfig::Table {
        features,
        ignore,
        categorical,
        missing,
        scaling,
        ..
    } = data
    else {
        bail!("not table data")
    };
    for name in ignore.iter().chain(categorical) {
        column_of(table, name, "data.ignore / data.categorical")?;
    }
    let cols: Vec<usize> = match features {
        Some(names) => names
            .iter()
            .map(|n| column_of(table, n, "data.features"))
            .collect::<anyhow::Result<_>>()?,
        None => (0..table.columns.len())
            .filter(|&i| i != label_col && !ignore.contains(&table.columns[i]))
            .collect(),
    };
    if cols.is_empty() {
        bail!("{}: no feature column is left", table.file.display());
    }
    if cols.contains(&label_col) {
        bail!(
            "data.features lists the label column {:?}",
            table.columns[label_col]
        );
    }
    let fit_rows: Vec<usize> = train
        .iter()
        .map(|&(r, _)| r)
        .filter(|&r| *missing == Missing::Impute || cols.iter().all(|&k| table.rows[r][k].is_some()))
        .collect();
    Ok(Encoder::fit(
        table,
        &cols,
        categorical,
        &fit_rows,
        *missing,
        *scaling,
    )?)
}

/// Encodes `rows` ((table row, class)) onto `x` and `ys`: the indices they got there, and
/// how many the missing-value policy dropped.
fn encode_rows(
    encoder: &Encoder,
    table: &Table,
    at: &[usize],
    rows: &[(usize, usize)],
    x: &mut Vec<f32>,
    ys: &mut Vec<usize>,
) -> anyhow::Result<(Vec<usize>, usize)> {
    let (mut kept, mut dropped) = (Vec::new(), 0);
    for &(r, class) in rows {
        match encoder.encode_row(table, r, at, x)? {
            Some(()) => {
                kept.push(ys.len());
                ys.push(class);
            }
            None => dropped += 1,
        }
    }
    Ok((kept, dropped))
}

/// Series windows in the model's scale: `width` inputs (the window's values, then any
/// calendar features) and `horizon` targets each.
pub struct WindowSet {
    x: Vec<f32>,
    y: Vec<f32>,
    width: usize,
    horizon: usize,
}

impl Dataset for WindowSet {
    type Item = WindowItem;
    fn len(&self) -> usize {
        self.x.len() / self.width
    }
    fn get(&self, i: usize) -> Result<Self::Item, DataError> {
        Ok((
            self.x[i * self.width..(i + 1) * self.width].to_vec(),
            self.y[i * self.horizon..(i + 1) * self.horizon].to_vec(),
        ))
    }
}

/// A run's series: the windows' loaders, the fitted spec, the values, and where the test
/// part starts.
pub struct SeriesData {
    pub splits: Splits<WindowSet>,
    pub spec: trident_zoo::SeriesSpec,
    pub series: trident_data::series::Series,
    pub test_start: usize,
}

/// The series of a `series` run read as it is (column `column`, the card's), and where
/// its held-out test part starts: what a trained model's test needs, without its windows.
pub fn read_series(c: &RunConfig, column: &str) -> anyhow::Result<(trident_data::series::Series, usize)> {
    let DataConfig::Series { file, test, .. } = &c.data else {
        bail!("not series data")
    };
    let series = trident_data::series::Series::read(file, Some(column))?;
    let n = series.values.len();
    if *test >= n {
        bail!("data.test = {test}: {} holds only {n} values", file.display());
    }
    Ok((series, n - test))
}

/// The windows of a `series` run: training windows whose targets end before the
/// validation part (every `step` values), validation windows whose targets lie in it, and
/// test windows whose targets lie in the test part (for the loss; the backtest forecasts
/// the test part itself). The log and the scale are fitted on the training part, or taken
/// from `fitted` (a checkpoint's).
pub fn series_splits(c: &RunConfig, fitted: Option<&trident_zoo::SeriesSpec>) -> anyhow::Result<SeriesData> {
    let DataConfig::Series {
        file,
        column,
        window,
        horizon,
        step,
        log,
        normalize,
        test,
        val,
        season,
        calendar,
        ..
    } = &c.data
    else {
        bail!("not series data")
    };
    let column = fitted.map(|f| f.column.as_str()).or(column.as_deref());
    let series = trident_data::series::Series::read(file, column)?;
    let v = &series.values;
    let n = v.len();
    let (w, h) = (*window, *horizon);
    let train_end = n.checked_sub(test + val).filter(|&e| e >= w + h).with_context(|| {
        format!(
            "{}: {n} values leave no training window: data.test + data.val = {} and a window of {w} + {h} need {} at least",
            file.display(),
            test + val,
            test + val + w + h
        )
    })?;
    if *log {
        if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| **x <= 0.0) {
            bail!(
                "{}: value {x} (row {}) is not positive: data.log needs a positive series",
                file.display(),
                i + 1
            );
        }
    }
    let spec = match fitted {
        Some(f) => f.clone(),
        None => {
            let t: Vec<f64> = v[..train_end]
                .iter()
                .map(|&x| if *log { x.ln() } else { x })
                .collect();
            let mean = t.iter().sum::<f64>() / t.len() as f64;
            // The model's inputs are scaled by the spread of what it reads.
            let spread = normalize.read(&t, *season);
            let centre = spread.iter().sum::<f64>() / spread.len().max(1) as f64;
            let var = spread.iter().map(|x| (x - centre).powi(2)).sum::<f64>() / spread.len().max(1) as f64;
            trident_zoo::SeriesSpec {
                column: series.column.clone(),
                window: w,
                horizon: h,
                log: *log,
                normalize: *normalize,
                season: *season,
                mean,
                std: var.sqrt().max(1e-12),
                calendar: calendar.clone(),
            }
        }
    };
    // Windows whose targets start at `t` for t in `starts`.
    let windows = |starts: &mut dyn Iterator<Item = usize>| -> WindowSet {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for t in starts {
            let (input, offsets) = spec.encode(&v[t - w..t], t);
            x.extend(input);
            y.extend(spec.encode_targets(&v[t..t + h], &offsets));
        }
        WindowSet {
            x,
            y,
            width: spec.inputs(),
            horizon: h,
        }
    };
    let test_start = n - test;
    let train = windows(&mut (w..=train_end - h).step_by(*step));
    let val_set =
        windows(&mut (train_end.max(w)..=test_start.saturating_sub(h)).filter(|&t| t + h <= test_start));
    let test_set = windows(&mut (test_start..=n.saturating_sub(h)).filter(|&t| t + h <= n));
    let sizes = (train.len(), val_set.len(), test_set.len());
    let mk = |set: WindowSet, train: bool| {
        let count = set.len();
        DataLoader::new(
            Arc::new(Subset::new(Arc::new(set), (0..count).collect())),
            loader_config(c, train),
            series_collate(spec.inputs(), h),
        )
    };
    let val_loader = (sizes.1 > 0).then(|| mk(val_set, false));
    Ok(SeriesData {
        splits: Splits {
            train: mk(train, true),
            val: val_loader,
            test: mk(test_set, false),
            sizes,
        },
        spec,
        series,
        test_start,
    })
}

/// A window's values and its targets, as [`WindowSet`] gives them.
type WindowItem = (Vec<f32>, Vec<f32>);

/// Stacks windows and their targets into a [`Batch::Series`].
fn series_collate(
    width: usize,
    horizon: usize,
) -> impl Fn(Vec<WindowItem>) -> Result<Batch, DataError> + Send + Sync + 'static {
    move |items| {
        let n = items.len();
        let (mut x, mut y) = (Vec::with_capacity(n * width), Vec::with_capacity(n * horizon));
        for (a, b) in items {
            x.extend(a);
            y.extend(b);
        }
        let err = |e: candle_core::Error| DataError::Batch(e.to_string());
        let x = trident_nn::Tensor::from_vec(x, (n, width), &trident_nn::Device::Cpu).map_err(err)?;
        let y = trident_nn::Tensor::from_vec(y, (n, horizon), &trident_nn::Device::Cpu).map_err(err)?;
        Ok(Batch::Series(x, y))
    }
}

/// `k` indices of each class drawn from `indices` (seeded; kept in ascending order), for
/// few-shot training (`data.per_class`). A class with fewer than `k` is an error that
/// names it.
fn per_class_draw(
    indices: &[usize],
    k: usize,
    classes: usize,
    seed: u64,
    label: impl Fn(usize) -> usize,
) -> anyhow::Result<Vec<usize>> {
    if k == 0 {
        bail!("data.per_class must be at least 1");
    }
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); classes];
    for &i in indices {
        by_class[label(i)].push(i);
    }
    let mut out = Vec::with_capacity(k * classes);
    for (c, mut pool) in by_class.into_iter().enumerate() {
        if pool.len() < k {
            bail!(
                "data.per_class = {k}: class {c} has {} training images",
                pool.len()
            );
        }
        // A seeded Fisher–Yates prefix per class.
        let mut s =
            trident_nn::ops::splitmix(seed ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x7065_7263);
        for j in 0..k {
            s = trident_nn::ops::splitmix(s);
            let pick = j + (s % (pool.len() - j) as u64) as usize;
            pool.swap(j, pick);
        }
        out.extend_from_slice(&pool[..k]);
    }
    out.sort_unstable();
    Ok(out)
}
