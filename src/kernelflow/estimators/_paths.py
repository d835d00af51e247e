"""Base classes of the early-stopped path estimators and of their path-CV variants.

A path estimator names its update rule (:mod:`kernelflow.solvers.paths.rules`) and its
defaults; fitting (validation split by :mod:`kernelflow.utils.holdout`, early stopping, refit),
prediction and the fitted attributes are shared. The CV variants choose the bandwidth and the
stopping time by batched path cross-validation
(:func:`kernelflow.solvers.path_cv.early_stopping_path_cv`) and refit the same rule.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions

from ..distributed.auto import DISTRIBUTED_CONSTRAINT
from ..distributed.cv import cv_solver
from ..kernels import Kernel, make_kernel, median_heuristic
from ..operators import KernelOperator
from ..solvers.early_stopping import fit_path
from ..solvers.losses import RESIDUAL_LOSSES
from ..solvers.path_cv import early_stopping_path_cv
from ..solvers.paths.driver import run_path
from ..solvers.paths.rules import PathRule, SignRule
from ..typing import ArrayLike, Output
from ..utils._finite import DivergenceError
from ..utils._threads import threads_for
from ..utils._validation import check_X_y
from ..utils.checkpoint import CHECKPOINT_CONSTRAINTS, arrays_fingerprint, fit_checkpoint
from ..utils.folds import kfold_indices
from ._base import (
    PRECOMPUTED,
    PRECOMPUTED_KERNEL_CONSTRAINTS,
    KernelEstimatorMixin,
    check_precomputed,
)

__all__ = ["PATH_CONSTRAINTS", "CV_CONSTRAINTS", "PathRegressor", "PathCVRegressor",
           "GramRows", "bandwidth_grid", "grid_kernels", "cv_folds"]

#: Validation losses every path estimator accepts.
VALIDATION_LOSSES = set(RESIDUAL_LOSSES)

#: Constraints shared by the path estimators.
PATH_CONSTRAINTS = {
    "learning_rate": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
    "max_iter": [Interval(Integral, 0, None, closed="left")],
    "tol": [Interval(Real, 0, None, closed="left")],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "validation_loss": [StrOptions(VALIDATION_LOSSES)],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    **CHECKPOINT_CONSTRAINTS,
}

#: Constraints shared by the path-CV estimators.
CV_CONSTRAINTS = {
    "sigmas": [Interval(Integral, 1, None, closed="left"), "array-like", None],
    "cv": [Interval(Integral, 2, None, closed="left"), "array-like"],
    "learning_rate": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "validation_loss": [StrOptions(VALIDATION_LOSSES)],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "distributed": DISTRIBUTED_CONSTRAINT,
}


class GramRows(Kernel):
    """A precomputed training kernel matrix seen as a kernel on row numbers: k(i, j) = K[i, j].

    ``kernel="precomputed"`` runs the path solvers unchanged on the user's matrix: they take
    a kernel and inputs, and here the inputs are the column of row numbers
    (:meth:`rows`), so every block, diagonal and tile they ask for is a slice of ``gram``.
    Cost: a gather per block, no kernel evaluation.

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    >>> k = GramRows(K)
    >>> bool(torch.equal(k(k.rows()), K)), k.diag(k.rows()).tolist()
    (True, [2.0, 3.0])
    """

    def __init__(self, gram: torch.Tensor) -> None:
        self.gram = gram

    def rows(self) -> torch.Tensor:  # shape: (n, 1), exact in float64 and float32 below 2^24
        n = self.gram.shape[0]
        return torch.arange(n, dtype=self.gram.dtype, device=self.gram.device).reshape(n, 1)

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        return self.gram[P1[:, 0].long()][:, P2[:, 0].long()]

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        return self.gram.diagonal()[X[:, 0].long()]

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)


def _drop_zero_weights(X, y, sw):
    """Remove rows of zero weight (they must act as absent rows); check the weights.

    Returns ``(X, y, sw, kept)`` with ``kept`` the int64 positions of the remaining rows
    (None when all are kept).
    """
    if sw is None:
        return X, y, None, None
    if bool((sw < 0).any()):
        raise ValueError("sample_weight must be non-negative.")
    keep = sw > 0
    if not bool(keep.any()):
        raise ValueError("sample_weight must have at least one positive entry.")
    if bool(keep.all()):
        return X, y, sw, None
    kept = np.flatnonzero(keep.cpu().numpy()).astype(np.int64)
    return X[keep], y[keep], sw[keep], kept


def fit_path_estimator(est, X, y, sample_weight=None):
    """Shared fit of the path estimators: validate, centre, run :func:`fit_path`, store.

    Rows of zero weight are removed before anything else (so ``X_fit_`` holds the rows with a
    positive weight); the remaining weights scale each row's update (see :func:`~kernelflow.
    solvers.paths.driver.run_path`), the intercept is the weighted location
    (``est._center_targets``), and the validation split and the monitored loss are weighted.
    ``validation_indices_`` are positions in the rows passed to ``fit``.
    """
    X, y, sw, _ = check_X_y(est, X, y, sample_weight=sample_weight)
    gram = None
    if est._precomputed():
        check_precomputed(est, X, fit=True)
        gram = X
    X, y, sw, kept = _drop_zero_weights(X, y, sw)
    if gram is not None and kept is not None:  # the kept rows' block: rows and columns
        X = X[:, torch.from_numpy(kept).to(X.device)]
    n = X.shape[0]
    with threads_for(n * n * (1 if y.ndim == 1 else y.shape[1])):  # one step: a product with K
        _fit_path_estimator(est, X, y, sw, kept)
    if gram is not None:  # predict takes kernels against every training row
        est.X_fit_ = gram
        if kept is not None:
            full = torch.zeros((gram.shape[0], *est.dual_coef_.shape[1:]),
                               dtype=est.dual_coef_.dtype, device=est.dual_coef_.device)
            full[torch.from_numpy(kept).to(full.device)] = est.dual_coef_
            est.dual_coef_ = full
    return est


def check_bandwidth_on_data(est, kernel, X: torch.Tensor, max_rows: int = 256, *,
                            name: str | None = None, value: Any = None,
                            allow_identity: bool = False) -> None:
    """Refuse a bandwidth at which the kernel matrix of X is degenerate or cannot be computed.

    As the bandwidth of a stationary kernel shrinks (``gamma`` grows), ``K`` tends to the
    identity: every ``k(x_i, x_j)`` of distinct rows underflows to 0, the path fits the training
    targets row by row and predicts the intercept everywhere else, so early stopping and
    validation have nothing to choose. Further still, ``|x|²/σ²`` dwarfs the squared distances
    and the kernel's own diagonal is lost to rounding (NaN, 0 or inf), which made the
    eigensolver of the step-size rule fail. Both are refused here, before any solve, with a
    ``ValueError`` that names the parameter and the median-heuristic value for X. Checked on
    at most ``max_rows`` evenly spaced rows: O(max_rows² d). ``name``/``value`` name the
    parameter in the message (default: the estimator's ``gamma``, ``kernel`` or ``sigma``).
    ``allow_identity`` accepts the identity (a candidate of a cross-validated grid: it loses
    there, and the automatic grid's smallest bandwidths give it on high-dimensional data).
    """
    if not getattr(kernel, "is_stationary", False) or X.shape[0] < 2:
        return
    n = X.shape[0]
    idx = torch.unique(torch.linspace(0, n - 1, min(n, max_rows), dtype=torch.float64).round()
                       .to(torch.long))
    Xs = torch.unique(X[idx.to(X.device)].to(torch.float64), dim=0)
    if Xs.shape[0] < 2:
        return
    with torch.no_grad():
        K = kernel(Xs)
        diag = kernel.diag(Xs)
    finite = bool(torch.isfinite(K).all())
    if finite:
        lost = float((K.diagonal() - diag).abs().max()) > 1e-3 * max(float(diag.abs().max()), 1.0)
        off = K - torch.diag(K.diagonal())
        identity = not allow_identity and float(off.abs().max()) == 0.0
    if finite and not lost and not identity:
        return
    if name is not None:
        pass
    elif getattr(est, "gamma", None) is not None:
        name, value = "gamma", est.gamma
    elif isinstance(getattr(est, "kernel", None), Kernel):
        name, value = "kernel", est.kernel
    else:
        name, value = "sigma", getattr(est, "sigma", None)
    med = median_heuristic(Xs)
    hint = {"gamma": f"gamma near {0.5 / med**2:.3g}", "sigma": f"sigma near {med:.3g}",
            "sigmas": f"sigmas around {med:.3g}"}.get(name, f"a kernel bandwidth near {med:.3g}")
    if not finite or lost:
        why = ("the kernel cannot be evaluated on X in float64 (k(x, x) comes out as NaN, 0 or "
               "inf instead of its value: the bandwidth is far below the scale of X)")
    else:
        why = ("k(x_i, x_j) underflows to 0 for every pair of distinct rows, so the kernel "
               "matrix is the identity and the model would predict the intercept everywhere "
               "off the training rows")
    raise ValueError(f"{name}={value!r} is out of range for X: {why}. Use {hint} (the median "
                     "heuristic for X) or rescale X.")


def _fit_path_estimator(est, X, y, sw, kept):
    est.kernel_ = est._build_kernel(X)
    if isinstance(est.kernel_, str):  # "precomputed": X is the kernel matrix of the training rows
        # the validation split goes by the content of K's rows (equal inputs, equal rows)
        kernel, inputs, split = GramRows(X), GramRows(X).rows(), X
    else:
        check_bandwidth_on_data(est, est.kernel_, X)
        kernel, inputs, split = est.kernel_, X, None
    yc, est.intercept_ = est._center_targets(y, sw)
    # written only by a matrix-free fit (K beyond the memory budget), see fit_path
    ckpt = fit_checkpoint(est, "path", arrays_fingerprint(X, y, sw))
    fit = fit_path(
        est._rule(yc), kernel, inputs, yc, learning_rate=est.learning_rate,
        max_iter=est.max_iter, early_stopping=est.early_stopping,
        validation_fraction=est.validation_fraction, n_iter_no_change=est.n_iter_no_change,
        tol=est.tol, random_state=est.random_state, options=est._options(),
        verbose=est.verbose, sample_weight=sw, validation_loss=est.validation_loss,
        holdout_rows=split, checkpoint=ckpt, **est._path_kwargs(),
    )
    if ckpt is not None and (ckpt.resumed or ckpt.n_saved):  # a fit that used it
        ckpt.finish()
    est.X_fit_ = X
    est.dual_coef_ = fit.alpha
    est.n_iter_ = int(fit.n_iter)
    est.learning_rate_ = float(fit.learning_rate)
    est.t_ = est.n_iter_ * est.learning_rate_
    es = fit.early_stopping
    est.validation_losses_ = None if es is None else es.validation_losses.numpy()
    val = fit.validation_indices
    est.validation_indices_ = (None if val is None else
                               (val if kept is None else kept[val]).astype(np.int64))


class PathRegressor(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Base of the early-stopped path regressors (not an estimator on its own).

    A subclass sets ``_rule_class`` (a :class:`~kernelflow.solvers.paths.rules.PathRule`
    built without arguments) or overrides :meth:`_rule` (a rule with options, e.g. momentum),
    stores its parameters in ``__init__`` (sklearn reads the signature), and may extend
    :meth:`_path_kwargs` (backend options of the rule's path) and :meth:`_after_fit`.
    """

    _parameter_constraints: dict = {**PATH_CONSTRAINTS, **PRECOMPUTED_KERNEL_CONSTRAINTS}
    _rule_class: type[PathRule] | None = None
    _accepts_precomputed = True

    def __init__(self, learning_rate="auto", *, max_iter=1000, tol=0.0, early_stopping=True,
                 validation_fraction=0.1, n_iter_no_change=100, validation_loss="squared",
                 random_state=None, kernel="rbf", sigma=None, gamma=None, degree=3, coef0=1.0,
                 fit_intercept=True, options=None, verbose=0, checkpoint=None,
                 checkpoint_interval=60.0):
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.validation_loss = validation_loss
        self.random_state = random_state
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.options = options
        self.verbose = verbose
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval

    def _rule(self, y: torch.Tensor) -> PathRule:
        """The update rule, given the centred training targets."""
        if self._rule_class is None:
            raise NotImplementedError(f"{type(self).__name__} names no path rule.")
        return self._rule_class()

    def _path_kwargs(self) -> dict:
        return {}

    def _after_fit(self) -> None:
        """Hook for rule-specific fitted attributes."""

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None):
        """Fit the model: choose the number of steps on held-out rows, refit on all rows.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights w; row i's update is scaled by w_i (an integer weight equals
            repeating the row; rows of weight 0 are dropped). The validation split and loss
            are weighted too.

        Returns
        -------
        self : object
        """
        fit_path_estimator(self, X, y, sample_weight)
        self._after_fit()
        return self

    def predict(self, X: ArrayLike) -> Output:
        """Predict f(x) = k(x, X_fit) dual_coef + intercept.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        """
        return self._kernel_predict(X)


def bandwidth_grid(sigmas, X: torch.Tensor) -> np.ndarray:
    """The bandwidth grid: explicit values, ``n`` log-spaced values median * [1e-2, 1e2], or
    for None the grid of :class:`~kernelflow.estimators.KernelRidgeCV`, median * 10^[-1, 1] in
    9 log-spaced values."""
    if sigmas is None or isinstance(sigmas, (int, np.integer)):
        med = float(median_heuristic(X))
        med = med if med > 0 else 1.0
        if sigmas is None:
            return med * np.logspace(-1, 1, 9)
        return med * np.geomspace(1e-2, 1e2, int(sigmas))
    if np.ndim(sigmas) > 1:
        raise ValueError(
            "sigmas is a grid of scalar bandwidths; per-feature (ARD) bandwidths are not "
            "searched by grid: learn them with kernelflow.hyperparameters.learn_hyperparameters."
        )
    grid = np.asarray(sigmas, dtype=float).reshape(-1)
    if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise ValueError(f"sigmas must be positive finite bandwidths, got {sigmas!r}.")
    return grid


def grid_kernels(kernel, grid) -> list[Kernel]:
    """One kernel per bandwidth; ``kernel`` is a name or a Kernel with a ``sigma`` parameter."""
    if isinstance(kernel, Kernel):
        if "sigma" not in kernel.get_params():
            raise ValueError(f"kernel {kernel!r} has no bandwidth to cross-validate.")
        return [type(kernel)(**{**kernel.get_params(), "sigma": float(s)}) for s in grid]
    kernels = [make_kernel(kernel, sigma=float(s)) for s in grid]
    if "sigma" not in kernels[0].get_params():
        raise ValueError(f"kernel {kernel!r} has no bandwidth to cross-validate.")
    return kernels


def cv_folds(cv, n: int, random_state):
    """Validation index arrays: ``cv`` folds of a seeded permutation, or the given folds."""
    if isinstance(cv, (int, np.integer)):
        if cv > n:
            raise ValueError(f"cv={cv} folds need at least {cv} samples, got n_samples={n}.")
        seed = random_state if not isinstance(random_state, np.random.RandomState) else None
        return kfold_indices(n, int(cv), random_state=seed if seed is not None else random_state)
    folds = [np.asarray(f, dtype=int).reshape(-1) for f in cv]
    if len(folds) < 2:
        raise ValueError("cv must give at least 2 folds.")
    return folds


class PathCVRegressor(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Base of the path-CV regressors: bandwidth and stopping time by batched path CV, refit.

    A subclass sets ``_rule_class`` or overrides :meth:`_rule`, and may override
    :meth:`_location` (the intercept) and :meth:`_after_refit`.
    """

    _multi_output = False
    _rule_class: type[PathRule] = SignRule
    _parameter_constraints: dict = {**CV_CONSTRAINTS, **PRECOMPUTED_KERNEL_CONSTRAINTS}
    _accepts_precomputed = True

    def __init__(self, sigmas=30, *, kernel="rbf", cv=10, learning_rate="auto", max_iter=10000,
                 n_iter_no_change=100, validation_loss="squared", fit_intercept=True,
                 random_state=None, options=None, verbose=0, distributed="auto"):
        self.sigmas = sigmas
        self.kernel = kernel
        self.cv = cv
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.n_iter_no_change = n_iter_no_change
        self.validation_loss = validation_loss
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.options = options
        self.verbose = verbose
        self.distributed = distributed

    def _rule(self, y: torch.Tensor) -> PathRule:
        return self._rule_class()

    def _location(self, y):
        return y.mean()

    def _after_refit(self, path) -> None:
        """Hook for rule-specific fitted attributes."""

    def _refit_rule(self, rule: PathRule) -> PathRule:
        """The rule of the refit (its step is passed explicitly); the CV rule by default."""
        return rule

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y):
        """Cross-validate bandwidth and stopping time, then refit on all of X.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,)

        Returns
        -------
        self : object
        """
        X, y, _, _ = check_X_y(self, X, y, multi_output=False)
        if self._precomputed():  # one kernel: only the stopping time is cross-validated
            check_precomputed(self, X, fit=True)
            gram = GramRows(X)
            grid, kernels, inputs = None, [gram], gram.rows()
        else:
            grid = bandwidth_grid(self.sigmas, X)
            kernels, inputs = grid_kernels(self.kernel, grid), X
            for s, k in zip(grid, kernels):
                check_bandwidth_on_data(self, k, X, name="sigmas", value=float(s),
                                        allow_identity=True)
        folds = cv_folds(self.cv, X.shape[0], self.random_state)
        n = X.shape[0]
        # one step of the batched path: a product with every bandwidth's kernel for every fold
        with threads_for(len(kernels) * len(folds) * n * n):
            self._fit_cv(inputs, y, grid, folds, kernels)
        if grid is None:
            self.kernel_, self.X_fit_ = PRECOMPUTED, X
        return self

    def _fit_cv(self, X, y, grid, folds, kernels) -> None:
        self.intercept_ = (self._location(y) if self.fit_intercept
                           else torch.zeros((), dtype=y.dtype, device=y.device))
        yc = y - self.intercept_
        rule = self._rule(yc)
        step = self.learning_rate if self.learning_rate == "auto" else float(self.learning_rate)
        # in a process group: bandwidths spread over the processes (same data on all)
        path_cv, folds = cv_solver(self, early_stopping_path_cv, X, y, folds)
        res = path_cv(
            X, yc, kernels, folds, method=rule, step_size=step,
            max_iter=int(self.max_iter), n_iter_no_change=int(self.n_iter_no_change),
            validation_loss=self.validation_loss, options=self._options(),
            verbose=self.verbose,
        )
        best = res.best_index
        self.sigmas_ = grid
        self.sigma_ = None if grid is None else float(grid[best])
        self.cv_mse_ = res.cv_mse.detach().cpu().numpy()
        self.best_iter_ = res.best_iter.detach().cpu().numpy()
        self.cv_n_iter_ = res.n_iter.detach().cpu().numpy()
        self.n_iter_ = int(res.stopping_iter[best])
        self.kernel_ = kernels[best]
        op = KernelOperator(self.kernel_, X, options=self._options())
        K = op.to_dense() if op.fits_in_memory() else op
        if step != "auto":
            eta = step
        elif res.step_size is not None:
            eta = float(res.step_size[best])
        else:  # the same automatic step as the CV run, on the same kernel matrix
            eta = rule.learning_rate(K, yc)
        path = run_path(self._refit_rule(rule), K, yc, learning_rate=eta, max_iter=self.n_iter_,
                        verbose=self.verbose)
        if not torch.isfinite(path.alpha).all():
            raise DivergenceError("The refit diverged; lower learning_rate.")
        self.X_fit_ = X
        self.dual_coef_ = path.alpha
        self.learning_rate_ = float(eta)
        self.t_ = self.n_iter_ * self.learning_rate_
        self._after_refit(path)

    def predict(self, X):
        """Predict f(x) = k(x, X_fit) dual_coef + intercept.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,)
        """
        return self._kernel_predict(X)
