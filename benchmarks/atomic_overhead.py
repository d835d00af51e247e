"""Cost of all-or-nothing updates: the online learners' ``learn_one`` and ``partial_fit`` with the
state snapshot (the shipped methods) against the same methods unwrapped (no snapshot, the
baseline), on the same rows in the same run. Both sides give identical predictions (checked).

    python benchmarks/atomic_overhead.py --quick        # 300 rounds
    python benchmarks/atomic_overhead.py --rounds 2000
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from kernelflow import online as O

LEARNERS = ("KernelAWV", "PKAWVTaylor", "PKAWVNystrom", "FOGD", "ProsNKONS")


def run(name, rows, y, X, method, wrapped, chunk):
    cls = getattr(O, name)
    fn = getattr(cls, method)
    fn = fn if wrapped else fn.__wrapped__
    est = cls(random_state=0) if "random_state" in cls().get_params() else cls()
    t = time.perf_counter()
    if method == "learn_one":
        for r, v in zip(rows, y):
            fn(est, r, float(v))
    else:
        for i in range(0, len(y), chunk):
            fn(est, X[i:i + chunk], y[i:i + chunk])
    return time.perf_counter() - t, est.predict(X[:50])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="300 rounds")
    ap.add_argument("--chunk", type=int, default=10, help="rows per partial_fit call")
    args = ap.parse_args()
    warnings.simplefilter("ignore", UserWarning)  # dict rows name the features
    n = 300 if args.quick else args.rounds
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    rows = [{"a": a, "b": b, "c": c} for a, b, c in X]
    print(f"{n} rounds; ratio = time with snapshot / time without (baseline)")
    print(f"{'learner':14s} {'method':12s} {'atomic s':>9s} {'plain s':>9s} {'ratio':>6s} "
          f"{'same pred':>9s}")
    for name in LEARNERS:
        for method in ("learn_one", "partial_fit"):
            ta, pa = run(name, rows, y, X, method, True, args.chunk)
            tp, pp = run(name, rows, y, X, method, False, args.chunk)
            print(f"{name:14s} {method:12s} {ta:9.3f} {tp:9.3f} {ta / tp:6.2f} "
                  f"{str(bool(np.array_equal(pa, pp))):>9s}")


if __name__ == "__main__":
    main()
