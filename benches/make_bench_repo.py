"""Writes the benchmark model repository (not committed: ~5 MB of weights).

    python benches/make_bench_repo.py /tmp/bench_repo

Models (same ONNX graph, different serving configuration):
  mlp_batched   384 -> 1536 -> ReLU -> 384, FP32,
                max_batch_size 32, dynamic_batching { preferred 8, 16; 100 us delay }
  mlp_nobatch   the same graph, max_batch_size 32, no dynamic batching
  digits        the example model (copied from examples/model_repository)
  digits_nobatch  the same without dynamic batching (no queue delay: isolates overhead)
"""

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((384, 1536)) / np.sqrt(384)).astype(np.float32)
    b1 = np.zeros(1536, np.float32)
    w2 = (rng.standard_normal((1536, 384)) / np.sqrt(1536)).astype(np.float32)
    b2 = np.zeros(384, np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2")]]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
        helper.make_node("Add", ["h3", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 384])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 384])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 384 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 384 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{batching}"""


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = mlp()
    batching = {
        "mlp_batched": "dynamic_batching { preferred_batch_size: [ 8, 16 ] max_queue_delay_microseconds: 100 }\n",
        "mlp_nobatch": "",
    }
    for name, block in batching.items():
        (out / name / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, out / name / "1" / "model.onnx")
        (out / name / "config.pbtxt").write_text(CONFIG.format(name=name, batching=block))
    shutil.copytree(ROOT / "examples/model_repository/digits", out / "digits", dirs_exist_ok=True)
    nobatch = out / "digits_nobatch"
    shutil.copytree(ROOT / "examples/model_repository/digits", nobatch, dirs_exist_ok=True)
    cfg = (nobatch / "config.pbtxt").read_text().replace('name: "digits"', 'name: "digits_nobatch"')
    cfg = cfg[: cfg.index("dynamic_batching")] + cfg[cfg.index("instance_group"):]
    (nobatch / "config.pbtxt").write_text(cfg)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bench_repo"))
