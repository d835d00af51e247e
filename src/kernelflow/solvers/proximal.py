"""Accelerated proximal gradient for l1-, l-infinity- and l2-penalised kernel regression.

Objective (Allerbo, Eq. 5b with the penalty swapped; Eq. 12-13 of the journal version):

    alpha_hat = argmin_alpha 1/2 ||y - K alpha||^2_{K^-1} + lambda P(alpha)
              = argmin_alpha 1/2 alpha^T K alpha - y^T alpha + lambda P(alpha),

with P = ||.||_1 (Kl1R, sparse), ||.||_inf (Klinf R, robust) or 1/2 ||.||_2^2 (ridge: the solution
is (K + lambda I)^-1 y). The smooth part has gradient K alpha - y and Lipschitz constant s_max(K).

**lambda convention.** ``lam`` here is the paper's lambda in the objective above; one step uses the
prox threshold eta * lambda. The reference implementation of the paper thresholds with its lambda
directly, so its lambda equals eta * lambda here (with its eta = 0.01, ``lam = 100 lambda_code``).

FISTA with gradient-based adaptive restart (O'Donoghue & Candes 2015) is run until the KKT
residual, the norm of the gradient mapping G(alpha) = (alpha - prox(alpha - eta grad)) / eta, is at
most ``tol * max|y|`` (G = 0 exactly at the solution), not for a fixed number of iterations. One
product with K per iteration: K z at the extrapolated point is a combination of the last two
products.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..utils._warnings import SolverConvergenceWarning, warn_caller
from .paths import DivergenceError, _check_eta, largest_eigenvalue
from .paths._operator import batch_matmul, dense_matrix, fits, path_operator
from .prox import PENALTIES, prox

__all__ = ["ProximalResult", "fista", "polish_solution", "proximal_gradient", "proximal_path"]

logger = logging.getLogger(__name__)


@dataclass
class ProximalResult:
    """Outcome of :func:`proximal_gradient` (batch results from :func:`fista` are tensors).

    Attributes
    ----------
    alpha : tensor of shape (n,) or (n, t)
    residual : tensor like ``alpha``
        y - K alpha.
    n_iter : int
        Iterations of the slowest target.
    converged : bool
        Whether every target met the KKT tolerance.
    kkt_residual : float
        Largest max-norm of the gradient mapping, relative to max|y|.
    learning_rate : float
    """

    alpha: torch.Tensor
    residual: torch.Tensor
    n_iter: int
    converged: bool
    kkt_residual: float
    learning_rate: float


@dataclass
class _FistaBatch:
    """The problems of a :func:`fista` batch still running: their rows in the batch, iterates
    (X, K X), extrapolated points (Z, K Z), momentum t, settings and stall marks."""

    rows: torch.Tensor  # (b,) indices in the batch
    X: torch.Tensor  # (b, n)
    KX: torch.Tensor  # (b, n)
    Z: torch.Tensor  # (b, n)
    KZ: torch.Tensor  # (b, n)
    t: torch.Tensor  # (b, 1)
    lam: torch.Tensor  # (b, 1)
    eta: torch.Tensor  # (b, 1)
    scale: torch.Tensor  # (b,) max|y_b|
    Y: torch.Tensor  # (b, n)
    limit: torch.Tensor  # (b,) residual norm taken as divergence
    mark: torch.Tensor  # (b,) KKT level to halve
    mark_it: torch.Tensor  # (b,) iteration it was set

    def keep(self, keep: torch.Tensor) -> None:
        """Keep only the problems where ``keep`` is True."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name)[keep])

    def kkt(self, penalty: str, X: torch.Tensor, KX: torch.Tensor) -> torch.Tensor:
        """max |G(x_b)| / max|y_b|, G the gradient mapping at X (with its product KX)."""
        G = (X - prox(penalty, X - self.eta * (KX - self.Y), self.eta * self.lam)) / self.eta
        return G.abs().amax(dim=-1) / self.scale


def _finished(b: _FistaBatch, penalty: str, tol: float, stall_iter: int | None, it: int,
              max_iter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(done, KKT residual) of every running problem: converged, stalled (the residual has not
    halved in ``stall_iter`` iterations) or out of iterations."""
    kkt = b.kkt(penalty, b.X, b.KX)
    done = kkt <= tol
    if stall_iter is not None:
        better = kkt <= 0.5 * b.mark
        b.mark = torch.where(better, kkt, b.mark)
        b.mark_it = torch.where(better, torch.full_like(b.mark_it, it), b.mark_it)
        done = done | (it - b.mark_it > stall_iter)
    if it >= max_iter:
        done = torch.ones_like(done)
    return done, kkt


def _polished(b: _FistaBatch, polish, matvec, penalty: str, tol: float) -> bool:
    """Replace the iterates by the polished candidates that meet the KKT tolerance; whether
    any did."""
    P = polish(b.X, b.rows)
    if P is None:
        return False
    KP = matvec(P, b.rows)
    good = (b.kkt(penalty, P, KP) <= tol) & torch.isfinite(P).all(dim=-1)
    if not bool(good.any()):
        return False
    b.X = torch.where(good[:, None], P, b.X)
    b.KX = torch.where(good[:, None], KP, b.KX)
    return True


def _advance(b: _FistaBatch, matvec, penalty: str, it: int, accelerated: bool,
             restart: bool) -> None:
    """One proximal step from the extrapolated point (one product with K), then the momentum
    (reset where the step goes against the last one, when ``restart``)."""
    Xn = prox(penalty, b.Z - b.eta * (b.KZ - b.Y), b.eta * b.lam)
    KXn = matvec(Xn, b.rows)
    rn = torch.linalg.vector_norm(b.Y - KXn, dim=-1)
    if not bool(torch.isfinite(rn).all()) or bool((rn > b.limit).any()):
        raise DivergenceError(
            f"proximal gradient diverged at iteration {it}: the residual norm reached "
            f"{float(rn.max()):.4g}; the step must satisfy learning_rate <= 1 / s_max(K)."
        )
    if accelerated:
        tn = 0.5 * (1.0 + torch.sqrt(1.0 + 4.0 * b.t * b.t))
        beta = (b.t - 1.0) / tn
        if restart:
            bad = ((b.Z - Xn) * (Xn - b.X)).sum(dim=-1, keepdim=True) > 0
            beta = torch.where(bad, torch.zeros_like(beta), beta)
            tn = torch.where(bad, torch.ones_like(tn), tn)
        b.Z = Xn + beta * (Xn - b.X)
        b.KZ = KXn + beta * (KXn - b.KX)
        b.t = tn
    else:
        b.Z, b.KZ = Xn, KXn
    b.X, b.KX = Xn, KXn


def fista(matvec: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], Y: torch.Tensor, lam,
          penalty: str, eta, *, X0: torch.Tensor | None = None, max_iter: int = 10000,
          tol: float = 1e-6, accelerated: bool = True, restart: bool = True,
          polish: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None,
          polish_every: int = 25, stall_iter: int | None = 2000):
    """Batched FISTA with restart on B independent problems (batch layout (B, n)).

    Parameters
    ----------
    matvec : callable
        ``matvec(A, rows)`` returns K_b a_b for every row b of A (shape (len(rows), n)), where
        ``rows`` holds the indices of those problems in the batch (converged problems drop out).
    Y : tensor of shape (B, n)
    lam, eta : float or tensor of shape (B,) or (B, 1)
        Penalty strength (paper units) and step (eta <= 1 / s_max(K_b) for convergence).
    penalty : {"l1", "linf", "l2"}
    X0 : tensor of shape (B, n), optional
        Warm start (default 0).
    max_iter, tol, accelerated, restart
        Iteration cap; KKT tolerance relative to max|y_b|; FISTA momentum; adaptive restart.
    polish : callable, optional
        ``polish(X, rows)`` returns candidate solutions (same shape as X) computed exactly on the
        active structure of the iterates (see :func:`polish_solution`); every ``polish_every``
        iterations a candidate that meets the KKT tolerance ends that problem. Proximal steps
        identify the support (l1) or the capped set (l-infinity) long before the iterates
        converge on ill-conditioned kernels, so this turns a slow tail into one linear solve.
    stall_iter : int or None, default=2000
        Give up on a problem (not converged) when its KKT residual has not halved in this many
        iterations. This happens when K is numerically singular and lambda small: the minimiser
        then has |alpha| of order 1 / s_min(K) (or does not exist for singular K), out of reach.

    Returns
    -------
    X : tensor (B, n)
    KX : tensor (B, n)
        K_b x_b, so that the residual is ``Y - KX``.
    n_iter : tensor (B,) of int
    converged : tensor (B,) of bool
    kkt : tensor (B,)
        max |G(x_b)| / max|y_b| at exit.

    Raises
    ------
    DivergenceError
        If the iterates become non-finite or the residual grows by 1e8 (step too large).

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(3, dtype=torch.float64)
    >>> Y = torch.tensor([[3.0, -1.0, 0.5]], dtype=torch.float64)
    >>> X, KX, it, ok, kkt = fista(lambda A, rows: A @ K, Y, 1.0, "l1", 1.0)
    >>> X.tolist(), bool(ok[0])
    ([[2.0, -0.0, 0.0]], True)
    """
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}.")
    B, n = Y.shape
    dt, dev = Y.dtype, Y.device

    def col(v):
        t = torch.as_tensor(v, dtype=dt, device=dev)
        return t.reshape(-1, 1).expand(B, 1) if t.numel() in (1, B) else t.reshape(B, 1)

    lam_all, eta_all = col(lam), col(eta)
    if bool((lam_all < 0).any()) or bool((eta_all <= 0).any()):
        raise ValueError("lam must be >= 0 and eta > 0.")
    scale_all = Y.abs().amax(dim=-1).clamp_min(torch.finfo(dt).tiny)
    X_out = torch.zeros_like(Y) if X0 is None else X0.to(dt).clone()
    KX_out = matvec(X_out, torch.arange(B, device=dev)) if X0 is not None else torch.zeros_like(Y)
    n_iter = torch.zeros(B, dtype=torch.long)
    converged = torch.zeros(B, dtype=torch.bool)
    kkt_out = torch.full((B,), math.inf, dtype=torch.float64)
    r0 = torch.linalg.vector_norm(Y - KX_out, dim=-1)
    limit_all = 1e8 * (r0 + torch.linalg.vector_norm(Y, dim=-1)) + 1e-12

    X, KX = X_out.clone(), KX_out.clone()
    b = _FistaBatch(rows=torch.arange(B, device=dev), X=X, KX=KX, Z=X, KZ=KX,
                    t=torch.ones(B, 1, dtype=dt, device=dev), lam=lam_all, eta=eta_all,
                    scale=scale_all, Y=Y, limit=limit_all,
                    mark=torch.full((B,), math.inf, dtype=dt, device=dev),
                    mark_it=torch.zeros(B, dtype=torch.long, device=dev))
    it = 0
    polished_at = 0
    while True:
        # KKT residual (gradient mapping) at the current iterate: no extra product, one prox;
        # checked every few iterations since the prox costs as much as the step itself.
        if it % 5 == 0 or it >= max_iter:
            done, kkt = _finished(b, penalty, tol, stall_iter, it, max_iter)
            if bool(done.any()):
                idx = b.rows[done]
                X_out[idx], KX_out[idx] = b.X[done], b.KX[done]
                kkt_out[idx.cpu()] = kkt[done].to(torch.float64).cpu()
                converged[idx.cpu()] = (kkt[done] <= tol).cpu()
                n_iter[idx.cpu()] = it
                keep = ~done
                if not bool(keep.any()):
                    break
                b.keep(keep)
        if polish is not None and it > polished_at and it % polish_every == 0:
            polished_at = it
            if _polished(b, polish, matvec, penalty, tol):
                continue  # the KKT check at the top of the loop retires them
        it += 1
        _advance(b, matvec, penalty, it, accelerated, restart)
    return X_out, KX_out, n_iter, converged, kkt_out


def polish_solution(penalty: str, K: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor,
                    lam: float) -> torch.Tensor:
    """Exact minimiser on the active structure of ``alpha`` (one linear solve).

    * l1: support S = {alpha_i != 0}, signs s: alpha_S = K_SS^-1 (y_S - lam s), 0 elsewhere;
    * l-infinity: capped set M = {|alpha_i| = max|alpha|} (exact ties, as the prox produces
      them), signs s, free set N: solve [[K_NN, K_NM s], [s^T K_MN, s^T K_MM s]] [alpha_N; m] =
      [y_N; s^T y_M - lam] (r_N = 0 and sum_M s_i r_i = lam) and set alpha_M = m s;
    * l2: (K + lam I)^-1 y.

    The result is the solution if the structure was right; the caller checks the KKT conditions.
    ``K`` dense (n, n); ``y``, ``alpha`` of shape (n,). Cost O(|S|^3).

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> y = torch.tensor([2.0, 0.1], dtype=torch.float64)
    >>> polish_solution("l1", K, y, torch.tensor([1.0, 0.0], dtype=torch.float64), 0.5).tolist()
    [1.5, 0.0]
    """
    dt = K.dtype
    y = y.to(dt)
    if penalty == "l2":
        return torch.linalg.solve(K + lam * torch.eye(K.shape[0], dtype=dt, device=K.device), y)
    out = torch.zeros_like(y)
    if penalty == "l1":
        S = alpha != 0
        if not bool(S.any()):
            return out
        out[S] = torch.linalg.solve(K[S][:, S], y[S] - lam * torch.sign(alpha[S]).to(dt))
        return out
    if penalty != "linf":
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}.")
    a = alpha.abs()
    top = a.max()
    if float(top) == 0.0:
        return out
    M = a == top
    N = ~M
    s = torch.sign(alpha[M]).to(dt)
    KNM_s = K[N][:, M] @ s
    nN = int(N.sum())
    A = torch.empty(nN + 1, nN + 1, dtype=dt, device=K.device)
    A[:-1, :-1] = K[N][:, N]
    A[:-1, -1] = KNM_s
    A[-1, :-1] = KNM_s
    A[-1, -1] = s @ K[M][:, M] @ s
    b = torch.cat([y[N], (s @ y[M] - lam).reshape(1)])
    z = torch.linalg.solve(A, b)
    out[N] = z[:-1]
    out[M] = z[-1] * s
    return out


def _dense_polisher(penalty, Km, Y, lam):
    if dense_matrix(Km) is None and not (Km.shape[0] <= 4000 and fits(Km)):
        return None
    K = Km.to_dense()

    def polish(X, rows):
        out = torch.empty_like(X)
        for j, b in enumerate(rows.tolist()):
            try:
                out[j] = polish_solution(penalty, K, Y[b], X[j], lam)
            except RuntimeError:  # singular active system: keep iterating instead
                out[j] = math.nan
        return out

    return polish


def _resolve_eta(K, learning_rate) -> float:
    if learning_rate == "auto":
        s = largest_eigenvalue(K)
        return 1.0 / s if s > 0 else 1.0
    return _check_eta(learning_rate)


def proximal_gradient(K, y: torch.Tensor, lam, *, penalty: str = "linf", learning_rate="auto",
                      max_iter: int = 10000, tol: float = 1e-6, accelerated: bool = True,
                      restart: bool = True, alpha0: torch.Tensor | None = None,
                      polish: bool = True, warn: bool = True) -> ProximalResult:
    """Solve argmin_alpha 1/2 alpha^T K alpha - y^T alpha + lam P(alpha) by FISTA with restart.

    Parameters
    ----------
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    lam : float
        Penalty strength lambda >= 0 in the paper's units (see the module docstring).
    penalty : {"l1", "linf", "l2"}, default="linf"
    learning_rate : float or "auto", default="auto"
        "auto" is 1 / s_max(K) (exact eigenvalue for n <= 2000, else a 5%-inflated power
        iteration estimate); the reference code's 0.01 may diverge for larger n.
    max_iter : int, default=10000
    tol : float, default=1e-6
        KKT tolerance: max |G(alpha)| <= tol max|y|.
    accelerated, restart : bool, default=True
        FISTA momentum and adaptive restart; ``accelerated=False`` is plain ISTA as in the paper.
    alpha0 : tensor like y, optional
        Warm start.
    polish : bool, default=True
        Every 25 iterations try the exact solution on the current active structure
        (:func:`polish_solution`, dense K of at most 4000 rows); accepted only if it meets the
        KKT tolerance.
    warn : bool, default=True
        Issue a ``SolverConvergenceWarning`` (a ``UserWarning``) when the tolerance is not met.

    Returns
    -------
    ProximalResult

    Notes
    -----
    Cost per iteration: one product with K (O(n^2), matrix-free through ``KernelOperator``) and
    one prox (O(n) or O(n log n) for l-infinity). KKT conditions at the solution, r = y - K alpha:
    l1: r_i = lam sign(alpha_i) on the support, |r_i| <= lam elsewhere; l-infinity: r_i = 0 where
    |alpha_i| < ||alpha||_inf and ||r||_1 = lam (if alpha != 0); alpha = 0 iff lam >= ||y||_inf (l1)
    or ||y||_1 (l-infinity).

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(3, dtype=torch.float64)
    >>> res = proximal_gradient(K, torch.tensor([3.0, -1.0, 0.5], dtype=torch.float64), 2.0,
    ...                         penalty="linf")
    >>> res.alpha.numpy().round(4), res.converged  # K = I: clip(y) at c with sum (|y|-c)+ = 2
    (array([ 1. , -1. ,  0.5]), True)
    """
    Km = path_operator(K)
    n = Km.shape[0]
    if y.ndim not in (1, 2) or y.shape[0] != n:
        raise ValueError(f"y must have shape ({n},) or ({n}, t), found {tuple(y.shape)}.")
    if not torch.isfinite(y).all():
        raise ValueError("y contains NaN or infinity.")
    lam = float(lam)
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"lam must be a non-negative finite number, got {lam}.")
    eta = _resolve_eta(K, learning_rate)
    Y = y.reshape(n, -1).T.to(Km.dtype).contiguous()
    X0 = None if alpha0 is None else alpha0.reshape(n, -1).T.to(Km.dtype).contiguous()
    X, KX, it, ok, kkt = fista(lambda A, rows: batch_matmul(Km, A), Y, lam, penalty, eta, X0=X0,
                               max_iter=max_iter, tol=tol, accelerated=accelerated,
                               restart=restart,
                               polish=_dense_polisher(penalty, Km, Y, lam) if polish else None)
    converged = bool(ok.all())
    if warn and not converged:
        warn_caller(
            f"proximal gradient did not reach the KKT tolerance {tol:g} in {max_iter} iterations "
            f"(KKT residual {float(kkt.max()):.3g}); increase max_iter or tol.",
            SolverConvergenceWarning
        )

    def out(A):
        return A.T.reshape(n, *y.shape[1:]) if y.ndim == 2 else A[0]

    return ProximalResult(alpha=out(X), residual=out(Y - KX), n_iter=int(it.max()),
                          converged=converged, kkt_residual=float(kkt.max()), learning_rate=eta)


def proximal_path(K, y: torch.Tensor, lams, *, penalty: str = "linf", learning_rate="auto",
                  max_iter: int = 10000, tol: float = 1e-6, accelerated: bool = True,
                  restart: bool = True, polish: bool = True, warn: bool = True):
    """Solutions for a sequence of penalties, largest first, each warm-started from the last.

    Penalties at or above :func:`~kernelflow.solvers.prox.lambda_max` give alpha = 0 at no cost.

    Parameters
    ----------
    K, y, penalty, learning_rate, max_iter, tol, accelerated, restart, polish, warn
        As in :func:`proximal_gradient`.
    lams : sequence of float
        Penalty strengths (any order).

    Returns
    -------
    alphas : tensor of shape (len(lams), n) or (len(lams), n, t)
        Solutions in the order of ``lams``.
    n_iter : list of int
        Iterations per penalty.

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(2, dtype=torch.float64)
    >>> A, its = proximal_path(K, torch.tensor([2.0, -1.0], dtype=torch.float64), [5.0, 0.5],
    ...                        penalty="l1")
    >>> A.numpy().round(3), its[0]
    (array([[ 0. ,  0. ],
           [ 1.5, -0.5]]), 0)
    """
    lams = [float(v) for v in lams]
    eta = _resolve_eta(K, learning_rate)
    order = sorted(range(len(lams)), key=lambda i: -lams[i])
    out: list = [None] * len(lams)
    its = [0] * len(lams)
    warm = None
    for i in order:
        res = proximal_gradient(K, y, lams[i], penalty=penalty, learning_rate=eta,
                                max_iter=max_iter, tol=tol, accelerated=accelerated,
                                restart=restart, alpha0=warm, polish=polish, warn=warn)
        out[i], its[i], warm = res.alpha, res.n_iter, res.alpha
    if not lams:
        return torch.empty(0, *y.shape, dtype=y.dtype), its
    return torch.stack(out), its
