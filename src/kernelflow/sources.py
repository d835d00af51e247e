"""Data sources: one "iterate row blocks" interface for in-memory and out-of-core data.

Every streaming solver (Nyström conjugate gradients, the robust Nyström gradient methods) reads
its training rows only through :meth:`DataSource.iter_blocks`, which yields :class:`Block` tuples
``(X, y, sample_weight, start)`` of at most ``block_size`` rows and can be called again for every
iteration. Three sources cover the usual cases:

* :class:`ArraySource`: NumPy arrays, pandas frames or torch tensors held in memory;
* :class:`MemmapSource`: ``.npy`` files (or ``np.memmap`` arrays) read lazily, block by block;
* :class:`ChunkSource`: a re-iterable (list, or a callable returning a fresh iterator) of
  ``(X, y)`` or ``(X, y, sample_weight)`` chunks, e.g. read from parquet files or a database.

A data-parallel run gives every process a source holding its own shard; the solvers sum their
per-block contributions and reduce them across processes.

Rows are identified by their global position ``start + i``. :meth:`DataSource.split` uses a hash of
that position to send a fixed fraction of rows to a validation subset, so the split does not depend
on the block size or on how a stream is chunked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "Block",
    "DataSource",
    "ArraySource",
    "MemmapSource",
    "ChunkSource",
    "SubsetSource",
    "as_source",
    "row_hash_uniform",
]

_DEFAULT_BLOCK = 8192


class Block(NamedTuple):
    """One block of rows: ``X`` (b, d), ``y`` (b, t) or None, ``sample_weight`` (b,) or None.

    ``start`` is the global index of the block's first row in the underlying source.
    """

    X: torch.Tensor
    y: torch.Tensor | None
    sample_weight: torch.Tensor | None
    start: int


def row_hash_uniform(index: np.ndarray, seed: int) -> np.ndarray:
    """Map integer row indices to pseudo-random numbers in [0, 1) (splitmix64 finaliser).

    Deterministic in ``(index, seed)`` only, so a validation split is the same whatever the block
    size, the chunking of a stream or the number of processes. Cost O(len(index)).

    Examples
    --------
    >>> import numpy as np
    >>> u = row_hash_uniform(np.arange(5), seed=0)
    >>> bool(((u >= 0) & (u < 1)).all()), len(set(u.tolist()))
    (True, 5)
    """
    z = np.asarray(index, dtype=np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(2**53)


def _as_tensor(a, name: str) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    if hasattr(a, "to_numpy"):  # pandas
        a = a.to_numpy()
    a = np.asarray(a)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be numeric, got dtype {a.dtype}.")
    return torch.from_numpy(np.ascontiguousarray(a))


def _check_block(X, y, w, n_features, n_outputs, where: str):
    if X.ndim != 2:
        raise ValueError(f"X in {where} must be 2-D, got shape {tuple(X.shape)}.")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(
            f"X in {where} has {X.shape[1]} features, expected {n_features} as in earlier rows."
        )
    if not torch.isfinite(X).all():
        raise ValueError(f"X in {where} contains NaN or infinity.")
    if y is not None:
        if y.shape[0] != X.shape[0]:
            raise ValueError(
                f"y in {where} has {y.shape[0]} rows but X has {X.shape[0]} rows."
            )
        if n_outputs is not None and y.shape[1] != n_outputs:
            raise ValueError(f"y in {where} has {y.shape[1]} outputs, expected {n_outputs}.")
        if not torch.isfinite(y).all():
            raise ValueError(f"y in {where} contains NaN or infinity.")
    if w is not None:
        if w.shape != (X.shape[0],):
            raise ValueError(
                f"sample_weight in {where} must have shape ({X.shape[0]},), got {tuple(w.shape)}."
            )
        if not torch.isfinite(w).all() or bool((w < 0).any()):
            raise ValueError(f"sample_weight in {where} must be finite and non-negative.")


def _y2d(y: torch.Tensor | None) -> torch.Tensor | None:
    if y is None:
        return None
    return y.reshape(-1, 1) if y.ndim == 1 else y


class DataSource:
    """Base class: a re-iterable collection of rows read in blocks.

    Subclasses implement :meth:`_raw_blocks` (blocks in the stored dtype) and set
    ``n_features`` and ``n_outputs`` (0 when there are no targets); ``n_samples`` may be computed
    lazily. Targets are always 2-D, shape (b, n_outputs).
    """

    n_features: int
    n_outputs: int
    _n_samples: int | None

    @property
    def n_samples(self) -> int:
        n = getattr(self, "_n_samples", None)
        if n is None:
            n = sum(b.X.shape[0] for b in self._raw_blocks(_DEFAULT_BLOCK * 8))
            self._n_samples = n
        return n

    @property
    def has_weights(self) -> bool:
        return False

    def _raw_blocks(self, block_size: int) -> Iterator[Block]:
        raise NotImplementedError

    def iter_blocks(
        self,
        block_size: int | None = None,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> Iterator[Block]:
        """Yield :class:`Block` s of at most ``block_size`` rows, converted to ``dtype``/``device``.

        Every call starts a fresh pass over the data. Cost: one read of the rows.
        """
        block_size = int(block_size or _DEFAULT_BLOCK)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}.")
        for b in self._raw_blocks(block_size):
            yield Block(
                _convert(b.X, dtype, device),
                _convert(b.y, dtype, device),
                _convert(b.sample_weight, dtype, device),
                b.start,
            )

    def take(self, indices) -> torch.Tensor:
        """Rows ``X[indices]`` (global positions), in the order given. Cost: one pass at most."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        parts, pos = [], 0
        for b in self._raw_blocks(_DEFAULT_BLOCK * 8):
            stop = b.start + b.X.shape[0]
            hi = int(np.searchsorted(sorted_idx, stop, side="left"))
            if hi > pos:
                parts.append(b.X[torch.from_numpy(sorted_idx[pos:hi] - b.start)])
                pos = hi
            if pos == len(sorted_idx):
                break
        if pos != len(sorted_idx):
            raise IndexError(f"row index {int(sorted_idx[pos])} is out of range.")
        rows = torch.cat(parts) if parts else torch.empty(0, self.n_features)
        out = torch.empty_like(rows)
        out[torch.from_numpy(order)] = rows
        return out

    def split(self, fraction: float, seed: int) -> tuple[SubsetSource, SubsetSource]:
        """Split rows into (train, validation) by hashing their global positions.

        About ``fraction`` of the rows go to the validation subset; the assignment depends only on
        ``(row position, seed)``.
        """
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction must be in (0, 1), got {fraction}.")

        def is_val(start, size):
            return row_hash_uniform(np.arange(start, start + size), seed) < fraction

        return (
            SubsetSource(self, lambda s, b: ~is_val(s, b)),
            SubsetSource(self, is_val),
        )


def _convert(t, dtype, device):
    if t is None:
        return None
    if dtype is not None and not t.dtype.is_floating_point:
        return t.to(dtype=dtype, device=device)
    return t.to(dtype=dtype or t.dtype, device=device)


class ArraySource(DataSource):
    """Rows held in memory (NumPy array, pandas frame or torch tensor).

    Parameters
    ----------
    X : array-like or Tensor of shape (n_samples, n_features)
    y : array-like or Tensor of shape (n_samples,) or (n_samples, n_outputs), default=None
    sample_weight : array-like or Tensor of shape (n_samples,), default=None

    Examples
    --------
    >>> import numpy as np
    >>> src = ArraySource(np.arange(10.0).reshape(5, 2), np.arange(5.0))
    >>> [tuple(b.X.shape) for b in src.iter_blocks(2)]
    [(2, 2), (2, 2), (1, 2)]
    """

    def __init__(self, X, y=None, sample_weight=None, *, validate: bool = True):
        self.X = _as_tensor(X, "X")
        self.y = None if y is None else _y2d(_as_tensor(y, "y"))
        self.sample_weight = None if sample_weight is None else _as_tensor(sample_weight, "w")
        if validate:
            _check_block(self.X, self.y, self.sample_weight, None, None, "ArraySource")
        if self.X.shape[0] == 0:
            raise ValueError("ArraySource needs at least one row, got 0.")
        self.n_features = int(self.X.shape[1])
        self.n_outputs = 0 if self.y is None else int(self.y.shape[1])
        self._n_samples = int(self.X.shape[0])

    @property
    def has_weights(self) -> bool:
        return self.sample_weight is not None

    def _raw_blocks(self, block_size):
        n = self._n_samples
        for s in range(0, n, block_size):
            e = min(s + block_size, n)
            yield Block(
                self.X[s:e],
                None if self.y is None else self.y[s:e],
                None if self.sample_weight is None else self.sample_weight[s:e],
                s,
            )

    def take(self, indices) -> torch.Tensor:
        return self.X[torch.as_tensor(np.asarray(indices, dtype=np.int64))]


class MemmapSource(DataSource):
    """Rows read lazily from ``.npy`` files (memory-mapped), one block at a time.

    Only the rows of the current block are resident; the operating system pages the rest in and
    out, so files larger than memory work.

    Parameters
    ----------
    X : str, os.PathLike or np.ndarray (e.g. ``np.memmap``) of shape (n_samples, n_features)
    y : str, os.PathLike, array-like or None, default=None
    sample_weight : str, os.PathLike, array-like or None, default=None
    validate : bool, default=True
        Check each block for NaN/inf as it is read (cheap beside the kernel products).

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "X.npy")
    >>> np.save(path, np.ones((7, 3)))
    >>> src = MemmapSource(path, np.zeros(7))
    >>> src.n_samples, [b.X.shape[0] for b in src.iter_blocks(4)]
    (7, [4, 3])
    """

    def __init__(self, X, y=None, sample_weight=None, *, validate: bool = True):
        self.X = _open(X, "X")
        if self.X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {self.X.shape}.")
        if self.X.shape[0] == 0:
            raise ValueError("MemmapSource needs at least one row, got 0.")
        self.y = None if y is None else _open(y, "y")
        self.sample_weight = None if sample_weight is None else _open(sample_weight, "w")
        n = self.X.shape[0]
        for name, a in (("y", self.y), ("sample_weight", self.sample_weight)):
            if a is not None and a.shape[0] != n:
                raise ValueError(f"{name} has {a.shape[0]} rows but X has {n} rows.")
        self.validate = validate
        self.n_features = int(self.X.shape[1])
        self.n_outputs = 0 if self.y is None else (1 if self.y.ndim == 1 else int(self.y.shape[1]))
        self._n_samples = int(n)

    @property
    def has_weights(self) -> bool:
        return self.sample_weight is not None

    def _raw_blocks(self, block_size):
        n = self._n_samples
        for s in range(0, n, block_size):
            e = min(s + block_size, n)
            X = _as_tensor(np.array(self.X[s:e]), "X")
            y = None if self.y is None else _y2d(_as_tensor(np.array(self.y[s:e]), "y"))
            w = (None if self.sample_weight is None
                 else _as_tensor(np.array(self.sample_weight[s:e]), "w"))
            if self.validate:
                _check_block(X, y, w, self.n_features, self.n_outputs, f"rows {s}:{e}")
            yield Block(X, y, w, s)

    def take(self, indices) -> torch.Tensor:
        idx = np.asarray(indices, dtype=np.int64).ravel()
        return _as_tensor(np.array(self.X[np.sort(idx)]), "X")[
            torch.from_numpy(np.argsort(np.argsort(idx, kind="stable"), kind="stable"))
        ]


def _open(a, name):
    if isinstance(a, str | os.PathLike):
        return np.load(os.fspath(a), mmap_mode="r")
    if isinstance(a, torch.Tensor):
        return a.numpy()
    a = a.to_numpy() if hasattr(a, "to_numpy") else np.asarray(a)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be numeric, got dtype {a.dtype}.")
    return a


class ChunkSource(DataSource):
    """Rows from a stream of ``(X, y)`` or ``(X, y, sample_weight)`` chunks.

    Parameters
    ----------
    chunks : callable or re-iterable
        Either a function with no arguments returning a fresh iterator of chunks (called once per
        pass), or a re-iterable object such as a list. A one-shot iterator (e.g. a generator
        object) cannot feed an iterative solver and is refused with ``TypeError``.
    n_samples : int or None, default=None
        Number of rows, if known; otherwise counted by one pass when first needed.

    Examples
    --------
    >>> import numpy as np
    >>> def read():
    ...     for i in range(3):
    ...         yield np.full((4, 2), i, float), np.full(4, i, float)
    >>> src = ChunkSource(read)
    >>> src.n_samples, [b.start for b in src.iter_blocks(3)]
    (12, [0, 3, 4, 7, 8, 11])
    """

    def __init__(self, chunks: Callable[[], Iterable] | Iterable, *, n_samples: int | None = None):
        if callable(chunks) and not hasattr(chunks, "__iter__"):
            self._factory = chunks
        elif hasattr(chunks, "__iter__"):
            if iter(chunks) is chunks:
                raise TypeError(
                    "chunks is a one-shot iterator; pass a list of chunks or a function that "
                    "returns a fresh iterator, so that every solver iteration can read the data."
                )
            self._factory = lambda: iter(chunks)
        else:
            raise TypeError(f"chunks must be callable or iterable, got {type(chunks).__name__}.")
        self._n_samples = n_samples
        first = self._first_chunk()
        self.n_features = int(first[0].shape[1])
        self.n_outputs = 0 if first[1] is None else int(first[1].shape[1])

    def _chunks(self):
        for i, chunk in enumerate(self._factory()):
            if not isinstance(chunk, tuple | list) or len(chunk) not in (1, 2, 3):
                raise TypeError(
                    f"chunk {i} must be a tuple (X,), (X, y) or (X, y, sample_weight), got "
                    f"{type(chunk).__name__}."
                )
            X = _as_tensor(chunk[0], "X")
            y = _y2d(_as_tensor(chunk[1], "y")) if len(chunk) > 1 and chunk[1] is not None else None
            w = _as_tensor(chunk[2], "w") if len(chunk) > 2 and chunk[2] is not None else None
            yield X, y, w

    def _first_chunk(self):
        for X, y, w in self._chunks():
            _check_block(X, y, w, None, None, "chunk 0")
            return X, y, w
        raise ValueError("the chunk stream is empty.")

    def _raw_blocks(self, block_size):
        start = 0
        for i, (X, y, w) in enumerate(self._chunks()):
            _check_block(X, y, w, self.n_features, self.n_outputs, f"chunk {i}")
            if (y is None) != (self.n_outputs == 0):
                raise ValueError(f"chunk {i} {'lacks' if y is None else 'has'} targets, unlike "
                                 "chunk 0.")
            for s in range(0, X.shape[0], block_size):
                e = min(s + block_size, X.shape[0])
                yield Block(X[s:e], None if y is None else y[s:e],
                            None if w is None else w[s:e], start + s)
            start += X.shape[0]
        if self._n_samples is None:
            self._n_samples = start

    @property
    def has_weights(self) -> bool:
        for _, _, w in self._chunks():
            return w is not None
        return False


class SubsetSource(DataSource):
    """The rows of ``source`` for which ``keep(start, size)`` (a boolean mask) is True.

    Used by :meth:`DataSource.split`; blocks keep the ``start`` of the underlying block.
    """

    def __init__(self, source: DataSource, keep: Callable[[int, int], np.ndarray] | None):
        self.source = source
        self.keep = keep
        self.n_features = source.n_features
        self.n_outputs = source.n_outputs
        self._n_samples = None

    @property
    def has_weights(self) -> bool:
        return self.source.has_weights

    def _mask(self, block: Block) -> np.ndarray:
        """The rows of ``block`` to keep (subclasses may decide from the block's content)."""
        if self.keep is None:
            raise NotImplementedError("SubsetSource needs keep or a subclass overriding _mask.")
        return np.asarray(self.keep(block.start, block.X.shape[0]), dtype=bool)

    def _raw_blocks(self, block_size):
        for b in self.source._raw_blocks(block_size):
            m = torch.from_numpy(self._mask(b))
            if not bool(m.any()):
                continue
            yield Block(b.X[m], None if b.y is None else b.y[m],
                        None if b.sample_weight is None else b.sample_weight[m], b.start)

    def take(self, indices) -> torch.Tensor:
        raise NotImplementedError("take is not defined on a subset; select from its parent.")


def as_source(X, y=None, sample_weight=None) -> DataSource:
    """Turn ``X`` (a source, array, tensor, ``.npy`` path or chunk stream) into a DataSource.

    Examples
    --------
    >>> import numpy as np
    >>> as_source(np.zeros((3, 2)), np.zeros(3)).n_samples
    3
    """
    if isinstance(X, DataSource):
        if y is not None or sample_weight is not None:
            raise ValueError("a DataSource carries its own y and sample_weight; pass y=None.")
        return X
    if isinstance(X, str | os.PathLike) or isinstance(X, np.memmap):
        return MemmapSource(X, y, sample_weight)
    if callable(X) and not hasattr(X, "shape"):
        return ChunkSource(X)
    return ArraySource(X, y, sample_weight)
