"""Dense matrices and kernel operators behind the few methods the path loops use.

The one adapter of the paths package: ``rmatmul`` (batch-layout products), kernel rows/columns
(cached for coordinate descent), ``to_dense``, ``diagonal`` and a memory check, written against
the operator method names so that it can give way to ``kernelflow.operators.as_operator``.
"""

from __future__ import annotations

import torch

from ...operators import LinearOperator, memory_budget

__all__ = ["_Matrix"]


class _Matrix:
    """Rows/columns/products of a dense K or a :class:`~kernelflow.operators.LinearOperator`
    (kernel, scaled, subset, ...) in batch layout."""

    def __init__(self, K, name: str = "K", cache_columns: bool = False):
        if isinstance(K, torch.Tensor):
            if K.ndim != 2:
                raise ValueError(f"{name} must be a 2-D matrix, found shape {tuple(K.shape)}.")
            self.dense, self.op = K, None
        elif isinstance(K, LinearOperator):
            self.dense, self.op = None, K
        else:
            raise TypeError(f"{name} must be a torch.Tensor or LinearOperator, got "
                            f"{type(K).__name__}.")
        self.shape = tuple(K.shape)
        self.dtype = K.dtype
        self.device = K.device
        self._dense_t = None
        self._cols: dict[int, torch.Tensor] = {}
        self._cap = 0
        if cache_columns and self.op is not None:
            # Coordinate descent revisits the same few coordinates: keep their columns, within
            # half the memory budget.
            budget = memory_budget(self.op.options, self.device) // 2
            self._cap = int(budget // max(1, self.shape[0] * K._element_size()))

    def rmatmul(self, A: torch.Tensor) -> torch.Tensor:  # A: (B, n2) -> (B, n1) = (K A^T)^T
        if self.dense is not None:
            return A @ self.dense.T
        return (self.op @ A.T.contiguous()).T

    def _op_column(self, i: int) -> torch.Tensor:  # (n1,) contiguous, cached
        col = self._cols.get(i)
        if col is None:
            col = self.op.columns([i])[:, 0].contiguous()
            if len(self._cols) < self._cap:
                self._cols[i] = col
        return col

    def columns_t(self, idx: torch.Tensor, symmetric: bool = False) -> torch.Tensor:
        """K[:, idx]^T of shape (len(idx), n1), gathered from contiguous rows."""
        if self.dense is not None:
            if symmetric:
                return self.dense[idx]
            if self._dense_t is None:  # transpose once so that columns are contiguous rows
                self._dense_t = self.dense.T.contiguous()
            return self._dense_t[idx]
        if self._cap == 0:
            return self.op.columns(idx).T
        return torch.stack([self._op_column(i) for i in idx.tolist()])

    def column(self, j: int, symmetric: bool = False) -> torch.Tensor:  # -> (n1,) contiguous
        if self.dense is not None:
            if symmetric:
                return self.dense[j]
            if self._dense_t is None:
                self._dense_t = self.dense.T.contiguous()
            return self._dense_t[j]
        return self._op_column(j) if self._cap else self.op.columns([j])[:, 0]

    def to_dense(self) -> torch.Tensor:
        return self.dense if self.dense is not None else self.op.to_dense()

    def fits(self) -> bool:
        return self.dense is not None or self.op.fits_in_memory(copies=3)

    def diagonal(self) -> torch.Tensor:
        return self.dense.diagonal() if self.dense is not None else self.op.diagonal()

