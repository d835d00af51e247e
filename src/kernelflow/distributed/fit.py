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

Both go through the public protocol of :mod:`.protocol` (prepare, local step, reduce, finish):
:func:`distributed_fit` accepts any estimator implementing it and touches nothing else of it.

A collective that fails (a process died, or did not answer within the group's timeout) raises
:class:`~kernelflow.distributed.launch.DistributedError` naming this process and the cause.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.distributed as dist

from ..collectives import is_distributed, world_size
from ..sources import ArraySource, DataSource
from ..utils._atomic import all_or_nothing
from . import auto
from .auto import collective_errors
from .protocol import DataParallelEstimator, fit_data_parallel
from .sharding import ShardSource

__all__ = ["distributed_fit", "as_shard", "labels_union", "bandwidth_rows"]

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
    estimator : DataParallelEstimator
        Any estimator implementing :class:`~kernelflow.distributed.protocol.
        DataParallelEstimator`: NystromKernelRidge, NystromRobustRegressor,
        DoublyStochasticRegressor, DoublyStochasticClassifier, or one of your own.
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
    if not isinstance(estimator, DataParallelEstimator):
        raise TypeError(
            f"{name} has no data-parallel fit (kernelflow.distributed.protocol."
            "DataParallelEstimator); use NystromKernelRidge, NystromRobustRegressor, "
            "DoublyStochasticRegressor or DoublyStochasticClassifier."
        )
    # all or nothing, as the estimators' own fit: a failed fit leaves the estimator as it was
    with collective_errors(f"{name}.fit"), all_or_nothing(estimator):
        return fit_data_parallel(estimator, as_shard(X, y, sample_weight))


# ---- shared decisions of the doubly stochastic estimators -----------------------------------
def bandwidth_rows(shard: ShardSource, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Rows drawn by global position for a median-heuristic bandwidth (collective).

    Up to :data:`~kernelflow.distributed.auto.GATHER_LIMIT` values the rows are all rows, so the
    heuristic sees what a single-process fit on the concatenated data sees; beyond, a uniform
    sample of ``_BANDWIDTH_ROWS`` global rows. The same rows on every process.
    """
    n = shard.n_samples
    if n * (shard.n_features + 1) <= auto.GATHER_LIMIT:
        idx = np.arange(n)
    else:
        idx = np.sort(np.random.RandomState(0).choice(n, size=min(n, _BANDWIDTH_ROWS),
                                                      replace=False))
    return shard.take(idx).to(dtype)


def labels_union(y_np: np.ndarray) -> np.ndarray:
    """Sorted union of the class labels of all processes (labels travel as objects)."""
    local = np.unique(y_np)
    if not is_distributed():
        return local
    gathered: list = [None] * world_size()
    dist.all_gather_object(gathered, local.tolist())
    return np.unique(np.concatenate([np.asarray(g, dtype=local.dtype) for g in gathered]))
