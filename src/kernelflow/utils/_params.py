"""Constructor parameter names of estimator classes, cached per class.

Used by the all-or-nothing fits (parameters are not fitted state) and by the model-file checks
(a model file may not set a parameter as state).
"""

from __future__ import annotations

__all__ = ["param_names"]

_PARAM_NAMES: dict[type, frozenset[str]] = {}


def param_names(cls: type) -> frozenset[str]:
    """Names of the constructor parameters of ``cls`` (scikit-learn's ``_get_param_names``);
    empty for a class that does not follow scikit-learn's convention."""
    names = _PARAM_NAMES.get(cls)
    if names is None:
        try:
            names = frozenset(cls._get_param_names())  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - not a scikit-learn style class
            names = frozenset()
        _PARAM_NAMES[cls] = names
    return names
