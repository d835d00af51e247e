"""Fit an estimator data-parallel: every process holds a shard of the rows, all get one model.

:func:`distributed_fit` is the single entry point. Call it on every process of an initialised
group (``torchrun`` or :func:`kernelflow.distributed.launch.spawn`) with that process's shard:

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

import contextlib
import logging

import numpy as np
import torch
import torch.distributed as dist
from sklearn.utils import check_random_state

from ..sources import ArraySource, DataSource
from ..utils._progress import progress
from ..utils._validation import check_X_y
from ._comm import all_reduce_sum, is_distributed, rank, world_size
from .launch import DistributedError, configured_timeout
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


@contextlib.contextmanager
def collective_errors(what: str):
    """Turn a failed collective into a :class:`DistributedError` that says what happened."""
    try:
        yield
    except DistributedError:
        raise
    except (RuntimeError, dist.DistError) as exc:
        msg = str(exc)
        comm = isinstance(exc, dist.DistError) or any(
            s in msg.lower() for s in ("gloo", "nccl", "connection", "timed out", "timeout",
                                       "peer", "socket", "process group"))
        if not comm:
            raise
        t = configured_timeout()
        limit = f" within the timeout of {t:g} s" if t is not None else ""
        raise DistributedError(
            f"rank {rank()} of {world_size()}: a collective operation failed during {what}; "
            f"another process exited or did not answer{limit}. Cause: {msg.splitlines()[0]}"
        ) from exc


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
    (r, C) block per mini-batch). Set bandwidths explicitly for results that equal the
    single-process fit with array input: with ``sigma=None`` the median heuristic runs on rows
    drawn from the global data set, the same rows on every process.

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
    from ..estimators.doubly_stochastic import DoublyStochasticMixin
    from ..estimators.nystrom_ridge import _NystromBase

    name = type(estimator).__name__
    with collective_errors(f"{name}.fit"):
        if isinstance(estimator, _NystromBase):
            source = as_shard(X, y, sample_weight)
            return estimator.fit(source)
        if isinstance(estimator, DoublyStochasticMixin):
            return _fit_doubly_stochastic(estimator, as_shard(X, y, sample_weight))
    raise TypeError(
        f"{name} has no data-parallel fit; use NystromKernelRidge, NystromRobustRegressor, "
        "DoublyStochasticRegressor or DoublyStochasticClassifier."
    )


# ---- doubly stochastic: global mini-batches ----------------------------------------------------
def _global_kernel(estimator, shard: ShardSource):
    """The kernel from rows drawn by global position (same rows, same kernel on every rank)."""
    if estimator.sigma is not None or estimator.gamma is not None or not isinstance(
            estimator.kernel, str):
        return None
    n = shard.n_samples
    idx = np.sort(np.random.RandomState(0).choice(n, size=min(n, _BANDWIDTH_ROWS),
                                                  replace=False))
    return estimator._resolve_kernel(shard.take(idx).to(torch.float64))


def _labels_union(y_np: np.ndarray) -> np.ndarray:
    """Sorted union of the class labels of all processes (labels travel as objects)."""
    local = np.unique(y_np)
    if not is_distributed():
        return local
    gathered: list = [None] * world_size()
    dist.all_gather_object(gathered, local.tolist())
    return np.unique(np.concatenate([np.asarray(g, dtype=local.dtype) for g in gathered]))


def _fit_doubly_stochastic(est, shard: ShardSource):
    if est.warm_start and hasattr(est, "coef_"):
        raise ValueError("distributed_fit starts from scratch; warm_start is not supported.")
    est._validate_params()
    X, y, sw = shard.local_arrays()
    classifier = hasattr(est, "_set_classes")
    if classifier:
        Xt, y_np, swt = est._check(X, (y[:, 0] if y.shape[1] == 1 else y).numpy(), sw,
                                   reset=True)
        est._set_classes(y_np, _labels_union(y_np))
        Y = est._encode_targets(y_np, first=True)
    else:
        y1 = y[:, 0] if y.shape[1] == 1 else y
        Xt, yt, swt, _ = check_X_y(est, X, y1, reset=True, sample_weight=sw)
        Y = est._encode_targets(yt, first=True)
    check_consistent("doubly stochastic targets", n_outputs=Y.shape[1])

    rng = check_random_state(est.random_state)
    kernel = _global_kernel(est, shard)
    saved = est.kernel
    try:
        if kernel is not None:
            est.kernel = kernel  # the same bandwidth on every process
        # _init_state reads the number of rows (batch_size="auto") and the width from its
        # argument: show it a zero-copy view with the global row count
        est._init_state(Xt[:1].expand(shard.n_samples, -1))
    finally:
        est.kernel = saved
    # the feature stream must be the same everywhere: random_state=None would differ
    check_consistent("random_state (the feature-stream seeds drawn from it)",
                     seed=float(est.seed_))
    model = est._model
    n, off, n_loc = shard.n_samples, shard.offset, shard.n_local
    train = np.arange(n)
    Xv = Yv = swv = None
    if est.early_stopping:
        n_val = max(1, int(round(est.validation_fraction * n)))
        if n - n_val < 1:
            raise ValueError("validation_fraction leaves no training rows.")
        perm = rng.permutation(n)
        val, train = perm[:n_val], perm[n_val:]
        lv = _local(val, off, n_loc)
        Xv, Yv = Xt[lv], Y[lv]
        swv = None if swt is None else swt[lv]
    best, no_improve = np.inf, 0
    est.n_iter_ = 0
    bs = int(getattr(est, "batch_size_", est.batch_size))
    for _epoch in progress(range(est.max_iter), total=est.max_iter, desc=type(est).__name__,
                           verbose=est.verbose if rank() == 0 else 0):
        order = train[rng.permutation(len(train))] if est.shuffle else train
        total = torch.zeros(2, dtype=torch.float64)
        for i in range(0, len(order), bs):
            loc = _local(order[i:i + bs], off, n_loc)
            w = None if swt is None else swt[loc]
            val_loss = model.step(Xt[loc], Y[loc], w)
            total += torch.tensor([val_loss * len(order[i:i + bs]), len(order[i:i + bs])],
                                  dtype=torch.float64)
        train_loss = float(total[0] / max(float(total[1]), 1.0))
        est.n_iter_ += 1
        score = est._validation_loss(model, Xv, Yv, swv) if est.early_stopping else train_loss
        est.loss_curve_.append(train_loss)
        if est.tol is not None:
            no_improve = no_improve + 1 if score > best - est.tol else 0
            best = min(best, score)
            if no_improve >= est.n_iter_no_change:
                break
    est._store_state()
    all_reduce_sum(torch.zeros(1))  # every process has finished before anyone returns
    return est


def _local(global_idx: np.ndarray, offset: int, n_local: int) -> torch.Tensor:
    """Local row numbers of the global rows this process holds, in the given order."""
    g = np.asarray(global_idx)
    keep = (g >= offset) & (g < offset + n_local)
    return torch.from_numpy(g[keep] - offset)
