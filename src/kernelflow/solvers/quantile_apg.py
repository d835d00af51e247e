"""Kernel quantile regression by accelerated proximal gradient on a smoothed check loss.

The competitor KQR-T / KQR-B of Allerbo's journal version (digest §2.10), the method of Tang, Gu
and Wang's ``fastkqr``. It minimises, over an intercept b and coefficients alpha,

    F(b, alpha) = (1/n) sum_i rho_tau(y_i - b - (K alpha)_i) + (lambda / 2) alpha^T K alpha,

with the check loss rho_tau(r) = r (tau - 1[r < 0]). The check loss is replaced by its Moreau
envelope with parameter delta (a Huber-like smoothing):

    h_delta(r) = r^2 / (2 delta)                     if (tau - 1) delta <= r <= tau delta
               = tau r - tau^2 delta / 2             if r > tau delta
               = (tau - 1) r - (tau - 1)^2 delta / 2  if r < (tau - 1) delta,

whose derivative clip(r / delta, tau - 1, tau) is 1/delta-Lipschitz, and 0 <= rho_tau - h_delta
<= delta max(tau, 1 - tau)^2 / 2. The smoothed problem is solved by Nesterov's accelerated
gradient in the metric of its quadratic majoriser

    M = (1 / (n delta)) [1, K]^T [1, K] + lambda [[0, 0], [0, K]],

which, after one eigendecomposition K = U diag(s) U^T, is inverted in O(n) per step (a diagonal
system bordered by the intercept), so a step costs two products with U. Momentum restarts
whenever the objective would increase and the step is then taken from the last iterate (a
majorise-minimise step), so the smoothed objective decreases monotonically.

Continuation: delta starts at ``delta`` and is divided by 4 until it falls below ``delta_min``.
After each stage the exact solution is tried (finite smoothing): with E the residuals inside
the quadratic zone and g_i = tau or tau - 1 outside it, the stationarity conditions of the
*unsmoothed* problem, alpha = g / (n lambda), sum_i g_i = 0 (with an intercept), r_E = 0, are a
linear system in (g_E, b). If its solution satisfies g_E in [tau - 1, tau] and the signs of the
other residuals agree with their g, it satisfies the KKT conditions of the exact problem and is
returned (``exact`` is True). Otherwise the last smoothed solution is returned.

Cost: one O(n^3) eigendecomposition per kernel matrix, then O(n^2) per iteration and problem;
the functions are batch-agnostic (K of shape (..., n, n), y (..., n), lambda and tau broadcast).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

__all__ = ["QuantileAPGResult", "kernel_quantile_apg", "smoothed_check_loss",
           "quantile_objective"]


@dataclass
class QuantileAPGResult:
    """Result of :func:`kernel_quantile_apg`.

    ``coef`` (..., n) and ``intercept`` (...) define f = K coef + intercept; ``objective`` is the
    unsmoothed objective F at the returned point; ``exact`` marks solutions that satisfy the
    exact KKT conditions; ``delta`` is the last smoothing parameter used; ``history`` the
    smoothed objective after every iteration of the last stage (unbatched problems only);
    ``iterations`` (...) the iterations each problem ran, over all stages.
    """

    coef: torch.Tensor
    intercept: torch.Tensor
    objective: torch.Tensor
    exact: torch.Tensor
    converged: torch.Tensor
    n_iter: int
    delta: float
    history: list
    iterations: torch.Tensor | None = None


def smoothed_check_loss(r: torch.Tensor, tau, delta: float) -> torch.Tensor:
    """Moreau envelope h_delta of the check loss, elementwise; ``delta=0`` gives rho_tau.

    Examples
    --------
    >>> import torch
    >>> r = torch.tensor([-1.0, 0.0, 0.05, 2.0], dtype=torch.float64)
    >>> smoothed_check_loss(r, 0.5, 0.0).tolist()
    [0.5, 0.0, 0.025, 1.0]
    >>> smoothed_check_loss(r, 0.5, 0.2).numpy().round(5).tolist()
    [0.475, 0.0, 0.00625, 0.975]
    """
    tau = torch.as_tensor(tau, dtype=r.dtype, device=r.device)
    lin = torch.where(r >= 0, tau * r, (tau - 1) * r)
    if delta == 0:
        return lin
    hi, lo = tau * delta, (tau - 1) * delta
    quad = r * r / (2 * delta)
    out = torch.where(r > hi, tau * r - tau * tau * delta / 2, quad)
    return torch.where(r < lo, (tau - 1) * r - (tau - 1) ** 2 * delta / 2, out)


def quantile_objective(K, y, coef, intercept, alpha, tau, delta: float = 0.0) -> torch.Tensor:
    """F(b, alpha) = mean_i h_delta(y_i - b - (K alpha)_i) + (lambda / 2) alpha^T K alpha.

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(2, dtype=torch.float64)
    >>> y = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> float(quantile_objective(K, y, torch.zeros(2, dtype=torch.float64), 0.0, 1.0, 0.5))
    0.5
    """
    Ka = (K @ coef.unsqueeze(-1))[..., 0]
    b = torch.as_tensor(intercept, dtype=K.dtype, device=K.device)
    r = y - b.unsqueeze(-1) - Ka
    lam = torch.as_tensor(alpha, dtype=K.dtype, device=K.device)
    tau = torch.as_tensor(tau, dtype=K.dtype, device=K.device)
    tau = tau.unsqueeze(-1) if tau.ndim else tau  # one tau per problem of the batch
    return smoothed_check_loss(r, tau, delta).mean(-1) + 0.5 * lam * (coef * Ka).sum(-1)


def _exact_kkt(K, y, f_res, lam, tau, delta, fit_intercept, n):
    """Try the finite-smoothing projection; returns (coef, intercept, ok) over the batch."""
    inside = (f_res > (tau - 1) * delta) & (f_res < tau * delta)
    e = inside.to(K.dtype)
    g_out = torch.where(f_res >= tau * delta, tau, tau - 1) * (1 - e)
    scale = 1.0 / (n * lam.unsqueeze(-1))  # (..., 1)
    Kn = K * scale.unsqueeze(-1)
    # rows in E: (K g / (n lam))_i + b = y_i; rows outside: g_i = g_out_i
    A = e.unsqueeze(-1) * Kn * e.unsqueeze(-2) + torch.diag_embed(1 - e)
    rhs = e * (y - (Kn @ g_out.unsqueeze(-1))[..., 0]) + g_out
    if fit_intercept:
        B = A.shape[:-2]
        A = torch.cat([A, e.unsqueeze(-1)], -1)
        last = torch.cat([e, torch.zeros(*B, 1, dtype=K.dtype, device=K.device)], -1)
        A = torch.cat([A, last.unsqueeze(-2)], -2)
        rhs = torch.cat([rhs, -(g_out.sum(-1, keepdim=True))], -1)
    sol, info = torch.linalg.solve_ex(A, rhs.unsqueeze(-1))
    sol = sol[..., 0]
    g = sol[..., :n] if fit_intercept else sol
    b = sol[..., n] if fit_intercept else torch.zeros_like(lam)
    tol = 1e-8 * (1 + y.abs().amax(-1, keepdim=True))
    coef = g * scale
    r = y - b.unsqueeze(-1) - (K @ coef.unsqueeze(-1))[..., 0]
    ok = (info == 0) & torch.isfinite(sol).all(-1)
    ok &= ((g >= tau - 1 - 1e-9) & (g <= tau + 1e-9)).all(-1)
    pos, neg = (1 - e).bool() & (g_out > 0), (1 - e).bool() & (g_out < 0)
    ok &= ~(pos & (r < -tol)).any(-1) & ~(neg & (r > tol)).any(-1)
    ok &= (~inside | (r.abs() <= tol)).all(-1)
    if fit_intercept:
        ok &= g.sum(-1).abs() <= 1e-8 * n
    return coef, b, ok


class _StageProblems:
    """The problems of one smoothing stage in the eigenbasis of their kernels: the smoothed
    objective, the predictions and the majoriser step M^{-1} grad F, for the rows present."""

    def __init__(self, U, s, keep, c, yw, lam1, tw, dlt: float, fit_intercept: bool):
        self.U, self.s, self.keep, self.c = U, s, keep, c  # (B, n, n), (B, n), (B, n), (B, n)
        self.yw, self.lam1, self.tw = yw, lam1, tw  # (B, n), (B, 1), (B, 1)
        self.dlt, self.fit_intercept = dlt, fit_intercept
        self.n = U.shape[-1]
        self.inv_nd = 1.0 / (self.n * dlt)

    def take(self, pos: torch.Tensor) -> _StageProblems:
        """The same stage restricted to rows ``pos``."""
        return _StageProblems(self.U[pos], self.s[pos], self.keep[pos], self.c[pos],
                              self.yw[pos], self.lam1[pos], self.tw[pos], self.dlt,
                              self.fit_intercept)

    def predictions(self, a_, b_):
        return b_.unsqueeze(-1) + torch.bmm(self.U, (self.s * a_).unsqueeze(-1))[..., 0]

    def objective(self, f_, a_):
        return (smoothed_check_loss(self.yw - f_, self.tw, self.dlt).mean(-1)
                + 0.5 * self.lam1[:, 0] * (self.s * a_ * a_).sum(-1))

    def step(self, a_, b_, f_):
        """M^{-1} grad F at (a_, b_); returns (da, db, df), df the change of predictions."""
        n, s, keep, c, lam1, inv_nd = self.n, self.s, self.keep, self.c, self.lam1, self.inv_nd
        g = torch.clamp((self.yw - f_) / self.dlt, min=self.tw - 1, max=self.tw)
        gU = torch.bmm(g.unsqueeze(-2), self.U)[:, 0]
        den = inv_nd * s + lam1
        q = torch.where(keep, (lam1 * a_ - gU / n) / den, torch.zeros_like(a_))
        if self.fit_intercept:
            grad_b = -g.sum(-1) / n
            schur = inv_nd * n - inv_nd**2 * (c * c * s / den).sum(-1)
            db = (grad_b - inv_nd * (c * s * q).sum(-1)) / schur
            da = q - torch.where(keep, inv_nd * c * db.unsqueeze(-1) / den,
                                 torch.zeros_like(q))
        else:
            db = torch.zeros_like(b_)
            da = q
        return da, db, self.predictions(da, db)


@dataclass
class _Problems:
    """Every problem of the batch flattened to one row, with its kernel's eigendecomposition."""

    batch: torch.Size
    kidx: torch.Tensor  # (B,) the kernel of each problem
    y: torch.Tensor  # (B, n)
    lam: torch.Tensor  # (B,)
    tau: torch.Tensor  # (B, 1)
    s: torch.Tensor  # (nk, n) eigenvalues, the negligible ones set to zero
    keep: torch.Tensor  # (nk, n) the eigenvalues kept
    U: torch.Tensor  # (nk, n, n)
    c: torch.Tensor  # (nk, n) U^T 1

    def stage(self, w: torch.Tensor, dlt: float, fit_intercept: bool) -> _StageProblems:
        ki = self.kidx[w]
        return _StageProblems(self.U[ki], self.s[ki], self.keep[ki], self.c[ki], self.y[w],
                              self.lam[w].unsqueeze(-1), self.tau[w], dlt, fit_intercept)


@dataclass
class _Solution:
    """What the stages have found so far, one row per problem."""

    a: torch.Tensor  # (B, n) coefficients in the eigenbasis (smoothed solution)
    b: torch.Tensor  # (B,)
    f: torch.Tensor  # (B, n) predictions
    coef_exact: torch.Tensor  # (B, n)
    b_exact: torch.Tensor  # (B,)
    is_exact: torch.Tensor  # (B,) bool
    converged: torch.Tensor  # (B,) bool
    iters: torch.Tensor  # (B,) long
    total: int = 0
    history: list = dataclasses.field(default_factory=list)


def _check_quantile_inputs(K, y, alpha, quantile, delta, delta_min):
    """Shapes and ranges; returns (n, lambda, tau) as tensors of K's dtype and device."""
    if K.ndim < 2 or K.shape[-1] != K.shape[-2]:
        raise ValueError(f"K must have shape (..., n, n), got {tuple(K.shape)}.")
    n = K.shape[-1]
    if y.shape[-1] != n:
        raise ValueError(f"y must have last dimension {n}, got shape {tuple(y.shape)}.")
    if not (delta > 0 and delta_min > 0):
        raise ValueError("delta and delta_min must be positive.")
    dt, dev = K.dtype, K.device
    lam = torch.as_tensor(alpha, dtype=dt, device=dev)
    if (lam <= 0).any() or not torch.isfinite(lam).all():
        raise ValueError("alpha (the penalty lambda) must be positive and finite.")
    tau = torch.as_tensor(quantile, dtype=dt, device=dev)
    if ((tau <= 0) | (tau >= 1)).any():
        raise ValueError("quantile must lie in (0, 1).")
    return n, lam, tau


def _flatten_problems(K, y, lam, tau, n: int) -> _Problems:
    """Broadcast the batch, flatten it and eigendecompose every kernel once."""
    dt, dev = K.dtype, K.device
    batch = torch.broadcast_shapes(K.shape[:-2], y.shape[:-1], lam.shape, tau.shape)
    kb = K.shape[:-2]
    nk = 1
    for d_ in kb:
        nk *= d_
    kidx = torch.arange(nk, device=dev).reshape(kb).expand(batch).reshape(-1)
    y_all = y.expand(*batch, n).reshape(-1, n)
    lam_all = lam.expand(batch).reshape(-1)
    tau_all = tau.expand(batch).reshape(-1, 1)
    s_k, U_k = torch.linalg.eigh(K)
    s_k = s_k.reshape(nk, n)
    keep_k = s_k > s_k.amax(-1, keepdim=True).clamp_min(1e-300) * (n * torch.finfo(dt).eps)
    s_k = torch.where(keep_k, s_k, torch.zeros_like(s_k))
    U_f = U_k.reshape(nk, n, n)
    return _Problems(batch, kidx, y_all, lam_all, tau_all, s_k, keep_k, U_f, U_f.sum(-2))


def _accelerated_step(pr: _StageProblems, a, b, f, F, a_prev, b_prev, f_prev, t):
    """One Nesterov step from the extrapolated point, restarted (a plain majorise-minimise step
    from the last iterate, momentum reset) where the objective would increase.
    Returns (a, b, f, F, t) proposed for every row."""
    t_new = 0.5 * (1 + torch.sqrt(1 + 4 * t * t))
    beta = ((t - 1) / t_new).unsqueeze(-1)
    ya, yb, yf = a + beta * (a - a_prev), b + beta[..., 0] * (b - b_prev), \
        f + beta * (f - f_prev)
    da, db, df = pr.step(ya, yb, yf)
    na, nb, nf = ya - da, yb - db, yf - df
    nF = pr.objective(nf, na)
    bad = nF > F
    if bool(bad.any()):
        ra, rb, rf = pr.step(a, b, f)
        badv = bad.unsqueeze(-1)
        na = torch.where(badv, a - ra, na)
        nb = torch.where(bad, b - rb, nb)
        nf = torch.where(badv, f - rf, nf)
        nF = torch.where(bad, pr.objective(nf, na), nF)
        t_new = torch.where(bad, torch.ones_like(t_new), t_new)
    return na, nb, nf, nF, t_new


def _smoothed_stage(pr: _StageProblems, sol: _Solution, w: torch.Tensor, *, max_iter: int,
                    tol: float, compact: bool, record: bool) -> None:
    """Run the accelerated iterations of one smoothing stage on rows ``w`` of ``sol`` until no
    prediction moves by more than ``tol`` (each problem on its own) or its objective is no
    longer finite (diverged, not converged), updating ``sol``."""
    a, b = sol.a[w], sol.b[w]
    f = pr.predictions(a, b)
    F = pr.objective(f, a)
    a_prev, b_prev, f_prev = a, b, f
    t = torch.ones(w.numel(), dtype=a.dtype, device=a.device)
    stage_done = sol.is_exact[w].clone()
    pos = torch.arange(w.numel(), device=a.device)  # rows of the working arrays still active
    sol.history = [float(F[0])] if record else []
    for _ in range(max_iter):
        if compact and pos.numel() == 0:
            break
        sol.total += 1
        if compact and pos.numel() < a.shape[0]:
            # finished problems leave: write them back, keep the active rows only
            sol.a[w], sol.b[w], sol.f[w] = a, b, f
            sol.converged[w] = stage_done & torch.isfinite(F)
            w, a, b, f, F = w[pos], a[pos], b[pos], f[pos], F[pos]
            a_prev, b_prev, f_prev, t = a_prev[pos], b_prev[pos], f_prev[pos], t[pos]
            stage_done = stage_done[pos]
            pr = pr.take(pos)
        na, nb, nf, nF, t = _accelerated_step(pr, a, b, f, F, a_prev, b_prev, f_prev, t)
        move = (nf - f).abs().amax(-1)
        frozen = stage_done.unsqueeze(-1)
        a_prev, b_prev, f_prev = a, b, f
        a = torch.where(frozen, a, na)
        b = torch.where(stage_done, b, nb)
        f = torch.where(frozen, f, nf)
        F = torch.where(stage_done, F, nF)
        sol.iters[w] += (~stage_done).long()
        if record:
            sol.history.append(float(F[0]))
        # a non-finite objective never becomes finite again: the problem has diverged
        stage_done = stage_done | (move <= tol) | ~torch.isfinite(F)
        if bool(stage_done.all()):
            pos = pos[:0]
            break
        pos = (~stage_done).nonzero()[:, 0]
    sol.a[w], sol.b[w], sol.f[w] = a, b, f
    sol.converged[w] = stage_done & torch.isfinite(F)


def _project_exact(K, P: _Problems, sol: _Solution, w: torch.Tensor, dlt: float,
                   fit_intercept: bool, n: int) -> None:
    """Try the exact solution of the problems ``w`` from their smoothed residuals; keep the
    first exact solution each problem reaches."""
    nk = P.s.shape[0]
    ce, be, ok = _exact_kkt(K.reshape(nk, n, n)[P.kidx[w]], P.y[w], P.y[w] - sol.f[w],
                            P.lam[w], P.tau[w], dlt, fit_intercept, n)
    new = ok & ~sol.is_exact[w]
    sol.coef_exact[w] = torch.where(new.unsqueeze(-1), ce, sol.coef_exact[w])
    sol.b_exact[w] = torch.where(new, be, sol.b_exact[w])
    sol.is_exact[w] = sol.is_exact[w] | ok


def kernel_quantile_apg(
    K: torch.Tensor,  # shape: (..., n, n)
    y: torch.Tensor,  # shape: (..., n)
    alpha,
    *,
    quantile=0.5,
    fit_intercept: bool = True,
    delta: float = 0.125,
    delta_min: float = 1e-6,
    max_iter: int = 100_000,
    tol: float = 1e-9,
    exact: bool = True,
    history: bool = False,
    compact: bool = True,
) -> QuantileAPGResult:
    """Kernel quantile regression with an intercept by accelerated proximal gradient (fastkqr).

    See the module docstring for the objective, the majoriser metric, the restart rule and
    the finite-smoothing projection. ``max_iter`` bounds the iterations of each smoothing stage;
    a stage ends when no prediction moves by more than ``tol`` in one iteration.

    Parameters
    ----------
    K : tensor of shape (..., n, n)
        Kernel matrices (symmetric positive semi-definite).
    y : tensor of shape (..., n)
    alpha : float or tensor
        Penalty lambda > 0 (broadcasts over the batch).
    quantile : float or tensor, default=0.5
        tau in (0, 1) (broadcasts).
    fit_intercept : bool, default=True
    delta, delta_min : float
        First and smallest smoothing parameter of the continuation (delta / 4 per stage).
    max_iter : int, default=100000
    tol : float, default=1e-9
    exact : bool, default=True
        Try the exact (unsmoothed) solution after every stage.
    history : bool, default=False
        Record the smoothed objective after each iteration (unbatched problems).
    compact : bool, default=True
        Problems whose stage has ended leave the batch, so an iteration costs only the active
        problems; ``False`` iterates the whole batch until its slowest problem stops and
        discards the finished problems' updates (the same results, for comparison).

    Returns
    -------
    QuantileAPGResult

    Examples
    --------
    >>> import torch
    >>> X = torch.linspace(0, 1, 6, dtype=torch.float64).unsqueeze(1)
    >>> K = torch.exp(-(X - X.T) ** 2 / 0.5)
    >>> y = torch.tensor([0.0, 1.0, 0.5, 2.0, 1.5, 3.0], dtype=torch.float64)
    >>> res = kernel_quantile_apg(K, y, 0.01, quantile=0.5)
    >>> bool(res.exact)
    True
    """
    n, lam, tau = _check_quantile_inputs(K, y, alpha, quantile, delta, delta_min)
    P = _flatten_problems(K, y, lam, tau, n)
    batch, B = P.batch, P.y.shape[0]
    zeros = functools.partial(torch.zeros, dtype=K.dtype, device=K.device)
    sol = _Solution(zeros(B, n), zeros(B), zeros(B, n), zeros(B, n), zeros(B),
                    torch.zeros(B, dtype=torch.bool, device=K.device),
                    torch.zeros(B, dtype=torch.bool, device=K.device),
                    torch.zeros(B, dtype=torch.long, device=K.device))
    record = history and B == 1 and len(batch) == 0
    dlt = float(delta)
    while True:
        # the working set: every problem (compact=False) or those not yet solved exactly
        w = torch.arange(B, device=K.device) if not compact else (~sol.is_exact).nonzero()[:, 0]
        _smoothed_stage(P.stage(w, dlt, fit_intercept), sol, w, max_iter=max_iter, tol=tol,
                        compact=compact, record=record)
        if exact:
            _project_exact(K, P, sol, w, dlt, fit_intercept, n)
        if bool(sol.is_exact.all()) or dlt / 4 < delta_min:
            break
        dlt /= 4
    coef_s = torch.bmm(P.U[P.kidx], sol.a.unsqueeze(-1))[..., 0]
    coef = torch.where(sol.is_exact.unsqueeze(-1), sol.coef_exact, coef_s).reshape(*batch, n)
    b = torch.where(sol.is_exact, sol.b_exact, sol.b).reshape(batch)
    is_exact = sol.is_exact.reshape(batch)
    converged = sol.converged.reshape(batch) | is_exact
    obj = quantile_objective(K, y.expand(*batch, n), coef, b, lam.expand(batch), tau.expand(batch))
    return QuantileAPGResult(coef, b, obj, is_exact, converged, sol.total, dlt, sol.history,
                             sol.iters.reshape(batch))
