"""Mathur et al., continuous landmark selection: the CSSP factor (Fig. 3) and large-n Nyström
(Fig. 4) on offline stand-ins, the continuous selector against the paper's baselines.

* ``cssp``: column subset selection on a data matrix X (rows = samples). The candidates are the
  columns of X, the Gram matrix is ``G = X^T X`` (linear kernel on the columns) and the factor is
  ``||X - P_S X||_F^2 / sum_{i>k} s_i^2`` (= trace error of the Nyström approximation of G over
  its best rank-k value; >= 1, 1 is optimal). Stand-ins: scikit-learn ``digits`` (64 pixel
  columns, the paper uses MNIST pixels) and ``breast_cancer`` (30 columns).
* ``large``: Nyström of a Gaussian kernel (sigma = 0.5, the paper's value, on inputs scaled to
  [-1, 1]^d) on a diamonds subsample (stand-in for the paper's 10^4 - 4.6 10^4 row sets):
  Frobenius factor ``||K - K_S||_F / ||K - K_k||_F`` and selection time, uniform, ridge leverage
  scores (RLS) and randomly pivoted Cholesky against the continuous selector.

Baselines are measured in the same run. Usage::

    python benchmarks/repro_mathur.py [--quick] [--n 4000] [--trials 5] [--large-ks 50 100 200 400]
        [--plot docs/img]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernelflow.kernels import Gaussian, Linear  # noqa: E402
from kernelflow.landmarks import SELECTORS, ContinuousSelector  # noqa: E402

CSSP_SELECTORS = ["uniform", "rls", "kdpp", "greedy", "continuous"]
LARGE_SELECTORS = ["uniform", "rls", "rpcholesky", "continuous"]
DETERMINISTIC = {"greedy", "pivoted_cholesky"}


def _select(name, P, ker, k, seed):
    """Indices of k landmarks among the rows of P chosen by selector ``name``."""
    if name == "continuous":
        out = ContinuousSelector().run(P, ker, k, random_state=seed)
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


def large_factors(X, ks, sigma=0.5, selectors=LARGE_SELECTORS, trials=3):
    """Frobenius factors and selection times ``{selector: {k: [(factor, seconds), ...]}}``."""
    ker = Gaussian(sigma)
    K = ker(torch.as_tensor(X), torch.as_tensor(X))
    lam = torch.linalg.eigvalsh(K).flip(0).clamp_min(0)
    tail = {k: float((lam[k:] ** 2).sum()) for k in ks}
    res = {s: {} for s in selectors}
    for s in selectors:
        for k in ks:
            out = []
            for trial in range(trials):
                t0 = time.perf_counter()
                idx = _select(s, X, ker, k, 1000 * trial + k)
                secs = time.perf_counter() - t0
                _, fro2 = nystrom_residual(K, idx)
                out.append((float(np.sqrt(fro2 / tail[k])), secs))
            res[s][k] = out
    return res


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
    p.add_argument("--sections", default="cssp,large")
    p.add_argument("--plot", default=None, help="folder for repro_mathur_*.png")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    trials = 2 if a.quick else a.trials
    cssp, large = {}, {}
    if "cssp" in a.sections:
        ks = [5, 10, 20] if a.quick else [5, 10, 15, 20, 25]
        for name, X in _cssp_sets().items():
            cssp[name] = cssp_factors(X, ks, trials=trials)
            print(f"\n== CSSP {name}: factor ||X - P_S X||_F^2 / best, median [min, max] ==")
            print(f"{'selector':12s}" + "".join(f"{'k=' + str(k):>28s}" for k in ks))
            for s, byk in cssp[name].items():
                print(f"{s:12s}" + "".join(f"{_fmt(byk[k]):>28s}" for k in ks))
    if "large" in a.sections:
        n = 600 if a.quick else a.n
        ks = [20, 50] if a.quick else a.large_ks
        X = _large_set(n)
        large = large_factors(X, ks, trials=trials)
        print(f"\n== Large-n Nystrom, diamonds n={n}, sigma=0.5: Frobenius factor / seconds ==")
        for s, byk in large.items():
            cells = [f"{np.median([f for f, _ in v]):.3f} / {np.median([t for _, t in v]):.2f}s"
                     for v in byk.values()]
            print(f"{s:12s}" + "".join(f"{c:>22s}" for c in cells))
    if a.plot:
        _plot(cssp, large, a.plot)
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


if __name__ == "__main__":
    main()
