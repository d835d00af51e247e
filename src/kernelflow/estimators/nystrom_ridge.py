"""Nyström kernel ridge regression for large data (Falkon-class preconditioned CG)."""

from __future__ import annotations

import copy
import logging
import os
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..collectives import all_reduce_sum, broadcast, is_distributed
from ..distributed.auto import DISTRIBUTED_CONSTRAINT, data_parallel, fit_scope, gather_all_rows
from ..distributed.sharding import ShardSource, check_consistent
from ..landmarks import LandmarkSelector, resolve_centers
from ..operators import Options, memory_budget
from ..solvers.hyperparameters import NYSTROM_CRITERIA
from ..solvers.nystrom import nystrom_krr, nystrom_predict, source_moments
from ..solvers.nystrom_eigen_cg import nystrom_eigen_cg
from ..solvers.variance import nystrom_posterior
from ..sources import ArraySource, DataSource, SubsetSource, as_source
from ..typing import ArrayLike, Output
from ..utils._validation import check_X, check_X_y, to_output
from ..utils.checkpoint import CHECKPOINT_CONSTRAINTS, data_fingerprint, fit_checkpoint
from ..utils.holdout import holdout_indices, holdout_stream_mask
from ._base import KERNEL_CONSTRAINTS, KernelEstimatorMixin, fit_random_state
from ._hyperparameters import (
    OPTIMIZER_CONSTRAINTS,
    check_optimizer,
    learn_for_nystrom,
    set_unit_signal_variance,
)
from ._uncertainty import nystrom_log_marginal_likelihood
from ._uncertainty import nystrom_predict as _predict_with_uncertainty

__all__ = ["NystromKernelRidge"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: Constraints shared by the Nyström estimators.
NYSTROM_CONSTRAINTS = {
    "n_components": [Interval(Integral, 1, None, closed="left")],
    "landmarks": [str, LandmarkSelector, "array-like", torch.Tensor],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "warm_start": ["boolean"],
    "dtype": [StrOptions(set(_DTYPES)), None],
    "block_size": [Interval(Integral, 1, None, closed="left"), None],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "distributed": DISTRIBUTED_CONSTRAINT,
    **CHECKPOINT_CONSTRAINTS,
    **KERNEL_CONSTRAINTS,
}


def _prepare_data(estimator, X, y, sample_weight):
    """Validate the training data; returns (source, pool tensor, its sample weight, y is 1-D).

    Array input is validated like any estimator's; a DataSource (or a ``.npy`` path) is used as
    is and only its first rows are inspected here (blocks are checked as they are read).
    """
    if isinstance(X, DataSource | str | os.PathLike):
        source = as_source(X, y, sample_weight)
        if source.n_outputs == 0:
            raise ValueError("the data source has no targets (y).")
        estimator.n_features_in_ = source.n_features
        if hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
        return source, None, None, source.n_outputs == 1
    Xt, yt, sw, _ = check_X_y(estimator, X, y, sample_weight=sample_weight, keep_float32=True)
    return ArraySource(Xt, yt, sw, validate=False), Xt, sw, yt.ndim == 1


def _data_parallel_data(source, pool, sw):
    """The data set of all processes: (ShardSource, global pool or None, its weights).

    Arrays: every process gathers all rows (up to ``GATHER_LIMIT`` values), so centres and the
    median-heuristic bandwidth come from exactly the rows of a single-process fit on the
    concatenated arrays; beyond, or for a DataSource, centres come from a global subsample.
    """
    shard = source if isinstance(source, ShardSource) else ShardSource(source)
    if pool is None:
        return shard, None, None
    rows = gather_all_rows(shard, pool, sw)
    if rows is None:
        logger.info("%d rows x %d features are too many to gather on every process: centres "
                    "are chosen from a global subsample", shard.n_samples, shard.n_features)
        return shard, None, None
    return shard, rows[0], rows[1]


def _candidate_pool(source: DataSource, pool, sw, k, rng):
    """Rows from which centres are chosen: the data (arrays) or a uniform subsample (streams)."""
    if pool is not None:
        return pool if sw is None else pool[sw > 0]
    n = source.n_samples
    m = min(n, max(20 * k, 10000))
    idx = np.sort(rng.choice(n, size=m, replace=False))
    return source.take(idx).to(torch.float64)


def _select_centers(estimator, pool, kernel, rng):
    """Centres from ``estimator.landmarks``; duplicates are removed (they add nothing)."""
    # Selecting from the distinct rows makes integer weights equivalent to repeated rows, and
    # torch.unique sorts them, so the candidates do not depend on the row order either. Given
    # centres do not depend on the pool: skip the sort of all rows.
    landmarks = estimator.landmarks
    if isinstance(landmarks, np.ndarray | torch.Tensor | list | tuple):
        k, pool = None, pool[:1].to(torch.float64)  # only its width and dtype are read
    else:
        pool = torch.unique(pool.to(torch.float64), dim=0)
        k = min(int(estimator.n_components), pool.shape[0])
    seed = int(rng.randint(0, 2**31 - 1))
    C = resolve_centers(landmarks, pool, kernel, k, random_state=seed).centers
    C = torch.unique(C.to(torch.float64), dim=0)
    if is_distributed():  # every process must hold the same centres
        C = broadcast(C.contiguous())
    return C


def _compute_dtype(estimator, X_dtype):
    if estimator.dtype is not None:
        return _DTYPES[estimator.dtype]
    return X_dtype if X_dtype in (torch.float32, torch.float64) else torch.float64


def _resolved_options(estimator, device=None) -> Options:
    opts = estimator.options or Options()
    if opts.memory_budget is None:  # fix the budget once per fit: stable block sizes; on a
        # GPU it is a fraction of the device's free memory
        opts = opts.replace(memory_budget=memory_budget(opts, device))
    return opts


class _StreamHoldout(SubsetSource):
    """The rows of a stream on one side of the holdout rule for streams
    (:func:`kernelflow.utils.holdout.holdout_stream_mask`: a row is held out when the hash of
    its content falls below the fraction); blocks keep their global ``start``."""

    def __init__(self, source: DataSource, fraction: float, seed: int, validation: bool):
        super().__init__(source, keep=None)
        self.fraction, self.seed, self.validation = fraction, seed, validation

    def _mask(self, block):
        m = holdout_stream_mask(block.X, self.fraction, self.seed)
        return m if self.validation else ~m

    def positions(self) -> np.ndarray:
        """Global positions of the rows on this side (one pass over the rows)."""
        parts = [b.start + np.flatnonzero(
            holdout_stream_mask(b.X, self.fraction, self.seed) == self.validation)
            for b in self.source._raw_blocks(1 << 16)]
        return np.sort(np.concatenate(parts)).astype(np.int64) if parts else \
            np.zeros(0, dtype=np.int64)


def _holdout_seed(estimator, rng) -> int:
    """The holdout seed: ``random_state`` itself when it is an integer (so every estimator holds
    out the same rows for the same ``random_state``), else a draw from the fit's generator."""
    drawn = int(rng.randint(0, 2**31 - 1))  # drawn in both cases: the centres stay the same
    rs = estimator.random_state
    return int(rs) if isinstance(rs, Integral) else drawn


def _split(estimator, source, rng):
    """(train, validation) sources when early stopping, else (source, None).

    Rows held in memory are split by :func:`kernelflow.utils.holdout.holdout_indices` (the rule
    of every early-stopped estimator); streamed or sharded rows by
    :func:`kernelflow.utils.holdout.holdout_stream_mask`. Sets ``validation_indices_``.
    """
    if not estimator.early_stopping:
        if hasattr(estimator, "validation_indices_"):
            del estimator.validation_indices_
        return source, None
    seed = _holdout_seed(estimator, rng)
    fraction = float(estimator.validation_fraction)
    pool, sw = getattr(estimator, "_holdout_rows", (None, None))
    gathered = isinstance(source, ShardSource) and pool is not None \
        and pool.shape[0] == source.n_samples
    if isinstance(source, ArraySource) or gathered:
        # rows in memory (for a data-parallel fit, every process's rows gathered in rank order,
        # so the split is the single-process one on the concatenated rows)
        if gathered:
            _, val_idx = holdout_indices(pool, fraction, seed, sample_weight=sw)
        else:
            _, val_idx = holdout_indices(source.X, fraction, seed, y=source.y,
                                         sample_weight=source.sample_weight)
        in_val = np.zeros(source.n_samples, dtype=bool)  # by global position
        in_val[val_idx] = True
        train = SubsetSource(source, lambda s, b: ~in_val[s:s + b])
        val = SubsetSource(source, lambda s, b: in_val[s:s + b])
        estimator.validation_indices_ = np.asarray(val_idx, dtype=np.int64)
    else:
        train = _StreamHoldout(source, fraction, seed, validation=False)
        val = _StreamHoldout(source, fraction, seed, validation=True)
        estimator.validation_indices_ = val.positions()
    counts = torch.tensor([train.n_samples, val.n_samples], dtype=torch.float64)
    if isinstance(source, ShardSource):  # subsets of a shard count this process's rows
        counts = all_reduce_sum(counts)
    if counts.min() == 0:
        raise ValueError(
            f"early_stopping with validation_fraction={estimator.validation_fraction} leaves an "
            f"empty training or validation set for {source.n_samples} samples."
        )
    return train, val


def _nystrom_predict_output(estimator, X):
    check_is_fitted(estimator)
    Xt, kind = check_X(estimator, X, reset=False)
    coef = estimator.dual_coef_
    coef2 = coef.reshape(coef.shape[0], -1)
    f = nystrom_predict(estimator.kernel_, estimator.centers_, coef2, Xt,
                        dtype=_DTYPES[estimator.compute_dtype_], options=estimator.options)
    f = f + estimator.intercept_.reshape(1, -1).to(f.dtype)
    out = f[:, 0] if coef.ndim == 1 else f
    return to_output(out.to(Xt.dtype), kind)


class _NystromBase(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """Data handling, centre selection and prediction shared by the Nyström estimators."""

    def _distributed_fit(self, shard):
        """:func:`kernelflow.distributed.distributed_fit` on a shard: the solvers read the local
        rows and all-reduce every sum over rows."""
        return self.fit(shard)

    def _setup(self, X, y, sample_weight):
        """Shared by the Nyström estimators: data, kernel, centres, dtype, warm-start state."""
        warm = self.warm_start and hasattr(self, "centers_")
        prev = (self.centers_, self.kernel_, self.dual_coef_, self.intercept_,
                getattr(self, "n_features_in_", None)) if warm else None
        source, pool, sw, y_1d = _prepare_data(self, X, y, sample_weight)
        x_dtype = pool.dtype if pool is not None else torch.float64
        if data_parallel(self.distributed, X):
            source, pool, sw = _data_parallel_data(source, pool, sw)
            check_consistent("targets", y_1d=float(y_1d))
        self._y_1d = y_1d
        self._holdout_rows = (pool, sw)  # the global rows in memory, if any, for the holdout
        rng = fit_random_state(self.random_state)
        if warm and prev[4] == source.n_features:
            C, kernel = prev[0], prev[1]
            rng.randint(0, 2**31 - 1)  # keep the split seed where a cold fit would draw it
        else:
            warm = False
            pool_ = _candidate_pool(source, pool, sw, int(self.n_components), rng)
            kernel = self._build_kernel(pool_) if pool is None else self._build_kernel(pool, sw)
            C = _select_centers(self, pool_, kernel, rng)
            sigma = getattr(kernel, "sigma", None)
            if is_distributed() and isinstance(sigma, float | int | np.ndarray):
                # a median-heuristic bandwidth (or sigma="ard") depends on each process's shard:
                # use rank 0's
                s = broadcast(torch.as_tensor(np.atleast_1d(sigma), dtype=torch.float64).clone())
                kernel = copy.copy(kernel)  # never the user's kernel object
                kernel.sigma = float(s[0]) if np.ndim(sigma) == 0 else s.numpy()
        dtype = _compute_dtype(self, x_dtype)
        return source, rng, kernel, C, dtype, (prev if warm else None)

    def predict(self, X: ArrayLike) -> Output:
        """Predict f(x) = K(x, centers_) dual_coef_ + intercept_.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        """
        return _nystrom_predict_output(self, X)


class NystromKernelRidge(_NystromBase):
    """Nyström kernel ridge regression solved by preconditioned conjugate gradients.

    With M centres C (``n_components`` chosen by ``landmarks``), fits f(x) = K(x, C) a + b by
    solving (K_nM^T D K_nM + alpha K_MM) a = K_nM^T D (y - b) (D = sample weights, b the weighted
    mean of y) with conjugate gradients and Falkon's preconditioner (Rudi et al. 2017, eq. 6-9;
    see :mod:`kernelflow.solvers.nystrom`). With all training points as centres this is exact
    kernel ridge regression (K + alpha I) a = y - b. K(X, C) is kept in memory only when it
    takes at most half of the memory budget; otherwise each iteration streams the rows block by
    block, so X may also be a :class:`kernelflow.sources.DataSource` (memory-mapped ``.npy``
    files, chunk streams) larger than memory.

    Cost: O(M^3 + M^2 d) setup, O(n M (d + 2t)) per iteration (usually 10-50 iterations),
    memory O(M^2) plus one row block. Prediction O(m M d).

    Parameters
    ----------
    n_components : int, default=100
        Number of centres M (capped at the number of distinct training rows).
    landmarks : str, LandmarkSelector or array-like of shape (M, n_features), default="uniform"
        Centre selector name (see :mod:`kernelflow.landmarks`), selector object, or the centres.
    alpha : float, default=1.0
        Ridge penalty (scikit-learn's scale), > 0.
    kernel : str or Kernel, default="rbf"
    sigma, gamma : float, default=None
        Bandwidth (median heuristic on the centre candidates when both are None); ``sigma``
        may also be one bandwidth per feature, or "ard" (the median heuristic per feature).
    degree : int, default=3
    coef0 : float, default=1.0
    fit_intercept : bool, default=True
        Centre y by its weighted mean.
    max_iter : int, default=100
        Maximum conjugate-gradient iterations (passes over the data).
    tol : float, default=None
        CG stops when the relative residual of the preconditioned system falls below ``tol`` or
        when the estimated relative error of the solution (the energy of the last four CG
        steps against that of the iterate) stays below ``tol`` for two consecutive passes.
        None means 1e-3 (calibrated
        in ``docs/performance/nystrom.md``: further passes changed the test error by less than
        0.1 %).
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows, keep the iterate with the lowest validation
        error and stop after ``n_iter_no_change`` iterations without improvement (iterations
        act as regularisation).
    validation_fraction : float, default=0.1
        Rows held in memory are split by :func:`kernelflow.utils.holdout.holdout_indices` (the
        same rows as every early-stopped estimator given the same ``random_state``); streamed
        rows by :func:`kernelflow.utils.holdout.holdout_stream_mask`.
    n_iter_no_change : int, default=5
    warm_start : bool, default=False
        Start from the previous fit's centres, kernel and coefficients.
    dtype : {"float32", "float64"} or None, default=None
        Precision of the kernel products (factorisations and accumulations are always float64);
        None follows the input: float32 for float32 arrays (NumPy, all-float32 pandas frames)
        and tensors, float64 otherwise.
    block_size : int, default=None
        Rows per streamed block (default from the memory budget).
    random_state : int, RandomState instance or None, default=None
        Seeds the centre selection and the validation split.
    verbose : int, default=0
        > 0 shows progress bars with one estimate of the time left: the rows of the direct
        solve's Gram pass (and of the variance pass), or the CG passes with residual and
        change; > 1 also logs one line per CG pass.
    options : Options, default=None
        Engine options (memory budget, device, ...).
    distributed : {"auto", "on", "off"} or bool, default="auto"
        Inside an initialised torch.distributed group of several processes ("auto", True or
        "on"), ``fit`` is data-parallel: each process passes its own rows (arrays or a
        DataSource), the processes' rows in rank order are the data set, every sum over rows is
        all-reduced and all processes end with the model of a single-process fit on the
        concatenated rows (see ``docs/distributed.md``). False or "off": each process fits its
        rows alone. A :class:`~kernelflow.distributed.ShardSource` is always data-parallel.
    learn_hyperparameters : {"validation", "nystrom_marginal_likelihood"} or None, default=None
        Learn the bandwidth(s) and ``alpha`` with the centres fixed, by L-BFGS on a held-out
        validation error or on the Nyström (Titsias) marginal likelihood (at most 20000 rows;
        :func:`kernelflow.hyperparameters.learn_hyperparameters`); sets ``sigma_``, ``alpha_``,
        ``signal_variance_``, ``noise_variance_``
        and ``hyperparameters_``. Needs in-memory arrays.
    solver : {"auto", "cg", "direct"}, default="auto"
        "direct" accumulates the Gram matrix of the rows in one pass and solves the M x M
        system densely in the eigenbasis of K_MM (exact, also when K_MM is rank-deficient;
        O(n M^2 + M^3)); when K_MM is ill-conditioned against ``alpha`` the rows are whitened
        before the Gram product, and the residual is checked against the rows (a
        RuntimeWarning and a fallback when it is far above rounding); "cg" runs
        preconditioned conjugate gradients; "auto" solves directly up to 500 centres, picks
        the cheaper from a cost model beyond (direct up to about 1000 centres, CG beyond),
        always CG with ``early_stopping``, and solves directly when a float32 CG run stalls.
        "eigen_cg" (many centres) runs CG with a rank-s eigen-preconditioner built from
        s = min(M, 1000) centres (:mod:`kernelflow.solvers.nystrom_eigen_cg`): setup
        O(M s^2 + s^3) and memory O(M s), no M x M matrix, but more passes than "cg" when
        alpha / n is small against K_MM's spectrum beyond its s-th eigenvalue; no checkpoint.
    compute_variance : bool or {"dtc", "fitc"}, default=False
        One more float64 pass over the rows (O(n M (M + d))) for the predictive variance
        (``predict(X, return_std=True)``) and ``log_marginal_likelihood()``: True or "dtc" for
        the DTC approximation, "fitc" for FITC (exact prior variance at the training points).
    n_restarts_optimizer : int, default=0
        Further L-BFGS runs of ``learn_hyperparameters`` from random starts (log-uniform
        within a factor of 10 of the best screened start, clipped to the bounds, seeded by
        ``random_state``), as in scikit-learn's ``GaussianProcessRegressor``.
    sigma_bounds : (float, float), default=(1e-3, 1e3)
        Bounds of the learned bandwidths, relative to the median-heuristic bandwidth.
    alpha_bounds : (float, float), default=(1e-6, 1e3)
        Bounds of the learned penalty (noise variance relative to the signal variance).
    checkpoint : str or path-like, default=None
        File where the conjugate-gradient state is written every ``checkpoint_interval``
        seconds (atomically, in the safe model-file layout). A fit given a path that holds a
        checkpoint of the same problem (data, parameters, centres) continues from it and ends
        with the model of an uninterrupted fit; one of another problem is refused with a
        ValueError naming what differs. A completed fit deletes the file. The direct solve
        (one pass) is not checkpointed. Needs a fixed ``random_state`` (else the centres
        differ); not with a data-parallel fit. See ``docs/reliability.md``.
    checkpoint_interval : float, default=60
        Least number of seconds between two checkpoint writes (0: after every pass).

    Attributes
    ----------
    centers_ : tensor of shape (M, n_features)
    dual_coef_ : tensor of shape (M,) or (M, n_targets)
    intercept_ : tensor of shape () or (n_targets,)
    kernel_ : Kernel
    n_iter_ : int
        Iterations of every solver that ran (CG passes; 1 per direct solve), summed over
        ``solver_history_``.
    converged_ : bool
        False when CG stopped at ``max_iter`` before meeting ``tol`` (a ConvergenceWarning is
        issued then).
    residual_ : float
        Final relative residual of the preconditioned system.
    solver_ : str
        The solver whose coefficients were kept, "cg", "direct" or "eigen_cg".
    solver_history_ : list of (str, int)
        Every solver that ran, in order, with its iterations: ``[("direct", 1)]`` for a
        direct solve, ``[("cg", 100), ("direct", 1)]`` when a float32 CG run that stalled was
        followed by the direct solve, ``[("direct", 1), ("direct", 1)]`` or
        ``[("direct", 1), ("cg", k)]`` when the residual check of a direct solve failed.
    residual_norms_ : list of float
    validation_scores_ : list of float
        Validation mean squared error per iteration (empty without early stopping).
    best_iteration_ : int
    validation_indices_ : ndarray of shape (n_validation,)
        Sorted positions of the held-out rows (only with ``early_stopping``; for a sharded
        source, this process's held-out rows).
    compute_dtype_ : str
    signal_variance_, noise_variance_ : float or ndarray of shape (n_targets,)
        Gaussian-process signal variance s^2 (prior s^2 k; learned with
        ``learn_hyperparameters``, else 1) and noise variance s^2 ``alpha_`` (else ``alpha``),
        used by ``predict(return_std=True)`` and ``log_marginal_likelihood()``.
    posterior_ : NystromPosterior or None
        DTC or FITC posterior factors (``compute_variance``), see
        :mod:`kernelflow.solvers.variance`.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has feature names that are all strings.

    See Also
    --------
    KernelRidge : exact solve for small n.
    NystromRobustRegressor : absolute / Huber losses on the same engine.

    References
    ----------
    Rudi, Carratino, Rosasco, "FALKON: An optimal large scale kernel method", NeurIPS 2017.
    Meanti, Carratino, Rosasco, Rudi, "Kernel methods through the roof", NeurIPS 2020.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, size=(500, 1))
    >>> y = np.sin(X[:, 0]) + 0.1 * rng.randn(500)
    >>> model = NystromKernelRidge(n_components=50, alpha=0.1, sigma=1.0, random_state=0)
    >>> round(model.fit(X, y).score(X, y), 2)
    0.98
    """

    _parameter_constraints: dict = {
        **NYSTROM_CONSTRAINTS,
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "tol": [Interval(Real, 0, None, closed="neither"), None],
        "learn_hyperparameters": [StrOptions(set(NYSTROM_CRITERIA)), None],
        "solver": [StrOptions({"auto", "cg", "direct", "eigen_cg"})],
        "compute_variance": ["boolean", StrOptions({"dtc", "fitc"})],
        **OPTIMIZER_CONSTRAINTS,
    }

    def __init__(self, n_components=100, *, landmarks="uniform", alpha=1.0, kernel="rbf",
                 sigma=None, gamma=None, degree=3, coef0=1.0, fit_intercept=True, max_iter=100,
                 tol=None, early_stopping=False, validation_fraction=0.1, n_iter_no_change=5,
                 warm_start=False, dtype=None, block_size=None, random_state=None, verbose=0,
                 options=None, distributed="auto", learn_hyperparameters=None,
                 solver="auto", compute_variance=False, n_restarts_optimizer=0,
                 sigma_bounds=(1e-3, 1e3), alpha_bounds=(1e-6, 1e3), checkpoint=None,
                 checkpoint_interval=60.0):
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
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.dtype = dtype
        self.block_size = block_size
        self.random_state = random_state
        self.verbose = verbose
        self.options = options
        self.distributed = distributed
        self.learn_hyperparameters = learn_hyperparameters
        self.solver = solver
        self.compute_variance = compute_variance
        self.n_restarts_optimizer = n_restarts_optimizer
        self.sigma_bounds = sigma_bounds
        self.alpha_bounds = alpha_bounds
        self.checkpoint = checkpoint
        self.checkpoint_interval = checkpoint_interval

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features), DataSource, or path to .npy
            Training inputs; a DataSource carries its own targets and weights.
        y : array-like or tensor of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        with fit_scope(self, X):
            return self._fit(X, y, sample_weight)

    def _fit(self, X, y, sample_weight):
        source, rng, kernel, C, dtype, prev = self._setup(X, y, sample_weight)
        options = _resolved_options(self, C.device)
        t = source.n_outputs
        if self.fit_intercept:
            W, ysum, _ = source_moments(source, block_size=self.block_size)
            intercept = ysum / W
        else:
            intercept = torch.zeros(t, dtype=torch.float64)
        coef0 = None
        if prev is not None and prev[2].reshape(prev[2].shape[0], -1).shape[1] == t:
            coef0 = prev[2].reshape(-1, t).to(torch.float64)
        alpha = float(self.alpha)
        check_optimizer(self)
        for name in ("sigma_", "alpha_", "hyperparameters_"):  # a previous fit's
            self.__dict__.pop(name, None)
        if self.learn_hyperparameters is not None:
            # sets sigma_, alpha_, signal_variance_, noise_variance_, hyperparameters_
            kernel, alpha = learn_for_nystrom(self, source, intercept, kernel, C)
        else:
            set_unit_signal_variance(self, alpha)
        train, val = _split(self, source, rng)
        ckpt = None
        if self.checkpoint is not None:
            if is_distributed():
                raise ValueError("checkpoint is not supported in a data-parallel fit.")
            ckpt = fit_checkpoint(self, "nystrom_cg", data_fingerprint(source), centers=C,
                                  kernel=kernel, alpha=alpha, coef0=coef0)
        if self.solver == "eigen_cg":
            if ckpt is not None:
                raise ValueError("checkpoint is not supported with solver='eigen_cg'.")
            sol = nystrom_eigen_cg(
                train, kernel, C, alpha, y_offset=intercept, coef0=coef0,
                max_iter=self.max_iter, tol=self.tol, validation=val,
                n_iter_no_change=self.n_iter_no_change, dtype=dtype, options=options,
                block_size=self.block_size, verbose=self.verbose,
            )
        else:
            sol = nystrom_krr(
                train, kernel, C, alpha, y_offset=intercept, coef0=coef0,
                max_iter=self.max_iter, tol=self.tol, validation=val, solver=self.solver,
                n_iter_no_change=self.n_iter_no_change, dtype=dtype, options=options,
                block_size=self.block_size, verbose=self.verbose, checkpoint=ckpt,
            )
        if not sol.converged and not sol.stopped_early:
            tol = sol.tolerance
            warnings.warn(
                f"Nyström CG stopped at max_iter={self.max_iter} with relative residual "
                f"{sol.residual:.2e} above tol={tol:.1e}: the model may be inaccurate. Increase "
                f"max_iter, loosen tol, use a larger alpha, dtype='float64', or "
                f"solver='direct'.",
                ConvergenceWarning, stacklevel=2,
            )
        single = t == 1 and self._y_1d
        self.kernel_ = kernel
        self.centers_ = C
        self.dual_coef_ = sol.coef[:, 0].clone() if single else sol.coef
        self.intercept_ = intercept[0].clone() if single else intercept
        self.n_iter_ = sol.n_iter
        self.converged_ = bool(sol.converged)
        self.residual_ = float(sol.residual)
        self.solver_ = sol.solver
        self.solver_history_ = [(str(name), int(k)) for name, k in sol.history]
        self.residual_norms_ = list(sol.residual_norms)
        self.validation_scores_ = list(sol.validation_mse)
        self.best_iteration_ = int(sol.best_iter)
        self.compute_dtype_ = "float32" if dtype == torch.float32 else "float64"
        self.posterior_ = nystrom_posterior(
            train, kernel, C, alpha, y_offset=intercept, options=options,
            block_size=self.block_size,
            method="fitc" if self.compute_variance == "fitc" else "dtc", verbose=self.verbose,
        ) if self.compute_variance else None
        if ckpt is not None:
            ckpt.finish()
        return self

    def predict(self, X, return_std=False, return_cov=False, observation_noise=None):
        """Predict f(x) = K(x, centers_) dual_coef_ + intercept_, optionally with uncertainty.

        The standard deviation / covariance are the DTC or FITC (Nyström) approximation of the
        GP posterior with prior ``signal_variance_`` k and noise variance ``noise_variance_``
        (needs ``compute_variance``; see :mod:`kernelflow.solvers.variance`), with the rule of
        :meth:`KernelRidge.predict`: the latent function's without ``learn_hyperparameters``,
        a new observation's (noise included) with learned hyperparameters.

        Parameters
        ----------
        X : array-like or tensor of shape (n_samples, n_features)
        return_std : bool, default=False
        return_cov : bool, default=False
        observation_noise : bool or None, default=None
            Add ``noise_variance_`` (new observations) or not (the latent function); None:
            True when the hyperparameters were learned, else False.

        Returns
        -------
        y_pred : ndarray or tensor of shape (n_samples,) or (n_samples, n_targets)
        y_std or y_cov : ndarray or tensor, only when requested
        """
        return _predict_with_uncertainty(self, X, return_std, return_cov, super().predict,
                                         observation_noise)

    def log_marginal_likelihood(self):
        """DTC or FITC log marginal likelihood of the centred targets (needs ``compute_variance``).

        Returns
        -------
        float
        """
        return nystrom_log_marginal_likelihood(self)
