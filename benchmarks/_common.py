"""Helpers shared by the benchmark scripts: timing, peak memory, machine roofline, tables, and
the smooth test problem of the Nyström side-by-side benchmarks."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
import torch


def best_time(fn, *, repeat=3, min_time=0.0):
    """Best wall time of ``repeat`` calls (at least one; more while under ``min_time``)."""
    times = []
    start_all = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start_all < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 50:
            break
    return min(times)


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_isolated(code: str, env: dict | None = None, timeout: float = 3600) -> dict:
    """Run ``code`` in a fresh Python process; it must print one JSON line last. Adds peak RSS."""
    wrapper = (
        "import json, resource\n" + code + "\n"
        "print(json.dumps({**RESULT, 'peak_rss_mb': "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))\n"
    )
    full_env = {**os.environ, **(env or {})}
    out = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True,
                         env=full_env, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"isolated run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def exp_throughput(dtype: torch.dtype, elements: int = 2**19, repeat: int = 30) -> float:
    """Elements per second of in-place ``exp_`` on a cache-sized buffer (all threads)."""
    buf = -torch.rand(elements, dtype=dtype)
    work = buf.clone()

    def run():
        for _ in range(repeat):
            work.copy_(buf)
            work.exp_()

    copy_time = best_time(lambda: [work.copy_(buf) for _ in range(repeat)], repeat=3)
    total = best_time(run, repeat=3)
    return elements * repeat / max(total - copy_time, 1e-9)


def gemm_throughput(dtype: torch.dtype, size: int = 2048) -> float:
    """Flops per second of a square GEMM (all threads)."""
    A = torch.randn(size, size, dtype=dtype)
    B = torch.randn(size, size, dtype=dtype)
    C = torch.empty(size, size, dtype=dtype)
    torch.mm(A, B, out=C)
    t = best_time(lambda: torch.mm(A, B, out=C), repeat=5)
    return 2.0 * size**3 / t


def machine_info() -> str:
    load = os.getloadavg()
    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"{os.cpu_count()} cpus, load average {load[0]:.1f}")


def print_table(rows: list[dict], columns: list[str] | None = None) -> None:
    """Print rows (dicts) as a Markdown table."""
    if not rows:
        return
    columns = columns or list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            if v == 0 or 1e-3 <= abs(v) < 1e5:
                return f"{v:.4g}"
            return f"{v:.3e}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |")
    sys.stdout.flush()


def dump_json(path: str | None, payload) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=2, default=str)


# ---- the Nyström side-by-side problem (nystrom_vs_falkon, many_centres, scale) ----------------
def smooth_f(X):
    """sin(2 u1) + 0.5 tanh(2 u2) + 0.25 u1 u2 with u the projections of ``X`` (n, 9) on two
    fixed orthonormal directions, in float64."""
    Q, _ = np.linalg.qr(np.random.RandomState(12345).randn(9, 2))
    u = np.asarray(X, dtype=np.float64) @ Q
    return np.sin(2 * u[:, 0]) + 0.5 * np.tanh(2 * u[:, 1]) + 0.25 * u[:, 0] * u[:, 1]


def smooth_data(n, dtype="float32", seed=0, n_test=10_000):
    """(X, y, X_test, f_test): X ~ N(0, I_9), y = f + 0.1 N(0, 1) in ``dtype``; f_test noiseless."""
    rng = np.random.RandomState(seed)
    X = rng.randn(n + n_test, 9)
    f = smooth_f(X)
    y = f + 0.1 * rng.randn(n + n_test)
    X, y = X.astype(dtype), y.astype(dtype)
    return X[:n], y[:n], X[n:], f[n:]


def centres(X, M, seed=0):
    """``M`` rows of ``X`` drawn without replacement, in row order (the same for every method)."""
    idx = np.sort(np.random.RandomState(seed + 1).choice(X.shape[0], M, replace=False))
    return X[idx]
