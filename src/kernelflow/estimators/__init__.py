"""scikit-learn estimators.

Every estimator listed in ``__all__`` is importable from here (and from ``kernelflow``); modules
are imported on first access so that importing the package stays fast.
"""

from __future__ import annotations

import importlib

_LOCATIONS = {
    # exact and spectral
    "KernelRidge": ".kernel_ridge",
    "KernelGradientFlow": ".gradient_flow",
    "KernelRidgeCV": ".kernel_ridge_cv",
    "KernelRidgeClassifier": ".kernel_ridge_classifier",
    # early-stopped paths and explicit penalties
    "KernelGradientDescent": ".gradient_descent",
    "KernelSignGradient": ".sign_gradient",
    "KernelCoordinateDescent": ".coordinate_descent",
    "PenalizedKernelRegressor": ".penalized",
    "KernelGradientDescentCV": ".path_cv",
    "KernelSignGradientCV": ".path_cv",
    "KernelCoordinateDescentCV": ".path_cv",
    "KernelHuberGradientDescent": ".huber_path",
    "KernelHuberGradientDescentCV": ".huber_path",
    "PenalizedKernelRegressorCV": ".penalized_cv",
    # robust baselines (M-estimators, quantile regression)
    "KernelHuberRegressor": ".huber",
    "KernelTukeyRegressor": ".tukey",
    "KernelQuantileRegressor": ".quantile",
    "KernelQuantileRegressorAPG": ".quantile_apg",
    # Nyström
    "Nystroem": ".nystroem",
    "NystromKernelRidge": ".nystrom_ridge",
    "NystromRobustRegressor": ".nystrom_robust",
    "NystromKernelRidgeClassifier": ".kernel_ridge_classifier",
    "NystromKernelLogisticRegression": ".nystrom_logistic",
    # doubly stochastic functional gradients
    "DoublyStochasticRegressor": ".doubly_stochastic_regressor",
    "DoublyStochasticClassifier": ".doubly_stochastic_classifier",
    "DoublyStochasticNoveltyDetector": ".doubly_stochastic_novelty",
}

__all__ = sorted(_LOCATIONS)


def __getattr__(name):
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
