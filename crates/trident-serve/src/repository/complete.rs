//! Completing a configuration from the model file (Triton's auto-complete), and checking
//! a configuration against what the model file really declares.

use crate::backend::{ModelIo, TensorSpec};
use trident_core::config::{self, pb, ModelConfig};

/// Triton's `--backend-config=default-max-batch-size`, used when a model that supports
/// batching comes without a batch configuration.
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

/// Fills name, platform, inputs, outputs, batching, instance group and version policy
/// where the configuration leaves them empty.
pub(super) fn autocomplete(c: &mut ModelConfig, name: &str, io: &ModelIo) -> Result<(), String> {
    if c.name.is_empty() {
        c.name = name.to_string();
    }
    if c.platform.is_empty() && c.backend.is_empty() {
        c.platform = "onnxruntime_onnx".into();
    }
    if c.backend.is_empty() {
        c.backend = "onnxruntime".into();
    }
    let unconfigured = c.input.is_empty() && c.output.is_empty() && c.max_batch_size == 0;
    let all = io.inputs.iter().chain(&io.outputs);
    let batchable = io
        .inputs
        .iter()
        .chain(&io.outputs)
        .all(|t| t.shape.first() == Some(&None))
        && all.count() > 0;
    if unconfigured && batchable {
        c.max_batch_size = DEFAULT_MAX_BATCH_SIZE;
        if c.scheduling_choice.is_none() {
            c.scheduling_choice = Some(pb::model_config::SchedulingChoice::DynamicBatching(
                Default::default(),
            ));
        }
        tracing::info!(model = %name, "auto-complete: the model batches; max_batch_size {DEFAULT_MAX_BATCH_SIZE} with dynamic batching");
    }
    let skip = usize::from(c.max_batch_size > 0);
    // Control and state tensors are the sequencer's, never the client's.
    let (hidden_in, hidden_out) = crate::sequence::hidden_tensors(c);
    let (hidden_in, hidden_out): (Vec<String>, Vec<String>) = (
        hidden_in.into_iter().map(String::from).collect(),
        hidden_out.into_iter().map(String::from).collect(),
    );
    if c.input.is_empty() {
        c.input = io
            .inputs
            .iter()
            .filter(|t| !hidden_in.contains(&t.name))
            .map(|t| pb::ModelInput {
                name: t.name.clone(),
                data_type: config::config_data_type(t.dtype),
                dims: dims(t, skip),
                ..Default::default()
            })
            .collect();
    }
    if c.output.is_empty() {
        c.output = io
            .outputs
            .iter()
            .filter(|t| !hidden_out.contains(&t.name))
            .map(|t| pb::ModelOutput {
                name: t.name.clone(),
                data_type: config::config_data_type(t.dtype),
                dims: dims(t, skip),
                ..Default::default()
            })
            .collect();
    }
    if c.instance_group.is_empty() {
        c.instance_group.push(pb::ModelInstanceGroup {
            name: name.to_string(),
            count: 1,
            kind: pb::model_instance_group::Kind::Cpu as i32,
            ..Default::default()
        });
    }
    for group in &mut c.instance_group {
        use pb::model_instance_group::Kind;
        match Kind::try_from(group.kind) {
            Ok(Kind::Gpu) => {
                return Err(format!(
                    "instance_group '{}' asks for KIND_GPU; Trident serves on CPU only",
                    group.name
                ))
            }
            _ => group.kind = Kind::Cpu as i32,
        }
        if group.count == 0 {
            group.count = 1;
        }
    }
    if c.version_policy.is_none() {
        c.version_policy = Some(pb::ModelVersionPolicy {
            policy_choice: Some(pb::model_version_policy::PolicyChoice::Latest(
                pb::model_version_policy::Latest { num_versions: 1 },
            )),
        });
    }
    Ok(())
}

fn dims(t: &TensorSpec, skip: usize) -> Vec<i64> {
    t.shape.iter().skip(skip).map(|d| d.unwrap_or(-1)).collect()
}

/// Every configured input and output must exist in the model with the same type and rank.
pub(super) fn check_against_model(c: &ModelConfig, io: &ModelIo) -> Result<(), String> {
    let batch = usize::from(c.max_batch_size > 0);
    let inputs = c
        .input
        .iter()
        .map(|i| ("input", &i.name, i.data_type, &i.dims, i.reshape.as_ref()));
    let outputs = c
        .output
        .iter()
        .map(|o| ("output", &o.name, o.data_type, &o.dims, o.reshape.as_ref()));
    for (kind, name, dtype, dims, reshape) in inputs.chain(outputs) {
        let declared = if kind == "input" { &io.inputs } else { &io.outputs };
        let spec = declared.iter().find(|s| &s.name == name).ok_or_else(|| {
            let names: Vec<&str> = declared.iter().map(|s| s.name.as_str()).collect();
            format!(
                "configuration has {kind} '{name}', which the model does not have (model {kind}s: {names:?})"
            )
        })?;
        let dtype = config::data_type(dtype).expect("validated");
        if dtype != spec.dtype {
            return Err(format!(
                "{kind} '{name}': configuration says {dtype}, the model has {}",
                spec.dtype
            ));
        }
        let rank = batch + reshape.map_or(dims.len(), |r| r.shape.len());
        if rank != spec.shape.len() {
            return Err(format!(
                "{kind} '{name}': configuration gives rank {rank} ({}dims {dims:?}), the model has rank {} ({:?})",
                if batch == 1 { "batch + " } else { "" },
                spec.shape.len(),
                spec.shape
            ));
        }
        if batch == 1 && matches!(spec.shape.first(), Some(Some(d)) if *d != 1) {
            return Err(format!(
                "{kind} '{name}': max_batch_size > 0 needs a variable first dimension, the model has {:?}",
                spec.shape
            ));
        }
    }
    Ok(())
}

/// Instances across the model's instance groups.
pub(super) fn instance_count(c: &ModelConfig) -> usize {
    c.instance_group
        .iter()
        .map(|g| g.count.max(1) as usize)
        .sum::<usize>()
        .max(1)
}

/// Intra-op threads per instance: `intra_op_thread_count` when set, else the cores shared
/// out so instances × threads never exceeds them.
pub(super) fn threads_per_instance(c: &ModelConfig, instances: usize, cores: usize) -> Result<usize, String> {
    match c.parameters.get("intra_op_thread_count") {
        Some(p) => {
            let n: usize = p.string_value.trim().parse().map_err(|_| {
                format!(
                    "parameter intra_op_thread_count must be a positive integer, got \"{}\"",
                    p.string_value
                )
            })?;
            if n * instances > cores {
                tracing::warn!(
                    "{} instances × {n} threads exceeds the {cores} cores: expect oversubscription",
                    instances
                );
            }
            Ok(n.max(1))
        }
        None => Ok((cores / instances).max(1)),
    }
}
