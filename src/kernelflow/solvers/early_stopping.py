"""Early stopping as regularisation: validation-monitored paths with patience.

A path from alpha = 0 visits every regularisation strength in one run (training time t = k eta
plays the role of 1 / lambda). The stopping time is chosen on held-out rows: after each iterate
the validation mean squared error of ``K_val alpha_k`` is computed (incrementally by the path
functions), the best value and its iteration are remembered, and the run ends after
``n_iter_no_change`` consecutive iterates without an improvement of more than ``tol`` (Allerbo,
Sec. 6: patience 100). The estimators then refit on all rows for the chosen number of steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..distributed._comm import all_reduce_sum, is_distributed
from ..linalg import symmetric_eigh
from ..operators import KernelOperator, Options
from .paths import (
    SPECTRAL_MAX_N,
    check_gradient_learning_rate,
    coordinate_descent_path,
    coordinate_learning_rate,
    gradient_descent_path,
    gradient_learning_rate,
    largest_eigenvalue,
    sign_learning_rate,
    spectral_filter,
)

__all__ = [
    "EarlyStopping",
    "EarlyStoppingResult",
    "validation_split",
    "validation_mse",
    "early_stopped_path",
    "PathFit",
    "fit_path",
]


class EarlyStopping:
    """Patience-based monitor of a validation loss.

    Parameters
    ----------
    n_iter_no_change : int, default=100
        Stop after this many consecutive iterations without improvement.
    tol : float, default=0.0
        An iteration improves when ``loss < best_loss - tol``.

    Attributes
    ----------
    best_iteration : int
        Iteration of the lowest loss seen (-1 before the first update).
    best_loss : float
    losses : list of float
        Every loss passed to :meth:`update`, in order.

    Examples
    --------
    >>> stop = EarlyStopping(n_iter_no_change=2)
    >>> [stop.update(k, loss) for k, loss in enumerate([3.0, 1.0, 2.0, 1.5])]
    [False, False, False, True]
    >>> stop.best_iteration, stop.best_loss
    (1, 1.0)
    """

    def __init__(self, n_iter_no_change: int = 100, tol: float = 0.0):
        if int(n_iter_no_change) < 1:
            raise ValueError(f"n_iter_no_change must be >= 1, got {n_iter_no_change}.")
        self.n_iter_no_change = int(n_iter_no_change)
        self.tol = float(tol)
        self.best_iteration = -1
        self.best_loss = math.inf
        self.losses: list[float] = []
        self._no_change = 0

    def update(self, iteration: int, loss: float) -> bool:
        """Record the loss of ``iteration``; return True when the run should stop."""
        loss = float(loss)
        if not math.isfinite(loss):
            raise FloatingPointError(f"validation loss at iteration {iteration} is {loss}.")
        self.losses.append(loss)
        if loss < self.best_loss - self.tol:
            self.best_loss, self.best_iteration = loss, int(iteration)
            self._no_change = 0
            return False
        self._no_change += 1
        return self._no_change >= self.n_iter_no_change


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


def validation_split(n: int, validation_fraction: float,
                     random_state=None) -> tuple[np.ndarray, np.ndarray]:
    """Random split of ``range(n)`` into training and validation indices.

    The validation part has ``ceil(validation_fraction * n)`` rows (at least 1) and the training
    part at least one row.

    Examples
    --------
    >>> tr, va = validation_split(10, 0.2, random_state=0)
    >>> len(tr), len(va), sorted(np.r_[tr, va].tolist()) == list(range(10))
    (8, 2, True)
    """
    if not 0.0 < float(validation_fraction) < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}.")
    if n < 2:
        raise ValueError(
            f"early stopping needs at least 2 samples to hold out a validation set, got {n} "
            "sample."
        )
    rng = random_state if isinstance(random_state, np.random.RandomState) else \
        np.random.RandomState(random_state)
    n_val = min(n - 1, max(1, math.ceil(validation_fraction * n)))
    perm = rng.permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def validation_mse(predictions: torch.Tensor, y_val: torch.Tensor) -> torch.Tensor:
    """Mean squared error over all entries; sums are reduced across processes.

    Examples
    --------
    >>> float(validation_mse(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])))
    2.0
    """
    diff = (predictions - y_val).to(torch.float64)
    if not is_distributed():
        return diff.pow(2).mean()
    stats = torch.stack([diff.pow(2).sum(), torch.tensor(float(diff.numel()), dtype=torch.float64,
                                                          device=diff.device)])
    stats = all_reduce_sum(stats)
    return stats[0] / stats[1].clamp_min(1.0)


def early_stopped_path(path_function: Callable, K_train, y_train: torch.Tensor, K_val,
                       y_val: torch.Tensor, *, n_iter_no_change: int = 100, tol: float = 0.0,
                       **path_kwargs) -> EarlyStoppingResult:
    """Run ``path_function`` with validation monitoring and patience; shared by all paths.

    Parameters
    ----------
    path_function : callable
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
    **path_kwargs
        Passed on (``learning_rate``, ``max_iter``, ``momentum``, ...).

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
    monitor = EarlyStopping(n_iter_no_change, tol)
    if path_function is gradient_descent_path:
        fast = _gd_spectral_early_stopping(monitor, K_train, y_train, K_val, y_val, path_kwargs)
        if fast is not None:
            return fast
    m = K_val.shape[0]
    Yv = y_val.reshape(m, -1).T.contiguous()  # batch layout, like the path's eval predictions
    best = {}

    def callback(k, alpha, residual, eval_predictions):
        loss = validation_mse(eval_predictions, Yv)
        stop = monitor.update(k, loss)
        if monitor.best_iteration == k:
            best["alpha"] = alpha.clone()
        return stop

    res = path_function(K_train, y_train, K_eval=K_val, callback=callback, **path_kwargs)
    alpha = best["alpha"]
    alpha = alpha.T.reshape(alpha.shape[1], *y_train.shape[1:]) if y_train.ndim == 2 else alpha[0]
    return EarlyStoppingResult(
        best_iteration=monitor.best_iteration, best_loss=monitor.best_loss, n_iter=res.n_iter,
        learning_rate=res.learning_rate, best_alpha=alpha,
        validation_losses=torch.tensor(monitor.losses, dtype=torch.float64),
    )


def _gd_spectral_early_stopping(monitor, K_train, y_train, K_val, y_val, kw):
    """Validation curve of plain GD from one eigendecomposition, in blocks of iterations.

    f_val(k) = (K_val U) diag(phi_k(s)) U^T y for a block of k at once (one GEMM) instead of a
    product per step; returns None when the closed form does not apply.
    """
    if float(kw.get("momentum", 0.0)) != 0.0 or kw.get("method", "auto") == "iterative":
        return None
    if not isinstance(K_train, torch.Tensor) or not isinstance(K_val, torch.Tensor):
        return None
    if kw.get("method", "auto") == "auto" and K_train.shape[0] > SPECTRAL_MAX_N:
        return None
    s, U = kw.get("eigh") or symmetric_eigh(K_train)
    s_max = float(s[-1]) if s.numel() else 0.0
    lr = kw.get("learning_rate", "auto")
    eta = (1.0 / s_max if s_max > 0 else 1.0) if lr == "auto" else float(lr)
    check_gradient_learning_rate(eta, s_max)
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
        losses = (P - Yv).pow(2).mean(dim=(1, 2))
        if is_distributed():
            losses = all_reduce_sum(losses * (Yv.numel())) / all_reduce_sum(
                torch.tensor(float(Yv.numel()), dtype=losses.dtype))
        for k, loss in zip(ks.tolist(), losses.tolist()):
            last = k
            if monitor.update(k, loss):
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
    """

    alpha: torch.Tensor
    n_iter: int
    learning_rate: float
    early_stopping: EarlyStoppingResult | None = None


def fit_path(path_function: Callable, kernel, X: torch.Tensor, y: torch.Tensor, *,
             learning_rate="auto", max_iter: int = 1000, early_stopping: bool = True,
             validation_fraction: float = 0.1, n_iter_no_change: int = 100, tol: float = 0.0,
             random_state=None, options: Options | None = None, verbose: int = 0,
             **path_kwargs) -> PathFit:
    """Fit a path estimator: step size, optional validation run, refit on all rows.

    1. K = K(X, X) (dense when it fits the memory budget, else a matrix-free operator).
    2. ``learning_rate="auto"`` resolves on the full K (:func:`gradient_learning_rate`,
       :func:`sign_learning_rate` or :func:`coordinate_learning_rate`); the validation run and the
       refit share that step, so they share the meaning of an iteration count (t = k eta). An
       explicit gradient step is checked against s_max(K) (``DivergenceError`` if too large).
    3. With ``early_stopping``, a ``validation_fraction`` of the rows is held out, the path runs on
       the rest with patience ``n_iter_no_change`` (improvements must exceed ``tol``), and the
       model is refit on all rows for the best number of steps (Allerbo, Sec. 6). Without it the
       path runs ``max_iter`` steps (or until the relative training residual is below ``tol``).

    Parameters
    ----------
    path_function : callable
        One of the three path functions of :mod:`kernelflow.solvers.paths`.
    kernel : Kernel
    X : tensor of shape (n, d)
    y : tensor of shape (n,) or (n, t)
    **path_kwargs
        Extra arguments of the path (``momentum``, ``nesterov``, ``method``).

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
    op = KernelOperator(kernel, X, options=options)
    dense = op.fits_in_memory(copies=3)
    K = op.to_dense() if dense else op
    refit_kw = {}
    if path_function is gradient_descent_path:
        if dense and path_kwargs.get("method", "auto") != "iterative" and \
                X.shape[0] <= SPECTRAL_MAX_N:
            # One decomposition gives s_max and the refit's whole path.
            refit_kw["eigh"] = symmetric_eigh(K)
            s_max = float(refit_kw["eigh"][0][-1])
        else:
            s_max = largest_eigenvalue(K)
        if learning_rate == "auto":
            eta = gradient_learning_rate(K, s_max=s_max)
        else:
            eta = float(learning_rate)
            check_gradient_learning_rate(eta, s_max, path_kwargs.get("momentum", 0.0),
                                         path_kwargs.get("nesterov", False))
    elif learning_rate != "auto":
        eta = float(learning_rate)
    elif path_function is coordinate_descent_path:
        eta = coordinate_learning_rate(K, y)
    else:
        eta = sign_learning_rate(K, y)
    kw = dict(path_kwargs, learning_rate=eta, verbose=verbose)
    if not early_stopping:
        res = path_function(K, y, max_iter=max_iter, tol=tol, **kw, **refit_kw)
        return PathFit(alpha=res.alpha, n_iter=res.n_iter, learning_rate=eta)
    tr, va = validation_split(X.shape[0], validation_fraction, random_state)
    tr_t = torch.as_tensor(tr, device=X.device)
    va_t = torch.as_tensor(va, device=X.device)
    if dense:
        K_tr, K_va = K[tr_t][:, tr_t], K[va_t][:, tr_t]
    else:
        K_tr = KernelOperator(kernel, X[tr_t], options=options)
        K_va = KernelOperator(kernel, X[va_t], X[tr_t], options=options)
    es = early_stopped_path(path_function, K_tr, y[tr_t], K_va, y[va_t],
                            n_iter_no_change=n_iter_no_change, tol=tol, max_iter=max_iter, **kw)
    res = path_function(K, y, max_iter=es.best_iteration, **kw, **refit_kw)
    return PathFit(alpha=res.alpha, n_iter=res.n_iter, learning_rate=eta, early_stopping=es)
