"""Dense and iterative linear algebra shared by all solvers.

Everything here works on torch tensors (any device, float32/float64) and never on estimators.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.linalg import lapack

from .utils._finite import DivergenceError, NotPositiveDefiniteError

__all__ = [
    "NearSingularKernelWarning",
    "cholesky",
    "cho_solve",
    "SolveResult",
    "StopSolver",
    "conjugate_gradient",
    "symmetric_eigh",
    "power_iteration",
    "BandedForm",
    "band_reduce",
]

logger = logging.getLogger(__name__)


class NearSingularKernelWarning(UserWarning):
    """The kernel matrix is (numerically) singular; jitter was added to factorise it."""


def _default_jitter(A: torch.Tensor) -> float:
    scale = float(A.diagonal().abs().mean()) if A.shape[0] else 1.0
    eps = torch.finfo(A.dtype).eps
    return max(scale, 1e-300) * eps * 10


def cholesky(A: torch.Tensor, *, jitter: float | None = None, max_tries: int = 8,
             warn: bool = True, overwrite: bool = False) -> tuple[torch.Tensor, float]:
    """Lower Cholesky factor of a symmetric positive (semi-)definite matrix, with jitter escalation.

    Tries ``A`` itself, then ``A + j I`` for j = jitter, 10 jitter, ... (``max_tries`` times). A
    :class:`NearSingularKernelWarning` is issued when jitter was needed. Only the lower triangle
    of ``A`` is read. With ``overwrite=True`` the jitter is added to ``A``'s diagonal in place
    (saving one n x n copy). Cost O(n^3 / 3).

    Returns
    -------
    L : tensor of shape (n, n)
    jitter_used : float (0.0 when none was needed)

    Examples
    --------
    >>> import torch
    >>> L, j = cholesky(torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64))
    >>> L.numpy().round(3), j
    (array([[2.   , 0.   ],
           [1.   , 1.414]]), 0.0)
    """
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"cholesky needs a square matrix, got shape {tuple(A.shape)}.")
    if not torch.isfinite(A).all():
        raise ValueError("cholesky: the matrix contains NaN or inf.")
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) == 0:
        return L, 0.0
    del L
    j = _default_jitter(A) if jitter is None else float(jitter)
    work = A if overwrite else A.clone()
    added = 0.0
    for _ in range(max_tries):
        work.diagonal().add_(j - added)
        added = j
        L, info = torch.linalg.cholesky_ex(work)
        if int(info) == 0:
            if warn:
                warnings.warn(
                    f"The matrix is numerically singular (e.g. duplicate rows); added jitter "
                    f"{j:.3g} to its diagonal.",
                    NearSingularKernelWarning,
                    stacklevel=2,
                )
            return L, j
        j *= 10.0
    raise NotPositiveDefiniteError(
        f"cholesky failed even with jitter {j / 10:.3g}: the matrix is not positive definite."
    )


def cho_solve(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Solve (L L^T) X = B given the lower Cholesky factor L. Cost O(n^2 t)."""
    squeeze = B.ndim == 1
    X = torch.cholesky_solve(B.reshape(B.shape[0], -1), L)
    return X[:, 0] if squeeze else X


@dataclass
class SolveResult:
    """Result of an iterative solve."""

    x: torch.Tensor
    n_iter: int
    residual_norms: list = field(default_factory=list)
    converged: bool = False
    #: conjugate gradients stopped on a direction of non-positive curvature (see
    #: :func:`conjugate_gradient`)
    breakdown: bool = False


class StopSolver(Exception):  # noqa: N818
    """Raised by a callback to stop an iterative solver early."""


def conjugate_gradient(
    matvec: Callable[[torch.Tensor], torch.Tensor],
    B: torch.Tensor,  # shape: (n,) or (n, t)
    *,
    x0: torch.Tensor | None = None,
    max_iter: int | None = None,
    tol: float | None = None,
    preconditioner: Callable[[torch.Tensor], torch.Tensor] | None = None,
    callback: Callable[[int, torch.Tensor, torch.Tensor], object] | None = None,
    state: dict | None = None,
) -> SolveResult:
    """(Preconditioned) conjugate gradients for A X = B with A symmetric positive definite.

    Each column is an independent system and converges on its own (its step sizes are zeroed once
    ``||r_j|| <= tol * ||b_j||``). ``preconditioner(R)`` applies M^{-1} ~ A^{-1}. ``callback(k, X,
    R)`` is called after each iteration; returning ``True`` (or raising ``StopSolver``) stops.
    A direction p of a column not yet converged with p^T A p <= 0 is a breakdown: A (as the
    products compute it) or the preconditioner is not positive definite to that precision. The
    run stops before that step, with ``breakdown=True`` in the result (a zero step there would
    leave X unchanged for every later iteration).
    ``state``, a dict, is kept up to date before each callback with the iteration ``k``, ``X``,
    ``R``, the last direction ``P``, ``rz`` and the residual ``norms`` (references, not copies);
    a ``state`` given holding these continues the run from them with the steps an uninterrupted
    run would take (how a checkpoint resumes CG).

    Cost per iteration: one ``matvec`` plus O(n t).

    Examples
    --------
    >>> import torch
    >>> A = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    >>> res = conjugate_gradient(lambda v: A @ v, torch.tensor([1.0, 2.0], dtype=torch.float64))
    >>> res.x.numpy().round(4), res.converged
    (array([0.0909, 0.6364]), True)
    """
    squeeze = B.ndim == 1
    B = B.reshape(B.shape[0], -1)
    n, t = B.shape
    if tol is None:
        tol = 1e-7 if B.dtype == torch.float32 else 1e-12
    if max_iter is None:
        max_iter = n
    b_norm = torch.linalg.vector_norm(B, dim=0).clamp_min(torch.finfo(B.dtype).tiny)
    pending = False  # resumed: the direction update comes first
    breakdown = False
    if state is not None and "X" in state:
        pending = True
        X, R, P, rz = (state[key].clone() for key in ("X", "R", "P", "rz"))
        k, norms = int(state["k"]), list(state["norms"])
        converged = False
    else:
        X = torch.zeros_like(B) if x0 is None else x0.reshape(n, t).clone()
        R = B - matvec(X) if x0 is not None else B.clone()
        Z = preconditioner(R) if preconditioner is not None else R
        P = Z.clone()
        rz = (R * Z).sum(0)
        norms = [float((torch.linalg.vector_norm(R, dim=0) / b_norm).max())]
        converged = norms[0] <= tol
        k = 0
    while not converged and k < max_iter:
        if pending:
            Z = preconditioner(R) if preconditioner is not None else R
            rz_new = (R * Z).sum(0)
            beta = torch.where(rz > 0, rz_new / torch.where(rz > 0, rz, 1.0), 0.0)
            P = Z + P * beta
            rz = rz_new
        pending = True
        AP = matvec(P)
        pap = (P * AP).sum(0)
        active = torch.linalg.vector_norm(R, dim=0) > tol * b_norm
        if bool((active & ~(pap > 0)).any()):  # NaN curvature counts as none
            breakdown = True
            break
        step = torch.where(active, rz / torch.where(pap > 0, pap, 1.0), 0.0)
        X += P * step
        R -= AP * step
        k += 1
        rel = torch.linalg.vector_norm(R, dim=0) / b_norm
        norms.append(float(rel.max()))
        if not math.isfinite(norms[-1]):
            raise DivergenceError("conjugate_gradient diverged (non-finite residual).")
        converged = bool((rel <= tol).all())
        if state is not None:
            state.update(k=k, X=X, R=R, P=P, rz=rz, norms=norms)
        if callback is not None:
            try:
                if callback(k, X, R):
                    break
            except StopSolver:
                break
        if converged:
            break
    x = X[:, 0] if squeeze else X
    return SolveResult(x=x, n_iter=k, residual_norms=norms, converged=converged,
                       breakdown=breakdown)


def symmetric_eigh(K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigendecomposition K = U diag(s) U^T of a symmetric PSD matrix, s ascending, clipped at 0.

    Cost O(n^3). Only the lower triangle is read. Negative eigenvalues from rounding are set to
    0 (K is PSD in exact arithmetic).

    Examples
    --------
    >>> import torch
    >>> s, U = symmetric_eigh(torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64))
    >>> s.numpy().round(6)
    array([1., 3.])
    """
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"symmetric_eigh needs a square matrix, got shape {tuple(K.shape)}.")
    if not torch.isfinite(K).all():
        raise ValueError("symmetric_eigh: the matrix contains NaN or inf.")
    try:
        s, U = torch.linalg.eigh(K)
    except torch.linalg.LinAlgError as exc:
        raise NotPositiveDefiniteError(
            f"symmetric_eigh: the eigensolver failed on the kernel matrix ({exc}); check the "
            "scale of X and the bandwidth."
        ) from None
    return s.clamp_min(0.0), U


def power_iteration(matvec: Callable[[torch.Tensor], torch.Tensor], n: int, *,
                    dtype=torch.float64, device=None, n_iter: int = 50, tol: float = 1e-6,
                    seed: int = 0) -> float:
    """Estimate of the largest eigenvalue of a symmetric PSD operator by power iteration.

    Returns an estimate from below; multiply by a safety factor (e.g. 1.05) for step sizes.
    Cost ``n_iter`` products.

    Examples
    --------
    >>> import torch
    >>> A = torch.diag(torch.tensor([1.0, 5.0, 2.0], dtype=torch.float64))
    >>> round(power_iteration(lambda v: A @ v, 3), 4)
    5.0
    """
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g, dtype=dtype).to(device)
    v /= torch.linalg.vector_norm(v)
    lam = 0.0
    for _ in range(n_iter):
        w = matvec(v)
        new = float(torch.dot(v, w))
        nrm = float(torch.linalg.vector_norm(w))
        if nrm == 0.0:
            return 0.0
        v = w / nrm
        if abs(new - lam) <= tol * max(abs(new), 1e-300):
            lam = new
            break
        lam = new
    return lam


@dataclass
class BandedForm:
    """Orthogonal similarity A = Q B Q^T with B symmetric banded (see :func:`band_reduce`).

    Attributes
    ----------
    band : ndarray of shape (bandwidth + 1, n)
        Lower banded storage of B: ``band[i, j] = B[j + i, j]`` (LAPACK's ``pbsv`` layout).
    reflectors : list of (start, V, T)
        Block reflectors ``Q_j = I - V T V^T`` acting on rows ``start:``; Q = Q_1 Q_2 ... Q_p.
    """

    band: Any
    reflectors: list
    eps: float = float(torch.finfo(torch.float64).eps)  # unit roundoff of the reduction

    @property
    def n(self) -> int:
        return self.band.shape[1]

    def apply_qt(self, Y: torch.Tensor) -> torch.Tensor:
        """Q^T Y for Y of shape (n, t). Cost O(n^2 t)."""
        Y = Y.clone()
        for start, V, T in self.reflectors:
            Y[start:] -= V @ (T.T @ (V.T @ Y[start:]))
        return Y

    def apply_q(self, Z: torch.Tensor) -> torch.Tensor:
        """Q Z for Z of shape (n, t) (or (n, m, t) flattened by the caller). Cost O(n^2 t)."""
        Z = Z.clone()
        for start, V, T in reversed(self.reflectors):
            Z[start:] -= V @ (T @ (V.T @ Z[start:]))
        return Z

    def solve_shifted(self, Y: torch.Tensor, shifts, *, warn: bool = True) -> torch.Tensor:
        """(A + s I)^{-1} Y for every shift s, shape (len(shifts), n, t).

        One banded Cholesky per shift (O(n b^2)) between one application of Q^T and one of Q.
        A shift that leaves B + s I numerically indefinite gets jitter as in :func:`cholesky`
        (10 eps mean(diag B), growing tenfold, eps that of the reduction's dtype).
        """
        C = np.asfortranarray(self.apply_qt(Y).cpu().numpy().astype(np.float64))
        n, t = C.shape
        shifts = [float(s) for s in shifts]
        Z = np.empty((n, len(shifts) * t))
        scale = max(float(np.abs(self.band[0]).mean()), 1e-300) if n else 1.0
        base = np.asfortranarray(self.band, dtype=np.float64)

        def solve(shift):
            added = 0.0
            for attempt in range(9):
                ab = base.copy(order="F")
                ab[0] += shift + added
                _, x, info = lapack.dpbsv(ab, C, lower=1, overwrite_ab=1, overwrite_b=0)
                if info == 0:
                    return x, added
                if info < 0:  # pragma: no cover - argument error, a bug
                    raise ValueError(f"dpbsv: illegal value in argument {-info}.")
                added = scale * self.eps * 10 * 10.0**attempt
            raise NotPositiveDefiniteError(
                f"shift {shift:.3g}: the shifted matrix is not positive definite."
            )

        for i, shift in enumerate(shifts):
            x, added = solve(shift)
            Z[:, i * t:(i + 1) * t] = x
            if added and warn:
                warnings.warn(
                    f"The matrix plus shift {shift:.3g} is numerically singular; added jitter "
                    f"{added:.3g} to its diagonal.",
                    NearSingularKernelWarning,
                    stacklevel=2,
                )
        out = self.apply_q(torch.from_numpy(Z).to(device=Y.device, dtype=Y.dtype))
        return out.reshape(n, len(shifts), t).permute(1, 0, 2)


def _symmetric_product(A: torch.Tensor, W: torch.Tensor, nb: int) -> torch.Tensor:
    """A @ W reading only the lower triangle of A (diagonal blocks of size nb are symmetrised)."""
    m = A.shape[0]
    X = torch.zeros(m, W.shape[1], dtype=A.dtype, device=A.device)
    for j0 in range(0, m, nb):
        j1 = min(j0 + nb, m)
        D = A[j0:j1, j0:j1].tril()
        D = D + D.tril(-1).T
        X[j0:j1] += D @ W[j0:j1]
        if j1 < m:
            L = A[j1:, j0:j1]
            X[j1:] += L @ W[j0:j1]
            X[j0:j1] += L.T @ W[j1:]
    return X


def band_reduce(A: torch.Tensor, bandwidth: int = 128, *, block: int = 512,
                overwrite: bool = False) -> BandedForm:
    """Reduce a symmetric matrix to banded form by orthogonal similarity, A = Q B Q^T.

    Block Householder reduction, panel by panel: the ``bandwidth`` columns of a panel are
    reduced below the band by one QR factorisation, and the trailing matrix receives the
    two-sided update ``(I - V T^T V^T) A22 (I - V T V^T)`` as one symmetric rank-2b update
    (``A22 - V Y^T - Y V^T``), computed on the lower triangle only in column blocks of
    ``block``. All flops are matrix-matrix products: about (4/3) n^3, four Cholesky
    factorisations, against about nine for a full eigendecomposition with vectors. This is the
    first stage of two-stage symmetric eigensolvers; since ``A + s I = Q (B + s I) Q^T`` for
    every shift s, one reduction serves any number of penalties, each then costing a banded
    solve of O(n b^2) (:meth:`BandedForm.solve_shifted`). Backward stable (orthogonal
    transformations only). Only the lower triangle of ``A`` is read; with ``overwrite=True``
    ``A`` is used as workspace.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(300, 3, dtype=torch.float64, generator=g)
    >>> A = torch.exp(-torch.cdist(X, X) ** 2)
    >>> y = torch.randn(300, 1, dtype=torch.float64, generator=g)
    >>> form = band_reduce(A, bandwidth=32)
    >>> Z = form.solve_shifted(y, [0.1, 1.0])
    >>> direct = torch.linalg.solve(A + 0.1 * torch.eye(300, dtype=A.dtype), y)
    >>> bool(torch.allclose(Z[0], direct, rtol=1e-9, atol=1e-9))
    True
    """
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"band_reduce needs a square matrix, got shape {tuple(A.shape)}.")
    if not torch.isfinite(A.sum()) and not torch.isfinite(A).all():  # cheap test first
        raise ValueError("band_reduce: the matrix contains NaN or inf.")
    if bandwidth < 1:
        raise ValueError(f"bandwidth must be >= 1, got {bandwidth}.")
    n = A.shape[0]
    A = A if overwrite else A.clone()
    b = max(1, min(bandwidth, n - 1))
    reflectors = []
    # The trailing matrix of a fast-decaying kernel spectrum fills with values below the
    # normal range; subnormal arithmetic is ~100x slower on CPUs.
    flushed = torch.set_flush_denormal(True)
    try:
        for k in range(0, max(n - b - 1, 0), b):
            start = k + b
            panel = A[start:, k:k + b]
            a, tau = torch.geqrf(panel)
            r = min(b, panel.shape[0])
            V = a[:, :r].tril(-1)
            V.diagonal().fill_(1.0)
            R = a[:r, :].triu()
            tau = tau[:r]
            # Compact WY: Q = H_1 ... H_r = I - V T V^T, T^{-1} = diag(1/tau) + striu(V^T V);
            # a zero tau is an identity reflector (its column of V is zeroed).
            live = tau != 0
            V[:, ~live] = 0.0
            Tinv = torch.triu(V.T @ V, 1)
            Tinv.diagonal().copy_(torch.where(live, 1.0 / torch.where(live, tau, 1.0), 1.0))
            eye = torch.eye(r, dtype=A.dtype, device=A.device)
            T = torch.linalg.solve_triangular(Tinv, eye, upper=True)
            A22 = A[start:, start:]
            X = _symmetric_product(A22, V @ T, block)
            M = T.T @ (V.T @ X)
            Y = X - 0.5 * (V @ M)
            left = torch.cat([V, Y], 1)
            right = torch.cat([Y, V], 1)
            m = A22.shape[0]
            for j0 in range(0, m, block):
                j1 = min(j0 + block, m)
                A22[j0:, j0:j1].addmm_(left[j0:], right[j0:j1].T, alpha=-1.0)
            panel.zero_()
            panel[:r] = R
            reflectors.append((start, V, T))
    finally:
        if flushed:
            torch.set_flush_denormal(False)
    Ad = A.cpu().numpy()
    band = np.zeros((b + 1, n), dtype=Ad.dtype)
    for i in range(min(b, n - 1) + 1):
        band[i, :n - i] = np.diagonal(Ad, -i)
    return BandedForm(band=band, reflectors=reflectors, eps=float(torch.finfo(A.dtype).eps))
