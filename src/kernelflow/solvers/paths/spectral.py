"""The spectral closed form of kernel gradient descent, written once.

With K = U diag(s) U^T, gradient descent from alpha_0 = 0 with step eta gives
``alpha_k = U diag(phi_k(s)) U^T y`` with ``phi_k(s) = (1 - (1 - eta s)^k) / s``: every iterate
from one eigendecomposition, without error accumulation.
"""

from __future__ import annotations

import torch

from ...linalg import symmetric_eigh
from ._common import DivergenceError, PathResult, _check_eta, _out
from ._operator import batch_matmul
from ._steps import check_gradient_learning_rate


def _decay(x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(1 - q^k, q^k)`` with q = 1 - x, for x = eta s and k broadcasting against each other.

    1 - q^k comes from log1p/expm1 where x < 0.5, which keeps it accurate when eta s is tiny.
    """
    small = x < 0.5
    num_small = -torch.expm1(k * torch.log1p(-torch.where(small, x, torch.zeros_like(x))))
    q = (1.0 - x).pow(k)
    return torch.where(small, num_small, 1.0 - q), q


def spectral_filter(s: torch.Tensor, eta: float, iterations: torch.Tensor) -> torch.Tensor:
    """phi_k(s) = (1 - (1 - eta s)^k) / s, with phi_k(0) = k eta: alpha_k = U phi_k(S) U^T y.

    ``s`` has shape (..., n), ``iterations`` shape (K,); returns (K, ..., n). The discrete
    counterpart of the gradient-flow filter (1 - exp(-t s)) / s (Eq. 10) at t = k eta.

    Examples
    --------
    >>> import torch
    >>> spectral_filter(torch.tensor([0.0, 1.0], dtype=torch.float64), 0.5,
    ...                 torch.tensor([2])).tolist()
    [[1.0, 0.75]]
    """
    k = iterations.to(s.dtype).reshape(-1, *([1] * s.ndim))
    num, _ = _decay(eta * s, k)
    safe_s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.where(s > 0, num / safe_s, k * eta)


class ChunkedSpectralFilter:
    """phi_k(s) b for consecutive chunks of iterations k = 1, 2, ..., batched over problems.

    ``s`` (..., n) are eigenvalues (clamped at 0), ``b`` (..., n) the coordinates of y in the
    eigenbasis. The factors 1 - q^j and q^j (q = 1 - eta s) for j = 1..``chunk`` are tabulated
    once; the chunk after step k0 then uses 1 - q^(k0 + j) = (1 - q^k0) + q^k0 (1 - q^j), a
    sum of non-negative terms, so a chunk costs one multiply-add per entry. Directions with
    s = 0 (marked by ``zero``) have phi_k = k eta: :meth:`next` leaves them out and returns
    the factors k eta, so that a caller can project them once.

    Examples
    --------
    >>> import torch
    >>> s = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    >>> f = ChunkedSpectralFilter(s, torch.ones(3, dtype=torch.float64), 0.25, chunk=4)
    >>> coef, t = f.next(3)
    >>> bool(torch.allclose(coef.T[:, 1:], spectral_filter(s, 0.25, torch.arange(1, 4))[:, 1:]))
    True
    >>> t.tolist()  # phi_k(0) = k eta
    [0.25, 0.5, 0.75]
    """

    _batched = ("zero", "b_over_s", "qtab", "ntab", "q0", "n0")

    def __init__(self, s: torch.Tensor, b: torch.Tensor, eta: float, chunk: int):
        self.zero = s <= 0
        self.b_over_s = torch.where(self.zero, torch.zeros_like(b),
                                    b / torch.where(self.zero, 1.0, s))
        j = torch.arange(1, chunk + 1, dtype=s.dtype, device=s.device)
        self.ntab, self.qtab = _decay((eta * s).unsqueeze(-1), j)  # (..., n, chunk)
        self.q0 = torch.ones_like(s)  # q^k0
        self.n0 = torch.zeros_like(s)  # 1 - q^k0, kept without cancellation
        self.eta = eta
        self.k = 0

    def keep(self, mask: torch.Tensor) -> None:
        """Keep the problems selected by ``mask`` (leading dimensions)."""
        for name in self._batched:
            setattr(self, name, getattr(self, name)[mask])

    def next(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """phi_k(s) b for the next ``c`` <= chunk steps, shape (..., n, c), zero where s = 0,
        and the factors k eta (c,) of the directions s = 0."""
        N = torch.addcmul(self.n0.unsqueeze(-1), self.q0.unsqueeze(-1), self.ntab[..., :c])
        coef = N.mul_(self.b_over_s.unsqueeze(-1))
        its = torch.arange(self.k + 1, self.k + c + 1, dtype=coef.dtype, device=coef.device)
        self.n0 = self.n0 + self.q0 * self.ntab[..., c - 1]
        self.q0 = self.q0 * self.qtab[..., c - 1]
        self.k += c
        return coef, self.eta * its


def _gd_spectral(Km, Y, Em, y, learning_rate, max_iter, gamma, nesterov, callback, record_path,
                 tol, eigh):
    s, U = symmetric_eigh(Km.to_dense()) if eigh is None else eigh
    s_max = float(s[-1]) if s.numel() else 0.0
    eta = (1.0 / s_max if s_max > 0 else 1.0) if learning_rate == "auto" else \
        _check_eta(learning_rate)
    check_gradient_learning_rate(eta, s_max, gamma, nesterov)
    C = Y @ U  # (t, n) coordinates of y in the eigenbasis
    EU = None if Em is None else batch_matmul(Em, U.T)  # (n, m): row j = (K_eval u_j)^T
    y_norm = torch.linalg.vector_norm(Y, dim=-1)

    def materialise(coef):  # eigen-coefficients (..., t, n) of alpha -> alpha, residual, eval
        A = coef @ U.T
        R = (C - coef * s) @ U.T
        E = None if EU is None else coef @ EU
        return A, R, E

    if gamma > 0:
        return _gd_spectral_momentum(s, C, materialise, y, eta, gamma, nesterov, max_iter,
                                     callback, record_path, tol, y_norm)
    n_iter = max_iter
    if tol > 0 and max_iter > 0:
        # ||r_k||^2 = sum_i (1 - eta s_i)^(2k) c_i^2: first k below tolerance, in O(n) per k.
        ks = torch.arange(max_iter + 1, dtype=s.dtype)
        damp = (1.0 - eta * s).abs().reshape(1, -1).pow(2 * ks.reshape(-1, 1))  # (k, n)
        norms = (damp @ (C * C).T).sqrt()  # (k, t)
        ok = (norms <= tol * y_norm).all(dim=1)
        if bool(ok.any()):
            n_iter = int(torch.nonzero(ok)[0, 0])
    stopped = False
    path = [] if record_path else None
    if callback is not None or record_path:
        block = max(1, min(256, 2**22 // max(1, C.numel())))
        last = None
        for k0 in range(0, n_iter + 1, block):
            ks = torch.arange(k0, min(k0 + block, n_iter + 1))
            phi = spectral_filter(s, eta, ks)  # (b, n)
            A, R, E = materialise(phi[:, None, :] * C[None])
            for j, k in enumerate(ks.tolist()):
                last = (k, A[j], R[j], None if E is None else E[j])
                if path is not None:
                    path.append(_out(A[j], y))
                if callback is not None and callback(*last):
                    stopped = True
                    break
            if stopped:
                break
        k, A, R, E = last
    else:
        k = n_iter
        phi = spectral_filter(s, eta, torch.tensor([k]))[0]
        A, R, E = materialise(phi * C)
    return PathResult(
        alpha=_out(A, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack(path),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )


def _gd_spectral_momentum(s, C, materialise, y, eta, gamma, nesterov, max_iter, callback,
                          record_path, tol, y_norm):
    a = torch.zeros_like(C)
    a_prev = torch.zeros_like(C)
    want = callback is not None or record_path
    path = [] if record_path else None
    stopped = False
    k = 0
    while True:
        if want:
            A, R, E = materialise(a)
            if path is not None:
                path.append(_out(A, y))
            if callback is not None and callback(k, A, R, E):
                stopped = True
                break
        if k >= max_iter:
            break
        r_coef = C - s * a
        if tol > 0 and bool((torch.linalg.vector_norm(r_coef, dim=-1) <= tol * y_norm).all()):
            break
        v = a - a_prev
        look = r_coef - gamma * s * v if nesterov else r_coef
        a_prev, a = a, a + gamma * v + eta * look
        k += 1
        if not bool(torch.isfinite(a).all()):
            raise DivergenceError(f"gradient descent with momentum diverged at iteration {k}.")
    A, R, E = materialise(a)
    return PathResult(
        alpha=_out(A, y), residual=_out(R, y), n_iter=k, learning_rate=eta,
        path=None if path is None else torch.stack(path),
        eval_predictions=None if E is None else _out(E, y), stopped_by_callback=stopped,
    )

