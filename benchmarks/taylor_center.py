"""Centred Taylor features for PKAWV: loss ratio to exact online KRR on the diamonds stream.

Diamonds (shuffled, inputs scaled to [-1, 1]^8), projected KRR (``awv=False``), lambda = 1.
For each sigma and degree, the cumulative square loss of PKAWV-Taylor without centring and with
``center="first_batch"`` (the mean of the first chunk of ``--first`` rounds), divided by the
loss of exact online KRR (same kernel, same rounds, one Cholesky) measured in the same run.

    python benchmarks/taylor_center.py --quick          # 2 000 rounds, seconds
    python benchmarks/taylor_center.py --n 20000        # the documented setting (minutes)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from kernelflow.datasets._online import load_online_stream  # noqa: E402
from kernelflow.kernels import Gaussian  # noqa: E402
from kernelflow.online import PKAWVTaylor, online_krr_predictions  # noqa: E402


def _progressive(learner, X, y, first):
    """Predictions round by round; the first ``first`` rounds form the first batch."""
    p1 = learner.progressive_predict(X[:first], y[:first])
    p2 = learner.progressive_predict(X[first:], y[first:])
    return np.concatenate([p1, p2])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 000 rounds")
    parser.add_argument("--n", type=int, default=20000, help="number of rounds")
    parser.add_argument("--first", type=int, default=500, help="rounds in the first batch")
    parser.add_argument("--sigmas", default="1,2")
    parser.add_argument("--degrees", default="2,3,4")
    args = parser.parse_args(argv)
    n = 2000 if args.quick else args.n
    X, y = load_online_stream("diamonds", n=n, shuffle=True)
    print(f"diamonds, shuffled, n = {n}, lambda = 1, projected KRR, first batch = {args.first}")
    print(f"{'sigma':>5} {'learner':34s} {'loss':>10} {'time (s)':>9} {'/ exact':>8}")
    import torch

    for sigma in [float(s) for s in args.sigmas.split(",")]:
        t0 = time.perf_counter()
        K = Gaussian(sigma)(torch.from_numpy(X)).numpy()
        exact = online_krr_predictions(K, y, 1.0, awv=False)
        t_exact = time.perf_counter() - t0
        del K
        base = float(((exact - y) ** 2).sum())
        print(f"{sigma:5g} {'exact online KRR':34s} {base:10.2f} {t_exact:9.2f} {1.0:8.3f}")
        for M in [int(m) for m in args.degrees.split(",")]:
            for center in (None, "first_batch"):
                learner = PKAWVTaylor(alpha=1.0, sigma=sigma, degree=M, awv=False, center=center)
                t0 = time.perf_counter()
                pred = _progressive(learner, X, y, args.first)
                dt = time.perf_counter() - t0
                loss = float(((pred - y) ** 2).sum())
                name = f"PKAWV-Taylor M={M}" + (", centred" if center else "")
                print(f"{sigma:5g} {name:34s} {loss:10.2f} {dt:9.2f} {loss / base:8.3f}")


if __name__ == "__main__":
    main()
