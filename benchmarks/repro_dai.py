"""Dai et al., doubly stochastic functional gradients: error against iterations, the paper's
O(1/t) rate (Fig. 4(2)) and test error against data points seen next to fixed random features
+ SGD and a batch reference (exact KRR and Nyström KRR on the same training set).

Data: the paper's synthetic regression ``y = cos(0.5 pi |x|) exp(-0.1 pi |x|) + 0.1 e`` on
``[-5, 5]^2`` (x uniform), Gaussian kernel with sigma = 0.1 x median distance (the paper's).

* rate: on a fixed training set of n rows, distance ``|f_t - f*|^2`` (on 2000 fresh inputs) of the
  iterate and of the averaged iterate to the exact regularised solution f*, steps theta/t with
  theta nu = 1, and the fitted log-log slope (theory: -1).
* error: test MSE of doubly SGD (nu = 1e-6, preconditioned steps) against data points seen, with
  scikit-learn ``RBFSampler`` + ``SGDRegressor`` (r = 2^8 and 2^10 fixed random features, same
  kernel, same batches) and the batch references as horizontal lines.

Usage::

    python benchmarks/repro_dai.py [--quick] [--n 4096] [--iters 512] [--plot docs/img]
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernelflow.datasets._doubly_stochastic import make_doubly_stochastic_regression  # noqa: E402
from kernelflow.kernels import Gaussian, median_heuristic  # noqa: E402
from kernelflow.solvers.doubly_stochastic import DoublyStochasticModel, StepSchedule  # noqa: E402


def rate_curve(n=1024, iters=128, batch=64, nu=1e-2, seed=0):
    """Checkpoints t = 8, 16, ... and ``|f_t - f*|^2``, ``|avg f_t - f*|^2`` on fresh inputs.

    Returns ``(t, err, err_avg, slope_avg)`` with the log-log slope of the averaged iterate's error
    fitted over t >= 32 (or all checkpoints if fewer).
    """
    X, y = make_doubly_stochastic_regression(n, random_state=seed)
    Xe, _ = make_doubly_stochastic_regression(2000, random_state=seed + 1)
    X, y, Xe = (torch.as_tensor(a) for a in (X, y, Xe))
    ker = Gaussian(0.1 * median_heuristic(X))
    K, Ke = ker(X), ker(Xe, X)
    f_star = Ke @ torch.linalg.solve(K + n * nu * torch.eye(n, dtype=K.dtype), y)
    m = DoublyStochasticModel(ker, 2, 1, alpha=nu, block_size=batch, seed=seed, average=True,
                              schedule=StepSchedule("inverse", eta0=1.0 / nu))
    g = torch.Generator().manual_seed(seed)
    cps = {2**i for i in range(3, int(math.log2(iters)) + 1)}
    rows = []
    for t in range(1, iters + 1):
        idx = torch.randint(0, n, (batch,), generator=g)
        m.step(X[idx], y[idx, None])
        if t in cps:
            e = float(((m.decision_function(Xe)[:, 0] - f_star) ** 2).mean())
            ea = float(((m.decision_function(Xe, averaged=True)[:, 0] - f_star) ** 2).mean())
            rows.append((t, e, ea))
    E = np.array(rows)
    tail = E[:, 0] >= 32 if (E[:, 0] >= 32).sum() >= 2 else np.ones(len(E), bool)
    slope = float(np.polyfit(np.log(E[tail, 0]), np.log(E[tail, 2]), 1)[0])
    return E[:, 0], E[:, 1], E[:, 2], slope


def error_curves(n=4096, iters=256, batch=64, components=(256, 1024), seed=0):
    """Test MSE against points seen: doubly SGD, RFF + SGD per r, and the batch references."""
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.linear_model import SGDRegressor

    from kernelflow.estimators import NystromKernelRidge

    X, y = make_doubly_stochastic_regression(n, random_state=seed)
    Xt, yt = make_doubly_stochastic_regression(2000, random_state=seed + 2)
    sigma = 0.1 * median_heuristic(torch.as_tensor(X))
    ker = Gaussian(sigma)
    Xa, ya, Xta = (torch.as_tensor(a) for a in (X, y, Xt))
    # batch references with the paper's nu = 1e-6 (ridge n * nu on the kernel matrix)
    nu = 1e-6
    t0 = time.perf_counter()
    beta = torch.linalg.solve(ker(Xa) + n * nu * torch.eye(n, dtype=torch.float64), ya)
    exact = float((((ker(Xta, Xa) @ beta).numpy() - yt) ** 2).mean())
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    nys = NystromKernelRidge(n_components=256, sigma=sigma, alpha=nu, random_state=seed).fit(X, y)
    nys_mse = float(((nys.predict(Xt) - yt) ** 2).mean())
    t_nys = time.perf_counter() - t0

    m = DoublyStochasticModel(ker, 2, 1, alpha=nu, block_size=batch, seed=seed, precondition=5.0,
                              fit_intercept=True)
    rffs = {}
    for r in components:
        # RBFSampler's gamma: exp(-gamma |x - x'|^2) = Gaussian(sigma) with gamma = 1/(2 sigma^2)
        rff = RBFSampler(gamma=1.0 / (2 * sigma**2), n_components=r, random_state=seed).fit(X[:1])
        rffs[r] = (rff, SGDRegressor(learning_rate="invscaling", eta0=0.05, alpha=nu,
                                     random_state=seed))
    g = np.random.default_rng(seed)
    seen, curves = [], {"doubly SGD": []} | {f"RFF+SGD r={r}": [] for r in components}
    for t in range(1, iters + 1):
        idx = g.integers(0, n, batch)
        m.step(Xa[idx], ya[idx, None])
        for rff, sgd in rffs.values():
            sgd.partial_fit(rff.transform(X[idx]), y[idx])
        if t & (t - 1) == 0 and t >= 4:
            seen.append(t * batch)
            curves["doubly SGD"].append(
                float(((m.decision_function(Xta)[:, 0].numpy() - yt) ** 2).mean()))
            for r, (rff, sgd) in rffs.items():
                curves[f"RFF+SGD r={r}"].append(
                    float(((sgd.predict(rff.transform(Xt)) - yt) ** 2).mean()))
    refs = {"exact KRR": (exact, t_exact), "Nystrom KRR m=256": (nys_mse, t_nys)}
    return np.array(seen), curves, refs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small smoke run")
    p.add_argument("--n", type=int, default=4096, help="training rows")
    p.add_argument("--iters", type=int, default=512, help="iterations (batches)")
    p.add_argument("--plot", default=None, help="folder for repro_dai.png")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    n, iters, b = (1024, 128, 64) if a.quick else (a.n, a.iters, 128)
    ts, e, ea, slope = rate_curve(n=n, iters=iters, batch=b)
    print(f"== O(1/t): n={n}, batch=block={b}, nu=1e-2, theta nu = 1 ==")
    print(f"{'t':>6s} {'|f_t - f*|^2':>14s} {'|avg f_t - f*|^2':>18s}")
    for row in zip(ts, e, ea):
        print(f"{int(row[0]):6d} {row[1]:14.3e} {row[2]:18.3e}")
    print(f"log-log slope of the averaged iterate (t >= 32): {slope:.2f} (theory -1)\n")
    seen, curves, refs = error_curves(n=n, iters=iters, batch=64)
    print(f"== test MSE against points seen (noise floor 0.01), n={n}, batch 64 ==")
    print(f"{'points':>8s}" + "".join(f"{k:>18s}" for k in curves))
    for i, s in enumerate(seen):
        print(f"{s:8d}" + "".join(f"{v[i]:18.5f}" for v in curves.values()))
    for k, (mse, secs) in refs.items():
        print(f"{k}: test MSE {mse:.5f} ({secs:.2f} s)")
    if a.plot:
        _plot(ts, e, ea, slope, seen, curves, refs, a.plot)


def _plot(ts, e, ea, slope, seen, curves, refs, folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.loglog(ts, e, "o-", color="#9ecae1", label="iterate f_t")
    a1.loglog(ts, ea, "o-", color="#08519c", label=f"averaged (slope {slope:.2f})")
    a1.loglog(ts, ea[0] * ts[0] / ts, ":", color="blue", label="1/t guide")
    a1.set_xlabel("iteration t")
    a1.set_ylabel("|f - f*|^2")
    a1.set_title("rate to the regularised solution", fontsize=9)
    a1.legend(fontsize=8)
    colours = ["#08519c", "#e6550d", "#fdae6b"]
    for (k, v), c in zip(curves.items(), colours):
        a2.loglog(seen, v, "o-", color=c, label=k)
    for (k, (mse, _)), ls in zip(refs.items(), ["-", "--"]):
        a2.axhline(mse, color="black", ls=ls, lw=1, label=k)
    a2.axhline(0.01, color="0.6", ls=":", lw=1, label="noise floor")
    a2.set_xlabel("training points seen")
    a2.set_ylabel("test MSE")
    a2.set_title("test error, synthetic regression", fontsize=9)
    a2.legend(fontsize=7)
    for ax in (a1, a2):
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path = os.path.join(folder, "repro_dai.png")
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
