"""The prepare stage of the Nyström estimators: data, centres, holdout and distribution policy.

Everything a Nyström fit decides before its solver runs, identically on every process of a
data-parallel fit (the prepare stage of :mod:`kernelflow.distributed.protocol`):

* the data: array input validated into an :class:`~kernelflow.sources.ArraySource`, a
  DataSource (or ``.npy`` path) used as is; data-parallel, this process's rows wrapped in a
  :class:`~kernelflow.distributed.sharding.ShardSource` and, up to
  :data:`~kernelflow.distributed.auto.GATHER_LIMIT` values, all processes' rows gathered, so that
  centres, bandwidth and holdout equal those of a single-process fit on the concatenated rows;
* the kernel (median-heuristic bandwidth from the centre candidates, process 0's when the
  processes' rows differ) and the centres (from the rows in memory, or from a uniform subsample
  drawn by global position), broadcast from process 0 as a guard;
* the holdout split (:func:`kernelflow.utils.holdout.split_holdout`) and its seed;
* the compute dtype, the memory budget and the weighted moments of the targets (one pass,
  given to the solver so that it does not read the rows again for them).

It lives in ``kernelflow.distributed`` (below the estimators, above the solvers) because it
needs :class:`ShardSource` and :func:`~kernelflow.distributed.auto.gather_all_rows`, which the
solvers may not import; the estimators keep only their parameters and fitted attributes.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import torch

from ..collectives import broadcast, is_distributed
from ..kernels import Kernel
from ..landmarks import resolve_centers
from ..operators import Options, memory_budget
from ..solvers.nystrom import source_moments
from ..sources import ArraySource, DataSource, as_source
from ..utils._validation import check_X_y
from ..utils.holdout import split_holdout
from .auto import data_parallel, gather_all_rows
from .sharding import ShardSource, check_consistent

__all__ = ["NystromData", "prepare_nystrom", "select_centers", "resolved_options",
           "COMPUTE_DTYPES"]

logger = logging.getLogger(__name__)

#: ``dtype`` parameter of the Nyström estimators.
COMPUTE_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: Moments of a source: total weight W, weighted target sum (t,), row count.
Moments = tuple[float, torch.Tensor, int]


@dataclass
class NystromData:
    """What the prepare stage decided for one Nyström fit (identical on every process).

    Attributes
    ----------
    source : DataSource
        All training rows (a ShardSource in a data-parallel fit).
    train, validation : DataSource, DataSource or None
        The two sides of the holdout split (``train is source`` without early stopping).
    validation_indices : ndarray or None
        Sorted global positions of the held-out rows (a sharded stream: this process's).
    kernel : Kernel
    centers : tensor of shape (M, n_features), float64
    dtype : torch.dtype
        Compute dtype of the solver.
    options : Options
        The estimator's options with the memory budget fixed for this fit.
    y_1d : bool
        Whether y was given 1-D (the fitted attributes then drop the target axis).
    moments : (float, tensor of shape (t,), int) or None
        :func:`~kernelflow.solvers.nystrom.source_moments` of ``source`` when requested.
    warm : tuple or None
        ``(centers_, kernel_, dual_coef_, intercept_)`` of the previous fit continued by
        ``warm_start`` (same number of features), else None.
    """

    source: DataSource
    train: DataSource
    validation: DataSource | None
    validation_indices: np.ndarray | None
    kernel: Kernel
    centers: torch.Tensor
    dtype: torch.dtype
    options: Options
    y_1d: bool
    moments: Moments | None
    warm: tuple | None

    def solver_moments(self) -> Moments | None:
        """The moments of the solver's rows: those of ``source`` when nothing is held out."""
        return self.moments if self.validation is None else None


def _validated_data(estimator, X, y, sample_weight):
    """(source, pool tensor or None, its sample weight, y is 1-D).

    Array input is validated like any estimator's (``n_features_in_`` and
    ``feature_names_in_`` are set on ``estimator``); a DataSource (or a ``.npy`` path) is used
    as is and only its first rows are inspected here (blocks are checked as they are read).
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


def select_centers(landmarks, n_components: int, pool: torch.Tensor, kernel: Kernel,
                   rng: np.random.RandomState) -> torch.Tensor:
    """Centres from ``landmarks`` (a selector name or object, or the centres themselves).

    Duplicates are removed (they add nothing); inside a process group the centres are
    broadcast from process 0. Draws one seed from ``rng``.

    Examples
    --------
    >>> from kernelflow.kernels import Gaussian
    >>> pool = torch.arange(20.0, dtype=torch.float64).reshape(10, 2)
    >>> select_centers("uniform", 4, pool, Gaussian(1.0), np.random.RandomState(0)).shape
    torch.Size([4, 2])
    """
    # Selecting from the distinct rows makes integer weights equivalent to repeated rows, and
    # torch.unique sorts them, so the candidates do not depend on the row order either. Given
    # centres do not depend on the pool: skip the sort of all rows.
    k: int | None
    if isinstance(landmarks, np.ndarray | torch.Tensor | list | tuple):
        k, pool = None, pool[:1].to(torch.float64)  # only its width and dtype are read
    else:
        pool = torch.unique(pool.to(torch.float64), dim=0)
        k = min(int(n_components), pool.shape[0])
    seed = int(rng.randint(0, 2**31 - 1))
    C = resolve_centers(landmarks, pool, kernel, k, random_state=seed).centers
    C = torch.unique(C.to(torch.float64), dim=0)
    if is_distributed():  # every process must hold the same centres
        C = broadcast(C.contiguous())
    return C


def resolved_options(options: Options | None, device=None) -> Options:
    """``options`` with the memory budget fixed once per fit (stable block sizes; on a GPU a
    fraction of the device's free memory)."""
    opts = options or Options()
    if opts.memory_budget is None:
        opts = opts.replace(memory_budget=memory_budget(opts, device))
    return opts


def _compute_dtype(dtype: str | None, X_dtype: torch.dtype) -> torch.dtype:
    if dtype is not None:
        return COMPUTE_DTYPES[dtype]
    return X_dtype if X_dtype in (torch.float32, torch.float64) else torch.float64


def _shared_kernel(kernel: Kernel) -> Kernel:
    """Process 0's bandwidth: a median-heuristic one (or sigma="ard") depends on each
    process's candidates."""
    sigma = getattr(kernel, "sigma", None)
    if is_distributed() and isinstance(sigma, float | int | np.ndarray):
        s = broadcast(torch.as_tensor(np.atleast_1d(sigma), dtype=torch.float64).clone())
        kernel = copy.copy(kernel)  # never the user's kernel object
        kernel.sigma = float(s[0]) if np.ndim(sigma) == 0 else s.numpy()  # type: ignore[attr-defined]
    return kernel


def _holdout_seed(random_state, rng: np.random.RandomState) -> int:
    """The holdout seed: ``random_state`` itself when it is an integer (so every estimator holds
    out the same rows for the same ``random_state``), else a draw from the fit's generator,
    process 0's in a process group (``random_state=None`` draws differently on every process,
    and every process must hold out the same rows)."""
    drawn = int(rng.randint(0, 2**31 - 1))  # drawn in both cases: the centres stay the same
    if isinstance(random_state, Integral):
        return int(random_state)
    if is_distributed():
        drawn = int(broadcast(torch.tensor([drawn], dtype=torch.int64))[0])
    return drawn


def _previous_fit(estimator) -> tuple | None:
    """The fitted state ``warm_start`` continues from, or None."""
    if not (estimator.warm_start and hasattr(estimator, "centers_")):
        return None
    return (estimator.centers_, estimator.kernel_, estimator.dual_coef_, estimator.intercept_,
            getattr(estimator, "n_features_in_", None))


def prepare_nystrom(estimator, X, y, sample_weight, *, rng: np.random.RandomState,
                    build_kernel: Callable[..., Kernel], moments: bool = False
                    ) -> NystromData:
    """Prepare a Nyström fit of ``estimator`` on ``X`` (collective when data-parallel).

    Reads the estimator's parameters (``n_components``, ``landmarks``, ``distributed``,
    ``warm_start``, ``early_stopping``, ``validation_fraction``, ``random_state``, ``dtype``,
    ``options``, ``block_size``) and, with ``warm_start``, its fitted centres and kernel; sets
    ``n_features_in_`` (and ``feature_names_in_``) like any validation. ``build_kernel(pool,
    sample_weight=None)`` resolves the kernel from the centre candidates; ``rng`` is the fit's
    generator (draws: candidates, centre seed, holdout seed). Data-parallel when ``X`` is a
    ShardSource or the estimator's ``distributed`` setting says so. Cost: the centre selection,
    plus one pass over the rows for the holdout of a stream and one for ``moments``.
    """
    prev = _previous_fit(estimator)
    source, pool, sw, y_1d = _validated_data(estimator, X, y, sample_weight)
    x_dtype = pool.dtype if pool is not None else torch.float64
    if data_parallel(estimator.distributed, X):
        source, pool, sw = _data_parallel_data(source, pool, sw)
        check_consistent("targets", y_1d=float(y_1d))
    if prev is not None and prev[4] == source.n_features:
        C, kernel = prev[0], prev[1]
        rng.randint(0, 2**31 - 1)  # keep the split seed where a cold fit would draw it
    else:
        prev = None
        pool_ = _candidate_pool(source, pool, sw, int(estimator.n_components), rng)
        kernel = build_kernel(pool_) if pool is None else build_kernel(pool, sw)
        C = select_centers(estimator.landmarks, estimator.n_components, pool_, kernel, rng)
        kernel = _shared_kernel(kernel)
    train: DataSource = source
    validation: DataSource | None = None
    val_idx = None
    if estimator.early_stopping:
        split = split_holdout(source, estimator.validation_fraction,
                              _holdout_seed(estimator.random_state, rng),
                              rows=None if pool is None else (pool, sw))
        train, validation, val_idx = split.train, split.validation, split.validation_indices
    mom = source_moments(source, block_size=estimator.block_size) if moments else None
    return NystromData(source, train, validation, val_idx, kernel, C,
                       _compute_dtype(estimator.dtype, x_dtype),
                       resolved_options(estimator.options, C.device), y_1d, mom,
                       None if prev is None else prev[:4])

