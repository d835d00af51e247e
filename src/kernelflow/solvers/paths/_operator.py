"""The kernel matrices of the paths as operators of :mod:`kernelflow.operators`.

A dense K becomes a :class:`~kernelflow.operators.DenseOperator` (declared symmetric for the
training kernel, whose columns are then read as rows), a kernel operator stays itself, and
coordinate descent wraps a matrix-free K in :class:`ColumnCacheOperator`, which keeps the few
columns it revisits. The helpers below are the products in batch layout (row b of A is
problem b) that the path loops use.
"""

from __future__ import annotations

import torch

from ...operators import DenseOperator, LinearOperator, memory_budget

__all__ = ["ColumnCacheOperator", "path_operator", "batch_matmul", "columns_t", "column",
           "dense_matrix", "fits"]


class ColumnCacheOperator(LinearOperator):
    """A matrix-free operator that keeps the columns it has computed, within half the memory
    budget (coordinate descent revisits the same few coordinates).

    Examples
    --------
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.operators import KernelOperator
    >>> X = torch.arange(4, dtype=torch.float64)[:, None]
    >>> op = ColumnCacheOperator(KernelOperator(Gaussian(1.0), X))
    >>> bool(torch.equal(op.column(2), Gaussian(1.0)(X)[:, 2])), len(op._cols)
    (True, 1)
    """

    def __init__(self, base: LinearOperator):
        self.base = base
        self.options = base.options
        budget = memory_budget(base.options, base.device) // 2
        self._cap = int(budget // max(1, base.shape[0] * base._element_size()))
        self._cols: dict[int, torch.Tensor] = {}

    shape = property(lambda self: self.base.shape)
    dtype = property(lambda self: self.base.dtype)
    device = property(lambda self: self.base.device)

    @property
    def symmetric(self) -> bool:
        return self.base.symmetric

    def _matmul(self, V: torch.Tensor) -> torch.Tensor:
        return self.base._matmul(V)

    def _t_matmul(self, V: torch.Tensor) -> torch.Tensor:
        return self.base._t_matmul(V)

    def _block(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        return self.base._block(rows, cols)

    def _diagonal(self) -> torch.Tensor:
        return self.base.diagonal()

    def column(self, j: int) -> torch.Tensor:  # shape: (n1,), contiguous
        col = self._cols.get(int(j))
        if col is None:
            col = self.base.columns([int(j)])[:, 0].contiguous()
            if len(self._cols) < self._cap:
                self._cols[int(j)] = col
        return col

    def columns_t(self, idx: torch.Tensor) -> torch.Tensor:  # shape: (len(idx), n1)
        if self._cap == 0:
            return self.base.columns(idx).T
        return torch.stack([self.column(i) for i in idx.tolist()])


def path_operator(K, name: str = "K", *, symmetric: bool = False,
                  cache_columns: bool = False) -> LinearOperator:
    """``K`` (a 2-D tensor or a LinearOperator) as an operator for the path loops.

    ``symmetric`` declares a dense K symmetric (its columns are read as rows);
    ``cache_columns`` keeps contiguous columns (a transposed copy of a dense K, the visited
    columns of a matrix-free one).
    """
    if isinstance(K, torch.Tensor):
        if K.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix, found shape {tuple(K.shape)}.")
        return DenseOperator(K, symmetric=symmetric and K.shape[0] == K.shape[1],
                             cache_columns=cache_columns)
    if isinstance(K, LinearOperator):
        return ColumnCacheOperator(K) if cache_columns else K
    raise TypeError(f"{name} must be a torch.Tensor or LinearOperator, got {type(K).__name__}.")


def dense_matrix(op: LinearOperator) -> torch.Tensor | None:
    """The stored matrix of a dense operator (not a copy), None for a matrix-free one."""
    return op.to_dense() if isinstance(op, DenseOperator) else None


def batch_matmul(op: LinearOperator, A: torch.Tensor) -> torch.Tensor:
    """``A @ K.T`` for A of shape (B, n2): returns (B, n1), the products of B problems."""
    dense = dense_matrix(op)
    if dense is not None:
        return A @ dense.T
    return (op @ A.T.contiguous()).T


def columns_t(op: LinearOperator, idx: torch.Tensor) -> torch.Tensor:
    """``K[:, idx].T`` of shape (len(idx), n1), from contiguous memory where the operator has
    it (a symmetric or column-cached dense K, a column cache)."""
    if isinstance(op, DenseOperator):
        return op._columns_t()[idx]  # the positions come from the loop: no checks per step
    if isinstance(op, ColumnCacheOperator):
        return op.columns_t(idx)
    return op.columns(idx).T


def column(op: LinearOperator, j: int) -> torch.Tensor:
    """Column ``K[:, j]`` of shape (n1,), contiguous where :func:`columns_t` is."""
    if isinstance(op, DenseOperator):
        return op._columns_t()[j]
    return op.column(j)


def fits(op: LinearOperator) -> bool:
    """Whether the path may use K densely: stored already, or three copies fit the budget."""
    return isinstance(op, DenseOperator) or op.fits_in_memory(copies=3)
