"""Early-stopped kernel regressors whose bandwidth and stopping time are chosen by path CV."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval

from ..datasets._allerbo import kfold_indices
from ..distributed.auto import DISTRIBUTED_CONSTRAINT
from ..distributed.cv import cv_solver
from ..kernels import Kernel, make_kernel, median_heuristic
from ..operators import KernelOperator
from ..solvers.path_cv import early_stopping_path_cv
from ..solvers.paths import coordinate_descent_path, gradient_descent_path, sign_gradient_path
from ..utils._finite import DivergenceError
from ..utils._validation import check_X_y
from ._base import KERNEL_CONSTRAINTS, KernelEstimatorMixin

__all__ = ["KernelGradientDescentCV", "KernelSignGradientCV", "KernelCoordinateDescentCV"]

_CV_CONSTRAINTS = {
    "sigmas": [Interval(Integral, 1, None, closed="left"), "array-like"],
    "cv": [Interval(Integral, 2, None, closed="left"), "array-like"],
    "learning_rate": [Interval(Real, 0, None, closed="neither")],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "distributed": DISTRIBUTED_CONSTRAINT,
}


def bandwidth_grid(sigmas, X: torch.Tensor) -> np.ndarray:
    """The bandwidth grid: explicit values, or ``n`` log-spaced values median * [1e-2, 1e2]."""
    if isinstance(sigmas, (int, np.integer)):
        med = float(median_heuristic(X))
        med = med if med > 0 else 1.0
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


class _PathCVRegressor(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Bandwidth and stopping time by batched path cross-validation, then a refit."""

    _multi_output = False
    _method = "sign"
    _parameter_constraints: dict = {**_CV_CONSTRAINTS, **KERNEL_CONSTRAINTS}

    def __init__(self, sigmas=30, *, kernel="rbf", cv=10, learning_rate=0.01, max_iter=10000,
                 n_iter_no_change=100, fit_intercept=True, random_state=None, options=None,
                 verbose=0, distributed="auto"):
        self.sigmas = sigmas
        self.kernel = kernel
        self.cv = cv
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.n_iter_no_change = n_iter_no_change
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.options = options
        self.verbose = verbose
        self.distributed = distributed

    def _refit(self, K, y, n_iter):
        raise NotImplementedError  # pragma: no cover

    def _location(self, y):
        return y.mean()

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
        grid = bandwidth_grid(self.sigmas, X)
        kernels = grid_kernels(self.kernel, grid)
        folds = cv_folds(self.cv, X.shape[0], self.random_state)
        self.intercept_ = (self._location(y) if self.fit_intercept
                           else torch.zeros((), dtype=y.dtype, device=y.device))
        yc = y - self.intercept_
        # in a process group: bandwidths spread over the processes (same data on all)
        path_cv, folds = cv_solver(self, early_stopping_path_cv, X, y, folds)
        res = path_cv(
            X, yc, kernels, folds, method=self._method, step_size=float(self.learning_rate),
            max_iter=int(self.max_iter), n_iter_no_change=int(self.n_iter_no_change),
            options=self._options(), verbose=self.verbose,
        )
        best = res.best_index
        self.sigmas_ = grid
        self.sigma_ = float(grid[best])
        self.cv_mse_ = res.cv_mse.detach().cpu().numpy()
        self.best_iter_ = res.best_iter.detach().cpu().numpy()
        self.n_iter_ = int(res.stopping_iter[best])
        self.kernel_ = kernels[best]
        op = KernelOperator(self.kernel_, X, options=self._options())
        K = op.to_dense() if op.fits_in_memory() else op
        path = self._refit(K, yc, self.n_iter_)
        if not torch.isfinite(path.alpha).all():
            raise DivergenceError("The refit diverged; lower learning_rate.")
        self.X_fit_ = X
        self.dual_coef_ = path.alpha
        self.t_ = self.n_iter_ * float(self.learning_rate)
        return self

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


_DOC = """{summary}

    Every (bandwidth, fold) problem of a ``cv``-fold split runs {rule} from alpha = 0 with step
    ``learning_rate``, monitoring the validation MSE after every step and stopping after
    ``n_iter_no_change`` steps without improvement; all folds and bandwidths advance together as
    one batched computation (:func:`kernelflow.solvers.path_cv.early_stopping_path_cv`). The
    bandwidth with the smallest mean best validation MSE wins, the stopping time is
    int(mean over folds of the best iteration) (Allerbo §6, as in the published experiments) and
    the model is refitted on all training rows for that many steps. Cost: O(S F n^2) per step
    for S bandwidths and F folds, plus the refit.

    Parameters
    ----------
    sigmas : int or array-like of shape (n_sigmas,), default=30
        Bandwidth grid, or its size: log-spaced values median * [1e-2, 1e2] where median is the
        median pairwise distance. The papers use geomspace(0.01, 1000, 30) on standardised data.
    kernel : str or Kernel, default="rbf"
        A kernel with a bandwidth (Gaussian, Laplace, Matern, Cauchy).
    cv : int or list of array-like, default=10
        Number of folds of a seeded permutation, or explicit validation index arrays.
    learning_rate : float, default=0.01
        Step size eta (the papers' value).
    max_iter : int, default=10000
        Largest number of steps per problem (t_max / eta).
    n_iter_no_change : int, default=100
        Patience of the stopping rule.
    fit_intercept : bool, default=True
        {intercept}
    random_state : int, RandomState or None, default=None
        Seed of the fold permutation.
    options : Options, default=None
        Engine options (memory budget for the stacked kernels).
    verbose : int, default=0
        Progress bar over steps.
    distributed : {{"auto", "on", "off"}} or bool, default="auto"
        Inside an initialised torch.distributed group of several processes ("auto", True or
        "on"), every process passes the whole training set and scores a share of the
        bandwidths (:func:`kernelflow.distributed.distributed_path_cv`); all select and refit
        the same model. False or "off": each process runs the whole grid.

    Attributes
    ----------
    sigma_ : float
        Chosen bandwidth.
    n_iter_ : int
        Chosen stopping time (steps of the refit); ``t_ = n_iter_ * learning_rate``.
    sigmas_ : ndarray of shape (n_sigmas,)
    cv_mse_ : ndarray of shape (n_sigmas,)
        Mean over folds of the best validation MSE.
    best_iter_ : ndarray of shape (n_sigmas, n_folds)
    dual_coef_ : tensor of shape (n_samples,)
    intercept_ : tensor of shape ()
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.{extra_attr}

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.path_cv import {name}
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(60, 1))
    >>> y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(60)
    >>> model = {name}(sigmas=[0.05, 0.5, 5.0], cv=5, max_iter=2000,
    ...     random_state=0).fit(X, y)
    >>> model.sigma_, round(model.score(X, y), 1){example_extra}
    {example_out}
    """


class KernelGradientDescentCV(_PathCVRegressor):
    _method = "gradient"

    def _refit(self, K, y, n_iter):
        return gradient_descent_path(K, y, learning_rate=float(self.learning_rate),
                                     max_iter=n_iter)


class KernelSignGradientCV(_PathCVRegressor):
    _method = "sign"

    def _location(self, y):
        return torch.quantile(y, 0.5)  # robust: an outlier must not shift every prediction

    def _refit(self, K, y, n_iter):
        return sign_gradient_path(K, y, learning_rate=float(self.learning_rate), max_iter=n_iter)


class KernelCoordinateDescentCV(_PathCVRegressor):
    _method = "coordinate"

    def _refit(self, K, y, n_iter):
        path = coordinate_descent_path(K, y, learning_rate=float(self.learning_rate),
                                       max_iter=n_iter)
        self.support_ = torch.nonzero(path.alpha != 0).reshape(-1).cpu().numpy()
        return path


KernelGradientDescentCV.__doc__ = _DOC.format(
    summary="Kernel gradient descent (KGD) with bandwidth and stopping time by path CV.",
    rule="alpha <- alpha + eta (y - K alpha)",
    intercept="Centre y by its mean and add it back when predicting.",
    extra_attr="", name="KernelGradientDescentCV", example_extra="",
    example_out="(0.5, 1.0)",
)
KernelSignGradientCV.__doc__ = _DOC.format(
    summary="Robust kernel sign gradient descent (KSGD) with bandwidth and stopping time by "
            "path CV.",
    rule="alpha <- alpha + eta sign(y - K alpha) (sign(0) = 0)",
    intercept="Centre y by its median (robust) and add it back when predicting.",
    extra_attr="", name="KernelSignGradientCV", example_extra="",
    example_out="(0.5, 1.0)",
)
KernelCoordinateDescentCV.__doc__ = _DOC.format(
    summary="Sparse kernel coordinate descent (KCD) with bandwidth and stopping time by path CV.",
    rule="alpha_m <- alpha_m + eta sign(r_m) on every m attaining max |r|",
    intercept="Centre y by its mean and add it back when predicting.",
    extra_attr="\n    support_ : ndarray of shape (n_support,)\n        Indices of the training "
               "points with a non-zero coefficient.",
    name="KernelCoordinateDescentCV", example_extra=", len(model.support_) < 60",
    example_out="(0.5, 1.0, True)",
)
