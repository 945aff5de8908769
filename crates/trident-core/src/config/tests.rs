use super::*;

fn parse(text: &str) -> Result<ParsedConfig, ConfigError> {
    parse_config(text, Path::new("m/config.pbtxt"))
}

const FULL: &str = r#"
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "MASK" data_type: TYPE_INT64 dims: [ -1 ] optional: true reshape: { shape: [ 1, -1 ] } }
]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 4, 4 ] reshape: { shape: [ 16 ] } } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  default_queue_policy { max_queue_size: 32 }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"#;

#[test]
fn parses_every_supported_field() {
    let parsed = parse(FULL).unwrap();
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    let c = parsed.config;
    assert_eq!(c.max_batch_size, 8);
    assert_eq!(c.input[1].reshape.as_ref().unwrap().shape, vec![1, -1]);
    assert!(c.input[1].optional);
    assert_eq!(data_type(c.output[0].data_type), Some(DataType::Bytes));
    let Some(pb::model_config::SchedulingChoice::DynamicBatching(db)) = c.scheduling_choice else {
        panic!("dynamic batching missing")
    };
    assert_eq!(db.preferred_batch_size, vec![4, 8]);
    assert_eq!(db.default_queue_policy.unwrap().max_queue_size, 32);
    assert_eq!(c.instance_group[0].count, 2);
    let Some(pb::model_version_policy::PolicyChoice::Specific(s)) = c.version_policy.unwrap().policy_choice
    else {
        panic!("version policy missing")
    };
    assert_eq!(s.versions, vec![1, 3]);
}

#[test]
fn unknown_field_is_rejected_with_line_and_column() {
    let err = parse("name: \"m\"\nmax_batch_size: 1\n  max_bach_size: 2\n").unwrap_err();
    let ConfigError::Syntax {
        line,
        column,
        message,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*line, *column), (3, 3), "{err}");
    assert!(message.contains("max_bach_size"), "{message}");
    assert!(err.to_string().starts_with("m/config.pbtxt:3:3:"), "{err}");
}

#[test]
fn unimplemented_triton_fields_are_named_in_warnings() {
    let parsed = parse(
        "max_batch_size: 4\nmodel_transaction_policy { decoupled: true }\n\
         optimization { input_pinned_memory { enable: true } }\n\
         dynamic_batching { preserve_ordering: true }\n\
         parameters { key: \"x\" value: { string_value: \"1\" } }\n",
    )
    .unwrap();
    let w = parsed.warnings.join("\n");
    assert!(
        !w.contains("model_transaction_policy"),
        "decoupled is implemented: {w}"
    );
    assert!(w.contains("'optimization'"), "{w}");
    assert!(w.contains("'dynamic_batching.preserve_ordering'"), "{w}");
    assert!(w.contains("parameter 'x'"), "{w}");
    assert_eq!(parsed.warnings.len(), 3, "{w}");
}

#[test]
fn validation_rejects_what_triton_rejects() {
    let check =
        |text: &str| validate(&parse(text).unwrap().config, "m", Path::new("c")).map_err(|e| e.to_string());
    assert!(check(FULL).is_ok());
    assert!(check("name: \"other\"")
        .unwrap_err()
        .contains("does not match its directory"));
    assert!(
        check("max_batch_size: 4 dynamic_batching { preferred_batch_size: 8 }")
            .unwrap_err()
            .contains("preferred_batch_size 8")
    );
    assert!(check("dynamic_batching { }")
        .unwrap_err()
        .contains("max_batch_size > 0"));
    assert!(
        check("input { name: \"a\" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [5] } }")
            .unwrap_err()
            .contains("reshape")
    );
    assert!(check("input { name: \"a\" dims: [1] }")
        .unwrap_err()
        .contains("data_type"));
    assert!(check("input { name: \"a\" data_type: TYPE_FP32 dims: [-2] }")
        .unwrap_err()
        .contains("-2"));
}

#[test]
fn json_has_tritons_shape() {
    let json = config_to_json(&parse(FULL).unwrap().config);
    assert_eq!(json["max_batch_size"], 8);
    assert_eq!(json["input"][0]["data_type"], "TYPE_FP32");
    assert_eq!(json["input"][0]["dims"], serde_json::json!([16]));
    assert_eq!(json["dynamic_batching"]["max_queue_delay_microseconds"], 100);
    assert_eq!(json["instance_group"][0]["kind"], "KIND_CPU");
}

/// Every `config.pbtxt` example in Triton's model-configuration guide parses: those that
/// use only fields Trident implements without warnings, the others with warnings that
/// name their fields. The blocks that are not configs (a shell session, directory trees,
/// tensor notation) are listed by index, so a new guide version is checked by hand.
#[test]
fn tritons_user_guide_examples_parse() {
    const NOT_CONFIG: [usize; 8] = [1, 4, 5, 6, 7, 11, 12, 13];
    let guide = include_str!("../../tests/fixtures/user_guide_model_configuration.md");
    let blocks: Vec<&str> = guide.split("```").skip(1).step_by(2).collect();
    assert_eq!(blocks.len(), 26, "the guide changed: review NOT_CONFIG");
    let (mut clean, mut warned) = (Vec::new(), Vec::new());
    for (i, block) in blocks.iter().enumerate().filter(|(i, _)| !NOT_CONFIG.contains(i)) {
        let body = block.strip_prefix('\n').unwrap_or(block);
        let parsed = parse(body).unwrap_or_else(|e| panic!("guide block {i} failed: {e}\n{body}"));
        if parsed.warnings.is_empty() {
            clean.push(i)
        } else {
            warned.push(i)
        }
    }
    // 0, 2, 3, 18: tensorrt examples with inputs/outputs/reshape; 8, 9: optional and
    // reshape fragments; 15-17: version policies; 19, 21: instance groups (KIND_GPU parses,
    // it is refused at load time). 10, 14 use shape tensors / batch inputs, 20, 22, 23 GPU
    // lists / rate limiters, 24 cc_model_filenames: Trident does not implement those yet,
    // so they warn. 25 (response_cache) is implemented.
    assert_eq!(
        clean,
        vec![0, 2, 3, 8, 9, 15, 16, 17, 18, 19, 21, 25],
        "warned: {warned:?}"
    );
    assert_eq!(warned, vec![10, 14, 20, 22, 23, 24]);
}

#[test]
fn ensemble_steps_are_implemented_and_max_inflight_requests_is_named() {
    let parsed = parse(
        "platform: \"ensemble\"\nensemble_scheduling {\n  max_inflight_requests: 4\n  step [ { model_name: \"a\" \
         model_version: -1 input_map { key: \"x\" value: \"X\" } output_map { key: \"y\" value: \"Y\" } } ]\n}\n",
    )
    .unwrap();
    assert_eq!(
        parsed.warnings,
        ["field 'ensemble_scheduling.max_inflight_requests' is a Triton setting Trident does not implement yet; it has no effect"]
    );
}
