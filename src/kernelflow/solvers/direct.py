"""Direct and spectral solvers: kernel ridge regression, gradient flow, leave-one-out.

Notation (Allerbo, Eq. 1-11): K = K(X, X) = U diag(s) U^T, y in R^{n x t}.

* KRR:            alpha(lambda) = (K + lambda I)^{-1} y                      (Eq. 2)
* gradient flow:  alpha(t) = K^{-1} (I - exp(-t K)) y = U diag(phi_t(s)) U^T y  (Eq. 10)
                  with phi_t(s) = (1 - exp(-t s)) / s and phi_t(0) = t (the s -> 0 limit; no
                  inverse of K is ever formed, so singular K is fine; Remark 4.1).
* momentum flow:  heavy-ball / Nesterov with factor gamma follow the flow at t / (1 - gamma).
* LOO:            e_i = (y_i - (H y)_i) / (1 - H_ii),  H = K (K + lambda I)^{-1}   (App. B)

All functions are pure and work on tensors.
"""

from __future__ import annotations

import torch

from ..linalg import band_reduce, cho_solve, cholesky, symmetric_eigh

__all__ = [
    "krr_cholesky",
    "krr_lstsq",
    "spectrum",
    "krr_spectral",
    "krr_path",
    "flow_filter",
    "gradient_flow_spectral",
    "loo_mse_spectral",
    "gcv_mse_spectral",
]


def _as_2d(Y: torch.Tensor) -> tuple[torch.Tensor, bool]:
    return (Y.reshape(-1, 1), True) if Y.ndim == 1 else (Y, False)


def _sqrt_weighted(Y2, sample_weight, dtype):
    """(W^{1/2} y, W^{1/2}) for the weighted problem; (y, None) without weights."""
    if sample_weight is None:
        return Y2, None
    sw = sample_weight.to(dtype).sqrt()
    return Y2 * sw[:, None], sw


def _weighted(K, Y, sample_weight):
    if sample_weight is None:
        return K, Y, None
    sw = sample_weight.to(K.dtype).sqrt()
    return K * sw[:, None] * sw[None, :], Y * sw[:, None], sw


def _ridge_system(K, Y, alpha, sample_weight):
    """The weighted ridge system of the direct solvers.

    Returns (W^{1/2} K W^{1/2}, W^{1/2} y as (n, t), W^{1/2} or None, the penalties as a 1-D
    tensor of 1 or t values, whether y was 1-D); refuses a count of penalties that is neither.
    """
    Y2, squeeze = _as_2d(Y)
    Kw, Yw, sw = _weighted(K, Y2, sample_weight)
    alphas = torch.as_tensor(alpha, dtype=K.dtype).reshape(-1)
    if alphas.numel() not in (1, Y2.shape[1]):
        raise ValueError(f"alpha has {alphas.numel()} values but y has {Y2.shape[1]} targets.")
    return Kw, Yw, sw, alphas, squeeze


def _ridge_coefficients(C, sw, squeeze):
    """Coefficients c = W^{1/2} C of the weighted system's solution C, shaped like y."""
    if sw is not None:
        C = C * sw[:, None]
    return C[:, 0] if squeeze else C


def krr_cholesky(
    K: torch.Tensor,  # shape: (n, n)
    Y: torch.Tensor,  # shape: (n,) or (n, t)
    alpha,  # float or tensor of shape (t,)
    *,
    sample_weight: torch.Tensor | None = None,  # shape: (n,)
    overwrite_k: bool = False,
) -> torch.Tensor:  # shape: like Y
    """Kernel ridge coefficients (K + alpha W^{-1})^{-1} y by Cholesky, with jitter escalation.

    With sample weights W the objective is sum_i w_i (y_i - f_i)^2 + alpha ||f||_H^2, solved as
    scikit-learn does: c = W^{1/2} (W^{1/2} K W^{1/2} + alpha I)^{-1} W^{1/2} y. A per-target
    ``alpha`` (shape (t,)) factorises once per distinct value. ``overwrite_k=True`` lets the
    solver add the penalty to K's diagonal in place (peak memory: K and its factor).
    Cost O(n^3/3 + n^2 t).

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> krr_cholesky(K, torch.tensor([1.0, 0.0], dtype=torch.float64), 1.0).numpy().round(4)
    array([ 0.5333, -0.1333])
    """
    Kw, Yw, sw, alphas, squeeze = _ridge_system(K, Y, alpha, sample_weight)
    C = torch.empty_like(Yw)
    values = torch.unique(alphas)
    A = Kw.clone() if (Kw is K and not overwrite_k) else Kw
    for i, a in enumerate(values):
        cols = (alphas == a).nonzero().reshape(-1) if alphas.numel() > 1 else slice(None)
        if i > 0:
            A.diagonal().sub_(float(values[i - 1]))
        A.diagonal().add_(float(a))
        L, _ = cholesky(A, overwrite=len(values) == 1)
        C[:, cols] = cho_solve(L, Yw[:, cols])
        del L
    return _ridge_coefficients(C, sw, squeeze)


def krr_lstsq(
    K: torch.Tensor,  # shape: (n, n)
    Y: torch.Tensor,  # shape: (n,) or (n, t)
    alpha,  # float or tensor of shape (t,)
    *,
    sample_weight: torch.Tensor | None = None,  # shape: (n,)
) -> torch.Tensor:  # shape: like Y
    """Kernel ridge coefficients for a matrix that need not be positive definite.

    The same system as :func:`krr_cholesky`, c = W^{1/2} (W^{1/2} K W^{1/2} + alpha I)^{-1}
    W^{1/2} y, solved in the least-squares sense (the minimum-norm solution when singular), as
    scikit-learn does when its Cholesky fails on a user's precomputed kernel. Cost O(n^3 t').

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)  # indefinite
    >>> krr_lstsq(K, torch.tensor([1.0, 0.0], dtype=torch.float64), 0.0).numpy().round(4)
    array([0., 1.])
    """
    Kw, Yw, sw, alphas, squeeze = _ridge_system(K, Y, alpha, sample_weight)
    C = torch.empty_like(Yw)
    eye = torch.eye(K.shape[0], dtype=K.dtype, device=K.device)
    for a in torch.unique(alphas):
        cols = (alphas == a).nonzero().reshape(-1) if alphas.numel() > 1 else slice(None)
        A = (Kw + float(a) * eye).double()
        C[:, cols] = torch.linalg.lstsq(A.cpu(), Yw[:, cols].double().cpu(),
                                        driver="gelsd").solution.to(C)
    return _ridge_coefficients(C, sw, squeeze)


def spectrum(K: torch.Tensor, sample_weight: torch.Tensor | None = None):
    """Eigendecomposition (s, U) of K (or W^{1/2} K W^{1/2}). Cost O(n^3)."""
    Kw, _, _ = _weighted(K, K[:, :1], sample_weight)
    return symmetric_eigh(Kw)


def _apply_filter(U, F, Y2, sw):
    # F: (m, n) filter values per eigenvalue for m settings -> (m, n, t) coefficients
    UtY = U.T @ Y2  # (n, t)
    C = torch.matmul(U, F[:, :, None] * UtY[None])  # (m, n, t) without an (m, n, n) temporary
    if sw is not None:
        C = C * sw[None, :, None]
    return C


def krr_spectral(s, U, Y, alphas, *, sample_weight=None) -> torch.Tensor:
    """KRR coefficients for many penalties from one eigendecomposition.

    alpha(lambda) = U diag(1 / (s + lambda)) U^T y for each lambda in ``alphas``.
    Returns shape (len(alphas), n) or (len(alphas), n, t). Cost O(m n^2 + n^2 t) after the
    O(n^3) decomposition. ``lambda = 0`` uses the pseudo-inverse (1/s for s above a relative
    tolerance, 0 otherwise).

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> s, U = spectrum(K)
    >>> krr_spectral(s, U, torch.tensor([1.0, 0.0], dtype=torch.float64), [1.0]).numpy().round(4)
    array([[ 0.5333, -0.1333]])
    """
    Y2, squeeze = _as_2d(Y)
    Y2, sw = _sqrt_weighted(Y2, sample_weight, s.dtype)
    lam = torch.as_tensor(alphas, dtype=s.dtype, device=s.device).reshape(-1, 1)
    denom = s[None, :] + lam
    tiny = s.max().clamp_min(1.0) * s.shape[0] * torch.finfo(s.dtype).eps
    F = torch.where(denom > tiny, 1.0 / denom.clamp_min(tiny), torch.zeros_like(denom))
    C = _apply_filter(U, F, Y2, sw)
    return C[..., 0] if squeeze else C


def krr_path(K: torch.Tensor, Y: torch.Tensor, alphas, *, sample_weight=None,
             bandwidth: int | None = None, overwrite: bool = False) -> torch.Tensor:
    """KRR coefficients for many penalties from one orthogonal band reduction.

    K = Q B Q^T with B banded (:func:`kernelflow.linalg.band_reduce`, about four Cholesky
    factorisations of work, all matrix-matrix products), then for every lambda
    alpha(lambda) = Q (B + lambda I)^{-1} Q^T y by one banded Cholesky solve of O(n b^2).
    Exact (backward stable, no eigenvectors), and cheaper than :func:`krr_spectral`'s
    eigendecomposition when only the coefficients are needed (the spectral route is still the
    one that gives exact leave-one-out errors). With sample weights the problem
    (W^{1/2} K W^{1/2} + lambda I) z = W^{1/2} y, alpha = W^{1/2} z is solved (the weighted
    objective of :func:`krr_cholesky`).

    Parameters
    ----------
    K : tensor of shape (n, n)
        Symmetric kernel matrix; only its lower triangle is read.
    Y : tensor of shape (n,) or (n, t)
    alphas : sequence of float
        Penalties lambda >= 0 (a numerically singular ``K + lambda I`` gets jitter and a
        :class:`~kernelflow.linalg.NearSingularKernelWarning`).
    sample_weight : tensor of shape (n,), optional
    bandwidth : int, optional
        Half-bandwidth of B; default 64 for n <= 3000, else 128.
    overwrite : bool, default=False
        Use K as workspace (saves an n x n copy).

    Returns
    -------
    tensor of shape (len(alphas), n) or (len(alphas), n, t)

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> krr_path(K, torch.tensor([1.0, 0.0], dtype=torch.float64), [1.0]).numpy().round(4)
    array([[ 0.5333, -0.1333]])
    """
    lam = [float(a) for a in alphas]
    if any(not (a >= 0) or a == float("inf") for a in lam):
        raise ValueError(f"penalties must be finite and >= 0, got {lam}.")
    Y2, squeeze = _as_2d(Y)
    Kw, Yw, sw = _weighted(K, Y2, sample_weight)
    n = K.shape[0]
    b = bandwidth or (64 if n <= 3000 else 128)
    form = band_reduce(Kw, b, overwrite=overwrite or Kw is not K)
    C = form.solve_shifted(Yw, lam)
    if sw is not None:
        C = C * sw[None, :, None]
    return C[..., 0] if squeeze else C


def flow_filter(s: torch.Tensor, times) -> torch.Tensor:
    """phi_t(s) = (1 - exp(-t s)) / s with the limit phi_t(0) = t; shape (len(times), n).

    Computed as -expm1(-t s) / s, and as t (1 - t s / 2) where t s is below 1e-8 so that there
    is no cancellation and no division by zero.

    Examples
    --------
    >>> import torch
    >>> flow_filter(torch.tensor([0.0, 1.0], dtype=torch.float64), [2.0]).numpy().round(4)
    array([[2.    , 0.8647]])
    """
    t = torch.as_tensor(times, dtype=s.dtype, device=s.device).reshape(-1, 1)
    ts = t * s[None, :]
    small = ts < 1e-8
    safe_s = torch.where(small, torch.ones_like(ts), s[None, :].expand_as(ts))
    return torch.where(small, t * (1.0 - 0.5 * ts), -torch.expm1(-ts) / safe_s)


def gradient_flow_spectral(s, U, Y, times, *, momentum: float = 0.0,
                           sample_weight=None) -> torch.Tensor:
    """Gradient-flow coefficients alpha(t) = K^{-1}(I - exp(-t K)) y for many times at once.

    With ``momentum`` gamma in [0, 1) returns the heavy-ball / Nesterov flow limit
    alpha(t / (1 - gamma)) (Allerbo, Remark 4.2). Returns (len(times), n[, t]).
    Cost O(m n^2) after the eigendecomposition.
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}.")
    Y2, squeeze = _as_2d(Y)
    Y2, sw = _sqrt_weighted(Y2, sample_weight, s.dtype)
    times = torch.as_tensor(times, dtype=s.dtype, device=s.device).reshape(-1) / (1.0 - momentum)
    C = _apply_filter(U, flow_filter(s, times), Y2, sw)
    return C[..., 0] if squeeze else C


def _hat_diag_and_fit(s, U, Y2, alphas):
    lam = torch.as_tensor(alphas, dtype=s.dtype, device=s.device).reshape(-1, 1)
    G = s[None, :] / (s[None, :] + lam)  # (m, n) eigenvalues of H
    H_diag = (U * U) @ G.T  # (n, m)
    fits = torch.matmul(U, G[:, :, None] * (U.T @ Y2)[None])  # (m, n, t)
    return G, H_diag, fits


def loo_mse_spectral(s, U, Y, alphas, *, sample_weight=None) -> torch.Tensor:
    """Exact leave-one-out mean squared error of KRR for each penalty (shape (m, t)).

    Uses e_i = (y_i - f_i) / (1 - H_ii) with H = K (K + lambda I)^{-1}, which equals refitting
    without point i (Allerbo App. B; tested against brute force). With sample weights the
    residuals are those of the weighted problem and the mean is weighted. Cost O(m n^2).
    """
    Yw, _ = _sqrt_weighted(_as_2d(Y)[0], sample_weight, s.dtype)
    _, H_diag, fits = _hat_diag_and_fit(s, U, Yw, alphas)
    denom = (1.0 - H_diag.T).clamp_min(torch.finfo(s.dtype).eps)  # (m, n)
    E = (Yw[None] - fits) / denom[..., None]
    if sample_weight is None:
        return (E**2).mean(1)
    return (E**2).sum(1) / sample_weight.to(s.dtype).sum()


def gcv_mse_spectral(s, U, Y, alphas, *, sample_weight=None) -> torch.Tensor:
    """Generalised cross-validation score (1/n) ||y - H y||^2 / (1 - tr(H)/n)^2, shape (m, t)."""
    Yw, _ = _sqrt_weighted(_as_2d(Y)[0], sample_weight, s.dtype)
    G, _, fits = _hat_diag_and_fit(s, U, Yw, alphas)
    n = s.shape[0]
    denom = (1.0 - G.sum(1) / n).clamp_min(torch.finfo(s.dtype).eps) ** 2  # (m,)
    return ((Yw[None] - fits) ** 2).mean(1) / denom[:, None]
