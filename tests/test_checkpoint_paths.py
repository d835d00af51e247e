"""Checkpoint and resume of the early-stopped paths on matrix-free kernels and of Nyström
eigen-CG: a fit killed after a checkpoint write and re-run with it ends with the model of an
uninterrupted fit, bit for bit; checkpoints of other problems are refused; model files never
carry the checkpoint path."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from _helpers import interrupt_cg, regression_data

from kernelflow.estimators import NystromKernelRidge
from kernelflow.estimators.coordinate_descent import KernelCoordinateDescent
from kernelflow.estimators.gradient_descent import KernelGradientDescent
from kernelflow.estimators.huber_path import KernelHuberGradientDescent
from kernelflow.estimators.sign_gradient import KernelSignGradient
from kernelflow.io import load_model, save_model
from kernelflow.operators import Options
from kernelflow.utils import checkpoint as ck_module

#: 3 n^2 float64 values exceed this budget for n = 160: the paths run matrix-free
MATRIX_FREE = 100_000

#: family -> (estimator, parameters); short runs: a write (with its fsync) costs more than a
#: step at this size, and the interrupted fits write after every step
FAMILIES = {
    "gradient": (KernelGradientDescent, dict(max_iter=40, n_iter_no_change=8)),
    "nesterov": (KernelGradientDescent, dict(max_iter=20, momentum=0.5, nesterov=True,
                                             early_stopping=False)),
    "sign": (KernelSignGradient, dict(max_iter=40, n_iter_no_change=8)),
    "coordinate": (KernelCoordinateDescent, dict(max_iter=40, n_iter_no_change=8)),
    "huber": (KernelHuberGradientDescent, dict(max_iter=40, n_iter_no_change=8)),
}

#: interrupted at the first write at or after this step of the phase
KILL_STEP = 6

#: a resumed fit writes no checkpoint (the interval is not part of the problem)
NO_WRITE = 3600.0

EIGEN_CG = dict(n_components=60, solver="eigen_cg", alpha=1e-3, tol=1e-12, max_iter=25,
                random_state=0)


def _data(n=160, t=1, seed=0):
    X, y = regression_data(n, 2, lambda X: np.sin(X.sum(1)), bounds=(-3.0, 3.0), seed=seed)
    if t > 1:
        y = np.column_stack([y, np.cos(X[:, 0])])
    return X, y


def _params(family, **extra):
    Est, kw = FAMILIES[family]
    return Est, {**kw, "sigma": 1.0, "random_state": 0,
                 "options": Options(memory_budget=MATRIX_FREE), **extra}


def _due(state, phase):
    """Whether a checkpoint write of ``state`` is the one to interrupt after."""
    if "loop" in state:
        return state["phase"] == phase and state["loop"]["k"] >= KILL_STEP
    return state["cg"]["k"] >= KILL_STEP  # a CG checkpoint


def _interrupt_after(monkeypatch, phase):
    """Raise KeyboardInterrupt right after the write of step :data:`KILL_STEP` of ``phase``."""
    orig = ck_module.Checkpoint.save

    def save(self, state):
        orig(self, state)
        if _due(state, phase):
            raise KeyboardInterrupt

    monkeypatch.setattr(ck_module.Checkpoint, "save", save)


def _record_loads(monkeypatch):
    """The (phase, step) of every checkpoint loaded from now on."""
    orig = ck_module.Checkpoint.load
    seen = []

    def load(self, device=None):
        state = orig(self, device)
        if state is not None:
            seen.append((state.get("phase"), state["loop"]["k"]) if "loop" in state
                        else ("cg", state["cg"]["k"]))
        return state

    monkeypatch.setattr(ck_module.Checkpoint, "load", load)
    return seen


def _record_steps(monkeypatch):
    """The step numbers the path loops take from now on."""
    import kernelflow.solvers.paths.driver as driver
    import kernelflow.solvers.paths.single as single

    steps = []
    orig = single._after_step

    def after_step(k, *args, **kw):
        steps.append(k)
        return orig(k, *args, **kw)

    monkeypatch.setattr(single, "_after_step", after_step)
    monkeypatch.setattr(driver, "_after_step", after_step)
    return steps


def _assert_same_model(est, ref):
    assert torch.equal(torch.as_tensor(est.dual_coef_), torch.as_tensor(ref.dual_coef_))
    assert est.n_iter_ == ref.n_iter_
    if hasattr(ref, "validation_losses_") and ref.validation_losses_ is not None:
        assert np.array_equal(est.validation_losses_, ref.validation_losses_)
    if hasattr(ref, "epsilon_"):
        assert est.epsilon_ == ref.epsilon_


# ---- (a) interrupted, resumed == uninterrupted ---------------------------------------------------
@pytest.mark.parametrize("family, phase, fit_kw", [
    ("gradient", "validation", {}),
    ("gradient", "refit", {"weights": True}),
    ("nesterov", "path", {"targets": 2}),
    ("sign", "validation", {}),
    ("sign", "refit", {"weights": True}),
    ("coordinate", "validation", {"weights": True}),
    ("coordinate", "refit", {}),
    ("huber", "validation", {}),
    ("huber", "refit", {"targets": 2}),
])
def test_path_resume_is_bit_identical(tmp_path, monkeypatch, family, phase, fit_kw):
    X, y = _data(t=fit_kw.get("targets", 1))
    sw = np.random.RandomState(1).randint(1, 4, X.shape[0]) if fit_kw.get("weights") else None
    Est, kw = _params(family)
    ref = Est(**kw).fit(X, y, sample_weight=sw)
    path = tmp_path / "path.ckpt"
    est = Est(checkpoint=path, checkpoint_interval=0, **kw)
    _interrupt_after(monkeypatch, phase)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y, sample_weight=sw)
    monkeypatch.undo()
    assert path.exists() and not hasattr(est, "dual_coef_")
    seen, steps = _record_loads(monkeypatch), _record_steps(monkeypatch)
    est.set_params(checkpoint_interval=NO_WRITE).fit(X, y, sample_weight=sw)
    assert seen == [(phase, KILL_STEP)] and steps[0] == KILL_STEP + 1  # resumed, not restarted
    _assert_same_model(est, ref)
    assert np.array_equal(est.predict(X), ref.predict(X))
    assert not path.exists()  # a completed fit deletes its checkpoint


_KILLED = """
import os, signal, warnings
import numpy as np
from kernelflow.operators import Options
from kernelflow.utils import checkpoint as ck
warnings.simplefilter("ignore")
rng = np.random.RandomState(0)
X = rng.uniform(-3.0, 3.0, size=(160, 2))
y = np.sin(X.sum(1)) + 0.1 * rng.randn(160)
orig = ck.Checkpoint.save
def save(self, state):
    orig(self, state)  # the checkpoint of this step is on disk
    if ({phase!r} == state.get("phase") and state["loop"]["k"] >= {step}
            or "cg" in state and state["cg"]["k"] >= {step}):
        os.kill(os.getpid(), signal.SIGKILL)
ck.Checkpoint.save = save
from {module} import {name} as Est
kw = {kw}
if {budget!r} is not None:
    kw["options"] = Options(memory_budget={budget!r})
Est(checkpoint={path!r}, checkpoint_interval=0, **kw).fit(X, y)
"""


def _kill_after(Est, kw, path, phase):
    """Fit in a fresh interpreter killed by SIGKILL after the checkpoint write of step
    :data:`KILL_STEP` of ``phase`` (the data of :func:`_data`; ``kw["options"]``, if any,
    holds only a memory budget)."""
    options = kw.get("options")
    plain = {k: v for k, v in kw.items() if k != "options"}
    script = textwrap.dedent(_KILLED).format(
        phase=phase, step=KILL_STEP, module=Est.__module__, name=Est.__name__, kw=repr(plain),
        budget=None if options is None else options.memory_budget, path=str(path))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert path.exists()


@pytest.mark.parametrize("family, phase", [("gradient", "refit"), ("nesterov", "path"),
                                           ("sign", "validation"), ("coordinate", "refit"),
                                           ("huber", "validation")])
def test_path_resume_after_sigkill(tmp_path, monkeypatch, family, phase):
    Est, kw = _params(family)
    path = tmp_path / "killed.ckpt"
    _kill_after(Est, kw, path, phase)
    X, y = _data()
    ref = Est(**kw).fit(X, y)
    seen, steps = _record_loads(monkeypatch), _record_steps(monkeypatch)
    est = Est(checkpoint=path, checkpoint_interval=NO_WRITE, **kw).fit(X, y)
    assert seen == [(phase, KILL_STEP)] and steps[0] == KILL_STEP + 1
    _assert_same_model(est, ref)
    assert not path.exists()


# ---- (b) refusals --------------------------------------------------------------------------------
def _leave_checkpoint(tmp_path, monkeypatch, family, X, y, **extra):
    Est, kw = _params(family, **extra)
    path = tmp_path / "left.ckpt"
    _interrupt_after(monkeypatch, "validation")
    with pytest.raises(KeyboardInterrupt):
        Est(checkpoint=path, checkpoint_interval=0, **kw).fit(X, y)
    monkeypatch.undo()
    assert path.exists()
    return path


@pytest.mark.parametrize("family", ["gradient", "coordinate"])
def test_other_data_or_parameters_refused(tmp_path, monkeypatch, family):
    X, y = _data()
    path = _leave_checkpoint(tmp_path, monkeypatch, family, X, y)
    Est, kw = _params(family)
    y2 = y.copy()
    y2[5] += 1e-9
    with pytest.raises(ValueError, match=r"another problem: .*data_digest differs.*Delete"):
        Est(checkpoint=path, **kw).fit(X, y2)
    with pytest.raises(ValueError, match="param max_iter differs"):
        Est(checkpoint=path, **{**kw, "max_iter": 61}).fit(X, y)
    with pytest.raises(ValueError, match="estimator differs"):
        KernelSignGradient(checkpoint=path, **{**kw, "n_iter_no_change": 20}).fit(X, y)
    assert path.exists()  # a refusal leaves the file for the fit it belongs to


def test_validation_rows_drawn_anew_refused(tmp_path, monkeypatch):
    X, y = _data()
    path = _leave_checkpoint(tmp_path, monkeypatch, "gradient", X, y, random_state=None)
    Est, kw = _params("gradient", random_state=None)
    # without an integer random_state every fit holds out other rows: refused, with the reason
    with pytest.raises(ValueError, match=r"validation_rows differs.*set an integer random_state"):
        Est(checkpoint=path, **kw).fit(X, y)


def test_fit_on_a_stored_kernel_neither_reads_nor_writes(tmp_path):
    X, y = _data()
    Est, kw = _params("sign", options=None)  # K fits the default budget: seconds, no checkpoint
    ref = Est(**kw).fit(X, y)
    foreign = tmp_path / "foreign.ckpt"
    ck_module.Checkpoint(foreign, interval=0, fingerprint={"solver": "other"}).save({"k": 1})
    before = foreign.read_bytes()
    est = Est(checkpoint=foreign, checkpoint_interval=0, **kw).fit(X, y)
    assert foreign.read_bytes() == before
    fresh = tmp_path / "fresh.ckpt"
    Est(checkpoint=fresh, checkpoint_interval=0, **kw).fit(X, y)
    assert not fresh.exists()
    _assert_same_model(est, ref)


def test_bad_interval_refused(tmp_path):
    X, y = _data()
    Est, kw = _params("gradient")
    with pytest.raises(ValueError, match="checkpoint_interval"):
        Est(checkpoint=tmp_path / "x", checkpoint_interval=-1.0, **kw).fit(X, y)


# ---- (c) model files -----------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore")  # convergence warnings of the short runs
@pytest.mark.parametrize("Est, kw", [
    *((Est, {**kw, "sigma": 1.0, "random_state": 0}) for Est, kw in FAMILIES.values()),
    (NystromKernelRidge, EIGEN_CG),
])
def test_model_file_stores_no_checkpoint(tmp_path, Est, kw):
    X, y = _data()
    ckpt = tmp_path / "fit.ckpt"
    model = Est(checkpoint=str(ckpt), **kw).fit(X, y)
    loaded = load_model(save_model(model, tmp_path / "m.npz"))
    assert loaded.get_params()["checkpoint"] is None
    assert model.get_params()["checkpoint"] == str(ckpt)  # the saved estimator is unchanged
    assert np.array_equal(loaded.predict(X[:9]), model.predict(X[:9]))


# ---- (d) Nyström eigen-CG ------------------------------------------------------------------------
def _interrupt_eigen_cg(monkeypatch, after=KILL_STEP):
    """Raise KeyboardInterrupt from the eigen-CG loop after pass ``after`` (None: never);
    returns the passes seen."""
    import kernelflow.solvers.nystrom_eigen_cg as eig

    return interrupt_cg(monkeypatch, eig, after)


@pytest.mark.parametrize("early_stopping", [False, True])
def test_eigen_cg_resume_is_bit_identical(tmp_path, monkeypatch, early_stopping):
    X, y = _data(n=300)
    kw = dict(EIGEN_CG, early_stopping=early_stopping, n_iter_no_change=50)
    with pytest.warns(Warning):
        ref = NystromKernelRidge(**kw).fit(X, y)
    path = tmp_path / "eig.ckpt"
    est = NystromKernelRidge(checkpoint=path, checkpoint_interval=0, **kw)
    _interrupt_eigen_cg(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    monkeypatch.undo()
    assert path.exists()
    seen, passes = _record_loads(monkeypatch), _interrupt_eigen_cg(monkeypatch, after=None)
    with pytest.warns(Warning):
        est.fit(X, y)
    assert seen == [("cg", KILL_STEP)] and passes[0] == KILL_STEP + 1  # resumed
    assert len(passes) == ref.n_iter_ - KILL_STEP
    assert np.array_equal(est.dual_coef_.numpy(), ref.dual_coef_.numpy())
    assert est.n_iter_ == ref.n_iter_ and est.residual_norms_ == ref.residual_norms_
    assert est.validation_scores_ == ref.validation_scores_
    assert not path.exists()


def test_eigen_cg_resume_after_sigkill(tmp_path, monkeypatch):
    path = tmp_path / "eig_killed.ckpt"
    _kill_after(NystromKernelRidge, EIGEN_CG, path, "cg")
    X, y = _data()
    with pytest.warns(Warning):
        ref = NystromKernelRidge(**EIGEN_CG).fit(X, y)
    seen = _record_loads(monkeypatch)
    with pytest.warns(Warning):
        est = NystromKernelRidge(checkpoint=path, checkpoint_interval=0, **EIGEN_CG).fit(X, y)
    assert seen == [("cg", KILL_STEP)]
    assert np.array_equal(est.dual_coef_.numpy(), ref.dual_coef_.numpy())
    assert est.n_iter_ == ref.n_iter_ and not path.exists()


def test_eigen_cg_other_parameters_refused(tmp_path, monkeypatch):
    X, y = _data(n=300)
    path = tmp_path / "eig.ckpt"
    _interrupt_eigen_cg(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        NystromKernelRidge(checkpoint=path, checkpoint_interval=0, **EIGEN_CG).fit(X, y)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="param alpha differs"):
        NystromKernelRidge(checkpoint=path, **{**EIGEN_CG, "alpha": 1e-2}).fit(X, y)
    # the CG solver's checkpoint is another problem too
    with pytest.raises(ValueError, match="param solver differs"):
        NystromKernelRidge(checkpoint=path, **{**EIGEN_CG, "solver": "cg"}).fit(X, y)
    assert path.exists()
