"""PyTorch's equivalent of examples/tabular/{wine,breast_cancer,penguins}.toml: the same
split (Trident's stratified split, ported in examples/tabular/reference.py), the same
encoding (z-score fitted on the training rows; penguins: `island` and `sex` one-hot over the
training levels, missing cells imputed with the training mean or most frequent level), the
same network, optimizer, batch size, epochs and shuffling per epoch (not the same order).

Prints, per data set, the median seconds of an epoch's training pass (epochs 2..; the
first warms up), examples per second, the loop's total and the test accuracy, like
benches/tabular_epochs.sh reads Trident's metrics.jsonl. Threads: TORCH_THREADS (default
2, the cores of the machines we run on).

    python3 benches/peers/torch_tabular.py [seed]
"""

import csv
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "tabular"))
from reference import read_sklearn, stratified_split  # noqa: E402

CONFIGS = {
    # name: (hidden, dropout, batch, epochs, lr, weight_decay)
    "wine": ([], 0.0, 16, 60, 0.05, 0.0),
    "breast_cancer": ([32], 0.2, 32, 40, 3e-3, 0.01),
    "penguins": ([16], 0.0, 16, 40, 1e-2, 0.01),
}


def penguins():
    """The rows, their labels and the class names (sorted species)."""
    rows = list(csv.DictReader(open("data/tabular/penguins.csv")))
    classes = sorted({r["species"] for r in rows})
    y = np.array([classes.index(r["species"]) for r in rows])
    return rows, y, classes


def encode_penguins(rows, train):
    """Features in Trident's column order, with its `missing = "impute"` and one-hot rules."""
    numeric = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
    cats = ["island", "sex"]
    cols = []
    for c in ["island", *numeric, "sex"]:
        cells = [None if r[c] in ("", "NA") else r[c] for r in rows]
        seen = [cells[i] for i in train if cells[i] is not None]
        if c in cats:
            levels = sorted(set(seen))
            fill = min(levels, key=lambda l: (-seen.count(l), l))
            cols.append(np.array([[float((v or fill) == l) for l in levels] for v in cells]))
        else:
            v = np.array([float(x) for x in seen])
            mean, std = v.mean(), v.std()
            cols.append(np.array([[((float(x) if x is not None else mean) - mean) / std] for x in cells]))
    return np.hstack(cols)


def data(name, seed):
    if name == "penguins":
        rows, y, _ = penguins()
        tr, _, te = stratified_split(list(y), 0.0, 0.2, seed)
        x = encode_penguins(rows, tr)
    else:
        x, y = read_sklearn(f"data/tabular/{'wine_data' if name == 'wine' else name}.csv")
        tr, _, te = stratified_split(list(y), 0.0, 0.2, seed)
        mean, std = x[tr].mean(0), x[tr].std(0)
        std[std == 0] = 1
        x = (x - mean) / std
    f = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return f(x[tr]), torch.tensor(y[tr]), f(x[te]), torch.tensor(y[te])


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
    for name, (hidden, dropout, batch, epochs, lr, wd) in CONFIGS.items():
        torch.manual_seed(seed)
        xtr, ytr, xte, yte = data(name, seed)
        sizes = [xtr.shape[1], *hidden, int(ytr.max()) + 1]
        layers = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers.append(torch.nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers += [torch.nn.ReLU(), torch.nn.Dropout(dropout)]
        net = torch.nn.Sequential(*layers)
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=wd)
        times = []
        t_all = time.perf_counter()
        for epoch in range(epochs):
            net.train()
            t0 = time.perf_counter()
            order = torch.randperm(len(ytr))
            for start in range(0, len(ytr), batch):
                idx = order[start:start + batch]
                loss = torch.nn.functional.cross_entropy(net(xtr[idx]), ytr[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            times.append(time.perf_counter() - t0)
        total = time.perf_counter() - t_all
        net.eval()
        with torch.no_grad():
            acc = (net(xte).argmax(1) == yte).float().mean().item()
        med = statistics.median(times[1:])
        print(f"{name:14s} pytorch {torch.__version__}  epoch median {med * 1e3:.2f} ms  "
              f"{len(ytr) / med:,.0f} ex/s  loop {total:.2f} s  test accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
