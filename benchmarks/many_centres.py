"""Many centres: Nyström eigen-CG (no M x M matrix) against Falkon-class PCG and the direct solve.

Data as in ``benchmarks/nystrom_vs_falkon.py``: X ~ N(0, I_9), f = sin(2 u1) + 0.5 tanh(2 u2)
+ 0.25 u1 u2 (u the projections on two fixed orthonormal directions), y = f + 0.1 N(0, 1),
float32 rows, Gaussian kernel sigma = 3, lambda = 1e-6 on Falkon's scale (alpha = n lambda),
RMSE against the noiseless f on 10 000 test points. The same uniform centres for every method.

Every method runs in its own process with one thread and records, after every pass, the test
RMSE_f and the time spent so far (the time of the RMSE evaluation itself excluded: the test
kernel matrix is built before the clock starts). Per M the script prints, for each method, the
time and the passes over the data (products with K_nM, the right-hand side and the Gram pass
included) until RMSE_f is within 1 % of the best RMSE_f any method reaches at that M, the
final RMSE_f, and the process's peak RSS.

Methods:

* ``eigen_cg``: :func:`kernelflow.solvers.nystrom_eigen_cg.nystrom_eigen_cg`, default rank
  s = min(M, 1000); ``eigen_cg-s=R``: rank R;
* ``pcg``: :func:`kernelflow.solvers.nystrom.nystrom_krr` with ``solver="cg"`` (Falkon's
  preconditioner, O(M^3) setup, O(M^2) memory);
* ``direct``: the same with ``solver="direct"`` (the exact Nyström solution, one Gram pass);
* ``falkon``: ``falkon.Falkon`` (CPU, 5, 10 and 20 iterations as separate fits) when
  ``import falkon`` works; skipped with a note otherwise.

Usage::

    python benchmarks/many_centres.py --n 20000 --M 1000 2000
    python benchmarks/many_centres.py --n 50000 --M 4000 --methods eigen_cg pcg
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)
LAMBDA, SIGMA, N_TEST = 1e-6, 3.0, 10_000

sys.path.insert(0, os.path.dirname(HERE))
from _common import centres  # noqa: E402
from _common import smooth_data as data  # noqa: E402


def _count_passes(counter):
    """Wrap every function that reads all rows (or the stored K_nM) once; counts its calls."""
    import kernelflow.solvers.nystrom as nys
    import kernelflow.solvers.nystrom_eigen_cg as ecg

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            counter["passes"] += 1
            return real(*args, **kwargs)

        setattr(module, name, wrapper)

    for name in ("nystrom_normal_matvec", "nystrom_rhs", "_gram_pass", "_gradient_residual",
                 "nystrom_kernel_cache"):
        counted(nys, name)
    for name in ("nystrom_normal_matvec", "nystrom_rhs", "nystrom_kernel_cache"):
        if hasattr(ecg, name):  # names eigen-CG imports itself (the cache comes through nys)
            counted(ecg, name)


def worker(spec):
    import torch

    torch.set_num_threads(1)
    from kernelflow.kernels import Gaussian
    from kernelflow.sources import ArraySource

    n, M, method = spec["n"], spec["M"], spec["method"]
    Xtr, ytr, Xte, fte = data(n)
    C = centres(Xtr, M)
    trace = []  # (seconds, passes, rmse_f)
    if method == "falkon":
        import falkon
        from falkon.center_selection import FixedSelector

        Xt, yt, Ct = (torch.from_numpy(a) for a in (Xtr, ytr.reshape(-1, 1), C))
        for iters in (5, 10, 20):
            opt = falkon.FalkonOptions(use_cpu=True, keops_active="no", max_cpu_mem=5e7)
            model = falkon.Falkon(kernel=falkon.kernels.GaussianKernel(SIGMA), penalty=LAMBDA,
                                  M=M, maxiter=iters, options=opt,
                                  center_selection=FixedSelector(Ct))
            t0 = time.perf_counter()
            model.fit(Xt, yt)
            fit_s = time.perf_counter() - t0
            pred = model.predict(torch.from_numpy(Xte)).numpy().ravel().astype(np.float64)
            trace.append((fit_s, iters + 1, float(np.sqrt(np.mean((pred - fte) ** 2)))))
    else:
        import kernelflow.solvers.nystrom as nys
        import kernelflow.solvers.nystrom_eigen_cg as ecg

        counter = {"passes": 0}
        _count_passes(counter)
        kernel = Gaussian(SIGMA)
        Ct = torch.from_numpy(C).to(torch.float64)
        K_te = kernel(torch.from_numpy(Xte).to(torch.float64), Ct)  # outside the clock
        mean = float(ytr.mean())
        src = ArraySource(torch.from_numpy(Xtr), torch.from_numpy(ytr - mean))
        paused = {"s": 0.0}
        t0 = time.perf_counter()

        def rmse(coef):
            pred = (K_te @ coef.to(torch.float64)).reshape(-1).numpy() + mean
            return float(np.sqrt(np.mean((pred - fte) ** 2)))

        def callback(k, coef):
            t = time.perf_counter()
            trace.append((t - t0 - paused["s"], counter["passes"], rmse(coef)))
            paused["s"] += time.perf_counter() - t
            return False

        alpha = n * LAMBDA
        if method.startswith("eigen_cg"):
            rank = int(method.split("=")[1]) if "=" in method else None
            sol = ecg.nystrom_eigen_cg(src, kernel, Ct, alpha, rank=rank, dtype=torch.float32,
                                       max_iter=spec["max_iter"], tol=1e-9, callback=callback)
        elif method == "pcg":
            sol = nys.nystrom_krr(src, kernel, Ct, alpha, solver="cg", dtype=torch.float32,
                                  max_iter=spec["max_iter"], tol=1e-9, callback=callback)
        else:
            sol = nys.nystrom_krr(src, kernel, Ct, alpha, solver="direct", dtype=torch.float32)
            callback(1, sol.coef)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps({"trace": trace, "peak_rss_gb": rss}))


def run(spec, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        proc = subprocess.run([sys.executable, HERE, "--worker", json.dumps(spec)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout {timeout}s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": " ".join((proc.stderr or proc.stdout).strip().splitlines()[-1:])}


def falkon_available():
    return subprocess.run([sys.executable, "-c", "import falkon"],
                          capture_output=True).returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--M", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--methods", nargs="+",
                    default=["eigen_cg", "eigen_cg-s=250", "pcg", "direct", "falkon"])
    ap.add_argument("--max-iter", type=int, default=200)
    ap.add_argument("--timeout", type=int, default=1200)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    methods = list(args.methods)
    if "falkon" in methods and not falkon_available():
        methods.remove("falkon")
        print("falkon: not importable here, skipped")
    print(f"n = {args.n}, float32 rows, sigma = {SIGMA}, lambda = {LAMBDA}, one thread")
    for M in args.M:
        results = {m: run({"n": args.n, "M": M, "method": m, "max_iter": args.max_iter},
                          args.timeout) for m in methods}
        best = min((r for res in results.values() if "trace" in res for *_, r in res["trace"]),
                   default=float("nan"))
        print(f"\nM = {M}: best RMSE_f {best:.5f}; target {1.01 * best:.5f}")
        print(f"{'method':16s} {'time to 1%':>10s} {'passes':>6s} {'final RMSE_f':>12s} "
              f"{'total s':>8s} {'total passes':>12s} {'peak RSS GB':>11s}")
        for m, res in results.items():
            if "error" in res:
                print(f"{m:16s} error: {res['error']}")
                continue
            tr = res["trace"]
            hit = next(((s, p) for s, p, r in tr if r <= 1.01 * best), None)
            reach = (f"{hit[0]:10.2f} {hit[1]:6d}" if hit else f"{'never':>10s} {'-':>6s}")
            print(f"{m:16s} {reach} {tr[-1][2]:12.5f} {tr[-1][0]:8.2f} {tr[-1][1]:12d} "
                  f"{res['peak_rss_gb']:11.2f}")


if __name__ == "__main__":
    main()
