"""The sections of the device check (``check.py``): tests, engine, Nyström, exact, memory.

Each ``section_<name>(ctx)`` appends rows (dicts) to ``ctx.record["rows"]`` and notes to
``ctx.record["notes"]``; it watches ``ctx.time_left()`` and leaves out what would not fit,
saying so. Sizes are those of the full check on one H100; ``ctx.quick`` shrinks them.
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelflow.estimators import (
    KernelCoordinateDescent,
    KernelGradientDescent,
    KernelRidge,
    KernelSignGradient,
    NystromKernelRidge,
)
from kernelflow.kernels import Gaussian
from kernelflow.operators import KernelOperator, Options, available_memory, memory_budget

ROOT = Path(__file__).resolve().parents[2]
TF32 = "tf32"
MiB = 2**20

# ---- the chip's spec sheet (dense, no sparsity), by device name ---------------------------------
# flop rates in flop/s, bandwidth in byte/s; exp: float32 exponentials per second of the special
# function units (16 per multiprocessor per clock at the boost clock); a float64 exponential has
# no such unit and is counted as 20 float64 vector operations.
_SPECS = {
    "H200": dict(label="H200 SXM (141 GB HBM3e)", fp32=67e12, tf32=495e12, fp64=67e12,
                 fp64_vector=34e12, bandwidth=4.8e12, sms=132, clock=1.98e9),
    "H100 NVL": dict(label="H100 NVL", fp32=60e12, tf32=418e12, fp64=60e12, fp64_vector=30e12,
                     bandwidth=3.9e12, sms=132, clock=1.785e9),
    "H100 PCIe": dict(label="H100 PCIe", fp32=51e12, tf32=378e12, fp64=51e12,
                      fp64_vector=26e12, bandwidth=2.0e12, sms=114, clock=1.755e9),
    "H100": dict(label="H100 SXM5 (80 GB HBM3)", fp32=67e12, tf32=495e12, fp64=67e12,
                 fp64_vector=34e12, bandwidth=3.35e12, sms=132, clock=1.98e9),
}


def spec_peaks(name: str) -> dict | None:
    """Spec sheet peaks of an H100 (SXM, PCIe, NVL) or H200 from its CUDA device name."""
    for key in ("H200", "H100 NVL", "H100 PCIe", "H100"):
        if key.lower().replace(" ", "") in name.lower().replace(" ", ""):
            s = dict(_SPECS[key])
            s["exp32"] = 16 * s["sms"] * s["clock"]
            s["exp64"] = s["fp64_vector"] / 20
            return s
    return None


@dataclass
class Context:
    device: torch.device
    quick: bool
    out: Path
    result: dict
    scale: float = 1.0  # multiplies the full check's sizes (a trial on a smaller machine)
    record: dict = field(default_factory=dict)
    rates: dict = field(default_factory=dict)  # measured GEMM / exp / copy rates
    memory: list = field(default_factory=list)
    headline: list = field(default_factory=list)
    _deadline: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def begin(self, name: str, record: dict, limit: float) -> None:
        self.record = record
        self._deadline = time.perf_counter() + limit
        self._budget = memory_budget(Options(), self.device)
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def end(self, name: str, record: dict) -> None:
        if name == "memory":
            return
        row = {"section": name, "budget_at_start_gib": self._budget / 2**30}
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            row.update(peak_gib=peak / 2**30, peak_over_budget=peak / max(self._budget, 1),
                       total_gib=torch.cuda.get_device_properties(self.device).total_memory
                       / 2**30)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            row.update(peak_gib=peak / 2**30, peak_over_budget=peak / max(self._budget, 1),
                       total_gib=float("nan"))
            row["note"] = "process peak RSS so far (not per section)"
        self.memory.append(row)
        record["peak_memory_gib"] = round(row["peak_gib"], 3)

    def size(self, n: float, floor: int = 100, power: float = 1.0) -> int:
        """A full-check size times ``scale ** power``, at least ``floor``."""
        return max(floor, int(n * min(1.0, self.scale) ** power))

    def time_left(self) -> float:
        return self._deadline - time.perf_counter()

    def note(self, text: str) -> None:
        self.record["notes"].append(text)
        print("   note:", text, flush=True)

    def row(self, **values) -> dict:
        clean = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in values.items()}
        self.record["rows"].append(clean)
        print("  ", clean, flush=True)
        return clean

    def failed_row(self, what: str, exc: BaseException) -> None:
        self.record.setdefault("failed_rows", []).append(
            {"what": what, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        print(f"   FAILED {what}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        if self.cuda:
            torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeat=1):
    """(best wall time of ``repeat`` calls, last result), synchronising the device."""
    best, out = math.inf, None
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


class _tf32:
    """TF32 tensor cores for float32 products inside the block, off outside."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if self.on else "highest")

    def __exit__(self, *exc):
        torch.set_float32_matmul_precision(self.saved)


# ---- (a) the tests --------------------------------------------------------------------------
def section_tests(ctx: Context) -> None:
    """``tests/test_cuda.py`` on the device (its own process; the log is ``tests.log``)."""
    junit = ctx.out / "tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           str(ROOT / "tests" / "test_cuda.py"), "-k", "not quick_cpu_mode",
           f"--junitxml={junit}", "--durations=15",
           "-W", "ignore::sklearn.exceptions.ConvergenceWarning"]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if not ctx.cuda and not ctx.quick:  # a dry run of the GPU tests' logic on the CPU
        env["KERNELFLOW_TEST_GPU"] = "cpu"
    t0 = time.perf_counter()
    if ctx.quick and not ctx.cuda:  # in this process: the smoke test saves the imports
        import contextlib
        import io

        import pytest

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = int(pytest.main(cmd[3:]))
        log = buf.getvalue()
    else:
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=max(10.0, ctx.time_left()))
            log, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            log, code = f"{exc.stdout or ''}{exc.stderr or ''}\n(timeout)", -1
    (ctx.out / "tests.log").write_text(log if isinstance(log, str) else log.decode())
    counts = _junit_counts(junit)
    junit.unlink(missing_ok=True)  # the log says the same; keep the files that come back few
    failed = [ln for ln in str(log).splitlines() if ln.startswith(("FAILED", "ERROR"))]
    ctx.row(suite="tests/test_cuda.py", device=str(ctx.device), **counts, exit_code=code,
            seconds=time.perf_counter() - t0)
    for ln in failed[:40]:
        ctx.note(ln[:300])
    if code not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"pytest exited with {code}: {counts}")


def _junit_counts(path: Path) -> dict:
    import xml.etree.ElementTree as ET

    if not path.exists():
        return {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


# ---- (b) the engine -------------------------------------------------------------------------
def _measure_rates(ctx: Context) -> None:
    dev, quick = ctx.device, ctx.quick
    for label, dtype, tf32, size in (("gemm_fp32", torch.float32, False, 8192),
                                     ("gemm_tf32", torch.float32, True, 8192),
                                     ("gemm_fp64", torch.float64, False, 4096)):
        if tf32 and not ctx.cuda:
            continue
        size = 512 if quick else (size if ctx.cuda else 2048)
        size = max(512, int(size * min(1.0, ctx.scale) ** (1 / 3)))
        A = torch.randn(size, size, dtype=dtype, device=dev)
        B = torch.randn(size, size, dtype=dtype, device=dev)
        with _tf32(tf32):
            torch.mm(A, B)
            t, _ = timed(lambda A=A, B=B: torch.mm(A, B), dev, repeat=3)
        ctx.rates[label] = 2.0 * size**3 / t
    for label, dtype in (("exp_fp32", torch.float32), ("exp_fp64", torch.float64)):
        n = 2**18 if quick or not ctx.cuda else 2**22  # L2- (or cache-) resident
        buf = -torch.rand(n, dtype=dtype, device=dev)
        reps = 20

        def run(buf=buf, reps=reps):
            for _ in range(reps):
                buf.exp_().neg_()

        def neg_only(buf=buf, reps=reps):
            for _ in range(reps):
                buf.neg_()

        run()
        t_all, _ = timed(run, dev, repeat=3)
        t_neg, _ = timed(neg_only, dev, repeat=3)
        ctx.rates[label] = n * reps / max(t_all - t_neg, 1e-9)
    n = 2**24 if quick or not ctx.cuda else 2**28
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t, _ = timed(lambda: dst.copy_(src), dev, repeat=5)
    ctx.rates["copy_bytes"] = 2.0 * n / t
    ctx.record["rates"] = dict(ctx.rates)
    ctx.note("measured in this run: " + ", ".join(
        f"{k} {v / 1e12:.3g} T" for k, v in ctx.rates.items())
        + " (flop/s for GEMMs, exp/s, bytes/s read + written for the copy)")


def _peak(ctx: Context, dtype_label: str) -> tuple[float, float, float] | None:
    """(flop/s, exp/s, bytes/s) of the spec sheet, None when the chip is not known."""
    spec = ctx.result["device"].get("spec")
    if not spec:
        return None
    if dtype_label == "float64":
        return spec["fp64"], spec["exp64"], spec["bandwidth"]
    return spec["tf32" if dtype_label == TF32 else "fp32"], spec["exp32"], spec["bandwidth"]


def _engine_row(ctx, op, n, m, d, dtype_label, options=None, device=None, repeat=None):
    device = device or ctx.device
    dtype = torch.float64 if dtype_label == "float64" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    X = torch.randn(n, d, dtype=dtype, device=device, generator=g)
    Z = None if m is None else torch.randn(m, d, dtype=dtype, device=device, generator=g)
    m_ = n if m is None else m
    repeat = repeat or (1 if float(n) * m_ >= 1e9 else 3)  # after one warm-up call
    kern = Gaussian(math.sqrt(d))
    K = KernelOperator(kern, X, Z, options=options)
    rhs = torch.randn(m_ if op == "K·v" else n, dtype=dtype, device=device, generator=g)
    f = (lambda: K @ rhs) if op == "K·v" else (lambda: K.t_matmul(rhs))
    with _tf32(dtype_label == TF32):
        f()
        t, out = timed(f, device, repeat=repeat)
    # accuracy on 128 outputs against a float64 evaluation of the same entries
    Z64 = (X if Z is None else Z).double()
    X64 = X.double()
    idx = torch.arange(min(128, out.shape[0]), device=device)
    if op == "K·v":
        ref = kern(X64[idx], Z64) @ rhs.double()
    else:
        ref = kern(X64, Z64[idx]).T @ rhs.double()
    rel_err = float((out[idx].double() - ref).norm() / ref.norm().clamp_min(1e-300))
    entries = float(n) * m_
    flops = 2.0 * entries * (d + 3)  # exponent GEMM of inner dimension d + 2, product with v
    item = 8 if dtype_label == "float64" else 4
    row = dict(op=op, n=n, m=m_, d=d, dtype=dtype_label, device=device.type,
               tile_mib=(options or Options()).tile_bytes / MiB, seconds=t,
               gflops=flops / t / 1e9, gexp=entries / t / 1e9, rel_err=rel_err)
    gemm = ctx.rates.get({"float64": "gemm_fp64", TF32: "gemm_tf32"}.get(dtype_label,
                                                                          "gemm_fp32"))
    expr = ctx.rates.get("exp_fp64" if dtype_label == "float64" else "exp_fp32")
    if gemm and expr and device == ctx.device:
        row["of_measured_roof"] = (flops / gemm + entries / expr) / t
    peak = _peak(ctx, dtype_label) if device == ctx.device else None
    if peak:
        row["of_spec_flops"] = (flops / t) / peak[0]
        row["of_spec_roof"] = (flops / peak[0] + entries / peak[1]) / t
        row["tile_traffic_of_bw"] = 4.0 * entries * item / t / peak[2]
    elif ctx.rates.get("copy_bytes") and device == ctx.device:
        row["tile_traffic_of_bw"] = 4.0 * entries * item / t / ctx.rates["copy_bytes"]
    return ctx.row(**row)


def section_engine(ctx: Context) -> None:
    """Gaussian K·v / Kᵀu throughput against the roofline, the tile size, the host CPU."""
    _measure_rates(ctx)
    ctx.note("roofline: a fused Gaussian K·v is compute-bound (2 n m (d + 3) flops and n m "
             "exponentials for O((n + m) d) bytes); of_measured_roof = (flops / measured GEMM "
             "rate + exps / measured exp rate) / time, of_spec_roof the same with spec-sheet "
             "peaks. The engine is tiled, not fused: each tile is written by the GEMM, "
             "exponentiated in place and read by the product (about 4 n m element transfers; "
             "tile_traffic_of_bw is that traffic over the spec bandwidth, a bound when tiles "
             "spill the L2 cache).")
    if ctx.quick:
        shapes = [(2000, None, 3), (4000, 500, 3), (4000, 500, 9)]
        dtypes = ["float32", "float64"] + ([TF32] if ctx.cuda else [])
        sweep = (4000, 500, 9, [2 * MiB, 64 * 1024])
    else:
        s, m4 = ctx.size, ctx.size(10_000, 200, 0.5)
        shapes = [(s(1_000_000, 2000), m4, 9), (s(100_000, 1000, 0.5), None, 9),
                  (s(1_000_000, 2000), m4, 64), (s(1_000_000, 2000), m4, 3),
                  (s(100_000, 1000), m4, 64)]
        dtypes = ["float32", TF32, "float64"]
        sweep = (s(1_000_000, 2000), m4, 9, [2 * MiB, 32 * MiB, 256 * MiB])
    if not ctx.cuda:
        dtypes = [dt for dt in dtypes if dt != TF32]
        ctx.note("TF32 is a CUDA setting: no TF32 rows on the CPU")
    # the tile size first: it decides how far the default is from the chip
    n, m, d, tiles = sweep
    for tb in tiles:
        if ctx.time_left() < 5:
            ctx.note("tile sweep cut: time allowance")
            break
        try:
            _engine_row(ctx, "K·v", n, m, d, "float32", Options(tile_bytes=tb))
        except Exception as exc:  # noqa: BLE001
            ctx.failed_row(f"tile {tb}", exc)
    for k, (n, m, d) in enumerate(shapes):
        for dt in dtypes:
            # Kᵀu for the first and the last (smallest) shapes only: the grid fits the allowance
            both = m is not None and (k in (0, len(shapes) - 1) or ctx.quick)
            for op in ("K·v", "Kᵀu") if both else ("K·v",):
                if ctx.time_left() < (15 if ctx.cuda else 5):
                    ctx.note(f"left out {op} n={n} m={m} d={d} {dt}: time allowance")
                    continue
                try:
                    _engine_row(ctx, op, n, m, d, dt)
                except Exception as exc:  # noqa: BLE001
                    ctx.failed_row(f"{op} n={n} m={m} d={d} {dt}", exc)
    # the same product on the host CPU (all its threads), for a ratio
    if ctx.cuda:
        n, m, d = ctx.size(100_000, 1000), ctx.size(10_000, 200, 0.5), 9
        dev_rows = [r for r in ctx.record["rows"] if r.get("op") == "K·v" and r.get("n") == n
                    and r.get("m") == m and r.get("d") == d and r.get("dtype") == "float32"]
        if not dev_rows:  # not in the grid above: time it on the device too
            dev_rows = [_engine_row(ctx, "K·v", n, m, d, "float32")]
        if ctx.time_left() > 10:
            cpu = _engine_row(ctx, "K·v", n, m, d, "float32", device=torch.device("cpu"),
                              repeat=1)
            ctx.headline.append(dict(item=f"Gaussian K·v n={n} m={m} d={d} float32",
                                     device_s=dev_rows[0]["seconds"], cpu_s=cpu["seconds"],
                                     cpu_over_device=cpu["seconds"] / dev_rows[0]["seconds"]))
        else:
            ctx.note("host CPU K·v left out: time allowance")


# ---- (c) Nyström at scale ---------------------------------------------------------------------
def _target(X: torch.Tensor) -> torch.Tensor:
    """The noiseless function of the Nyström and exact sections (d >= 3)."""
    return (torch.sin(2 * X[:, 0]) + torch.cos(X[:, 1]) * X[:, 2]
            + 0.5 * torch.sin(X[:, 3:]).sum(1) / max(1, X.shape[1] - 3) ** 0.5)


def _problem(n, d, dtype, device, seed, noise=0.3):
    g = torch.Generator(device=device).manual_seed(seed)
    X = torch.rand(n, d, dtype=dtype, device=device, generator=g) * 4 - 2
    f = _target(X)
    return X, f + noise * torch.randn(n, dtype=dtype, device=device, generator=g), f


def _rmse(model, Xt, ft) -> float:
    p = model.predict(Xt)
    p = p if isinstance(p, torch.Tensor) else torch.as_tensor(p)
    return float(((p.to(ft.device).double() - ft.double()) ** 2).mean().sqrt())


def _pass_time(ctx, X, C, sigma, options, device, n_total):
    """Seconds of one pass K_nM^T (K_nM v) over ``X`` on ``device``, scaled to n_total rows."""
    Xd, Cd = X.to(device), C.to(device)
    K = KernelOperator(Gaussian(sigma), Xd, Cd, options=options)
    v = torch.ones(Cd.shape[0], dtype=torch.float64, device=device)
    K.kt_k_matmul(v[:, None].to(Xd.dtype))
    t, _ = timed(lambda: K.kt_k_matmul(v[:, None].to(Xd.dtype)), device)
    return t * n_total / Xd.shape[0]


def section_nystrom(ctx: Context) -> None:
    """n = 1e7, M = 2e4, d = 9, float32 data drawn on the device; each solver."""
    dev = ctx.device
    n, M, d = (20_000, 200, 9) if ctx.quick else (ctx.size(10_000_000, 20_000),
                                                   ctx.size(20_000, 200, 0.5), 9)
    sigma, noise = 3.0, 0.3
    alpha = 1e-6 * n
    t0 = time.perf_counter()
    X, y, _ = _problem(n, d, torch.float32, dev, seed=0, noise=noise)
    n_test = 20_000 if ctx.quick else ctx.size(100_000, 20_000)
    Xt, _, ft = _problem(n_test, d, torch.float32, dev, seed=1)
    f_std = float(ft.double().std())
    sync(dev)
    ctx.note(f"data: X uniform on [-2, 2]^{d}, y = f(X) + {noise} N(0, 1), drawn on "
             f"{dev.type} in {time.perf_counter() - t0:.2f} s; RMSE against the noiseless f "
             f"on {n_test} test points (std of f {f_std:.3f}); sigma = {sigma}, "
             f"alpha = 1e-6 n = {alpha:g}")
    g = torch.Generator(device="cpu").manual_seed(0)
    C = X[torch.randperm(n, generator=g)[:M].to(dev)]
    # one pass over the data, default tiles and large tiles, device and host
    n_probe = min(n, 5_000 if ctx.quick else ctx.size(500_000, 5000))
    big = Options(tile_bytes=256 * MiB)
    pass_default = _pass_time(ctx, X[:n_probe], C, sigma, None, dev, n)
    ctx.row(table="one pass over the data", what="K_nM^T K_nM v, default tiles", n=n, M=M,
            device=dev.type, seconds=pass_default, measured_rows=n_probe)
    fit_options, tiles = None, "default (2 MiB)"
    if ctx.cuda:
        pass_big = _pass_time(ctx, X[:n_probe], C, sigma, big, dev, n)
        ctx.row(table="one pass over the data", what="K_nM^T K_nM v, tile_bytes = 256 MiB",
                n=n, M=M, device=dev.type, seconds=pass_big, measured_rows=n_probe)
        if pass_default > 3.0 and pass_big < pass_default:
            fit_options, tiles = big, "tile_bytes = 256 MiB"
            ctx.note(f"the fits use tile_bytes = 256 MiB: with the default 2 MiB tiles one "
                     f"pass takes {pass_default:.1f} s here, so a CG fit would not fit the "
                     f"allowance")
        n_cpu = ctx.size(20_000, 2000)
        if ctx.time_left() > 30:
            pass_cpu = _pass_time(ctx, X[:n_cpu], C, sigma, None, torch.device("cpu"), n)
            ctx.row(table="one pass over the data", what="K_nM^T K_nM v, default tiles",
                    n=n, M=M, device="cpu", seconds=pass_cpu, measured_rows=n_cpu)
            best = min(pass_default, pass_big)
            ctx.headline.append(dict(item=f"Nyström pass n={n:.0e} M={M} d={d} float32",
                                     device_s=best, cpu_s=pass_cpu,
                                     cpu_over_device=pass_cpu / best))
    pass_used = pass_big if fit_options is big else pass_default
    done: dict = {}
    for solver in ("auto", "cg", "direct"):
        left = ctx.time_left()
        if solver == "cg" and done.get("auto", {}).get("solver_ran") == "cg":
            ctx.row(**{**done["auto"], "solver": "cg", "note": "the same fit as auto"})
            continue
        n_fit, cap = n, 100
        if solver == "direct":
            gemm64 = ctx.rates.get("gemm_fp64") or 1e12
            est = 2.0 * n * M * M / gemm64 + pass_used
            if est > 0.6 * left:
                n_fit = max(M, int(n * 0.6 * left / max(est, 1e-9)) // 1000 * 1000)
                ctx.note(f"direct solve on the first {n_fit} rows: the Gram pass at n = {n} "
                         f"is estimated at {est:.0f} s (measured float64 GEMM rate)")
        else:
            cap = max(3, min(100, int(0.6 * left / max(pass_used, 1e-9))))
        if left < 10:
            ctx.note(f"solver {solver} left out: time allowance")
            continue
        est = NystromKernelRidge(n_components=M, alpha=alpha, sigma=sigma, solver=solver,
                                 max_iter=cap, random_state=0, options=fit_options)
        try:
            t, _ = timed(lambda est=est, n_fit=n_fit: est.fit(X[:n_fit], y[:n_fit]), dev)
            rmse = _rmse(est, Xt, ft)
            r = ctx.row(table="fits", solver=solver, solver_ran=est.solver_, n=n_fit, M=M, d=d,
                        dtype=est.compute_dtype_, tiles=tiles, fit_s=t, rmse=rmse,
                        rmse_over_f_std=rmse / f_std,
                        n_iter=int(est.n_iter_), max_iter=cap,
                        converged=bool(getattr(est, "converged_", True)))
            done[solver] = r
        except Exception as exc:  # noqa: BLE001
            ctx.failed_row(f"Nyström solver={solver}", exc)
        del est


# ---- (d) exact KRR and the paths ----------------------------------------------------------------
def _fit_row(ctx, name, make, n, device, d=9, dtype=torch.float64, test=2000):
    X, y, _ = _problem(n, d, dtype, device, seed=2)
    Xt, _, ft = _problem(test, d, dtype, device, seed=3)
    est = make()
    t, _ = timed(lambda: est.fit(X, y), device)
    return ctx.row(estimator=name, n=n, d=d, dtype=str(dtype).replace("torch.", ""),
                   device=device.type, fit_s=t, rmse=_rmse(est, Xt, ft),
                   n_iter=int(getattr(est, "n_iter_", 0) or 0))


def section_exact(ctx: Context) -> None:
    """Exact KRR at n = 2e4 and 5e4, the three paths at n = 2e4; device and host CPU."""
    dev, cpu = ctx.device, torch.device("cpu")
    sizes = (1000, 2000) if ctx.quick else (ctx.size(20_000, 1000, 0.5),
                                             ctx.size(50_000, 2000, 0.5))
    n_path = 800 if ctx.quick else ctx.size(20_000, 800, 0.5)
    krr = {}
    for n in sizes:
        if ctx.time_left() < 10:
            ctx.note(f"KRR n={n} left out: time allowance")
            continue
        try:
            krr[n] = _fit_row(ctx, "KernelRidge", lambda: KernelRidge(alpha=1e-3, sigma=3.0),
                              n, dev)
        except MemoryError as exc:  # the budget refused: half the free memory is too little
            ctx.note(f"KRR n={n}: {str(exc)[:200]}; again with memory_fraction = 0.9")
            try:
                krr[n] = _fit_row(ctx, "KernelRidge (memory_fraction 0.9)",
                                  lambda: KernelRidge(alpha=1e-3, sigma=3.0,
                                                      options=Options(memory_fraction=0.9)),
                                  n, dev)
            except Exception as exc2:  # noqa: BLE001
                ctx.failed_row(f"KRR n={n}", exc2)
        except Exception as exc:  # noqa: BLE001
            ctx.failed_row(f"KRR n={n}", exc)
    paths = {
        "KernelGradientDescent": lambda: KernelGradientDescent(max_iter=100, sigma=3.0,
                                                               early_stopping=False),
        "KernelSignGradient": lambda: KernelSignGradient(max_iter=300, sigma=3.0,
                                                         early_stopping=False),
        "KernelCoordinateDescent": lambda: KernelCoordinateDescent(max_iter=300, sigma=3.0,
                                                                   early_stopping=False),
    }
    path_rows = {}
    for name, make in paths.items():
        if ctx.time_left() < 8:
            ctx.note(f"{name} left out: time allowance")
            continue
        try:
            path_rows[name] = _fit_row(ctx, name, make, n_path, dev)
        except Exception as exc:  # noqa: BLE001
            ctx.failed_row(name, exc)
    if not ctx.cuda:
        return
    # the host CPU: the paths, then the KRR sizes whose cubic-cost estimate fits
    for name, make in paths.items():
        if name not in path_rows or ctx.time_left() < 20:
            continue
        r = _fit_row(ctx, name, make, n_path, cpu)
        ctx.headline.append(dict(item=f"{name} n={n_path}", device_s=path_rows[name]["fit_s"],
                                 cpu_s=r["fit_s"],
                                 cpu_over_device=r["fit_s"] / path_rows[name]["fit_s"]))
    prev = None
    for n in sorted(krr):
        left = ctx.time_left()
        if prev is not None and prev[0] * (n / prev[1]) ** 3 > left - 5:
            ctx.note(f"host CPU KRR n={n} left out: estimated {prev[0] * (n / prev[1]) ** 3:.0f}"
                     f" s from n={prev[1]}, {left:.0f} s left")
            continue
        if left < 10:
            break
        r = _fit_row(ctx, "KernelRidge", lambda: KernelRidge(alpha=1e-3, sigma=3.0), n, cpu)
        prev = (r["fit_s"], n)
        ctx.headline.append(dict(item=f"exact KRR n={n} d=9 float64", device_s=krr[n]["fit_s"],
                                 cpu_s=r["fit_s"], cpu_over_device=r["fit_s"] / krr[n]["fit_s"]))


# ---- (e) memory -----------------------------------------------------------------------------
def section_memory(ctx: Context) -> None:
    """Peak memory of every section against the budget read at its start."""
    for row in ctx.memory:
        ctx.row(**row)
    dev = ctx.device
    ctx.row(table="budget now", section="now", available_gib=available_memory(dev) / 2**30,
            budget_gib=memory_budget(Options(), dev) / 2**30,
            budget_rule="memory_fraction (0.5) x free memory of the device")
    over = [r["section"] for r in ctx.memory if r.get("peak_over_budget", 0) > 1.0]
    if over and ctx.cuda:
        ctx.note(f"peak above the budget in {over}: the budget bounds one engine call, not "
                 "the data a section holds (X, y, the dense K of an exact fit are outside it)")
    ctx.result["headline"] = ctx.headline


# ---- the report -----------------------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return ""
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


def _table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return lines


def markdown(result: dict) -> str:
    dev = result["device"]
    lines = ["# kernelflow device check", ""]
    if dev["type"] != "cuda":
        mode = "CPU quick mode" if result["quick"] else "CPU run"
        lines += [f"> **{mode}** (a smoke test of the check itself, on the CPU): these are "
                  "**not GPU figures**.", ""]
    elif result["quick"] or result.get("scale", 1.0) != 1.0:
        lines += ["> **quick or scaled-down mode**: not the sizes of the full check.", ""]
    name = dev.get("name")
    lines += [f"- device: {dev['type']} ({name}; {dev.get('cpus')} host CPUs)",
              f"- date: {result['date']}",
              f"- command: `{result['command']}` (commit {result.get('commit') or 'unknown'})",
              f"- torch {dev.get('torch')}, CUDA {dev.get('cuda')}", ""]
    spec = dev.get("spec")
    if spec:
        lines += [f"- spec sheet used: {spec['label']}: FP32 {spec['fp32'] / 1e12:.0f}, TF32 "
                  f"{spec['tf32'] / 1e12:.0f}, FP64 {spec['fp64'] / 1e12:.0f} TFLOP/s (dense), "
                  f"{spec['bandwidth'] / 1e12:.2f} TB/s, {spec['exp32'] / 1e12:.1f} T exp/s "
                  "(float32, special function units)", ""]
    if result.get("headline"):
        lines += ["## Headline: device against the host CPU of the same machine", ""]
        lines += _table(result["headline"]) + [""]
    for name, rec in result["sections"].items():
        lines += [f"## {name}: {rec['status']}"
                  + (f" ({rec.get('seconds', 0):.0f} s)" if "seconds" in rec else ""), ""]
        if rec.get("error"):
            lines += [f"error: `{rec['error'][:300]}`", ""]
        groups: dict = {}
        for r in rec.get("rows", []):
            groups.setdefault(r.get("table", ""), []).append(
                {k: v for k, v in r.items() if k != "table"})
        for title, rows in groups.items():
            lines += ([f"{title}:", ""] if title else []) + _table(rows) + [""]
        for f in rec.get("failed_rows", []):
            lines.append(f"- failed: {f['what']}: `{f['error'][:200]}`")
        for note in rec.get("notes", []):
            lines.append(f"- {note}")
        lines.append("")
    return "\n".join(lines)
