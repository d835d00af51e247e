"""Warning categories raised below the estimator layer (solvers must not import scikit-learn)."""

from __future__ import annotations

__all__ = ["SolverConvergenceWarning"]


class SolverConvergenceWarning(UserWarning):
    """An iterative solver stopped at its iteration cap before meeting its tolerance.

    Estimators translate it into scikit-learn's ``ConvergenceWarning``.
    """
