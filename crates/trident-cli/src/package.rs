//! `trident package`: a checkpoint as a ready-to-serve Triton model repository entry —
//! the ensemble `<name>` (text or image bytes, or a table row's cells, in; logits and class probabilities out, the
//! labels attached for the classification extension), its native pre-processing model
//! `<name>_preprocess` (`backend: "tokenizer"`, `"image"` or `"table"`, the checkpoint's own
//! length rule, image spec or fitted feature encoder) and the exported ONNX model `<name>_onnx`, each with dynamic
//! batching and warm-up. `--archive` writes the same folders as SageMaker's
//! `model.tar.gz` (model folders at the top of the archive).

use anyhow::{bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};
use trident_data::table::ColumnCode;
use trident_export::{Flavour, Io, Options, Precision};
use trident_zoo::{InputSpec, Model};

#[derive(Debug, Args)]
pub struct PackageArgs {
    /// A checkpoint directory (`<run>/best` or `<run>/last`).
    #[arg(long)]
    model: PathBuf,
    /// The model repository to write into (created if absent).
    #[arg(long, required_unless_present = "archive")]
    repository: Option<PathBuf>,
    /// Also (or only) write the folders as a SageMaker `model.tar.gz`.
    #[arg(long)]
    archive: Option<PathBuf>,
    /// The ensemble's name; its steps are `<name>_preprocess` and `<name>_onnx`.
    #[arg(long, default_value = "model")]
    name: String,
    /// ONNX flavour: `portable` or `ort-fused` (see `trident export`).
    #[arg(long, alias = "flavor", default_value = "portable")]
    flavour: String,
    /// `fp32` or `int8` weights (see `trident export`).
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// Largest batch the models take (dynamic batching merges requests up to it).
    #[arg(long, default_value_t = 32)]
    max_batch_size: u32,
    /// How long a request may wait for others to batch with, in microseconds. The default,
    /// 0 (Triton's own), adds no latency to a lone request; under load, requests that queue
    /// while the instances are busy still run together. `trident recommend` measures others.
    #[arg(long, default_value_t = 0)]
    max_queue_delay_us: u64,
    /// Replace model folders of the same names.
    #[arg(long)]
    force: bool,
}

/// Files of a model folder: relative path → contents.
type Files = Vec<(String, Vec<u8>)>;

/// One model folder: its name and files.
type Folder = (String, Files);

pub fn run(args: PackageArgs) -> anyhow::Result<()> {
    let opts = Options {
        flavour: Flavour::parse(&args.flavour)?,
        precision: Precision::parse(&args.precision)?,
    };
    if args.name.is_empty() || args.name.contains(['/', '\\']) || args.name.starts_with('.') {
        bail!("--name `{}`: a model name is a plain directory name", args.name);
    }
    if args.max_batch_size == 0 {
        bail!("--max-batch-size must be at least 1");
    }
    let model = Model::load_checkpoint(&args.model)?;
    let exported = trident_export::export(&model, opts)
        .with_context(|| format!("exporting {}", args.model.display()))?;
    let folders = folders(&args, &model, &exported, opts)?;
    if let Some(repo) = &args.repository {
        write_repository(repo, &folders, args.force)?;
        let what = match folders.as_slice() {
            [_] => format!("model `{}`", args.name),
            _ => format!(
                "ensemble `{}` with `{}_preprocess` and `{}_onnx`",
                args.name, args.name, args.name
            ),
        };
        eprintln!(
            "{}: {what} ({} {}); serve with `trident serve --model-repository {}`",
            repo.display(),
            opts.flavour.name(),
            opts.precision.name(),
            repo.display()
        );
    }
    if let Some(archive) = &args.archive {
        write_archive(archive, &folders)?;
        eprintln!(
            "{}: SageMaker model.tar.gz (set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME={})",
            archive.display(),
            args.name
        );
    }
    Ok(())
}

fn entry(io: &Io, extra: &str) -> String {
    let dims: Vec<String> = io.dims.iter().map(i64::to_string).collect();
    format!(
        "  {{\n    name: \"{}\"\n    data_type: {}\n    dims: [ {} ]{extra}\n  }}",
        io.name,
        io.data_type,
        dims.join(", ")
    )
}

fn tensor(kind: &str, io: &Io, extra: &str) -> String {
    format!("{kind} [\n{}\n]\n", entry(io, extra))
}

/// `kind [ ... ]` listing `list`; `labelled` attaches the labels file to each (the
/// outputs are per-class logits and probabilities).
fn tensors(kind: &str, list: &[Io], labelled: Option<&str>) -> String {
    let entries: Vec<String> = list
        .iter()
        .map(|io| {
            let extra = match labelled {
                Some(file) => format!("\n    label_filename: \"{file}\""),
                _ => String::new(),
            };
            entry(io, &extra)
        })
        .collect();
    format!("{kind} [\n{}\n]\n", entries.join(",\n"))
}

/// `model_warmup`: one zero-filled request of batch 1 (token ids 0 over `seq` tokens for
/// text models), run on every instance before the model is ready.
fn warmup(inputs: &[Io], seq: i64) -> String {
    let entries: Vec<String> = inputs
        .iter()
        .map(|io| {
            let dims: Vec<String> = io.dims.iter().map(|&d| if d < 0 { seq } else { d }.to_string()).collect();
            format!(
                "    inputs {{\n      key: \"{}\"\n      value {{ data_type: {} dims: [ {} ] zero_data: true }}\n    }}",
                io.name,
                io.data_type,
                dims.join(", ")
            )
        })
        .collect();
    format!(
        "model_warmup [\n  {{\n    name: \"zeros\"\n    batch_size: 1\n    count: 1\n{}\n  }}\n]\n",
        entries.join("\n")
    )
}

fn batching(args: &PackageArgs) -> String {
    format!(
        "max_batch_size: {}\ndynamic_batching {{\n  max_queue_delay_microseconds: {}\n}}\n",
        args.max_batch_size, args.max_queue_delay_us
    )
}

/// The three model folders.
fn folders(
    args: &PackageArgs,
    model: &Model,
    exported: &trident_export::Exported,
    opts: Options,
) -> anyhow::Result<Vec<Folder>> {
    let name = &args.name;
    let engine = match (opts.flavour, opts.precision) {
        (Flavour::Portable, Precision::Fp32) => String::new(),
        // Contrib operators: ONNX Runtime only.
        _ => "parameters [\n  { key: \"trident.onnx_engine\" value { string_value: \"ort\" } }\n]\n".into(),
    };
    if matches!(model.card.input, InputSpec::Series(_)) || model.net.is::<trident_zoo::Gan>() {
        // A forecaster's graph takes raw values and gives raw forecasts (its transform is
        // inside), a GAN's generator takes latent vectors and gives pixels in [0, 1]: one
        // model, no pre-processing step.
        let config = format!(
            "name: \"{name}\"\nplatform: \"onnxruntime_onnx\"\n{}{}{}{}{engine}",
            batching(args),
            tensors("input", &exported.inputs, None),
            tensors("output", &exported.outputs, None),
            warmup(&exported.inputs, 1),
        );
        return Ok(vec![(
            name.clone(),
            vec![
                ("config.pbtxt".into(), config.into_bytes()),
                ("1/model.onnx".into(), exported.to_bytes()),
            ],
        )]);
    }
    let (pre, onnx) = (format!("{name}_preprocess"), format!("{name}_onnx"));
    let labels = model.card.classes.join("\n") + "\n";
    // Per-class outputs name their classes (classification extension); an autoencoder's do not.
    let labels_file = exported.per_class.then_some("labels.txt");
    // Pre-processing: the checkpoint's tokenizer and length rule, image spec or encoder.
    let (pre_config, pre_files, raw_inputs) = preprocess(args, model, exported, &pre)?;

    let seq = match model.card.input {
        InputSpec::Text { max_len, .. } => max_len.min(16) as i64,
        InputSpec::Image { .. } | InputSpec::Table { .. } | InputSpec::Series(_) => 1,
    };
    let onnx_config = format!(
        "name: \"{onnx}\"\nplatform: \"onnxruntime_onnx\"\n{}{}{}{}{engine}",
        batching(args),
        tensors("input", &exported.inputs, None),
        tensors("output", &exported.outputs, labels_file),
        warmup(&exported.inputs, seq),
    );
    let map = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| format!("        {{ key: \"{k}\" value: \"{v}\" }}"))
            .collect::<Vec<_>>()
            .join(",\n")
    };
    let pre_out: Vec<(&str, &str)> = exported
        .inputs
        .iter()
        .map(|i| (i.name.as_str(), i.name.as_str()))
        .collect();
    let onnx_out: Vec<(&str, &str)> = exported
        .outputs
        .iter()
        .map(|o| (o.name.as_str(), o.name.as_str()))
        .collect();
    let raw_names: Vec<(&str, &str)> = raw_inputs
        .iter()
        .map(|i| (i.name.as_str(), i.name.as_str()))
        .collect();
    let ensemble = format!(
        "name: \"{name}\"\nplatform: \"ensemble\"\nmax_batch_size: {}\n{}{}ensemble_scheduling {{\n  step [\n    {{\n      model_name: \"{pre}\"\n      model_version: -1\n      input_map [\n{}\n      ]\n      output_map [\n{}\n      ]\n    }},\n    {{\n      model_name: \"{onnx}\"\n      model_version: -1\n      input_map [\n{}\n      ]\n      output_map [\n{}\n      ]\n    }}\n  ]\n}}\n",
        args.max_batch_size,
        tensors("input", &raw_inputs, None),
        tensors("output", &exported.outputs, labels_file),
        map(&raw_names),
        map(&pre_out),
        map(&pre_out),
        map(&onnx_out),
    );
    Ok(vec![
        (
            name.clone(),
            vec![
                ("config.pbtxt".into(), ensemble.into_bytes()),
                ("labels.txt".into(), labels.clone().into_bytes()),
                ("1/.keep".into(), Vec::new()),
            ],
        ),
        (
            pre.clone(),
            std::iter::once(("config.pbtxt".to_string(), pre_config.into_bytes()))
                .chain(pre_files)
                .collect(),
        ),
        (
            onnx,
            vec![
                ("config.pbtxt".into(), onnx_config.into_bytes()),
                ("labels.txt".into(), labels.into_bytes()),
                ("1/model.onnx".into(), exported.to_bytes()),
            ],
        ),
    ])
}

/// The pre-processing model `pre` of a package: its `config.pbtxt`, its version folder's
/// files, and the raw inputs the ensemble takes — text (the checkpoint's tokenizer and
/// length rule), an image (its size and normalisation) or a table row's cells (its fitted
/// encoder; one input per column, numbers as FP32 with NaN for missing, categories as text).
fn preprocess(
    args: &PackageArgs,
    model: &Model,
    exported: &trident_export::Exported,
    pre: &str,
) -> anyhow::Result<(String, Files, Vec<Io>)> {
    let raw = Io {
        name: String::new(),
        data_type: "TYPE_STRING",
        dims: vec![1],
    };
    Ok(match &model.card.input {
        InputSpec::Series(_) => unreachable!("a forecaster has no pre-processing step"),
        &InputSpec::Text { max_len, truncate } => {
            let tokenizer = std::fs::read(args.model.join("tokenizer.json"))
                .with_context(|| format!("{}: the checkpoint's tokenizer.json", args.model.display()))?;
            let outputs: Vec<Io> = exported.inputs.clone();
            let text = Io {
                name: "TEXT".into(),
                ..raw.clone()
            };
            let config = format!(
                "name: \"{pre}\"\nbackend: \"tokenizer\"\n{}{}{}{}parameters [\n  {{ key: \"max_length\" value {{ string_value: \"{max_len}\" }} }},\n  {{ key: \"truncation\" value {{ string_value: \"{truncate}\" }} }},\n  {{ key: \"padding\" value {{ string_value: \"longest\" }} }}\n]\n",
                batching(args),
                tensor("input", &text, ""),
                tensors("output", &outputs, None),
                warmup(std::slice::from_ref(&text), 1),
            );
            (
                config,
                vec![("1/tokenizer.json".to_string(), tokenizer)],
                vec![text],
            )
        }
        &InputSpec::Image {
            channels,
            height,
            width,
            mean,
            std,
        } => {
            let image = Io {
                name: "IMAGE".into(),
                ..raw.clone()
            };
            let config = format!(
                "name: \"{pre}\"\nbackend: \"image\"\n{}{}{}parameters [\n  {{ key: \"channels\" value {{ string_value: \"{channels}\" }} }},\n  {{ key: \"height\" value {{ string_value: \"{height}\" }} }},\n  {{ key: \"width\" value {{ string_value: \"{width}\" }} }},\n  {{ key: \"mean\" value {{ string_value: \"{mean}\" }} }},\n  {{ key: \"std\" value {{ string_value: \"{std}\" }} }}\n]\n",
                batching(args),
                tensor("input", &image, ""),
                tensors("output", &exported.inputs, None),
            );
            (config, vec![("1/.keep".to_string(), Vec::new())], vec![image])
        }
        InputSpec::Table { encoder, .. } => {
            let columns: Vec<Io> = encoder
                .columns
                .iter()
                .map(|c| match c {
                    ColumnCode::Numeric { name, .. } => Io {
                        name: name.clone(),
                        data_type: "TYPE_FP32",
                        dims: vec![1],
                    },
                    ColumnCode::Categorical { name, .. } => Io {
                        name: name.clone(),
                        ..raw.clone()
                    },
                })
                .collect();
            let config = format!(
                "name: \"{pre}\"\nbackend: \"table\"\n{}{}{}",
                batching(args),
                tensors("input", &columns, None),
                tensors("output", &exported.inputs, None),
            );
            let file = serde_json::to_vec_pretty(encoder)?;
            (config, vec![("1/encoder.json".to_string(), file)], columns)
        }
    })
}

/// Each folder is written beside its final place, synced, and renamed into it.
fn write_repository(repo: &Path, folders: &[Folder], force: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(repo).with_context(|| format!("creating {}", repo.display()))?;
    for (name, _) in folders {
        if repo.join(name).exists() && !force {
            bail!(
                "{}: exists (pass --force to replace it)",
                repo.join(name).display()
            );
        }
    }
    for (name, files) in folders {
        let tmp = repo.join(format!(".{name}.tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        for (rel, bytes) in files {
            crate::learn::write_atomic(&tmp.join(rel), bytes)?;
        }
        let dest = repo.join(name);
        if dest.exists() {
            std::fs::remove_dir_all(&dest).with_context(|| format!("replacing {}", dest.display()))?;
        }
        std::fs::rename(&tmp, &dest).with_context(|| format!("writing {}", dest.display()))?;
    }
    Ok(())
}

/// `model.tar.gz` with the model folders at its top level.
fn write_archive(path: &Path, folders: &[Folder]) -> anyhow::Result<()> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    for (name, files) in folders {
        for (rel, bytes) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_cksum();
            tar.append_data(&mut header, format!("{name}/{rel}"), bytes.as_slice())?;
        }
    }
    let bytes = tar.into_inner()?.finish()?;
    crate::learn::write_atomic(path, &bytes)
}
