"""Progress reporting for long loops.

``progress`` wraps an iterable (or a manual counter) in a tqdm bar when a user can see it
and in a silent object otherwise, so solvers call the same code in both cases:

>>> from kernelflow.utils.progress import progress
>>> total = 0
>>> with progress(range(3), desc="demo", verbose=0) as bar:
...     for i in bar:
...         total += i
...         bar.set_postfix(loss=0.5)
>>> total
3
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["progress", "SilentProgress"]


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class SilentProgress:
    """No-op stand-in for a tqdm bar: iterates, counts and ignores everything else.

    Parameters
    ----------
    iterable : iterable or None, default=None
        Items to yield. With ``None`` the object is a manual counter driven by ``update``.
    total : int or None, default=None
        Expected number of steps (kept for introspection only).

    Attributes
    ----------
    n : int
        Number of steps counted so far (items yielded plus ``update`` increments).
    postfix : dict
        The last values given to ``set_postfix``.

    Examples
    --------
    >>> bar = SilentProgress(total=10)
    >>> bar.update(4); bar.update(); bar.n
    5
    """

    def __init__(self, iterable: Iterable | None = None, total: int | None = None) -> None:
        self.iterable = iterable
        self.total = total
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self.disable = True

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            return iter(())
        return self._counted()

    def _counted(self) -> Iterator:
        for item in self.iterable or ():
            self.n += 1
            yield item

    def __len__(self) -> int:
        if self.total is not None:
            return int(self.total)
        return len(self.iterable)  # type: ignore[arg-type]

    def update(self, n: int = 1) -> None:
        self.n += int(n)

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kw) -> None:
        if ordered_dict:
            self.postfix.update(ordered_dict)
        self.postfix.update(kw)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        pass

    def write(self, s: str) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> SilentProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    verbose: int | bool = 0,
    unit: str = "it",
    **postfix: Any,
):
    """Return a progress bar over ``iterable``, or a silent equivalent.

    A real ``tqdm`` bar is shown only when ``verbose > 0``, standard error is a terminal
    and tqdm can be imported; otherwise the returned object has the same interface
    (iteration, ``update(n)``, ``set_postfix(**kw)``, ``close()``, context manager) and
    does nothing. Cost: O(1) per step.

    Parameters
    ----------
    iterable : iterable or None, default=None
        Items to iterate over. ``None`` gives a manual bar advanced with ``update``.
    total : int or None, default=None
        Number of expected steps (inferred from ``len(iterable)`` when possible).
    desc : str or None, default=None
        Label shown before the bar.
    verbose : int or bool, default=0
        Verbosity of the caller; 0 or False silences the bar.
    unit : str, default="it"
        Name of one step ("it", "rows", "epoch", ...).
    **postfix
        Initial values shown after the bar (e.g. ``loss=0.1``).

    Returns
    -------
    bar : tqdm.tqdm or SilentProgress
        The bar.

    Examples
    --------
    >>> bar = progress(total=100, desc="rows", verbose=1, unit="rows")
    >>> bar.update(50)
    >>> bar.set_postfix(val_mse=0.25)
    >>> bar.close()
    """
    if not verbose or not _stderr_is_terminal():
        return SilentProgress(iterable, total=total)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional dependency
        return SilentProgress(iterable, total=total)
    bar = tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)
    if postfix:
        bar.set_postfix(**postfix)
    return bar
