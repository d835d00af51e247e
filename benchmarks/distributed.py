"""Data-parallel Nyström KRR: processes against threads on one host, and a scaling model.

Claim (docs/distributed.md): on this 2-core machine a 10^6-row Nyström fit on 2 Gloo processes
x 1 thread is at least 1.5x faster than 1 process x 1 thread and no slower than 1 process x 2
threads. Baseline: 1 process x 1 thread, measured in the same run (configurations interleaved,
best of ``--repeats``). Every configuration runs the same ``distributed_fit`` in fresh processes
started the same way, reads the same memory-mapped ``.npy`` files (each process only its rows)
and runs a fixed number of CG iterations.

Then the pieces of the scaling model, measured here: Gloo all-reduce time of an (M x t) float64
block on localhost (latency and bandwidth fitted), compute time per row per pass (one thread),
and the preconditioner build (the part every process repeats); the script prints the predicted
speed-up for many processes/hosts and where it stops scaling.

Many centres (n = 10^8, M = 10^4 and 10^5): the ingredients are measured on one thread (CPU
time, d = 9, float32 kernel tiles as the solvers stream them): one pass per row at M = 10^4
and 10^5, K_MM v at M = 10^4 and 2 10^4 (at 10^5 a block of 2000 rows, scaled by the row
count), eigen-CG's preconditioner (s = 3000) at 10^4 and 10^5, and Falkon's at 10^4 (the M x M
kernel, one Cholesky, the triangular product L^T L, one triangular solve; extrapolated as
M^2 and M^3 to 10^5, where its matrices do not fit memory). Then the predicted fit time and
efficiency for p = 1 .. 2048 on 10 GbE (assumed latency and bandwidth) for PCG (replicated
O(M^3) setup and triangular solves), eigen-CG with K_MM v on every process, and eigen-CG with
K_MM v split over the processes; the pass counts are taken from
docs/performance/many_centres.md (``PCG_PASSES``, ``EIGEN_PASSES``).

    python benchmarks/distributed.py            # n = 10^6 rows (about 3 minutes on 2 idle cores)
    python benchmarks/distributed.py --quick    # n = 10^5, smoke run
    python benchmarks/distributed.py --model-only   # the scaling model only (about 2 minutes)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings

import numpy as np
import torch

from kernelflow.distributed import (
    DistributedError,
    all_reduce_sum,
    barrier,
    rank,
    shard_npy,
    spawn,
)
from kernelflow.distributed.fit import distributed_fit

BUDGET = 1 << 30
CENTRES_D = 9  # dimension of the many-centres ingredients (the many-centres benchmark's data)


# ---- workers (run in the spawned processes) ----------------------------------------------------
def fit_worker(paths, n_components, sigma, alpha, iters, dtype):
    from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    from kernelflow.operators import Options

    warnings.simplefilter("ignore")  # fixed iteration count: the convergence warning is expected
    source = shard_npy(paths["X"], paths["y"])
    # a fixed 1 GiB budget: K(X, C) is never stored, every pass streams the rows and evaluates
    # the kernel (the regime of data larger than memory), the same in every configuration
    est = NystromKernelRidge(n_components, alpha=alpha, sigma=sigma, max_iter=iters, tol=1e-300,
                             dtype=dtype, random_state=0,
                             options=Options(memory_budget=BUDGET))
    barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    distributed_fit(est, source)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cpu": time.process_time() - c0, "n_iter": est.n_iter_,
            "coef": est.dual_coef_.numpy()}


def allreduce_worker(sizes):
    out = {}
    for size in sizes:
        buf = torch.ones(int(size), dtype=torch.float64)
        for _ in range(3):
            all_reduce_sum(buf)
        times = []
        for _ in range(10 if size >= 100_000 else 50):  # same count on every process
            barrier()
            t0 = time.perf_counter()
            all_reduce_sum(buf)
            times.append(time.perf_counter() - t0)
        out[int(size)] = statistics.median(times)
    return out if rank() == 0 else None


def compute_worker(paths, n_components, sigma, rows, dtype):
    """Seconds per row of one pass (K^T K v over a block) and of the preconditioner build."""
    from kernelflow.kernels import Gaussian
    from kernelflow.solvers.nystrom import nystrom_normal_matvec, nystrom_preconditioner
    from kernelflow.sources import ArraySource

    X = torch.from_numpy(np.load(paths["X"], mmap_mode="r")[:rows].copy())
    C = X[:n_components].to(torch.float64)
    v = torch.ones(n_components, 1, dtype=torch.float64)
    src = ArraySource(X.to(dtype), torch.zeros(rows, dtype=dtype))
    from kernelflow.operators import Options

    opts = Options(memory_budget=BUDGET)
    nystrom_normal_matvec(src, Gaussian(sigma), C, v, dtype=dtype, options=opts)  # warm-up
    t0 = time.perf_counter()
    nystrom_normal_matvec(src, Gaussian(sigma), C, v, dtype=dtype, options=opts)
    per_row = (time.perf_counter() - t0) / rows
    t0 = time.perf_counter()
    nystrom_preconditioner(Gaussian(sigma), C, 1e-6)
    return {"per_row": per_row, "precond": time.perf_counter() - t0}


def _timed(fn, *args, repeats=1):
    """(wall seconds, CPU seconds, result) of ``fn(*args)``, best of ``repeats``; CPU time is
    this process's (one thread), which a loaded machine inflates less than the wall clock."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn(*args)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu), result


def centres_worker(d, sigma, rows, rank_s, setup_cap):
    """The ingredients of the many-centres model, measured on one thread at M = 10^4 and 10^5.

    Returns {name: (wall s, CPU s, how)}: one streamed pass per row (float32 tiles, float64
    sums, as the solvers stream them), one K_MM v (the full product at M = 10^4 and 2 10^4, a
    block of rows at 10^5), eigen-CG's preconditioner (setup and one application), and Falkon's
    (the M x M kernel, one Cholesky, the triangular product L^T L, one triangular solve).
    """
    from kernelflow.kernels import Gaussian
    from kernelflow.operators import KernelOperator, Options
    from kernelflow.solvers.nystrom import _lower_gram, nystrom_normal_matvec
    from kernelflow.solvers.nystrom_eigen_cg import eigen_preconditioner
    from kernelflow.sources import ArraySource

    f64, f32 = torch.float64, torch.float32
    gen = torch.Generator().manual_seed(0)
    kernel, lam = Gaussian(sigma), 1e-6
    opts = Options(memory_budget=BUDGET)
    acc = opts.replace(accumulate_float64=True)

    def points(m):
        return torch.rand(m, d, generator=gen, dtype=f64) * 2 - 1

    def one_pass(src, C, v):
        return nystrom_normal_matvec(src, kernel, C, v, dtype=f32, options=opts)

    def setup(C):
        return eigen_preconditioner(kernel, C, lam, rank_s,
                                    generator=torch.Generator().manual_seed(0))

    out = {}
    for M, m_rows in ((10_000, rows), (100_000, max(256, rows // 8))):
        C, X = points(M), points(m_rows).to(f32)
        src, v = ArraySource(X, torch.zeros(m_rows, dtype=f32)), torch.ones(M, 1, dtype=f64)
        one_pass(src, C, v)  # warm-up
        w, c, _ = _timed(one_pass, src, C, v, repeats=2)
        out[f"pass_row_{M}"] = (w / m_rows, c / m_rows, f"{m_rows} rows, per row")
    for M, k_rows in ((10_000, 10_000), (20_000, 20_000), (100_000, 2_000)):
        C, v = points(M).to(f32), torch.ones(M, 1, dtype=f64)
        K = KernelOperator(kernel, C[:k_rows], C, options=acc)
        w, c, _ = _timed(K.matmul, v, repeats=2)
        out[f"kmm_{M}"] = (w * M / k_rows, c * M / k_rows,
                           "measured" if k_rows == M else
                           f"{k_rows} rows measured, x {M // k_rows}")
    for M in (10_000, 100_000):
        if M > 10_000 and out["eig_setup_10000"][1] * M / 10_000 > setup_cap:
            w, c, _ = out["eig_setup_10000"]
            out[f"eig_setup_{M}"] = (w * M / 10_000, c * M / 10_000, "M s^2: x M / 10^4")
            w, c, _ = out["eig_apply_10000"]
            out[f"eig_apply_{M}"] = (w * M / 10_000, c * M / 10_000, "M s: x M / 10^4")
            continue
        w, c, P = _timed(setup, points(M))
        out[f"eig_setup_{M}"] = (w, c, f"measured, s = {rank_s}")
        w, c, _ = _timed(P.apply_inverse, torch.ones(M, 1, dtype=f64), repeats=5)
        out[f"eig_apply_{M}"] = (w, c, "measured")
        del P
    dense = KernelOperator(kernel, points(10_000), options=None).to_dense
    w, c, K = _timed(dense)
    out["kmm_dense_10000"] = (w, c, "measured")
    K.diagonal().add_(1e-3)  # SPD whatever the bandwidth (the time does not depend on it)
    w, c, L = _timed(torch.linalg.cholesky, K)
    out["chol_10000"] = (w, c, "measured")
    del K
    w, c, _ = _timed(_lower_gram, L)
    out["gram_10000"] = (w, c, "measured")
    def trsv(R):
        return torch.linalg.solve_triangular(L, R, upper=False)

    w, c, _ = _timed(trsv, torch.ones(10_000, 1, dtype=f64), repeats=5)
    out["trsv_10000"] = (w, c, "measured")
    return out


#: passes over the rows to 1 % of the best RMSE_f (docs/performance/many_centres.md, float32
#: rows, lambda = 1e-6): PCG 7-11 at n = 2e4 to 1e6 (M = 4000 to 2e4); eigen-CG with
#: s = 3000, the default rank on the streamed rows of n = 1e8 over up to 512 (M = 1e4) or 1024
#: (M = 1e5) processes, 14-25 at n = 2e4 and 2e5 (M = 4000 to 5e4, fewer at the larger M).
#: 50 doubles the most measured, for M = 1e5 (M / s = 33, not measured).
PCG_PASSES = 11
EIGEN_PASSES = (25, 50)
#: the rank s of the eigen-CG preconditioner modelled
EIGEN_RANK = 3000
#: triangular solves with an M x M factor in one PCG iteration (B beta and B^T u)
PCG_SOLVES = 4


def centre_costs(ing, M):
    """CPU seconds of the model's pieces at M = 10^4 or 10^5 (measured at 10^4; at 10^5 from
    the measured row rate, or extrapolated as stated in the notes)."""
    scale2, scale3 = (M / 10_000) ** 2, (M / 10_000) ** 3
    return {
        "per_row": ing[f"pass_row_{M}"][1],
        "kmm": ing[f"kmm_{M}"][1],
        "eig_setup": ing[f"eig_setup_{M}"][1],
        "eig_apply": ing[f"eig_apply_{M}"][1],
        # Falkon's setup: K_MM, two Cholesky factorisations and L^T L, as O(M^2) and O(M^3)
        "pcg_setup": (ing["kmm_dense_10000"][1] * scale2
                      + (2 * ing["chol_10000"][1] + ing["gram_10000"][1]) * scale3),
        "pcg_apply": PCG_SOLVES * ing["trsv_10000"][1] * scale2,
    }


def centres_fit_seconds(kind, p, n, M, passes, cost, alpha, bw):
    """Predicted fit time on p processes for one of the three models.

    "pcg": replicated O(M^3) setup, passes with one all-reduce and replicated triangular
    solves; "eigen_replicated": O(M s^2) setup, passes with every process computing all of
    K_MM v; "eigen_split": the same with K_MM v split over the processes (one more all-reduce
    of M float64 values per pass).
    """
    ar = allreduce_seconds(p, 8.0 * M, alpha, bw)
    stream = cost["per_row"] * n / p
    if kind == "pcg":
        return cost["pcg_setup"] + passes * (stream + ar + cost["pcg_apply"])
    kmm = cost["kmm"] if kind == "eigen_replicated" else cost["kmm"] / p
    n_ar = 1 if kind == "eigen_replicated" else 2
    return cost["eig_setup"] + passes * (stream + n_ar * ar + kmm + cost["eig_apply"])


def first_win(kind, n, M, passes, cost, alpha, bw, max_log2=20):
    """'; faster than PCG from p = ...' (powers of two up to 2^max_log2), or that it is not."""
    for e in range(max_log2 + 1):
        p = 2 ** e
        if (centres_fit_seconds(kind, p, n, M, passes, cost, alpha, bw)
                < centres_fit_seconds("pcg", p, n, M, PCG_PASSES, cost, alpha, bw)):
            return f"; faster than PCG from p = {p}"
    return f"; slower than PCG up to p = 2^{max_log2}"


def print_many_centres(ing, alpha, bw, n=100_000_000):
    """The ingredients table and, for M = 10^4 and 10^5, the three models' predictions."""
    print(f"\nmany-centres ingredients, one thread, d={CENTRES_D}, Gaussian, seconds "
          "(wall, CPU); CPU time is used below:")
    print_table(["ingredient", "wall s", "CPU s", "how"],
                [[k, f"{w:.3g}", f"{c:.3g}", note] for k, (w, c, note) in ing.items()])
    procs = [2 ** k for k in range(0, 12)]
    for M in (10_000, 100_000):
        cost = centre_costs(ing, M)
        print(f"\npredicted fit, n={n:.0e}, M={M}, t=1, 10 GbE (assumed {alpha * 1e6:.0f} us, "
              f"{bw / 1e9:.1f} GB/s), CPU seconds; PCG {PCG_PASSES} passes, eigen-CG "
              f"{' or '.join(map(str, EIGEN_PASSES))} passes")
        print(f"  setup: PCG {cost['pcg_setup']:.4g} s"
              + (" (3 M x M float64 matrices: 240 GB, does not fit)" if M >= 100_000 else "")
              + f", eigen-CG {cost['eig_setup']:.4g} s; per pass: K_MM v {cost['kmm']:.4g} s, "
              f"PCG triangular solves {cost['pcg_apply']:.3g} s, eigen apply "
              f"{cost['eig_apply']:.3g} s, stream {cost['per_row'] * n:.4g} s on one process")
        models = [("PCG", "pcg", PCG_PASSES)]
        for k in EIGEN_PASSES:
            models += [(f"eig-rep {k}", "eigen_replicated", k),
                       (f"eig-split {k}", "eigen_split", k)]
        one = {name: centres_fit_seconds(kind, 1, n, M, k, cost, alpha, bw)
               for name, kind, k in models}
        rows = []
        for p in procs:
            cells = [p]
            for name, kind, k in models:
                total = centres_fit_seconds(kind, p, n, M, k, cost, alpha, bw)
                cells.append(f"{total:.4g} s ({one[name] / total / p:.0%})")
            rows.append(cells)
        print_table(["p"] + [m[0] for m in models], rows)
        for name, kind, k in models:
            eff = [one[name] / centres_fit_seconds(kind, p, n, M, k, cost, alpha, bw) / p
                   for p in procs]
            stop = next((p for p, e in zip(procs, eff, strict=True) if e < 0.5), None)
            floor = centres_fit_seconds(kind, 1 << 30, n, M, k, cost, alpha, bw)
            wins = "" if kind == "pcg" else first_win(kind, n, M, k, cost, alpha, bw)
            print(f"  {name}: efficiency below 50% from p = {stop}; time for p -> inf "
                  f"(replicated parts and latency) {floor:.4g} s{wins}")


# ---- driver ------------------------------------------------------------------------------------
def make_data(n, d, seed=0):
    directory = tempfile.mkdtemp(prefix="kf_dist_bench_")
    rng = np.random.RandomState(seed)
    X = np.lib.format.open_memmap(os.path.join(directory, "X.npy"), "w+", np.float64, (n, d))
    y = np.lib.format.open_memmap(os.path.join(directory, "y.npy"), "w+", np.float64, (n,))
    for s in range(0, n, 1 << 18):
        e = min(n, s + (1 << 18))
        X[s:e] = rng.uniform(-1, 1, (e - s, d))
        y[s:e] = np.sin(3 * X[s:e, 0]) * np.cos(2 * X[s:e, 1]) + 0.1 * rng.randn(e - s)
    X.flush()
    y.flush()
    del X, y
    return directory, {"X": os.path.join(directory, "X.npy"), "y": os.path.join(directory, "y.npy")}


def fit_link(sizes, times):
    """Latency alpha (s): the smallest message's time; bandwidth B (bytes/s): from the largest."""
    alpha = times[min(sizes)]
    big = max(sizes)
    return alpha, 8.0 * big / max(times[big] - alpha, 1e-12)


def allreduce_seconds(p, nbytes, alpha, bw):
    """Halving-doubling all-reduce: 2 log2(p) latencies and 2 (p - 1) / p of the bytes."""
    if p == 1:
        return 0.0
    return 2 * np.log2(p) * alpha + 2 * (p - 1) / p * nbytes / bw


def predicted(p, n, M, t, iters, per_row, precond, alpha, bw):
    """Fit time on p processes: replicated setup + (iters + 2) passes of n/p rows + all-reduces.

    Returns (total seconds, compute seconds per pass, communication seconds per pass).
    """
    compute = per_row * n / p
    comm = allreduce_seconds(p, 8.0 * M * t, alpha, bw)
    return precond + (iters + 2) * (compute + comm), compute, comm


def print_table(header, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(str(h).rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)))


def measure_allreduce():
    """Gloo all-reduce times on 2 local processes, printed; returns (latency s, bytes/s)."""
    sizes = [1, 100, 1000, 10_000, 100_000, 1_000_000]
    ar = spawn(allreduce_worker, 2, args=(sizes,), timeout=120)[0]
    lat, bw = fit_link(sizes, ar)
    print("\nGloo all-reduce on localhost, 2 processes (median):")
    print_table(["float64 elements", "bytes", "seconds"],
                [[s, 8 * s, f"{ar[s]:.2e}"] for s in sizes])
    print(f"latency {lat * 1e6:.0f} us (1 element), bandwidth {bw / 1e9:.2f} GB/s "
          f"(8 MB message)")
    return lat, bw


def many_centres_model(args):
    """Measure the many-centres ingredients in one 1-thread process and print the models."""
    ing = spawn(centres_worker, 1, args=(CENTRES_D, 1.0, args.centre_rows, EIGEN_RANK, 60.0),
                timeout=900, threads=1)[0]
    print_many_centres(ing, 50e-6, 1.1e9)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 10^5 smoke run")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--centers", type=int, default=None)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--cap", type=float, default=300.0,
                        help="seconds after which one configuration's run is stopped")
    parser.add_argument("--skip-threads", action="store_true",
                        help="leave out 1 process x 2 threads (slow on a busy machine)")
    parser.add_argument("--model-only", action="store_true",
                        help="only the scaling model's ingredients (all-reduce, many centres)")
    parser.add_argument("--centre-rows", type=int, default=4096,
                        help="rows of the block timed for one pass at M = 10^4 (1/8 at 10^5)")
    args = parser.parse_args()
    if args.model_only:
        spawn(barrier, 1, timeout=60)
        lat, bw = measure_allreduce()
        many_centres_model(args)
        return
    n = args.n or (100_000 if args.quick else 1_000_000)
    M = args.centers or (300 if args.quick else 500)
    sigma, alpha = 1.0, 1e-3
    dtype = torch.float32 if args.dtype == "float32" else torch.float64
    print(f"Nystrom KRR fit: n={n}, d={args.d}, M={M}, {args.iters} CG iterations, "
          f"{args.dtype} kernel tiles, {os.cpu_count()} CPUs, torch {torch.__version__}")
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            autogroup = f.read().strip() == "1"
    except OSError:
        autogroup = False
    if autogroup:
        print("note: the kernel shares CPU time per session (sched_autogroup): on a busy machine "
              "all processes of this run share one session's share")
    directory, paths = make_data(n, args.d)
    configs = [("1 process x 1 thread", 1, 1), ("1 process x 2 threads", 1, 2),
               ("2 processes x 1 thread", 2, 1)]
    if args.skip_threads:
        configs.pop(1)
    try:
        spawn(barrier, 1, timeout=60)  # start the process server outside the timings
        results = {c[0]: [] for c in configs}
        cpu_max = {c[0]: [float("nan")] for c in configs}  # CPU s of the busiest process
        capped: set = set()
        coefs, loads = {}, []
        for rep in range(args.repeats):
            for name, procs, threads in configs:
                loads.append(os.getloadavg()[0])
                try:
                    out = spawn(fit_worker, procs, args=(paths, M, sigma, alpha, args.iters,
                                                          args.dtype), timeout=600,
                                threads=threads, max_seconds=args.cap)
                except DistributedError:  # over the cap: record it as a lower bound
                    results[name].append(float(args.cap))
                    capped.add(name)
                    print(f"  repeat {rep + 1}: {name:24s} stopped after {args.cap:.0f} s "
                          f"(load {loads[-1]:.1f})", flush=True)
                    continue
                results[name].append(max(o["seconds"] for o in out))
                coefs[name] = out[0]["coef"]
                cpu = sum(o["cpu"] for o in out)
                cpu_max[name].append(max(o["cpu"] for o in out))
                print(f"  repeat {rep + 1}: {name:24s} {results[name][-1]:8.2f} s, CPU time "
                      f"{cpu:7.2f} s in all processes (load {loads[-1]:.1f})", flush=True)
        base = min(results[configs[0][0]])
        two_threads = min(results.get("1 process x 2 threads", [float("nan")]))
        rows = []
        for name, _, _ in configs:
            best = min(results[name])
            diff = (np.abs(coefs[name] - coefs[configs[0][0]]).max()
                    / np.abs(coefs[configs[0][0]]).max()) if name in coefs else float("nan")
            flag = ">" if name in capped and best >= args.cap else ""
            cpu_best = min((c for c in cpu_max[name] if c == c), default=float("nan"))
            rows.append([name, f"{flag}{best:.2f}", f"{base / best:.2f}x",
                         f"{two_threads / best:.2f}x", f"{cpu_best:.2f}", f"{diff:.1e}"])
        print()
        print_table(["configuration", "fit s (best)", "vs 1x1", "vs 1x2threads",
                     "CPU s busiest process", "coef rel. diff"], rows)
        print(f"load average (1 min) during the runs: min {min(loads):.1f}, "
              f"max {max(loads):.1f} on {os.cpu_count()} CPUs")

        # ---- scaling model ingredients ----
        lat, bw = measure_allreduce()
        comp = spawn(compute_worker, 1, args=(paths, M, sigma, min(n, 65536), dtype),
                     timeout=300, threads=1)[0]
        print(f"compute: {comp['per_row'] * 1e6:.2f} us per row per pass (M={M}, d={args.d}, "
              f"1 thread); preconditioner build {comp['precond']:.3f} s (every process)")
        networks = [("localhost (measured)", lat, bw),
                    ("10 GbE (assumed 50 us, 1.1 GB/s)", 50e-6, 1.1e9),
                    ("100 Gb/s IB (assumed 5 us, 10 GB/s)", 5e-6, 10e9)]
        procs = [2 ** k for k in range(0, 15)]
        for n_model, M_model in ((n, M),):
            pre, per_row = comp["precond"], comp["per_row"]
            print(f"\npredicted fit time, n={n_model:.0e}, M={M_model}, {args.iters} iterations "
                  f"(setup {pre:.2f} s repeated on every process, t=1 output):")
            one = predicted(1, n_model, M_model, 1, args.iters, per_row, pre, lat, bw)[0]
            rows = []
            for p in (1, 2, 8, 32, 128, 512, 2048):
                cells = [p]
                for _, a, b in networks:
                    total, compute, comm = predicted(p, n_model, M_model, 1, args.iters, per_row,
                                                     pre, a, b)
                    cells.append(f"{total:.2f} s, eff. {one / total / p:.0%}, "
                                 f"comm/compute {comm / compute:.2g}")
                rows.append(cells)
            print_table(["processes"] + [net[0] for net in networks], rows)
            for name, a, b in networks:
                eff = [one / predicted(p, n_model, M_model, 1, args.iters, per_row, pre, a, b)[0]
                       / p for p in procs]
                stop = next((p for p, e in zip(procs, eff, strict=True) if e < 0.5), None)
                cross = next((p for p in procs if allreduce_seconds(p, 8.0 * M_model, a, b)
                              > per_row * n_model / p), None)
                print(f"  {name}: efficiency below 50% from p = {stop}; all-reduce exceeds "
                      f"compute per pass from p = {cross}")
        many_centres_model(args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
