"""Greedy forward selection (Farahat, Ghodsi and Kamel 2011, 2013): the paper's baseline.

The residual ``E = K - K[:, S] K[S, S]^+ K[S, :]`` is kept explicitly, and each step adds
the column with the largest error decrease:

* ``criterion="trace"`` (Farahat's ``f_i / g_i`` rule): ``||E[:, i]||^2 / E_ii``, which is
  exactly the decrease of ``tr(K - K_S)`` and of the CSSP error ``||X - P_S X||_F^2`` when
  ``K = X^T X``;
* ``criterion="frobenius"``: the exact decrease of ``||K - K_S||_F^2``,
  ``2 u^T E u / c - ||u||^4 / c^2`` with ``u = E[:, i]``, ``c = E_ii``.

Both scores come from ``E`` and ``E^2``, updated by the rank-one step ``E <- E - w w^T``
with ``w = E[:, l] / sqrt(E_ll)``. Cost ``O(n^2 k)`` time and ``O(n^2)`` memory (the full
matrix is needed, as in the paper).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._access import DenseGram, GramAccess, check_k, stored_gram
from ._base import LandmarkSelector, Param, Selection

if TYPE_CHECKING:
    import numpy as np

    from ..kernels import Kernel
    from ..typing import ArrayLike

__all__ = ["GreedySelector", "greedy_selection"]


def greedy_selection(K: ArrayLike | GramAccess, k: int, *, criterion: str = "trace",
                     rtol: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy forward selection of ``k`` columns of a PSD matrix.

    Parameters
    ----------
    K : tensor of shape (n, n) or GramAccess
    k : int
    criterion : {"trace", "frobenius"}, default="trace"
    rtol : float
        Columns whose residual diagonal is below ``rtol * max(diag K)`` are not eligible.

    Returns
    -------
    indices : tensor of int64, shape (k,)
        In the order chosen.
    gains : tensor of shape (k,)
        The error decrease credited to each step.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import greedy_selection
    >>> K = torch.tensor([[4.0, 2.0, 0.0], [2.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    >>> idx, gains = greedy_selection(K, 2)
    >>> idx.tolist(), gains.numpy().round(3)
    ([0, 1], array([5. , 2.5]))
    """
    if criterion not in ("trace", "frobenius"):
        raise ValueError(f"criterion must be 'trace' or 'frobenius', got {criterion!r}")
    gram = K if isinstance(K, GramAccess) else DenseGram(K)
    k = check_k(k, gram.n)
    gram.check_psd_diagonal()
    E = gram.to_dense().clone()
    E2 = E @ E
    floor = rtol * float(E.diagonal().max())
    chosen: list[int] = []
    gains: list[float] = []
    for _ in range(k):
        c = E.diagonal()
        ok = c > floor
        if chosen:
            ok[torch.as_tensor(chosen)] = False
        if not bool(ok.any()):
            break
        cs = torch.where(ok, c, 1.0)
        f = E2.diagonal()  # ||E[:, i]||^2
        if criterion == "trace":
            score = f / cs
        else:
            uEu = (E * E2).sum(0)  # u^T E u with u = E[:, i]
            score = 2 * uEu / cs - f * f / (cs * cs)
        score = torch.where(ok, score, -torch.inf)
        l = int(torch.argmax(score))
        chosen.append(l)
        gains.append(float(score[l]))
        w = E[:, l] / float(c[l]) ** 0.5
        Ew = E @ w
        ww = float(w @ w)
        E2 -= torch.outer(Ew, w) + torch.outer(w, Ew) - ww * torch.outer(w, w)
        E -= torch.outer(w, w)
    return torch.as_tensor(chosen, dtype=torch.long), torch.as_tensor(gains, dtype=E.dtype)


class GreedySelector(LandmarkSelector):
    """The paper's greedy baseline (Farahat et al.) as a landmark selector.

    Parameters
    ----------
    criterion : {"trace", "frobenius"}, default="trace"
    max_n : int, default=20000
        Refuses larger ``n`` (the method stores two ``n x n`` matrices).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.landmarks import GreedySelector
    >>> X = torch.linspace(0, 1, 40, dtype=torch.float64)[:, None]
    >>> len(GreedySelector().select(X, Gaussian(0.3), 4).indices)
    4
    """

    _param_spec = {"criterion": Param("option", options=("trace", "frobenius")),
                   "max_n": Param("int", 1)}

    def __init__(self, *, criterion: str = "trace", max_n: int = 20000) -> None:
        self.criterion = criterion
        self.max_n = max_n

    def select(
        self, X: ArrayLike, kernel: Kernel, k: int, *,
        random_state: int | np.random.RandomState | torch.Generator | None = None,
    ) -> Selection:
        Xt, k, gram = stored_gram(X, kernel, k, max_n=self.max_n, why=(
            "greedy selection stores two full n x n matrices"))
        idx, _ = greedy_selection(gram, k, criterion=self.criterion)
        return Selection(indices=idx, centers=Xt[idx], weights=None)
