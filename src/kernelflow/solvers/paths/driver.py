"""The drivers of the path rules: the reference loop and the choice of a fast backend.

:func:`rule_path` is the reference: ``alpha_{k+1} = alpha_k + gamma (alpha_k - alpha_{k-1}) +
eta W direction(r_k)`` from alpha_0 = 0 (gamma the rule's momentum, 0 for most rules), with
r = y - K alpha kept up to date by one product with K per step (``K alpha`` and
``K_eval alpha`` are running sums), an optional evaluation operator and a callback that sees
every iterate (a monitor, a recorder). :func:`run_path` runs a rule on the fast backend it
declares (its specialised loop of :mod:`.single`: flipped-sign updates, single kernel
columns, the spectral form, the compiled loops), else on the reference; :func:`step_size`
resolves the step as the rule says.
"""

from __future__ import annotations

import torch

from ...linalg import symmetric_eigh
from ...utils._progress import progress
from ._common import (
    Callback,
    DivergenceError,
    PathResult,
    _after_step,
    _check_eta,
    _path_result,
    _prepare,
    _resumed,
    _sample_weight,
)
from ._operator import batch_matmul
from .rules import (
    BACKEND_OPTIONS,
    PathRule,
    as_rule,
    largest_eigenvalue,
    weighted_largest_eigenvalue,
)

__all__ = ["rule_path", "run_path", "step_size"]


def rule_path(rule: PathRule, K, y: torch.Tensor, *, learning_rate="auto", max_iter: int = 1000,
              K_eval=None, callback: Callback | None = None, sample_weight=None,
              tol: float = 0.0, record_path: bool = False, verbose: int = 0,
              state: dict | None = None) -> PathResult:
    """Run ``rule`` from alpha = 0 for up to ``max_iter`` steps (the reference of every
    backend; momentum and sample weights included).

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
    state : dict, optional
        Kept up to date after each step with ``k`` and the loop's tensors (references, not
        copies); a ``state`` given holding them continues the run from step ``k`` with the
        steps an uninterrupted run takes, the callback not called again for the steps before
        (how a checkpoint resumes a path; ``record_path`` then holds this run's iterates).

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
    s_max = None
    if learning_rate == "auto" or rule.bounded:
        s_max = largest_eigenvalue(K) if w is None else weighted_largest_eigenvalue(K, w)
    if learning_rate == "auto":
        eta = rule.learning_rate(K, y, s_max=s_max, sample_weight=w)
    else:
        eta = _check_eta(learning_rate)
        if s_max is not None and rule.bounded:
            rule.check_learning_rate(eta, s_max)
    B = Y.shape[0]
    saved = _resumed(state, ("alpha", "F", "alpha_prev", "F_prev", "R", "E"))
    if saved is None:
        k, alpha, F = 0, torch.zeros_like(Y), torch.zeros_like(Y)
        alpha_prev, F_prev = alpha, F
        R = Y.clone()
        E = None if Em is None else torch.zeros(B, Em.shape[0], dtype=Y.dtype, device=Y.device)
    else:
        k, alpha, F, alpha_prev, F_prev, R, E = saved
    sq = None if w is None else w.sqrt()
    y_norm = torch.linalg.vector_norm(Y if sq is None else sq * Y, dim=-1)
    limit = 1e6 * (y_norm + 1)
    path = [alpha.clone()] if record_path else None
    stopped = saved is None and callback is not None and bool(callback(0, alpha, R, E))
    bar = progress(total=max_iter, desc=f"{rule.name} path", verbose=verbose,
                   upper_bound=callback is not None or tol > 0)  # may stop early
    while not stopped and k < max_iter:
        r_norm = torch.linalg.vector_norm(R if sq is None else sq * R, dim=-1)
        if tol > 0 and bool((r_norm <= tol * y_norm).all()):
            break
        D = _increment(rule, R, F, F_prev, alpha, alpha_prev, eta, w)
        if rule.momentum:
            alpha_prev, F_prev = alpha, F
        alpha = alpha + D
        F = F + batch_matmul(Km, D)
        if E is not None:
            E = E + batch_matmul(Em, D)
        R = Y - F
        k += 1
        bar.update()
        r_norm = torch.linalg.vector_norm(R if sq is None else sq * R, dim=-1)
        if not bool(torch.isfinite(r_norm).all()) or bool((r_norm > limit).any()):
            bar.close()
            raise DivergenceError(f"the {rule.name} path diverged at iteration {k} with "
                                  f"learning_rate={eta:.4g}; lower it or use 'auto'.")
        if _after_step(k, alpha, R, E, path, callback, state, F=F, alpha_prev=alpha_prev,
                       F_prev=F_prev):
            stopped = True
    bar.close()
    return _path_result(alpha, R, E, y, k, eta, path, stopped)


def _increment(rule: PathRule, R, F, F_prev, alpha, alpha_prev, eta: float, w):
    """``gamma (alpha - alpha_prev) + eta W direction(look)``, look = r (heavy ball) or
    r - gamma K (alpha - alpha_prev) (Nesterov)."""
    gamma = rule.momentum
    look = R - gamma * (F - F_prev) if gamma and rule.nesterov else R
    D = rule.direction(look)
    D = eta * D if w is None else (eta * w) * D
    return gamma * (alpha - alpha_prev) + D if gamma else D


def run_path(rule, K, y: torch.Tensor, *, sample_weight: torch.Tensor | None = None,
             **kwargs) -> PathResult:
    """Run ``rule`` on the fastest route it declares: its specialised single path (declared
    ``"single"``, and ``"weighted"`` when ``sample_weight`` is given), else :func:`rule_path`.

    ``kwargs`` are those of :func:`rule_path` plus the backend options of the single paths
    (``method``, ``eigh``, ``incremental``), which only choose how the path is computed and
    which the reference driver ignores.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.solvers.paths.rules import HuberRule, SignRule
    >>> K = torch.eye(2, dtype=torch.float64); y = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> run_path(SignRule(), K, y, sample_weight=torch.tensor([2.0, 1.0], dtype=torch.float64),
    ...          learning_rate=0.1, max_iter=3).alpha.numpy().round(2)  # row 1 moves twice as fast
    array([ 0.6, -0.3])
    >>> run_path(HuberRule(0.5), K, y, learning_rate=0.5, max_iter=1).alpha.numpy().round(2)
    array([ 0.25, -0.25])
    """
    rule = as_rule(rule)
    if rule.supports("single" if sample_weight is None else "weighted"):
        return rule.single_path(K, y, sample_weight=sample_weight, **kwargs)
    for key in BACKEND_OPTIONS:
        kwargs.pop(key, None)
    return rule_path(rule, K, y, sample_weight=sample_weight, **kwargs)


def step_size(rule: PathRule, K, y: torch.Tensor, learning_rate="auto", *,
              sample_weight: torch.Tensor | None = None,
              eigh_ok: bool = False) -> tuple[float, tuple | None]:
    """The step of ``rule`` on K: its automatic step, or ``learning_rate`` checked against its
    bound when it has one (``DivergenceError`` if too large).

    s_max(K) (with weights, of W^1/2 K W^1/2) is computed only for a bounded rule: from an
    eigendecomposition when ``eigh_ok`` and the rule declares ``"eigenbasis"`` (returned, for
    its path to reuse), else by :func:`largest_eigenvalue`. Returns ``(eta, eigh or None)``.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.solvers.paths.rules import GradientRule
    >>> eta, eigh = step_size(GradientRule(), 4 * torch.eye(2, dtype=torch.float64),
    ...                       torch.ones(2, dtype=torch.float64), eigh_ok=True)
    >>> eta, eigh[0].tolist()
    (0.25, [4.0, 4.0])
    """
    w = sample_weight
    eigh = None
    s_max = None
    if rule.bounded:
        if eigh_ok and rule.supports("eigenbasis"):
            sq = None if w is None else w.sqrt()
            eigh = symmetric_eigh(K if sq is None else sq[:, None] * K * sq[None, :])
            s_max = float(eigh[0][-1])
        else:
            s_max = largest_eigenvalue(K) if w is None else weighted_largest_eigenvalue(K, w)
    if learning_rate == "auto":
        eta = rule.learning_rate(K, y, s_max=s_max,
                                 sample_weight=None if w is None else w.to(K.dtype))
    else:
        eta = float(learning_rate)
        if s_max is not None:
            rule.check_learning_rate(eta, s_max)
    return eta, eigh
