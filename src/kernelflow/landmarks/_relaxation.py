"""The continuous relaxation of Mathur, Moka and Botev: losses, gradients, estimators.

Notation (paper §2): ``t in [0, 1]^n``, ``T = Diag(t)``, ``Z = K - delta I`` and
``L_t = T K T + delta (I - T^2)``. The relaxed Nyström matrix is
``K~(t) = K T L_t^+ T K`` (Definition 2.5); at a binary ``s`` it equals the Nyström
approximation ``K_[s] K_[s,s]^+ K_[s]^T`` for every ``delta > 0`` (Lemma 2.6).

* trace loss (CSSP, and trace-norm Nyström with ``K = X^T X``):
  ``f(t) = -tr(K T L_t^+ T K) + lam sum(t)``, gradient Lemma 2.4;
* Frobenius loss: ``g(t) = ||K - K~(t)||_F^2 + lam sum(t)``, gradient Lemma 2.8.

The dense functions cost ``O(n^3)`` and serve small problems and tests. The stochastic
estimators (Lemmas 3.1 and 3.2) only multiply by ``K`` (through a
:class:`~kernelflow.landmarks._access.GramAccess`) and solve with ``L_t`` by conjugate
gradients, restricted to the active set of non-zero ``t`` (Lemma 3.3).
"""

from __future__ import annotations

import numpy as np
import torch

from ._base import check_points

__all__ = [
    "frobenius_gradient",
    "frobenius_loss",
    "low_rank_preconditioner",
    "relaxed_nystroem",
    "stochastic_gradient",
    "t_from_w",
    "trace_gradient",
    "trace_loss",
    "w_from_t",
]


def t_from_w(w: torch.Tensor) -> torch.Tensor:
    """Box reparametrisation ``t = 1 - exp(-w^2)`` (paper §3.1); ``t`` lies in ``[0, 1)``."""
    return -torch.expm1(-w * w)


def w_from_t(t) -> torch.Tensor:
    """Inverse map ``w = sqrt(-log(1 - t))``; ``t0 = 1/2`` gives ``w0 = sqrt(log 2)``."""
    t = torch.as_tensor(t, dtype=torch.float64)
    return torch.sqrt(-torch.log1p(-t))


def _check_Kt(K, t) -> tuple[torch.Tensor, torch.Tensor]:
    """K as a square tensor (array-likes and pandas accepted) and t as a vector of its length."""
    if not isinstance(K, torch.Tensor):
        K = check_points(K, name="K")
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"K must be a square matrix, got shape {tuple(K.shape)}.")
    if hasattr(t, "to_numpy"):  # pandas
        t = np.array(t.to_numpy(), dtype=np.float64)
    t = torch.as_tensor(t, dtype=K.dtype)
    if t.shape != (K.shape[0],):
        raise ValueError(f"t must be a vector of length {K.shape[0]}, got shape "
                         f"{tuple(t.shape)}.")
    return K, t


def _L(K, t, delta):
    return t[:, None] * K * t[None, :] + torch.diag(delta * (1 - t * t))


def _relaxed_inner(K, t, delta):
    """``L_t^+ T K``: a solve in the interior, a pseudo-inverse when some ``t_j = 1``."""
    L = _L(K, t, delta)
    TK = t[:, None] * K
    if bool((t >= 1).any()):
        return torch.linalg.pinv(L, hermitian=True) @ TK
    return torch.linalg.solve(L, TK)


def relaxed_nystroem(K: torch.Tensor, t, delta: float = 1.0) -> torch.Tensor:
    """Relaxed Nyström matrix ``K~(t) = K T L_t^+ T K`` (paper Definition 2.5), ``O(n^3)``.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.landmarks import relaxed_nystroem
    >>> A = torch.tensor([[2.0, 1.0, 0.0], [1.0, 2.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    >>> s = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    >>> C = A[:, [0, 2]]
    >>> bool(torch.allclose(relaxed_nystroem(A, s), C @ torch.linalg.pinv(C[[0, 2]]) @ C.T))
    True
    """
    K, t = _check_Kt(K, t)
    return (K * t[None, :]) @ _relaxed_inner(K, t, delta)


def trace_loss(K, t, delta: float = 1.0, lam: float = 0.0) -> torch.Tensor:
    """``f_lam(t) = -tr(K T L_t^+ T K) + lam sum(t)`` (paper eq. after Definition 2.1).

    At a binary ``s`` with ``K = X^T X`` this is ``||X - P_s X||_F^2 - ||X||_F^2 + lam |s|``.
    """
    K, t = _check_Kt(K, t)
    return -torch.trace(relaxed_nystroem(K, t, delta)) + lam * t.sum()


def frobenius_loss(K, t, delta: float = 1.0, lam: float = 0.0) -> torch.Tensor:
    """``g_lam(t) = ||K - K~(t)||_F^2 + lam sum(t)`` (paper problem (3) relaxed)."""
    K, t = _check_Kt(K, t)
    return ((K - relaxed_nystroem(K, t, delta)) ** 2).sum() + lam * t.sum()


def trace_gradient(K, t, delta: float = 1.0, lam: float = 0.0) -> torch.Tensor:
    """Exact gradient of ``f_lam`` (Lemma 2.4), ``t`` in the interior, ``O(n^3)``.

    ``grad = 2 Diag[L^-1 T K^2 (T L^-1 T Z - I)] + lam 1``.
    """
    K, t = _check_Kt(K, t)
    n = K.shape[0]
    Z = K - delta * torch.eye(n, dtype=K.dtype)
    Linv = torch.linalg.inv(_L(K, t, delta))
    A = (Linv * t[None, :]) @ (K @ K)  # L^-1 T K^2
    B = t[:, None] * (Linv @ (t[:, None] * Z))  # T L^-1 T Z
    return 2 * ((A * (B - torch.eye(n, dtype=K.dtype)).T).sum(1)) + lam


def frobenius_gradient(K, t, delta: float = 1.0, lam: float = 0.0) -> torch.Tensor:
    """Exact gradient of ``g_lam`` (Lemma 2.8), ``t`` in the interior, ``O(n^3)``.

    ``grad = 4 Diag[L^-1 T K D K (I - T L^-1 T Z)] + lam 1`` with ``D = K~(t) - K``.
    """
    K, t = _check_Kt(K, t)
    n = K.shape[0]
    Z = K - delta * torch.eye(n, dtype=K.dtype)
    Linv = torch.linalg.inv(_L(K, t, delta))
    D = (K * t[None, :]) @ (Linv @ (t[:, None] * K)) - K
    A = (Linv * t[None, :]) @ (K @ D @ K)
    B = torch.eye(n, dtype=K.dtype) - t[:, None] * (Linv @ (t[:, None] * Z))
    return 4 * (A * B.T).sum(1) + lam


# ----------------------------------------------------------------------------------------
# matrix-free estimators (Lemmas 3.1 and 3.2)


class _Solver:
    """Solves with ``(L_t)_+`` on the active set: preconditioned CG, or a dense Cholesky
    factorisation of the active block when ``direct`` (small active sets).

    The CG preconditioner is Jacobi (the diagonal of ``L_t``) or, when ``factor`` is given,
    the low-rank-plus-diagonal approximation of ``L_t`` built from a partial Cholesky factor
    ``K ~ F F^T`` (see :func:`low_rank_preconditioner`).

    The operator of the active block ``K[idx][:, idx]`` is made once, on first use, and held
    for the solver's lifetime (all its CG iterations and products): taking the subset of a
    stored ``K`` copies the block out, which at every CG iteration cost as much as the
    product. The dense factorisation reads its own copy, freed once factorised."""

    def __init__(self, gram, idx, t, delta, *, tol, max_iter, direct=False, factor=None):
        self.gram, self.idx, self.t, self.delta = gram, idx, t, delta
        self.tol, self.max_iter = tol, max_iter
        self.n_matvec = 0
        self.n_cg_iter = 0
        self._block = None
        tt = t * t
        d = gram.diagonal() if idx is None else gram.diagonal()[idx]
        # Jacobi preconditioner: the diagonal of L_t is t^2 K_jj + delta (1 - t^2)
        self.diag = tt * d + delta * (1 - tt)
        self._chol = self._lu = None
        self._precond = lambda R: R / self.diag[:, None]
        if direct:
            # not the held block: it would stay in memory beside the factor
            L = _L(gram.sub_block(idx), t, delta)
            if L.shape[0] <= 128:
                # small blocks: LAPACK's threaded Cholesky has a large fixed start-up cost
                self._lu = torch.linalg.lu_factor(L)
            else:
                self._chol = torch.linalg.cholesky(L)
        elif factor is not None:
            F = factor if idx is None else factor[idx]
            self._precond = low_rank_preconditioner(F, d, t, delta)

    def block(self):
        """The operator of ``K[idx][:, idx]`` (``K`` itself when ``idx`` is None), held."""
        if self._block is None:
            self._block = self.gram.op.subset(self.idx, self.idx)
        return self._block

    def sub_matmul(self, V):  # K[idx][:, idx] @ V, V: shape (len(idx), m)
        return self.block() @ V

    def matvec(self, V):
        t = self.t[:, None]
        self.n_matvec += V.shape[1]
        return t * self.sub_matmul(t * V) + self.delta * (1 - t * t) * V

    def solve(self, B, x0=None):
        if self._chol is not None:
            return torch.cholesky_solve(B, self._chol)
        if self._lu is not None:
            return torch.linalg.lu_solve(*self._lu, B)
        from kernelflow.linalg import conjugate_gradient

        res = conjugate_gradient(
            self.matvec,
            B,
            x0=x0,
            max_iter=self.max_iter,
            tol=self.tol,
            preconditioner=self._precond,
        )
        self.n_cg_iter += res.n_iter
        return res.x


def low_rank_preconditioner(F: torch.Tensor, diag_K: torch.Tensor, t: torch.Tensor,
                            delta: float):
    """``R -> M^-1 R`` for ``M = T F F^T T + Diag(t^2 (diag K - diag F F^T) + delta (1 - t^2))``.

    ``F`` (``n x r``, e.g. a partial pivoted Cholesky factor of ``K``) gives ``K ~ F F^T``;
    ``M`` then equals ``L_t = T K T + delta (I - T^2)`` up to the off-diagonal part of the
    Nyström residual ``K - F F^T``, and keeps the exact diagonal of ``L_t``. Applied by
    Woodbury with an ``r x r`` Cholesky factor: ``O(n r^2)`` to build (once per ``t``),
    ``O(n r)`` per right-hand side. The residual ``K - F F^T`` has its largest eigenvalues
    removed, so CG on the preconditioned system needs far fewer iterations than with the
    diagonal alone when ``K``'s spectrum decays (the kernel case).

    Examples
    --------
    >>> import torch
    >>> F = torch.tensor([[1.0, 0.0], [0.5, 1.0], [0.0, 2.0]], dtype=torch.float64)
    >>> K = F @ F.T
    >>> t = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)
    >>> apply = low_rank_preconditioner(F, K.diagonal(), t, 0.5)
    >>> L = t[:, None] * K * t[None, :] + torch.diag(0.5 * (1 - t * t))
    >>> bool(torch.allclose(apply(L), torch.eye(3, dtype=torch.float64)))
    True
    """
    tt = t * t
    resid = (diag_K - (F * F).sum(1)).clamp_min(0)
    D = tt * resid + delta * (1 - tt)  # > 0 for t in [0, 1)
    U = t[:, None] * F  # shape: (n, r)
    UD = U / D[:, None]
    C = torch.eye(F.shape[1], dtype=F.dtype, device=F.device) + U.T @ UD
    Lc = torch.linalg.cholesky(C)

    def apply(R: torch.Tensor) -> torch.Tensor:
        return R / D[:, None] - UD @ torch.cholesky_solve(UD.T @ R, Lc)

    return apply


def stochastic_gradient(
    gram,
    t: torch.Tensor,
    z: torch.Tensor,
    *,
    loss: str = "frobenius",
    delta: float = 1.0,
    lam: float = 0.0,
    active=None,
    cg_tol: float = 1e-6,
    cg_max_iter: int | None = None,
    direct: bool = False,
    warm: dict | None = None,
    factor: torch.Tensor | None = None,
    stats: dict | None = None,
):
    """Unbiased gradient estimate from Rademacher vectors (paper Lemmas 3.1 and 3.2).

    Parameters
    ----------
    gram : GramAccess
        Products with ``K``.
    t : tensor of shape (n_active,)
        Current ``t`` on the active set (all entries of ``t`` outside it are 0).
    z : tensor of shape (n, M)
        Rademacher vectors (full length: ``a = K z`` needs all of ``z`` to stay unbiased).
    loss : {"frobenius", "trace"}
    active : tensor of indices or None
        Active set (``None`` = all); by Lemma 3.3 the solves live on it.
    direct : bool
        Solve with a dense Cholesky factor of the active block of ``L_t`` instead of CG
        (``O(n_active^3)``; cheaper than CG once the active set is small).
    warm : dict or None
        Previous solutions used as CG starting points; updated in place.
    factor : tensor of shape (n, r) or None
        Partial Cholesky factor of ``K`` (all ``n`` rows): CG is then preconditioned by
        :func:`low_rank_preconditioner` instead of the diagonal of ``L_t``.
    stats : dict or None
        When given, ``stats["cg_iter"]`` is increased by the CG iterations of the solves.

    Returns
    -------
    grad : tensor of shape (n_active,)
        ``2 mean(phi or psi) + lam`` on the active set.
    loss_estimate : float
        Unbiased estimate of ``-tr(K T L^-1 T K)`` (trace) or ``||K - K~(t)||_F^2``
        (Frobenius), without the penalty.
    per_sample : tensor of shape (n_active, M)
        The individual ``phi`` (trace) or ``psi`` (Frobenius) vectors.
    n_matvec : int
        Products with ``L_t`` used by the solves.

    Notes
    -----
    Per vector: trace ``1 + l + 1`` products with (blocks of) ``K``, Frobenius about
    ``2 l + 4`` with ``l`` CG iterations; all ``M`` vectors are solved as one batch.
    """
    warm = {} if warm is None else warm
    tc = t[:, None]
    solver = _Solver(gram, active, t, delta, tol=cg_tol, max_iter=cg_max_iter,
                     direct=direct, factor=factor)
    stats = {} if stats is None else stats
    if loss == "trace":
        a = gram.rows_matmul(active, z)  # (K z)_+
        b = solver.solve(tc * a, warm.get("b"))
        Ztb = solver.sub_matmul(tc * b) - delta * tc * b
        phi = b * Ztb - a * b
        warm["b"] = b
        stats["cg_iter"] = stats.get("cg_iter", 0) + solver.n_cg_iter
        est = -float((tc * a * b).sum(0).mean())
        return 2 * phi.mean(1) + lam, est, phi, solver.n_matvec
    if loss != "frobenius":
        raise ValueError(f"loss must be 'frobenius' or 'trace', got {loss!r}")
    a_full = gram.rows_matmul(None, z)  # K z
    a = a_full if active is None else a_full[active]
    b = solver.solve(tc * a, warm.get("b"))
    Ktb = gram.cols_matmul(active, tc * b)  # K (t . b), full length
    c = Ktb - a_full  # = D z
    d = gram.rows_matmul(active, c)  # (K D z)_+
    e = solver.solve(tc * d, warm.get("e"))
    Ktb_p = Ktb if active is None else Ktb[active]
    Ztb = Ktb_p - delta * tc * b
    Zte = solver.sub_matmul(tc * e) - delta * tc * e
    psi = b * d + a * e - e * Ztb - b * Zte
    warm["b"], warm["e"] = b, e
    stats["cg_iter"] = stats.get("cg_iter", 0) + solver.n_cg_iter
    est = float((c * c).sum(0).mean())
    return 2 * psi.mean(1) + lam, est, psi, solver.n_matvec


def rademacher(n: int, M: int, generator: torch.Generator, dtype=torch.float64):
    """``M`` Rademacher vectors (i.i.d. +-1 with probability 1/2) of length ``n``."""
    bits = torch.randint(0, 2, (n, M), generator=generator)
    return (2 * bits - 1).to(dtype)

