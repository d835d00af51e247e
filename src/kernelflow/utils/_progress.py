"""Progress reporting for long loops.

``progress`` wraps an iterable (or a manual counter) in a bar when a user can see it and in a
silent object otherwise, so solvers call the same code in every case:

>>> from kernelflow.utils.progress import progress
>>> total = 0
>>> with progress(range(3), desc="demo", verbose=0) as bar:
...     for i in bar:
...         total += i
...         bar.set_postfix(loss=0.5)
>>> total
3

Where the bar goes, at ``verbose >= 1``:

- a terminal on standard error, or a Jupyter kernel (where standard error is no terminal):
  a ``tqdm.auto`` bar (a widget in a notebook with ipywidgets, text otherwise);
- an explicit ``file``: a text tqdm bar on that stream;
- anywhere else (standard error sent to a file or a pipe), or without tqdm (an optional
  dependency, the ``progress`` extra): one plain line every ``TEXT_INTERVAL`` seconds with
  done/total, the elapsed time and one estimate of the time left.

One estimate of the time left: a loop whose ``total`` is only an upper bound (``max_iter`` of
a solver that usually stops earlier) is opened with ``upper_bound=True``; its estimate is then
shown as a bound ("at most ... left") until the loop tells the bar how many steps it now
expects with ``set_total`` (e.g. from the rate at which a residual falls, :func:`steps_to_reach`).
No other estimate is printed beside it.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

__all__ = ["progress", "SilentProgress", "TextProgress", "steps_to_reach", "TEXT_INTERVAL"]

#: seconds between two lines of the plain-text report
TEXT_INTERVAL = 5.0

_BOUND_FORMAT = ("{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, at most {remaining} left, "
                 "{rate_fmt}{postfix}]")


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (notebook, lab, VS Code, Colab), where stderr is no tty."""
    if ("ipykernel" not in sys.modules
            and "IPython.utils._process_emscripten" not in sys.modules):  # JupyterLite
        return False
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    try:
        shell = get_ipython() if get_ipython is not None else None
    except Exception:  # a half-initialised IPython
        return False
    return shell is not None and "terminal" not in type(shell).__module__  # not plain IPython


def _format_seconds(s: float) -> str:
    s = int(round(max(s, 0.0)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def steps_to_reach(history: Sequence[float], target: float, *, cap: int,
                   window: int = 5) -> int:
    """Steps still needed for a falling quantity to reach ``target`` at its recent rate.

    The rate is geometric over the last ``window`` steps, rho = (h_k / h_{k-w})^(1/w), and the
    answer is ceil(log(target / h_k) / log(rho)), capped by ``cap`` (the steps the loop may
    still take). With fewer than three values or no decrease the answer is ``cap``; with
    ``h_k <= target`` it is 0. Cost O(1).

    Parameters
    ----------
    history : sequence of float
        The quantity after each step so far (e.g. a relative residual), oldest first.
    target : float
        The value at which the loop stops (e.g. ``tol``).
    cap : int
        Most steps the loop can still take (``max_iter - k``).
    window : int, default=5
        Steps over which the rate is measured.

    Returns
    -------
    steps : int

    Examples
    --------
    >>> steps_to_reach([1.0, 0.1, 0.01, 0.001], 1e-6, cap=100)
    3
    >>> steps_to_reach([1.0, 1.0, 1.0], 1e-6, cap=100)
    100
    """
    cap = max(int(cap), 0)
    if history and history[-1] <= target:
        return 0
    if len(history) < 3:
        return cap
    k = min(int(window), len(history) - 1)
    last, first = float(history[-1]), float(history[-1 - k])
    if not (math.isfinite(last) and math.isfinite(first)) or first <= 0 or last <= 0:
        return cap
    rate = (last / first) ** (1.0 / k)
    if not 0 < rate < 1 or target <= 0:
        return cap
    return min(cap, math.ceil(math.log(target / last) / math.log(rate)))


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
    total : int or None
        Expected number of steps (changed by ``set_total``).
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
            self.update()
            yield item
        self.close()  # as tqdm does at the end of the iteration

    def __len__(self) -> int:
        if self.total is not None:
            return int(self.total)
        return len(self.iterable)  # type: ignore[arg-type]

    def update(self, n: int = 1) -> None:
        self.n += int(n)

    def set_total(self, total: int | None) -> None:
        """Revise the number of steps expected (the time-left estimate follows it)."""
        self.total = total

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


class TextProgress(SilentProgress):
    """Plain-text progress: one line every ``interval`` seconds on ``file``.

    For streams that are not a terminal (a log file, a pipe) or when tqdm is missing. A line
    reads ``desc: 120/1000 step (12%), 00:05 elapsed, ~00:37 left, loss=0.1``: one estimate
    of the time left, ``elapsed / n * (total - n)``, written "at most" while the total is an
    upper bound. A loop shorter than ``interval`` writes nothing; one that wrote a line writes
    a last one when it closes (``desc: done, 4 it in 00:12``).

    Parameters
    ----------
    iterable : iterable or None, default=None
    total : int or None, default=None
    desc : str or None, default=None
    unit : str, default="it"
    file : text stream or None, default=None
        Where lines go (None: ``sys.stderr`` at the time of writing).
    upper_bound : bool, default=False
        ``total`` is only the most steps the loop can take.
    interval : float or None, default=None
        Seconds between lines (None: the module's ``TEXT_INTERVAL``).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> bar = TextProgress(total=4, desc="demo", file=out, interval=0.0)
    >>> bar.update(2); bar.close()
    >>> out.getvalue().splitlines()[0].split(",")[0]
    'demo: 2/4 it (50%)'
    """

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, *,
                 desc: str | None = None, unit: str = "it", file: IO[str] | None = None,
                 upper_bound: bool = False, interval: float | None = None) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        super().__init__(iterable, total=total)
        self.desc = desc
        self.unit = unit
        self.file = file
        self.upper_bound = bool(upper_bound)
        self.interval = TEXT_INTERVAL if interval is None else float(interval)
        self.disable = False
        self._start = time.monotonic()
        self._last = self._start
        self._written = False
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += int(n)
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._emit(now)

    def set_total(self, total: int | None) -> None:
        """Revise the number of steps expected; the estimate is no longer a bound."""
        self.total = total
        self.upper_bound = False

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc

    def write(self, s: str) -> None:
        self._print(s)

    def line(self, now: float | None = None) -> str:
        """The current report line."""
        elapsed = (time.monotonic() if now is None else now) - self._start
        head = f"{self.desc}: " if self.desc else ""
        parts = [f"{head}{self.n}/{self.total if self.total is not None else '?'} {self.unit}"]
        if self.total:
            parts[0] += f" ({100.0 * self.n / self.total:.0f}%)"
        parts.append(f"{_format_seconds(elapsed)} elapsed")
        if self.total and self.n > 0:
            left = elapsed / self.n * max(self.total - self.n, 0)
            parts.append(f"{'at most ' if self.upper_bound else '~'}{_format_seconds(left)} left")
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return ", ".join(parts)

    def _emit(self, now: float | None = None) -> None:
        self._written = True
        self._print(self.line(now))

    def _print(self, s: str) -> None:
        stream = self.file if self.file is not None else sys.stderr
        if stream is None:
            return
        try:
            stream.write(s + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed stream must not stop a solver
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._written:
            elapsed = time.monotonic() - self._start
            head = f"{self.desc}: " if self.desc else ""
            tail = "".join(f", {k}={v}" for k, v in self.postfix.items())
            self._print(f"{head}done, {self.n} {self.unit} in {_format_seconds(elapsed)}{tail}")


def _tqdm_class(auto: bool) -> type:
    """tqdm (``tqdm.auto`` or the text ``tqdm.std``) with ``set_total``; raises ImportError."""
    if auto:
        from tqdm.auto import tqdm as base
    else:
        from tqdm.std import tqdm as base
    return _with_set_total(base)


@functools.lru_cache(maxsize=4)
def _with_set_total(base: type) -> type:
    class Bar(base):  # type: ignore[misc, valid-type]
        def set_total(self, total: int | None) -> None:
            """Revise the number of steps expected; the estimate is no longer a bound."""
            if total == getattr(self, "total", None) and getattr(self, "bar_format", None) is None:
                return
            self.total = total  # shown at the next update (tqdm's own refresh interval)
            container = getattr(self, "container", None)
            if container is not None and total:  # the notebook widget keeps its own maximum
                try:
                    container.children[1].max = total
                except (AttributeError, IndexError):
                    pass
            self.bar_format = None

    return Bar


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    verbose: int | bool = 0,
    unit: str = "it",
    file: IO[str] | None = None,
    upper_bound: bool = False,
    **postfix: Any,
):
    """Return a progress bar over ``iterable``, or a silent equivalent.

    ``verbose`` 0 or False gives a :class:`SilentProgress`. At ``verbose >= 1`` the bar is a
    ``tqdm.auto`` bar when standard error is a terminal or the code runs in a Jupyter kernel,
    a text tqdm bar on ``file`` when one is given, and a :class:`TextProgress` (a plain line
    every ``TEXT_INTERVAL`` seconds) elsewhere or without tqdm. All have the same interface:
    iteration, ``update(n)``, ``set_total(total)``, ``set_postfix(**kw)``, ``close()``, context
    manager. Cost: O(1) per step.

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
    file : text stream or None, default=None
        Write the bar to this stream (at ``verbose >= 1``, terminal or not).
    upper_bound : bool, default=False
        ``total`` is the most steps the loop can take (a ``max_iter`` that convergence or
        early stopping usually cuts short): the one time estimate reads "at most ... left"
        until ``bar.set_total(expected)`` replaces the bound by the expected count.
    **postfix
        Initial values shown after the bar (e.g. ``loss=0.1``).

    Returns
    -------
    bar : tqdm.tqdm, TextProgress or SilentProgress
        The bar.

    Examples
    --------
    >>> bar = progress(total=100, desc="rows", verbose=1, unit="rows")
    >>> bar.update(50)
    >>> bar.set_postfix(val_mse=0.25)
    >>> bar.close()

    A loop bounded by ``max_iter`` that learns how many steps it needs:

    >>> bar = progress(total=1000, desc="CG", verbose=1, unit="pass", upper_bound=True)
    >>> residuals = [1.0, 0.1, 0.01]
    >>> bar.update(2)
    >>> bar.set_total(2 + steps_to_reach(residuals, 1e-6, cap=998))  # one estimate: ~4 more
    >>> bar.close()
    """
    if not verbose:
        return SilentProgress(iterable, total=total)
    shown = file is not None or _stderr_is_terminal() or _in_notebook()
    cls = None
    if shown:
        try:
            cls = _tqdm_class(file is None)
        except ImportError:  # tqdm is an optional dependency
            cls = None
    if cls is None:
        bar: Any = TextProgress(iterable, total=total, desc=desc, unit=unit, file=file,
                                upper_bound=upper_bound)
        if postfix:
            bar.set_postfix(**postfix)
        return bar
    bar = cls(iterable, total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
              file=file, bar_format=_BOUND_FORMAT if upper_bound and total else None)
    if postfix:
        bar.set_postfix(**postfix)
    return bar
