"""Early-stopped kernel regression on the Huber loss (rule, estimator, path CV)."""

import numpy as np
import pytest
import torch

from kernelflow.estimators import KernelGradientDescent
from kernelflow.estimators.huber_path import (
    KernelHuberGradientDescent,
    KernelHuberGradientDescentCV,
)
from kernelflow.estimators.path_cv import KernelGradientDescentCV
from kernelflow.kernels import Gaussian
from kernelflow.solvers.path_cv import early_stopping_path_cv
from kernelflow.solvers.paths.driver import rule_path
from kernelflow.solvers.paths.rules import HuberRule


def _contaminated(n=200, seed=0, share=0.1):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(n)
    bad = rng.rand(n) < share
    y[bad] += rng.choice([-1, 1], bad.sum()) * rng.uniform(3, 6, bad.sum())
    Xt = np.linspace(-3, 3, 200)[:, None]
    return X, y, Xt, np.sin(2 * Xt[:, 0])


def _rmse(model, Xt, yt):
    return float(np.sqrt(np.mean((model.predict(Xt) - yt) ** 2)))


def test_step_is_the_huber_functional_gradient():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(7, generator=g, dtype=torch.float64) * 3
    alpha = torch.randn(7, generator=g, dtype=torch.float64)
    eps, eta = 1.1, 0.3
    # hand-computed psi: r inside [-eps, eps], eps sign(r) outside
    psi = torch.tensor([v if abs(v) <= eps else eps * np.sign(v) for v in r.tolist()],
                       dtype=torch.float64)
    got = HuberRule(eps).step(alpha, r, eta)
    assert torch.allclose(got, alpha + eta * psi, rtol=0, atol=1e-15)
    # the same from autograd: d/df sum huber(y - f) = -psi(y - f)
    f = torch.zeros(7, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.huber_loss(f, r, delta=eps, reduction="sum").backward()
    assert torch.allclose(-f.grad, psi, rtol=0, atol=1e-15)


def test_adaptive_threshold_is_the_residual_mad():
    r = torch.tensor([[0.0, 1.0, -2.0, 4.0, 100.0]], dtype=torch.float64)
    mad = float((r - r.median()).abs().median())
    eps = HuberRule().threshold(r)
    assert float(eps) == pytest.approx(1.345 * 1.4826 * mad)
    # masked rows (a fold's validation rows) do not enter the scale
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    sub = r[:, :4]
    want = 1.345 * 1.4826 * float((sub - sub.median()).abs().median())
    assert float(HuberRule().threshold(r, mask)) == pytest.approx(want)
    with pytest.raises(ValueError, match="epsilon"):
        HuberRule(-1.0)


def test_huge_epsilon_is_gradient_descent():
    X, y, Xt, _ = _contaminated(n=120, seed=1)
    kw = dict(sigma=0.7, random_state=0, fit_intercept=False, validation_loss="squared")
    huber = KernelHuberGradientDescent(epsilon=1e12, **kw).fit(X, y)
    gd = KernelGradientDescent(method="iterative", **kw).fit(X, y)
    assert huber.n_iter_ == gd.n_iter_ > 0
    assert huber.learning_rate_ == pytest.approx(gd.learning_rate_, rel=1e-12)
    np.testing.assert_allclose(huber.predict(Xt), gd.predict(Xt), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(huber.validation_indices_, gd.validation_indices_)


def test_beats_gradient_descent_on_gross_outliers():
    X, y, Xt, yt = _contaminated(n=200, seed=0)
    huber = KernelHuberGradientDescent(sigma=0.5, random_state=0).fit(X, y)
    gd = KernelGradientDescent(sigma=0.5, random_state=0).fit(X, y)
    assert _rmse(huber, Xt, yt) < 0.5 * _rmse(gd, Xt, yt)
    assert huber.epsilon_ < 0.5  # the adaptive threshold shrank to the noise level


def test_rule_path_weights_act_as_repeated_rows():
    g = torch.Generator().manual_seed(2)
    X = torch.rand(6, 1, generator=g, dtype=torch.float64)
    y = torch.randn(6, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 1.0], dtype=torch.float64)
    K = Gaussian(0.5)(X, X)
    rep = torch.repeat_interleave(torch.arange(6), w.long())
    Kr = Gaussian(0.5)(X[rep], X[rep])
    rule = HuberRule(0.3)
    a = rule_path(rule, K, y, sample_weight=w, learning_rate=0.05, max_iter=40).alpha
    ar = rule_path(rule, Kr, y[rep], learning_rate=0.05, max_iter=40).alpha
    summed = torch.zeros(6, dtype=torch.float64).index_add_(0, rep, ar)
    assert torch.allclose(a, summed, atol=1e-12)


def test_path_cv_torch_batch_equals_single_problems():
    X, y, _, _ = _contaminated(n=40, seed=3)
    Xt, yt = torch.tensor(X), torch.tensor(y - np.median(y))
    folds = [list(range(i, 40, 4)) for i in range(4)]
    kernels = [Gaussian(0.3), Gaussian(1.0)]
    res = early_stopping_path_cv(Xt, yt, kernels, folds, method=HuberRule(), step_size="auto",
                                 max_iter=300, n_iter_no_change=20, validation_loss="huber",
                                 low_rank=False)
    for s, kern in enumerate(kernels):
        one = early_stopping_path_cv(Xt, yt, [kern], folds, method=HuberRule(),
                                     step_size="auto", max_iter=300, n_iter_no_change=20,
                                     validation_loss="huber", low_rank=False)
        assert torch.equal(one.best_iter[0], res.best_iter[s])
        assert torch.allclose(one.fold_mse[0], res.fold_mse[s])
        assert float(one.step_size[0]) == float(res.step_size[s])


def test_cv_beats_gradient_descent_cv_on_outliers():
    X, y, Xt, yt = _contaminated(n=150, seed=0)
    kw = dict(sigmas=[0.1, 0.5, 2.0], cv=5, max_iter=3000, random_state=0)
    huber = KernelHuberGradientDescentCV(**kw).fit(X, y)
    gd = KernelGradientDescentCV(learning_rate="auto", **kw).fit(X, y)
    assert _rmse(huber, Xt, yt) < 0.5 * _rmse(gd, Xt, yt)
    assert huber.learning_rate_ > 0 and huber.t_ == huber.n_iter_ * huber.learning_rate_
