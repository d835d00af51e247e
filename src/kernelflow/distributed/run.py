"""Command line of data-parallel fitting: ``python -m kernelflow.distributed fit ...``.

Under torchrun (one or many hosts) every process reads its shard of the data and fits::

    torchrun --standalone --nproc_per_node=2 -m kernelflow.distributed fit --model nystrom_ridge \\
        --data X.npy --target y.npy --param n_components=1000 --param alpha=1e-3 \\
        --out model.npz

Without torchrun, ``--nproc N`` starts N local processes itself (Gloo on localhost). The data
are ``.npy`` files (``--data X.npy --target y.npy``, memory-mapped, each process reads only its
rows) or Parquet (``--data dir_or_file.parquet --target column``). Process 0 writes the model
file and prints a one-line JSON summary; the others stay silent unless something goes wrong.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings

from ..collectives import rank, world_size
from .launch import (
    DEFAULT_TIMEOUT,
    DistributedError,
    configure_logging,
    destroy_process_group,
    init_process_group,
    save_model_rank0,
    spawn,
)

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m kernelflow.distributed``."""
    parser = argparse.ArgumentParser(prog="python -m kernelflow.distributed",
                                     description="Data-parallel kernelflow fits.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fit", help="fit a model on sharded data and write a model file")
    p.add_argument("--model", required=True,
                   help="nystrom_ridge, nystrom_robust, doubly_stochastic (registered name)")
    p.add_argument("--data", required=True, help="X as .npy, or a Parquet file or directory")
    p.add_argument("--target", required=True, help="y as .npy, or the Parquet target column")
    p.add_argument("--weights", default=None, help="sample weights (.npy or Parquet column)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="estimator parameter (repeatable)")
    p.add_argument("--out", default=None, help="model file written by process 0")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds a collective waits for the other processes (default 300)")
    p.add_argument("--nproc", type=int, default=1,
                   help="local processes to start when not under torchrun (default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per process")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return parser


def _params(items) -> dict:
    from ..utils._text import parse_value

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param expects KEY=VALUE, got {item!r}.")
        out[key.strip()] = parse_value(value)
    return out


def _shard(args):
    from .sharding import shard_npy, shard_parquet

    if args.data.endswith(".npy"):
        return shard_npy(args.data, args.target, args.weights)
    return shard_parquet(args.data, args.target, sample_weight=args.weights)


def _fit(args) -> dict:
    """Runs on every process of an initialised group (or alone)."""
    import torch

    from ..registry import make_estimator
    from .fit import distributed_fit

    if args.threads:
        torch.set_num_threads(args.threads)
    if rank() != 0:  # every process fits the same model and would repeat the same warnings
        warnings.simplefilter("ignore")
    estimator = make_estimator(args.model, **_params(args.param))
    source = _shard(args)
    start = time.perf_counter()
    distributed_fit(estimator, source)
    seconds = time.perf_counter() - start
    summary = {"model": args.model, "n_samples": int(source.n_samples),
               "n_features": int(source.n_features), "processes": world_size(),
               "fit_seconds": round(seconds, 3), "n_iter": getattr(estimator, "n_iter_", None)}
    if args.out:
        save_model_rank0(estimator, args.out)
        summary["out"] = args.out
    return summary


def _run_spawned(args):
    return _fit(args)


def main(argv=None) -> int:
    """Entry point; returns the exit status (0 on success, 1 on a failed run)."""
    args = build_parser().parse_args(argv)
    handler = configure_logging(logging.INFO if args.verbose else logging.WARNING)
    my_rank = int(os.environ.get("RANK", 0))  # torchrun's rank; spawned runs report from 0
    try:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
            init_process_group(timeout=args.timeout)
            try:
                summary = _fit(args)
            finally:
                destroy_process_group()
        elif args.nproc > 1:
            summary = spawn(_run_spawned, args.nproc, args=(args,), timeout=args.timeout,
                            threads=args.threads or 1)[0]
        else:
            summary = _fit(args)
    except (DistributedError, ValueError, TypeError, OSError) as exc:
        print(f"error (rank {my_rank}): {exc}", file=sys.stderr)
        return 1
    finally:
        logging.getLogger("kernelflow").removeHandler(handler)
    if my_rank == 0:
        print(json.dumps(summary))
    return 0
