import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.gaussian_process.kernels import Matern as SkMatern
from sklearn.gaussian_process.kernels import RationalQuadratic
from sklearn.metrics.pairwise import linear_kernel, polynomial_kernel, rbf_kernel

from kernelflow.estimators import KernelRidge
from kernelflow.kernels import (
    Cauchy,
    Gaussian,
    Laplace,
    Linear,
    Matern,
    Polynomial,
    make_kernel,
    median_heuristic,
    sq_distances,
)


def _data(n1=37, n2=23, d=4, seed=0):
    r = np.random.RandomState(seed)
    return r.randn(n1, d) * 2 + 5, r.randn(n2, d) * 2 + 5  # offset tests the centring shift


def _reference(kernel, A, B):
    D = np.sqrt(((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))
    if isinstance(kernel, Gaussian):
        return np.exp(-(D**2) / (2 * kernel.sigma**2))
    if isinstance(kernel, Laplace):
        return np.exp(-D / kernel.sigma)
    if isinstance(kernel, Cauchy):
        return 1 / (1 + D**2 / kernel.sigma**2)
    if isinstance(kernel, Matern):
        r = D / kernel.sigma
        if kernel.nu == 0.5:
            return np.exp(-r)
        if kernel.nu == 1.5:
            return (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r)
        return (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)
    if isinstance(kernel, Linear):
        return A @ B.T
    if isinstance(kernel, Polynomial):
        return (kernel.gamma * A @ B.T + kernel.coef0) ** kernel.degree
    raise AssertionError


KERNELS = [
    Gaussian(1.7),
    Laplace(2.5),
    Cauchy(1.3),
    Matern(1.2, 0.5),
    Matern(1.5, 1.5),
    Matern(2.0, 2.5),
    Linear(),
    Polynomial(degree=2, gamma=0.1, coef0=1.0),
]


@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
def test_kernel_blocks_match_formula_float64(kernel):
    A, B = _data()
    K = kernel(torch.from_numpy(A), torch.from_numpy(B)).numpy()
    np.testing.assert_allclose(K, _reference(kernel, A, B), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kernel.diag(torch.from_numpy(A)).numpy(),
                               np.diag(_reference(kernel, A, A)), rtol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
def test_kernel_blocks_float32(kernel):
    A, B = _data()
    K = kernel(torch.from_numpy(A).float(), torch.from_numpy(B).float())
    assert K.dtype == torch.float32
    ref = _reference(kernel, A, B)
    np.testing.assert_allclose(K.numpy(), ref, rtol=2e-4, atol=2e-4 * np.abs(ref).max())


def test_agreement_with_sklearn_kernels():
    A, B = _data()
    tA, tB = torch.from_numpy(A), torch.from_numpy(B)
    np.testing.assert_allclose(make_kernel("rbf", gamma=0.3)(tA, tB), rbf_kernel(A, B, gamma=0.3),
                               rtol=1e-10)
    np.testing.assert_allclose(make_kernel("linear")(tA, tB), linear_kernel(A, B), rtol=1e-12)
    np.testing.assert_allclose(make_kernel("poly", gamma=0.05, degree=3, coef0=2.0)(tA, tB),
                               polynomial_kernel(A, B, degree=3, gamma=0.05, coef0=2.0),
                               rtol=1e-12)
    np.testing.assert_allclose(Matern(1.4, 2.5)(tA, tB),
                               SkMatern(length_scale=1.4, nu=2.5)(A, B), rtol=1e-10)
    # Cauchy(sigma) is the rational quadratic with alpha=1, length_scale=sigma/sqrt(2)
    np.testing.assert_allclose(Cauchy(2.0)(tA, tB),
                               RationalQuadratic(length_scale=2 / np.sqrt(2), alpha=1.0)(A, B),
                               rtol=1e-10)


def test_gamma_conversions():
    assert make_kernel("rbf", gamma=0.5).sigma == pytest.approx(1.0)
    assert make_kernel("laplace", gamma=0.5).sigma == pytest.approx(2.0)
    assert make_kernel("cauchy", gamma=0.25).sigma == pytest.approx(2.0)
    assert make_kernel("matern32", sigma=3.0) == Matern(3.0, 1.5)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_bandwidth(bad):
    with pytest.raises(ValueError, match="sigma"):
        Gaussian(bad)(torch.zeros(2, 1))
    with pytest.raises(ValueError):
        make_kernel("rbf", sigma=bad)


def test_make_kernel_errors():
    with pytest.raises(ValueError, match="laplacian"):
        make_kernel("laplacian")
    with pytest.raises(ValueError, match="Unknown kernel"):
        make_kernel("nope")
    with pytest.raises(ValueError, match="at most one"):
        make_kernel("rbf", sigma=1.0, gamma=1.0)
    with pytest.raises(TypeError):
        make_kernel(3)


def test_median_heuristic_and_default_bandwidth():
    X = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    assert median_heuristic(X) == pytest.approx(2.0)
    assert make_kernel("rbf", X=X).sigma == pytest.approx(2.0)


def test_kernel_params_and_clone():
    est = KernelRidge(kernel=Gaussian(sigma=2.0))
    params = est.get_params(deep=True)
    assert params["kernel__sigma"] == 2.0
    cloned = clone(est)
    assert cloned.kernel == est.kernel and cloned.kernel is not est.kernel
    est.set_params(kernel__sigma=3.0)
    assert est.kernel.sigma == 3.0


def test_sq_distances_nonnegative_and_exact():
    A, B = _data()
    D = sq_distances(torch.from_numpy(A), torch.from_numpy(B)).numpy()
    assert (D >= 0).all()
    np.testing.assert_allclose(D, ((A[:, None] - B[None]) ** 2).sum(-1), rtol=1e-10)
