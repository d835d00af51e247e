"""Kernel regression on streams by doubly stochastic functional gradients."""

from __future__ import annotations

from numbers import Real

from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions

from ..distributed.auto import data_parallel, fit_scope
from ..solvers.losses import get_loss
from ..typing import ArrayLike, Output
from ..utils._validation import check_X_y, to_output
from .doubly_stochastic import (
    DATA_PARALLEL_CONSTRAINTS,
    DOUBLY_STOCHASTIC_CONSTRAINTS,
    DoublyStochasticDataParallel,
    DoublyStochasticMixin,
)

__all__ = ["DoublyStochasticRegressor"]


class DoublyStochasticRegressor(DoublyStochasticDataParallel, DoublyStochasticMixin,
                                RegressorMixin, BaseEstimator):
    """Kernel regression by doubly stochastic functional gradients (Dai et al. 2014).

    Minimises ``E[l(f(x), y)] + (alpha/2)|f|²_H`` (Eq. 1) over the RKHS of ``kernel``. Each
    iteration takes a mini-batch of ``batch_size`` rows and a new block of ``block_size`` random
    features regenerated from ``(seed, block index)`` and performs Algorithm 1:
    ``α_t = -γ_t mean_i l'(f(x_i), y_i) Φ_t(x_i)`` and ``α_j ← (1 - γ_t alpha) α_j`` for older
    blocks. The model grows by one block per iteration (up to ``max_blocks``) and stores only the
    coefficients: memory O(t · block_size · n_targets), independent of the number of rows and of
    the input dimension.

    Cost: iteration t costs O(batch_size · t · block_size · d) (prediction on the batch with all
    existing blocks); T iterations cost O(b T² r d) in total, prediction O(T r d) per row.

    Parameters
    ----------
    loss : {"squared_error", "huber", "epsilon_insensitive", "absolute_error", "quantile"}, \
default="squared_error"
        ``l(u, y)``; see :mod:`kernelflow.solvers.losses`.
    alpha : float, default=1e-6
        RKHS regularisation ν (the paper's experiments use 1e-6 or 1/n).
    kernel : str or Kernel, default="rbf"
        Any kernel with random features (Gaussian, Laplace, Matérn, Cauchy, linear, polynomial,
        :class:`~kernelflow.features.random.ArcCosine`).
    sigma, gamma : float, default=None
        Bandwidth (or scikit-learn's gamma); with both None the median heuristic on the first
        training chunk.
    degree, coef0 : polynomial kernel parameters, default=3 and 1.0.
    epsilon : float, default=None
        Huber threshold (default 1, the paper's) or SVR tube width (default 0.1).
    quantile : float, default=0.5
        Level τ of the quantile loss.
    learning_rate : {"inverse", "inverse_scaling", "constant"}, default="inverse_scaling"
        ``γ_t = eta0/t``, ``eta0/(1 + decay·t)`` or ``eta0``.
    eta0 : float, default=1.0
        θ or γ₀. With the normalised features (``Φ(x)ᵀΦ(x) ≈ k(x, x) = 1``) a unit step is safe
        for the squared loss; ``"inverse"`` needs ``eta0·alpha`` in (1, 2) or an integer for the
        paper's O(1/t) bound.
    decay : float or "auto", default="auto"
        γ₁ of ``"inverse_scaling"`` (per iteration). ``"auto"`` is 0.05 divided by the number of
        iterations in one epoch of the rows given to ``fit``, so the step falls to half over 20
        epochs whatever the number of rows, and 1e-3 for ``partial_fit`` (a stream has no
        epochs); the value used is ``decay_``.
    batch_size : int or "auto", default="auto"
        Rows per iteration; "auto" is ``clip(n // 16, 32, 1024)`` for the ``n`` rows given to
        ``fit`` (or to the first ``partial_fit`` call).
    block_size : int, default=128
        Random features added per iteration (even for stationary kernels).
    max_iter : int, default=20
        Epochs of ``fit``.
    max_blocks : int, default=None
        Cap on the number of blocks; later iterations revisit block ``(t-1) mod max_blocks``.
    precondition : float, "auto" or None, default="auto"
        Relative ridge c of the block preconditioner ``(H + c·tr(H)/r · I)^{-1}``, ``H = ΦᵀΦ/b``
        the empirical covariance of the new block (Sec. 2.6 of the digest); None gives plain
        Algorithm 1. With it the step fits the batch residual on the new block by ridge
        regression; keep ``eta0 <= 1``. "auto" is 5, except None for the losses without
        curvature (absolute, ε-insensitive, quantile), whose sign gradients it would inflate.
    average : bool or int, default=False
        Predict with the averaged iterate ``(1/t) Σ f_i`` (from iteration ``average`` on).
    fit_intercept : bool, default=True
        Learn an unregularised offset with the same steps (capped at 1).
    tol : float or None, default=1e-4
        Stop when the monitored loss has not improved by ``tol`` for ``n_iter_no_change`` epochs.
    early_stopping : bool, default=False
        Monitor the loss on a held-out ``validation_fraction`` of the rows.
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=5
    shuffle : bool, default=True
        Shuffle the rows at every epoch of ``fit``.
    random_state : int, RandomState instance or None, default=None
        Draws the feature-stream seed, the shuffles and the validation split.
    warm_start : bool, default=False
        Continue from the fitted coefficients (same feature stream) instead of restarting.
    verbose : int, default=0
    dtype : {"float64", "float32"}, default="float64"
        Precision of features and coefficients (float32 is about twice as fast).
    distributed : {"auto", "on", "off"} or bool, default="auto"
        Inside an initialised torch.distributed group of several processes ("auto", True or
        "on"), ``fit`` and ``partial_fit`` are data-parallel: each process passes its own rows,
        the processes' rows in rank order are the data set, every process draws the same
        feature blocks and mini-batches of global rows, the batch gradients are all-reduced,
        and all processes end with the single-process model of the concatenated rows (see
        ``docs/distributed.md``). False or "off": each process fits its rows alone.
    checkpoint : str or path-like, default=None
        File where the training state (coefficients, step counter, the shuffling generator's
        state, losses, monitor) is written after an epoch, every ``checkpoint_interval``
        seconds; random features regenerate from the seed. A ``fit`` given a path holding a
        checkpoint of the same problem (data, parameters, seed) continues from it and ends with
        the model of an uninterrupted fit; one of another problem is refused with a ValueError
        naming what differs. A completed fit deletes the file. Needs a fixed ``random_state``;
        not with a data-parallel fit; ``partial_fit`` ignores it. See ``docs/reliability.md``.
    checkpoint_interval : float, default=60
        Least number of seconds between two checkpoint writes (0: after every epoch).

    Attributes
    ----------
    coef_ : tensor of shape (n_features_total_, n_targets)
        Coefficients of the random features, block-major.
    averaged_coef_ : tensor of shape (n_features_total_, n_targets)
        Only with ``average``.
    intercept_ : tensor of shape (n_targets,)
    kernel_ : Kernel
    seed_ : int
        Seed of the feature stream: block j is regenerated from ``(seed_, j)``.
    t_ : int
        Iterations (mini-batch steps) performed.
    n_blocks_ : int
    n_features_total_ : int
    n_iter_ : int
        Epochs run by the last ``fit``.
    loss_curve_ : list of float
        Mean progressive (before-step) training loss per epoch or ``partial_fit`` call.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    DoublyStochasticClassifier, DoublyStochasticNoveltyDetector

    References
    ----------
    B. Dai et al., "Scalable Kernel Methods via Doubly Stochastic Gradients", NIPS 2014.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(400, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(400)
    >>> model = DoublyStochasticRegressor(sigma=1.0, block_size=32, max_iter=5,
    ...                                   random_state=0).fit(X, y)
    >>> round(model.score(X, y), 1)
    1.0
    """

    _parameter_constraints: dict = {
        "loss": [StrOptions({"squared_error", "huber", "epsilon_insensitive", "absolute_error",
                             "quantile"})],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "epsilon": [Interval(Real, 0, None, closed="left"), None],
        "quantile": [Interval(Real, 0, 1, closed="neither")],
        "fit_intercept": ["boolean"],
        **DOUBLY_STOCHASTIC_CONSTRAINTS,
        **DATA_PARALLEL_CONSTRAINTS,
    }

    def __init__(self, loss="squared_error", *, alpha=1e-6, kernel="rbf", sigma=None, gamma=None,
                 degree=3, coef0=1.0, epsilon=None, quantile=0.5, learning_rate="inverse_scaling",
                 eta0=1.0, decay="auto", batch_size="auto", block_size=128, max_iter=20,
                 max_blocks=None, precondition="auto", average=False, fit_intercept=True, tol=1e-4,
                 early_stopping=False, validation_fraction=0.1, n_iter_no_change=5, shuffle=True,
                 random_state=None, warm_start=False, verbose=0, dtype="float64",
                 distributed="auto", checkpoint=None,
                 checkpoint_interval=60.0):
        self.loss = loss
        self.alpha = alpha
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.epsilon = epsilon
        self.quantile = quantile
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.decay = decay
        self.batch_size = batch_size
        self.block_size = block_size
        self.max_iter = max_iter
        self.max_blocks = max_blocks
        self.precondition = precondition
        self.average = average
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.shuffle = shuffle
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.dtype = dtype
        self.distributed = distributed
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval

    def _loss_object(self):
        return get_loss(self.loss, epsilon=self.epsilon, quantile=self.quantile)

    def _regularisation(self):
        return self.alpha

    def _encode_targets(self, y, first):
        self._y_1d = y.ndim == 1 if first else getattr(self, "_y_1d", y.ndim == 1)
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        if first:
            self._n_outputs = Y.shape[1]
        return Y

    def _shard_targets(self, X, y, sw):
        """Validated rows and (n, t) targets of this process's shard (y 2-D)."""
        Xt, yt, swt, _ = check_X_y(self, X, y[:, 0] if y.shape[1] == 1 else y, reset=True,
                                   sample_weight=sw)
        return Xt, self._encode_targets(yt, first=True), swt

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.non_deterministic = False
        return tags

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None):
        """Fit by ``max_iter`` epochs of shuffled mini-batches (restarts unless ``warm_start``).

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        reset = not (self.warm_start and hasattr(self, "coef_"))
        with fit_scope(self, X):
            X, y, sw, _ = check_X_y(self, X, y, reset=reset, sample_weight=sample_weight)
            if data_parallel(self.distributed, X):
                return self._fit_data_parallel(X, y, sw)
            return self._fit(X, y, sw)

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None):
        """One in-order pass of mini-batches over a chunk of a stream.

        The first call fixes the kernel (median heuristic on this chunk when no bandwidth is
        given), the feature stream and the number of targets; later chunks must have the same
        number of features.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        first = not hasattr(self, "coef_")
        with fit_scope(self, X):
            X, y, sw, _ = check_X_y(self, X, y, reset=first, sample_weight=sample_weight)
            if data_parallel(self.distributed, X):
                return self._fit_data_parallel(X, y, sw, partial=True)
            return self._partial_fit(X, y, sw)

    def predict(self, X: ArrayLike) -> Output:
        """Predict ``f(x) = Σ_j α_jᵀ Φ_j(x) + b`` (Algorithm 2), block by block.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        """
        F, kind = self._decision(X)
        if self._y_1d:
            F = F[:, 0]
        return to_output(F, kind)
