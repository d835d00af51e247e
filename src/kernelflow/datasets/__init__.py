"""Data sets: offline loaders of real data and generators of the papers' synthetic settings.

Real data (no network; read from installed packages, see :mod:`kernelflow.datasets._real`):
``load_diamonds``, ``load_flights``, ``load_concrete``, ``load_default``, ``load_mcycle``,
``load_boston``, ``load_diabetes`` and the generic ``load_rdataset``; ``REAL_DATASETS`` maps
short names to loaders.

Synthetic generators come from one module per paper: ``_allerbo`` (robust and sparse early
stopping), ``_online`` (online kernel regression), ``_doubly_stochastic`` (doubly stochastic
gradients) and ``_landmarks`` (Nyström centres). Everything a module lists in ``__all__`` is
re-exported here.

Examples
--------
>>> from kernelflow.datasets import load_concrete
>>> X, y = load_concrete(n_samples=100, return_X_y=True)
>>> X.shape, y.shape
((100, 8), (100,))
"""

from __future__ import annotations

from . import _allerbo, _doubly_stochastic, _landmarks, _online
from ._allerbo import *  # noqa: F403 - the generators listed in each module's __all__
from ._doubly_stochastic import *  # noqa: F403
from ._landmarks import *  # noqa: F403
from ._online import *  # noqa: F403
from ._real import (
    REAL_DATASETS,
    load_boston,
    load_concrete,
    load_default,
    load_diabetes,
    load_diamonds,
    load_flights,
    load_mcycle,
    load_rdataset,
)

__all__ = [
    "REAL_DATASETS",
    "load_boston",
    "load_concrete",
    "load_default",
    "load_diabetes",
    "load_diamonds",
    "load_flights",
    "load_mcycle",
    "load_rdataset",
    *_allerbo.__all__,
    *_online.__all__,
    *_doubly_stochastic.__all__,
    *_landmarks.__all__,
]
