"""Kernel gradient flow: the closed-form limit of early-stopped kernel gradient descent."""

from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING, Literal

import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from ..solvers.direct import gradient_flow_spectral, spectrum
from ..utils._validation import check_X, check_X_y, to_output
from ._base import PRECOMPUTED_KERNEL_CONSTRAINTS, KernelEstimatorMixin, check_precomputed

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..kernels import Kernel
    from ..operators import Options
    from ..typing import ArrayLike, Output

__all__ = ["KernelGradientFlow"]


class KernelGradientFlow(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Kernel gradient flow with stopping time ``t``.

    The solution of d alpha/dt = y - K alpha, alpha(0) = 0 (Allerbo Eq. 9-10):
    alpha(t) = K^{-1} (I - exp(-t K)) y = U diag((1 - e^{-t s}) / s) U^T y, with the limit t
    for s = 0, so singular kernels are fine. Stopping time acts as an inverse penalty: with
    t = 1 / lambda it is within 0.0415 ||K^{-1} y||^2 of kernel ridge regression (Prop. 4.1).
    ``momentum`` gamma gives the heavy-ball / Nesterov limit alpha(t / (1 - gamma)).

    Cost: one O(n^3) eigendecomposition; then O(n^2) per stopping time, so
    :meth:`predict_path` evaluates a whole regularisation path at once.

    Parameters
    ----------
    t : float, default=1.0
        Stopping time (> 0).
    momentum : float, default=0.0
        Momentum factor gamma in [0, 1).
    kernel, sigma, gamma, degree, coef0, fit_intercept, options
        As in :class:`KernelRidge`, ``kernel="precomputed"`` included.

    Attributes
    ----------
    dual_coef_ : tensor of shape (n_samples,) or (n_samples, n_targets)
    intercept_ : tensor
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel or "precomputed"
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators import KernelGradientFlow
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(100, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(100)
    >>> model = KernelGradientFlow(t=10.0, sigma=1.0).fit(X, y)
    >>> round(model.score(X, y), 2)
    0.98
    >>> model.predict_path(X[:2], [0.0, 10.0]).shape
    (2, 2)
    """

    _parameter_constraints: dict = {
        "t": [Interval(Real, 0, None, closed="neither")],
        "momentum": [Interval(Real, 0, 1, closed="left")],
        **PRECOMPUTED_KERNEL_CONSTRAINTS,
    }
    _accepts_precomputed = True

    def __init__(self, t: float = 1.0, *, momentum: float = 0.0, kernel: str | Kernel = "rbf",
                 sigma: ArrayLike | Literal["ard"] | None = None, gamma: float | None = None,
                 degree: int = 3, coef0: float = 1.0, fit_intercept: bool = True,
                 options: Options | None = None) -> None:
        self.t = t
        self.momentum = momentum
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.options = options

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None) -> Self:
        """Fit the flow at time ``t``.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the squared loss (the flow of sum_i w_i (y_i - f_i)^2 / 2).

        Returns
        -------
        self : object
        """
        Xt, yt, sw, _ = check_X_y(self, X, y, sample_weight=sample_weight)
        if self._precomputed():
            check_precomputed(self, Xt, fit=True)
        self.kernel_ = self._build_kernel(Xt, sw)
        self.X_fit_ = Xt
        yc, self.intercept_ = self._center_targets(yt, sw)
        self._fit_sw = sw
        self._yc = yc
        self._spec = None
        self.dual_coef_ = self.coef_path([self.t])[0]
        return self

    def _spectrum(self):
        if getattr(self, "_spec", None) is None:
            K = self._operator(self.X_fit_).to_dense()
            self._spec = spectrum(K, getattr(self, "_fit_sw", None))
        return self._spec

    def coef_path(self, times: ArrayLike) -> torch.Tensor:
        """Dual coefficients alpha(t) for each time; shape (len(times), n[, n_targets])."""
        check_is_fitted(self)
        s, U = self._spectrum()
        yc = getattr(self, "_yc", None)
        if yc is None:  # e.g. after loading a model file: recover K alpha = f from the flow
            raise AttributeError("coef_path needs the training targets; refit the model.")
        return gradient_flow_spectral(s, U, yc, times, momentum=self.momentum,
                                      sample_weight=getattr(self, "_fit_sw", None))

    def predict_path(self, X: ArrayLike, times: ArrayLike) -> Output:
        """Predictions at every stopping time; shape (n_samples, len(times)[, n_targets])."""
        check_is_fitted(self)
        Xt, kind = check_X(self, X, reset=False)
        if self._precomputed():
            check_precomputed(self, Xt, fit=False)
        Xt = Xt.to(device=self.X_fit_.device, dtype=self.X_fit_.dtype)
        C = self.coef_path(times)  # (m, n[, t])
        m = C.shape[0]
        C2 = C.reshape(m, C.shape[1], -1).permute(1, 0, 2).reshape(C.shape[1], -1)
        P = self._operator(Xt) @ C2  # (n_test, m * t)
        P = P.reshape(Xt.shape[0], m, *C.shape[2:]) + self.intercept_
        return to_output(P, kind)

    def predict(self, X: ArrayLike) -> Output:
        """Predict at the stopping time ``t``.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        """
        return self._kernel_predict(X)
