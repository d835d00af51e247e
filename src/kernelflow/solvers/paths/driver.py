"""The tensor-loop driver: any :class:`~.rules.PathRule` over a batch of problems.

``alpha_{k+1} = alpha_k + eta W direction(r_k)`` from alpha_0 = 0, with r = y - K alpha kept up
to date by one product with K per step (``K alpha`` and ``K_eval alpha`` are running sums), an
optional evaluation operator and a callback that sees every iterate (a monitor, a recorder).
The specialised loops of :mod:`.single` (flipped-sign updates, single kernel columns, the
spectral closed form, the compiled loops) are faster backends of the same rules.
"""

from __future__ import annotations

import torch

from ...utils._progress import progress
from ._common import (
    Callback,
    DivergenceError,
    PathResult,
    _after_step,
    _check_eta,
    _path_result,
    _prepare,
    _sample_weight,
)
from .rules import PathRule, as_rule, largest_eigenvalue, weighted_largest_eigenvalue

__all__ = ["rule_path"]


def rule_path(rule: PathRule, K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000,
              K_eval=None, callback: Callback | None = None, sample_weight=None,
              tol: float = 0.0, record_path: bool = False, verbose: int = 0) -> PathResult:
    """Run ``rule`` from alpha = 0 for up to ``max_iter`` steps.

    Parameters
    ----------
    rule : PathRule or str
    K : tensor of shape (n, n) or KernelOperator
    y : tensor of shape (n,) or (n, t)
    learning_rate : float or "auto", default="auto"
        "auto" is the rule's automatic step (with weights, computed on W^1/2 K W^1/2, the
        matrix of the repeated-row problem); a float is checked against the rule's bound.
    max_iter : int, default=1000
    K_eval : tensor of shape (m, n) or KernelOperator, optional
        Its product with alpha is carried along and passed to the callback.
    callback : callable, optional
        ``callback(k, alpha, r, K_eval alpha)`` in batch layout (t, n); True stops the run.
    sample_weight : tensor of shape (n,), optional
        Positive weights: row i's update is scaled by w_i (an integer weight acts as repeating
        the row).
    tol : float, default=0.0
        Stop once ||W^1/2 r|| <= tol ||W^1/2 y||.
    record_path : bool, default=False
    verbose : int, default=0

    Returns
    -------
    PathResult

    Examples
    --------
    >>> import torch
    >>> from kernelflow.solvers.paths.rules import HuberRule
    >>> res = rule_path(HuberRule(0.5), torch.eye(2, dtype=torch.float64),
    ...                 torch.tensor([0.2, 5.0], dtype=torch.float64), learning_rate=0.5,
    ...                 max_iter=2)
    >>> res.alpha.numpy().round(3)  # the large residual is clipped at epsilon
    array([0.15, 0.5 ])
    """
    rule = as_rule(rule)
    Km, Y, Em = _prepare(K, y, K_eval)
    n = Km.shape[0]
    w = _sample_weight(sample_weight, n, Y.dtype, Y.device)
    bounded = rule.max_step(1.0) < float("inf")
    s_max = None
    if learning_rate == "auto" or bounded:
        s_max = largest_eigenvalue(K) if w is None else weighted_largest_eigenvalue(K, w)
    if learning_rate == "auto":
        eta = rule.learning_rate(K, y, s_max=s_max, sample_weight=w)
    else:
        eta = _check_eta(learning_rate)
        if bounded:
            rule.check_learning_rate(eta, s_max)
    B = Y.shape[0]
    alpha = torch.zeros_like(Y)
    F = torch.zeros_like(Y)
    R = Y.clone()
    E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
    sq = None if w is None else w.sqrt()
    y_norm = torch.linalg.vector_norm(Y if sq is None else sq * Y, dim=-1)
    limit = 1e6 * (y_norm + 1)
    path = [alpha.clone()] if record_path else None
    stopped = callback is not None and bool(callback(0, alpha, R, E))
    k = 0
    bar = progress(total=max_iter, desc=f"{rule.name} path", verbose=verbose,
                   upper_bound=callback is not None or tol > 0)  # may stop early
    while not stopped and k < max_iter:
        r_norm = torch.linalg.vector_norm(R if sq is None else sq * R, dim=-1)
        if tol > 0 and bool((r_norm <= tol * y_norm).all()):
            break
        D = rule.direction(R)
        D = eta * D if w is None else (eta * w) * D
        alpha = alpha + D
        F = F + Km.rmatmul(D)
        if E is not None:
            E = E + Em.rmatmul(D)
        R = Y - F
        k += 1
        bar.update()
        r_norm = torch.linalg.vector_norm(R if sq is None else sq * R, dim=-1)
        if not bool(torch.isfinite(r_norm).all()) or bool((r_norm > limit).any()):
            bar.close()
            raise DivergenceError(f"the {rule.name} path diverged at iteration {k} with "
                                  f"learning_rate={eta:.4g}; lower it or use 'auto'.")
        if _after_step(k, alpha, R, E, path, callback):
            stopped = True
    bar.close()
    return _path_result(alpha, R, E, y, k, eta, path, stopped)
