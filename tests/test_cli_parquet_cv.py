"""Streamed cross-validation of Parquet data sets on the command line (fit --cv, evaluate).

The streamed scores must equal an in-memory cross-validation of the loaded data on the same
folds (fold rule re-derived here, loop by loop), and the loading path must never run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import mean_absolute_error, r2_score, root_mean_squared_error

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from kernelflow import cli  # noqa: E402
from kernelflow._streamed_cv import FoldSource, ScoreSums, fold_of, fold_sizes  # noqa: E402
from kernelflow.parquet_source import ParquetSource  # noqa: E402
from kernelflow.sources import ArraySource, row_hash_uniform  # noqa: E402

N = 203  # not a multiple of the folds, the row groups or the files
SCORING = ["r2", "neg_root_mean_squared_error", "neg_mean_absolute_error"]
NYSTROM = {"n_components": 20, "sigma": 1.0, "alpha": 1e-3, "random_state": 0}


def _frame(n=N, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-2, 2, size=(n, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.randn(n) + 10.0  # offset: R^2 sums
    return pd.DataFrame(X, columns=["a", "b", "c"]).assign(y=y)


def _write(df, path, row_group_size):
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path,
                   row_group_size=row_group_size)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Two files with uneven row groups (37 and 50 rows)."""
    d = tmp_path_factory.mktemp("pqcv")
    df = _frame()
    _write(df.iloc[:120], d / "part0.parquet", 37)
    _write(df.iloc[120:], d / "part1.parquet", 50)
    return d


def _reference_folds(n, k, seed):
    """The documented rule, chunk by chunk: rows cK..cK+K-1 go to the folds in the order of
    their seeded position hashes."""
    folds = np.empty(n, dtype=np.int64)
    for c in range((n + k - 1) // k):
        rows = np.arange(c * k, c * k + k)
        rank = np.argsort(np.argsort(row_hash_uniform(rows, seed)))
        keep = rows < n
        folds[rows[keep]] = rank[keep]
    return folds


def _in_memory_cv(fit, X, y, folds, k):
    """Fold-by-fold scores of models fitted in memory, scored with scikit-learn's metrics."""
    out = {s: [] for s in SCORING}
    for j in range(k):
        train, test = folds != j, folds == j
        pred = fit(X[train], y[train]).predict(X[test])
        out["r2"].append(r2_score(y[test], pred))
        out["neg_root_mean_squared_error"].append(-root_mean_squared_error(y[test], pred))
        out["neg_mean_absolute_error"].append(-mean_absolute_error(y[test], pred))
    return {s: np.asarray(v) for s, v in out.items()}


def _no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the data set was loaded")

    monkeypatch.setattr(cli, "_read_xy", refuse)
    monkeypatch.setattr(cli, "read_table", refuse)


def _main(monkeypatch, capsys, cwd, *args):
    monkeypatch.chdir(cwd)
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------------------------
# the fold rule
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "k", "seed"), [(203, 5, 0), (203, 4, 3), (10, 10, 1), (7, 2, 5)])
def test_folds_follow_the_rule_and_are_balanced(n, k, seed):
    folds = fold_of(np.arange(n), k, seed)
    np.testing.assert_array_equal(folds, _reference_folds(n, k, seed))
    sizes = np.bincount(folds, minlength=k)
    np.testing.assert_array_equal(fold_sizes(n, k, seed), sizes)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == n
    # any subset of positions, in any order, gets the same folds
    pos = np.random.RandomState(0).permutation(n)[: max(1, n // 2)]
    np.testing.assert_array_equal(fold_of(pos, k, seed), folds[pos])


def test_fold_sides_are_the_rows_of_the_rule_whatever_the_block_size():
    df = _frame(n=57)
    X, y = df[["a", "b", "c"]].to_numpy(), df["y"].to_numpy()
    folds = _reference_folds(57, 4, 2)
    src = ArraySource(X, y)
    for j in range(4):
        for held_out, rows in ((True, folds == j), (False, folds != j)):
            side = FoldSource(src, 4, j, 2, held_out=held_out)
            assert side.n_samples == rows.sum()
            for block_size in (5, 13, 1000):
                blocks = list(side.iter_blocks(block_size))
                np.testing.assert_array_equal(np.concatenate([b.X for b in blocks]), X[rows])
                starts = np.cumsum([0] + [b.X.shape[0] for b in blocks[:-1]])
                assert [b.start for b in blocks] == starts.tolist()  # numbered 0, 1, ...
            # positions on a side address its own rows, as in an array of them
            np.testing.assert_array_equal(side.take([2, 0]).numpy(), X[rows][[2, 0]])


def test_score_sums_equal_scikit_learn_over_blocks():
    rng = np.random.RandomState(1)
    y = 1e4 + rng.randn(1001)  # large offset: a naive sum of squares loses the digits
    pred = y + 0.3 * rng.randn(1001)
    sums = ScoreSums()
    for a in range(0, 1001, 97):
        sums.add(y[a:a + 97, None], pred[a:a + 97])
    assert sums.score("r2") == pytest.approx(r2_score(y, pred), rel=0, abs=1e-10)
    assert -sums.score("neg_root_mean_squared_error") == pytest.approx(
        root_mean_squared_error(y, pred), rel=1e-12)
    assert -sums.score("neg_mean_absolute_error") == pytest.approx(
        mean_absolute_error(y, pred), rel=1e-12)
    const = ScoreSums()  # constant target: scikit-learn's finite convention
    const.add(np.ones(4), np.ones(4))
    assert const.score("r2") == r2_score(np.ones(4), np.ones(4)) == 1.0
    const.add(np.ones(1), np.zeros(1))
    assert const.score("r2") == r2_score(np.ones(5), [1, 1, 1, 1, 0]) == 0.0


# ---------------------------------------------------------------------------------------------
# streamed cross-validation = in-memory cross-validation on the same folds
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "scale"), [("nystrom_ridge", False), ("nystrom_ridge", True),
                                           ("nystrom_robust", False)])
def test_streamed_cv_equals_in_memory_cv_on_the_same_folds(data_dir, name, scale):
    from sklearn.preprocessing import StandardScaler

    df = pd.concat([pd.read_parquet(data_dir / f) for f in ("part0.parquet", "part1.parquet")])
    X, y = df[["a", "b", "c"]].to_numpy(), df["y"].to_numpy()
    params = NYSTROM if name == "nystrom_ridge" else {"n_components": 20, "sigma": 1.0,
                                                       "random_state": 0}
    model = cli.build_model(name, params, scale=scale)  # scale: StandardScaler in front
    res = cli._streamed_cross_validate(model, ParquetSource(data_dir, target="y"), 5, SCORING,
                                       seed=3)
    cls = type(model[-1] if scale else model)

    class InMemory:  # the scaler fitted on the training rows, the model on the scaled rows
        def fit(self, A, b):
            self.scaler = StandardScaler().fit(A) if scale else None
            self.est = cls(**params).fit(ArraySource(self._scaled(A), b))
            return self

        def _scaled(self, A):
            return A if self.scaler is None else self.scaler.transform(A)

        def predict(self, A):
            return self.est.predict(self._scaled(A))

    ref = _in_memory_cv(lambda A, b: InMemory().fit(A, b), X, y, _reference_folds(N, 5, 3), 5)
    for s in SCORING:
        np.testing.assert_allclose(res[f"test_{s}"], ref[s], rtol=0, atol=1e-10)
    assert res["converged"] == [True] * 5 and len(res["fit_time"]) == 5


def test_streamed_doubly_stochastic_cv_equals_in_memory_passes(tmp_path):
    df = _frame(n=150)
    _write(df, tmp_path / "one.parquet", 1000)  # one row group: one chunk per pass
    X, y = df[["a", "b", "c"]].to_numpy(), df["y"].to_numpy()
    params = {"sigma": 1.0, "max_iter": 2, "batch_size": 16, "random_state": 0}
    model = cli.build_model("doubly_stochastic", params, scale=False)
    res = cli._streamed_cross_validate(model, ParquetSource(tmp_path / "one.parquet",
                                                            target="y"), 3, SCORING, seed=0)

    def passes(A, b):
        est = type(model)(**params)
        for _ in range(2):
            est.partial_fit(A, b)
        return est

    ref = _in_memory_cv(passes, X, y, _reference_folds(150, 3, 0), 3)
    for s in SCORING:
        np.testing.assert_allclose(res[f"test_{s}"], ref[s], rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# the command line streams (never loads) and prints the in-memory table
# ---------------------------------------------------------------------------------------------
def test_evaluate_streams_and_prints_the_in_memory_table(data_dir, tmp_path, monkeypatch,
                                                         capsys):
    df = pd.concat([pd.read_parquet(data_dir / f) for f in ("part0.parquet", "part1.parquet")])
    df.to_csv(tmp_path / "same.csv", index=False)
    args = ["--target", "y", "--model", "nystrom_ridge", "--no-scale", "--cv", "5", "--seed",
            "3", *sum((["-p", f"{k}={v}"] for k, v in NYSTROM.items()), [])]
    code, loaded, err = _main(monkeypatch, capsys, tmp_path, "evaluate", "same.csv", *args)
    assert code == 0, err
    _no_loading(monkeypatch)
    code, out, err = _main(monkeypatch, capsys, tmp_path, "evaluate", data_dir, *args)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"nystrom_ridge: 5-fold cross-validation on {N} rows x 3 features"
    assert lines[0] == loaded.splitlines()[0]
    assert lines[1].split() == loaded.splitlines()[1].split() == ["metric", "mean", "sd",
                                                                  "folds"]
    assert [r.split()[0] for r in lines[3:7]] == [r.split()[0] for r in loaded.splitlines()[3:7]]
    assert "streamed block by block from 2 Parquet file(s), never loaded" in out
    assert "fold 5/5: R^2" in err
    X, y = df[["a", "b", "c"]].to_numpy(), df["y"].to_numpy()
    ref = _in_memory_cv(lambda A, b: type(cli.build_model("nystrom_ridge", NYSTROM,
                                                          scale=False))(**NYSTROM)
                        .fit(ArraySource(A, b)), X, y, _reference_folds(N, 5, 3), 5)
    assert float(lines[3].split()[1]) == pytest.approx(ref["r2"].mean(), abs=5e-5)
    assert float(lines[4].split()[1]) == pytest.approx(
        -ref["neg_root_mean_squared_error"].mean(), abs=5e-5)


def test_fit_cv_streams_and_records_the_score(data_dir, tmp_path, monkeypatch, capsys):
    """The default command (features standardised) streams too: the scaler learns from blocks."""
    from sklearn.preprocessing import StandardScaler

    from kernelflow.io import load_model, read_metadata

    _no_loading(monkeypatch)
    code, out, err = _main(monkeypatch, capsys, tmp_path, "fit", data_dir, "--target", "y",
                           "--model", "nystrom_ridge", "--cv", "4", "--seed", "1",
                           *sum((["-p", f"{k}={v}"] for k, v in NYSTROM.items()), []),
                           "-o", tmp_path / "m.npz")
    assert code == 0, err
    res = cli._streamed_cross_validate(cli.build_model("nystrom_ridge", NYSTROM, scale=True),
                                       ParquetSource(data_dir, target="y"), 4, ["r2"], seed=1)
    mean = res["test_r2"].mean()
    assert "(streamed)" in out and f"4-fold cross-validated R^2 = {mean:.4f}" in out
    extra = read_metadata(tmp_path / "m.npz")["extra"]
    assert extra["cv_score"] == pytest.approx(mean, abs=1e-6)
    # the saved model is the scaler and the model fitted on every row
    df = pd.concat([pd.read_parquet(data_dir / f) for f in ("part0.parquet", "part1.parquet")])
    X, y = df[["a", "b", "c"]].to_numpy(), df["y"].to_numpy()
    model = load_model(tmp_path / "m.npz")
    scaler = StandardScaler().fit(X)
    np.testing.assert_allclose(model[0].mean_, scaler.mean_, rtol=1e-13)
    np.testing.assert_allclose(model[0].scale_, scaler.scale_, rtol=1e-13)
    ref = type(model[-1])(**NYSTROM).fit(ArraySource(scaler.transform(X), y))
    np.testing.assert_allclose(model.predict(X), ref.predict(scaler.transform(X)), rtol=0,
                               atol=1e-10)
    # the model predicts a CSV file (named columns) as it predicts the Parquet blocks
    df.to_csv(tmp_path / "same.csv", index=False)
    monkeypatch.undo()
    code, out, err = _main(monkeypatch, capsys, tmp_path, "predict", "m.npz", "same.csv", "-o",
                           "pred.csv", "-q")
    assert code == 0 and "warning" not in err, err
    np.testing.assert_allclose(pd.read_csv(tmp_path / "pred.csv")["prediction"],
                               model.predict(X), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# hostile inputs: one clear error
# ---------------------------------------------------------------------------------------------
def test_more_folds_than_rows_is_one_clear_error(tmp_path, monkeypatch, capsys):
    _write(_frame(n=6), tmp_path / "six.parquet", 4)
    _no_loading(monkeypatch)
    code, out, err = _main(monkeypatch, capsys, tmp_path, "evaluate", "six.parquet", "--target",
                           "y", "--model", "nystrom_ridge", "--no-scale", "--cv", "7", "-q")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        "kernelflow: error: --cv 7 is larger than the number of rows (6): a fold would have no "
        "rows"]


def test_a_fold_without_rows_is_refused():
    src = ArraySource(np.arange(6.0).reshape(3, 2), np.arange(3.0))
    empty = int(np.flatnonzero(fold_sizes(3, 5, 0) == 0)[0])
    with pytest.raises(ValueError, match=rf"fold {empty + 1} of 5 has no held-out rows: 3 row"):
        FoldSource(src, 5, empty, 0, held_out=True)
    one = ArraySource(np.zeros((1, 2)), np.zeros(1))
    full = int(np.flatnonzero(fold_sizes(1, 2, 0) == 1)[0])
    with pytest.raises(ValueError, match="has no training rows"):
        FoldSource(one, 2, full, 0, held_out=False)
    with pytest.raises(ValueError, match="no rows were scored"):
        ScoreSums().score("r2")


def test_a_scoring_that_cannot_be_streamed_is_refused_before_reading(data_dir, tmp_path,
                                                                      monkeypatch, capsys):
    def no_source(*args, **kwargs):
        raise AssertionError("the data set was opened")

    _no_loading(monkeypatch)
    monkeypatch.setattr(cli, "parquet_source", no_source)
    for scoring, message in (("r2,explained_variance", "--scoring explained_variance cannot be "
                                                       "computed on a streamed data set"),
                             ("r2,no_such_score", "unknown scorer in --scoring")):
        code, out, err = _main(monkeypatch, capsys, tmp_path, "evaluate", data_dir, "--target",
                               "y", "--model", "nystrom_ridge", "--no-scale", "--scoring",
                               scoring)
        assert code == 1 and len(err.strip().splitlines()) == 1 and message in err


def test_models_that_cannot_stream_still_load(data_dir, tmp_path, monkeypatch, capsys):
    code, out, err = _main(monkeypatch, capsys, tmp_path, "evaluate", data_dir, "--target", "y",
                           "--model", "kernel_ridge", "--cv", "3", "-q")
    assert code == 0, err
    assert "streamed" not in out and f"on {N} rows x 3 features" in out


def test_row_name_columns_are_left_out_as_when_loading(tmp_path, monkeypatch, capsys):
    df = _frame(n=40)
    _write(df.assign(rownames=np.arange(1, 41)), tmp_path / "r.parquet", 16)
    _no_loading(monkeypatch)
    args = ["evaluate", "r.parquet", "--target", "y", "--model", "nystrom_ridge", "--cv", "2",
            "-p", "n_components=5", "-q"]
    code, out, err = _main(monkeypatch, capsys, tmp_path, *args)
    assert code == 0, err
    assert "on 40 rows x 3 features" in out and "left out index-like column(s) 'rownames'" in err
    code, out, err = _main(monkeypatch, capsys, tmp_path, *args, "--keep-index-columns")
    assert code == 0 and "on 40 rows x 4 features" in out, err
