"""Kernel novelty detection on streams by doubly stochastic functional gradients."""

from __future__ import annotations

from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, OutlierMixin, _fit_context
from sklearn.utils._param_validation import Interval

from ..solvers.losses import NoveltyLoss
from ..typing import ArrayLike, Output
from ..utils._validation import check_X, check_X_y, to_output
from .doubly_stochastic import DOUBLY_STOCHASTIC_CONSTRAINTS, DoublyStochasticMixin

__all__ = ["DoublyStochasticNoveltyDetector"]

_CONSTRAINTS = {k: v for k, v in DOUBLY_STOCHASTIC_CONSTRAINTS.items()}


class DoublyStochasticNoveltyDetector(DoublyStochasticMixin, OutlierMixin, BaseEstimator):
    """One-class kernel novelty detection by doubly stochastic functional gradients.

    Minimises ``E[max(0, τ - f(x))] + (ν/2)|f|²_H - ντ`` jointly over f and the offset τ
    (Dai et al. 2014, Sec. 3; the one-class SVM objective scaled by ν). Each iteration:
    ``α_t = γ_t mean_i 1[f(x_i) < τ] Φ_t(x_i)``, all older blocks shrink by ``1 - γ_t ν`` and
    ``τ ← τ - γ_t (mean_i 1[f(x_i) < τ] - ν)``, starting from τ = 0. At the optimum at most a
    fraction ν of the training rows lies below τ. A row is novel when ``f(x) < τ``.
    Memory O(t · block_size); iteration t costs O(batch_size · t · block_size · d).

    Parameters
    ----------
    nu : float, default=0.1
        ν in (0, 1]: regularisation and the target fraction of outliers.
    kernel, sigma, gamma, degree, coef0, learning_rate, eta0, decay, batch_size, block_size, \
max_iter, max_blocks, precondition, average, tol, early_stopping, validation_fraction, \
n_iter_no_change, shuffle, random_state, warm_start, verbose, dtype, checkpoint, \
checkpoint_interval :
        As in :class:`DoublyStochasticRegressor`, except ``eta0=0.3`` and ``decay=0.1``: the
        offset τ follows a sign-like gradient and needs decreasing steps to settle.

    Attributes
    ----------
    offset_ : float
        τ; ``decision_function = score_samples - offset_``.
    coef_ : tensor of shape (n_features_total_, 1)
    kernel_, seed_, t_, n_blocks_, n_features_total_, n_iter_, loss_curve_ :
        As in :class:`DoublyStochasticRegressor`.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.doubly_stochastic_novelty import (
    ...     DoublyStochasticNoveltyDetector)
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(500, 2)
    >>> det = DoublyStochasticNoveltyDetector(nu=0.1, sigma=1.0, block_size=32,
    ...                                       random_state=0).fit(X)
    >>> det.predict([[0.0, 0.0], [6.0, 6.0]]).tolist()
    [1, -1]
    """

    _parameter_constraints: dict = {
        "nu": [Interval(Real, 0, 1, closed="right")],
        **_CONSTRAINTS,
    }
    _has_intercept = False

    def __init__(self, nu=0.1, *, kernel="rbf", sigma=None, gamma=None, degree=3, coef0=1.0,
                 learning_rate="inverse_scaling", eta0=0.3, decay=0.1, batch_size="auto",
                 block_size=128, max_iter=20, max_blocks=None, precondition=None, average=False,
                 tol=1e-4, early_stopping=False, validation_fraction=0.1, n_iter_no_change=5,
                 shuffle=True, random_state=None, warm_start=False, verbose=0, dtype="float64",
                 checkpoint=None, checkpoint_interval=60.0):
        self.nu = nu
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.decay = decay
        self.batch_size = batch_size
        self.block_size = block_size
        self.max_iter = max_iter
        self.max_blocks = max_blocks
        self.precondition = precondition
        self.average = average
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.shuffle = shuffle
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.dtype = dtype
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval

    def _loss_object(self):
        return NoveltyLoss()

    def _regularisation(self):
        return self.nu

    def _encode_targets(self, y, first):
        if first:
            self._n_outputs = 1
        return torch.zeros(y.shape[0], 1, dtype=torch.float64)

    def _check(self, X, sample_weight, reset):
        if isinstance(X, torch.Tensor):
            Xt, _ = check_X(self, X, reset=reset)
            y = torch.zeros(Xt.shape[0], dtype=Xt.dtype)
        else:
            Xt, _ = check_X(self, X, reset=reset)
            y = np.zeros(Xt.shape[0])
        Xt, y, sw, _ = check_X_y(self, Xt, y, reset=reset, sample_weight=sample_weight)
        return Xt, y, sw

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, sample_weight=None):
        """Fit by ``max_iter`` epochs of shuffled mini-batches (restarts unless ``warm_start``).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        X, y, sw = self._check(X, sample_weight, reset=not (self.warm_start and
                                                            hasattr(self, "coef_")))
        return self._fit(X, y, sw)

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y=None, sample_weight=None):
        """One in-order pass of mini-batches over a chunk of a stream.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        X, y, sw = self._check(X, sample_weight, reset=not hasattr(self, "coef_"))
        return self._partial_fit(X, y, sw)

    def score_samples(self, X: ArrayLike) -> Output:
        """``f(x)``: larger means more typical.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        scores : ndarray or tensor of shape (n_samples,)
        """
        F, kind = self._decision(X)
        return to_output(F[:, 0], kind)

    def decision_function(self, X: ArrayLike) -> Output:
        """``f(x) - τ``: negative for novelties.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        scores : ndarray or tensor of shape (n_samples,)
        """
        F, kind = self._decision(X)
        return to_output(F[:, 0] - self.offset_, kind)

    def predict(self, X: ArrayLike) -> Output:
        """+1 for inliers (``f(x) ≥ τ``), -1 for novelties.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        F, _ = self._decision(X)
        return np.where((F[:, 0] - self.offset_ >= 0).cpu().numpy(), 1, -1)
