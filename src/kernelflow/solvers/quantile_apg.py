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
    batch = torch.broadcast_shapes(K.shape[:-2], y.shape[:-1], lam.shape, tau.shape)
    kb = K.shape[:-2]
    nk = 1
    for d_ in kb:
        nk *= d_
    kidx = torch.arange(nk, device=dev).reshape(kb).expand(batch).reshape(-1)
    y_all = y.expand(*batch, n).reshape(-1, n)
    lam_all = lam.expand(batch).reshape(-1)
    tau_all = tau.expand(batch).reshape(-1, 1)
    B = y_all.shape[0]

    s_k, U_k = torch.linalg.eigh(K)
    s_k = s_k.reshape(nk, n)
    keep_k = s_k > s_k.amax(-1, keepdim=True).clamp_min(1e-300) * (n * torch.finfo(dt).eps)
    s_k = torch.where(keep_k, s_k, torch.zeros_like(s_k))
    U_f = U_k.reshape(nk, n, n)
    c_k = U_f.sum(-2)  # U^T 1

    a_all = torch.zeros(B, n, dtype=dt, device=dev)
    b_all = torch.zeros(B, dtype=dt, device=dev)
    f_all = torch.zeros(B, n, dtype=dt, device=dev)
    coef_exact = torch.zeros_like(a_all)
    b_exact = torch.zeros_like(b_all)
    is_exact = torch.zeros(B, dtype=torch.bool, device=dev)
    converged = torch.zeros(B, dtype=torch.bool, device=dev)
    iters = torch.zeros(B, dtype=torch.long, device=dev)
    record = history and B == 1 and len(batch) == 0
    hist: list = []
    total = 0
    dlt = float(delta)
    while True:
        inv_nd = 1.0 / (n * dlt)
        # the working set: every problem (compact=False) or those not yet solved exactly
        w = torch.arange(B, device=dev) if not compact else (~is_exact).nonzero()[:, 0]
        w_stage, ki = w, kidx[w]
        U, s, keep, c = U_f[ki], s_k[ki], keep_k[ki], c_k[ki]
        yw, lam1, tw = y_all[w], lam_all[w].unsqueeze(-1), tau_all[w]

        def predictions(a_, b_, U=U, s=s):
            return b_.unsqueeze(-1) + torch.bmm(U, (s * a_).unsqueeze(-1))[..., 0]

        def objective(f_, a_, yw=yw, tw=tw, lam1=lam1, s=s, dlt=dlt):
            return (smoothed_check_loss(yw - f_, tw, dlt).mean(-1)
                    + 0.5 * lam1[:, 0] * (s * a_ * a_).sum(-1))

        def step(a_, b_, f_, U=U, s=s, keep=keep, c=c, yw=yw, lam1=lam1, tw=tw, dlt=dlt,
                 inv_nd=inv_nd, predictions=predictions):
            # M^{-1} grad F at (a_, b_); returns (da, db, df), df the change of predictions
            g = torch.clamp((yw - f_) / dlt, min=tw - 1, max=tw)
            gU = torch.bmm(g.unsqueeze(-2), U)[:, 0]
            den = inv_nd * s + lam1
            q = torch.where(keep, (lam1 * a_ - gU / n) / den, torch.zeros_like(a_))
            if fit_intercept:
                grad_b = -g.sum(-1) / n
                schur = inv_nd * n - inv_nd**2 * (c * c * s / den).sum(-1)
                db = (grad_b - inv_nd * (c * s * q).sum(-1)) / schur
                da = q - torch.where(keep, inv_nd * c * db.unsqueeze(-1) / den,
                                     torch.zeros_like(q))
            else:
                db = torch.zeros_like(b_)
                da = q
            return da, db, predictions(da, db)

        a, b = a_all[w], b_all[w]
        f = predictions(a, b)
        F = objective(f, a)
        a_prev, b_prev, f_prev = a, b, f
        t = torch.ones(w.numel(), dtype=dt, device=dev)
        stage_done = is_exact[w].clone()
        pos = torch.arange(w.numel(), device=dev)  # rows of the working arrays still active
        hist = [float(F[0])] if record else []
        for _ in range(max_iter):
            if compact and pos.numel() == 0:
                break
            total += 1
            if compact and pos.numel() < a.shape[0]:
                # finished problems leave: write them back, keep the active rows only
                a_all[w], b_all[w], f_all[w] = a, b, f
                converged[w] = stage_done
                w, a, b, f, F = w[pos], a[pos], b[pos], f[pos], F[pos]
                a_prev, b_prev, f_prev, t = a_prev[pos], b_prev[pos], f_prev[pos], t[pos]
                stage_done = stage_done[pos]
                U, s, keep, c = U[pos], s[pos], keep[pos], c[pos]
                yw, lam1, tw = yw[pos], lam1[pos], tw[pos]
                step = functools.partial(step, U=U, s=s, keep=keep, c=c, yw=yw, lam1=lam1,
                                         tw=tw, predictions=functools.partial(
                                             predictions, U=U, s=s))
                objective = functools.partial(objective, yw=yw, tw=tw, lam1=lam1, s=s)
            t_new = 0.5 * (1 + torch.sqrt(1 + 4 * t * t))
            beta = ((t - 1) / t_new).unsqueeze(-1)
            ya, yb, yf = a + beta * (a - a_prev), b + beta[..., 0] * (b - b_prev), \
                f + beta * (f - f_prev)
            da, db, df = step(ya, yb, yf)
            na, nb, nf = ya - da, yb - db, yf - df
            nF = objective(nf, na)
            bad = nF > F
            if bool(bad.any()):
                ra, rb, rf = step(a, b, f)
                badv = bad.unsqueeze(-1)
                na = torch.where(badv, a - ra, na)
                nb = torch.where(bad, b - rb, nb)
                nf = torch.where(badv, f - rf, nf)
                nF = torch.where(bad, objective(nf, na), nF)
                t_new = torch.where(bad, torch.ones_like(t_new), t_new)
            move = (nf - f).abs().amax(-1)
            frozen = stage_done.unsqueeze(-1)
            a_prev, b_prev, f_prev = a, b, f
            a = torch.where(frozen, a, na)
            b = torch.where(stage_done, b, nb)
            f = torch.where(frozen, f, nf)
            F = torch.where(stage_done, F, nF)
            t = t_new
            iters[w] += (~stage_done).long()
            if record:
                hist.append(float(F[0]))
            stage_done = stage_done | (move <= tol)
            if bool(stage_done.all()):
                pos = pos[:0]
                break
            pos = (~stage_done).nonzero()[:, 0]
        a_all[w], b_all[w], f_all[w] = a, b, f
        converged[w] = stage_done
        if exact:
            w = w_stage
            ce, be, ok = _exact_kkt(K.reshape(nk, n, n)[kidx[w]], y_all[w], y_all[w] - f_all[w],
                                    lam_all[w], tau_all[w], dlt, fit_intercept, n)
            new = ok & ~is_exact[w]
            coef_exact[w] = torch.where(new.unsqueeze(-1), ce, coef_exact[w])
            b_exact[w] = torch.where(new, be, b_exact[w])
            is_exact[w] = is_exact[w] | ok
        if bool(is_exact.all()) or dlt / 4 < delta_min:
            break
        dlt /= 4
    coef_s = torch.bmm(U_f[kidx], a_all.unsqueeze(-1))[..., 0]
    coef = torch.where(is_exact.unsqueeze(-1), coef_exact, coef_s).reshape(*batch, n)
    b = torch.where(is_exact, b_exact, b_all).reshape(batch)
    is_exact = is_exact.reshape(batch)
    converged = converged.reshape(batch) | is_exact
    obj = quantile_objective(K, y.expand(*batch, n), coef, b, lam.expand(batch), tau.expand(batch))
    return QuantileAPGResult(coef, b, obj, is_exact, converged, total, dlt, hist,
                             iters.reshape(batch))
