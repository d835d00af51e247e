"""Early stopping as regularisation: validation-monitored paths with patience.

A path from alpha = 0 visits every regularisation strength in one run (training time t = k eta
plays the role of 1 / lambda). The stopping time is chosen on held-out rows: after each iterate
the validation mean squared error of ``K_val alpha_k`` is computed (incrementally by the path
functions), the best value and its iteration are remembered, and the run ends after
``n_iter_no_change`` consecutive iterates without an improvement of more than ``tol`` (Allerbo,
Sec. 6: patience 100). The estimators then refit on all rows for the chosen number of steps.

Every path runs through :func:`~kernelflow.solvers.paths.driver.run_path`, which asks the rule
for its fast backends (:mod:`kernelflow.solvers.paths.rules`). Sample weights scale each row's
update so that an integer weight acts as repeating the row; the validation rows are chosen by
:func:`validation_weights` (whole distinct inputs, independent of row order) and the monitored
loss (:func:`validation_loss`: squared, the paper's choice, or absolute, robust to outlying
validation responses) is weighted.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..collectives import all_reduce_sum, is_distributed
from ..linalg import symmetric_eigh
from ..operators import KernelOperator, LinearOperator, Options
from ..utils.checkpoint import Checkpoint, tensor_digest
from ..utils.holdout import holdout_weights as validation_weights
from ..utils.holdout import row_content_hash
from ..utils.monitor import EarlyStopping
from .losses import RESIDUAL_LOSSES, get_residual_loss
from .paths import SPECTRAL_MAX_N, PathResult, spectral_filter
from .paths.driver import run_path, step_size
from .paths.resume import PathCheckpoint
from .paths.rules import PathRule, as_rule
from .paths.rules import huber_epsilon as _huber_epsilon

__all__ = [
    "EarlyStopping",
    "EarlyStoppingResult",
    "validation_weights",
    "row_content_hash",
    "validation_mse",
    "validation_loss",
    "weighted_path",
    "early_stopped_path",
    "PathFit",
    "fit_path",
]


@dataclass
class EarlyStoppingResult:
    """Outcome of :func:`early_stopped_path`.

    Attributes
    ----------
    best_iteration : int
        Number of steps with the lowest validation loss (0 means alpha = 0).
    best_loss : float
    n_iter : int
        Steps actually run (best_iteration + patience, or max_iter).
    learning_rate : float
    best_alpha : tensor
        Coefficients at ``best_iteration`` (fitted on the training part only).
    validation_losses : tensor of shape (n_iter + 1,)
    """

    best_iteration: int
    best_loss: float
    n_iter: int
    learning_rate: float
    best_alpha: torch.Tensor
    validation_losses: torch.Tensor = field(repr=False)


LOSSES = tuple(RESIDUAL_LOSSES)


def _rule_with_options(path_function, path_kwargs: dict[str, Any]) -> tuple[PathRule, dict]:
    """The rule of ``path_function`` with the options among ``path_kwargs`` (e.g. ``momentum``)
    moved into it; the rest are the path's own arguments."""
    rule = as_rule(path_function)
    options = {key: path_kwargs.pop(key) for key in list(path_kwargs) if key in rule.option_names}
    return rule.with_options(**options), path_kwargs


def _check_loss(loss: str) -> str:
    return get_residual_loss(loss, what="validation_loss").name


def validation_mse(predictions: torch.Tensor, y_val: torch.Tensor) -> torch.Tensor:
    """Mean squared error over all entries; sums are reduced across processes.

    Examples
    --------
    >>> float(validation_mse(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])))
    2.0
    """
    return validation_loss(predictions, y_val)


def validation_loss(predictions: torch.Tensor, y_val: torch.Tensor,
                    weight: torch.Tensor | None = None, loss: str = "squared") -> torch.Tensor:
    """Weighted mean of the squared, absolute or Huber errors over the last two dimensions.

    ``predictions`` has shape (..., B, m) or (m,) and ``y_val`` broadcasts to it; ``weight`` (m,)
    weighs the validation rows (None: all 1). Returns sum w_i e_i / (B sum w_i) with
    e = (f - y)^2 (``"squared"``, the paper's MSE), |f - y| (``"absolute"``, robust to
    outlying validation responses) or Huber's loss of f - y (``"huber"``: d^2 / 2 for
    |d| <= epsilon, epsilon (|d| - epsilon / 2) beyond, with epsilon 1.345 times the robust
    scale 1.4826 MAD of ``y_val``); sums are reduced across processes. Cost O(B m).

    Examples
    --------
    >>> p, yv = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])
    >>> float(validation_loss(p, yv, torch.tensor([1.0, 3.0]))), float(validation_loss(p, yv,
    ...                                                                 loss="absolute"))
    (3.0, 1.0)
    """
    diff = (predictions - y_val).to(torch.float64)
    if diff.ndim == 1:
        diff = diff.unsqueeze(0)
    err = _elementwise_loss(diff, y_val, _check_loss(loss))
    B, m = err.shape[-2], err.shape[-1]
    if weight is None:
        num, den = err.sum(dim=(-2, -1)), torch.tensor(float(B * m), dtype=torch.float64)
    else:
        wt = weight.to(device=err.device, dtype=torch.float64)
        num, den = (err * wt).sum(dim=(-2, -1)), B * wt.sum()
    if is_distributed():
        num, den = all_reduce_sum(num), all_reduce_sum(den.to(num.device))
    return num / den.to(num.device).clamp_min(torch.finfo(torch.float64).tiny)


def _elementwise_loss(diff: torch.Tensor, y_val: torch.Tensor, loss: str) -> torch.Tensor:
    lf = get_residual_loss(loss, what="validation_loss")
    return lf.error(diff, _huber_epsilon(y_val) if lf.needs_threshold else None)


def weighted_path(path_function: Callable | PathRule | str, K, y: torch.Tensor,
                  sample_weight: torch.Tensor, **kwargs: Any) -> PathResult:
    """Deprecated: a path with positive sample weights is
    :func:`~kernelflow.solvers.paths.driver.run_path` with ``sample_weight``.

    Each rule is the one that repeating row i ``w_i`` times gives for integer weights (see
    :func:`~kernelflow.solvers.paths.gradient_descent_path`,
    :func:`~kernelflow.solvers.paths.sign_gradient_path` and
    :func:`~kernelflow.solvers.paths.coordinate_descent_path`); ``momentum`` and ``nesterov``
    among ``kwargs`` are options of the gradient rule.

    Examples
    --------
    >>> import torch, warnings
    >>> from kernelflow.solvers.paths import sign_gradient_path
    >>> K = torch.eye(2, dtype=torch.float64); y = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     res = weighted_path(sign_gradient_path, K, y,
    ...                         torch.tensor([2.0, 1.0], dtype=torch.float64),
    ...                         learning_rate=0.1, max_iter=3)
    >>> res.alpha.numpy().round(2)  # the first row moves twice as fast
    array([ 0.6, -0.3])
    """
    warnings.warn("weighted_path is deprecated; use kernelflow.solvers.paths.driver.run_path("
                  "rule, K, y, sample_weight=...).", DeprecationWarning, stacklevel=2)
    rule, kwargs = _rule_with_options(path_function, dict(kwargs))
    return run_path(rule, K, y, sample_weight=sample_weight, **kwargs)


def early_stopped_path(path_function: Callable | PathRule | str, K_train,
                       y_train: torch.Tensor, K_val, y_val: torch.Tensor, *,
                       n_iter_no_change: int = 100, tol: float = 0.0,
                       sample_weight: torch.Tensor | None = None,
                       validation_weight: torch.Tensor | None = None,
                       validation_loss: str = "squared",
                       resume: PathCheckpoint | None = None,
                       **path_kwargs) -> EarlyStoppingResult:
    """Run ``path_function`` with validation monitoring and patience; shared by all paths.

    Parameters
    ----------
    path_function : PathRule, str or callable
        A rule of :mod:`kernelflow.solvers.paths.rules`, a method name, or
        :func:`~kernelflow.solvers.paths.gradient_descent_path`,
        :func:`~kernelflow.solvers.paths.sign_gradient_path` or
        :func:`~kernelflow.solvers.paths.coordinate_descent_path`.
    K_train : tensor (n, n) or KernelOperator
    y_train : tensor (n,) or (n, t)
    K_val : tensor (m, n) or KernelOperator
        Kernel between validation and training rows.
    y_val : tensor (m,) or (m, t)
    n_iter_no_change, tol
        See :class:`EarlyStopping`.
    sample_weight : tensor of shape (n,), optional
        Positive training weights (each row's update scaled by its weight).
    validation_weight : tensor of shape (m,), optional
        Weights of the validation rows in the monitored loss.
    validation_loss : {"squared", "absolute"}, default="squared"
        Monitored loss: weighted mean squared error (the paper's choice for every method) or
        mean absolute error, which a few gross outliers among the validation rows cannot
        dominate (see :func:`validation_loss`).
    resume : PathCheckpoint, optional
        The checkpoint of the fit: the run continues from its validation phase (loop,
        monitor, best iterate) and writes that phase every interval.
    **path_kwargs
        Options of the rule (``momentum``, ...) and arguments of the path
        (``learning_rate``, ``max_iter``, ...).

    Returns
    -------
    EarlyStoppingResult

    Notes
    -----
    The validation predictions are carried along by the path (O(m) per coordinate step,
    O(m |flips|) per sign step), so monitoring adds O(m) per iteration to the path's cost.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.solvers.paths import gradient_descent_path
    >>> K = torch.eye(3, dtype=torch.float64)
    >>> res = early_stopped_path(gradient_descent_path, K, torch.ones(3, dtype=torch.float64),
    ...                          torch.zeros(1, 3, dtype=torch.float64),
    ...                          torch.ones(1, dtype=torch.float64), n_iter_no_change=3,
    ...                          learning_rate=0.5)
    >>> res.best_iteration, res.n_iter  # predictions at a new point stay 0: stop at once
    (0, 3)
    """
    _check_loss(validation_loss)
    rule, path_kwargs = _rule_with_options(path_function, dict(path_kwargs))
    monitor = EarlyStopping(n_iter_no_change, tol)
    wv = validation_weight
    if rule.supports("spectral"):
        fast = _spectral_early_stopping(rule, monitor, K_train, y_train, K_val, y_val,
                                        path_kwargs, sample_weight, wv, validation_loss)
        if fast is not None:
            return fast
        monitor = EarlyStopping(n_iter_no_change, tol)
    m = K_val.shape[0]
    Yv = y_val.reshape(m, -1).T.contiguous()  # batch layout, like the path's eval predictions
    best: dict[str, torch.Tensor] = {}
    resume_kw: dict[str, Any] = {}
    if resume is not None:
        resume.restore_validation(monitor, best)
        resume_kw = resume.run_kwargs("validation", resume.monitor_extra(monitor, best),
                                      last=path_kwargs.get("max_iter"))
    save = resume_kw.pop("callback", None)

    def callback(k, alpha, residual, eval_predictions):
        loss = validation_loss_fn(eval_predictions, Yv, wv, validation_loss)
        stop = monitor.update(k, loss)
        if monitor.best_iteration == k:
            best["alpha"] = alpha.clone()
        if save is not None and not stop:
            save()
        return stop

    res = run_path(rule, K_train, y_train, sample_weight=sample_weight, K_eval=K_val,
                   callback=callback, **resume_kw, **path_kwargs)
    alpha = best["alpha"]
    alpha = alpha.T.reshape(alpha.shape[1], *y_train.shape[1:]) if y_train.ndim == 2 else alpha[0]
    return EarlyStoppingResult(
        best_iteration=monitor.best_iteration, best_loss=monitor.best_loss, n_iter=res.n_iter,
        learning_rate=res.learning_rate, best_alpha=alpha,
        validation_losses=torch.tensor(monitor.losses, dtype=torch.float64),
    )


def _spectral_early_stopping(rule, monitor, K_train, y_train, K_val, y_val, kw, sample_weight,
                             weight, loss) -> EarlyStoppingResult | None:
    """The validation run of a rule with the spectral closed form (plain gradient descent),
    with weights as plain gradient descent on M = W^1/2 K W^1/2 with targets W^1/2 y
    (alpha = W^1/2 beta); None where the closed form does not apply."""
    Kt, yt, Kv, scale = K_train, y_train, K_val, None
    if sample_weight is not None:
        if not (isinstance(K_train, torch.Tensor) and isinstance(K_val, torch.Tensor)):
            return None
        scale = sample_weight.to(K_train.dtype).sqrt()
        Kt = scale[:, None] * K_train * scale[None, :]
        yt = y_train * (scale if y_train.ndim == 1 else scale[:, None])
        Kv = K_val * scale[None, :]
    fast = _gd_spectral_early_stopping(rule, monitor, Kt, yt, Kv, y_val, kw, weight, loss)
    if fast is not None and scale is not None:
        fast.best_alpha = fast.best_alpha * (scale if y_train.ndim == 1 else scale[:, None])
    return fast


validation_loss_fn = validation_loss


def _gd_spectral_early_stopping(rule, monitor, K_train, y_train, K_val, y_val, kw, weight=None,
                                loss="squared"):
    """Validation curve of plain GD from one eigendecomposition, in blocks of iterations.

    f_val(k) = (K_val U) diag(phi_k(s)) U^T y for a block of k at once (one GEMM) instead of a
    product per step; returns None when the closed form does not apply.
    """
    if kw.get("method", "auto") == "iterative":
        return None
    if not isinstance(K_train, torch.Tensor) or not isinstance(K_val, torch.Tensor):
        return None
    if kw.get("method", "auto") == "auto" and K_train.shape[0] > SPECTRAL_MAX_N:
        return None
    s, U = kw.get("eigh") or symmetric_eigh(K_train)
    s_max = float(s[-1]) if s.numel() else 0.0
    lr = kw.get("learning_rate", "auto")
    eta = (1.0 / s_max if s_max > 0 else 1.0) if lr == "auto" else float(lr)
    rule.check_learning_rate(eta, s_max)
    n, m = K_train.shape[0], K_val.shape[0]
    Y = y_train.reshape(n, -1).T.to(s.dtype)  # (B, n)
    Yv = y_val.reshape(m, -1).T.to(s.dtype)  # (B, m)
    C = Y @ U
    EU = K_val.to(s.dtype) @ U  # (m, n)
    max_iter = int(kw.get("max_iter", 1000))
    block = max(1, min(1024, 2**22 // max(1, C.numel() + Yv.numel())))
    stop = False
    last = 0
    for k0 in range(0, max_iter + 1, block):
        ks = torch.arange(k0, min(k0 + block, max_iter + 1))
        phi = spectral_filter(s, eta, ks)  # (b, n)
        P = (phi[:, None, :] * C[None]) @ EU.T  # (b, B, m)
        losses = validation_loss(P, Yv, weight, loss)
        for k, value in zip(ks.tolist(), losses.tolist()):
            last = k
            if monitor.update(k, value):
                stop = True
                break
        if stop:
            break
    best = monitor.best_iteration
    alpha = (spectral_filter(s, eta, torch.tensor([best]))[0] * C) @ U.T  # (B, n)
    alpha = alpha.T.reshape(n, *y_train.shape[1:]) if y_train.ndim == 2 else alpha[0]
    return EarlyStoppingResult(
        best_iteration=best, best_loss=monitor.best_loss, n_iter=last, learning_rate=eta,
        best_alpha=alpha, validation_losses=torch.tensor(monitor.losses, dtype=torch.float64),
    )


@dataclass
class PathFit:
    """Outcome of :func:`fit_path`.

    Attributes
    ----------
    alpha : tensor of shape (n,) or (n, t)
        Final coefficients on all rows.
    n_iter : int
        Steps of the final model (the stopping time is ``n_iter * learning_rate``).
    learning_rate : float
    early_stopping : EarlyStoppingResult or None
        The validation run, when early stopping was used.
    validation_indices : ndarray of int64 or None
        Sorted positions of the held-out rows (:func:`kernelflow.utils.holdout.
        holdout_weights`), when early stopping was used.
    """

    alpha: torch.Tensor
    n_iter: int
    learning_rate: float
    early_stopping: EarlyStoppingResult | None = None
    validation_indices: np.ndarray | None = None


def fit_path(path_function: Callable | PathRule | str, kernel, X: torch.Tensor, y: torch.Tensor, *,
             learning_rate="auto", max_iter: int = 1000, early_stopping: bool = True,
             validation_fraction: float = 0.1, n_iter_no_change: int = 100, tol: float = 0.0,
             random_state=None, options: Options | None = None, verbose: int = 0,
             sample_weight: torch.Tensor | None = None, validation_loss: str = "squared",
             holdout_rows: torch.Tensor | None = None, checkpoint: Checkpoint | None = None,
             **path_kwargs) -> PathFit:
    """Fit a path estimator: step size, optional validation run, refit on all rows.

    1. K = K(X, X) (dense when it fits the memory budget, else a matrix-free operator).
    2. ``learning_rate="auto"`` resolves on the full K as the rule says
       (:func:`~kernelflow.solvers.paths.driver.step_size`: the rule's automatic step, with
       weights that of the repeated-row problem); the validation run and the refit share that
       step, so they share the meaning of an iteration count (t = k eta). An explicit step of
       a rule with a stability bound (gradient, Huber) is checked against s_max(K)
       (``DivergenceError`` if too large).
    3. With ``early_stopping``, :func:`validation_weights` holds out distinct rows carrying a
       ``validation_fraction`` of the weight, the path runs on the rest with patience
       ``n_iter_no_change`` (improvements of the weighted ``validation_loss`` must exceed
       ``tol``), and the model is refit on all rows for the best number of steps (Allerbo,
       Sec. 6). Without it the path runs ``max_iter`` steps (or until the relative training
       residual is below ``tol``).

    Parameters
    ----------
    path_function : PathRule, str or callable
        A rule of :mod:`kernelflow.solvers.paths.rules`, a method name or one of the three
        path functions of :mod:`kernelflow.solvers.paths`.
    kernel : Kernel
    X : tensor of shape (n, d)
    y : tensor of shape (n,) or (n, t)
    sample_weight : tensor of shape (n,), optional
        Positive weights (remove rows of weight 0 first); an integer weight acts as repeating
        the row.
    validation_loss : {"squared", "absolute"}, default="squared"
        Loss monitored on the validation rows.
    holdout_rows : tensor of shape (n, d'), optional
        Rows whose content decides the validation split (default X); a precomputed kernel
        matrix passes its own rows, so equal inputs still fall on the same side.
    checkpoint : Checkpoint, optional
        Used when K does not fit the memory budget (a matrix-free fit, whose loops run one
        kernel product per step): the state of the running phase (the validation run's loop,
        monitor and best iterate; the refit's loop) is written every ``checkpoint.interval``
        seconds (:class:`~kernelflow.solvers.paths.resume.PathCheckpoint`), and a fit given a
        checkpoint of the same problem continues from it and ends with the result of an
        uninterrupted fit. The validation rows join its fingerprint. A fit on a stored K
        (seconds) neither reads nor writes it.
    **path_kwargs
        Options of the rule (``momentum``, ``nesterov`` of the gradient rule) and backend
        options of its path (``method``).

    Returns
    -------
    PathFit

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> from kernelflow.solvers.paths import sign_gradient_path
    >>> X = torch.linspace(-2, 2, 40, dtype=torch.float64)[:, None]
    >>> fit = fit_path(sign_gradient_path, Gaussian(0.5), X, torch.sin(X[:, 0]),
    ...                max_iter=3000, random_state=0)
    >>> fit.n_iter > 0, fit.early_stopping.best_iteration == fit.n_iter
    (True, True)
    """
    _check_loss(validation_loss)
    rule, path_kwargs = _rule_with_options(path_function, dict(path_kwargs))
    sw = _fit_weights(sample_weight, X)
    op = KernelOperator(kernel, X, options=options)
    dense = op.fits_in_memory(copies=3)
    K = op.to_dense() if dense else op
    if early_stopping:
        w_tr, w_va = validation_weights(X if holdout_rows is None else holdout_rows, y, sw,
                                        validation_fraction, random_state)
        tr_t = torch.nonzero(w_tr > 0).reshape(-1)
        va_t = torch.nonzero(w_va > 0).reshape(-1)
    # only a matrix-free fit is long enough to checkpoint
    ck = None if checkpoint is None or dense else _path_checkpoint(
        checkpoint, rule, X, va_t if early_stopping else None)
    # one decomposition gives s_max and the refit's whole path when the rule can use it
    eigh_ok = dense and path_kwargs.get("method", "auto") != "iterative" and \
        X.shape[0] <= SPECTRAL_MAX_N
    if ck is not None and ck.learning_rate is not None:  # resumed: the stored step
        eta, eigh = ck.learning_rate, None
    else:
        eta, eigh = step_size(rule, K, y, learning_rate, sample_weight=sw, eigh_ok=eigh_ok)
    if ck is not None:
        ck.learning_rate = eta
    refit_kw: dict[str, Any] = {} if eigh is None else {"eigh": eigh}
    kw = dict(path_kwargs, learning_rate=eta, verbose=verbose)
    if not early_stopping:
        refit_kw.update({} if ck is None else ck.run_kwargs("path", last=max_iter))
        res = run_path(rule, K, y, sample_weight=sw, max_iter=max_iter, tol=tol, **kw,
                       **refit_kw)
        return PathFit(alpha=res.alpha, n_iter=res.n_iter, learning_rate=eta)
    K_tr: torch.Tensor | LinearOperator
    K_va: torch.Tensor | LinearOperator
    if isinstance(K, torch.Tensor):
        K_tr, K_va = K[tr_t][:, tr_t], K[va_t][:, tr_t]
    else:
        K_tr = KernelOperator(kernel, X[tr_t], options=options)
        K_va = KernelOperator(kernel, X[va_t], X[tr_t], options=options)
    done = None if ck is None else ck.validation_result()
    es = EarlyStoppingResult(**done) if done is not None else early_stopped_path(
        rule, K_tr, y[tr_t], K_va, y[va_t], n_iter_no_change=n_iter_no_change, tol=tol,
        max_iter=max_iter, sample_weight=None if sw is None else w_tr[tr_t],
        validation_weight=None if sw is None else w_va[va_t],
        validation_loss=validation_loss, resume=ck, **kw)
    if ck is not None:
        refit_kw.update(ck.run_kwargs("refit", lambda: {"validation": dict(vars(es))},
                                      last=es.best_iteration))
    res = run_path(rule, K, y, sample_weight=sw, max_iter=es.best_iteration, **kw, **refit_kw)
    return PathFit(alpha=res.alpha, n_iter=res.n_iter, learning_rate=eta, early_stopping=es,
                   validation_indices=va_t.cpu().numpy().astype(np.int64))


def _path_checkpoint(checkpoint: Checkpoint, rule: PathRule, X: torch.Tensor,
                     validation_rows: torch.Tensor | None) -> PathCheckpoint:
    """The checkpoint of a matrix-free path fit, loaded, with the validation rows in its
    fingerprint (a split drawn anew, as with ``random_state=None``, is another problem)."""
    if validation_rows is not None:
        checkpoint.fingerprint["validation_rows"] = tensor_digest(validation_rows)
    return PathCheckpoint(checkpoint, rule, X.device)


def _fit_weights(sample_weight: torch.Tensor | None, X: torch.Tensor) -> torch.Tensor | None:
    """The weights of :func:`fit_path` in X's dtype, checked; None when all are 1."""
    if sample_weight is None:
        return None
    sw = sample_weight.to(device=X.device, dtype=X.dtype).reshape(-1)
    if sw.shape[0] != X.shape[0] or not bool((sw > 0).all()):
        raise ValueError("sample_weight must hold one positive weight per row of X (remove "
                         "rows of weight 0 first).")
    return None if bool((sw == 1).all()) else sw
