"""Kernel quantile regression by majorise-minimise (KQR-Z / KQR-A)."""

from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING, Literal

import torch
from sklearn.utils._param_validation import Interval

from ..solvers.m_estimators import kernel_quantile_mm
from .huber import _KernelIRLSRegressor

if TYPE_CHECKING:
    from ..kernels import Kernel
    from ..operators import Options
    from ..solvers.m_estimators import MEstimateResult
    from ..typing import ArrayLike

__all__ = ["KernelQuantileRegressor"]


class KernelQuantileRegressor(_KernelIRLSRegressor):
    """Kernel quantile regression, fitted by majorise-minimise.

    Minimises sum_i rho_tau(y_i - f_i) + (alpha_pen / 2) a^T K a with f = K a and the check
    loss rho_tau(r) = (|r| + (2 tau - 1) r) / 2, as the comparator KQR-Z (Zheng 2022) of Allerbo's
    journal version: from a = 0, with r = y - K a, U = diag(1 / (4 (eps + |r|))) and
    v = (y / (eps + |r|) + 2 tau - 1) / 2, iterate

        a <- (2 U K + alpha_pen I)^{-1} v

    (each step minimises a quadratic majoriser of the objective) until ||a_new - a||_2 < tol or
    ``max_iter`` iterations. Cost: O(n^3) per iteration.

    Parameters
    ----------
    alpha : float, default=1.0
        Penalty lambda > 0.
    quantile : float, default=0.5
        Quantile tau in (0, 1) (the paper's grid is {0.25, 0.5, 0.75}).
    epsilon : float, default=1e-5
        Smoothing of |r| in the majoriser.
    kernel : str or Kernel, default="rbf"
        Kernel name or object.
    sigma : float, default=None
        Bandwidth; with ``gamma`` also None, the median heuristic.
    gamma : float, default=None
        scikit-learn's bandwidth parameter, converted to ``sigma``.
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1.0
        Constant of the polynomial kernel.
    fit_intercept : bool, default=True
        Subtract the tau-quantile of y before fitting and add it back when predicting.
    max_iter : int, default=100
        Largest number of MM iterations.
    tol : float, default=1e-5
        Stop when the coefficients move less than ``tol`` (Euclidean norm).
    options : Options, default=None
        Engine options.

    Attributes
    ----------
    dual_coef_ : tensor of shape (n_samples,)
    intercept_ : tensor of shape ()
    weights_ : ndarray of shape (n_samples,)
        Final majoriser weights 1 / (4 (eps + |r_i|)).
    n_iter_ : int
    X_fit_ : tensor of shape (n_samples, n_features)
    kernel_ : Kernel
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    KernelHuberRegressor, KernelTukeyRegressor : robust M-estimators by IRLS.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.quantile import KernelQuantileRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(80, 1))
    >>> y = np.sin(X[:, 0]) + 0.3 * rng.randn(80)
    >>> lo = KernelQuantileRegressor(alpha=0.01, quantile=0.1, sigma=1.0, tol=1e-3)
    >>> lo = lo.fit(X, y)
    >>> hi = KernelQuantileRegressor(alpha=0.01, quantile=0.9, sigma=1.0, tol=1e-3)
    >>> hi = hi.fit(X, y)
    >>> bool(np.all(hi.predict(X) > lo.predict(X)))
    True
    """

    _parameter_constraints: dict = {
        **_KernelIRLSRegressor._parameter_constraints,
        "quantile": [Interval(Real, 0, 1, closed="neither")],
    }

    def __init__(self, alpha: float = 1.0, *, quantile: float = 0.5, epsilon: float = 1e-5,
                 kernel: str | Kernel = "rbf", sigma: ArrayLike | Literal["ard"] | None = None,
                 gamma: float | None = None, degree: int = 3, coef0: float = 1.0,
                 fit_intercept: bool = True, max_iter: int = 100, tol: float = 1e-5,
                 options: Options | None = None) -> None:
        self.alpha = alpha
        self.quantile = quantile
        self.epsilon = epsilon
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.options = options

    def _location(self, y: torch.Tensor) -> torch.Tensor:
        return torch.quantile(y, float(self.quantile))

    def _solve(self, K: torch.Tensor, y: torch.Tensor) -> MEstimateResult:
        return kernel_quantile_mm(K, y, self.alpha, quantile=self.quantile, eps=self.epsilon,
                                  max_iter=self.max_iter, tol=self.tol)
