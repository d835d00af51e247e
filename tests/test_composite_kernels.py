"""Sums, products, positive scalings and additive (column-group) kernels."""

import numpy as np
import pytest
import torch
from sklearn.base import clone

from kernelflow.estimators import KernelRidge, NystromKernelRidge
from kernelflow.features.random import random_features
from kernelflow.io import load_model, save_model
from kernelflow.kernels import (
    Additive,
    Cauchy,
    Gaussian,
    Laplace,
    Linear,
    Matern,
    Polynomial,
    Product,
    Scaled,
    Sum,
)
from kernelflow.operators import KernelOperator

F64 = torch.float64


@pytest.fixture
def X():
    return torch.randn(37, 4, dtype=F64, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def Z():
    return torch.randn(23, 4, dtype=F64, generator=torch.Generator().manual_seed(1))


PAIRS = [
    (Gaussian(1.2), Laplace(2.0)),
    (Gaussian([0.5, 1.0, 2.0, 4.0]), Linear()),
    (Matern(1.0, nu=2.5), Polynomial(degree=2, gamma=0.3)),
    (Cauchy(0.7), Gaussian(3.0)),
]


@pytest.mark.parametrize("k1, k2", PAIRS)
def test_sum_and_product_equal_the_explicit_matrices(k1, k2, X, Z):
    torch.testing.assert_close((k1 + k2)(X, Z), k1(X, Z) + k2(X, Z), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((k1 * k2)(X, Z), k1(X, Z) * k2(X, Z), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((2.5 * k1)(X, Z), 2.5 * k1(X, Z), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((k1 * 0.5)(X, Z), 0.5 * k1(X, Z), rtol=1e-12, atol=1e-12)
    for k in (k1 + k2, k1 * k2, 3.0 * k2):
        torch.testing.assert_close(k.diag(X), k(X).diagonal(), rtol=1e-10, atol=1e-10)
        # the tiled engine sees the same kernel
        K = KernelOperator(k, X, Z).to_dense()
        torch.testing.assert_close(K, k(X, Z), rtol=1e-10, atol=1e-10)


def test_nested_composites_and_additive_groups(X, Z):
    g, lap, lin = Gaussian(1.0), Laplace(2.0), Linear()
    k = 2.0 * (g + lap) * lin + Additive([([0, 1], g), ([2, 3], lap)])
    expected = 2.0 * (g(X, Z) + lap(X, Z)) * lin(X, Z) + g(X[:, :2], Z[:, :2]) + lap(
        X[:, 2:], Z[:, 2:])
    torch.testing.assert_close(k(X, Z), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(KernelOperator(k, X, Z).to_dense(), expected, rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(k.diag(X), k(X).diagonal(), rtol=1e-10, atol=1e-10)
    on = Gaussian([1.0, 2.0]).on([3, 1])
    torch.testing.assert_close(on(X, Z), Gaussian([1.0, 2.0])(X[:, [3, 1]], Z[:, [3, 1]]))


def test_stationarity_follows_the_parts():
    assert (Gaussian(1.0) + Laplace(1.0)).is_stationary
    assert (2.0 * Gaussian(1.0)).is_stationary
    assert not (Gaussian(1.0) + Linear()).is_stationary
    assert Additive([([0], Gaussian(1.0))]).is_stationary


def test_nested_parameters_follow_scikit_learn():
    k = Gaussian(1.0) + 2.0 * Laplace(3.0)
    params = k.get_params()
    assert params["k1__sigma"] == 1.0
    assert params["k2__scale"] == 2.0 and params["k2__kernel__sigma"] == 3.0
    k.set_params(k1__sigma=0.5, k2__kernel__sigma=4.0)
    assert k.k1.sigma == 0.5 and k.k2.kernel.sigma == 4.0
    assert set(k.get_params(deep=False)) == {"k1", "k2"}
    a = Additive([([0], Gaussian(1.0)), ([1], Laplace(2.0))])
    assert a.get_params()["k1__sigma"] == 2.0
    with pytest.raises(ValueError, match="Invalid parameter"):
        k.set_params(k3__sigma=1.0)
    assert Gaussian(1.0) + Linear() == Sum(Gaussian(1.0), Linear())
    assert Gaussian(1.0) * Linear() == Product(Gaussian(1.0), Linear())
    assert Gaussian(1.0) + Linear() != Sum(Gaussian(2.0), Linear())


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: Scaled(Gaussian(1.0), -1.0), "positive"),
        (lambda: Scaled(Gaussian(1.0), [1.0, 2.0]), "positive number"),
        (lambda: Sum(Gaussian(1.0), "rbf"), "Kernel objects"),
        (lambda: Additive([]), "non-empty"),
        (lambda: Additive([([], Gaussian(1.0))]), "column indices"),
        (lambda: Additive([([0.5], Gaussian(1.0))]), "column indices"),
        (lambda: Sum(Gaussian(-1.0), Linear()), "positive"),
    ],
)
def test_invalid_composites_are_refused(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bad()(torch.zeros(2, 2, dtype=F64))


def test_additive_refuses_columns_out_of_range():
    X = np.zeros((5, 2))
    with pytest.raises(ValueError, match="out of range"):
        KernelRidge(kernel=Gaussian(1.0).on([0, 2])).fit(X, np.zeros(5))


def test_scaling_by_a_non_positive_number_is_not_a_kernel():
    with pytest.raises(TypeError):
        Gaussian(1.0) * "2"
    with pytest.raises(ValueError, match="positive"):
        (-1.0 * Gaussian(1.0)).validate()


@pytest.fixture
def data():
    rng = np.random.RandomState(0)
    X = rng.randn(50, 3)
    return X, np.sin(X[:, 0]) + X[:, 1] + 0.1 * rng.randn(50)


KERNELS = [
    Gaussian(1.0) + Linear(),
    2.0 * Laplace(1.5) * Gaussian([1.0, 2.0, 3.0]),
    Additive([([0], Gaussian(1.0)), ([1, 2], Linear())]),
]


@pytest.mark.parametrize("kernel", KERNELS, ids=["sum", "product", "additive"])
def test_estimators_accept_composites_and_match_a_direct_solve(kernel, data):
    X, y = data
    model = KernelRidge(alpha=0.1, kernel=kernel, fit_intercept=False).fit(X, y)
    Xt = torch.as_tensor(X)
    K = kernel(Xt)
    c = torch.linalg.solve(K + 0.1 * torch.eye(50, dtype=F64), torch.as_tensor(y))
    np.testing.assert_allclose(model.dual_coef_.numpy(), c.numpy(), rtol=1e-8, atol=1e-10)
    ny = NystromKernelRidge(n_components=50, alpha=0.1, kernel=kernel, fit_intercept=False,
                            random_state=0, max_iter=500, tol=1e-14).fit(X, y)
    np.testing.assert_allclose(ny.predict(X), model.predict(X), rtol=1e-5, atol=1e-6)
    assert clone(model).kernel == kernel


@pytest.mark.parametrize("kernel", KERNELS, ids=["sum", "product", "additive"])
def test_composite_model_file_round_trip(kernel, data, tmp_path):
    X, y = data
    model = KernelRidge(alpha=0.1, kernel=kernel).fit(X, y)
    loaded = load_model(save_model(model, tmp_path / "m.npz"))
    assert loaded.kernel == kernel
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))


@pytest.mark.parametrize(
    "kernel",
    [
        Gaussian(1.0) + 2.0 * Laplace([1.0, 2.0, 3.0]),
        Gaussian(0.7) * Cauchy(2.0),
        Additive([([0], Gaussian(1.0)), ([1, 2], Matern(1.0, nu=2.5))]),
        3.0 * Gaussian(1.0),
    ],
    ids=["sum", "product", "additive", "scaled"],
)
def test_random_features_of_shift_invariant_composites(kernel):
    X = torch.randn(6, 3, dtype=F64, generator=torch.Generator().manual_seed(2)) * 0.5
    Phi = random_features(kernel, X, seed=0, block_index=0, n_features=100000)
    scale = float(kernel.diag(X[:1])[0])
    torch.testing.assert_close(Phi @ Phi.T, kernel(X), rtol=0, atol=0.03 * scale)


def test_random_features_of_non_shift_invariant_composites_are_refused():
    with pytest.raises(ValueError, match="No real random-feature map"):
        random_features(Gaussian(1.0) + Linear(), torch.zeros(2, 2, dtype=F64), 0, 0, 8)


def test_estimator_level_nested_parameters(data):
    X, y = data
    model = KernelRidge(kernel=Gaussian(1.0) + 2.0 * Linear())
    params = model.get_params()
    assert params["kernel__k1__sigma"] == 1.0 and params["kernel__k2__scale"] == 2.0
    model.set_params(kernel__k1__sigma=0.5)
    assert model.kernel.k1.sigma == 0.5
    direct = KernelRidge(kernel=Gaussian(0.5) + 2.0 * Linear()).fit(X, y)
    np.testing.assert_array_equal(model.fit(X, y).predict(X), direct.predict(X))


def test_doubly_stochastic_regressor_takes_shift_invariant_composites(data):
    from kernelflow.estimators import DoublyStochasticRegressor
    from kernelflow.features.random import supports_random_features

    X, y = data
    kernel = Gaussian(1.0) + Laplace(2.0)
    assert supports_random_features(kernel)
    assert not supports_random_features(Gaussian(1.0) * Linear())
    model = DoublyStochasticRegressor(kernel=kernel, random_state=0, max_iter=5).fit(X, y)
    assert model.score(X, y) > 0.5
