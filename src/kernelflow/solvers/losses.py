"""Pointwise losses ``l(u, y)`` and their (sub)derivatives in the prediction ``u``.

These are the losses of Dai et al. (2014), Sec. 3 (digest §3): each step of doubly stochastic
training only needs ``l'(f(x_i), y_i)``. Every loss takes ``u`` and ``y`` of shape (n, C) (one
column per output; binary labels are ±1, multiclass labels one-hot) and returns per-row values
``(n,)`` from :meth:`Loss.value` and the derivative ``(n, C)`` from :meth:`Loss.derivative`. Cost
O(nC). At a kink the derivative takes the one-sided value stated in each class.

Examples
--------
>>> import torch
>>> u, y = torch.tensor([[0.5]]), torch.tensor([[2.0]])
>>> loss = get_loss("huber", epsilon=1.0)
>>> float(loss.value(u, y)[0]), float(loss.derivative(u, y)[0, 0])
(1.0, -1.0)
"""

from __future__ import annotations

import torch

__all__ = [
    "Loss",
    "SquaredLoss",
    "HuberLoss",
    "EpsilonInsensitiveLoss",
    "AbsoluteLoss",
    "QuantileLoss",
    "HingeLoss",
    "SquaredHingeLoss",
    "LogisticLoss",
    "SoftmaxLoss",
    "NoveltyLoss",
    "get_loss",
    "LOSSES",
    "ResidualLoss",
    "RESIDUAL_LOSSES",
    "get_residual_loss",
]


class Loss:
    """Base class: ``value(u, y) -> (n,)`` summed over outputs, ``derivative(u, y) -> (n, C)``."""

    #: labels are classes (±1 or one-hot), not real targets
    is_classification = False
    #: the loss carries a jointly optimised offset (novelty detection)
    has_offset = False

    def _elementwise(self, u, y):
        raise NotImplementedError

    def value(self, u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (n, C), (n, C) -> (n,)
        """Loss of each row, summed over the output columns."""
        return self._elementwise(u, y).sum(1)

    def derivative(self, u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # -> (n, C)
        """``∂l/∂u``, the quantity step 5 of Algorithm 1 multiplies the features with."""
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class SquaredLoss(Loss):
    """Kernel ridge regression: ``l = ½ (u - y)²``, ``l' = u - y``."""

    def _elementwise(self, u, y):
        return 0.5 * (u - y) ** 2

    def derivative(self, u, y):
        return u - y


class HuberLoss(Loss):
    """Robust regression: ``½r²`` for ``|r| ≤ ε``, ``ε|r| - ½ε²`` beyond; ``l' = clip(r, ±ε)``.

    ``r = u - y``; the paper fixes ``ε = 1``.
    """

    def __init__(self, epsilon=1.0):
        self.epsilon = float(epsilon)

    def _elementwise(self, u, y):
        r = (u - y).abs()
        e = self.epsilon
        return torch.where(r <= e, 0.5 * r * r, e * r - 0.5 * e * e)

    def derivative(self, u, y):
        return (u - y).clamp(-self.epsilon, self.epsilon)


class EpsilonInsensitiveLoss(Loss):
    """Support vector regression: ``l = max(0, |u - y| - ε)``, ``l' = sign(u - y)·1[|u-y| > ε]``."""

    def __init__(self, epsilon=0.1):
        self.epsilon = float(epsilon)

    def _elementwise(self, u, y):
        return ((u - y).abs() - self.epsilon).clamp_min(0.0)

    def derivative(self, u, y):
        r = u - y
        return torch.where(r.abs() > self.epsilon, torch.sign(r), torch.zeros_like(r))


class AbsoluteLoss(EpsilonInsensitiveLoss):
    """Least absolute deviation, the ε = 0 case: ``l = |u - y|``, ``l' = sign(u - y)``."""

    def __init__(self):
        self.epsilon = 0.0


class QuantileLoss(Loss):
    """Quantile (pinball) loss at level τ: ``max(τ(y - u), (1 - τ)(u - y))``.

    ``l' = 1 - τ`` if ``u ≥ y`` and ``-τ`` otherwise.
    """

    def __init__(self, quantile=0.5):
        self.quantile = float(quantile)

    def _elementwise(self, u, y):
        t = self.quantile
        return torch.maximum(t * (y - u), (1.0 - t) * (u - y))

    def derivative(self, u, y):
        t = self.quantile
        return torch.where(u >= y, torch.full_like(u, 1.0 - t), torch.full_like(u, -t))


class HingeLoss(Loss):
    """Kernel SVM: ``l = max(0, 1 - yu)``, ``l' = -y`` if ``yu < 1`` else 0 (labels ±1)."""

    is_classification = True

    def _elementwise(self, u, y):
        return (1.0 - y * u).clamp_min(0.0)

    def derivative(self, u, y):
        return torch.where(y * u < 1.0, -y, torch.zeros_like(u))


class SquaredHingeLoss(Loss):
    """ℓ2-SVM: ``l = ½ max(0, 1 - yu)²``, ``l' = u - y`` if ``yu < 1`` else 0 (labels ±1)."""

    is_classification = True

    def _elementwise(self, u, y):
        return 0.5 * (1.0 - y * u).clamp_min(0.0) ** 2

    def derivative(self, u, y):
        return torch.where(y * u < 1.0, u - y, torch.zeros_like(u))


class LogisticLoss(Loss):
    """Binary kernel logistic regression: ``l = log(1 + e^{-yu})``, ``l' = -y σ(-yu)``."""

    is_classification = True

    def _elementwise(self, u, y):
        return torch.nn.functional.softplus(-y * u)

    def derivative(self, u, y):
        return -y * torch.sigmoid(-y * u)


class SoftmaxLoss(Loss):
    """Multiclass kernel logistic: ``l = -u_y + log Σ_c e^{u_c}``, ``l' = softmax(u) - δ_y``.

    ``y`` is one-hot of shape (n, C).
    """

    is_classification = True

    def value(self, u, y):
        return torch.logsumexp(u, dim=1) - (u * y).sum(1)

    def derivative(self, u, y):
        return torch.softmax(u, dim=1) - y


class NoveltyLoss(Loss):
    """One-class (novelty) loss ``l = max(0, τ - u)`` with an offset τ optimised jointly.

    The objective is ``E[max(0, τ - f(x))] + (ν/2)|f|² - ντ``; ``∂l/∂u = -1[u < τ]`` and
    ``∂l/∂τ = 1[u < τ]``. Here ``y`` holds τ (broadcast to ``u``'s shape).
    """

    has_offset = True

    def _elementwise(self, u, y):
        return (y - u).clamp_min(0.0)

    def derivative(self, u, y):
        return -(u < y).to(u.dtype)

    def offset_derivative(self, u, tau):
        """``∂l/∂τ = 1[u < τ]`` of shape (n, C)."""
        return (u < tau).to(u.dtype)


LOSSES = {
    "squared_error": SquaredLoss,
    "huber": HuberLoss,
    "epsilon_insensitive": EpsilonInsensitiveLoss,
    "absolute_error": AbsoluteLoss,
    "quantile": QuantileLoss,
    "hinge": HingeLoss,
    "squared_hinge": SquaredHingeLoss,
    "log_loss": LogisticLoss,
    "softmax": SoftmaxLoss,
    "novelty": NoveltyLoss,
}


def get_loss(name, *, epsilon=None, quantile=0.5) -> Loss:
    """Build a loss from its name (keys of ``LOSSES``) or return a :class:`Loss` as is.

    ``epsilon`` is Huber's threshold (default 1, the paper's) or the SVR tube (default 0.1).

    Examples
    --------
    >>> get_loss("quantile", quantile=0.9)
    QuantileLoss(quantile=0.9)
    """
    if isinstance(name, Loss):
        return name
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}; choose one of {sorted(LOSSES)}.")
    if name == "huber":
        return HuberLoss(1.0 if epsilon is None else epsilon)
    if name == "epsilon_insensitive":
        return EpsilonInsensitiveLoss(0.1 if epsilon is None else epsilon)
    if name == "quantile":
        return QuantileLoss(quantile)
    return LOSSES[name]()


# ---- losses of a residual r = y - f: robust training and validation scoring --------------------
class ResidualLoss:
    """A loss of the residual ``r = y - f`` with everything its users need, written once.

    ``rho(r, eps)`` is the training loss, ``psi(r, eps) = rho'(r)`` its derivative (the
    influence function of M-estimation), ``irls_weight(r, eps) = psi(r) / r`` the weight of
    iteratively reweighted least squares, ``error(r, eps)`` the per-row validation error that
    early stopping averages (the squared error for ``"squared"``, so that it reports the mean
    squared error; ``rho`` otherwise), ``smoothness`` the Lipschitz constant of ``psi`` (None when
    ``psi`` jumps) and ``needs_threshold`` whether ``eps`` (Huber's threshold) is used. With
    ``inplace=True`` ``error`` may overwrite ``r`` (batched validation scoring saves a copy).
    Cost O(size of r).

    Examples
    --------
    >>> r = torch.tensor([-3.0, 0.5, 2.0])
    >>> get_residual_loss("huber").psi(r, 1.0).tolist()
    [-1.0, 0.5, 1.0]
    >>> get_residual_loss("squared").error(r, None).tolist(), RESIDUAL_LOSSES["absolute"].smoothness
    ([9.0, 0.25, 4.0], None)
    """

    name: str = ""
    smoothness: float | None = None
    needs_threshold = False

    def rho(self, r: torch.Tensor, eps) -> torch.Tensor:
        raise NotImplementedError

    def psi(self, r: torch.Tensor, eps) -> torch.Tensor:
        raise NotImplementedError

    def irls_weight(self, r: torch.Tensor, eps) -> torch.Tensor:
        a = r.abs()
        return torch.where(a > 0, self.psi(r, eps) / torch.where(a > 0, r, torch.ones_like(r)),
                           torch.full_like(r, self._weight_at_zero()))

    def _weight_at_zero(self) -> float:
        return 1.0

    def error(self, r: torch.Tensor, eps, *, inplace: bool = False) -> torch.Tensor:
        return self.rho(r, eps)

    def __repr__(self):
        return f"get_residual_loss({self.name!r})"


class _Squared(ResidualLoss):
    name, smoothness = "squared", 1.0

    def rho(self, r, eps):
        return 0.5 * r * r

    def psi(self, r, eps):
        return r

    def error(self, r, eps, *, inplace=False):
        return r.square_() if inplace else r.square()


class _Absolute(ResidualLoss):
    name, smoothness = "absolute", None

    def rho(self, r, eps):
        return r.abs()

    def psi(self, r, eps):
        return torch.sign(r)

    def _weight_at_zero(self):
        return float("inf")

    def error(self, r, eps, *, inplace=False):
        return r.abs_() if inplace else r.abs()


class _Huber(ResidualLoss):
    name, smoothness, needs_threshold = "huber", 1.0, True

    def rho(self, r, eps):
        a = r.abs()
        return torch.where(a <= eps, 0.5 * a * a, eps * (a - 0.5 * eps))

    def psi(self, r, eps):
        if isinstance(eps, torch.Tensor):
            return torch.maximum(torch.minimum(r, eps), -eps)
        return r.clamp(-eps, eps)

    def error(self, r, eps, *, inplace=False):
        a = r.abs_() if inplace else r.abs()
        return torch.where(a <= eps, 0.5 * a.square(), eps * (a - 0.5 * eps))


#: the residual losses by name: robust Nyström training, path rules' validation scoring,
#: estimators' ``loss`` / ``validation_loss`` options
RESIDUAL_LOSSES: dict[str, ResidualLoss] = {L.name: L() for L in (_Squared, _Absolute, _Huber)}


def get_residual_loss(name, *, what: str = "loss") -> ResidualLoss:
    """The :class:`ResidualLoss` called ``name`` (a ``ValueError`` naming ``what`` otherwise).

    Examples
    --------
    >>> get_residual_loss("absolute").rho(torch.tensor([-2.0]), None).tolist()
    [2.0]
    """
    if isinstance(name, ResidualLoss):
        return name
    try:
        return RESIDUAL_LOSSES[name]
    except (KeyError, TypeError):
        raise ValueError(f"{what} must be one of {tuple(RESIDUAL_LOSSES)}, got {name!r}.") from None
