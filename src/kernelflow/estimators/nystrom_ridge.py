"""Nyström kernel ridge regression for large data (Falkon-class preconditioned CG)."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import torch
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..collectives import all_reduce_sum, is_distributed
from ..distributed.auto import DISTRIBUTED_CONSTRAINT, fit_scope
from ..distributed.nystrom_prepare import COMPUTE_DTYPES, NystromData, prepare_nystrom
from ..distributed.protocol import FitPlan, LocalResult, fit_data_parallel
from ..distributed.sharding import ShardSource
from ..landmarks import LandmarkSelector
from ..solvers.hyperparameters import NYSTROM_CRITERIA
from ..solvers.nystrom import (
    centre_matrices_fit,
    choose_solver,
    kernel_fits,
    nystrom_krr,
    nystrom_predict,
)
from ..solvers.nystrom_eigen_cg import nystrom_eigen_cg, source_default_rank
from ..solvers.variance import nystrom_posterior
from ..sources import DataSource
from ..typing import ArrayLike, Output
from ..utils._validation import check_X, to_output
from ..utils._warnings import warn_caller
from ..utils.checkpoint import CHECKPOINT_CONSTRAINTS, data_fingerprint, fit_checkpoint
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

#: Constraints shared by the Nyström estimators.
NYSTROM_CONSTRAINTS = {
    "n_components": [Interval(Integral, 1, None, closed="left")],
    "landmarks": [str, LandmarkSelector, "array-like", torch.Tensor],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "warm_start": ["boolean"],
    "dtype": [StrOptions(set(COMPUTE_DTYPES)), None],
    "block_size": [Interval(Integral, 1, None, closed="left"), None],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "distributed": DISTRIBUTED_CONSTRAINT,
    **CHECKPOINT_CONSTRAINTS,
    **KERNEL_CONSTRAINTS,
}


def _nystrom_predict_output(estimator, X):
    check_is_fitted(estimator)
    Xt, kind = check_X(estimator, X, reset=False)
    coef = estimator.dual_coef_
    coef2 = coef.reshape(coef.shape[0], -1)
    f = nystrom_predict(estimator.kernel_, estimator.centers_, coef2, Xt,
                        dtype=COMPUTE_DTYPES[estimator.compute_dtype_], options=estimator.options)
    f = f + estimator.intercept_.reshape(1, -1).to(f.dtype)
    out = f[:, 0] if coef.ndim == 1 else f
    return to_output(out.to(Xt.dtype), kind)


class _NystromBase(KernelEstimatorMixin, RegressorMixin, BaseEstimator):
    """The stages of a Nyström fit and prediction, shared by the Nyström estimators.

    A fit is the data-parallel protocol of :mod:`kernelflow.distributed.protocol` run on the
    rows given: prepare (:func:`~kernelflow.distributed.nystrom_prepare.prepare_nystrom`, then
    the estimator's own choices), the solver on this process's rows (every sum over rows
    all-reduced inside it), finish (the fitted attributes).
    """

    def _wants_moments(self) -> bool:
        """Whether prepare computes the weighted moments of the targets (one pass; the solver
        then skips its own when nothing is held out)."""
        return False

    def _prepare(self, X, y=None, sample_weight=None) -> NystromData:
        """The prepare stage: data, kernel, centres, holdout, dtype, warm-start state."""
        return prepare_nystrom(self, X, y, sample_weight,
                               rng=fit_random_state(self.random_state),
                               build_kernel=self._build_kernel, moments=self._wants_moments())

    def _plan(self, X, y=None, sample_weight=None) -> FitPlan:
        """The plan of a fit: the prepare stage plus the estimator's own decisions."""
        raise NotImplementedError

    def _fit_stages(self, X, y, sample_weight):
        """``fit``: the stages of :mod:`kernelflow.distributed.protocol` on the rows given (this
        process's rows of a data-parallel fit, when the ``distributed`` setting says so)."""
        plan = self._plan(X, y, sample_weight)
        return fit_data_parallel(self, plan.state.data.source, plan=plan)

    # ---- the data-parallel protocol (kernelflow.distributed.protocol) --------------------------
    def data_parallel_prepare(self, shard: ShardSource) -> FitPlan:
        """Validate the parameters, then decide data, kernel, centres and holdout from the
        global data set (:func:`kernelflow.distributed.nystrom_prepare.prepare_nystrom`)."""
        self._validate_params()
        return self._plan(shard)

    def data_parallel_step(self, shard: DataSource, plan: FitPlan) -> LocalResult:
        """Run the solver on this process's rows; it all-reduces every sum over rows."""
        raise NotImplementedError

    def data_parallel_finish(self, plan: FitPlan, result: LocalResult):
        """Store the fitted attributes (the same on every process); returns self."""
        raise NotImplementedError

    def _store_common(self, data: NystromData, coef: torch.Tensor, intercept: torch.Tensor):
        """Fitted attributes shared by the Nyström estimators."""
        single = data.source.n_outputs == 1 and data.y_1d
        self.kernel_ = data.kernel
        self.centers_ = data.centers
        self.dual_coef_ = coef[:, 0].clone() if single else coef
        self.intercept_ = intercept[0].clone() if single else intercept
        self.compute_dtype_ = "float32" if data.dtype == torch.float32 else "float64"
        if data.validation_indices is None:
            self.__dict__.pop("validation_indices_", None)
        else:
            self.validation_indices_ = data.validation_indices

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


@dataclass
class _RidgePlan:
    """The plan of a Nyström ridge fit: prepared data, intercept, penalty, warm start and the
    solver that runs (``solver``, or "eigen_cg" for "auto" beyond the memory budget)."""

    data: NystromData
    intercept: torch.Tensor
    alpha: float
    coef0: torch.Tensor | None
    solver: str


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
    solver : {"auto", "cg", "direct", "eigen_cg"}, default="auto"
        "direct" accumulates the Gram matrix of the rows in one pass and solves the M x M
        system densely in the eigenbasis of K_MM (exact, also when K_MM is rank-deficient;
        O(n M^2 + M^3)); when K_MM is ill-conditioned against ``alpha`` the rows are whitened
        before the Gram product, and the residual is checked against the rows (a
        RuntimeWarning and a fallback when it is far above rounding); "cg" runs
        preconditioned conjugate gradients. Both hold M x M float64 matrices and refuse with
        a MemoryError when one of them (8 M^2 bytes) exceeds the memory budget of
        ``options`` (:func:`~kernelflow.solvers.nystrom.centre_matrices_fit`).
        "eigen_cg" (many centres) runs CG with a rank-s eigen-preconditioner built from
        s = ``precond_rank`` centres (:mod:`kernelflow.solvers.nystrom_eigen_cg`; by default
        min(M, 2000), or min(M, 3000) where the cost model finds that its extra setup saves
        more pass time, e.g. from about 1.0e5 rows per process at M = 2e4 with K_nM streamed;
        fewer when 3 M s float64 values exceed a quarter of the budget): setup
        O(M s^2 + s^3) and memory O(M s), no M x M matrix, but more passes than "cg" when
        alpha / n is small against K_MM's spectrum beyond its s-th eigenvalue. "auto" runs
        "eigen_cg" when the M x M matrices do not fit the budget (by that same rule);
        otherwise it solves directly up to 500 centres and beyond picks the cheapest of the
        three by a cost model (:func:`~kernelflow.solvers.nystrom.solver_costs`, constants
        measured on CPU: direct up to about 1000 centres, then CG, then "eigen_cg" from about
        M = 11 500 at 2e4 rows and M = 30 500 at 2e5 rows with K_nM stored); between direct
        and CG, always CG with ``early_stopping``, and solves directly when a float32 CG run
        stalls. ``solver_`` reports the solver that ran.
    precond_rank : int, default=None
        Rank s of the "eigen_cg" preconditioner (capped at M): a larger rank costs O(M s^2)
        more setup and 3 M s float64 values, and saves passes when K_MM's spectrum decays
        slowly against ``alpha``. None: :func:`~kernelflow.solvers.nystrom_eigen_cg.default_rank`.
        The cost model of "auto" prices this rank. Not used by "cg" and "direct".
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
        File where the conjugate-gradient state ("cg" and "eigen_cg") is written every
        ``checkpoint_interval`` seconds (atomically, in the safe model-file layout). A fit
        given a path that holds a
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
        "precond_rank": [Interval(Integral, 1, None, closed="left"), None],
        "compute_variance": ["boolean", StrOptions({"dtc", "fitc"})],
        **OPTIMIZER_CONSTRAINTS,
    }

    def __init__(self, n_components=100, *, landmarks="uniform", alpha=1.0, kernel="rbf",
                 sigma=None, gamma=None, degree=3, coef0=1.0, fit_intercept=True, max_iter=100,
                 tol=None, early_stopping=False, validation_fraction=0.1, n_iter_no_change=5,
                 warm_start=False, dtype=None, block_size=None, random_state=None, verbose=0,
                 options=None, distributed="auto", learn_hyperparameters=None,
                 solver="auto", precond_rank=None, compute_variance=False,
                 n_restarts_optimizer=0, sigma_bounds=(1e-3, 1e3), alpha_bounds=(1e-6, 1e3),
                 checkpoint=None, checkpoint_interval=60.0):
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
        self.precond_rank = precond_rank
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
            return self._fit_stages(X, y, sample_weight)

    def _wants_moments(self) -> bool:
        # the intercept is the weighted mean of y; without a holdout the solver's total weight
        # comes from the same pass
        return bool(self.fit_intercept) or not self.early_stopping

    def _plan(self, X, y=None, sample_weight=None) -> FitPlan:
        """Prepare, then the intercept, the warm start and learned hyperparameters."""
        data = self._prepare(X, y, sample_weight)
        t = data.source.n_outputs
        if self.fit_intercept and data.moments is not None:
            W, ysum, _ = data.moments
            intercept = ysum / W
        else:
            intercept = torch.zeros(t, dtype=torch.float64)
        coef0 = None
        prev = data.warm
        if prev is not None and prev[2].reshape(prev[2].shape[0], -1).shape[1] == t:
            coef0 = prev[2].reshape(-1, t).to(torch.float64)
        alpha = float(self.alpha)
        check_optimizer(self)
        for name in ("sigma_", "alpha_", "hyperparameters_"):  # a previous fit's
            self.__dict__.pop(name, None)
        if self.learn_hyperparameters is not None:
            # sets sigma_, alpha_, signal_variance_, noise_variance_, hyperparameters_
            data.kernel, alpha = learn_for_nystrom(self, data.source, intercept, data.kernel,
                                                   data.centers)
        else:
            set_unit_signal_variance(self, alpha)
        return FitPlan(shared={"centres": float(data.centers.shape[0]), "targets": float(t)},
                       state=_RidgePlan(data, intercept, alpha, coef0, self._route(data)))

    def _precond_rank(self, data: NystromData, stored: bool) -> int:
        """The rank of eigen-CG's preconditioner: ``precond_rank`` capped at M, or the
        solver's own default on this process's rows, K_nM ``stored`` or not
        (:func:`~kernelflow.solvers.nystrom_eigen_cg.source_default_rank`)."""
        M = int(data.centers.shape[0])
        if self.precond_rank is not None:
            return int(min(self.precond_rank, M))
        return source_default_rank(data.train, M, data.options, data.dtype, stored=stored)

    def _route(self, data: NystromData) -> str:
        """``solver``, except "auto": "eigen_cg" where the M x M matrices of "cg" and "direct"
        exceed the memory budget (the rule with which they refuse) or where it is the cheapest
        of the three by :func:`~kernelflow.solvers.nystrom.choose_solver` on any process
        (collective in a data-parallel fit, whose processes may have different rows and
        budgets), else "auto" (the direct solve or PCG, chosen by the solver)."""
        if self.solver != "auto":
            return self.solver
        M, src = int(data.centers.shape[0]), data.train
        short = not centre_matrices_fit(M, data.options)
        stored = kernel_fits(src, M, data.dtype, data.options)
        cheaper = choose_solver(
            int(getattr(src, "n_local", src.n_samples)), M, src.n_features, dtype=data.dtype,
            stored=stored, rank=self._precond_rank(data, stored),
            candidates=("direct", "cg", "eigen_cg"))
        votes = all_reduce_sum(torch.tensor([float(short or cheaper == "eigen_cg")],
                                            dtype=torch.float64))
        return "eigen_cg" if float(votes[0]) > 0 else "auto"

    def _checkpoint(self, p: _RidgePlan):
        """(the fit's checkpoint or None, eigen-CG's rank or None for the solver's default).

        The checkpoint's problem includes the solver that runs ("auto" run as "eigen_cg" keeps
        other vectors than "cg") and eigen-CG's rank (its default follows the budget and the
        storage of K_nM, which may differ when a fit resumes): a checkpoint of another route
        or rank is refused, naming ``solver_run`` or ``precond_rank_run``.
        """
        if self.checkpoint is None:
            return None, self.precond_rank
        if is_distributed():
            raise ValueError("checkpoint is not supported in a data-parallel fit.")
        d, rank = p.data, self.precond_rank
        routed: dict = {"solver_run": p.solver} if p.solver != self.solver else {}
        if p.solver == "eigen_cg":
            rank = self._precond_rank(
                d, kernel_fits(d.train, int(d.centers.shape[0]), d.dtype, d.options))
            routed["precond_rank_run"] = rank
        ckpt = fit_checkpoint(self, "nystrom_cg", data_fingerprint(d.source), centers=d.centers,
                              kernel=d.kernel, alpha=p.alpha, coef0=p.coef0, **routed)
        return ckpt, rank

    def data_parallel_step(self, shard: DataSource, plan: FitPlan) -> LocalResult:
        """Conjugate gradients (or the direct solve) on this process's rows; every sum over
        rows is all-reduced inside the solver. Then the posterior pass (``compute_variance``)."""
        p: _RidgePlan = plan.state
        d = p.data
        if self.compute_variance and not centre_matrices_fit(int(d.centers.shape[0]), d.options):
            raise MemoryError(
                f"compute_variance needs M x M float64 matrices ({d.centers.shape[0]} centres) "
                f"above the memory budget; fit without compute_variance, with fewer centres "
                f"or with a larger budget (options=Options(memory_budget=...)).")
        ckpt, rank = self._checkpoint(p)
        common = dict(y_offset=p.intercept, coef0=p.coef0, max_iter=self.max_iter, tol=self.tol,
                      validation=d.validation, n_iter_no_change=self.n_iter_no_change,
                      dtype=d.dtype, options=d.options, block_size=self.block_size,
                      verbose=self.verbose, moments=d.solver_moments())
        if p.solver == "eigen_cg":
            sol = nystrom_eigen_cg(d.train, d.kernel, d.centers, p.alpha, checkpoint=ckpt,
                                   rank=rank, **common)
        else:
            sol = nystrom_krr(d.train, d.kernel, d.centers, p.alpha, solver=p.solver,
                              checkpoint=ckpt, **common)
        posterior = nystrom_posterior(
            d.train, d.kernel, d.centers, p.alpha, y_offset=p.intercept, options=d.options,
            block_size=self.block_size,
            method="fitc" if self.compute_variance == "fitc" else "dtc", verbose=self.verbose,
        ) if self.compute_variance else None
        if ckpt is not None:
            ckpt.finish()
        return LocalResult(state=(sol, posterior))

    def data_parallel_finish(self, plan: FitPlan, result: LocalResult):
        """Store the coefficients, the solver's history and the posterior; returns self."""
        p: _RidgePlan = plan.state
        sol, posterior = result.state
        if not sol.converged and not sol.stopped_early and sol.stop_reason != "breakdown":
            # a breakdown was reported by the solver with its own remedy: one warning
            warn_caller(
                f"Nyström CG stopped at max_iter={self.max_iter} with relative residual "
                f"{sol.residual:.2e} above tol={sol.tolerance:.1e}: the model may be "
                f"inaccurate. Increase max_iter, loosen tol, use a larger alpha, "
                f"dtype='float64', or solver='direct'.",
                ConvergenceWarning,
            )
        self._store_common(p.data, sol.coef, p.intercept)
        self.n_iter_ = sol.n_iter
        self.converged_ = bool(sol.converged)
        self.residual_ = float(sol.residual)
        self.solver_ = sol.solver
        self.solver_history_ = [(str(name), int(k)) for name, k in sol.history]
        self.residual_norms_ = list(sol.residual_norms)
        self.validation_scores_ = list(sol.validation_mse)
        self.best_iteration_ = int(sol.best_iter)
        self.posterior_ = posterior
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
