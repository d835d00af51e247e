"""Scale: fits streamed from a Parquet data set of 10^5, 10^6 and 10^7 rows; kill and resume.

Data as in ``benchmarks/nystrom_vs_falkon.py`` and ``benchmarks/many_centres.py``:
X ~ N(0, I_9), f = sin(2 u1) + 0.5 tanh(2 u2) + 0.25 u1 u2 (u the projections on two fixed
orthonormal directions), y = f + 0.1 N(0, 1) (``--noise`` sets the 0.1), float32 columns
``x0`` ... ``x8``, ``y``. The data set is generated once to ``--data-dir`` (never loaded
whole): files of 10^5 rows (row groups of 50 000), so the first n / 10^5 files are the data set
of n rows. The test set
is 10 000 more points with the noiseless f (``test.npz``).

Every fit runs in its own process with one thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``), reads the files through
:class:`kernelflow.parquet_source.ParquetSource` and records the CPU time of the process during
the fit (``getrusage``, user + system: robust to other processes on a shared machine), the
wall time, the peak resident set size of the process (``ru_maxrss``), the passes over the data
(rows read divided by n, every read counted: centre sampling, moments, fingerprints included)
and the test RMSE against the noiseless f. Estimators:

* ``nystrom``: ``NystromKernelRidge`` (M = 2000, conjugate gradients, which ``solver="auto"``
  picks at this size; set explicitly so that the fixed ``max_iter`` is not followed by the
  float64 direct solve that "auto" runs after a float32 CG run which has not met its tolerance),
  sigma = 3, alpha = n lambda with lambda = 1e-6 (Falkon's scale), float32 products,
  ``tol=1e-12`` so that every n runs exactly ``--max-iter`` passes, memory budget
  ``--budget-mb`` (below the size of the 10^7 data set, so K_nM is never stored);
* ``doubly_stochastic``: ``DoublyStochasticRegressor`` (one in-order pass of ``partial_fit``
  over the record batches of 65 536 rows, mini-batches of 1024 rows, 16 blocks of 128 random
  features at most, so an iteration costs the same whatever n), sigma = 3, alpha = 1e-6;
* ``nystrom_fixed`` (not run by default): ``nystrom`` with the same 2000 centres at every n
  (rows drawn from the first file), which separates the effect of n on the test error from
  that of the centre draw;
* ``nystrom_direct`` (not run by default): the same centres, solved by ``solver="direct"`` (one
  Gram pass accumulated in float64, no iteration count): the converged Nyström solution, whose
  test error at 10^6 and 10^7 rows differs only by the rows, not by the solver's progress;
* ``robust``: ``NystromRobustRegressor`` (M = 2000, absolute loss, sigma = 3, alpha = n lambda,
  ``tol=0`` and ``--robust-max-iter`` iterations, default ``--max-iter``).

Results are appended to a JSON-lines file (``--out`` with the suffix ``.jsonl``) one fit at a
time; a re-run skips the (estimator, n) pairs already there, so a killed run continues.

``--resume-check`` measures a kill and resume at the largest n for ``NystromKernelRidge``: the
fit runs with ``checkpoint=`` and ``checkpoint_interval=--interval``; it is killed with SIGKILL
once the checkpoint holds at least half of the passes; the same fit is then re-run with the same
checkpoint and its CPU time compared with that of the uninterrupted fit of the table (whose
coefficients are saved to the data directory), and the two models' coefficients are compared.

Usage (the runs of ``docs/performance/scale.md``)::

    python benchmarks/scale.py --n 1e5 1e6 1e7 --max-iter 10 --estimators nystrom \
        --resume-check --out /tmp/kfscale/scale10.json
    python benchmarks/scale.py --n 1e5 1e6 1e7 --max-iter 10 --robust-max-iter 5 \
        --out /tmp/kfscale/scale10.json --plot docs/img/scale.png
    python benchmarks/scale.py --n 1e6 1e7 --max-iter 10 --estimators nystrom_direct \
        nystrom_fixed --noise 1.0 --data-dir /tmp/kernelflow-scale-noise1 \
        --out /tmp/kfscale3/noise1.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)
LAMBDA, SIGMA, M, N_TEST = 1e-6, 3.0, 2000, 10_000

sys.path.insert(0, os.path.dirname(HERE))
from _common import smooth_f  # noqa: E402

FILE_ROWS, GROUP_ROWS, D = 100_000, 50_000, 9
ESTIMATORS = ("nystrom", "doubly_stochastic", "robust")
CHOICES = ESTIMATORS + ("nystrom_fixed", "nystrom_direct")


# ---- data -----------------------------------------------------------------------------------
def file_path(data_dir, i):
    return os.path.join(data_dir, f"part-{i:05d}.parquet")


def generate(data_dir, n_max, noise=0.1):
    """Write the files of the first ``n_max`` rows (those present are kept) and the test set.

    ``noise`` is the standard deviation of the target noise; it is recorded in the directory
    (``noise.json``) and a directory written with another noise level is refused. The inputs
    and the standard normal noise draw are the same whatever ``noise`` (only its scale changes).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(data_dir, exist_ok=True)
    meta = os.path.join(data_dir, "noise.json")
    if os.path.exists(meta):
        with open(meta) as fh:
            old = json.load(fh)["noise"]
        if old != noise:
            raise SystemExit(f"{data_dir} holds data with noise {old}, not {noise}: "
                             "use another --data-dir")
    elif any(os.path.exists(file_path(data_dir, i)) for i in range(2)) and noise != 0.1:
        raise SystemExit(f"{data_dir} holds data of unknown noise: use another --data-dir")
    with open(meta, "w") as fh:
        json.dump({"noise": noise}, fh)
    t0 = time.time()
    for i in range(-(-n_max // FILE_ROWS)):
        path = file_path(data_dir, i)
        if os.path.exists(path):
            continue
        rng = np.random.RandomState(1000 + i)
        X = rng.randn(FILE_ROWS, D)
        y = smooth_f(X) + noise * rng.randn(FILE_ROWS)
        cols = {f"x{j}": pa.array(X[:, j].astype(np.float32)) for j in range(D)}
        cols["y"] = pa.array(y.astype(np.float32))
        tmp = path + ".tmp"
        pq.write_table(pa.table(cols), tmp, row_group_size=GROUP_ROWS, compression="snappy")
        os.replace(tmp, path)
    test = os.path.join(data_dir, "test.npz")
    if not os.path.exists(test):
        rng = np.random.RandomState(999)
        X = rng.randn(N_TEST, D)
        np.savez(test, X=X.astype(np.float32), f=smooth_f(X.astype(np.float32)))
    print(f"data: {n_max} rows in {data_dir} ({time.time() - t0:.0f} s to write)", flush=True)


def source(data_dir, n):
    """The first n rows: a ParquetSource over the first n / 10^5 files, rows counted."""
    import torch

    from kernelflow.parquet_source import ParquetSource

    files = [file_path(data_dir, i) for i in range(n // FILE_ROWS)]
    src = ParquetSource(files, features=[f"x{j}" for j in range(D)], target="y",
                        dtype=torch.float32)
    read = {"rows": 0}
    blocks = src._blocks

    def counted(block_size, dtype):  # every read of the data goes through _blocks
        for b in blocks(block_size, dtype):
            read["rows"] += int(b.X.shape[0])
            yield b

    src._blocks = counted
    return src, read


# ---- one fit, in its own process ------------------------------------------------------------
def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fixed_centres(data_dir):
    """M rows drawn (seed 0) from the first file: centres common to every n."""
    import pyarrow.parquet as pq

    table = pq.read_table(file_path(data_dir, 0), columns=[f"x{j}" for j in range(D)])
    X = np.column_stack([table.column(j).to_numpy() for j in range(D)])
    return X[np.sort(np.random.RandomState(0).choice(X.shape[0], M, replace=False))]


def make_estimator(name, n, max_iter, budget_mb, checkpoint=None, interval=10.0,
                   landmarks="uniform"):
    from kernelflow.operators import Options

    opts = Options(memory_budget=int(budget_mb) << 20)
    if name == "nystrom_direct":  # the converged Nyström solution: one Gram pass, no CG
        from kernelflow.estimators.nystrom_ridge import NystromKernelRidge

        return NystromKernelRidge(M, landmarks=landmarks, sigma=SIGMA, alpha=n * LAMBDA,
                                  solver="direct", random_state=0, options=opts)
    if name in ("nystrom", "nystrom_fixed"):
        from kernelflow.estimators.nystrom_ridge import NystromKernelRidge

        return NystromKernelRidge(M, landmarks=landmarks, sigma=SIGMA, alpha=n * LAMBDA,
                                  solver="cg", dtype="float32",
                                  max_iter=max_iter, tol=1e-12, random_state=0, options=opts,
                                  checkpoint=checkpoint, checkpoint_interval=interval)
    if name == "robust":
        from kernelflow.estimators.nystrom_robust import NystromRobustRegressor

        return NystromRobustRegressor(M, sigma=SIGMA, alpha=n * LAMBDA, dtype="float32",
                                      max_iter=max_iter, tol=0.0, random_state=0, options=opts)
    from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor

    return DoublyStochasticRegressor(sigma=SIGMA, alpha=LAMBDA, dtype="float32", batch_size=1024,
                                     block_size=128, max_blocks=16, random_state=0)


def worker(spec):
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    name, n = spec["estimator"], int(spec["n"])
    src, read = source(spec["data_dir"], n)
    centres = (fixed_centres(spec["data_dir"]) if name in ("nystrom_fixed", "nystrom_direct")
               else "uniform")
    est = make_estimator(name, n, spec["max_iter"], spec["budget_mb"],
                         spec.get("checkpoint"), spec.get("interval", 10.0), centres)
    c0, w0 = _cpu(), time.perf_counter()
    if name == "doubly_stochastic":  # one in-order pass of partial_fit over the record batches
        for b in src.iter_blocks(65536, dtype=torch.float32):
            est.partial_fit(b.X.numpy(), b.y[:, 0].numpy())
    else:
        est.fit(src)
    cpu, wall = _cpu() - c0, time.perf_counter() - w0
    test = np.load(os.path.join(spec["data_dir"], "test.npz"))
    pred = np.asarray(est.predict(test["X"]), dtype=np.float64)
    rmse = float(np.sqrt(np.mean((pred - test["f"]) ** 2)))
    out = {"estimator": name, "n": n, "cpu_s": cpu, "wall_s": wall,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
           "passes": read["rows"] / n, "rmse_f": rmse, "max_iter": spec["max_iter"],
           "budget_mb": spec["budget_mb"], "n_iter": int(getattr(est, "n_iter_", 0))}
    if hasattr(est, "dual_coef_") and spec.get("save_coef"):
        np.save(spec["save_coef"], est.dual_coef_.detach().cpu().numpy())
    print(json.dumps(out), flush=True)


def launch(spec, timeout=None):
    """Start ``spec`` in a fresh single-threaded process; returns the Popen."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, HERE, "--worker", json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, text=True)


def run_fit(spec):
    proc = launch(spec)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"fit {spec} failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


# ---- kill and resume ------------------------------------------------------------------------
def checkpoint_passes(path):
    """CG passes stored in a checkpoint file (None when absent or being replaced)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(f["__kernelflow__"].tobytes().decode("utf-8"))
    except Exception:  # noqa: BLE001 - absent, or replaced while read
        return None
    return _find_iter(meta.get("state"))


def _find_iter(node):
    """The pass counter of the CG state: the first ``k``/``n_iter``/``iteration`` int node."""
    if isinstance(node, dict) and "dict" in node:
        for k, v in node["dict"]:
            if k in ("k", "n_iter", "iteration", "iter") and isinstance(v, dict) and "int" in v:
                return int(v["int"])
        for _, v in node["dict"]:
            found = _find_iter(v)
            if found is not None:
                return found
    if isinstance(node, dict) and "list" in node:
        for v in node["list"]:
            found = _find_iter(v)
            if found is not None:
                return found
    return None


def resume_check(args, n, reference):
    ckpt = os.path.join(args.data_dir, f"nystrom-{n}.ckpt.npz")
    if os.path.exists(ckpt):
        os.remove(ckpt)
    spec = {"estimator": "nystrom", "n": n, "data_dir": args.data_dir, "max_iter": args.max_iter,
            "budget_mb": args.budget_mb, "checkpoint": ckpt, "interval": args.interval}
    half = args.max_iter // 2
    cpu0 = _children_cpu()
    proc = launch(spec)
    c_start = time.time()
    stored = None
    while proc.poll() is None:
        time.sleep(1.0)
        stored = checkpoint_passes(ckpt)
        if stored is not None and stored >= half:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            break
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the fit ended (exit {proc.returncode}) before it was killed")
    killed_cpu = _children_cpu() - cpu0
    print(f"killed after {time.time() - c_start:.0f} s with {stored} passes in the checkpoint",
          flush=True)
    coef_path = os.path.join(args.data_dir, f"nystrom-{n}-resumed.npy")
    resumed = run_fit({**spec, "save_coef": coef_path})
    ref = np.load(os.path.join(args.data_dir, f"nystrom-{n}-coef.npy"))
    new = np.load(coef_path)
    diff = float(np.max(np.abs(ref.astype(np.float64) - new)))
    return {"n": n, "max_iter": args.max_iter, "killed_at_passes": stored,
            "killed_run_cpu_s": killed_cpu, "resumed_cpu_s": resumed["cpu_s"],
            "resumed_wall_s": resumed["wall_s"], "resumed_passes": resumed["passes"],
            "uninterrupted_cpu_s": reference["cpu_s"],
            "resumed_fraction": resumed["cpu_s"] / reference["cpu_s"],
            "coef_identical": bool(np.array_equal(ref, new)), "coef_max_abs_diff": diff,
            "rmse_f_resumed": resumed["rmse_f"], "rmse_f_uninterrupted": reference["rmse_f"]}


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ---- report ---------------------------------------------------------------------------------
def load_jsonl(path):
    rows = []
    if os.path.exists(path):
        with open(path) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    return rows


def summary(rows):
    out = {}
    for name in CHOICES:
        r = sorted((x for x in rows if x["estimator"] == name), key=lambda x: x["n"])
        if len(r) < 2:
            continue
        ln, lc = np.log([x["n"] for x in r]), np.log([x["cpu_s"] for x in r])
        s = {"slope_cpu": float(np.polyfit(ln, lc, 1)[0])}
        by_n = {x["n"]: x for x in r}
        if 10**6 in by_n and 10**7 in by_n:
            s["rss_ratio_1e7_1e6"] = by_n[10**7]["peak_rss_mb"] / by_n[10**6]["peak_rss_mb"]
            s["rmse_f_1e6"], s["rmse_f_1e7"] = by_n[10**6]["rmse_f"], by_n[10**7]["rmse_f"]
        out[name] = s
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), dpi=90)
    for name, mk in zip(ESTIMATORS, "os^", strict=True):
        r = sorted((x for x in rows if x["estimator"] == name), key=lambda x: x["n"])
        if not r:
            continue
        n = [x["n"] for x in r]
        axes[0].loglog(n, [x["cpu_s"] for x in r], marker=mk, label=name)
        axes[1].semilogx(n, [x["peak_rss_mb"] for x in r], marker=mk, label=name)
    if rows:
        n0 = min(x["n"] for x in rows)
        c0 = min(x["cpu_s"] for x in rows if x["n"] == n0)
        ns = np.array(sorted({x["n"] for x in rows}), dtype=float)
        axes[0].loglog(ns, c0 * ns / n0, "k:", label="slope 1")
    axes[0].set(xlabel="rows n", ylabel="CPU seconds (1 thread)", title="fit time")
    axes[1].set(xlabel="rows n", ylabel="peak RSS (MB)", title="peak memory", ylim=(0, None))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker")
    ap.add_argument("--n", nargs="+", type=float, default=[1e5, 1e6, 1e7])
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=CHOICES)
    ap.add_argument("--data-dir", default="/tmp/kernelflow-scale")
    ap.add_argument("--max-iter", type=int, default=20)
    ap.add_argument("--robust-max-iter", type=int,
                    help="iterations of the robust fit (default --max-iter)")
    ap.add_argument("--budget-mb", type=int, default=256)
    ap.add_argument("--out", default="/tmp/kernelflow-scale.json")
    ap.add_argument("--plot")
    ap.add_argument("--resume-check", action="store_true")
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--noise", type=float, default=0.1,
                    help="standard deviation of the target noise (one value per --data-dir)")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    ns = sorted(int(v) for v in args.n)
    if any(n % FILE_ROWS for n in ns):
        raise SystemExit(f"every n must be a multiple of {FILE_ROWS}")
    generate(args.data_dir, max(ns), args.noise)
    jsonl = os.path.splitext(args.out)[0] + ".jsonl"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rows = load_jsonl(jsonl)
    iters = {"nystrom": args.max_iter, "nystrom_fixed": args.max_iter,
             "nystrom_direct": 1, "doubly_stochastic": args.max_iter,
             "robust": args.robust_max_iter or args.max_iter}
    for n in ns:
        for name in args.estimators:
            if any(r["estimator"] == name and r["n"] == n and r["max_iter"] == iters[name]
                   for r in rows):
                continue
            spec = {"estimator": name, "n": n, "data_dir": args.data_dir,
                    "max_iter": iters[name], "budget_mb": args.budget_mb}
            if name.startswith("nystrom"):
                spec["save_coef"] = os.path.join(args.data_dir, f"{name}-{n}-coef.npy")
            r = run_fit(spec)
            print(json.dumps(r), flush=True)
            rows.append(r)
            with open(jsonl, "a") as fh:
                fh.write(json.dumps(r) + "\n")
    rows = [r for r in rows if r["max_iter"] == iters[r["estimator"]]]
    print("| estimator | n | CPU s | wall s | peak RSS MB | passes | RMSE_f |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda x: (x["estimator"], x["n"])):
        print(f"| {r['estimator']} | {r['n']:.0e} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | "
              f"{r['peak_rss_mb']:.0f} | {r['passes']:.2f} | {r['rmse_f']:.4f} |")
    summ = summary(rows)
    for name, s in summ.items():
        print(name, json.dumps(s))
    payload = {"rows": rows, "summary": summ, "max_iter": iters, "budget_mb": args.budget_mb}
    if args.resume_check:
        n = max(ns)
        ref = next(r for r in rows if r["estimator"] == "nystrom" and r["n"] == n)
        payload["resume"] = resume_check(args, n, ref)
        print(json.dumps(payload["resume"]), flush=True)
    elif os.path.exists(args.out):
        with open(args.out) as fh:
            old = json.load(fh)
        if "resume" in old:
            payload["resume"] = old["resume"]
    with open(args.out, "w") as fh:
        json.dump(payload, fh, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
