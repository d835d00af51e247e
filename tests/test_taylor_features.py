"""Taylor features of the Gaussian kernel (Jézéquel et al. 2019, eq. 6, Lemmas 11-13)."""

import math

import numpy as np
import pytest
import torch

from kernelflow.features.taylor import (
    n_taylor_features,
    taylor_features,
    taylor_kernel,
    taylor_multi_indices,
    taylor_truncation_bound,
    theoretical_taylor_degree,
)


def _gauss(A, B, sigma):
    return np.exp(-0.5 * ((A[:, None] - B[None]) ** 2).sum(-1) / sigma**2)


@pytest.mark.parametrize("d,M", [(1, 0), (1, 5), (3, 2), (5, 3), (8, 3), (9, 4)])
def test_feature_count_and_indices(d, M):
    K = taylor_multi_indices(d, M)
    assert K.shape == (math.comb(M + d, d), d) == (n_taylor_features(d, M), d)
    assert (K.sum(1) <= M).all() and (K >= 0).all()
    assert len({tuple(r) for r in K.tolist()}) == len(K)  # no duplicates
    assert (np.diff(K.sum(1)) >= 0).all()  # graded order
    np.testing.assert_array_equal(K, taylor_multi_indices(d, M))  # deterministic
    assert n_taylor_features(d, M, mode="ordered") == sum(d**k for k in range(M + 1))


def test_digest_table_sizes():
    assert [n_taylor_features(8, M) for M in (2, 3, 4)] == [45, 165, 495]
    assert [n_taylor_features(18, M) for M in (2, 3, 4)] == [190, 1330, 7315]


def test_closed_form_of_each_feature(rng):
    d, M, sigma = 3, 4, 0.7
    X = rng.uniform(-1, 1, (20, d))
    Phi = taylor_features(X, sigma=sigma, M=M)
    K = taylor_multi_indices(d, M)
    env = np.exp(-(X**2).sum(1) / (2 * sigma**2))
    fact = np.array([math.prod(math.factorial(int(k)) for k in row) for row in K])
    direct = env[:, None] * np.prod((X[:, None, :] / sigma) ** K[None], axis=2) / np.sqrt(fact)
    np.testing.assert_allclose(Phi, direct, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("M", [0, 1, 2, 3, 6])
def test_truncated_kernel_identity_and_ordered_mode(rng, M):
    X = rng.uniform(-1, 1, (30, 4))
    Z = rng.uniform(-1, 1, (10, 4))
    P, Q = taylor_features(X, sigma=1.3, M=M), taylor_features(Z, sigma=1.3, M=M)
    np.testing.assert_allclose(P @ Q.T, taylor_kernel(X, Z, sigma=1.3, M=M), atol=1e-14)
    Po = taylor_features(X, sigma=1.3, M=M, mode="ordered")
    np.testing.assert_allclose(Po @ Po.T, P @ P.T, atol=1e-13)


@pytest.mark.parametrize("M", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("sigma", [0.8, 1.0, 2.0])
def test_truncation_error_bound(rng, M, sigma):
    d, R = 3, 1.2
    U = rng.standard_normal((60, d))
    X = U / np.linalg.norm(U, axis=1, keepdims=True) * rng.uniform(0, R, (60, 1))
    Phi = taylor_features(X, sigma=sigma, M=M)
    err = np.abs(_gauss(X, X, sigma) - Phi @ Phi.T).max()
    assert err <= taylor_truncation_bound(R, sigma, M) * (1 + 1e-12)
    # ‖Pφ(x)‖² ≤ k(x, x) = 1, increasing with M
    norms = (Phi**2).sum(1)
    assert (norms <= 1 + 1e-12).all()
    assert (norms <= (taylor_features(X, sigma=sigma, M=M + 1) ** 2).sum(1) + 1e-15).all()


def test_error_shrinks_towards_the_gaussian_kernel(rng):
    X = rng.uniform(-1, 1, (40, 2))
    errs = [np.abs(_gauss(X, X, 1.0) - (P := taylor_features(X, M=M)) @ P.T).max()
            for M in range(1, 12)]
    assert all(b < a for a, b in zip(errs, errs[1:]))
    assert errs[-1] < 1e-6


def test_torch_input_matches_numpy(rng):
    X = rng.uniform(-1, 1, (7, 3))
    out = taylor_features(torch.tensor(X), sigma=0.9, M=3)
    assert torch.is_tensor(out) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), taylor_features(X, sigma=0.9, M=3), atol=1e-15)
    out32 = taylor_features(torch.tensor(X, dtype=torch.float32), M=2)
    assert out32.dtype == torch.float32


def test_theoretical_degree():
    # Theorem 4: M = ceil(max(8R²/σ², 2 log(n / min(λ, 1))))
    assert theoretical_taylor_degree(100, R=0.5, sigma=1.0) == math.ceil(2 * math.log(100))
    assert theoretical_taylor_degree(100, R=2.0, sigma=1.0) == 32
    assert theoretical_taylor_degree(100, R=0.1, alpha=0.01) == math.ceil(2 * math.log(1e4))
    with pytest.raises(ValueError):
        theoretical_taylor_degree(0, R=1.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="sigma"):
        taylor_features(np.zeros((2, 2)), sigma=0.0)
    with pytest.raises(ValueError, match="2-D"):
        taylor_features(np.zeros(3))
    with pytest.raises(ValueError, match="mode"):
        taylor_features(np.zeros((2, 2)), mode="bogus")
    with pytest.raises(ValueError, match="M must be"):
        taylor_multi_indices(2, -1)
