//! `trident train`, `trident eval` and `trident predict`.

use trident_tasks::assess::{
    backtest_report, series_anomaly, test_and_report, write_reconstruction, write_report,
};
use trident_tasks::data as task;
use trident_tasks::predict::{predict_forecast, prediction_inputs, predictions};
use trident_tasks::teacher::{distill_step, fill_cache, load_teacher};
pub(crate) use trident_tasks::write_atomic;
use trident_tasks::{config, forecast, gan};

use anyhow::{bail, Context};
use clap::Args;
use config::{DataConfig, RunConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use task::{image_splits, read_text, table_splits, text_splits, InputSpec, Model, ModelCard, Splits};
use trident_data::Dataset;
use trident_train::{evaluate, TrainStep, Trainer};
use trident_zoo::graph_step::{ExportedStep, GraphRunner};

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The run's TOML configuration.
    #[arg(long)]
    config: PathBuf,
    /// Continue the run in `run.dir` from its `last` checkpoint.
    #[arg(long)]
    resume: bool,
    /// Override `run.dir`.
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Override `train.epochs`.
    #[arg(long)]
    epochs: Option<u64>,
    /// Stop (checkpointing, as on Ctrl-C) after this many optimizer steps.
    #[arg(long, hide = true)]
    stop_after_steps: Option<u64>,
    /// Profile the run: step phases, Trident's operators, a Chrome trace and a diagnosis of
    /// the bottleneck, written to `<run>/profile/`.
    #[arg(long)]
    profile: bool,
    /// Profile only optimizer steps N..M (1-based, inclusive), or step N; implies --profile.
    #[arg(long, value_name = "N..M", value_parser = parse_steps)]
    profile_steps: Option<(u64, u64)>,
    /// Data parallelism in this process: N replicas on threads, each with cores / N
    /// threads, each training on its part of every global batch of N × batch_size
    /// examples; gradients summed in shared memory.
    #[arg(long, value_name = "N", conflicts_with = "dist")]
    data_parallel: Option<usize>,
    /// Run as one rank of a data-parallel job started by `mpirun` (Open MPI; a build with
    /// the `mpi` feature). The global batch is ranks × batch_size.
    #[arg(long, value_name = "mpi", value_parser = ["mpi"])]
    dist: Option<String>,
    /// Data parallelism: gradients are summed in buckets of about this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 25.0)]
    bucket_mb: f64,
    /// ZeRO stage: 1 shards the optimizer state across the data-parallel ranks (each
    /// keeps 1/N of AdamW's moments); 0 keeps it whole on every rank.
    #[arg(long, value_name = "STAGE", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    zero: u8,
}

/// How this process takes part in training.
enum Replicas {
    /// Alone.
    One,
    /// N replicas on threads of this process.
    Threads(usize),
    /// One rank of an MPI job.
    #[cfg(feature = "mpi")]
    Mpi(std::sync::Arc<trident_dist::Mpi>),
}

impl Replicas {
    fn from_args(args: &TrainArgs) -> anyhow::Result<Self> {
        match (args.data_parallel, args.dist.as_deref()) {
            (Some(0), _) => bail!("--data-parallel must be at least 1"),
            (Some(1) | None, None) => Ok(Replicas::One),
            (Some(n), None) => Ok(Replicas::Threads(n)),
            (_, Some(_)) => Self::mpi(),
        }
    }

    #[cfg(feature = "mpi")]
    fn mpi() -> anyhow::Result<Self> {
        let comm = trident_dist::Mpi::init(trident_dist::default_timeout())?;
        // The ranks on this machine share its cores.
        let local: usize = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let threads = (cores() / local.max(1)).max(1);
        if rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .is_err()
        {
            eprintln!(
                "rank {}: the thread pool was already started; not limiting it to {threads}",
                {
                    use trident_dist::Communicator;
                    comm.rank()
                }
            );
        }
        Ok(Replicas::Mpi(std::sync::Arc::new(comm)))
    }

    #[cfg(not(feature = "mpi"))]
    fn mpi() -> anyhow::Result<Self> {
        bail!("--dist mpi: this trident was built without MPI; build it with `--features mpi` (needs libopenmpi-dev)")
    }

    /// Whether this process writes the run directory and reports (rank 0).
    fn lead(&self) -> bool {
        match self {
            #[cfg(feature = "mpi")]
            Replicas::Mpi(c) => trident_dist::Communicator::rank(c.as_ref()) == 0,
            _ => true,
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `N..M` or `N` (1-based optimizer steps).
fn parse_steps(s: &str) -> Result<(u64, u64), String> {
    let num = |t: &str| {
        t.trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("`{t}` is not a step number (1, 2, …)"))
    };
    let (a, b) = match s.split_once("..") {
        Some((a, b)) => (num(a)?, num(b.trim_start_matches('='))?),
        None => (num(s)?, num(s)?),
    };
    if a > b {
        return Err(format!("{s}: the first step is after the last"));
    }
    Ok((a, b))
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// A checkpoint directory (`<run>/best` or `<run>/last`).
    #[arg(long)]
    model: PathBuf,
    /// Which split of the run's data: test or val.
    #[arg(long, default_value = "test")]
    split: String,
    /// Evaluate every example of this file instead (same format as the run's data).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Where to write metrics.json and confusion.png (default: `<model>/eval-<split>`,
    /// `<model>/eval-<split>-onnx` with `--onnx`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Evaluate this exported ONNX file of the checkpoint instead of the checkpoint
    /// itself, on the same split with the same metrics (e.g. an int8 export against fp32).
    #[arg(long)]
    onnx: Option<PathBuf>,
    /// The engine that runs `--onnx`: ort (ONNX Runtime, the default; contrib operators)
    /// or tract.
    #[arg(long, requires = "onnx")]
    engine: Option<String>,
    /// An agent of `trident rl`: greedy episodes to play (default: the run's
    /// `eval_episodes`).
    #[arg(long)]
    episodes: Option<u64>,
    /// An agent of `trident rl`: the first episode's seed (default: the run's `eval_seed`).
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// A checkpoint directory (`<run>/best` or `<run>/last`).
    #[arg(long)]
    model: PathBuf,
    /// Texts to classify for a text model, PNG/JPEG files for an image model, for a table
    /// model CSV rows of feature values in the model's column order or CSV files whose
    /// header names the columns, or in scikit-learn's bundled layout (one JSON line of output per text, image or row).
    #[arg(required = true, value_name = "INPUT")]
    inputs: Vec<String>,
}

fn card_for(c: &RunConfig, classes: Vec<String>, image: Option<(usize, usize, usize)>) -> ModelCard {
    let input = match (&c.data, image) {
        (
            DataConfig::Text {
                max_len, truncate, ..
            },
            _,
        ) => InputSpec::Text {
            max_len: *max_len,
            truncate: *truncate,
        },
        (DataConfig::Idx { mean, std, .. } | DataConfig::Folder { mean, std, .. }, Some((ch, h, w))) => {
            InputSpec::Image {
                channels: ch,
                height: h,
                width: w,
                mean: *mean,
                std: *std,
            }
        }
        (DataConfig::Idx { .. } | DataConfig::Folder { .. }, None) => {
            unreachable!("image shape is known for image data")
        }
        (DataConfig::Table { .. } | DataConfig::Series { .. }, _) => {
            unreachable!("a table's or series' card holds what was fitted: `train` builds it from its splits")
        }
    };
    ModelCard {
        model: c.model.clone(),
        classes,
        input,
    }
}

fn install_signal_handlers(trainer: &Trainer) -> anyhow::Result<()> {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, trainer.stop.clone()).context("installing signal handler")?;
    }
    Ok(())
}

/// `trident train`, or with `distill` `trident distill` (which needs a `[distill]` section).
pub fn train(args: TrainArgs, distill: bool) -> anyhow::Result<()> {
    // MPI starts first: it fixes each rank's thread pool before anything uses it.
    let replicas = Replicas::from_args(&args)?;
    let mut c = RunConfig::read(&args.config)?;
    match (distill, &c.distill) {
        (false, Some(_)) => bail!(
            "{}: has a [distill] section: run it with `trident distill --config {}`",
            args.config.display(),
            args.config.display()
        ),
        (true, None) => bail!(
            "{}: `trident distill` needs a [distill] section (teacher = \"<run>/best\", [distill.loss])",
            args.config.display()
        ),
        _ => {}
    }
    if let Some(d) = args.run_dir.clone() {
        c.run.dir = d;
    }
    if let Some(e) = args.epochs {
        c.train.epochs = e;
    }
    match &c.data {
        DataConfig::Text { .. } => {
            let set = read_text(&c)?;
            let card = card_for(&c, set.classes().to_vec(), None);
            let model = Model::build(&card, c.run.seed, None)?;
            let fresh = model.params.initialised_names();
            if !fresh.is_empty() {
                eprintln!("initialised (not in the pretrained file): {}", fresh.join(", "));
            }
            let splits = text_splits(&c, &model, &set)?;
            run(&c, &args, model, splits, &replicas)
        }
        DataConfig::Idx { .. } | DataConfig::Folder { .. } => {
            let (splits, classes, shape) = image_splits(&c)?;
            let card = card_for(&c, classes, Some(shape));
            let model = Model::build(&card, c.run.seed, None)?;
            if model.net.is::<task::Gan>() {
                if !matches!(replicas, Replicas::One) {
                    bail!("a gan trains in one process: remove --data-parallel / --dist");
                }
                return train_gan(&c, &args, model, splits);
            }
            run(&c, &args, model, splits, &replicas)
        }
        DataConfig::Table { .. } => {
            let t = table_splits(&c, None)?;
            let card = ModelCard {
                model: c.model.clone(),
                classes: t.classes,
                input: InputSpec::Table {
                    label: t.label,
                    encoder: t.encoder,
                },
            };
            let model = Model::build(&card, c.run.seed, None)?;
            run(&c, &args, model, t.splits, &replicas)
        }
        DataConfig::Series { .. } => {
            let s = task::series_splits(&c, None)?;
            eprintln!(
                "series {}: {} values of {:?}; the last {} held out for the test",
                s.series.file.display(),
                s.series.values.len(),
                s.spec.column,
                s.series.values.len() - s.test_start
            );
            let card = ModelCard {
                model: c.model.clone(),
                classes: Vec::new(),
                input: InputSpec::Series(s.spec),
            };
            let model = Model::build(&card, c.run.seed, None)?;
            run(&c, &args, model, s.splits, &replicas)
        }
    }
}

fn run<D: Dataset + 'static>(
    c: &RunConfig,
    args: &TrainArgs,
    mut model: Model,
    splits: Splits<D>,
    replicas: &Replicas,
) -> anyhow::Result<()> {
    let config_file = &args.config;
    let teacher = load_teacher(c, &model)?;
    let lead = replicas.lead();
    let classes = model.card.classes.clone();
    let (tr, va, te) = splits.sizes;
    eprintln!(
        "{}: {} trainable parameters of {}; data {tr} train / {va} val / {te} test, classes {classes:?}",
        config_file.display(),
        model.params.trainable_count(),
        model.param_count(),
    );
    if let (Some((t, _)), Some(d)) = (&teacher, &c.distill) {
        eprintln!(
            "teacher {}: {} parameters; the student has {:.1} % of them; loss {:?}",
            d.teacher.display(),
            t.param_count(),
            100.0 * model.param_count() as f64 / t.param_count().max(1) as f64,
            d.loss
        );
    }
    eprintln!("matrix products: {}", trident_nn::blas::backend());
    let (trainer, data_hash) = trainer_for(c, args, &model, lead)?;
    let (summary, teacher) = match (teacher, &c.distill) {
        (Some((teacher, cache)), Some(d)) => {
            // mut: an MPI rank other than 0 swaps in the cache rank 0 wrote.
            #[cfg_attr(not(feature = "mpi"), allow(unused_mut))]
            let mut step = distill_step(d, model, teacher, cache);
            // Cached mode: rank 0 runs the teacher over the training set once and saves the
            // cache; other MPI ranks then read it (replicas on threads open it when built).
            if step.cache.is_some() && lead {
                let augmented = c.data.image_options().is_some_and(|o| o.augment);
                fill_cache(&step, &splits.train, if augmented { c.train.epochs } else { 1 })?;
            }
            #[cfg(feature = "mpi")]
            if let (Replicas::Mpi(comm), Some(_)) = (replicas, &step.cache) {
                trident_dist::Communicator::barrier(comm.as_ref())?;
                if !lead {
                    let (_, cache) = load_teacher(c, &step.student)?.context("the teacher")?;
                    step.cache = cache.map(std::sync::Mutex::new);
                }
            }
            let (ran0, cached0) = (
                step.teacher_batches.load(Ordering::Relaxed),
                step.cached_batches.load(Ordering::Relaxed),
            );
            // Replicas beyond rank 0 build their own student and teacher.
            let card = step.student.card.clone();
            let make = || -> anyhow::Result<_> {
                let student = Model::build(&card, c.run.seed, None)?;
                let (teacher, cache) = load_teacher(c, &student)?.context("the teacher")?;
                Ok(distill_step(d, student, teacher, cache))
            };
            let (s, step) = fit_replicas(c, args, &trainer, step, &make, &splits, &data_hash, replicas)?;
            if lead {
                step.save_cache()?;
                eprintln!(
                    "teacher: {} batches run during training, {} from the cache{}",
                    step.teacher_batches.load(Ordering::Relaxed) - ran0,
                    step.cached_batches.load(Ordering::Relaxed) - cached0,
                    if matches!(replicas, Replicas::One) {
                        ""
                    } else {
                        " (rank 0)"
                    }
                );
            }
            model = step.student;
            (s, Some(step.teacher))
        }
        _ => {
            let card = model.card.clone();
            let make = || Ok(Model::build(&card, c.run.seed, None)?);
            let (s, m) = fit_replicas(c, args, &trainer, model, &make, &splits, &data_hash, replicas)?;
            model = m;
            (s, None)
        }
    };
    if !lead {
        return Ok(());
    }
    let peak_rss = trident_train::monitor::peak_rss_bytes();
    if summary.interrupted {
        eprintln!(
            "stopped at epoch {}, batch {}: resume with `trident {} --config {} --resume`",
            summary.state.epoch + 1,
            summary.state.batch_in_epoch,
            if c.distill.is_some() { "distill" } else { "train" },
            config_file.display()
        );
        if trainer.stop.load(Ordering::SeqCst) {
            std::process::exit(130);
        }
        return Ok(());
    }
    // Test the best checkpoint.
    test_and_report(c, &model, teacher.as_ref(), &splits, &summary, peak_rss)
}

/// The trainer of a run (its checkpoint files, stop budget, progress, profiling and
/// signal handlers), the run directory with its `config.toml`, and the hash of everything
/// beyond `[train]` that shapes the run (it joins the resume check).
fn trainer_for(
    c: &RunConfig,
    args: &TrainArgs,
    model: &Model,
    lead: bool,
) -> anyhow::Result<(Trainer, String)> {
    let dir = &c.run.dir;
    let mut trainer = Trainer::new(c.train.clone(), model.card.classes.clone(), dir);
    trainer.checkpoint_files = model.checkpoint_files()?;
    let resolved = toml::to_string_pretty(c)?;
    trainer
        .checkpoint_files
        .push(("run.toml".into(), resolved.clone().into_bytes()));
    trainer.stop_after_steps = args.stop_after_steps;
    trainer.progress = lead;
    if lead && (args.profile || args.profile_steps.is_some()) {
        trainer.profile = Some(trident_train::profile::ProfileOptions {
            steps: args.profile_steps,
            dir: dir.join("profile"),
            num_workers: c.loader.num_workers,
            bf16: c.train.precision == trident_train::trainer::Precision::Bf16,
        });
    }
    install_signal_handlers(&trainer)?;
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    if !args.resume && lead {
        write_atomic(&dir.join("config.toml"), resolved.as_bytes())?;
    }
    let data_hash = format!(
        "{:?}|{:?}|{:?}|{}|{:?}|{:?}",
        c.data, c.loader, c.model, c.run.seed, c.distill, c.gan
    );
    Ok((trainer, data_hash))
}

/// `trident train` of a GAN: the adversarial loop, a sample grid per epoch, and with
/// `[gan] judge` the sample-quality report of the best epoch (`<run>/report.json`).
fn train_gan(
    c: &RunConfig,
    args: &TrainArgs,
    model: Model,
    splits: Splits<task::ImageSet>,
) -> anyhow::Result<()> {
    let (tr, va, te) = splits.sizes;
    eprintln!(
        "{}: {} parameters (generator {}, discriminator {}); data {tr} train / {va} val / {te} test",
        args.config.display(),
        model.param_count(),
        model
            .params
            .all()
            .iter()
            .filter(|p| p.name.starts_with("generator."))
            .map(|p| p.var.elem_count())
            .sum::<usize>(),
        model
            .params
            .all()
            .iter()
            .filter(|p| p.name.starts_with("discriminator."))
            .map(|p| p.var.elem_count())
            .sum::<usize>(),
    );
    let (trainer, data_hash) = trainer_for(c, args, &model, true)?;
    let step = trident_zoo::gan_step::GanStep::new(&model)?;
    let review = gan::EpochReview::new(&step, c, splits.val.as_ref())?;
    let mut judge = |epoch: u64| {
        review
            .review(epoch)
            .map_err(|e| trident_train::TrainError::Invalid(format!("{e:#}")))
    };
    let summary = trainer.fit_adversarial(&step, &splits.train, args.resume, &data_hash, &mut judge)?;
    let dir = &c.run.dir;
    if summary.interrupted {
        eprintln!(
            "stopped at epoch {}, batch {}: resume with `trident train --config {} --resume`",
            summary.state.epoch + 1,
            summary.state.batch_in_epoch,
            args.config.display()
        );
        if trainer.stop.load(Ordering::SeqCst) {
            std::process::exit(130);
        }
        return Ok(());
    }
    let best = dir.join("best");
    eprintln!(
        "samples of every epoch in {}; best epoch {}",
        dir.join("samples").display(),
        summary.state.best_epoch.map_or(0, |e| e + 1)
    );
    let Some(section) = &c.gan else {
        eprintln!("no [gan] judge: the samples are not scored (add [gan] judge = \"<a cnn run>/best\")");
        return Ok(());
    };
    let best_model = Model::load_checkpoint(&best)?;
    let best_step = trident_zoo::gan_step::GanStep::new(&best_model)?;
    let report = gan::report(&best_step, section, &splits.train, &splits.test, dir)?;
    for l in report.lines() {
        println!("{l}");
    }
    println!("wrote {}/report.json, samples.png and classes.png", dir.display());
    Ok(())
}

/// Trains `model` (rank 0's step) alone, as N replicas on threads (the others made by
/// `make`), or as one MPI rank; returns rank 0's summary and step.
#[allow(clippy::too_many_arguments)]
fn fit_replicas<S, D>(
    c: &RunConfig,
    args: &TrainArgs,
    trainer: &Trainer,
    model: S,
    make: &(dyn Fn() -> anyhow::Result<S> + Sync),
    splits: &Splits<D>,
    data_hash: &str,
    replicas: &Replicas,
) -> anyhow::Result<(trident_train::trainer::FitSummary, S)>
where
    S: TrainStep<Batch = task::Batch> + Send + Sync,
    D: Dataset + 'static,
{
    use std::sync::Arc;
    use trident_dist::Communicator;
    use trident_train::ddp::DataParallel;
    let resume = args.resume;
    let dp = |comm: Arc<dyn Communicator>| DataParallel {
        comm,
        bucket_mb: args.bucket_mb,
        zero: args.zero == 1,
    };
    match replicas {
        Replicas::One if args.zero > 0 => {
            bail!("--zero 1 shards the optimizer state across data-parallel ranks: add --data-parallel N or --dist mpi")
        }
        Replicas::One => {
            let s = trainer.fit(&model, &splits.train, splits.val.as_ref(), resume, data_hash)?;
            Ok((s, model))
        }
        #[cfg(feature = "mpi")]
        Replicas::Mpi(comm) => {
            let comm: Arc<dyn Communicator> = comm.clone();
            let (rank, world) = (comm.rank(), comm.world_size());
            if rank == 0 {
                eprintln!(
                    "data parallel: {world} MPI ranks, global batch {} ({} per rank), gradient buckets {} MiB",
                    world * c.loader.batch_size,
                    c.loader.batch_size,
                    args.bucket_mb
                );
            }
            let mut t = trainer.clone();
            t.data_parallel = Some(dp(comm.clone()));
            let train = splits.train.sharded(rank, world);
            match t.fit(&model, &train, splits.val.as_ref(), resume, data_hash) {
                Ok(s) => Ok((s, model)),
                Err(e) => {
                    comm.abort(&e.to_string());
                    Err(e.into())
                }
            }
        }
        &Replicas::Threads(n) => {
            eprintln!(
                "data parallel: {n} replicas in this process, {} thread(s) each; global batch {} ({} per replica), \
                 gradient buckets {} MiB",
                (cores() / n).max(1),
                n * c.loader.batch_size,
                c.loader.batch_size,
                args.bucket_mb
            );
            let mut models = vec![model];
            for _ in 1..n {
                models.push(make()?);
            }
            Ok(trident_train::replicas::fit_on_threads(
                trainer,
                models,
                &splits.train,
                splits.val.as_ref(),
                (resume, data_hash),
                &dp,
            )?)
        }
    }
}

pub fn eval(args: EvalArgs) -> anyhow::Result<()> {
    if args.model.join("rl.toml").exists() {
        if args.data.is_some() || args.out.is_some() || args.split != "test" {
            bail!("{}: an agent of `trident rl` is evaluated on seeded episodes: --episodes, --seed and --onnx apply, not --split, --data or --out", args.model.display());
        }
        let onnx = args
            .onnx
            .as_deref()
            .map(|f| (f, args.engine.as_deref().unwrap_or("ort")));
        return crate::rl::evaluate(&args.model, args.episodes, args.seed, onnx);
    }
    if args.episodes.is_some() || args.seed.is_some() {
        bail!(
            "--episodes and --seed evaluate an agent of `trident rl`; {} is not one",
            args.model.display()
        );
    }
    let run_file = args.model.join("run.toml");
    let mut c = RunConfig::read(&run_file)
        .with_context(|| format!("{} is not a checkpoint of `trident train`", args.model.display()))?;
    let model = Model::load_checkpoint(&args.model)?;
    let onnx = match &args.onnx {
        Some(file) => Some(OnnxRunner::load(file, args.engine.as_deref().unwrap_or("ort"))?),
        None => None,
    };
    let label = match &args.data {
        Some(f) => f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "data".into()),
        None => args.split.clone(),
    };
    if let Some(f) = &args.data {
        read_whole_file(&mut c.data, f)?;
    }
    if model.net.is::<task::Gan>() {
        if onnx.is_some() {
            bail!("--onnx: a gan's report generates images with the checkpoint's generator; `trident export` writes that generator");
        }
        return eval_gan(&c, &model, &args, &run_file);
    }
    let suffix = if onnx.is_some() { "-onnx" } else { "" };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.model.join(format!("eval-{label}{suffix}")));
    if let InputSpec::Series(spec) = &model.card.input {
        return eval_series(&c, &model, spec, onnx.as_ref(), &out);
    }
    let (ev, first) = evaluate_split(&c, &model, &args, onnx.as_ref())?;
    let Some(r) = &ev.report else {
        for l in write_reconstruction(&c, &model, &ev, &first, &out)? {
            println!("{l}");
        }
        println!("wrote {}/metrics.json and scores.png", out.display());
        return Ok(());
    };
    let classes = &model.card.classes;
    write_report(&out, &ev, classes)?;
    println!(
        "examples {}  accuracy {:.4}  macro-F1 {:.4}  loss {:.4}",
        ev.labels.len(),
        r.accuracy,
        r.macro_f1,
        ev.loss
    );
    for (i, name) in classes.iter().enumerate() {
        println!(
            "  {name:>12}  precision {:.4}  recall {:.4}  F1 {:.4}  support {}",
            r.precision[i], r.recall[i], r.f1[i], r.support[i]
        );
    }
    if let Some(auc) = r.roc_auc_ovr_macro {
        println!("  ROC-AUC (one-vs-rest, macro) {auc:.4}");
    }
    println!("wrote {}/metrics.json and confusion.png", out.display());
    Ok(())
}

/// `trident eval --data f`: the run's data read from `f` alone, every example of it
/// evaluated (no validation or test fraction held out).
fn read_whole_file(data: &mut DataConfig, f: &Path) -> anyhow::Result<()> {
    match data {
        DataConfig::Text {
            files,
            val_fraction,
            test_fraction,
            ..
        } => {
            *files = vec![f.to_path_buf()];
            (*val_fraction, *test_fraction) = (0.0, 0.0);
        }
        DataConfig::Table {
            file,
            val_fraction,
            test_fraction,
            ..
        } => {
            *file = f.to_path_buf();
            (*val_fraction, *test_fraction) = (0.0, 0.0);
        }
        DataConfig::Series { file, .. } => *file = f.to_path_buf(),
        DataConfig::Idx { .. } | DataConfig::Folder { .. } => {
            bail!("--data takes a text, table or series file; image runs evaluate their configured test set")
        }
    }
    Ok(())
}

/// `trident eval` of a gan: samples drawn and scored by the run's `[gan]` judge against
/// the test images (`eval-test/` unless `--out`).
fn eval_gan(c: &RunConfig, model: &Model, args: &EvalArgs, run_file: &Path) -> anyhow::Result<()> {
    let section = c.gan.as_ref().with_context(|| {
        format!(
            "{}: the run has no [gan] judge to score samples with; add one to {}",
            args.model.display(),
            run_file.display()
        )
    })?;
    let (s, _, _) = image_splits(c)?;
    let out = args.out.clone().unwrap_or_else(|| args.model.join("eval-test"));
    let step = trident_zoo::gan_step::GanStep::new(model)?;
    let report = gan::report(&step, section, &s.train, &s.test, &out)?;
    for l in report.lines() {
        println!("{l}");
    }
    println!("wrote {}/report.json, samples.png and classes.png", out.display());
    Ok(())
}

/// The evaluation of a classifier or an autoencoder (not a forecaster) on the split
/// `--split` of its run's data, or on all of `--data`, by the checkpoint or its ONNX
/// export; with the split's first batch (an autoencoder draws its reconstructions).
fn evaluate_split(
    c: &RunConfig,
    model: &Model,
    args: &EvalArgs,
    onnx: Option<&ExportedStep>,
) -> anyhow::Result<(trident_train::trainer::Evaluation, task::Batch)> {
    let classes = &model.card.classes;
    let whole_file = args.data.is_some();
    match &c.data {
        DataConfig::Text { .. } => {
            let set = read_text(c)?;
            if set.classes() != classes.as_slice() {
                bail!(
                    "the data's classes {:?} differ from the model's {classes:?}",
                    set.classes()
                );
            }
            let s = text_splits(c, model, &set)?;
            evaluate_either(onnx, model, &pick(whole_file, &args.split, s)?)
        }
        DataConfig::Idx { .. } | DataConfig::Folder { .. } => {
            let (s, _, _) = image_splits(c)?;
            evaluate_either(onnx, model, &pick(false, &args.split, s)?)
        }
        DataConfig::Series { .. } => unreachable!("forecasters are evaluated by eval_series"),
        DataConfig::Table { .. } => {
            let InputSpec::Table { label, encoder } = &model.card.input else {
                bail!(
                    "{}: the run reads a table, the model does not",
                    args.model.display()
                )
            };
            let fitted = task::Fitted {
                label,
                encoder,
                classes,
            };
            let t = table_splits(c, Some(fitted))?;
            evaluate_either(onnx, model, &pick(whole_file, &args.split, t.splits)?)
        }
    }
}

fn eval_series(
    c: &RunConfig,
    model: &Model,
    spec: &trident_zoo::SeriesSpec,
    onnx: Option<&ExportedStep>,
    out: &Path,
) -> anyhow::Result<()> {
    if model.net.is::<trident_nn::autoencoder::Autoencoder>() {
        for l in series_anomaly(c, model, spec, out)? {
            println!("{l}");
        }
        println!("wrote {}/metrics.json and scores.png", out.display());
        return Ok(());
    }
    let (series, _) = task::read_series(c, &spec.column)?;
    let lines = match onnx {
        Some(graph) => {
            if forecast::refit(c) {
                bail!("data.refit: the run's backtest trains a model per origin; --onnx scores one exported model (evaluate without data.refit)");
            }
            let f = |w: &[f64], at: usize| Ok(graph.forecast(w, at)?);
            let update = forecast::updating(&f, spec);
            forecast::report(c, spec, &series.values, &update, out)?.1
        }
        None => backtest_report(c, model, spec, &series.values, out)?.1,
    };
    for l in lines {
        println!("{l}");
    }
    println!("wrote {}/metrics.json and forecast.png", out.display());
    Ok(())
}

/// One instance of the server's own ONNX backend, running an exported graph for
/// [`ExportedStep`] (`trident eval --onnx`).
struct OnnxRunner {
    instance: std::sync::Mutex<Box<dyn trident_serve::backend::ModelInstance>>,
    inputs: Vec<String>,
}

/// One instance of the server's ONNX engine `engine` (ort or tract) running `file`, with
/// the graph's input names.
pub(crate) fn onnx_instance(
    file: &Path,
    engine: &str,
) -> anyhow::Result<(Box<dyn trident_serve::backend::ModelInstance>, Vec<String>)> {
    use trident_serve::backend::LoadOptions;
    let backend = match engine {
        "tract" => trident_serve::backend::tract_engine(),
        "ort" => trident_serve::backend::ort_engine(),
        other => bail!("--engine `{other}`: expected ort or tract"),
    }
    .map_err(|e| anyhow::anyhow!("--engine {engine}: {e}"))?;
    let options = LoadOptions {
        threads_per_instance: std::thread::available_parallelism().map_or(1, |n| n.get()),
        config: Default::default(),
    };
    let model = backend.load(file, &options)?;
    let inputs = model.io().inputs.iter().map(|i| i.name.clone()).collect();
    Ok((model.instance()?, inputs))
}

impl OnnxRunner {
    /// `file` on `engine` (ort or tract), as the step that evaluates it.
    fn load(file: &Path, engine: &str) -> anyhow::Result<ExportedStep> {
        let (instance, inputs) = onnx_instance(file, engine)?;
        Ok(ExportedStep::new(Box::new(OnnxRunner {
            instance: std::sync::Mutex::new(instance),
            inputs,
        })))
    }
}

impl GraphRunner for OnnxRunner {
    fn inputs(&self) -> &[String] {
        &self.inputs
    }

    fn run(
        &self,
        inputs: Vec<(String, trident_core::Tensor)>,
    ) -> Result<Vec<(String, trident_core::Tensor)>, String> {
        self.instance
            .lock()
            .expect("instance lock")
            .execute(inputs)
            .map_err(|e| e.to_string())
    }
}

/// The checkpoint, or its exported graph when `--onnx` gave one, on `loader`; with the
/// loader's first batch.
fn evaluate_either<D: Dataset + 'static>(
    onnx: Option<&ExportedStep>,
    model: &Model,
    loader: &trident_data::DataLoader<D, task::Batch>,
) -> anyhow::Result<(trident_train::trainer::Evaluation, task::Batch)> {
    let classes = model.card.classes.len();
    let ev = match onnx {
        Some(step) => evaluate(step, loader, classes)?,
        None => evaluate(model, loader, classes)?,
    };
    let first = loader.epoch(0).next().context("the split is empty")??;
    Ok((ev, first))
}

fn pick<D: Dataset>(
    whole_file: bool,
    split: &str,
    s: Splits<D>,
) -> anyhow::Result<trident_data::DataLoader<trident_data::sampler::Subset<D>, task::Batch>> {
    if whole_file {
        return Ok(s.train); // fractions are 0: every example is in "train" (order does not change metrics)
    }
    match split {
        "test" => Ok(s.test),
        "val" => s.val.context("the run has no validation split"),
        other => bail!("--split `{other}` is not one of test, val"),
    }
}

pub fn predict(args: PredictArgs) -> anyhow::Result<()> {
    let model = Model::load_checkpoint(&args.model)?;
    if model.net.is::<task::Gan>() {
        bail!(
            "{}: a gan generates images rather than predicting from inputs: `trident eval --model {}` \
             draws and scores samples, `trident export` writes the generator (latent vectors in, images out)",
            args.model.display(),
            args.model.display()
        );
    }
    if matches!(model.card.input, InputSpec::Series(_))
        && model.net.is::<trident_nn::autoencoder::Autoencoder>()
    {
        bail!(
            "{}: an autoencoder on a series ranks the windows of a whole series: `trident eval --model {} [--data file.csv]`",
            args.model.display(),
            args.model.display()
        );
    }
    if let InputSpec::Series(spec) = &model.card.input {
        for (i, input) in args.inputs.iter().enumerate() {
            println!("{}", predict_forecast(&model, spec, input, i)?);
        }
        return Ok(());
    }
    for (i, input) in args.inputs.iter().enumerate() {
        for (key, names, batch) in prediction_inputs(&model, &args.model, input, i)? {
            for line in predictions(&model, key, &names, &batch)? {
                println!("{line}");
            }
        }
    }
    Ok(())
}
