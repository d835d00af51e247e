"""The ``learn_hyperparameters`` option of the kernel ridge estimators.

One rule for the learned signal variance: it is *carried*, not folded. ``kernel_``,
``alpha_`` and ``dual_coef_`` stay those of the ridge problem (predictions equal a ridge fit
at ``sigma_`` and ``alpha_``), and the fitted attributes ``signal_variance_`` (s^2) and
``noise_variance_`` (s^2 alpha_) complete the Gaussian-process reading: prior s^2 k, noise
s^2 alpha. ``predict(return_std=True)`` and ``log_marginal_likelihood()`` use both. Without
learning, s^2 = 1 and the noise variance is the penalty (scikit-learn's
``GaussianProcessRegressor(alpha=...)`` convention).
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
import torch
from sklearn.utils._param_validation import Interval

from ..collectives import is_distributed
from ..solvers.hyperparameters import check_bounds, learn_hyperparameters
from ._base import fit_random_state

__all__ = ["OPTIMIZER_CONSTRAINTS", "check_optimizer", "learn_for_estimator",
           "learn_for_nystrom", "set_unit_signal_variance"]

#: Rows used to learn the Nyström model's hyperparameters (a uniform subsample beyond).
MAX_ROWS = 20000

#: Parameter constraints of the optimiser options (the bounds are checked by check_optimizer).
OPTIMIZER_CONSTRAINTS: dict = {
    "n_restarts_optimizer": [Interval(Integral, 0, None, closed="left")],
    "sigma_bounds": ["array-like"],
    "alpha_bounds": ["array-like"],
}


def check_optimizer(estimator) -> None:
    """Refuse bounds that are not 0 < low < high < inf (a ValueError naming the parameter)."""
    check_bounds("sigma_bounds", estimator.sigma_bounds)
    check_bounds("alpha_bounds", estimator.alpha_bounds)


def set_unit_signal_variance(estimator, alpha) -> None:
    """``signal_variance_`` = 1 and ``noise_variance_`` = the penalty (no learning)."""
    estimator.signal_variance_ = 1.0
    a = np.asarray(alpha, dtype=np.float64)
    estimator.noise_variance_ = float(a) if a.size == 1 else a.reshape(-1).copy()


def learn_for_estimator(estimator, X, y, sample_weight, alpha, kernel, centers=None):
    """Learn ``kernel`` and the penalty of ``estimator`` on centred targets ``y``.

    Sets the fitted attributes ``sigma_`` (float, array, or None for kernels without one),
    ``alpha_``, ``signal_variance_``, ``noise_variance_`` and ``hyperparameters_`` (a
    :class:`HyperparameterResult`) and returns (learned kernel, learned alpha).
    """
    if sample_weight is not None:
        raise ValueError("learn_hyperparameters does not support sample_weight.")
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.size != 1:
        raise ValueError("learn_hyperparameters learns one penalty; give a scalar alpha.")
    check_optimizer(estimator)
    start = float(alpha) if float(alpha) > 0 else 1e-2
    res = learn_hyperparameters(
        torch.as_tensor(X), y, kernel, criterion=estimator.learn_hyperparameters,
        alpha=start, centers=centers, random_state=_seed(estimator),
        sigma_bounds=estimator.sigma_bounds, alpha_bounds=estimator.alpha_bounds,
        n_random_starts=int(estimator.n_restarts_optimizer),
        verbose=getattr(estimator, "verbose", 0),
    )
    estimator.hyperparameters_ = res
    estimator.alpha_ = res.alpha
    estimator.sigma_ = getattr(res.kernel, "sigma", None)
    s2 = res.signal_variance
    estimator.signal_variance_ = s2
    estimator.noise_variance_ = s2 * res.alpha
    return res.kernel, res.alpha


def _seed(estimator) -> int:
    """The seed of the validation split and the random restarts: ``random_state`` itself when
    it is an integer, a draw from a copy of a ``RandomState``, 0 for None."""
    rs = getattr(estimator, "random_state", None)
    if isinstance(rs, Integral):
        return int(rs)
    if isinstance(rs, np.random.RandomState):
        return int(fit_random_state(rs).randint(0, 2**31 - 1))
    return 0


def learn_for_nystrom(estimator, source, intercept, kernel, centers):
    """:func:`learn_for_estimator` for the Nyström estimators, on (a subsample of) the rows of an
    in-memory data source, with the selected centres fixed."""
    if is_distributed():
        raise ValueError("learn_hyperparameters is not supported in data-parallel fits; learn "
                         "on one process and pass the learned sigma_ and alpha_.")
    X, y = getattr(source, "X", None), getattr(source, "y", None)
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError("learn_hyperparameters needs the training data in memory (arrays).")
    if X.shape[0] > MAX_ROWS:
        g = torch.Generator().manual_seed(_seed(estimator))
        idx = torch.randperm(X.shape[0], generator=g)[:MAX_ROWS].to(X.device)
        X, y = X[idx], y[idx]
    y = y.to(torch.float64) - intercept.reshape(1, -1).to(device=y.device)
    return learn_for_estimator(estimator, X, y, getattr(source, "sample_weight", None),
                               estimator.alpha, kernel, centers=centers)
