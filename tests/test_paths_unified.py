"""The weighted paths run the single-path backends; the spectral filter is written once.

Sample weights are an option of the flipped-sign sign-descent loop and of the single-column
coordinate loop, so :func:`weighted_path` and the single paths give the same iterates; path
cross-validation takes its gradient-descent filter from :mod:`kernelflow.solvers.paths.spectral`.
"""

import pytest
import torch

from kernelflow.kernels import Gaussian
from kernelflow.operators import KernelOperator
from kernelflow.solvers.early_stopping import weighted_path
from kernelflow.solvers.paths import (
    coordinate_descent_path,
    sign_gradient_path,
    sign_learning_rate,
    spectral_filter,
)
from kernelflow.solvers.paths.driver import rule_path
from kernelflow.solvers.paths.rules import SignRule, weighted_largest_eigenvalue
from kernelflow.solvers.paths.spectral import ChunkedSpectralFilter

# the deprecated weighted_path is kept working: these tests call it on purpose
pytestmark = pytest.mark.filterwarnings("ignore:weighted_path is deprecated:DeprecationWarning")


def _problem(n=20, t=1, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = (torch.rand(n, 1, dtype=torch.float64, generator=g) * 6 - 3).to(dtype)
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(n, dtype=torch.float64, generator=g).to(dtype)
    if t > 1:
        y = torch.stack([y + j for j in range(t)], 1)
    w = torch.randint(1, 4, (n,), generator=g).to(dtype)
    return X, y, w


def _repeat(w):
    return torch.repeat_interleave(torch.arange(w.numel()), w.to(torch.long))


@pytest.mark.parametrize("path", [sign_gradient_path, coordinate_descent_path],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_path_is_the_single_path_with_weights(path, t, dtype):
    X, y, w = _problem(t=t, dtype=dtype)
    k = Gaussian(1.0)
    K, Ke = k(X, X), k(X[:5] + 0.1, X)
    seen = {}

    def record(name):
        def cb(i, a, r, e):
            seen.setdefault(name, []).append((a.clone(), r.clone(), e.clone()))
        return cb

    a = weighted_path(path, K, y, w, max_iter=200, K_eval=Ke, callback=record("a"), tol=1e-3)
    b = path(K, y, sample_weight=w, max_iter=200, K_eval=Ke, callback=record("b"), tol=1e-3)
    assert (a.n_iter, a.learning_rate) == (b.n_iter, b.learning_rate)
    for x, z in [(a.alpha, b.alpha), (a.residual, b.residual),
                 (a.eval_predictions, b.eval_predictions)]:
        assert torch.equal(x, z)
    assert len(seen["a"]) == len(seen["b"]) == a.n_iter + 1
    for u, v in zip(seen["a"], seen["b"]):
        assert all(torch.equal(p, q) for p, q in zip(u, v))


@pytest.mark.parametrize("path", [sign_gradient_path, coordinate_descent_path],
                         ids=lambda f: f.__name__)
def test_integer_weights_repeat_rows_in_the_single_paths(path):
    X, y, w = _problem(n=12)
    k = Gaussian(1.0)
    K = k(X, X)
    idx = _repeat(w)
    ref = path(K[idx][:, idx], y[idx], max_iter=300)
    res = path(K, y, sample_weight=w, max_iter=300)
    assert res.learning_rate == pytest.approx(ref.learning_rate, rel=1e-12)
    summed = torch.zeros_like(y).index_add_(0, idx, ref.alpha)  # copies' coefficients add up
    torch.testing.assert_close(res.alpha, summed, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("path", [sign_gradient_path, coordinate_descent_path],
                         ids=lambda f: f.__name__)
def test_unit_weights_give_the_unweighted_path(path):
    X, y, _ = _problem(n=25, t=2)
    K = Gaussian(0.8)(X, X)
    ref = path(K, y, max_iter=400, learning_rate=0.01)
    res = path(K, y, sample_weight=torch.ones(25, dtype=K.dtype), max_iter=400,
               learning_rate=0.01)
    assert res.n_iter == ref.n_iter
    torch.testing.assert_close(res.alpha, ref.alpha, rtol=1e-10, atol=1e-12)


def test_weighted_sign_step_is_the_repeated_problems_step():
    X, y, w = _problem(n=15, t=2)
    K = Gaussian(1.0)(X, X)
    eta = sign_learning_rate(K, y, sample_weight=w)
    rms = float(((w[:, None] * y.square()).sum() / (2 * w.sum())).sqrt())
    assert eta == pytest.approx(0.01 * rms / weighted_largest_eigenvalue(K, w), rel=1e-12)
    assert sign_gradient_path(K, y, sample_weight=w, max_iter=0).learning_rate == eta
    idx = _repeat(w)
    assert eta == pytest.approx(sign_learning_rate(K[idx][:, idx], y[idx]), rel=1e-10)
    # every entry point with weights takes the same automatic step: the rule driver too
    assert rule_path(SignRule(), K, y, sample_weight=w, max_iter=0).learning_rate == \
        pytest.approx(eta, rel=1e-12)
    assert weighted_path(sign_gradient_path, K, y, w, max_iter=0).learning_rate == eta


@pytest.mark.parametrize("path", [sign_gradient_path, coordinate_descent_path],
                         ids=lambda f: f.__name__)
def test_weighted_single_paths_on_an_operator(path):
    X, y, w = _problem(n=20)
    k = Gaussian(1.0)
    dense = path(k(X, X), y, sample_weight=w, max_iter=150, learning_rate=0.01)
    op = path(KernelOperator(k, X), y, sample_weight=w, max_iter=150, learning_rate=0.01)
    torch.testing.assert_close(op.alpha, dense.alpha, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("path", [sign_gradient_path, coordinate_descent_path],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_bad_weights_are_rejected(path, bad):
    X, y, w = _problem(n=6)
    w[2] = bad
    with pytest.raises(ValueError, match="sample_weight"):
        path(Gaussian(1.0)(X, X), y, sample_weight=w)
    with pytest.raises(ValueError, match="sample_weight"):
        path(Gaussian(1.0)(X, X), y, sample_weight=w[:5])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_filter_equals_spectral_filter(dtype):
    g = torch.Generator().manual_seed(3)
    s = torch.cat([torch.zeros(2, 3), torch.rand(2, 6, generator=g) ** 4 * 2], 1).to(dtype)
    b = torch.randn(2, 9, generator=g).to(dtype)
    eta = 0.9
    f = ChunkedSpectralFilter(s, b, eta, chunk=7)
    got, ts = [], []
    for c in (7, 3, 7, 1, 5):
        coef, t = f.next(c)
        got.append(coef)
        ts.append(t)
    coef, t = torch.cat(got, -1), torch.cat(ts)  # (2, 9, 23), (23,)
    ks = torch.arange(1, 24)
    ref = spectral_filter(s, eta, ks)  # (23, 2, 9)
    pos = s > 0
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(coef.permute(2, 0, 1)[:, pos], (ref * b)[:, pos], **tol)
    assert bool((coef.permute(2, 0, 1)[:, ~pos] == 0).all())
    torch.testing.assert_close(t, ks.to(dtype) * eta, **tol)
    torch.testing.assert_close(ref[:, ~pos], (ks.to(dtype) * eta)[:, None].expand(-1, 6), **tol)


def test_chunked_filter_keeps_selected_problems():
    g = torch.Generator().manual_seed(4)
    s = torch.rand(3, 5, generator=g, dtype=torch.float64)
    b = torch.randn(3, 5, generator=g, dtype=torch.float64)
    full = ChunkedSpectralFilter(s, b, 0.5, chunk=4)
    part = ChunkedSpectralFilter(s, b, 0.5, chunk=4)
    full.next(4)
    part.next(4)
    mask = torch.tensor([True, False, True])
    part.keep(mask)
    assert torch.equal(part.next(3)[0], full.next(3)[0][mask])
