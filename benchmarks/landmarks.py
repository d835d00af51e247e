"""When does landmark selection pay off? Nyström approximation factor, selection time and
downstream Nyström KRR error for every selector in :mod:`kernelflow.landmarks`.

For each data set (scikit-learn digits, a synthetic set of clusters of very unequal size,
concrete and a diamonds subsample) the kernel matrix ``K`` of ``n`` training points is built
once. For every selector, ``k`` and trial we record

* ``AF_F = ||K - K_S||_F^2 / sum_{i>k} lam_i^2`` (the paper's Frobenius factor, squared) and
  ``AF_* = tr(K - K_S) / sum_{i>k} lam_i`` (trace norm); both are >= 1;
* the selection time (seconds, wall clock, this machine);
* the test RMSE of Nyström KRR on the selected centres at equal ``k``
  (ridge on the features ``K_nS K_SS^{-1/2}``, ridge chosen once per data set by exact KRR on
  a validation split), relative to exact KRR.

Trial ``t`` at ``k`` seeds the selector with ``1000 t + k`` (``--trials``, default 10; the
deterministic ``pivoted_cholesky`` and ``greedy`` run once). Tables give the mean over the
trials (the RMSE table also the sample standard deviation); the figures (``--plots``) draw
one colour and marker per selector, the mean as a line and a band from the lowest to the
highest trial.

Baseline: uniform sampling. Ratios are measured in the same run. Run
``python benchmarks/landmarks.py`` (full) or ``--quick`` (smoke run).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from kernelflow.kernels import Gaussian, median_heuristic
from kernelflow.landmarks import (
    SELECTORS,
    ContinuousSelector,
    best_rank_k_errors,
    nystroem_errors,
    nystroem_factor,
)

DATASET_ORDER = ["digits", "clusters", "concrete", "diamonds"]
SELECTOR_ORDER = ["uniform", "rpcholesky", "block_rpcholesky", "pivoted_cholesky", "rls",
                  "bless", "kmeans", "kdpp", "greedy", "continuous"]
DETERMINISTIC = {"pivoted_cholesky", "greedy"}


def _standardise(Xtr, Xte):
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd < 1e-12] = 1.0  # constant columns (digits' border pixels) stay 0
    return (Xtr - mu) / sd, (Xte - mu) / sd


def load_sets(n_train: int, n_test: int, seed: int = 0):
    from sklearn.datasets import load_digits

    from kernelflow.datasets import load_concrete, load_diamonds
    from kernelflow.datasets._landmarks import make_unequal_clusters

    rng = np.random.RandomState(seed)
    out = {}
    d = load_digits()
    out["digits"] = (d.data.astype(float), d.target.astype(float), None)
    Xc, yc, _ = make_unequal_clusters(n_train + n_test, 5, n_clusters=12, size_ratio=0.6,
                                      random_state=seed)
    out["clusters"] = (Xc, yc, 1.0)  # bandwidth of the clusters' own scale
    Xk, yk = load_concrete(return_X_y=True)
    out["concrete"] = (np.asarray(Xk, float), np.asarray(yk, float), None)
    Xd, yd = load_diamonds(n_samples=n_train + n_test, random_state=seed, return_X_y=True)
    out["diamonds"] = (np.asarray(Xd, float), np.asarray(yd, float), None)
    sets = {}
    for name, (X, y, sigma) in out.items():
        idx = rng.permutation(len(X))[: n_train + n_test]
        tr, te = idx[:n_train], idx[n_train:]
        Xtr, Xte = _standardise(X[tr], X[te])
        sets[name] = dict(Xtr=torch.as_tensor(Xtr), ytr=torch.as_tensor(y[tr]),
                          Xte=torch.as_tensor(Xte), yte=torch.as_tensor(y[te]), sigma=sigma)
    return sets


def _ridge_features(F, y, lam):
    r = F.shape[1]
    A = F.T @ F + lam * torch.eye(r, dtype=F.dtype)
    return torch.linalg.solve(A, F.T @ y)


def krr_setup(ker, Xtr, ytr, Xte, yte, K):
    """Exact-KRR reference and a ridge chosen on a validation split of the training set."""
    n = Xtr.shape[0]
    nv = n // 4
    Kt, Kv = K[nv:][:, nv:], K[:nv][:, nv:]
    ym = ytr[nv:].mean()
    best = (math.inf, None)
    for lam in 10.0 ** np.arange(-6, 2):
        a = torch.linalg.solve(Kt + lam * torch.eye(n - nv, dtype=K.dtype), ytr[nv:] - ym)
        err = float(((Kv @ a + ym - ytr[:nv]) ** 2).mean())
        if err < best[0]:
            best = (err, float(lam))
    lam = best[1]
    ym = ytr.mean()
    a = torch.linalg.solve(K + lam * torch.eye(n, dtype=K.dtype), ytr - ym)
    pred = ker(Xte, Xtr) @ a + ym
    return lam, float(((pred - yte) ** 2).mean().sqrt())


def nystroem_krr_rmse(ker, C, Xtr, ytr, Xte, yte, lam):
    F = nystroem_factor(Xtr, ker, C)
    Ft = nystroem_factor(torch.cat([Xte, C]), ker, C)[: Xte.shape[0]]
    ym = ytr.mean()
    beta = _ridge_features(F, ytr - ym, lam)
    return float(((Ft @ beta + ym - yte) ** 2).mean().sqrt()), F


def run(args):
    torch.set_num_threads(args.threads)
    sets = load_sets(args.n, args.n_test)
    if args.datasets:
        sets = {k: v for k, v in sets.items() if k in args.datasets}
    names = [s for s in SELECTOR_ORDER if s in args.selectors]
    results = {}
    for dname, ds in sets.items():
        Xtr, ytr, Xte, yte = ds["Xtr"], ds["ytr"], ds["Xte"], ds["yte"]
        sigma = ds["sigma"] or median_heuristic(Xtr)
        ker = Gaussian(sigma)
        K = ker(Xtr, Xtr)
        best = best_rank_k_errors(K, args.ks)
        lam, exact_rmse = krr_setup(ker, Xtr, ytr, Xte, yte, K)
        print(f"\n== {dname}: n={Xtr.shape[0]}, d={Xtr.shape[1]}, sigma={sigma:.3g}, "
              f"ridge={lam:.0e}, exact KRR test RMSE={exact_rmse:.4g}", flush=True)
        res = {"sigma": sigma, "ridge": lam, "exact_rmse": exact_rmse,
               "n_train": int(Xtr.shape[0]), "rows": []}
        for sname in names:
            lam_init = None
            for k in args.ks:
                trials = 1 if sname in DETERMINISTIC else args.trials
                for trial in range(trials):
                    if sname == "continuous":
                        sel_obj = ContinuousSelector(lam_init=lam_init)
                    else:
                        sel_obj = SELECTORS[sname]()
                    t0 = time.perf_counter()
                    try:
                        if sname == "continuous":
                            out = sel_obj.run(Xtr, ker, k, random_state=1000 * trial + k)
                            lam_init = out.lam
                            C = Xtr[out.support]
                            extra = {"method": out.method, "probes": len(out.probes)}
                        else:
                            C = sel_obj.select(Xtr, ker, k, random_state=1000 * trial + k).centers
                            extra = {}
                    except ValueError as exc:  # e.g. k-DPP with k above the numerical rank
                        print(f"   {sname} k={k}: {exc}")
                        break
                    secs = time.perf_counter() - t0
                    rmse, F = nystroem_krr_rmse(ker, C, Xtr, ytr, Xte, yte, lam)
                    e = nystroem_errors(K, F)
                    res["rows"].append(dict(
                        selector=sname, k=k, trial=trial, time=secs,
                        af_fro=e["frobenius_sq"] / best[k]["frobenius_sq"],
                        af_trace=e["trace"] / best[k]["trace"], rmse=rmse, **extra))
                lam_init = None if sname != "continuous" else lam_init
            print(f"   {sname:<17} done", flush=True)
        results[dname] = res
        _print_tables(dname, res, names, args.ks)
        if args.json:  # after every data set, so an interrupted run keeps what it finished
            Path(args.json).write_text(json.dumps(results, indent=1))
    _report(results, names, args)
    return results


def _report(results, names, args):
    _check_claims(results, args.ks)
    if args.plots:
        _plots(results, names, args.ks, Path(args.plots))


def merge(args):
    """Tables and plots from the JSON files of runs on disjoint data sets (same settings)."""
    results = {}
    for f in args.merge:
        for dname, res in json.loads(Path(f).read_text()).items():
            if dname in results:
                raise SystemExit(f"{f}: data set {dname!r} is in two files")
            res.setdefault("n_train", args.n)  # files written before the field existed
            results[dname] = res
    order = [d for d in DATASET_ORDER if d in results] + \
        [d for d in results if d not in DATASET_ORDER]
    results = {d: results[d] for d in order}
    present = {r["selector"] for res in results.values() for r in res["rows"]}
    names = [s for s in SELECTOR_ORDER if s in present]
    args.ks = sorted({r["k"] for res in results.values() for r in res["rows"]})
    for dname, res in results.items():
        _print_tables(dname, res, names, args.ks)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, names, args.ks))
    _report(results, names, args)
    return results


def _agg(rows, sname, k, key):
    """Mean and sample standard deviation (0 for one trial) over the trials."""
    v = [r[key] for r in rows if r["selector"] == sname and r["k"] == k]
    if not v:
        return math.nan, math.nan
    return float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0


def _print_tables(dname, res, names, ks):
    rows = res["rows"]
    for key, title in [("af_fro", "Frobenius approximation factor (mean over trials)"),
                       ("af_trace", "trace-norm approximation factor"),
                       ("rmse", f"Nystrom KRR test RMSE (exact KRR {res['exact_rmse']:.4g})"),
                       ("time", "selection time [s]")]:
        print(f"\n[{dname}] {title}")
        print(f"{'selector':<17}" + "".join(f"{'k=' + str(k):>11}" for k in ks))
        for s in names:
            vals = [_agg(rows, s, k, key)[0] for k in ks]
            print(f"{s:<17}" + "".join(f"{v:>11.4g}" for v in vals))
        if key != "time":
            print(f"{'uniform/cont.':<17}" + "".join(
                f"{_agg(rows, 'uniform', k, key)[0] / _agg(rows, 'continuous', k, key)[0]:>11.3g}"
                for k in ks))
    print(f"{'cont./rpchol t':<17}" + "".join(
        f"{_agg(rows, 'continuous', k, 'time')[0] / _agg(rows, 'rpcholesky', k, 'time')[0]:>11.3g}"
        for k in ks))


def _check_claims(results, ks):
    focus = [k for k in (20, 50, 100) if k in ks]
    if not focus or not all("continuous" in {r["selector"] for r in v["rows"]}
                            for v in results.values()):
        return
    print("\nClaims at k in", focus)
    for k in focus:
        not_worse_uni, not_worse_rls = [], []
        for res in results.values():
            c = _agg(res["rows"], "continuous", k, "af_fro")[0]
            not_worse_uni.append(c <= _agg(res["rows"], "uniform", k, "af_fro")[0])
            not_worse_rls.append(c <= _agg(res["rows"], "rls", k, "af_fro")[0])
        print(f"  k={k}: continuous <= uniform on {sum(not_worse_uni)}/{len(results)} sets; "
              f"<= rls on {sum(not_worse_rls)}/{len(results)}")


def _plots(results, names, ks, folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    folder.mkdir(parents=True, exist_ok=True)
    # one colour and marker per selector, the same in every panel and every figure
    cmap = plt.get_cmap("tab10")
    markers = "osD^v<>pXh"
    style = {s: dict(color=cmap(SELECTOR_ORDER.index(s) % 10),
                     marker=markers[SELECTOR_ORDER.index(s) % len(markers)])
             for s in names}
    trials = max((r["trial"] for res in results.values() for r in res["rows"]), default=0) + 1
    spread = (f"mean of {trials} seeded trials, band: lowest to highest trial"
              if trials > 1 else "one trial")
    figures = [
        ("af_fro", "factor", "af_frobenius",
         "Nyström Frobenius approximation factor ||K - K_S||²_F / (best rank-k error) "
         f"({spread}; 1 is the best possible, lower is better)"),
        ("rmse", "test RMSE (target units)", "krr_rmse",
         f"Test RMSE of Nyström KRR on the selected landmarks ({spread}; "
         "dashed: exact KRR on all rows)"),
        ("time", "seconds", "time",
         f"Landmark selection time, one thread ({spread}; shared machine)"),
    ]
    for key, ylabel, fname, title in figures:
        fig, axes = plt.subplots(1, len(results), figsize=(4.0 * len(results) + 1.4, 3.8))
        for ax, (dname, res) in zip(np.atleast_1d(axes), results.items()):
            for s in names:
                m = [_agg(res["rows"], s, k, key)[0] for k in ks]
                ax.plot(ks, m, label=s, lw=2.4 if s == "continuous" else 1.2, ms=5, **style[s])
                lo, hi = _trial_range(res["rows"], s, ks, key)
                if np.any(hi > lo):  # deterministic selectors run once: no band
                    ax.fill_between(ks, lo, hi, color=style[s]["color"], alpha=0.15, lw=0)
            if key == "rmse":
                ax.axhline(res["exact_rmse"], color="k", ls="--", lw=1, label="exact KRR")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(ks)
            ax.set_xticklabels([str(k) for k in ks])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            _plain_log_labels(ax, matplotlib.ticker)
            ax.set_title(f"{dname} (n = {_n_rows(res)})")
            ax.set_xlabel("number of landmarks k")
            ax.grid(True, which="major", alpha=0.3)
        np.atleast_1d(axes)[0].set_ylabel(ylabel)
        handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout(rect=(0, 0, 1 - 1.3 / fig.get_figwidth(), 1))
        fig.savefig(folder / f"landmarks_{fname}.png", dpi=110)
        plt.close(fig)


def _trial_range(rows, sname, ks, key):
    """Lowest and highest value over the trials at each k (NaN where a k has no rows)."""
    lo, hi = [], []
    for k in ks:
        v = [r[key] for r in rows if r["selector"] == sname and r["k"] == k]
        lo.append(min(v) if v else math.nan)
        hi.append(max(v) if v else math.nan)
    return np.array(lo), np.array(hi)


def _plain_log_labels(ax, ticker):
    # y labels as plain numbers (6, 10, 1e+04); minor ones only where the axis spans < 1.5 decades
    lo, hi = ax.get_ylim()
    few = hi / lo < 10 ** 1.5
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}" if few else ""))


def _fmt(v, digits=3):
    return f"{v:.{digits}g}"


def markdown(results, names, ks):
    """The documentation's tables (means over trials; the best entry of a column in bold)."""
    out = []
    blocks = [
        ("af_fro", "Frobenius approximation factor ‖K − K_S‖²_F / Σ_{i>k} λ_i² "
                   "(mean of the trials; lower is better, ≥ 1)", True, 3),
        ("af_trace", "Trace-norm approximation factor tr(K − K_S) / Σ_{i>k} λ_i", True, 3),
        ("rmse", "Nyström KRR test RMSE at equal k (mean ± sd of the trials)", False, 4),
        ("time", "Selection time [s] (mean; one thread, shared machine)", False, 2),
    ]
    for key, title, ratios, digits in blocks:
        out.append(f"### {title}\n")
        for dname, res in results.items():
            rows = res["rows"]
            out.append(f"| {dname} | " + " | ".join(f"k={k}" for k in ks) + " |")
            out.append("|---" * (len(ks) + 1) + "|")
            means = {s: [_agg(rows, s, k, key)[0] for k in ks] for s in names}
            best = [min((means[s][j] for s in names if not math.isnan(means[s][j])),
                        default=math.nan) for j in range(len(ks))]
            for s in names:
                cells = []
                for j, v in enumerate(means[s]):
                    c = "-" if math.isnan(v) else _fmt(v, digits)
                    cells.append(f"**{c}**" if key != "time" and v == best[j] else c)
                    sd = _agg(rows, s, ks[j], key)[1]
                    if key == "rmse" and sd > 0:  # is a gap between selectors above the noise?
                        cells[-1] += f" ± {_fmt(sd, 2)}"
                out.append(f"| {s} | " + " | ".join(cells) + " |")
            if key == "rmse":
                out.append("| exact KRR | " + " | ".join(_fmt(res["exact_rmse"], digits)
                                                       for _ in ks) + " |")
            if ratios and "continuous" in names:
                for base in ("uniform", "rls"):
                    if base in names:
                        out.append(f"| {base} / continuous | " + " | ".join(
                            _fmt(means[base][j] / means["continuous"][j]) for j in
                            range(len(ks))) + " |")
            if key == "time" and {"continuous", "rpcholesky"} <= set(names):
                out.append("| continuous / rpcholesky | " + " | ".join(
                    f"{means['continuous'][j] / means['rpcholesky'][j]:.0f}×"
                    for j in range(len(ks))) + " |")
            out.append("")
    if "continuous" in names:
        out.append("### Search outcome of the continuous selector\n")
        out.append("| data set | outcome per k (trials) | mean runs per selection |")
        out.append("|---|---|---|")
        for dname, res in results.items():
            cont = [r for r in res["rows"] if r["selector"] == "continuous"]
            parts = []
            for k in ks:
                methods = [r.get("method", "?") for r in cont if r["k"] == k]
                counts = {m: methods.count(m) for m in dict.fromkeys(methods)}
                parts.append(f"k={k}: " + ", ".join(f"{m} {c}" for m, c in counts.items()))
            runs = np.mean([r.get("probes", math.nan) for r in cont])
            out.append(f"| {dname} | " + "; ".join(parts) + f" | {runs:.2f} |")
        out.append("")
    return "\n".join(out)


def _n_rows(res):
    return res.get("n_train", "?")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small smoke run")
    p.add_argument("--n", type=int, default=800, help="training points per data set")
    p.add_argument("--n-test", type=int, default=400)
    p.add_argument("--ks", type=int, nargs="+", default=[10, 20, 50, 100, 200])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--datasets", nargs="*", default=None)
    p.add_argument("--selectors", nargs="*", default=SELECTOR_ORDER)
    p.add_argument("--json", default=None, help="write all rows to this file")
    p.add_argument("--plots", default=None, help="folder for landmarks_*.png")
    p.add_argument("--markdown", default=None, metavar="FILE",
                   help="with --merge: write the documentation's tables to FILE")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="no run: print the tables and draw the plots of these --json files "
                        "(runs on disjoint --datasets, e.g. in parallel processes)")
    args = p.parse_args()
    if args.merge:
        merge(args)
        return
    if args.quick:
        args.n, args.n_test, args.ks, args.trials = 300, 150, [10, 20], 2
    run(args)


if __name__ == "__main__":
    main()
