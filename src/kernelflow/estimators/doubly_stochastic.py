"""Shared machinery of the doubly stochastic estimators (Dai et al. 2014).

The estimators wire :class:`kernelflow.solvers.doubly_stochastic.DoublyStochasticModel` into the
scikit-learn API: epochs of shuffled mini-batches in ``fit``, one in-order pass per chunk in
``partial_fit``, ``warm_start``, validation early stopping and ``random_state``. The fitted state
is only the coefficients (one row per random feature), a few scalars, the seed of the feature
stream and the kernel: no training rows are kept.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, cast

import numpy as np
import torch
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..collectives import all_reduce_sum, is_distributed, local_only, rank
from ..distributed.auto import DISTRIBUTED_CONSTRAINT, gather_all_rows, shared_seed
from ..distributed.fit import bandwidth_rows
from ..distributed.protocol import FitPlan, LocalResult, fit_data_parallel
from ..distributed.sharding import ShardSource, check_consistent
from ..features.random import supports_random_features
from ..kernels import KERNEL_NAMES, Kernel, make_kernel
from ..solvers.doubly_stochastic import (
    DoublyStochasticModel,
    StepSchedule,
    batch_pass,
    run_epochs,
)
from ..sources import ArraySource, DataSource
from ..utils._atomic import AtomicFitMixin
from ..utils._progress import progress
from ..utils._validation import check_X
from ..utils.checkpoint import CHECKPOINT_CONSTRAINTS, arrays_fingerprint, fit_checkpoint
from ..utils.holdout import resolve_seed, split_holdout

logger = logging.getLogger(__name__)

__all__ = ["DoublyStochasticMixin", "DoublyStochasticDataParallel", "DOUBLY_STOCHASTIC_CONSTRAINTS",
           "DATA_PARALLEL_CONSTRAINTS"]

DOUBLY_STOCHASTIC_CONSTRAINTS = {
    "kernel": [StrOptions(set(KERNEL_NAMES) - {"laplacian"}), Kernel],
    "sigma": [Interval(Real, 0, None, closed="neither"), "array-like", StrOptions({"ard"}), None],
    "gamma": [Interval(Real, 0, None, closed="neither"), None],
    "degree": [Interval(Integral, 1, None, closed="left")],
    "coef0": [Interval(Real, 0, None, closed="left")],
    "learning_rate": [StrOptions(set(StepSchedule.KINDS))],
    "eta0": [Interval(Real, 0, None, closed="neither")],
    "decay": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
    "batch_size": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
    "block_size": [Interval(Integral, 2, None, closed="left")],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "max_blocks": [Interval(Integral, 1, None, closed="left"), None],
    "precondition": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"}), None],
    "average": ["boolean", Interval(Integral, 1, None, closed="left")],
    "tol": [Interval(Real, 0, None, closed="left"), None],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "shuffle": ["boolean"],
    "random_state": ["random_state"],
    "warm_start": ["boolean"],
    "verbose": ["verbose"],
    "dtype": [StrOptions({"float32", "float64"})],
    **CHECKPOINT_CONSTRAINTS,
}

#: ``distributed`` of the estimators with a data-parallel fit (regressor, classifier).
DATA_PARALLEL_CONSTRAINTS = {"distributed": DISTRIBUTED_CONSTRAINT}

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: decay of the "inverse_scaling" step per epoch with ``decay="auto"`` in ``fit``, and per
#: iteration in ``partial_fit``
AUTO_DECAY_PER_EPOCH = 0.05
AUTO_DECAY_STREAM = 1e-3


class DoublyStochasticMixin(AtomicFitMixin):
    """fit / partial_fit / prediction for the doubly stochastic estimators.

    Subclasses define ``_loss_name()``, ``_regularisation()``, ``_encode_targets(y, first)``
    (returns the (n, C) target tensor) and ``_n_outputs`` after encoding.
    """

    _has_intercept = True

    # ---- model construction ------------------------------------------------------------------
    def _make_model(self, n_input, n_outputs, kernel, seed, device):
        # decay_ is set by _init_state; model files written before it existed hold decay
        schedule = StepSchedule(self.learning_rate, eta0=self.eta0,
                                decay=getattr(self, "decay_", self.decay))
        return DoublyStochasticModel(
            kernel, n_input, n_outputs, loss=self._loss_object(), alpha=self._regularisation(),
            schedule=schedule, block_size=self.block_size, seed=seed,
            max_blocks=self.max_blocks, precondition=self._precondition(), average=self.average,
            fit_intercept=self._has_intercept and getattr(self, "fit_intercept", False),
            dtype=_DTYPES[self.dtype], device=device,
        )

    def _precondition(self):
        if self.precondition != "auto":
            return self.precondition
        flat = {"epsilon_insensitive", "absolute_error", "quantile"}
        return None if getattr(self, "loss", "novelty") in flat | {"novelty"} else 5.0

    def _resolve_kernel(self, X):
        kernel = self.kernel
        if isinstance(kernel, Kernel):
            kernel = make_kernel(kernel)
        else:
            kernel = make_kernel(kernel, sigma=self.sigma, gamma=self.gamma, degree=self.degree,
                                 coef0=self.coef0, X=X)
        if not supports_random_features(kernel):
            raise ValueError(f"Kernel {kernel!r} has no random-feature map.")
        if self.block_size % 2 and kernel.is_stationary:
            raise ValueError(
                f"block_size must be even for {type(kernel).__name__} (cos/sin pairs), got "
                f"{self.block_size}."
            )
        return kernel

    def _init_state(self, X, *, random_state=None, kernel=None, stream=False):
        """Fresh model state; ``random_state`` and ``kernel`` override the parameters (a
        data-parallel fit passes the seed and bandwidth shared by all processes)."""
        rng = check_random_state(self.random_state if random_state is None else random_state)
        self.kernel_ = self._resolve_kernel(X) if kernel is None else kernel
        self.seed_ = int(rng.randint(np.iinfo(np.int32).max))
        self.batch_size_ = (int(np.clip(X.shape[0] // 16, 32, 1024)) if self.batch_size == "auto"
                            else int(self.batch_size))
        # "auto": in fit, the step of "inverse_scaling" falls by 1/(1 + AUTO_DECAY_PER_EPOCH) per
        # epoch of these rows, whatever their number (the default 20 epochs end at half the
        # step); a stream (partial_fit) has no epochs and gets a fixed per-iteration decay, so
        # that chunks of a stream give the model of the whole stream
        if self.decay != "auto":
            self.decay_ = float(self.decay)
        elif stream:
            self.decay_ = AUTO_DECAY_STREAM
        else:
            self.decay_ = AUTO_DECAY_PER_EPOCH / math.ceil(X.shape[0] / self.batch_size_)
        self._model = self._make_model(X.shape[1], self._n_outputs, self.kernel_, self.seed_,
                                       X.device)
        self.n_iter_ = 0
        self.loss_curve_ = []
        self._store_state()

    def _store_state(self):
        st = self._model.state()
        self.coef_ = st["coef"]
        self.intercept_ = st["intercept"]
        self.t_ = st["t"]
        self.n_blocks_ = st["n_blocks"]
        self.n_features_total_ = st["n_blocks"] * self.block_size
        self.n_averaged_ = st["n_averaged"]
        if self.average:
            self.averaged_coef_ = st.get("averaged_coef", st["coef"])
            self.averaged_intercept_ = st.get("averaged_intercept", st["intercept"])
        if self._model.loss.has_offset:
            self.raw_offset_ = st["offset"]
            self.offset_ = st.get("averaged_offset", st["offset"]) if st["n_averaged"] else \
                st["offset"]

    def _get_model(self):
        m = getattr(self, "_model", None)
        if m is not None and m.t == self.t_ and m.n_blocks == self.n_blocks_:
            return m
        # rebuilt from the stored coefficients (e.g. after unpickling); features regenerate
        m = self._make_model(self.n_features_in_, self.coef_.shape[1], self.kernel_, self.seed_,
                             self.coef_.device)
        state = {"coef": self.coef_, "intercept": self.intercept_, "t": self.t_,
                 "n_blocks": self.n_blocks_, "n_averaged": self.n_averaged_,
                 "offset": getattr(self, "raw_offset_", 0.0)}
        if self.average and hasattr(self, "averaged_coef_"):
            state.update(averaged_coef=self.averaged_coef_,
                         averaged_intercept=self.averaged_intercept_,
                         averaged_offset=getattr(self, "offset_", 0.0))
        self._model = m.load_state(state)
        return m

    def __getstate__(self) -> dict[str, Any]:
        # the estimators derive from scikit-learn's BaseEstimator, which defines __getstate__
        state = dict(cast(Any, super()).__getstate__())  # a copy: it may return __dict__
        state.pop("_model", None)  # the model file holds coefficients only
        return state

    # ---- training loops -----------------------------------------------------------------------
    def _validation_loss(self, model, X, Y, sw):
        if X.shape[0] == 0:  # a data-parallel process holding no validation row
            s = all_reduce_sum(torch.zeros(2, dtype=model.dtype, device=X.device))
            return float(s[0] / s[1].clamp_min(1e-300))
        F = model.decision_function(X, averaged=bool(self.average))
        target = torch.full_like(F, model.current_offset) if model.loss.has_offset else \
            Y.to(F.dtype)
        v = model.loss.value(F, target)
        w = torch.ones_like(v) if sw is None else sw.to(v.dtype)
        s = all_reduce_sum(torch.stack([(v * w).sum(), w.sum()]))
        return float(s[0] / s[1].clamp_min(1e-300))

    def _refuse_parallel_checkpoint(self):
        if getattr(self, "checkpoint", None) is not None:
            raise ValueError("checkpoint is not supported in a data-parallel fit.")

    def _fit(self, X, y, sw):
        """Epochs of shuffled mini-batches on this process's rows; X, y tensors (validated)."""
        # the model all-reduces every batch sum: inside a process group, keep this fit local
        with local_only():
            return self._fit_local(X, y, sw)

    def _fit_local(self, X, y, sw):
        resume = self.warm_start and hasattr(self, "coef_") and getattr(self, "t_", 0) > 0
        Y = self._encode_targets(y, first=not resume)
        if resume:
            if self.coef_.shape[1] != Y.shape[1]:
                raise ValueError("warm_start: the targets changed their number of columns.")
            model = self._get_model()
        else:
            self._init_state(X)
            model = self._model
        rng = check_random_state(self.random_state)
        train, val = np.arange(X.shape[0]), None
        if self.early_stopping:
            # the one holdout rule (kernelflow.utils.holdout): rows chosen by their content
            split = split_holdout(ArraySource(X, None, sw, validate=False),
                                  self.validation_fraction, resolve_seed(self.random_state))
            train, val = cast(np.ndarray, split.train_indices), split.validation_indices
        ckpt = None
        if getattr(self, "checkpoint", None) is not None and not is_distributed():
            ckpt = fit_checkpoint(
                self, "doubly_stochastic", arrays_fingerprint(X, Y, sw), seed=self.seed_,
                kernel=self.kernel_, batch_size=self.batch_size_, decay=self.decay_,
                start=model.training_state()["coef"] if resume else None)
        return self._epochs(model, X, Y, sw, train, val, rng, checkpoint=ckpt)

    def _epochs(self, model, X, Y, sw, train, val, rng, *, offset=0, verbose=None,
                checkpoint=None):
        """Epochs of the solver over the global rows ``train``; ``val`` the global validation
        rows (None: none); this process holds rows ``offset`` to ``offset + len(X)``."""
        self.validation_indices_ = val
        validation_loss = None
        if val is not None:
            lv = _local_rows(val, offset, X.shape[0])
            Xv, Yv, swv = X[lv], Y[lv], None if sw is None else sw[lv]

            def validation_loss():
                return self._validation_loss(model, Xv, Yv, swv)

        # rows of every epoch's batches; early stopping (tol) makes max_iter epochs a bound
        bar = progress(total=self.max_iter * len(train), desc=type(self).__name__, unit="row",
                       verbose=self.verbose if verbose is None else verbose,
                       upper_bound=self.tol is not None)

        def log(train_loss, score):
            self.loss_curve_.append(float(train_loss))
            bar.set_postfix(loss=f"{train_loss:.4g}")
            logger.debug("epoch %d: train loss %.6g, monitored %.6g", len(self.loss_curve_),
                         train_loss, score)

        epochs = range(self.max_iter)
        curve = list(self.loss_curve_)
        self.n_iter_, losses, _ = run_epochs(
            model, X, Y, sw, train, batch_size=int(self.batch_size_), epochs=epochs, rng=rng,
            shuffle=self.shuffle, tol=self.tol, n_iter_no_change=self.n_iter_no_change,
            validation_loss=validation_loss, offset=offset, on_epoch=log, bar=bar,
            checkpoint=checkpoint)
        bar.close()
        self.loss_curve_ = curve + [float(v) for v in losses]  # epochs of a checkpoint too
        self._store_state()
        if checkpoint is not None:
            checkpoint.finish()
        return self

    def _partial_fit(self, X, y, sw):
        with local_only():
            return self._partial_fit_local(X, y, sw)

    def _partial_fit_local(self, X, y, sw):
        first = not hasattr(self, "coef_")
        Y = self._encode_targets(y, first=first)
        if first:
            self._init_state(X, stream=True)
        model = self._get_model()
        if Y.shape[1] != model.n_outputs:
            raise ValueError(
                f"y has {Y.shape[1]} target column(s), the model was started with "
                f"{model.n_outputs}."
            )
        loss = batch_pass(model, X, Y, sw, np.arange(X.shape[0]), int(self.batch_size_))
        self.loss_curve_.append(float(loss))
        self._store_state()
        return self

    # ---- prediction ---------------------------------------------------------------------------
    def _decision(self, X):
        """(f(X), kind) with f of shape (n, C), computed block by block (Algorithm 2)."""
        check_is_fitted(self, "coef_")
        Xt, kind = check_X(self, X, reset=False)
        model = self._get_model()
        F = model.decision_function(Xt, averaged=bool(self.average))
        return F.to(torch.float64) if kind == "numpy" else F, kind


def _local_rows(global_idx, offset: int, n_local: int) -> torch.Tensor:
    """Local row numbers of the global rows this process holds, in the given order."""
    g = np.asarray(global_idx)
    keep = (g >= offset) & (g < offset + n_local)
    return torch.from_numpy(g[keep] - offset)


@dataclass
class _GlobalBatches:
    """A data-parallel plan: this process's validated rows (global positions ``offset`` to
    ``offset + len(X)`` of ``n``), the model, the batch-order generator and the global
    (train, validation) positions; ``partial``: one in-order pass."""

    X: torch.Tensor
    Y: torch.Tensor
    sw: torch.Tensor | None
    offset: int
    n: int
    model: DoublyStochasticModel
    rng: np.random.RandomState
    train: np.ndarray
    val: np.ndarray | None
    partial: bool


class DoublyStochasticDataParallel:
    """The data-parallel protocol (:mod:`kernelflow.distributed.protocol`) of the doubly
    stochastic regressor and classifier: epochs of *global* mini-batches.

    All processes draw the same seed (process 0's when ``random_state`` is None), the same
    bandwidth from rows drawn by global position, the same feature stream, the same holdout
    split and the same permutation of the n global rows; each takes the rows of every batch
    that it holds, and :meth:`DoublyStochasticModel.step` all-reduces the batch sums, so all
    processes take the same steps as a single-process fit. Subclasses define
    ``_shard_targets(X, y, sample_weight) -> (X, Y, sample_weight)`` (validated rows and encoded
    targets of this process's shard).
    """

    def data_parallel_prepare(self, shard: ShardSource) -> FitPlan:
        """Validate this process's rows and decide the shared state (from scratch)."""
        est = cast(Any, self)
        est._refuse_parallel_checkpoint()
        if est.warm_start and hasattr(est, "coef_"):
            raise ValueError("distributed_fit starts from scratch; warm_start is not supported.")
        est._validate_params()
        X, y, sw = shard.local_arrays()
        if y is None:
            raise ValueError("distributed_fit of a doubly stochastic estimator needs targets y.")
        Xt, Y, swt = est._shard_targets(X, y, sw)
        check_consistent("doubly stochastic targets", n_outputs=Y.shape[1])
        shard = ShardSource(ArraySource(Xt, Y, swt, validate=False))
        return self._global_plan(shard, Xt, Y, swt, resume=False, partial=False)

    def data_parallel_step(self, shard: DataSource, plan: FitPlan) -> LocalResult:
        """Epochs (or one in-order pass) of global mini-batches over this process's rows."""
        est, p = cast(Any, self), plan.state
        if p.partial:
            bs = int(getattr(est, "batch_size_", est.batch_size))
            est.loss_curve_.append(float(batch_pass(p.model, p.X, p.Y, p.sw, np.arange(p.n), bs,
                                                    offset=p.offset)))
            est._store_state()
            return LocalResult()
        est._epochs(p.model, p.X, p.Y, p.sw, p.train, p.val, p.rng, offset=p.offset,
                    verbose=est.verbose if rank() == 0 else 0)
        # reduced by the driver: every process has finished before anyone returns
        return LocalResult(sums={"finished": torch.zeros(1)})

    def data_parallel_finish(self, plan: FitPlan, result: LocalResult):
        """The fitted attributes were stored by the step (identical on every process)."""
        return self

    def _global_plan(self, shard: ShardSource, X, Y, sw, *, resume: bool,
                     partial: bool) -> FitPlan:
        """Seed, kernel, model and holdout split shared by all processes (collective)."""
        est = cast(Any, self)
        # the seed and the bandwidth shared by all processes are passed on, never written into
        # the estimator's parameters
        random_state = shared_seed(est.random_state)
        if resume:
            model = est._get_model()
            if Y.shape[1] != model.n_outputs:
                raise ValueError(
                    f"y has {Y.shape[1]} target column(s), the model was started with "
                    f"{model.n_outputs}.")
        else:
            kernel = None
            if est.sigma is None and est.gamma is None and isinstance(est.kernel, str):
                kernel = est._resolve_kernel(bandwidth_rows(shard, X.dtype))
            # _init_state reads the number of rows (batch_size="auto") and the width from its
            # argument: show it a zero-copy view with the global row count
            est._init_state(X.new_zeros(1, X.shape[1]).expand(shard.n_samples, -1),
                            random_state=random_state, kernel=kernel, stream=partial)
            model = est._model
        rng = check_random_state(random_state)
        train, val = np.arange(shard.n_samples), None
        if est.early_stopping and not partial:
            split = split_holdout(shard, est.validation_fraction, resolve_seed(random_state),
                                  rows=gather_all_rows(shard, X, sw), global_positions=True)
            # global positions: never None
            train, val = cast(np.ndarray, split.train_indices), split.validation_indices
        plan = _GlobalBatches(X, Y, sw, shard.offset, shard.n_samples, model, rng, train, val,
                              partial)
        # the feature stream must be the same everywhere (seed drawn from random_state)
        return FitPlan(shared={"feature_seed_from_random_state": float(est.seed_)}, state=plan)

    def _fit_data_parallel(self, X, y, sw, *, partial=False):
        """``fit`` / ``partial_fit`` over the rows of all processes (rank order), collective.

        ``X``, ``y`` (tensor, or class labels for a classifier whose ``classes_`` are set) and
        ``sw`` are this process's validated rows. Equals the single-process call on the
        concatenated rows with the same ``random_state`` (``warm_start`` and ``partial_fit``
        continue from the fitted model, which every process holds).
        """
        est = cast(Any, self)
        est._refuse_parallel_checkpoint()
        if partial:
            resume = hasattr(est, "coef_")
        else:
            resume = est.warm_start and hasattr(est, "coef_") and getattr(est, "t_", 0) > 0
        Y = est._encode_targets(y, first=not resume)
        shard = ShardSource(ArraySource(X, Y, sw, validate=False))
        check_consistent("doubly stochastic targets",
                         y_1d=float(bool(getattr(est, "_y_1d", True))), resume=float(resume))
        plan = self._global_plan(shard, X, Y, sw, resume=resume, partial=partial)
        return fit_data_parallel(cast(Any, self), shard, plan=plan)
