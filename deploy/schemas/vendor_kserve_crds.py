#!/usr/bin/env python3
"""Vendor the openAPIV3Schema of KServe's ClusterServingRuntime and InferenceService CRDs.

tests/e2e/test_deploy_manifests.py validates deploy/kserve/*.yaml against these files
offline (the Kubernetes JSON schemas that kubernetes-validate bundles have no CRDs).

Usage: python3 deploy/schemas/vendor_kserve_crds.py KSERVE_CHECKOUT [COMMIT]
reads KSERVE_CHECKOUT/config/crd/full/serving.kserve.io_{clusterservingruntimes,
inferenceservices}.yaml and writes deploy/schemas/kserve-*.json.

The ClusterServingRuntime schema is kept whole. The InferenceService schema is pruned to
what these manifests can use: `spec.predictor` with its `model` field (the framework-
specific predictor fields, `workerSpec`, the transformer, explainer, canary and status
trees are replaced by an open object, so a manifest using them is not checked there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent

# Predictor fields that are whole framework-specific container specs (13 kB each) or
# the multi-node spec; trident's manifests use `model` instead.
PRUNED_PREDICTOR = [
    "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "pmml",
    "lightgbm", "paddle", "huggingface", "workerSpec",
]
PRUNED_SPEC = ["transformer", "explainer", "canary"]


def pruned(what: str) -> dict:
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": f"(pruned when vendored: {what} is not validated here)",
    }


def crd_schema(path: Path, version: str) -> dict:
    crd = yaml.safe_load(path.read_text())
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise SystemExit(f"{path}: no version {version}")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    root = Path(sys.argv[1])
    commit = sys.argv[2] if len(sys.argv) > 2 else "unknown"
    crds = root / "config" / "crd" / "full"

    csr = crd_schema(crds / "serving.kserve.io_clusterservingruntimes.yaml", "v1alpha1")
    csr["x-vendored-from"] = (
        f"kserve/kserve@{commit} config/crd/full/serving.kserve.io_clusterservingruntimes.yaml"
    )
    write(OUT / "kserve-clusterservingruntime-v1alpha1.json", csr)

    isvc = crd_schema(crds / "serving.kserve.io_inferenceservices.yaml", "v1beta1")
    spec = isvc["properties"]["spec"]
    for name in PRUNED_SPEC:
        if name in spec["properties"]:
            spec["properties"][name] = pruned(f"spec.{name}")
    predictor = spec["properties"]["predictor"]
    for name in PRUNED_PREDICTOR:
        if name in predictor["properties"]:
            predictor["properties"][name] = pruned(f"spec.predictor.{name}")
    if "status" in isvc.get("properties", {}):
        isvc["properties"]["status"] = pruned("status")
    isvc["x-vendored-from"] = (
        f"kserve/kserve@{commit} config/crd/full/serving.kserve.io_inferenceservices.yaml"
        f" (pruned: spec.{{{','.join(PRUNED_SPEC)}}}, spec.predictor.{{{','.join(PRUNED_PREDICTOR)}}}, status)"
    )
    write(OUT / "kserve-inferenceservice-v1beta1.json", isvc)


def write(path: Path, schema: dict) -> None:
    path.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
