"""Small path problems on one torch thread against the caller's thread count, same run.

Baseline ("all threads"): torch keeps the caller's thread count for every operation of the fit
(what the estimators did before; reproduced here by setting the small-work threshold
``kernelflow.utils._threads.SMALL_STEP`` to 0). Ours ("one thread when small"): the default,
torch held on one thread while the per-step work is below ``SMALL_STEP`` multiply-adds; the
compiled loops keep the caller's count. Both fit ``KernelSignGradientCV`` on the Allerbo robust
protocol (n = 80 training points, 30 bandwidths, 10 folds, step 0.01, squared validation
error, no intercept) with torch's default thread count, interleaved; both give the same
predictions (checked and printed).

Usage::

    python benchmarks/path_threads.py            # 10 rounds
    python benchmarks/path_threads.py --rounds 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from kernelflow.estimators.path_cv import KernelSignGradientCV
from kernelflow.utils import _threads


def _fit(X, y):
    est = KernelSignGradientCV(sigmas=np.geomspace(0.01, 1000, 30), cv=10, learning_rate=0.01,
                               validation_loss="squared", fit_intercept=False, random_state=0)
    t0 = time.perf_counter()
    est.fit(X, y)
    return time.perf_counter() - t0, est.predict(X)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    rng = np.random.default_rng(1)
    x = rng.uniform(-10, 10, 80)
    X, y = x[:, None], np.sin(np.pi * x / 2) + 0.1 * rng.standard_cauchy(80)
    small = _threads.SMALL_STEP
    print(f"torch threads: {torch.get_num_threads()}; seconds per fit, interleaved")
    print(f"{'round':>5} {'all threads':>12} {'one thread when small':>22} {'ratio':>7}")
    ratios, same = [], True
    _fit(X, y)  # warm-up (imports, thread pools)
    for r in range(args.rounds):
        _threads.SMALL_STEP = 0
        try:
            t_all, p_all = _fit(X, y)
        finally:
            _threads.SMALL_STEP = small
        t_one, p_one = _fit(X, y)
        same = same and np.array_equal(p_all, p_one)
        ratios.append(t_all / t_one)
        print(f"{r:>5} {t_all:>12.4f} {t_one:>22.4f} {ratios[-1]:>6.2f}x")
    print(f"median ratio {np.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x); "
          f"identical predictions: {same}")


if __name__ == "__main__":
    main()
