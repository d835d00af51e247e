"""The single paths from alpha = 0: gradient, sign and coordinate descent."""

from __future__ import annotations

import numpy as np
import torch

from ...operators import LinearOperator, ScaledOperator
from ...utils._progress import progress
from .. import _native
from ._common import (
    SPECTRAL_MAX_N,
    Callback,
    DivergenceError,
    PathResult,
    _after_step,
    _check_eta,
    _out,
    _path_result,
    _prepare,
    _resumed,
    _sample_weight,
)
from ._operator import (
    batch_matmul,
    column,
    columns_t,
    dense_matrix,
    fits,
    path_operator,
)
from ._steps import (
    _scaled_largest_eigenvalue,
    check_gradient_learning_rate,
    coordinate_learning_rate,
    coordinate_moves,
    gradient_learning_rate,
    sign_learning_rate,
)
from .spectral import _gd_spectral

__all__ = ["gradient_descent_path", "sign_gradient_path", "coordinate_descent_path"]


def _native_path(method: str, Km: LinearOperator, Y: torch.Tensor, Em: LinearOperator | None,
                 y: torch.Tensor, eta: float, max_iter: int, name: str) -> PathResult | None:
    """The whole path in compiled code (one problem per target), or None where it cannot run.

    Used for a dense symmetric K on the CPU when no callback, recording or tolerance needs the
    iterates: the same update rules, with K alpha kept as a running sum (see
    :mod:`._native`); the residual returned is recomputed as y - K alpha.
    """
    dense = dense_matrix(Km)
    if dense is None or not _native.available(method, dense):
        return None
    B, n = Y.shape
    ones = torch.ones(1, n, dtype=Y.dtype)
    _, _, n_iter, alpha = _native.run_problems(
        method, dense.unsqueeze(0), Y, ones, torch.zeros_like(ones), np.zeros(B),
        np.arange(B), np.zeros(B), eta=eta, max_iter=max_iter, return_alpha=True)
    R = Y - batch_matmul(Km, alpha)
    if not bool(torch.isfinite(R).all()):
        raise DivergenceError(f"{name} produced a non-finite residual.")
    E = None if Em is None else batch_matmul(Em, alpha)
    return PathResult(
        alpha=_out(alpha, y), residual=_out(R, y), n_iter=int(n_iter.max(initial=0)),
        learning_rate=eta, path=None, eval_predictions=None if E is None else _out(E, y),
        stopped_by_callback=False,
    )



def gradient_descent_path(
    K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000, momentum: float = 0.0,
    nesterov: bool = False, method: str = "auto", K_eval=None, callback: Callback | None = None,
    record_path: bool = False, tol: float = 0.0, eigh: tuple | None = None,
    sample_weight: torch.Tensor | None = None, verbose: int = 0, state: dict | None = None,
) -> PathResult:
    """Kernel gradient descent from alpha_0 = 0: ``alpha_{k+1} = alpha_k + eta (y - K alpha_k)``.

    With ``momentum`` gamma: ``alpha_{k+1} = alpha_k + gamma v_k + eta (y - K(alpha_k +
    [nesterov] gamma v_k))``, v_k = alpha_k - alpha_{k-1} (Remark 4.2; the flow limit is gradient
    flow at time t / (1 - gamma)).

    Parameters
    ----------
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    learning_rate : float or "auto", default="auto"
        "auto" is 1 / s_max(K) (:func:`gradient_learning_rate`).
    max_iter : int, default=1000
    momentum : float in [0, 1), default=0.0
    nesterov : bool, default=False
    method : {"auto", "spectral", "iterative"}, default="auto"
        "spectral" diagonalises K once (O(n^3)) and then gives every iterate in O(n^2) with no
        error accumulation (momentum runs its recurrence in the eigenbasis at O(n) per step);
        "iterative" costs one product with K per step and works matrix-free. "auto" picks
        spectral when K fits in memory and n <= 2000.
    K_eval : tensor of shape (m, n) or KernelOperator, optional
        Evaluation kernel (e.g. validation rows); ``K_eval @ alpha_k`` is passed to the callback.
    callback : callable, optional
        ``callback(k, alpha_k, r_k, f_eval_k)`` after every iterate, k = 0 (alpha = 0), 1, ...;
        tensors in batch layout (t, n) / (t, m). Returning True stops the run.
    record_path : bool, default=False
        Keep every iterate in ``PathResult.path``.
    tol : float, default=0.0
        Stop once ||r_k||_2 <= tol ||y||_2.
    eigh : tuple (s, U), optional
        A precomputed eigendecomposition of K (``kernelflow.linalg.symmetric_eigh``) for the
        spectral method; with ``sample_weight``, that of W^1/2 K W^1/2.
    sample_weight : tensor of shape (n,), optional
        Positive finite weights w: ``alpha += eta W r`` (an integer weight acts as repeating
        the row). With beta = W^-1/2 alpha this is plain gradient descent on
        M = W^1/2 K W^1/2 with targets W^1/2 y, so the spectral form, the momentum and the
        bound eta < 2 / s_max(M) carry over; ``tol`` then compares ||W^1/2 r|| with
        ||W^1/2 y|| and "auto" is 1 / s_max(M).
    verbose : int, default=0
    state : dict, optional
        The loop's state, kept up to date and resumed as in
        :func:`~kernelflow.solvers.paths.driver.rule_path` (how a checkpoint resumes a path);
        the iterative method only ("auto" then picks it).

    Returns
    -------
    PathResult

    Raises
    ------
    DivergenceError
        If the residual grows (plain GD: above ||y||, which cannot happen for eta <= 2 / s_max),
        or becomes non-finite.

    Notes
    -----
    Closed form of the discrete iteration: alpha_k = (I - (I - eta K)^k) K^-1 y. Cost: spectral
    O(n^3) once plus O(n^2) per visited iterate; iterative one K-product per step.

    Examples
    --------
    >>> import torch
    >>> K = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> res = gradient_descent_path(K, torch.tensor([1.0, 0.0], dtype=torch.float64),
    ...                             max_iter=200)
    >>> res.alpha.numpy().round(3)  # -> K^-1 y
    array([ 1.333, -0.667])
    """
    Km, Y, Em = _prepare(K, y, K_eval)
    if not 0.0 <= float(momentum) < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
    if method not in ("auto", "spectral", "iterative"):
        raise ValueError(f"method must be 'auto', 'spectral' or 'iterative', got {method!r}.")
    if method == "spectral" and state is not None:
        raise ValueError("a path resumed from a state runs method='iterative'.")
    if sample_weight is not None:
        return _weighted_gradient_path(
            K, y, sample_weight, learning_rate=learning_rate, max_iter=max_iter,
            momentum=momentum, nesterov=nesterov, method=method, K_eval=K_eval,
            callback=callback, record_path=record_path, tol=tol, eigh=eigh, verbose=verbose,
            state=state)
    n = Km.shape[0]
    if method == "auto":
        method = "spectral" if state is None and (
            eigh is not None or (n <= SPECTRAL_MAX_N and fits(Km))) else "iterative"
    if method == "spectral":
        return _gd_spectral(Km, Y, Em, y, learning_rate, max_iter, float(momentum), nesterov,
                            callback, record_path, tol, eigh)
    eta = gradient_learning_rate(K) if learning_rate == "auto" else _check_eta(learning_rate)
    gamma = float(momentum)
    B = Y.shape[0]
    saved = _resumed(state, ("alpha", "F", "alpha_prev", "F_prev", "R", "E"))
    if saved is None:
        k, alpha, F = 0, torch.zeros_like(Y), torch.zeros_like(Y)  # F = K alpha
        F_prev, alpha_prev = F.clone(), alpha.clone()
        E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
        R = Y - F
    else:
        k, alpha, F, alpha_prev, F_prev, R, E = saved
    y_norm = torch.linalg.vector_norm(Y, dim=-1)
    limit = (1.0 + 1e-6) * y_norm + 1e-12 if gamma == 0 else 1e4 * y_norm + 1e-12
    path = [alpha.clone()] if record_path else None
    stopped = saved is None and callback is not None and bool(callback(0, alpha, R, E))
    bar = progress(total=max_iter, desc="gradient descent", verbose=verbose,
                   upper_bound=callback is not None or tol > 0)  # may stop early
    while not stopped and k < max_iter:
        if tol > 0 and bool((torch.linalg.vector_norm(R, dim=-1) <= tol * y_norm).all()):
            break
        if gamma == 0:
            delta = eta * R
        else:
            V = alpha - alpha_prev
            look = R - gamma * (F - F_prev) if nesterov else R
            delta = gamma * V + eta * look
        KD = batch_matmul(Km, delta)
        alpha_prev, F_prev = alpha, F
        alpha = alpha + delta
        F = F + KD
        if E is not None:
            E = E + batch_matmul(Em, delta)
        R = Y - F
        k += 1
        bar.update()
        r_norm = torch.linalg.vector_norm(R, dim=-1)
        if not bool(torch.isfinite(r_norm).all()) or bool((r_norm > limit).any()):
            bar.close()
            raise DivergenceError(
                f"gradient descent diverged at iteration {k} with learning_rate={eta:.4g}: the "
                f"residual norm grew from {float(y_norm.max()):.4g} to "
                f"{float(r_norm.max()):.4g}; use learning_rate <= 2 / s_max(K) or 'auto'."
            )
        if _after_step(k, alpha, R, E, path, callback, state, F=F, alpha_prev=alpha_prev,
                       F_prev=F_prev):
            stopped = True
    bar.close()
    return _path_result(alpha, R, E, y, k, eta, path, stopped)



def _weighted_gradient_path(K, y: torch.Tensor, sample_weight: torch.Tensor, *, learning_rate,
                            max_iter: int, momentum: float, nesterov: bool, method: str,
                            K_eval, callback: Callback | None, record_path: bool, tol: float,
                            eigh: tuple | None, verbose: int,
                            state: dict | None = None) -> PathResult:
    """Weighted gradient descent as plain gradient descent on M = W^1/2 K W^1/2 with targets
    W^1/2 y; alpha = W^1/2 beta (see :func:`gradient_descent_path`)."""
    w = _sample_weight(sample_weight, K.shape[0], K.dtype, y.device)
    assert w is not None
    sq = w.sqrt()
    M: torch.Tensor | LinearOperator
    Ke: torch.Tensor | LinearOperator | None
    if isinstance(K, torch.Tensor):
        M = sq[:, None] * K * sq[None, :]
        Ke = None if K_eval is None else path_operator(K_eval, "K_eval").to_dense() * sq[None, :]
    else:  # matrix-free: the scaled operator, one product with K per step
        M = ScaledOperator(K, left=sq, right=sq)
        Ke = None if K_eval is None else ScaledOperator(K_eval, right=sq)
        if learning_rate != "auto":
            check_gradient_learning_rate(_check_eta(learning_rate),
                                         _scaled_largest_eigenvalue(K, sq), momentum, nesterov)
    cb = None
    if callback is not None:
        def cb(k, beta, resid, ev):
            return callback(k, beta * sq, resid / sq, ev)
    Y2 = y.reshape(y.shape[0], -1).to(K.dtype)
    res = gradient_descent_path(M, (sq[:, None] * Y2).reshape(y.shape),
                                learning_rate=learning_rate, max_iter=max_iter,
                                momentum=momentum, nesterov=nesterov, method=method,
                                K_eval=Ke, callback=cb, tol=tol, eigh=eigh,
                                record_path=record_path, verbose=verbose, state=state)
    scale = sq if y.ndim == 1 else sq[:, None]
    return PathResult(alpha=res.alpha * scale, residual=res.residual / scale,
                      n_iter=res.n_iter, learning_rate=res.learning_rate,
                      path=None if res.path is None else res.path * scale,
                      eval_predictions=res.eval_predictions,
                      stopped_by_callback=res.stopped_by_callback)


# ---- sign gradient descent ----
def sign_gradient_path(
    K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000, K_eval=None,
    callback: Callback | None = None, record_path: bool = False, incremental: bool = True,
    tol: float = 0.0, sample_weight: torch.Tensor | None = None, verbose: int = 0,
    state: dict | None = None,
) -> PathResult:
    """Kernel sign gradient descent from alpha_0 = 0: ``alpha_{k+1} = alpha_k + eta sign(r_k)``.

    sign(0) = 0, so a coordinate whose residual is exactly zero does not move. Every alpha_i moves
    by exactly 0 or eta per step, so ||alpha_k||_inf <= k eta (Prop 5.1: the path of the
    l-infinity constrained problem with radius t = k eta when K is diagonal). With sample weights
    the step is ``alpha += eta W sign(r)``, W = diag(w): |alpha_i| <= k eta w_i, and an integer
    weight acts as repeating the row.

    Parameters
    ----------
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    learning_rate : float or "auto", default="auto"
        "auto" is :func:`sign_learning_rate`; the paper uses 0.01.
    max_iter : int, default=1000
    K_eval, callback, record_path, verbose
        As in :func:`gradient_descent_path`.
    incremental : bool, default=True
        Keep q = K sign(r) and update it with the rows of K where a sign flipped (O(n) per flip)
        instead of a full product per step (O(n^2)); a full product is used when more than a
        quarter of the signs flip.
    tol : float, default=0.0
        Stop once ||W^1/2 r_k||_2 <= tol ||W^1/2 y||_2 (W = I without weights).
    sample_weight : tensor of shape (n,), optional
        Positive finite weights. "auto" then is the step of the repeated-row problem
        (:func:`sign_learning_rate` with the weights).
    state : dict, optional
        The loop's state (with the running products K W sign(r)), kept up to date and resumed
        as in :func:`~kernelflow.solvers.paths.driver.rule_path`.

    Returns
    -------
    PathResult

    Examples
    --------
    >>> import torch
    >>> res = sign_gradient_path(torch.eye(3, dtype=torch.float64),
    ...                          torch.tensor([0.3, -1.0, 0.0], dtype=torch.float64),
    ...                          learning_rate=0.1, max_iter=5)
    >>> res.alpha.numpy().round(2)  # clip(y, t = 0.5); sign(0) = 0 keeps alpha_3 at 0
    array([ 0.3, -0.5,  0. ])
    """
    Km, Y, Em = _prepare(K, y, K_eval)
    n = Km.shape[0]
    w = _sample_weight(sample_weight, n, Y.dtype, Y.device)
    eta = sign_learning_rate(K, y, sample_weight=w) if learning_rate == "auto" else \
        _check_eta(learning_rate)
    if (callback is None and not record_path and incremental and tol == 0 and w is None
            and state is None):
        fast = _native_path("sign", Km, Y, Em, y, eta, max_iter, "sign gradient descent")
        if fast is not None:
            return fast
    B = Y.shape[0]
    sq = None if w is None else w.sqrt()
    ew = None if w is None else eta * w  # the step of each row
    saved = _resumed(state, ("alpha", "R", "S", "Q", "E", "QE"))
    if saved is None:
        k, alpha, R = 0, torch.zeros_like(Y), Y.clone()
        S = torch.sign(R)
        Q = batch_matmul(Km, S if w is None else S * w)  # K W sign(r), batch layout
        E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
        QE = None if Em is None else batch_matmul(Em, S if w is None else S * w)
    else:
        k, alpha, R, S, Q, E, QE = saved
    path = [alpha.clone()] if record_path else None
    stopped = saved is None and callback is not None and bool(callback(0, alpha, R, E))
    y_norm = torch.linalg.vector_norm(Y if sq is None else sq * Y, dim=-1)
    bar = progress(total=max_iter, desc="sign gradient descent", verbose=verbose,
                   upper_bound=callback is not None or tol > 0)  # may stop early
    while not stopped and k < max_iter:
        if tol > 0 and bool((torch.linalg.vector_norm(R if sq is None else sq * R, dim=-1)
                             <= tol * y_norm).all()):
            break
        if w is None:  # in place
            alpha = alpha.add_(S, alpha=eta) if path is None else alpha + eta * S
            R.sub_(Q, alpha=eta)
            if E is not None and QE is not None:
                E.add_(QE, alpha=eta)
        else:
            assert ew is not None
            alpha = alpha + ew * S
            R = R - eta * Q
            if E is not None and QE is not None:
                E = E + eta * QE
        k += 1
        bar.update()
        S_new = torch.sign(R)
        changed = (S_new != S).any(dim=0) if B > 1 else (S_new[0] != S[0])
        idx = torch.nonzero(changed).reshape(-1)
        if idx.numel():
            if not incremental or idx.numel() * 4 > n:
                Q = batch_matmul(Km, S_new if w is None else S_new * w)
                if QE is not None:
                    QE = batch_matmul(Em, S_new if w is None else S_new * w)
            else:
                dS = (S_new - S)[:, idx]  # (B, |D|)
                if w is not None:
                    dS = dS * w[idx]
                Q = Q + dS @ columns_t(Km, idx)
                if QE is not None:
                    QE = QE + dS @ columns_t(Em, idx)
            S = S_new
        if _after_step(k, alpha, R, E, path, callback, state, S=S, Q=Q, QE=QE):
            stopped = True
    bar.close()
    if not bool(torch.isfinite(R).all()):
        raise DivergenceError("sign gradient descent produced a non-finite residual.")
    return _path_result(alpha, R, E, y, k, eta, path, stopped)


# ---- coordinate descent ----
def coordinate_descent_path(
    K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000, K_eval=None,
    callback: Callback | None = None, record_path: bool = False, tol: float = 0.0,
    sample_weight: torch.Tensor | None = None, verbose: int = 0, state: dict | None = None,
) -> PathResult:
    """Kernel coordinate descent (forward stagewise) from alpha_0 = 0.

    ``alpha_{k+1} = alpha_k + eta I_inf(r_k)``: every coordinate attaining max |r| moves by
    eta sign(r_m); the residual is updated with those kernel columns only, O(n) per step
    (columns of a matrix-free K are computed on demand, O(n d), and cached for revisited
    coordinates within half the memory budget). Without ties ||alpha_k||_0 <= k and
    ||alpha_k||_1 <= k eta. With sample weights a moving coordinate m moves by
    eta w_m sign(r_m), as repeating row m w_m times would (integer weights).

    Parameters
    ----------
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    learning_rate : float or "auto", default="auto"
        "auto" is :func:`coordinate_learning_rate`; the paper uses 0.01.
    max_iter : int, default=1000
    tol : float, default=0.0
        Stop once max |r| <= tol max |y|.
    sample_weight : tensor of shape (n,), optional
        Positive finite weights; "auto" is the same step as without them.
    K_eval, callback, record_path, verbose, state
        As in :func:`gradient_descent_path`.

    Returns
    -------
    PathResult

    Examples
    --------
    >>> import torch
    >>> res = coordinate_descent_path(torch.eye(3, dtype=torch.float64),
    ...                               torch.tensor([0.3, -1.0, 0.05], dtype=torch.float64),
    ...                               learning_rate=0.1, max_iter=9)
    >>> res.alpha.numpy().round(2)  # soft-thresholding of y: sparse
    array([ 0.1, -0.8,  0. ])
    """
    Km, Y, Em = _prepare(K, y, K_eval)
    if dense_matrix(Km) is None:
        Km = path_operator(K, cache_columns=True)
    if Em is not None and dense_matrix(Em) is None:
        Em = path_operator(K_eval, "K_eval", cache_columns=True)
    w = _sample_weight(sample_weight, Km.shape[0], Y.dtype, Y.device)
    eta = coordinate_learning_rate(K, y) if learning_rate == "auto" else \
        _check_eta(learning_rate)
    if callback is None and not record_path and tol == 0 and w is None and state is None:
        fast = _native_path("coordinate", Km, Y, Em, y, eta, max_iter, "coordinate descent")
        if fast is not None:
            return fast
    B = Y.shape[0]
    saved = _resumed(state, ("alpha", "R", "E"))
    if saved is None:
        k, alpha, R = 0, torch.zeros_like(Y), Y.clone()
        E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
    else:
        k, alpha, R, E = saved
    y_max = Y.abs().amax(dim=-1)
    path = [alpha.clone()] if record_path else None
    stopped = saved is None and callback is not None and bool(callback(0, alpha, R, E))
    bar = progress(total=max_iter, desc="coordinate descent", verbose=verbose,
                   upper_bound=True)  # stops early at a zero residual too
    tol_level = float(tol * y_max.max()) if B == 1 else 0.0
    while not stopped and k < max_iter:
        if B == 1 and w is None:
            # One target: argmax and one kernel column, O(n) with a handful of operations.
            a0 = R[0].abs()
            m = int(torch.argmax(a0))
            top = float(a0[m])
            if top == 0.0 or (tol > 0 and top <= tol_level):
                break
            if int((a0 == top).sum()) == 1:
                step = eta if float(R[0, m]) > 0 else -eta
                alpha[0, m] += step
                R[0].sub_(column(Km, m), alpha=step)
                if E is not None:
                    E[0].add_(column(Em, m), alpha=step)
                k += 1
                bar.update()
                if _after_step(k, alpha, R, E, path, callback, state):
                    stopped = True
                continue
        moves = coordinate_moves(R, tol, y_max)
        if moves is None:  # residual exactly zero (or below tol): the path has stopped
            break
        mask, idx = moves
        step_m = eta if w is None else eta * w[idx]
        delta = step_m * torch.sign(R[:, idx]) * mask[:, idx]  # (B, |D|)
        alpha[:, idx] += delta
        R = R - delta @ columns_t(Km, idx)
        if E is not None:
            E = E + delta @ columns_t(Em, idx)
        k += 1
        bar.update()
        if _after_step(k, alpha, R, E, path, callback, state):
            stopped = True
    bar.close()
    if not bool(torch.isfinite(R).all()):
        raise DivergenceError("coordinate descent produced a non-finite residual.")
    return _path_result(alpha, R, E, y, k, eta, path, stopped)
