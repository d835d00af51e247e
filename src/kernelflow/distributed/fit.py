"""Fit an estimator data-parallel: every process holds a shard of the rows, all get one model.

Inside an initialised group (``torchrun`` or :func:`kernelflow.distributed.launch.spawn`) the
estimators' own ``fit`` is data-parallel (``distributed="auto"``, see :mod:`.auto`): every
process calls ``fit`` with its rows. :func:`distributed_fit` does the same for any shard
(``.npy``, Parquet, a DataSource) whatever the estimator's ``distributed`` setting:

* Nyström estimators (:class:`~kernelflow.estimators.nystrom_ridge.NystromKernelRidge`,
  :class:`~kernelflow.estimators.nystrom_robust.NystromRobustRegressor`) run their own fit on a
  :class:`~kernelflow.distributed.sharding.ShardSource`. The solvers read only the local rows and
  all-reduce every sum over rows: per conjugate-gradient iteration one (M x t) block
  K_nM^T D K_nM v; per gradient step the gradient, the loss and the residual histogram; the
  validation loss of early stopping. Centres are drawn from the global data set (the same on
  every process) and the preconditioner is built from them on every process, identically, so
  nothing else travels.
* Doubly stochastic estimators run their epochs over *global* mini-batches: all processes draw
  the same permutation of the n global rows from ``random_state``, and each takes the rows of
  every batch that it holds. Every process regenerates the same random-feature block from the
  shared seed, the batch gradient is all-reduced inside
  :meth:`DoublyStochasticModel.step`, so all processes take the same step, and the result equals
  the single-process fit with the same seeds.

A collective that fails (a process died, or did not answer within the group's timeout) raises
:class:`~kernelflow.distributed.launch.DistributedError` naming this process and the cause.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.distributed as dist
from sklearn.utils import check_random_state

from ..collectives import all_reduce_sum, is_distributed, rank, world_size
from ..solvers.doubly_stochastic import batch_pass
from ..sources import ArraySource, DataSource
from ..utils._validation import check_X_y
from ..utils.holdout import holdout_indices, holdout_stream_mask, resolve_seed
from . import auto
from .auto import collective_errors, shared_seed
from .sharding import ShardSource, check_consistent

__all__ = ["distributed_fit", "as_shard"]

logger = logging.getLogger(__name__)

#: Rows gathered (by global position, from the processes holding them) to resolve a bandwidth by
#: the median heuristic when a doubly stochastic estimator has neither sigma nor gamma.
_BANDWIDTH_ROWS = 2000


def as_shard(X, y=None, sample_weight=None) -> ShardSource:
    """This process's rows as a :class:`ShardSource` (collective).

    ``X`` may be a ShardSource (returned as is), any other DataSource, or arrays holding this
    process's rows (in rank order: process 0 holds the first rows).

    Examples
    --------
    >>> import numpy as np
    >>> as_shard(np.zeros((4, 2)), np.zeros(4)).n_samples
    4
    """
    if isinstance(X, ShardSource):
        if y is not None or sample_weight is not None:
            raise ValueError("a ShardSource carries its own y and sample_weight; pass y=None.")
        return X
    if isinstance(X, DataSource):
        if y is not None or sample_weight is not None:
            raise ValueError("a DataSource carries its own y and sample_weight; pass y=None.")
        return ShardSource(X)
    return ShardSource(ArraySource(X, y, sample_weight))


def distributed_fit(estimator, X, y=None, sample_weight=None):
    """Fit ``estimator`` on the union of all processes' shards; returns it (same on every rank).

    Collective: every process of the group calls it with the same estimator parameters and its
    own rows. On a single process (no group) it is the ordinary fit on ``X``.

    Parameters
    ----------
    estimator : NystromKernelRidge, NystromRobustRegressor, DoublyStochasticRegressor or
        DoublyStochasticClassifier
    X : ShardSource, DataSource, or array-like of this process's rows
        See :func:`as_shard`; :mod:`kernelflow.distributed.sharding` builds shards from arrays,
        ``.npy`` files and Parquet.
    y, sample_weight : array-like, optional
        This process's targets and weights when ``X`` is an array.

    Returns
    -------
    estimator : object
        Fitted. Coefficients agree with a single-process fit on all rows with the same
        parameters up to floating-point reassociation of the sums (about 1e-12 relative).

    Notes
    -----
    Cost per process: the single-process cost with n replaced by the local row count, plus one
    all-reduce per pass (Nyström: an (M, t) float64 block per iteration; doubly stochastic: an
    (r, C) block per mini-batch). With ``sigma=None`` the median heuristic of a doubly
    stochastic estimator sees all rows (gathered on every process) when there are at most
    :data:`~kernelflow.distributed.auto.GATHER_LIMIT` values, as a single-process fit on arrays
    does; beyond, 2000 rows drawn by global position, the same on every process. A Nyström
    estimator given a shard draws its centre candidates from the global rows as on a DataSource.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-3, 3, (200, 1)); y = np.sin(X[:, 0])
    >>> model = distributed_fit(NystromKernelRidge(20, alpha=1e-3, sigma=1.0, random_state=0),
    ...                         X, y)
    >>> round(model.score(X, y), 3)
    1.0
    """
    name = type(estimator).__name__
    fit_shard = getattr(estimator, "_distributed_fit", None)
    if fit_shard is not None:
        with collective_errors(f"{name}.fit"):
            return fit_shard(as_shard(X, y, sample_weight))
    raise TypeError(
        f"{name} has no data-parallel fit; use NystromKernelRidge, NystromRobustRegressor, "
        "DoublyStochasticRegressor or DoublyStochasticClassifier."
    )


# ---- doubly stochastic: global mini-batches ----------------------------------------------------
def _global_kernel(estimator, shard: ShardSource, dtype: torch.dtype = torch.float64):
    """The kernel from rows drawn by global position (same rows, same kernel on every rank).

    Up to :data:`~kernelflow.distributed.auto.GATHER_LIMIT` values the rows are all rows, so the
    median heuristic sees what a single-process fit on the concatenated data sees; beyond, a
    uniform sample of ``_BANDWIDTH_ROWS`` global rows. None when no heuristic is needed.
    """
    if estimator.sigma is not None or estimator.gamma is not None or not isinstance(
            estimator.kernel, str):
        return None
    n = shard.n_samples
    if n * (shard.n_features + 1) <= auto.GATHER_LIMIT:
        idx = np.arange(n)
    else:
        idx = np.sort(np.random.RandomState(0).choice(n, size=min(n, _BANDWIDTH_ROWS),
                                                      replace=False))
    return estimator._resolve_kernel(shard.take(idx).to(dtype))


def _labels_union(y_np: np.ndarray) -> np.ndarray:
    """Sorted union of the class labels of all processes (labels travel as objects)."""
    local = np.unique(y_np)
    if not is_distributed():
        return local
    gathered: list = [None] * world_size()
    dist.all_gather_object(gathered, local.tolist())
    return np.unique(np.concatenate([np.asarray(g, dtype=local.dtype) for g in gathered]))


def fit_doubly_stochastic_shard(est, shard: ShardSource):
    """:func:`distributed_fit` of a doubly stochastic estimator on a shard (from scratch)."""
    if est.warm_start and hasattr(est, "coef_"):
        raise ValueError("distributed_fit starts from scratch; warm_start is not supported.")
    est._validate_params()
    X, y, sw = shard.local_arrays()
    if y is None:
        raise ValueError("distributed_fit of a doubly stochastic estimator needs targets y.")
    if hasattr(est, "_set_classes"):
        Xt, y_np, swt = est._check(X, (y[:, 0] if y.shape[1] == 1 else y).numpy(), sw,
                                   reset=True)
        est._set_classes(y_np, _labels_union(y_np))
        Y = est._encode_targets(y_np, first=True)
    else:
        y1 = y[:, 0] if y.shape[1] == 1 else y
        Xt, yt, swt, _ = check_X_y(est, X, y1, reset=True, sample_weight=sw)
        Y = est._encode_targets(yt, first=True)
    check_consistent("doubly stochastic targets", n_outputs=Y.shape[1])
    return global_batch_fit(est, shard, Xt, Y, swt, resume=False)


def fit_doubly_stochastic_arrays(est, X: torch.Tensor, y, sample_weight=None, *,
                                 partial: bool = False):
    """Data-parallel ``fit`` / ``partial_fit`` of a doubly stochastic estimator (collective).

    ``X``, ``y`` (tensor, or class labels for a classifier whose ``classes_`` are set) and
    ``sample_weight`` are this process's validated rows; the processes' rows, in rank order,
    are the data set. Equals the single-process call on the concatenated rows with the same
    ``random_state`` (``warm_start`` and ``partial_fit`` continue from the fitted model, which
    every process holds).
    """
    if partial:
        resume = hasattr(est, "coef_")
    else:
        resume = est.warm_start and hasattr(est, "coef_") and getattr(est, "t_", 0) > 0
    Y = est._encode_targets(y, first=not resume)
    shard = ShardSource(ArraySource(X, Y, sample_weight, validate=False))
    check_consistent("doubly stochastic targets",
                     y_1d=float(bool(getattr(est, "_y_1d", True))), resume=float(resume))
    return global_batch_fit(est, shard, X, Y, sample_weight, resume=resume, partial=partial)


def global_batch_fit(est, shard: ShardSource, Xt, Y, swt, *, resume: bool,
                     partial: bool = False):
    """Epochs (or, with ``partial``, one in-order pass) of global mini-batches.

    All processes draw the same permutation of the n global rows; each takes the rows of every
    batch that it holds, and :meth:`DoublyStochasticModel.step` all-reduces the batch sums.
    """
    # the seed and the bandwidth shared by all processes are passed on, never written into the
    # estimator's parameters
    random_state = shared_seed(est.random_state)
    if resume:
        model = est._get_model()
        if Y.shape[1] != model.n_outputs:
            raise ValueError(
                f"y has {Y.shape[1]} target column(s), the model was started with "
                f"{model.n_outputs}.")
    else:
        # _init_state reads the number of rows (batch_size="auto") and the width from its
        # argument: show it a zero-copy view with the global row count
        est._init_state(Xt.new_zeros(1, Xt.shape[1]).expand(shard.n_samples, -1),
                        random_state=random_state, kernel=_global_kernel(est, shard, Xt.dtype),
                        stream=partial)
        model = est._model
    rng = check_random_state(random_state)
    # the feature stream must be the same everywhere
    check_consistent("random_state (the feature-stream seeds drawn from it)",
                     seed=float(est.seed_))
    n, off = shard.n_samples, shard.offset
    bs = int(getattr(est, "batch_size_", est.batch_size))
    if partial:
        est.loss_curve_.append(float(batch_pass(model, Xt, Y, swt, np.arange(n), bs,
                                                offset=off)))
        est._store_state()
        return est
    train, val = np.arange(n), None
    if est.early_stopping:
        train, val = _holdout(est, shard, Xt, swt, random_state)
    est._epochs(model, Xt, Y, swt, train, val, rng, offset=off,
                verbose=est.verbose if rank() == 0 else 0)
    all_reduce_sum(torch.zeros(1))  # every process has finished before anyone returns
    return est


def _holdout(est, shard: ShardSource, Xt, swt, seed_source) -> tuple[np.ndarray, np.ndarray]:
    """Global (train, validation) positions by row content; the same on every process.

    Rows that can be gathered (:func:`~kernelflow.distributed.auto.gather_all_rows`) are split
    by :func:`~kernelflow.utils.holdout.holdout_indices`, as a single-process fit on the
    concatenated rows is; beyond, each process marks its rows by
    :func:`~kernelflow.utils.holdout.holdout_stream_mask` and one all-reduce of an (n,) mask
    tells every process the global split.
    """
    seed = resolve_seed(seed_source)
    fraction = float(est.validation_fraction)
    gathered = auto.gather_all_rows(shard, Xt, swt)
    if gathered is not None:
        train, val = holdout_indices(gathered[0], fraction, seed, sample_weight=gathered[1])
    else:
        local = holdout_stream_mask(Xt, fraction, seed)
        counts = torch.zeros(shard.n_samples, dtype=torch.float64)
        counts[shard.offset:shard.offset + shard.n_local] = torch.from_numpy(
            local.astype(np.float64))
        held = all_reduce_sum(counts).numpy() > 0.5
        val, train = np.flatnonzero(held), np.flatnonzero(~held)
    if len(val) == 0 or len(train) == 0:
        raise ValueError("validation_fraction leaves no training or no validation rows.")
    return train, val
