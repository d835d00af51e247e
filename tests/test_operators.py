import dataclasses

import numpy as np
import pytest
import torch

from kernelflow.kernels import Cauchy, Gaussian, Laplace, Linear, Matern
from kernelflow.operators import KernelOperator, Options, memory_budget

SMALL_TILES = Options(tile_elements=97)  # tiles that never divide the sizes


def _make(kernel, dtype, n1=53, n2=41, d=3, symmetric=False):
    g = torch.Generator().manual_seed(1)
    X1 = torch.randn(n1, d, generator=g, dtype=torch.float64).to(dtype)
    X2 = None if symmetric else torch.randn(n2, d, generator=g, dtype=torch.float64).to(dtype)
    return X1, X2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel", [Gaussian(1.1), Laplace(0.9), Cauchy(1.0), Matern(1.0, 2.5),
                                    Linear()], ids=repr)
@pytest.mark.parametrize("symmetric", [False, True])
def test_operator_matches_dense(kernel, dtype, symmetric):
    X1, X2 = _make(kernel, dtype, symmetric=symmetric)
    op = KernelOperator(kernel, X1, X2, options=SMALL_TILES)
    dense = kernel(X1, X1 if X2 is None else X2)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    n1, n2 = op.shape
    g = torch.Generator().manual_seed(2)
    V = torch.randn(n2, 3, generator=g, dtype=dtype)
    W = torch.randn(n1, 3, generator=g, dtype=dtype)
    torch.testing.assert_close(op @ V, dense @ V, **tol)
    torch.testing.assert_close(op @ V[:, 0], dense @ V[:, 0], **tol)
    torch.testing.assert_close(op.t_matmul(W), dense.T @ W, **tol)
    w = torch.rand(n1, generator=g, dtype=dtype)
    torch.testing.assert_close(op.kt_k_matmul(V, W, row_weights=w),
                               dense.T @ (w[:, None] * (dense @ V + W)), **tol)
    torch.testing.assert_close(op.diagonal(), torch.diagonal(dense)[: min(n1, n2)], **tol)
    torch.testing.assert_close(op.rows([0, 5, 7]), dense[[0, 5, 7]], **tol)
    torch.testing.assert_close(op.columns([1, 2]), dense[:, [1, 2]], **tol)
    torch.testing.assert_close(op.block([3, 4], [0, 9]), dense[[3, 4]][:, [0, 9]], **tol)
    torch.testing.assert_close(op.to_dense(), dense, **tol)


def test_float64_accumulation_is_more_accurate():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3000, 2, generator=g, dtype=torch.float64)
    v = torch.randn(3000, generator=g, dtype=torch.float64)
    k = Gaussian(3.0)
    exact = KernelOperator(k, X) @ v
    op32 = KernelOperator(k, X.float(), options=Options(tile_elements=3000 * 64))
    op32_acc = KernelOperator(k, X.float(), options=Options(tile_elements=3000 * 64,
                                                             accumulate_float64=True))
    plain = op32 @ v.float()
    acc = op32_acc @ v.float()
    assert acc.dtype == torch.float64 and plain.dtype == torch.float32
    err_plain = (plain.double() - exact).abs().max()
    err_acc = (acc - exact).abs().max()
    assert err_acc < err_plain


def test_memory_budget_is_respected():
    X = torch.randn(400, 2, dtype=torch.float64)
    op = KernelOperator(Gaussian(1.0), X, options=Options(memory_budget=400 * 400 * 4))
    assert not op.fits_in_memory(copies=1)
    with pytest.raises(MemoryError, match="memory budget"):
        op.to_dense()
    bn, bm = op._tiles()
    assert 3 * bn * bm * 8 <= 400 * 400 * 4
    v = torch.ones(400, dtype=torch.float64)
    full = KernelOperator(Gaussian(1.0), X) @ v
    torch.testing.assert_close(op @ v, full)
    assert memory_budget(Options(memory_budget=123)) == 123
    assert memory_budget(Options()) > 0


def test_options_replace_and_tolerance():
    opts = dataclasses.replace(Options(), accumulate_float64=True)
    assert opts.accumulate_float64 and not Options().accumulate_float64
    assert Options().cg_tolerance(torch.float32) > Options().cg_tolerance(torch.float64)


def test_bad_operator_inputs():
    with pytest.raises(ValueError, match="same number of columns"):
        KernelOperator(Gaussian(1.0), torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(TypeError):
        KernelOperator("rbf", torch.zeros(3, 2))
    op = KernelOperator(Gaussian(1.0), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="shape"):
        op @ torch.zeros(4)
    with pytest.raises(TypeError):
        op @ np.zeros(3)
