"""Shared pieces of the kernel estimators: kernel construction, centring, prediction."""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..kernels import KERNEL_NAMES, Kernel, make_kernel
from ..operators import KernelOperator, Options
from ..utils._atomic import AtomicFitMixin
from ..utils._finite import check_bandwidth, check_finite_output
from ..utils._validation import check_X, to_output

__all__ = ["KernelEstimatorMixin", "KERNEL_CONSTRAINTS"]

#: Parameter constraints shared by every estimator that takes a kernel.
KERNEL_CONSTRAINTS = {
    "kernel": [StrOptions(set(KERNEL_NAMES)), Kernel],
    "sigma": [Interval(Real, 0, None, closed="neither"), "array-like", StrOptions({"ard"}), None],
    "gamma": [Interval(Real, 0, None, closed="neither"), None],
    "degree": [Interval(Integral, 1, None, closed="left")],
    "coef0": [Interval(Real, -math.inf, math.inf, closed="neither")],  # finite
    "fit_intercept": ["boolean"],
    "options": [Options, None],
}


class KernelEstimatorMixin(AtomicFitMixin):
    """Kernel construction, target centring and kernel prediction for estimators.

    Expects the parameters ``kernel``, ``sigma``, ``gamma``, ``degree``, ``coef0``,
    ``fit_intercept`` and ``options``; ``_kernel_predict`` expects the fitted attributes
    ``kernel_``, ``X_fit_``, ``dual_coef_`` and ``intercept_``.

    ``fit`` (and ``partial_fit`` where defined) of every subclass is all-or-nothing: see
    :class:`kernelflow.utils._atomic.AtomicFitMixin`.
    """

    #: Whether y may have several columns (sets scikit-learn's ``multi_output`` tag).
    _multi_output = True

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = self._multi_output
        tags.target_tags.single_output = True
        return tags

    def _build_kernel(self, X: torch.Tensor, sample_weight: torch.Tensor | None = None) -> Kernel:
        # Rows of zero weight do not count for the default (median-heuristic) bandwidth, so that
        # weighting by integers is the same as repeating rows.
        if sample_weight is not None:
            X = X[sample_weight > 0]
        kernel = make_kernel(
            self.kernel,
            sigma=getattr(self, "sigma", None),
            gamma=getattr(self, "gamma", None),
            degree=getattr(self, "degree", 3),
            coef0=getattr(self, "coef0", 1.0),
            X=X,
        )
        check_bandwidth(kernel)
        return kernel

    def _options(self) -> Options:
        return getattr(self, "options", None) or Options()

    def _center_targets(self, y: torch.Tensor, sample_weight: torch.Tensor | None):
        """Centre y when ``fit_intercept``; returns (centred y, intercept of shape y.shape[1:])."""
        if not getattr(self, "fit_intercept", True):
            return y, torch.zeros(y.shape[1:], dtype=y.dtype, device=y.device)
        if sample_weight is None:
            mean = y.mean(0)
        else:
            w = sample_weight.reshape(-1, *([1] * (y.ndim - 1)))
            mean = (w * y).sum(0) / sample_weight.sum().clamp_min(torch.finfo(y.dtype).tiny)
        return y - mean, mean

    def _operator(self, X: torch.Tensor) -> KernelOperator:
        return KernelOperator(self.kernel_, X.to(self.X_fit_.dtype), self.X_fit_,
                              options=self._options())

    def _kernel_predict(self, X):
        check_is_fitted(self)
        Xt, kind = check_X(self, X, reset=False)
        Xt = Xt.to(device=self.X_fit_.device, dtype=self.X_fit_.dtype)
        out = self._operator(Xt) @ self.dual_coef_ + self.intercept_
        check_finite_output(type(self).__name__, out)
        return to_output(out, kind)
