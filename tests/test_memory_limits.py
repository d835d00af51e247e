"""The memory budget honours the process's real limits (cgroup v2/v1, RLIMIT_AS); allocations
above it are refused up front with advice, and allocator failures become a clear MemoryError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kernelflow import operators
from kernelflow.estimators import KernelRidge
from kernelflow.online import PKAWVTaylor
from kernelflow.operators import Options, available_memory, memory_budget
from kernelflow.utils._finite import MemoryBudgetError

GiB = 2**30


# ---- cgroup files -------------------------------------------------------------------------------
def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_minus_usage_tightest_level(tmp_path):
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "memory.max", "max\n")  # the root: unlimited
    _write(root / "a" / "memory.max", str(8 * GiB))
    _write(root / "a" / "memory.current", str(1 * GiB))
    _write(root / "a" / "b" / "memory.max", str(4 * GiB))
    _write(root / "a" / "b" / "memory.current", str(3 * GiB))
    proc = tmp_path / "cgroup"
    _write(proc, "0::/a/b\n")
    assert operators._cgroup_available(str(root), str(proc)) == 1 * GiB
    _write(root / "a" / "b" / "memory.max", "max\n")
    assert operators._cgroup_available(str(root), str(proc)) == 7 * GiB


def test_cgroup_v2_namespace_root(tmp_path):
    # inside a container, /proc/self/cgroup says "0::/" and the mount point is the own cgroup
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "memory\n")
    _write(root / "memory.max", str(3 * GiB))
    _write(root / "memory.current", str(GiB // 2))
    proc = tmp_path / "cgroup"
    _write(proc, "0::/\n")
    assert operators._cgroup_available(str(root), str(proc)) == 3 * GiB - GiB // 2


def test_cgroup_v1_limit_and_unlimited(tmp_path):
    root = tmp_path / "cg"
    mem = root / "memory"
    _write(mem / "memory.limit_in_bytes", "9223372036854771712\n")  # "no limit"
    _write(mem / "memory.usage_in_bytes", str(GiB))
    proc = tmp_path / "cgroup"
    _write(proc, "4:memory:/job\n1:cpu:/\n0::/\n")
    assert operators._cgroup_available(str(root), str(proc)) is None
    _write(mem / "job" / "memory.limit_in_bytes", str(2 * GiB))
    _write(mem / "job" / "memory.usage_in_bytes", str(GiB // 4))
    assert operators._cgroup_available(str(root), str(proc)) == 2 * GiB - GiB // 4


def test_no_cgroup_files(tmp_path):
    assert operators._cgroup_available(str(tmp_path / "none"), str(tmp_path / "none")) is None


def test_budget_takes_the_tightest_limit(monkeypatch):
    monkeypatch.setattr(operators, "_cgroup_available", lambda: GiB)
    assert available_memory() <= GiB
    assert memory_budget() <= GiB // 2 + 1
    assert memory_budget(Options(memory_budget=123)) == 123
    monkeypatch.setattr(operators, "_cgroup_available", lambda: None)
    monkeypatch.setattr(operators, "_rlimit_available", lambda: 2 * GiB)
    assert available_memory() <= 2 * GiB


# ---- refusals with advice -----------------------------------------------------------------------
def test_pkawv_taylor_refuses_a_state_above_the_budget(monkeypatch):
    import kernelflow.online.pkawv_taylor as mod

    monkeypatch.setattr(mod, "memory_budget", lambda *a, **k: GiB)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(5, 200)), rng.normal(size=5)
    est = PKAWVTaylor(degree=2)
    with pytest.raises(ValueError, match=r"r = 20301 .*Use degree=1 \(r = 201\)") as info:
        est.fit(X, y)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, MemoryBudgetError)
    assert not hasattr(est, "n_rounds_")
    # the suggested degree does fit
    assert PKAWVTaylor(degree=1).fit(X, y).n_features_out_ == 201


def test_raw_allocator_error_becomes_clear_memory_error(monkeypatch):
    import kernelflow.estimators.kernel_ridge as kr

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 2)), rng.normal(size=30)
    est = KernelRidge(alpha=0.1).fit(X, y)
    before = est.predict(X)

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't "
                           "allocate memory: you tried to allocate 7200000000 bytes.")

    monkeypatch.setattr(kr, "krr_cholesky", no_memory)
    with pytest.raises(MemoryError, match=r"ran out of memory.*Options\(memory_budget=") as info:
        est.fit(rng.normal(size=(40, 3)), rng.normal(size=40))
    assert isinstance(info.value.__cause__, RuntimeError)
    np.testing.assert_array_equal(est.predict(X), before)
    assert est.n_features_in_ == 2


# ---- the real thing: a process under a 3 GiB address-space limit --------------------------------
CHILD = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    import numpy as np
    from kernelflow.estimators import KernelRidge
    from kernelflow.online import PKAWVTaylor
    from kernelflow.operators import available_memory
    out = {"available": available_memory()}
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20000, 3))  # K is 3.2 GB: over the limit
    try:
        KernelRidge(alpha=1.0).fit(X, X[:, 0])
        out["exact"] = "fitted"
    except BaseException as exc:
        out["exact"] = [type(exc).__name__, str(exc), isinstance(exc, MemoryError)]
    try:
        PKAWVTaylor(degree=2).fit(rng.normal(size=(5, 200)), np.zeros(5))
        out["taylor"] = "fitted"
    except BaseException as exc:
        out["taylor"] = [type(exc).__name__, str(exc), isinstance(exc, ValueError)]
    print(json.dumps(out))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_rlimit_as_gives_clear_refusals():
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 < out["available"] <= 3 * GiB
    name, message, is_memory_error = out["exact"]
    assert is_memory_error and "memory budget" in message, out["exact"]
    assert "NystromKernelRidge" in message  # advice, not a raw allocator error
    name, message, is_value_error = out["taylor"]
    assert is_value_error and "degree=1" in message, out["taylor"]
