"""Early-stopped kernel regressors whose bandwidth and stopping time are chosen by path CV."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import torch

from ..solvers.paths.rules import CoordinateRule, GradientRule, PathRule, SignRule
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
    sigmas : int, array-like of shape (n_sigmas,) or None, default={sigmas_default}
        Bandwidth grid, or its size: log-spaced values median * [1e-2, 1e2] where median is the
        median pairwise distance; None: the grid of ``KernelRidgeCV``, median * 10^[-1, 1] in 9
        values. The papers use geomspace(0.01, 1000, 30) on standardised data.{sigmas_extra}
    kernel : str or Kernel, default="rbf"
        A kernel with a bandwidth (Gaussian, Laplace, Matern, Cauchy), or "precomputed": ``fit``
        then takes the (n, n) training kernel matrix and only the stopping time is
        cross-validated (``sigma_`` and ``sigmas_`` are None), ``predict`` the
        (n_test, n_train) kernel matrix.
    cv : int or list of array-like, default={cv_default}
        Number of folds of a seeded permutation, or explicit validation index arrays.
    learning_rate : float or "auto", default="auto"
        Step size eta. "auto" gives every bandwidth a scale-aware step on its kernel matrix
        ({auto_step}); the papers use 0.01 on standardised data.
    max_iter : int, default={max_iter_default}
        Largest number of steps per problem (t_max / eta).
    n_iter_no_change : int, default={patience_default}
        Patience of the stopping rule.{patience_extra}
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
    sigma_ : float or None
        Chosen bandwidth (None with ``kernel="precomputed"``).
    n_iter_ : int
        Chosen stopping time (steps of the refit); ``t_ = n_iter_ * learning_rate_``.
    learning_rate_ : float
        Step of the chosen bandwidth.
    t_ : float
    sigmas_ : ndarray of shape (n_sigmas,) or None
    cv_mse_ : ndarray of shape (n_sigmas,)
        Mean over folds of the best validation loss (the MSE for ``validation_loss="squared"``).
    best_iter_ : ndarray of shape (n_sigmas, n_folds)
    cv_n_iter_ : ndarray of shape (n_sigmas, n_folds)
        Steps each cross-validation problem ran before its monitor stopped it (``max_iter``
        where the cap stopped it).
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
    _rule_class = GradientRule


def typical_sign_learning_rate(K: torch.Tensor, y: torch.Tensor,
                               resolution: float = 0.01) -> float:
    """Sign-descent step that moves the fitted values by ``resolution ||y||`` in a typical step.

    eta = resolution * rms(y) * sqrt(n) / ||K||_F. A step changes the fitted values by
    eta ||K s||_2 with s = sign(r). :func:`~kernelflow.solvers.paths.sign_learning_rate`
    bounds the worst case, ||K s|| <= s_max(K) sqrt(n), which is attained only while s follows
    K's top eigenvector (the first steps from alpha = 0). Once the residual's signs are mixed,
    ||K s|| is about ||K||_F (E ||K s||^2 = ||K||_F^2 for signs without alignment), and for a
    kernel with a fast-decaying spectrum ||K||_F is far below s_max sqrt(n): the worst-case step
    then moves the fit by much less than ``resolution`` per step, and the path needs thousands
    of steps to reach its best validation error. Both steps agree for K = I. Sign descent
    cannot diverge (|alpha_i| <= k eta), so the larger step only coarsens the path early on.
    Cost O(n^2).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.solvers.paths import sign_learning_rate
    >>> round(typical_sign_learning_rate(torch.eye(4, dtype=torch.float64), torch.ones(4)), 4)
    0.01
    >>> K = torch.ones(4, 4, dtype=torch.float64)  # rank one: 2 = sqrt(n) times the worst case
    >>> round(typical_sign_learning_rate(K, torch.ones(4)) / sign_learning_rate(K, torch.ones(4)))
    2
    """
    n = K.shape[0]
    fro = float(torch.linalg.matrix_norm(K))
    rms = float(y.pow(2).mean().sqrt()) if y.numel() else 0.0
    return resolution * (rms if rms > 0 else 1.0) * n**0.5 / (fro if fro > 0 else 1.0)


class _TypicalStepSignRule(SignRule):
    """Sign descent with :func:`typical_sign_learning_rate` as its automatic step."""

    def learning_rate(self, K, y, s_max=None, sample_weight=None):
        if sample_weight is not None or not isinstance(K, torch.Tensor):
            return super().learning_rate(K, y, s_max=s_max, sample_weight=sample_weight)
        return typical_sign_learning_rate(K, y)


class KernelSignGradientCV(PathCVRegressor):
    _rule_class = SignRule

    def __init__(self, sigmas: int | ArrayLike | None = None, *, kernel: str | Kernel = "rbf",
                 cv: int | Iterable[ArrayLike] = 5,
                 learning_rate: float | Literal["auto"] = "auto", max_iter: int = 30000,
                 n_iter_no_change: int = 250, validation_loss: str = "huber",
                 fit_intercept: bool = True,
                 random_state: int | np.random.RandomState | None = None,
                 options: Options | None = None, verbose: int = 0,
                 distributed: bool | Literal["auto", "on", "off"] = "auto") -> None:
        super().__init__(sigmas, kernel=kernel, cv=cv, learning_rate=learning_rate,
                         max_iter=max_iter, n_iter_no_change=n_iter_no_change,
                         validation_loss=validation_loss, fit_intercept=fit_intercept,
                         random_state=random_state, options=options, verbose=verbose,
                         distributed=distributed)

    def _rule(self, y: torch.Tensor) -> PathRule:
        return _TypicalStepSignRule()

    def _refit_rule(self, rule: PathRule) -> PathRule:
        return SignRule()  # the same update; the compiled single path runs it

    def _location(self, y: torch.Tensor) -> torch.Tensor:
        return torch.quantile(y, 0.5)  # robust: an outlier must not shift every prediction


class KernelCoordinateDescentCV(PathCVRegressor):
    _rule_class = CoordinateRule

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
    cv_default="10", max_iter_default="10000", patience_default="100", patience_extra="",
    extra_attr="", name="KernelGradientDescentCV", example_extra="", vl_default="squared",
    example_out="(0.5, 1.0)", sigmas_default="30", sigmas_extra="",
    auto_step="that of the single-path estimator, from s_max(K)",
)
KernelSignGradientCV.__doc__ = _DOC.format(
    summary="Robust kernel sign gradient descent (KSGD) with bandwidth and stopping time by "
            "path CV.",
    rule="alpha <- alpha + eta sign(y - K alpha) (sign(0) = 0)",
    intercept="Centre y by its median (robust) and add it back when predicting.",
    cv_default="5", max_iter_default="30000", patience_default="250",
    patience_extra=(
        "\n        On clean data the validation curves of the smooth kernels that win are "
        "flat and\n        slow (the best step is often beyond 5 000): a patience of 100 "
        "steps ended folds\n        on a plateau and biased the choice towards narrow "
        "bandwidths; 5 folds pay for\n        the longer runs."),
    extra_attr="", name="KernelSignGradientCV", example_extra="", vl_default="huber",
    example_out="(0.5, 1.0)", sigmas_default="None",
    sigmas_extra=(
        "\n        The default searches the same bandwidths as ``KernelRidgeCV()``: on the wider "
        "grid of\n        30 values the widest bandwidths (K nearly constant) creep down to "
        "``max_iter``\n        without being chosen."),
    auto_step=("0.01 rms(y) sqrt(n) / ||K||_F, a typical step moving the fit by 1 % of "
               "||y||,\n        see :func:`typical_sign_learning_rate`; it ends by its "
               "monitor, not by ``max_iter``"),
)
KernelCoordinateDescentCV.__doc__ = _DOC.format(
    summary="Sparse kernel coordinate descent (KCD) with bandwidth and stopping time by path CV.",
    rule="alpha_m <- alpha_m + eta sign(r_m) on every m attaining max |r|",
    intercept="Centre y by its mean and add it back when predicting.",
    extra_attr="\n    support_ : ndarray of shape (n_support,)\n        Indices of the training "
               "points with a non-zero coefficient.",
    cv_default="10", max_iter_default="10000", patience_default="100", patience_extra="",
    name="KernelCoordinateDescentCV", example_extra=", len(model.support_) < 60",
    vl_default="huber",
    example_out="(0.5, 1.0, True)", sigmas_default="30", sigmas_extra="",
    auto_step="that of the single-path estimator, 0.01 max|y| / max K_ii",
)
