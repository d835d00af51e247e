"""The landmark-selector interface shared by every Nyström method.

A selector chooses k landmarks (Nyström centres) for data X under a kernel. Index-based
selectors return row indices of X; others (k-means) return new points. Every Nyström estimator
accepts a selector name, a selector object or an explicit array of centres through
:func:`resolve_centers`.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np
import torch

from ..kernels import Kernel

__all__ = ["Selection", "LandmarkSelector", "Uniform", "SELECTORS", "register_selector",
           "resolve_centers", "check_k"]


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
    cloned.
    """

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
