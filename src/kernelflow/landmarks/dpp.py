"""Exact k-DPP sampling (Kulesza and Taskar 2012, Algorithms 8 and 1) for small ``n``.

A k-DPP with kernel ``L`` draws a set ``S`` of size ``k`` with probability
``det(L[S, S]) / e_k(eigenvalues of L)``. The exact sampler

1. eigendecomposes ``L = sum_i lam_i v_i v_i^T`` (``O(n^3)``);
2. chooses ``k`` eigenvectors with the elementary symmetric polynomials ``e_l^j``
   (kept in log space so that large ``k`` cannot overflow);
3. samples the projection DPP on the chosen eigenvectors ``V`` item by item: the next item
   has probability proportional to the residual diagonal of ``V V^T`` after conditioning on
   the items already drawn, which is a randomly pivoted Cholesky on ``V V^T``
   (``O(n k^2)``).

Used with ``L = K`` for Nyström (Derezinski and Mahoney 2021) and ``L = X^T X`` for CSSP.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ._access import DenseGram, GramAccess, check_k, stored_gram
from ._base import LandmarkSelector, Param, Selection, _generator

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..typing import ArrayLike

__all__ = ["KDPP", "sample_kdpp"]


def _log_esp(lam: torch.Tensor, k: int) -> torch.Tensor:
    """``log e_l^j`` for ``l = 0..k``, ``j = 0..n`` (rows l, columns j)."""
    n = lam.numel()
    loglam = torch.log(lam.clamp_min(0))
    E = torch.full((k + 1, n + 1), -math.inf, dtype=lam.dtype)
    E[0, :] = 0.0
    for j in range(1, n + 1):
        E[1:, j] = torch.logaddexp(E[1:, j - 1], loglam[j - 1] + E[:-1, j - 1])
    return E


def sample_kdpp(L: ArrayLike | GramAccess, k: int, *,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one exact sample of the k-DPP with PSD kernel ``L``.

    Parameters
    ----------
    L : tensor of shape (n, n) or GramAccess
    k : int
        Must not exceed the numerical rank of ``L``.
    generator : torch.Generator or None

    Returns
    -------
    indices : tensor of int64, shape (k,)
        Sorted.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import sample_kdpp
    >>> g = torch.Generator().manual_seed(0)
    >>> sample_kdpp(torch.eye(5, dtype=torch.float64), 5, generator=g).tolist()
    [0, 1, 2, 3, 4]
    """
    gram = L if isinstance(L, GramAccess) else DenseGram(L)
    k = check_k(k, gram.n)
    gram.check_psd_diagonal()
    A = gram.to_dense()
    lam, V = torch.linalg.eigh((A + A.T) / 2)
    lam = lam.clamp_min(0)
    tiny = 1e-12 * float(lam.max()) if lam.numel() else 0.0
    rank = int((lam > tiny).sum())
    if k > rank:
        raise ValueError(f"k={k} exceeds the numerical rank {rank} of the DPP kernel")
    lam = torch.where(lam > tiny, lam, torch.zeros_like(lam))
    E = _log_esp(lam, k)
    loglam = torch.log(lam)
    u = torch.rand(gram.n, generator=generator, dtype=A.dtype)
    chosen: list[int] = []
    l = k
    for j in range(gram.n, 0, -1):
        if l == 0:
            break
        if j == l:  # every remaining eigenvector must be taken
            chosen.extend(range(j - 1, -1, -1))
            l = 0
            break
        logp = loglam[j - 1] + E[l - 1, j - 1] - E[l, j]
        if float(u[j - 1]) < math.exp(min(float(logp), 0.0)):
            chosen.append(j - 1)
            l -= 1
    W = V[:, chosen]  # orthonormal, n x k
    # projection DPP by sequential conditioning (randomly pivoted Cholesky on W W^T)
    d = (W * W).sum(1)
    F = torch.zeros(gram.n, k, dtype=A.dtype)
    items: list[int] = []
    for r in range(k):
        i = int(torch.multinomial(d.clamp_min(0), 1, generator=generator))
        col = W @ W[i] - F[:, :r] @ F[i, :r]
        F[:, r] = col / float(col[i]).__pow__(0.5)
        d = d - F[:, r] ** 2
        d[i] = 0.0
        items.append(i)
    return torch.as_tensor(sorted(items), dtype=torch.long)


class KDPP(LandmarkSelector):
    """Exact k-DPP landmarks with ``L = K`` (``O(n^3)``; refuses ``n > max_n``).

    Parameters
    ----------
    max_n : int, default=5000

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import KDPP
    >>> X = torch.randn(60, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> len(KDPP().select(X, Gaussian(1.0), 5, random_state=0).indices)
    5
    """

    _param_spec = {"max_n": Param("int", 1)}

    def __init__(self, *, max_n: int = 5000) -> None:
        self.max_n = max_n

    def select(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> Selection:
        Xt, k, gram = stored_gram(X, kernel, k, max_n=self.max_n, why=(
            "exact k-DPP sampling needs an eigendecomposition of the full kernel"))
        idx = sample_kdpp(gram, k, generator=_generator(random_state))
        return Selection(indices=idx, centers=Xt[idx], weights=None)
