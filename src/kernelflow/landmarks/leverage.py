"""Ridge leverage-score sampling: recursive RLS-Nyström (Musco and Musco 2017).

The ``lam``-ridge leverage score of point ``i`` is ``l_i = (K (K + lam I)^-1)_ii``. The
recursive sampler estimates them level by level: a uniform half of the points is sampled
recursively, the scores of the current level are estimated from that sample ``S`` with
weights ``W``,

``l_i ~ (K_ii - K_iS (K_SS + lam W^-2)^-1 K_Si) / lam``,

and the next sample keeps ``i`` with probability ``min(1, log(k) l_i)``. The ridge of each
level is chosen so that about ``k / (4 log k)`` directions are above it. The last level
draws exactly ``k`` distinct indices with probabilities ``~ min(1, l_i)`` (the practical
variant of the authors' code). Cost ``O(n k^2)`` time and ``O(n k)`` kernel entries.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, overload

import torch

from ._access import GramAccess, KernelGram, as_gram, as_tensor, check_k
from ._base import LandmarkSelector, Selection, _generator, _sample_weights

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..typing import ArrayLike

__all__ = ["RecursiveRLS", "recursive_rls", "ridge_leverage_scores"]


def ridge_leverage_scores(K: torch.Tensor, lam: float) -> torch.Tensor:
    """Exact ridge leverage scores ``diag(K (K + lam I)^-1)``, ``O(n^3)`` (reference).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import ridge_leverage_scores
    >>> ridge_leverage_scores(torch.eye(3, dtype=torch.float64), 1.0).tolist()
    [0.5, 0.5, 0.5]
    """
    K = as_gram(K, name="K").to_dense() if not isinstance(K, torch.Tensor) else K
    n = K.shape[0]
    return torch.linalg.solve(K + lam * torch.eye(n, dtype=K.dtype), K).diagonal()


def _block(gram: GramAccess, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``K[rows, cols]`` through the access object (only those entries are evaluated)."""
    return gram.block(rows, cols)


@overload
def recursive_rls(gram: GramAccess, k: int, *, generator: torch.Generator | None = ...,
                  return_scores: Literal[False] = ...) -> torch.Tensor: ...


@overload
def recursive_rls(gram: GramAccess, k: int, *, generator: torch.Generator | None = ...,
                  return_scores: Literal[True]) -> tuple[torch.Tensor, torch.Tensor, float]: ...


@overload
def recursive_rls(gram: GramAccess, k: int, *, generator: torch.Generator | None = ...,
                  return_scores: bool = ...
                  ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, float]: ...


def recursive_rls(gram: GramAccess, k: int, *, generator: torch.Generator | None = None,
                  return_scores: bool = False
                  ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, float]:
    """Recursive ridge-leverage-score sampling of ``k`` distinct landmarks.

    Parameters
    ----------
    gram : GramAccess or array-like of shape (n, n)
    k : int
    generator : torch.Generator or None
    return_scores : bool, default=False
        Also return the final-level score estimates and the ridge used there.

    Returns
    -------
    indices : tensor of int64, shape (k,)
    scores, lam : tensor of shape (n,), float
        Only with ``return_scores=True``: estimated ``lam``-ridge leverage scores.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import KernelGram, recursive_rls
    >>> X = torch.randn(200, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> g = torch.Generator().manual_seed(0)
    >>> idx = recursive_rls(KernelGram(Gaussian(1.0), X), 20, generator=g)
    >>> len(set(idx.tolist()))
    20
    """
    gram = as_gram(gram)
    n = gram.n
    k = check_k(k, n)
    diag = gram.check_psd_diagonal()
    dtype = diag.dtype
    oversamp = max(math.log(k), 1.0)
    kk = max(1, math.ceil(k / (4 * oversamp)))
    n_levels = max(0, math.ceil(math.log2(n / k))) if n > k else 0
    perm = torch.randperm(n, generator=generator)
    sizes = [n]
    for _ in range(n_levels):
        sizes.append(math.ceil(sizes[-1] / 2))
    samp = torch.arange(sizes[-1])
    ind = perm[samp]
    w = torch.ones(samp.numel(), dtype=dtype)
    if n_levels == 0:  # k == n: every point is a landmark
        idx = perm
        scores = torch.ones(n, dtype=dtype)
        return (idx, scores, 0.0) if return_scores else idx
    for level in range(n_levels - 1, -1, -1):
        cur = perm[: sizes[level]]  # a prefix of perm, so ``samp`` indexes its rows
        KS = _block(gram, cur, ind)  # (|cur|, |samp|)
        SKS = KS[samp]
        if kk >= samp.numel():
            lam = 1e-6
        else:
            M = w[:, None] * SKS * w[None, :]
            top = torch.linalg.eigvalsh((M + M.T) / 2)[-kk:].sum()
            lam = float((SKS.diagonal() * w * w).sum() - top) / kk
        lam = max(lam, 1e-10 * float(diag.max()))
        A = SKS + torch.diag(lam / (w * w))
        A = (A + A.T) / 2
        try:
            KR = torch.cholesky_solve(KS.T, torch.linalg.cholesky(A)).T  # KS R
        except RuntimeError:  # numerically singular block: least squares instead
            KR = torch.linalg.lstsq(A, KS.T).solution.T
        lev = ((diag[cur] - (KR * KS).sum(1)) / lam).clamp_min(0)
        if level == 0:
            break
        p = (oversamp * lev).clamp(max=1.0)
        keep = torch.rand(cur.numel(), generator=generator, dtype=dtype) < p
        samp = torch.nonzero(keep).flatten()
        if samp.numel() == 0:
            p = torch.full((cur.numel(),), k / cur.numel(), dtype=dtype)
            samp = torch.randperm(cur.numel(), generator=generator)[:k]
        w = 1 / p[samp].sqrt()
        ind = cur[samp]
    # final draw over all points: exactly k distinct indices, probabilities ~ min(1, lev)
    p = lev.clamp(max=1.0)
    # a few zero scores must not make k distinct draws impossible
    p = _sample_weights(p)
    pick = torch.multinomial(p, k, replacement=False, generator=generator)
    idx = perm[pick]
    if return_scores:
        scores = torch.zeros(n, dtype=dtype)
        scores[perm] = lev
        return idx, scores, lam
    return idx


class RecursiveRLS(LandmarkSelector):
    """Recursive ridge-leverage-score sampling (Musco and Musco 2017) as a selector.

    ``O(n k^2)`` time, ``O(n k)`` kernel entries. The sampling weights are not used for
    the Nyström approximation (as in Mathur et al.); ``Selection.weights`` holds the
    estimated leverage scores of the chosen points.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import RecursiveRLS
    >>> X = torch.randn(300, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> len(RecursiveRLS().select(X, Gaussian(1.0), 15, random_state=0).indices)
    15
    """

    def select(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> Selection:
        X = as_tensor(X)
        k = check_k(k, X.shape[0])
        gram = KernelGram(kernel, X)
        idx, scores, _ = recursive_rls(
            gram, k, generator=_generator(random_state), return_scores=True
        )
        return Selection(indices=idx, centers=X[idx], weights=scores[idx])
