"""Kernels own their spectral measure and their reading of scikit-learn's gamma."""

import math

import numpy as np
import torch
from sklearn.metrics.pairwise import laplacian_kernel, rbf_kernel

from kernelflow.features.random import sample_block, supports_random_features
from kernelflow.kernels import Cauchy, Gaussian, Laplace, _DistanceKernel, make_kernel


class _InverseMultiquadric(_DistanceKernel):
    """k = (1 + d^2 / sigma^2)^(-3/2): a Gaussian scale mixture with precision ~ Gamma(3/2)."""

    def _block(self, P1, P2):
        return self._sq_block(P1, P2).add_(1.0).pow_(-1.5)

    def _frequencies(self, Z, s, m, generator):
        from kernelflow.kernels import _gamma_draws

        return Z * torch.sqrt(2.0 * _gamma_draws(1.5, m, generator)) / s


def test_a_new_distance_kernel_gets_random_features_without_touching_features():
    k = _InverseMultiquadric(0.8)
    assert supports_random_features(k)
    X = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    blocks = [sample_block(k, 2, 4000, seed=3, block_index=i)(X) for i in range(4)]
    Phi = torch.cat(blocks, dim=1) / 2.0  # four blocks of 4000: average of the estimates
    np.testing.assert_allclose(Phi @ Phi.T, k(X), atol=0.03)


def test_mixture_masses_and_frequencies_of_composites():
    k = 2.0 * Gaussian(1.0) + Laplace(0.5)
    assert k.has_spectral_measure() and math.isclose(k.spectral_mass(), 3.0)
    W = k.sample_frequencies(3, 10, torch.Generator().manual_seed(0))
    assert W.shape == (3, 10) and W.dtype == torch.float64


def test_gamma_means_what_scikit_learn_means():
    X = np.random.RandomState(0).normal(size=(5, 3))
    Xt = torch.as_tensor(X)
    for gamma in (0.1, 2.0):
        np.testing.assert_allclose(make_kernel("rbf", gamma=gamma)(Xt).numpy(),
                                   rbf_kernel(X, gamma=gamma), rtol=1e-12)
        np.testing.assert_allclose(make_kernel("laplace", gamma=gamma).sigma,
                                   Laplace.sigma_from_gamma(gamma))
        # scikit-learn's Laplacian kernel uses the l1 distance; ours the l2 distance: compare
        # in one dimension, where both agree
        np.testing.assert_allclose(make_kernel("laplace", gamma=gamma)(Xt[:, :1]).numpy(),
                                   laplacian_kernel(X[:, :1], gamma=gamma), rtol=1e-12)
    assert math.isclose(Cauchy.sigma_from_gamma(4.0), 0.5)
