//! One conformance suite for every [`Backend`]: the same fixture models and reference
//! outputs (computed by onnxruntime in `tests/fixtures/make_models.py`) must come out
//! of each implementation, batched results must equal unbatched ones, and a broken
//! model file must be an error, not a panic.

use super::*;
use std::path::PathBuf;
use trident_core::DataType;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn tensor(v: &serde_json::Value) -> Tensor {
    let dtype: DataType = v["datatype"].as_str().unwrap().parse().unwrap();
    let shape: Vec<i64> = serde_json::from_value(v["shape"].clone()).unwrap();
    let data = v["data"].as_array().unwrap();
    let bytes: Vec<u8> = match dtype {
        DataType::F32 => data
            .iter()
            .flat_map(|x| (x.as_f64().unwrap() as f32).to_le_bytes())
            .collect(),
        DataType::I32 => data
            .iter()
            .flat_map(|x| (x.as_i64().unwrap() as i32).to_le_bytes())
            .collect(),
        other => panic!("fixture type {other} not handled"),
    };
    Tensor::new(dtype, shape, bytes.into()).unwrap()
}

fn assert_close(name: &str, got: &Tensor, want: &Tensor, tol: f32) {
    assert_eq!(got.shape(), want.shape(), "{name} shape");
    assert_eq!(got.dtype(), want.dtype(), "{name} dtype");
    if got.dtype() == DataType::F32 {
        let (g, w) = (got.to_f32().unwrap(), want.to_f32().unwrap());
        let worst = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .map(|d| if d.is_nan() { f32::INFINITY } else { d })
            .fold(0f32, f32::max);
        assert!(worst <= tol, "{name}: max abs diff {worst} > {tol}");
    } else {
        assert_eq!(got.data(), want.data(), "{name} data");
    }
}

/// Runs the whole suite against `backend`.
pub(crate) fn run_suite(backend: &dyn Backend) {
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("models_reference.json")).unwrap())
            .unwrap();
    let options = LoadOptions {
        threads_per_instance: 1,
        config: Default::default(),
    };
    for (model_name, cases) in reference.as_object().unwrap() {
        let path = fixtures().join("models").join(model_name).join("1/model.onnx");
        let model = backend
            .load(&path, &options)
            .unwrap_or_else(|e| panic!("{model_name}: {e}"));
        assert!(!model.io().inputs.is_empty());
        assert_eq!(
            model.io().inputs[0].shape.first(),
            Some(&None),
            "{model_name}: batch dim is symbolic"
        );
        let mut instance = model.instance().unwrap();
        for case in cases.as_array().unwrap() {
            let inputs: Vec<(String, Tensor)> = case["inputs"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(n, v)| (n.clone(), tensor(v)))
                .collect();
            let outputs = instance.execute(inputs.clone()).unwrap();
            for (name, want) in case["outputs"].as_object().unwrap() {
                let got = &outputs.iter().find(|(n, _)| n == name).unwrap().1;
                assert_close(
                    &format!("{} {model_name}/{name}", backend.name()),
                    got,
                    &tensor(want),
                    1e-5,
                );
            }
            // Row by row gives the same as the batch.
            let rows = inputs[0].1.shape()[0];
            let row_of = |t: &Tensor, r: i64| t.split(&[r, 1, rows - r - 1]).unwrap().swap_remove(1);
            for r in 0..rows {
                let row: Vec<(String, Tensor)> =
                    inputs.iter().map(|(n, t)| (n.clone(), row_of(t, r))).collect();
                let single = instance.execute(row).unwrap();
                for ((name, whole), (_, one)) in outputs.iter().zip(&single) {
                    let expected = row_of(whole, r);
                    assert_close(&format!("{model_name}/{name} row {r}"), one, &expected, 1e-5);
                }
            }
        }
    }
    let broken = fixtures().join("models/broken/1/model.onnx");
    assert!(matches!(
        backend.load(&broken, &options),
        Err(BackendError::Load { .. })
    ));
    let missing = fixtures().join("models/does-not-exist/1/model.onnx");
    assert!(backend.load(&missing, &options).is_err());
}

#[cfg(feature = "tract")]
#[test]
fn tract_passes_the_conformance_suite() {
    run_suite(&tract::TractBackend);
}

#[cfg(feature = "ort")]
#[test]
fn onnxruntime_passes_the_conformance_suite() {
    match ort::shared() {
        Ok(backend) => run_suite(backend.as_ref()),
        Err(e) => panic!("the ort feature is on but ONNX Runtime cannot be loaded: {e} (set ORT_DYLIB_PATH or pip install onnxruntime)"),
    }
}
