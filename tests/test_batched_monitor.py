"""BatchedEarlyStopping follows EarlyStopping problem by problem."""

import math

import numpy as np
import pytest
import torch

from kernelflow.utils._finite import DivergenceError
from kernelflow.utils.monitor import BatchedEarlyStopping, EarlyStopping


def _scalar(losses, patience, tol):
    mon = EarlyStopping(patience, tol)
    for k, loss in enumerate(losses, start=1):
        if mon.update(k, loss):
            return mon.best_iteration, mon.best_loss, k
    return mon.best_iteration, mon.best_loss, -1


@pytest.mark.parametrize("tol", [0.0, 0.05])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_batched_equals_scalar(tol, chunk):
    rng = np.random.default_rng(0)
    T, B, patience = 60, 12, 5
    # noisy decreasing curves with plateaus and exact ties
    L = np.round(np.cumsum(rng.normal(0, 0.1, (T, B)), 0) + np.linspace(1, 0, T)[:, None], 1)
    mon = BatchedEarlyStopping((B,), patience, tol, dtype=torch.float64)
    for k0 in range(0, T, chunk):
        mon.update_chunk(k0 + 1, torch.tensor(L[k0:k0 + chunk]))
    for b in range(B):
        it, best, stop = _scalar(L[:, b], patience, tol)
        assert int(mon.best_iteration[b]) == it
        assert float(mon.best_loss[b]) == best
        assert int(mon.stop_iteration[b]) == stop


def test_nonfinite_policy():
    mon = BatchedEarlyStopping((2,), 2, dtype=torch.float64)
    with pytest.raises(DivergenceError):
        mon.update(0, torch.tensor([1.0, math.nan], dtype=torch.float64))
    mon = BatchedEarlyStopping((2,), 2, nonfinite="worst", dtype=torch.float64)
    for k in range(3):
        mon.update(k, torch.tensor([1.0 - k, math.inf], dtype=torch.float64))
    assert mon.best_iteration.tolist() == [2, -1]
    assert mon.stop_iteration.tolist() == [-1, 1]  # never improved: stops after patience


def test_bad_parameters():
    with pytest.raises(ValueError, match="n_iter_no_change"):
        BatchedEarlyStopping((1,), 0)
    with pytest.raises(ValueError, match="nonfinite"):
        BatchedEarlyStopping((1,), 1, nonfinite="ignore")
