"""Kernel classifiers against scikit-learn's SVC on digits: test accuracy and fit time.

Same split (75/25, stratified, seed 0), inputs divided by 16, the same bandwidth for every
model (SVC's ``gamma="scale"``: 1 / (n_features * X_train.var())), SVC with its default C = 1.
Fit times are ratios to SVC's measured in the same run.

    python benchmarks/classifiers.py            # digits, seconds
    python benchmarks/classifiers.py --quick    # fewer centres
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from kernelflow.estimators import (  # noqa: E402
    KernelRidgeClassifier,
    NystromKernelLogisticRegression,
    NystromKernelRidgeClassifier,
)


def _time_fit(model, X, y):
    t0 = time.perf_counter()
    model.fit(X, y)
    return time.perf_counter() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 centres instead of 600")
    args = parser.parse_args(argv)
    M = 300 if args.quick else 600
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    gamma = 1.0 / (X.shape[1] * Xtr.var())
    models = [
        ("SVC (rbf, C=1, gamma=scale)", SVC(gamma="scale")),
        ("KernelRidgeClassifier alpha=1", KernelRidgeClassifier(alpha=1.0, gamma=gamma)),
        (f"NystromKernelRidgeClassifier M={M} alpha=1",
         NystromKernelRidgeClassifier(M, alpha=1.0, gamma=gamma, random_state=0)),
    ] + [
        (f"NystromKernelLogisticRegression M={M} alpha={a:g}",
         NystromKernelLogisticRegression(M, alpha=a, gamma=gamma, random_state=0))
        for a in (1.0, 0.1, 0.01)
    ]
    print(f"digits: {len(ytr)} train, {len(yte)} test, gamma = {gamma:.4f}")
    print(f"{'model':48s} {'accuracy':>8} {'fit (s)':>8} {'/ SVC':>7}")
    base = None
    for name, model in models:
        dt = _time_fit(model, Xtr, ytr)
        base = base or dt
        print(f"{name:48s} {model.score(Xte, yte):8.4f} {dt:8.3f} {dt / base:7.2f}")


if __name__ == "__main__":
    main()
