"""Per-feature bandwidths (ARD) for the distance kernels, everywhere a scalar is accepted."""

import warnings

import numpy as np
import pytest
import torch

from kernelflow.estimators import (
    KernelGradientDescent,
    KernelGradientDescentCV,
    KernelGradientFlow,
    KernelRidge,
    KernelRidgeCV,
    KernelSignGradient,
    NystromKernelRidge,
)
from kernelflow.features.random import random_features
from kernelflow.features.taylor import taylor_features, taylor_kernel
from kernelflow.io import load_model, save_model
from kernelflow.kernels import Cauchy, Gaussian, Laplace, Matern, make_kernel, median_heuristic
from kernelflow.landmarks import SELECTORS
from kernelflow.operators import KernelOperator

F64 = torch.float64
KERNELS = [Gaussian, Laplace, Cauchy, lambda s: Matern(s, nu=1.5), lambda s: Matern(s, nu=2.5)]


@pytest.fixture
def data():
    rng = np.random.RandomState(0)
    X = rng.randn(60, 3)
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(60)
    return X, y


@pytest.mark.parametrize("make", KERNELS)
def test_equal_bandwidths_give_the_scalar_blocks_bit_for_bit(make):
    X = torch.randn(40, 4, dtype=F64) * 3
    Z = torch.randn(30, 4, dtype=F64)
    scalar, vector = make(0.7), make([0.7] * 4)
    assert torch.equal(scalar(X, Z), vector(X, Z))
    assert torch.equal(KernelOperator(scalar, X, Z).to_dense(),
                       KernelOperator(vector, X, Z).to_dense())


@pytest.mark.parametrize("make", KERNELS)
def test_ard_is_the_scalar_kernel_on_scaled_inputs(make):
    X = torch.randn(20, 3, dtype=F64)
    s = torch.tensor([0.5, 2.0, 7.0], dtype=F64)
    torch.testing.assert_close(make(s.numpy())(X), make(1.0)(X / s), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "estimator",
    [
        KernelRidge(alpha=0.1),
        NystromKernelRidge(n_components=30, alpha=0.1, random_state=0),
        NystromKernelRidge(n_components=30, alpha=0.1, landmarks="rpcholesky", random_state=0),
        KernelGradientDescent(max_iter=50, early_stopping=False, random_state=0),
    ],
    ids=["exact", "nystrom", "nystrom-rpcholesky", "gradient-path"],
)
def test_estimators_with_equal_bandwidths_reproduce_the_scalar_bit_for_bit(estimator, data):
    X, y = data
    a = estimator.set_params(sigma=1.3).fit(X, y).predict(X)
    b = estimator.set_params(sigma=[1.3, 1.3, 1.3]).fit(X, y).predict(X)
    c = estimator.set_params(sigma=np.full(3, 1.3)).fit(X, y).predict(X)
    assert np.array_equal(a, b) and np.array_equal(a, c)


@pytest.mark.parametrize(
    "landmarks",
    [pytest.param(k, marks=pytest.mark.slow) if k == "continuous" else k
     for k in sorted(SELECTORS)],
)
def test_every_landmark_selector_takes_ard_bandwidths(landmarks, data):
    X, y = data
    est = NystromKernelRidge(n_components=15, landmarks=landmarks, random_state=0, max_iter=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = est.set_params(sigma=1.3).fit(X, y).predict(X)
        b = est.set_params(sigma=[1.3, 1.3, 1.3]).fit(X, y).predict(X)
        c = est.set_params(sigma=[1.3, 9.0, 9.0]).fit(X, y).predict(X)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize(
    "estimator",
    [KernelSignGradient(max_iter=30, early_stopping=False), KernelGradientFlow(t=10.0)],
    ids=["sign-gradient", "gradient-flow"],
)
def test_more_path_estimators_reproduce_the_scalar_bit_for_bit(estimator, data):
    X, y = data
    a = estimator.set_params(sigma=0.9).fit(X, y).predict(X)
    b = estimator.set_params(sigma=[0.9, 0.9, 0.9]).fit(X, y).predict(X)
    assert np.array_equal(a, b)


def test_per_feature_bandwidths_change_the_fit(data):
    X, y = data
    a = KernelRidge(alpha=0.1, sigma=1.3).fit(X, y).predict(X)
    b = KernelRidge(alpha=0.1, sigma=[1.3, 10.0, 10.0]).fit(X, y).predict(X)
    assert not np.allclose(a, b)


@pytest.mark.parametrize(
    "sigma, match",
    [
        ([1.0, 2.0], "2 per-feature bandwidths but X has 3 features"),
        ([1.0, -2.0, 1.0], "positive finite"),
        ([1.0, np.nan, 1.0], "positive finite"),
        ([1.0, np.inf, 1.0], "positive finite"),
        ([[1.0, 1.0, 1.0]], "1-D"),
        ([], "1-D"),
    ],
)
def test_bad_bandwidth_vectors_are_refused(sigma, match, data):
    X, y = data
    with pytest.raises(ValueError, match=match):
        KernelRidge(sigma=sigma).fit(X, y)


def test_bad_vector_in_a_kernel_object_is_refused(data):
    X, y = data
    with pytest.raises(ValueError, match="2 per-feature bandwidths"):
        KernelRidge(kernel=Gaussian([1.0, 1.0])).fit(X, y)
    with pytest.raises(ValueError, match="positive finite"):
        Gaussian([1.0, 0.0])(torch.zeros(2, 2))


def test_vector_sigma_needs_a_distance_kernel(data):
    X, _ = data
    with pytest.raises(ValueError, match="distance kernel"):
        make_kernel("linear", sigma=[1.0, 1.0, 1.0], X=torch.as_tensor(X))
    with pytest.raises(ValueError, match="distance kernel"):
        make_kernel("poly", sigma="ard", X=torch.as_tensor(X))


def test_sigma_ard_starts_from_the_median_heuristic(data):
    X, y = data
    model = KernelRidge(sigma="ard").fit(X, y)
    med = median_heuristic(torch.as_tensor(X))
    assert np.array_equal(model.kernel_.sigma, np.full(3, med))
    scalar = KernelRidge().fit(X, y)
    assert np.array_equal(model.predict(X), scalar.predict(X))


@pytest.mark.parametrize("make", [Gaussian, Laplace, Cauchy, lambda s: Matern(s, nu=2.5)])
def test_random_features_scale_frequencies_per_feature(make):
    X = torch.randn(6, 3, dtype=F64) * 0.5
    s = [0.5, 1.0, 2.0]
    Phi = random_features(make(s), X, seed=0, block_index=0, n_features=60000)
    torch.testing.assert_close(Phi @ Phi.T, make(s)(X), rtol=0, atol=0.03)
    # equal bandwidths: the scalar kernel's features, bit for bit
    P1 = random_features(make(0.8), X, seed=1, block_index=2, n_features=64)
    P2 = random_features(make([0.8] * 3), X, seed=1, block_index=2, n_features=64)
    assert torch.equal(P1, P2)


def test_random_features_refuse_a_wrong_length():
    with pytest.raises(ValueError, match="2 per-feature bandwidths but X has 3"):
        random_features(Gaussian([1.0, 1.0]), torch.zeros(2, 3, dtype=F64), 0, 0, 8)


def test_taylor_features_with_ard_are_those_of_the_scaled_inputs():
    X = np.random.RandomState(1).uniform(-1, 1, size=(5, 2))
    s = np.array([0.8, 2.0])
    np.testing.assert_array_equal(taylor_features(X, sigma=s, M=4),
                                  taylor_features(X / s, sigma=1.0, M=4))
    K = np.exp(-0.5 * (((X[:, None] - X[None]) / s) ** 2).sum(-1))
    P = taylor_features(torch.as_tensor(X), sigma=s, M=10)
    T = taylor_kernel(X, X, sigma=s, M=10)
    np.testing.assert_allclose(P.numpy() @ P.numpy().T, T, atol=1e-12)
    np.testing.assert_allclose(T, K, atol=1e-5)
    with pytest.raises(ValueError, match="3 per-feature bandwidths but X has 2"):
        taylor_features(X, sigma=[1.0, 1.0, 1.0])


def test_bandwidth_grids_refuse_vectors(data):
    X, y = data
    with pytest.raises(ValueError, match="per-feature"):
        KernelGradientDescentCV(sigmas=[[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]).fit(X, y)
    with pytest.raises(ValueError, match="per-feature"):
        KernelRidgeCV(kernel=Gaussian([1.0, 1.0, 1.0])).fit(X, y)


def test_ard_model_file_round_trip(tmp_path, data):
    X, y = data
    model = KernelRidge(alpha=0.1, sigma=[0.5, 1.0, 2.0]).fit(X, y)
    path = save_model(model, tmp_path / "ard.npz")
    loaded = load_model(path)
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    np.testing.assert_array_equal(np.asarray(loaded.sigma), [0.5, 1.0, 2.0])
    model = KernelRidge(alpha=0.1, kernel=Laplace(np.array([0.5, 1.0, 2.0]))).fit(X, y)
    loaded = load_model(save_model(model, tmp_path / "ard2.npz"))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))


def test_kernels_with_vectors_compare_and_hash():
    assert Gaussian([1.0, 2.0]) == Gaussian(np.array([1.0, 2.0]))
    assert Gaussian([1.0, 2.0]) != Gaussian([1.0, 3.0])
    assert hash(Gaussian([1.0, 2.0])) == hash(Gaussian(np.array([1.0, 2.0])))
    assert "sigma=[1.0, 2.0]" in repr(Gaussian([1.0, 2.0]))


def test_online_learners_take_ard_bandwidths(data):
    from kernelflow.online import KernelAWV

    X, y = data
    a = KernelAWV(sigma=1.2).fit(X, y).predict(X)
    b = KernelAWV(sigma=[1.2, 1.2, 1.2]).fit(X, y).predict(X)
    c = KernelAWV(sigma=[1.2, 8.0, 8.0]).fit(X, y).predict(X)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert not np.allclose(a, c)


def test_doubly_stochastic_regressor_takes_ard_bandwidths(data):
    from kernelflow.estimators import DoublyStochasticRegressor

    X, y = data
    est = DoublyStochasticRegressor(random_state=0, max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = est.set_params(sigma=1.2).fit(X, y).predict(X)
        b = est.set_params(sigma=[1.2, 1.2, 1.2]).fit(X, y).predict(X)
    assert np.array_equal(a, b)
