"""Many centres: Nyström eigen-CG (no M x M matrix) against Falkon-class PCG and the direct solve.

Data as in ``benchmarks/nystrom_vs_falkon.py``: X ~ N(0, I_9), f = sin(2 u1) + 0.5 tanh(2 u2)
+ 0.25 u1 u2 (u the projections on two fixed orthonormal directions), y = f + 0.1 N(0, 1),
float32 rows, Gaussian kernel sigma = 3, lambda = 1e-6 on Falkon's scale (alpha = n lambda),
RMSE against the noiseless f on 10 000 test points. The same uniform centres for every method.

Every method runs in its own process with one thread and records, after every pass, the test
RMSE_f and the time spent so far (the time of the RMSE evaluation itself excluded; it builds
the test kernel 500 rows at a time, so that the peak RSS is the solver's, not a 10 000 x M
test matrix's). Per M the script prints, for each method, the
time and the passes over the data (products with K_nM, the right-hand side and the Gram pass
included) until RMSE_f is within 1 % of the best RMSE_f any method reaches at that M, the
final RMSE_f, and the process's peak RSS.

Methods:

* ``eigen_cg``: :func:`kernelflow.solvers.nystrom_eigen_cg.nystrom_eigen_cg`, default rank
  (:func:`~kernelflow.solvers.nystrom_eigen_cg.default_rank`: min(M, 2000), or 3000 where
  the rows make its setup pay); ``eigen_cg-s=R``: rank R;
* ``pcg``: :func:`kernelflow.solvers.nystrom.nystrom_krr` with ``solver="cg"`` (Falkon's
  preconditioner, O(M^3) setup, O(M^2) memory);
* ``direct``: the same with ``solver="direct"`` (the exact Nyström solution, one Gram pass);
* ``falkon``: ``falkon.Falkon`` with its tuned CPU options (no KeOps, ``max_cpu_mem=5e7``) on
  the float32 rows, one fit of ``max_iter`` CG iterations traced by its own validation
  callback (its training time excludes the test error); ``falkon-f64``: the same on float64
  rows (Falkon's accurate mode). Falkon's CPU build lives in its own environment: name its
  interpreter with ``--falkon-python``; skipped with a note when ``import falkon`` fails there.

* ``estimator-cg``, ``estimator-eigen_cg``, ``estimator-auto``: ``NystromKernelRidge`` with
  that ``solver`` and its own stopping rule (default ``tol``; ``max_iter`` as given)
  (``estimator-eigen_cg-s=R``, ``estimator-auto-s=R``: with ``precond_rank=R``), one point:
  the fit's time, its iterations (in the passes column) and RMSE_f; the JSON line also has
  ``solver_`` and ``converged``.

Workers print every trace point as they go: a run stopped by ``--timeout`` keeps the points it
reached, and the table shows ``> timeout`` when it had not reached 1 % of the best by then.

``--out results.jsonl`` appends one JSON line per (n, M, method) as soon as its process ends
(trace, peak RSS, max_iter) and skips the runs already there, so that a long comparison resumes
after an interruption; ``--summary`` prints the tables of a results file without running
anything; ``--plot time_vs_M.png`` draws, per n, the time to reach 1 % of the best RMSE_f
against M on log-log axes, one line per method (runs that never reach it are marked at the
top of the axis).

Usage::

    python benchmarks/many_centres.py --n 20000 --M 1000 2000
    python benchmarks/many_centres.py --n 50000 --M 4000 --methods eigen_cg pcg
    python benchmarks/many_centres.py --n 200000 --M 5000 20000 50000 \
        --methods eigen_cg eigen_cg-s=2000 pcg --out mc.jsonl --plot mc.png
    python benchmarks/many_centres.py --summary --out mc.jsonl --plot mc.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)
LAMBDA, SIGMA, N_TEST = 1e-6, 3.0, 10_000

sys.path.insert(0, os.path.dirname(HERE))
from _common import centres, peak_rss_mb  # noqa: E402
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
    n, M, method = spec["n"], spec["M"], spec["method"]
    Xtr, ytr, Xte, fte = data(n)
    C = centres(Xtr, M)
    trace = []  # (seconds, passes, rmse_f)
    extra = {}
    if method.startswith("falkon"):
        _falkon_fit(spec, Xtr, ytr, Xte, fte, C, trace)
    elif method.startswith("estimator-"):
        extra = _estimator_fit(spec, Xtr, ytr, Xte, fte, C, trace)
    else:
        import kernelflow.solvers.nystrom as nys
        import kernelflow.solvers.nystrom_eigen_cg as ecg
        from kernelflow.kernels import Gaussian
        from kernelflow.sources import ArraySource

        counter = {"passes": 0}
        _count_passes(counter)
        kernel = Gaussian(SIGMA)
        Ct = torch.from_numpy(C).to(torch.float64)
        Xs = torch.from_numpy(Xte).to(torch.float64)
        mean = float(ytr.mean())
        src = ArraySource(torch.from_numpy(Xtr), torch.from_numpy(ytr - mean))
        paused = {"s": 0.0}
        t0 = time.perf_counter()

        def rmse(coef):  # 500 test rows at a time: no 10 000 x M matrix in the peak RSS
            c = coef.to(torch.float64).reshape(-1, 1)
            pred = torch.cat([kernel(Xs[i:i + 500], Ct) @ c for i in range(0, len(Xs), 500)])
            return float(np.sqrt(np.mean((pred.reshape(-1).numpy() + mean - fte) ** 2)))

        def callback(k, coef):
            t = time.perf_counter()
            _point(trace, t - t0 - paused["s"], counter["passes"], rmse(coef))
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
    print("RESULT " + json.dumps({"trace": trace, "peak_rss_gb": peak_rss_mb() / 1024, **extra}))


def _estimator_fit(spec, Xtr, ytr, Xte, fte, C, trace):
    """``NystromKernelRidge(solver=...)`` with its own stopping rule (default ``tol``,
    ``max_iter`` = the benchmark's), the same centres and penalty: one trace point (fit time,
    iterations, RMSE_f) and what the estimator reports."""
    from kernelflow.estimators import NystromKernelRidge

    n = spec["n"]
    solver, _, rank = spec["method"].split("-", 1)[1].partition("-s=")
    est = NystromKernelRidge(n_components=spec["M"], landmarks=C, alpha=n * LAMBDA, sigma=SIGMA,
                             solver=solver, precond_rank=int(rank) if rank else None,
                             max_iter=spec["max_iter"])
    t0 = time.perf_counter()
    est.fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    pred = np.asarray(est.predict(Xte), dtype=np.float64)
    _point(trace, fit_s, int(est.n_iter_), float(np.sqrt(np.mean((pred - fte) ** 2))))
    return {"solver_": est.solver_, "converged": bool(est.converged_)}


def _point(trace, seconds, passes, rmse_f):
    """Record one trace point and print it at once, with the peak RSS so far, so that a run
    stopped by ``--timeout`` still reports how far it got."""
    trace.append((seconds, passes, rmse_f))
    print("POINT " + json.dumps([seconds, passes, rmse_f, peak_rss_mb() / 1024]), flush=True)


def _falkon_fit(spec, Xtr, ytr, Xte, fte, C, trace):
    """One Falkon fit with its tuned CPU options, ``maxiter = max_iter``; its own per-iteration
    callback gives the training time (preconditioner included, the test error excluded) and the
    test RMSE_f after every CG iteration (one pass each, after the right-hand side's pass).
    ``falkon-f64`` hands Falkon float64 rows (its accurate mode), ``falkon`` the float32 rows."""
    import falkon
    import torch
    from falkon.center_selection import FixedSelector

    dt = torch.float64 if spec["method"] == "falkon-f64" else torch.float32
    Xt, yt, Ct, Xs, fs = (torch.from_numpy(a).to(dt)
                          for a in (Xtr, ytr.reshape(-1, 1), C, Xte, fte.reshape(-1, 1)))

    def rmse_f(y_true, y_pred):
        err = y_pred.to(torch.float64) - y_true.to(torch.float64)
        return float(torch.sqrt(torch.mean(err ** 2))), "rmse_f"

    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no", max_cpu_mem=5e7)
    model = falkon.Falkon(kernel=falkon.kernels.GaussianKernel(SIGMA), penalty=LAMBDA, M=spec["M"],
                          maxiter=spec["max_iter"], options=opt, center_selection=FixedSelector(Ct),
                          error_fn=rmse_f, error_every=1)
    real = model._get_callback_fn

    def traced(*args, **kwargs):
        cback = real(*args, **kwargs)

        def wrapper(it, beta, train_time):
            cback(it, beta, train_time)
            _point(trace, model.fit_times_[-1], it + 1, model.val_errors_[-1])

        return wrapper

    model._get_callback_fn = traced
    model.fit(Xt, yt, Xs, fs)


def _partial(out):
    """The trace points a worker printed before it was stopped, and its peak RSS by then."""
    text = out.decode() if isinstance(out, bytes) else (out or "")
    pts = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("POINT ")]
    return {"trace": [p[:3] for p in pts], "peak_rss_gb": max((p[3] for p in pts), default=None)}


def run(spec, timeout, python=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [python or sys.executable, "-P", HERE, "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timeout {timeout}s", "timeout_s": timeout, **_partial(exc.stdout)}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": " ".join((proc.stderr or proc.stdout).strip().splitlines()[-1:])}


def falkon_available(python):
    return subprocess.run([python, "-P", "-c", "import falkon"],
                          capture_output=True).returncode == 0


def _load(path):
    """Rows of a results file (``[]`` when it does not exist yet)."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _reach(trace, target):
    """(seconds, passes) of the first point of ``trace`` with RMSE_f <= target, or None."""
    return next(((s, p) for s, p, r in trace if r <= target), None)


def table(rows):
    """Print, per (n, M), each method's time and passes to 1 % of the best RMSE_f reached by
    any method at that (n, M), its final RMSE_f, totals and peak RSS; return the points of the
    plot ``{n: {method: [(M, seconds or None)]}}``."""
    points = {}
    for n, M in sorted({(r["n"], r["M"]) for r in rows}):
        group = [r for r in rows if r["n"] == n and r["M"] == M]
        best = min((x[2] for r in group for x in r.get("trace") or []),
                   default=float("nan"))
        print(f"\nn = {n}, M = {M}: best RMSE_f {best:.5f}; target {1.01 * best:.5f}")
        print(f"{'method':16s} {'time to 1%':>10s} {'passes':>6s} {'final RMSE_f':>12s} "
              f"{'total s':>8s} {'total passes':>12s} {'peak RSS GB':>11s}")
        for r in group:
            m = r["method"]
            tr = r.get("trace") or []
            hit = _reach(tr, 1.01 * best)
            points.setdefault(n, {}).setdefault(m, []).append((M, hit[0] if hit else None))
            if not tr:
                print(f"{m:16s} {r.get('error', 'no trace')}")
                continue
            if hit:
                reach = f"{hit[0]:10.2f} {hit[1]:6d}"
            elif "timeout_s" in r:  # stopped before it got there: a lower bound
                reach = f"{'> ' + str(r['timeout_s']):>10s} {'-':>6s}"
            else:
                reach = f"{'never':>10s} {'-':>6s}"
            rss = r.get("peak_rss_gb")
            print(f"{m:16s} {reach} {tr[-1][2]:12.5f} {tr[-1][0]:8.2f} {tr[-1][1]:12d} "
                  f"{float('nan') if rss is None else rss:11.2f}"
                  + (f"  ({r['error']})" if "error" in r else ""))
    return points


def plot(points, path):
    """Log-log time to 1 % against M, one panel per n, one line per method; a method that did
    not reach the target at some M (never, or not before its timeout) is drawn as an open
    marker at the top of the panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(points), figsize=(5.5 * len(points), 4.5), squeeze=False)
    # one colour and marker per method across the panels
    names = sorted({m for by_method in points.values() for m in by_method})
    style = {m: (f"C{i % 10}", "osD^vPX*"[i % 8]) for i, m in enumerate(names)}
    for ax, (n, by_method) in zip(axes[0], sorted(points.items())):
        reached = [t for pts in by_method.values() for _, t in pts if t is not None]
        top = 2 * max(reached, default=1.0)
        for method, pts in sorted(by_method.items()):
            colour, mk = style[method]
            pts = sorted(pts)
            # NaN where the target was never reached: the line breaks there
            ax.plot([m for m, _ in pts], [float("nan") if t is None else t for _, t in pts],
                    marker=mk, color=colour, label=method)
            missed = [m for m, t in pts if t is None]
            if missed:
                ax.plot(missed, [top] * len(missed), marker=mk, ls="none", mfc="none",
                        color=colour)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("centres M")
        ax.set_ylabel("time to RMSE_f within 1 % of the best (s, one thread)")
        ax.set_title(f"n = {n} (open markers: not reached)", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot written to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--M", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--methods", nargs="+",
                    default=["eigen_cg", "eigen_cg-s=250", "pcg", "direct", "falkon"])
    ap.add_argument("--max-iter", type=int, default=200)
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--out", help="JSONL results file: appended to, and runs in it skipped")
    ap.add_argument("--summary", action="store_true",
                    help="print the tables (and --plot) of --out without running anything")
    ap.add_argument("--plot", help="PNG path for the log-log plot of time against M")
    ap.add_argument("--falkon-python",
                    help="interpreter of an environment where falkon is installed (its CPU build "
                         "lives apart from kernelflow's); default: this one")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    rows = _load(args.out)
    if not args.summary:
        methods = list(args.methods)
        falkon_python = args.falkon_python or sys.executable
        for m in [m for m in methods if m.startswith("falkon")]:
            if not falkon_available(falkon_python):
                methods.remove(m)
                print(f"{m}: falkon not importable by {falkon_python}, skipped")
        print(f"n = {args.n}, float32 rows, sigma = {SIGMA}, lambda = {LAMBDA}, one thread")
        done = {(r["n"], r["M"], r["method"]) for r in rows}
        for M in args.M:
            for m in methods:
                if (args.n, M, m) in done:
                    continue
                res = {"n": args.n, "M": M, "method": m, "max_iter": args.max_iter,
                       **run({"n": args.n, "M": M, "method": m, "max_iter": args.max_iter},
                             args.timeout, falkon_python if m.startswith("falkon") else None)}
                rows.append(res)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(res) + "\n")
        wanted = {(args.n, M) for M in args.M}
        rows = [r for r in rows if (r["n"], r["M"]) in wanted and r["method"] in methods]
    points = table(rows)
    if args.plot and points:
        plot(points, args.plot)


if __name__ == "__main__":
    main()
