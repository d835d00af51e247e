"""BLESS-style coarse-to-fine leverage-score sampling (Rudi, Calandriello, Carratino and
Rosasco 2018), ending with an exact-k draw.

BLESS walks down a geometric path of ridges ``lam_h = lam_0 / q^h`` starting from
``lam_0 = tr(K)`` (where the effective dimension is at most 1). At each ridge it draws a
uniform candidate set ``U_h`` of size ``R_h ~ q1 * min(n, tr(K) / lam_h)``, estimates their
ridge leverage scores from the previous dictionary ``D`` with importance weights
``pi_j`` (the probability that ``j`` entered ``D``),

``l_i ~ (K_ii - K_iD (K_DD + lam_h Diag(pi))^-1 K_Di) / lam_h``,

and keeps each candidate with probability ``p_i = min(1, q2 l_i)``. The walk stops at the
first ridge whose estimated effective dimension ``(n / R_h) sum_U l_i`` reaches ``k``.
Unlike the paper, which returns the (random-size) dictionary, the last step scores all
``n`` points with the final dictionary and draws exactly ``k`` distinct indices with
probabilities ``~ min(1, l_i)`` (as the recursive RLS sampler does). Cost
``O(sum_h R_h |D_h|^2 + n |D|^2)`` time; kernel entries only for the blocks ``K_UD``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, overload

import torch

from ._access import GramAccess, KernelGram, as_gram, as_tensor, check_k
from ._base import LandmarkSelector, Param, Selection, _generator, _sample_weights
from .leverage import _block

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..typing import ArrayLike

__all__ = ["BLESS", "bless"]


def _scores(gram: GramAccess, rows: torch.Tensor, D: torch.Tensor, pi: torch.Tensor, lam: float,
            diag: torch.Tensor) -> torch.Tensor:
    KUD = _block(gram, rows, D)
    A = _block(gram, D, D) + torch.diag(lam * pi)
    A = (A + A.T) / 2
    try:
        KR = torch.linalg.solve(A, KUD.T).T
    except RuntimeError:  # numerically singular block: least squares instead
        KR = torch.linalg.lstsq(A, KUD.T).solution.T
    return ((diag[rows] - (KR * KUD).sum(1)) / lam).clamp_min(0)


@overload
def bless(gram: GramAccess, k: int, *, q: float = ..., q1: float = ..., q2: float = ...,
          generator: torch.Generator | None = ...,
          return_scores: Literal[False] = ...) -> torch.Tensor: ...


@overload
def bless(gram: GramAccess, k: int, *, q: float = ..., q1: float = ..., q2: float = ...,
          generator: torch.Generator | None = ...,
          return_scores: Literal[True]) -> tuple[torch.Tensor, torch.Tensor, float]: ...


@overload
def bless(gram: GramAccess, k: int, *, q: float = ..., q1: float = ..., q2: float = ...,
          generator: torch.Generator | None = ..., return_scores: bool = ...
          ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, float]: ...


def bless(gram: GramAccess, k: int, *, q: float = 2.0, q1: float = 2.0, q2: float = 2.0,
          generator: torch.Generator | None = None, return_scores: bool = False
          ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, float]:
    """Coarse-to-fine leverage-score sampling of ``k`` distinct landmarks.

    Parameters
    ----------
    gram : GramAccess or array-like of shape (n, n)
    k : int
    q : float, default=2.0
        Ridge shrink factor between levels.
    q1 : float, default=2.0
        Candidates per unit of ``tr(K) / lam``.
    q2 : float, default=2.0
        Oversampling of the dictionary.
    generator : torch.Generator or None
    return_scores : bool, default=False

    Returns
    -------
    indices : tensor of int64, shape (k,)
    scores, lam : tensor of shape (n,), float
        Only with ``return_scores=True``.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import KernelGram, bless
    >>> X = torch.randn(300, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> idx = bless(KernelGram(Gaussian(1.0), X), 15, generator=torch.Generator().manual_seed(0))
    >>> len(set(idx.tolist()))
    15
    """
    gram = as_gram(gram)
    n = gram.n
    k = check_k(k, n)
    if q <= 1 or q1 <= 0 or q2 <= 0:
        raise ValueError("need q > 1, q1 > 0 and q2 > 0")
    diag = gram.check_psd_diagonal()
    trace = float(diag.sum())
    if trace <= 0:
        raise ValueError("the kernel matrix is zero")
    lam = trace
    D = torch.randint(n, (1,), generator=generator)
    pi = torch.ones(1, dtype=diag.dtype) / n
    for _ in range(200):
        lam /= q
        R = min(n, math.ceil(q1 * min(n, trace / lam)))
        U = torch.randperm(n, generator=generator)[:R]
        lev = _scores(gram, U, D, pi, lam, diag)
        d_eff = n / R * float(lev.sum())
        p = (q2 * lev).clamp(max=1.0)
        keep = torch.rand(R, generator=generator, dtype=diag.dtype) < p
        if bool(keep.any()):
            D, pi = U[keep], p[keep] * R / n
        if d_eff >= k or lam < 1e-12 * trace:
            break
    scores = _scores(gram, torch.arange(n), D, pi, lam, diag)
    w = scores.clamp(max=1.0)
    w = _sample_weights(w)
    idx = torch.multinomial(w, k, replacement=False, generator=generator)
    return (idx, scores, lam) if return_scores else idx


class BLESS(LandmarkSelector):
    """BLESS-style leverage-score landmarks with an exact-k final draw (see :func:`bless`).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import BLESS
    >>> X = torch.randn(200, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> len(BLESS().select(X, Gaussian(1.0), 10, random_state=0).indices)
    10
    """

    _param_spec = {"q": Param("real", 1, low_open=True), "q1": Param("real", 0, low_open=True),
                   "q2": Param("real", 0, low_open=True)}

    def __init__(self, *, q: float = 2.0, q1: float = 2.0, q2: float = 2.0) -> None:
        self.q = q
        self.q1 = q1
        self.q2 = q2

    def select(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> Selection:
        X = as_tensor(X)
        k = check_k(k, X.shape[0])
        idx, scores, _ = bless(KernelGram(kernel, X), k, q=self.q, q1=self.q1, q2=self.q2,
                               generator=_generator(random_state), return_scores=True)
        return Selection(indices=idx, centers=X[idx], weights=scores[idx])
