"""Random features regenerated from (seed, block index): unbiasedness, 1/sqrt(D), determinism."""

import hashlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from kernelflow.features.random import (
    ArcCosine,
    block_seed,
    concat_blocks,
    random_features,
    sample_block,
    supports_random_features,
)
from kernelflow.kernels import Cauchy, Gaussian, Laplace, Linear, Matern, Polynomial

KERNELS = [
    Gaussian(1.3),
    Laplace(1.1),
    Matern(1.2, 0.5),
    Matern(1.2, 1.5),
    Matern(0.9, 2.5),
    Cauchy(0.9),
    Linear(),
    Polynomial(degree=2, gamma=0.5, coef0=1.0),
    ArcCosine(0),
    ArcCosine(1),
    ArcCosine(2),
]


pytestmark = pytest.mark.usefixtures("one_thread")


def _points(n=6, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 0.7 * torch.randn(n, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
def test_estimate_is_unbiased(kernel):
    # mean of S independent blocks' estimates -> k; deviation within 5 standard errors
    X = _points()
    K = kernel(X)
    D, S = 16, 400
    Phi = [random_features(kernel, X, seed=7, block_index=i, n_features=D) for i in range(S)]
    est = torch.stack([P @ P.T for P in Phi])
    mean, se = est.mean(0), est.std(0) / S**0.5
    assert torch.all((mean - K).abs() <= 5 * se + 1e-12), float(((mean - K).abs() / se).max())


@pytest.mark.parametrize("kernel", [Gaussian(1.0), Matern(1.0, 1.5), ArcCosine(1)], ids=repr)
def test_error_shrinks_like_inverse_sqrt_D(kernel):
    X = _points(8, 2, seed=1)
    K = kernel(X)

    def rms(D, reps=60):
        errs = [
            ((lambda P: P @ P.T)(random_features(kernel, X, 3, b, D)) - K).pow(2).mean()
            for b in range(reps)
        ]
        return float(torch.stack(errs).mean().sqrt())

    ratio = rms(64) / rms(1024)  # sqrt(1024 / 64) = 4
    assert 2.8 < ratio < 5.7, ratio


def test_features_identical_across_calls_and_batch_layout():
    k = Gaussian(0.8)
    X = _points(10, 4)
    A = random_features(k, X, seed=11, block_index=3, n_features=32)
    B = random_features(k, X, seed=11, block_index=3, n_features=32)
    assert torch.equal(A, B)
    # rows evaluated in any batching give the same features
    C = torch.cat([random_features(k, X[i:i + 3], 11, 3, 32) for i in range(0, 10, 3)])
    assert torch.allclose(A, C, rtol=0, atol=1e-14)
    # other block, other seed -> other features
    assert not torch.allclose(A, random_features(k, X, 11, 4, 32))
    assert not torch.allclose(A, random_features(k, X, 12, 3, 32))
    assert block_seed(11, 3) != block_seed(3, 11)


def test_concatenated_blocks_are_the_individual_blocks():
    for k in (Gaussian(1.0), Polynomial(3, 0.3, 1.0), ArcCosine(2)):
        X = _points(5, 3)
        blocks = [sample_block(k, 3, 8, 0, j) for j in range(3)]
        cat = concat_blocks(blocks)
        full = cat(X)
        for j, b in enumerate(blocks):
            assert torch.allclose(full[:, 8 * j:8 * (j + 1)], b(X), atol=1e-13)
        A = torch.randn(24, 2, dtype=torch.float64)
        assert torch.allclose(cat.matmul(X, A), full @ A, atol=1e-12)
        G = torch.randn(5, 2, dtype=torch.float64)
        assert torch.allclose(cat.t_matmul(X, G), full.T @ G, atol=1e-12)


_CHILD = """
import hashlib, torch
from kernelflow.features.random import random_features
from kernelflow.kernels import Matern
g = torch.Generator().manual_seed(0)
X = torch.randn(7, 3, generator=g, dtype=torch.float64)
P = random_features(Matern(1.1, 1.5), X, seed=123, block_index=45, n_features=64)
print(hashlib.sha256(P.numpy().tobytes()).hexdigest())
"""


def test_features_identical_in_another_process():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(7, 3, generator=g, dtype=torch.float64)
    P = random_features(Matern(1.1, 1.5), X, seed=123, block_index=45, n_features=64)
    here = hashlib.sha256(P.numpy().tobytes()).hexdigest()
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == here


def test_arccos_kernel_closed_forms():
    X = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    # theta = pi/2 between the first two: J0 = pi/2, J1 = 1, J2 = pi/2
    assert float(ArcCosine(0)(X)[0, 1]) == pytest.approx(0.5)
    assert float(ArcCosine(1)(X)[0, 1]) == pytest.approx(2.0 / np.pi)
    assert float(ArcCosine(2)(X)[0, 1]) == pytest.approx(4.0 * 0.5)
    for n in (0, 1, 2):
        assert torch.allclose(ArcCosine(n).diag(X), ArcCosine(n)(X).diagonal())


def test_bad_arguments():
    with pytest.raises(ValueError, match="even"):
        random_features(Gaussian(1.0), _points(), 0, 0, 7)
    with pytest.raises(ValueError, match="integer degree"):
        sample_block(Polynomial(degree=2.5), 3, 8, 0, 0)
    with pytest.raises(ValueError, match="order"):
        sample_block(ArcCosine(3), 3, 8, 0, 0)
    with pytest.raises(TypeError):
        sample_block("rbf", 3, 8, 0, 0)
    with pytest.raises(ValueError, match="2-D"):
        random_features(Gaussian(1.0), torch.ones(3), 0, 0, 8)
    assert supports_random_features(Laplace(1.0)) and not supports_random_features(None)
