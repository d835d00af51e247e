"""Access to a Gram matrix through blocks and products, shared by every selector.

Selectors never assume that the full ``n x n`` kernel matrix is stored. They see a
:class:`GramAccess`, which offers the diagonal, column blocks ``K[:, idx]`` and the
three products that the continuous method needs (``K[idx, :] V``, ``K[:, idx] V`` and
``K[idx, idx] V``). Three backends exist:

* :class:`DenseGram`: a stored PSD matrix (small problems, tests, precomputed kernels);
* :class:`KernelGram`: a kernel and points, evaluated lazily through
  :class:`kernelflow.operators.KernelOperator` (never more than the memory budget);
* :class:`FeatureGram`: ``K = A^T A`` for column subset selection on a data matrix ``A``
  (``m x n``, the ``n`` columns are the items), so ``K`` is never formed.
"""

from __future__ import annotations

import logging

import torch

from ._base import check_k, check_points

logger = logging.getLogger(__name__)

__all__ = ["DenseGram", "FeatureGram", "GramAccess", "KernelGram", "as_tensor", "check_k"]


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


class GramAccess:
    """Minimal interface to a PSD matrix ``K`` of size ``n x n``.

    ``idx=None`` means all indices. Products take ``V`` of shape ``(len, t)`` or ``(len,)``.
    """

    n: int
    dtype: torch.dtype

    def diagonal(self) -> torch.Tensor:  # shape: (n,)
        raise NotImplementedError

    def columns(self, idx) -> torch.Tensor:  # shape: (n, len(idx))
        raise NotImplementedError

    def rows_matmul(self, idx, V: torch.Tensor) -> torch.Tensor:  # K[idx, :] @ V
        raise NotImplementedError

    def cols_matmul(self, idx, V: torch.Tensor) -> torch.Tensor:  # K[:, idx] @ V
        raise NotImplementedError

    def sub_matmul(self, idx, V: torch.Tensor) -> torch.Tensor:  # K[idx][:, idx] @ V
        raise NotImplementedError

    def sub_block(self, idx) -> torch.Tensor:  # K[idx][:, idx], dense
        if idx is None:
            return self.to_dense()
        return self.columns(idx)[idx]

    def to_dense(self) -> torch.Tensor:  # shape: (n, n)
        return self.columns(torch.arange(self.n))

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
        self.K = K
        self.n = K.shape[0]
        self.dtype = K.dtype

    def diagonal(self):
        return self.K.diagonal().clone()

    def columns(self, idx):
        return self.K[:, idx]

    def rows_matmul(self, idx, V):
        return (self.K if idx is None else self.K[idx]) @ V

    def cols_matmul(self, idx, V):
        return (self.K if idx is None else self.K[:, idx]) @ V

    def sub_matmul(self, idx, V):
        if idx is None:
            return self.K @ V
        return self.K[idx][:, idx] @ V

    def to_dense(self):
        return self.K


class KernelGram(GramAccess):
    """A kernel on points ``X``, evaluated only through the kernel engine.

    ``cache=True`` stores the full matrix once when it fits the memory budget, which makes
    the many products of the continuous method cheap on moderate ``n``.
    """

    def __init__(self, kernel, X, *, options=None, cache: bool = False):
        self.kernel = kernel
        self.X = X
        self.n = X.shape[0]
        self.dtype = X.dtype
        self.options = options
        self._dense = None
        if cache:
            op = self._op(X, X)
            if op.fits_in_memory():
                self._dense = op.to_dense()

    def _op(self, X1, X2):
        from kernelflow.operators import KernelOperator

        return KernelOperator(self.kernel, X1, X2, options=self.options)

    def diagonal(self):
        if self._dense is not None:
            return self._dense.diagonal().clone()
        return self.kernel.diag(self.X)

    def columns(self, idx):
        if self._dense is not None:
            return self._dense[:, idx]
        return self.kernel(self.X, self.X[idx])

    def _pts(self, idx):
        return self.X if idx is None else self.X[idx]

    def rows_matmul(self, idx, V):
        if self._dense is not None:
            return (self._dense if idx is None else self._dense[idx]) @ V
        return self._op(self._pts(idx), self.X) @ V

    def cols_matmul(self, idx, V):
        if self._dense is not None:
            return (self._dense if idx is None else self._dense[:, idx]) @ V
        return self._op(self.X, self._pts(idx)) @ V

    def sub_matmul(self, idx, V):
        if self._dense is not None:
            K = self._dense if idx is None else self._dense[idx][:, idx]
            return K @ V
        P = self._pts(idx)
        return self._op(P, P) @ V

    def sub_block(self, idx):
        if self._dense is not None:
            return self._dense if idx is None else self._dense[idx][:, idx]
        P = self._pts(idx)
        return self._op(P, P).to_dense()

    def to_dense(self):
        if self._dense is not None:
            return self._dense
        return self._op(self.X, self.X).to_dense()


class FeatureGram(GramAccess):
    """``K = A^T A`` for a data matrix ``A`` (``m x n``); products cost ``O(m n)``."""

    def __init__(self, A):
        A = as_tensor(A, name="A")
        self.A = A
        self.n = A.shape[1]
        self.dtype = A.dtype

    def _cols(self, idx):
        return self.A if idx is None else self.A[:, idx]

    def diagonal(self):
        return (self.A * self.A).sum(0)

    def columns(self, idx):
        return self.A.T @ self.A[:, idx]

    def rows_matmul(self, idx, V):
        return self._cols(idx).T @ (self.A @ V)

    def cols_matmul(self, idx, V):
        return self.A.T @ (self._cols(idx) @ V)

    def sub_matmul(self, idx, V):
        B = self._cols(idx)
        return B.T @ (B @ V)
