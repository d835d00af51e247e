"""Data-parallel execution on torch.distributed.

Each process holds a shard of the rows (:mod:`.sharding`); the solvers all-reduce every sum over
rows (:mod:`kernelflow.collectives`), so the estimators' ``fit`` inside a process group
(:mod:`.auto`) and :func:`distributed_fit` give every process the model of a single-process fit
on all rows.
:mod:`.launch` starts and supervises process groups (``torchrun`` or :func:`spawn`) with bounded
timeouts; :mod:`.cv` spreads cross-validation grids over processes. Command line:
``torchrun --standalone --nproc_per_node=N -m kernelflow.distributed fit ...`` (see
``docs/distributed.md``). An estimator fits data-parallel by implementing the protocol of
:mod:`.protocol` (prepare, local step, reduce, finish); :func:`distributed_fit` runs it.
"""

from ..collectives import all_reduce_sum, broadcast, is_distributed, local_only, rank, world_size
from .auto import data_parallel
from .launch import (
    DistributedError,
    barrier,
    configure_logging,
    destroy_process_group,
    init_process_group,
    save_model_rank0,
    spawn,
)
from .protocol import (
    DataParallelEstimator,
    FitPlan,
    LocalResult,
    fit_data_parallel,
    reduce_sums,
)
from .sharding import (
    ShardSource,
    check_consistent,
    shard_arrays,
    shard_npy,
    shard_parquet,
    shard_range,
)

__all__ = [
    "all_reduce_sum",
    "broadcast",
    "is_distributed",
    "rank",
    "world_size",
    "local_only",
    "data_parallel",
    "DistributedError",
    "init_process_group",
    "destroy_process_group",
    "barrier",
    "spawn",
    "configure_logging",
    "save_model_rank0",
    "ShardSource",
    "shard_range",
    "shard_arrays",
    "shard_npy",
    "shard_parquet",
    "check_consistent",
    "DataParallelEstimator",
    "FitPlan",
    "LocalResult",
    "fit_data_parallel",
    "reduce_sums",
    "as_shard",
    "distributed_fit",
    "distributed_path_cv",
    "distributed_krr_grid_cv",
    "distributed_penalized_grid_cv",
    "my_share",
]

# fit and cv import the solvers: loading them on first use keeps `import kernelflow.distributed`
# light for the launcher
_LAZY = {"as_shard": "fit", "distributed_fit": "fit", "distributed_path_cv": "cv",
         "distributed_krr_grid_cv": "cv", "distributed_penalized_grid_cv": "cv",
         "my_share": "cv"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
