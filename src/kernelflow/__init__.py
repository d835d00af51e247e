"""kernelflow: fast, robust and scalable kernel regression.

Kernels (:mod:`kernelflow.kernels`) say what to compute, the kernel engine
(:mod:`kernelflow.operators`) computes products with kernel matrices tile by tile, solvers
(:mod:`kernelflow.solvers`) are pure functions on tensors, and estimators
(:mod:`kernelflow.estimators`) give them a scikit-learn interface.
"""

from .kernels import (
    Cauchy,
    Gaussian,
    Kernel,
    Laplace,
    Linear,
    Matern,
    Polynomial,
    make_kernel,
    median_heuristic,
)
from .operators import KernelOperator, Options

__version__ = "0.1.0"

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
    "KernelOperator",
    "Options",
    "__version__",
]


def __getattr__(name):
    # Estimators are importable from the top level without importing every solver at start-up.
    # importlib (not ``from . import``) so that looking up a submodule never re-enters here.
    if not name.startswith("_"):
        import importlib

        estimators = importlib.import_module(f"{__name__}.estimators")
        if name in estimators.__all__:
            return getattr(estimators, name)
    raise AttributeError(f"module 'kernelflow' has no attribute {name!r}")
