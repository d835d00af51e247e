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


# ---- one test mixin every operator subclass runs --------------------------------------------
from kernelflow.operators import (  # noqa: E402
    BatchedMaskedOperator,
    DenseOperator,
    FeatureOperator,
    LinearOperator,
    ScaledOperator,
    SubsetOperator,
    as_operator,
)


class OperatorContract:
    """Every product and block of an operator against its own ``to_dense()``.

    A subclass defines ``make(dtype, n1, n2)`` returning ``(operator, reference dense matrix)``
    built independently of the operator's code, and ``square_only`` when n1 must equal n2.
    """

    square_only = False
    exact_dtype = True  # products in the operator's dtype (False: float64 sums)

    def make(self, dtype, n1, n2):  # pragma: no cover - abstract
        raise NotImplementedError

    def _pair(self, dtype, n1=23, n2=17):
        if self.square_only:
            n2 = n1
        return self.make(dtype, n1, n2)

    def _tol(self, dtype):
        tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10,
                                                                             atol=1e-10)
        return {**tol, "check_dtype": self.exact_dtype}

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_products_match_dense(self, dtype):
        op, dense = self._pair(dtype)
        tol = self._tol(dtype)
        assert isinstance(op, LinearOperator)
        assert op.shape == tuple(dense.shape) and op.dtype == dtype
        assert op.device == dense.device
        torch.testing.assert_close(op.to_dense(), dense, **tol)
        n1, n2 = op.shape
        g = torch.Generator().manual_seed(3)
        V = torch.randn(n2, 4, generator=g, dtype=dtype)
        W = torch.randn(n1, 4, generator=g, dtype=dtype)
        A = torch.randn(5, n2, generator=g, dtype=dtype)
        w = torch.rand(n1, generator=g, dtype=dtype)
        torch.testing.assert_close(op @ V, dense @ V, **tol)
        torch.testing.assert_close(op.matmul(V[:, 0]), dense @ V[:, 0], **tol)
        torch.testing.assert_close(op.t_matmul(W), dense.T @ W, **tol)
        torch.testing.assert_close(op.t_matmul(W[:, 1]), dense.T @ W[:, 1], **tol)
        torch.testing.assert_close(op.rmatmul(A), A @ dense.T, **tol)
        torch.testing.assert_close(op.kt_k_matmul(V, W, row_weights=w),
                                   dense.T @ (w[:, None] * (dense @ V + W)), **tol)
        torch.testing.assert_close(op.kt_k_matmul(V), dense.T @ (dense @ V), **tol)
        torch.testing.assert_close(op.T @ W, dense.T @ W, **tol)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_blocks_match_dense(self, dtype):
        op, dense = self._pair(dtype)
        tol = self._tol(dtype)
        n1, n2 = op.shape
        torch.testing.assert_close(op.diagonal(), torch.diagonal(dense)[: min(n1, n2)], **tol)
        torch.testing.assert_close(op.rows([0, 5, n1 - 1]), dense[[0, 5, n1 - 1]], **tol)
        torch.testing.assert_close(op.columns([n2 - 1, 2]), dense[:, [n2 - 1, 2]], **tol)
        torch.testing.assert_close(op.column(3), dense[:, 3], **tol)
        torch.testing.assert_close(op.block([3, 4, 3], [0, 9]), dense[[3, 4, 3]][:, [0, 9]],
                                   **tol)
        torch.testing.assert_close(op.block(torch.tensor([-1]), [1]), dense[[-1]][:, [1]], **tol)
        mask = torch.zeros(n1, dtype=torch.bool)
        mask[[1, 6]] = True
        torch.testing.assert_close(op.rows(mask), dense[mask], **tol)

    def test_empty_and_one_row(self):
        op, dense = self._pair(torch.float64)
        n1, n2 = op.shape
        assert op.matmul(torch.zeros(n2, 0, dtype=torch.float64)).shape == (n1, 0)
        assert op.rmatmul(torch.zeros(0, n2, dtype=torch.float64)).shape == (0, n1)
        assert op.rows([]).shape == (0, n2) and op.columns([]).shape == (n1, 0)
        one, one_dense = self._pair(torch.float64, n1=1, n2=1 if self.square_only else 6)
        v = torch.ones(one.shape[1], dtype=torch.float64)
        torch.testing.assert_close(one @ v, one_dense @ v)
        torch.testing.assert_close(one.t_matmul(torch.ones(1, dtype=torch.float64)),
                                   one_dense.T @ torch.ones(1, dtype=torch.float64))
        torch.testing.assert_close(one.diagonal(), torch.diagonal(one_dense))

    def test_wrong_inputs_refused(self):
        op, _ = self._pair(torch.float64)
        n1, n2 = op.shape
        with pytest.raises(ValueError, match="shape"):
            op @ torch.zeros(n2 + 1, dtype=torch.float64)
        with pytest.raises(ValueError, match="shape"):
            op @ torch.zeros(n2, 2, 2, dtype=torch.float64)
        with pytest.raises(ValueError, match="shape"):
            op.t_matmul(torch.zeros(n1 + 1, dtype=torch.float64))
        with pytest.raises(ValueError, match="shape"):
            op.rmatmul(torch.zeros(n2, dtype=torch.float64))
        with pytest.raises(TypeError):
            op @ np.zeros(n2)
        with pytest.raises(IndexError):
            op.rows([n1])
        with pytest.raises(IndexError):
            op.columns([n2 + 3])
        with pytest.raises(TypeError, match="integer"):
            op.rows([0.5])
        with pytest.raises(ValueError, match="row_weights"):
            op.kt_k_matmul(torch.zeros(n2, dtype=torch.float64),
                           row_weights=torch.ones(n1 + 1, dtype=torch.float64))

    def test_fits_in_memory_counts_copies(self):
        op, _ = self._pair(torch.float64)
        assert op.fits_in_memory(copies=1)
        n1, n2 = op.shape
        assert not op.fits_in_memory(copies=2**62 // (n1 * n2 * 8))

    def test_as_operator_returns_operator_unchanged(self):
        op, _ = self._pair(torch.float64)
        assert as_operator(op) is op


def _data(dtype, n1, n2, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n1, d, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(n2, d, generator=g, dtype=torch.float64).to(dtype))


class TestKernelOperatorContract(OperatorContract):
    def make(self, dtype, n1, n2):
        X1, X2 = _data(dtype, n1, n2)
        k = Gaussian(1.3)
        return KernelOperator(k, X1, X2, options=SMALL_TILES), k(X1, X2)


class TestSymmetricKernelOperatorContract(OperatorContract):
    square_only = True

    def make(self, dtype, n1, n2):
        X1, _ = _data(dtype, n1, n2)
        k = Matern(1.0, 1.5)
        return KernelOperator(k, X1, options=SMALL_TILES), k(X1, X1)


class TestDenseOperatorContract(OperatorContract):
    def make(self, dtype, n1, n2):
        M = torch.randn(n1, n2, generator=torch.Generator().manual_seed(5),
                        dtype=torch.float64).to(dtype)
        return DenseOperator(M), M.clone()


class TestDenseOperatorColumnCacheContract(OperatorContract):
    def make(self, dtype, n1, n2):
        M = torch.randn(n1, n2, generator=torch.Generator().manual_seed(6),
                        dtype=torch.float64).to(dtype)
        return DenseOperator(M, cache_columns=True), M.clone()


class TestDenseOperatorFloat64SumsContract(OperatorContract):
    exact_dtype = False

    def make(self, dtype, n1, n2):
        M = torch.randn(n1, n2, generator=torch.Generator().manual_seed(6),
                        dtype=torch.float64).to(dtype)
        op = DenseOperator(M, options=Options(accumulate_float64=True))
        op._CHUNK = 4  # several chunks even at these sizes
        return op, M.clone()

    def test_sums_are_float64(self):
        op, M = self.make(torch.float32, 9, 5)
        out = op.t_matmul(torch.ones(9, dtype=torch.float32))
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, M.double().sum(0), rtol=1e-6, atol=1e-6)


class TestScaledOperatorContract(OperatorContract):
    def make(self, dtype, n1, n2):
        X1, X2 = _data(dtype, n1, n2, seed=1)
        k = Laplace(1.0)
        g = torch.Generator().manual_seed(7)
        left = torch.rand(n1, generator=g, dtype=torch.float64).to(dtype)
        right = torch.rand(n2, generator=g, dtype=torch.float64).to(dtype)
        op = ScaledOperator(KernelOperator(k, X1, X2, options=SMALL_TILES), left, right)
        return op, left[:, None] * k(X1, X2) * right[None, :]


class TestSubsetOperatorContract(OperatorContract):
    def make(self, dtype, n1, n2):
        X1, X2 = _data(dtype, n1 + 5, n2 + 4, seed=2)
        k = Cauchy(1.0)
        g = torch.Generator().manual_seed(8)
        rows = torch.randperm(n1 + 5, generator=g)[:n1]
        cols = torch.randperm(n2 + 4, generator=g)[:n2]
        op = SubsetOperator(KernelOperator(k, X1, X2, options=SMALL_TILES), rows, cols)
        return op, k(X1, X2)[rows][:, cols]


class TestSymmetricSubsetOperatorContract(OperatorContract):
    square_only = True

    def make(self, dtype, n1, n2):
        X1, _ = _data(dtype, n1 + 5, 1, seed=2)
        k = Gaussian(0.8)
        rows = torch.randperm(n1 + 5, generator=torch.Generator().manual_seed(9))[:n1]
        op = SubsetOperator(KernelOperator(k, X1, options=SMALL_TILES), rows, rows)
        assert op.symmetric
        return op, k(X1, X1)[rows][:, rows]


class TestFeatureOperatorContract(OperatorContract):
    def make(self, dtype, n1, n2):
        g = torch.Generator().manual_seed(10)
        P1 = torch.randn(n1, 6, generator=g, dtype=torch.float64).to(dtype)
        P2 = torch.randn(n2, 6, generator=g, dtype=torch.float64).to(dtype)
        return FeatureOperator(P1, P2), P1 @ P2.T


class TestTransposedOperatorContract(OperatorContract):
    def make(self, dtype, n1, n2):
        X1, X2 = _data(dtype, n2, n1, seed=4)  # the base is (n2, n1)
        k = Gaussian(1.0)
        return KernelOperator(k, X1, X2, options=SMALL_TILES).T, k(X1, X2).T


def test_batched_masked_operator_matches_per_problem_products():
    g = torch.Generator().manual_seed(11)
    X = torch.randn(20, 2, generator=g, dtype=torch.float64)
    K = Gaussian(1.0)(X, X)
    masks = (torch.rand(4, 20, generator=g) > 0.3).double()
    A = torch.randn(4, 20, generator=g, dtype=torch.float64) * masks
    for base in (K, KernelOperator(Gaussian(1.0), X, options=SMALL_TILES)):
        op = BatchedMaskedOperator(base, masks)
        out = op.batch_matmul(A)
        for b in range(4):
            expected = masks[b] * (K @ (masks[b] * A[b]))
            torch.testing.assert_close(out[b], expected)
            torch.testing.assert_close(op.operator(b) @ A[b], expected)
        assert bool((out[masks == 0] == 0).all())
    with pytest.raises(ValueError, match="shape"):
        op.batch_matmul(A[:2])
    with pytest.raises(ValueError, match="square"):
        BatchedMaskedOperator(K[:5], masks)


def test_as_operator_converts_and_refuses():
    M = np.arange(6.0).reshape(2, 3)
    op = as_operator(M)
    assert isinstance(op, DenseOperator) and op.shape == (2, 3)
    torch.testing.assert_close(op.to_dense(), torch.from_numpy(M))
    with pytest.raises(TypeError, match="operator"):
        as_operator([[1.0]])
    with pytest.raises(ValueError, match="2-D"):
        as_operator(torch.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        ScaledOperator(torch.ones(2, 2), left=torch.ones(3))
    with pytest.raises(ValueError, match="finite"):
        ScaledOperator(torch.ones(2, 2), left=torch.tensor([1.0, float("nan")]))


class _WideKernel(Gaussian):
    """A Gaussian declaring large temporaries: tiles must shrink to keep within the budget."""

    def extra_memory(self, n1, n2):
        return 20 * n1 * n2


def test_tiles_budget_the_kernels_extra_memory():
    X = torch.randn(3000, 2, dtype=torch.float64)
    opts = Options(memory_budget=2**22)
    plain = KernelOperator(Gaussian(1.0), X, options=opts)
    wide = KernelOperator(_WideKernel(1.0), X, options=opts)
    bn, bm = plain._tiles()
    bn_w, bm_w = wide._tiles()
    assert bm_w == bm and bn_w < bn
    assert (3 * bn_w * bm_w + 20 * bn_w * bm_w) * 8 <= 2**22
    v = torch.ones(3000, dtype=torch.float64)
    torch.testing.assert_close(wide @ v, plain @ v)


@pytest.mark.parametrize("make", [
    lambda X: KernelOperator(Gaussian(1.0), X, options=SMALL_TILES),
    lambda X: DenseOperator(Gaussian(1.0)(X, X), symmetric=True),
    lambda X: FeatureOperator(X),
    lambda X: ScaledOperator(Gaussian(1.0)(X, X), left=torch.linspace(0.5, 1.5, X.shape[0],
                                                                     dtype=X.dtype)),
], ids=["kernel", "dense", "feature", "scaled"])
def test_subset_operators_match_dense_blocks(make):
    X = torch.randn(30, 3, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    op = make(X)
    dense = op.to_dense()
    rows, cols = [4, 0, 17, 29], [3, 3, 8]
    V = torch.randn(3, 2, dtype=torch.float64)
    torch.testing.assert_close(op.subset(rows, cols) @ V, dense[rows][:, cols] @ V)
    torch.testing.assert_close(op.subset(rows) @ torch.ones(30, dtype=torch.float64),
                               dense[rows].sum(1))
    sub = op.subset(rows, rows)
    torch.testing.assert_close(sub.to_dense(), dense[rows][:, rows])
    assert sub.symmetric == op.symmetric
    assert op.subset() is op


# ---- the selectors' Gram matrices are operators over the operator they wrap -----------------
class _PlainCallable:
    """A kernel-like callable that is not a Kernel (no tiling interface)."""

    def __call__(self, X1, X2):
        return Gaussian(0.7)(X1, X2)

    def diag(self, X):
        return torch.ones(X.shape[0], dtype=X.dtype)


class TestKernelGramContract(OperatorContract):
    square_only = True

    def make(self, dtype, n1, n2):
        from kernelflow.landmarks import KernelGram

        X1, _ = _data(dtype, n1, 1, seed=11)
        k = Laplace(0.9)
        return KernelGram(k, X1, options=SMALL_TILES), k(X1, X1)


class TestCallableKernelGramContract(OperatorContract):
    square_only = True

    def make(self, dtype, n1, n2):
        from kernelflow.landmarks import KernelGram

        X1, _ = _data(dtype, n1, 1, seed=12)
        return KernelGram(_PlainCallable(), X1), Gaussian(0.7)(X1, X1)


class TestDenseGramContract(OperatorContract):
    square_only = True

    def make(self, dtype, n1, n2):
        from kernelflow.landmarks import DenseGram

        X1, _ = _data(dtype, n1, 1, seed=13)
        K = Gaussian(1.2)(X1, X1)
        return DenseGram(K, check_psd=False), K.clone()


class TestFeatureGramContract(OperatorContract):
    square_only = True

    def make(self, dtype, n1, n2):
        from kernelflow.landmarks import FeatureGram

        A = torch.randn(7, n1, generator=torch.Generator().manual_seed(14),
                        dtype=torch.float64).to(dtype)
        return FeatureGram(A), A.T @ A


@pytest.mark.parametrize("cache", [False, True])
def test_gram_subsets_are_the_wrapped_operators_own(cache):
    from kernelflow.landmarks import KernelGram

    X = torch.randn(30, 3, generator=torch.Generator().manual_seed(15), dtype=torch.float64)
    gram = KernelGram(Gaussian(1.0), X, cache=cache)
    sub = gram.subset([2, 5], [7])
    assert type(sub) is type(gram.op.subset([2, 5], [7]))
    assert gram.T is gram and gram.stored == cache
    torch.testing.assert_close(sub.to_dense(), Gaussian(1.0)(X, X)[[2, 5]][:, [7]])


@pytest.mark.parametrize("stored", [False, True])
def test_float64_products_of_float32_values_are_one_fixed_matrix(stored):
    # with products_float64 the float32 kernel values are multiplied in float64: the product
    # is linear to float64 rounding and equals the up-cast values' product; float32 products
    # are not linear to better than float32 rounding
    from kernelflow.operators import DenseOperator

    g = torch.Generator().manual_seed(3)
    X1 = torch.randn(700, 4, generator=g)
    X2 = torch.randn(300, 4, generator=g)
    f64 = Options(products_float64=True, tile_elements=5000)
    K32 = Gaussian(2.0)(X1, X2)
    op = (DenseOperator(K32, options=f64) if stored
          else KernelOperator(Gaussian(2.0), X1, X2, options=f64))
    K = K32.double() if stored else op.to_dense().double()
    U = torch.randn(300, 2, dtype=torch.float64, generator=g)
    V = torch.randn(300, 2, dtype=torch.float64, generator=g) * 1e6
    w = torch.rand(700, dtype=torch.float64, generator=g)
    cases = [("kt_k", lambda a: op.kt_k_matmul(a, row_weights=w),
              lambda a: K.T @ (w[:, None] * (K @ a))),
             ("matmul", op.matmul, lambda a: K @ a)]
    for name, prod, ref in cases:
        out = prod(U + V)
        assert out.dtype == torch.float64, name
        torch.testing.assert_close(out, prod(U) + prod(V), rtol=1e-12, atol=0)
        torch.testing.assert_close(out, ref(U + V), rtol=1e-12, atol=0)
    A = torch.randn(700, 2, dtype=torch.float64, generator=g)
    torch.testing.assert_close(op.t_matmul(A), K.T @ A, rtol=1e-12, atol=0)
    # float32 products of the same values (tiles in float32, float64 sums) are not linear
    plain = Options(accumulate_float64=True, tile_elements=5000)
    op32 = (DenseOperator(K32, options=plain) if stored
            else KernelOperator(Gaussian(2.0), X1, X2, options=plain))
    err = (op32.kt_k_matmul(U + V) - op32.kt_k_matmul(U) - op32.kt_k_matmul(V)).abs().max()
    assert float(err / op32.kt_k_matmul(U + V).abs().max()) > 1e-10


def test_float64_products_flag_leaves_float64_operators_unchanged():
    from kernelflow.operators import DenseOperator

    X1, X2 = _make(Gaussian(1.1), torch.float64, n1=300, n2=200)
    V = torch.randn(200, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for opts in [Options(), Options(accumulate_float64=True)]:
        on = opts.replace(products_float64=True)
        a, b = KernelOperator(Gaussian(1.1), X1, X2, options=opts), KernelOperator(
            Gaussian(1.1), X1, X2, options=on)
        assert torch.equal(a.kt_k_matmul(V), b.kt_k_matmul(V))
        assert torch.equal(a.matmul(V), b.matmul(V))
        K = a.to_dense()
        da, db = DenseOperator(K, options=opts), DenseOperator(K, options=on)
        assert torch.equal(da.kt_k_matmul(V), db.kt_k_matmul(V))
        assert torch.equal(da.t_matmul(K @ V), db.t_matmul(K @ V))
