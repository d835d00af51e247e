"""The landmark-selector interface shared by every Nyström method.

A selector chooses k landmarks (Nyström centres) for data X under a kernel. Index-based
selectors return row indices of X; others (k-means) return new points. Every Nyström estimator
accepts a selector name, a selector object or an explicit array of centres through
:func:`resolve_centers`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import torch

from ..kernels import Kernel

__all__ = ["Selection", "LandmarkSelector", "Uniform", "SELECTORS", "register_selector",
           "resolve_centers", "check_k", "check_points", "Param", "check_param"]


@dataclass
class Selection:
    """Result of a selection.

    Attributes
    ----------
    indices : tensor of shape (k,) or None
        Chosen rows of X (None for selectors that create points, such as k-means).
    centers : tensor of shape (k, d)
        The landmarks themselves (X[indices] for index selectors).
    weights : tensor of shape (k,) or None
        Method-specific weights (e.g. leverage-score sampling probabilities), if any.
    """

    indices: torch.Tensor | None
    centers: torch.Tensor
    weights: torch.Tensor | None = None


def check_k(k, n: int) -> int:
    """Validate the number of landmarks: an integer with 1 <= k <= n."""
    if not isinstance(k, Integral | np.integer) or isinstance(k, bool):
        raise TypeError(f"k must be an integer, got {type(k).__name__}.")
    k = int(k)
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}.")
    if k > n:
        raise ValueError(f"k = {k} landmarks requested from only n = {n} points.")
    return int(k)


def check_points(X, *, name: str = "X") -> torch.Tensor:
    """Validate selector input: a non-empty, finite, real 2-D array or tensor.

    Tensors are detached (``requires_grad`` inputs are accepted). Integer and boolean inputs
    become float64, float16 and bfloat16 become float32 (kernels are not defined in half
    precision); complex, object and string inputs raise ``TypeError`` naming the dtype.

    Examples
    --------
    >>> import torch
    >>> check_points(torch.ones(3, 2, dtype=torch.float16)).dtype
    torch.float32
    >>> check_points([[1, 2], [3, 4]]).dtype
    torch.float64
    """
    if isinstance(X, torch.Tensor):
        T = X.detach()
        if T.is_complex():
            raise TypeError(f"{name} must be real, got complex dtype {T.dtype}.")
        if T.dtype in (torch.float16, torch.bfloat16):
            T = T.to(torch.float32)
        elif not T.is_floating_point():
            T = T.to(torch.float64)
    else:
        if hasattr(X, "dtypes") and hasattr(X, "to_numpy"):  # pandas
            X = X.to_numpy()
        try:
            arr = np.asarray(X)
        except Exception as exc:
            raise TypeError(f"{name} must be array-like, got {type(X).__name__}.") from exc
        if np.iscomplexobj(arr):
            raise TypeError(f"{name} must be real, got complex dtype {arr.dtype}.")
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                       or arr.dtype == np.bool_):
            raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}.")
        T = torch.as_tensor(np.array(arr, dtype=np.float64))
    if T.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(T.shape)}.")
    if T.shape[0] == 0 or T.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(T.shape)}).")
    if not bool(torch.isfinite(T).all()):
        raise ValueError(f"{name} contains NaN or infinity.")
    top = float(T.abs().max())
    if not top * 2.0 * math.sqrt(T.shape[1]) < math.sqrt(torch.finfo(T.dtype).max):
        raise ValueError(f"{name} has values up to {top:.3g} in magnitude: squared distances "
                         f"overflow {T.dtype}; rescale {name}.")
    return T


@dataclass(frozen=True)
class Param:
    """Declared range of one selector hyperparameter (see :func:`check_param`).

    ``kind`` is ``"int"``, ``"real"``, ``"bool"`` or ``"option"``; ``low``/``high`` bound
    numbers (``None``: unbounded, but always finite), ``low_open``/``high_open`` exclude the
    bound; ``options`` lists the allowed strings; ``none`` allows ``None``.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    options: tuple = ()
    none: bool = False

    def describe(self) -> str:
        if self.kind == "option":
            return "one of " + ", ".join(map(repr, self.options))
        if self.kind == "bool":
            return "a bool"
        what = "an integer" if self.kind == "int" else "a finite real number"
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return what + (" " + " and ".join(parts) if parts else "")


def check_param(owner: str, name: str, value, spec: Param):
    """Raise ``TypeError``/``ValueError`` naming ``owner.name`` unless ``value`` fits ``spec``.

    Examples
    --------
    >>> check_param("BLESS", "q", 2.0, Param("real", 1, low_open=True))
    2.0
    >>> check_param("BLESS", "q", float("nan"), Param("real", 1, low_open=True))
    Traceback (most recent call last):
    ...
    ValueError: BLESS: q must be a finite real number > 1, got nan.
    """
    if value is None and spec.none:
        return value
    msg = f"{owner}: {name} must be {spec.describe()}{' or None' if spec.none else ''}, got "
    if spec.kind == "option":
        if not isinstance(value, str) or value not in spec.options:
            raise ValueError(msg + f"{value!r}.")
        return value
    if spec.kind == "bool":
        if not isinstance(value, bool | np.bool_):
            raise TypeError(msg + f"{type(value).__name__} {value!r}.")
        return value
    number = Integral if spec.kind == "int" else Real
    if isinstance(value, bool | np.bool_) or not isinstance(value, number):
        raise TypeError(msg + f"{type(value).__name__} {value!r}.")
    v = float(value)
    ok = math.isfinite(v)
    if ok and spec.low is not None:
        ok = v > spec.low if spec.low_open else v >= spec.low
    if ok and spec.high is not None:
        ok = v < spec.high if spec.high_open else v <= spec.high
    if not ok:
        raise ValueError(msg + f"{value!r}.")
    return value


def _check_kernel(kernel):
    if not callable(kernel):
        raise TypeError(f"kernel must be a Kernel (callable k(X, Z)), got "
                        f"{type(kernel).__name__}.")


def _sample_weights(p: torch.Tensor) -> torch.Tensor:
    """Sampling weights for k distinct draws: scores made finite, non-negative and positive.

    A tiny floor keeps a few zero scores from making k distinct draws impossible; scores that
    are all zero (identical points, or values that underflowed) give uniform weights.
    """
    p = torch.nan_to_num(p, nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)
    top = float(p.max()) if p.numel() else 0.0
    if not top > 0:
        return torch.ones_like(p)
    return p + 1e-12 * top


def _generator(random_state) -> torch.Generator:
    if isinstance(random_state, torch.Generator):
        return random_state
    if random_state is None:
        seed = int(np.random.randint(0, 2**31 - 1))
    elif isinstance(random_state, np.random.RandomState):
        seed = int(random_state.randint(0, 2**31 - 1))
    else:
        seed = int(random_state)
    return torch.Generator().manual_seed(seed)


class LandmarkSelector:
    """Base class: subclasses implement :meth:`select`.

    Selectors are plain parameter objects (``get_params``) so estimators holding one can be
    cloned. Subclasses declare their hyperparameters in ``_param_spec`` (name ->
    :class:`Param`); every ``select`` first checks them, then the points (:func:`check_points`),
    the kernel and ``k`` (:func:`check_k`), so each selector receives a finite real tensor.
    """

    _param_spec: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "select" in cls.__dict__ and not getattr(cls.__dict__["select"], "_checked", False):
            cls.select = _checked_select(cls.__dict__["select"])

    def _check_params(self) -> None:
        """Raise ``TypeError``/``ValueError`` for a hyperparameter outside its declared range."""
        owner = type(self).__name__
        for name, spec in self._param_spec.items():
            check_param(owner, name, getattr(self, name), spec)

    def get_params(self, deep=True):
        import inspect

        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params):
        for key, value in params.items():
            setattr(self, key, value)
        return self

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def select(self, X: torch.Tensor, kernel: Kernel, k: int, *, random_state=None) -> Selection:
        raise NotImplementedError


def _checked_select(select):
    @functools.wraps(select)
    def wrapper(self, X, kernel, k, *, random_state=None):
        self._check_params()
        X = check_points(X)
        _check_kernel(kernel)
        check_k(k, X.shape[0])
        return select(self, X, kernel, k, random_state=random_state)

    wrapper._checked = True
    return wrapper


class Uniform(LandmarkSelector):
    """k rows of X uniformly at random without replacement. Cost O(n).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.arange(10.0).reshape(5, 2)
    >>> sel = Uniform().select(X, Gaussian(1.0), 3, random_state=0)
    >>> sel.centers.shape
    torch.Size([3, 2])
    """

    def __init__(self):
        pass

    def select(self, X, kernel, k, *, random_state=None):
        k = check_k(k, X.shape[0])
        g = _generator(random_state)
        idx = torch.randperm(X.shape[0], generator=g)[:k].sort().values.to(X.device)
        return Selection(indices=idx, centers=X[idx], weights=None)


#: Registry of selector names -> classes (constructed with default parameters).
SELECTORS: dict[str, type] = {"uniform": Uniform}


def register_selector(name: str, cls: type) -> None:
    SELECTORS[name] = cls


def resolve_centers(landmarks, X: torch.Tensor, kernel: Kernel, k: int | None,
                    random_state=None) -> Selection:
    """Centres from a selector name, a selector object, or an explicit array of centres.

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.randn(20, 2)
    >>> resolve_centers("uniform", X, Gaussian(1.0), 5, random_state=0).centers.shape
    torch.Size([5, 2])
    """
    if isinstance(landmarks, str):
        if landmarks not in SELECTORS:
            raise ValueError(f"Unknown landmark selector {landmarks!r}; choose one of "
                             f"{sorted(SELECTORS)}.")
        landmarks = SELECTORS[landmarks]()
    if isinstance(landmarks, LandmarkSelector):
        if k is None:
            raise ValueError("The number of landmarks must be given with a selector.")
        sel = landmarks.select(X, kernel, k, random_state=random_state)
        return sel
    C = landmarks if isinstance(landmarks, torch.Tensor) else torch.as_tensor(
        np.asarray(landmarks, dtype=np.float64))
    if C.ndim != 2 or C.shape[1] != X.shape[1] or C.shape[0] == 0:
        raise ValueError(f"Explicit centres must have shape (k, {X.shape[1]}), got "
                         f"{tuple(C.shape)}.")
    if not torch.isfinite(C).all():
        raise ValueError("Explicit centres contain NaN or infinity.")
    return Selection(indices=None, centers=C.to(dtype=X.dtype, device=X.device), weights=None)
