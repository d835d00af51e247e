"""The data-parallel fit protocol: what an estimator implements to be fitted on row shards.

A data-parallel fit runs on every process of a group, each holding a shard of the rows
(:class:`~kernelflow.distributed.sharding.ShardSource`: this process's rows, seen as the global
data set). It has four stages; the estimator implements three methods and the driver,
:func:`fit_data_parallel` (what :func:`kernelflow.distributed.distributed_fit` calls), runs
them in order:

1. **prepare** (:meth:`DataParallelEstimator.data_parallel_prepare`): validate the parameters and
   this process's rows, and decide everything that must be identical on every process: the
   kernel and its bandwidth, Nyström centres, the holdout split, the seeds of random features
   and mini-batch orders. The returned :class:`FitPlan` names, in ``shared``, numbers that the
   driver checks to be equal on every process
   (:func:`~kernelflow.distributed.sharding.check_consistent`), so a mismatch raises
   ``ValueError`` everywhere instead of a hang or a wrong model.
2. **local step** (:meth:`DataParallelEstimator.data_parallel_step`): the work on this process's
   rows. It returns :class:`LocalResult`: partial sums over the local rows (``sums``), and any
   other result (``state``). The step may run a whole iterative solver: the solvers all-reduce
   their own sums over rows (one (M x t) block per conjugate-gradient iteration, one gradient
   per mini-batch) through :func:`kernelflow.collectives.all_reduce_sum`, which is the reduce
   stage inside an iteration; an estimator whose statistics are one pass of sums returns them
   in ``sums`` instead and lets the driver reduce them.
3. **reduce** (the driver, never the estimator): every tensor of ``LocalResult.sums`` is summed
   over all processes (:func:`reduce_sums`: one all-reduce per entry, in sorted key order, so
   every process issues the same collectives). Without a process group it is the identity.
4. **finish** (:meth:`DataParallelEstimator.data_parallel_finish`): from the plan and the
   reduced result, store the fitted attributes (identical on every process) and return the
   estimator.

What an author of a new data-parallel estimator writes: the three methods (parameters are
validated in prepare, e.g. by scikit-learn's ``_validate_params``); nothing in
:mod:`kernelflow.distributed` changes. ``isinstance(est, DataParallelEstimator)`` tells whether
an estimator has a data-parallel fit.

Examples
--------
A least-squares line fitted from the sums X^T X and X^T y of every process's rows:

>>> import numpy as np, torch
>>> from kernelflow.distributed.sharding import shard_arrays
>>> class LeastSquares:
...     def data_parallel_prepare(self, shard):
...         return FitPlan(shared={"n_features": shard.n_features})
...     def data_parallel_step(self, shard, plan):
...         X, y, _ = shard.local_arrays()
...         return LocalResult(sums={"XtX": X.T @ X, "Xty": X.T @ y})
...     def data_parallel_finish(self, plan, result):
...         self.coef_ = torch.linalg.solve(result.sums["XtX"], result.sums["Xty"])[:, 0]
...         return self
>>> X = np.random.RandomState(0).randn(50, 2); y = X @ np.array([1.0, -2.0])
>>> isinstance(LeastSquares(), DataParallelEstimator)
True
>>> fit_data_parallel(LeastSquares(), shard_arrays(X, y)).coef_.numpy().round(6)
array([ 1., -2.])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from ..collectives import all_reduce_sum
from ..sources import DataSource
from .sharding import ShardSource, check_consistent

__all__ = ["FitPlan", "LocalResult", "DataParallelEstimator", "reduce_sums",
           "fit_data_parallel"]


@dataclass
class FitPlan:
    """What prepare decided: the same on every process.

    Attributes
    ----------
    shared : dict of str to float
        Numbers that must be equal on every process (checked by the driver), e.g. the number
        of targets, a seed, a bandwidth.
    state : object
        The estimator's own decisions (kernel, centres, holdout split, validated rows...),
        passed to the local step and to finish.
    """

    shared: dict[str, float] = field(default_factory=dict)
    state: Any = None


@dataclass
class LocalResult:
    """What the local step returns.

    Attributes
    ----------
    sums : dict of str to tensor
        Partial sums over this process's rows, summed over all processes by the driver before
        finish (empty when the step's solver reduced its own sums).
    state : object
        Anything else the step computed (e.g. a solver result already identical everywhere).
    """

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    state: Any = None


@runtime_checkable
class DataParallelEstimator(Protocol):
    """An estimator that can be fitted on row shards (see the module docstring)."""

    def data_parallel_prepare(self, shard: ShardSource) -> FitPlan:
        """Validate and decide everything that must be identical on every process.

        Collective when the decisions need the global data (e.g. centres drawn by global row
        position with :meth:`ShardSource.take`). Returns the plan.
        """
        ...

    def data_parallel_step(self, shard: DataSource, plan: FitPlan) -> LocalResult:
        """The work on this process's rows; sums over rows are reduced by the solver it runs
        (through :func:`kernelflow.collectives.all_reduce_sum`) or returned in ``sums``."""
        ...

    def data_parallel_finish(self, plan: FitPlan, result: LocalResult) -> Any:
        """Store the fitted attributes from the plan and the reduced result; return self."""
        ...


def reduce_sums(result: LocalResult) -> LocalResult:
    """``result`` with every entry of ``sums`` summed over all processes (collective).

    Entries are reduced in sorted key order (every process issues the same all-reduces), in
    place. Without a process group it is the identity.

    Examples
    --------
    >>> reduce_sums(LocalResult(sums={"n": torch.tensor([3.0])})).sums["n"]
    tensor([3.])
    """
    for key in sorted(result.sums):
        result.sums[key] = all_reduce_sum(result.sums[key].contiguous())
    return result


def fit_data_parallel(estimator: DataParallelEstimator, shard: DataSource,
                      plan: FitPlan | None = None) -> Any:
    """Run the four stages of a data-parallel fit on ``shard`` (collective); returns the result
    of finish (the fitted estimator, the same on every process).

    ``shard`` is this process's rows: a :class:`ShardSource` (any other source is the whole
    data set of a single-process fit, e.g. an estimator's own ``fit`` outside a group).

    ``plan``: an estimator's own ``fit`` that prepared itself from arrays it had already
    validated (the automatic mode inside a process group) passes its plan; prepare is then
    skipped. Cost: the estimator's stages, one all-reduce of the shared numbers after prepare
    and one per entry of the step's sums.
    """
    name = type(estimator).__name__
    if plan is None:
        # a source that is not a shard is the whole data set (a single-process shard)
        plan = estimator.data_parallel_prepare(
            shard if isinstance(shard, ShardSource) else ShardSource(shard))
    if plan.shared:
        check_consistent(f"values prepared by {name}", **plan.shared)
    result = reduce_sums(estimator.data_parallel_step(shard, plan))
    return estimator.data_parallel_finish(plan, result)
