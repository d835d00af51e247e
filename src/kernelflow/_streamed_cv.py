"""K-fold cross-validation of a data set that is read block by block, never held whole.

Folds are defined by a row's global position alone, so they need no pass over the data and no
array of n fold labels. The positions are cut into consecutive chunks of ``n_folds`` rows, and
inside each chunk the rows are dealt to the folds in a seeded random order: row ``p`` of chunk
``c = p // K`` goes to fold ``rank of h(p) among h(cK), ..., h(cK + K - 1)``, with ``h`` the
seeded position hash :func:`~kernelflow.sources.row_hash_uniform`. Every chunk therefore gives
one row to each fold: fold sizes differ by at most one (as in scikit-learn's ``KFold``), a fold
is empty only when there are fewer rows than folds, and the assignment depends neither on the
block size nor on how the data set is cut into files or row groups. Cost O(b + K) per block.

:class:`FoldSource` is the training side (every fold but one) or the held-out side (one fold) of
any :class:`~kernelflow.sources.DataSource`, with its rows numbered 0, 1, ... in order, as an
:class:`~kernelflow.sources.ArraySource` of the same rows would be; :class:`ScoreSums` holds the
sums from which the usual regression scores and the accuracy are computed over a stream, each
equal to scikit-learn's scorer on the same rows; :class:`StandardisedSource` applies a fitted
``StandardScaler``'s statistics to every block, so a scaled model learns from a stream too.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from .sources import Block, DataSource, row_hash_uniform

__all__ = ["STREAMED_SCORERS", "fold_of", "fold_sizes", "FoldSource", "ScoreSums",
           "StandardisedSource"]

#: scikit-learn scorer names that :class:`ScoreSums` computes from sums over blocks
STREAMED_SCORERS = ("r2", "neg_mean_squared_error", "neg_root_mean_squared_error",
                    "neg_mean_absolute_error", "accuracy")


def _check_folds(n_folds: int) -> int:
    if isinstance(n_folds, bool) or not isinstance(n_folds, int | np.integer) or n_folds < 2:
        raise ValueError(f"n_folds must be an integer >= 2, got {n_folds!r}.")
    return int(n_folds)


def fold_of(positions: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """The fold (0 .. n_folds - 1) of each global row position.

    Row ``p`` is dealt to a fold inside its chunk ``p // n_folds`` by the rank of its seeded
    position hash among the chunk's ``n_folds`` hashes, so each chunk fills every fold once.
    Cost O(n_folds) per chunk touched: O(len(positions) + n_folds) for a block of consecutive
    rows.

    Examples
    --------
    >>> import numpy as np
    >>> f = fold_of(np.arange(12), 4, seed=0)
    >>> sorted(f[:4].tolist()), np.bincount(f).tolist()
    ([0, 1, 2, 3], [3, 3, 3, 3])
    """
    k = _check_folds(n_folds)
    p = np.asarray(positions, dtype=np.int64)
    if p.size == 0:
        return np.zeros(0, dtype=np.int64)
    if int(p.min()) < 0:
        raise ValueError("row positions must be non-negative.")
    chunk = p // k
    chunks = np.unique(chunk)
    rows = (chunks[:, None] * k + np.arange(k)).ravel()
    u = row_hash_uniform(rows, seed).reshape(len(chunks), k)
    ranks = np.argsort(np.argsort(u, axis=1, kind="stable"), axis=1, kind="stable")
    return ranks[np.searchsorted(chunks, chunk), p % k]


def fold_sizes(n_samples: int, n_folds: int, seed: int) -> np.ndarray:
    """Number of rows of each fold among positions 0 .. n_samples - 1. Cost O(n_folds).

    Examples
    --------
    >>> fold_sizes(11, 4, seed=0).sum(), sorted(fold_sizes(11, 4, seed=0).tolist())
    (np.int64(11), [2, 3, 3, 3])
    """
    k = _check_folds(n_folds)
    full = int(n_samples) // k
    rest = fold_of(np.arange(full * k, int(n_samples)), k, seed)
    return full + np.bincount(rest, minlength=k).astype(np.int64)


class FoldSource(DataSource):
    """One side of fold ``fold`` of ``source``: its held-out rows, or all the others.

    Rows keep their order and are numbered 0, 1, ... (``Block.start``), so :meth:`take` and
    every estimator see the same data as an in-memory array of these rows. ``n_samples`` is
    known without a pass (:func:`fold_sizes`). A pass reads ``source`` once.

    A side without rows (fewer rows than folds) is refused with ``ValueError``.

    Parameters
    ----------
    source : DataSource
    n_folds : int
    fold : int
        The held-out fold, 0 <= fold < n_folds.
    seed : int
        Seed of the assignment (:func:`fold_of`).
    held_out : bool
        True: the rows of ``fold``; False: the rows of every other fold.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.sources import ArraySource
    >>> src = ArraySource(np.arange(20.0).reshape(10, 2), np.arange(10.0))
    >>> test = FoldSource(src, 3, 0, seed=0, held_out=True)
    >>> train = FoldSource(src, 3, 0, seed=0, held_out=False)
    >>> test.n_samples + train.n_samples, [b.start for b in train.iter_blocks(4)]
    (10, [0, 2, 5])
    """

    def __init__(self, source: DataSource, n_folds: int, fold: int, seed: int, *,
                 held_out: bool):
        k = _check_folds(n_folds)
        if not 0 <= int(fold) < k:
            raise ValueError(f"fold must be in [0, {k}), got {fold}.")
        self.source, self.n_folds, self.fold = source, k, int(fold)
        self.seed, self.held_out = int(seed), bool(held_out)
        self.n_features = source.n_features
        self.n_outputs = source.n_outputs
        n = source.n_samples
        size = int(fold_sizes(n, k, self.seed)[self.fold])
        self._n_samples = size if self.held_out else n - size
        if self._n_samples == 0:
            raise ValueError(f"fold {self.fold + 1} of {k} has no "
                             f"{'held-out' if self.held_out else 'training'} rows: {n} row(s) "
                             f"cannot fill {k} folds.")

    @property
    def has_weights(self) -> bool:
        return self.source.has_weights

    def _masked(self, blocks: Iterator[Block]) -> Iterator[Block]:
        position = 0
        for b in blocks:
            fold = fold_of(np.arange(b.start, b.start + b.X.shape[0]), self.n_folds, self.seed)
            keep = (fold == self.fold) if self.held_out else (fold != self.fold)
            m = torch.from_numpy(keep).to(b.X.device)
            size = int(keep.sum())
            if size == 0:
                continue
            yield Block(b.X[m], None if b.y is None else b.y[m],
                        None if b.sample_weight is None else b.sample_weight[m], position)
            position += size

    def _raw_blocks(self, block_size: int) -> Iterator[Block]:
        return self._masked(self.source._raw_blocks(block_size))

    def iter_blocks(self, block_size: int | None = None, *, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> Iterator[Block]:
        """The parent's blocks (read in ``dtype`` on ``device``) restricted to this side."""
        return self._masked(self.source.iter_blocks(block_size, dtype=dtype, device=device))


class StandardisedSource(DataSource):
    """The rows of ``source`` with features ``(x - mean) / scale``, computed in float64.

    The same operations, in the same order, as scikit-learn's ``StandardScaler.transform``
    (``mean`` or ``scale`` None: that step is skipped), so an estimator fitted on this source
    sees exactly the standardised array. Blocks keep their ``start``; a pass reads ``source``
    once.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.sources import ArraySource
    >>> src = StandardisedSource(ArraySource(np.array([[1.0], [3.0]]), np.zeros(2)),
    ...                          np.array([2.0]), np.array([0.5]))
    >>> next(src.iter_blocks()).X[:, 0].tolist()
    [-2.0, 2.0]
    """

    def __init__(self, source: DataSource, mean: np.ndarray | None, scale: np.ndarray | None):
        self.source = source
        self.mean = None if mean is None else torch.as_tensor(mean, dtype=torch.float64)
        self.scale = None if scale is None else torch.as_tensor(scale, dtype=torch.float64)
        self.n_features = source.n_features
        self.n_outputs = source.n_outputs
        self._n_samples = source.n_samples

    @property
    def has_weights(self) -> bool:
        return self.source.has_weights

    def _standardised(self, X: torch.Tensor) -> torch.Tensor:
        X = X.to(torch.float64)
        if self.mean is not None:
            X = X - self.mean.to(X.device)
        if self.scale is not None:
            X = X / self.scale.to(X.device)
        return X

    def _raw_blocks(self, block_size: int) -> Iterator[Block]:
        for b in self.source.iter_blocks(block_size, dtype=torch.float64):
            yield Block(self._standardised(b.X), b.y, b.sample_weight, b.start)

    def iter_blocks(self, block_size: int | None = None, *, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> Iterator[Block]:
        """The parent's blocks, read in float64, standardised, then cast to ``dtype``."""
        to = dtype or torch.float64
        for b in self.source.iter_blocks(block_size, dtype=torch.float64, device=device):
            yield Block(self._standardised(b.X).to(to), None if b.y is None else b.y.to(to),
                        None if b.sample_weight is None else b.sample_weight.to(to), b.start)

    def take(self, indices) -> torch.Tensor:
        return self._standardised(self.source.take(indices))


class ScoreSums:
    """Running sums of (target, prediction) blocks giving scikit-learn's scores over a stream.

    The target's mean and centred sum of squares are merged block by block (Chan et al.'s
    pairwise update, as stable as a two-pass sum), beside the sums of squared and absolute
    residuals and of exact matches. ``score(name)`` gives the value of scikit-learn's scorer
    ``name`` on all rows added (errors negated, as the ``neg_`` scorers are); a constant target
    gets R^2 = 1 for a perfect fit and 0 otherwise, as scikit-learn's ``r2_score``. One target
    column. Memory O(1).

    Examples
    --------
    >>> import numpy as np
    >>> sums = ScoreSums()
    >>> sums.add(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    >>> sums.add(np.array([3.0]), np.array([2.5]))
    >>> round(sums.score("r2"), 6), round(sums.score("neg_mean_absolute_error"), 6)
    (0.75, -0.333333)
    """

    def __init__(self) -> None:
        self.n = 0
        self.mean = self.m2 = self.sse = self.sae = 0.0
        self.hits = 0

    def add(self, y: np.ndarray, pred: np.ndarray) -> None:
        """Add one block: ``y`` of shape (b,) or (b, 1), ``pred`` with b values."""
        y = np.asarray(y)
        pred = np.asarray(pred)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or pred.size != y.size:
            raise ValueError(f"streamed scores take one target column: got targets of shape "
                             f"{y.shape} and predictions of shape {pred.shape}.")
        pred = pred.reshape(y.shape)
        b = y.size
        if b == 0:
            return
        self.hits += int(np.sum(pred == y))
        if y.dtype.kind not in "biuf" or pred.dtype.kind not in "biuf":
            self.n += b  # labels that are not numbers: accuracy only
            return
        yf, r = y.astype(np.float64), y.astype(np.float64) - pred.astype(np.float64)
        self.sse += float(np.sum(r * r))
        self.sae += float(np.sum(np.abs(r)))
        mean_b = float(np.mean(yf))
        m2_b = float(np.sum((yf - mean_b) ** 2))
        n = self.n + b
        delta = mean_b - self.mean
        self.mean += delta * b / n
        self.m2 += m2_b + delta * delta * self.n * b / n
        self.n = n

    def score(self, name: str) -> float:
        """scikit-learn's scorer ``name`` (one of :data:`STREAMED_SCORERS`) on the rows added."""
        if name not in STREAMED_SCORERS:
            raise ValueError(f"the score {name!r} cannot be computed from a stream; streamed "
                             f"scores: {', '.join(STREAMED_SCORERS)}.")
        if self.n == 0:
            raise ValueError("no rows were scored.")
        if name == "accuracy":
            return self.hits / self.n
        if name == "r2":
            if self.m2 == 0.0:
                return 1.0 if self.sse == 0.0 else 0.0
            return 1.0 - self.sse / self.m2
        mse = self.sse / self.n
        return -{"neg_mean_squared_error": mse, "neg_root_mean_squared_error": float(np.sqrt(mse)),
                 "neg_mean_absolute_error": self.sae / self.n}[name]
