use super::*;
use crate::model::InferRequest;

#[test]
fn version_policy_selects_directories() {
    let dir = tempfile::tempdir().unwrap();
    for v in ["1", "2", "10", "notaversion"] {
        std::fs::create_dir(dir.path().join(v)).unwrap();
    }
    let mut c = ModelConfig::default();
    assert_eq!(select_versions(dir.path(), &c).unwrap(), vec![10]);
    use pb::model_version_policy::{All, Latest, PolicyChoice, Specific};
    let policy = |p| {
        Some(pb::ModelVersionPolicy {
            policy_choice: Some(p),
        })
    };
    c.version_policy = policy(PolicyChoice::All(All {}));
    assert_eq!(select_versions(dir.path(), &c).unwrap(), vec![1, 2, 10]);
    c.version_policy = policy(PolicyChoice::Latest(Latest { num_versions: 2 }));
    assert_eq!(select_versions(dir.path(), &c).unwrap(), vec![2, 10]);
    c.version_policy = policy(PolicyChoice::Specific(Specific { versions: vec![1, 3] }));
    assert!(select_versions(dir.path(), &c).unwrap_err().contains("version 3"));
}

#[test]
fn control_api_is_refused_outside_explicit_mode_and_names_never_reach_paths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("m")).unwrap();
    let repo = |mode| {
        Repository::new(RepositoryOptions {
            root: dir.path().into(),
            mode,
            startup_models: vec![],
            cores: 2,
            cache: None,
            onnx_engine: OnnxEngine::Tract,
        })
    };
    assert!(matches!(
        repo(ControlMode::None).load("m"),
        Err(ServeError::NotAllowed(_))
    ));
    let explicit = repo(ControlMode::Explicit);
    for bad in ["../m", "m/..", "/etc", ".", ".."] {
        assert!(
            matches!(explicit.load(bad), Err(ServeError::LoadFailed { .. })),
            "{bad}"
        );
    }
    // `m` exists but has no version: it loads as UNAVAILABLE with a reason.
    let err = explicit.load("m").unwrap_err().to_string();
    assert!(err.contains("no version directory"), "{err}");
    let index = explicit.index(false).unwrap();
    assert_eq!(index[0].state, Some("UNAVAILABLE"));
}

/// `(input_map, output_map, model)` of one ensemble step.
type StepSpec<'a> = (&'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)], &'a str);

/// An ensemble config over the fixture model `simple` (INT32 [16] INPUT0, INPUT1 →
/// OUTPUT0 = sum, OUTPUT1 = difference); `steps` are `(input_map, output_map)` pairs.
fn ensemble(inputs: &[(&str, &str)], outputs: &[&str], steps: &[StepSpec]) -> String {
    let tensors = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(n, t)| format!("{{ name: \"{n}\" data_type: {t} dims: [ 16 ] }}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let outs: Vec<(&str, &str)> = outputs.iter().map(|o| (*o, "TYPE_INT32")).collect();
    let map = |m: &[(&str, &str)]| {
        m.iter()
            .map(|(k, v)| format!("{{ key: \"{k}\" value: \"{v}\" }}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let steps: Vec<String> = steps
        .iter()
        .map(|(i, o, model)| {
            format!(
                "{{ model_name: \"{model}\" model_version: -1 input_map [ {} ] output_map [ {} ] }}",
                map(i),
                map(o)
            )
        })
        .collect();
    format!(
        "platform: \"ensemble\"\nmax_batch_size: 8\ninput [ {} ]\noutput [ {} ]\nensemble_scheduling {{ step [ {} ] }}\n",
        tensors(inputs),
        tensors(&outs),
        steps.join(", ")
    )
}

#[test]
fn ensembles_run_their_dag_and_refuse_bad_plans_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/simple");
    std::fs::create_dir_all(dir.path().join("simple/1")).unwrap();
    std::fs::copy(
        fixture.join("config.pbtxt"),
        dir.path().join("simple/config.pbtxt"),
    )
    .unwrap();
    std::fs::copy(
        fixture.join("1/model.onnx"),
        dir.path().join("simple/1/model.onnx"),
    )
    .unwrap();
    let ab = [("A", "TYPE_INT32"), ("B", "TYPE_INT32")];
    let first: &[(&str, &str)] = &[("INPUT0", "A"), ("INPUT1", "B")];
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        // (A + B) + (A − B) = 2A, through two steps.
        (
            "twice",
            ensemble(
                &ab,
                &["OUT"],
                &[
                    (first, &[("OUTPUT0", "S"), ("OUTPUT1", "D")], "simple"),
                    (
                        &[("INPUT0", "S"), ("INPUT1", "D")],
                        &[("OUTPUT0", "OUT")],
                        "simple",
                    ),
                ],
            ),
            None,
        ),
        (
            "cycle",
            ensemble(
                &ab,
                &["OUT"],
                &[
                    (&[("INPUT0", "A"), ("INPUT1", "Y")], &[("OUTPUT0", "X")], "simple"),
                    (
                        &[("INPUT0", "X"), ("INPUT1", "B")],
                        &[("OUTPUT0", "Y"), ("OUTPUT1", "OUT")],
                        "simple",
                    ),
                ],
            ),
            Some("cycle"),
        ),
        (
            "twice_produced",
            ensemble(
                &ab,
                &["OUT"],
                &[
                    (first, &[("OUTPUT0", "OUT")], "simple"),
                    (first, &[("OUTPUT0", "OUT")], "simple"),
                ],
            ),
            Some("already produced"),
        ),
        (
            "unknown_tensor",
            ensemble(
                &ab,
                &["OUT"],
                &[(
                    &[("INPUT0", "A"), ("INPUT1", "nope")],
                    &[("OUTPUT0", "OUT")],
                    "simple",
                )],
            ),
            Some("'nope', which no step produces"),
        ),
        (
            "wrong_type",
            ensemble(
                &[("A", "TYPE_FP32"), ("B", "TYPE_INT32")],
                &["OUT"],
                &[(first, &[("OUTPUT0", "OUT")], "simple")],
            ),
            Some("input 'INPUT0' is INT32, but 'A'"),
        ),
        (
            "no_such_model",
            ensemble(&ab, &["OUT"], &[(first, &[("OUTPUT0", "OUT")], "absent")]),
            Some("model 'absent'"),
        ),
        (
            "unproduced_output",
            ensemble(&ab, &["OUT", "MORE"], &[(first, &[("OUTPUT0", "OUT")], "simple")]),
            Some("ensemble output 'MORE' is produced by no step"),
        ),
    ];
    for (name, config, _) in &cases {
        std::fs::create_dir_all(dir.path().join(name).join("1")).unwrap();
        std::fs::write(dir.path().join(name).join("config.pbtxt"), config).unwrap();
    }
    let repo = Repository::new(RepositoryOptions {
        root: dir.path().into(),
        mode: ControlMode::None,
        startup_models: vec![],
        cores: 2,
        cache: None,
        onnx_engine: OnnxEngine::Tract,
    });
    repo.load_startup_models().unwrap();
    let index = repo.index(false).unwrap();
    for (name, _, error) in &cases {
        let entry = index.iter().find(|e| e.name == *name).unwrap();
        match error {
            None => assert_eq!(entry.state, Some("READY"), "{name}: {:?}", entry.reason),
            Some(want) => {
                let reason = entry.reason.clone().unwrap_or_default();
                assert_eq!(entry.state, Some("UNAVAILABLE"), "{name}");
                assert!(reason.contains(want), "{name}: {reason}");
            }
        }
    }
    let a: Vec<i32> = (0..16).collect();
    let b: Vec<i32> = (0..16).map(|i| 100 - i).collect();
    let t = |v: &[i32]| {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        trident_core::Tensor::new(trident_core::DataType::I32, vec![1, 16], bytes.into()).unwrap()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let model = repo.get("twice", None).unwrap();
    let response = rt
        .block_on(model.infer(InferRequest {
            inputs: vec![("A".into(), t(&a)), ("B".into(), t(&b))],
            outputs: vec![],
            received: std::time::Instant::now(),
            sequence: None,
        }))
        .unwrap();
    let (name, out) = &response.outputs[0];
    assert_eq!(name, "OUT");
    let got: Vec<i32> = out
        .data()
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, a.iter().map(|x| 2 * x).collect::<Vec<_>>());
    // A bad request names the ensemble's own input, before any step runs.
    let err = rt
        .block_on(model.infer(InferRequest {
            inputs: vec![("A".into(), t(&a))],
            outputs: vec![],
            received: std::time::Instant::now(),
            sequence: None,
        }))
        .unwrap_err();
    assert!(
        matches!(&err, ServeError::InvalidRequest(m) if m.contains("'B'")),
        "{err}"
    );
}

#[test]
fn unload_dependents_unloads_an_ensembles_composing_models_unless_another_uses_them() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/simple");
    for m in ["simple", "other_step"] {
        std::fs::create_dir_all(dir.path().join(m).join("1")).unwrap();
        let config = std::fs::read_to_string(fixture.join("config.pbtxt"))
            .unwrap()
            .replace("name: \"simple\"", &format!("name: \"{m}\""));
        std::fs::write(dir.path().join(m).join("config.pbtxt"), config).unwrap();
        std::fs::copy(
            fixture.join("1/model.onnx"),
            dir.path().join(m).join("1/model.onnx"),
        )
        .unwrap();
    }
    let ab = [("A", "TYPE_INT32"), ("B", "TYPE_INT32")];
    let step = |model: &'static str| -> StepSpec<'static> {
        (&[("INPUT0", "A"), ("INPUT1", "B")], &[("OUTPUT0", "OUT")], model)
    };
    for (name, model) in [("ens_a", "simple"), ("ens_b", "simple"), ("ens_c", "other_step")] {
        std::fs::create_dir_all(dir.path().join(name).join("1")).unwrap();
        std::fs::write(
            dir.path().join(name).join("config.pbtxt"),
            ensemble(&ab, &["OUT"], &[step(model)]),
        )
        .unwrap();
    }
    let repo = Repository::new(RepositoryOptions {
        root: dir.path().into(),
        mode: ControlMode::Explicit,
        startup_models: vec![],
        cores: 2,
        cache: None,
        onnx_engine: OnnxEngine::Tract,
    });
    for e in ["ens_a", "ens_b", "ens_c"] {
        repo.load(e).unwrap();
    }
    assert!(repo.get("simple", None).is_ok() && repo.get("other_step", None).is_ok());
    // Without dependents: the composing model stays.
    repo.unload_with("ens_c", false).unwrap();
    assert!(repo.get("other_step", None).is_ok());
    repo.load("ens_c").unwrap();
    repo.unload_with("ens_c", true).unwrap();
    assert!(repo.get("other_step", None).is_err(), "its only ensemble is gone");
    // `simple` is still used by ens_b.
    repo.unload_with("ens_a", true).unwrap();
    assert!(repo.get("simple", None).is_ok(), "ens_b still uses it");
    repo.unload_with("ens_b", true).unwrap();
    assert!(repo.get("simple", None).is_err());
}

const REPEAT: &str = r#"name: "repeat_int32"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"#;

fn u32_tensor(dtype: trident_core::DataType, values: &[u32]) -> trident_core::Tensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    trident_core::Tensor::new(dtype, vec![values.len() as i64], bytes.into()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoupled_model_streams_its_responses_and_refuses_a_single_answer() {
    use trident_core::DataType;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("repeat_int32/1")).unwrap();
    std::fs::write(dir.path().join("repeat_int32/config.pbtxt"), REPEAT).unwrap();
    // An ensemble may not use it.
    let ens = ensemble(
        &[("A", "TYPE_INT32"), ("D", "TYPE_UINT32"), ("W", "TYPE_UINT32")],
        &["O"],
        &[(
            &[("IN", "A"), ("DELAY", "D"), ("WAIT", "W")],
            &[("OUT", "O")],
            "repeat_int32",
        )],
    )
    .replace("dims: [ 1 ]", "dims: [ -1 ]");
    std::fs::create_dir_all(dir.path().join("streamed/1")).unwrap();
    std::fs::write(dir.path().join("streamed/config.pbtxt"), ens).unwrap();
    let repo = Repository::new(RepositoryOptions {
        root: dir.path().into(),
        mode: ControlMode::Explicit,
        startup_models: vec![],
        cores: 2,
        cache: None,
        onnx_engine: OnnxEngine::Tract,
    });
    repo.load("repeat_int32").unwrap();
    let err = repo.load("streamed").unwrap_err().to_string();
    assert!(err.contains("decoupled"), "{err}");
    let m = repo.get("repeat_int32", None).unwrap();
    assert!(m.decoupled());
    let request = |values: &[u32], delays: &[u32]| InferRequest {
        inputs: vec![
            ("IN".into(), u32_tensor(DataType::I32, values)),
            ("DELAY".into(), u32_tensor(DataType::U32, delays)),
            ("WAIT".into(), u32_tensor(DataType::U32, &[0])),
        ],
        outputs: vec![crate::OutputRequest::named("OUT")],
        received: std::time::Instant::now(),
        sequence: None,
    };
    // One answer is refused by name.
    let err = m.infer(request(&[1], &[0])).await.unwrap_err();
    assert!(matches!(err, ServeError::Unsupported(_)), "{err:?}");

    // Two requests on one instance: WAIT 0 releases each at once, so their responses
    // interleave; each stream has its own values in order, only OUT as asked.
    let (a, b) = (
        m.infer_decoupled(request(&[10, 11, 12], &[20, 40, 40])).unwrap(),
        m.infer_decoupled(request(&[20, 21], &[30, 40])).unwrap(),
    );
    let t0 = std::time::Instant::now();
    let (ga, gb) = tokio::join!(outs(a), outs(b));
    assert_eq!((ga, gb), (vec![10, 11, 12], vec![20, 21]));
    // Interleaved: both done in about the longer stream's time, not the sum.
    assert!(
        t0.elapsed() < std::time::Duration::from_millis(170),
        "{:?}",
        t0.elapsed()
    );
    for _ in 0..2 {
        let empty = m.infer_decoupled(request(&[], &[])).unwrap();
        assert_eq!(
            outs(empty).await,
            Vec::<i32>::new(),
            "IN of shape [0]: no responses"
        );
    }

    // A request the backend refuses ends its stream with the error, as the client's.
    let mut bad = m.infer_decoupled(request(&[1, 2], &[0])).unwrap();
    let err = bad.next().await.unwrap().unwrap_err();
    assert!(
        matches!(&err, ServeError::InvalidRequest(t) if t.contains("expected IN and DELAY shape to match")),
        "{err:?}"
    );
    assert!(bad.next().await.is_none());
    drop(bad);

    let s = m.stats().snapshot("repeat_int32", 1);
    // Four streams succeeded (two with values, two empty); the refused single answer
    // and the refused shapes failed.
    assert_eq!(s.inference_stats.success.count, 4);
    assert_eq!(s.inference_stats.fail.count, 2);
}

/// The OUT values of every response of a stream, checking that only OUT came back.
async fn outs(mut r: crate::Responses<'_>) -> Vec<i32> {
    let mut got = Vec::new();
    while let Some(response) = r.next().await {
        let response = response.unwrap();
        assert_eq!(response.outputs.len(), 1);
        assert_eq!(response.outputs[0].0, "OUT");
        let t = &response.outputs[0].1;
        assert_eq!(t.shape(), &[1]);
        got.push(i32::from_le_bytes(t.data()[..4].try_into().unwrap()));
    }
    assert!(r.next().await.is_none(), "ended for good");
    got
}

#[test]
fn a_config_override_that_makes_an_ensemble_loads_its_composing_models() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/simple");
    std::fs::create_dir_all(dir.path().join("simple/1")).unwrap();
    std::fs::copy(
        fixture.join("config.pbtxt"),
        dir.path().join("simple/config.pbtxt"),
    )
    .unwrap();
    std::fs::copy(
        fixture.join("1/model.onnx"),
        dir.path().join("simple/1/model.onnx"),
    )
    .unwrap();
    // On disk `e` is not an ensemble: only the override's steps can name `simple`.
    std::fs::create_dir_all(dir.path().join("e/1")).unwrap();
    let repo = Repository::new(RepositoryOptions {
        root: dir.path().into(),
        mode: ControlMode::Explicit,
        startup_models: vec![],
        cores: 2,
        cache: None,
        onnx_engine: OnnxEngine::Tract,
    });
    let tensor = |name: &str| format!(r#"{{"name": "{name}", "data_type": "TYPE_INT32", "dims": [16]}}"#);
    let config = format!(
        r#"{{"name": "e", "platform": "ensemble", "max_batch_size": 8,
            "input": [{}, {}], "output": [{}],
            "ensemble_scheduling": {{"step": [{{"model_name": "simple", "model_version": -1,
                "input_map": {{"INPUT0": "A", "INPUT1": "B"}}, "output_map": {{"OUTPUT0": "OUT"}}}}]}}}}"#,
        tensor("A"),
        tensor("B"),
        tensor("OUT")
    );
    assert!(repo.get("simple", None).is_err());
    repo.load_with(
        "e",
        LoadOverride {
            config: Some(config),
            files: vec![],
        },
    )
    .unwrap();
    assert!(
        repo.get("simple", None).is_ok(),
        "the composing model was loaded first"
    );
    assert!(repo.get("e", None).is_ok());
}
