"""Parquet and Arrow data sets read through ``pyarrow.dataset``, one row group at a time.

:class:`ParquetSource` is a :class:`kernelflow.sources.DataSource`: the streaming solvers (Nyström
conjugate gradients, robust Nyström) read it block by block and never hold more than one record
batch of it. A file, a directory (every ``*.parquet`` / ``*.pq`` file below it, in path order) or
a glob pattern names the data; ``features=``, ``target=`` and ``weight=`` select columns.

Everything that can be checked from the files' footers is checked when the source is built, so a
bad data set is refused before any estimator starts fitting: unreadable (truncated, corrupt)
files, files without rows, missing or non-numeric columns, column types that differ between files
and nulls (from the row-group statistics; a column whose statistics lack null counts is scanned
once). Each error names the file and the column.

Rows are numbered by file, then row group, then position; :meth:`ParquetSource.row_groups`
lists the row groups with their global first row, and :meth:`ParquetSource.select_row_groups`
restricts a source to some of them (used by
:func:`kernelflow.distributed.sharding.shard_parquet` to give every process whole row groups).

pyarrow is optional: it is imported when a source is built (``pip install kernelflow[data]``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .sources import Block, DataSource, _check_block

__all__ = ["ParquetSource", "RowGroup", "parquet_files"]

_SUFFIXES = (".parquet", ".pq")


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.dataset as ds
    except ImportError as exc:  # pragma: no cover - exercised only without pyarrow
        raise ImportError(
            "reading Parquet data needs pyarrow: pip install 'kernelflow[data]'."
        ) from exc
    return pa, ds


class RowGroup(NamedTuple):
    """One row group: its file, its index in the file, its first global row and its row count."""

    path: str
    group: int
    start: int
    num_rows: int


def parquet_files(path) -> list[str]:
    """The data set's files, sorted: a file, a directory (recursive), a glob or a list."""
    if isinstance(path, list | tuple):
        files = [os.fspath(p) for p in path]
    else:
        p = os.fspath(path)
        if os.path.isdir(p):
            files = sorted(f for f in glob.glob(os.path.join(p, "**", "*"), recursive=True)
                           if f.endswith(_SUFFIXES) and os.path.isfile(f))
        elif glob.has_magic(p):
            files = sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f))
        else:
            files = [p]
    if not files:
        raise ValueError(f"no Parquet files found at {path!r}.")
    for f in files:
        if not os.path.isfile(f):
            raise ValueError(f"Parquet file {f} does not exist.")
    return files


def _numeric(pa, t) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


class ParquetSource(DataSource):
    """Rows of a Parquet (or Arrow) data set, streamed one record batch at a time.

    Parameters
    ----------
    path : str, os.PathLike or list of them
        A Parquet file, a directory of Parquet files (``*.parquet``, ``*.pq``; searched
        recursively, read in sorted path order), a glob pattern or an explicit list of files.
    features : list of str, default=None
        Feature columns, in this order; default every column that is neither a target nor the
        weight, in the first file's order.
    target : str or list of str, default=None
        Target column(s); None for a source without targets (prediction).
    weight : str, default=None
        Sample-weight column.
    dtype : torch.dtype, default=torch.float64
        Precision of the blocks when :meth:`iter_blocks` is called without ``dtype`` (the
        estimators ask for their own precision, and the columns are converted straight to it).
    format : {"parquet", "arrow", "feather", "ipc"}, default="parquet"
        File format passed to ``pyarrow.dataset``. An Arrow IPC (Feather) file counts as one
        row group (sharding gives whole files); name IPC files explicitly or by a glob, since
        a directory is searched for ``*.parquet`` / ``*.pq`` only.

    Attributes
    ----------
    n_samples : int
    n_features : int
    n_outputs : int
        Number of target columns (0 without targets).
    files : list of str
    columns : list of str
        ``features + targets + [weight]``.

    Notes
    -----
    Cost: building reads every file's footer (O(number of row groups)); a pass over the data
    reads the selected columns once, one record batch at a time (memory O(block_size x
    columns)).

    Examples
    --------
    >>> import os, tempfile
    >>> import pandas as pd
    >>> d = tempfile.mkdtemp()
    >>> for i in range(2):
    ...     frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 2.0], "y": [1.0, 0.0, 1.0]})
    ...     frame.to_parquet(os.path.join(d, f"part{i}.parquet"))
    >>> src = ParquetSource(d, target="y")
    >>> src.n_samples, src.n_features, src.n_outputs
    (6, 2, 1)
    >>> [tuple(b.X.shape) for b in src.iter_blocks(4)]
    [(3, 2), (3, 2)]
    """

    def __init__(self, path, *, features: Sequence[str] | None = None,
                 target: str | Sequence[str] | None = None, weight: str | None = None,
                 dtype: torch.dtype = torch.float64, format: str = "parquet"):
        pa, ds = _pyarrow()
        if format not in ("parquet", "arrow", "feather", "ipc"):
            raise ValueError(
                f"format must be 'parquet', 'arrow', 'feather' or 'ipc', got {format!r}.")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}.")
        self.files = parquet_files(path)
        self.format = "ipc" if format in ("arrow", "feather") else format
        self.dtype = dtype
        self.targets = [] if target is None else ([target] if isinstance(target, str)
                                                  else list(target))
        self.weight = weight
        fragments, schemas = [], []
        for f in self.files:
            try:
                frag = ds.dataset(f, format=self.format).get_fragments()
                frag = next(iter(frag))
                schemas.append(frag.physical_schema)
            except (pa.ArrowException, OSError, StopIteration) as exc:
                raise ValueError(f"cannot read {f} as {self.format}: {exc}") from exc
            fragments.append(frag)
        first = schemas[0]
        extra = self.targets + ([weight] if weight is not None else [])
        if features is None:
            features = [c for c in first.names if c not in extra]
        self.features = list(features)
        if not self.features:
            raise ValueError(f"no feature columns in {self.files[0]} (columns: {first.names}).")
        self.columns = self.features + extra
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"a column is selected twice: features={self.features}, "
                             f"target={self.targets}, weight={weight!r}.")
        for f, schema in zip(self.files, schemas, strict=True):
            self._check_schema(pa, f, schema, first)
        self._groups = self._scan_row_groups(pa, fragments)
        self._selected = list(self._groups)
        self.n_features = len(self.features)
        self.n_outputs = len(self.targets)
        self._n_samples = sum(g.num_rows for g in self._selected)

    def _check_schema(self, pa, f, schema, first) -> None:
        for c in self.columns:
            if schema.get_field_index(c) < 0:
                raise ValueError(f"column {c!r} is not in {f} (columns: {schema.names}).")
            t = schema.field(c).type
            if not _numeric(pa, t):
                raise TypeError(f"column {c!r} of {f} is not numeric (type {t}).")
            t0 = first.field(c).type
            if t != t0:
                raise ValueError(f"column {c!r} has type {t} in {f} but {t0} in "
                                 f"{self.files[0]}: the files' schemas differ.")

    def _scan_row_groups(self, pa, fragments) -> list[RowGroup]:
        groups: list[RowGroup] = []
        pos = 0
        for f, frag in zip(self.files, fragments, strict=True):
            if self.format != "parquet":
                n = frag.count_rows()
                if n == 0:
                    raise ValueError(f"{f} has no rows.")
                self._check_nulls_by_scan(frag, f)
                groups.append(RowGroup(f, 0, pos, n))
                pos += n
                continue
            try:
                meta = frag.metadata
            except (pa.ArrowException, OSError) as exc:
                raise ValueError(f"cannot read the metadata of {f}: {exc}") from exc
            if meta.num_rows == 0:
                raise ValueError(f"{f} has no rows.")
            names = meta.schema.to_arrow_schema().names
            scan = False
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                if rg.num_rows == 0:
                    continue
                for c in self.columns:
                    stats = rg.column(names.index(c)).statistics
                    if stats is None or not stats.has_null_count:
                        scan = True
                    elif stats.null_count > 0:
                        raise ValueError(f"column {c!r} of {f} has {stats.null_count} null "
                                         f"value(s) in row group {g}.")
                groups.append(RowGroup(f, g, pos, rg.num_rows))
                pos += rg.num_rows
            if scan:
                self._check_nulls_by_scan(frag, f)
        return groups

    def _check_nulls_by_scan(self, frag, f) -> None:
        for batch in frag.to_batches(columns=self.columns):
            for c in self.columns:
                nulls = batch.column(c).null_count
                if nulls:
                    raise ValueError(f"column {c!r} of {f} has {nulls} null value(s).")

    @property
    def has_weights(self) -> bool:
        return self.weight is not None

    def row_groups(self) -> list[RowGroup]:
        """The selected row groups, in row order, with their global first row."""
        return list(self._selected)

    def select_row_groups(self, groups: Sequence[RowGroup]) -> ParquetSource:
        """A copy of this source reading only ``groups``, their rows numbered from 0 in order.

        A process's shard wraps it in :class:`~kernelflow.distributed.sharding.ShardSource` with
        ``offset=groups[0].start``, which restores the global positions.

        Examples
        --------
        >>> import os, tempfile
        >>> import pandas as pd
        >>> path = os.path.join(tempfile.mkdtemp(), "d.parquet")
        >>> pd.DataFrame({"a": range(6), "y": range(6)}).to_parquet(path, row_group_size=2)
        >>> src = ParquetSource(path, target="y")
        >>> part = src.select_row_groups(src.row_groups()[1:])
        >>> part.n_samples, [b.start for b in part.iter_blocks()]
        (4, [0, 2])
        """
        out = object.__new__(ParquetSource)
        out.__dict__.update(self.__dict__)
        out._selected = list(groups)
        out._n_samples = sum(g.num_rows for g in out._selected)
        return out

    def _raw_blocks(self, block_size: int) -> Iterator[Block]:
        return self._blocks(block_size, self.dtype)

    def iter_blocks(self, block_size: int | None = None, *, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> Iterator[Block]:
        """Yield :class:`~kernelflow.sources.Block` s read straight into ``dtype``/``device``.

        Blocks never span two record batches, so they may hold fewer than ``block_size`` rows.
        """
        block_size = int(block_size or 8192)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}.")
        target = dtype if dtype is not None and dtype.is_floating_point else self.dtype
        for b in self._blocks(block_size, target):
            if device is None:
                yield b
            else:
                yield Block(b.X.to(device), None if b.y is None else b.y.to(device),
                            None if b.sample_weight is None else b.sample_weight.to(device),
                            b.start)

    def _blocks(self, block_size: int, dtype: torch.dtype) -> Iterator[Block]:
        pa, ds = _pyarrow()
        np_dtype = np.float32 if dtype == torch.float32 else np.float64
        fragments: dict[str, Any] = {}
        start = 0
        for g in self._selected:
            frag = fragments.get(g.path)
            if frag is None:
                frag = next(iter(ds.dataset(g.path, format=self.format).get_fragments()))
                fragments = {g.path: frag}
            if self.format == "parquet":
                frag = frag.subset(row_group_ids=[g.group])
            try:
                for batch in frag.to_batches(columns=self.columns, batch_size=block_size):
                    if batch.num_rows == 0:
                        continue
                    yield self._to_block(batch, np_dtype, start, g)
                    start += batch.num_rows
            except (pa.ArrowException, OSError) as exc:
                raise ValueError(f"cannot read row group {g.group} of {g.path}: {exc}") from exc

    def _to_block(self, batch, np_dtype, start: int, g: RowGroup) -> Block:
        def matrix(names):
            out = np.empty((batch.num_rows, len(names)), dtype=np_dtype)
            for j, c in enumerate(names):
                col = batch.column(c)
                if col.null_count:
                    raise ValueError(f"column {c!r} of {g.path} has {col.null_count} null "
                                     f"value(s) in row group {g.group}.")
                out[:, j] = col.to_numpy(zero_copy_only=False)
            return torch.from_numpy(out)

        X = matrix(self.features)
        y = matrix(self.targets) if self.targets else None
        w = matrix([self.weight])[:, 0] if self.weight is not None else None
        _check_block(X, y, w, self.n_features, self.n_outputs or None,
                     f"{g.path} (row group {g.group})")
        return Block(X, y, w, start)
