"""scikit-learn estimators.

Every estimator listed in ``__all__`` is importable from here (and from ``kernelflow``); modules
are imported on first access so that importing the package stays fast.
"""

from __future__ import annotations

import importlib

_LOCATIONS = {
    "KernelRidge": ".kernel_ridge",
    "KernelGradientFlow": ".gradient_flow",
    "KernelRidgeCV": ".kernel_ridge_cv",
}

__all__ = sorted(_LOCATIONS)


def __getattr__(name):
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
