"""Kernel hyperparameters learned by gradient: bandwidths (scalar or per feature), scales of
composite kernels and the ridge penalty.

:func:`learn_hyperparameters` minimises a differentiable criterion with torch autograd and
L-BFGS: the exact leave-one-out error, GCV or the GP negative log marginal likelihood for exact
kernel ridge regression, a held-out validation error or the Nyström (Titsias) approximate marginal
likelihood for the Nyström model. The estimators expose the same through their
``learn_hyperparameters`` option (``KernelRidge``, ``NystromKernelRidge``); learned values are
fitted attributes (``kernel_``, ``sigma_``, ``alpha_``, and the Gaussian-process signal and noise
variance ``signal_variance_`` and ``noise_variance_`` that ``predict(return_std=True)`` and
``log_marginal_likelihood()`` use). Optimiser options: ``n_restarts_optimizer``,
``sigma_bounds``, ``alpha_bounds``.

Examples
--------
>>> import numpy as np
>>> from kernelflow.estimators import KernelRidge
>>> rng = np.random.RandomState(0)
>>> X = rng.uniform(-2, 2, size=(80, 3))
>>> y = np.sin(2 * X[:, 0]) + 0.05 * rng.randn(80)
>>> model = KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood").fit(X, y)
>>> model.sigma_.shape
(3,)
>>> bool(model.sigma_[0] < model.sigma_[1] and model.sigma_[0] < model.sigma_[2])
True
"""

from .solvers.hyperparameters import (
    CRITERIA,
    EXACT_CRITERIA,
    NYSTROM_CRITERIA,
    HyperparameterResult,
    krr_gcv_error,
    krr_loo_error,
    krr_negative_log_marginal_likelihood,
    learn_hyperparameters,
    nystrom_negative_log_marginal_likelihood,
    nystrom_validation_error,
)

__all__ = [
    "CRITERIA",
    "EXACT_CRITERIA",
    "NYSTROM_CRITERIA",
    "HyperparameterResult",
    "learn_hyperparameters",
    "krr_negative_log_marginal_likelihood",
    "krr_loo_error",
    "krr_gcv_error",
    "nystrom_validation_error",
    "nystrom_negative_log_marginal_likelihood",
]
