"""Writes the fuzzers' seed corpus, fuzz/seeds/<target>/ (committed; deterministic).

    python3 fuzz/make_seeds.py
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SEEDS = HERE / "seeds"


def write(target: str, name: str, data: bytes) -> None:
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def request(inputs, outputs=None, parameters=None) -> dict:
    r = {"id": "seed", "inputs": inputs}
    if outputs is not None:
        r["outputs"] = outputs
    if parameters is not None:
        r["parameters"] = parameters
    return r


def bytes_elements(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def main() -> None:
    if SEEDS.exists():
        shutil.rmtree(SEEDS)
    # codec_json: what clients send, every data type, both field orders.
    simple = request(
        [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [[1] * 16]},
        ],
        outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}],
    )
    write("codec_json", "simple.json", json.dumps(simple).encode())
    kinds = {
        "BOOL": [True, False],
        "UINT8": [0, 255],
        "INT8": [-128, 127],
        "UINT64": [0, 18446744073709551615],
        "INT64": [-9223372036854775808, 1],
        "FP16": [1.5, "NaN"],
        "BF16": [-2.0, "Infinity"],
        "FP32": [3.25, "-Infinity"],
        "FP64": [1e300, -0.0],
        "BYTES": ["héllo", ""],
    }
    for dtype, data in kinds.items():
        body = json.dumps(request([{"name": "x", "datatype": dtype, "shape": [2], "data": data}]))
        write("codec_json", f"{dtype.lower()}.json", body.encode())
    late = '{"inputs":[{"name":"x","data":[[1,2],[3,4]],"shape":[2,2],"datatype":"FP32"}]}'
    write("codec_json", "data_before_datatype.json", late.encode())
    # codec_binary: two bytes of header length, then JSON and binary parts.
    header = json.dumps(
        request(
            [
                {"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
                {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 13}},
            ],
            parameters={"binary_data_output": True},
        )
    ).encode()
    binary = struct.pack("<2f", 1.0, -2.5) + bytes_elements([b"abc", b"\xff\x00"])
    write("codec_binary", "mixed.bin", struct.pack("<H", len(header)) + header + binary)
    # config_pbtxt: every fixture and example configuration.
    for config in sorted(ROOT.glob("tests/fixtures/models/*/config.pbtxt")) + sorted(
        ROOT.glob("examples/model_repository/*/config.pbtxt")
    ):
        write("config_pbtxt", f"{config.parent.name}.pbtxt", config.read_bytes())
    # bytes_tensor: kind, rank, dims, payload (see trident_fuzz::bytes_tensor).
    write("bytes_tensor", "bytes_2.bin", bytes([13, 1, 2]) + bytes_elements([b"ab", b"c"]))
    write("bytes_tensor", "fp32_2x2.bin", bytes([10, 2, 2, 2]) + struct.pack("<4f", 1, 2, 3, 4))
    write("bytes_tensor", "scalar_u8.bin", bytes([1, 0, 7]))
    # checkpoint: 0 + state.json, 1 + model.safetensors (w [2,3], b [4]).
    state = {
        "epoch": 1,
        "batch_in_epoch": 2,
        "micro_step": 7,
        "optimizer_step": 1,
        "best_metric": 0.5,
        "best_epoch": 0,
        "epochs_without_improvement": 0,
        "finished": False,
    }
    write("checkpoint", "state.json.bin", b"\x00" + json.dumps(state).encode())
    tensors = {
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]},
    }
    head = json.dumps(tensors, separators=(",", ":")).encode()
    data = struct.pack("<6f", *range(6)) + struct.pack("<4f", 0, 0, 0, 0)
    write("checkpoint", "model.safetensors.bin", b"\x01" + struct.pack("<Q", len(head)) + head + data)


if __name__ == "__main__":
    main()
