"""The ``learn_hyperparameters`` option of the kernel ridge estimators."""

from __future__ import annotations

import numpy as np
import torch

from ..collectives import is_distributed
from ..solvers.hyperparameters import learn_hyperparameters

__all__ = ["learn_for_estimator", "learn_for_nystrom"]

#: Rows used to learn the Nyström model's hyperparameters (a uniform subsample beyond).
MAX_ROWS = 20000


def learn_for_estimator(estimator, X, y, sample_weight, alpha, kernel, centers=None):
    """Learn ``kernel`` and the penalty of ``estimator`` on centred targets ``y``.

    Sets the fitted attributes ``sigma_`` (float, array, or None for kernels without one),
    ``alpha_`` and ``hyperparameters_`` (a :class:`HyperparameterResult`) and returns
    (learned kernel, learned alpha).
    """
    if sample_weight is not None:
        raise ValueError("learn_hyperparameters does not support sample_weight.")
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.size != 1:
        raise ValueError("learn_hyperparameters learns one penalty; give a scalar alpha.")
    start = float(alpha) if float(alpha) > 0 else 1e-2
    res = learn_hyperparameters(
        torch.as_tensor(X), y, kernel, criterion=estimator.learn_hyperparameters,
        alpha=start, centers=centers, random_state=_seed(estimator),
    )
    estimator.hyperparameters_ = res
    estimator.alpha_ = res.alpha
    estimator.sigma_ = getattr(res.kernel, "sigma", None)
    return res.kernel, res.alpha


def _seed(estimator):
    rs = getattr(estimator, "random_state", None)
    return rs if isinstance(rs, int) else 0


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
