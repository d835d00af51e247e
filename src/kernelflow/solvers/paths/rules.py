"""Path rules: each update rule declares its step, automatic step, stability bound, options and
the fast backends that run it; the drivers ask the rule and never its name.

A rule is ``alpha += eta * direction(r)`` with r = y - K alpha, from alpha = 0. The reference
driver :func:`~kernelflow.solvers.paths.driver.rule_path` runs every rule (sample weights and
momentum included); a rule lists in :attr:`PathRule.backends` the faster routes that compute
the same path (:data:`BACKENDS`), and ``tests/test_path_rule_contract.py`` checks each of
them against the reference. The single steps, automatic step sizes and bounds the rules are
built on live in :mod:`._steps` and are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from ._common import DivergenceError, PathResult
from ._steps import (
    _scaled_largest_eigenvalue,
    check_gradient_learning_rate,
    coordinate_direction,
    coordinate_learning_rate,
    coordinate_monotone_step,
    coordinate_moves,
    coordinate_step,
    gradient_learning_rate,
    gradient_step,
    largest_eigenvalue,
    momentum_step,
    sign_learning_rate,
    sign_monotone_step,
    sign_step,
    weighted_largest_eigenvalue,
)
from .single import coordinate_descent_path, gradient_descent_path, sign_gradient_path

__all__ = [
    "BACKENDS", "PathRule", "GradientRule", "SignRule", "CoordinateRule", "HuberRule", "RowMask",
    "RULES", "as_rule", "huber_epsilon", "HUBER_CONSTANT",
    "gradient_step", "momentum_step", "sign_step", "coordinate_direction", "coordinate_moves",
    "coordinate_step", "largest_eigenvalue", "weighted_largest_eigenvalue",
    "gradient_learning_rate", "check_gradient_learning_rate", "sign_learning_rate",
    "coordinate_learning_rate", "sign_monotone_step", "coordinate_monotone_step",
]

_ = _scaled_largest_eigenvalue  # re-exported for the drivers

#: The fast backends a rule may declare, each computing the path of the reference driver:
#:
#: * ``"single"``: the rule's specialised single-path loop (:meth:`PathRule.single_path`);
#: * ``"weighted"``: that loop also takes ``sample_weight``;
#: * ``"eigenbasis"``: that loop can run from an eigendecomposition of K (``eigh``,
#:   ``method``), which the drivers then compute once for the step size and the refit;
#: * ``"spectral"``: the closed form alpha_k = U phi_k(s) U^T y of plain gradient descent
#:   (validation curves in blocks of iterations, the filter of path cross-validation);
#: * ``"batched"``: :meth:`PathRule.batched_step` on a (..., n) batch of problems with their
#:   training rows (:class:`RowMask`), the tensor loop of path cross-validation;
#: * ``"native"``: the compiled loops of :mod:`kernelflow.solvers._native`, named by
#:   :attr:`PathRule.native`.
BACKENDS = ("single", "weighted", "eigenbasis", "spectral", "batched", "native")

#: Options of the single-path loops that only choose how a path is computed; the reference
#: driver ignores them.
BACKEND_OPTIONS = ("method", "eigh", "incremental")


class RowMask:
    """Training rows of a batch of problems, shape (..., n) (1 where a row trains), with what a
    rule derives from them cached on this object.

    A batched driver makes one whenever its batch changes and passes it to every
    :meth:`PathRule.batched_step`, so a rule may cache per-mask work in :attr:`cache` (keyed
    by what it needs, e.g. the residual shape).

    Examples
    --------
    >>> m = RowMask(torch.tensor([[1.0, 0.0, 1.0]]))
    >>> m.mask.shape, m.cache
    (torch.Size([1, 3]), {})
    """

    def __init__(self, mask: torch.Tensor):
        self.mask = mask
        self.cache: dict[Any, Any] = {}


def _mask_tensor(mask: torch.Tensor | RowMask | None) -> torch.Tensor | None:
    return mask.mask if isinstance(mask, RowMask) else mask


# ---- rule objects ----
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

    A rule declares everything a driver needs, and the drivers ask it:

    * the step: :meth:`direction` (on the last dimension, so that a batch of problems
      advances in one call) and :meth:`step`; :meth:`batched_step` for the batched loop;
    * the automatic step :meth:`learning_rate` and the stability bound :meth:`max_step`
      (inf for rules that cannot diverge; :attr:`bounded` says whether the drivers need
      s_max(K)), checked by :meth:`check_learning_rate`;
    * whether the step uses the training rows of each problem (:attr:`uses_mask`: the
      batched loop then passes a :class:`RowMask`);
    * its options (:attr:`option_names`, read by :attr:`options`, changed by
      :meth:`with_options`), among them heavy-ball ``momentum`` and ``nesterov``, which the
      reference driver runs for every rule;
    * the fast backends that compute its path (:attr:`backends`, names of :data:`BACKENDS`):
      ``fast_backends`` without momentum, ``momentum_backends`` among them with it.

    A new rule subclasses this class, sets ``name`` and implements :meth:`direction` and
    :meth:`learning_rate` (and :meth:`max_step` if a step can be too large); it then runs in
    the reference driver, the estimators' fits (``fit_path``) and, since the base step is
    batch-agnostic, in path cross-validation. A specialised loop is declared by adding
    ``"single"`` to ``fast_backends`` and implementing :meth:`single_path`.
    """

    name = "rule"
    #: Backends of the rule without momentum (the base step runs in the batched loop).
    fast_backends: ClassVar[frozenset[str]] = frozenset({"batched"})
    #: Backends that also run its momentum (none unless declared).
    momentum_backends: ClassVar[frozenset[str]] = frozenset()
    #: Whether :meth:`direction` and :meth:`step` need the training rows of each problem.
    uses_mask: ClassVar[bool] = False
    #: Name of the compiled loop of :mod:`kernelflow.solvers._native` (with ``"native"``).
    native: ClassVar[str | None] = None
    #: Names of the options, stored once as attributes of the same name.
    option_names: ClassVar[tuple[str, ...]] = ()
    #: The single-path function of :mod:`kernelflow.solvers.paths` that runs the rule, if any
    #: (``as_rule`` accepts it in place of the rule).
    path_function: ClassVar[Callable[..., PathResult] | None] = None
    momentum = 0.0
    nesterov = False

    @property
    def backends(self) -> frozenset[str]:
        """The fast backends that compute this rule's path with its current options."""
        if self.momentum:
            return self.fast_backends & self.momentum_backends
        return self.fast_backends

    def supports(self, backend: str) -> bool:
        """Whether the fast backend ``backend`` (a name of :data:`BACKENDS`) runs this rule."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
        return backend in self.backends

    @property
    def options(self) -> dict[str, Any]:
        """The rule's options, by name."""
        return {key: getattr(self, key) for key in self.option_names}

    def with_options(self, **options: Any) -> PathRule:
        """This rule with ``options`` changed (itself when nothing changes)."""
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            raise ValueError(f"the {self.name} rule has no option {', '.join(unknown)}; its "
                             f"options are {self.option_names or 'none'}.")
        if all(getattr(self, key) == value for key, value in options.items()):
            return self
        return type(self)(**{**self.options, **options})

    def direction(self, residual: torch.Tensor,
                  mask: torch.Tensor | RowMask | None = None) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover

    def step(self, alpha: torch.Tensor, residual: torch.Tensor, eta,
             mask: torch.Tensor | RowMask | None = None) -> torch.Tensor:
        """``alpha + eta * direction(residual)`` on the last dimension."""
        if self.uses_mask:
            return alpha + eta * self.direction(residual, mask)
        return alpha + eta * self.direction(residual)

    def batched_step(self, alpha: torch.Tensor, residual: torch.Tensor, eta: float,
                     mask: RowMask) -> torch.Tensor:
        """The step of the batched loop: ``alpha`` (..., n) of every problem, ``residual``
        zero off each problem's training rows ``mask``; may reuse the memory of both."""
        if self.uses_mask:
            return self.step(alpha, residual, eta, mask)
        return self.step(alpha, residual, eta)

    def learning_rate(self, K, y: torch.Tensor, s_max: float | None = None,
                      sample_weight: torch.Tensor | None = None) -> float:
        """The automatic step; with ``sample_weight``, that of the repeated-row problem
        (``s_max`` is then the top eigenvalue of W^1/2 K W^1/2)."""
        raise NotImplementedError  # pragma: no cover

    def max_step(self, s_max: float) -> float:
        """Largest stable step for a kernel matrix with top eigenvalue ``s_max``."""
        return math.inf

    @property
    def bounded(self) -> bool:
        """Whether a step can be too large, so that the drivers need s_max(K)."""
        return self.max_step(1.0) < math.inf

    def check_learning_rate(self, eta: float, s_max: float) -> None:
        """Raise :class:`DivergenceError` when ``eta`` exceeds :meth:`max_step`."""
        bound = self.max_step(s_max)
        if eta > bound * (1 + 1e-9):
            raise DivergenceError(
                f"learning_rate={eta:.4g} diverges for this kernel matrix with the {self.name} "
                f"rule (s_max(K) ~ {s_max:.4g}); use learning_rate <= {bound:.4g} or "
                "learning_rate='auto'.")

    def single_path(self, K, y: torch.Tensor, *, sample_weight: torch.Tensor | None = None,
                    **kwargs: Any) -> PathResult:
        """The rule's specialised single path (declared by ``"single"``), the arguments of
        :func:`~kernelflow.solvers.paths.driver.rule_path` plus its own backend options."""
        raise NotImplementedError(f"the {self.name} rule declares no single path.")

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"


class GradientRule(PathRule):
    """Kernel gradient descent, ``alpha += eta r``, optionally with heavy-ball or Nesterov
    momentum gamma (Remark 4.2): ``alpha += gamma (alpha - alpha_prev) + eta r`` with r taken
    at the look-ahead point for Nesterov.

    Examples
    --------
    >>> import torch
    >>> GradientRule().step(torch.zeros(2), torch.tensor([1.0, -2.0]), 0.5).tolist()
    [0.5, -1.0]
    >>> round(GradientRule().max_step(4.0), 3)
    0.5
    >>> sorted(GradientRule(momentum=0.5).backends)  # no closed form, no batched loop
    ['eigenbasis', 'single', 'weighted']
    """

    name = "gradient"
    fast_backends = frozenset({"single", "weighted", "eigenbasis", "spectral", "batched"})
    momentum_backends = frozenset({"single", "weighted", "eigenbasis"})
    option_names = ("momentum", "nesterov")
    path_function = staticmethod(gradient_descent_path)

    def __init__(self, momentum: float = 0.0, nesterov: bool = False):
        momentum = float(momentum)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
        self.momentum = momentum
        self.nesterov = bool(nesterov)

    def direction(self, residual, mask=None):
        return residual

    def learning_rate(self, K, y=None, s_max=None, sample_weight=None):
        return gradient_learning_rate(K, s_max=s_max)

    def max_step(self, s_max):
        g = self.momentum
        bound = 2.0 * (1 + g) / (1 + 2 * g) if self.nesterov else 2.0 * (1 + g)
        return bound / s_max if s_max > 0 else math.inf

    def check_learning_rate(self, eta, s_max):
        check_gradient_learning_rate(eta, s_max, self.momentum, self.nesterov)

    def single_path(self, K, y, *, sample_weight=None, **kwargs):
        return gradient_descent_path(K, y, momentum=self.momentum, nesterov=self.nesterov,
                                     sample_weight=sample_weight, **kwargs)


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
    fast_backends = frozenset({"single", "weighted", "batched", "native"})
    path_function = staticmethod(sign_gradient_path)

    def direction(self, residual, mask=None):
        return torch.sign(residual)

    def batched_step(self, alpha, residual, eta, mask):
        return alpha.add_(residual.sign_(), alpha=eta)  # in place: two passes, not three

    def learning_rate(self, K, y, s_max=None, sample_weight=None):
        return sign_learning_rate(K, y, s_max=s_max, sample_weight=sample_weight)

    def single_path(self, K, y, *, sample_weight=None, **kwargs):
        return sign_gradient_path(K, y, sample_weight=sample_weight, **kwargs)


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
    fast_backends = frozenset({"single", "weighted", "batched", "native"})
    path_function = staticmethod(coordinate_descent_path)

    def direction(self, residual, mask=None):
        return coordinate_direction(residual)

    def learning_rate(self, K, y, s_max=None, sample_weight=None):
        return coordinate_learning_rate(K, y)

    def single_path(self, K, y, *, sample_weight=None, **kwargs):
        return coordinate_descent_path(K, y, sample_weight=sample_weight, **kwargs)


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
    fast_backends = frozenset({"batched"})
    uses_mask = True
    option_names = ("epsilon", "constant")

    def __init__(self, epsilon: float | None = None, constant: float = HUBER_CONSTANT):
        if epsilon is not None:
            epsilon = float(epsilon)
            if not (epsilon > 0 and math.isfinite(epsilon)):
                raise ValueError(f"epsilon must be a positive finite number, got {epsilon}.")
        self.epsilon = epsilon
        self.constant = float(constant)
        self.last_epsilon: torch.Tensor | float | None = None

    def threshold(self, residual: torch.Tensor, mask: torch.Tensor | None = None):
        """epsilon, or the adaptive threshold of each problem (shape (..., 1))."""
        if self.epsilon is not None:
            return self.epsilon
        host = self._host(residual, mask)
        return torch.from_numpy(host[0]) if host is not None else self._tensor_threshold(
            residual, mask)

    def _tensor_threshold(self, residual, mask):
        mask = _mask_tensor(mask)
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
        where a problem has no training row. Cached on a :class:`RowMask` (which a batched
        driver keeps between steps) for each residual shape; a bare tensor mask is read at
        every call.
        """
        n = shape[-1]
        if mask is None:  # every row trains (n > 0: checked by the caller)
            return None, (n - 1) // 2, n - 1
        cache = mask.cache if isinstance(mask, RowMask) else None
        if cache is not None and ("huber", shape) in cache:
            return cache[("huber", shape)]
        tensor = _mask_tensor(mask)
        assert tensor is not None
        keep = np.ascontiguousarray(np.broadcast_to((tensor > 0).numpy(), shape)).reshape(-1, n)
        count = keep.sum(-1, dtype=np.int64)
        if not bool((count > 0).all()):
            rows = None
        elif bool((count == count[0]).all()):
            rows = (keep, int(count[0] - 1) // 2, int(count[0] - 1))
        else:
            at = np.arange(count.size)
            rows = (keep, (at, (count - 1) // 2), (at, count - 1))
        if cache is not None:
            cache[("huber", shape)] = rows
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
        mask_t = _mask_tensor(mask)
        if (self.epsilon is not None or residual.device.type != "cpu"
                or residual.requires_grad or residual.dtype not in (torch.float32, torch.float64)
                or residual.ndim == 0 or residual.shape[-1] == 0
                or (mask_t is not None and (mask_t.device.type != "cpu"
                                            or mask_t.requires_grad))):
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


#: The rules a method name stands for (``as_rule("sign")``).
RULES: dict[str, type[PathRule]] = {"gradient": GradientRule, "sign": SignRule,
                                    "coordinate": CoordinateRule}


def as_rule(rule, **options: Any) -> PathRule:
    """A :class:`PathRule` from a rule, a method name of :data:`RULES` or the single-path
    function a rule declares (``path_function``), with ``options`` set
    (:meth:`PathRule.with_options`).

    Examples
    --------
    >>> as_rule("sign").name
    'sign'
    >>> as_rule("gradient", momentum=0.5)
    GradientRule(momentum=0.5, nesterov=False)
    """
    if isinstance(rule, PathRule):
        found = rule
    elif isinstance(rule, str):
        if rule not in RULES:
            raise ValueError(f"method must be one of {tuple(RULES)} or a PathRule, got {rule!r}.")
        found = RULES[rule]()
    else:
        match = [cls for cls in RULES.values() if cls.path_function is rule]
        if not match:
            raise ValueError("path_function must be one of the three paths of "
                             f"kernelflow.solvers.paths or a PathRule, got {rule!r}.")
        found = match[0]()
    return found.with_options(**options) if options else found
