"""Update rules of the paths: single steps, automatic step sizes and stability bounds.

The single-step functions act on the last dimension, so a batch ``(B, n)`` of independent
problems (folds x bandwidths) advances in one call. The top eigenvalue s_max(K), which bounds
every stable gradient step, is computed by :func:`largest_eigenvalue` and nowhere else.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...linalg import power_iteration
from ._common import EXACT_EIGENVALUE_MAX_N, DivergenceError
from ._operator import _Matrix


# ---- single steps (batch-agnostic: the last dimension indexes training points) ----
def gradient_step(alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
    """One kernel gradient-descent step ``alpha + eta r`` (Eq. 8), r = y - K alpha.

    Works on any batch shape ``(..., n)``; ``eta`` is a float or broadcasts (e.g. shape (B, 1)).

    Examples
    --------
    >>> import torch
    >>> gradient_step(torch.zeros(3), torch.tensor([1.0, -2.0, 0.0]), 0.5).tolist()
    [0.5, -1.0, 0.0]
    """
    return alpha + eta * residual


def momentum_step(alpha: torch.Tensor, alpha_prev: torch.Tensor, residual: torch.Tensor, eta,
                  momentum) -> torch.Tensor:
    """Heavy-ball / Nesterov step ``alpha + gamma (alpha - alpha_prev) + eta r`` (Remark 4.2).

    For heavy ball, ``residual`` is ``y - K alpha``; for Nesterov it is taken at the look-ahead
    point ``alpha + gamma (alpha - alpha_prev)``. Shapes ``(..., n)``.

    Examples
    --------
    >>> import torch
    >>> momentum_step(torch.ones(2), torch.zeros(2), torch.ones(2), 0.25, 0.5).tolist()
    [1.75, 1.75]
    """
    return alpha + momentum * (alpha - alpha_prev) + eta * residual


def sign_step(alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
    """One kernel sign-gradient step ``alpha + eta sign(r)`` with sign(0) = 0 (Eq. 24).

    Examples
    --------
    >>> import torch
    >>> sign_step(torch.zeros(3), torch.tensor([0.3, -2.0, 0.0]), 0.25).tolist()
    [0.25, -0.25, 0.0]
    """
    return alpha + eta * torch.sign(residual)


def coordinate_direction(residual: torch.Tensor) -> torch.Tensor:
    """``I_inf(r)``: sign(r_d) on every coordinate attaining max_d |r_d| (all ties), else 0.

    Operates on the last dimension; a zero residual gives a zero direction.

    Examples
    --------
    >>> import torch
    >>> coordinate_direction(torch.tensor([[0.5, -2.0, 2.0], [1.0, 0.0, -0.5]])).tolist()
    [[0.0, -1.0, 1.0], [1.0, 0.0, -0.0]]
    """
    a = residual.abs()
    top = a.amax(dim=-1, keepdim=True)
    return torch.sign(residual) * (a == top)


def coordinate_moves(R: torch.Tensor, tol: float = 0.0, y_max=None):
    """The coordinates a coordinate-descent step moves in a batch of residuals ``R`` (B, n).

    Every m attaining max |r| of its row moves (ties move together): returns ``(mask, idx)``
    with ``mask`` (B, n) marking them per row and ``idx`` their union, or None when the path
    has ended (a zero residual, or max |r| <= ``tol * y_max`` in every row when ``tol > 0``).

    Examples
    --------
    >>> mask, idx = coordinate_moves(torch.tensor([[0.5, -2.0, 2.0]]))
    >>> mask.tolist(), idx.tolist()
    ([[False, True, True]], [1, 2])
    """
    A = R.abs()
    top = A.amax(dim=-1, keepdim=True)
    if tol > 0 and bool((top[:, 0] <= tol * y_max).all()):
        return None
    mask = (A == top) & (top > 0)
    idx = torch.nonzero(mask.any(dim=0)).reshape(-1)
    if idx.numel() == 0:
        return None
    return mask, idx


def coordinate_step(alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
    """One kernel coordinate-descent step ``alpha + eta I_inf(r)`` (forward stagewise).

    Examples
    --------
    >>> import torch
    >>> coordinate_step(torch.zeros(3), torch.tensor([0.5, -2.0, 1.0]), 0.25).tolist()
    [0.0, -0.25, 0.0]
    """
    return alpha + eta * coordinate_direction(residual)



# ---- step sizes ----
def largest_eigenvalue(K, n_iter: int = 50) -> float:
    """Upper estimate of s_max(K): exact (eigvalsh) for dense n <= 2000, else power iteration.

    Power iteration estimates from below; the estimate is inflated by 5% and capped at the trace
    bound s_max <= trace(K). Cost O(n^3) exact, else ``n_iter`` products with K.

    Examples
    --------
    >>> import torch
    >>> round(largest_eigenvalue(torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)), 6)
    3.0
    """
    Km = _Matrix(K)
    n = Km.shape[0]
    if n == 0:
        return 0.0
    if n <= EXACT_EIGENVALUE_MAX_N and Km.fits():
        D = Km.to_dense()
        return float(torch.linalg.eigvalsh(0.5 * (D + D.T).to(torch.float64))[-1].clamp_min(0))
    est = power_iteration(lambda v: Km.rmatmul(v[None].to(Km.dtype))[0].to(torch.float64), n,
                          device=Km.device, n_iter=n_iter)
    trace = float(Km.diagonal().sum())
    return min(1.05 * est, trace) if trace > 0 else 1.05 * est


def weighted_largest_eigenvalue(K, w: torch.Tensor) -> float:
    """s_max(W^1/2 K W^1/2) for positive weights w: exact when dense and small, else power
    iteration (+5 %); the matrix of the repeated-row problem.

    Examples
    --------
    >>> import torch
    >>> round(weighted_largest_eigenvalue(torch.eye(2, dtype=torch.float64),
    ...                                   torch.tensor([1.0, 3.0], dtype=torch.float64)), 6)
    3.0
    """
    return _scaled_largest_eigenvalue(K, w.sqrt())


def _scaled_largest_eigenvalue(K, sq: torch.Tensor) -> float:
    """s_max(diag(sq) K diag(sq)); see :func:`weighted_largest_eigenvalue`."""
    if isinstance(K, torch.Tensor) and K.shape[0] <= EXACT_EIGENVALUE_MAX_N:
        return largest_eigenvalue(sq[:, None] * K * sq[None, :])
    Km = _Matrix(K)
    est = power_iteration(lambda v: (sq * Km.rmatmul((sq * v.to(sq.dtype))[None])[0])
                          .to(torch.float64), K.shape[0], device=sq.device)
    return 1.05 * est


def gradient_learning_rate(K, s_max: float | None = None) -> float:
    """Safe gradient-descent step ``1 / s_max(K)`` (Prop 5.3: eta <= 2 / s_max keeps ||r||_2
    non-increasing; 1 / s_max also makes every spectral factor 1 - eta s non-negative).

    Examples
    --------
    >>> import torch
    >>> round(gradient_learning_rate(torch.eye(3, dtype=torch.float64) * 4), 4)
    0.25
    """
    s = largest_eigenvalue(K) if s_max is None else float(s_max)
    return 1.0 / s if s > 0 else 1.0


def check_gradient_learning_rate(eta: float, s_max: float, momentum: float = 0.0,
                                 nesterov: bool = False) -> None:
    """Raise :class:`DivergenceError` if gradient descent with step ``eta`` cannot converge.

    Plain GD needs eta s_max < 2; heavy ball eta s_max < 2 (1 + gamma); Nesterov
    eta s_max < (2 + 2 gamma) / (1 + 2 gamma) (stability of the two-term recurrence).

    Examples
    --------
    >>> check_gradient_learning_rate(1.0, 3.0)
    Traceback (most recent call last):
    ...
    kernelflow.solvers.paths.DivergenceError: ...
    """
    g = float(momentum)
    bound = 2.0 * (1 + g) / (1 + 2 * g) if nesterov else 2.0 * (1 + g)
    if eta * s_max > bound * (1 + 1e-9):
        raise DivergenceError(
            f"learning_rate={eta:.4g} diverges for this kernel matrix: learning_rate * s_max(K) = "
            f"{eta * s_max:.4g} exceeds {bound:.4g} (s_max(K) ~ {s_max:.4g}); use "
            f"learning_rate <= {bound / s_max:.4g} or learning_rate='auto'."
        )


def _rms(Y: torch.Tensor) -> float:
    v = float(Y.pow(2).mean().sqrt()) if Y.numel() else 0.0
    return v if v > 0 else 1.0


def sign_learning_rate(K, y: torch.Tensor, resolution: float = 0.01,
                       s_max: float | None = None,
                       sample_weight: torch.Tensor | None = None) -> float:
    """Default sign-descent step ``resolution * rms(y) / s_max(K)``.

    One step changes the fitted values by ``eta ||K sign(r)||_2 <= eta s_max sqrt(n)``, i.e. by at
    most ``resolution ||y||_2``. Sign descent cannot diverge (|alpha_i| <= k eta), so this only sets
    the resolution of the path; the paper's fixed 0.01 remains available. With positive
    ``sample_weight`` w it is the step of the repeated-row problem: the weighted root mean square
    of y over s_max(W^1/2 K W^1/2) (:func:`weighted_largest_eigenvalue`).

    Examples
    --------
    >>> import torch
    >>> round(sign_learning_rate(torch.eye(4, dtype=torch.float64), torch.ones(4)), 4)
    0.01
    """
    if sample_weight is not None:
        w = sample_weight.reshape(-1)
        Y = y.reshape(y.shape[0], -1).to(w.dtype)
        rms = float(((w[:, None] * Y.square()).sum() / (w.sum() * Y.shape[1])).sqrt())
        s = weighted_largest_eigenvalue(K, w) if s_max is None else float(s_max)
        return resolution * (rms if rms > 0 else 1.0) / (s if s > 0 else 1.0)
    # Only sets the resolution, so a rough estimate (10 products when matrix-free) suffices.
    s = largest_eigenvalue(K, n_iter=10) if s_max is None else float(s_max)
    return resolution * _rms(y) / (s if s > 0 else 1.0)


def coordinate_learning_rate(K, y: torch.Tensor, resolution: float = 0.01) -> float:
    """Default coordinate-descent step ``resolution * max|y| / max_i K_ii``.

    A step on coordinate m changes r_m by eta K_mm: about 1% of the largest residual. Cost O(n).

    Examples
    --------
    >>> import torch
    >>> round(coordinate_learning_rate(torch.eye(3, dtype=torch.float64), torch.tensor([1., 2.])),
    ...       4)
    0.02
    """
    d = float(_Matrix(K).diagonal().abs().max()) if K.shape[0] else 1.0
    m = float(y.abs().max()) if y.numel() else 1.0
    return resolution * (m if m > 0 else 1.0) / (d if d > 0 else 1.0)


def sign_monotone_step(residual: torch.Tensor, K_sign: torch.Tensor) -> torch.Tensor:
    """Largest step keeping ||r||_1 non-increasing for sign descent: min_i |r_i| / |(K s)_i|.

    The corrected form of Prop 5.3 (the paper's ``min_i |r_i|`` is not sufficient): no residual
    changes sign, so ||r - eta K s||_1 = ||r||_1 - eta s^T K s. ``K_sign`` is K sign(r); last
    dimension. Returns +inf where K sign(r) = 0.

    Examples
    --------
    >>> import torch
    >>> float(sign_monotone_step(torch.tensor([1.0, -0.5]), torch.tensor([2.0, -2.0])))
    0.25
    """
    ratio = residual.abs() / K_sign.abs()
    ratio = torch.where(K_sign == 0, torch.full_like(ratio, math.inf), ratio)
    return ratio.amin(dim=-1)


def coordinate_monotone_step(residual: torch.Tensor, K_column: torch.Tensor,
                             m: int) -> torch.Tensor:
    """Largest step keeping ||r||_inf non-increasing when coordinate m = argmax |r| moves.

    Corrected Prop 5.3: eta <= min_i (|r_m| + sign(K_im s) r_i) / |K_im| over K_im != 0, with
    s = sign(r_m); this is necessary and sufficient. ``K_column`` is K[:, m]; 1-D inputs.

    Examples
    --------
    >>> import torch
    >>> r = torch.tensor([1.0, -0.95]); col = torch.tensor([1.0, 0.9])
    >>> round(float(coordinate_monotone_step(r, col, 0)), 4)
    0.0556
    """
    s = torch.sign(residual[m])
    a = K_column * s
    bound = (residual[m].abs() + torch.sign(a) * residual) / a.abs()
    bound = torch.where(a == 0, torch.full_like(bound, math.inf), bound)
    return bound.amin()



# ---- rule objects: one per method, owning its step, automatic step size and stability bound ----
def _robust_scale(y: torch.Tensor) -> float:
    """1.4826 x the median absolute deviation from the median (the normal-consistent MAD)."""
    v = y.reshape(-1).to(torch.float64)
    if v.numel() == 0:
        return 1.0
    s = 1.4826 * float((v - v.median()).abs().median())
    if s <= 0:  # more than half the values equal: fall back to the root mean square
        s = float(v.square().mean().sqrt())
    return s if s > 0 else 1.0


class PathRule:
    """One update rule of the paths: ``alpha += eta * direction(r)``, r = y - K alpha.

    Subclasses set ``name`` and implement :meth:`direction` and :meth:`learning_rate`; the
    stability bound on eta (inf for rules that cannot diverge) comes from :meth:`max_step`.
    ``native`` names the compiled loop that runs the rule (:mod:`kernelflow.solvers._native`),
    ``spectral`` says the closed form of gradient descent applies.
    """

    name = "rule"
    native: str | None = None
    spectral = False

    def direction(self, residual: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def step(self, alpha: torch.Tensor, residual: torch.Tensor, eta) -> torch.Tensor:
        """``alpha + eta * direction(residual)`` on the last dimension."""
        return alpha + eta * self.direction(residual)

    def learning_rate(self, K, y: torch.Tensor, s_max: float | None = None,
                      sample_weight: torch.Tensor | None = None) -> float:
        """The automatic step; with ``sample_weight``, that of the repeated-row problem
        (``s_max`` is then the top eigenvalue of W^1/2 K W^1/2)."""
        raise NotImplementedError  # pragma: no cover

    def max_step(self, s_max: float) -> float:
        """Largest stable step for a kernel matrix with top eigenvalue ``s_max``."""
        return math.inf

    def check_learning_rate(self, eta: float, s_max: float) -> None:
        """Raise :class:`DivergenceError` when ``eta`` exceeds :meth:`max_step`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class GradientRule(PathRule):
    """Kernel gradient descent, ``alpha += eta r`` (optionally with momentum gamma).

    Examples
    --------
    >>> import torch
    >>> GradientRule().step(torch.zeros(2), torch.tensor([1.0, -2.0]), 0.5).tolist()
    [0.5, -1.0]
    >>> round(GradientRule().max_step(4.0), 3)
    0.5
    """

    name = "gradient"
    spectral = True

    def __init__(self, momentum: float = 0.0, nesterov: bool = False):
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    def direction(self, residual):
        return residual

    def learning_rate(self, K, y=None, s_max=None, sample_weight=None):
        return gradient_learning_rate(K, s_max=s_max)

    def max_step(self, s_max):
        g = self.momentum
        bound = 2.0 * (1 + g) / (1 + 2 * g) if self.nesterov else 2.0 * (1 + g)
        return bound / s_max if s_max > 0 else math.inf

    def check_learning_rate(self, eta, s_max):
        check_gradient_learning_rate(eta, s_max, self.momentum, self.nesterov)


class SignRule(PathRule):
    """Kernel sign gradient descent, ``alpha += eta sign(r)``: cannot diverge.

    Examples
    --------
    >>> import torch
    >>> SignRule().step(torch.zeros(3), torch.tensor([0.3, -2.0, 0.0]), 0.25).tolist()
    [0.25, -0.25, 0.0]
    """

    name = "sign"
    native = "sign"

    def direction(self, residual):
        return torch.sign(residual)

    def learning_rate(self, K, y, s_max=None, sample_weight=None):
        return sign_learning_rate(K, y, s_max=s_max, sample_weight=sample_weight)


class CoordinateRule(PathRule):
    """Kernel coordinate descent, ``alpha += eta I_inf(r)``: cannot diverge.

    Examples
    --------
    >>> import torch
    >>> CoordinateRule().step(torch.zeros(3), torch.tensor([0.5, -2.0, 1.0]), 0.25).tolist()
    [0.0, -0.25, 0.0]
    """

    name = "coordinate"
    native = "coordinate"

    def direction(self, residual):
        return coordinate_direction(residual)

    def learning_rate(self, K, y, s_max=None, sample_weight=None):
        return coordinate_learning_rate(K, y)


#: Huber's tuning constant: 95 % efficiency under normal errors.
HUBER_CONSTANT = 1.345


def huber_epsilon(y: torch.Tensor, constant: float = HUBER_CONSTANT) -> float:
    """Scale-aware Huber threshold ``constant * 1.4826 * MAD(y)``.

    Examples
    --------
    >>> import torch
    >>> round(huber_epsilon(torch.tensor([-1.0, 0.0, 1.0, 50.0])), 3)
    1.994
    """
    return constant * _robust_scale(y)


class HuberRule(PathRule):
    """Kernel gradient descent on the Huber loss: ``alpha += eta psi(r)``.

    psi(r) = clip(r, -epsilon, epsilon) is the derivative of Huber's loss, so the update is
    the functional gradient step f <- f + eta K psi(y - f) of sum_i huber_epsilon(y_i - f_i):
    residuals beyond epsilon pull with a bounded force, which makes the path robust to gross
    outliers; for epsilon above every residual it is plain gradient descent. psi is
    1-Lipschitz, so the gradient-descent step ``1 / s_max(K)`` is stable (bound 2 / s_max).

    Parameters
    ----------
    epsilon : float or None, default=None
        Threshold between the quadratic and the linear part of the loss. None re-estimates it
        at every step as ``constant * 1.4826 * MAD(r)`` of each problem's current residuals
        (the root mean square where more than half of them are zero): at alpha = 0 the
        residual is the signal, and its robust scale shrinks to the noise level as the path
        fits, so outliers pull less and less.
    constant : float, default=1.345
        Huber's tuning constant for the adaptive threshold.

    Attributes
    ----------
    last_epsilon : tensor or None
        Threshold(s) of the last step taken.

    Examples
    --------
    >>> import torch
    >>> HuberRule(1.0).step(torch.zeros(3), torch.tensor([0.5, -3.0, 2.0]), 0.5).tolist()
    [0.25, -0.5, 0.5]
    """

    name = "huber"

    def __init__(self, epsilon: float | None = None, constant: float = HUBER_CONSTANT):
        if epsilon is not None:
            epsilon = float(epsilon)
            if not (epsilon > 0 and math.isfinite(epsilon)):
                raise ValueError(f"epsilon must be a positive finite number, got {epsilon}.")
        self.epsilon = epsilon
        self.constant = float(constant)
        self.last_epsilon = None
        self._layout = None  # cached training positions of the last mask

    def threshold(self, residual: torch.Tensor, mask: torch.Tensor | None = None):
        """epsilon, or the adaptive threshold of each problem (shape (..., 1))."""
        if self.epsilon is not None:
            return self.epsilon
        host = self._host(residual, mask)
        return torch.from_numpy(host[0]) if host is not None else self._tensor_threshold(
            residual, mask)

    def _tensor_threshold(self, residual, mask):
        r = residual if mask is None else torch.where(mask > 0, residual, torch.nan)
        med = r.nanmedian(dim=-1, keepdim=True).values
        mad = (r - med).abs().nanmedian(dim=-1, keepdim=True).values
        count = residual.shape[-1] if mask is None else (mask > 0).sum(-1, keepdim=True)
        rms = ((residual.square() if mask is None else (residual * (mask > 0)).square())
               .sum(-1, keepdim=True) / count).sqrt()
        return self.constant * torch.where(mad > 0, 1.4826 * mad, rms)

    def _rows(self, mask, shape):
        """Positions of the order statistics of every problem (rows of the (B, n) batch).

        Returns ``(train, mid, last)``: the training-row mask as a (B, n) array (None without
        a mask), and the positions of the lower median and of the largest value after a
        row-wise sort that puts the other rows last: integers when all problems have the
        same number of training rows, else ``(rows, per-row positions)`` index pairs. None
        where a problem has no training row. Cached for the mask object (and its version),
        which a path keeps between steps.
        """
        n = shape[-1]
        key = None if mask is None else (id(mask), mask._version, tuple(mask.shape))
        layout = getattr(self, "_layout", None)
        if layout is not None and layout[:2] == (key, shape):
            return layout[2]
        if mask is None:
            keep, count = None, np.full(1, n, dtype=np.int64)
        else:
            keep = np.ascontiguousarray(np.broadcast_to((mask > 0).numpy(), shape)).reshape(-1, n)
            count = keep.sum(-1, dtype=np.int64)
        if not bool((count > 0).all()):
            rows = None
        elif bool((count == count[0]).all()):
            rows = (keep, int(count[0] - 1) // 2, int(count[0] - 1))
        else:
            at = np.arange(count.size)
            rows = (keep, (at, (count - 1) // 2), (at, count - 1))
        self._layout = (key, shape, rows, mask)  # holding the mask keeps its id unique
        return rows

    def _host(self, residual, mask, alpha=None, eta=None):
        """The adaptive threshold on CPU tensors by NumPy (one call costs far less than a
        tensor operation on the small batches of a path), with the same values.

        Returns ``(epsilon, psi(residual))`` (an array and a tensor), psi replaced by
        ``alpha + eta psi`` when ``alpha`` is given, or None where the tensor code must
        decide: another device,
        autograd, a dtype other than float32/float64, a problem without training rows, a NaN
        deviation from the median (NaN residuals, inf - inf) or a zero MAD (the root mean
        square). Medians are order statistics and the rest is elementwise, each rounded as
        the tensor code rounds it (``eta`` in the dtype, as torch takes a Python scalar).
        """
        if (self.epsilon is not None or residual.device.type != "cpu"
                or residual.requires_grad or residual.dtype not in (torch.float32, torch.float64)
                or residual.ndim == 0 or residual.shape[-1] == 0
                or (mask is not None and (mask.device.type != "cpu" or mask.requires_grad))):
            return None
        shape = tuple(residual.shape)
        rows = self._rows(mask, shape)
        if rows is None:
            return None
        keep, mid, last = rows
        r = residual.numpy()
        with np.errstate(all="ignore"):  # tensors do not warn on inf - inf or overflow either
            w = r.reshape(-1, shape[-1])
            w = np.where(keep, w, np.nan) if keep is not None else w.copy()
            s = np.sort(w, axis=-1)  # the other problems' rows (NaN) last
            med = s[:, mid, None] if isinstance(mid, int) else s[mid][:, None]
            dev = np.abs(np.subtract(w, med, out=w), out=w)
            dev.sort(axis=-1)
            mad = dev[:, mid] if isinstance(mid, int) else dev[mid]
            top = dev[:, last] if isinstance(last, int) else dev[last]
            if not np.minimum.reduce(np.minimum(mad, top)) > 0:  # NaN fails too
                return None
            eps = (self.constant * (1.4826 * mad)).reshape(*shape[:-1], 1)
            # the result lives in a tensor's own storage: products with it then see the
            # memory alignment they see with the tensor code
            out = torch.empty(shape, dtype=residual.dtype)
            psi = out.numpy()
            np.maximum(r, -eps, out=psi)
            np.minimum(psi, eps, out=psi)
            if alpha is not None:
                if eta != 1:
                    np.multiply(psi, psi.dtype.type(eta), out=psi)
                np.add(alpha.numpy(), psi, out=psi)
        return eps, out

    def direction(self, residual, mask=None):
        host = self._host(residual, mask)
        if host is not None:
            self.last_epsilon = torch.from_numpy(host[0])
            return host[1]
        eps = self.threshold(residual, mask)
        self.last_epsilon = eps
        if isinstance(eps, float):
            return residual.clamp(-eps, eps)
        return torch.minimum(torch.maximum(residual, -eps), eps)

    def step(self, alpha, residual, eta, mask=None):
        if (isinstance(eta, (int, float)) and not isinstance(eta, bool)
                and alpha.device.type == "cpu" and alpha.dtype == residual.dtype
                and alpha.shape == residual.shape and not alpha.requires_grad):
            host = self._host(residual, mask, alpha, eta)
            if host is not None:
                self.last_epsilon = torch.from_numpy(host[0])
                return host[1]
        return alpha + eta * self.direction(residual, mask)

    def learning_rate(self, K, y=None, s_max=None, sample_weight=None):
        return gradient_learning_rate(K, s_max=s_max)

    def max_step(self, s_max):
        return 2.0 / s_max if s_max > 0 else math.inf

    def check_learning_rate(self, eta, s_max):
        check_gradient_learning_rate(eta, s_max)

    def __repr__(self) -> str:
        eps = "adaptive" if self.epsilon is None else f"{self.epsilon:.4g}"
        return f"HuberRule(epsilon={eps})"


def as_rule(rule) -> PathRule:
    """A :class:`PathRule` from a rule, a method name or one of the three path functions.

    Examples
    --------
    >>> as_rule("sign").name
    'sign'
    """
    if isinstance(rule, PathRule):
        return rule
    if isinstance(rule, str):
        rules = {"gradient": GradientRule, "sign": SignRule, "coordinate": CoordinateRule}
        if rule not in rules:
            raise ValueError(f"method must be one of {tuple(rules)} or a PathRule, got {rule!r}.")
        return rules[rule]()
    name = getattr(rule, "__name__", "")
    by_function = {"gradient_descent_path": "gradient", "sign_gradient_path": "sign",
                   "coordinate_descent_path": "coordinate"}
    if name in by_function and getattr(rule, "__module__", "").startswith(
            "kernelflow.solvers.paths"):
        return as_rule(by_function[name])
    raise ValueError("path_function must be one of the three paths of kernelflow.solvers.paths "
                     f"or a PathRule, got {rule!r}.")
