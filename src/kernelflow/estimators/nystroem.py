"""Nyström feature map with any landmark selector."""

from __future__ import annotations

from numbers import Integral

import torch
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from ..landmarks import LandmarkSelector, resolve_centers
from ..operators import KernelOperator
from ..typing import ArrayLike, Output
from ..utils._validation import check_X, to_output
from ..utils._warnings import warn_caller
from ._base import KERNEL_CONSTRAINTS, KernelEstimatorMixin, fit_random_state

__all__ = ["Nystroem"]


class Nystroem(ClassNamePrefixFeaturesOutMixin, KernelEstimatorMixin, TransformerMixin,
               BaseEstimator):
    """Nyström approximation of a kernel feature map, with a choice of landmarks.

    Selects ``m = n_components`` landmarks ``C`` with any selector (uniform as in
    scikit-learn's ``Nystroem``, RPCholesky, ridge leverage scores, k-means, continuous
    optimisation, ...) and maps ``x -> k(x, C) K_CC^{-1/2}`` (Williams and Seeger 2001), so
    that ``phi(x)^T phi(x') = k(x, C) K_CC^+ k(C, x')``. ``K_CC^{-1/2}`` comes from an
    eigendecomposition with eigenvalues below ``1e-12 * max`` dropped (the pseudo-inverse).

    Cost: the selector's cost, plus ``O(m^3)`` to fit and ``O(n m d + n m^2)`` to transform.

    Parameters
    ----------
    kernel : str or Kernel, default="rbf"
        Kernel name or object.
    sigma : float, default=None
        Bandwidth; with ``gamma`` also None, the median heuristic on the training inputs.
    gamma : float, default=None
        scikit-learn's bandwidth parameter, converted to ``sigma``.
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1.0
        Constant of the polynomial kernel.
    n_components : int, default=100
        Number of landmarks; reduced to ``n_samples`` (with a warning) when larger.
    landmarks : str, LandmarkSelector or array-like of shape (m, n_features), default="uniform"
        A selector name from :data:`kernelflow.landmarks.SELECTORS`, a selector object, or
        explicit centres (then ``n_components`` is ignored).
    random_state : int, RandomState instance or None, default=None
        Seed of the selector.
    options : Options, default=None
        Engine options (memory budget, device, ...).

    Attributes
    ----------
    components_ : tensor of shape (m, n_features)
        The landmarks.
    component_indices_ : ndarray of shape (m,) or None
        Their rows in the training data (None for k-means or explicit centres).
    normalization_ : tensor of shape (m, r)
        ``K_CC^{-1/2}`` restricted to the ``r`` retained eigen-directions.
    kernel_ : Kernel
        The kernel with its resolved bandwidth.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    kernelflow.landmarks : the selectors and a comparison of their accuracy.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.nystroem import Nystroem
    >>> X = np.random.RandomState(0).randn(200, 3)
    >>> Z = Nystroem(sigma=2.0, n_components=20, landmarks="rpcholesky",
    ...              random_state=0).fit_transform(X)
    >>> Z.shape
    (200, 20)
    """

    _parameter_constraints: dict = {
        "kernel": KERNEL_CONSTRAINTS["kernel"],
        "sigma": KERNEL_CONSTRAINTS["sigma"],
        "gamma": KERNEL_CONSTRAINTS["gamma"],
        "degree": KERNEL_CONSTRAINTS["degree"],
        "coef0": KERNEL_CONSTRAINTS["coef0"],
        "options": KERNEL_CONSTRAINTS["options"],
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "landmarks": [str, LandmarkSelector, "array-like"],
        "random_state": ["random_state"],
    }

    def __init__(self, kernel="rbf", *, sigma=None, gamma=None, degree=3, coef0=1.0,
                 n_components=100, landmarks="uniform", random_state=None, options=None):
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.n_components = n_components
        self.landmarks = landmarks
        self.random_state = random_state
        self.options = options

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike | None = None):
        """Select the landmarks and compute the normalisation.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self : object
        """
        Xt, _ = check_X(self, X, reset=True)
        n = Xt.shape[0]
        k = self.n_components
        explicit = not isinstance(self.landmarks, str | LandmarkSelector)
        if explicit:
            k = None
        elif k > n:
            warn_caller(
                f"n_components={k} > n_samples={n}; using n_components={n}.", UserWarning)
            k = n
        self.kernel_ = self._build_kernel(Xt)
        rs = fit_random_state(self.random_state)
        sel = resolve_centers(self.landmarks, Xt, self.kernel_, k, random_state=rs)
        C = sel.centers.to(dtype=Xt.dtype, device=Xt.device)
        KCC = self.kernel_(C, C)
        s, U = torch.linalg.eigh((KCC + KCC.T) / 2)
        keep = s > 1e-12 * float(s.max().clamp_min(torch.finfo(s.dtype).tiny))
        self.components_ = C
        self.component_indices_ = (
            None if sel.indices is None else sel.indices.detach().cpu().numpy()
        )
        self.normalization_ = U[:, keep] / s[keep].sqrt()
        self._n_features_out = int(self.normalization_.shape[1])
        return self

    def transform(self, X: ArrayLike) -> Output:
        """Map ``X`` to ``k(X, C) K_CC^{-1/2}``.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        X_new : ndarray or tensor of shape (n_samples, r)
            ``r`` is ``n_components`` unless ``K_CC`` is numerically singular.
        """
        check_is_fitted(self)
        Xt, kind = check_X(self, X, reset=False)
        Xt = Xt.to(dtype=self.components_.dtype, device=self.components_.device)
        op = KernelOperator(self.kernel_, Xt, self.components_, options=self._options())
        return to_output(op @ self.normalization_, kind)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags
