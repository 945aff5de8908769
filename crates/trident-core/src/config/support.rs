//! Which `ModelConfig` fields Trident implements. Every other field a config sets is
//! named in a warning at load time: accepted for compatibility, never silently ignored.

use prost_reflect::{DynamicMessage, MapKey, Value};

/// Field paths (message fields joined by `.`) that Trident acts on. A path that names
/// a message accepts everything below it.
pub const SUPPORTED_FIELDS: &[&str] = &[
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "version_policy.latest.num_versions",
    "version_policy.all",
    "version_policy.specific.versions",
    "input.name",
    "input.data_type",
    "input.format",
    "input.dims",
    "input.reshape.shape",
    "input.optional",
    "output.name",
    "output.data_type",
    "output.dims",
    "output.reshape.shape",
    "output.label_filename",
    "dynamic_batching.preferred_batch_size",
    "dynamic_batching.max_queue_delay_microseconds",
    "dynamic_batching.default_queue_policy.max_queue_size",
    "sequence_batching.max_sequence_idle_microseconds",
    "sequence_batching.control_input",
    "sequence_batching.direct.max_queue_delay_microseconds",
    "sequence_batching.oldest.max_queue_delay_microseconds",
    "sequence_batching.oldest.max_candidate_sequences",
    "sequence_batching.oldest.preferred_batch_size",
    "sequence_batching.state.input_name",
    "sequence_batching.state.output_name",
    "sequence_batching.state.data_type",
    "sequence_batching.state.dims",
    "sequence_batching.state.initial_state",
    "instance_group.name",
    "instance_group.count",
    "instance_group.kind",
    "default_model_filename",
    "ensemble_scheduling.step.model_name",
    "ensemble_scheduling.step.model_version",
    "ensemble_scheduling.step.input_map",
    "ensemble_scheduling.step.output_map",
    "model_warmup",
    "response_cache.enable",
    "model_transaction_policy.decoupled",
    "parameters",
];

/// Keys of the `parameters` map that Trident reads.
/// - `intra_op_thread_count`: the Triton ONNX Runtime backend's name for threads per instance;
/// - `trident.onnx_engine`: `ort` or `tract`, forcing one ONNX engine.
/// - `max_length`, `truncation`, `padding`: the `tokenizer` backend's;
/// - `height`, `width`, `channels`, `mean`, `std`: the `image` backend's.
pub const SUPPORTED_PARAMETERS: &[&str] = &[
    "intra_op_thread_count",
    "trident.onnx_engine",
    "max_length",
    "truncation",
    "padding",
    "height",
    "width",
    "channels",
    "mean",
    "std",
];

/// Names every set field (and `parameters` key) that Trident does not implement.
pub fn unsupported_fields(message: &DynamicMessage) -> Vec<String> {
    let mut out = Vec::new();
    walk(message, "", &mut out);
    out.sort();
    out.dedup();
    out
}

fn walk(message: &DynamicMessage, prefix: &str, out: &mut Vec<String>) {
    for (field, value) in message.fields() {
        let path = if prefix.is_empty() {
            field.name().to_string()
        } else {
            format!("{prefix}.{}", field.name())
        };
        if path == "parameters" {
            parameter_keys(value, out);
        } else if SUPPORTED_FIELDS.contains(&path.as_str()) {
            continue;
        } else if SUPPORTED_FIELDS
            .iter()
            .any(|s| s.starts_with(&format!("{path}.")))
        {
            for child in messages(value) {
                walk(child, &path, out);
            }
        } else {
            out.push(format!(
                "field '{path}' is a Triton setting Trident does not implement yet; it has no effect"
            ));
        }
    }
}

fn messages(value: &Value) -> Vec<&DynamicMessage> {
    match value {
        Value::Message(m) => vec![m],
        Value::List(items) => items.iter().filter_map(Value::as_message).collect(),
        _ => Vec::new(),
    }
}

fn parameter_keys(value: &Value, out: &mut Vec<String>) {
    let Value::Map(map) = value else { return };
    for key in map.keys() {
        if let MapKey::String(key) = key {
            if !SUPPORTED_PARAMETERS.contains(&key.as_str()) {
                out.push(format!(
                    "parameter '{key}' is not one Trident reads (known: {}); it has no effect",
                    SUPPORTED_PARAMETERS.join(", ")
                ));
            }
        }
    }
}
