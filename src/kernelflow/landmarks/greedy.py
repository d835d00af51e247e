"""Greedy forward selection (Farahat, Ghodsi and Kamel 2011, 2013): the paper's baseline.

The residual ``E = K - K[:, S] K[S, S]^+ K[S, :]`` is kept explicitly, and each step adds
the column with the largest error decrease:

* ``criterion="trace"`` (Farahat's ``f_i / g_i`` rule): ``||E[:, i]||^2 / E_ii``, which is
  exactly the decrease of ``tr(K - K_S)`` and of the CSSP error ``||X - P_S X||_F^2`` when
  ``K = X^T X``;
* ``criterion="frobenius"``: the exact decrease of ``||K - K_S||_F^2``,
  ``2 u^T E u / c - ||u||^4 / c^2`` with ``u = E[:, i]``, ``c = E_ii``.

Each step removes ``w w^T`` from ``E`` with ``w = E[:, l] / sqrt(E_ll)``, in place. With
``E' = E - w w^T`` and ``v = E w``,
``E'^2 = E^2 - v w^T - w v^T + (w^T w) w w^T``, so the trace score only needs the vector
``f = diag(E^2)`` (``f_i = ||E[:, i]||^2``), updated by
``f <- f - 2 v * w + (w^T w) w * w``: one product ``E w`` per step, no ``n x n`` temporary,
and no ``K @ K`` at the start (``f`` starts as the squared column norms of ``K``). The
Frobenius score also needs ``u^T E u = diag(E E^2)``, so ``E^2`` is kept and updated in
place by the same rank-two step. Cost ``O(n^2 k)`` time (plus one ``O(n^3)`` product for
``"frobenius"``) and ``O(n^2)`` memory: the residual ``E`` (and ``E^2`` for
``"frobenius"``) besides ``K``, as in the paper.
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
    scores = _ResidualScores(E, criterion)
    floor = rtol * float(E.diagonal().max())
    eligible = torch.ones(gram.n, dtype=torch.bool, device=E.device)
    chosen: list[int] = []
    gains: list[float] = []
    for _ in range(k):
        c = E.diagonal()
        ok = (c > floor) & eligible
        if not bool(ok.any()):
            break
        cs = torch.where(ok, c, 1.0)
        score = torch.where(ok, scores.score(cs), -torch.inf)
        l = int(torch.argmax(score))
        chosen.append(l)
        eligible[l] = False
        gains.append(float(score[l]))
        scores.remove(E[:, l] / float(c[l]) ** 0.5)
    return torch.as_tensor(chosen, dtype=torch.long), torch.as_tensor(gains, dtype=E.dtype)


class _ResidualScores:
    """The residual ``E`` (updated in place) and what the scores need of ``E^2``:
    its diagonal ``f`` for ``"trace"``, the whole matrix ``E2`` for ``"frobenius"``."""

    _ROWS = 256  # row panel of the column reductions

    def __init__(self, E: torch.Tensor, criterion: str):  # E: shape (n, n), overwritten
        self.E, self.criterion = E, criterion
        self.E2: torch.Tensor | None = None
        if criterion == "frobenius":
            self.E2 = E @ E
            self.f = self.E2.diagonal()  # a view: follows the in-place updates of E2
        else:
            self.f = self._column_dots(E, E)  # diag(E^2), E symmetric

    def score(self, cs: torch.Tensor) -> torch.Tensor:  # shape: (n,)
        f = self.f  # ||E[:, i]||^2
        if self.E2 is None:
            return f / cs
        uEu = self._column_dots(self.E, self.E2)  # u^T E u with u = E[:, i]
        return 2 * uEu / cs - f * f / (cs * cs)

    @classmethod
    def _column_dots(cls, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """``(A * B).sum(0)`` by row panels (A, B: shape (n, n)), no ``n x n`` temporary."""
        out = torch.zeros(A.shape[1], dtype=A.dtype, device=A.device)
        for s in range(0, A.shape[0], cls._ROWS):
            out += (A[s:s + cls._ROWS] * B[s:s + cls._ROWS]).sum(0)
        return out

    def remove(self, w: torch.Tensor) -> None:  # E <- E - w w^T, w: shape (n,)
        Ew = self.E @ w
        ww = float(w @ w)
        if self.E2 is None:
            self.f -= 2 * Ew * w - ww * (w * w)
        else:  # E2 <- E2 - a w^T - w a^T with a = E w - (w^T w / 2) w
            a = Ew - (ww / 2) * w
            self.E2.addr_(a, w, alpha=-1).addr_(w, a, alpha=-1)
        self.E.addr_(w, w, alpha=-1)


class GreedySelector(LandmarkSelector):
    """The paper's greedy baseline (Farahat et al.) as a landmark selector.

    Parameters
    ----------
    criterion : {"trace", "frobenius"}, default="trace"
    max_n : int, default=20000
        Refuses larger ``n`` (the method stores ``K`` and its residual, and ``E^2`` too for
        ``"frobenius"``).

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
