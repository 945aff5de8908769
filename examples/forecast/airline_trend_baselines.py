"""Two fixed-trend extrapolations of AirPassengers on the anchor's split, for context beside
docs/RESULTS.md's table (numpy only; not Trident models):

- log-linear trend + month dummies, least squares on the training part;
- seasonal naive on the log + the training part's mean yearly log growth (a drift).

Each is fitted on 1949-1954 and scored on 1955-1957 (the validation protocol the shipped
example's settings were chosen by), and fitted on 1949-1957 and scored on 1958-1960 (the
test), 36 months from one origin.

    scripts/fetch-data.sh series && python3 examples/forecast/airline_trend_baselines.py
"""

import csv

import numpy as np

y = np.array([float(r["Passengers"]) for r in csv.DictReader(open("data/series/airline.csv"))])


def log_linear(end, h=36):
    t = np.arange(end + h)
    x = np.column_stack([np.ones(end + h), t] + [(t % 12 == m).astype(float) for m in range(1, 12)])
    beta = np.linalg.lstsq(x[:end], np.log(y[:end]), rcond=None)[0]
    return np.exp(x[end:] @ beta)


def seasonal_naive_drift(end, h=36):
    ly = np.log(y[:end])
    growth = (ly[-12:] - ly[:12]).mean() / ((end - 12) / 12)
    return np.array([np.exp(ly[end - 12 + i % 12] + growth * (i // 12 + 1)) for i in range(h)])


for name, f in (("log-linear trend + month dummies", log_linear), ("seasonal naive + log drift", seasonal_naive_drift)):
    val = np.abs(f(72) - y[72:108]).mean()
    test = np.abs(f(108) - y[108:144]).mean()
    print(f"{name:34s} MAE 1955-1957 {val:6.2f}   1958-1960 {test:6.2f}")
