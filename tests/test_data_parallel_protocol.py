"""The public data-parallel protocol (prepare, local step, reduce, finish) and the one holdout
split of any source.

A weighted ridge regression written here, outside the library, implements the protocol and is
fitted by ``distributed_fit`` unchanged, on one process and on two; the built-in data-parallel
estimators satisfy the same protocol, and ``kernelflow.distributed`` reads none of their
private members.
"""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch

import kernelflow.distributed as kd
from kernelflow.distributed import distributed_fit, rank, shard_arrays, shard_range, spawn
from kernelflow.distributed.protocol import (
    DataParallelEstimator,
    FitPlan,
    LocalResult,
    fit_data_parallel,
)
from kernelflow.estimators.doubly_stochastic_classifier import DoublyStochasticClassifier
from kernelflow.estimators.doubly_stochastic_novelty import DoublyStochasticNoveltyDetector
from kernelflow.estimators.doubly_stochastic_regressor import DoublyStochasticRegressor
from kernelflow.estimators.nystrom_logistic import NystromKernelLogisticRegression
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge
from kernelflow.estimators.nystrom_robust import NystromRobustRegressor
from kernelflow.sources import ArraySource, ChunkSource
from kernelflow.utils.holdout import holdout_indices, holdout_stream_mask, split_holdout


class LinearRidge:
    """Weighted linear ridge regression from the sums X^T W X, X^T W y and the weight total.

    Not a library class: it shows what an author of a data-parallel estimator writes.
    """

    def __init__(self, alpha=1.0, offset=0.0):
        self.alpha = alpha
        self.offset = offset  # added to the shared number: a test of the consistency check

    def data_parallel_prepare(self, shard):
        if self.alpha <= 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}.")
        return FitPlan(shared={"alpha": float(self.alpha) + self.offset * rank()})

    def data_parallel_step(self, shard, plan):
        X, y, w = shard.local_arrays()
        X, y = X.to(torch.float64), y.to(torch.float64)
        w = torch.ones(X.shape[0], dtype=torch.float64) if w is None else w.to(torch.float64)
        return LocalResult(sums={"XtWX": X.T @ (w[:, None] * X), "XtWy": X.T @ (w[:, None] * y),
                                 "W": w.sum().reshape(1)},
                           state=shard.n_local)

    def data_parallel_finish(self, plan, result):
        s = result.sums
        A = s["XtWX"] + self.alpha * torch.eye(s["XtWX"].shape[0], dtype=torch.float64)
        self.coef_ = torch.linalg.solve(A, s["XtWy"])[:, 0].numpy()
        self.total_weight_ = float(s["W"][0])
        self.n_local_ = int(result.state)
        return self


def _data(n=90, d=3):
    rng = np.random.RandomState(0)
    X = rng.normal(size=(n, d))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)
    w = rng.uniform(0.5, 2.0, size=n)
    return X, y, w


def _direct(X, y, w, alpha):
    return np.linalg.solve(X.T @ (w[:, None] * X) + alpha * np.eye(X.shape[1]), X.T @ (w * y))


def test_an_estimator_written_outside_is_fitted_by_distributed_fit():
    X, y, w = _data()
    est = LinearRidge(alpha=0.5)
    assert isinstance(est, DataParallelEstimator)
    assert distributed_fit(est, X, y, sample_weight=w) is est
    np.testing.assert_allclose(est.coef_, _direct(X, y, w, 0.5), rtol=1e-12)
    assert est.total_weight_ == pytest.approx(w.sum()) and est.n_local_ == len(X)


def test_a_refused_prepare_leaves_the_estimator_as_it_was():
    X, y, w = _data()
    est = distributed_fit(LinearRidge(alpha=0.5), X, y)
    before = est.coef_.copy()
    est.alpha = -1.0
    with pytest.raises(ValueError, match="alpha must be positive"):
        distributed_fit(est, X, y)
    np.testing.assert_array_equal(est.coef_, before)


def test_an_object_without_the_protocol_is_refused():
    class NoProtocol:
        def fit(self, X, y):
            return self

    with pytest.raises(TypeError, match="no data-parallel fit"):
        distributed_fit(NoProtocol(), *_data()[:2])


def _two_process_fit(offset):
    X, y, w = _data()
    lo, hi = shard_range(len(X))
    try:
        est = distributed_fit(LinearRidge(alpha=0.5, offset=offset), X[lo:hi], y[lo:hi],
                              sample_weight=w[lo:hi])
    except ValueError as exc:
        return {"error": str(exc)}
    return {"coef": est.coef_, "W": est.total_weight_, "n_local": est.n_local_}


def test_two_processes_reduce_the_sums_of_all_rows():
    X, y, w = _data()
    out = spawn(_two_process_fit, 2, args=(0.0,), timeout=30, max_seconds=60)
    ref = _direct(X, y, w, 0.5)
    for r in range(2):
        np.testing.assert_allclose(out[r]["coef"], ref, rtol=1e-12)
        assert out[r]["W"] == pytest.approx(w.sum())
    assert out[0]["n_local"] + out[1]["n_local"] == len(X)


def test_two_processes_disagreeing_after_prepare_fail_everywhere():
    out = spawn(_two_process_fit, 2, args=(1.0,), timeout=30, max_seconds=60)
    for r in range(2):
        msg = out[r]["error"]
        assert "disagree across processes" in msg and "LinearRidge" in msg and "alpha" in msg


def test_the_driver_reduces_sums_in_the_same_order_and_calls_every_stage():
    calls = []

    class Recorder(LinearRidge):
        def data_parallel_prepare(self, shard):
            calls.append("prepare")
            return super().data_parallel_prepare(shard)

        def data_parallel_step(self, shard, plan):
            calls.append("step")
            return super().data_parallel_step(shard, plan)

        def data_parallel_finish(self, plan, result):
            calls.append("finish")
            return super().data_parallel_finish(plan, result)

    X, y, w = _data()
    fit_data_parallel(Recorder(), shard_arrays(X, y, w))
    assert calls == ["prepare", "step", "finish"]


@pytest.mark.parametrize("cls", [NystromKernelRidge, NystromRobustRegressor,
                                 DoublyStochasticRegressor, DoublyStochasticClassifier])
def test_built_in_data_parallel_estimators_implement_the_protocol(cls):
    est = cls()
    assert isinstance(est, DataParallelEstimator)
    for name in ("data_parallel_prepare", "data_parallel_step", "data_parallel_finish"):
        assert getattr(est, name).__doc__, f"{cls.__name__}.{name} has no docstring"


@pytest.mark.parametrize("cls", [DoublyStochasticNoveltyDetector,
                                 NystromKernelLogisticRegression])
def test_estimators_without_a_data_parallel_fit_do_not_claim_one(cls):
    assert not isinstance(cls(), DataParallelEstimator)


def test_distributed_fit_of_a_built_in_estimator_equals_its_fit_on_the_shard():
    X, y, _ = _data(200)
    a = distributed_fit(NystromKernelRidge(20, alpha=1e-3, sigma=1.0, random_state=0), X, y)
    b = NystromKernelRidge(20, alpha=1e-3, sigma=1.0, random_state=0).fit(shard_arrays(X, y))
    np.testing.assert_array_equal(a.dual_coef_.numpy(), b.dual_coef_.numpy())
    np.testing.assert_array_equal(a.centers_.numpy(), b.centers_.numpy())


def test_the_plumbing_reads_no_private_member_of_an_estimator():
    # distributed/ drives estimators through the protocol only: no `estimator._x` / `est._x`
    root = pathlib.Path(kd.__file__).parent
    bad = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in {"estimator", "est", "model"}
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    assert not bad, bad


# ---- one holdout split for any source ---------------------------------------------------------
def _rows(n=300, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    return X, X.sum(1)


def test_rows_in_memory_are_split_by_the_holdout_rule():
    X, y = _rows()
    w = torch.ones(X.shape[0], dtype=torch.float64)
    w[:7] = 0.0
    split = split_holdout(ArraySource(X, y, w), 0.2, seed=3)
    tr, va = holdout_indices(X, 0.2, 3, y=y, sample_weight=w)
    np.testing.assert_array_equal(split.validation_indices, va)
    np.testing.assert_array_equal(split.train_indices, tr)
    # the sides as sources: the held-out rows and all others (weight-0 rows included)
    assert split.validation.n_samples == len(va)
    assert split.train.n_samples == X.shape[0] - len(va)
    Xv = torch.cat([b.X for b in split.validation.iter_blocks(50)])
    torch.testing.assert_close(Xv, X[torch.from_numpy(va)])


def test_gathered_rows_give_the_in_memory_split_to_any_source():
    X, y = _rows()
    chunks = [(X[:120], y[:120]), (X[120:], y[120:])]
    split = split_holdout(ChunkSource(chunks), 0.1, seed=1, rows=(X, None))
    tr, va = holdout_indices(X, 0.1, 1)
    np.testing.assert_array_equal(split.validation_indices, va)
    np.testing.assert_array_equal(split.train_indices, tr)


def test_a_stream_is_split_by_the_hash_of_its_rows_whatever_the_chunks():
    X, y = _rows(2000)
    mask = holdout_stream_mask(X, 0.1, seed=4)
    for cut in (1, 700, 1999):
        split = split_holdout(ChunkSource([(X[:cut], y[:cut]), (X[cut:], y[cut:])]), 0.1,
                              seed=4, global_positions=True)
        np.testing.assert_array_equal(split.validation_indices, np.flatnonzero(mask))
        np.testing.assert_array_equal(split.train_indices, np.flatnonzero(~mask))
        assert split.validation.n_samples == int(mask.sum())
    # without global_positions the training positions are not listed (a stream may be long)
    assert split_holdout(ChunkSource([(X, y)]), 0.1, seed=4).train_indices is None


@pytest.mark.parametrize("make", [lambda X, y: ArraySource(X, y),
                                  lambda X, y: ChunkSource([(X, y)])])
def test_an_empty_side_is_refused_with_one_message(make):
    X, y = _rows(1)
    with pytest.raises(ValueError, match="at least 2 samples|empty training or validation"):
        split_holdout(make(X, y), 0.1, seed=0)
    X, y = _rows(3)  # a stream of 3 rows holds none out at 1e-6
    with pytest.raises(ValueError, match=r"validation_fraction=1e-06 leaves an empty training "
                                         r"or validation set \(3 training and 0 validation"):
        split_holdout(ChunkSource([(X, y)]), 1e-6, seed=0)


def _nystrom_holdout_without_seed():
    X, y, _ = _data(120)
    lo, hi = shard_range(len(X))
    np.random.seed(rank())  # independent processes (torchrun) draw differently for None
    est = NystromKernelRidge(10, alpha=1e-3, sigma=1.0, early_stopping=True, solver="cg",
                             max_iter=3, random_state=None).fit(X[lo:hi], y[lo:hi])
    return {"val": est.validation_indices_, "coef": est.dual_coef_.numpy()}


def test_two_processes_hold_out_the_same_rows_without_a_random_state():
    # the prepare stage decides the holdout once for all processes (process 0's seed)
    out = spawn(_nystrom_holdout_without_seed, 2, timeout=30, max_seconds=60)
    np.testing.assert_array_equal(out[0]["val"], out[1]["val"])
    np.testing.assert_array_equal(out[0]["coef"], out[1]["coef"])
    assert len(out[0]["val"]) == 12
