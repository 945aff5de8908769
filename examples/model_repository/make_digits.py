#!/usr/bin/env python3
"""Train a small digit classifier and export it as a Triton/Trident model repository.

Test accuracy of the committed model: 97.22% (350/360 held-out images), MLP 64 -> 32 -> 10.

The data is scikit-learn's bundled 8x8 digits set (1797 images, pixel values 0..16,
shipped inside the package, no download). An MLP 64 -> 32 (ReLU) -> 10 (softmax) is
trained with plain numpy mini-batch gradient descent (momentum) on an 80/20 split with
a fixed seed, then written as ONNX (opset 17):

    digits/config.pbtxt
    digits/1/model.onnx     input "pixels" FP32 [batch, 64] (raw 0..16 values)
                            output "probabilities" FP32 [batch, 10]

It also writes digits_sample.json (5 test images and their labels) for client.py, and
checks that onnxruntime (if installed) reproduces the numpy model.

    pip install numpy onnx scikit-learn onnxruntime
    python examples/model_repository/make_digits.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SEED = 0
HIDDEN = 32
EPOCHS = 60
BATCH = 32
LR = 0.02
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-3

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "digits"

CONFIG = """\
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "pixels"
    data_type: TYPE_FP32
    dims: [ 64 ]
  }
]
output [
  {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 500
}
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def forward(params, x):
    w1, b1, w2, b2 = params
    h = np.maximum(x @ w1 + b1, 0.0)
    return h, softmax(h @ w2 + b2)


def train(x: np.ndarray, y: np.ndarray, rng: np.random.Generator):
    """x: [n, 64] scaled to 0..1; y: int labels. Returns float32 (w1, b1, w2, b2)."""
    n, d = x.shape
    w1 = rng.standard_normal((d, HIDDEN)) * np.sqrt(2.0 / d)
    b1 = np.zeros(HIDDEN)
    w2 = rng.standard_normal((HIDDEN, 10)) * np.sqrt(2.0 / HIDDEN)
    b2 = np.zeros(10)
    params = [w1, b1, w2, b2]
    velocity = [np.zeros_like(p) for p in params]
    onehot = np.eye(10)[y]
    for _ in range(EPOCHS):
        order = rng.permutation(n)
        for start in range(0, n, BATCH):
            idx = order[start : start + BATCH]
            xb, tb = x[idx], onehot[idx]
            h, p = forward(params, xb)
            dz2 = (p - tb) / len(idx)  # d(cross-entropy)/d(logits)
            dh = (dz2 @ params[2].T) * (h > 0)
            grads = [xb.T @ dh, dh.sum(0), h.T @ dz2, dz2.sum(0)]
            for i, g in enumerate(grads):
                if i in (0, 2):
                    g = g + WEIGHT_DECAY * params[i]
                velocity[i] = MOMENTUM * velocity[i] - LR * g
                params[i] = params[i] + velocity[i]
    return [p.astype(np.float32) for p in params]


def export(params, path: Path) -> None:
    """Writes the ONNX model; the 1/16 input scaling is folded into the first layer."""
    w1, b1, w2, b2 = params
    w1_raw = (w1 / np.float32(16.0)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["pixels", "w1"], ["h0"]),
            helper.make_node("Add", ["h0", "b1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h2"]),
            helper.make_node("MatMul", ["h2", "w2"], ["z0"]),
            helper.make_node("Add", ["z0", "b2"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
        ],
        "digits",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=[
            numpy_helper.from_array(w1_raw, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    model = helper.make_model(
        graph,
        producer_name="trident-examples",
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))


def main() -> int:
    digits = load_digits()
    x = digits.data.astype(np.float64)  # [1797, 64], values 0..16
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=SEED, stratify=y
    )
    rng = np.random.default_rng(SEED)
    params = train(x_train / 16.0, y_train, rng)

    # Reference predictions of the float32 numpy model on the raw 0..16 inputs.
    def predict(xr: np.ndarray) -> np.ndarray:
        p64 = [p.astype(np.float64) for p in params]
        return forward(p64, xr / 16.0)[1]

    train_acc = float((predict(x_train).argmax(1) == y_train).mean())
    test_prob = predict(x_test)
    test_acc = float((test_prob.argmax(1) == y_test).mean())
    print(f"train accuracy: {train_acc:.4f} ({len(y_train)} images)")
    print(f"test accuracy:  {test_acc:.4f} ({len(y_test)} images)")

    model_path = MODEL_DIR / "1" / "model.onnx"
    export(params, model_path)
    (MODEL_DIR / "config.pbtxt").write_text(CONFIG)
    print(f"wrote {model_path.relative_to(HERE)} ({model_path.stat().st_size} bytes)")

    # Five held-out test images of five different digits, for client.py.
    picked: list[int] = []
    for i, label in enumerate(y_test):
        if len(picked) < 5 and label not in y_test[picked]:
            picked.append(i)
    sample = {
        "pixels": x_test[picked].astype(int).tolist(),
        "labels": y_test[picked].astype(int).tolist(),
    }
    (HERE / "digits_sample.json").write_text(json.dumps(sample) + "\n")
    print(f"wrote digits_sample.json (labels {sample['labels']})")

    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not installed: skipped the ONNX check")
        return 0
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (onnx_prob,) = sess.run(["probabilities"], {"pixels": x_test.astype(np.float32)})
    max_diff = float(np.abs(onnx_prob - test_prob).max())
    onnx_acc = float((onnx_prob.argmax(1) == y_test).mean())
    print(f"onnxruntime vs numpy: max |diff| = {max_diff:.2e}, accuracy {onnx_acc:.4f}")
    if max_diff > 1e-4 or onnx_acc != test_acc:
        print("ERROR: the exported ONNX model does not match the numpy model")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
