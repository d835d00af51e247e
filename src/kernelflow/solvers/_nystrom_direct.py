"""The dense part of the direct Nyström solve (:func:`kernelflow.solvers.nystrom.nystrom_krr`,
``solver="direct"``): the eigenbasis of K_MM, the whitening F = U_r diag(s_r)^-1/2 over the
eigenvalues kept, the bound that decides whether the rows are whitened before their Gram product,
and the solve of the whitened system (3) of :func:`_direct_solve`.

Pure functions on M x M float64 tensors (O(M^3)); the passes over the rows stay in
:mod:`kernelflow.solvers.nystrom`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import Kernel
from ..linalg import symmetric_eigh
from ..operators import KernelOperator, Options

_F64 = torch.float64
#: The direct solve with float32 kernel values leaves out directions of K_MM whose eigenvalue s
#: is below ``_NOISE_FLOOR (eps d)^2 / lam`` (see :func:`_direct_solve`)
_NOISE_FLOOR = 1.0


def _spd_solve(S: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Solve S x = r for symmetric positive (semi-)definite S: Cholesky, else a clipped eigh."""
    S = (S + S.T) / 2
    L, info = torch.linalg.cholesky_ex(S)
    if int(info) == 0:
        return torch.cholesky_solve(r, L)
    w, U = torch.linalg.eigh(S)
    keep = w > w[-1] * torch.finfo(S.dtype).eps * S.shape[0]
    return U[:, keep] @ ((U[:, keep].T @ r) / w[keep].reshape(-1, 1))


@dataclass
class _Whitening:
    """F = U_r diag(s_r)^-1/2 over the kept eigenvalues s_r of K_MM (see :func:`_whitening`)."""

    F: torch.Tensor  # shape: (M, r)
    s_max: float
    s_min: float  # smallest kept eigenvalue
    mean_diag: float


def _kmm_eigh(kernel: Kernel, C: torch.Tensor, options: Options | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """K_MM = U diag(s) U^T in float64, s ascending and clipped at 0."""
    return symmetric_eigh(KernelOperator(kernel, C, C, options=options).to_dense().to(_F64))


def _whitening(s: torch.Tensor, U: torch.Tensor, lam: float,
               dtype: torch.dtype = _F64) -> _Whitening:
    """The whitening F of K_MM = U diag(s) U^T used by the direct solve (:func:`_direct_solve`)."""
    keep = s > s[-1] * torch.finfo(_F64).eps * s.shape[0]
    d = float(s.clamp_min(0).sum()) / s.shape[0]
    if dtype != _F64 and lam > 0:
        # a direction u of K_MM enters as the feature K_nM u / sqrt(s): the rounding of the
        # kernel values (eps d, d the mean diagonal) gives it a noise of mean square about
        # (eps d)^2 / s per row, which the penalty lam no longer damps when it is larger
        keep &= s > _NOISE_FLOOR * (torch.finfo(dtype).eps * d) ** 2 / lam
    if not bool(keep.any()):
        keep[-1] = True
    s_r = s[keep]
    return _Whitening(F=U[:, keep] / s_r.sqrt(), s_max=float(s[-1]), s_min=float(s_r[0]),
                      mean_diag=d)


def _squared_gram_error(w: _Whitening, lam: float) -> float:
    """Bound on the relative error that forming K_nM^T K_nM before whitening puts in (3).

    The Gram's rounding (eps ||G|| <= eps mean k(x, x) s_max, per unit weight) is amplified by
    ||F||^2 = 1 / s_min and compared with the smallest eigenvalue lam of (3).
    """
    return torch.finfo(_F64).eps * w.mean_diag * w.s_max / (w.s_min * lam)


def _direct_solve(S: torch.Tensor, rhs: torch.Tensor, F: torch.Tensor, lam: float
                  ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Solve (3) (F^T G F + lam I) beta = F^T b for S = F^T G F; returns (a = F beta, beta,
    relative residual of (3)).

    With K_MM = U diag(s) U^T and a = U_r diag(s_r)^-1/2 beta over the eigenvalues s_r above
    rounding (s > eps M s_max), the normal equations (1) on the range of K_MM become

        (F^T G F + lam I) beta = F^T b,   F = U_r diag(s_r)^-1/2,                              (3)

    whose eigenvalues lie in [lam, lam + mean k(x, x)] (the quadratic form of
    G is at most mean k(x, x) times that of K_MM). Directions of K_MM below rounding carry
    functions that are zero on the data to rounding and are left out, so a rank-deficient
    K_MM (duplicated or collinear centres, all points as centres of a low-rank kernel) costs no
    accuracy. With float32 kernel values (``dtype``) the rounding of K_nM's entries (about
    1e-7) enters every direction u of K_MM as a noise feature of mean square (eps d)^2 / s
    (d the mean diagonal); directions where it exceeds the penalty lam are left out
    (``_NOISE_FLOOR``). Kept, they are fitted to the targets: with 300 centres of a smooth
    kernel and lam = 3e-10, the test RMSE was 0.25 with them and 0.040 without (float64:
    0.035); at lam = 1e-6 and 1e-8 on 9-d data the test error is unchanged. Cost: one M x M
    eigendecomposition and O(M^3) products.

    F^T G F is formed from the Gram of the whitened rows (K_nM F)^T D (K_nM F) when the
    rounding of K_nM^T D K_nM, amplified by ||F||^2, would exceed a fraction of lam
    (:func:`_squared_gram_error`): with sigma = 10 on 9-d data (s_min(K_MM) = 6e-9) and
    lam = 1e-8, whitening after the Gram left the objective 62 % above its minimum.
    """
    S = (S + S.T) / 2
    S.diagonal().add_(lam)
    beta = _spd_solve(S, rhs)
    r = torch.linalg.vector_norm(rhs - S @ beta, dim=0) / torch.linalg.vector_norm(
        rhs, dim=0).clamp_min(1e-300)
    return F @ beta, beta, float(r.max())
