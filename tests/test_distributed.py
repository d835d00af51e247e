"""Data-parallel fits on 2 Gloo processes equal the single-process fits; failures end cleanly."""

import os
import signal

import numpy as np
import pandas as pd
import pytest
import torch
from _helpers import one_thread, regression_data, sine_cosine

from kernelflow.distributed import (
    DistributedError,
    ShardSource,
    check_consistent,
    distributed_fit,
    distributed_krr_grid_cv,
    distributed_path_cv,
    distributed_penalized_grid_cv,
    my_share,
    rank,
    save_model_rank0,
    shard_arrays,
    shard_npy,
    shard_parquet,
    shard_range,
    spawn,
)
from kernelflow.estimators.doubly_stochastic_classifier import DoublyStochasticClassifier
from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.estimators.nystrom_robust import NystromRobustRegressor
from kernelflow.kernels import Gaussian
from kernelflow.solvers.grid_cv import krr_grid_cv, penalized_grid_cv
from kernelflow.solvers.path_cv import early_stopping_path_cv
from kernelflow.sources import ArraySource

N, D = 600, 2
_PEN = {"penalty": "l1", "max_iter": 2000, "tol": 1e-9}
RTOL = 1e-6


def _data():
    X, y = regression_data(N, D, sine_cosine, bounds=(-3, 3))
    y[::25] += 20.0  # gross outliers for the robust regressor
    return X, y


def _estimators():
    """(name, estimator, data-format) triples fitted both ways."""
    return [
        ("nystrom_krr", NystromKernelRidge(40, alpha=1e-3, sigma=1.0, random_state=0),
         "parquet"),
        ("nystrom_krr_weighted_2d", NystromKernelRidge(40, alpha=1e-3, sigma=1.0,
                                                       random_state=0), "weighted"),
        # centres drawn from the global rows, median-heuristic bandwidth, hashed validation split
        ("nystrom_krr_early", NystromKernelRidge(40, alpha=0.1, early_stopping=True,
                                                 random_state=0), "clean"),
        ("nystrom_lad", NystromRobustRegressor(40, sigma=1.0, max_iter=25, random_state=0),
         "npy"),
        ("nystrom_huber", NystromRobustRegressor(40, loss="huber", sigma=1.0, max_iter=20,
                                                 early_stopping=True, random_state=0), "arrays"),
        # batch_size="auto" is sized from the global row count
        ("doubly_stochastic", DoublyStochasticRegressor(sigma=1.0, batch_size="auto",
                                                        block_size=16, max_iter=2,
                                                        early_stopping=True, random_state=0),
         "arrays"),
        ("doubly_stochastic_clf", DoublyStochasticClassifier(sigma=1.0, batch_size=64,
                                                             block_size=16, max_iter=1,
                                                             random_state=0), "labels"),
    ]


def _coef(model):
    c = model.coef_ if hasattr(model, "coef_") else model.dual_coef_
    return np.asarray(c, dtype=np.float64)


def _shard(kind, X, y, files):
    if kind == "npy":
        return shard_npy(files["X"], files["y"])
    if kind == "parquet":
        return shard_parquet(files["parquet"], "y")
    if kind == "labels":
        return shard_arrays(X, (y > np.median(y)).astype(np.float64))
    if kind == "clean":  # no outliers: the validation MSE keeps improving for a while
        return shard_arrays(X, np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1]))
    if kind == "weighted":  # two targets, sample weights
        w = 0.5 + np.abs(np.cos(np.arange(N)))
        return shard_arrays(X, np.stack([y, np.cos(X[:, 1])], 1), w)
    return shard_arrays(X, y)


def _fit_all(files):
    """Runs on every process: all fits, the CV grids, model writing and a shape mismatch."""
    X, y = _data()
    out = {}
    for name, est, kind in _estimators():
        model = distributed_fit(est, _shard(kind, X, y, files))
        out[name] = (_coef(model), np.asarray(model.predict(X[:100]), dtype=np.float64),
                     getattr(model, "best_iteration_", None),
                     list(getattr(model, "validation_scores_", [])))
    save_model_rank0(model, files["model"])
    from kernelflow.io import load_model

    out["reloaded"] = np.asarray(load_model(files["model"]).predict(X[:100]), dtype=np.float64)
    Xt = torch.as_tensor(X[:80])
    kernels = [Gaussian(s) for s in (0.3, 1.0, 3.0)]
    folds = [list(range(i, 80, 4)) for i in range(4)]
    res = distributed_path_cv(Xt, torch.as_tensor(y[:80]), kernels, folds, method="gradient",
                              step_size=0.1, max_iter=300, n_iter_no_change=20)
    out["path_cv"] = (res.fold_mse.numpy(), res.best_iter.numpy(), res.best_index)
    out["krr_cv"] = distributed_krr_grid_cv(Xt, torch.as_tensor(y[:80]), kernels,
                                            [1e-3, 1e-1], folds).cv_mse.numpy()
    out["pen_cv"] = distributed_penalized_grid_cv(Xt, torch.as_tensor(y[:80]), kernels,
                                                  [1e-2, 1.0], folds, **_PEN).cv_mse.numpy()
    out["share"] = my_share(3)
    try:  # process 1 has one feature fewer: every process must get the error, none may hang
        d = D if rank() == 0 else D - 1
        ShardSource(ArraySource(np.zeros((5, d)), np.zeros(5)))
        out["mismatch"] = "no error"
    except ValueError as exc:
        out["mismatch"] = str(exc)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    X, y = _data()
    d = tmp_path_factory.mktemp("dist")
    paths = {"X": str(d / "X.npy"), "y": str(d / "y.npy"), "parquet": str(d / "data.parquet"),
             "model": str(d / "model.npz")}
    np.save(paths["X"], X)
    np.save(paths["y"], y)
    frame = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "y": y})
    frame.to_parquet(paths["parquet"], row_group_size=128)  # shards cut through row groups
    return paths


@pytest.fixture(scope="module")
def two_process(files):
    return spawn(_fit_all, 2, args=(files,), timeout=30, max_seconds=50)


@pytest.mark.parametrize("name", [e[0] for e in _estimators()])
def test_two_processes_equal_single_process(two_process, files, name):
    X, y = _data()
    est, kind = {e[0]: (e[1], e[2]) for e in _estimators()}[name]
    with one_thread():  # no process group: the ordinary fit
        ref = distributed_fit(est, _shard(kind, X, y, files))
    c0, p0 = _coef(ref), np.asarray(ref.predict(X[:100]), dtype=np.float64)
    early = name == "nystrom_krr_early"
    for r in range(2):
        c, p, best, scores = two_process[r][name]
        assert c.shape == c0.shape
        if kind == "labels":
            np.testing.assert_array_equal(p, p0)
        elif not early:
            np.testing.assert_allclose(p, p0, rtol=0, atol=RTOL * np.abs(p0).max())
        if not early:
            np.testing.assert_allclose(c, c0, rtol=0, atol=RTOL * np.abs(c0).max())
            continue
        # CG on the ill-conditioned Nyström system amplifies the reassociation of the sums from
        # iteration to iteration (changing block_size on one process does the same), and early
        # stopping keeps an unconverged iterate on a flat validation curve: the curves agree
        # closely at first, the selected fits to the flatness of the curve.
        ref_scores = ref.validation_scores_
        np.testing.assert_allclose(scores[:5], ref_scores[:5], rtol=1e-6)
        np.testing.assert_allclose(min(scores), min(ref_scores), rtol=1e-4)
        np.testing.assert_allclose(p, p0, rtol=0, atol=1e-3 * np.abs(p0).max())
    # both processes hold bit-identical models (same all-reduced sums, same steps)
    np.testing.assert_array_equal(two_process[0][name][0], two_process[1][name][0])


def test_single_process_shard_fit_matches_array_fit():
    # for the doubly stochastic estimator the global-batch loop reproduces the estimator's fit
    X, y = _data()
    est = DoublyStochasticRegressor(sigma=1.0, batch_size=50, block_size=16, max_iter=2,
                                    early_stopping=True, random_state=0)
    with one_thread():
        a = est.fit(X, y).predict(X[:50])
        b = distributed_fit(est, X, y).predict(X[:50])
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_model_written_once_and_reloaded(two_process):
    p = two_process[0]["doubly_stochastic_clf"][1]
    for r in range(2):
        np.testing.assert_array_equal(two_process[r]["reloaded"], p)


def test_cv_grids_spread_over_processes_equal_single_process(two_process):
    X, y = _data()
    Xt = torch.as_tensor(X[:80])
    kernels = [Gaussian(s) for s in (0.3, 1.0, 3.0)]
    folds = [list(range(i, 80, 4)) for i in range(4)]
    with one_thread():
        ref = early_stopping_path_cv(Xt, torch.as_tensor(y[:80]), kernels, folds,
                                     method="gradient", step_size=0.1, max_iter=300,
                                     n_iter_no_change=20)
        ref_krr = krr_grid_cv(Xt, torch.as_tensor(y[:80]), kernels, [1e-3, 1e-1], folds).cv_mse
        ref_pen = penalized_grid_cv(Xt, torch.as_tensor(y[:80]), kernels, [1e-2, 1.0], folds,
                                    **_PEN).cv_mse
    assert [two_process[r]["share"] for r in range(2)] == [[0, 2], [1]]
    for r in range(2):
        fold_mse, best_iter, best_index = two_process[r]["path_cv"]
        np.testing.assert_allclose(fold_mse, ref.fold_mse.numpy(), rtol=1e-10)
        np.testing.assert_array_equal(best_iter, ref.best_iter.numpy())
        assert best_index == ref.best_index
        np.testing.assert_allclose(two_process[r]["krr_cv"], ref_krr.numpy(), rtol=1e-10)
        # batched FISTA stops on the batch's KKT tolerance: equal to that tolerance
        np.testing.assert_allclose(two_process[r]["pen_cv"], ref_pen.numpy(), rtol=1e-5)


def test_shapes_disagreeing_across_processes_raise_everywhere(two_process):
    for r in range(2):
        msg = two_process[r]["mismatch"]
        assert "disagree across processes" in msg and "n_features" in msg
        assert "rank 0: n_features=2" in msg and "rank 1: n_features=1" in msg


class _DyingSource(ArraySource):
    """Process 1 kills itself (SIGKILL) when the fit starts its 3rd pass over the rows (the
    solver's: the first reads the dtype, the second the moments of the targets)."""

    def _raw_blocks(self, block_size):
        self.passes = getattr(self, "passes", 0) + 1
        if rank() == 1 and self.passes == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        yield from super()._raw_blocks(block_size)


def _fit_and_die():
    X, y = _data()
    lo, hi = shard_range(N)
    source = ShardSource(_DyingSource(X[lo:hi], y[lo:hi]))
    distributed_fit(NystromKernelRidge(40, alpha=1e-3, sigma=1.0, random_state=0), source)
    return "finished"


def test_process_killed_mid_fit_makes_the_other_fail_clearly():
    with pytest.raises(DistributedError) as info:
        spawn(_fit_and_die, 2, timeout=15, grace=5, max_seconds=50)
    msg = str(info.value)
    assert "rank 1 died" in msg and "SIGKILL" in msg
    # process 0 ended by itself with a clear error (not terminated as "hung" by the launcher)
    assert "rank 0 error: DistributedError" in msg
    assert "collective operation failed during NystromKernelRidge.fit" in msg


class _StallingSource(ArraySource):
    """Process 1 stops answering (sleeps) when the fit starts its 3rd pass over the rows (the
    solver's: the first reads the dtype, the second the moments of the targets)."""

    def _raw_blocks(self, block_size):
        self.passes = getattr(self, "passes", 0) + 1
        if rank() == 1 and self.passes == 3:
            import time

            time.sleep(60)
        yield from super()._raw_blocks(block_size)


def _fit_and_stall():
    X, y = _data()
    lo, hi = shard_range(N)
    source = ShardSource(_StallingSource(X[lo:hi], y[lo:hi]))
    distributed_fit(NystromKernelRidge(40, alpha=1e-3, sigma=1.0, random_state=0), source)
    return "finished"


@pytest.mark.slow
def test_process_that_stops_answering_times_out_clearly():
    with pytest.raises(DistributedError) as info:
        spawn(_fit_and_stall, 2, timeout=3, grace=2, max_seconds=50)
    msg = str(info.value)
    # process 0 gives up after the 3 s collective timeout; the silent one is terminated
    assert "rank 0 error: DistributedError" in msg and "timeout of 3 s" in msg
    assert "rank 1 hung" in msg


def test_command_line_fits_on_two_processes(files, tmp_path, capsys):
    import json

    from kernelflow.distributed.run import main
    from kernelflow.io import load_model

    out = str(tmp_path / "cli.npz")
    argv = ["fit", "--model", "nystrom_ridge", "--data", files["X"], "--target", files["y"],
            "--param", "n_components=30", "--param", "sigma=1.0", "--param", "alpha=1e-3",
            "--param", "random_state=0", "--nproc", "2", "--timeout", "30", "--out", out]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["processes"] == 2 and summary["n_samples"] == N
    X, y = _data()
    with one_thread():
        ref = distributed_fit(NystromKernelRidge(30, alpha=1e-3, sigma=1.0, random_state=0),
                              shard_npy(files["X"], files["y"]))
        pred = load_model(out).predict(X[:50])
    np.testing.assert_allclose(pred, ref.predict(X[:50]), rtol=1e-8, atol=1e-8)
    assert main(["fit", "--model", "nystrom_ridge", "--data", files["X"], "--target",
                 files["y"], "--param", "n_components=0"]) == 1
    assert "n_components" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_launch(files, tmp_path):
    import json
    import subprocess
    import sys

    out = str(tmp_path / "torchrun.npz")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "kernelflow.distributed", "fit", "--model",
           "nystrom_ridge", "--data", files["X"], "--target", files["y"], "--param",
           "n_components=30", "--param", "sigma=1.0", "--param", "random_state=0",
           "--timeout", "30", "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1  # only process 0 reports
    assert json.loads(lines[0])["processes"] == 2 and os.path.exists(out)


def test_shard_ranges_partition_rows():
    for n in (1, 7, 10, 1000):
        for p in (1, 2, 3, 8):
            if n < p:
                continue
            parts = [shard_range(n, r, p) for r in range(p)]
            assert parts[0][0] == 0 and parts[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
            assert max(b - a for a, b in parts) - min(b - a for a, b in parts) <= 1
    with pytest.raises(ValueError, match="outside"):
        shard_range(10, 2, 2)


def test_shard_source_single_process_is_the_data(files):
    X, y = _data()
    for src in (shard_arrays(X, y), shard_npy(files["X"], files["y"]),
                shard_parquet(files["parquet"], "y")):
        assert src.n_samples == N and src.n_local == N and src.offset == 0
        blocks = list(src.iter_blocks(100, dtype=torch.float64))
        sizes = [b.X.shape[0] for b in blocks]
        assert [b.start for b in blocks] == list(np.cumsum([0] + sizes[:-1]))
        np.testing.assert_array_equal(torch.cat([b.X for b in blocks]).numpy(), X)
        np.testing.assert_array_equal(torch.cat([b.y for b in blocks]).numpy()[:, 0], y)
        np.testing.assert_array_equal(src.take([5, 0, 599]).numpy(), X[[5, 0, 599]])
    check_consistent("nothing to compare", n=1.0)


def test_bad_inputs_raise_clear_errors(files):
    X, y = _data()
    with pytest.raises(ValueError, match="y has 5 rows"):
        shard_npy(X, y[:5])
    with pytest.raises(ValueError, match="not in"):
        shard_parquet(files["parquet"], "nope")
    with pytest.raises(TypeError, match="no data-parallel fit"):
        from sklearn.linear_model import Ridge

        distributed_fit(Ridge(), X, y)
    with pytest.raises(ValueError, match="nprocs"):
        spawn(_fit_and_die, 0)


# ---- faults of the launcher itself ---------------------------------------------------------
def _stop_rank_one():
    """Process 1 stops itself (SIGSTOP); process 0 waits for it in a collective."""
    import torch.distributed as dist

    if rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))
    return "finished"


def test_stopped_process_is_killed_and_spawn_returns():
    import multiprocessing as mp
    import time

    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        spawn(_stop_rank_one, 2, timeout=2, grace=1, max_seconds=40)
    msg = str(info.value)
    assert "rank 0 error" in msg and "rank 1 hung" in msg
    # SIGTERM stays pending on a stopped process: the launcher must have killed it
    assert mp.active_children() == []
    assert time.monotonic() - start < 40


def _rank_one_sleeps():
    import time

    if rank() == 1:
        time.sleep(600)
    return rank()


def test_hanging_process_ended_at_max_seconds():
    import multiprocessing as mp

    with pytest.raises(DistributedError, match="rank 1 hung: still running after max_seconds"):
        spawn(_rank_one_sleeps, 2, timeout=30, max_seconds=3)
    assert mp.active_children() == []


def _world():
    import torch.distributed as dist

    return dist.get_world_size()


def test_rendezvous_does_not_use_a_guessed_port(monkeypatch):
    import socket

    import kernelflow.distributed.launch as launch

    # a port that is taken: the launcher must not depend on a probed port staying free
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        monkeypatch.setattr(launch, "free_port", lambda: busy.getsockname()[1])
        assert spawn(_world, 2, timeout=20, max_seconds=40) == [2, 2]
    finally:
        busy.close()
