"""KSGD against the robust competitors of Allerbo's journal version (Tables 4 and 5), paired.

For every split of every stand-in data set (the protocol, data sets and methods of
``allerbo_real.py``: 100 rows, 80 train / 20 test, 10-fold CV, Gaussian kernel) the script fits
KSGD (the paper's 30 bandwidths) and the competitors KMR-H, KMR-T, KQR (IRLS / MM, batched over
bandwidths x folds x penalties x 3 tuning constants) and KQR-B (fastkqr's method, one kernel
for fitting and prediction) on a ``--grid``-point bandwidth and penalty grid
(geomspace(0.01, 1000, g) x geomspace(1e-6, 10, g); the paper uses g = 30), and appends one
JSON line per (data set, outliers, split) to ``--out``. A rerun skips the lines already there,
so long runs resume where they stopped.

``--summary`` reads the file and prints, per data set and outlier setting, the median test R^2
of every method and the paired per-split differences KSGD - competitor: median, wins, the
two-sided Wilcoxon signed-rank and sign-test p-values, and a one-sided Wilcoxon test of
non-inferiority at the margin ``--margin`` (H0: the median difference is <= -margin).

``--summary --grid 30 --against 10`` also prints, for the splits run at both grids, how each
method's test R^2 and CPU change from the ``--against`` grid to ``--grid`` (the check that a
smaller grid does not decide the comparison).

``--loop-compare`` also runs the M-estimators with the uncompacted solver loop (every problem
iterated until the slowest converges) and records the CPU time of both loops and whether the
chosen grid point is the same.

Usage::

    python benchmarks/allerbo_competitors.py --splits 1-20 --grid 10 --out bench_out/comp_g10.jsonl
    python benchmarks/allerbo_competitors.py --summary --out bench_out/comp_g10.jsonl
    python benchmarks/allerbo_competitors.py --summary --grid 30 --against 10 \
        --out bench_out/comp_g30.jsonl,bench_out/comp_g10.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from allerbo_real import STANDIN, competitor_cv, kqr_apg_cv, load  # noqa: E402
from allerbo_synthetic import KERNELS, r2  # noqa: E402

from kernelflow.datasets._allerbo import kfold_indices, subsample_protocol  # noqa: E402
from kernelflow.estimators.path_cv import KernelSignGradientCV  # noqa: E402

COMPETITORS = ("KMR-H", "KMR-T", "KQR", "KQR-B")


def run_split(X, y, seed, outliers, grid, methods, loop_compare):
    """One split: {method: {r2, cpu, ...}} with CPU seconds of this process."""
    kern = KERNELS["gaussian"]
    X_tr, X_te, y_tr, y_te = subsample_protocol(X, y, outliers=outliers, random_state=seed)
    X_tr, X_te, y_tr = torch.tensor(X_tr), torch.tensor(X_te), torch.tensor(y_tr)
    folds = kfold_indices(len(y_tr), 10, random_state=seed)
    rows = {}
    c0 = time.process_time()
    est = KernelSignGradientCV(sigmas=np.geomspace(0.01, 1000, 30), kernel=kern(1.0), cv=folds,
                               learning_rate=0.01, max_iter=10_000, n_iter_no_change=100,
                               fit_intercept=False, validation_loss="squared").fit(X_tr, y_tr)
    rows["KSGD"] = dict(r2=r2(y_te, est.predict(X_te).numpy()), cpu=time.process_time() - c0)
    sig, lam = np.geomspace(0.01, 1000, grid), np.geomspace(1e-6, 10, grid)
    for name in methods:
        info: dict = {}
        c0 = time.process_time()
        if name == "KQR-B":
            pred, _ = kqr_apg_cv(X_tr, y_tr, X_te, sig, lam, folds, False, kern, info=info)
        else:
            pred, _ = competitor_cv(X_tr, y_tr, X_te, sig, lam, folds, name, kern, info=info)
        rows[name] = dict(r2=r2(y_te, pred), cpu=time.process_time() - c0, **info)
        if loop_compare and name != "KQR-B":
            old: dict = {}
            c0 = time.process_time()
            pred_old, _ = competitor_cv(X_tr, y_tr, X_te, sig, lam, folds, name, kern,
                                       compact=False, info=old)
            rows[name].update(cpu_uncompacted=time.process_time() - c0,
                              same_choice=old["choice"] == info["choice"],
                              max_pred_diff=float(np.abs(pred_old - pred).max()))
    return rows


def parse_splits(text):
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def run(args):
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["data"], r["outliers"], r["split"]))
    methods = [m for m in args.methods.split(",") if m in COMPETITORS]
    data = {name: load(name) for name in args.datasets.split(",")}
    # split-major order: a run cut short leaves every data set with the same splits
    for s in parse_splits(args.splits):
        for name, (X, y) in data.items():
            for o in args.outliers.split(","):
                if (name, o, s) in done:
                    continue
                rows = run_split(X, y, s, o == "yes", args.grid, methods, args.loop_compare)
                rec = dict(data=name, outliers=o, split=s, grid=args.grid, methods=rows)
                with out.open("a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                cpu = "  ".join(f"{m} {v['cpu']:.1f}" + (f"/{v['cpu_uncompacted']:.1f}"
                                                          if "cpu_uncompacted" in v else "")
                                for m, v in rows.items())
                print(f"{name} outliers={o} split {s} grid {args.grid}: CPU [s] {cpu}",
                      flush=True)


def grid_change(merged, g_from, g_to):
    """Per data set, outlier setting and method, over the splits run at both grids: median and
    largest change of test R^2 from grid ``g_from`` to ``g_to`` and the median CPU ratio."""
    pairs: dict = {}
    for (d, o, s, g), r in merged.items():
        if g == g_to and (d, o, s, g_from) in merged:
            pairs.setdefault((d, o), []).append((merged[(d, o, s, g_from)], r))
    print(f"\nFrom the {g_from}-point to the {g_to}-point grid, splits run at both: median and "
          "largest |change| of test R^2, median CPU ratio")
    print("\n| data | outliers | method | splits | median R^2 change | largest abs change | "
          "median CPU ratio |")
    print("|---|---|---|---|---|---|---|")
    for (d, o), ps in sorted(pairs.items()):
        for m in ["KSGD", *COMPETITORS]:
            both = [(a["methods"][m], b["methods"][m]) for a, b in ps
                    if m in a["methods"] and m in b["methods"]]
            if not both:
                continue
            ch = np.array([b["r2"] - a["r2"] for a, b in both])
            cpu = np.median([b["cpu"] / a["cpu"] for a, b in both])
            print(f"| {d} | {o} | {m} | {len(both)} | {np.median(ch):+.3f} | "
                  f"{np.abs(ch).max():.3f} | {cpu:.1f}x |")


def summary(args):
    from scipy.stats import binomtest, wilcoxon

    # several files (comma-separated) are merged split by split: a method run in one file and
    # another method run in a second file on the same split pair up
    merged: dict = {}
    for path in args.out.split(","):
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            key = (r["data"], r["outliers"], r["split"], r["grid"])
            merged.setdefault(key, {**r, "methods": {}})["methods"].update(r["methods"])
    if args.against is not None:
        grid_change(merged, args.against, args.grid)
    recs = [r for r in merged.values() if r["grid"] == args.grid]
    keys = sorted({(r["data"], r["outliers"]) for r in recs},
                  key=lambda k: (k[1], list(STANDIN).index(k[0])))
    methods = ["KSGD", *COMPETITORS]
    print(f"grid: {args.grid} points per axis (the splits run at --grid); margin {args.margin}")
    print("\n| data (paper's) | outliers | splits | "
          + " | ".join(f"{m} R^2 med" for m in methods) + " |")
    print("|---|---|---|" + "---|" * len(methods))
    for d, o in keys:
        rs = [r for r in recs if (r["data"], r["outliers"]) == (d, o)]
        cells = []
        for m in methods:
            v = [r["methods"][m]["r2"] for r in rs if m in r["methods"]]
            cells.append(f"{np.median(v):.2f}" if v else "-")
        print(f"| {d} ({STANDIN[d]}) | {o} | {len(rs)} | " + " | ".join(cells) + " |")
    print("\nPaired KSGD - competitor test R^2 per split: median difference, KSGD wins / splits, "
          "two-sided Wilcoxon p, sign-test p, non-inferiority p (H0: median <= -margin)")
    print("\n| data | outliers | competitor | n | median diff | wins | Wilcoxon p | sign p | "
          f"non-inf. p (margin {args.margin}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d, o in keys:
        rs = [r for r in recs if (r["data"], r["outliers"]) == (d, o)]
        for m in COMPETITORS:
            pairs = [(r["methods"]["KSGD"]["r2"], r["methods"][m]["r2"]) for r in rs
                     if m in r["methods"]]
            if len(pairs) < 2:
                continue
            diff = np.array([a - b for a, b in pairs])
            nz = diff[diff != 0]
            wins = int((diff > 0).sum())
            pw = wilcoxon(nz).pvalue if len(nz) else 1.0
            ps = binomtest(wins, len(nz)).pvalue if len(nz) else 1.0
            pn = wilcoxon(diff + args.margin, alternative="greater").pvalue
            print(f"| {d} | {o} | {m} | {len(diff)} | {np.median(diff):+.3f} | {wins}/{len(diff)}"
                  f" | {pw:.3f} | {ps:.3f} | {pn:.3f} |")
    print("\nCPU [s] per split, median (process time of one torch thread)")
    print("\n| data | outliers | " + " | ".join(methods) + " | uncompacted loop (KMR-H, KMR-T, "
          "KQR) | same choice | capped share (KMR-H, KMR-T, KQR, KQR-B) |")
    print("|---|---|" + "---|" * len(methods) + "---|---|---|")
    for d, o in keys:
        rs = [r for r in recs if (r["data"], r["outliers"]) == (d, o)]

        def med(m, key, rs=rs):
            v = [r["methods"][m][key] for r in rs if key in r["methods"].get(m, {})]
            return f"{np.median(v):.3g}" if v else "-"

        same = [r["methods"][m]["same_choice"] for r in rs for m in COMPETITORS
                if "same_choice" in r["methods"].get(m, {})]
        print(f"| {d} | {o} | " + " | ".join(med(m, "cpu") for m in methods) + " | "
              + ", ".join(med(m, "cpu_uncompacted") for m in COMPETITORS[:3]) + " | "
              + (f"{sum(same)}/{len(same)}" if same else "-") + " | "
              + ", ".join(med(m, "cap") for m in COMPETITORS) + " |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", default="1-20", help="split seeds, e.g. 1-20 or 5")
    ap.add_argument("--datasets", default="concrete,boston,diamonds,diabetes,airquality")
    ap.add_argument("--outliers", default="yes,no")
    ap.add_argument("--grid", type=int, default=10, help="points per bandwidth/penalty axis")
    ap.add_argument("--methods", default=",".join(COMPETITORS))
    ap.add_argument("--loop-compare", action="store_true",
                    help="also time the uncompacted IRLS/MM loop (same grid point expected)")
    ap.add_argument("--out", default="bench_out/allerbo_competitors.jsonl",
                    help="JSON-lines file (for --summary: files separated by commas)")
    ap.add_argument("--summary", action="store_true", help="print the tables of --out")
    ap.add_argument("--against", type=int, default=None,
                    help="with --summary: also compare --grid with this grid, split by split")
    ap.add_argument("--margin", type=float, default=0.05,
                    help="non-inferiority margin in test R^2")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    summary(args) if args.summary else run(args)


if __name__ == "__main__":
    main()
