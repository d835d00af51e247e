"""Early-stopped kernel regressors whose bandwidth and stopping time are chosen by path CV."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import torch

from ._paths import PathCVRegressor, bandwidth_grid, cv_folds, grid_kernels

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..operators import Options
    from ..typing import ArrayLike

__all__ = ["KernelGradientDescentCV", "KernelSignGradientCV", "KernelCoordinateDescentCV",
           "bandwidth_grid", "grid_kernels", "cv_folds"]

_DOC = """{summary}

    Every (bandwidth, fold) problem of a ``cv``-fold split runs {rule} from alpha = 0 with step
    ``learning_rate``, monitoring the validation loss after every step and stopping after
    ``n_iter_no_change`` steps without improvement; all folds and bandwidths advance together as
    one batched computation (:func:`kernelflow.solvers.path_cv.early_stopping_path_cv`). The
    bandwidth with the smallest mean best validation loss wins, the stopping time is
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
    learning_rate : float or "auto", default="auto"
        Step size eta. "auto" gives every bandwidth the scale-aware step of the single-path
        estimator on its kernel matrix (e.g. 0.01 rms(y) / s_max(K) for sign descent); the
        papers use 0.01 on standardised data.
    max_iter : int, default=10000
        Largest number of steps per problem (t_max / eta).
    n_iter_no_change : int, default=100
        Patience of the stopping rule.
    validation_loss : {{"squared", "absolute", "huber"}}, default="{vl_default}"
        Loss scored on each fold's validation rows (all three run in the compiled loops for
        sign and coordinate descent). "absolute" and "huber" (threshold 1.345 x 1.4826 MAD of
        the fold's validation targets) keep gross outliers among the validation rows from
        choosing the bandwidth and the stopping time. To reproduce the paper's protocol use
        ``learning_rate=0.01``, ``validation_loss="squared"`` and ``fit_intercept=False``.
    fit_intercept : bool, default=True
        {intercept}
    random_state : int, RandomState or None, default=None
        Seed of the fold permutation.
    options : Options, default=None
        Engine options (memory budget for the stacked kernels).
    verbose : int, default=0
        > 0 shows progress over the steps of every bandwidth (at most ``n_sigmas *
        max_iter``), in a terminal or a notebook, and over the refit's steps.
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
        Chosen stopping time (steps of the refit); ``t_ = n_iter_ * learning_rate_``.
    learning_rate_ : float
        Step of the chosen bandwidth.
    t_ : float
    sigmas_ : ndarray of shape (n_sigmas,)
    cv_mse_ : ndarray of shape (n_sigmas,)
        Mean over folds of the best validation loss (the MSE for ``validation_loss="squared"``).
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


class KernelGradientDescentCV(PathCVRegressor):
    _method = "gradient"


class KernelSignGradientCV(PathCVRegressor):
    _method = "sign"

    def __init__(self, sigmas: int | ArrayLike = 30, *, kernel: str | Kernel = "rbf",
                 cv: int | Iterable[ArrayLike] = 10,
                 learning_rate: float | Literal["auto"] = "auto", max_iter: int = 10000,
                 n_iter_no_change: int = 100, validation_loss: str = "huber",
                 fit_intercept: bool = True,
                 random_state: int | np.random.RandomState | None = None,
                 options: Options | None = None, verbose: int = 0,
                 distributed: bool | Literal["auto", "on", "off"] = "auto") -> None:
        super().__init__(sigmas, kernel=kernel, cv=cv, learning_rate=learning_rate,
                         max_iter=max_iter, n_iter_no_change=n_iter_no_change,
                         validation_loss=validation_loss, fit_intercept=fit_intercept,
                         random_state=random_state, options=options, verbose=verbose,
                         distributed=distributed)

    def _location(self, y: torch.Tensor) -> torch.Tensor:
        return torch.quantile(y, 0.5)  # robust: an outlier must not shift every prediction


class KernelCoordinateDescentCV(PathCVRegressor):
    _method = "coordinate"

    def __init__(self, sigmas: int | ArrayLike = 30, *, kernel: str | Kernel = "rbf",
                 cv: int | Iterable[ArrayLike] = 10,
                 learning_rate: float | Literal["auto"] = "auto", max_iter: int = 10000,
                 n_iter_no_change: int = 100, validation_loss: str = "huber",
                 fit_intercept: bool = True,
                 random_state: int | np.random.RandomState | None = None,
                 options: Options | None = None, verbose: int = 0,
                 distributed: bool | Literal["auto", "on", "off"] = "auto") -> None:
        super().__init__(sigmas, kernel=kernel, cv=cv, learning_rate=learning_rate,
                         max_iter=max_iter, n_iter_no_change=n_iter_no_change,
                         validation_loss=validation_loss, fit_intercept=fit_intercept,
                         random_state=random_state, options=options, verbose=verbose,
                         distributed=distributed)

    def _after_refit(self, path: Any) -> None:
        self.support_ = torch.nonzero(path.alpha != 0).reshape(-1).cpu().numpy()


KernelGradientDescentCV.__doc__ = _DOC.format(
    summary="Kernel gradient descent (KGD) with bandwidth and stopping time by path CV.",
    rule="alpha <- alpha + eta (y - K alpha)",
    intercept="Centre y by its mean and add it back when predicting.",
    extra_attr="", name="KernelGradientDescentCV", example_extra="", vl_default="squared",
    example_out="(0.5, 1.0)",
)
KernelSignGradientCV.__doc__ = _DOC.format(
    summary="Robust kernel sign gradient descent (KSGD) with bandwidth and stopping time by "
            "path CV.",
    rule="alpha <- alpha + eta sign(y - K alpha) (sign(0) = 0)",
    intercept="Centre y by its median (robust) and add it back when predicting.",
    extra_attr="", name="KernelSignGradientCV", example_extra="", vl_default="huber",
    example_out="(0.5, 1.0)",
)
KernelCoordinateDescentCV.__doc__ = _DOC.format(
    summary="Sparse kernel coordinate descent (KCD) with bandwidth and stopping time by path CV.",
    rule="alpha_m <- alpha_m + eta sign(r_m) on every m attaining max |r|",
    intercept="Centre y by its mean and add it back when predicting.",
    extra_attr="\n    support_ : ndarray of shape (n_support,)\n        Indices of the training "
               "points with a non-zero coefficient.",
    name="KernelCoordinateDescentCV", example_extra=", len(model.support_) < 60",
    vl_default="huber",
    example_out="(0.5, 1.0, True)",
)
