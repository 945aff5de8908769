"""Reference detectors for the breast-cancer anomaly example, on the very splits Trident
trains on (examples/tabular/reference.py ports its split): the Mahalanobis distance and the
PCA(5) reconstruction error, fitted on the benign rows of the training split (z-scored with
their statistics), scored on the whole test split with malignant rows as the anomalies.
The reference (docs/RESULTS.md, "Autoencoders and anomaly detection"): Mahalanobis 0.957,
PCA(5) 0.895. numpy only.

    python3 examples/autoencoder/reference.py [N]     # seeds 0..N-1 (default 10)
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tabular"))
from reference import read_sklearn, stratified_split  # noqa: E402

BENIGN = 1  # scikit-learn's breast_cancer.csv: 0 malignant, 1 benign


def auroc(scores, positive):
    """Mann-Whitney with average ranks for ties (scikit-learn's roc_auc_score)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(s))
    r[order] = ranks
    p = positive.sum()
    n = len(positive) - p
    return (r[positive].sum() - p * (p + 1) / 2) / (p * n)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    x, y = read_sklearn("data/tabular/breast_cancer.csv")
    results = {"mahalanobis": [], "pca5": []}
    for seed in range(n):
        tr, _, te = stratified_split(list(y), 0.1, 0.4, seed)
        tr = [i for i in tr if y[i] == BENIGN]
        mean, std = x[tr].mean(0), x[tr].std(0)
        std[std == 0] = 1
        z = (x - mean) / std
        positive = y[te] != BENIGN
        # Mahalanobis: the benign rows' covariance (pseudo-inverse: 30 features).
        cov = np.cov(z[tr], rowvar=False)
        inv = np.linalg.pinv(cov)
        d = z[te] - z[tr].mean(0)
        results["mahalanobis"].append(auroc(np.einsum("ij,jk,ik->i", d, inv, d), positive))
        # PCA(5) reconstruction error.
        c = z[tr].mean(0)
        _, _, vt = np.linalg.svd(z[tr] - c, full_matrices=False)
        basis = vt[:5]
        rec = (z[te] - c) @ basis.T @ basis + c
        results["pca5"].append(auroc(((z[te] - rec) ** 2).mean(1), positive))
    for name, v in results.items():
        print(f"{name:12s} seeds {n:2d}  mean {np.mean(v):.4f}  min {min(v):.4f}  max {max(v):.4f}  "
              f"all: {' '.join(f'{a:.3f}' for a in v)}")


if __name__ == "__main__":
    main()
