"""When an estimator's fit runs data-parallel, and what it gathers to match one process.

The estimators with a data-parallel fit (Nyström, robust Nyström, doubly stochastic, the path
cross-validation estimators) take a ``distributed`` parameter:

* ``"auto"`` (default): data-parallel when a torch.distributed process group with more than one
  process is initialised, each process passing its own rows to ``fit`` (rank order: process 0
  holds the first rows of the concatenated data set);
* ``True`` / ``"on"``: the same, but a missing process group is an error (instead of a silent
  single-process fit);
* ``False`` / ``"off"``: each process fits only its own rows; collectives are switched off for
  the duration of the fit (:func:`kernelflow.collectives.local_only`).

A :class:`~kernelflow.distributed.sharding.ShardSource` always means a data-parallel fit.

To pick centres and a median-heuristic bandwidth from exactly the rows a single-process fit on
the concatenated arrays would use, a data-parallel fit on arrays gathers all rows on every
process (one all-reduce of n x d numbers) when there are at most :data:`GATHER_LIMIT` of them;
beyond that it draws them from a global uniform subsample, as a fit on a
:class:`~kernelflow.sources.DataSource` does.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist
from sklearn.utils._param_validation import StrOptions

from ..collectives import (
    DistributedError,
    all_reduce_sum,
    broadcast,
    configured_timeout,
    is_distributed,
    local_only,
    rank,
    world_size,
)

__all__ = ["DISTRIBUTED_CONSTRAINT", "GATHER_LIMIT", "data_parallel", "fit_scope",
           "collective_errors", "gather_all_rows", "shared_seed"]

#: Parameter constraint of ``distributed``.
DISTRIBUTED_CONSTRAINT = ["boolean", StrOptions({"auto", "on", "off"})]

#: Largest number of values (rows x (features + 1)) gathered on every process so that centres and
#: bandwidths come from the same rows as in a single-process fit (2^24 float64 = 128 MiB).
GATHER_LIMIT = 2**24


def data_parallel(setting, X=None) -> bool:
    """Whether a fit with ``distributed=setting`` on training input ``X`` runs data-parallel.

    Examples
    --------
    >>> data_parallel("auto"), data_parallel(False)  # no process group here
    (False, False)
    """
    from .sharding import ShardSource

    if isinstance(X, ShardSource):
        return True
    if setting is False or setting == "off":
        return False
    active = is_distributed()
    if (setting is True or setting == "on") and not active:
        raise ValueError(
            "distributed=True needs an initialised torch.distributed process group with more "
            "than one process (kernelflow.distributed.init_process_group, e.g. under torchrun); "
            "use distributed='auto' to fit on one process when there is none."
        )
    return active


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


def fit_scope(estimator, X=None):
    """Context for ``estimator.fit(X, ...)``: collective errors reported clearly when
    data-parallel, collectives switched off when a group runs but the fit is local.

    Examples
    --------
    >>> from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    >>> with fit_scope(NystromKernelRidge(distributed=False)):
    ...     is_distributed()
    False
    """
    if data_parallel(getattr(estimator, "distributed", "auto"), X):
        return collective_errors(f"{type(estimator).__name__}.fit")
    return local_only() if is_distributed() else contextlib.nullcontext()


def gather_all_rows(shard, X_local: torch.Tensor, sample_weight: torch.Tensor | None = None):
    """All rows of the data set (and weights) on every process, in global order (collective).

    Returns ``(X, sample_weight)`` equal to the concatenation of the processes' rows, or None
    (on every process) when there are more than :data:`GATHER_LIMIT` values. One all-reduce of
    a zero-padded (n, d [+ 1]) float64 block: each row is non-zero on one process only, so the
    sums are the rows themselves, exactly.
    """
    n, d = int(shard.n_samples), int(X_local.shape[1])
    if n * (d + 1) > GATHER_LIMIT:
        return None
    if not is_distributed():
        return X_local, sample_weight
    cols = d + (sample_weight is not None)
    buf = torch.zeros(n, cols, dtype=torch.float64)
    lo, hi = shard.offset, shard.offset + shard.n_local
    buf[lo:hi, :d] = X_local.detach().cpu().to(torch.float64)
    if sample_weight is not None:
        buf[lo:hi, d] = sample_weight.detach().cpu().to(torch.float64)
    buf = all_reduce_sum(buf)
    X = buf[:, :d].to(dtype=X_local.dtype, device=X_local.device)
    w = None if sample_weight is None else buf[:, d].to(dtype=sample_weight.dtype,
                                                          device=sample_weight.device)
    return X, w


def shared_seed(random_state):
    """``random_state``, or for None one integer seed drawn on process 0 and sent to all.

    Data-parallel fits draw their random choices (feature stream, mini-batch order) on every
    process from the same seed; None would give every process its own.
    """
    if random_state is not None or not is_distributed():
        return random_state
    seed = torch.tensor([np.random.randint(np.iinfo(np.int32).max)], dtype=torch.int64)
    return int(broadcast(seed)[0])
