"""Pivoted partial Cholesky: greedy, randomly pivoted (RPCholesky) and blocked RPCholesky.

A rank-k partial Cholesky factor ``F`` (``n x k``) with pivots ``S`` gives exactly the
Nyström approximation ``F F^T = K[:, S] K[S, S]^+ K[S, :]``. Each step reads one column of
``K`` (``n`` entries) and the diagonal is read once, so the whole run evaluates
``(k + 1) n`` kernel entries and costs ``O(k^2 n)`` further flops (Chen, Epperly, Tropp and
Webber 2025, Algorithm 1).

Pivot rules on the residual diagonal ``d = diag(K - F F^T)``:

* ``"greedy"``: ``argmax d`` (classic pivoted Cholesky);
* ``"random"``: sample ``i`` with probability ``d_i / sum(d)`` (RPCholesky);
* blocked RPCholesky draws ``b`` pivots at once (without replacement, ``p ~ d``), reads the
  ``b`` columns together and factorises the ``b x b`` block with a pivoted Cholesky, so
  matrix products replace the column loop (Epperly, Tropp and Webber 2024, block variant
  without the rejection step).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ._access import GramAccess, KernelGram, as_gram, as_tensor, check_k
from ._base import LandmarkSelector, Param, Selection, _generator

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..typing import ArrayLike

logger = logging.getLogger(__name__)

__all__ = ["BlockRPCholesky", "PivotedCholesky", "RPCholesky", "pivoted_cholesky"]


def pivoted_cholesky(
    gram: GramAccess,
    k: int,
    *,
    rule: str = "random",
    block_size: int = 1,
    generator: torch.Generator | None = None,
    initial: Sequence[int] | torch.Tensor | None = None,
    candidates: Sequence[int] | torch.Tensor | None = None,
    rtol: float = 1e-12,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-``k`` partial Cholesky factor of a PSD matrix seen through ``gram``.

    Parameters
    ----------
    gram : GramAccess or array-like of shape (n, n)
        Access to the diagonal and to columns of ``K`` (a matrix is stored as is).
    k : int
        Number of pivots.
    rule : {"random", "greedy"}, default="random"
    block_size : int, default=1
        Pivots drawn per block (``rule="random"`` only).
    generator : torch.Generator or None
    initial : sequence of int or None
        Pivots forced first (used to complete a given set greedily).
    candidates : sequence of int or None
        Restrict the pivots chosen by the rule to these indices (after ``initial``).
    rtol : float, default=1e-12
        A residual diagonal below ``rtol * max(diag K)`` counts as zero; the factor stops
        early (with fewer than ``k`` columns) when the whole residual is zero.

    Returns
    -------
    F : tensor of shape (n, r)
        ``F F^T`` is the Nyström approximation on the pivots, ``r <= k``.
    pivots : tensor of int64, shape (r,)

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import DenseGram, pivoted_cholesky
    >>> K = torch.tensor([[4.0, 2.0, 0.0], [2.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    >>> F, piv = pivoted_cholesky(DenseGram(K), 3, rule="greedy")
    >>> piv.tolist(), bool(torch.allclose(F @ F.T, K))
    ([0, 1, 2], True)
    """
    gram = as_gram(gram)
    n = gram.n
    k = check_k(k, n)
    if rule not in ("random", "greedy"):
        raise ValueError(f"rule must be 'random' or 'greedy', got {rule!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    d = gram.check_psd_diagonal().clone()
    scale = float(d.max()) if n else 0.0
    floor = rtol * scale
    F = torch.zeros(n, k, dtype=d.dtype, device=d.device)
    pivots: list[int] = []
    forced = [] if initial is None else [int(i) for i in torch.as_tensor(initial).flatten()]
    allowed = None
    if candidates is not None:
        allowed = torch.zeros(n, dtype=torch.bool, device=d.device)
        allowed[torch.as_tensor(candidates, dtype=torch.long)] = True
    r = 0
    while r < k:
        if allowed is not None and not forced:
            d = torch.where(allowed, d, torch.zeros_like(d))
        if float(d.sum()) <= floor:
            logger.info("residual is zero after %d pivots; stopping early", r)
            break
        b = min(block_size if rule == "random" else 1, k - r)
        if forced:
            S = forced[:b]
            forced = forced[b:]
        elif rule == "greedy":
            S = [int(torch.argmax(d))]
        else:
            p = d.clamp_min(0)
            nz = int((p > floor).sum())
            S = torch.multinomial(p, min(b, nz), replacement=False, generator=generator).tolist()
        G = gram.columns(torch.as_tensor(S))  # (n, b): the only kernel entries read
        if r:
            G = G - F[:, :r] @ F[S, :r].T
        accepted, cols = _factor_block(G, S, floor)
        for j, c in zip(accepted, cols.T):
            if r >= k:
                break
            F[:, r] = c
            pivots.append(j)
            r += 1
        d = (d - (cols * cols).sum(1)).clamp_min(0)
        # every pivot of the block is spent: accepted ones are exact now, and a rejected one's
        # recomputed residual is at most the floor (the tracked d can drift above it by
        # rounding, and a pivot left there would be chosen again forever)
        d[torch.as_tensor(S, dtype=torch.long)] = 0
    return F[:, :r], torch.as_tensor(pivots, dtype=torch.long)


def _factor_block(G: torch.Tensor, S: list[int],
                  floor: float) -> tuple[list[int], torch.Tensor]:
    """Cholesky columns of the residual block ``G = E[:, S]`` (pivoted, drops zero pivots)."""
    acc: list[int] = []
    cols: list[torch.Tensor] = []
    G = G.clone()
    remaining = list(range(len(S)))
    while remaining:
        diag = torch.stack([G[S[j], j] for j in remaining])
        jj = int(torch.argmax(diag))
        j = remaining.pop(jj)
        piv = float(G[S[j], j])
        if piv <= floor:
            break
        c = G[:, j] / piv**0.5
        acc.append(S[j])
        cols.append(c)
        for m in remaining:
            G[:, m] -= c * c[S[m]]
    if not cols:
        return [], G.new_zeros(G.shape[0], 0)
    return acc, torch.stack(cols, 1)


class _CholeskySelector(LandmarkSelector):
    rule = "random"
    _param_spec = {"block_size": Param("int", 1)}

    def __init__(self, *, block_size: int = 1) -> None:
        self.block_size = block_size

    def select(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> Selection:
        X = as_tensor(X)
        k = check_k(k, X.shape[0])
        gram = KernelGram(kernel, X)
        gen = _generator(random_state)
        F, piv = pivoted_cholesky(
            gram, k, rule=self.rule, block_size=self.block_size, generator=gen
        )
        if piv.numel() < k:
            logger.warning("kernel matrix has rank %d < k=%d; returning %d landmarks",
                           piv.numel(), k, piv.numel())
        return Selection(indices=piv, centers=X[piv], weights=None)


class PivotedCholesky(_CholeskySelector):
    """Greedy pivoted Cholesky: pivot ``argmax`` of the residual diagonal.

    Deterministic; reads ``(k + 1) n`` kernel entries and costs ``O(k^2 n)`` flops.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import PivotedCholesky
    >>> X = torch.linspace(0, 1, 50, dtype=torch.float64)[:, None]
    >>> PivotedCholesky().select(X, Gaussian(0.2), 3).indices.tolist()
    [0, 49, 24]
    """

    rule = "greedy"

    def __init__(self) -> None:
        self.block_size = 1


class RPCholesky(_CholeskySelector):
    """Randomly pivoted Cholesky: pivot ``i`` drawn with probability ``d_i / sum(d)``.

    Reads ``(k + 1) n`` kernel entries, ``O(k^2 n)`` flops (Chen et al. 2025, Alg. 1).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import RPCholesky
    >>> X = torch.randn(100, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> len(RPCholesky().select(X, Gaussian(1.0), 10, random_state=0).indices)
    10
    """

    def __init__(self) -> None:
        self.block_size = 1


class BlockRPCholesky(_CholeskySelector):
    """Blocked RPCholesky: ``block_size`` pivots per round, read as one column block.

    Same ``(k + 1) n`` entry count when no drawn pivot is rejected; the factor update is a
    matrix product per block instead of per column.

    Parameters
    ----------
    block_size : int, default=16

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import BlockRPCholesky
    >>> X = torch.randn(100, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> len(BlockRPCholesky(block_size=4).select(X, Gaussian(1.0), 10, random_state=0).indices)
    10
    """

    def __init__(self, *, block_size: int = 16) -> None:
        self.block_size = block_size
