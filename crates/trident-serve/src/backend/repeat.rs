//! `backend: "repeat"`: Triton's example decoupled backend (`triton-inference-server/
//! repeat_backend`), so that clients of streaming models (NVIDIA's
//! `simple_grpc_custom_repeat.py`, a user's own token-streaming client) can be tested
//! against Trident with no model file.
//!
//! The model has inputs `IN` (INT32, one dimension), `DELAY` (UINT32, the same shape) and
//! `WAIT` (UINT32 `[1]`), outputs `OUT` (INT32 `[1]`) and `IDX` (UINT32 `[1]`),
//! `max_batch_size: 0` and `model_transaction_policy { decoupled: true }`. For a request
//! with n elements in `IN` it sends n responses: the i-th after sleeping `DELAY[i]` ms,
//! with `OUT = [IN[i]]` and `IDX = [i]`; with `IN` of shape `[0]` it sends none. The
//! instance takes its next request after `WAIT` ms, which may be before every response
//! of this one is out, so the responses of several requests can interleave on one
//! instance. As in Triton, each request's responses come from a thread of their own.

use super::{Backend, BackendError, LoadOptions, Model, ModelInstance, ModelIo, ResponseSender, TensorSpec};
use std::path::Path;
use std::time::Duration;
use trident_core::config::{self, pb};
use trident_core::{DataType, Tensor};

/// The repeat backend.
pub struct RepeatBackend;

struct Loaded {
    io: ModelIo,
}

struct Instance;

/// The tensors the backend requires, in config order: (name, type, rule for dims).
const INPUTS: [(&str, DataType); 3] = [
    ("IN", DataType::I32),
    ("DELAY", DataType::U32),
    ("WAIT", DataType::U32),
];
const OUTPUTS: [(&str, DataType); 2] = [("OUT", DataType::I32), ("IDX", DataType::U32)];

fn shape_text(dims: &[i64]) -> String {
    format!(
        "[{}]",
        dims.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    )
}

/// Triton's `ValidateModelConfig` for this backend, with its texts, plus the decoupled
/// policy it needs (Triton leaves that to the server's response checks).
fn validate(c: &pb::ModelConfig) -> Result<(), String> {
    if c.max_batch_size != 0 {
        return Err("repeat backend only supports models with max_batch_size == 0".into());
    }
    if !c.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) {
        return Err(
            "the repeat backend sends many responses per request: its model needs model_transaction_policy { decoupled: true }"
                .into(),
        );
    }
    if c.input.len() != 3 {
        return Err(format!("expected 3 inputs, got {}", c.input.len()));
    }
    if c.output.len() != 2 {
        return Err(format!("expected 2 outputs, got {}", c.output.len()));
    }
    let ordinal = ["first", "second", "third"];
    let tensors = c
        .input
        .iter()
        .map(|i| ("input", &i.name, i.data_type, &i.dims))
        .zip(INPUTS)
        .enumerate()
        .chain(
            c.output
                .iter()
                .map(|o| ("output", &o.name, o.data_type, &o.dims))
                .zip(OUTPUTS)
                .enumerate(),
        );
    for (i, ((kind, name, data_type, dims), (want, dtype))) in tensors {
        if name != want {
            return Err(format!(
                "expected {} {kind} tensor name to be {want}, got {name}",
                ordinal[i]
            ));
        }
        if config::data_type(data_type) != Some(dtype) {
            let got =
                pb::DataType::try_from(data_type).map_or(data_type.to_string(), |t| t.as_str_name().into());
            return Err(format!("expected {want} datatype to be {dtype}, got {got}"));
        }
        let ok = match want {
            "IN" => dims.len() == 1,
            "DELAY" => dims == &c.input[0].dims,
            _ => dims.as_slice() == [1],
        };
        if !ok {
            return Err(match want {
                "IN" => format!(
                    "expected IN shape to have one dimension, got {}",
                    shape_text(dims)
                ),
                "DELAY" => format!(
                    "expected IN and DELAY shape to match, got {} and {}",
                    shape_text(&c.input[0].dims),
                    shape_text(dims)
                ),
                _ => format!("expected {want} shape to be [1], got {}", shape_text(dims)),
            });
        }
    }
    Ok(())
}

impl Backend for RepeatBackend {
    fn name(&self) -> &'static str {
        "repeat"
    }

    fn load(&self, path: &Path, options: &LoadOptions) -> Result<Box<dyn Model>, BackendError> {
        let c = &options.config;
        validate(c).map_err(|message| BackendError::Load {
            path: path.display().to_string(),
            message,
        })?;
        let spec = |name: &str, dtype: DataType, dims: &[i64]| TensorSpec {
            name: name.to_string(),
            dtype,
            shape: dims.iter().map(|&d| (d >= 0).then_some(d)).collect(),
        };
        let io = ModelIo {
            inputs: c
                .input
                .iter()
                .zip(INPUTS)
                .map(|(i, (name, dtype))| spec(name, dtype, &i.dims))
                .collect(),
            outputs: OUTPUTS
                .iter()
                .map(|&(name, dtype)| spec(name, dtype, &[1]))
                .collect(),
        };
        Ok(Box::new(Loaded { io }))
    }
}

impl Model for Loaded {
    fn io(&self) -> &ModelIo {
        &self.io
    }
    fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError> {
        Ok(Box::new(Instance))
    }
}

fn u32s(t: &Tensor) -> Vec<u32> {
    t.data()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn input<'a>(inputs: &'a [(String, Tensor)], name: &str) -> Result<&'a Tensor, BackendError> {
    inputs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| BackendError::Execute(format!("input '{name}' missing")))
}

fn scalar(dtype: DataType, bits: u32) -> Tensor {
    Tensor::new(dtype, vec![1], bits.to_le_bytes().to_vec().into()).expect("4 bytes for one 32-bit element")
}

impl ModelInstance for Instance {
    fn execute(&mut self, _: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, BackendError> {
        Err(BackendError::Execute(
            "the repeat backend answers only as a decoupled model, one response at a time \
             (gRPC ModelStreamInfer); model_warmup cannot run it"
                .into(),
        ))
    }

    fn execute_decoupled(
        &mut self,
        inputs: Vec<(String, Tensor)>,
        responses: ResponseSender,
    ) -> Result<(), BackendError> {
        let wait = u32s(input(&inputs, "WAIT")?);
        let [wait] = wait[..] else {
            return Err(BackendError::InvalidInput(
                "unexpected size for WAIT input".into(),
            ));
        };
        let (values, delays) = (input(&inputs, "IN")?, input(&inputs, "DELAY")?);
        if values.shape() != delays.shape() {
            return Err(BackendError::InvalidInput(format!(
                "expected IN and DELAY shape to match, got {} and {}",
                shape_text(values.shape()),
                shape_text(delays.shape())
            )));
        }
        let values = u32s(values);
        let delays = u32s(delays);
        std::thread::Builder::new()
            .name("repeat-responses".into())
            .spawn(move || {
                for (i, (value, delay)) in values.into_iter().zip(delays).enumerate() {
                    std::thread::sleep(Duration::from_millis(delay.into()));
                    let response = vec![
                        ("OUT".to_string(), scalar(DataType::I32, value)),
                        ("IDX".to_string(), scalar(DataType::U32, i as u32)),
                    ];
                    if !responses.send(response) {
                        return;
                    }
                }
            })
            .map_err(|e| BackendError::Execute(format!("cannot start the response thread: {e}")))?;
        std::thread::sleep(Duration::from_millis(wait.into()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Streamed;

    fn config(text: &str) -> pb::ModelConfig {
        trident_core::config::parse_config(text, Path::new("repeat_int32/config.pbtxt"))
            .expect("valid pbtxt")
            .config
    }

    const REPEAT: &str = r#"
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
        ]"#;

    #[test]
    fn the_config_is_checked_as_triton_checks_it() {
        assert_eq!(validate(&config(REPEAT)), Ok(()));
        let broken = |from: &str, to: &str| validate(&config(&REPEAT.replace(from, to))).unwrap_err();
        assert_eq!(
            broken("max_batch_size: 0", "max_batch_size: 4"),
            "repeat backend only supports models with max_batch_size == 0"
        );
        assert!(broken("decoupled: True", "decoupled: False").contains("decoupled: true"));
        assert_eq!(
            broken("\"DELAY\"", "\"PAUSE\""),
            "expected second input tensor name to be DELAY, got PAUSE"
        );
        assert_eq!(
            broken("\"IDX\" data_type: TYPE_UINT32", "\"IDX\" data_type: TYPE_INT64"),
            "expected IDX datatype to be UINT32, got TYPE_INT64"
        );
        assert_eq!(
            broken(
                "TYPE_UINT32 dims: [ 1 ] }\n        ]\n        output",
                "TYPE_UINT32 dims: [ 2 ] }\n        ]\n        output"
            ),
            "expected WAIT shape to be [1], got [2]"
        );
        assert_eq!(
            broken("TYPE_UINT32 dims: [ -1 ]", "TYPE_UINT32 dims: [ 4 ]"),
            "expected IN and DELAY shape to match, got [-1] and [4]"
        );
    }

    fn tensor(dtype: DataType, values: &[u32]) -> Tensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(dtype, vec![values.len() as i64], bytes.into()).unwrap()
    }

    fn request(values: &[i32], delays: &[u32], wait: u32) -> Vec<(String, Tensor)> {
        let values: Vec<u32> = values.iter().map(|&v| v as u32).collect();
        vec![
            ("IN".into(), tensor(DataType::I32, &values)),
            ("DELAY".into(), tensor(DataType::U32, delays)),
            ("WAIT".into(), tensor(DataType::U32, &[wait])),
        ]
    }

    /// Every response's (OUT, IDX), until the request completes.
    fn drain(mut rx: tokio::sync::mpsc::Receiver<Streamed>) -> Vec<(i32, u32)> {
        let mut got = Vec::new();
        while let Some(m) = rx.blocking_recv() {
            let Streamed::Response(outputs) = m else {
                panic!("{m:?}")
            };
            assert_eq!(outputs[0].0, "OUT");
            assert_eq!(outputs[1].0, "IDX");
            let out = u32s(&outputs[0].1)[0] as i32;
            got.push((out, u32s(&outputs[1].1)[0]));
        }
        got
    }

    #[test]
    fn one_response_per_element_after_its_delay_and_the_instance_is_free_after_wait() {
        let mut instance = Instance;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let t0 = std::time::Instant::now();
        instance
            .execute_decoupled(request(&[7, -3, 9], &[30, 30, 30], 0), ResponseSender::new(tx))
            .unwrap();
        // Released before the responses (WAIT 0 < the delays).
        assert!(t0.elapsed() < Duration::from_millis(30), "{:?}", t0.elapsed());
        assert_eq!(drain(rx), vec![(7, 0), (-3, 1), (9, 2)]);
        assert!(t0.elapsed() >= Duration::from_millis(90));

        let (tx, rx) = tokio::sync::mpsc::channel(4);
        instance
            .execute_decoupled(request(&[], &[], 0), ResponseSender::new(tx))
            .unwrap();
        assert_eq!(drain(rx), vec![], "IN of shape [0]: no responses");

        let (tx, _rx) = tokio::sync::mpsc::channel(4);
        let err = instance
            .execute_decoupled(request(&[1, 2], &[0], 0), ResponseSender::new(tx))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "expected IN and DELAY shape to match, got [2] and [1]"
        );
    }

    #[test]
    fn a_client_that_goes_away_stops_the_responses() {
        // Room for one response: the second blocks until the client reads or leaves.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let weak = tx.downgrade();
        Instance
            .execute_decoupled(
                request(&[1, 2, 3, 4], &[0, 0, 10_000, 10_000], 0),
                ResponseSender::new(tx),
            )
            .unwrap();
        drop(rx);
        // The response thread sees the closed stream at its next send and ends, dropping
        // its sender; one that went on would sleep 10 s before the third response.
        let t0 = std::time::Instant::now();
        while weak.upgrade().is_some() {
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "the response thread went on after the client left"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
