"""Nyström kernel ridge side by side: kernelflow defaults vs Falkon vs scikit-learn.

Data: X ~ N(0, I_9), f = sin(2 u1) + 0.5 tanh(2 u2) + 0.25 u1 u2 with u the projections on two
fixed orthonormal directions, y = f + 0.1 N(0, 1); Gaussian kernel sigma = 3; penalty
lambda = 1e-6 on Falkon's scale (kernelflow and scikit-learn: alpha = n lambda, since kernelflow
solves (K_nM^T K_nM + alpha K_MM) a = K_nM^T y, Falkon (K_nM^T K_nM + n lambda K_MM) a = ...).
Every method runs in its own process on the same rows and the same centres (uniform, seeded),
and is scored by RMSE against f on 10 000 test points.

Methods:

* ``kernelflow``: ``NystromKernelRidge`` with only ``n_components``, ``alpha``, ``sigma`` and
  the centres set (defaults otherwise); the ``streamed`` configurations turn the kernel cache
  off (``nystrom_kernel_cache`` returns None in the worker), so nothing of K_nM is stored and
  every pass recomputes all of it. The worker prints the number of stored rows (0 there).
* ``kernelflow-direct``: the same with ``solver="direct"`` (the exact Nyström solution; skipped
  where M > 3000); ``kernelflow-cg``: the same with ``solver="cg"``.
* ``falkon``: ``falkon.Falkon`` with ``FalkonOptions(use_cpu=True, keops_active="no",
  max_cpu_mem=5e7)``, 20 iterations, ``FixedSelector`` on the same centres; run only when
  ``import falkon`` works.
* ``sklearn``: ``Nystroem`` (same centres) + ``Ridge(alpha)``; skipped when its n x M float64
  feature matrix exceeds ``--sklearn-max-gb``.

Methods run interleaved (each method once, then each again, ``--repeats`` times), and the best
time of each is kept, so that load from other jobs hits every method alike. Prints, per
configuration, fit time (wall clock and the process's CPU time, the figure to read on a loaded
machine), time ratio to the baseline (Falkon when available, else
scikit-learn; ratio = baseline time / method time, > 1 means faster than the baseline), RMSE
against f, CG iterations / solver, and peak RSS.

Usage::

    python benchmarks/nystrom_vs_falkon.py --quick          # n = 20 000, a few minutes
    python benchmarks/nystrom_vs_falkon.py --small-penalty  # alpha = 1e-6, 500 centres
    python benchmarks/nystrom_vs_falkon.py --streamed-pass  # one streamed float32 pass
    python benchmarks/nystrom_vs_falkon.py --crossover      # CG vs direct, n = 20 000
    python benchmarks/nystrom_vs_falkon.py --conditioning   # sigma = 10 against a reference
    python benchmarks/nystrom_vs_falkon.py --only "n=2e5 M=1000" --repeats 2
    python benchmarks/nystrom_vs_falkon.py                  # the full table (hours on 2 cores)
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

# (name, n, M, dtype, streamed)
CONFIGS = [
    ("n=2e5 M=1000 f32", 200_000, 1000, "float32", False),
    ("n=2e5 M=5000 f32", 200_000, 5000, "float32", False),
    ("n=1e6 M=1000 f32", 1_000_000, 1000, "float32", False),
    ("n=2e5 M=5000 streamed f64", 200_000, 5000, "float64", True),
    ("n=1e6 M=1000 streamed f64", 1_000_000, 1000, "float64", True),
    ("n=1e6 M=5000 streamed f32", 1_000_000, 5000, "float32", True),
]
QUICK = [
    ("n=2e4 M=500 f32", 20_000, 500, "float32", False),
    ("n=2e4 M=1000 f32", 20_000, 1000, "float32", False),
    ("n=2e4 M=1000 streamed f64", 20_000, 1000, "float64", True),
    ("n=2e4 M=2000 f64", 20_000, 2000, "float64", False),
]
LAMBDA, SIGMA, N_TEST = 1e-6, 3.0, 10_000

sys.path.insert(0, os.path.dirname(HERE))
from _common import centres  # noqa: E402
from _common import smooth_data as data  # noqa: E402


def worker(spec):
    import torch

    torch.set_num_threads(spec["threads"])
    n, M, dtype, streamed = spec["n"], spec["M"], spec["dtype"], spec["streamed"]
    Xtr, ytr, Xte, fte = data(n, dtype)
    C = centres(Xtr, M)
    extra = {}
    t0 = time.perf_counter()
    c0 = time.process_time()
    if spec["method"].startswith("kernelflow"):
        import kernelflow.solvers.nystrom as nys
        from kernelflow.estimators.nystrom_ridge import NystromKernelRidge

        kw = {}
        stored = {"rows": 0}
        cache = nys.nystrom_kernel_cache

        def counted_cache(*args, **kwargs):  # counts the rows of K_nM kept in memory
            c = None if streamed else cache(*args, **kwargs)
            if c is not None:
                blocks = c if isinstance(c, list) else c.stored
                stored["rows"] += sum(b.X.shape[0] for _, b in blocks)
            return c

        nys.nystrom_kernel_cache = counted_cache
        if spec["method"] in ("kernelflow-direct", "kernelflow-cg"):
            kw["solver"] = spec["method"].split("-")[1]
        m = NystromKernelRidge(n_components=M, alpha=n * LAMBDA, sigma=SIGMA, landmarks=C,
                               **kw).fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
        pred = np.asarray(m.predict(Xte), np.float64)
        extra = {"iters": m.n_iter_, "solver": m.solver_, "converged": m.converged_,
                 "stored_rows": stored["rows"]}
    elif spec["method"] == "falkon":
        import falkon
        from falkon.center_selection import FixedSelector

        Xt, yt, Ct = (torch.from_numpy(a) for a in (Xtr, ytr.reshape(-1, 1), C))
        opt = falkon.FalkonOptions(use_cpu=True, keops_active="no", max_cpu_mem=5e7)
        model = falkon.Falkon(kernel=falkon.kernels.GaussianKernel(SIGMA), penalty=LAMBDA,
                              M=M, maxiter=20, options=opt,
                              center_selection=FixedSelector(Ct))
        model.fit(Xt, yt)
        fit_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
        pred = model.predict(torch.from_numpy(Xte)).numpy().ravel().astype(np.float64)
        extra = {"iters": 20, "solver": "falkon"}
    else:  # sklearn
        from sklearn.kernel_approximation import Nystroem
        from sklearn.linear_model import Ridge

        ny = Nystroem(gamma=1.0 / (2 * SIGMA**2), n_components=M).fit(C)
        ridge = Ridge(alpha=n * LAMBDA).fit(ny.transform(Xtr), ytr)
        fit_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
        pred = ridge.predict(ny.transform(Xte)).astype(np.float64)
        extra = {"iters": "-", "solver": "Ridge"}
    rmse = float(np.sqrt(np.mean((pred - fte) ** 2)))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps({"fit_s": fit_s, "cpu_s": cpu_s, "rmse_f": rmse,
                                  "peak_rss_gb": rss, **extra}))


def run(spec, timeout):
    t = str(spec["threads"])
    env = dict(os.environ, OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, MKL_NUM_THREADS=t)
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
    out = subprocess.run([sys.executable, "-c", "import falkon"], capture_output=True)
    return out.returncode == 0


def small_penalty(threads):
    """The user-guide data at n = 20 000, 500 centres, alpha = 1e-6: defaults, CG, scikit-learn."""
    import torch
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge

    from kernelflow.estimators.nystrom_ridge import NystromKernelRidge

    torch.set_num_threads(threads)
    rng = np.random.RandomState(0)
    X = rng.uniform(-3, 3, size=(30_000, 3))
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] / 3 + 0.1 * rng.randn(30_000)
    Xtr, ytr, Xte, yte = X[:20_000], y[:20_000], X[20_000:], y[20_000:]
    print(f"{'fit':22s} {'solver':>7s} {'passes':>6s} {'converged':>9s} {'test R^2':>9s} "
          f"{'fit s':>6s}")
    C = None
    for solver in ("auto", "cg"):
        t0 = time.perf_counter()
        m = NystromKernelRidge(n_components=500, alpha=1e-6, sigma=1.5, random_state=0,
                               solver=solver).fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        C = m.centers_.numpy()
        print(f"{'kernelflow ' + solver:22s} {m.solver_:>7s} {m.n_iter_:6d} "
              f"{m.converged_!s:>9s} {m.score(Xte, yte):9.4f} {fit_s:6.2f}")
    t0 = time.perf_counter()
    ny = Nystroem(gamma=1.0 / (2 * 1.5**2), n_components=len(C)).fit(C)
    r = Ridge(alpha=1e-6).fit(ny.transform(Xtr), ytr)
    fit_s = time.perf_counter() - t0
    print(f"{'sklearn (same centres)':22s} {'Ridge':>7s} {'-':>6s} {'-':>9s} "
          f"{r.score(ny.transform(Xte), yte):9.4f} {fit_s:6.2f}")


def streamed_pass(threads, n=50_000, M=1000):
    """Time of one streamed float32 pass K_nM^T K_nM v, and its error against float64."""
    import torch

    from kernelflow.kernels import Gaussian
    from kernelflow.solvers.nystrom import nystrom_normal_matvec
    from kernelflow.sources import ArraySource

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 9, generator=g)
    C, src = X[:M].double(), ArraySource(X, torch.zeros(n))
    V = torch.randn(M, 1, dtype=torch.float64, generator=g)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = nystrom_normal_matvec(src, Gaussian(SIGMA), C, V, dtype=torch.float32)
        times.append(time.perf_counter() - t0)
    K = Gaussian(SIGMA)(X.double(), C)
    ref = K.T @ (K @ V)
    err = float((out - ref).norm() / ref.norm())
    print(f"streamed float32 pass n={n} M={M}: best {min(times):.3f} s, "
          f"relative error vs float64 {err:.1e}")
    from kernelflow.solvers.nystrom import _lower_gram

    L = torch.randn(3000, 3000, dtype=torch.float64, generator=g).tril_()
    for name, fn in (("full GEMM L^T L", lambda: L.T @ L), ("triangular", lambda: _lower_gram(L))):
        t0 = time.perf_counter()
        fn()
        print(f"preconditioner product, M=3000, {name}: {time.perf_counter() - t0:.2f} s")


def conditioning(threads, n=20_000, M=500):
    """Default fits on ill-conditioned problems (sigma = 10) against a float64 reference.

    Reference: least squares on the unsquared whitened system [K_nM F; sqrt(alpha) I] beta =
    [y; 0], a = F beta (F = U diag(s)^-1/2 over K_MM's eigenvalues above rounding); objectives
    ||K_nM a - y||^2 + alpha a^T K_MM a in extended precision.
    """
    import warnings

    import torch

    from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    from kernelflow.kernels import Gaussian

    torch.set_num_threads(threads)
    print(f"{'sigma':>5s} {'lambda':>7s} {'dtype':>7s} {'objective/ref - 1':>17s} {'RMSE_f':>7s} "
          f"{'fit s':>6s} {'warnings':>8s}  solver_history_")
    for sigma, lam, dtype in [(10.0, 1e-8, "float64"), (10.0, 1e-10, "float64"),
                              (3.0, 1e-6, "float64"), (10.0, 1e-8, "float32")]:
        Xtr, ytr, Xte, fte = data(n, dtype)
        alpha = n * lam
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = NystromKernelRidge(n_components=M, alpha=alpha, sigma=sigma,
                                   landmarks=centres(Xtr, M)).fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        X, C = torch.from_numpy(Xtr.astype(np.float64)), m.centers_
        K = Gaussian(sigma)(X, C).numpy()
        K_mm = Gaussian(sigma)(C).numpy()
        yc = ytr.astype(np.float64) - float(m.intercept_)
        s, U = np.linalg.eigh(K_mm)
        keep = s > s[-1] * np.finfo(np.float64).eps * M
        F = U[:, keep] / np.sqrt(s[keep])
        A = np.vstack([K @ F, np.sqrt(alpha) * np.eye(F.shape[1])])
        beta = np.linalg.lstsq(A, np.concatenate([yc, np.zeros(F.shape[1])]), rcond=None)[0]

        KL, K_mmL = K.astype(np.longdouble), K_mm.astype(np.longdouble)
        obj = []
        for a in (m.dual_coef_.numpy(), F @ beta):
            aL = a.astype(np.longdouble)
            r = KL @ aL - yc
            obj.append(float(r @ r + alpha * aL @ (K_mmL @ aL)))
        gap = obj[0] / obj[1] - 1.0
        pred = np.asarray(m.predict(Xte), np.float64)
        rmse = float(np.sqrt(np.mean((pred - fte) ** 2)))
        print(f"{sigma:5.0f} {lam:7.0e} {dtype:>7s} {gap:17.1e} {rmse:7.4f} {fit_s:6.2f} "
              f"{len(caught):8d}  {m.solver_history_}")


def crossover(threads, n=20_000):
    """CG vs direct solve of the same Nyström system, stored and streamed K_nM (interleaved)."""
    import torch

    from kernelflow.kernels import Gaussian
    from kernelflow.solvers.nystrom import choose_solver, nystrom_krr
    from kernelflow.sources import ArraySource

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    print(f"{'n':>6s} {'M':>5s} {'dtype':>8s} {'K_nM':>8s} {'cg s':>7s} {'passes':>6s} "
          f"{'direct s':>8s} {'cg/direct':>9s} {'model':>7s}")
    for M, dt, store in [(500, torch.float64, False), (1000, torch.float64, True),
                         (1000, torch.float64, False), (1000, torch.float32, False),
                         (2000, torch.float64, True), (2000, torch.float64, False)]:
        X = torch.randn(n, 9, dtype=dt, generator=g)
        y = torch.sin(X[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=dt)
        src, best, passes = ArraySource(X, y), {}, 0
        for solver in ("cg", "direct", "cg", "direct"):
            t0 = time.perf_counter()
            sol = nystrom_krr(src, Gaussian(SIGMA), X[:M], LAMBDA * n, solver=solver,
                              store_kernel=store, dtype=dt)
            best[solver] = min(best.get(solver, np.inf), time.perf_counter() - t0)
            passes = sol.n_iter if solver == "cg" else passes
        model = choose_solver(n, M, 9, stored=store, dtype=dt)
        print(f"{n:6d} {M:5d} {str(dt)[6:]:>8s} {'stored' if store else 'streamed':>8s} "
              f"{best['cg']:7.2f} {passes:6d} {best['direct']:8.2f} "
              f"{best['cg'] / best['direct']:9.2f} {model:>7s}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n = 20 000 configurations")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--sklearn-max-gb", type=float, default=4.0)
    p.add_argument("--methods", default="kernelflow,kernelflow-direct,falkon,sklearn")
    p.add_argument("--small-penalty", action="store_true",
                   help="only the small-penalty case (n = 20 000, M = 500, alpha = 1e-6)")
    p.add_argument("--streamed-pass", action="store_true",
                   help="only the time of one streamed float32 pass (n = 50 000, M = 1000)")
    p.add_argument("--crossover", action="store_true",
                   help="only CG vs direct at n = 20 000 (the cost model's calibration)")
    p.add_argument("--conditioning", action="store_true",
                   help="only default fits at sigma = 10 against a float64 reference")
    p.add_argument("--repeats", type=int, default=2,
                   help="interleaved runs of each method per configuration (best time kept)")
    p.add_argument("--only", default="", help="run only configurations whose name contains this")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(json.loads(a.worker))
        return
    if a.crossover:
        crossover(a.threads)
        return
    if a.conditioning:
        conditioning(a.threads)
        return
    if a.small_penalty or a.streamed_pass:
        if a.small_penalty:
            small_penalty(a.threads)
        if a.streamed_pass:
            streamed_pass(a.threads)
        return
    methods = a.methods.split(",")
    if "falkon" in methods and not falkon_available():
        print("falkon is not importable: the Falkon column is skipped")
        methods.remove("falkon")
    base_name = "falkon" if "falkon" in methods else "sklearn"
    print(f"threads={a.threads}  lambda={LAMBDA}  sigma={SIGMA}  baseline={base_name}")
    print(f"{'config':28s} {'method':18s} {'fit s':>8s} {'cpu s':>8s} {'ratio':>7s} {'RMSE_f':>8s} "
          f"{'iters':>6s} {'solver':>7s} {'RSS GB':>7s} {'K_nM rows stored':>16s}")
    for name, n, M, dtype, streamed in (QUICK if a.quick else CONFIGS):
        if a.only not in name:
            continue
        results = {}
        for _ in range(max(1, a.repeats)):
            for method in methods:
                if method == "sklearn" and n * M * 8 > a.sklearn_max_gb * 2**30:
                    continue
                if method == "kernelflow-direct" and M > 3000:
                    continue
                spec = dict(method=method, n=n, M=M, dtype=dtype, streamed=streamed,
                            threads=a.threads)
                r = run(spec, a.timeout)
                prev = results.get(method)
                if prev is None or "error" in prev or ("error" not in r
                                                       and r["fit_s"] < prev["fit_s"]):
                    results[method] = r
        base = results.get(base_name, {}).get("fit_s")
        for method, r in results.items():
            if "error" in r:
                print(f"{name:28s} {method:18s} error: {r['error']}")
                continue
            ratio = f"{base / r['fit_s']:.2f}x" if base else "-"
            print(f"{name:28s} {method:18s} {r['fit_s']:8.2f} {r.get('cpu_s', float('nan')):8.2f} "
                  f"{ratio:>7s} {r['rmse_f']:8.4f} "
                  f"{r['iters']!s:>6s} {r['solver']:>7s} {r['peak_rss_gb']:7.2f} "
                  f"{r.get('stored_rows', '-')!s:>16s}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
