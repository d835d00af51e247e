"""Row shards: each process reads only its own rows of a data set.

The rows of a data set of n rows are split into contiguous, balanced ranges, process r holding
rows [floor(r n / p), floor((r + 1) n / p)). :class:`ShardSource` wraps the process's rows (any
:class:`kernelflow.sources.DataSource`) and presents the *global* data set to the solvers:

* blocks carry their global row positions, so the holdout split of a stream
  (:func:`kernelflow.utils.holdout.split_holdout`) is the same as on one process;
* ``n_samples`` is the global row count and :meth:`ShardSource.take` fetches rows by global
  position from whichever process holds them (one all-reduce of the requested rows only).

Each process iterates its own blocks; the solvers sum per-block contributions and all-reduce them
(:func:`kernelflow.collectives.all_reduce_sum`), so nothing ever gathers the data set.
Constructing a shard is a collective operation: all processes build theirs at the same point, and
shards whose number of features, targets, weights or dtype disagree raise ``ValueError`` on every
process (instead of a hang or a wrong result later).

Helpers: :func:`shard_arrays` (in-memory arrays), :func:`shard_npy` (memory-mapped ``.npy``
files, only the process's rows are paged in) and :func:`shard_parquet` (Parquet data sets:
each process gets whole row groups, :func:`row_group_shards`, and reads only those, once per
pass).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..collectives import all_reduce_sum, is_distributed, rank, world_size
from ..sources import ArraySource, Block, DataSource, MemmapSource

__all__ = ["shard_range", "ShardSource", "shard_arrays", "shard_npy", "shard_parquet",
           "row_group_shards", "check_consistent"]

_DTYPE_CODES = {torch.float64: 1, torch.float32: 2, torch.float16: 3, torch.bfloat16: 4}


def shard_range(n: int, rank_: int | None = None, world_size_: int | None = None
                ) -> tuple[int, int]:
    """Rows ``[start, stop)`` of process ``rank_`` among ``world_size_`` (balanced, contiguous).

    Defaults to this process's rank and the group size. Cost O(1).

    Examples
    --------
    >>> [shard_range(10, r, 3) for r in range(3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    r = rank() if rank_ is None else int(rank_)
    p = world_size() if world_size_ is None else int(world_size_)
    if not 0 <= r < p:
        raise ValueError(f"rank {r} is outside [0, {p}).")
    return (int(n) * r) // p, (int(n) * (r + 1)) // p


def _gather_rows(values: Sequence[float]) -> torch.Tensor:
    """(world, k) float64 table whose row r holds process r's ``values`` (one all-reduce)."""
    table = torch.zeros(world_size(), len(values), dtype=torch.float64)
    table[rank()] = torch.as_tensor(list(values), dtype=torch.float64)
    return all_reduce_sum(table)


def check_consistent(what: str, **values: float) -> None:
    """Raise ``ValueError`` on every process if ``values`` differ across processes (collective).

    Examples
    --------
    >>> check_consistent("demo", n_features=3)  # one process: nothing to compare
    """
    if not is_distributed():
        return
    table = _gather_rows(list(values.values()))
    bad = [name for j, name in enumerate(values) if not bool((table[:, j] == table[0, j]).all())]
    if bad:
        per_rank = "; ".join(
            f"rank {r}: " + ", ".join(f"{name}={table[r, j]:g}" for j, name in enumerate(values)
                                      if name in bad) for r in range(table.shape[0]))
        raise ValueError(f"{what} disagree across processes ({', '.join(bad)}): {per_rank}.")


class ShardSource(DataSource):
    """This process's rows of a data set split across processes, seen as the global data set.

    Parameters
    ----------
    local : DataSource
        The rows this process holds (may be empty only if it has no rows, see ``n_local``).
    offset : int, optional
        Global position of the first local row; default: the number of rows on lower ranks
        (one all-reduce of the row counts).
    n_total : int, optional
        Global number of rows; default: the sum of the row counts.

    Attributes
    ----------
    n_samples : int
        Global number of rows (all processes).
    n_local : int
        Rows held by this process.
    offset : int

    Notes
    -----
    Construction is collective and checks that every shard has the same number of features,
    targets, sample-weight presence and dtype. :meth:`take` is collective too (all processes
    must call it with the same indices); the Nyström estimators call it to draw centre
    candidates, so every process selects the same centres from the global data set.

    Examples
    --------
    >>> import numpy as np
    >>> from kernelflow.sources import ArraySource
    >>> src = ShardSource(ArraySource(np.arange(8.0).reshape(4, 2), np.zeros(4)))
    >>> src.n_samples, src.offset, [b.start for b in src.iter_blocks(3)]
    (4, 0, [0, 3])
    """

    def __init__(self, local: DataSource, *, offset: int | None = None,
                 n_total: int | None = None):
        if not isinstance(local, DataSource):
            raise TypeError(f"local must be a DataSource, got {type(local).__name__}.")
        self.local = local
        self.n_features = int(local.n_features)
        self.n_outputs = int(local.n_outputs)
        n_local = int(local.n_samples)
        dtype = _source_dtype(local)
        check_consistent("data shards", n_features=self.n_features, n_outputs=self.n_outputs,
                         sample_weight=float(local.has_weights),
                         dtype=_DTYPE_CODES.get(dtype, 0))
        counts = _gather_rows([n_local])[:, 0].to(torch.int64) if is_distributed() else \
            torch.tensor([n_local])
        self.offset = int(counts[: rank()].sum()) if offset is None else int(offset)
        self._n_samples = int(counts.sum()) if n_total is None else int(n_total)
        self.n_local = n_local
        self._dtype = dtype

    @property
    def has_weights(self) -> bool:
        return self.local.has_weights

    def _raw_blocks(self, block_size: int) -> Iterator[Block]:
        for b in self.local._raw_blocks(block_size):
            yield Block(b.X, b.y, b.sample_weight, b.start + self.offset)

    def take(self, indices) -> torch.Tensor:
        """Rows at global positions ``indices`` (collective: one all-reduce of those rows)."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size and (idx.min() < 0 or idx.max() >= self._n_samples):
            raise IndexError(f"row index out of range [0, {self._n_samples}).")
        mine = (idx >= self.offset) & (idx < self.offset + self.n_local)
        out = torch.zeros(idx.size, self.n_features, dtype=self._dtype)
        if mine.any():
            out[torch.from_numpy(mine)] = self.local.take(idx[mine] - self.offset).to(self._dtype)
        # each row is non-zero on exactly one process, so the sum is the row itself, exactly
        return all_reduce_sum(out)

    def local_arrays(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """This process's rows as tensors ``(X, y, sample_weight)`` (y 2-D), read in one pass."""
        parts = list(self.local._raw_blocks(1 << 16))
        if not parts:
            X = torch.empty(0, self.n_features, dtype=self._dtype)
            return X, (None if self.n_outputs == 0 else torch.empty(0, self.n_outputs)), None
        X = torch.cat([b.X for b in parts])
        ys = [b.y for b in parts if b.y is not None]
        ws = [b.sample_weight for b in parts if b.sample_weight is not None]
        y = torch.cat(ys) if len(ys) == len(parts) else None
        w = torch.cat(ws) if len(ws) == len(parts) else None
        return X, y, w


def _source_dtype(source: DataSource) -> torch.dtype:
    for b in source._raw_blocks(1):
        return b.X.dtype if b.X.dtype.is_floating_point else torch.float64
    return torch.float64


def shard_arrays(X, y=None, sample_weight=None) -> ShardSource:
    """This process's contiguous share of in-memory arrays (views, no copy), as a ShardSource.

    For data every process can address (e.g. a shared array); data that arrives already split
    goes straight into ``ShardSource(ArraySource(X_local, y_local))``. Collective.

    Examples
    --------
    >>> import numpy as np
    >>> src = shard_arrays(np.ones((5, 2)), np.zeros(5))
    >>> src.n_samples, src.n_local
    (5, 5)
    """
    n = len(X)
    start, stop = shard_range(n)
    if stop <= start:
        raise ValueError(f"{n} rows cannot give every one of {world_size()} processes a row.")
    part = ArraySource(X[start:stop], None if y is None else y[start:stop],
                       None if sample_weight is None else sample_weight[start:stop])
    return ShardSource(part, offset=start, n_total=n)


def shard_npy(X, y=None, sample_weight=None, *, validate: bool = True) -> ShardSource:
    """This process's rows of ``.npy`` files, memory-mapped: only those rows are ever read.

    Parameters
    ----------
    X : str or os.PathLike or np.ndarray of shape (n_samples, n_features)
    y : str or os.PathLike or np.ndarray of shape (n_samples,) or (n_samples, n_targets), optional
    sample_weight : str or os.PathLike or np.ndarray of shape (n_samples,), optional
    validate : bool, default=True
        Check each block for NaN/inf as it is read.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "X.npy"), np.ones((6, 2)))
    >>> np.save(os.path.join(d, "y.npy"), np.zeros(6))
    >>> shard_npy(os.path.join(d, "X.npy"), os.path.join(d, "y.npy")).n_samples
    6
    """
    arrays = [None if a is None else (np.load(os.fspath(a), mmap_mode="r")
                                      if isinstance(a, str | os.PathLike) else a)
              for a in (X, y, sample_weight)]
    X_arr = arrays[0]
    if X_arr is None:
        raise ValueError("X is required.")
    if X_arr.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {X_arr.shape}.")
    n = X_arr.shape[0]
    for name, a in zip(("y", "sample_weight"), arrays[1:], strict=True):
        if a is not None and a.shape[0] != n:
            raise ValueError(f"{name} has {a.shape[0]} rows but X has {n} rows.")
    start, stop = shard_range(n)
    if stop <= start:
        raise ValueError(f"{n} rows cannot give every one of {world_size()} processes a row.")
    parts = [None if a is None else a[start:stop] for a in arrays]
    return ShardSource(MemmapSource(*parts, validate=validate), offset=start, n_total=n)


def row_group_shards(groups: Sequence, n_total: int, world_size_: int) -> list[list]:
    """Whole row groups per process: group g goes to the rank whose row range holds its start.

    Every group goes to exactly one process, the groups of a process are contiguous (so its rows
    are a contiguous global range) and each process's row count is within one row group of
    ``n_total / world_size_``. ``groups`` are :class:`~kernelflow.parquet_source.RowGroup` s
    (anything with ``start``) in row order. Cost O(groups).

    Examples
    --------
    >>> from kernelflow.parquet_source import RowGroup
    >>> gs = [RowGroup("f", i, 4 * i, 4) for i in range(5)]
    >>> [[g.group for g in part] for part in row_group_shards(gs, 20, 2)]
    [[0, 1, 2], [3, 4]]
    """
    bounds = [shard_range(n_total, r, world_size_)[0] for r in range(world_size_)]
    parts: list[list] = [[] for _ in range(world_size_)]
    for g in groups:
        parts[int(np.searchsorted(bounds, g.start, side="right")) - 1].append(g)
    return parts


def shard_parquet(path, target: str | Sequence[str] | None = None, *,
                  features: Sequence[str] | None = None, sample_weight: str | None = None,
                  dtype=np.float64) -> ShardSource:
    """This process's row groups of a Parquet data set (a file, a directory, a glob or a list).

    Row positions follow the files in sorted order, then their row groups. Every process reads
    the footers, assigns whole row groups with :func:`row_group_shards` (the same assignment
    everywhere, no communication) and streams only its own groups, once per pass (nothing is
    cached). All checks of :class:`~kernelflow.parquet_source.ParquetSource` (missing columns,
    nulls, non-numeric columns, schemas differing across files, unreadable files) run on every
    process before any collective, so a bad data set fails everywhere with the same error.

    Parameters
    ----------
    path : str, os.PathLike or list of them
    target : str or list of str, optional
        Target column(s).
    features : list of str, optional
        Feature columns; default every column that is neither a target nor the weight.
    sample_weight : str, optional
        Weight column.
    dtype : NumPy dtype, default=float64

    Examples
    --------
    >>> import os, tempfile
    >>> import pandas as pd
    >>> path = os.path.join(tempfile.mkdtemp(), "d.parquet")
    >>> pd.DataFrame({"a": [1.0, 2.0, 3.0], "y": [0.0, 1.0, 0.0]}).to_parquet(path)
    >>> src = shard_parquet(path, "y")
    >>> src.n_samples, src.n_features
    (3, 1)
    """
    from ..parquet_source import ParquetSource

    torch_dtype = torch.float32 if np.dtype(dtype) == np.float32 else torch.float64
    source = ParquetSource(path, features=features, target=target, weight=sample_weight,
                           dtype=torch_dtype)
    groups = source.row_groups()
    n = source.n_samples
    parts = row_group_shards(groups, n, world_size())
    empty = [r for r, part in enumerate(parts) if not part]
    if empty:
        raise ValueError(
            f"{len(groups)} row group(s) of {n} rows cannot give each of {world_size()} processes "
            f"a row group (ranks {empty} get none); write the data with smaller row groups.")
    mine = parts[rank()]
    return ShardSource(source.select_row_groups(mine), offset=mine[0].start, n_total=n)
