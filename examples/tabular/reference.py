"""The tabular reference protocol (docs/RESULTS.md, "Tabular data"), run on the
very splits Trident trains on: softmax regression, 500 full-batch gradient-descent steps at
lr 0.5 on features z-scored with the training rows' statistics, test accuracy per seed.

Trident's stratified split (trident_data::sampler::stratified_split, SplitMix64) is ported
below, so seed s here is `[run] seed = s` there. numpy only.

    python3 examples/tabular/reference.py [N]
"""

import sys

import numpy as np

M = (1 << 64) - 1


def splitmix_next(state):
    state = (state + 0x9E3779B97F4A7C15) & M
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return state, z ^ (z >> 31)


def from_parts(parts):
    state = 0x6A09E667F3BCC909
    for p in parts:
        _, state = splitmix_next(state ^ p)
    return state


def below(state, n):
    while True:
        state, x = splitmix_next(state)
        m = x * n
        if (m & M) >= ((-n) & M) % n:
            return state, m >> 64


def stratified_split(labels, val, test, seed):
    tr, va, te = [], [], []
    for k in range(max(labels) + 1):
        idx = [i for i, l in enumerate(labels) if l == k]
        state = from_parts([seed, 0x5742A71F, k])
        for i in range(len(idx) - 1, 0, -1):
            state, j = below(state, i + 1)
            idx[i], idx[j] = idx[j], idx[i]
        n = len(idx)
        n_test = min(int(np.floor(n * test + 0.5)), max(n - 1, 0))
        n_val = min(int(np.floor(n * val + 0.5)), max(n - 1 - n_test, 0))
        te += idx[n - n_test:]
        va += idx[n - n_test - n_val:n - n_test]
        tr += idx[:n - n_test - n_val]
    return sorted(tr), sorted(va), sorted(te)


def read_sklearn(path):
    with open(path) as f:
        next(f)
        rows = np.array([[float(c) for c in line.split(",")] for line in f if line.strip()])
    return rows[:, :-1], rows[:, -1].astype(int)


def softmax_regression(x, y, classes, steps=500, lr=0.5):
    w = np.zeros((x.shape[1], classes))
    b = np.zeros(classes)
    onehot = np.eye(classes)[y]
    for _ in range(steps):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / len(y)
        w -= lr * x.T @ g
        b -= lr * g.sum(0)
    return w, b


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for name in ["wine_data", "breast_cancer"]:
        x, y = read_sklearn(f"data/tabular/{name}.csv")
        accs = []
        for seed in range(n):
            tr, _, te = stratified_split(list(y), 0.0, 0.2, seed)
            mean, std = x[tr].mean(0), x[tr].std(0)
            std[std == 0] = 1
            z = (x - mean) / std
            w, b = softmax_regression(z[tr], y[tr], y.max() + 1)
            accs.append(float(((z[te] @ w + b).argmax(1) == y[te]).mean()))
        print(f"{name:14s} reference seeds {n:2d}  mean {np.mean(accs):.4f}  min {min(accs):.4f}  "
              f"max {max(accs):.4f}  all: {' '.join(f'{a:.3f}' for a in accs)}")


if __name__ == "__main__":
    main()
