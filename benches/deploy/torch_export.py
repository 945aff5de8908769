"""The Triton side of the deployment benchmark: the ONNX graph that
`torch.onnx.export` writes from the same checkpoint, the way Triton users serve a
fine-tuned BERT today. The checkpoint's weights carry Hugging Face's names, so
transformers' BertModel loads them; mean pooling and the linear head are added as the
model has them. Checks the export against PyTorch itself and, when given, a
Trident-exported graph on the same padded batch (needs onnxruntime in the venv).

    /work/venv-torch/bin/python benches/deploy/torch_export.py runs/sentiment/best OUT.onnx [TRIDENT.onnx]
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel


class Classifier(torch.nn.Module):
    def __init__(self, ckpt: Path):
        super().__init__()
        config = BertConfig.from_json_file(str(ckpt / "config.json"))
        self.bert = BertModel(config, add_pooling_layer=True)
        weights = load_file(str(ckpt / "model.safetensors"))
        card = json.loads((ckpt / "trident.json").read_text())
        self.pooling = card["model"].get("pooling", "mean")
        classes = len(card["classes"])
        self.classifier = torch.nn.Linear(config.hidden_size, classes)
        bert = {k[len("bert."):]: v for k, v in weights.items() if k.startswith("bert.")}
        missing, unexpected = self.bert.load_state_dict(bert, strict=False)
        missing = [m for m in missing if not m.endswith("position_ids")]
        assert not missing and not unexpected, (missing, unexpected)
        self.classifier.load_state_dict({"weight": weights["classifier.weight"], "bias": weights["classifier.bias"]})

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        if self.pooling == "cls":
            pooled = out.pooler_output
        else:
            m = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
            pooled = (out.last_hidden_state * m).sum(1) / m.sum(1).clamp(min=1e-9)
        logits = self.classifier(pooled)
        return logits, torch.softmax(logits, dim=-1)


def main():
    ckpt, out = Path(sys.argv[1]), sys.argv[2]
    model = Classifier(ckpt).eval()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    encs = [tok.encode(t).ids for t in ["the movie was great, I loved it", "awful"]]
    n = max(map(len, encs))
    ids = torch.tensor([e + [0] * (n - len(e)) for e in encs])
    mask = torch.tensor([[1] * len(e) + [0] * (n - len(e)) for e in encs])
    types = torch.zeros_like(ids)
    torch.onnx.export(
        model,
        (ids, mask, types),
        out,
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["logits", "probabilities"],
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in ["input_ids", "attention_mask", "token_type_ids"]}
        | {n: {0: "batch"} for n in ["logits", "probabilities"]},
        opset_version=17,
        dynamo=False,
    )
    import onnxruntime as ort

    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    with torch.no_grad():
        want = model(ids, mask, types)[0].numpy()
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    print(f"torch export vs PyTorch: max |diff| {np.abs(got - want).max():.2e}")
    if len(sys.argv) > 3:
        ours = ort.InferenceSession(sys.argv[3], providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
        print(f"trident export vs PyTorch: max |diff| {np.abs(ours - want).max():.2e}")


if __name__ == "__main__":
    main()
