"""The ``kernelflow`` command line: fit, predict, evaluate, compare, demo, list, info.

This module parses the command line and dispatches; the demo lives in :mod:`kernelflow.demo`.
Every failure the user can cause (missing file, missing or non-numeric column, unknown model or
parameter, corrupt model file) ends with one line on standard error and a non-zero exit code
(2 for usage errors, 1 otherwise); ``--debug`` shows the traceback instead. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from collections.abc import Callable, Collection, Container, Hashable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from .utils._text import format_seconds, format_table, parse_value

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from sklearn.base import BaseEstimator

__all__ = ["main", "build_parser", "CLIError"]

PROG = "kernelflow"
logger = logging.getLogger(__name__)


class CLIError(Exception):
    """An error reported to the user as one line (no traceback)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of usage + message
        raise CLIError(f"{message} (see '{self.prog} --help')")


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
_CSV_SUFFIXES = (".csv", ".txt", ".tsv", ".gz", "")
_PARQUET_SUFFIXES = (".parquet", ".pq")


def separator(value: str | None, suffix: str = "") -> str:
    """The CSV field separator: ``value`` (``tab`` or ``\\t`` mean a tab), else by suffix.

    Examples
    --------
    >>> separator(None, ".tsv") == "\\t", separator("tab") == "\\t", separator(";")
    (True, True, ';')
    """
    if value is None:
        return "\t" if suffix == ".tsv" else ","
    if value.lower() in ("tab", "\\t", "\t"):
        return "\t"
    if value == "":
        raise CLIError("--sep must not be empty")
    return value


def read_table(source: str, sep: str | None = None) -> tuple[pd.DataFrame, str | None]:
    """Read a CSV/TSV/Parquet file, or a bundled data set written ``dataset:NAME``.

    ``sep`` is the field separator of CSV files (default ``,``; a tab for ``.tsv``).
    """
    import pandas as pd

    if source.startswith("dataset:"):
        from kernelflow.datasets import REAL_DATASETS

        name = source.split(":", 1)[1]
        if name not in REAL_DATASETS:
            raise CLIError(
                f"unknown data set {name!r}; choose from {', '.join(sorted(REAL_DATASETS))}"
            )
        bunch = REAL_DATASETS[name](as_frame=True)
        return bunch.frame, bunch.target_name
    path = Path(source)
    if path.is_dir() or _has_glob(source):
        return _read_parquet_dataset(source), None
    if not path.exists():
        raise CLIError(f"file not found: {source}")
    suffix = path.suffix.lower()
    try:
        if suffix in _PARQUET_SUFFIXES:
            df = pd.read_parquet(path)
        elif suffix in _CSV_SUFFIXES:
            df = pd.read_csv(path, sep=separator(sep, suffix))
        else:
            raise CLIError(f"unsupported file type {suffix!r} for {source}; use .csv or .parquet")
    except CLIError:
        raise
    except Exception as exc:  # noqa: BLE001 - parser errors vary by engine
        raise CLIError(f"cannot read {source}: {_one_line(exc)}") from None
    if df.shape[0] == 0 or df.shape[1] == 0:
        raise CLIError(f"{source} contains no data")
    return df, None


def _has_glob(source: str) -> bool:
    return any(ch in source for ch in "*?[")


def _read_parquet_dataset(source: str) -> pd.DataFrame:
    """Every file of a Parquet directory or glob, in sorted path order, as one frame."""
    import pandas as pd

    try:
        from kernelflow.parquet_source import parquet_files

        frames = [pd.read_parquet(f) for f in parquet_files(source)]
        df = pd.concat(frames, ignore_index=True)
    except Exception as exc:  # noqa: BLE001 - Arrow and pandas errors vary
        raise CLIError(f"cannot read {source}: {_one_line(exc)}") from None
    if df.shape[0] == 0 or df.shape[1] == 0:
        raise CLIError(f"{source} contains no data")
    return df


def is_parquet_dataset(source: str) -> bool:
    """A Parquet file, a directory of Parquet files or a glob: data the command line can stream."""
    if source.startswith("dataset:"):
        return False
    path = Path(source)
    return path.is_dir() or _has_glob(source) or path.suffix.lower() in _PARQUET_SUFFIXES


def parquet_source(source: str, *, target: str | None = None,
                   features: Sequence[str] | None = None, drop: Sequence[str] = ()) -> Any:
    """A streaming :class:`~kernelflow.parquet_source.ParquetSource`; errors become CLIError."""
    from kernelflow.parquet_source import ParquetSource

    try:
        src = ParquetSource(source, target=target, features=features or None)
        if drop:
            unknown = [c for c in drop if c not in src.features]
            if unknown:
                raise CLIError(f"--drop: column(s) {', '.join(unknown)} not in {source}")
            kept = [c for c in src.features if c not in drop]
            src = ParquetSource(source, target=target, features=kept)
    except (ValueError, TypeError, ImportError) as exc:
        raise CLIError(_one_line(exc)) from None
    return src


def _streamed_predictions(model: BaseEstimator, source: Any) -> Iterable[tuple[Any, Any]]:
    """(predictions, targets or None) block by block: the data set is never held whole."""
    import numpy as np
    import torch

    for block in source.iter_blocks(1 << 16, dtype=torch.float64):
        pred = np.asarray(model.predict(block.X.numpy()))
        yield pred, (None if block.y is None else block.y.numpy())


def _streamed_scores(model: BaseEstimator, source: Any, scoring: Sequence[str]
                     ) -> dict[str, float]:
    """scikit-learn's scorers ``scoring`` over one pass of the source (sums over blocks)."""
    from kernelflow._streamed_cv import ScoreSums

    sums = ScoreSums()
    for pred, y in _streamed_predictions(model, source):
        sums.add(y, pred)
    return {name: sums.score(name) for name in scoring}


def _streamed_score(model: BaseEstimator, source: Any) -> float:
    """R^2 (accuracy for a classifier) over one pass of the source."""
    name = "accuracy" if _is_classifier(model) else "r2"
    return _streamed_scores(model, source, [name])[name]


def _streams(args: argparse.Namespace, model: BaseEstimator) -> bool:
    """Whether ``fit``/``evaluate`` read the data block by block instead of loading it."""
    return (is_parquet_dataset(str(args.data)) and _can_stream(model)
            and args.max_rows is None)


def _check_streamed_scoring(scoring: Sequence[str]) -> None:
    """Refuse scorers that need every prediction at once (or that scikit-learn lacks)."""
    from sklearn.metrics import get_scorer_names

    from kernelflow._streamed_cv import STREAMED_SCORERS

    unknown = [s for s in scoring if s not in get_scorer_names()]
    if unknown:
        raise CLIError(f"unknown scorer in --scoring {','.join(scoring)}; see scikit-learn's "
                       "get_scorer_names()")
    other = [s for s in scoring if s not in STREAMED_SCORERS]
    if other:
        raise CLIError(f"--scoring {','.join(other)} cannot be computed on a streamed data set "
                       f"(streamed scores: {', '.join(STREAMED_SCORERS)}); choose among them, "
                       "or use --max-rows N to evaluate on N loaded rows")


def _streaming_parts(model: BaseEstimator) -> tuple[Any, BaseEstimator] | None:
    """(scaler or None, estimator) of a model that learns from a stream, else None.

    The estimator's ``fit`` reads a DataSource block by block (Nyström), or it learns from a
    stream of chunks (doubly stochastic regression: ``partial_fit``); a ``StandardScaler``
    before it (the command line's default) learns its statistics from one pass of the blocks.
    """
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor
    from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    from kernelflow.estimators.nystrom_robust import NystromRobustRegressor

    scaler = None
    if isinstance(model, Pipeline):
        if len(model.steps) != 2 or not isinstance(model[0], StandardScaler):
            return None
        scaler, model = model[0], model[-1]
    if isinstance(model, NystromKernelRidge | NystromRobustRegressor | DoublyStochasticRegressor):
        return scaler, model
    return None


def _can_stream(model: BaseEstimator) -> bool:
    """Whether ``model`` (possibly after a ``StandardScaler``) learns from a stream."""
    return _streaming_parts(model) is not None


def _fit_source(model: BaseEstimator, source: Any) -> None:
    """``fit(source)``, or ``max_iter`` in-order passes of ``partial_fit`` over its blocks; a
    ``StandardScaler`` in front is fitted first, by one pass, and standardises the blocks."""
    import torch

    scaler, est = _streaming_parts(model) or (None, model)
    if scaler is not None:
        from kernelflow._streamed_cv import StandardisedSource

        for block in source.iter_blocks(1 << 16, dtype=torch.float64):
            scaler.partial_fit(block.X.numpy())
        source = StandardisedSource(source, scaler.mean_ if scaler.with_mean else None,
                                    scaler.scale_ if scaler.with_std else None)
    if not hasattr(est, "partial_fit"):
        est.fit(source)
        return
    for _ in range(int(est.max_iter)):
        for block in source.iter_blocks(1 << 16, dtype=torch.float64):
            y = block.y[:, 0] if block.y.shape[1] == 1 else block.y
            est.partial_fit(block.X.numpy(), y.numpy())


def index_columns(df: pd.DataFrame, exclude: Collection[Hashable] = ()) -> list[Hashable]:
    """Columns that look like a row index rather than a feature.

    An R ``rownames`` column, an unnamed column (pandas calls it ``Unnamed: k``, e.g. the index
    written by ``DataFrame.to_csv``), or an integer column that counts the rows 0..n-1 or 1..n.
    Such a column carries no information about a row except its position in the file, which
    often follows the target (sorted files), so using it as a feature misleads.

    Examples
    --------
    >>> import pandas as pd
    >>> df = pd.DataFrame({"rownames": [1, 2, 3], "id": [0, 1, 2], "a": [5, 1, 2],
    ...                    "b": [1, 2, 4], "y": [0.1, 0.2, 0.3]})
    >>> index_columns(df, exclude=["y"])
    ['rownames', 'id']
    """
    import numpy as np
    import pandas as pd

    out: list[Hashable] = []
    n = len(df)
    for col in df.columns:
        if col in exclude:
            continue
        if _index_like_name(col):
            out.append(col)
            continue
        values = df[col]
        if n >= 3 and pd.api.types.is_integer_dtype(values):
            v = values.to_numpy()
            if np.array_equal(v, np.arange(n)) or np.array_equal(v, np.arange(1, n + 1)):
                out.append(col)
    return out


def _index_like_name(col: Hashable) -> bool:
    """A column name that says "row names" (R's ``rownames``, pandas' ``Unnamed: k``)."""
    name = str(col).strip()
    return name.lower() in ("rownames", "row.names", "row_names", "") or name.startswith(
        "Unnamed: ")


def split_xy(df: pd.DataFrame, target: str | None, *, features: Sequence[str] | None = None,
             drop: Sequence[str] = (), source: str = "data", keep_index_columns: bool = False,
             labels: bool = False) -> tuple[pd.DataFrame, np.ndarray]:
    """Select numeric features and the target column with clear errors.

    Index-like columns (:func:`index_columns`) are left out with a note on standard error
    unless ``keep_index_columns`` or they are named in ``features``. With ``labels`` (a
    classifier) the target is returned as given (integers, strings, ...); otherwise it must be
    numeric and is returned as float64.
    """
    if target is None:
        raise CLIError("--target is required for this data")
    if target not in df.columns:
        cols = ", ".join(map(str, list(df.columns)[:12]))
        hint = ""
        if df.shape[1] == 1:
            found = [s for s in (";", "\t", "|", ",") if s in str(df.columns[0])]
            if found:
                hint = (f"; the file was read as one column: is it separated by "
                        f"{found[0]!r}? use --sep {'tab' if found[0] == chr(9) else found[0]!r}")
        raise CLIError(f"target column {target!r} not found in {source} (columns: {cols}){hint}")
    unknown_drop = [c for c in drop if c not in df.columns]
    if unknown_drop:
        raise CLIError(f"--drop: no column(s) {', '.join(unknown_drop)} in {source}")
    if features:
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise CLIError(f"feature column(s) {', '.join(missing)} not found in {source}")
        X = df[list(features)]
    else:
        X = df.drop(columns=[target, *drop])
        if not keep_index_columns:
            dropped = index_columns(X)
            if dropped and len(dropped) < X.shape[1]:
                X = X.drop(columns=dropped)
                _note(f"left out index-like column(s) {', '.join(map(repr, map(str, dropped)))}"
                      f" of {source} (row names or row numbers, not features); "
                      "--keep-index-columns keeps them")
    check_numeric(X, source)
    y = df[target]
    if y.isna().any():
        raise CLIError(f"target column {target!r} has {int(y.isna().sum())} missing values "
                       f"(first at {_row(int(y.isna().to_numpy().argmax()))})")
    if X.shape[1] == 0:
        raise CLIError(f"{source} has no feature columns besides the target")
    if labels:  # class labels as given: the classifier's predictions use the same values
        return X.astype("float64"), y.to_numpy()
    if not _is_numeric(y):
        bad = _bad_cells(y)
        if bad is not None and bad[2] < len(y):
            raise CLIError(_bad_cell_message(target, source, *bad))
        raise CLIError(f"target column {target!r} of {source} is not numeric ({_row(0)}: "
                       f"{_shown(y.iloc[0])}); a regression needs numbers (for class labels "
                       "choose a classifier, see 'kernelflow list')")
    _check_overflow(y.to_frame(), source)
    return X.astype("float64"), y.astype("float64").to_numpy()


def _row(position: int) -> str:
    """A row of the data as users count it: from 1, the header not counted."""
    return f"data row {position + 1}"


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad_cells(column: pd.Series) -> tuple[int, Any, int] | None:
    """(position, value, count) of the cells of ``column`` that are not numbers, or None."""
    import pandas as pd

    numbers = pd.to_numeric(column, errors="coerce")
    bad = (numbers.isna() & column.notna()).to_numpy()
    if not bad.any():
        return None
    first = int(bad.argmax())
    return first, column.iloc[first], int(bad.sum())


def _bad_cell_message(col: Hashable, source: str, position: int, value: Any,
                      count: int) -> str:
    more = f" ({count} such cells)" if count > 1 else ""
    return (f"column {str(col)!r} of {source}, {_row(position)}: {_shown(value)} is not a "
            f"number{more}; fix the cell or leave the column out with --drop")


def _note(message: str) -> None:
    print(f"{PROG}: note: {message}", file=sys.stderr)


# magnitudes whose squares (kernel distances, variances) overflow float64
_OVERFLOW_LIMIT = 1e150


def _check_overflow(X: pd.DataFrame, source: str = "data") -> None:
    """Refuse values that overflow float64 (read as inf) or whose squares would overflow."""
    import numpy as np

    for col in X.columns:
        v = X[col].to_numpy(dtype=np.float64, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            inf = np.isinf(v)
            big = np.abs(v) > _OVERFLOW_LIMIT
        if inf.any():
            row = int(np.flatnonzero(inf)[0])
            raise CLIError(
                f"column {str(col)!r} of {source} has {int(inf.sum())} value(s) that overflow "
                f"float64 (first at data row {row + 1}; |value| > 1.8e308 or 'inf'); rescale "
                "the column or leave it out with --drop"
            )
        if big.any():
            row = int(np.flatnonzero(big)[0])
            raise CLIError(
                f"column {str(col)!r} of {source} has value(s) up to "
                f"{float(np.nanmax(np.abs(v))):.3g} (first at data row {row + 1}): their squares "
                f"overflow float64 (|value| > {_OVERFLOW_LIMIT:.0e}); rescale the column or "
                "leave it out with --drop"
            )


def _is_numeric(series: pd.Series) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(series))


def check_numeric(X: pd.DataFrame, source: str = "data") -> None:
    """Refuse non-numeric, overflowing or missing cells, naming the column, row and value."""
    text_cols = []
    for col in X.columns:
        if _is_numeric(X[col]):
            continue
        bad = _bad_cells(X[col])
        if bad is not None and bad[2] < X[col].notna().sum():  # numbers and a few bad cells
            raise CLIError(_bad_cell_message(col, source, *bad))
        text_cols.append((col, bad))
    if text_cols:
        shown = ", ".join(
            str(c) + ("" if bad is None else f" ({_row(bad[0])}: {_shown(bad[1])})")
            for c, bad in text_cols[:8]) + (" ..." if len(text_cols) > 8 else "")
        raise CLIError(
            f"non-numeric column(s) in {source}: {shown}; encode them as numbers or leave them "
            "out with --drop"
        )
    _check_overflow(X, source)
    nan_cols = [c for c in X.columns if X[c].isna().any()]
    if nan_cols:
        first = _row(int(X[nan_cols[0]].isna().to_numpy().argmax()))
        raise CLIError(
            f"missing values in column(s) {', '.join(map(str, nan_cols[:8]))} of {source} "
            f"(first at {first} of column {str(nan_cols[0])!r}); kernelflow does not impute: "
            "fill or drop them first"
        )


def _subsample(X: pd.DataFrame, y: np.ndarray, max_rows: int | None,
               seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    if max_rows is None or len(X) <= max_rows:
        return X, y
    import numpy as np

    idx = np.sort(np.random.RandomState(seed).choice(len(X), size=max_rows, replace=False))
    logger.info("using %d of %d rows (--max-rows)", max_rows, len(X))
    return X.iloc[idx], y[idx]


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
def parse_params(items: Iterable[str] | None,
                 models: Container[str] | None = None) -> dict[str | None, dict[str, Any]]:
    """Parse ``key=value`` (or ``model:key=value``) pairs into ``{scope: {key: value}}``.

    Unscoped pairs land under the key ``None``.

    Examples
    --------
    >>> parse_params(["alpha=0.1", "sign_gradient:sigma=2"], models={"sign_gradient"})
    {None: {'alpha': 0.1}, 'sign_gradient': {'sigma': 2}}
    """
    out: dict[str | None, dict[str, Any]] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CLIError(f"--param expects key=value, got {item!r}")
        key = key.strip()
        scope: str | None = None
        if ":" in key:
            scope, key = key.split(":", 1)
            if models is not None and scope not in models:
                raise CLIError(f"--param {item!r}: {scope!r} is not one of the compared models")
        out.setdefault(scope, {})[key] = parse_value(value)
    return out


def build_model(name: str, params: dict[str, Any], *, scale: bool, verbose: int = 0,
                center_target: bool = False) -> BaseEstimator:
    """The registered estimator ``name`` with ``params``, after a ``StandardScaler`` (``scale``).

    ``verbose`` goes to estimators that have the parameter. With ``center_target`` a regressor
    is fitted to targets centred at their training mean (and its predictions shifted back), the
    preprocessing that an intercept performs, so that models with and without one compare fairly.
    """
    from kernelflow.registry import get_estimator_class, make_estimator

    try:
        cls = get_estimator_class(name)
    except KeyError as exc:
        raise CLIError(exc.args[0]) from None
    except ImportError as exc:
        raise CLIError(str(exc)) from None
    if verbose and "verbose" in cls().get_params() and "verbose" not in params:
        params = {**params, "verbose": verbose}
    try:
        model = make_estimator(name, **params)
        if hasattr(model, "_parameter_constraints"):  # invalid values now, not after the data
            model._validate_params()
    except (ValueError, TypeError) as exc:
        raise CLIError(str(exc)) from None
    if scale:
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        model = make_pipeline(StandardScaler(), model)
    if center_target and not _is_classifier(model):
        from sklearn.compose import TransformedTargetRegressor
        from sklearn.preprocessing import StandardScaler

        model = TransformedTargetRegressor(regressor=model, check_inverse=False,
                                           transformer=StandardScaler(with_std=False))
    return model


def _final(model: BaseEstimator) -> BaseEstimator:
    """The estimator inside a target transformer and a pipeline."""
    for attr in ("regressor_", "regressor"):
        if getattr(model, attr, None) is not None:
            model = getattr(model, attr)
            break
    return model[-1] if hasattr(model, "steps") else model


def _is_classifier(model: BaseEstimator) -> bool:
    from sklearn.base import is_classifier

    return is_classifier(model)


def _default_scoring(model: BaseEstimator) -> list[str]:
    if _is_classifier(model):
        return ["accuracy"]
    return ["r2", "neg_root_mean_squared_error", "neg_mean_absolute_error"]


def _score_label(name: str) -> str:
    return {"neg_root_mean_squared_error": "RMSE", "neg_mean_absolute_error": "MAE",
            "neg_mean_squared_error": "MSE", "r2": "R^2"}.get(name, name)


def _score_sign(name: str) -> float:
    return -1.0 if name.startswith("neg_") else 1.0


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def _one_line(exc: BaseException | str) -> str:
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    msg = " ".join(str(msg).split())
    return msg if len(msg) < 600 else msg[:597] + "..."


#: figure formats matplotlib writes (``savefig`` picks the format from the suffix)
_PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif",
                  ".tiff", ".webp", ".pgf")


def check_output(path: str, what: str, *, suffixes: Sequence[str] | None = None,
                 create_dirs: bool = False) -> Path:
    """Refuse an output path that cannot be written, before any work is done.

    The path must not be a directory; its directory must exist (or, with ``create_dirs``, its
    nearest existing ancestor must be a writable directory) and be writable; with
    ``suffixes`` the file name must end in one of them.

    Examples
    --------
    >>> check_output("model.npz", "model file").name
    'model.npz'
    >>> check_output("no/such/dir/model.npz", "model file")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kernelflow.cli.CLIError: cannot write the model file ...: directory no/such/dir does not exist
    """
    import os

    p = Path(path)
    if p.is_dir():
        raise CLIError(f"cannot write the {what} {path}: it is a directory; give a file name")
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise CLIError(f"cannot write the {what} {path}: unsupported file type "
                       f"{p.suffix.lower() or '(none)'!r}; use one of {', '.join(suffixes)}")
    parent = p.parent
    if not parent.exists():
        if not create_dirs:
            raise CLIError(f"cannot write the {what} {path}: directory {parent} does not exist")
        while not parent.exists():
            parent = parent.parent
    if not parent.is_dir():
        raise CLIError(f"cannot write the {what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"cannot write the {what} {path}: directory {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise CLIError(f"cannot write the {what} {path}: the file is not writable")
    return p


def _check_plot(path: str | None) -> None:
    """A --plot path: writable, a figure format, and matplotlib installed."""
    if path is None:
        return
    import importlib.util

    check_output(path, "plot", suffixes=_PLOT_SUFFIXES, create_dirs=True)
    if importlib.util.find_spec("matplotlib") is None:
        raise CLIError("--plot needs matplotlib: pip install matplotlib (or pip install -e "
                       "'.[plot]' from a checkout)")


def _check_table_output(path: str) -> str:
    """Check a predictions file; return its format (``"csv"`` or ``"parquet"``)."""
    import importlib.util

    suffix = Path(path).suffix.lower()
    check_output(path, "predictions file", suffixes=_CSV_SUFFIXES[:-1] + _PARQUET_SUFFIXES)
    if suffix in _PARQUET_SUFFIXES:
        if not any(importlib.util.find_spec(m) for m in ("pyarrow", "fastparquet")):
            raise CLIError(f"writing {path} needs a Parquet engine: pip install pyarrow (or "
                           "write .csv)")
        return "parquet"
    return "csv"


class _Stages:
    """One line per stage and per fold on standard error (``-q`` silences them)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.start = time.perf_counter()

    def say(self, message: str) -> None:
        if not self.quiet:
            elapsed = format_seconds(time.perf_counter() - self.start)
            print(f"{PROG}: [{elapsed}] {message}", file=sys.stderr, flush=True)


def _stages(args: argparse.Namespace) -> _Stages:
    stages = getattr(args, "_stages", None)
    if stages is None:
        stages = args._stages = _Stages(bool(getattr(args, "quiet", False)))
    return stages


# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    from kernelflow.registry import ESTIMATORS, available_estimators

    ok = available_estimators()
    rows = []
    for name in sorted(ESTIMATORS):
        cls = ok.get(name)
        summary = ""
        if cls is not None and cls.__doc__:
            summary = cls.__doc__.strip().splitlines()[0]
        rows.append([name, "yes" if cls is not None else "no", summary])
    print(format_table(["model", "available", "description"], rows))
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from kernelflow.io import save_model

    stages = _stages(args)
    if args.cv:
        _check_folds(args.cv)
    check_output(args.output, "model file")  # before the data is read and the model fitted
    _check_plot(args.plot)
    params = parse_params(args.param).get(None, {})
    model = build_model(args.model, params, scale=not args.no_scale, verbose=args.verbose)
    classifier = _is_classifier(model)
    if _streams(args, model) and not args.plot:
        return _fit_streaming(args, model, stages)
    X, y = _read_xy(args, labels=classifier)
    label = "accuracy" if classifier else "R^2"
    cv_text, cv_score = "", None
    if args.cv and len(X) < 2 * args.cv:
        _note(f"no cross-validated score: {len(X)} rows are too few for --cv {args.cv}")
    elif args.cv:
        scoring = "accuracy" if classifier else "r2"
        res = _cross_validate(model, X, y, args.cv, [scoring], args.seed, stages=stages,
                              announce=f"{args.cv}-fold cross-validation of {args.model} on "
                                       f"{len(X)} rows")
        v = res[f"test_{scoring}"]
        cv_score = float(v.mean())
        cv_text = f"; {args.cv}-fold cross-validated {label} = {v.mean():.4f} +- {_sd(v):.4f}"
    stages.say(f"fitting {args.model} on all {len(X)} rows")
    start = time.perf_counter()
    model.fit(X, y)
    elapsed = time.perf_counter() - start
    score = model.score(X, y)
    extra = {"model": args.model, "target": args.target, "features":
             [str(c) for c in X.columns], "n_samples": int(len(X)), "source": str(args.data),
             "fit_seconds": round(elapsed, 3), "training_score": round(float(score), 6)}
    if cv_score is not None:
        extra["cv_score"] = round(cv_score, 6)
    out = save_model(model, args.output, extra=extra)
    print(f"fitted {args.model} on {len(X)} rows x {X.shape[1]} features in "
          f"{format_seconds(elapsed)}; training {label} = {score:.4f}{cv_text}; wrote {out}")
    if not args.cv:
        print("(the training score is optimistic; drop --cv 0 to see a cross-validated one)")
    if args.plot:
        unit = None
        if str(args.data).startswith("dataset:"):
            from kernelflow.demo import UNITS

            unit = UNITS.get(str(args.data).split(":", 1)[1])
        _plot_fit(model, X, y, args.plot, title=args.model,
                  ylabel=str(args.target) + (f" ({unit})" if unit else ""), unit=unit)
    return 0


def _fit_streaming(args: argparse.Namespace, model: BaseEstimator, stages: _Stages) -> int:
    """``fit`` from a Parquet data set read block by block, with a streamed cross-validated
    score unless ``--cv 0``."""
    from kernelflow.io import save_model

    source = _streamed_source(args)
    label = "accuracy" if _is_classifier(model) else "R^2"
    cv_text, cv_score = _streamed_cv_score(args, model, source, stages)
    stages.say(f"fitting {args.model} on {source.n_samples} rows streamed from "
               f"{len(source.files)} Parquet file(s)")
    start = time.perf_counter()
    _fit_source(model, source)
    elapsed = time.perf_counter() - start
    score = _streamed_score(model, source)
    extra = {"model": args.model, "target": args.target, "features": list(source.features),
             "n_samples": int(source.n_samples), "source": str(args.data),
             "fit_seconds": round(elapsed, 3), "training_score": round(float(score), 6)}
    if cv_score is not None:
        extra["cv_score"] = round(cv_score, 6)
    out = save_model(model, args.output, extra=extra)
    print(f"fitted {args.model} on {source.n_samples} rows x {source.n_features} features "
          f"(streamed) in {format_seconds(elapsed)}; training {label} = {score:.4f}{cv_text}; "
          f"wrote {out}")
    if not args.cv:
        print("(the training score is optimistic; drop --cv 0 to see a cross-validated one)")
    return 0


def _streamed_source(args: argparse.Namespace) -> Any:
    """The Parquet data set of ``fit``/``evaluate`` as a streaming source with its target."""
    if not args.target:
        raise CLIError(f"--target is required for {args.data}")
    features, drop = _split_list(args.features), _split_list(args.drop)
    source = parquet_source(str(args.data), target=args.target, features=features, drop=drop)
    named = [] if features or args.keep_index_columns else [
        c for c in source.features if _index_like_name(c)]
    if not named or len(named) == source.n_features:
        return source
    _note(f"left out index-like column(s) {', '.join(map(repr, named))} of {args.data} (row "
          "names, not features); --keep-index-columns keeps them")
    return parquet_source(str(args.data), target=args.target,
                          features=[c for c in source.features if c not in named])


def _streamed_cv_score(args: argparse.Namespace, model: BaseEstimator, source: Any,
                       stages: _Stages) -> tuple[str, float | None]:
    """(text, mean) of the streamed ``--cv`` score of ``fit``; ("", None) without one."""
    if not args.cv:
        return "", None
    n = source.n_samples
    if n < 2 * args.cv:
        _note(f"no cross-validated score: {n} rows are too few for --cv {args.cv}")
        return "", None
    classifier = _is_classifier(model)
    scoring = "accuracy" if classifier else "r2"
    res = _streamed_cross_validate(model, source, args.cv, [scoring], args.seed, stages=stages,
                                   announce=f"{args.cv}-fold cross-validation of {args.model} "
                                            f"on {n} rows streamed from {len(source.files)} "
                                            "Parquet file(s)")
    v = res[f"test_{scoring}"]
    label = "accuracy" if classifier else "R^2"
    return (f"; {args.cv}-fold cross-validated {label} = {v.mean():.4f} +- {_sd(v):.4f}",
            float(v.mean()))


def _predict_streaming(args: argparse.Namespace, model: BaseEstimator, extra: dict,
                       fmt: str) -> int:
    """``predict`` on a Parquet data set, block by block; predictions written as they come."""
    import pandas as pd

    features, target = extra.get("features"), extra.get("target")
    source = None
    if target:  # the data set has the answers: report the score as well
        try:
            source = parquet_source(str(args.data), target=target, features=features)
        except CLIError:
            source = None
    if source is None:
        source = parquet_source(str(args.data), features=features)
    _stages(args).say(f"predicting {source.n_samples} rows streamed from {args.data}")
    writer, n, first = None, 0, True
    stream: Any = sys.stdout
    if args.output and fmt != "parquet":
        stream = open(args.output, "w", newline="")  # noqa: SIM115 - closed below
    try:
        for pred, _ in _streamed_predictions(model, source):
            cols = (["prediction"] if pred.ndim == 1
                    else [f"prediction_{i}" for i in range(pred.shape[1])])
            out = pd.DataFrame(pred.reshape(len(pred), -1), columns=cols)
            n += len(out)
            if fmt == "parquet" and args.output:
                import pyarrow as pa
                import pyarrow.parquet as pq

                table = pa.Table.from_pandas(out, preserve_index=False)
                writer = writer or pq.ParquetWriter(args.output, table.schema)
                writer.write_table(table)
            else:
                suffix = Path(args.output).suffix.lower() if args.output else ""
                out.to_csv(stream, index=False, header=first, sep=separator(args.sep, suffix))
            first = False
    finally:
        if writer is not None:
            writer.close()
        if stream is not sys.stdout:
            stream.close()
    if args.output:
        print(f"wrote {n} predictions to {args.output}")
        if source.n_outputs:
            label = "accuracy" if _is_classifier(model) else "R^2"
            print(f"{label} on {args.data}: {_streamed_score(model, source):.4f}")
    return 0


def _read_xy(args: argparse.Namespace, *, labels: bool = False) -> tuple[pd.DataFrame,
                                                                         np.ndarray]:
    df, default_target = read_table(args.data, args.sep)
    args.target = args.target or default_target
    X, y = split_xy(df, args.target, features=_split_list(args.features),
                    drop=_split_list(args.drop), source=args.data,
                    keep_index_columns=args.keep_index_columns, labels=labels)
    return _subsample(X, y, args.max_rows, args.seed)


def _plot_fit(model: BaseEstimator, X: pd.DataFrame, y: np.ndarray, path: str, *, title: str,
              ylabel: str = "y", unit: str | None = None) -> None:
    from kernelflow.plotting import (
        plot_estimator_path,
        plot_fit_1d,
        plot_predictions,
        save_figure,
    )

    final = model[-1] if hasattr(model, "steps") else model
    sigma = getattr(final, "sigma_", None)
    if sigma is None:
        sigma = getattr(getattr(final, "kernel_", None), "sigma", None)
    scaled = " of the standardised features" if hasattr(model, "steps") else ""
    what = f", sigma = {float(sigma):.3g}{scaled}" if sigma is not None and \
        getattr(sigma, "ndim", 0) == 0 else ""
    if X.shape[1] == 1:
        import pandas as pd

        def on_grid(grid: np.ndarray) -> np.ndarray:
            # keep the column name the model was fitted with
            return model.predict(pd.DataFrame(grid, columns=X.columns))

        fig = plot_fit_1d(X.to_numpy(), y, {title: on_grid}, xlabel=str(X.columns[0]),
                          ylabel=ylabel, title=f"{title}: fitted function{what}")
    else:
        try:
            fig = plot_estimator_path(final, unit=unit)
        except ValueError:
            fig = plot_predictions(y, {title: model.predict(X)}, unit=unit,
                                   title=f"{title}: predictions on the training data")
    print(f"wrote plot {save_figure(fig, path)}")


def cmd_predict(args: argparse.Namespace) -> int:
    import numpy as np
    import pandas as pd

    from kernelflow.io import load_model, read_metadata

    fmt = _check_table_output(args.output) if args.output else "csv"
    if not Path(args.model).exists():
        raise CLIError(f"file not found: {args.model}")
    model = load_model(args.model)
    extra = read_metadata(args.model).get("extra", {})
    if is_parquet_dataset(str(args.data)) and extra.get("features"):
        return _predict_streaming(args, model, extra, fmt)
    df, _ = read_table(args.data, args.sep)
    features = extra.get("features")
    if features:
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise CLIError(f"column(s) {', '.join(missing)} used for training are missing "
                           f"from {args.data}")
        X = df[features]
    else:
        X = df
    check_numeric(X, args.data)
    _stages(args).say(f"predicting {len(X)} rows")
    # a model fitted on a stream saw no column names: give it the columns, in order, unnamed
    data = X.astype("float64") if hasattr(model, "feature_names_in_") else \
        X.to_numpy(dtype="float64")
    pred = np.asarray(model.predict(data))  # class labels keep their type
    cols = ["prediction"] if pred.ndim == 1 else [f"prediction_{i}" for i in range(pred.shape[1])]
    out = pd.DataFrame(pred.reshape(len(X), -1), columns=cols)
    if args.output and fmt == "parquet":
        out.to_parquet(args.output, index=False)
    else:
        suffix = Path(args.output).suffix.lower() if args.output else ""
        out.to_csv(args.output or sys.stdout, index=False, sep=separator(args.sep, suffix))
    if args.output:
        print(f"wrote {len(out)} predictions to {args.output}")
    target = extra.get("target")
    if args.output and target in df.columns and not df[target].isna().any():
        classifier = _is_classifier(model)
        if classifier or _is_numeric(df[target]):  # the file has the answers: report the score
            label = "accuracy" if classifier else "R^2"
            truth = df[target] if classifier else df[target].astype("float64")
            score = model.score(data, truth)
            print(f"{label} on {args.data}: {score:.4f}")
    return 0


def _cross_validate(model: BaseEstimator, X: pd.DataFrame, y: np.ndarray, cv: int,
                    scoring: list[str], seed: int, *, repeats: int = 1,
                    stages: _Stages | None = None, label: str = "",
                    announce: str | None = None) -> dict[str, Any]:
    """K-fold cross-validation (``repeats`` times with fresh folds), one line per fold.

    Returns scikit-learn's ``cross_validate`` keys (``fit_time``, ``test_<scorer>``,
    ``estimator``) and ``converged``: per fit, False when it issued a ``ConvergenceWarning``.
    """
    import numpy as np
    from sklearn.base import clone
    from sklearn.metrics import get_scorer
    from sklearn.model_selection import RepeatedKFold, RepeatedStratifiedKFold

    _check_folds(cv, repeats)
    if cv > len(X):
        raise CLIError(f"--cv {cv} is larger than the number of rows ({len(X)})")
    try:
        scorers = {s: get_scorer(s) for s in scoring}
    except ValueError:
        raise CLIError(f"unknown scorer in --scoring {','.join(scoring)}; see scikit-learn's "
                       "get_scorer_names()") from None
    splitter = (RepeatedStratifiedKFold if _is_classifier(model) else RepeatedKFold)(
        n_splits=cv, n_repeats=repeats, random_state=seed)
    splits = list(splitter.split(X, y))
    if stages is not None and announce:
        stages.say(announce)
    out: dict[str, Any] = {"fit_time": [], "estimator": [], "converged": [],
                           **{f"test_{s}": [] for s in scoring}}
    for k, (train, test) in enumerate(splits):
        est = clone(model)
        fit_time, converged = _recorded_fit(partial(est.fit, X.iloc[train], y[train]))
        scores = {s: float(f(est, X.iloc[test], y[test])) for s, f in scorers.items()}
        out["estimator"].append(est)
        _record_fold(out, scores, fit_time, converged, stages,
                     f"{label}fold {k + 1}/{len(splits)}")
    return {k: (v if k in ("estimator", "converged") else np.asarray(v)) for k, v in out.items()}


def _recorded_fit(fit: Callable[[], object]) -> tuple[float, bool]:
    """Run ``fit``; return (seconds, converged): False when it issued a ConvergenceWarning
    (other warnings are shown as usual)."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        start = time.perf_counter()
        fit()
        fit_time = time.perf_counter() - start
    unconverged = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    for w in caught:  # other warnings are shown as usual
        if w not in unconverged:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return fit_time, not unconverged


def _record_fold(out: dict[str, Any], scores: dict[str, float], fit_time: float,
                 converged: bool, stages: _Stages | None, what: str) -> None:
    """Append one fold's scores, fit time and convergence to ``out``; say them (``stages``)."""
    for s, v in scores.items():
        out[f"test_{s}"].append(v)
    out["fit_time"].append(fit_time)
    out["converged"].append(converged)
    if stages is not None:
        first = next(iter(scores))
        stages.say(f"{what}: {_score_label(first)} {_score_sign(first) * scores[first]:.4f}, "
                   f"fit {format_seconds(fit_time)}" + ("" if converged else
                                                       "; did not converge"))


def _streamed_cross_validate(model: BaseEstimator, source: Any, cv: int,
                             scoring: list[str], seed: int, *, stages: _Stages | None = None,
                             announce: str | None = None) -> dict[str, Any]:
    """K-fold cross-validation of a source read block by block (memory flat in its rows).

    The folds are dealt by row position (:mod:`kernelflow._streamed_cv`); each fold's model
    is fitted on the other folds' rows (:func:`_fit_source`) and scored on its own by sums
    over predicted blocks. Returns :func:`_cross_validate`'s keys but ``estimator``.
    """
    import numpy as np
    from sklearn.base import clone

    from kernelflow._streamed_cv import FoldSource

    _check_folds(cv)
    _check_streamed_scoring(scoring)
    n = source.n_samples
    if cv > n:
        raise CLIError(f"--cv {cv} is larger than the number of rows ({n}): a fold would have "
                       "no rows")
    if stages is not None and announce:
        stages.say(announce)
    out: dict[str, Any] = {"fit_time": [], "converged": [],
                           **{f"test_{s}": [] for s in scoring}}
    for k in range(cv):
        est = clone(model)
        train = FoldSource(source, cv, k, seed, held_out=False)
        fit_time, converged = _recorded_fit(partial(_fit_source, est, train))
        scores = _streamed_scores(est, FoldSource(source, cv, k, seed, held_out=True), scoring)
        _record_fold(out, scores, fit_time, converged, stages, f"fold {k + 1}/{cv}")
    return {k: (v if k == "converged" else np.asarray(v)) for k, v in out.items()}


def _check_folds(cv: int, repeats: int = 1) -> None:
    if cv < 2:
        raise CLIError(f"--cv must be at least 2, got {cv}")
    if repeats < 1:
        raise CLIError(f"--repeats must be at least 1, got {repeats}")


def cmd_evaluate(args: argparse.Namespace) -> int:
    _check_folds(args.cv)
    params = parse_params(args.param).get(None, {})
    model = build_model(args.model, params, scale=not args.no_scale, verbose=args.verbose)
    scoring = _split_list(args.scoring) or _default_scoring(model)
    stages = _stages(args)
    if _streams(args, model):
        _check_streamed_scoring(scoring)  # before the data is read
        source = _streamed_source(args)
        n, d = source.n_samples, source.n_features
        res = _streamed_cross_validate(
            model, source, args.cv, scoring, args.seed, stages=stages,
            announce=f"{args.cv}-fold cross-validation of {args.model} on {n} rows streamed "
                     f"from {len(source.files)} Parquet file(s)")
        streamed = (f"(data streamed block by block from {len(source.files)} Parquet file(s), "
                    f"never loaded; folds dealt by row position with seed {args.seed})")
    else:
        X, y = _read_xy(args, labels=_is_classifier(model))
        n, d, streamed = len(X), X.shape[1], None
        res = _cross_validate(model, X, y, args.cv, scoring, args.seed, stages=stages,
                              announce=f"{args.cv}-fold cross-validation of {args.model} on "
                                       f"{n} rows")
    _print_cv_table(args, res, scoring, n, d)
    if streamed:
        print(streamed)
    return 0


def _print_cv_table(args: argparse.Namespace, res: dict[str, Any], scoring: list[str], n: int,
                    d: int) -> None:
    """``evaluate``'s result: a header, one row per score and the fit time, convergence."""
    import numpy as np

    rows = []
    for name in scoring:
        v = _score_sign(name) * np.asarray(res[f"test_{name}"])
        rows.append([_score_label(name), f"{v.mean():.4f}", f"{_sd(v):.4f}",
                     " ".join(f"{s:.3f}" for s in v)])
    rows.append(["fit time", format_seconds(np.mean(res["fit_time"])),
                 format_seconds(_sd(res["fit_time"])), ""])
    print(f"{args.model}: {args.cv}-fold cross-validation on {n} rows x {d} features")
    print(format_table(["metric", "mean", "sd", "folds"], rows))
    unconverged = res["converged"].count(False)
    if unconverged:
        print(f"{args.model} did not converge (ConvergenceWarning) in {unconverged} of "
              f"{len(res['converged'])} fits")


def _shared_setting(X: pd.DataFrame, y: np.ndarray,
                    args: argparse.Namespace) -> tuple[str, float, float, list[str]]:
    """The kernel, bandwidth and penalty every compared model gets (unless set per model)."""
    import numpy as np

    from kernelflow.kernels import median_heuristic

    kernel = args.kernel
    Xs = X.to_numpy()
    if not args.no_scale:
        from sklearn.preprocessing import StandardScaler

        Xs = StandardScaler().fit_transform(Xs)
    notes: list[str] = []
    sigma = args.sigma
    if sigma is None:
        sigma = float(median_heuristic(Xs))
        notes.append(f"sigma = {sigma:.3g} is the median heuristic of the "
                     f"{'standardised ' if not args.no_scale else ''}features")
    alpha = args.alpha
    if alpha is None:
        import warnings as _w

        from kernelflow.estimators import KernelRidgeCV

        m = min(len(Xs), 2000)
        idx = np.random.RandomState(args.seed).permutation(len(Xs))[:m]
        with _w.catch_warnings():
            _w.simplefilter("ignore")
            target = y if y.dtype.kind in "fiub" else np.unique(y, return_inverse=True)[1]
            alpha = float(KernelRidgeCV(kernel=kernel, sigmas=[sigma]).fit(
                Xs[idx], target[idx].astype(np.float64)).alpha_)
        notes.append(f"alpha = {alpha:.3g} is the leave-one-out choice of exact KRR with this "
                     f"kernel on {'all' if m == len(Xs) else m} rows, chosen once before the "
                     "folds")
    return kernel, float(sigma), float(alpha), notes


def _configure(name: str, cls: type, kernel: str, sigma: float,
               alpha: float) -> dict[str, Any]:
    """Parameters giving ``cls`` the shared kernel, bandwidth and penalty where it has them."""
    valid = set(cls().get_params(deep=False))
    module = cls.__module__
    if module.startswith("sklearn.kernel_ridge"):
        if kernel not in ("rbf", "gaussian"):
            raise CLIError(f"{name} has no kernel equivalent to {kernel!r}; compare it with "
                           "--kernel rbf or leave it out")
        return {"kernel": "rbf", "gamma": 1.0 / (2.0 * sigma**2), "alpha": alpha}
    if module.startswith("sklearn."):  # linear models: the same penalty on the weights
        linear: dict[str, Any] = {"alpha": alpha} if "alpha" in valid and "huber" not in name \
            else {}
        if "max_iter" in valid:  # iterate to convergence (L-BFGS stops when it gets there)
            linear["max_iter"] = 10_000
        return linear
    params: dict[str, Any] = {}
    if "kernel" in valid:
        params["kernel"] = kernel
    if "sigma" in valid:
        params["sigma"] = sigma
    elif "sigmas" in valid:
        params["sigmas"] = [sigma]
    if "alpha" in valid and "alphas" not in valid:
        params["alpha"] = alpha
    return params


def _sd(values: np.ndarray) -> float:
    """The sample standard deviation (n - 1 in the denominator) of scores over folds."""
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def _median(values: Iterable[float | None]) -> float | None:
    import numpy as np

    v = [float(x) for x in values if x is not None]
    return float(np.median(v)) if v else None


def _describe(name: str, estimators: Sequence[BaseEstimator]) -> tuple[str, str, str]:
    """(kernel, bandwidth, penalty) strings of the models fitted on the folds."""
    import math

    finals = [_final(e) for e in estimators]
    f = finals[0]
    p = f.get_params(deep=False)
    module = type(f).__module__
    if module.startswith("sklearn.kernel_ridge"):
        kernel = str(p.get("kernel"))
        gamma = p.get("gamma")
        sigma = 1.0 / math.sqrt(2.0 * gamma) if kernel == "rbf" and gamma else None
        return (("gaussian (rbf)" if kernel == "rbf" else kernel),
                "-" if sigma is None else f"{sigma:.3g}", f"alpha {p.get('alpha'):.3g}")
    if module.startswith("sklearn."):
        pen = p.get("alpha")
        what = f"alpha {pen:.3g}" if isinstance(pen, (int, float)) else "-"
        if "huber" in name:
            what += " (its own default)"
        return "none (linear)", "-", what
    kernel = p.get("kernel", "-")
    kernel = "gaussian (rbf)" if kernel == "rbf" else str(kernel)
    sig = _median(getattr(getattr(e, "kernel_", None), "sigma", None) for e in finals)
    if sig is None:
        sig = _median(getattr(e, "sigma_", None) for e in finals)
    if sig is None and isinstance(p.get("sigma"), (int, float)):
        sig = float(p["sigma"])
    fitted_alpha = _median(getattr(e, "alpha_", None) for e in finals)
    t = _median(getattr(e, "t_", None) for e in finals)
    if fitted_alpha is not None and "alphas" in p:
        pen = f"alpha {fitted_alpha:.3g} (tuned, fold median)"
    elif isinstance(p.get("alpha"), (int, float)):
        pen = f"alpha {p['alpha']:.3g}"
    elif t is not None:
        pen = f"early stopping t {t:.3g} (fold median)"
    else:
        pen = "-"
    return kernel, "-" if sig is None else f"{sig:.3g}", pen


def _compared_models(args: argparse.Namespace) -> tuple[list, dict, dict]:
    """(names, classes, parameters by model) of ``compare``, every name and parameter checked
    before any fitting."""
    from kernelflow.registry import get_estimator_class

    names = []
    for item in args.models or []:
        names.extend(_split_list(item))
    if len(names) < 1:
        raise CLIError("give at least one model with --models NAME[,NAME...]")
    classes = {}
    for name in names:  # fail fast on typos, before any fitting
        try:
            classes[name] = get_estimator_class(name)
        except KeyError as exc:
            raise CLIError(exc.args[0]) from None
        except ImportError as exc:
            raise CLIError(str(exc)) from None
    _check_plot(args.plot)
    _check_folds(args.cv, args.repeats)
    scoped = parse_params(args.param, models=set(names))
    for name in names:  # unknown or invalid parameters, before any fitting
        build_model(name, dict(scoped.get(name, {})), scale=False)
    return names, classes, scoped


def _compare_one(name: str, cls, args: argparse.Namespace, scoped: dict, shared: tuple,
                 X, y, scoring: list, stages) -> tuple[list, float, float, float]:
    """Cross-validate one model of ``compare`` on the shared setting ``(kernel, sigma,
    alpha)``; returns its table row, mean score, score spread and mean fit time (a failing
    model gets a row saying so)."""
    import numpy as np

    kernel, sigma, alpha = shared
    valid = set(cls().get_params(deep=False))
    params = _configure(name, cls, kernel, sigma, alpha)
    if "random_state" in valid:  # reproducible rows (landmarks, validation splits)
        params["random_state"] = args.seed
    params.update({k: v for k, v in scoped.get(None, {}).items() if k in valid})
    params.update(scoped.get(name, {}))
    model = build_model(name, params, scale=not args.no_scale, verbose=args.verbose,
                        center_target=True)
    try:
        res = _cross_validate(model, X, y, args.cv, scoring, args.seed,
                              repeats=args.repeats, stages=stages, label=f"{name} ")
    except CLIError:
        raise
    except Exception as exc:  # noqa: BLE001 - one failing model must not hide the others
        row = ([name, "-", "-", "failed: " + _one_line(exc)[:60]]
               + [""] * len(scoring) + ["", ""])
        return row, float("nan"), 0.0, float("nan")
    vals = [_score_sign(s) * np.asarray(res[f"test_{s}"]) for s in scoring]
    fit_t = float(np.mean(res["fit_time"]))
    failed = res["converged"].count(False)
    n_fits = args.cv * args.repeats
    row = ([name, *_describe(name, res["estimator"])]
           + [f"{v.mean():.4f} +- {_sd(v):.4f}" for v in vals]
           + [format_seconds(fit_t), f"no ({failed}/{n_fits} fits)" if failed else "yes"])
    return row, float(vals[0].mean()), _sd(vals[0]), fit_t


def cmd_compare(args: argparse.Namespace) -> int:
    names, classes, scoped = _compared_models(args)
    classifier = _is_classifier(classes[names[0]]())
    stages = _stages(args)
    X, y = _read_xy(args, labels=classifier)
    scoring = _split_list(args.scoring) or _default_scoring(classes[names[0]]())
    stages.say("choosing the shared bandwidth and penalty")
    kernel, sigma, alpha, notes = _shared_setting(X, y, args)
    n_fits = args.cv * args.repeats
    rows, scores, spreads, times = [], [], [], []
    for name in names:
        row, score, spread, fit_t = _compare_one(name, classes[name], args, scoped,
                                                 (kernel, sigma, alpha), X, y, scoring, stages)
        rows.append(row)
        scores.append(score)
        spreads.append(spread)
        times.append(fit_t)
    folds = (f"{args.cv}-fold cross-validation" if args.repeats == 1 else
             f"{args.cv}-fold cross-validation repeated with {args.repeats} seeds")
    print(f"{folds} on {len(X)} rows x {X.shape[1]} features (target {args.target}): mean +- "
          f"sd (sample) over {n_fits} held-out folds. Every model gets the same preprocessing "
          "(features "
          f"{'standardised and ' if not args.no_scale else ''}"
          f"{'target centred at its training mean, ' if not classifier else ''}in each fold), "
          f"the same kernel ({kernel}), bandwidth (sigma {sigma:.3g}) and penalty (alpha "
          f"{alpha:.3g}) where it has one, unless set with -p; models that tune a parameter "
          "tune it inside each fold; 'converged' is 'no' where a fit warned that it stopped "
          "before converging")
    for note in notes:
        print(f"  {note}")
    print(format_table(["model", "kernel", "sigma", "penalty"]
                       + [_score_label(s) for s in scoring] + ["fit time", "converged"], rows))
    if args.plot:
        from kernelflow.plotting import plot_comparison, save_figure

        fig = plot_comparison(names, scores, times, errors=spreads,
                              score_label=f"{_score_label(scoring[0])} (mean ± sd over "
                                          f"{n_fits} held-out folds)",
                              title=f"{folds}, target {args.target}\n"
                                    f"shared: {kernel} kernel, sigma {sigma:.3g}, "
                                    f"alpha {alpha:.3g}, centred target")
        print(f"wrote plot {save_figure(fig, args.plot)}")
    return 0


def environment_report() -> list[tuple[str, str]]:
    """(name, value) pairs: versions, device, threads, memory budget, compiled loops.

    Examples
    --------
    >>> dict(environment_report())["compiled loops"].split(":")[0] in ("active", "unavailable")
    True
    """
    import platform

    import numpy as np
    import scipy
    import sklearn
    import torch

    from kernelflow import __version__
    from kernelflow.operators import Options, memory_budget
    from kernelflow.solvers import _native

    if torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name(0)}; {torch.cuda.device_count()} device(s))"
    else:
        device = "cpu (no CUDA device visible to torch)"
    cuda = torch.version.cuda or "none (CPU build)"
    return [
        ("kernelflow", __version__),
        ("python", f"{platform.python_version()} ({platform.platform(terse=True)})"),
        ("torch", f"{torch.__version__} (CUDA: {cuda})"),
        ("numpy", np.__version__),
        ("scipy", scipy.__version__),
        ("scikit-learn", sklearn.__version__),
        ("device", device),
        ("torch threads", str(torch.get_num_threads())),
        ("memory budget", f"{memory_budget(Options()) / 2**30:.1f} GiB per engine call (half "
                          "of the free host memory)"),
        ("compiled loops", _native.status()),
    ]


def cmd_info(args: argparse.Namespace) -> int:
    if args.model is None:
        rows = environment_report()
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}} : {value}")
        return 0
    return _model_info(args)


def _model_info(args: argparse.Namespace) -> int:
    from kernelflow.io import read_metadata

    if not Path(args.model).exists():
        raise CLIError(f"file not found: {args.model}")
    meta = read_metadata(args.model)
    est = meta["estimator"]
    print(f"format        : {meta['format']} v{meta['format_version']}")
    print(f"estimator     : {est.get('name') or '-'} ({est['class']})")
    print("written by    : " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    n_bytes = sum(_nbytes(a) for a in meta["arrays"].values())
    print(f"arrays        : {len(meta['arrays'])} ({n_bytes / 1e6:.2f} MB)")
    for key, value in meta.get("extra", {}).items():
        if key == "fit_seconds" and isinstance(value, (int, float)):
            value = format_seconds(value)
        elif isinstance(value, float):
            value = f"{value:.4g}"
        print(f"{key:<14}: {value}")
    return 0


def _nbytes(info: dict[str, Any]) -> int:
    import math

    import numpy as np

    return int(np.dtype(info["dtype"]).itemsize * math.prod(info["shape"]))


def cmd_demo(args: argparse.Namespace) -> int:
    from kernelflow.demo import run_demo

    if not 0.0 <= args.outliers < 0.5:
        raise CLIError(f"--outliers must be in [0, 0.5), got {args.outliers}")
    if args.n_train is not None and args.n_train < 20:
        raise CLIError(f"--n-train must be at least 20, got {args.n_train}")
    if args.splits < 1:
        raise CLIError(f"--splits must be at least 1, got {args.splits}")
    plot = None if args.no_plot else args.plot
    if plot:
        import importlib.util

        check_output(plot, "plot", suffixes=_PLOT_SUFFIXES, create_dirs=True)
        if importlib.util.find_spec("matplotlib") is None:
            logger.warning("no plot: matplotlib is not installed (pip install matplotlib, or "
                           "pip install -e '.[plot]' from a checkout)")
            plot = None
    run_demo(dataset=args.dataset, outlier_fraction=args.outliers, seed=args.seed,
             n_train=args.n_train, plot=plot, verbose=args.verbose, n_splits=args.splits,
             on_split=_stages(args).say)
    return 0


def _split_list(value: str | Sequence[str] | None) -> list[str]:
    if not value:
        return []
    if isinstance(value, (list, tuple)):
        out: list[str] = []
        for v in value:
            out.extend(_split_list(v))
        return out
    return [v.strip() for v in str(value).split(",") if v.strip()]


# ---------------------------------------------------------------------------------------------
# parser and entry point
# ---------------------------------------------------------------------------------------------
def _add_data_args(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    p.add_argument("data", help="CSV or Parquet file, a directory or glob of Parquet files, or "
                                "dataset:NAME (e.g. dataset:concrete)")
    p.add_argument("--target", "-t", help="name of the target column")
    p.add_argument("--features", help="comma-separated feature columns (default: all others)")
    p.add_argument("--drop", action="append", help="column(s) to leave out (comma-separated)")
    p.add_argument("--max-rows", type=int, help="use a random subset of this many rows")
    p.add_argument("--no-scale", action="store_true",
                   help="do not standardise the features (default: StandardScaler first)")
    p.add_argument("--seed", type=int, default=0, help="seed for subsampling and folds")
    p.add_argument("--keep-index-columns", action="store_true",
                   help="keep columns that look like row names or row numbers (default: leave "
                        "them out with a note)")
    _add_sep_arg(p)
    if model:
        p.add_argument("--model", "-m", required=True, help="model name (see 'kernelflow list')")
        p.add_argument("--param", "-p", action="append", metavar="KEY=VALUE",
                       help="estimator parameter, repeatable (e.g. -p alpha=0.1 -p kernel=rbf)")


def _add_sep_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sep", help="field separator of CSV files, e.g. ';' or tab (default ',', "
                                 "a tab for .tsv)")


def _add_global_args(p: argparse.ArgumentParser, *, sub: bool) -> None:
    """-v, -q and --debug: accepted before and after the command (the counts add up)."""
    default = argparse.SUPPRESS if sub else None
    p.add_argument("-v", "--verbose", action="count", dest="verbose_after" if sub else "verbose",
                   default=argparse.SUPPRESS if sub else 0,
                   help="more output: the estimators' own progress (bars on a terminal or in a "
                        "notebook) and log messages")
    p.add_argument("-q", "--quiet", action="store_true", default=default or False,
                   help="no progress lines on standard error")
    p.add_argument("--debug", action="store_true", default=default or False,
                   help="show tracebacks on errors")


class _VersionAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        rows = environment_report()
        print(f"{PROG} {rows[0][1]}")
        print("; ".join(f"{k} {v.split(' (')[0]}" for k, v in rows[1:6]))
        print(f"compiled loops: {rows[-1][1].split(':')[0]}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kernelflow`` command."""
    from kernelflow import __version__

    parser = _Parser(prog=PROG, description="Fast, robust and scalable kernel regression.")
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help=f"show the versions ({PROG} {__version__}, torch, ...) and exit")
    _add_global_args(parser, sub=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = _Parser(add_help=False)
    _add_global_args(common, sub=True)

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    p = add("fit", help="fit a model and write a model file")
    _add_data_args(p)
    p.add_argument("--output", "-o", default="model.npz", help="model file (default model.npz)")
    p.add_argument("--cv", type=int, default=5,
                   help="folds of the cross-validated score printed beside the training score "
                        "(default 5; 0: none)")
    p.add_argument("--plot", help="write a plot (fitted function, path or predictions)")
    p.set_defaults(func=cmd_fit)

    p = add("predict", help="predict with a saved model")
    p.add_argument("model", help="model file written by 'kernelflow fit'")
    p.add_argument("data", help="CSV or Parquet file with the training feature columns")
    p.add_argument("--output", "-o", help="predictions file: .csv (or .tsv, .txt) or .parquet "
                                          "(default: CSV on standard output)")
    _add_sep_arg(p)
    p.set_defaults(func=cmd_predict)

    p = add("evaluate", help="cross-validated scores of one model")
    _add_data_args(p)
    p.add_argument("--cv", type=int, default=5, help="number of folds (default 5)")
    p.add_argument("--scoring", help="comma-separated scikit-learn scorer names")
    p.set_defaults(func=cmd_evaluate)

    p = add("compare", help="compare several models on one data set")
    _add_data_args(p, model=False)
    p.add_argument("--models", "-m", action="append", required=True,
                   help="comma-separated model names (repeatable)")
    p.add_argument("--param", "-p", action="append", metavar="[MODEL:]KEY=VALUE",
                   help="parameter for all models that accept it, or for MODEL only")
    p.add_argument("--cv", type=int, default=3, help="number of folds (default 3)")
    p.add_argument("--repeats", type=int, default=1,
                   help="repeat the cross-validation with this many seeds (fresh folds each "
                        "time; the spread is over all held-out folds; default 1)")
    p.add_argument("--scoring", help="comma-separated scikit-learn scorer names")
    p.add_argument("--kernel", default="rbf", help="kernel of every model (default rbf)")
    p.add_argument("--sigma", type=float,
                   help="bandwidth of every model (default: median heuristic)")
    p.add_argument("--alpha", type=float,
                   help="ridge penalty of every penalised model (default: leave-one-out "
                        "choice of exact KRR)")
    p.add_argument("--plot", help="write a bar chart of the first score with error bars")
    p.set_defaults(func=cmd_compare)

    p = add("demo", help="robust kernel regression on real data with outliers")
    p.add_argument("--dataset", default="concrete", help="real data set (default concrete)")
    p.add_argument("--outliers", type=float, default=0.2,
                   help="fraction of training targets replaced by outliers (default 0.2)")
    p.add_argument("--n-train", type=int, default=None, help="number of training rows")
    p.add_argument("--seed", type=int, default=0, help="seed of the first split (default 0)")
    p.add_argument("--splits", type=int, default=5,
                   help="random train/test splits (seeds SEED, SEED+1, ...); the table shows "
                        "mean +- sd over them (default 5)")
    p.add_argument("--plot", default="kernelflow-demo.png",
                   help="plot file (default kernelflow-demo.png)")
    p.add_argument("--no-plot", action="store_true", help="do not write a plot")
    p.set_defaults(func=cmd_demo)

    p = add("list", help="list the registered models")
    p.set_defaults(func=cmd_list)

    p = add("info", help="versions, device and compiled loops; or a model file's "
                                    "metadata")
    p.add_argument("model", nargs="?", help="model file (default: describe the installation)")
    p.set_defaults(func=cmd_info)
    return parser


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    print(f"{PROG}: warning: {category.__name__}: {_one_line(message)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Errors are reported as one line on standard error: exit code 2 for a wrong command line,
    1 for a failed command.

    Examples
    --------
    >>> main(["info", "no-such-model.npz"])
    1
    >>> main([])  # doctest: +ELLIPSIS
    2
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    previous_showwarning = warnings.showwarning
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.verbose += getattr(args, "verbose_after", 0)
        args._stages = _Stages(args.quiet)  # progress lines count from here
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format=f"{PROG}: %(message)s")
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        if not debug:
            warnings.showwarning = _show_warning
        return int(args.func(args) or 0)
    except CLIError as exc:
        if debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2 if "--help" in str(exc) else 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. 'kernelflow predict ... | head'
        return 0
    except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback
        if debug:
            raise
        from kernelflow.io import ModelFileError

        kind = "" if isinstance(exc, (ModelFileError, ValueError, FileNotFoundError,
                                      KeyError, ImportError, MemoryError)) else (
            f"{type(exc).__name__}: ")
        print(f"{PROG}: error: {kind}{_one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = previous_showwarning


if __name__ == "__main__":
    sys.exit(main())
