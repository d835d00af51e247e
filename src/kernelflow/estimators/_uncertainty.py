"""Predictive standard deviation, covariance and evidence for the ridge estimators.

The maths is in :mod:`kernelflow.solvers.variance`; this module wires it to the fitted
attributes of :class:`~kernelflow.estimators.KernelRidge` and
:class:`~kernelflow.estimators.NystromKernelRidge`. The posterior is factorised for the prior k
and the penalty ``alpha_``; the (co)variance is then scaled by the fitted ``signal_variance_``
s^2 and, for new observations, the noise variance ``noise_variance_`` = s^2 alpha_ is added
(see :mod:`kernelflow.estimators._hyperparameters` for the rule).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from ..operators import KernelOperator
from ..solvers.variance import _kernel_diag, exact_posterior
from ..utils._validation import check_X, to_output

_F64 = torch.float64


def _exact_state(est):
    """The exact posterior of a fitted KernelRidge, factorised once per fit (O(n^3 / 3))."""
    cache = getattr(est, "_posterior_cache", None)
    if cache is not None and cache[0] is est.dual_coef_:
        return cache[1]
    X = est.X_fit_
    K = KernelOperator(est.kernel_, X, options=est._options()).to_dense()
    t = 1 if est.dual_coef_.ndim == 1 else est.dual_coef_.shape[1]
    post = exact_posterior(K, torch.as_tensor(getattr(est, "alpha_", est.alpha), dtype=_F64),
                           sample_weight=getattr(est, "_fit_sample_weight", None), n_targets=t)
    est._posterior_cache = (est.dual_coef_, post)
    return post


def _shape_out(var, single):
    # var: (m, t) or (m, m, t) -> drop the target axis for 1-D targets
    return var[..., 0] if single else var


def _include_noise(est, observation_noise) -> bool:
    """None: the noise is part of the prediction when it was learned (as a ``WhiteKernel`` in
    scikit-learn's GaussianProcessRegressor), not when it is the given penalty (scikit-learn's
    ``alpha``)."""
    if observation_noise is None:
        return getattr(est, "hyperparameters_", None) is not None
    if not isinstance(observation_noise, bool | np.bool_):
        raise TypeError(f"observation_noise must be True, False or None, got "
                        f"{observation_noise!r}.")
    return bool(observation_noise)


def _scale(var, est, t: int, noise: bool, full: bool):
    """var (m, t) or (m, m, t) for the prior k -> for the prior s^2 k, plus the noise variance
    on the (diagonal of the) new observations when ``noise``."""
    s2 = torch.as_tensor(np.asarray(getattr(est, "signal_variance_", 1.0), dtype=np.float64))
    var = var * s2.reshape(-1).expand(t)
    if noise:
        default = np.asarray(getattr(est, "alpha_", est.alpha), dtype=np.float64)
        nv = torch.as_tensor(np.asarray(getattr(est, "noise_variance_", default),
                                        dtype=np.float64)).reshape(-1).expand(t)
        if full:
            var.diagonal(dim1=0, dim2=1).add_(nv[:, None])
        else:
            var = var + nv
    return var


def exact_predict(est, X, return_std: bool, return_cov: bool, observation_noise=None):
    """``predict`` of KernelRidge with scikit-learn's GaussianProcessRegressor convention."""
    if return_std and return_cov:
        raise ValueError("at most one of return_std and return_cov can be requested.")
    noise = _include_noise(est, observation_noise)
    mean = est._kernel_predict(X)
    if not (return_std or return_cov):
        return mean
    Xt, kind = check_X(est, X, reset=False)
    Xt = Xt.to(device=est.X_fit_.device, dtype=est.X_fit_.dtype)
    post = _exact_state(est)
    K_xs = KernelOperator(est.kernel_, est.X_fit_, Xt, options=est._options()).to_dense()
    single = est.dual_coef_.ndim == 1
    t = post.n_targets
    if return_cov:
        k_ss = KernelOperator(est.kernel_, Xt, options=est._options()).to_dense()
        cov = _scale(post.covariance(K_xs, k_ss, full=True), est, t, noise, full=True)
        return mean, to_output(_shape_out(cov, single).to(Xt.dtype), kind)
    var = _scale(post.covariance(K_xs, _kernel_diag(est.kernel_, Xt)), est, t, noise, False)
    return mean, to_output(_shape_out(var, single).sqrt().to(Xt.dtype), kind)


def exact_log_marginal_likelihood(est) -> float:
    check_is_fitted(est)
    return _exact_state(est).log_marginal_likelihood(
        est.dual_coef_, getattr(est, "signal_variance_", None))


def _nystrom_state(est):
    check_is_fitted(est)
    post = getattr(est, "posterior_", None)
    if post is None:
        raise ValueError(
            f"{type(est).__name__} was fitted with compute_variance=False; refit with "
            "compute_variance=True for the predictive variance and the log marginal likelihood."
        )
    return post


def nystrom_predict(est, X, return_std: bool, return_cov: bool, predict,
                    observation_noise=None):
    """``predict`` of NystromKernelRidge with the DTC predictive std / covariance."""
    if return_std and return_cov:
        raise ValueError("at most one of return_std and return_cov can be requested.")
    noise = _include_noise(est, observation_noise)
    if not (return_std or return_cov):
        return predict(X)
    post = _nystrom_state(est)
    mean = predict(X)
    Xt, kind = check_X(est, X, reset=False)
    Xt = Xt.to(_F64)
    C = est.centers_.to(_F64)
    K_cs = KernelOperator(est.kernel_, C, Xt, options=est.options).to_dense()
    single = est.dual_coef_.ndim == 1
    t = 1 if single else est.dual_coef_.shape[1]
    if return_cov:
        k_ss = KernelOperator(est.kernel_, Xt, options=est.options).to_dense()
        cov = _scale(post.covariance(K_cs, k_ss, full=True)[:, :, None].expand(-1, -1, t)
                     .clone(), est, t, noise, full=True)
        return mean, to_output(_shape_out(cov, single).contiguous().to(Xt.dtype), kind)
    var = _scale(post.covariance(K_cs, _kernel_diag(est.kernel_, Xt))[:, None].expand(-1, t),
                 est, t, noise, full=False)
    return mean, to_output(_shape_out(var, single).sqrt().contiguous().to(Xt.dtype), kind)


def nystrom_log_marginal_likelihood(est) -> float:
    return _nystrom_state(est).log_evidence(getattr(est, "signal_variance_", None))
