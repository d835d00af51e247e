"""Access to a Gram matrix through blocks and products, shared by every selector.

Selectors never assume that the full ``n x n`` kernel matrix is stored. They see a
:class:`GramAccess`: a square :class:`kernelflow.operators.LinearOperator` over the operator
that computes the entries, with the diagonal, column blocks ``K[:, idx]`` and the three
products that the continuous method needs (``K[idx, :] V``, ``K[:, idx] V`` and
``K[idx, idx] V``), all derived from that operator. Three constructors pick the operator:

* :class:`DenseGram`: a stored PSD matrix (a :class:`~kernelflow.operators.DenseOperator`;
  small problems, tests, precomputed kernels);
* :class:`KernelGram`: a kernel and points (a :class:`~kernelflow.operators.KernelOperator`,
  never more than the memory budget);
* :class:`FeatureGram`: ``K = A^T A`` for column subset selection on a data matrix ``A``
  (``m x n``, the ``n`` columns are the items; a :class:`~kernelflow.operators.FeatureOperator`),
  so ``K`` is never formed.
"""

from __future__ import annotations

import logging

import torch

from ..kernels import Kernel
from ..operators import DenseOperator, FeatureOperator, KernelOperator, LinearOperator, as_operator
from ._base import check_k, check_points

logger = logging.getLogger(__name__)

__all__ = ["DenseGram", "FeatureGram", "GramAccess", "KernelGram", "as_gram", "as_tensor",
           "check_k"]


def as_tensor(X, *, name="X", dtype=None) -> torch.Tensor:
    """Convert array-like input to a 2-D finite real tensor, with clear errors.

    See :func:`kernelflow.landmarks.check_points` for the accepted dtypes.
    """
    T = check_points(X, name=name)
    if dtype is not None and T.dtype != dtype:
        T = T.to(dtype)
        if not bool(torch.isfinite(T).all()):
            raise ValueError(f"{name} contains values that overflow {dtype}.")
    return T


def as_gram(K, *, name: str = "gram") -> GramAccess:
    """A :class:`GramAccess` as is, or a square matrix (array-like, pandas, tensor) stored.

    Anything else raises ``TypeError`` (not array-like) or ``ValueError`` (not a square, finite
    real matrix) naming ``name``.

    Examples
    --------
    >>> as_gram([[2.0, 1.0], [1.0, 2.0]]).n
    2
    """
    if isinstance(K, GramAccess):
        return K
    T = check_points(K, name=name)
    if T.shape[0] != T.shape[1]:
        raise ValueError(f"{name} must be a square Gram matrix (or a GramAccess), got shape "
                         f"{tuple(T.shape)}.")
    return DenseGram(T, check_psd=False)


def stored_gram(X, kernel, k, *, max_n: int, why: str):
    """Prologue of the selectors that need the whole kernel matrix in memory.

    Returns ``(X tensor, checked k, DenseGram of K(X, X))``; refuses ``n > max_n`` with a
    message that starts with ``why`` (what the method stores).
    """
    X = as_tensor(X)
    k = check_k(k, X.shape[0])
    if X.shape[0] > max_n:
        raise ValueError(f"{why}; n={X.shape[0]} exceeds max_n={max_n}")
    K = KernelOperator(kernel, X).to_dense()
    return X, k, DenseGram(K, check_psd=False)


class GramAccess(LinearOperator):
    """A symmetric PSD matrix ``K`` of size ``n x n``: a square operator over another one.

    Every :class:`~kernelflow.operators.LinearOperator` method works on it and is passed to the
    wrapped operator ``op``, so a stored matrix keeps its free blocks and a kernel its tiled
    products. What the selectors add: ``n``, the products on index subsets
    (``rows_matmul``, ``cols_matmul``), ``sub_block``, ``stored`` and the
    checked diagonal. ``idx=None`` means all indices. Products take ``V`` of shape
    ``(len, t)`` or ``(len,)``.

    Parameters
    ----------
    op : LinearOperator or tensor of shape (n, n)
    """

    def __init__(self, op):
        op = as_operator(op)
        if op.shape[0] != op.shape[1]:
            raise ValueError(f"a Gram matrix must be square, got shape {op.shape}")
        self.op = op
        self.n = op.shape[0]
        self.options = op.options

    shape = property(lambda self: self.op.shape)
    dtype = property(lambda self: self.op.dtype)
    device = property(lambda self: self.op.device)
    symmetric = property(lambda self: True)

    def _matmul(self, V):
        return self.op._matmul(V)

    def _t_matmul(self, V):
        return self.op._t_matmul(V)

    def _kt_k_matmul(self, V, W, row_weights):
        return self.op._kt_k_matmul(V, W, row_weights)

    def _block(self, rows, cols):
        return self.op._block(rows, cols)

    def _diagonal(self):
        return self.op._diagonal()

    def _subset(self, rows, cols):
        return self.op._subset(rows, cols)

    def diagonal(self) -> torch.Tensor:  # shape: (n,)
        return self.op.diagonal()

    def columns(self, idx) -> torch.Tensor:  # shape: (n, len(idx))
        return self.op.columns(idx)

    def rows_matmul(self, idx, V: torch.Tensor) -> torch.Tensor:  # K[idx, :] @ V
        return self.op.subset(rows=idx) @ V

    def cols_matmul(self, idx, V: torch.Tensor) -> torch.Tensor:  # K[:, idx] @ V
        return self.op.subset(cols=idx) @ V

    def sub_block(self, idx) -> torch.Tensor:  # K[idx][:, idx], dense
        if idx is None:
            return self.to_dense()
        return self.op.block(idx, idx)

    def to_dense(self) -> torch.Tensor:  # shape: (n, n)
        return self.op.to_dense()

    def block(self, rows, cols) -> torch.Tensor:  # K[rows][:, cols], only those entries
        return self.op.block(rows, cols)

    @property
    def stored(self) -> bool:
        """Whether the matrix is held in memory (dense products, free blocks)."""
        return isinstance(self.op, DenseOperator)

    def check_psd_diagonal(self) -> torch.Tensor:
        """Return the diagonal after checking it is finite and non-negative."""
        d = self.diagonal()
        if not bool(torch.isfinite(d).all()):
            raise ValueError("the kernel diagonal contains NaN or infinity")
        scale = float(d.abs().max()) if d.numel() else 0.0
        if bool((d < -1e-10 * max(scale, 1.0)).any()):
            raise ValueError(
                "the kernel matrix is not positive semi-definite: it has a negative "
                f"diagonal entry ({float(d.min()):.3g})"
            )
        return d.clamp_min(0)


class DenseGram(GramAccess):
    """A stored symmetric PSD matrix.

    Parameters
    ----------
    K : tensor of shape (n, n)
        The matrix. ``check_psd=True`` verifies symmetry and the smallest eigenvalue
        (``O(n^3)``) and raises ``ValueError`` for a non-PSD matrix.
    """

    def __init__(self, K, *, check_psd: bool = True):
        K = as_tensor(K, name="K")
        if K.shape[0] != K.shape[1]:
            raise ValueError(f"K must be square, got shape {tuple(K.shape)}")
        if check_psd:
            scale = float(K.abs().max())
            if float((K - K.T).abs().max()) > 1e-8 * max(scale, 1e-300):
                raise ValueError("K must be symmetric")
            lo = float(torch.linalg.eigvalsh((K + K.T) / 2)[0])
            if lo < -1e-8 * max(scale, 1e-300) * K.shape[0]:
                raise ValueError(
                    f"K is not positive semi-definite (smallest eigenvalue {lo:.3g})"
                )
        super().__init__(DenseOperator(K, symmetric=True))
        self.K = K


class KernelGram(GramAccess):
    """A kernel on points ``X``, evaluated only through the kernel engine.

    ``cache=True`` stores the full matrix once when it fits the memory budget, which makes
    the many products of the continuous method cheap on moderate ``n``.
    """

    def __init__(self, kernel, X, *, options=None, cache: bool = False):
        X = X if isinstance(X, torch.Tensor) else as_tensor(X)
        self.kernel = kernel
        self.X = X
        op: LinearOperator = (KernelOperator(kernel, X, options=options)
                              if isinstance(kernel, Kernel) else _CallOperator(kernel, X))
        if cache and op.fits_in_memory():
            op = DenseOperator(op.to_dense(), options=options, symmetric=True)
        super().__init__(op)

    @property
    def _dense(self) -> torch.Tensor | None:
        """The stored matrix (``cache=True`` and it fitted), else None."""
        return self.op.to_dense() if self.stored else None


class _CallOperator(LinearOperator):
    """K(X, X) for any object with ``kernel(X1, X2)`` and ``kernel.diag(X)`` (not a
    :class:`~kernelflow.kernels.Kernel`): blocks are exactly the entries asked for.

    A :class:`~kernelflow.operators.KernelOperator` needs a :class:`~kernelflow.kernels.Kernel`
    (its block interface drives the tiling and the memory budget); this operator serves the
    plain callables selectors also accept, with products by row panels of 1024.
    """

    def __init__(self, kernel, X):
        self.kernel, self.X = kernel, X

    shape = property(lambda self: (self.X.shape[0], self.X.shape[0]))
    dtype = property(lambda self: self.X.dtype)
    device = property(lambda self: self.X.device)
    symmetric = property(lambda self: True)

    def _block(self, rows, cols):
        return self.kernel(self.X[rows], self.X[cols])

    def _matmul(self, V):
        out = torch.zeros(self.X.shape[0], V.shape[1], dtype=self._acc_dtype(V))
        everything = torch.arange(self.X.shape[0])
        for i0 in range(0, self.X.shape[0], 1024):
            rows = everything[i0:i0 + 1024]
            out[rows] = self._block(rows, everything).to(out.dtype) @ V.to(out.dtype)
        return out

    def _diagonal(self):
        return self.kernel.diag(self.X)


class FeatureGram(GramAccess):
    """``K = A^T A`` for a data matrix ``A`` (``m x n``); products cost ``O(m n)``."""

    def __init__(self, A):
        A = as_tensor(A, name="A")
        self.A = A
        super().__init__(FeatureOperator(A.T))
