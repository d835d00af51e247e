"""Thread counts by problem size: small problems run on the calling thread.

Waking torch's thread pool for a product of a few thousand entries costs more than the product
(tens of microseconds on a quiet machine; on a loaded one an 80 x 80 ``exp`` took 15 ms on two
threads against 0.3 ms on one). :func:`threads_for` holds torch on one thread while a small
problem runs; :func:`available_threads` still reports the caller's setting, so the compiled
loops, which run their own workers over independent problems, keep it for large batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["SMALL_STEP", "threads_for", "available_threads"]

#: Below this many multiply-adds per step a computation runs on one torch thread.
SMALL_STEP = 30_000_000

_outer: list[int] = []  # the caller's thread counts, innermost last


@contextmanager
def threads_for(step_work: float) -> Iterator[None]:
    """Hold torch on one thread while a problem of ``step_work`` multiply-adds per step runs.

    Restores the caller's setting afterwards (also after an exception).

    Examples
    --------
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> with threads_for(1e3):
    ...     torch.get_num_threads(), available_threads() == before
    (1, True)
    >>> torch.get_num_threads() == before
    True
    """
    before = torch.get_num_threads()
    if step_work >= SMALL_STEP or before == 1:
        yield
        return
    _outer.append(before)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        _outer.pop()


def available_threads() -> int:
    """The thread count the caller chose (torch's, unless :func:`threads_for` narrowed it)."""
    return _outer[0] if _outer else torch.get_num_threads()
