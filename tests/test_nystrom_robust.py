"""Robust Nyström regression: sign-gradient (LAD), Huber and squared losses on streamed data."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.estimators.nystrom_robust import NystromRobustRegressor
from kernelflow.kernels import Gaussian
from kernelflow.operators import Options
from kernelflow.solvers.nystrom import nystrom_direct
from kernelflow.solvers.nystrom_robust import nystrom_loss_pass, nystrom_robust
from kernelflow.sources import ArraySource, ChunkSource

F64 = torch.float64
OPTS = Options(memory_budget=2**28)


def _data(n=300, d=2, seed=0, noise=0.1, outliers=0.0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, dtype=F64, generator=g) * 4 - 2
    f = torch.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    y = f + noise * torch.randn(n, dtype=F64, generator=g)
    if outliers:
        idx = torch.randperm(n, generator=g)[: int(outliers * n)]
        y[idx] += 30.0 + 10 * torch.rand(len(idx), dtype=F64, generator=g)
    return X, y, f


def test_sign_gradient_equals_ksgd_with_nystrom_kernel():
    """Allerbo Prop. 5.2: GD on |y - Phi beta| in feature space = sign GD on the dual a."""
    X, y, _ = _data(80)
    C, k, eta, steps = X[:15], Gaussian(0.7), 0.3, 12
    sol = nystrom_robust(ArraySource(X, y), k, C, loss="absolute", alpha=0.0,
                         learning_rate=eta, max_iter=steps, tol=0.0, preconditioned=False,
                         fit_intercept=False, options=OPTS)
    Knm = k(X, C)
    Kt = Knm @ torch.linalg.solve(k(C), Knm.T)  # Nyström kernel K~ = K_nM K_MM^-1 K_Mn
    a = torch.zeros(80, dtype=F64)
    for _ in range(steps):
        a = a + (eta / 80) * torch.sign(y - Kt @ a)
    assert sol.n_iter == steps
    assert torch.allclose(Knm @ sol.coef[:, 0], Kt @ a, atol=1e-8)
    assert float(a.abs().max()) <= steps * eta / 80 + 1e-15  # ||a_k||_inf <= k eta (T11)


def test_squared_loss_converges_to_nystrom_krr():
    X, y, _ = _data(300)
    C, k, alpha = X[:30], Gaussian(1.0), 1.0
    ref = nystrom_direct(ArraySource(X, y), k, C, alpha)
    sol = nystrom_robust(ArraySource(X, y), k, C, loss="squared", alpha=alpha, max_iter=400,
                         tol=1e-14, fit_intercept=False, options=OPTS)
    K = k(X, C)
    assert float((K @ (sol.coef - ref)).norm() / (K @ ref).norm()) < 1e-5
    obj = np.array(sol.objective)
    assert np.all(np.diff(obj) <= 1e-12 * obj[0])  # accepted steps never increase (1)


def test_huber_with_huge_threshold_is_squared():
    X, y, _ = _data(200)
    C, k = X[:20], Gaussian(1.0)
    kw = dict(alpha=0.5, max_iter=15, tol=0.0, fit_intercept=False, options=OPTS)
    a = nystrom_robust(ArraySource(X, y), k, C, loss="huber", delta=1e6, **kw)
    b = nystrom_robust(ArraySource(X, y), k, C, loss="squared", **kw)
    assert torch.allclose(a.coef, b.coef, atol=1e-10)


def test_loss_pass_against_dense():
    X, y, _ = _data(97)
    C, k = X[:9], Gaussian(1.0)
    coef = torch.randn(9, 1, dtype=F64, generator=torch.Generator().manual_seed(1))
    b = torch.tensor([0.2], dtype=F64)
    w = torch.rand(97, dtype=F64, generator=torch.Generator().manual_seed(2))
    out = nystrom_loss_pass(ArraySource(X, y, w), k, C, coef, b, "huber", delta=0.5,
                            block_size=10)
    K = k(X, C)
    r = y - K @ coef[:, 0] - 0.2
    psi = r.clamp(-0.5, 0.5)
    rho = torch.where(r.abs() <= 0.5, 0.5 * r**2, 0.5 * r.abs() - 0.125)
    assert torch.allclose(out.grad[:, 0], K.T @ (w * psi))
    assert float(out.loss_sum) == pytest.approx(float(w @ rho))
    assert out.weight == pytest.approx(float(w.sum()))


def test_chunks_match_arrays():
    X, y, _ = _data(230, outliers=0.05)
    C, k = X[:20], Gaussian(0.8)

    def chunks():
        for s in range(0, 230, 70):
            yield X[s:s + 70].numpy(), y[s:s + 70].numpy()

    kw = dict(loss="huber", alpha=0.1, max_iter=20, options=OPTS, block_size=32)
    a = nystrom_robust(ArraySource(X, y), k, C, **kw)
    b = nystrom_robust(ChunkSource(chunks), k, C, store_kernel=False, **kw)  # fully streamed
    assert torch.allclose(a.coef, b.coef, rtol=1e-6, atol=1e-9)
    assert torch.allclose(a.intercept, b.intercept, atol=1e-9)


@pytest.mark.parametrize("loss", ["absolute", "huber"])
def test_robust_beats_ridge_under_gross_outliers(loss):
    X, y, _ = _data(600, outliers=0.05)
    Xt, _, ft = _data(300, seed=1)
    kw = dict(n_components=60, sigma=0.7, random_state=0)
    ridge = NystromKernelRidge(alpha=1e-3, **kw).fit(X, y)
    robust = NystromRobustRegressor(loss=loss, alpha=1e-3, max_iter=60, **kw).fit(X, y)
    rmse = {name: float(((m.predict(Xt) - ft) ** 2).mean().sqrt())
            for name, m in (("ridge", ridge), ("robust", robust))}
    assert rmse["robust"] < 0.5 * rmse["ridge"]
    assert rmse["robust"] < 0.2


def test_estimator_warm_start_continues():
    X, y, _ = _data(300, outliers=0.05)
    m = NystromRobustRegressor(n_components=30, sigma=0.7, loss="absolute", max_iter=5,
                               warm_start=True, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        m.fit(X, y)
        first = m.objective_[-1]
        m.fit(X, y)
    assert m.objective_[0] == pytest.approx(first, rel=1e-9)
    assert m.objective_[-1] <= first


def test_estimator_early_stopping_records_scores():
    X, y, _ = _data(400, outliers=0.05, noise=0.3)
    m = NystromRobustRegressor(n_components=40, sigma=0.5, alpha=0.0, early_stopping=True,
                               n_iter_no_change=3, max_iter=200, random_state=0).fit(X, y)
    assert len(m.validation_scores_) == m.n_iter_ + 1
    assert m.best_iteration_ == int(np.argmin(m.validation_scores_))


def test_constant_target_and_intercept():
    X = np.random.RandomState(0).rand(50, 2)
    m = NystromRobustRegressor(n_components=10, sigma=1.0).fit(X, np.full(50, 3.0))
    assert np.allclose(m.predict(X), 3.0, atol=0.05)


@pytest.mark.parametrize(
    "params, match",
    [({"loss": "hinge"}, "loss"), ({"alpha": -1.0}, "alpha"), ({"epsilon": 0.0}, "epsilon"),
     ({"learning_rate": "fast"}, "learning_rate"), ({"n_components": 1.5}, "n_components")],
)
def test_bad_params(params, match):
    with pytest.raises(ValueError, match=match):
        NystromRobustRegressor(**params).fit(np.ones((4, 2)), np.ones(4))


def test_bad_data():
    with pytest.raises(ValueError, match="NaN"):
        NystromRobustRegressor().fit(np.array([[np.nan, 1.0]]), np.array([1.0]))
    with pytest.raises(ValueError, match="inconsistent"):
        NystromRobustRegressor().fit(np.ones((3, 2)), np.ones(2))


@pytest.mark.parametrize("estimator", [NystromRobustRegressor(n_components=20, max_iter=8)])
def test_check_estimator(estimator):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check_estimator(estimator)
