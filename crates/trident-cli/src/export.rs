//! `trident export`: a checkpoint of `trident train` / `trident distill` as an ONNX file, or
//! an agent of `trident rl` as its policy.

use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use trident_export::{Flavour, Options, Precision};
use trident_zoo::Model;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A checkpoint directory (`<run>/best` or `<run>/last`).
    #[arg(long)]
    model: PathBuf,
    /// The ONNX file to write.
    #[arg(long)]
    out: PathBuf,
    /// `portable` (standard operators, opset 17: ONNX Runtime, tract, Triton's ORT
    /// backend) or `ort-fused` (ONNX Runtime's fused attention, skip layer norm and bias
    /// GELU, bidirectional recurrences with sequence lengths: ONNX Runtime only).
    #[arg(long, alias = "flavor", default_value = "portable")]
    flavour: String,
    /// `fp32`, or `int8`: linear layers with per-column int8 weights (ONNX Runtime's
    /// DynamicQuantizeMatMul; ONNX Runtime only).
    #[arg(long, default_value = "fp32")]
    precision: String,
}

impl ExportArgs {
    fn options(&self) -> anyhow::Result<Options> {
        Ok(Options {
            flavour: Flavour::parse(&self.flavour)?,
            precision: Precision::parse(&self.precision)?,
        })
    }
}

/// An agent of `trident rl`: its policy network (observation in; scores and greedy action
/// out), or its Q-table (state in).
fn policy(args: &ExportArgs, opts: Options) -> anyhow::Result<trident_export::Exported> {
    use trident_rl::run::PolicyShape;
    let (config, agent) =
        trident_rl::run::load_checkpoint(&args.model, None, None).map_err(anyhow::Error::msg)?;
    let shape = trident_rl::run::policy_shape(&config).map_err(anyhow::Error::msg)?;
    let at = || format!("exporting {}", args.model.display());
    Ok(match shape {
        PolicyShape::Table { actions } => {
            trident_export::export_q_table(agent.params(), "q_table", actions, opts).with_context(at)?
        }
        PolicyShape::Net {
            prefix,
            layers,
            activation,
            width,
            scores,
            actions,
        } => {
            let net = trident_export::PolicyNet {
                prefix,
                layers,
                activation,
                width,
                scores,
            };
            trident_export::export_policy(agent.params(), &net, actions, opts).with_context(at)?
        }
    })
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let opts = args.options()?;
    let exported = if args.model.join("rl.toml").exists() {
        policy(&args, opts)?
    } else {
        let model = Model::load_checkpoint(&args.model)?;
        trident_export::export(&model, opts).with_context(|| format!("exporting {}", args.model.display()))?
    };
    crate::learn::write_atomic(&args.out, &exported.to_bytes())?;
    let bytes = std::fs::metadata(&args.out)?.len();
    let nodes: usize = exported.histogram().values().sum();
    let io = |list: &[trident_export::Io]| {
        list.iter()
            .map(|i| format!("{} {} {:?}", i.name, i.data_type, i.dims))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "{}: {} nodes, {:.1} MB, {} {} (inputs: {}; outputs: {}; batch dimension first)",
        args.out.display(),
        nodes,
        bytes as f64 / 1e6,
        opts.flavour.name(),
        opts.precision.name(),
        io(&exported.inputs),
        io(&exported.outputs)
    );
    Ok(())
}
