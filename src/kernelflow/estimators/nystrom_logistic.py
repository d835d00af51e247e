"""Nyström kernel logistic regression (multinomial) by preconditioned Newton steps."""

from __future__ import annotations

from numbers import Integral, Real
from typing import TYPE_CHECKING, Literal

import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from ..distributed.nystrom_prepare import select_centers
from ..kernels import make_kernel
from ..operators import KernelOperator, Options, memory_budget
from ..solvers.logistic import nystrom_logistic_newton
from ..utils._atomic import AtomicFitMixin
from ..utils._validation import check_X, to_output
from ..utils._warnings import warn_caller
from ._base import KERNEL_CONSTRAINTS
from .kernel_ridge_classifier import encode_labels
from .nystrom_ridge import NYSTROM_CONSTRAINTS

__all__ = ["NystromKernelLogisticRegression"]

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self

    from ..kernels import Kernel
    from ..landmarks import LandmarkSelector
    from ..typing import ArrayLike, Output

_F64 = torch.float64


class NystromKernelLogisticRegression(AtomicFitMixin, ClassifierMixin, BaseEstimator):
    """Multinomial kernel logistic regression on a Nyström subspace, solved by Newton's method.

    Fits c functions f_k(x) = K(x, C) a_k + b_k (c = number of classes, also for two) by
    minimising sum_i w_i [log sum_k exp f_k(x_i) - f_{y_i}(x_i)] + alpha / 2 sum_k ||f_k||_H^2
    with inexact Newton steps whose linear systems are solved by conjugate gradients with a
    Falkon-style preconditioner (see :mod:`kernelflow.solvers.logistic`). ``predict_proba`` is
    the softmax of the scores.

    Cost: O(M^3) once, then per Newton step (usually 4-10) two products with K(X, C) per
    inner iteration, O(n M c) each; K(X, C) is stored when it takes at most half of
    the memory budget, otherwise recomputed tile by tile.

    Parameters
    ----------
    n_components : int, default=100
        Number of centres M (capped at the number of distinct training rows).
    landmarks : str, LandmarkSelector or array-like, default="uniform"
        As in :class:`~kernelflow.estimators.NystromKernelRidge`.
    alpha : float, default=1.0
        RKHS penalty (> 0), on the scale of the summed loss.
    kernel : str or Kernel, default="rbf"
    sigma, gamma : float, default=None
        Bandwidth (median heuristic on the training rows when both are None).
    degree : int, default=3
    coef0 : float, default=1.0
    fit_intercept : bool, default=True
        Unpenalised per-class offsets b.
    max_iter : int, default=50
        Maximum Newton steps.
    tol : float, default=1e-4
        Stop when the gradient norm falls below ``tol`` times its value at zero (scikit-learn's
        ``LogisticRegression`` default is also 1e-4; on the benchmarks of the user guide the
        test log-loss then agrees with the fully converged model's to 3e-5 relative).
    cg_max_iter : int, default=200
        Maximum conjugate-gradient iterations per Newton step.
    random_state : int, RandomState instance or None, default=None
        Seeds the centre selection.
    options : Options, default=None

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    centers_ : tensor of shape (M, n_features)
    dual_coef_ : tensor of shape (M, n_classes)
    intercept_ : tensor of shape (n_classes,)
    kernel_ : Kernel
    n_iter_ : int
        Newton steps taken.
    converged_ : bool
    objective_ : float
        Final value of the objective.
    gradient_norms_ : list of float
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)

    References
    ----------
    Meanti, Carratino, Rosasco, Rudi, "Kernel methods through the roof", NeurIPS 2020.

    Examples
    --------
    >>> from sklearn.datasets import make_moons
    >>> from kernelflow.estimators import NystromKernelLogisticRegression
    >>> X, y = make_moons(300, noise=0.1, random_state=0)
    >>> clf = NystromKernelLogisticRegression(50, alpha=0.1, sigma=0.5, random_state=0)
    >>> round(clf.fit(X, y).score(X, y), 2)
    1.0
    >>> clf.predict_proba(X[:2]).sum(1).round(6)
    array([1., 1.])
    """

    _parameter_constraints: dict = {
        **{k: NYSTROM_CONSTRAINTS[k] for k in ("n_components", "landmarks", "random_state")},
        **KERNEL_CONSTRAINTS,
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "cg_max_iter": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(self, n_components: int = 100, *,
                 landmarks: str | LandmarkSelector | ArrayLike = "uniform", alpha: float = 1.0,
                 kernel: str | Kernel = "rbf", sigma: ArrayLike | Literal["ard"] | None = None,
                 gamma: float | None = None, degree: int = 3, coef0: float = 1.0,
                 fit_intercept: bool = True, max_iter: int = 50, tol: float = 1e-4,
                 cg_max_iter: int = 200, random_state: int | np.random.RandomState | None = None,
                 options: Options | None = None) -> None:
        self.n_components = n_components
        self.landmarks = landmarks
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.cg_max_iter = cg_max_iter
        self.random_state = random_state
        self.options = options

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None) -> Self:
        """Fit the model.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,)
            Class labels (numbers or strings).
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        Xt, labels, sw, self.classes_ = encode_labels(self, X, y, sample_weight)
        Xt = Xt.to(_F64)
        pool = Xt if sw is None else Xt[sw > 0]
        self.kernel_ = make_kernel(self.kernel, sigma=self.sigma, gamma=self.gamma,
                                   degree=self.degree, coef0=self.coef0, X=pool)
        rng = check_random_state(self.random_state)
        C = select_centers(self.landmarks, self.n_components, pool, self.kernel_, rng).to(_F64)
        options = self.options or Options()
        op = KernelOperator(self.kernel_, Xt, C, options=options)
        if Xt.shape[0] * C.shape[0] * 8 <= 0.5 * memory_budget(options):
            Knm = op.to_dense().to(_F64)
            # K^T U as (U^T K)^T: a transposed left operand takes a much slower GEMM path
            matmul, t_matmul = (lambda V: Knm @ V), (lambda U: (U.T @ Knm).T)
        else:
            matmul, t_matmul = op.matmul, op.t_matmul
        K_mm = KernelOperator(self.kernel_, C, options=options).to_dense().to(_F64)
        sol = nystrom_logistic_newton(
            matmul, t_matmul, K_mm, labels.cpu(), len(self.classes_), float(self.alpha),
            sample_weight=sw, fit_intercept=self.fit_intercept, max_iter=self.max_iter,
            tol=self.tol, cg_max_iter=self.cg_max_iter)
        if not sol.converged:
            warn_caller(
                f"Newton's method did not reach tol={self.tol} within max_iter={self.max_iter} "
                f"steps (relative gradient norm "
                f"{sol.gradient_norms[-1] / max(sol.gradient_norms[0], 1e-300):.2e}). "
                f"Increase max_iter or cg_max_iter, loosen tol, or use a larger alpha.",
                ConvergenceWarning)
        self.centers_ = C
        self.dual_coef_ = sol.coef
        self.intercept_ = sol.intercept
        self.n_iter_ = sol.n_iter
        self.converged_ = sol.converged
        self.objective_ = sol.objective
        self.gradient_norms_ = list(sol.gradient_norms)
        return self

    def _scores(self, X):
        check_is_fitted(self)
        Xt, kind = check_X(self, X, reset=False)
        op = KernelOperator(self.kernel_, Xt.to(_F64), self.centers_, options=self.options)
        return op.matmul(self.dual_coef_) + self.intercept_, kind, Xt.dtype

    def decision_function(self, X: ArrayLike) -> Output:
        """Scores f_k(x): shape (n_samples,) for two classes (f_1 - f_0), else
        (n_samples, n_classes).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        scores : ndarray or tensor
        """
        F, kind, dtype = self._scores(X)
        if F.shape[1] == 2:
            F = F[:, 1] - F[:, 0]
        return to_output(F.to(dtype), kind)

    def predict_proba(self, X: ArrayLike) -> Output:
        """Class probabilities, the softmax of the scores.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        proba : ndarray or tensor of shape (n_samples, n_classes)
        """
        F, kind, dtype = self._scores(X)
        return to_output(torch.softmax(F, 1).to(dtype), kind)

    def predict_log_proba(self, X: ArrayLike) -> Output:
        """Logarithm of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        log_proba : ndarray or tensor of shape (n_samples, n_classes)
        """
        F, kind, dtype = self._scores(X)
        return to_output(torch.log_softmax(F, 1).to(dtype), kind)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Most probable class.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        F, _, _ = self._scores(X)
        return self.classes_[F.argmax(1).cpu().numpy()]

