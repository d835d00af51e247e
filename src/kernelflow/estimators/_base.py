"""Shared pieces of the kernel estimators: kernel construction, centring, prediction."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..kernels import KERNEL_NAMES, Kernel, make_kernel
from ..operators import DenseOperator, KernelOperator, LinearOperator, Options
from ..utils._atomic import AtomicFitMixin
from ..utils._finite import check_bandwidth, check_finite_output
from ..utils._validation import check_X, to_output

__all__ = [
    "KernelEstimatorMixin",
    "KERNEL_CONSTRAINTS",
    "PRECOMPUTED",
    "PRECOMPUTED_KERNEL_CONSTRAINTS",
    "fit_random_state",
    "resolve_kernel",
]

#: The ``kernel`` value meaning "X is the kernel matrix" (scikit-learn's convention).
PRECOMPUTED = "precomputed"

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

#: The same, for estimators that also accept ``kernel="precomputed"``.
PRECOMPUTED_KERNEL_CONSTRAINTS = {
    **KERNEL_CONSTRAINTS,
    "kernel": [StrOptions(set(KERNEL_NAMES) | {PRECOMPUTED}), Kernel],
}


def resolve_kernel(kernel, *, sigma=None, gamma=None, degree=3, coef0=1.0, X=None,
                   sample_weight=None, allow_precomputed: bool = False):
    """The one place that turns an estimator's kernel parameters into a kernel.

    Parameters
    ----------
    kernel : str or Kernel
        A name in :data:`kernelflow.kernels.KERNEL_NAMES`, a kernel object (returned as is; then
        ``sigma`` and ``gamma`` must be None) or ``"precomputed"``.
    sigma : float, array-like of shape (n_features,), "ard" or None
        Bandwidth; None (with ``gamma`` None) is the median heuristic on ``X``.
    gamma : float or None
        scikit-learn's bandwidth parameter, converted to ``sigma`` by the kernel class.
    degree, coef0 : polynomial kernel parameters.
    X : tensor of shape (n_samples, n_features), optional
        Training inputs, for the median heuristic and the ARD length check.
    sample_weight : tensor of shape (n_samples,), optional
        Rows of zero weight do not count for the median heuristic (weighting by integers is
        the same as repeating rows).
    allow_precomputed : bool, default=False
        Whether ``"precomputed"`` is accepted (then returned as the string).

    Returns
    -------
    Kernel or "precomputed"

    Examples
    --------
    >>> resolve_kernel("rbf", gamma=0.5)
    Gaussian(sigma=1.0)
    >>> resolve_kernel("precomputed", allow_precomputed=True)
    'precomputed'
    """
    if isinstance(kernel, str) and kernel == PRECOMPUTED:
        if not allow_precomputed:
            raise ValueError("kernel='precomputed' is not supported by this estimator.")
        if sigma is not None or gamma is not None:
            raise ValueError("sigma and gamma must be None with kernel='precomputed'.")
        return PRECOMPUTED
    if X is not None and sample_weight is not None:
        X = X[sample_weight > 0]
    out = make_kernel(kernel, sigma=sigma, gamma=gamma, degree=degree, coef0=coef0, X=X)
    check_bandwidth(out)
    return out


def fit_random_state(random_state) -> np.random.RandomState:
    """The generator a fit draws from. A user's ``RandomState`` is copied, never advanced: no
    fit changes its estimator's parameters, and two fits with the same parameters agree.

    Examples
    --------
    >>> rs = np.random.RandomState(0)
    >>> before = rs.get_state()[1].copy()
    >>> _ = fit_random_state(rs).rand()
    >>> bool((rs.get_state()[1] == before).all())
    True
    """
    if isinstance(random_state, np.random.RandomState):
        return copy.deepcopy(random_state)
    return check_random_state(random_state)


def check_precomputed(estimator, K, *, fit: bool) -> None:
    """Refuse a kernel matrix of the wrong shape: (n, n) to fit, (m, n_train) to predict.

    Runs after the generic input validation (finite values, 2-D, number of columns).
    """
    shape = tuple(K.shape)
    if fit and shape[0] != shape[1]:
        raise ValueError(
            f"With kernel='precomputed', X must be the square training kernel matrix of shape "
            f"(n_samples, n_samples), found shape {shape}.")
    n_train = getattr(estimator, "n_features_in_", None)
    if not fit and n_train is not None and shape[1] != n_train:
        raise ValueError(
            f"With kernel='precomputed', X must be the kernel between the test points and the "
            f"{n_train} training points, of shape (n_test, {n_train}); found shape {shape}.")


class KernelEstimatorMixin(AtomicFitMixin):
    """Kernel construction, target centring and kernel prediction for estimators.

    Expects the parameters ``kernel``, ``sigma``, ``gamma``, ``degree``, ``coef0``,
    ``fit_intercept`` and ``options``; ``_kernel_predict`` expects the fitted attributes
    ``kernel_``, ``X_fit_``, ``dual_coef_`` and ``intercept_``.

    ``fit`` (and ``partial_fit`` where defined) of every subclass is all-or-nothing: see
    :class:`kernelflow.utils._atomic.AtomicFitMixin`.
    """

    # parameters and fitted attributes the subclasses provide (declared for type checkers)
    kernel: Any
    kernel_: Any
    X_fit_: Any
    get_params: Callable[..., dict]

    #: Whether y may have several columns (sets scikit-learn's ``multi_output`` tag).
    _multi_output = True

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = self._multi_output
        tags.target_tags.single_output = True
        tags.input_tags.pairwise = self._precomputed()
        return tags

    #: Whether ``kernel="precomputed"`` is accepted.
    _accepts_precomputed = False

    def _precomputed(self) -> bool:
        return self._accepts_precomputed and isinstance(self.kernel, str) and \
            self.kernel == PRECOMPUTED

    def _kernel_params(self) -> dict:
        """The kernel parameters this estimator has (its constructor's), by name."""
        params = self.get_params(deep=False)
        return {k: params[k] for k in ("sigma", "gamma", "degree", "coef0") if k in params}

    def _build_kernel(self, X: torch.Tensor, sample_weight: torch.Tensor | None = None):
        """The fitted kernel from the parameters (see :func:`resolve_kernel`)."""
        return resolve_kernel(self.kernel, **self._kernel_params(), X=X,
                              sample_weight=sample_weight,
                              allow_precomputed=self._accepts_precomputed)

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

    def _operator(self, X: torch.Tensor) -> LinearOperator:
        """K(X, X_fit) as an operator; with a precomputed kernel, X itself."""
        if self._precomputed():
            return DenseOperator(X.to(self.X_fit_.dtype), options=self._options())
        return KernelOperator(self.kernel_, X.to(self.X_fit_.dtype), self.X_fit_,
                              options=self._options())

    def _kernel_predict(self, X):
        check_is_fitted(self)
        Xt, kind = check_X(self, X, reset=False)
        if self._precomputed():
            check_precomputed(self, Xt, fit=False)
        Xt = Xt.to(device=self.X_fit_.device, dtype=self.X_fit_.dtype)
        out = self._operator(Xt) @ self.dual_coef_ + self.intercept_
        check_finite_output(type(self).__name__, out)
        return to_output(out, kind)
