"""Nyström and column-subset errors, and the approximation factor against the best rank k.

For landmarks ``C`` (data points or any centres) the Nyström approximation is
``K^ = K_nC K_CC^+ K_Cn = F F^T`` with ``F = K_nC K_CC^{+1/2}`` (eigenvalues of ``K_CC``
below ``rcond * max`` are dropped, which is the pseudo-inverse the paper writes).

* ``||K - K^||_F^2 = ||K||_F^2 - 2 tr(F^T K F) + ||F^T F||_F^2`` needs only ``K F``
  (``r`` kernel products, tiled), so it is computed without storing ``K``;
* ``tr(K - K^) = sum(diag K) - ||F||_F^2``;
* approximation factor (Mathur et al. §4): ``||K - K^||_F^2 / sum_{i>k} lam_i(K)^2`` and
  ``tr(K - K^) / sum_{i>k} lam_i(K)``. Both are >= 1 whenever ``rank K^ <= k``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from ._access import DenseGram, GramAccess, as_tensor

if TYPE_CHECKING:
    from ..typing import ArrayLike

__all__ = [
    "approximation_factor",
    "best_rank_k_errors",
    "column_subset_error",
    "nystroem_errors",
    "nystroem_factor",
]


def nystroem_factor(X: ArrayLike, kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    centers: ArrayLike, *, rcond: float = 1e-10) -> torch.Tensor:
    """``F`` with ``F F^T = K_nC K_CC^+ K_Cn`` (shape ``(n, r)``, ``r <= len(centers)``).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import nystroem_factor
    >>> X = torch.randn(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> F = nystroem_factor(X, Gaussian(1.0), X)   # all points as centres: exact
    >>> bool(torch.allclose(F @ F.T, Gaussian(1.0)(X, X), atol=1e-6))
    True
    """
    X = as_tensor(X)
    C = as_tensor(centers, name="centers").to(X.dtype)
    KnC = kernel(X, C)
    return _factor(KnC, kernel(C, C), rcond)


def _factor(KnC: torch.Tensor, KCC: torch.Tensor, rcond: float) -> torch.Tensor:
    s, U = torch.linalg.eigh((KCC + KCC.T) / 2)
    keep = s > rcond * float(s.max().clamp_min(1e-300))
    return KnC @ (U[:, keep] / s[keep].sqrt())


def nystroem_errors(K: ArrayLike | GramAccess, F: torch.Tensor) -> dict[str, float]:
    """Frobenius and trace errors of ``K^ = F F^T`` (no ``n x n`` matrix when lazy).

    Parameters
    ----------
    K : tensor of shape (n, n) or GramAccess
    F : tensor of shape (n, r)

    Returns
    -------
    dict with ``"frobenius_sq"`` (``||K - K^||_F^2``) and ``"trace"`` (``tr(K - K^)``).
    """
    gram = K if isinstance(K, GramAccess) else DenseGram(K, check_psd=False)
    if gram.stored:
        Kd = gram.to_dense()
        R = Kd - F @ F.T
        fro = float((R * R).sum())
    else:
        KF = gram.cols_matmul(None, F)
        FtF = F.T @ F
        fro = _frobenius_sq(gram) - 2 * float((F * KF).sum()) + float((FtF * FtF).sum())
    tr = float(gram.diagonal().sum()) - float((F * F).sum())
    return {"frobenius_sq": max(fro, 0.0), "trace": max(tr, 0.0)}


def _frobenius_sq(gram: GramAccess, block: int = 2048) -> float:
    total = 0.0
    for i in range(0, gram.n, block):
        idx = torch.arange(i, min(i + block, gram.n))
        Kb = gram.columns(idx)
        total += float((Kb * Kb).sum())
    return total


def best_rank_k_errors(K: ArrayLike | GramAccess,
                       ks: Iterable[int]) -> dict[int, dict[str, float]]:
    """Best rank-k errors from the eigenvalues of ``K`` (Eckart-Young), ``O(n^3)``.

    Returns ``{k: {"frobenius_sq": sum_{i>k} lam_i^2, "trace": sum_{i>k} lam_i}}``.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import best_rank_k_errors
    >>> best_rank_k_errors(torch.diag(torch.tensor([3.0, 2.0, 1.0])), [1])
    {1: {'frobenius_sq': 5.0, 'trace': 3.0}}
    """
    Kd = K.to_dense() if isinstance(K, GramAccess) else (
        K if isinstance(K, torch.Tensor) else as_tensor(K, name="K"))
    lam = torch.linalg.eigvalsh((Kd + Kd.T) / 2).flip(0).clamp_min(0).to(torch.float64)
    out: dict[int, dict[str, float]] = {}
    for k in ks:
        tail = lam[int(k):]
        out[int(k)] = {"frobenius_sq": float((tail * tail).sum()), "trace": float(tail.sum())}
    return out


def approximation_factor(error: float, best: float, *, atol: float = 1e-12) -> float:
    """``error / best``, with values ``<= atol`` counting as zero.

    The ratio of two zeros (rank of ``K`` at most ``k``, exact approximation) is 1; a
    positive error over a zero best error is ``inf``.

    Examples
    --------
    >>> from kernelflow.landmarks import approximation_factor
    >>> approximation_factor(2.0, 1.0), approximation_factor(0.0, 0.0)
    (2.0, 1.0)
    """
    if best <= atol:
        return 1.0 if error <= atol else float("inf")
    return error / best


def column_subset_error(A: ArrayLike, indices: ArrayLike) -> float:
    """``||A - P_S A||_F^2`` with ``P_S`` the projector onto the chosen columns (QR).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import column_subset_error
    >>> A = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    >>> column_subset_error(A, [0])
    1.0
    """
    A = as_tensor(A, name="A")
    idx = torch.as_tensor(indices, dtype=torch.long)
    C = A[:, idx]
    U, s, _ = torch.linalg.svd(C, full_matrices=False)
    U = U[:, s > 1e-12 * float(s.max().clamp_min(1e-300))] if s.numel() else U[:, :0]
    R = A - U @ (U.T @ A)
    return float((R * R).sum())
