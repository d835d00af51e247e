"""Predictive standard deviation, covariance and evidence for the ridge estimators.

The maths is in :mod:`kernelflow.solvers.variance`; this module wires it to the fitted
attributes of :class:`~kernelflow.estimators.KernelRidge` and
:class:`~kernelflow.estimators.NystromKernelRidge`.
"""

from __future__ import annotations

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


def exact_predict(est, X, return_std: bool, return_cov: bool):
    """``predict`` of KernelRidge with scikit-learn's GaussianProcessRegressor convention."""
    if return_std and return_cov:
        raise ValueError("at most one of return_std and return_cov can be requested.")
    mean = est._kernel_predict(X)
    if not (return_std or return_cov):
        return mean
    Xt, kind = check_X(est, X, reset=False)
    Xt = Xt.to(device=est.X_fit_.device, dtype=est.X_fit_.dtype)
    post = _exact_state(est)
    K_xs = KernelOperator(est.kernel_, est.X_fit_, Xt, options=est._options()).to_dense()
    single = est.dual_coef_.ndim == 1
    if return_cov:
        k_ss = KernelOperator(est.kernel_, Xt, options=est._options()).to_dense()
        cov = _shape_out(post.covariance(K_xs, k_ss, full=True), single)
        return mean, to_output(cov.to(Xt.dtype), kind)
    var = _shape_out(post.covariance(K_xs, _kernel_diag(est.kernel_, Xt)), single)
    return mean, to_output(var.sqrt().to(Xt.dtype), kind)


def exact_log_marginal_likelihood(est) -> float:
    check_is_fitted(est)
    return _exact_state(est).log_marginal_likelihood(est.dual_coef_)


def _nystrom_state(est):
    check_is_fitted(est)
    post = getattr(est, "posterior_", None)
    if post is None:
        raise ValueError(
            f"{type(est).__name__} was fitted with compute_variance=False; refit with "
            "compute_variance=True for the predictive variance and the log marginal likelihood."
        )
    return post


def nystrom_predict(est, X, return_std: bool, return_cov: bool, predict):
    """``predict`` of NystromKernelRidge with the DTC predictive std / covariance."""
    if return_std and return_cov:
        raise ValueError("at most one of return_std and return_cov can be requested.")
    if not (return_std or return_cov):
        return predict(X)
    post = _nystrom_state(est)
    mean = predict(X)
    Xt, kind = check_X(est, X, reset=False)
    Xt = Xt.to(_F64)
    C = est.centers_.to(_F64)
    K_cs = KernelOperator(est.kernel_, C, Xt, options=est.options).to_dense()
    if return_cov:
        k_ss = KernelOperator(est.kernel_, Xt, options=est.options).to_dense()
        cov = post.covariance(K_cs, k_ss, full=True)
        if est.dual_coef_.ndim > 1:
            cov = cov[:, :, None].expand(-1, -1, est.dual_coef_.shape[1])
        return mean, to_output(cov.to(Xt.dtype), kind)
    var = post.covariance(K_cs, _kernel_diag(est.kernel_, Xt))
    if est.dual_coef_.ndim > 1:
        var = var[:, None].expand(-1, est.dual_coef_.shape[1])
    return mean, to_output(var.sqrt().contiguous().to(Xt.dtype), kind)


def nystrom_log_marginal_likelihood(est) -> float:
    return _nystrom_state(est).log_marginal_likelihood
