"""Calibration of the predictive uncertainty with learned hyperparameters, against scikit-learn.

On each split (inputs standardised on the training rows, targets as given):

* ``ours exact``: ``KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood")``;
* ``ours Nystrom``: ``NystromKernelRidge(n_components=M, sigma="ard", compute_variance=True,
  learn_hyperparameters="nystrom_marginal_likelihood")`` (DTC variance);
* ``sklearn GP`` (the baseline): ``GaussianProcessRegressor(ConstantKernel() * RBF(ones(d)) +
  WhiteKernel(), normalize_y=True)`` (ARD, signal and noise variance learned, no restarts).

Every model's ``predict(X, return_std=True)`` is used as the user gets it: the intervals are
mean +- 1.96 std. Reported per split: 95 % interval coverage of the test targets, negative log
predictive density per test point (NLPD, in the targets' units), test RMSE, the maximised log
evidence minus scikit-learn's (dLML, nats, in the targets' units; exact models only) and fit
time divided by scikit-learn's (fits interleaved in one process), then the medians over the
splits.

Run: ``python benchmarks/calibration.py`` (3 data sets x 5 splits, 400 training rows; a few
minutes on one core) or ``--quick`` (2 splits, 200 rows).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from sklearn.datasets import make_friedman1
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from kernelflow.datasets import load_concrete, load_diabetes
from kernelflow.estimators import KernelRidge, NystromKernelRidge

Z95 = 1.959963984540054


def datasets(seed: int) -> dict:
    """Name -> (X, y): two real sets shipped offline and Friedman 1 (5 of 10 inputs relevant)."""
    Xf, yf = make_friedman1(n_samples=1500, n_features=10, noise=1.0, random_state=seed)
    return {"diabetes": load_diabetes(return_X_y=True),
            "concrete": load_concrete(return_X_y=True),
            "friedman1": (Xf, yf)}


def split(X, y, n_train: int, seed: int, n_test: int = 1000):
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    idx = np.random.RandomState(seed).permutation(X.shape[0])
    n_train = min(n_train, int(0.7 * X.shape[0]))
    tr, te = idx[:n_train], idx[n_train:n_train + n_test]
    mu, sd = X[tr].mean(0), X[tr].std(0)
    sd[sd == 0] = 1.0
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


def scores(mean, std, y) -> dict:
    """Coverage of mean +- 1.96 std, NLPD per point and RMSE."""
    mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    var = np.maximum(std, 1e-300) ** 2
    return {"coverage": float(np.mean(np.abs(y - mean) <= Z95 * std)),
            "nlpd": float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var)),
            "rmse": float(np.sqrt(np.mean((y - mean) ** 2)))}


def fit_ours_exact(X, y, restarts=0, seed=0):
    return KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood",
                       n_restarts_optimizer=restarts, random_state=seed).fit(X, y)


def fit_ours_nystrom(X, y, n_components, seed=0):
    return NystromKernelRidge(n_components=n_components, sigma="ard", compute_variance=True,
                              learn_hyperparameters="nystrom_marginal_likelihood",
                              random_state=seed).fit(X, y)


def fit_sklearn(X, y, seed=0):
    kernel = ConstantKernel() * RBF(np.ones(X.shape[1])) + WhiteKernel()
    with warnings.catch_warnings():  # bound warnings of the optimiser are its own business
        warnings.simplefilter("ignore")
        return GaussianProcessRegressor(kernel, normalize_y=True, random_state=seed).fit(X, y)


def run_split(X, y, Xt, yt, args, seed) -> dict:
    methods = {"ours exact": lambda: fit_ours_exact(X, y, 0, seed),
               f"ours Nystrom M={args.nystrom}": lambda: fit_ours_nystrom(X, y, args.nystrom,
                                                                          seed),
               "sklearn GP": lambda: fit_sklearn(X, y, seed)}
    if args.restarts:
        methods[f"ours exact, {args.restarts} restarts"] = lambda: fit_ours_exact(
            X, y, args.restarts, seed)
    out = {}
    for name, fit in methods.items():
        t0 = time.perf_counter()
        model = fit()
        elapsed = time.perf_counter() - t0
        mean, std = model.predict(Xt, return_std=True)
        out[name] = {**scores(mean, std, yt), "time": elapsed, "lml": _evidence(model, y)}
    return out


def _evidence(model, y) -> float:
    """Log marginal likelihood of the training targets in their own units (NaN for the Nyström
    model, whose DTC evidence is that of another model)."""
    if isinstance(model, GaussianProcessRegressor):  # normalize_y: undo the scaling
        return float(model.log_marginal_likelihood_value_ - y.shape[0] * np.log(np.std(y)))
    if isinstance(model, KernelRidge):
        return float(model.log_marginal_likelihood())
    return float("nan")


def _warm_up():
    # the first torch.optim optimiser of a process imports torch's compiler stack (seconds)
    u = torch.zeros(1, requires_grad=True)
    torch.optim.LBFGS([u])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 splits, 200 training rows")
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--n-train", type=int, default=400)
    parser.add_argument("--nystrom", type=int, default=100, metavar="M")
    parser.add_argument("--restarts", type=int, default=0,
                        help="also ours exact with this many random restarts")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--datasets", default=None, help="comma-separated subset")
    args = parser.parse_args(argv)
    if args.quick:
        args.splits, args.n_train = 2, 200
    torch.set_num_threads(args.threads)
    _warm_up()
    print(f"# threads={args.threads} n_train<={args.n_train} splits={args.splits} "
          f"nystrom M={args.nystrom}; 95 % intervals mean +- 1.96 std from predict(return_std)")
    header = (f"{'data set':10s} {'split':>5s} {'method':26s} {'coverage':>8s} {'NLPD':>8s} "
              f"{'RMSE':>9s} {'dLML':>8s} {'t/t_sk':>7s}")
    print(header)
    print("-" * len(header))
    names = list(datasets(0))
    if args.datasets:
        names = [n for n in names if n in args.datasets.split(",")]
    summary = []
    for name in names:
        rows = []
        for seed in range(args.splits):
            X, y = datasets(seed)[name]
            Xtr, ytr, Xte, yte = split(X, y, args.n_train, seed)
            res = run_split(Xtr, ytr, Xte, yte, args, seed)
            t_sk = res["sklearn GP"]["time"]
            for method, r in res.items():
                gap = r["lml"] - res["sklearn GP"]["lml"]
                print(f"{name:10s} {seed:5d} {method:26s} {r['coverage']:8.3f} {r['nlpd']:8.3f} "
                      f"{r['rmse']:9.4f} {gap:8.2f} {r['time'] / t_sk:7.2f}")
            rows.append(res)
        for method in rows[0]:
            med = {k: float(np.median([r[method][k] for r in rows]))
                   for k in ("coverage", "nlpd", "rmse")}
            med["gap"] = float(np.median([r[method]["lml"] - r["sklearn GP"]["lml"]
                                          for r in rows]))
            lo = min(r[method]["coverage"] for r in rows)
            hi = max(r[method]["coverage"] for r in rows)
            ratio = float(np.median([r[method]["time"] / r["sklearn GP"]["time"] for r in rows]))
            summary.append((name, Xtr.shape[0], method, med, lo, hi, ratio))
        print()
    print("# medians over the splits (coverage: median [min, max])")
    print("| data set | n train | method | coverage | NLPD | RMSE | evidence - sklearn's | "
          "fit time / sklearn's |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n, method, med, lo, hi, ratio in summary:
        gap = "-" if np.isnan(med["gap"]) else f"{med['gap']:+.2f}"
        print(f"| {name} | {n} | {method} | {med['coverage']:.3f} [{lo:.3f}, {hi:.3f}] | "
              f"{med['nlpd']:.3f} | {med['rmse']:.4g} | {gap} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
