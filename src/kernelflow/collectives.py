"""Collective operations that are the identity when no process group is initialised.

Solvers route every sum over data rows through :func:`all_reduce_sum`, so the same code runs on
one process or data-parallel over many (each holding a shard of the rows).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.distributed as dist

__all__ = ["is_distributed", "rank", "world_size", "all_reduce_sum", "broadcast", "local_only",
           "DistributedError", "configured_timeout"]

# the timeout given to ``kernelflow.distributed.init_process_group`` (None: not started there)
_GROUP_STATE: dict[str, float | None] = {"timeout": None}


class DistributedError(RuntimeError):
    """A process of a data-parallel run failed, died, or did not answer within the timeout."""


def configured_timeout() -> float | None:
    """Timeout (seconds) given to ``kernelflow.distributed.init_process_group``, or None if it
    was not used."""
    return _GROUP_STATE["timeout"]

# set while an estimator fits this process's rows alone inside a process group
_LOCAL_ONLY = contextvars.ContextVar("kernelflow_local_only", default=False)


@contextlib.contextmanager
def local_only():
    """Within this block, behave as a single process: collectives are the identity.

    For an estimator asked to fit only this process's rows (``distributed=False``) while a
    process group is running.

    Examples
    --------
    >>> with local_only():
    ...     is_distributed()
    False
    """
    token = _LOCAL_ONLY.set(True)
    try:
        yield
    finally:
        _LOCAL_ONLY.reset(token)


def is_distributed() -> bool:
    """True when a torch.distributed process group with more than one process is running."""
    if _LOCAL_ONLY.get():
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all processes (in place when distributed); returns it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Copy ``tensor`` from process ``src`` to all processes (in place); returns it."""
    if is_distributed():
        dist.broadcast(tensor, src=src)
    return tensor
