"""Online kernel regression with regret guarantees (Jézéquel, Gaillard & Rudi 2019).

Learners follow the strict protocol "see x_t, predict, then see y_t" and offer both the
scikit-learn API (``fit``/``partial_fit``/``predict``) and the river API
(``learn_one``/``predict_one``). When river is installed they are registered as river
regressors, so ``river.evaluate.progressive_val_score`` accepts them.
"""

from __future__ import annotations

from importlib.util import find_spec

from .adversary import greedy_adversary
from .evaluate import ProgressiveResult, progressive_validation
from .fogd import FOGD
from .kawv import KernelAWV, online_krr_predictions
from .pkawv_nystrom import PKAWVNystrom
from .pkawv_taylor import PKAWVTaylor
from .prosnkons import ProsNKONS

__all__ = [
    "FOGD",
    "KernelAWV",
    "PKAWVNystrom",
    "PKAWVTaylor",
    "ProgressiveResult",
    "ProsNKONS",
    "greedy_adversary",
    "online_krr_predictions",
    "progressive_validation",
]


def _register_with_river() -> None:
    if find_spec("river") is None:
        return
    try:
        from river import base
    except Exception:  # pragma: no cover - a broken river install must not break import
        return
    for cls in (FOGD, KernelAWV, PKAWVNystrom, PKAWVTaylor, ProsNKONS):
        base.Regressor.register(cls)


_register_with_river()
