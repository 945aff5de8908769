"""Train → package → serve → classify, with NVIDIA's tritonclient unchanged.

A small text model (the tiny BERT fixture, fine-tuned here), a small image model (the
CNN, trained here on generated PNGs) and a table model (an MLP on generated rows with a
categorical column and missing cells) are trained by `trident train`, packaged by `trident
package` (ensemble + native tokenizer/image/table pre-processing + exported ONNX) and served by
`trident serve`. Their answers must equal `trident predict`'s label and score.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import REPO_ROOT, TridentServer, trident_bin

TINY_BERT = REPO_ROOT / "crates" / "trident-nn" / "tests" / "fixtures" / "tiny_bert"
TEXTS = ["the movie was good", "film and awful", "it is a great"]


def png(pixels: np.ndarray) -> bytes:
    """A greyscale 8-bit PNG (stdlib only: zlib + the chunk format)."""
    h, w = pixels.shape
    raw = b"".join(b"\x00" + bytes(row) for row in pixels.astype(np.uint8))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def image(rng: np.random.Generator, bright: bool) -> np.ndarray:
    base = 200 if bright else 40
    return np.clip(base + rng.normal(0, 25, (8, 8)), 0, 255)


def run(args: list[str], cwd: Path) -> str:
    out = subprocess.run([str(trident_bin()), *args], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, f"trident {' '.join(args)} failed:\n{out.stderr}"
    return out.stdout


def train_text(work: Path) -> Path:
    pos, neg = ["good", "great", "love", "fine"], ["bad", "awful", "hate", "poor"]
    fillers = ["the movie was", "it is a", "the plot is very", "film and"]
    lines = []
    for i in range(80):
        word, label = (pos[i // 2 % 4], "positive") if i % 2 == 0 else (neg[i // 2 % 4], "negative")
        lines.append(f"{fillers[i % 4]} {word}\t{label}")
    (work / "reviews.tsv").write_text("\n".join(lines) + "\n")
    (work / "text.toml").write_text(
        f"""
[run]
dir = "text_run"
seed = 3
[data]
kind = "text"
files = ["reviews.tsv"]
format = "tsv"
text_field = "0"
label_field = "1"
max_len = 16
[loader]
batch_size = 8
[model]
kind = "bert"
pretrained = "{TINY_BERT}"
pooling = "cls"
[train]
epochs = 4
lr = 5e-3
"""
    )
    run(["train", "--config", "text.toml"], work)
    return work / "text_run" / "best"


# The [data] and [loader] sections of a run on the shapes images train_image writes.
SHAPES_DATA = """[data]
kind = "folder"
train_dir = "shapes/train"
test_dir = "shapes/test"
height = 8
width = 8
mean = 0.5
std = 0.25
[loader]
batch_size = 8
"""


def train_image(work: Path) -> tuple[Path, list[Path]]:
    rng = np.random.default_rng(5)
    for split, n in [("train", 24), ("test", 6)]:
        for cls, bright in [("bright", True), ("dark", False)]:
            d = work / "shapes" / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                (d / f"{i}.png").write_bytes(png(image(rng, bright)))
    (work / "image.toml").write_text(
        """
[run]
dir = "image_run"
seed = 1
"""
        + SHAPES_DATA
        + """
[model]
kind = "cnn"
width = 4
[train]
epochs = 3
lr = 1e-2
"""
    )
    run(["train", "--config", "image.toml"], work)
    samples = []
    for i, bright in enumerate([True, False, True]):
        f = work / f"query{i}.png"
        f.write_bytes(png(image(rng, bright)))
        samples.append(f)
    return work / "image_run" / "best", samples


TABLE_ROWS = [("Biscoe", 4900.0, 39.0), ("Dream", 3600.0, 49.5), ("", 3700.0, 38.5), ("Atlantis", 3650.0, 48.0)]


def train_table(work: Path) -> Path:
    rng = np.random.default_rng(7)
    lines = ["island,mass_g,bill_mm,species"]
    for i in range(120):
        k = i % 3
        island = ["Torgersen", "Biscoe", "Dream"][k] if rng.random() < 0.7 else "Dream"
        mass = 3500 + 1200 * (k == 1) + 300 * rng.random()
        bill = 38 + 10 * (k == 2) + 3 * rng.random()
        island = "NA" if i % 29 == 4 else island
        lines.append(f"{island},{mass:.0f},{bill:.1f},{['Adelie', 'Gentoo', 'Chinstrap'][k]}")
    (work / "table.csv").write_text("\n".join(lines) + "\n")
    (work / "table.toml").write_text(
        """
[run]
dir = "table_run"
seed = 2
[data]
kind = "table"
file = "table.csv"
missing = "impute"
[loader]
batch_size = 16
[model]
kind = "mlp"
hidden = [8]
[train]
epochs = 10
lr = 3e-2
"""
    )
    run(["train", "--config", "table.toml"], work)
    return work / "table_run" / "best"


def train_autoencoders(work: Path) -> tuple[Path, Path]:
    """A dense autoencoder of the "bright" images and one of the Adelie table rows, on the
    data train_image and train_table wrote."""
    (work / "image_ae.toml").write_text(
        """
[run]
dir = "image_ae_run"
seed = 1
[data]
kind = "folder"
train_dir = "shapes/train"
test_dir = "shapes/test"
height = 8
width = 8
[anomaly]
normal = ["bright"]
[loader]
batch_size = 8
[model]
kind = "autoencoder"
hidden = [16]
code = 4
[train]
epochs = 4
lr = 1e-2
"""
    )
    (work / "table_ae.toml").write_text(
        (work / "table.toml").read_text()
        .replace('dir = "table_run"', 'dir = "table_ae_run"')
        .replace('kind = "mlp"\nhidden = [8]', 'kind = "autoencoder"\nhidden = [8]\ncode = 2\nactivation = "tanh"')
        .replace("[loader]", '[anomaly]\nnormal = ["Adelie"]\n[loader]')
    )
    run(["train", "--config", "image_ae.toml"], work)
    run(["train", "--config", "table_ae.toml"], work)
    return work / "image_ae_run" / "best", work / "table_ae_run" / "best"


def train_forecaster(work: Path) -> Path:
    """An MLP forecaster on a seasonal series with a trend (the next 4 values from 12)."""
    t = np.arange(300)
    values = 40 + 0.1 * t + 5 * np.sin(2 * np.pi * t / 12) + np.random.default_rng(3).normal(0, 0.2, 300)
    (work / "series.csv").write_text("t,value\n" + "".join(f"{i},{v:.4f}\n" for i, v in zip(t, values)))
    (work / "forecast.toml").write_text(
        """
[run]
dir = "forecast_run"
seed = 1
[data]
kind = "series"
file = "series.csv"
window = 12
horizon = 4
test = 24
val = 12
season = 12
log = true
normalize = "season"
[loader]
batch_size = 16
[model]
kind = "forecaster"
hidden = [16]
[train]
epochs = 5
lr = 3e-3
"""
    )
    run(["train", "--config", "forecast.toml"], work)
    # An LSTM with calendar features (the position in a 12-row period): a second input.
    text = (work / "forecast.toml").read_text()
    (work / "forecast_lstm.toml").write_text(
        text.replace('dir = "forecast_run"', 'dir = "forecast_lstm_run"')
        .replace('normalize = "season"', 'normalize = "season"\ncalendar = [12]')
        .replace("hidden = [16]", 'net = "lstm"\nhidden = [8]')
    )
    run(["train", "--config", "forecast_lstm.toml"], work)
    return work / "forecast_run" / "best"


def train_gan(work: Path) -> Path:
    """A DCGAN of the shapes images train_image wrote (a tiny one: only serving is checked)."""
    (work / "gan.toml").write_text(
        """
[run]
dir = "gan_run"
seed = 1
"""
        + SHAPES_DATA
        + """
[model]
kind = "gan"
z = 6
width = 4
[train]
epochs = 2
lr = 2e-3
"""
    )
    run(["train", "--config", "gan.toml"], work)
    return work / "gan_run" / "best"


def predict(model: Path, inputs: list[str], cwd: Path) -> list[dict]:
    return [json.loads(line) for line in run(["predict", "--model", str(model), *inputs], cwd).splitlines()]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    work = tmp_path_factory.mktemp("deploy")
    text_ckpt = train_text(work)
    image_ckpt, images = train_image(work)
    table_ckpt = train_table(work)
    image_ae, table_ae = train_autoencoders(work)
    forecaster = train_forecaster(work)
    gan = train_gan(work)
    repo = work / "models"
    run(["package", "--model", str(forecaster), "--repository", str(repo), "--name", "forecast"], work)
    lstm = work / "forecast_lstm_run" / "best"
    run(["package", "--model", str(lstm), "--repository", str(repo), "--name", "forecast_lstm"], work)
    run(["package", "--model", str(gan), "--repository", str(repo), "--name", "generator"], work)
    run(["package", "--model", str(image_ae), "--repository", str(repo), "--name", "shapes_ae"], work)
    run(["package", "--model", str(table_ae), "--repository", str(repo), "--name", "penguins_ae"], work)
    run(["package", "--model", str(table_ckpt), "--repository", str(repo), "--name", "penguins"], work)
    run(["package", "--model", str(text_ckpt), "--repository", str(repo), "--name", "sentiment"], work)
    run(["package", "--model", str(image_ckpt), "--repository", str(repo), "--name", "shapes"], work)
    # A long batching window, so that concurrent requests are seen to merge.
    run(
        ["package", "--model", str(text_ckpt), "--repository", str(repo), "--name", "batched",
         "--max-queue-delay-us", "300000"],
        work,
    )
    fused = os.environ.get("TRIDENT_ONNX_ENGINE", "ort") == "ort"
    if fused:
        run(
            ["package", "--model", str(text_ckpt), "--repository", str(repo), "--name", "sentiment_int8",
             "--flavour", "ort-fused", "--precision", "int8"],
            work,
        )
    run(["package", "--model", str(text_ckpt), "--archive", str(work / "model.tar.gz"), "--name", "sentiment"], work)
    # The response cache on an ensemble and on its ONNX model.
    run(["package", "--model", str(text_ckpt), "--repository", str(repo), "--name", "cached"], work)
    for name in ["cached", "cached_onnx"]:
        with open(repo / name / "config.pbtxt", "a") as f:
            f.write("response_cache { enable: true }\n")
    # Warm-up from a file (Triton's input_data_file), and one whose file is missing.
    import shutil

    for name, data_file in [("warm_file", "ids.bin"), ("warm_broken", "missing.bin")]:
        shutil.copytree(repo / "sentiment_onnx", repo / name)
        config = (repo / name / "config.pbtxt").read_text().replace('name: "sentiment_onnx"', f'name: "{name}"')
        # input_ids from the file; the mask and segments stay zeros, 4 tokens like the ids.
        ids = 'key: "input_ids"\n      value { data_type: TYPE_INT64 dims: [ 16 ] zero_data: true }'
        assert ids in config
        config = config.replace(ids, f'key: "input_ids"\n      value {{ data_type: TYPE_INT64 dims: [ 4 ] input_data_file: "{data_file}" }}')
        (repo / name / "config.pbtxt").write_text(config.replace("dims: [ 16 ] zero_data", "dims: [ 4 ] zero_data"))
        (repo / name / "warmup").mkdir()
    (repo / "warm_file" / "warmup" / "ids.bin").write_bytes(np.array([2, 7, 9, 3], dtype="<i8").tobytes())
    srv = TridentServer(repo, extra_args=["--cache-config", "local,size=1048576"])
    try:
        srv.wait_started()
        names = ["sentiment", "shapes", "penguins", "shapes_ae", "penguins_ae", "forecast", "generator", "batched", "warm_file", "cached"]
        names += ["sentiment_int8"] if fused else []
        srv.wait_models(names, ["warm_broken"], timeout=120)
    except BaseException:
        srv.stop()
        raise
    yield {
        "server": srv,
        "work": work,
        "text": text_ckpt,
        "image": image_ckpt,
        "table": table_ckpt,
        "image_ae": image_ae,
        "table_ae": table_ae,
        "forecaster": forecaster,
        "forecaster_lstm": work / "forecast_lstm_run" / "best",
        "images": images,
        "fused": fused,
    }
    assert srv.stop() == 0, srv.log(last=40)


def text_input(texts: list[bytes]) -> httpclient.InferInput:
    inp = httpclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t] for t in texts], dtype=object))
    return inp


def classify(client, model: str, inp, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
    outputs = [
        httpclient.InferRequestedOutput("probabilities", class_count=k),
        httpclient.InferRequestedOutput("logits"),
    ]
    r = client.infer(model, [inp], outputs=outputs)
    return r.as_numpy("probabilities"), r.as_numpy("logits")


def parse(entry: bytes) -> tuple[float, int, str]:
    value, index, label = entry.decode().split(":", 2)
    return float(value), int(index), label


def test_text_model_answers_like_trident_predict(deployed):
    client = deployed["server"].client()
    want = predict(deployed["text"], TEXTS, deployed["work"])
    top, logits = classify(client, "sentiment", text_input([t.encode() for t in TEXTS]))
    assert top.shape == (3, 1) and logits.shape == (3, 2)
    for row, w in zip(top, want):
        score, _, label = parse(row[0])
        assert label == w["label"]
        # predict rounds to 4 decimals; the classification string has 6.
        assert abs(score - w["score"]) <= 1e-4 + 5e-5, (score, w)


def test_image_model_answers_like_trident_predict(deployed):
    client = deployed["server"].client()
    files = deployed["images"]
    want = predict(deployed["image"], [str(f) for f in files], deployed["work"])
    inp = httpclient.InferInput("IMAGE", [len(files), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[f.read_bytes()] for f in files], dtype=object))
    top, _ = classify(client, "shapes", inp, k=2)
    assert top.shape == (3, 2)
    for row, w in zip(top, want):
        score, _, label = parse(row[0])
        assert label == w["label"] and abs(score - w["score"]) <= 1.5e-4, (row, w)
        # Both classes, probabilities summing to 1, in descending order.
        scores = [parse(e)[0] for e in row]
        assert scores[0] >= scores[1] and abs(sum(scores) - 1) < 1e-5
        assert {parse(e)[2] for e in row} == set(w["scores"])


def table_inputs(rows) -> list[httpclient.InferInput]:
    island = httpclient.InferInput("island", [len(rows), 1], "BYTES")
    island.set_data_from_numpy(np.array([[r[0].encode()] for r in rows], dtype=object))
    mass = httpclient.InferInput("mass_g", [len(rows), 1], "FP32")
    mass.set_data_from_numpy(np.array([[r[1]] for r in rows], dtype=np.float32))
    bill = httpclient.InferInput("bill_mm", [len(rows), 1], "FP32")
    bill.set_data_from_numpy(np.array([[r[2]] for r in rows], dtype=np.float32))
    return [island, mass, bill]


def test_table_model_answers_like_trident_predict(deployed):
    """Cells in, one input per column; the package's encoder scales, one-hot encodes and
    imputes exactly as training did (an empty island is missing, an unseen one all zeros)."""
    client = deployed["server"].client()
    meta = client.get_model_metadata("penguins")
    assert {i["name"]: i["datatype"] for i in meta["inputs"]} == {"island": "BYTES", "mass_g": "FP32", "bill_mm": "FP32"}
    want = predict(deployed["table"], [f"{r[0]},{r[1]:g},{r[2]:g}" for r in TABLE_ROWS], deployed["work"])
    outputs = [httpclient.InferRequestedOutput("probabilities", class_count=3)]
    r = client.infer("penguins", table_inputs(TABLE_ROWS), outputs=outputs)
    top = r.as_numpy("probabilities")
    assert top.shape == (4, 3)
    for row, w in zip(top, want):
        score, _, label = parse(row[0])
        assert label == w["label"] and abs(score - w["score"]) <= 1.5e-4, (row, w)
    assert [w["label"] for w in want[:2]] == ["Gentoo", "Chinstrap"], want
    # A missing mass (NaN) is imputed too; a request without a column is the client's error.
    rows = [("Biscoe", float("nan"), 39.0)]
    nan = predict(deployed["table"], ["Biscoe,NA,39"], deployed["work"])[0]
    score, _, label = parse(client.infer("penguins", table_inputs(rows), outputs=outputs).as_numpy("probabilities")[0][0])
    assert label == nan["label"] and abs(score - nan["score"]) <= 1.5e-4
    with pytest.raises(InferenceServerException) as e:
        client.infer("penguins", table_inputs(rows)[:2], outputs=outputs)
    assert "bill_mm" in str(e.value), str(e.value)
    # The same rows over gRPC (typed inputs, raw contents) answer the same.
    import tritonclient.grpc as grpcclient

    g = deployed["server"].grpc_client()
    inputs = []
    for name, dtype, col in [("island", "BYTES", 0), ("mass_g", "FP32", 1), ("bill_mm", "FP32", 2)]:
        inp = grpcclient.InferInput(name, [len(TABLE_ROWS), 1], dtype)
        values = [[r[col].encode() if dtype == "BYTES" else r[col]] for r in TABLE_ROWS]
        inp.set_data_from_numpy(np.array(values, dtype=object if dtype == "BYTES" else np.float32))
        inputs.append(inp)
    top = g.infer("penguins", inputs, outputs=[grpcclient.InferRequestedOutput("probabilities", class_count=3)])
    for row, w in zip(top.as_numpy("probabilities"), want):
        score, _, label = parse(row[0])
        assert label == w["label"] and abs(score - w["score"]) <= 1.5e-4, (row, w)


def test_autoencoders_score_like_trident_predict(deployed):
    """Packaged autoencoders (image bytes, or one input per table column, in): the
    reconstruction and its error per example, over HTTP and gRPC, as `trident predict`
    scores the same inputs."""
    import tritonclient.grpc as grpcclient

    srv, work = deployed["server"], deployed["work"]
    client, g = srv.client(), srv.grpc_client()
    meta = client.get_model_metadata("shapes_ae")
    assert {o["name"]: o["shape"] for o in meta["outputs"]} == {
        "reconstruction": [-1, 1, 8, 8],
        "reconstruction_error": [-1, 1],
    }, meta
    files = deployed["images"]
    want = [w["reconstruction_error"] for w in predict(deployed["image_ae"], [str(f) for f in files], work)]
    inp = httpclient.InferInput("IMAGE", [len(files), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[f.read_bytes()] for f in files], dtype=object))
    r = client.infer("shapes_ae", [inp])
    got = r.as_numpy("reconstruction_error")[:, 0]
    assert np.allclose(got, want, rtol=1e-4, atol=1e-6), (got, want)
    rec = r.as_numpy("reconstruction")
    assert rec.shape == (3, 1, 8, 8) and rec.min() >= 0 and rec.max() <= 1  # a sigmoid decoder
    # The dark image (an anomaly: only bright ones were learnt) reconstructs worst.
    assert got[1] > max(got[0], got[2]), got

    want = predict(deployed["table_ae"], [f"{r[0]},{r[1]:g},{r[2]:g}" for r in TABLE_ROWS], work)
    want = [w["reconstruction_error"] for w in want]
    got = client.infer("penguins_ae", table_inputs(TABLE_ROWS)).as_numpy("reconstruction_error")[:, 0]
    assert np.allclose(got, want, rtol=1e-4, atol=1e-6), (got, want)
    inputs = []
    for name, dtype, col in [("island", "BYTES", 0), ("mass_g", "FP32", 1), ("bill_mm", "FP32", 2)]:
        inp = grpcclient.InferInput(name, [len(TABLE_ROWS), 1], dtype)
        values = [[r[col].encode() if dtype == "BYTES" else r[col]] for r in TABLE_ROWS]
        inp.set_data_from_numpy(np.array(values, dtype=object if dtype == "BYTES" else np.float32))
        inputs.append(inp)
    got = g.infer("penguins_ae", inputs).as_numpy("reconstruction_error")[:, 0]
    assert np.allclose(got, want, rtol=1e-4, atol=1e-6), (got, want)


def test_forecaster_serves_what_trident_predict_forecasts(deployed):
    """The packaged forecaster takes raw values (its log and seasonal offsets are in the
    graph) and answers, over HTTP and gRPC, the forecast `trident predict` gives."""
    import tritonclient.grpc as grpcclient

    srv, work = deployed["server"], deployed["work"]
    meta = srv.client().get_model_metadata("forecast")
    assert meta["inputs"] == [{"name": "values", "datatype": "FP32", "shape": [-1, 12]}], meta
    series = [float(line.split(",")[1]) for line in (work / "series.csv").read_text().splitlines()[1:]]
    windows = [series[i:i + 12] for i in (0, 100, 288)]
    want = [predict(deployed["forecaster"], [",".join(f"{v:.4f}" for v in w)], work)[0]["forecast"] for w in windows]
    x = np.array(windows, dtype=np.float32)
    inp = httpclient.InferInput("values", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = srv.client().infer("forecast", [inp]).as_numpy("forecast")
    assert got.shape == (3, 4)
    assert np.allclose(got, want, rtol=1e-4), (got, want)
    g = grpcclient.InferInput("values", list(x.shape), "FP32")
    g.set_data_from_numpy(x)
    assert np.allclose(srv.grpc_client().infer("forecast", [g]).as_numpy("forecast"), want, rtol=1e-4)


def test_calendar_lstm_forecaster_serves_each_window_from_its_position(deployed):
    """An LSTM forecaster with calendar features takes the window and the forecast's row
    (`position`, INT64); over HTTP and gRPC, batched and one window at a time (a recurrent
    node must not carry one request's state into the next), it answers what `trident
    predict` gives for the series cut after that window."""
    import tritonclient.grpc as grpcclient

    srv, work = deployed["server"], deployed["work"]
    meta = srv.client().get_model_metadata("forecast_lstm")
    assert meta["inputs"] == [
        {"name": "values", "datatype": "FP32", "shape": [-1, 12]},
        {"name": "position", "datatype": "INT64", "shape": [-1, 1]},
    ], meta
    lines = (work / "series.csv").read_text().splitlines()
    series = [float(line.split(",")[1]) for line in lines[1:]]
    ends = [12, 113, 300]
    want = []
    for end in ends:
        cut = work / f"series_{end}.csv"
        cut.write_text("\n".join(lines[: end + 1]) + "\n")
        want.append(predict(deployed["forecaster_lstm"], [str(cut)], work)[0]["forecast"])
    x = np.array([series[e - 12 : e] for e in ends], dtype=np.float32)
    pos = np.array([[e] for e in ends], dtype=np.int64)

    def inputs(module, x, pos):
        a = module.InferInput("values", list(x.shape), "FP32")
        a.set_data_from_numpy(x)
        b = module.InferInput("position", list(pos.shape), "INT64")
        b.set_data_from_numpy(pos)
        return [a, b]

    for _ in range(2):
        got = srv.client().infer("forecast_lstm", inputs(httpclient, x, pos)).as_numpy("forecast")
        assert got.shape == (3, 4)
        assert np.allclose(got, want, rtol=1e-4), (got, want)
        for i in range(3):
            one = srv.client().infer("forecast_lstm", inputs(httpclient, x[i : i + 1], pos[i : i + 1]))
            assert np.allclose(one.as_numpy("forecast")[0], want[i], rtol=1e-4), (i, one.as_numpy("forecast"), want[i])
    g = srv.grpc_client().infer("forecast_lstm", inputs(grpcclient, x, pos)).as_numpy("forecast")
    assert np.allclose(g, want, rtol=1e-4), (g, want)


def test_gan_generator_serves_images_from_latent_vectors(deployed):
    """The packaged generator takes latent vectors and answers, over HTTP and gRPC, the
    images its ONNX graph gives when ONNX Runtime runs it directly: pixels in [0, 1]."""
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient

    srv, work = deployed["server"], deployed["work"]
    meta = srv.client().get_model_metadata("generator")
    assert meta["inputs"] == [{"name": "z", "datatype": "FP32", "shape": [-1, 6]}], meta
    assert meta["outputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}], meta
    z = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    session = ort.InferenceSession(str(work / "models" / "generator" / "1" / "model.onnx"))
    (want,) = session.run(["image"], {"z": z})
    inp = httpclient.InferInput("z", list(z.shape), "FP32")
    inp.set_data_from_numpy(z)
    got = srv.client().infer("generator", [inp]).as_numpy("image")
    assert got.shape == (5, 1, 8, 8)
    assert np.allclose(got, want, atol=1e-5)
    assert got.min() >= 0.0 and got.max() <= 1.0
    # Different latent vectors, different images.
    assert np.abs(got[0] - got[1]).max() > 1e-3
    g = grpcclient.InferInput("z", list(z.shape), "FP32")
    g.set_data_from_numpy(z)
    assert np.allclose(srv.grpc_client().infer("generator", [g]).as_numpy("image"), want, atol=1e-5)


def test_int8_fused_model_keeps_the_labels(deployed):
    if not deployed["fused"]:
        pytest.skip("the ort-fused int8 package runs on ONNX Runtime only")
    client = deployed["server"].client()
    want = predict(deployed["text"], TEXTS, deployed["work"])
    top, _ = classify(client, "sentiment_int8", text_input([t.encode() for t in TEXTS]))
    for row, w in zip(top, want):
        score, _, _ = parse(row[0])
        assert abs(score - w["score"]) < 0.05, (row, w)


def test_ensemble_errors_name_the_step_and_are_the_clients(deployed):
    srv = deployed["server"]
    client = srv.client()
    long_text = " ".join(["good"] * 40).encode()
    with pytest.raises(InferenceServerException) as e:
        classify(client, "sentiment", text_input([b"fine", long_text]))
    msg = str(e.value)
    assert "sentiment_preprocess" in msg and "tokens" in msg and "max_length 16" in msg, msg
    with pytest.raises(InferenceServerException) as e:
        classify(client, "sentiment", text_input([b"\xff\xfe not utf-8"]))
    assert "UTF-8" in str(e.value) and "sentiment_preprocess" in str(e.value)
    bad = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
    bad.set_data_from_numpy(np.array([[b"not an image at all"]], dtype=object))
    with pytest.raises(InferenceServerException) as e:
        classify(client, "shapes", bad)
    assert "PNG or JPEG" in str(e.value) and "shapes_preprocess" in str(e.value)
    # Status codes, from the raw protocol.
    status, _, body = srv.request(
        "POST",
        "/v2/models/sentiment/infer",
        json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [" ".join(["good"] * 40)]}]}),
    )
    assert status == 400, body
    assert "sentiment_preprocess" in json.loads(body)["error"]
    # The server keeps serving.
    top, _ = classify(client, "sentiment", text_input([b"film and awful"]))
    assert top.shape == (1, 1)


def test_classification_on_the_onnx_model_and_labels_file(deployed):
    client = deployed["server"].client()
    ids = httpclient.InferInput("input_ids", [1, 4], "INT64")
    ids.set_data_from_numpy(np.array([[2, 7, 9, 3]], dtype=np.int64))
    mask = httpclient.InferInput("attention_mask", [1, 4], "INT64")
    mask.set_data_from_numpy(np.ones((1, 4), dtype=np.int64))
    types = httpclient.InferInput("token_type_ids", [1, 4], "INT64")
    types.set_data_from_numpy(np.zeros((1, 4), dtype=np.int64))
    out = [httpclient.InferRequestedOutput("logits", class_count=2)]
    r = client.infer("sentiment_onnx", [ids, mask, types], outputs=out)
    row = r.as_numpy("logits")[0]
    labels = (deployed["work"] / "models" / "sentiment_onnx" / "labels.txt").read_text().split()
    assert sorted(parse(e)[2] for e in row) == sorted(labels)
    meta = client.get_server_metadata()
    assert "classification" in meta["extensions"]


def test_dynamic_batching_still_merges_requests_through_the_ensemble(deployed):
    srv = deployed["server"]
    client = srv.client(concurrency=8)
    outputs = [httpclient.InferRequestedOutput("probabilities", class_count=1)]
    pending = [
        client.async_infer("batched", [text_input([b"the movie was good"])], outputs=outputs)
        for _ in range(8)
    ]
    answers = [p.get_result().as_numpy("probabilities") for p in pending]
    assert len({a[0][0] for a in answers}) == 1, "the same text gets the same answer"
    stats = client.get_inference_statistics("batched_onnx")["model_stats"][0]
    assert stats["inference_count"] == 8
    assert stats["execution_count"] < 8, f"no request merged: {stats}"
    pre = client.get_inference_statistics("batched_preprocess")["model_stats"][0]
    assert pre["inference_count"] == 8
    ens = client.get_inference_statistics("batched")["model_stats"][0]
    assert ens["inference_stats"]["success"]["count"] == 8


def test_archive_has_model_folders_at_the_top(deployed):
    with tarfile.open(deployed["work"] / "model.tar.gz") as tar:
        names = set(tar.getnames())
    assert "config.pbtxt" not in names
    for folder in ["sentiment", "sentiment_preprocess", "sentiment_onnx"]:
        assert f"{folder}/config.pbtxt" in names, names
    assert "sentiment_onnx/1/model.onnx" in names and "sentiment_preprocess/1/tokenizer.json" in names
    with tarfile.open(deployed["work"] / "model.tar.gz") as tar:
        model = tar.extractfile("sentiment_onnx/1/model.onnx").read()
    import onnx

    onnx.checker.check_model(onnx.load_model_from_string(model), full_check=True)


def test_warmup_runs_before_ready_and_a_failing_one_keeps_the_model_out(deployed):
    srv = deployed["server"]
    status, _, body = srv.request("POST", "/v2/repository/index", {})
    index = {e["name"]: e for e in json.loads(body)}
    assert index["warm_file"]["state"] == "READY"
    broken = index["warm_broken"]
    assert broken["state"] == "UNAVAILABLE" and "missing.bin" in broken["reason"], broken
    assert "model_warmup" in broken["reason"]
    # The packaged models carry a warm-up sample and were served after it ran.
    assert "model_warmup" in (deployed["work"] / "models" / "sentiment_onnx" / "config.pbtxt").read_text()


def test_response_cache_answers_repeats_without_executing(deployed):
    srv = deployed["server"]
    client = srv.client()

    def stats(model):
        return client.get_inference_statistics(model)["model_stats"][0]

    first, _ = classify(client, "cached", text_input([b"it is a great"]))
    onnx_before = stats("cached_onnx")["execution_count"]
    again, logits = classify(client, "cached", text_input([b"it is a great"]))
    assert (first == again).all()
    s = stats("cached")["inference_stats"]
    assert s["cache_hit"]["count"] == 1 and s["cache_miss"]["count"] == 1, s
    assert stats("cached_onnx")["execution_count"] == onnx_before, "a hit runs nothing"
    # Output selection still applies to a cached answer.
    r = client.infer("cached", [text_input([b"it is a great"])], outputs=[httpclient.InferRequestedOutput("logits")])
    assert r.as_numpy("probabilities") is None and np.allclose(r.as_numpy("logits"), logits)
    # Other inputs miss; a refused request is not cached.
    classify(client, "cached", text_input([b"film and awful"]))
    with pytest.raises(InferenceServerException):
        classify(client, "cached", text_input([" ".join(["good"] * 40).encode()]))
    s = stats("cached")["inference_stats"]
    assert s["cache_hit"]["count"] == 2 and s["cache_miss"]["count"] == 2, s
    # The ensemble's own cache answered, so its ONNX model saw misses only.
    assert stats("cached_onnx")["inference_stats"]["cache_hit"]["count"] == 0
    metrics = srv.metrics()
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 2' in metrics, metrics
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"} 2' in metrics


def test_explicit_load_of_an_ensemble_loads_its_composing_models(deployed):
    srv = TridentServer(deployed["work"] / "models", load="sentiment")
    try:
        srv.wait_started()
        srv.wait_models(["sentiment", "sentiment_preprocess", "sentiment_onnx"], [], timeout=60)
        status, _, body = srv.request("POST", "/v2/repository/index", {"ready": True})
        ready = {e["name"] for e in json.loads(body)}
        assert ready == {"sentiment", "sentiment_preprocess", "sentiment_onnx"}, ready
        top, _ = classify(srv.client(), "sentiment", text_input([b"it is a great"]))
        assert top.shape == (1, 1)
        # Unloading a composing model makes the ensemble's requests fail by name, not hang.
        status, _, _ = srv.request("POST", "/v2/repository/models/sentiment_onnx/unload", {})
        assert status == 200
        status, _, body = srv.request(
            "POST",
            "/v2/models/sentiment/infer",
            {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["fine"]}]},
        )
        assert status in (400, 503) and "sentiment_onnx" in json.loads(body)["error"], (status, body)
    finally:
        assert srv.stop() == 0
