"""Every estimator family on a CUDA device against the CPU result, and the device memory budget.

The tests marked ``gpu`` skip without a CUDA device. Each fits the same float64 data once on the
CPU and once on the GPU and compares the predictions: the GPU runs the tensor code paths (the
column-panel Gram pass of the Nyström direct solve, the tensor path rules instead of the
compiled loops, the tensor prox instead of the fused CPU one), the CPU the reference. Model files
written from a GPU fit are read back on the CPU and on the GPU.

``KERNELFLOW_TEST_GPU=cpu`` runs the ``gpu`` tests with the CPU as the "GPU" (a dry run of the
test logic on a machine without CUDA; the comparisons then hold trivially).

The budget and out-of-memory tests at the end run everywhere (with ``torch.cuda`` monkeypatched),
and so does the quick CPU mode of the device check ``benchmarks/gpu/run.sh``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kernelflow.operators as operators
from kernelflow.estimators import (
    DoublyStochasticClassifier,
    DoublyStochasticRegressor,
    KernelCoordinateDescent,
    KernelGradientDescent,
    KernelGradientDescentCV,
    KernelGradientFlow,
    KernelHuberGradientDescent,
    KernelRidge,
    KernelRidgeClassifier,
    KernelRidgeCV,
    KernelSignGradient,
    Nystroem,
    NystromKernelLogisticRegression,
    NystromKernelRidge,
    NystromKernelRidgeClassifier,
    NystromRobustRegressor,
    PenalizedKernelRegressor,
    PenalizedKernelRegressorCV,
)
from kernelflow.io import load_model, save_model
from kernelflow.kernels import Gaussian
from kernelflow.landmarks import SELECTORS, resolve_centers
from kernelflow.online import FOGD, KernelAWV, PKAWVNystrom, PKAWVTaylor, ProsNKONS
from kernelflow.operators import KernelOperator, Options, available_memory, memory_budget

ROOT = Path(__file__).resolve().parents[1]
GPU = torch.device(os.environ.get("KERNELFLOW_TEST_GPU", "cuda"))
gpu = pytest.mark.skipif(GPU.type == "cuda" and not torch.cuda.is_available(),
                         reason="needs a CUDA device")


def _data(n=240, d=3, seed=0, classes=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 4 - 2
    f = torch.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - X[:, 2 % d]
    if classes:
        edges = torch.quantile(f, torch.linspace(0, 1, classes + 1, dtype=torch.float64)[1:-1])
        return X, torch.bucketize(f, edges)
    return X, f + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


def _np(t):
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _both(make, X, y, method="predict", Xt=None):
    """Fit ``make()`` on the CPU and on the GPU; the outputs of ``method`` on ``Xt`` (or X)."""
    Xt = X if Xt is None else Xt
    cpu = make().fit(X, y)
    dev = make().fit(X.to(GPU), y.to(GPU))
    out_dev = getattr(dev, method)(Xt.to(GPU))
    assert isinstance(out_dev, torch.Tensor) and out_dev.device.type == GPU.type
    return _np(getattr(cpu, method)(Xt)), _np(out_dev), cpu, dev


# ---- exact, spectral and path estimators ---------------------------------------------------
EXACT_AND_PATHS = {
    "krr_cholesky": lambda: KernelRidge(alpha=0.1, sigma=1.0),
    "krr_eigen": lambda: KernelRidge(alpha=0.1, sigma=1.0, solver="eigen"),
    "gradient_flow": lambda: KernelGradientFlow(t=20.0, sigma=1.0),
    "gradient": lambda: KernelGradientDescent(max_iter=150, early_stopping=False, sigma=1.0),
    "gradient_early_stopping": lambda: KernelGradientDescent(max_iter=300, sigma=1.0,
                                                             random_state=0),
    "sign": lambda: KernelSignGradient(max_iter=300, early_stopping=False, sigma=1.0),
    "coordinate": lambda: KernelCoordinateDescent(max_iter=200, early_stopping=False, sigma=1.0),
    "huber_path": lambda: KernelHuberGradientDescent(max_iter=150, early_stopping=False,
                                                     sigma=1.0),
    "penalized_linf": lambda: PenalizedKernelRegressor(alpha=0.5, penalty="linf", sigma=1.0,
                                                       max_iter=300),
    "penalized_l1": lambda: PenalizedKernelRegressor(alpha=0.05, penalty="l1", sigma=1.0,
                                                     max_iter=300),
    # the grid cross-validation: batched folds x bandwidths x penalties
    "krr_cv": lambda: KernelRidgeCV(alphas=[1e-3, 1e-1, 1.0], sigmas=[0.5, 1.0, 2.0], cv=3),
    "penalized_cv": lambda: PenalizedKernelRegressorCV(alphas=4, sigmas=[0.5, 1.0], cv=3,
                                                       max_iter=100, random_state=0),
    "gradient_cv": lambda: KernelGradientDescentCV(sigmas=[0.5, 1.0, 2.0], cv=3, max_iter=200,
                                                   random_state=0),
}


#: early stopping picks the best iterate from validation losses that agree to rounding only, so
#: a near tie may move it by a step
LOOSE = {"gradient_early_stopping": 1e-3, "gradient_cv": 1e-3}


@gpu
@pytest.mark.parametrize("name", sorted(EXACT_AND_PATHS))
def test_exact_and_path_estimators_match_the_cpu(name):
    X, y = _data()
    p_cpu, p_dev, cpu, dev = _both(EXACT_AND_PATHS[name], X, y, Xt=_data(60, seed=1)[0])
    tol = LOOSE.get(name, 1e-6)
    np.testing.assert_allclose(p_dev, p_cpu, rtol=0, atol=tol * (1 + np.abs(p_cpu).max()))
    if hasattr(cpu, "n_iter_") and name not in LOOSE:
        assert dev.n_iter_ == cpu.n_iter_


# ---- Nyström: ridge (CG and direct, float64 and float32), robust, the transformer ----------------
NYSTROM = {
    "cg": lambda: NystromKernelRidge(n_components=60, alpha=1e-3, sigma=1.0, solver="cg",
                                     tol=1e-10, max_iter=300, random_state=0),
    "direct": lambda: NystromKernelRidge(n_components=60, alpha=1e-3, sigma=1.0,
                                         solver="direct", random_state=0),
    "early_stopping": lambda: NystromKernelRidge(n_components=60, alpha=1e-6, sigma=1.0,
                                                 early_stopping=True, random_state=0),
    "robust_absolute": lambda: NystromRobustRegressor(n_components=60, alpha=1e-3, sigma=1.0,
                                                      loss="absolute", random_state=0),
    "robust_huber": lambda: NystromRobustRegressor(n_components=60, alpha=1e-3, sigma=1.0,
                                                   loss="huber", random_state=0),
}


@gpu
@pytest.mark.parametrize("name", sorted(NYSTROM))
def test_nystrom_estimators_match_the_cpu(name):
    X, y = _data(400)
    p_cpu, p_dev, cpu, dev = _both(NYSTROM[name], X, y, Xt=_data(80, seed=1)[0])
    np.testing.assert_allclose(_np(dev.centers_), _np(cpu.centers_))
    # early stopping and the robust losses' step halving decide on values equal to rounding
    tol = 1e-5 if name in ("cg", "direct") else 1e-3
    np.testing.assert_allclose(p_dev, p_cpu, rtol=0, atol=tol * (1 + np.abs(p_cpu).max()))


@gpu
def test_nystrom_float32_on_the_gpu_is_close_to_float64_on_the_cpu():
    """Mixed precision: float32 kernel values with float64 factorisations and accumulations."""
    X, y = _data(400)
    Xt = _data(80, seed=1)[0]
    ref = NystromKernelRidge(n_components=60, alpha=1e-3, sigma=1.0, solver="direct",
                             random_state=0).fit(X, y).predict(Xt)
    for solver in ("cg", "direct"):
        m = NystromKernelRidge(n_components=60, alpha=1e-3, sigma=1.0, solver=solver,
                               dtype="float32", random_state=0).fit(X.to(GPU), y.to(GPU))
        assert m.compute_dtype_ == "float32"
        np.testing.assert_allclose(_np(m.predict(Xt.to(GPU))), _np(ref), atol=0.02)  # noise 0.1


@gpu
def test_nystroem_transformer_matches_the_cpu():
    X, _ = _data(300)
    cpu = Nystroem(sigma=1.0, n_components=50, random_state=0).fit(X)
    dev = Nystroem(sigma=1.0, n_components=50, random_state=0).fit(X.to(GPU))
    Z = dev.transform(X.to(GPU))
    assert Z.device.type == GPU.type
    np.testing.assert_allclose(_np(Z), _np(cpu.transform(X)), atol=1e-8)


# ---- doubly stochastic and online learners ----------------------------------------------------
@gpu
def test_doubly_stochastic_regressor_on_the_gpu_fits_as_well_as_on_the_cpu():
    X, y = _data(600)
    Xt, yt = _data(200, seed=1)

    def make():
        return DoublyStochasticRegressor(sigma=1.0, max_iter=8, random_state=0)

    p_cpu, p_dev, _, _ = _both(make, X, y, Xt=Xt)
    r_cpu, r_dev = (np.sqrt(np.mean((p - _np(yt)) ** 2)) for p in (p_cpu, p_dev))
    # the same seed; random features drawn on another device may differ, the fit may not
    assert r_dev < 0.5 * float(yt.std())
    assert abs(r_dev - r_cpu) < 0.1 * float(yt.std())


ONLINE = {
    "kawv": lambda: KernelAWV(alpha=1.0, sigma=1.0),
    "pkawv_taylor": lambda: PKAWVTaylor(alpha=1.0, sigma=1.0, degree=2),
    "pkawv_nystrom": lambda: PKAWVNystrom(alpha=1.0, sigma=1.0, random_state=0),
    "prosnkons": lambda: ProsNKONS(alpha=1.0, sigma=1.0, random_state=0),
    "fogd": lambda: FOGD(n_components=100, sigma=1.0, random_state=0),
}


@gpu
@pytest.mark.parametrize("name", sorted(ONLINE))
def test_online_learners_accept_gpu_tensors(name):
    X, y = _data(150)
    p_cpu, p_dev, _, _ = _both(ONLINE[name], X, y, Xt=_data(40, seed=1)[0])
    np.testing.assert_allclose(p_dev, p_cpu, atol=1e-8)


# ---- landmarks ------------------------------------------------------------------------------
def _nystrom_trace_error(X, C, kernel):
    Knm, Kmm = kernel(X, C), kernel(C, C)
    return float(kernel.diag(X).sum() - torch.trace(Knm @ torch.linalg.pinv(Kmm) @ Knm.T))


@gpu
@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_landmark_selectors_on_the_gpu(name):
    X, _ = _data(300)
    kernel = Gaussian(1.0)
    cpu = resolve_centers(name, X, kernel, 20, random_state=0).centers
    dev = resolve_centers(name, X.to(GPU), kernel, 20, random_state=0).centers
    assert dev.device.type == GPU.type and tuple(dev.shape) == tuple(cpu.shape)
    assert bool(torch.isfinite(dev).all())
    e_cpu = _nystrom_trace_error(X, cpu.to(X.dtype), kernel)
    e_dev = _nystrom_trace_error(X, dev.cpu().to(X.dtype), kernel)
    # a seeded selector may draw differently on another device; its quality may not change
    assert e_dev <= 1.5 * e_cpu + 1e-6 * float(X.shape[0])


# ---- classifiers ----------------------------------------------------------------------------
CLASSIFIERS = {
    "krr": lambda: KernelRidgeClassifier(alpha=0.1, sigma=1.0),
    "nystrom_krr": lambda: NystromKernelRidgeClassifier(n_components=60, alpha=1e-3, sigma=1.0,
                                                        random_state=0),
    "nystrom_logistic": lambda: NystromKernelLogisticRegression(n_components=60, alpha=1e-3,
                                                                sigma=1.0, random_state=0),
}


@gpu
@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_classifiers_match_the_cpu(name):
    X, y = _data(300, classes=3)
    d_cpu, d_dev, cpu, dev = _both(CLASSIFIERS[name], X, y, method="decision_function",
                                   Xt=_data(80, seed=1)[0])
    np.testing.assert_allclose(d_dev, d_cpu, atol=1e-5 * (1 + np.abs(d_cpu).max()))
    Xt = _data(80, seed=1)[0]
    np.testing.assert_array_equal(_np(dev.predict(Xt.to(GPU))), _np(cpu.predict(Xt)))


@gpu
def test_doubly_stochastic_classifier_on_the_gpu_fits_as_well_as_on_the_cpu():
    X, y = _data(600, classes=2)
    Xt, yt = _data(200, seed=1, classes=2)
    acc = []
    for dev in ("cpu", GPU):
        m = DoublyStochasticClassifier(sigma=1.0, max_iter=8, random_state=0)
        m.fit(X.to(dev), y.to(dev))
        acc.append(float((_np(m.predict(Xt.to(dev))) == _np(yt)).mean()))
    assert acc[1] > 0.8 and abs(acc[1] - acc[0]) < 0.05


# ---- the engine on the device -----------------------------------------------------------------
@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tiled_products_on_the_gpu_match_the_cpu(dtype):
    """Tiles smaller than the matrix (sizes not a multiple of the tile), both products, K^T K."""
    X, _ = _data(1030, d=5)
    Z, _ = _data(517, d=5, seed=2)
    V = torch.randn(517, 3, dtype=dtype, generator=torch.Generator().manual_seed(3))
    U = torch.randn(1030, 3, dtype=dtype, generator=torch.Generator().manual_seed(4))
    opts = Options(tile_elements=50_000)
    cpu = KernelOperator(Gaussian(1.3), X.to(dtype), Z.to(dtype), options=opts)
    dev = KernelOperator(Gaussian(1.3), X.to(dtype).to(GPU), Z.to(dtype).to(GPU), options=opts)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    for f in (lambda K: K @ V, lambda K: K.t_matmul(U), lambda K: K.kt_k_matmul(V),
              lambda K: K.diagonal() if K.symmetric else K.block([0, 5, 9], [1, 2])):
        a, b = f(cpu), f(dev)
        assert b.device.type == GPU.type
        np.testing.assert_allclose(_np(b), _np(a), rtol=tol, atol=tol * float(a.abs().max()))


@gpu
def test_options_device_moves_cpu_inputs_to_the_gpu():
    X, _ = _data(200)
    v = torch.ones(200, dtype=torch.float64)
    K = KernelOperator(Gaussian(1.0), X, options=Options(device=GPU))
    assert K.device.type == GPU.type
    out = K @ v  # a CPU right-hand side is moved to the operator's device
    assert out.device.type == GPU.type
    np.testing.assert_allclose(_np(out), _np(KernelOperator(Gaussian(1.0), X) @ v), atol=1e-9)


@gpu
def test_float32_tiles_with_float64_accumulation_on_the_gpu():
    X, _ = _data(2000, d=4)
    v = torch.randn(2000, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    exact = KernelOperator(Gaussian(1.0), X) @ v
    K = KernelOperator(Gaussian(1.0), X.float().to(GPU),
                       options=Options(accumulate_float64=True, tile_elements=100_000))
    out = K @ v.to(GPU)
    assert out.dtype == torch.float64
    np.testing.assert_allclose(_np(out), _np(exact), rtol=1e-4, atol=1e-4)


# ---- the memory budget on the device ----------------------------------------------------------
@gpu
@pytest.mark.skipif(GPU.type != "cuda", reason="reads CUDA's free memory")
def test_budget_is_a_fraction_of_the_free_device_memory():
    free, total = torch.cuda.mem_get_info(GPU)
    avail = available_memory(GPU)
    assert free <= avail <= total
    assert memory_budget(Options(memory_fraction=0.5), GPU) == pytest.approx(avail / 2, rel=0.05)
    assert memory_budget(Options(device=GPU)) == pytest.approx(avail / 2, rel=0.05)
    X, _ = _data(100)
    K = KernelOperator(Gaussian(1.0), X.to(GPU))
    assert K._budget() == pytest.approx(avail / 2, rel=0.05)
    # a refusal against a small budget on the device, before any allocation
    small = KernelOperator(Gaussian(1.0), X.to(GPU), options=Options(memory_budget=1000))
    with pytest.raises(MemoryError, match="memory budget"):
        small.to_dense()


@gpu
@pytest.mark.skipif(GPU.type != "cuda", reason="a real CUDA out-of-memory error")
def test_real_device_out_of_memory_becomes_memory_error_with_advice():
    n = 400_000  # a 400k x 400k float32 matrix is 640 GB: more than any one GPU holds
    X = torch.rand(n, 3, device=GPU)
    K = KernelOperator(Gaussian(1.0), X, options=Options(memory_budget=2**60))
    with pytest.raises(MemoryError, match=r"ran out of memory on cuda.*memory_budget") as info:
        K.to_dense()
    assert isinstance(info.value.__cause__, operators._OUT_OF_MEMORY)
    est = KernelRidge(alpha=1.0, sigma=1.0, options=Options(memory_budget=2**60))
    with pytest.raises(MemoryError, match="ran out of memory"):
        est.fit(X, X[:, 0])
    assert not hasattr(est, "dual_coef_")
    del X, K
    torch.cuda.empty_cache()
    # the device is usable afterwards
    Xs, ys = _data(100)
    assert KernelRidge(alpha=0.1, sigma=1.0).fit(Xs.to(GPU), ys.to(GPU)).score(
        Xs.to(GPU), ys.to(GPU)) > 0.9


# ---- model files: GPU -> CPU -> GPU -------------------------------------------------------------
FILES = {
    "krr": lambda: KernelRidge(alpha=0.1, sigma=1.0),
    "nystrom": lambda: NystromKernelRidge(n_components=40, alpha=1e-3, sigma=1.0, random_state=0),
    "sign": lambda: KernelSignGradient(max_iter=100, early_stopping=False, sigma=1.0),
    "doubly_stochastic": lambda: DoublyStochasticRegressor(sigma=1.0, max_iter=3, random_state=0),
    "classifier": lambda: KernelRidgeClassifier(alpha=0.1, sigma=1.0),
}


@gpu
@pytest.mark.parametrize("name", sorted(FILES))
def test_model_file_written_on_the_gpu_reads_on_the_cpu_and_back(name, tmp_path):
    X, y = _data(200, classes=3 if name == "classifier" else 0)
    Xt = _data(50, seed=1)[0]
    method = "decision_function" if name == "classifier" else "predict"
    est = FILES[name]().fit(X.to(GPU), y.to(GPU))
    ref = _np(getattr(est, method)(Xt.to(GPU)))
    path = save_model(est, tmp_path / "model.kfm")
    on_cpu = load_model(path)
    p = getattr(on_cpu, method)(Xt)
    assert isinstance(p, torch.Tensor) and p.device.type == "cpu"
    np.testing.assert_allclose(_np(p), ref, atol=1e-10)
    path2 = save_model(on_cpu, tmp_path / "model_cpu.kfm")  # CPU -> file -> GPU
    back = load_model(path2, device=GPU)
    p2 = getattr(back, method)(Xt.to(GPU))
    assert p2.device.type == GPU.type
    np.testing.assert_allclose(_np(p2), ref, atol=1e-10)
    if name == "classifier":
        np.testing.assert_array_equal(_np(back.predict(Xt.to(GPU))), _np(est.predict(Xt.to(GPU))))


# ---- everywhere: the budget reading and the out-of-memory translation, monkeypatched -----------
GiB = 2**30


def _fake_cuda(monkeypatch, free=3 * GiB, reserved=GiB, allocated=GiB // 2):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_budget_reads_the_free_device_memory(monkeypatch):
    _fake_cuda(monkeypatch)
    # free memory plus the blocks the allocator holds but does not use
    assert available_memory("cuda:0") == 3 * GiB + GiB // 2
    assert memory_budget(Options(), "cuda:0") == int(0.5 * 3.5 * GiB)
    assert memory_budget(Options(memory_fraction=0.25), torch.device("cuda")) == int(0.875 * GiB)
    # the computation's device comes from the options when no device is given
    assert memory_budget(Options(device="cuda")) == int(0.5 * 3.5 * GiB)
    # an explicit budget wins; the CPU budget does not read CUDA
    assert memory_budget(Options(memory_budget=123, device="cuda")) == 123
    _fake_cuda(monkeypatch, free=GiB, reserved=0, allocated=0)
    assert memory_budget(Options(device="cuda")) == GiB // 2


def test_cpu_budget_ignores_cuda(monkeypatch):
    def boom(device=None):
        raise AssertionError("the CPU budget must not ask CUDA")

    monkeypatch.setattr(torch.cuda, "mem_get_info", boom)
    assert memory_budget(Options()) > 0
    assert memory_budget(Options(device="cpu")) > 0


def _oom(*args, **kwargs):
    raise operators._OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                                   "total capacity of 79.1 GiB of which 1.2 GiB is free.")


@pytest.mark.parametrize("product", ["matmul", "t_matmul", "kt_k_matmul"])
def test_out_of_memory_in_a_tile_becomes_memory_error_with_advice(monkeypatch, product):
    X, _ = _data(50)
    K = KernelOperator(Gaussian(1.0), X, X[:20])
    v = torch.ones(20 if product != "t_matmul" else 50, dtype=torch.float64)
    monkeypatch.setattr(KernelOperator, "_tile", _oom)
    with pytest.raises(MemoryError) as info:
        getattr(K, product)(v)
    msg = str(info.value)
    assert f"KernelOperator.{product} ran out of memory on cpu" in msg
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in msg
    assert "Options(memory_budget=" in msg and "float32" in msg
    assert isinstance(info.value.__cause__, operators._OUT_OF_MEMORY)


def test_out_of_memory_in_a_block_and_the_cpu_allocator_message(monkeypatch):
    X, _ = _data(50)
    K = KernelOperator(Gaussian(1.0), X)
    monkeypatch.setattr(Gaussian, "_block", _oom)
    with pytest.raises(MemoryError, match="KernelOperator.block ran out of memory"):
        K.to_dense()

    def cpu_alloc(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                           "7200000000 bytes.")

    monkeypatch.setattr(Gaussian, "_block", cpu_alloc)
    with pytest.raises(MemoryError, match=r"available \(host, cgroup and RLIMIT_AS limits\)"):
        K.block([0, 1], [2, 3])


def test_other_runtime_errors_pass_through(monkeypatch):
    X, _ = _data(50)
    K = KernelOperator(Gaussian(1.0), X)

    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(KernelOperator, "_tile", broken)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        K @ torch.ones(50, dtype=torch.float64)
    assert not isinstance(info.value, MemoryError)


def test_device_out_of_memory_in_a_fit_leaves_the_estimator_and_names_the_gpu(monkeypatch):
    import kernelflow.estimators.kernel_ridge as kr

    X, y = _data(60)
    est = KernelRidge(alpha=0.1, sigma=1.0).fit(X, y)
    before = _np(est.predict(X))
    monkeypatch.setattr(kr, "krr_cholesky", _oom)  # a solve outside the operators
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    _fake_cuda(monkeypatch, free=5 * GiB, reserved=0, allocated=0)
    with pytest.raises(MemoryError, match=r"5\.00 GiB now \(free GPU memory\)") as info:
        est.fit(X[:40], y[:40])
    assert "Options(memory_budget=" in str(info.value)
    assert isinstance(info.value.__cause__, operators._OUT_OF_MEMORY)
    np.testing.assert_array_equal(_np(est.predict(X)), before)


def test_engine_memory_error_in_a_fit_is_not_wrapped_twice(monkeypatch):
    X, y = _data(300)
    monkeypatch.setattr(Gaussian, "_block", _oom)  # every kernel evaluation of the engine
    est = NystromKernelRidge(n_components=30, alpha=1e-3, sigma=1.0, solver="cg",
                             random_state=0)
    with pytest.raises(MemoryError) as info:
        est.fit(X, y)
    assert str(info.value).count("ran out of memory") == 1
    assert not hasattr(est, "dual_coef_")


# ---- the device check itself, in its quick CPU mode (kept working by CI) ---------------------
def test_device_check_quick_cpu_mode_writes_json_and_markdown(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--device",
                           "cpu", "--quick"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["device"]["type"] == "cpu" and result["quick"] is True
    for section in ("tests", "engine", "nystrom", "exact", "memory"):
        assert result["sections"][section]["status"] == "ok", result["sections"][section]
    engine = result["sections"]["engine"]["rows"]
    assert engine and all(r["gflops"] > 0 and r["rel_err"] < 1e-3 for r in engine)
    fits = [r for r in result["sections"]["nystrom"]["rows"] if r.get("table") == "fits"]
    assert {r["solver"] for r in fits} >= {"auto", "cg", "direct"}
    assert all(r["rmse_over_f_std"] < 0.8 for r in fits)  # each solver learned the function
    table = (tmp_path / "gpu_check.md").read_text()
    assert "CPU quick mode" in table and "| K·v" in table
