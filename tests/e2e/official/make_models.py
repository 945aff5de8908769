"""Builds the model repository NVIDIA's official client examples expect (Triton's
`docs/examples/model_repository`, as `qa/L0_http` / `qa/L0_grpc` assemble it), with each
TensorFlow model rebuilt as a small ONNX graph of the same names, types and shapes.
What each model computes is in MODELS.md (decoded from Triton's graphdefs).

    python3 tests/e2e/official/make_models.py   # writes tests/e2e/official/models/

The outputs are committed; this script needs only the `onnx` package.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
OUT = HERE / "models"
OPSET = [helper.make_opsetid("", 17)]


def save(name: str, graph: onnx.GraphProto, config: str, extra: dict[str, bytes] | None = None) -> None:
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="trident-official-examples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    (OUT / name / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, OUT / name / "1" / "model.onnx")
    (OUT / name / "config.pbtxt").write_text(config.strip() + "\n")
    for file, data in (extra or {}).items():
        (OUT / name / file).write_bytes(data)


def io(name: str, elem: int, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def add_sub(name: str, elem: int, config_type: str) -> None:
    g = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        name,
        [io("INPUT0", elem, ["N", 16]), io("INPUT1", elem, ["N", 16])],
        [io("OUTPUT0", elem, ["N", 16]), io("OUTPUT1", elem, ["N", 16])],
    )
    save(name, g, f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: {config_type} dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: {config_type} dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: {config_type} dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: {config_type} dims: [ 16 ] }}
]
""")


def simple_string() -> None:
    """Decimal strings in, decimal strings out: Cast(string -> int32), Add/Sub, Cast back."""
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["diff"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    s = TensorProto.STRING
    g = helper.make_graph(
        nodes,
        "simple_string",
        [io("INPUT0", s, ["N", 16]), io("INPUT1", s, ["N", 16])],
        [io("OUTPUT0", s, ["N", 16]), io("OUTPUT1", s, ["N", 16])],
    )
    save("simple_string", g, """
name: "simple_string"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
""")


def simple_identity() -> None:
    s = TensorProto.STRING
    g = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "simple_identity",
        [io("INPUT0", s, ["N", "M"])],
        [io("OUTPUT0", s, ["N", "M"])],
    )
    save("simple_identity", g, """
name: "simple_identity"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
""")


def sequence(dyna: bool) -> None:
    """OUTPUT = READY * (INPUT + START [+ END * int32(CORRID)]), as Triton's graphs do."""
    i32 = TensorProto.INT32
    inputs = [io("INPUT", i32, ["N", 1]), io("START", i32, ["N", 1]), io("READY", i32, ["N", 1])]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"])]
    total = "sum"
    if dyna:
        inputs += [io("END", i32, ["N", 1]), io("CORRID", TensorProto.UINT64, ["N", 1])]
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=i32),
            helper.make_node("Mul", ["END", "corrid"], ["end_term"]),
            helper.make_node("Add", ["sum", "end_term"], ["total"]),
        ]
        total = "total"
    nodes.append(helper.make_node("Mul", ["READY", total], ["OUTPUT"]))
    name = "simple_dyna_sequence" if dyna else "simple_sequence"
    g = helper.make_graph(nodes, name, inputs, [io("OUTPUT", i32, ["N", 1])])
    if dyna:
        config = """
name: "simple_dyna_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
    else:
        config = """
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""
    save(name, g, config)


def string_dyna_sequence() -> None:
    """Triton's `dyna_sequence` C++ test backend as ONNX with implicit state: an INT32
    accumulator per sequence (START: INPUT; else state + INPUT), plus int(CORRID) on
    END, where CORRID is a string. READY 0 leaves the state alone and outputs 0."""
    i32 = TensorProto.INT32
    nodes = [
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=i32),
        helper.make_node("Sub", ["one", "START"], ["not_start"]),
        helper.make_node("Mul", ["ACC_IN", "not_start"], ["base"]),
        helper.make_node("Add", ["base", "INPUT"], ["acc"]),
        helper.make_node("Mul", ["END", "corrid"], ["end_term"]),
        helper.make_node("Add", ["acc", "end_term"], ["new"]),
        helper.make_node("Mul", ["READY", "new"], ["OUTPUT"]),
        helper.make_node("Sub", ["one", "READY"], ["not_ready"]),
        helper.make_node("Mul", ["not_ready", "ACC_IN"], ["kept"]),
        helper.make_node("Add", ["OUTPUT", "kept"], ["ACC_OUT"]),
    ]
    inputs = [
        io("INPUT", i32, ["N", 1]),
        io("START", i32, ["N", 1]),
        io("END", i32, ["N", 1]),
        io("READY", i32, ["N", 1]),
        io("CORRID", TensorProto.STRING, ["N", 1]),
        io("ACC_IN", i32, ["N", 1]),
    ]
    g = helper.make_graph(
        nodes,
        "simple_string_dyna_sequence",
        inputs,
        [io("OUTPUT", i32, ["N", 1]), io("ACC_OUT", i32, ["N", 1])],
        initializer=[numpy_helper.from_array(np.array([[1]], np.int32), "one")],
    )
    save("simple_string_dyna_sequence", g, """
name: "simple_string_dyna_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  oldest { max_queue_delay_microseconds: 10000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [
    {
      input_name: "ACC_IN"
      output_name: "ACC_OUT"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
""")


def inception_stand_in() -> None:
    """inception_graphdef's interface; every row's output is one-hot at index 24
    (VULTURE in inception_labels.txt), whatever the image: the examples check the
    protocol path (metadata, config, classification, labels), not the network."""
    onehot = np.zeros((1, 1001), np.float32)
    onehot[0, 24] = 1.0
    nodes = [
        helper.make_node("Shape", ["input"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["batch"]),
        helper.make_node("Concat", ["batch", "classes"], ["out_shape"], axis=0),
        helper.make_node("Expand", ["onehot", "out_shape"], ["InceptionV3/Predictions/Softmax"]),
    ]
    init = [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([1001], np.int64), "classes"),
        numpy_helper.from_array(onehot, "onehot"),
    ]
    g = helper.make_graph(
        nodes,
        "inception_stand_in",
        [io("input", TensorProto.FLOAT, ["N", 299, 299, 3])],
        [io("InceptionV3/Predictions/Softmax", TensorProto.FLOAT, ["N", 1001])],
        initializer=init,
    )
    labels = (HERE / "inception_labels.txt").read_bytes()
    save("inception_graphdef", g, """
name: "inception_graphdef"
platform: "onnxruntime_onnx"
max_batch_size: 128
input [ { name: "input" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 299, 299, 3 ] } ]
output [
  {
    name: "InceptionV3/Predictions/Softmax"
    data_type: TYPE_FP32
    dims: [ 1001 ]
    label_filename: "inception_labels.txt"
  }
]
""", {"inception_labels.txt": labels})


def repeat_int32() -> None:
    """Triton's src/test/models/repeat_int32, served by Trident's native `repeat`
    backend: no model file, only the version directory (kept in git by a note)."""
    (OUT / "repeat_int32" / "1").mkdir(parents=True, exist_ok=True)
    (OUT / "repeat_int32" / "1" / "README").write_text(
        "The repeat backend needs no model file; this note keeps the version directory in git.\n"
    )
    (OUT / "repeat_int32" / "config.pbtxt").write_text("""
name: "repeat_int32"
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
""".strip() + "\n")


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    add_sub("simple", TensorProto.INT32, "TYPE_INT32")
    add_sub("simple_int8", TensorProto.INT8, "TYPE_INT8")
    simple_string()
    simple_identity()
    sequence(dyna=False)
    sequence(dyna=True)
    string_dyna_sequence()
    inception_stand_in()
    repeat_int32()
    print(f"wrote {sorted(p.name for p in OUT.iterdir())} to {OUT}")


if __name__ == "__main__":
    main()
