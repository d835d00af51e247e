"""Kernel functions.

A kernel is a plain parameter object: it says *what* to compute for one block k(X1, X2) and its
diagonal; :mod:`kernelflow.operators` decides *how* (tiling, memory, devices).

Bandwidth convention
--------------------
Every distance kernel has a bandwidth ``sigma`` > 0, in the units of the inputs: a number, or a
vector of one bandwidth per feature (automatic relevance determination, ARD), in which case d is
the distance between x / sigma and x' / sigma (elementwise) and the formulas below hold with
sigma = 1:

=================  ===========================================  ======================
kernel             k(x, x')  with d = ||x - x'||_2              scikit-learn ``gamma``
=================  ===========================================  ======================
``Gaussian``       exp(-d^2 / (2 sigma^2))                      sigma = 1/sqrt(2 gamma)
``Laplace``        exp(-d / sigma)                              sigma = 1/gamma
``Matern`` nu=3/2  (1 + sqrt(3) d/sigma) exp(-sqrt(3) d/sigma)  sigma = 1/gamma
``Matern`` nu=5/2  (1 + sqrt(5) d/sigma + 5d^2/(3 sigma^2))     sigma = 1/gamma
                   * exp(-sqrt(5) d/sigma)
``Cauchy``         1 / (1 + d^2 / sigma^2)                      sigma = 1/sqrt(gamma)
``Linear``         <x, x'>                                      --
``Polynomial``     (gamma <x, x'> + coef0)^degree               gamma as is
=================  ===========================================  ======================

scikit-learn's ``"laplacian"`` kernel uses the l1 distance, so it does *not* map onto ``Laplace``
(which uses the Euclidean distance, as in the kernel-regression literature) and is refused.

Composite kernels
-----------------
Kernels combine with ``+`` (:class:`Sum`), ``*`` (:class:`Product`, or :class:`Scaled` with a
positive number) and :meth:`Kernel.on` / :class:`Additive` (kernels on groups of columns). Their
parameters follow scikit-learn's nested names: ``(Gaussian(1.0) + Linear()).get_params()``
holds ``k1__sigma``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Collection, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard, cast, overload

import numpy as np
import torch

if TYPE_CHECKING:
    from typing_extensions import Self

    from .typing import ArrayLike

    #: a bandwidth: a positive number, or a vector of one per feature
    _Bandwidth: TypeAlias = float | Sequence[float] | np.ndarray | torch.Tensor

__all__ = [
    "Kernel",
    "Gaussian",
    "Laplace",
    "Matern",
    "Cauchy",
    "Linear",
    "Polynomial",
    "Sum",
    "Product",
    "Scaled",
    "Additive",
    "make_kernel",
    "check_bandwidth",
    "check_n_features",
    "median_heuristic",
    "sq_distances",
    "KERNEL_NAMES",
]

#: log2(e): exp(x) = exp2(x log2 e); exp2 is the cheaper of the two in torch's CPU kernels
_LOG2E = 1.4426950408889634


def sq_distances(X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances ||x_i - z_j||^2, clamped at 0.

    Uses the expansion ||x||^2 + ||z||^2 - 2<x, z> (one GEMM). Cost O(n1 n2 d).

    Examples
    --------
    >>> import torch
    >>> sq_distances(torch.tensor([[0.0, 0.0]]), torch.tensor([[3.0, 4.0]]))
    tensor([[25.]])
    """
    n1 = (X1 * X1).sum(1, keepdim=True)
    n2 = (X2 * X2).sum(1, keepdim=True)
    D = torch.addmm(n1, X1, X2.T, alpha=-2.0).add_(n2.T)
    return D.clamp_(min=0.0)


class Kernel:
    """Base class of kernels: a plain parameter object.

    Subclasses implement :meth:`_prepare` (per-side preprocessing done once per operator, e.g.
    scaling by the bandwidth) and :meth:`_block` (the kernel block from prepared inputs). Calling
    the kernel, ``kernel(X1, X2)``, evaluates the dense block. ``get_params``/``set_params`` follow
    scikit-learn so that ``sklearn.base.clone`` works on estimators holding a kernel.
    """

    @property
    def is_stationary(self) -> bool:
        """Whether k(x, x') depends on x - x' only (subclasses override it)."""
        return False

    # ---- spectral measure (random features) ---------------------------------------------------
    def has_spectral_measure(self) -> bool:
        """Whether :meth:`sample_frequencies` can sample this kernel's spectral measure (true for
        the distance kernels and sums, products, scalings and column groups of them)."""
        return False

    def spectral_mass(self) -> float:
        """k(x, x) of a shift-invariant kernel: the total mass of its spectral measure."""
        raise TypeError(f"{type(self).__name__} has no spectral measure.")

    def sample_frequencies(self, d: int, m: int, generator: torch.Generator) -> torch.Tensor:
        """``m`` frequencies (a (d, m) float64 tensor) from the spectral measure normalised to
        a probability, drawn from ``generator`` only (Bochner: k(x - x') = mass E[cos w^T(x -
        x')]). Random-feature maps call this; the draws are a function of the generator's state.
        """
        raise TypeError(f"{type(self).__name__} has no spectral measure to sample.")

    # ---- scikit-learn style parameters -----------------------------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        return list(_param_names(cls))

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self._get_param_names()}
        if deep:
            for name, child in self._children():
                out.update({f"{name}__{k}": v for k, v in child.get_params(deep=True).items()})
        return out

    def set_params(self, **params: Any) -> Self:
        valid = self._get_param_names()
        children = dict(self._children())
        for key, value in params.items():
            head, _, rest = key.partition("__")
            if rest and head in children:
                children[head].set_params(**{rest: value})
            elif key in valid:
                setattr(self, key, value)
            else:
                raise ValueError(f"Invalid parameter {key!r} for kernel {type(self).__name__}.")
        return self

    def _children(self) -> list[tuple[str, Kernel]]:
        """(name, kernel) pairs of the kernels this one is built from (nested parameters)."""
        return []

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and _freeze(self) == _freeze(other)

    def __hash__(self) -> int:
        return hash(_freeze(self))

    # ---- composition ----------------------------------------------------------------------
    def __add__(self, other: Kernel) -> Sum:
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum(self, other)

    @overload
    def __mul__(self, other: Kernel) -> Product: ...

    @overload
    def __mul__(self, other: float) -> Scaled: ...

    def __mul__(self, other: Kernel | float) -> Product | Scaled:
        if isinstance(other, Kernel):
            return Product(self, other)
        if isinstance(other, Real) and not isinstance(other, bool):
            return Scaled(self, float(other))
        return NotImplemented

    __rmul__ = __mul__

    def on(self, columns: Collection[int]) -> Additive:
        """This kernel applied to the given feature columns only: ``Additive([(columns, self)])``.

        Examples
        --------
        >>> import torch
        >>> k = Gaussian(1.0).on([0])
        >>> X = torch.tensor([[0.0, 5.0], [1.0, -5.0]], dtype=torch.float64)
        >>> bool(torch.equal(k(X), Gaussian(1.0)(X[:, :1])))
        True
        """
        return Additive([(columns, self)])

    # ---- evaluation -----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``ValueError`` if a parameter is invalid."""

    def _prepare(self, X: torch.Tensor, side: int) -> torch.Tensor:  # shape: (n, d) -> (n, d')
        return X

    def _prepare_both(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(_prepare(X, 0), _prepare(X, 1))`` for a square block k(X, X); subclasses share
        the work of the two sides (the same values)."""
        return self._prepare(X, 0), self._prepare(X, 1)

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:  # -> (n1, n2)
        raise NotImplementedError

    def _width(self) -> tuple[int, int]:
        """(a, b): :meth:`_prepare` maps d columns to a d + b columns."""
        return (1, 0)

    def __call__(self, X1: torch.Tensor, X2: torch.Tensor | None = None) -> torch.Tensor:
        """Dense block k(X1, X2) of shape (n1, n2); ``X2=None`` means X1."""
        self.validate()
        X2 = X1 if X2 is None else X2
        if X1.shape[-1] != X2.shape[-1]:
            raise ValueError(
                f"X1 and X2 must have the same number of features, got {X1.shape[-1]} "
                f"and {X2.shape[-1]}."
            )
        shift = _common_shift(X1, X2) if self.is_stationary else None
        if X2 is X1:  # a square block: both sides from one preparation
            return self._block(*self._prepare_both(_sub(X1, shift)))
        return self._block(self._prepare(_sub(X1, shift), 0), self._prepare(_sub(X2, shift), 1))

    def diag(self, X: torch.Tensor) -> torch.Tensor:  # shape: (n,)
        """Diagonal k(x_i, x_i)."""
        self.validate()
        if self.is_stationary:
            return torch.ones(X.shape[0], dtype=X.dtype, device=X.device)
        return torch.stack([self(X[i : i + 1], X[i : i + 1])[0, 0] for i in range(X.shape[0])])

    def extra_memory(self, n1: int, n2: int) -> int:
        """Scratch elements one block of shape (n1, n2) needs beyond the block itself."""
        return 0


_PARAM_NAMES: dict[type, tuple[str, ...]] = {}


def _param_names(cls: type) -> tuple[str, ...]:
    # a class's constructor arguments do not change: read its signature once (inspect costs
    # tens of microseconds a call, and fits ask for the parameters of many kernels)
    names = _PARAM_NAMES.get(cls)
    if names is None:
        sig = inspect.signature(cls)  # the constructor's parameters, without self
        names = _PARAM_NAMES[cls] = tuple(sorted(p for p in sig.parameters if p != "self"))
    return names


def _freeze(value: Any) -> Any:
    # a hashable, comparable image of a parameter value (vectors of bandwidths included)
    if isinstance(value, Kernel):
        items = value.get_params(deep=False).items()
        return (type(value).__name__, tuple(sorted((k, _freeze(v)) for k, v in items)))
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return _freeze(value.tolist())  # a vector equals the list of its values
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _is_number(s: object) -> TypeGuard[float]:
    return isinstance(s, Real) and not isinstance(s, bool)


def check_bandwidth(sigma: ArrayLike, n_features: int | None = None, *,
                    name: str = "sigma") -> float | np.ndarray | torch.Tensor:
    """Validate a bandwidth: a positive finite number or a vector of them (one per feature).

    Returns the number as a float or the vector as a float64 NumPy array (a torch tensor is
    returned as is, so that gradients flow through learned bandwidths). With ``n_features``
    a vector must have that length.

    Examples
    --------
    >>> check_bandwidth(2)
    2.0
    >>> check_bandwidth([1.0, 2.0], 2)
    array([1., 2.])
    """
    if _is_number(sigma):
        if not math.isfinite(sigma) or sigma <= 0:
            raise ValueError(f"{name} must be a positive finite number, got {sigma!r}.")
        return float(sigma)
    try:
        arr = (sigma.detach().cpu().numpy() if isinstance(sigma, torch.Tensor)
               else np.asarray(sigma, dtype=np.float64))
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a positive number or a vector of them, got {sigma!r}."
        ) from None
    if arr.ndim > 1 or arr.size == 0:
        raise ValueError(
            f"{name} must be a positive number or a 1-D vector (one bandwidth per feature), "
            f"got shape {arr.shape}."
        )
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must hold positive finite values, got {sigma!r}.")
    if n_features is not None and arr.ndim == 1 and arr.shape[0] != n_features:
        raise ValueError(
            f"{name} has {arr.shape[0]} per-feature bandwidths but X has {n_features} features."
        )
    if isinstance(sigma, torch.Tensor):
        return sigma
    return float(arr) if arr.ndim == 0 else arr


def _scale(X: torch.Tensor, sigma: ArrayLike) -> torch.Tensor:
    """X / sigma for a scalar or per-feature bandwidth (IEEE division: equal bandwidths give the
    scalar's bits)."""
    if _is_number(sigma):
        return X / float(sigma)
    if isinstance(sigma, torch.Tensor):
        s = sigma.to(dtype=X.dtype, device=X.device)
    else:
        s = torch.as_tensor(np.asarray(sigma, dtype=np.float64), dtype=X.dtype, device=X.device)
    if s.ndim == 1 and s.shape[0] != X.shape[1]:
        raise ValueError(
            f"sigma has {s.shape[0]} per-feature bandwidths but X has {X.shape[1]} features."
        )
    return X / s


def _tracked(T: torch.Tensor) -> bool:
    # blocks on the autograd tape (learned parameters) must not be modified in place
    return torch.is_grad_enabled() and T.requires_grad


def _common_shift(X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
    # Stationary kernels are shift invariant; centring both sides on one point reduces the
    # cancellation in ||x||^2 + ||z||^2 - 2<x, z> (important in float32).
    return X2[: min(X2.shape[0], 1024)].mean(0, keepdim=True)


def _sub(X: torch.Tensor, shift: torch.Tensor | None) -> torch.Tensor:
    return X if shift is None else X - shift


def _gamma_draws(shape: float, n: int, gen: torch.Generator) -> torch.Tensor:
    """n Gamma(shape, 1) draws driven by ``gen`` only (Marsaglia-Tsang 2000 rejection; torch's
    own gamma sampler ignores generators). The rejection loop consumes draws in a fixed order."""
    if shape < 1.0:
        g = _gamma_draws(shape + 1.0, n, gen)
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        return g * u.pow(1.0 / shape)
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = torch.empty(n, dtype=torch.float64)
    todo = torch.arange(n)
    while todo.numel():
        k = todo.numel()
        x = torch.randn(k, generator=gen, dtype=torch.float64)
        u = torch.rand(k, generator=gen, dtype=torch.float64)
        v = (1.0 + c * x) ** 3
        ok = v > 0
        lv = torch.log(v.clamp_min(1e-300))
        ok &= torch.log(u) < 0.5 * x * x + d - d * v + d * lv
        out[todo[ok]] = d * v[ok]
        todo = todo[~ok]
    return out


class _DistanceKernel(Kernel):
    is_stationary = True
    sigma: Any  # as given: a number or a vector (see check_bandwidth)

    def __init__(self, sigma: _Bandwidth = 1.0) -> None:
        self.sigma = sigma

    def has_spectral_measure(self) -> bool:
        return True

    def spectral_mass(self) -> float:
        return 1.0

    @classmethod
    def sigma_from_gamma(cls, gamma: float) -> float:
        """The bandwidth for scikit-learn's ``gamma`` (``exp(-gamma d)`` for the exponential
        kernels: sigma = 1 / gamma)."""
        return 1.0 / gamma

    def sample_frequencies(self, d: int, m: int, generator: torch.Generator) -> torch.Tensor:
        Z = torch.randn(d, m, generator=generator, dtype=torch.float64)
        sigma = self.sigma
        s: float | torch.Tensor
        if isinstance(sigma, Real):
            s = float(sigma)
        else:  # per-feature bandwidths: frequency j of k((x - x') / sigma) is w_j / sigma_j
            check_n_features(self, d)
            s = torch.as_tensor(np.asarray(sigma, dtype=np.float64), dtype=torch.float64)
            s = s.reshape(d, 1)
        return self._frequencies(Z, s, m, generator)

    def _frequencies(self, Z: torch.Tensor, s: float | torch.Tensor, m: int,
                     generator: torch.Generator) -> torch.Tensor:
        # (d, m) standard normal -> frequencies
        raise NotImplementedError

    def validate(self) -> None:
        try:
            check_bandwidth(self.sigma)
        except ValueError as exc:
            raise ValueError(f"{type(self).__name__}: {exc}") from None

    def _prepare(self, X: torch.Tensor, side: int) -> torch.Tensor:
        return self._scaled(X)

    def _prepare_both(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        P = self._scaled(X)  # both sides are the same scaled inputs
        return P, P

    def _scaled(self, X: torch.Tensor) -> torch.Tensor:
        """X / sigma, refused when its squared distances would overflow."""
        P = _scale(X, self.sigma)
        top = float(P.detach().abs().max()) if P.numel() else 0.0
        if not top * 2.0 * math.sqrt(max(P.shape[-1], 1)) < math.sqrt(torch.finfo(P.dtype).max):
            raise ValueError(f"{type(self).__name__}: X / sigma reaches {top:.3g} (sigma="
                             f"{self.sigma!r}): squared distances overflow {P.dtype}; rescale X "
                             "or use a larger sigma.")
        return P

    def _sq_block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        return sq_distances(P1, P2)

    def _dist_block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        # Distances for kernels that take a square root: below the resolution of the expansion
        # |x|^2 + |z|^2 - 2<x, z> (a few eps times the norms) the squared distance is rounding
        # noise, whose square root (~sqrt(eps)) would be a visible error; snap it to 0.
        n1 = (P1 * P1).sum(1, keepdim=True)
        n2 = (P2 * P2).sum(1, keepdim=True)
        D2 = torch.addmm(n1, P1, P2.T, alpha=-2.0).add_(n2.T)
        noise = (n1 + n2.T).mul_(8 * torch.finfo(P1.dtype).eps)
        return D2.masked_fill_(D2 <= noise, 0.0)


class Gaussian(_DistanceKernel):
    """Gaussian (RBF) kernel k(x, x') = exp(-||x - x'||^2 / (2 sigma^2)).

    One block costs one GEMM of inner dimension d + 2 and one exp: the inputs are scaled by
    1/sigma and augmented with the half squared norms so that the GEMM returns the exponent.

    Parameters
    ----------
    sigma : float or array-like of shape (n_features,), default=1.0
        Bandwidth (> 0), or one per feature (ARD). scikit-learn's ``gamma`` is 1 / (2 sigma^2).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    >>> Gaussian(sigma=1.0)(X).numpy().round(4)
    array([[1.    , 0.6065],
           [0.6065, 1.    ]])
    """

    def _parts(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Xs = self._scaled(X)
        half = 0.5 * (Xs * Xs).sum(1, keepdim=True)
        return Xs, half, torch.ones_like(half)

    def _prepare(self, X: torch.Tensor, side: int) -> torch.Tensor:
        Xs, half, one = self._parts(X)
        # <[x, -|x|^2/2, 1], [z, 1, -|z|^2/2]> = <x, z> - |x|^2/2 - |z|^2/2 = -|x - z|^2 / 2
        return torch.cat([Xs, -half, one] if side == 0 else [Xs, one, -half], dim=1)

    def _prepare_both(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Xs, half, one = self._parts(X)
        return torch.cat([Xs, -half, one], dim=1), torch.cat([Xs, one, -half], dim=1)

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        # exponent <= 0 up to rounding; exp of a rounding-level positive value is 1 + O(eps).
        # exp(v) as exp2(v log2 e): 2-3x cheaper on CPUs, where the exponential dominates a
        # streamed kernel tile; the factor is applied to the product (not folded into P1) so
        # that the exponent of x = z cancels as exactly as before
        return torch.mm(P1, P2.T).mul_(_LOG2E).exp2_()

    def _width(self) -> tuple[int, int]:
        return (1, 2)

    def _frequencies(self, Z: torch.Tensor, s: float | torch.Tensor, m: int,
                     generator: torch.Generator) -> torch.Tensor:
        # spectral measure N(0, sigma^-2 I)
        return Z / s

    @classmethod
    def sigma_from_gamma(cls, gamma: float) -> float:
        """scikit-learn's ``exp(-gamma d^2)``: sigma = 1 / sqrt(2 gamma)."""
        return 1.0 / math.sqrt(2.0 * gamma)


class Laplace(_DistanceKernel):
    """Laplace (exponential) kernel k(x, x') = exp(-||x - x'||_2 / sigma).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Laplace
    >>> Laplace(sigma=2.0)(torch.tensor([[0.0], [2.0]])).numpy().round(4)
    array([[1.    , 0.3679],
           [0.3679, 1.    ]], dtype=float32)
    """

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        D2 = self._dist_block(P1, P2)
        if _tracked(D2):  # learned bandwidths: no in-place ops
            return torch.exp(-D2.sqrt())
        return D2.sqrt_().mul_(-_LOG2E).exp2_()

    def _frequencies(self, Z: torch.Tensor, s: float | torch.Tensor, m: int,
                     generator: torch.Generator) -> torch.Tensor:
        # multivariate Cauchy: z / (sigma |g|)
        g = torch.randn(m, generator=generator, dtype=torch.float64).abs_().clamp_min_(1e-300)
        return Z / (s * g)


class Matern(_DistanceKernel):
    """Matérn kernel with smoothness nu in {0.5, 1.5, 2.5}.

    nu = 1/2: exp(-d/sigma); nu = 3/2: (1 + sqrt(3) d/sigma) exp(-sqrt(3) d/sigma);
    nu = 5/2: (1 + sqrt(5) d/sigma + 5 d^2 / (3 sigma^2)) exp(-sqrt(5) d/sigma).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Matern
    >>> round(float(Matern(sigma=1.0, nu=1.5)(torch.zeros(1, 1), torch.ones(1, 1))[0, 0]), 4)
    0.4834
    """

    def __init__(self, sigma: _Bandwidth = 1.0, nu: float = 1.5) -> None:
        self.sigma = sigma
        self.nu = nu

    def validate(self) -> None:
        super().validate()
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"Matern: nu must be 0.5, 1.5 or 2.5, got {self.nu!r}.")

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        D2 = self._dist_block(P1, P2)
        if _tracked(D2):  # learned bandwidths: no in-place ops
            Dc = D2.sqrt() * (1.0 if self.nu == 0.5 else math.sqrt(3.0 if self.nu == 1.5 else 5.0))
            poly = 1.0 if self.nu == 0.5 else 1.0 + Dc
            if self.nu == 2.5:
                poly = poly + (5.0 / 3.0) * D2
            return poly * torch.exp(-Dc)
        D = D2.sqrt()
        if self.nu == 0.5:
            return D.mul_(-_LOG2E).exp2_()
        c = math.sqrt(3.0) if self.nu == 1.5 else math.sqrt(5.0)
        D.mul_(c)
        poly = 1.0 + D
        if self.nu == 2.5:
            poly.add_(D2, alpha=5.0 / 3.0)
        return poly.mul_(D.mul_(-_LOG2E).exp2_())

    def _frequencies(self, Z: torch.Tensor, s: float | torch.Tensor, m: int,
                     generator: torch.Generator) -> torch.Tensor:
        # multivariate t with 2 nu degrees of freedom
        nu = float(self.nu)
        u = 2.0 * _gamma_draws(nu, m, generator)  # chi^2 with 2 nu degrees of freedom
        return Z * torch.sqrt(2.0 * nu / u.clamp_min(1e-300)) / s


class Cauchy(_DistanceKernel):
    """Cauchy kernel k(x, x') = 1 / (1 + ||x - x'||^2 / sigma^2).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Cauchy
    >>> float(Cauchy(sigma=1.0)(torch.zeros(1, 1), torch.ones(1, 1))[0, 0])
    0.5
    """

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        return self._sq_block(P1, P2).add_(1.0).reciprocal_()

    def _frequencies(self, Z: torch.Tensor, s: float | torch.Tensor, m: int,
                     generator: torch.Generator) -> torch.Tensor:
        # Gaussian scale mixture z sqrt(2e) / sigma
        e = -torch.log1p(-torch.rand(m, generator=generator, dtype=torch.float64))  # Exp(1)
        return Z * torch.sqrt(2.0 * e) / s

    @classmethod
    def sigma_from_gamma(cls, gamma: float) -> float:
        """``1 / (1 + gamma d^2)``: sigma = 1 / sqrt(gamma)."""
        return 1.0 / math.sqrt(gamma)


class Linear(Kernel):
    """Linear kernel k(x, x') = <x, x'>.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Linear
    >>> Linear()(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]))
    tensor([[11.]])
    """

    def __init__(self) -> None:
        pass

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        return torch.mm(P1, P2.T)

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        return (X * X).sum(1)


class Polynomial(Kernel):
    """Polynomial kernel k(x, x') = (gamma <x, x'> + coef0)^degree.

    ``gamma=None`` means 1 / n_features (scikit-learn's default).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Polynomial
    >>> Polynomial(degree=2, gamma=1.0, coef0=1.0)(torch.tensor([[1.0]]), torch.tensor([[2.0]]))
    tensor([[9.]])
    """

    def __init__(self, degree: int = 3, gamma: float | None = None, coef0: float = 1.0) -> None:
        self.degree = degree
        self.gamma = gamma
        self.coef0 = coef0

    def validate(self) -> None:
        if not isinstance(self.degree, Real) or self.degree <= 0:
            raise ValueError(f"Polynomial: degree must be positive, got {self.degree!r}.")
        if self.gamma is not None and not (isinstance(self.gamma, Real) and self.gamma > 0):
            raise ValueError(f"Polynomial: gamma must be positive or None, got {self.gamma!r}.")
        if not isinstance(self.coef0, Real) or not math.isfinite(self.coef0):
            raise ValueError(f"Polynomial: coef0 must be a finite number, got {self.coef0!r}.")

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        g = 1.0 / P1.shape[1] if self.gamma is None else float(self.gamma)
        return torch.addmm(
            torch.full((1, 1), float(self.coef0), dtype=P1.dtype, device=P1.device),
            P1,
            P2.T,
            alpha=g,
        ).pow_(self.degree)

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        g = 1.0 / X.shape[1] if self.gamma is None else float(self.gamma)
        return (g * (X * X).sum(1) + float(self.coef0)) ** self.degree


def _is_column_index(i: object) -> bool:
    # a non-negative whole real number (validation of Additive's columns)
    if not isinstance(i, Real):
        return False
    v = cast(float, i)  # numbers.Real: int, float, NumPy scalars, ...
    return int(v) == v and v >= 0


def _split(P: torch.Tensor, kernels: Sequence[Kernel]) -> tuple[torch.Tensor, ...]:
    # prepared inputs of a composite are its children's, side by side: recover each child's
    # column count from d (a d + b columns each, d solved from the total)
    coeffs = [k._width() for k in kernels]
    a, b = sum(c[0] for c in coeffs), sum(c[1] for c in coeffs)
    d = (P.shape[1] - b) // a if a else 0
    return torch.split(P, [ca * d + cb for ca, cb in coeffs], dim=1)


class _Composite(Kernel):
    def _kernels(self) -> list[Kernel]:
        return [k for _, k in self._children()]

    @property
    def is_stationary(self) -> bool:
        return all(k.is_stationary for k in self._kernels())

    def validate(self) -> None:
        for k in self._kernels():
            if not isinstance(k, Kernel):
                raise TypeError(f"{type(self).__name__}: parts must be Kernel objects, got "
                                f"{type(k).__name__}.")
            k.validate()

    def _prepare(self, X: torch.Tensor, side: int) -> torch.Tensor:
        return torch.cat([k._prepare(X, side) for k in self._kernels()], dim=1)

    def _width(self) -> tuple[int, int]:
        coeffs = [k._width() for k in self._kernels()]
        return (sum(c[0] for c in coeffs), sum(c[1] for c in coeffs))

    def extra_memory(self, n1: int, n2: int) -> int:
        return n1 * n2 + max(k.extra_memory(n1, n2) for k in self._kernels())

    def has_spectral_measure(self) -> bool:
        return all(k.has_spectral_measure() for k in self._kernels())

    @staticmethod
    def _mixture_frequencies(parts: Sequence[tuple[Collection[int] | None, Kernel]], d: int,
                             m: int, generator: torch.Generator) -> torch.Tensor:
        """Frequencies of a sum: a mixture of the parts' measures, weights proportional to
        their masses; ``parts`` are (columns or None, kernel)."""
        f64 = torch.float64
        weights = torch.tensor([k.spectral_mass() for _, k in parts], dtype=f64)
        pick = torch.multinomial(weights / weights.sum(), m, replacement=True,
                                 generator=generator)
        W = torch.zeros(d, m, dtype=f64)
        for i, (cols, k) in enumerate(parts):
            mask = pick == i
            if cols is None:
                Wi = k.sample_frequencies(d, m, generator)
                W[:, mask] = Wi[:, mask]
            else:
                if max(cols) >= d:
                    raise ValueError(f"Additive: column {max(cols)} is out of range for X with "
                                     f"{d} features.")
                Wi = k.sample_frequencies(len(cols), m, generator)
                W[torch.tensor(cols)[:, None], mask.nonzero()[:, 0][None, :]] = Wi[:, mask]
        return W


class _Pair(_Composite):
    """Two kernels ``k1`` and ``k2`` combined entry by entry (a sum or a product)."""

    def __init__(self, k1: Kernel, k2: Kernel) -> None:
        self.k1 = k1
        self.k2 = k2

    def _children(self) -> list[tuple[str, Kernel]]:
        return [("k1", self.k1), ("k2", self.k2)]

    def _blocks(self, P1: torch.Tensor, P2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The blocks of ``k1`` and ``k2`` from the pair's prepared inputs."""
        A1, A2 = _split(P1, [self.k1, self.k2])
        B1, B2 = _split(P2, [self.k1, self.k2])
        return self.k1._block(A1, B1), self.k2._block(A2, B2)


class Sum(_Pair):
    """Sum of two kernels, k(x, x') = k1(x, x') + k2(x, x'); also written ``k1 + k2``.

    A sum of positive-definite kernels is positive definite; the sum of two shift-invariant
    kernels is shift invariant with the mixture of their spectral measures.

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(5, 2, dtype=torch.float64)
    >>> k = Gaussian(1.0) + Linear()
    >>> bool(torch.allclose(k(X), Gaussian(1.0)(X) + Linear()(X)))
    True
    >>> sorted(k.get_params())
    ['k1', 'k1__sigma', 'k2']
    """

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        K1, K2 = self._blocks(P1, P2)
        return K1 + K2 if _tracked(K1) or _tracked(K2) else K1.add_(K2)

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        return self.k1.diag(X) + self.k2.diag(X)

    def spectral_mass(self) -> float:
        return self.k1.spectral_mass() + self.k2.spectral_mass()

    def sample_frequencies(self, d: int, m: int, generator: torch.Generator) -> torch.Tensor:
        return self._mixture_frequencies([(None, self.k1), (None, self.k2)], d, m, generator)


class Product(_Pair):
    """Product of two kernels, k(x, x') = k1(x, x') k2(x, x'); also written ``k1 * k2``.

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(5, 2, dtype=torch.float64)
    >>> k = Gaussian(1.0) * Laplace(2.0)
    >>> bool(torch.allclose(k(X), Gaussian(1.0)(X) * Laplace(2.0)(X)))
    True
    """

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        K1, K2 = self._blocks(P1, P2)
        return K1 * K2 if _tracked(K1) or _tracked(K2) else K1.mul_(K2)

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        return self.k1.diag(X) * self.k2.diag(X)

    def spectral_mass(self) -> float:
        return self.k1.spectral_mass() * self.k2.spectral_mass()

    def sample_frequencies(self, d: int, m: int, generator: torch.Generator) -> torch.Tensor:
        # a product's measure is a convolution
        return (self.k1.sample_frequencies(d, m, generator)
                + self.k2.sample_frequencies(d, m, generator))


class Scaled(_Composite):
    """A kernel times a positive number, k(x, x') = scale * kernel(x, x'); also ``2.0 * k``.

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(4, 3, dtype=torch.float64)
    >>> k = 2.0 * Gaussian(1.0)
    >>> k
    Scaled(kernel=Gaussian(sigma=1.0), scale=2.0)
    >>> bool(torch.allclose(k(X), 2.0 * Gaussian(1.0)(X)))
    True
    """

    def __init__(self, kernel: Kernel, scale: float | torch.Tensor = 1.0) -> None:
        self.kernel = kernel
        self.scale = scale

    def _children(self) -> list[tuple[str, Kernel]]:
        return [("kernel", self.kernel)]

    def validate(self) -> None:
        super().validate()
        sc = self.scale
        if not _is_number(sc) and not (isinstance(sc, torch.Tensor) and sc.ndim == 0):
            raise ValueError(f"Scaled: scale must be a positive number, got {sc!r}.")
        check_bandwidth(sc, name="Scaled: scale")

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        K = self.kernel._block(P1, P2)
        if isinstance(self.scale, torch.Tensor):
            return K * self.scale.to(K.dtype)
        return K * float(self.scale) if _tracked(K) else K.mul_(float(self.scale))

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        d = self.kernel.diag(X)
        return d * (self.scale.to(d.dtype) if isinstance(self.scale, torch.Tensor)
                    else float(self.scale))

    def extra_memory(self, n1: int, n2: int) -> int:
        return self.kernel.extra_memory(n1, n2)

    def spectral_mass(self) -> float:
        return float(self.scale) * self.kernel.spectral_mass()

    def sample_frequencies(self, d: int, m: int, generator: torch.Generator) -> torch.Tensor:
        return self.kernel.sample_frequencies(d, m, generator)


class Additive(_Composite):
    """Sum of kernels on groups of feature columns, k(x, x') = sum_g k_g(x[c_g], x'[c_g]).

    Parameters
    ----------
    parts : list of (columns, Kernel)
        ``columns`` is a list of column indices (or a slice-free range). Groups may overlap.
        Nested parameter names are ``k0__sigma``, ``k1__sigma``, ... in the order of ``parts``.

    Examples
    --------
    >>> import torch
    >>> X = torch.randn(6, 3, dtype=torch.float64)
    >>> k = Additive([([0], Gaussian(1.0)), ([1, 2], Laplace(2.0))])
    >>> K = Gaussian(1.0)(X[:, [0]]) + Laplace(2.0)(X[:, [1, 2]])
    >>> bool(torch.allclose(k(X), K))
    True
    """

    def __init__(self, parts: Sequence[tuple[Collection[int], Kernel]]) -> None:
        self.parts = parts

    def _children(self) -> list[tuple[str, Kernel]]:
        try:
            return [(f"k{i}", part[1]) for i, part in enumerate(self.parts)]
        except (TypeError, IndexError):
            return []

    def _columns(self) -> list[torch.Tensor]:
        return [torch.as_tensor(list(cols), dtype=torch.long) for cols, _ in self.parts]

    def validate(self) -> None:
        if not isinstance(self.parts, list | tuple) or not self.parts or not all(
            isinstance(p, list | tuple) and len(p) == 2 for p in self.parts
        ):
            raise ValueError("Additive: parts must be a non-empty list of (columns, kernel).")
        for cols, _ in self.parts:
            c = list(cols)
            if not c or not all(_is_column_index(i) for i in c):
                raise ValueError(f"Additive: columns must be non-empty lists of column indices, "
                                 f"got {cols!r}.")
        super().validate()

    def _prepare(self, X: torch.Tensor, side: int) -> torch.Tensor:
        out = []
        for idx, k in zip(self._columns(), self._kernels(), strict=True):
            if int(idx.max()) >= X.shape[1]:
                raise ValueError(f"Additive: column {int(idx.max())} is out of range for X with "
                                 f"{X.shape[1]} features.")
            out.append(k._prepare(X[:, idx.to(X.device)], side))
        return torch.cat(out, dim=1)

    def _width(self) -> tuple[int, int]:
        return (0, sum(k._width()[0] * len(c) + k._width()[1]
                       for c, k in zip(self._columns(), self._kernels(), strict=True)))

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
        widths = [k._width()[0] * len(c) + k._width()[1]
                  for c, k in zip(self._columns(), self._kernels(), strict=True)]
        K = None
        for k, A, B in zip(self._kernels(), torch.split(P1, widths, 1), torch.split(P2, widths, 1),
                           strict=True):
            Kg = k._block(A, B)
            K = Kg if K is None else (K + Kg if _tracked(K) or _tracked(Kg) else K.add_(Kg))
        assert K is not None  # validate() refuses an empty list of parts
        return K

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, sum(
            k.diag(X[:, idx.to(X.device)])
            for idx, k in zip(self._columns(), self._kernels(), strict=True)))

    def spectral_mass(self) -> float:
        return sum(k.spectral_mass() for _, k in self.parts)

    def sample_frequencies(self, d: int, m: int, generator: torch.Generator) -> torch.Tensor:
        return self._mixture_frequencies([(list(c), k) for c, k in self.parts], d, m, generator)


KERNEL_NAMES: dict[str, type[Kernel]] = {
    "rbf": Gaussian,
    "gaussian": Gaussian,
    "laplace": Laplace,
    "exponential": Laplace,
    "matern12": Matern,
    "matern32": Matern,
    "matern52": Matern,
    "cauchy": Cauchy,
    "linear": Linear,
    "poly": Polynomial,
    "polynomial": Polynomial,
}
_NU = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}


def check_n_features(kernel: Kernel, n_features: int) -> None:
    """Raise ``ValueError`` if a per-feature bandwidth in ``kernel`` (or its parts) does not have
    ``n_features`` entries, or an :class:`Additive` part names a column beyond ``n_features``.

    Examples
    --------
    >>> check_n_features(Gaussian([1.0, 2.0]), 3)
    Traceback (most recent call last):
    ...
    ValueError: sigma has 2 per-feature bandwidths but X has 3 features.
    """
    if isinstance(kernel, Additive):
        for cols, k in kernel.parts:
            if max(int(c) for c in cols) >= n_features:
                raise ValueError(f"Additive: column {max(int(c) for c in cols)} is out of range "
                                 f"for X with {n_features} features.")
            check_n_features(k, len(list(cols)))
        return
    if isinstance(kernel, _DistanceKernel):
        check_bandwidth(kernel.sigma, n_features)
    for _, child in kernel._children():
        check_n_features(child, n_features)


def median_heuristic(X: ArrayLike, *, max_samples: int = 1000, random_state: int = 0) -> float:
    """Median of the pairwise Euclidean distances between (at most ``max_samples``) distinct rows.

    A common default bandwidth. Duplicate rows are removed first, so that repeating a sample
    (or weighting it by an integer) does not change the bandwidth. Cost O(m^2 d) with
    m = min(n, max_samples).

    Examples
    --------
    >>> import torch
    >>> median_heuristic(torch.tensor([[0.0], [1.0], [3.0]]))
    2.0
    """
    T = torch.as_tensor(X)
    if T.ndim != 2 or T.shape[0] < 1:
        raise ValueError("median_heuristic needs a non-empty 2-D array.")
    T = torch.unique(T, dim=0)
    if T.shape[0] < 2:
        return 1.0
    if T.shape[0] > max_samples:
        g = torch.Generator().manual_seed(int(random_state))
        idx = torch.randperm(T.shape[0], generator=g)[:max_samples].to(T.device)
        T = T[idx]
    T = T.to(torch.float64)
    D = sq_distances(T, T)
    iu = torch.triu_indices(T.shape[0], T.shape[0], offset=1, device=T.device)
    med = float(D[iu[0], iu[1]].sqrt().median())
    return med if med > 0 else 1.0


def make_kernel(kernel: str | Kernel = "rbf", *, sigma: ArrayLike | None = None,
                gamma: float | None = None, degree: int = 3, coef0: float = 1.0,
                X: torch.Tensor | np.ndarray | None = None) -> Kernel:
    """Turn a kernel name or :class:`Kernel` into a validated :class:`Kernel`.

    Parameters
    ----------
    kernel : str or Kernel
        A name in ``KERNEL_NAMES`` or a kernel object (returned as is; then ``sigma`` and
        ``gamma`` must be None).
    sigma : float or array-like of shape (n_features,), optional
        Bandwidth in this library's convention (see the module docstring); a vector gives one
        bandwidth per feature (ARD), checked against ``X``'s number of columns when given.
    gamma : float, optional
        scikit-learn's parameter; converted to ``sigma``. Give at most one of the two.
    degree, coef0 : polynomial kernel parameters.
    X : tensor, optional
        Training inputs; with neither ``sigma`` nor ``gamma``, distance kernels use
        ``median_heuristic(X)``.

    Examples
    --------
    >>> make_kernel("rbf", gamma=0.5)
    Gaussian(sigma=1.0)
    """
    n_features = None if X is None or getattr(X, "ndim", 0) != 2 else int(X.shape[1])
    if isinstance(kernel, Kernel):
        if sigma is not None or gamma is not None:
            raise ValueError("Give the bandwidth inside the kernel object, not as sigma/gamma.")
        kernel.validate()
        if n_features is not None:
            check_n_features(kernel, n_features)
        return kernel
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string or a Kernel, got {type(kernel).__name__}.")
    name = kernel.lower()
    if name == "laplacian":
        raise ValueError(
            "kernel='laplacian' (scikit-learn's l1 Laplacian) is not supported; use 'laplace' "
            "for exp(-||x - x'||_2 / sigma)."
        )
    if name not in KERNEL_NAMES:
        raise ValueError(f"Unknown kernel {kernel!r}; choose one of {sorted(KERNEL_NAMES)}.")
    cls = KERNEL_NAMES[name]
    if sigma is not None and gamma is not None:
        raise ValueError("Give at most one of sigma and gamma.")
    if gamma is not None and (
        not _is_number(gamma) or not math.isfinite(gamma) or gamma <= 0
    ):
        raise ValueError(f"gamma must be a positive finite number, got {gamma!r}.")
    if isinstance(sigma, str):
        if sigma != "ard" or not issubclass(cls, _DistanceKernel):
            raise ValueError(f"sigma='ard' (per-feature bandwidths) needs a distance kernel; got "
                             f"sigma={sigma!r} with kernel={kernel!r}.")
        if n_features is None:
            raise ValueError("sigma='ard' needs the training inputs X.")
        assert X is not None  # n_features comes from X
        # equal per-feature bandwidths at the median heuristic: the scalar kernel, ready to learn
        sigma = np.full(n_features, median_heuristic(X))
    if sigma is not None:
        sigma = check_bandwidth(sigma, n_features)
        if not _is_number(sigma) and not issubclass(cls, _DistanceKernel):
            raise ValueError(f"A per-feature sigma needs a distance kernel, not {kernel!r}.")
    out: Kernel
    if cls is Linear:
        out = Linear()
    elif cls is Polynomial:
        out = Polynomial(degree=degree, gamma=gamma, coef0=coef0)
    else:
        dist_cls = cast("type[_DistanceKernel]", cls)  # every other name is a distance kernel
        if sigma is None:
            if gamma is not None:
                sigma = dist_cls.sigma_from_gamma(float(gamma))
            elif X is not None:
                sigma = median_heuristic(X)
            else:
                sigma = 1.0
        out = Matern(sigma=sigma, nu=_NU[name]) if cls is Matern else dist_cls(sigma)
    out.validate()
    return out
