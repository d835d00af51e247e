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
    assert "fit time (s)" in res.stdout
    assert (workdir / "compare.png").stat().st_size > 1000


def test_list_and_info(good_runs, workdir, monkeypatch, capsys):
    listing = _main(workdir, monkeypatch, capsys, "list")
    assert listing.returncode == 0 and "kernel_ridge " in listing.stdout
    info = _main(workdir, monkeypatch, capsys, "info", "model.npz")
    assert info.returncode == 0, info.stderr
    assert "kernelflow-model v1" in info.stdout and "Pipeline" in info.stdout


def _demo(tmp_path, *extra):
    res = _run_all({"demo": ["demo", "--plot", "demo.png", *extra]}, tmp_path)["demo"]
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    rmse = {}
    for line in res.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) > 2 and parts[1].replace(".", "", 1).isdigit():
            rmse[parts[0]] = float(parts[1])
    robust = [v for k, v in rmse.items() if "sign" in k.lower()]
    exact = [v for k, v in rmse.items() if k.lower().startswith("exact")]
    assert robust and exact, res.stdout
    return robust[0], exact[0]


def test_demo_runs_and_the_robust_method_wins(tmp_path):
    robust, exact = _demo(tmp_path, "--n-train", "300")
    assert robust < 0.7 * exact


@pytest.mark.slow
def test_full_demo_the_robust_method_wins(tmp_path):
    robust, exact = _demo(tmp_path)
    assert robust < 0.7 * exact


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
