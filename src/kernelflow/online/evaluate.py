"""Progressive validation: play a stream round by round and record losses, regret and time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..utils._progress import progress

if TYPE_CHECKING:
    from ..typing import ArrayLike
    from ._base import OnlineRegressorBase

__all__ = ["ProgressiveResult", "progressive_validation", "iter_chunks"]


@dataclass
class ProgressiveResult:
    """Outcome of :func:`progressive_validation` (all arrays indexed by round).

    Attributes
    ----------
    y_true, y_pred : ndarray of shape (n_rounds,)
        Labels and the strict-protocol predictions (made before the label was seen).
    losses : ndarray of shape (n_rounds,)
        Per-round loss (square loss, or 0/1 error of ``sign(ŷ)`` for ``loss="zero_one"``).
    cumulative_loss, average_loss : ndarray of shape (n_rounds,)
    elapsed : ndarray of shape (n_rounds,)
        Seconds from the start to the end of each round (learner time only).
    regret : ndarray of shape (n_rounds,) or None
        ``Σ_{s≤t} ℓ(y_s, ŷ_s) - Σ_{s≤t} ℓ(y_s, f(x_s))`` when a comparator f was given.
    truncated : bool
        True when ``time_limit`` stopped the run early.
    """

    y_true: np.ndarray
    y_pred: np.ndarray
    losses: np.ndarray
    cumulative_loss: np.ndarray
    average_loss: np.ndarray
    elapsed: np.ndarray
    regret: np.ndarray | None = None
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_rounds(self) -> int:
        return int(self.y_pred.shape[0])

    @property
    def rounds_per_second(self) -> float:
        total = float(self.elapsed[-1]) if self.n_rounds else 0.0
        return self.n_rounds / total if total > 0 else float("inf")


class _Rows(Protocol):
    """Anything with a length and row slices (NumPy, torch, pandas, lists)."""

    def __len__(self) -> int: ...

    def __getitem__(self, rows: slice, /) -> Any: ...


def iter_chunks(X: _Rows, y: _Rows, chunk_size: int = 1000) -> Iterator[tuple[Any, Any]]:
    """Yield ``(X[i:i+c], y[i:i+c])``: an in-memory stand-in for a chunked file reader.

    Examples
    --------
    >>> import numpy as np
    >>> [len(c[1]) for c in iter_chunks(np.zeros((5, 2)), np.zeros(5), 2)]
    [2, 2, 1]
    """
    for i in range(0, len(y), chunk_size):
        yield X[i : i + chunk_size], y[i : i + chunk_size]


def _loss(y: np.ndarray, p: np.ndarray, kind: str) -> np.ndarray:
    if kind == "squared":
        return (y - p) ** 2
    return (np.where(p >= 0, 1.0, -1.0) != np.sign(y)).astype(np.float64)


def progressive_validation(learner: OnlineRegressorBase,
                           stream: Iterable[tuple[ArrayLike, ArrayLike]], *,
                           comparator: Callable[[np.ndarray], ArrayLike] | ArrayLike | None = None,
                           loss: str = "squared", time_limit: float | None = None,
                           verbose: int = 0) -> ProgressiveResult:
    """Play the rounds of ``stream`` with ``learner`` under the strict protocol.

    Each chunk ``(X_c, y_c)`` of the stream is validated, then every row is played: the learner
    sees ``x_t``, predicts, then receives ``y_t``. Works with any iterable of chunks (e.g. a CSV
    read with ``pandas.read_csv(..., chunksize=...)`` and split into features and label), so the
    stream never has to fit in memory (the Taylor learner keeps O(r²) state).

    Parameters
    ----------
    learner : online learner of :mod:`kernelflow.online`
        Fresh learners start from scratch; fitted ones continue.
    stream : iterable of (X_chunk, y_chunk)
        2-D inputs and 1-D labels per chunk (NumPy, pandas or torch).
    comparator : callable or array-like, default=None
        A fixed function f: ``f(X_chunk) -> predictions``, or the array of ``f(x_t)`` for all
        rounds; gives the regret curve.
    loss : {"squared", "zero_one"}, default="squared"
        The recorded loss (the learners always minimise the square loss).
    time_limit : float, default=None
        Stop after the first chunk that ends past this many seconds (the paper's timeout).
    verbose : int, default=0

    Returns
    -------
    result : ProgressiveResult

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.online import PKAWVTaylor
    >>> from kernelflow.online.evaluate import iter_chunks, progressive_validation
    >>> rng = np.random.RandomState(0)
    >>> X = rng.uniform(-1, 1, size=(1000, 2)); y = np.sin(3 * X[:, 0])
    >>> res = progressive_validation(PKAWVTaylor(degree=3), iter_chunks(X, y, 250))
    >>> res.n_rounds, round(float(res.average_loss[-1]), 3)
    (1000, 0.054)
    """
    if loss not in ("squared", "zero_one"):
        raise ValueError(f"loss must be 'squared' or 'zero_one', got {loss!r}")
    ys: list[np.ndarray] = []
    ps: list[np.ndarray] = []
    ts: list[np.ndarray] = []
    fs: list[np.ndarray] = []
    offset = 0.0
    truncated = False
    n_done = 0
    with progress(stream, desc=type(learner).__name__, verbose=verbose) as bar:
        for X_c, y_c in bar:
            Xn, yn, _, _ = learner._start(X_c, y_c, reset=not hasattr(learner, "n_rounds_"))
            preds = np.empty(Xn.shape[0])
            stamps = np.empty(Xn.shape[0])
            start = time.perf_counter()

            def clock(t: int, stamps: np.ndarray = stamps, start: float = start) -> None:
                stamps[t] = time.perf_counter() - start

            learner._run(Xn, yn, preds, clock)
            ys.append(yn)
            ps.append(preds)
            ts.append(stamps + offset)
            offset += float(stamps[-1]) if stamps.size else 0.0
            if comparator is not None and callable(comparator):
                fs.append(np.asarray(comparator(Xn), dtype=np.float64).reshape(-1))
            n_done += Xn.shape[0]
            if time_limit is not None and offset > time_limit:
                truncated = True
                break
    y_true = np.concatenate(ys) if ys else np.zeros(0)
    y_pred = np.concatenate(ps) if ps else np.zeros(0)
    losses = _loss(y_true, y_pred, loss)
    cum = np.cumsum(losses)
    regret = None
    if comparator is not None:
        f = np.concatenate(fs) if fs else np.asarray(comparator, dtype=np.float64)[:n_done]
        regret = cum - np.cumsum(_loss(y_true, f, loss))
    return ProgressiveResult(
        y_true=y_true, y_pred=y_pred, losses=losses, cumulative_loss=cum,
        average_loss=cum / np.arange(1, cum.size + 1), elapsed=np.concatenate(ts) if ts else
        np.zeros(0), regret=regret, truncated=truncated,
    )
