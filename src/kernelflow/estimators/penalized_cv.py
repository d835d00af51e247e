"""Penalised kernel regression with bandwidth and penalty chosen by batched grid CV."""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral, Real
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions

from ..distributed.auto import DISTRIBUTED_CONSTRAINT
from ..distributed.cv import cv_solver
from ..operators import KernelOperator
from ..solvers.direct import krr_cholesky
from ..solvers.grid_cv import krr_grid_cv, penalized_grid_cv
from ..solvers.prox import lambda_max
from ..solvers.proximal import proximal_gradient
from ..utils._validation import check_X_y
from ._base import KERNEL_CONSTRAINTS, KernelEstimatorMixin
from .path_cv import bandwidth_grid, cv_folds, grid_kernels
from .penalized import warn_unconverged

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..kernels import Kernel
    from ..operators import Options
    from ..typing import ArrayLike, Output

__all__ = ["PenalizedKernelRegressorCV"]


def penalty_grid(alphas: int | ArrayLike, penalty: str, y: torch.Tensor) -> np.ndarray:
    """Explicit penalties, or ``n`` log-spaced values lambda_max * [1e-6, 1] (1e-6..10 for l2)."""
    if isinstance(alphas, (int, np.integer)):
        top = float(lambda_max(penalty, y)) if penalty != "l2" else 10.0
        top = top if top > 0 and np.isfinite(top) else 1.0
        return top * np.geomspace(1e-6 if penalty != "l2" else 1e-7, 1.0, int(alphas))
    grid = np.asarray(alphas, dtype=float).reshape(-1)
    if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid < 0):
        raise ValueError(f"alphas must be non-negative finite penalties, got {alphas!r}.")
    return grid


class PenalizedKernelRegressorCV(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Penalised kernel regression (l1, l_inf, l2) with bandwidth and penalty by grid CV.

    Solves alpha = argmin 1/2 ||y - K alpha||^2_{K^-1} + lambda P(alpha) (Allerbo's Eq. 5b with
    the penalty swapped: P = ||.||_inf is the robust Kl_infR, P = ||.||_1 the sparse Kl1R,
    P = 1/2 ||.||^2 kernel ridge regression) for every (bandwidth, penalty) pair of a grid and
    every fold of a ``cv``-fold split; all folds and penalties of one bandwidth advance together,
    one matrix product per step (:func:`kernelflow.solvers.grid_cv.penalized_grid_cv`; the l2
    case uses one batched eigendecomposition per bandwidth). The pair with the smallest mean
    validation MSE is refitted on all rows by FISTA to the KKT tolerance ``tol``. Cost:
    O(S F L n^2) per FISTA iteration for S bandwidths, F folds and L penalties.

    Parameters
    ----------
    penalty : {"linf", "l1", "l2"}, default="linf"
        The penalty P.
    alphas : int or array-like of shape (n_alphas,), default=10
        Penalty grid (paper units), or its size: log-spaced lambda_max * [1e-6, 1] with
        lambda_max the smallest penalty giving alpha = 0 (||y||_1 for l_inf, ||y||_inf for l1).
    sigmas : int or array-like of shape (n_sigmas,), default=10
        Bandwidth grid, or its size (log-spaced median * [1e-2, 1e2]).
    kernel : str or Kernel, default="rbf"
        A kernel with a bandwidth.
    cv : int or list of array-like, default=5
        Number of folds, or explicit validation index arrays.
    max_iter : int, default=100
        Largest number of FISTA iterations per penalty (grid and refit). On a nearly singular
        kernel (wide bandwidth) and a small penalty the KKT tolerance is out of reach and every
        penalty runs to this cap, so the grid costs up to n_alphas * max_iter batched
        iterations: the cap, not the tolerance, bounds the default run. Raise it (with
        ``tol``) for exact minimisers.
    tol : float, default=1e-4
        KKT tolerance (gradient-mapping norm relative to max |y|).
    fit_intercept : bool, default=True
        Centre y by its mean (median for l_inf) and add it back when predicting.
    random_state : int, RandomState or None, default=None
        Seed of the fold permutation.
    options : Options, default=None
        Engine options.
    verbose : int, default=0
        > 0 shows progress over the bandwidths of the grid (the l2 grid: over its
        (bandwidth, fold) fits), in a terminal or a notebook.
    distributed : {"auto", "on", "off"} or bool, default="auto"
        Inside an initialised torch.distributed group of several processes ("auto", True or
        "on"), every process passes the whole training set and scores a share of the
        bandwidths; all select and refit the same model. False or "off": each process runs the
        whole grid.

    Attributes
    ----------
    alpha_ : float
        Chosen penalty.
    sigma_ : float
        Chosen bandwidth.
    alphas_ : ndarray of shape (n_alphas,)
    sigmas_ : ndarray of shape (n_sigmas,)
    cv_mse_ : ndarray of shape (n_sigmas, n_alphas)
        Mean validation MSE of every grid point.
    dual_coef_ : tensor of shape (n_samples,)
    support_ : ndarray of shape (n_support,)
        Indices of the non-zero coefficients (few for l1).
    n_iter_ : int
        FISTA iterations of the refit (1 for the direct l2 solve).
    intercept_ : tensor of shape ()
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    kernelflow.estimators.path_cv.KernelSignGradientCV : the early-stopping counterpart of
        Kl_infR (one path per fold instead of one solve per penalty).

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.penalized_cv import PenalizedKernelRegressorCV
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(40, 1))
    >>> y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(40)
    >>> model = PenalizedKernelRegressorCV(penalty="l1", alphas=[1e-2, 1e-1, 10.0],
    ...     sigmas=[0.05, 0.5, 5.0], cv=4, tol=1e-4, random_state=0).fit(X, y)
    >>> model.sigma_, model.alpha_, round(model.score(X, y), 2)
    (0.5, 0.1, 0.99)
    """

    _multi_output = False
    _parameter_constraints: dict = {
        "penalty": [StrOptions({"linf", "l1", "l2"})],
        "alphas": [Interval(Integral, 1, None, closed="left"), "array-like"],
        "sigmas": [Interval(Integral, 1, None, closed="left"), "array-like"],
        "cv": [Interval(Integral, 2, None, closed="left"), "array-like"],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "distributed": DISTRIBUTED_CONSTRAINT,
        **KERNEL_CONSTRAINTS,
    }

    def __init__(self, penalty: Literal["linf", "l1", "l2"] = "linf", *,
                 alphas: int | ArrayLike = 10, sigmas: int | ArrayLike = 10,
                 kernel: str | Kernel = "rbf", cv: int | Iterable[ArrayLike] = 5,
                 max_iter: int = 100, tol: float = 1e-4, fit_intercept: bool = True,
                 random_state: int | np.random.RandomState | None = None,
                 options: Options | None = None, verbose: int = 0,
                 distributed: bool | Literal["auto", "on", "off"] = "auto") -> None:
        self.penalty = penalty
        self.alphas = alphas
        self.sigmas = sigmas
        self.kernel = kernel
        self.cv = cv
        self.max_iter = max_iter
        self.tol = tol
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.options = options
        self.verbose = verbose
        self.distributed = distributed

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Cross-validate bandwidth and penalty, then refit on all of X.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,)

        Returns
        -------
        self : object
        """
        Xt, yt, _, _ = check_X_y(self, X, y, multi_output=False)
        if not self.fit_intercept:
            self.intercept_ = torch.zeros((), dtype=yt.dtype, device=yt.device)
        elif self.penalty == "linf":
            self.intercept_ = torch.quantile(yt, 0.5)
        else:
            self.intercept_ = yt.mean()
        yc = yt - self.intercept_
        sig = bandwidth_grid(self.sigmas, Xt)
        lam = penalty_grid(self.alphas, self.penalty, yc)
        kernels = grid_kernels(self.kernel, sig)
        folds = cv_folds(self.cv, Xt.shape[0], self.random_state)
        # in a process group: bandwidths spread over the processes (same data on all)
        if self.penalty == "l2":
            grid_cv, folds = cv_solver(self, krr_grid_cv, Xt, yt, folds)
            # the process-group version takes no options: progress on one process only
            res = grid_cv(Xt, yc, kernels, lam, folds,
                          **({"verbose": self.verbose} if grid_cv is krr_grid_cv else {}))
        else:
            grid_cv, folds = cv_solver(self, penalized_grid_cv, Xt, yt, folds)
            res = grid_cv(Xt, yc, kernels, lam, folds, penalty=self.penalty,
                          max_iter=int(self.max_iter), tol=float(self.tol),
                          verbose=self.verbose)
        i, j = res.best_index
        self.sigmas_, self.alphas_ = sig, lam
        self.cv_mse_ = res.cv_mse.detach().cpu().numpy()
        self.sigma_, self.alpha_ = float(sig[i]), float(lam[j])
        self.kernel_ = kernels[i]
        op = KernelOperator(self.kernel_, Xt, options=self._options())
        K = op.to_dense() if op.fits_in_memory(copies=3) else op
        if self.penalty == "l2":
            self.dual_coef_ = krr_cholesky(op.to_dense(), yc, self.alpha_)
            self.n_iter_ = 1  # one direct solve
        else:
            fit = proximal_gradient(K, yc, self.alpha_, penalty=self.penalty,
                                    max_iter=int(self.max_iter), tol=float(self.tol),
                                    warn=False)
            warn_unconverged(fit, self.max_iter, self.tol)
            self.dual_coef_ = fit.alpha
            self.n_iter_ = int(fit.n_iter)
        self.support_ = torch.nonzero(self.dual_coef_ != 0).reshape(-1).cpu().numpy()
        self.X_fit_ = Xt
        return self

    def predict(self, X: ArrayLike) -> Output:
        """Predict f(x) = k(x, X_fit) dual_coef + intercept.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,)
        """
        return self._kernel_predict(X)
