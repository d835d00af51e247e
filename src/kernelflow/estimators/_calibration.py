"""Probabilities of score classifiers: temperature scaling fitted on out-of-fold scores.

A classifier whose scores are not probabilities (least squares on {-1, 1} indicators, hinge
losses) gets ``predict_proba = softmax(beta * logits)``, with logits (-f, f) for a single
two-class score f (scikit-learn's convention for ``decision_function``) and the c scores
otherwise. beta is fitted by :func:`kernelflow.solvers.logistic.temperature_scaling` on scores
that the model did not see: the out-of-fold scores of a stratified k-fold split
(scikit-learn's ``CalibratedClassifierCV(method="temperature", ensemble=False)``), or rows
held out of training. The folds follow the package's holdout rule
(:mod:`kernelflow.utils.holdout`): rows are ordered by a seeded hash of their values, so copies
of a row share a fold and an integer sample weight acts as repeating the row, also for the
calibration. One parameter keeps the arg-max of the scores, so ``predict`` and the
arg-max of ``predict_proba`` always agree.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch

from ..solvers.logistic import temperature_scaling
from ..utils.holdout import resolve_seed, row_content_hash

__all__ = ["as_logits", "scores_to_proba", "content_folds", "cross_validated_scores",
           "fit_inverse_temperature"]


def as_logits(F: torch.Tensor) -> torch.Tensor:
    """(n,) or (n, 1) two-class scores -> (n, 2) logits (-f, f); (n, c) scores unchanged."""
    if F.ndim == 2 and F.shape[1] > 1:
        return F
    f = F.reshape(-1)
    return torch.stack([-f, f], 1)


def scores_to_proba(F: torch.Tensor, beta: float, *, log: bool = False) -> torch.Tensor:
    """softmax(beta * logits), (n, c); its logarithm with ``log=True``."""
    Z = beta * as_logits(F.to(torch.float64))
    return torch.log_softmax(Z, 1) if log else torch.softmax(Z, 1)


def fit_inverse_temperature(F: torch.Tensor, labels: torch.Tensor,
                            sample_weight: torch.Tensor | None = None) -> float:
    """beta of :func:`scores_to_proba` fitted to scores F of rows with class indices ``labels``."""
    sw = None if sample_weight is None else sample_weight.detach().cpu().to(torch.float64)
    return temperature_scaling(as_logits(F.detach().cpu().to(torch.float64)),
                               labels.detach().cpu(), sample_weight=sw)


def content_folds(X: torch.Tensor, labels: torch.Tensor, sample_weight: torch.Tensor | None,
                  n_splits: int, random_state) -> np.ndarray | None:
    """Fold number of every row, stratified by class and decided by row content.

    Within each class the distinct rows of positive weight are ordered by a seeded hash of
    (x, class) and dealt to the folds in turn; equal rows share a fold, rows of weight 0 go to
    fold 0 (they weigh nothing on either side). The number of folds is lowered to the number of
    distinct rows of the smallest class; None when that is below 2.
    """
    y = labels.detach().cpu().numpy()
    key = torch.cat([X.detach().reshape(X.shape[0], -1).to(torch.float64).cpu(),
                     torch.as_tensor(y, dtype=torch.float64)[:, None]], 1)
    if isinstance(random_state, np.random.RandomState):  # leave the caller's generator as is
        random_state = copy.deepcopy(random_state)
    h = row_content_hash(key, resolve_seed(random_state))
    pos = np.ones(len(y), bool) if sample_weight is None else \
        sample_weight.detach().cpu().numpy() > 0
    classes = np.unique(y[pos])
    groups = [np.unique(h[pos & (y == k)]) for k in classes]  # sorted: a seeded order
    k_folds = min(int(n_splits), min((len(g) for g in groups), default=0))
    if k_folds < 2:
        return None
    fold = np.zeros(len(y), dtype=np.int64)
    for k, g in zip(classes, groups):
        rows = pos & (y == k)
        fold[rows] = np.searchsorted(g, h[rows]) % k_folds
    return fold


def cross_validated_scores(
    fold_scores: Callable[[np.ndarray, np.ndarray], torch.Tensor],
    fold: np.ndarray,  # (n,) fold number of every row
) -> torch.Tensor:
    """Out-of-fold scores, (n,) or (n, c): ``fold_scores(train, test)`` fits on rows ``train``
    and scores rows ``test``, for each fold in turn."""
    out = None
    for j in range(int(fold.max()) + 1):
        train, test = np.flatnonzero(fold != j), np.flatnonzero(fold == j)
        S = fold_scores(train, test).detach().cpu().to(torch.float64)
        if out is None:
            out = torch.zeros((len(fold),) + tuple(S.shape[1:]), dtype=torch.float64)
        out[torch.as_tensor(test)] = S
    if out is None:
        raise ValueError("fold must number at least one fold (0, 1, ...).")
    return out
