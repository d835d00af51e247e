"""Side by side with the authors' code of Allerbo's robust kernel regression, same data and folds.

Imports the unmodified ``help_fcts.py`` and ``proximal.py`` of a local checkout of the authors'
public repository (allerbo/fast_robust_kernel_regression; bring it in beforehand, nothing is
downloaded here). ``help_fcts`` imports ``rpy2`` at module level only for its quantile
regression, so empty stand-in modules are installed for it, and ``np.alltrue`` (removed in
NumPy 2) is aliased to ``np.all``.

Protocol (the authors' synthetic robust example): ``make_data_synth("sin", seed)`` -- 100
training points x ~ U(-10, 10), y = sin(pi x / 2) + 0.1 Cauchy, a 1000-point noiseless test
grid --; their ``cv10`` folds (``np.random.seed(seed)``, a permutation split in 10);
sigma = geomspace(0.01, 1000, 30); Gaussian kernel; no intercept. Protocols:

* KSGD / KCD: sign / coordinate descent, step 0.01, patience 100, at most 10 000 steps, refit at
  the mean best step (kernelflow: ``KernelSignGradientCV`` / ``KernelCoordinateDescentCV``,
  refit for ``n_iter_ - 1`` steps, the authors' 0-based count);
* KRR: 30 sigma x 30 lambda = geomspace(1e-6, 10, 30), 10-fold (kernelflow: ``KernelRidgeCV``
  with ``cv`` the same folds);
* KlinfR: the same grid with the published capped solver (ISTA, step 0.01, threshold lambda, at
  most 1000 iterations; kernelflow: :func:`kernelflow.solvers.grid_cv.penalized_grid_cv` with
  ``solver="published"`` and penalties lambda / 0.01, refit by the same loop).

Both sides run on one core (``OMP_NUM_THREADS=1`` and one torch thread), interleaved within each
seed (the side that goes first alternates), each protocol first run once untimed on both sides
(library and first-call set-up), then ``--repeats`` times per seed, keeping each side's best
time. Printed per seed and protocol: both times (CV + refit + prediction), the ratio, both
chosen hyperparameters and both test R^2 against the clean function.

Usage::

    python benchmarks/allerbo_vs_authors.py --authors /path/to/checkout --seeds 1 2
    python benchmarks/allerbo_vs_authors.py --authors /path/to/checkout --seeds 1-10 \\
        --protocols KSGD KCD KRR KlinfR --repeats 1

Without ``--authors`` it prints that the comparison was skipped and exits with status 0.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before NumPy loads its BLAS
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernelflow.estimators import KernelRidgeCV  # noqa: E402
from kernelflow.estimators.path_cv import (  # noqa: E402
    KernelCoordinateDescentCV,
    KernelSignGradientCV,
)
from kernelflow.kernels import Gaussian  # noqa: E402
from kernelflow.solvers.grid_cv import (  # noqa: E402
    _GridOperator,
    _published_ista,
    penalized_grid_cv,
)
from kernelflow.solvers.paths import coordinate_descent_path, sign_gradient_path  # noqa: E402

PROTOCOLS = ("KSGD", "KCD", "KRR", "KlinfR")
SIGMAS = np.geomspace(0.01, 1000, 30)
LAMBDAS = np.geomspace(1e-6, 10, 30)
STEP = 0.01


def load_authors(path: Path):
    """Import the authors' ``help_fcts`` from ``path`` with ``rpy2`` stubbed."""
    if not (path / "help_fcts.py").is_file() or not (path / "proximal.py").is_file():
        raise SystemExit(f"{path} holds no help_fcts.py and proximal.py of the authors' code.")
    names = ["rpy2", "rpy2.robjects", "rpy2.robjects.packages", "rpy2.rinterface_lib",
             "rpy2.rinterface_lib.callbacks"]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    robjects = sys.modules["rpy2.robjects"]
    robjects.r = None
    robjects.numpy2ri = types.SimpleNamespace(activate=lambda: None)
    sys.modules["rpy2.robjects.packages"].importr = lambda name: None
    sys.modules["rpy2.rinterface_lib"].callbacks = sys.modules["rpy2.rinterface_lib.callbacks"]
    if not hasattr(np, "alltrue"):
        np.alltrue = np.all
    sys.path.insert(0, str(path))
    import help_fcts  # noqa: PLC0415

    return help_fcts


def authors_folds(n: int, seed: int):
    """The folds of the authors' ``cv10``: a seeded permutation split in 10."""
    np.random.seed(seed)
    return np.array_split(np.random.permutation(n), 10)


def r2(y, yhat) -> float:
    y, yhat = np.asarray(y).reshape(-1), np.asarray(yhat).reshape(-1)
    return float(1 - np.mean((y - yhat) ** 2) / np.mean((y - y.mean()) ** 2))


def run_authors(hf, protocol, X, y, Xte, seed):
    quiet = contextlib.redirect_stdout(io.StringIO())
    if protocol in ("KSGD", "KCD"):
        alg = "sgd" if protocol == "KSGD" else "cd"
        with quiet:
            sigma, steps, _ = hf.cv10(X, y, SIGMAS, [None], [alg], seed, hf.kgd, 100)
        pred = hf.kgd(Xte, X, y, sigma, steps, alg, nu=100)[0]
        return pred, (float(sigma), int(steps))
    fun, hp3 = (hf.krr, None) if protocol == "KRR" else (hf.kpr, "linf")
    with quiet:
        sigma, lbda, _ = hf.cv10(X, y, SIGMAS, LAMBDAS, [hp3], seed, fun, 100)
    pred = fun(Xte, X, y, sigma, lbda, hp3, nu=100)[0]
    return pred, (float(sigma), float(lbda))


def run_ours(protocol, X, y, Xte, folds):
    Xt, yt, Xe = torch.tensor(X), torch.tensor(y[:, 0]), torch.tensor(Xte)
    n = Xt.shape[0]
    if protocol in ("KSGD", "KCD"):
        cls, path = ((KernelSignGradientCV, sign_gradient_path) if protocol == "KSGD"
                     else (KernelCoordinateDescentCV, coordinate_descent_path))
        params = dict(sigmas=SIGMAS, kernel=Gaussian(), cv=folds, learning_rate=STEP,
                      max_iter=10_000, n_iter_no_change=100, fit_intercept=False)
        if "validation_loss" in cls().get_params():
            params["validation_loss"] = "squared"  # the paper's protocol
        est = cls(**params).fit(Xt, yt)
        steps = max(int(est.n_iter_) - 1, 0)  # the authors' 0-based count
        coef = path(est.kernel_(Xt, Xt), yt, learning_rate=STEP, max_iter=steps).alpha
        return (est.kernel_(Xe, Xt) @ coef).numpy(), (float(est.sigma_), steps)
    kernels = [Gaussian(float(s)) for s in SIGMAS]
    if protocol == "KRR":
        splits = [(np.setdiff1d(np.arange(n), f), f) for f in folds]
        est = KernelRidgeCV(alphas=LAMBDAS, sigmas=SIGMAS, kernel=Gaussian(), cv=splits,
                            fit_intercept=False).fit(Xt, yt)
        return est.predict(Xe), (float(est.sigma_), float(est.alpha_))
    res = penalized_grid_cv(Xt, yt, kernels, LAMBDAS / STEP, folds, penalty="linf",
                            solver="published", max_iter=1000)
    i, j = res.best_index
    K = kernels[i](Xt, Xt)
    A, _ = _published_ista(_GridOperator(K[None], torch.ones(1, n, dtype=K.dtype), 1),
                           yt[None], torch.tensor([[LAMBDAS[j] / STEP]]), "linf",
                           torch.tensor([[STEP]]), torch.tensor([float(n)]), 1000)
    return (kernels[i](Xe, Xt) @ A[0]).numpy(), (float(SIGMAS[i]), float(LAMBDAS[j]))


def parse_seeds(items) -> list[int]:
    seeds = []
    for item in items:
        lo, _, hi = str(item).partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--authors", type=Path, default=None,
                    help="local checkout of allerbo/fast_robust_kernel_regression")
    ap.add_argument("--seeds", nargs="+", default=["1-10"], help="seeds, e.g. 1 2 or 1-10")
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs of each side per seed and protocol (best kept)")
    args = ap.parse_args(argv)
    if args.authors is None:
        print("allerbo_vs_authors: no --authors checkout given; comparison skipped.")
        return 0
    torch.set_num_threads(1)
    hf = load_authors(args.authors.resolve())
    print(f"{'protocol':8} {'seed':>4} {'authors s':>10} {'ours s':>9} {'ratio':>7}  "
          f"{'authors (sigma, hp)':28} {'ours (sigma, hp)':28} {'R2 auth':>8} {'R2 ours':>8}")
    ratios: dict[str, list[float]] = {p: [] for p in args.protocols}
    seeds = parse_seeds(args.seeds)
    X, y, Xte, _, _, _ = hf.make_data_synth("sin", seeds[0])
    for protocol in args.protocols:  # untimed: first-call set-up of both sides
        run_authors(hf, protocol, X, y, Xte, seeds[0])
        run_ours(protocol, X, y, Xte, authors_folds(X.shape[0], seeds[0]))
    for k, seed in enumerate(seeds):
        X, y, Xte, yte, _, _ = hf.make_data_synth("sin", seed)
        folds = authors_folds(X.shape[0], seed)
        for protocol in args.protocols:
            out = {}
            for _ in range(max(1, args.repeats)):
                for side in (("authors", "ours") if k % 2 == 0 else ("ours", "authors")):
                    t0 = time.perf_counter()
                    if side == "authors":
                        pred, hp = run_authors(hf, protocol, X, y, Xte, seed)
                    else:
                        pred, hp = run_ours(protocol, X, y, Xte, folds)
                    dt = time.perf_counter() - t0
                    if side not in out or dt < out[side][0]:
                        out[side] = (dt, hp, r2(yte, pred))
            (ta, ha, ra), (to, ho, ro) = out["authors"], out["ours"]
            ratios[protocol].append(ta / to)
            same = "" if np.allclose(ha, ho, rtol=1e-9) else "  DIFFERENT CHOICE"
            print(f"{protocol:8} {seed:4d} {ta:10.3f} {to:9.4f} {ta / to:6.1f}x  "
                  f"{str(tuple(round(v, 6) for v in ha)):28} "
                  f"{str(tuple(round(v, 6) for v in ho)):28} {ra:8.4f} {ro:8.4f}{same}",
                  flush=True)
    for protocol, rs in ratios.items():
        print(f"{protocol}: ratio median {np.median(rs):.1f}x, min {np.min(rs):.1f}x over "
              f"{len(rs)} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
