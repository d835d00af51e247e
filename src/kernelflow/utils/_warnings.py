"""Warning categories raised below the estimator layer (solvers must not import scikit-learn),
and :func:`warn_caller`, which points a warning at the user's line."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

__all__ = ["SolverConvergenceWarning", "warn_caller"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# scikit-learn's fit wrappers (parameter validation, output containers) stand between a user's
# call and the estimator's fit: a warning should not point at them either
_WRAPPER_FILES = (os.path.join("sklearn", "base.py"),
                  os.path.join("sklearn", "utils", "_set_output.py"))


class SolverConvergenceWarning(UserWarning):
    """An iterative solver stopped at its iteration cap before meeting its tolerance.

    Estimators translate it into scikit-learn's ``ConvergenceWarning``.
    """


def _stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn` called from :func:`warn_caller` that names
    the first frame outside this package and scikit-learn's fit wrappers."""
    frame: FrameType | None = sys._getframe(2)  # the caller of warn_caller
    level = 2
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_PACKAGE_DIR) and not name.endswith(_WRAPPER_FILES):
            return level
        frame = frame.f_back
        level += 1
    return 2


def warn_caller(message: str, category: type[Warning]) -> None:
    """:func:`warnings.warn` pointing at the first line outside kernelflow: the user's call of
    ``fit``, however many stages (a data-parallel driver, a prepare stage) lie between.

    Examples
    --------
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_caller("stopped early", UserWarning)
    >>> caught[0].filename.endswith("_warnings.py")
    False
    """
    warnings.warn(message, category, stacklevel=_stacklevel())
