"""Checkpoint and resume of long fits: an interrupted fit re-run with its checkpoint ends with
the model of an uninterrupted fit; checkpoints of other problems and damaged files are refused."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from _helpers import interrupt_cg, regression_data

import kernelflow.solvers.doubly_stochastic as ds_solver
import kernelflow.solvers.nystrom as ny_solver
import kernelflow.solvers.nystrom_robust as robust_solver
from kernelflow.estimators import (
    DoublyStochasticClassifier,
    DoublyStochasticRegressor,
    NystromKernelRidge,
    NystromRobustRegressor,
)
from kernelflow.utils._files import _host
from kernelflow.utils.checkpoint import Checkpoint, CheckpointError


def _data(seed=0, n=240):
    return regression_data(n, 3, lambda X: np.sin(X.sum(1)), bounds=None, seed=seed)


NYSTROM = dict(n_components=30, solver="cg", alpha=1e-3, tol=1e-12, max_iter=25,
               random_state=0)
ROBUST = dict(n_components=30, loss="huber", max_iter=25, tol=1e-12, random_state=0)
DS = dict(max_iter=6, block_size=16, tol=None, average=2, random_state=0)


def _interrupt_cg(monkeypatch, after):
    """Raise KeyboardInterrupt from the CG loop after ``after`` iterations; count iterations."""
    return interrupt_cg(monkeypatch, ny_solver, after)


def _interrupt_passes(monkeypatch, module, name, after):
    """Raise KeyboardInterrupt at call ``after`` of ``module.name``; count the calls."""
    orig = getattr(module, name)
    calls = []

    def wrapped(*args, **kw):
        calls.append(1)
        if after is not None and len(calls) == after:
            raise KeyboardInterrupt
        return orig(*args, **kw)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def _coef(est):
    return est.dual_coef_.numpy() if hasattr(est, "dual_coef_") else est.coef_.numpy()


# ---- (a) interrupted, resumed == uninterrupted --------------------------------------------------
@pytest.mark.parametrize("early_stopping", [False, True])
def test_nystrom_cg_resume_is_bit_identical(tmp_path, monkeypatch, early_stopping):
    X, y = _data()
    kw = dict(NYSTROM, early_stopping=early_stopping, n_iter_no_change=50)
    with pytest.warns(Warning):
        ref = NystromKernelRidge(**kw).fit(X, y)
    path = tmp_path / "cg.ckpt"
    est = NystromKernelRidge(checkpoint=path, checkpoint_interval=0, **kw)
    _interrupt_cg(monkeypatch, after=9)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    assert path.exists() and not hasattr(est, "dual_coef_")
    seen = _interrupt_cg(monkeypatch, after=None)
    with pytest.warns(Warning):
        est.fit(X, y)
    assert seen[0] == 10 and len(seen) == ref.n_iter_ - 9  # resumed, not restarted
    assert np.array_equal(_coef(est), _coef(ref))
    assert est.n_iter_ == ref.n_iter_ and est.residual_norms_ == ref.residual_norms_
    assert est.validation_scores_ == ref.validation_scores_
    assert np.array_equal(est.predict(X), ref.predict(X))
    assert not path.exists()  # a completed fit deletes its checkpoint


def test_nystrom_cg_resume_after_sigkill(tmp_path):
    path = tmp_path / "killed.ckpt"
    script = textwrap.dedent(f"""
        import os, signal, warnings
        import numpy as np
        import kernelflow.solvers.nystrom as ny
        from kernelflow.estimators import NystromKernelRidge
        warnings.simplefilter("ignore")
        rng = np.random.RandomState(0)
        X = rng.randn(240, 3)
        y = np.sin(X.sum(1)) + 0.1 * rng.randn(240)
        orig = ny.conjugate_gradient
        def wrapped(*a, callback=None, **kw):
            def cb(k, X, R):
                stop = callback(k, X, R)  # writes the checkpoint of pass k
                if k == 7:
                    os.kill(os.getpid(), signal.SIGKILL)
                return stop
            return orig(*a, callback=cb, **kw)
        ny.conjugate_gradient = wrapped
        NystromKernelRidge(checkpoint={str(path)!r}, checkpoint_interval=0,
                           **{NYSTROM!r}).fit(X, y)
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert path.exists()
    X, y = _data()
    with pytest.warns(Warning):
        ref = NystromKernelRidge(**NYSTROM).fit(X, y)
    with pytest.warns(Warning):
        est = NystromKernelRidge(checkpoint=path, checkpoint_interval=0, **NYSTROM).fit(X, y)
    assert np.array_equal(_coef(est), _coef(ref)) and est.n_iter_ == ref.n_iter_
    assert not path.exists()


@pytest.mark.parametrize("early_stopping", [False, True])
def test_nystrom_robust_resume_is_bit_identical(tmp_path, monkeypatch, early_stopping):
    X, y = _data()
    y[::17] += 8.0  # outliers
    kw = dict(ROBUST, early_stopping=early_stopping, n_iter_no_change=50)
    ref = NystromRobustRegressor(**kw).fit(X, y)
    path = tmp_path / "robust.ckpt"
    est = NystromRobustRegressor(checkpoint=path, checkpoint_interval=0, **kw)
    _interrupt_passes(monkeypatch, robust_solver, "nystrom_loss_pass", after=15)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    assert path.exists()
    calls = _interrupt_passes(monkeypatch, robust_solver, "nystrom_loss_pass", after=None)
    est.fit(X, y)
    resumed = len(calls)
    calls.clear()
    NystromRobustRegressor(**kw).fit(X, y)
    assert resumed < len(calls) - 10  # resumed, not restarted
    assert np.array_equal(_coef(est), _coef(ref))
    assert np.array_equal(est.intercept_.numpy(), ref.intercept_.numpy())
    assert est.n_iter_ == ref.n_iter_ and est.objective_ == ref.objective_
    assert est.validation_scores_ == ref.validation_scores_
    assert not path.exists()


@pytest.mark.parametrize("Est, target", [
    (DoublyStochasticRegressor, "regression"),
    (DoublyStochasticClassifier, "classes"),
])
def test_doubly_stochastic_resume_is_bit_identical(tmp_path, monkeypatch, Est, target):
    X, y = _data()
    if target == "classes":
        y = (y > 0).astype(int)
    kw = dict(DS, early_stopping=True, n_iter_no_change=50)
    ref = Est(**kw).fit(X, y)
    path = tmp_path / "ds.ckpt"
    est = Est(checkpoint=path, checkpoint_interval=0, **kw)
    _interrupt_passes(monkeypatch, ds_solver, "batch_pass", after=4)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    assert path.exists()
    calls = _interrupt_passes(monkeypatch, ds_solver, "batch_pass", after=None)
    est.fit(X, y)
    assert len(calls) == DS["max_iter"] - 3  # three epochs came from the checkpoint
    assert np.array_equal(_coef(est), _coef(ref))
    assert np.array_equal(est.averaged_coef_.numpy(), ref.averaged_coef_.numpy())
    assert est.loss_curve_ == ref.loss_curve_ and est.n_iter_ == ref.n_iter_
    assert np.array_equal(est.predict(X), ref.predict(X))
    assert not path.exists()


# ---- (b) a checkpoint of another problem is refused ----------------------------------------------
def _leave_checkpoint(tmp_path, monkeypatch, Est, kw, X, y):
    path = tmp_path / "left.ckpt"
    est = Est(checkpoint=path, checkpoint_interval=0, **kw)
    if Est is NystromKernelRidge:
        _interrupt_cg(monkeypatch, after=3)
    elif Est is NystromRobustRegressor:
        _interrupt_passes(monkeypatch, robust_solver, "nystrom_loss_pass", after=6)
    else:
        _interrupt_passes(monkeypatch, ds_solver, "batch_pass", after=3)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    monkeypatch.undo()
    assert path.exists()
    return path


@pytest.mark.parametrize("Est, kw, change", [
    (NystromKernelRidge, NYSTROM, {"alpha": 1e-2}),
    (NystromRobustRegressor, ROBUST, {"epsilon": 2.0}),
    (DoublyStochasticRegressor, DS, {"eta0": 0.5}),
])
def test_other_data_or_parameters_refused(tmp_path, monkeypatch, Est, kw, change):
    X, y = _data()
    path = _leave_checkpoint(tmp_path, monkeypatch, Est, kw, X, y)
    y2 = y.copy()
    y2[5] += 1e-9
    with pytest.raises(ValueError, match=r"another problem: .*data_digest differs.*Delete"):
        Est(checkpoint=path, checkpoint_interval=0, **kw).fit(X, y2)
    name = next(iter(change))
    with pytest.raises(ValueError, match=f"param {name} differs"):
        Est(checkpoint=path, checkpoint_interval=0, **{**kw, **change}).fit(X, y)
    with pytest.raises(ValueError, match="n_samples differs"):
        Est(checkpoint=path, checkpoint_interval=0, **kw).fit(X[:-1], y[:-1])
    assert path.exists()  # a refusal leaves the file for the fit it belongs to


def test_other_centres_refused(tmp_path, monkeypatch):
    X, y = _data()
    kw = {**NYSTROM, "random_state": None}
    path = _leave_checkpoint(tmp_path, monkeypatch, NystromKernelRidge, kw, X, y)
    # without an integer random_state the centres are drawn anew: refused, with the reason
    with pytest.raises(ValueError, match=r"centers differs.*set an integer random_state"):
        NystromKernelRidge(checkpoint=path, **kw).fit(X, y)


# ---- (c) damaged files are refused ---------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_checkpoint_refused(tmp_path, monkeypatch, damage):
    X, y = _data()
    path = _leave_checkpoint(tmp_path, monkeypatch, NystromKernelRidge, NYSTROM, X, y)
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # the first data byte of the last array
        i = raw.index(b"\n", raw.rfind(b"\x93NUMPY")) + 1
        path.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
    elif damage == "garbage":
        path.write_bytes(b"not a checkpoint" * 10)
    else:
        path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"corrupt.*Delete the file") as info:
        NystromKernelRidge(checkpoint=path, checkpoint_interval=0, **NYSTROM).fit(X, y)
    if damage == "flip":
        assert "CRC" in str(info.value) or "checksum" in str(info.value)


def test_edited_metadata_refused(tmp_path):
    path = tmp_path / "m.ckpt"
    Checkpoint(path, interval=0, fingerprint={"a": 1}).save({"x": torch.ones(3), "k": 4})
    with np.load(path) as f:
        members = {k: f[k] for k in f.files}
    meta = members["__kernelflow__"].tobytes().replace(b'"4"', b'"5"')
    assert meta != members["__kernelflow__"].tobytes()
    members["__kernelflow__"] = np.frombuffer(meta, dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **members)
    with pytest.raises(CheckpointError, match="checksum"):
        Checkpoint(path, fingerprint={"a": 1}).load()


def test_state_round_trip_is_exact(tmp_path):
    state = {"x": torch.randn(4, 2, dtype=torch.float64), "f": torch.randn(3).float(),
             "rng": np.random.RandomState(3).get_state(legacy=False), "none": None,
             "floats": [0.1, float("inf"), -0.0], "k": 2**40, "s": "reason", "flag": True}
    ck = Checkpoint(tmp_path / "s.ckpt", interval=0, fingerprint={})
    ck.save(state)
    back = Checkpoint(tmp_path / "s.ckpt", fingerprint={}).load()
    assert torch.equal(back["x"], state["x"]) and back["f"].dtype == torch.float32
    assert back["floats"] == state["floats"] and back["k"] == 2**40 and back["flag"] is True
    r = np.random.RandomState()
    r.set_state(back["rng"])
    assert np.array_equal(r.randint(0, 1000, 5), np.random.RandomState(3).randint(0, 1000, 5))


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "w.ckpt"
    ck = Checkpoint(path, interval=0, fingerprint={})
    ck.save({"k": 1})
    before = path.read_bytes()

    def fail(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        ck.save({"k": 2})
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["w.ckpt"]
    # a temporary file left by a killed writer is removed by the next write
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".w.ckpt.kf-tmp-{_host()}-{dead}-0123456789abcdef"
    stale.write_bytes(b"half a file")
    ck.save({"k": 3})
    assert os.listdir(tmp_path) == ["w.ckpt"]
    assert Checkpoint(path, fingerprint={}).load() == {"k": 3}


# ---- (d) all-or-nothing --------------------------------------------------------------------------
@pytest.mark.parametrize("Est, kw", [
    (NystromKernelRidge, NYSTROM),
    (NystromRobustRegressor, ROBUST),
    (DoublyStochasticRegressor, DS),
])
def test_interrupted_fit_keeps_previous_model(tmp_path, monkeypatch, Est, kw):
    X, y = _data()
    X2, y2 = _data(seed=1)
    with pytest.warns(Warning) if Est is NystromKernelRidge else _nothing():
        est = Est(checkpoint=tmp_path / "p.ckpt", checkpoint_interval=0, **kw).fit(X, y)
    before = est.predict(X2)
    if Est is NystromKernelRidge:
        _interrupt_cg(monkeypatch, after=3)
    elif Est is NystromRobustRegressor:
        _interrupt_passes(monkeypatch, robust_solver, "nystrom_loss_pass", after=6)
    else:
        _interrupt_passes(monkeypatch, ds_solver, "batch_pass", after=3)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X2, y2)
    assert np.array_equal(est.predict(X2), before)
    assert (tmp_path / "p.ckpt").exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_bad_interval_refused(tmp_path):
    X, y = _data()
    with pytest.raises(ValueError, match="checkpoint_interval"):
        NystromKernelRidge(checkpoint=tmp_path / "x", checkpoint_interval=-1.0,
                           **NYSTROM).fit(X, y)
