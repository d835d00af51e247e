"""Plots for kernel regression: regularisation paths, 1-D fits, online losses, Nyström error.

Every function returns a :class:`matplotlib.figure.Figure` built without ``pyplot``, so the
functions work headless (no display, no global backend switch) and inside notebooks alike;
write a figure with ``fig.savefig(path)`` or :func:`save_figure`. matplotlib is an optional
dependency and is imported only when a function is called.

Examples
--------
>>> import numpy as np
>>> from kernelflow.plotting import plot_regularization_path
>>> t = np.linspace(0.1, 10, 20)
>>> fig = plot_regularization_path(t, np.exp(-t)[:, None] * [1.0, -0.5], xlabel="t")
>>> len(fig.axes[0].lines)
2
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .utils._text import format_seconds

__all__ = [
    "plot_regularization_path",
    "plot_estimator_path",
    "criterion_label",
    "plot_fit_1d",
    "plot_predictions",
    "plot_online_losses",
    "nystrom_approximation_error",
    "nystrom_error_curve",
    "plot_nystrom_error",
    "plot_comparison",
    "method_color",
    "save_figure",
]

# One colour per method, the same in every panel and every figure. Names are matched by the
# first keyword they contain (case-insensitive); other names get the remaining colours in order
# of first use.
_KEYWORD_COLORS = (
    ("scikit-learn kernelridge", "#8c564b"),
    ("sklearn_kernel_ridge", "#8c564b"),
    ("huber", "#ff7f0e"),
    ("sign", "#2ca02c"),
    ("coordinate", "#9467bd"),
    ("exact", "#1f77b4"),
    ("kernel_ridge", "#1f77b4"),
    ("krr", "#1f77b4"),
    ("nystr", "#17becf"),
    ("gradient", "#bcbd22"),
    ("penalized", "#e377c2"),
    ("tukey", "#d62728"),
    ("quantile", "#7f7f7f"),
)
_SPARE_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d",
                 "#31a354", "#756bb1", "#636363")
_ASSIGNED: dict[str, str] = {}


def method_color(name: str) -> str:
    """The colour of a method in every kernelflow figure (a hex string).

    Examples
    --------
    >>> method_color("sign-gradient descent (kernelflow)") == method_color("sign_gradient")
    True
    >>> method_color("exact KRR") != method_color("sign_gradient")
    True
    """
    key = str(name).lower()
    for word, color in _KEYWORD_COLORS:
        if word in key:
            return color
    if key not in _ASSIGNED:
        _ASSIGNED[key] = _SPARE_COLORS[len(_ASSIGNED) % len(_SPARE_COLORS)]
    return _ASSIGNED[key]


def _distinct_colors(names) -> list[str]:
    """:func:`method_color` of each name; a repeated colour in one figure gets a spare one."""
    out: list[str] = []
    spare = iter(c for c in _SPARE_COLORS)
    for n in names:
        c = method_color(str(n))
        out.append(next(spare) if c in out else c)
    return out


def _spans_decades(v, decades: float = 2.0) -> bool:
    v = np.asarray(v, dtype=float)
    v = v[np.isfinite(v)]
    return v.size > 1 and bool(np.all(v > 0)) and v.max() / v.min() >= 10.0**decades


def _figure(ax=None, figsize=(6.4, 4.2)):
    if ax is not None:
        return ax.figure, ax
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "plotting needs matplotlib: pip install matplotlib (or pip install -e '.[plot]' from "
            "a kernelflow checkout)"
        ) from exc
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _np(a) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=float)


def save_figure(fig, path, *, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix, e.g. ``.png``, ``.pdf``, ``.svg``).

    Examples
    --------
    >>> import os, tempfile
    >>> fig = plot_online_losses({"a": [1.0, 0.5, 0.2]})
    >>> p = save_figure(fig, os.path.join(tempfile.mkdtemp(), "f.png"))
    >>> p.stat().st_size > 0
    True
    """
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def plot_regularization_path(
    path,
    values,
    *,
    labels: Sequence[str] | None = None,
    xlabel: str = "stopping time t",
    ylabel: str = "coefficient",
    log_x: bool | None = None,
    best: float | None = None,
    max_lines: int = 60,
    title: str | None = None,
    ax=None,
):
    """Plot coefficients or validation errors along a regularisation path.

    For early-stopped methods the path is the training time t = k * eta; for penalised
    methods it is the penalty lambda (t ~ 1/lambda, Allerbo Eq. 10-11).

    Parameters
    ----------
    path : array-like of shape (T,)
        Stopping times or penalties.
    values : array-like of shape (T,) or (T, k)
        One curve per column (dual coefficients, validation errors per fold, ...).
    labels : sequence of str, optional
        Legend labels, one per column (no legend when None).
    xlabel, ylabel : str
        Axis labels.
    log_x : bool, optional
        Logarithmic x-axis; default: when the path spans two decades or more.
    best : float, optional
        Mark the selected stopping time or penalty with a vertical line.
    max_lines : int, default=60
        Plot at most this many columns (evenly chosen) so large paths stay readable.
    title : str, optional
        Axes title.
    ax : matplotlib Axes, optional
        Draw into this axes instead of a new figure.

    Returns
    -------
    fig : matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> fig = plot_regularization_path([1e-3, 1e-2, 1e-1], [0.5, 0.3, 0.4], xlabel="lambda",
    ...                                ylabel="validation MSE", best=1e-2)
    >>> fig.axes[0].get_xscale()
    'log'
    """
    x = _np(path).ravel()
    Y = _np(values)
    Y = Y[:, None] if Y.ndim == 1 else Y
    if Y.shape[0] != x.shape[0]:
        raise ValueError(f"values has {Y.shape[0]} rows but path has {x.shape[0]} points.")
    cols = np.arange(Y.shape[1])
    if len(cols) > max_lines:
        cols = np.unique(np.linspace(0, Y.shape[1] - 1, max_lines).round().astype(int))
    fig, ax = _figure(ax)
    for j in cols:
        label = labels[int(j)] if labels is not None else None
        ax.plot(x, Y[:, j], lw=1.2 if len(cols) > 1 else 1.8, label=label)
    if best is not None:
        b = float(best)
        ax.axvline(b, color="k", ls="--", lw=1, label=f"selected: {b:.3g}")
        if len(cols) == 1:  # a flat curve hides the vertical line: mark the point itself
            k = int(np.argmin(np.abs(x - b)))
            ax.plot([x[k]], [Y[k, cols[0]]], "o", ms=7, mfc="none", mec="k", mew=1.5)
    positive = x[x > 0]
    if log_x is None:
        log_x = positive.size == x.size and positive.max() / positive.min() >= 100
    if log_x:
        ax.set_xscale("log")
    finite = Y[:, cols][np.isfinite(Y[:, cols])]
    if finite.size and _spans_decades(finite):
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if labels is not None or best is not None:
        ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return fig


#: names of the validation criteria (``validation_loss`` and ``loss`` parameters)
_CRITERIA = {"squared": "MSE", "squared_error": "MSE", "absolute": "mean absolute error",
             "huber": "Huber loss", "hinge": "hinge loss", "log": "log-loss",
             "epsilon_insensitive": "epsilon-insensitive loss", "quantile": "pinball loss",
             "tukey": "Tukey loss", "logistic": "log-loss"}


def criterion_label(estimator, *, cross_validated: bool = False,
                    unit: str | None = None) -> str:
    """The axis label of the criterion an estimator recorded along its path.

    Read from its ``validation_loss`` parameter (early-stopped paths, path CV), its ``loss``
    (robust Nyström) or its ``criterion`` (``KernelRidgeCV``: leave-one-out or GCV); squared
    and Huber losses carry the square of ``unit``, absolute and pinball losses ``unit``.

    Examples
    --------
    >>> class Huber:
    ...     validation_loss = "huber"
    >>> criterion_label(Huber())
    'validation Huber loss'
    >>> class Ridge:
    ...     criterion = "loo"
    ...     cv = None
    >>> criterion_label(Ridge(), unit="MPa")
    'leave-one-out MSE (MPa²)'
    """
    e = estimator
    name = getattr(e, "validation_loss", None)
    if not isinstance(name, str):
        name = getattr(e, "loss", None)
    power = 2  # the unit's power in the criterion: r^2 (squared, Huber, Tukey), |r|, or none
    if isinstance(name, str) and name in _CRITERIA:
        what = _CRITERIA[name]
        power = {"absolute": 1, "quantile": 1, "epsilon_insensitive": 1, "hinge": 0,
                 "log": 0, "logistic": 0}.get(name, 2)
    elif getattr(e, "criterion", None) in ("loo", "gcv") and getattr(e, "cv", None) is None:
        what = "leave-one-out MSE" if e.criterion == "loo" else "GCV score (MSE scale)"
        cross_validated = False
    else:  # every other recorded criterion is the mean squared error
        what = "MSE"
    if not what.startswith(("leave", "GCV")):
        what = ("cross-validated " if cross_validated else "validation ") + what
    if unit and power:
        what += f" ({unit}²)" if power == 2 else f" ({unit})"
    return what


def _grid_curves(x, E, sigmas, *, xlabel, best, ax, ylabel="cross-validated MSE"):
    E = _np(E).reshape(-1, len(_np(x)))
    labels = None
    if sigmas is not None and len(_np(sigmas)) == E.shape[0] and E.shape[0] > 1:
        labels = [f"sigma = {s:.3g}" for s in _np(sigmas)]
    what = ylabel.split(" (")[0]
    return plot_regularization_path(x, E.T, labels=labels, xlabel=xlabel, ylabel=ylabel,
                                    best=best, ax=ax, title=f"{what} against the penalty")


def plot_estimator_path(estimator, *, unit: str | None = None, ax=None):
    """Plot the validation or cross-validation curve a fitted estimator recorded.

    ``unit`` is the unit of the target (the squared errors are in its square). A single curve
    takes the estimator's colour (:func:`method_color`).

    Recognised fitted attributes, tried in order:

    * ``validation_losses_`` with ``learning_rate_`` (early-stopped paths): the validation
      criterion against the training time t = k eta, the chosen ``t_`` marked;
    * ``cv_results_`` with ``"alphas"``/``"mean_error"`` or ``cv_mse_`` with ``alphas_``
      (penalty grids): cross-validated error against the penalty, one line per bandwidth;
    * ``cv_mse_`` with ``sigmas_`` (path CV): cross-validated error against the bandwidth;
    * ``validation_scores_`` (iterative solvers): validation error per iteration;
    * ``loss_curve_``: training loss per epoch.

    The error axis names the criterion the estimator used (:func:`criterion_label`: MSE,
    Huber loss, mean absolute error, leave-one-out MSE, ...).

    Raises ``ValueError`` when the estimator recorded none of them.

    Examples
    --------
    >>> import numpy as np
    >>> class Fitted:
    ...     validation_losses_ = np.array([1.0, 0.5, 0.4, 0.45])
    ...     learning_rate_ = 0.1
    ...     t_ = 0.2
    >>> plot_estimator_path(Fitted()).axes[0].get_xlabel()
    'stopping time t'
    """
    e = estimator
    sigma = getattr(e, "sigma_", None)
    if sigma is None:
        sigma = getattr(getattr(e, "kernel_", None), "sigma", None)
    losses = getattr(e, "validation_losses_", None)
    if losses is not None and getattr(e, "learning_rate_", None) is not None:
        v = _np(losses)
        t = np.arange(v.shape[0]) * float(e.learning_rate_)
        keep = t > 0  # t = 0 (alpha = 0) cannot sit on the logarithmic axis
        what = f"{type(e).__name__}: validation error along the path"
        if sigma is not None and np.ndim(sigma) == 0:
            what += f", sigma = {float(sigma):.3g}"
        fig = plot_regularization_path(t[keep], v[keep], xlabel="stopping time t",
                                       ylabel=criterion_label(e, unit=unit),
                                       best=getattr(e, "t_", None),
                                       log_x=bool(keep.sum() > 1), title=what, ax=ax)
        if v.ndim == 1:
            fig.axes[-1].lines[0].set_color(method_color(type(e).__name__))
        return fig
    cv_label = criterion_label(e, cross_validated=True, unit=unit)
    res = getattr(e, "cv_results_", None)
    if isinstance(res, dict) and "alphas" in res and "mean_error" in res:
        return _grid_curves(res["alphas"], res["mean_error"], res.get("sigmas"),
                            xlabel="penalty lambda", best=getattr(e, "alpha_", None), ax=ax,
                            ylabel=cv_label)
    cv = getattr(e, "cv_mse_", None)
    if cv is not None and getattr(e, "alphas_", None) is not None:
        return _grid_curves(e.alphas_, cv, getattr(e, "sigmas_", None), xlabel="penalty lambda",
                            best=getattr(e, "alpha_", None), ax=ax, ylabel=cv_label)
    if cv is not None and getattr(e, "sigmas_", None) is not None:
        return plot_regularization_path(e.sigmas_, cv, xlabel="bandwidth sigma",
                                        ylabel=cv_label, best=getattr(e, "sigma_", None), ax=ax)
    scores = getattr(e, "validation_scores_", None)
    if scores is not None and len(scores):
        it = np.arange(1, len(scores) + 1)
        best = getattr(e, "best_iteration_", None)
        return plot_regularization_path(it, scores, xlabel="iteration",
                                        ylabel=criterion_label(e, unit=unit), best=best,
                                        log_x=False, ax=ax)
    curve = getattr(e, "loss_curve_", None)
    if curve is not None and len(curve):
        return plot_regularization_path(np.arange(1, len(curve) + 1), curve, xlabel="epoch",
                                        ylabel="training loss", log_x=False, ax=ax)
    raise ValueError(f"{type(e).__name__} has no recorded path to plot.")


def _predict(model, X):
    out = model(X) if callable(model) and not hasattr(model, "predict") else model.predict(X)
    return _np(out).reshape(len(X), -1)[:, 0]


def plot_fit_1d(
    X,
    y,
    models,
    *,
    outliers=None,
    X_test=None,
    y_test=None,
    n_grid: int = 400,
    xlabel: str = "x",
    ylabel: str = "y",
    title: str | None = None,
    ax=None,
):
    """Plot fitted functions of one-dimensional inputs against the data.

    Parameters
    ----------
    X : array-like of shape (n, 1)
        Training inputs (one feature).
    y : array-like of shape (n,)
        Training targets.
    models : estimator, callable or mapping of name -> estimator/callable
        Fitted models; each is evaluated on an even grid over the data range.
    outliers : array-like of bool of shape (n,), optional
        Training points to highlight as outliers.
    X_test, y_test : array-like, optional
        Held-out points, drawn as hollow circles.
    n_grid : int, default=400
        Number of grid points.
    xlabel, ylabel, title : str
        Labels.
    ax : matplotlib Axes, optional
        Draw into this axes.

    Returns
    -------
    fig : matplotlib.figure.Figure

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.kernel_ridge import KernelRidge
    >>> X = np.linspace(0, 1, 30)[:, None]
    >>> y = np.sin(6 * X[:, 0])
    >>> fig = plot_fit_1d(X, y, {"KRR": KernelRidge(alpha=0.1, kernel="rbf").fit(X, y)})
    >>> len(fig.axes[0].lines)
    1
    """
    Xn = _np(X)
    if Xn.ndim == 1:
        Xn = Xn[:, None]
    if Xn.ndim != 2 or Xn.shape[1] != 1:
        raise ValueError(f"plot_fit_1d needs one input feature, got X of shape {Xn.shape}.")
    yn = _np(y).ravel()
    if not isinstance(models, Mapping):
        models = {type(models).__name__: models}
    fig, ax = _figure(ax)
    mask = np.zeros(len(yn), bool) if outliers is None else np.asarray(outliers, bool)
    ax.scatter(Xn[~mask, 0], yn[~mask], s=10, c="0.45", alpha=0.7, label="training data")
    if mask.any():
        ax.scatter(Xn[mask, 0], yn[mask], s=22, c="tab:red", marker="x", label="outliers")
    if X_test is not None and y_test is not None:
        ax.scatter(_np(X_test).ravel(), _np(y_test).ravel(), s=14, facecolors="none",
                   edgecolors="tab:blue", alpha=0.6, label="test data")
    lo, hi = float(Xn.min()), float(Xn.max())
    grid = np.linspace(lo, hi, n_grid)[:, None]
    for name, model in models.items():
        ax.plot(grid[:, 0], _predict(model, grid), lw=2, label=str(name),
                color=method_color(str(name)))
    # outliers can be huge: keep the clean data in view
    clean = yn[~mask] if (~mask).any() else yn
    span = float(np.ptp(clean)) or 1.0
    ax.set_ylim(float(clean.min()) - 0.25 * span, float(clean.max()) + 0.25 * span)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return fig


def plot_predictions(y_true, predictions: Mapping, *, title: str | None = None,
                     unit: str | None = None, ax=None):
    """Scatter predicted against true values for several models (any input dimension).

    Each model keeps its colour (:func:`method_color`); the dashed line is y = x.

    Examples
    --------
    >>> fig = plot_predictions([0.0, 1.0, 2.0], {"m": [0.1, 0.9, 2.2]}, unit="MPa")
    >>> fig.axes[0].get_xlabel()
    'true value (MPa)'
    """
    yt = _np(y_true).ravel()
    fig, ax = _figure(ax, figsize=(5.2, 5.0))
    for (name, pred), color in zip(predictions.items(), _distinct_colors(predictions)):
        ax.scatter(yt, _np(pred).ravel(), s=9, alpha=0.6, label=str(name), color=color)
    lo, hi = float(yt.min()), float(yt.max())
    ax.plot([lo, hi], [lo, hi], color="k", lw=1, ls="--", label="prediction = true value")
    suffix = f" ({unit})" if unit else ""
    ax.set_xlabel("true value" + suffix)
    ax.set_ylabel("prediction" + suffix)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return fig


def plot_online_losses(
    losses: Mapping,
    *,
    cumulative: str | None = "average",
    x: str = "round",
    log_x: bool = False,
    ylabel: str | None = None,
    title: str | None = None,
    ax=None,
):
    """Plot per-round losses of online learners (one curve per learner).

    Parameters
    ----------
    losses : mapping of name -> array-like of shape (T,) or progressive-validation result
        Instantaneous losses l_t(f_t(x_t), y_t) in round order, or objects with a ``losses``
        attribute (and ``elapsed`` for ``x="time"``), such as the result of
        ``kernelflow.online.progressive_validation``.
    cumulative : {"average", "sum", None}, default="average"
        Plot the running average (1/t) sum_{s<=t} l_s, the cumulative sum (whose gap to a
        comparator is the regret), or the raw losses.
    x : {"round", "time"}, default="round"
        Horizontal axis: the round t, or the elapsed seconds (``elapsed`` attribute).
    log_x : bool, default=False
        Logarithmic horizontal axis.
    ylabel, title : str, optional
        Labels.
    ax : matplotlib Axes, optional
        Draw into this axes.

    Returns
    -------
    fig : matplotlib.figure.Figure

    Examples
    --------
    >>> fig = plot_online_losses({"fogd": [1.0, 0.5, 0.25], "kawv": [0.5, 0.2, 0.1]})
    >>> [line.get_label() for line in fig.axes[0].lines]
    ['fogd', 'kawv']
    """
    if cumulative not in ("average", "sum", None):
        raise ValueError(f"cumulative must be 'average', 'sum' or None, got {cumulative!r}.")
    if x not in ("round", "time"):
        raise ValueError(f"x must be 'round' or 'time', got {x!r}.")
    fig, ax = _figure(ax)
    for name, values in losses.items():
        v = _np(getattr(values, "losses", values)).ravel()
        t = np.arange(1, v.size + 1)
        if cumulative == "average":
            v = np.cumsum(v) / t
        elif cumulative == "sum":
            v = np.cumsum(v)
        if x == "time":
            if getattr(values, "elapsed", None) is None:
                raise ValueError(f"x='time' needs results with an 'elapsed' attribute ({name}).")
            t = _np(values.elapsed).ravel()
        ax.plot(t, v, lw=1.6, label=str(name), color=method_color(str(name)))
    if log_x:
        ax.set_xscale("log")
    default = {"average": "average loss", "sum": "cumulative loss", None: "loss"}[cumulative]
    ax.set_xlabel("round t" if x == "round" else "elapsed time (s)")
    ax.set_ylabel(ylabel or default)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return fig


def nystrom_approximation_error(X, kernel, centers, *, norm: str = "trace",
                                relative: bool = True) -> float:
    """Error of the Nyström approximation K ~ K_nm K_mm^+ K_mn.

    The residual E = K - K_nm K_mm^+ K_mn is positive semi-definite. ``norm="trace"`` returns
    tr(E) = sum_i k(x_i, x_i) - ||S^{-1/2} U^T K_mn||_F^2 (K_mm = U S U^T, tiny eigenvalues
    dropped), cost O(n m d + n m^2 + m^3) without forming an n x n matrix; ``"frobenius"``
    and ``"spectral"`` form E densely (O(n^2 m), small n only). With ``relative=True`` the
    error is divided by the same norm of K.

    Parameters
    ----------
    X : array-like or tensor of shape (n, d)
        Points on which the kernel matrix is approximated.
    kernel : str or kernelflow.kernels.Kernel
        Kernel (a name uses the median-heuristic bandwidth of ``X``).
    centers : array-like or tensor of shape (m, d)
        Nyström centres.
    norm : {"trace", "frobenius", "spectral"}, default="trace"
    relative : bool, default=True

    Returns
    -------
    error : float

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.kernels import Gaussian
    >>> X = np.random.RandomState(0).rand(50, 2)
    >>> e10 = nystrom_approximation_error(X, Gaussian(0.5), X[:10])
    >>> e30 = nystrom_approximation_error(X, Gaussian(0.5), X[:30])
    >>> bool(e30 < e10), round(nystrom_approximation_error(X, Gaussian(0.5), X), 6)
    (True, 0.0)
    """
    import torch

    from kernelflow.kernels import make_kernel

    Xt = torch.as_tensor(np.asarray(X) if not hasattr(X, "detach") else X, dtype=torch.float64)
    C = torch.as_tensor(np.asarray(centers) if not hasattr(centers, "detach") else centers,
                        dtype=torch.float64)
    k = make_kernel(kernel, X=Xt)
    K_mm = k(C, C)
    K_mn = k(C, Xt)
    s, U = torch.linalg.eigh(K_mm)
    keep = s > s.max() * 1e-12 * max(1, C.shape[0])
    B = (U[:, keep].T @ K_mn) / s[keep].sqrt()[:, None]  # rows span the approximation
    if norm == "trace":
        diag = k.diag(Xt)
        err = float((diag.sum() - (B * B).sum()).clamp(min=0.0))
        ref = float(diag.sum())
    elif norm in ("frobenius", "spectral"):
        K = k(Xt, Xt)
        E = K - B.T @ B
        if norm == "frobenius":
            err, ref = float(torch.linalg.norm(E)), float(torch.linalg.norm(K))
        else:
            err = float(torch.linalg.eigvalsh(E).abs().max())
            ref = float(torch.linalg.eigvalsh(K).max())
    else:
        raise ValueError(f"norm must be 'trace', 'frobenius' or 'spectral', got {norm!r}.")
    return err / ref if relative and ref > 0 else err


def nystrom_error_curve(X, kernel, n_centers: Sequence[int], *, selectors=("uniform",),
                        norm: str = "trace", random_state=0,
                        n_trials: int = 1) -> dict[str, np.ndarray]:
    """Nyström error against the number of centres for several centre selectors.

    Each selector is a name or object accepted by ``kernelflow.landmarks.resolve_centers``
    (or a callable ``f(X, m, random_state) -> centres``). With ``n_trials > 1`` every
    selection is repeated with seeds ``random_state, random_state + 1, ...`` so that
    :func:`plot_nystrom_error` can show the spread of randomised selectors.

    Returns
    -------
    errors : dict of name -> ndarray of shape (len(n_centers),), or of shape
        (n_trials, len(n_centers)) when ``n_trials > 1``

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.RandomState(0).rand(60, 2)
    >>> curve = nystrom_error_curve(X, "rbf", [5, 20],
    ...                             selectors={"first rows": lambda X, m, rs: X[:m]})
    >>> bool(curve["first rows"][1] < curve["first rows"][0])
    True
    >>> nystrom_error_curve(X, "rbf", [5, 20], n_trials=3)["uniform"].shape
    (3, 2)
    """
    import torch

    from kernelflow.kernels import make_kernel

    if int(n_trials) < 1:
        raise ValueError(f"n_trials must be at least 1, got {n_trials}.")
    Xt = torch.as_tensor(np.asarray(X) if not hasattr(X, "detach") else X, dtype=torch.float64)
    k = make_kernel(kernel, X=Xt)
    if not isinstance(selectors, Mapping):
        selectors = {getattr(s, "__name__", str(s)) if not isinstance(s, str) else s: s
                     for s in selectors}
    out = {}
    for name, sel in selectors.items():
        trials = []
        for trial in range(int(n_trials)):
            seed = random_state + trial if isinstance(random_state, (int, np.integer)) else \
                random_state
            errs = []
            for m in n_centers:
                if callable(sel) and not hasattr(sel, "select"):
                    C = sel(Xt, int(m), seed)
                else:
                    from kernelflow.landmarks import resolve_centers

                    C = resolve_centers(sel, Xt, k, int(m), seed)
                    C = getattr(C, "centers", C)
                errs.append(nystrom_approximation_error(Xt, k, C, norm=norm))
            trials.append(errs)
        out[str(name)] = np.asarray(trials[0] if n_trials == 1 else trials)
    return out


def _qualitative_colors(n: int) -> list:
    """``n`` distinct colours of matplotlib's qualitative ``tab10`` (``tab20`` beyond ten)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_nystrom_error(n_centers, errors: Mapping, *, ylabel: str = "relative trace error",
                       log_y: bool = True, title: str | None = None, ax=None):
    """Plot Nyström approximation error against the number of centres m.

    One colour per selector from a qualitative colour map (``tab10``) and one marker each.
    An entry of shape (n_trials, m) is drawn as its mean with a band of one standard deviation
    over the trials (the legend says so); an entry of shape (m,) as one line.

    Examples
    --------
    >>> fig = plot_nystrom_error([10, 20, 40], {"uniform": [0.3, 0.1, 0.02]})
    >>> fig.axes[0].get_yscale()
    'log'
    >>> fig = plot_nystrom_error([10, 20], {"uniform": [[0.3, 0.1], [0.4, 0.2]]})
    >>> len(fig.axes[0].collections)  # the band
    1
    """
    m = _np(n_centers).ravel()
    fig, ax = _figure(ax)
    colors = _qualitative_colors(len(errors))
    markers = "osD^v<>pXh*"
    tiny = np.finfo(float).tiny
    for i, (name, e) in enumerate(errors.items()):
        ev = _np(e)
        ev = ev[None, :] if ev.ndim == 1 else ev
        if ev.ndim != 2 or ev.shape[1] != m.size:
            raise ValueError(f"errors[{name!r}] has shape {np.shape(e)} for {m.size} centre "
                             "counts (expected (m,) or (n_trials, m)).")
        mean = ev.mean(axis=0)
        label = str(name)
        if ev.shape[0] > 1:
            sd = ev.std(axis=0, ddof=1)
            lo, hi = mean - sd, mean + sd
            ax.fill_between(m, np.maximum(lo, tiny) if log_y else lo, hi, color=colors[i],
                            alpha=0.2, lw=0)
            label += f" (mean ± sd, {ev.shape[0]} trials)"
        ax.plot(m, np.maximum(mean, tiny) if log_y else mean, marker=markers[i % len(markers)],
                lw=1.6, label=label, color=colors[i])
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("number of centres m")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return fig


def plot_comparison(names: Sequence[str], scores, times=None, *, errors=None,
                    score_label: str = "score", title: str | None = None, log: bool | None = None,
                    ax=None):
    """Horizontal bar chart of one score per model, with error bars and the values printed.

    Parameters
    ----------
    names : sequence of str
        Model names (one bar each, in this order from the top; colours from
        :func:`method_color`).
    scores : array-like of shape (k,)
        The score of each model (the printed value on each bar).
    times : array-like of shape (k,), optional
        Fit times in seconds, shown after the names.
    errors : array-like of shape (k,), optional
        Spread of each score (e.g. the standard deviation over folds), drawn as error bars.
    score_label : str
        Axis label, with the unit (e.g. ``"RMSE (MPa)"``).
    title : str, optional
        Axes title.
    log : bool, optional
        Logarithmic score axis; default: when the positive scores span two decades or more.
    ax : matplotlib Axes, optional
        Draw into this axes.

    Returns
    -------
    fig : matplotlib.figure.Figure

    Examples
    --------
    >>> fig = plot_comparison(["a", "b"], [0.8, 0.6], [0.01, 2.5], errors=[0.05, 0.1])
    >>> len(fig.axes[0].patches)
    2
    """
    s = _np(scores).ravel()
    if len(names) != s.size:
        raise ValueError(f"{len(names)} names for {s.size} scores.")
    err = None if errors is None else _np(errors).ravel()
    if err is not None and err.size != s.size:
        raise ValueError(f"{err.size} errors for {s.size} scores.")
    fig, ax = _figure(ax, figsize=(7.5, 0.55 * len(names) + 1.8))
    pos = np.arange(len(names))[::-1]
    colors = _distinct_colors(names)
    shown = np.where(np.isfinite(s), s, 0.0)
    ax.barh(pos, shown, xerr=err, color=colors, alpha=0.85, height=0.6,
            error_kw={"ecolor": "0.2", "capsize": 3, "lw": 1})
    labels = [str(n) for n in names]
    if times is not None:
        labels = [f"{lab}\n(fit {format_seconds(t)})" for lab, t in zip(labels, _np(times).ravel())]
    ax.set_yticks(pos, labels, fontsize="small")
    if log is None:
        log = _spans_decades(s)
    if log:
        ax.set_xscale("log")
    top = np.nanmax(np.abs(s + (err if err is not None else 0.0))) if np.isfinite(s).any() else 1
    finite = np.abs(s[np.isfinite(s)])
    if log or not finite.size or finite.max() == 0:
        fmt = "{:.3g}"
    else:  # one number of decimals for all bars: four significant digits on the largest
        digits = int(np.clip(3 - math.floor(math.log10(finite.max())), 0, 8))
        fmt = "{:.%sf}".replace("%s", str(digits))
    for p, v, e in zip(pos, s, err if err is not None else np.zeros_like(s)):
        text = "failed" if not math.isfinite(v) else (
            f"{fmt.format(v)} ± {e:.2g}" if e else fmt.format(v))
        x = v + e if math.isfinite(v) else 0.0
        if not log and math.isfinite(v) and v < 0:
            x = 0.0
        ax.annotate(text, (x, p), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize="small")
    if not log and np.isfinite(s).any():
        lo = min(0.0, float(np.nanmin(s)))
        ax.set_xlim(lo * 1.1, top * 1.3 if top > 0 else 1.0)
    ax.set_xlabel(score_label)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize="medium")
    return fig
