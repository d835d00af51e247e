"""ParquetSource: fits from Parquet data sets equal fits from the same arrays; bad data refused."""

import os

import numpy as np
import pytest
import torch
from _helpers import regression_data

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from kernelflow.distributed.sharding import row_group_shards, shard_parquet  # noqa: E402
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge  # noqa: E402
from kernelflow.estimators.nystrom_robust import NystromRobustRegressor  # noqa: E402
from kernelflow.parquet_source import ParquetSource  # noqa: E402
from kernelflow.sources import ArraySource  # noqa: E402

N, D = 400, 3


def _data():
    rng = np.random.RandomState(0)
    X, y = regression_data(N, D, lambda X: np.sin(X[:, 0]) + X[:, 1] * X[:, 2], bounds=(-2, 2),
                           seed=rng)
    return X, y, rng.uniform(0.5, 2.0, N)


def _table(X, y, w, *, extra=None):
    cols = {f"x{j}": X[:, j] for j in range(X.shape[1])}
    cols.update({"y": y, "w": w})
    cols.update(extra or {})
    return pa.table(cols)


@pytest.fixture
def data_dir(tmp_path):
    """The data set split over three files with row groups of 50 rows (sizes not multiples)."""
    X, y, w = _data()
    d = tmp_path / "data"
    d.mkdir()
    for i, (a, b) in enumerate([(0, 130), (130, 260), (260, N)]):
        pq.write_table(_table(X[a:b], y[a:b], w[a:b]), d / f"part-{i}.parquet", row_group_size=50)
    return d


def _nystrom(**kw):
    return NystromKernelRidge(30, alpha=1e-3, sigma=1.0, random_state=0, **kw)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_fit_from_parquet_directory_equals_fit_from_arrays(data_dir):
    X, y, w = _data()
    src = ParquetSource(data_dir, target="y", weight="w")
    assert (src.n_samples, src.n_features, src.n_outputs) == (N, D, 1)
    assert [g.num_rows for g in src.row_groups()][:4] == [50, 50, 30, 50]
    blocks = list(src.iter_blocks(64, dtype=torch.float64))
    np.testing.assert_array_equal(torch.cat([b.X for b in blocks]).numpy(), X)
    assert [b.start for b in blocks] == list(np.cumsum([0] + [b.X.shape[0] for b in blocks])[:-1])
    np.testing.assert_array_equal(src.take([399, 0, 131]).numpy(), X[[399, 0, 131]])

    robust = NystromRobustRegressor(30, alpha=1e-3, sigma=1.0, max_iter=20, random_state=0)
    for est in (_nystrom(), robust):
        ref = type(est)(**est.get_params()).fit(ArraySource(X, y, w))
        got = est.fit(src)
        np.testing.assert_allclose(got.predict(X), ref.predict(X), rtol=0, atol=1e-10)


def test_blocks_in_the_estimator_precision_and_column_selection(data_dir):
    X, y, w = _data()
    src = ParquetSource(data_dir, features=["x2", "x0"], target=["y", "x1"])
    assert (src.n_features, src.n_outputs, src.has_weights) == (2, 2, False)
    b = next(src.iter_blocks(16, dtype=torch.float32))
    assert b.X.dtype == torch.float32 and b.X.shape == (16, 2) and b.sample_weight is None
    np.testing.assert_array_equal(b.X.numpy(), X[:16, [2, 0]].astype(np.float32))
    np.testing.assert_array_equal(b.y.numpy(), np.c_[y[:16], X[:16, 1]].astype(np.float32))
    # default features: all columns but the target and the weight
    assert ParquetSource(data_dir, target="y", weight="w").features == ["x0", "x1", "x2"]
    # float32 fit reads float32 blocks and agrees with the float32 fit of the arrays
    est32 = _nystrom(dtype="float32").fit(ParquetSource(data_dir, target="y", weight="w"))
    ref32 = _nystrom(dtype="float32").fit(ArraySource(X, y, w))
    np.testing.assert_allclose(est32.predict(X), ref32.predict(X), rtol=0, atol=1e-5)
    assert est32.compute_dtype_ == "float32"
    # a glob names the same data set
    glob_src = ParquetSource(os.path.join(data_dir, "part-*.parquet"), target="y")
    assert glob_src.n_samples == N


def _hostile(tmp_path, kind):
    X, y, w = _data()
    d = tmp_path / kind
    d.mkdir()
    good = _table(X[:100], y[:100], w[:100])
    pq.write_table(good, d / "a.parquet", row_group_size=50)
    bad = d / "b.parquet"
    if kind == "schema":
        pq.write_table(good.set_column(0, "x0", pa.array(np.arange(100), pa.int64())), bad)
        return d, "x0", r"column 'x0' has type int64 in .*b\.parquet"
    if kind == "nulls":
        pq.write_table(good.set_column(1, "x1", pa.array([1.0, None] * 50)), bad)
        return d, "y", r"column 'x1' of .*b\.parquet has 50 null"
    if kind == "strings":
        pq.write_table(good.set_column(2, "x2", pa.array(["a"] * 100)), bad)
        return d, "y", r"column 'x2' of .*b\.parquet is not numeric"
    if kind == "empty":
        pq.write_table(good.slice(0, 0), bad)
        return d, "y", r"b\.parquet has no rows"
    if kind == "truncated":
        pq.write_table(good, bad)
        raw = bad.read_bytes()
        bad.write_bytes(raw[: len(raw) // 2])
        return d, "y", r"cannot read .*b\.parquet"
    if kind == "missing":
        pq.write_table(good.drop_columns(["w"]), bad)
        return d, "y", r"column 'w' is not in .*b\.parquet"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["schema", "nulls", "strings", "empty", "truncated", "missing"])
def test_hostile_data_sets_give_one_clear_error_and_no_model(tmp_path, data_dir, kind):
    X, y, _ = _data()
    d, _, message = _hostile(tmp_path, kind)
    error = TypeError if kind == "strings" else ValueError
    fresh = _nystrom()
    fitted = _nystrom().fit(ArraySource(X, y))
    before = fitted.predict(X)
    with pytest.raises(error, match=message):
        fresh.fit(ParquetSource(d, target="y", weight="w"))
    with pytest.raises(error, match=message):
        fitted.fit(ParquetSource(d, target="y", weight="w"))
    with pytest.raises(error, match=message):
        shard_parquet(d, "y", sample_weight="w")
    assert not [a for a in vars(fresh) if a.endswith("_")]
    np.testing.assert_array_equal(fitted.predict(X), before)


def test_missing_column_and_nan_values(tmp_path, data_dir):
    with pytest.raises(ValueError, match=r"column 'nope' is not in .*part-0\.parquet"):
        ParquetSource(data_dir, target="nope")
    with pytest.raises(ValueError, match="no Parquet files"):
        ParquetSource(tmp_path / "data" / "*.csv")
    # NaN is a value, not a null: found while reading, named by file and row group
    X, y, w = _data()
    y = y.copy()
    y[70] = np.nan
    pq.write_table(_table(X, y, w), tmp_path / "nan.parquet", row_group_size=50)
    with pytest.raises(ValueError, match=r"y in .*nan\.parquet \(row group 1\) contains NaN"):
        _nystrom().fit(ParquetSource(tmp_path / "nan.parquet", target="y"))


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_row_group_sharding_covers_every_row_once(data_dir, world):
    X, y, _ = _data()
    src = ParquetSource(data_dir, target="y", weight="w")
    groups = src.row_groups()
    parts = row_group_shards(groups, src.n_samples, world)
    assert [g for part in parts for g in part] == groups  # each group once, in order
    rows = []
    for part in parts:
        local = src.select_row_groups(part)
        offset = part[0].start
        for b in local.iter_blocks(32, dtype=torch.float64):
            rows.append(np.arange(b.start, b.start + b.X.shape[0]) + offset)
            np.testing.assert_array_equal(b.X.numpy(), X[offset + b.start:][: b.X.shape[0]])
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(N))
    sizes = [sum(g.num_rows for g in part) for part in parts]
    assert max(sizes) - min(sizes) <= 2 * max(g.num_rows for g in groups)


def test_too_few_row_groups_for_the_processes(tmp_path, monkeypatch):
    import kernelflow.distributed.sharding as sharding

    X, y, w = _data()
    pq.write_table(_table(X[:10], y[:10], w[:10]), tmp_path / "one.parquet")
    monkeypatch.setattr(sharding, "world_size", lambda: 2)
    with pytest.raises(ValueError, match=r"1 row group\(s\) of 10 rows cannot give each of 2"):
        shard_parquet(tmp_path / "one.parquet", "y")


def _cli(monkeypatch, capsys, cwd, *args):
    from kernelflow.cli import main

    monkeypatch.chdir(cwd)
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_command_line_streams_fit_and_predict(data_dir, tmp_path, monkeypatch, capsys):
    import pandas as pd

    from kernelflow.io import load_model, read_metadata

    X, y, w = _data()
    model_file = tmp_path / "m.npz"
    code, out, err = _cli(monkeypatch, capsys, tmp_path, "fit", data_dir, "--target", "y",
                          "--drop", "w", "--model", "nystrom_ridge", "--no-scale", "--cv", "0",
                          "-p", "n_components=30", "-p", "alpha=1e-3", "-p", "sigma=1.0",
                          "-p", "random_state=0", "-o", model_file)
    assert code == 0, err
    assert f"fitted nystrom_ridge on {N} rows x 3 features (streamed)" in out
    ref = _nystrom().fit(ParquetSource(data_dir, target="y", weight=None,
                                       features=["x0", "x1", "x2"]))
    model = load_model(model_file)
    np.testing.assert_allclose(model.predict(X), ref.predict(X), rtol=0, atol=1e-10)
    assert read_metadata(model_file)["extra"]["features"] == ["x0", "x1", "x2"]
    # predictions streamed batch by batch to Parquet and CSV, with the score when y is there
    for name in ("pred.parquet", "pred.csv"):
        code, out, err = _cli(monkeypatch, capsys, tmp_path, "predict", model_file, data_dir,
                              "-o", name)
        assert code == 0, err
        assert f"wrote {N} predictions" in out and "R^2 on" in out
        read = pd.read_parquet if name.endswith("parquet") else pd.read_csv
        np.testing.assert_allclose(read(tmp_path / name)["prediction"], ref.predict(X),
                                   rtol=0, atol=1e-10)
    # a model that cannot stream loads the directory instead
    code, out, err = _cli(monkeypatch, capsys, tmp_path, "fit", data_dir, "--target", "y",
                          "--drop", "w", "--model", "kernel_ridge", "--cv", "0",
                          "-o", tmp_path / "k.npz")
    assert code == 0 and f"on {N} rows" in out, err


def test_command_line_refuses_a_hostile_data_set_in_one_line(tmp_path, monkeypatch, capsys):
    d, _, message = _hostile(tmp_path, "nulls")
    code, out, err = _cli(monkeypatch, capsys, tmp_path, "fit", d, "--target", "y", "--model",
                          "nystrom_ridge", "--no-scale", "--cv", "0", "-o", tmp_path / "m.npz")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "column 'x1'" in err and "b.parquet" in err and "null" in err
    assert not (tmp_path / "m.npz").exists()


def test_command_line_streams_doubly_stochastic_passes(data_dir, tmp_path, monkeypatch,
                                                         capsys):
    from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor
    from kernelflow.io import load_model

    X, y, _ = _data()
    code, out, err = _cli(monkeypatch, capsys, tmp_path, "fit", data_dir, "--target", "y",
                          "--drop", "w", "--model", "doubly_stochastic", "--no-scale",
                          "--cv", "0", "-p", "sigma=1.0", "-p", "max_iter=2", "-p",
                          "batch_size=16", "-p", "random_state=0", "-o", tmp_path / "ds.npz")
    assert code == 0 and "(streamed)" in out, err
    # the same in-order passes over the arrays, one chunk per row group
    ref = DoublyStochasticRegressor(sigma=1.0, max_iter=2, batch_size=16, random_state=0)
    bounds = [g.start for g in ParquetSource(data_dir, target="y").row_groups()] + [N]
    for _ in range(2):
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            ref.partial_fit(X[a:b], y[a:b])
    np.testing.assert_allclose(load_model(tmp_path / "ds.npz").predict(X), ref.predict(X),
                               rtol=0, atol=1e-10)
