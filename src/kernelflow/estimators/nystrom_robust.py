"""Robust large-scale kernel regression: sign-gradient (LAD) and Huber on Nyström features."""

from __future__ import annotations

import os
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Literal

import torch
from sklearn.base import _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from ..collectives import is_distributed
from ..distributed.auto import fit_scope
from ..distributed.nystrom_prepare import NystromData
from ..distributed.protocol import FitPlan, LocalResult
from ..solvers.nystrom_robust import LOSSES, nystrom_robust
from ..utils._warnings import warn_caller
from ..utils.checkpoint import data_fingerprint, fit_checkpoint
from .nystrom_ridge import NYSTROM_CONSTRAINTS, _NystromBase

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self

    from ..kernels import Kernel
    from ..landmarks import LandmarkSelector
    from ..operators import Options
    from ..sources import DataSource
    from ..typing import ArrayLike

__all__ = ["NystromRobustRegressor"]


@dataclass
class _RobustPlan:
    """The plan of a robust Nyström fit: prepared data and the warm start."""

    data: NystromData
    coef0: torch.Tensor | None
    intercept0: torch.Tensor | None


class NystromRobustRegressor(_NystromBase):
    """Robust kernel regression for millions of rows by streamed (sign-)gradient descent.

    Fits f(x) = K(x, C) a + b on M centres C by minimising
    (1/W) sum_i w_i rho(y_i - f(x_i)) + (alpha / 2W) a^T K_MM a with gradient steps in the
    Nyström feature space (see :mod:`kernelflow.solvers.nystrom_robust`). With
    ``loss="absolute"`` the steps follow sign(y - f): gradient descent on least absolute
    deviations in feature space, which is kernel sign-gradient descent with the Nyström kernel
    (Allerbo, Prop. 5.2), so gross outliers pull the fit by a bounded amount. ``"huber"`` uses a
    threshold of ``epsilon`` robust standard deviations of the residuals; ``"squared"`` gives
    (early-stopped) kernel gradient descent, and run to convergence Nyström kernel ridge
    regression. Early stopping on a validation split (scored with the same loss) makes the
    number of iterations the regulariser, as in the paper.

    Cost: O(M^3) setup and O(n M (d + 2t)) per iteration; memory O(M^2) plus one row block.
    X may be a :class:`kernelflow.sources.DataSource` larger than memory.

    Parameters
    ----------
    n_components : int, default=100
        Number of centres M.
    landmarks : str, LandmarkSelector or array-like, default="uniform"
        Centre selector name, selector object, or the centres.
    loss : {"absolute", "huber", "squared"}, default="absolute"
    alpha : float, default=1.0
        Ridge penalty (scikit-learn's scale), >= 0.
    epsilon : float, default=1.345
        Huber threshold in robust standard deviations of the residuals.
    learning_rate : float or "auto", default="auto"
        Constant step size, or adaptive (start at 1, or at half the robust scale of y for the
        absolute loss; halve whenever the objective increases).
    preconditioned : bool, default=True
        Take the steps in the coordinates of Falkon's preconditioner (few passes); False gives
        the plain Nyström-feature iteration of the paper.
    kernel, sigma, gamma, degree, coef0 : kernel parameters (see ``NystromKernelRidge``).
    fit_intercept : bool, default=True
        Learn an unpenalised intercept (started at the weighted median of y).
    max_iter : int, default=100
        Maximum number of passes over the data.
    tol : float, default=1e-6
        Relative decrease of the objective (or, for the adaptive absolute loss, step size
        relative to the scale of y) below which the run stops.
    early_stopping : bool, default=False
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=5
    warm_start : bool, default=False
    dtype : {"float32", "float64"} or None, default=None
    block_size : int, default=None
    random_state : int, RandomState instance or None, default=None
    verbose : int, default=0
    options : Options, default=None
    distributed : {"auto", "on", "off"} or bool, default="auto"
        Data-parallel ``fit`` inside a process group of several processes, each passing its own
        rows (see ``NystromKernelRidge``); the gradient, loss and residual histogram of every
        step and the validation loss are all-reduced.
    checkpoint : str or path-like, default=None
        File where the descent state (iterate, intercept, step size, objective history,
        validation monitor) is written every ``checkpoint_interval`` seconds; a fit given a
        path holding a checkpoint of the same problem continues from it and ends with the
        model of an uninterrupted fit, one of another problem is refused with a ValueError. A
        completed fit deletes the file. See ``NystromKernelRidge`` and ``docs/reliability.md``.
    checkpoint_interval : float, default=60
        Least number of seconds between two checkpoint writes (0: after every iteration).

    Attributes
    ----------
    centers_ : tensor of shape (M, n_features)
    dual_coef_ : tensor of shape (M,) or (M, n_targets)
    intercept_ : tensor of shape () or (n_targets,)
    kernel_ : Kernel
    n_iter_ : int
    converged_ : bool
    objective_ : list of float
        Objective after each accepted step (iteration 0 first).
    validation_scores_ : list of float
        Mean validation loss per iteration (empty without early stopping).
    best_iteration_ : int
    learning_rate_ : float
        Final step size.
    delta_ : float or None
        Final Huber threshold.
    compute_dtype_ : str
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    NystromKernelRidge : squared loss by preconditioned conjugate gradients.

    References
    ----------
    Allerbo, "Fast robust kernel regression through sign gradient descent with early
    stopping" (Prop. 5.2).

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.nystrom_robust import NystromRobustRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(500, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(500)
    >>> y[::20] += 30.0                                    # 5 % gross outliers
    >>> model = NystromRobustRegressor(n_components=40, sigma=1.0, random_state=0).fit(X, y)
    >>> err = np.abs(model.predict(X) - np.sin(X[:, 0]))
    >>> bool(np.median(err) < 0.05)
    True
    """

    _parameter_constraints: dict = {
        **NYSTROM_CONSTRAINTS,
        "alpha": [Interval(Real, 0, None, closed="left")],
        "loss": [StrOptions(set(LOSSES))],
        "epsilon": [Interval(Real, 0, None, closed="neither")],
        "learning_rate": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "preconditioned": ["boolean"],
        "tol": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(self, n_components: int = 100, *,
                 landmarks: str | LandmarkSelector | ArrayLike = "uniform",
                 loss: str = "absolute", alpha: float = 1.0, epsilon: float = 1.345,
                 learning_rate: float | Literal["auto"] = "auto", preconditioned: bool = True,
                 kernel: str | Kernel = "rbf", sigma: ArrayLike | Literal["ard"] | None = None,
                 gamma: float | None = None, degree: int = 3, coef0: float = 1.0,
                 fit_intercept: bool = True, max_iter: int = 100, tol: float = 1e-6,
                 early_stopping: bool = False, validation_fraction: float = 0.1,
                 n_iter_no_change: int = 5, warm_start: bool = False,
                 dtype: Literal["float32", "float64"] | None = None, block_size: int | None = None,
                 random_state: int | np.random.RandomState | None = None, verbose: int = 0,
                 options: Options | None = None,
                 distributed: bool | Literal["auto", "on", "off"] = "auto",
                 checkpoint: str | os.PathLike[str] | None = None,
                 checkpoint_interval: float = 60.0) -> None:
        self.n_components = n_components
        self.landmarks = landmarks
        self.loss = loss
        self.alpha = alpha
        self.epsilon = epsilon
        self.learning_rate = learning_rate
        self.preconditioned = preconditioned
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.dtype = dtype
        self.block_size = block_size
        self.random_state = random_state
        self.verbose = verbose
        self.options = options
        self.distributed = distributed
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike | DataSource | str | os.PathLike[str], y: ArrayLike | None = None,
            sample_weight: ArrayLike | None = None) -> Self:
        """Fit the model.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features), DataSource, or path to .npy
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        with fit_scope(self, X):
            return self._fit_stages(X, y, sample_weight)

    def _plan(self, X, y=None, sample_weight=None) -> FitPlan:
        """Prepare, then the warm start."""
        data = self._prepare(X, y, sample_weight)
        t = data.source.n_outputs
        coef0 = intercept0 = None
        prev = data.warm
        if prev is not None and prev[2].reshape(prev[2].shape[0], -1).shape[1] == t:
            coef0 = prev[2].reshape(-1, t).to(torch.float64)
            intercept0 = prev[3].reshape(t).to(torch.float64)
        return FitPlan(shared={"centres": float(data.centers.shape[0]), "targets": float(t)},
                       state=_RobustPlan(data, coef0, intercept0))

    def data_parallel_step(self, shard: DataSource, plan: FitPlan) -> LocalResult:
        """Gradient steps on this process's rows; the gradient, the loss, the residual
        histogram and the validation loss are all-reduced inside the solver."""
        p: _RobustPlan = plan.state
        data, coef0, intercept0 = p.data, p.coef0, p.intercept0
        ckpt = None
        if self.checkpoint is not None:
            if is_distributed():
                raise ValueError("checkpoint is not supported in a data-parallel fit.")
            ckpt = fit_checkpoint(self, "nystrom_robust", data_fingerprint(data.source),
                                  centers=data.centers, kernel=data.kernel, coef0=coef0,
                                  intercept0=intercept0)
        sol = nystrom_robust(
            data.train, data.kernel, data.centers, loss=self.loss, alpha=float(self.alpha),
            epsilon=self.epsilon, learning_rate=self.learning_rate, max_iter=self.max_iter,
            tol=self.tol, preconditioned=self.preconditioned, fit_intercept=self.fit_intercept,
            coef0=coef0, intercept0=intercept0, validation=data.validation,
            n_iter_no_change=self.n_iter_no_change, dtype=data.dtype, options=data.options,
            block_size=self.block_size, verbose=self.verbose, checkpoint=ckpt,
        )
        if ckpt is not None:
            ckpt.finish()
        return LocalResult(state=sol)

    def data_parallel_finish(self, plan: FitPlan, result: LocalResult) -> Self:
        """Store the coefficients and the descent's history; returns self."""
        sol = result.state
        if (self.learning_rate == "auto" and not sol.converged and not sol.stopped_early
                and self.max_iter >= 10):
            warn_caller(
                f"Nyström {self.loss} descent stopped at max_iter={self.max_iter} before "
                f"reaching tol={self.tol}.", ConvergenceWarning,
            )
        self._store_common(plan.state.data, sol.coef, sol.intercept)
        self.n_iter_ = sol.n_iter
        self.converged_ = bool(sol.converged)
        self.objective_ = list(sol.objective)
        self.validation_scores_ = list(sol.validation_loss)
        self.best_iteration_ = int(sol.best_iter)
        self.learning_rate_ = float(sol.learning_rate)
        self.delta_ = sol.delta
        return self
