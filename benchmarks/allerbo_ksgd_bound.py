"""KSGD protocol: our time against the paper's and against a dense-product flop bound.

The journal version's KSGD protocol for one 100-row split:

* 10 folds x 30 bandwidths of kernel sign-gradient descent from alpha = 0;
* eta = 0.01, patience 100, at most 10 000 steps, then the refit.

A straightforward implementation (the published code among them) multiplies by K at every step
of every (bandwidth, fold) problem: K alpha on all n = 80 training rows, 2 n^2 flops, and the
steps are sequential. The paper fixes the step size, so the number of steps is part of the
protocol. We count the steps each problem takes before it stops (from
``early_stopping_path_cv``), plus the refit's, and divide these dense flops by this machine's
single-core GEMM rate on large matrices, measured in the same run. That is a lower bound on the
time of any implementation that forms the product densely every step, even at full GEMM speed
on one core (80 x 80 products run well below it).

kernelflow does not form it: its compiled loop (``kernelflow.solvers._native``) updates
K sign(r) with the rows of K whose sign flipped, which on the wide bandwidths, where most steps
are spent, is a few rows or none per step. So its time can fall below the dense bound; the
column ``ours / dense bound`` says by how much.

Beside the bound the script prints our measured CPU time: ``KernelSignGradientCV`` fit +
predict, one thread, float64 and float32.

    python benchmarks/allerbo_ksgd_bound.py                 # 3 splits per data set
    python benchmarks/allerbo_ksgd_bound.py --splits 1 --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402
from allerbo_real import PAPER, STANDIN, load  # noqa: E402

from kernelflow.datasets._allerbo import kfold_indices, subsample_protocol  # noqa: E402
from kernelflow.estimators.path_cv import KernelSignGradientCV  # noqa: E402
from kernelflow.kernels import Gaussian  # noqa: E402
from kernelflow.solvers.path_cv import early_stopping_path_cv  # noqa: E402


def gemm_rate(dtype, size=2048):
    A = torch.randn(size, size, dtype=dtype)
    B = torch.randn(size, size, dtype=dtype)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(A, B)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


def protocol_cpu(X, y, Xte, folds, sig, dtype):
    est = KernelSignGradientCV(sigmas=sig, kernel=Gaussian(), cv=folds, learning_rate=0.01,
                               max_iter=10_000, n_iter_no_change=100, fit_intercept=False,
                               validation_loss="squared")  # the paper's protocol
    c0 = time.process_time()
    est.fit(X.to(dtype), y.to(dtype))
    est.predict(Xte.to(dtype))
    return time.process_time() - c0, est


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=3)
    parser.add_argument("--datasets", default=",".join(STANDIN))
    parser.add_argument("--quick", action="store_true", help="concrete only, no outliers")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the paper's timings: one core per experiment
    rate64, rate32 = gemm_rate(torch.float64), gemm_rate(torch.float32)
    print(f"single-core GEMM rate (2048^2): float64 {rate64 / 1e9:.1f} GFlop/s, "
          f"float32 {rate32 / 1e9:.1f} GFlop/s")
    datasets = ["concrete"] if args.quick else args.datasets.split(",")
    rows = []
    sig = np.geomspace(0.01, 1000, 30)
    for name in datasets:
        X_all, y_all = load(name)
        for outliers in ([False] if args.quick else [False, True]):
            per = []
            for seed in range(args.splits):
                X_tr, X_te, y_tr, _ = subsample_protocol(X_all, y_all, outliers=outliers,
                                                         random_state=seed)
                X, Xte, y = torch.tensor(X_tr), torch.tensor(X_te), torch.tensor(y_tr)
                folds = kfold_indices(len(y), 10, random_state=seed)
                cpu64, est = protocol_cpu(X, y, Xte, folds, sig, torch.float64)
                cpu32, _ = protocol_cpu(X, y, Xte, folds, sig, torch.float32)
                res = early_stopping_path_cv(X, y, [Gaussian(s) for s in sig], folds,
                                             method="sign", step_size=0.01)
                n = len(y)
                steps = int(res.n_iter.sum()) + int(est.n_iter_)
                flops = 2.0 * n * n * steps
                per.append((cpu64, cpu32, steps, flops))
            paper = PAPER[STANDIN[name]]["KSGD"][int(outliers)][0]
            cpu64 = statistics.median(p[0] for p in per)
            cpu32 = statistics.median(p[1] for p in per)
            flops = statistics.median(p[3] for p in per)
            steps = statistics.median(p[2] for p in per)
            rows.append({
                "data": name, "outliers": "yes" if outliers else "no",
                "problem_steps": int(steps), "dense_GFlop": flops / 1e9,
                "dense_bound_f64_s": flops / rate64, "dense_bound_f32_s": flops / rate32,
                "paper_s": paper,
                "paper/dense_bound_f64": paper / (flops / rate64),
                "ours_f64_cpu_s": cpu64, "ours_f32_cpu_s": cpu32,
                "ours/dense_bound_f64": cpu64 / (flops / rate64),
                "paper/ours_f64": paper / cpu64, "paper/ours_f32": paper / cpu32,
            })
    print(f"\nKSGD protocol per split (median over {args.splits} splits), one thread; "
          "dense bound = dense flops / single-core GEMM rate; ratios = paper / time")
    print_table(rows)


if __name__ == "__main__":
    main()
