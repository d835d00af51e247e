"""Dai et al., doubly stochastic functional gradients: the O(1/t) rate (Fig. 4(2)), test error
against points seen and against training time next to SGD on fixed random and fixed Nyström
features with r = 2^8, 2^10, 2^12 (Fig. 4(3), Fig. 6), and the GP regression of Fig. 5.

* rate: on a fixed training set of n rows, distance ``|f_t - f*|^2`` (on 2000 fresh inputs) of the
  iterate and of the averaged iterate to the exact regularised solution f*, steps theta/t with
  theta nu = 1, and the fitted log-log slope (theory: -1). Data: the paper's synthetic regression
  ``y = cos(0.5 pi |x|) exp(-0.1 pi |x|) + 0.1 e`` on ``[-5, 5]^2``, Gaussian kernel with
  sigma = 0.1 x median distance (the paper's).
* regression race (same data): test MSE of doubly SGD (nu = 1e-6, preconditioned steps) against
  data points seen and against training wall time, next to ``SGDRegressor`` on fixed features of
  the same kernel, fed the same batches: scikit-learn ``RBFSampler`` random features and
  kernelflow's ``Nystroem`` map with uniform landmarks, r in {2^8, 2^10, 2^12}; exact KRR and
  Nyström KRR as batch references.
* classification race: a generated covtype-like binary problem (many Gaussian clusters per
  class in 10 dimensions, scikit-learn ``make_classification``; nothing is downloaded), hinge
  loss, nu = 1/n and the median-trick bandwidth as in the paper's Forest runs:
  ``DoublyStochasticClassifier`` against ``SGDClassifier`` on the same fixed features; test
  error rate against points seen and time, with an exact ``SVC`` as batch reference.
* GP: posterior mean and variance of ``gp_posterior`` (doubly stochastic KRR, variance by the
  paper's method 2) against the exact GP (scikit-learn ``GaussianProcessRegressor`` with the same
  fixed kernel and noise) on a 1-D version of the synthetic data, n = 2^11, noise variance 0.1,
  batch 64, feature block 512 (the paper's), against iterations.

Times are the wall time of each method's own training (feature map and feature table included
for the fixed-feature methods, evaluation excluded), single thread, measured in one run.

Usage::

    python benchmarks/repro_dai.py [--quick] [--n 8192] [--iters 512] [--plot docs/img]
                                   [--save FILE] [--replot FILE]
    python benchmarks/repro_dai.py --tuned-classification   # Fig. 6, every method tuned
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernelflow.datasets._doubly_stochastic import make_doubly_stochastic_regression  # noqa: E402
from kernelflow.kernels import Gaussian, median_heuristic  # noqa: E402
from kernelflow.solvers.doubly_stochastic import (  # noqa: E402
    DoublyStochasticModel,
    StepSchedule,
    gp_posterior,
)

COMPONENTS = (256, 1024, 4096)
#: steps of the regression race, each the best of a small grid on this data (``step_grid``):
#: doubly SGD ``1/(1 + DECAY t)`` (O(1/t) as the theory asks), SGD on fixed features
#: scikit-learn's ``invscaling`` ``ETA0 / t^0.25``
DECAY, ETA0 = 0.1, 0.5


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


# ---- the race: every method sees the same batches; its own training time is clocked -----------
class _Doubly:
    """Doubly SGD regression on the solver model (one block per batch), steps
    ``1/(1 + decay t)``."""

    def __init__(self, ker, d, nu, block, seed, decay=DECAY):
        self.m = DoublyStochasticModel(ker, d, 1, alpha=nu, block_size=block, seed=seed,
                                       precondition=5.0, fit_intercept=True,
                                       schedule=StepSchedule("inverse_scaling", decay=decay))

    def step(self, X, y):
        self.m.step(torch.as_tensor(X), torch.as_tensor(y)[:, None])

    def predict(self, X):
        return self.m.decision_function(torch.as_tensor(X))[:, 0].numpy()


class _DoublyClassifier:
    """``DoublyStochasticClassifier.partial_fit`` with one mini-batch per call."""

    def __init__(self, sigma, nu, batch, block, seed, classes):
        from kernelflow.estimators.doubly_stochastic_classifier import (
            DoublyStochasticClassifier,
        )

        self.c = DoublyStochasticClassifier(sigma=sigma, alpha=nu, batch_size=batch,
                                            block_size=block, random_state=seed)
        self.classes = classes

    def step(self, X, y):
        self.c.partial_fit(X, y, classes=self.classes)

    def predict(self, X):
        return self.c.predict(X)


class _Fixed:
    """SGD on a fixed feature map: the map is fitted and the training rows mapped once (setup,
    clocked); each step is one ``partial_fit`` on the batch's rows of the feature table."""

    def __init__(self, fmap, sgd, X, classes=None):
        self.fmap, self.sgd, self.classes = fmap, sgd, classes
        self.Z = fmap.fit(X).transform(X)

    def step(self, idx, y):
        kw = {} if self.classes is None else {"classes": self.classes}
        self.sgd.partial_fit(self.Z[idx], y, **kw)

    def predict(self, X):
        return self.sgd.predict(self.fmap.transform(X))


def _feature_maps(sigma, r, seed):
    from sklearn.kernel_approximation import RBFSampler

    from kernelflow.estimators.nystroem import Nystroem

    # RBFSampler's gamma: exp(-gamma |x - x'|^2) = Gaussian(sigma) with gamma = 1/(2 sigma^2)
    return {f"RFF r={r}": RBFSampler(gamma=1.0 / (2 * sigma**2), n_components=r,
                                     random_state=seed),
            f"Nystrom r={r}": Nystroem(sigma=sigma, n_components=r, landmarks="uniform",
                                       random_state=seed)}


def _race(make, X, y, Xt, score, iters, batch, seed):
    """Run every method of ``make`` (name -> (constructor, fixed?)) on the same batches.

    Returns ``(seen, errors, seconds)``: checkpoints at powers of two (t >= 4), per method the
    test error and the cumulative training time at each checkpoint.
    """
    methods, secs = {}, {}
    for name, build in make.items():
        t0 = time.perf_counter()
        methods[name] = build()
        secs[name] = time.perf_counter() - t0
    g = np.random.default_rng(seed)
    seen, errors = [], {k: [] for k in methods}
    clock = {k: [] for k in methods}
    for t in range(1, iters + 1):
        idx = g.integers(0, len(X), batch)
        for name, m in methods.items():
            t0 = time.perf_counter()
            m.step(idx if isinstance(m, _Fixed) else X[idx], y[idx])
            secs[name] += time.perf_counter() - t0
        if (t & (t - 1) == 0 and t >= 4) or t == iters:
            seen.append(t * batch)
            for name, m in methods.items():
                errors[name].append(score(m.predict(Xt)))
                clock[name].append(secs[name])
    return np.array(seen), errors, clock


def regression_race(n=8192, iters=512, batch=64, components=COMPONENTS, block=128, seed=0,
                    decay=DECAY, eta0=ETA0, refs=True):
    """Test MSE against points seen and time: doubly SGD and SGD on RFF / Nyström features.

    Returns ``(seen, errors, seconds, refs)``; ``refs`` maps a batch reference to
    ``(test MSE, seconds)`` (empty with ``refs=False``); ``decay=None`` leaves doubly SGD out.
    """
    from sklearn.linear_model import SGDRegressor

    from kernelflow.estimators import NystromKernelRidge

    X, y = make_doubly_stochastic_regression(n, random_state=seed)
    Xt, yt = make_doubly_stochastic_regression(2000, random_state=seed + 2)
    sigma = 0.1 * median_heuristic(torch.as_tensor(X))
    ker = Gaussian(sigma)
    nu = 1e-6  # the paper's; ridge n nu on the kernel matrix

    def mse(p):
        return float(((np.asarray(p) - yt) ** 2).mean())

    make = {} if decay is None else {
        "doubly SGD": lambda: _Doubly(ker, X.shape[1], nu, block, seed, decay)}
    for r in components:
        for name, fmap in _feature_maps(sigma, r, seed).items():
            make[name] = (lambda fmap=fmap: _Fixed(fmap, SGDRegressor(
                learning_rate="invscaling", eta0=eta0, alpha=nu, random_state=seed), X))
    seen, errors, secs = _race(make, X, y, Xt, mse, iters, batch, seed)
    if not refs:
        return seen, errors, secs, {}

    Xa, ya, Xta = (torch.as_tensor(a) for a in (X, y, Xt))
    t0 = time.perf_counter()
    beta = torch.linalg.solve(ker(Xa) + n * nu * torch.eye(n, dtype=torch.float64), ya)
    out = {"exact KRR": (mse((ker(Xta, Xa) @ beta).numpy()), time.perf_counter() - t0)}
    m = max(components)
    t0 = time.perf_counter()
    nys = NystromKernelRidge(n_components=m, sigma=sigma, alpha=nu, solver="direct",
                             random_state=seed).fit(X, y)
    out[f"Nystrom KRR m={m}"] = (mse(nys.predict(Xt)), time.perf_counter() - t0)
    return seen, errors, secs, out


def step_grid(n=8192, iters=512, batch=64, components=(256, 1024), decays=(1e-3, 0.02, 0.1),
              etas=(0.05, 0.2, 0.5, 1.0), seed=0):
    """Final test MSE of the regression race for each step setting (the grids behind DECAY and
    ETA0): ``{("doubly SGD", decay): mse}`` and ``{(fixed-feature method, eta0): mse}``."""
    out = {}
    for dec in decays:
        _, err, _, _ = regression_race(n, iters, batch, components=(), seed=seed, decay=dec,
                                       refs=False)
        out[("doubly SGD", dec)] = err["doubly SGD"][-1]
    for eta in etas:
        _, err, _, _ = regression_race(n, iters, batch, components=components, seed=seed,
                                       decay=None, eta0=eta, refs=False)
        out |= {(k, eta): v[-1] for k, v in err.items()}
    return out


def make_covtype_like(n_samples, *, n_features=10, random_state=0):
    """A binary problem with a complicated boundary: 16 Gaussian clusters per class in 10
    dimensions (8 informative), 1 % flipped labels, standardised."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples, n_features=n_features, n_informative=8, n_redundant=0,
                               n_clusters_per_class=16, class_sep=1.5, flip_y=0.01,
                               random_state=random_state)
    return (X - X.mean(0)) / X.std(0), y


def classification_race(n=16384, iters=256, batch=256, components=COMPONENTS, block=256,
                        seed=0):
    """Test error rate against points seen and time: ``DoublyStochasticClassifier`` and
    ``SGDClassifier`` on RFF / Nyström features (hinge loss, nu = 1/n).

    Returns ``(seen, errors, seconds, refs)``.
    """
    from sklearn.linear_model import SGDClassifier
    from sklearn.svm import SVC

    X, y = make_covtype_like(n + 2000, random_state=seed)
    X, Xt, y, yt = X[:n], X[n:], y[:n], y[n:]
    sigma = median_heuristic(torch.as_tensor(X))
    nu = 1.0 / n
    classes = np.unique(y)

    def err(p):
        return float((np.asarray(p) != yt).mean())

    make = {"doubly SGD": lambda: _DoublyClassifier(sigma, nu, batch, block, seed, classes)}
    for r in components:
        for name, fmap in _feature_maps(sigma, r, seed).items():
            make[name] = (lambda fmap=fmap: _Fixed(fmap, SGDClassifier(
                alpha=nu, random_state=seed), X, classes))
    seen, errors, secs = _race(make, X, y, Xt, err, iters, batch, seed)
    t0 = time.perf_counter()
    svc = SVC(C=1.0 / (nu * n), gamma=1.0 / (2 * sigma**2)).fit(X, y)
    refs = {"exact SVC": (err(svc.predict(Xt)), time.perf_counter() - t0)}
    return seen, errors, secs, refs


def gp_curves(n=2048, n_test=64, iters=256, batch=64, block=512, noise_variance=0.1, seed=0):
    """Doubly stochastic GP posterior against the exact GP on a 1-D version of the data.

    ``gp_posterior`` is called with ``n_iter`` = 16, 32, ..., ``iters`` (same seeds, so the
    first iterations coincide). Returns a dict with the checkpoints ``t``, the mean squared
    distances ``mean_err`` = mean (mu - mu_gp)^2 and ``var_err`` = mean |var - var_gp| over the
    test grid, and the grid, data and final/exact posteriors for the plot.
    """
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF

    X, y = make_doubly_stochastic_regression(n, n_features=1, random_state=seed)
    Xs = np.linspace(-5, 5, n_test)[:, None]
    sigma = 0.25 * median_heuristic(torch.as_tensor(X))
    t0 = time.perf_counter()
    gp = GaussianProcessRegressor(RBF(sigma, length_scale_bounds="fixed"), alpha=noise_variance,
                                  optimizer=None).fit(X, y)
    mu_gp, sd_gp = gp.predict(Xs, return_std=True)
    t_gp = time.perf_counter() - t0
    var_gp = sd_gp**2
    ts, me, ve, tsec = [], [], [], []
    mu = var = np.zeros(n_test)
    for k in range(4, int(math.log2(iters)) + 1):
        t0 = time.perf_counter()
        mu_t, var_t = gp_posterior(Gaussian(sigma), torch.as_tensor(X), torch.as_tensor(y),
                                   torch.as_tensor(Xs), noise_variance=noise_variance,
                                   n_iter=2**k, batch_size=batch, block_size=block, seed=seed,
                                   random_state=seed)
        tsec.append(time.perf_counter() - t0)
        mu, var = mu_t.numpy(), var_t.numpy()
        ts.append(2**k)
        me.append(float(((mu - mu_gp) ** 2).mean()))
        ve.append(float(np.abs(var - var_gp).mean()))
    return {"t": np.array(ts), "mean_err": np.array(me), "var_err": np.array(ve),
            "seconds": np.array(tsec), "t_exact": t_gp, "sigma": sigma, "X": X, "y": y,
            "Xs": Xs[:, 0], "mu": mu, "var": var, "mu_gp": mu_gp, "var_gp": var_gp}


# ---- report --------------------------------------------------------------------------------------
def _print_race(title, seen, errors, secs, refs, fmt):
    print(f"== {title} ==")
    names = list(errors)
    print(f"{'points':>8s}" + "".join(f"{k:>17s}" for k in names))
    for i, s in enumerate(seen):
        print(f"{s:8d}" + "".join(f"{fmt.format(errors[k][i]):>17s}" for k in names))
    print(f"{'seconds':>8s}" + "".join(f"{secs[k][-1]:17.2f}" for k in names))
    for k, (e, t) in refs.items():
        print(f"{k} (batch): {fmt.format(e)} ({t:.2f} s)")
    print()


class _FixedTable(_Fixed):
    """SGD on a feature table fitted once and shared by the settings of a grid."""

    def __init__(self, fmap, Z, sgd, classes=None):
        self.fmap, self.Z, self.sgd, self.classes = fmap, Z, sgd, classes


#: the tuning budget of the classification race: four settings per method, each run for the
#: same iterations on the same batches, chosen by the error on held-out training rows
DOUBLY_ETA0 = (0.1, 0.3, 1.0, 3.0)
SGD_STEPS = ("optimal", 0.01, 0.1, 1.0)


def tuned_classification(n=16384, iters=256, batch=256, components=COMPONENTS, block=256,
                         seed=0, n_val=2000):
    """The classification race with every method tuned on the same budget.

    The last ``n_val`` training rows are held out; every method runs each of its four settings
    on the other rows for ``iters`` batches (the same batches for all) and keeps the setting
    with the lowest validation error at the end: doubly SGD its step ``eta0`` (``DOUBLY_ETA0``,
    default 1), SGD on fixed features its step (``SGD_STEPS``: scikit-learn's default
    ``optimal`` schedule 1 / (nu (t + t0)), or ``invscaling`` eta0 / t^0.25 with eta0 = 0.01,
    0.1 or 1); the penalty stays nu = 1/n for all. Both grids hold the default. The chosen
    settings are then rerun on all n rows against the same test rows as
    :func:`classification_race`.

    Returns ``(chosen, validation, (seen, errors, seconds, refs))``.
    """
    from sklearn.linear_model import SGDClassifier

    X, y = make_covtype_like(n + 2000, random_state=seed)
    X, Xt, y, yt = X[:n], X[n:], y[:n], y[n:]
    sigma = median_heuristic(torch.as_tensor(X))
    nu = 1.0 / n
    classes = np.unique(y)
    Xf, yf, Xv, yv = X[:-n_val], y[:-n_val], X[-n_val:], y[-n_val:]

    def sgd(step, alpha):
        if step == "optimal":
            return SGDClassifier(alpha=alpha, random_state=seed)
        return SGDClassifier(alpha=alpha, learning_rate="invscaling", eta0=step,
                             random_state=seed)

    def err_on(target):
        return lambda p: float((np.asarray(p) != target).mean())

    def doubly(eta0, alpha):

        m = _DoublyClassifier(sigma, alpha, batch, block, seed, classes)
        m.c.set_params(eta0=eta0)
        return m

    def grid(Xa, nu_a):
        make, names = {}, {}
        for e in DOUBLY_ETA0:
            key = f"doubly SGD eta0={e:g}"
            make[key] = lambda e=e: doubly(e, nu_a)
            names[key] = ("doubly SGD", e)
        for r in components:
            for name, fmap in _feature_maps(sigma, r, seed).items():
                Z = fmap.fit(Xa).transform(Xa)
                for step in SGD_STEPS:
                    key = f"{name} step={step}"
                    make[key] = (lambda fmap=fmap, Z=Z, step=step: _FixedTable(
                        fmap, Z, sgd(step, nu_a), classes))
                    names[key] = (name, step)
        return make, names

    make, names = grid(Xf, 1.0 / len(Xf))
    _, val_err, _ = _race(make, Xf, yf, Xv, err_on(yv), iters, batch, seed)
    validation = {names[k]: v[-1] for k, v in val_err.items()}
    chosen = {}
    for (method, setting), e in validation.items():
        if method not in chosen or e < validation[(method, chosen[method])]:
            chosen[method] = setting
    final = {"doubly SGD": lambda: doubly(chosen["doubly SGD"], nu)}
    for r in components:
        for name, fmap in _feature_maps(sigma, r, seed).items():
            final[name] = (lambda fmap=fmap, step=chosen[name]: _Fixed(
                fmap, sgd(step, nu), X, classes))
    seen, errors, secs = _race(final, X, y, Xt, err_on(yt), iters, batch, seed)
    return chosen, validation, (seen, errors, secs, {})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small smoke run (under a minute)")
    p.add_argument("--n", type=int, default=8192, help="training rows of the regression race")
    p.add_argument("--iters", type=int, default=512, help="iterations (batches) of the races")
    p.add_argument("--plot", default=None, help="folder for the repro_dai*.png figures")
    p.add_argument("--save", default=None, help="pickle the results to this file")
    p.add_argument("--tuned-classification", action="store_true",
                   help="only the classification race with every method tuned on the same "
                        "budget (tuned_classification)")
    p.add_argument("--replot", default=None,
                   help="draw the figures from a file written by --save (no run)")
    a = p.parse_args(argv)
    if a.replot:
        with open(a.replot, "rb") as fh:
            _plot(a.plot or ".", *pickle.load(fh))
        return
    torch.set_num_threads(1)
    if a.tuned_classification:
        n_cls, it_cls = (2048, 32) if a.quick else (16384, a.iters // 2)
        comps = (64, 256) if a.quick else COMPONENTS[:2]  # 2^12 features: 30-50 s of setup each
        chosen, val, race = tuned_classification(n=n_cls, iters=it_cls, components=comps)
        print(f"== tuning on {n_cls - 2000} rows, validation error on 2000 held-out rows ==")
        for (method, setting), e in val.items():
            mark = " <- chosen" if chosen[method] == setting else ""
            label = "eta0" if method == "doubly SGD" else "step"
            print(f"{method:>16s} {label}={setting!s:<8s} {e:.4f}{mark}")
        print()
        _print_race(f"classification, tuned: test error rate, n={n_cls}, batch 256", *race,
                    "{:.4f}")
        return
    if a.quick:
        n, iters, comps, n_cls, it_cls, n_gp, it_gp = 1024, 64, (64, 256), 2048, 32, 512, 64
    else:
        n, iters, comps, n_cls, it_cls, n_gp, it_gp = (a.n, a.iters, COMPONENTS, 16384,
                                                       a.iters // 2, 2048, a.iters // 2)
    t_all = time.perf_counter()
    b = 64 if a.quick else 128
    ts, e, ea, slope = rate_curve(n=min(n, 2048), iters=iters // 2 if a.quick else 256, batch=b)
    print(f"== O(1/t): n={min(n, 2048)}, batch=block={b}, nu=1e-2, theta nu = 1 ==")
    print(f"{'t':>6s} {'|f_t - f*|^2':>14s} {'|avg f_t - f*|^2':>18s}")
    for row in zip(ts, e, ea):
        print(f"{int(row[0]):6d} {row[1]:14.3e} {row[2]:18.3e}")
    print(f"log-log slope of the averaged iterate (t >= 32): {slope:.2f} (theory -1)\n")

    reg = regression_race(n=n, iters=iters, batch=64, components=comps)
    _print_race(f"regression: test MSE (noise floor 0.01), n={n}, batch 64", *reg, "{:.5f}")
    grid = step_grid(n=n, iters=iters, components=comps[:2])
    print(f"== step sizes: final test MSE after {iters} iterations ==")
    for (k, v), mse in grid.items():
        print(f"{k:>16s} {'decay' if k == 'doubly SGD' else 'eta0':>5s}={v:<6g} {mse:.5f}")
    print()
    cls = classification_race(n=n_cls, iters=it_cls, batch=256, components=comps)
    _print_race(f"classification: test error rate, n={n_cls}, batch 256", *cls, "{:.4f}")
    gp = gp_curves(n=n_gp, n_test=64, iters=it_gp)
    print(f"== GP regression (1-D), n={n_gp}, noise variance 0.1, batch 64, block 512, "
          f"sigma={gp['sigma']:.3f} ==")
    print(f"{'iters':>6s} {'mean (mu-mu_gp)^2':>18s} {'mean |var-var_gp|':>18s} {'seconds':>8s}")
    for row in zip(gp["t"], gp["mean_err"], gp["var_err"], gp["seconds"]):
        print(f"{int(row[0]):6d} {row[1]:18.3e} {row[2]:18.3e} {row[3]:8.2f}")
    print(f"exact GP: {gp['t_exact']:.2f} s; mean exact posterior variance "
          f"{gp['var_gp'].mean():.3e}\n")
    print(f"total {time.perf_counter() - t_all:.0f} s")
    results = ((ts, e, ea, slope), reg, cls, gp, grid)
    if a.save:
        with open(a.save, "wb") as fh:
            pickle.dump(results, fh)
    if a.plot:
        _plot(a.plot, *results)


# ---- figures: one colour per method in every figure ----------------------------------------------
_DOUBLY = "#000000"
_RFF = ["#fdae6b", "#f16913", "#a63603"]  # light to dark with r
_NYS = ["#a1d99b", "#41ab5d", "#006d2c"]


def _colours(names):
    rff = [k for k in names if k.startswith("RFF")]
    nys = [k for k in names if k.startswith("Nystrom")]
    out = {"doubly SGD": (_DOUBLY, "o-")}
    out |= {k: (_RFF[i + 3 - len(rff)], "s--") for i, k in enumerate(rff)}
    out |= {k: (_NYS[i + 3 - len(nys)], "^:") for i, k in enumerate(nys)}
    return out


def _ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def _plain_ticks(ax):
    """No labels on the minor ticks of a log x axis (they overlap)."""
    ax.xaxis.set_minor_formatter(_ticker().NullFormatter())


def _log2_counts(ax):
    """A base-2 log x axis labelled with plain counts (256, 1024, ...)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_ticker().FormatStrFormatter("%d"))
    _plain_ticks(ax)


def _race_figure(plt, seen, errors, secs, refs, ylabel, title, floor=None, logy=True):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    style = _colours(list(errors))
    for k, v in errors.items():
        c, ls = style[k]
        lw = 2.2 if k == "doubly SGD" else 1.3
        a1.plot(seen, v, ls, color=c, lw=lw, ms=4, label=k)
        a2.plot(secs[k], v, ls, color=c, lw=lw, ms=4)
    for ax in (a1, a2):
        for (k, (e, _)), ls in zip(refs.items(), ["-", "-."]):
            ax.axhline(e, color="0.35", ls=ls, lw=1, label=f"{k} (batch)" if ax is a1 else None)
        if floor is not None:
            ax.axhline(floor, color="0.6", ls=":", lw=1,
                       label="noise floor" if ax is a1 else None)
        ax.set_xscale("log")
        ax.set_yscale("log" if logy else "linear")
        ax.grid(alpha=0.3, which="both")
        _plain_ticks(ax)
    _log2_counts(a1)
    a1.set_xticks(seen[::2] if len(seen) > 6 else seen)
    a1.set_xlabel("training points seen")
    a2.set_xlabel("training wall time (s, single thread, shared machine)")
    a1.set_ylabel(ylabel)
    a1.set_title(f"{title}: error against points seen", fontsize=10)
    a2.set_title(f"{title}: error against training time", fontsize=10)
    fig.legend(loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def _plot(folder, rate, reg, cls, gp, grid=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts, e, ea, slope = rate
    fig, ax = plt.subplots(figsize=(5, 3.8))
    ax.loglog(ts, e, "o-", color="#9ecae1", label="iterate f_t")
    ax.loglog(ts, ea, "o-", color=_DOUBLY, label=f"averaged iterate (slope {slope:.2f})")
    ax.loglog(ts, ea[0] * ts[0] / ts, ":", color="blue", label="1/t guide")
    _log2_counts(ax)
    ax.set_xlabel("iteration t")
    ax.set_ylabel("|f - f*|^2 (mean over 2000 inputs)")
    ax.set_title("doubly SGD: distance to the regularised solution", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    paths = []

    def save(fig, name):
        paths.append(os.path.join(folder, name))
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)

    save(fig, "repro_dai.png")
    save(_race_figure(plt, *reg, "test MSE", "regression", floor=0.01),
         "repro_dai_regression.png")
    save(_race_figure(plt, *cls, "test error rate", "classification", logy=False),
         "repro_dai_classification.png")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.9))
    order = np.argsort(gp["X"][:, 0])
    a1.plot(gp["X"][order, 0], gp["y"][order], ".", color="0.75", ms=2, alpha=0.5,
            label="training data")
    for mu, var, c, ls, lab in ((gp["mu_gp"], gp["var_gp"], "#d62728", "-", "exact GP"),
                                (gp["mu"], gp["var"], _DOUBLY, "--",
                                 f"doubly SGD, {int(gp['t'][-1])} iterations")):
        sd = np.sqrt(np.clip(var, 0, None))
        a1.plot(gp["Xs"], mu, ls, color=c, lw=1.5, label=f"{lab}: mean")
        a1.plot(gp["Xs"], mu + 2 * sd, ls, color=c, lw=0.8, alpha=0.7)
        a1.plot(gp["Xs"], mu - 2 * sd, ls, color=c, lw=0.8, alpha=0.7,
                label=f"{lab}: mean +- 2 sd")
    a1.set_xlabel("x")
    a1.set_ylabel("y, f(x) (no unit)")
    a1.set_title("GP posterior of the latent f, 1-D stand-in", fontsize=10)
    a1.set_ylim(-1.6, 2.4)
    a1.legend(fontsize=7, loc="upper center", ncol=2, frameon=False)
    a2.loglog(gp["t"], gp["mean_err"], "o-", color=_DOUBLY, label="mean: avg (mu - mu_gp)^2")
    a2.loglog(gp["t"], gp["var_err"], "s--", color="#6a51a3",
              label="variance: avg |var - var_gp|")
    _log2_counts(a2)
    a2.set_xlabel("iteration (batch 64, feature block 512)")
    a2.set_ylabel("distance to the exact posterior")
    a2.set_title("convergence to the exact GP posterior", fontsize=10)
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3, which="both")
    fig.tight_layout()
    save(fig, "repro_dai_gp.png")
    for path in paths:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
