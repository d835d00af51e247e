"""The fast CPU routes of the default CV fits give the values of the tensor code.

HuberRule's adaptive threshold (two medians per problem and step) and the l1-ball level run on
NumPy views of CPU tensors, bit for bit; the l_inf prox and the published solver's l_inf step
run compiled (the same Newton iteration with sums in double: equal to rounding). The tensor
code remains the reference (other devices, autograd, NaN residuals, a zero MAD). These tests
compare the routes on hostile batches and on whole default fits.
"""

import warnings

import numpy as np
import pytest
import torch

from kernelflow.estimators.huber_path import KernelHuberGradientDescentCV
from kernelflow.estimators.penalized_cv import PenalizedKernelRegressorCV
from kernelflow.solvers import _native
from kernelflow.solvers import prox as prox_module
from kernelflow.solvers.paths.rules import HuberRule


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and values, NaN where NaN."""
    return (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            and torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0)))


def _reference_step(alpha, residual, eta, mask):
    eps = HuberRule()._tensor_threshold(residual, mask)
    return alpha + eta * torch.minimum(torch.maximum(residual, -eps), eps), eps


def _batch(rng, kind, dtype):
    G, F, n = rng.randint(1, 5), rng.randint(2, 7), rng.randint(1, 35)
    R = torch.from_numpy(rng.randn(G, F, n) * 10.0 ** rng.uniform(-6, 6)).to(dtype)
    if kind == "ties":  # zero MAD: the root-mean-square fallback
        R = torch.round(R / R.abs().max().clamp_min(1e-300))
    if kind == "nan":
        R.view(-1)[rng.choice(R.numel(), 2)] = float("nan")
    if kind == "inf":
        R.view(-1)[rng.choice(R.numel(), 2)] = float("inf")
        R.view(-1)[rng.choice(R.numel(), 1)] = -float("inf")
    if kind == "equal":  # every fold with the same number of training rows
        mask = torch.ones(F, n, dtype=dtype)
        m = rng.randint(0, n)
        for f in range(F):
            mask[f, rng.choice(n, m, replace=False)] = 0
    else:
        mask = torch.from_numpy(rng.rand(F, n) > 0.3).to(dtype)
    mask = mask.expand(G, F, n)
    R = torch.where(mask > 0, R, torch.zeros_like(R))
    return torch.from_numpy(rng.randn(G, F, n)).to(dtype), R, mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["plain", "equal", "ties", "nan", "inf"])
def test_huber_step_is_the_tensor_step(kind, dtype):
    rng = np.random.RandomState(len(kind))
    for trial in range(40):
        A, R, mask = _batch(rng, kind, dtype)
        eta = [1.0, 0.1, 0.37, 3][trial % 4]
        for m in (mask, None):
            want, eps = _reference_step(A, R, eta, m)
            rule = HuberRule()
            for _ in range(2):  # the second call reuses the cached layout of the mask
                got = rule.step(A, R, eta, m)
                assert _same(got, want)
                assert _same(torch.as_tensor(rule.last_epsilon), eps)
            assert _same(rule.threshold(R, m), eps)
            assert _same(rule.direction(R, m), torch.minimum(torch.maximum(R, -eps), eps))


def test_huber_step_follows_a_changed_mask():
    rng = np.random.RandomState(0)
    A, R, mask = _batch(rng, "plain", torch.float64)
    rule = HuberRule()
    rule.step(A, R, 1.0, mask)
    other = mask.clone()
    other[..., 0] = 1 - other[..., 0]
    R = R * other
    assert _same(rule.step(A, R, 1.0, other), _reference_step(A, R, 1.0, other)[0])


def _hostile_rows(rng, trial, max_rows, max_cols, dtype):
    """A batch of rows over twelve orders of magnitude: integers every fourth trial, ties at the
    cap (half a row equal) every fourth trial after it."""
    B, n = rng.randint(1, max_rows), rng.randint(1, max_cols)
    v = torch.from_numpy(rng.randn(B, n) * 10.0 ** rng.uniform(-6, 6)).to(dtype)
    if trial % 4 == 0:
        v = torch.round(v)
    if trial % 4 == 1:
        v[:, : n // 2] = v[:, :1]  # ties at the cap
    return v


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_l1_ball_level_is_the_tensor_level(dtype):
    rng = np.random.RandomState(1)
    for trial in range(300):
        v = _hostile_rows(rng, trial, 60, 50, dtype)
        B, n = v.shape
        if trial % 9 == 2:
            v.view(-1)[rng.choice(v.numel(), 2)] = float("nan")
        a = v.abs()
        scale = float(torch.nan_to_num(a, 1.0).sum(-1).max())
        radius = torch.from_numpy(rng.rand(B, 1) * scale * rng.choice([0.0, 0.1, 1.0, 2.0]))
        radius = radius.to(dtype) if trial % 7 else float(radius[0, 0])
        want = prox_module._l1_level_tensor(a, radius, None)
        got = prox_module._l1_level(a, radius, None)
        assert _same(got[0], want[0]) and torch.equal(got[1], want[1])


def _fitted(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(X, y)


def _problem(n, d, seed):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-2, 2, size=(n, d))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(n)
    y[::9] += 5.0  # outliers
    return X, y


def _assert_same_fit(fast, slow, X, attrs):
    for a in attrs:
        np.testing.assert_array_equal(np.asarray(getattr(fast, a)), np.asarray(getattr(slow, a)))
    np.testing.assert_array_equal(fast.predict(X), slow.predict(X))


def test_default_penalized_cv_fit_is_the_tensor_fit(monkeypatch):
    X, y = _problem(30, 3, 0)
    fast = _fitted(PenalizedKernelRegressorCV(random_state=0), X, y)
    # the host level alone (compiled prox off) is the tensor level bit for bit
    monkeypatch.setattr(_native, "prox_linf_rows", lambda v, c: None)
    host = _fitted(PenalizedKernelRegressorCV(random_state=0), X, y)
    monkeypatch.setattr(prox_module, "_l1_level", prox_module._l1_level_tensor)
    slow = _fitted(PenalizedKernelRegressorCV(random_state=0), X, y)
    _assert_same_fit(host, slow, X, ["sigma_", "alpha_", "cv_mse_", "dual_coef_", "n_iter_"])
    # the compiled prox: the same choices, values equal to rounding
    for a in ("sigma_", "alpha_"):
        assert np.asarray(getattr(fast, a)).tolist() == np.asarray(getattr(slow, a)).tolist()
    np.testing.assert_allclose(fast.cv_mse_, slow.cv_mse_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast.dual_coef_, slow.dual_coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(fast.predict(X), slow.predict(X), rtol=1e-8, atol=1e-10)


def _tensor_prox_linf(v, c):
    theta, inside = prox_module._l1_level_tensor(v.abs(), c, None)
    out = torch.clamp(v, min=-theta, max=theta)
    out = torch.where(inside, torch.zeros_like(v), out)
    return torch.where(c <= 0, v, out)


@pytest.mark.skipif(not _native.has_ista_linf_step(), reason="compiled extension not built")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_linf_prox_and_step_are_the_tensor_ones(dtype):
    rng = np.random.RandomState(2)
    tol = 1e-14 if dtype == torch.float64 else 1e-6
    for trial in range(200):
        v = _hostile_rows(rng, trial, 40, 70, dtype)
        B, n = v.shape
        scale = float(v.abs().sum(-1).max())
        c = torch.from_numpy(rng.rand(B, 1) * scale * rng.choice([0.0, 0.1, 1.0, 2.0])).to(dtype)
        if trial % 5 == 0:
            c[0, 0] = -1.0  # c <= 0 keeps v
        if trial % 9 == 2:
            v[0, 0] = float("nan")  # a NaN row stays NaN
        got = prox_module.prox_linf(v, c)
        want = _tensor_prox_linf(v, c)
        assert torch.equal(got.isnan(), want.isnan())
        err = (got - want).nan_to_num().abs()
        assert bool((err <= tol * v.nan_to_num().abs().amax(-1, keepdim=True)).all())
        # the published solver's fused l_inf step: the same update and step length
        if trial % 9 == 2:
            continue
        A = torch.from_numpy(rng.randn(B, n)).to(dtype)
        P, Y = torch.randn(B, n, dtype=dtype), torch.randn(B, n, dtype=dtype)
        eta = torch.from_numpy(rng.rand(B)).to(dtype)
        thr = c.reshape(-1).abs()
        new = _tensor_prox_linf(A - eta[:, None] * (P - Y), thr[:, None])
        moved_want = (new - A).square().sum(-1).sqrt()
        An = A.numpy().copy()
        moved = _native.ista_linf_step(An, P.numpy(), Y.numpy(), eta.numpy(), thr.numpy())
        scale = float(A.abs().max() + (P - Y).abs().max() + 1.0)
        assert np.abs(An - new.numpy()).max() <= 4 * tol * scale * max(1.0, n ** 0.5)
        np.testing.assert_allclose(moved, moved_want.double().numpy(), rtol=1e-5 if
                                   dtype == torch.float32 else 1e-12, atol=tol * scale)


def test_huber_cv_fit_is_the_tensor_fit(monkeypatch):
    # 33 rows in 5 folds: training sets of unequal sizes
    X, y = _problem(33, 2, 1)
    params = dict(sigmas=5, cv=5, max_iter=3000, random_state=0)
    fast = _fitted(KernelHuberGradientDescentCV(**params), X, y)
    monkeypatch.setattr(HuberRule, "_host", lambda self, *args, **kwargs: None)
    slow = _fitted(KernelHuberGradientDescentCV(**params), X, y)
    _assert_same_fit(fast, slow, X, ["sigma_", "n_iter_", "cv_mse_", "best_iter_",
                                     "dual_coef_", "epsilon_"])
