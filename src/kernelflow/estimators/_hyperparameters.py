"""The ``learn_hyperparameters`` option of the kernel ridge estimators."""

from __future__ import annotations

import numpy as np
import torch

from ..solvers.hyperparameters import learn_hyperparameters

__all__ = ["learn_for_estimator"]


def learn_for_estimator(estimator, X, y, sample_weight, alpha, centers=None):
    """Learn the kernel and penalty of ``estimator`` on centred targets ``y``.

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
        torch.as_tensor(X), y, estimator.kernel_, criterion=estimator.learn_hyperparameters,
        alpha=start, centers=centers, random_state=_seed(estimator),
    )
    estimator.hyperparameters_ = res
    estimator.alpha_ = res.alpha
    estimator.sigma_ = getattr(res.kernel, "sigma", None)
    return res.kernel, res.alpha


def _seed(estimator):
    rs = getattr(estimator, "random_state", None)
    return rs if isinstance(rs, int) else 0
