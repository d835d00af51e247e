"""Skipping sign descent against the step-by-step compiled loop, same run.

Baseline ("stepwise"): the compiled loop visiting every step (``_stepwise=True``). Ours: the
same loop skipping the runs of steps without a sign change, scoring only their validation rows
(coordinate descent is not skipped: its two columns time the same loop twice, a noise check).
Both give the same best steps, step counts and coefficients (checked here and printed).

Problems: the paper's robust synthetic protocol (n training points, x ~ U(-10, 10),
y = sin(pi x / 2) + 0.1 Cauchy, 10 folds, sigma = geomspace(0.01, 1000, 30), step 0.01,
patience 100, at most 10 000 steps), grouped by bandwidth: narrow (sigma < 0.1, most signs
flip every step), middle, wide (sigma > 10). One thread.

Usage::

    python benchmarks/paths_jump.py            # n = 80, 5 repeats
    python benchmarks/paths_jump.py --quick    # n = 40, 2 repeats
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from kernelflow.solvers import _native


def _problems(n, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-10, 10, n)
    y = np.sin(np.pi * x / 2) + 0.1 * rng.standard_cauchy(n)
    sig = np.geomspace(0.01, 1000, 30)
    K = np.exp(-(x[None, :, None] - x[None, None, :]) ** 2 / (2 * sig[:, None, None] ** 2))
    folds = np.arange(n) % 10
    train = torch.tensor(np.stack([folds != f for f in range(10)]) * 1.0)
    return torch.tensor(K), torch.tensor(y[None]), train, 1.0 - train, sig


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 40, 2 repeats")
    parser.add_argument("--n", type=int, default=80)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if not _native.available():
        print("compiled loops unavailable: nothing to compare")
        return
    n, repeat = (40, 2) if args.quick else (args.n, args.repeat)
    K, Y, train, wval, sig = _problems(n)
    kernel_of = np.repeat(np.arange(sig.size), 10)
    fold_of = np.tile(np.arange(10), sig.size)
    groups = {"narrow": sig[kernel_of] < 0.1,
              "middle": (sig[kernel_of] >= 0.1) & (sig[kernel_of] <= 10),
              "wide": sig[kernel_of] > 10, "all": np.ones(kernel_of.size, bool)}
    print(f"n = {n}, one thread, best of {repeat}")
    print(f"{'method':11s}{'group':8s}{'steps':>9s}{'stepwise ms':>13s}{'skipping ms':>13s}"
          f"{'ratio':>8s}  identical")
    for method in ("sign", "coordinate"):
        for name, sel in groups.items():
            times, outs = {}, {}
            for stepwise in (True, False):
                best = np.inf
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    out = _native.run_problems(
                        method, K, Y, train, wval, kernel_of[sel], np.zeros(sel.sum(), int),
                        fold_of[sel], eta=0.01, max_iter=10_000, patience=100,
                        return_alpha=True, n_threads=1, _stepwise=stepwise)
                    best = min(best, time.perf_counter() - t0)
                times[stepwise], outs[stepwise] = best, out
            same = all(np.array_equal(a, b) for a, b in zip(outs[True][:3], outs[False][:3]))
            same = same and torch.equal(outs[True][3], outs[False][3])
            print(f"{method:11s}{name:8s}{int(outs[True][2].sum()):9d}"
                  f"{times[True] * 1e3:13.2f}{times[False] * 1e3:13.2f}"
                  f"{times[True] / times[False]:7.2f}x  {same}")


if __name__ == "__main__":
    main()
