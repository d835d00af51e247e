"""Kernel functions.

A kernel is a plain parameter object: it says *what* to compute for one block k(X1, X2) and its
diagonal; :mod:`kernelflow.operators` decides *how* (tiling, memory, devices).

Bandwidth convention
--------------------
Every distance kernel has one bandwidth ``sigma`` > 0, in the units of the inputs:

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
"""

from __future__ import annotations

import inspect
import math
from numbers import Real

import torch

__all__ = [
    "Kernel",
    "Gaussian",
    "Laplace",
    "Matern",
    "Cauchy",
    "Linear",
    "Polynomial",
    "make_kernel",
    "median_heuristic",
    "sq_distances",
    "KERNEL_NAMES",
]


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

    #: k(x, x') depends on x - x' only.
    is_stationary = False

    # ---- scikit-learn style parameters -----------------------------------------------------
    @classmethod
    def _get_param_names(cls):
        sig = inspect.signature(cls.__init__)
        return sorted(p for p in sig.parameters if p != "self")

    def get_params(self, deep=True):
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        valid = self._get_param_names()
        for key, value in params.items():
            if key not in valid:
                raise ValueError(f"Invalid parameter {key!r} for kernel {type(self).__name__}.")
            setattr(self, key, value)
        return self

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_params() == other.get_params()

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.get_params().items()))))

    # ---- evaluation -----------------------------------------------------------------------
    def validate(self):
        """Raise ``ValueError`` if a parameter is invalid."""

    def _prepare(self, X: torch.Tensor, side: int) -> torch.Tensor:  # shape: (n, d) -> (n, d')
        return X

    def _block(self, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:  # -> (n1, n2)
        raise NotImplementedError

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


def _common_shift(X1, X2):
    # Stationary kernels are shift invariant; centring both sides on one point reduces the
    # cancellation in ||x||^2 + ||z||^2 - 2<x, z> (important in float32).
    return X2[: min(X2.shape[0], 1024)].mean(0, keepdim=True)


def _sub(X, shift):
    return X if shift is None else X - shift


class _DistanceKernel(Kernel):
    is_stationary = True

    def __init__(self, sigma=1.0):
        self.sigma = sigma

    def validate(self):
        s = self.sigma
        if not isinstance(s, Real) or isinstance(s, bool) or not math.isfinite(s) or s <= 0:
            raise ValueError(
                f"{type(self).__name__}: sigma must be a positive finite number, got {s!r}."
            )

    def _prepare(self, X, side):
        return self._scaled(X)

    def _scaled(self, X):
        """X / sigma, refused when its squared distances would overflow."""
        P = X / float(self.sigma)
        top = float(P.abs().max()) if P.numel() else 0.0
        if not top * 2.0 * math.sqrt(max(P.shape[-1], 1)) < math.sqrt(torch.finfo(P.dtype).max):
            raise ValueError(f"{type(self).__name__}: X / sigma reaches {top:.3g} (sigma="
                             f"{self.sigma!r}): squared distances overflow {P.dtype}; rescale X "
                             "or use a larger sigma.")
        return P

    def _sq_block(self, P1, P2):
        return sq_distances(P1, P2)

    def _dist_block(self, P1, P2):
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
    sigma : float, default=1.0
        Bandwidth (> 0). scikit-learn's ``gamma`` is 1 / (2 sigma^2).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    >>> Gaussian(sigma=1.0)(X).numpy().round(4)
    array([[1.    , 0.6065],
           [0.6065, 1.    ]])
    """

    def _prepare(self, X, side):
        Xs = self._scaled(X)
        half = 0.5 * (Xs * Xs).sum(1, keepdim=True)
        one = torch.ones_like(half)
        # <[x, -|x|^2/2, 1], [z, 1, -|z|^2/2]> = <x, z> - |x|^2/2 - |z|^2/2 = -|x - z|^2 / 2
        return torch.cat([Xs, -half, one] if side == 0 else [Xs, one, -half], dim=1)

    def _block(self, P1, P2):
        # exponent <= 0 up to rounding; exp of a rounding-level positive value is 1 + O(eps)
        return torch.mm(P1, P2.T).exp_()


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

    def _block(self, P1, P2):
        return self._dist_block(P1, P2).sqrt_().neg_().exp_()


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

    def __init__(self, sigma=1.0, nu=1.5):
        self.sigma = sigma
        self.nu = nu

    def validate(self):
        super().validate()
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"Matern: nu must be 0.5, 1.5 or 2.5, got {self.nu!r}.")

    def _block(self, P1, P2):
        D2 = self._dist_block(P1, P2)
        D = D2.sqrt()
        if self.nu == 0.5:
            return D.neg_().exp_()
        c = math.sqrt(3.0) if self.nu == 1.5 else math.sqrt(5.0)
        D.mul_(c)
        poly = 1.0 + D
        if self.nu == 2.5:
            poly.add_(D2, alpha=5.0 / 3.0)
        return poly.mul_(D.neg_().exp_())


class Cauchy(_DistanceKernel):
    """Cauchy kernel k(x, x') = 1 / (1 + ||x - x'||^2 / sigma^2).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Cauchy
    >>> float(Cauchy(sigma=1.0)(torch.zeros(1, 1), torch.ones(1, 1))[0, 0])
    0.5
    """

    def _block(self, P1, P2):
        return self._sq_block(P1, P2).add_(1.0).reciprocal_()


class Linear(Kernel):
    """Linear kernel k(x, x') = <x, x'>.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Linear
    >>> Linear()(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]))
    tensor([[11.]])
    """

    def __init__(self):
        pass

    def _block(self, P1, P2):
        return torch.mm(P1, P2.T)

    def diag(self, X):
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

    def __init__(self, degree=3, gamma=None, coef0=1.0):
        self.degree = degree
        self.gamma = gamma
        self.coef0 = coef0

    def validate(self):
        if not isinstance(self.degree, Real) or self.degree <= 0:
            raise ValueError(f"Polynomial: degree must be positive, got {self.degree!r}.")
        if self.gamma is not None and not (isinstance(self.gamma, Real) and self.gamma > 0):
            raise ValueError(f"Polynomial: gamma must be positive or None, got {self.gamma!r}.")
        if not isinstance(self.coef0, Real) or not math.isfinite(self.coef0):
            raise ValueError(f"Polynomial: coef0 must be a finite number, got {self.coef0!r}.")

    def _block(self, P1, P2):
        g = 1.0 / P1.shape[1] if self.gamma is None else float(self.gamma)
        return torch.addmm(
            torch.full((1, 1), float(self.coef0), dtype=P1.dtype, device=P1.device),
            P1,
            P2.T,
            alpha=g,
        ).pow_(self.degree)

    def diag(self, X):
        g = 1.0 / X.shape[1] if self.gamma is None else float(self.gamma)
        return (g * (X * X).sum(1) + float(self.coef0)) ** self.degree


KERNEL_NAMES = {
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


def _sigma_from_gamma(cls, gamma):
    if cls is Gaussian:
        return 1.0 / math.sqrt(2.0 * gamma)
    if cls is Cauchy:
        return 1.0 / math.sqrt(gamma)
    return 1.0 / gamma


def median_heuristic(X, *, max_samples=1000, random_state=0) -> float:
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
    X = torch.as_tensor(X)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError("median_heuristic needs a non-empty 2-D array.")
    X = torch.unique(X, dim=0)
    if X.shape[0] < 2:
        return 1.0
    if X.shape[0] > max_samples:
        g = torch.Generator().manual_seed(int(random_state))
        idx = torch.randperm(X.shape[0], generator=g)[:max_samples].to(X.device)
        X = X[idx]
    X = X.to(torch.float64)
    D = sq_distances(X, X)
    iu = torch.triu_indices(X.shape[0], X.shape[0], offset=1, device=X.device)
    med = float(D[iu[0], iu[1]].sqrt().median())
    return med if med > 0 else 1.0


def make_kernel(kernel="rbf", *, sigma=None, gamma=None, degree=3, coef0=1.0, X=None) -> Kernel:
    """Turn a kernel name or :class:`Kernel` into a validated :class:`Kernel`.

    Parameters
    ----------
    kernel : str or Kernel
        A name in ``KERNEL_NAMES`` or a kernel object (returned as is; then ``sigma`` and
        ``gamma`` must be None).
    sigma : float, optional
        Bandwidth in this library's convention (see the module docstring).
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
    if isinstance(kernel, Kernel):
        if sigma is not None or gamma is not None:
            raise ValueError("Give the bandwidth inside the kernel object, not as sigma/gamma.")
        kernel.validate()
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
    for pname, val in (("sigma", sigma), ("gamma", gamma)):
        if val is not None and (
            not isinstance(val, Real) or isinstance(val, bool) or not math.isfinite(val) or val <= 0
        ):
            raise ValueError(f"{pname} must be a positive finite number, got {val!r}.")
    if cls is Linear:
        out = Linear()
    elif cls is Polynomial:
        out = Polynomial(degree=degree, gamma=gamma, coef0=coef0)
    else:
        if sigma is None:
            if gamma is not None:
                sigma = _sigma_from_gamma(cls, float(gamma))
            elif X is not None:
                sigma = median_heuristic(X)
            else:
                sigma = 1.0
        out = Matern(sigma=float(sigma), nu=_NU[name]) if cls is Matern else cls(float(sigma))
    out.validate()
    return out
