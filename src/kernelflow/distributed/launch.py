"""Starting, supervising and ending data-parallel process groups (Gloo on CPUs, NCCL on GPUs).

Two ways to run code on N processes:

* ``torchrun --nproc_per_node=N -m kernelflow.distributed fit ...`` (one or many hosts): torchrun
  sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` and every process calls
  :func:`init_process_group`;
* :func:`spawn` from Python on one host: starts N fresh interpreters, initialises the group in
  each, runs a function and returns every process's result, or raises :class:`DistributedError`
  naming the processes that failed.

Every collective operation is bounded by the ``timeout`` given to :func:`init_process_group`, so a
process that dies or stops answering makes the others fail with an error instead of waiting
forever. Logging and model files are written by process 0 only (:func:`configure_logging`,
:func:`save_model_rank0`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing as mp
import queue as queue_mod
import signal
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..collectives import (
    _GROUP_STATE,
    DistributedError,
    configured_timeout,
    is_distributed,
    rank,
    world_size,
)

__all__ = [
    "DistributedError",
    "DEFAULT_TIMEOUT",
    "init_process_group",
    "destroy_process_group",
    "configured_timeout",
    "free_port",
    "spawn",
    "configure_logging",
    "save_model_rank0",
    "barrier",
]

logger = logging.getLogger(__name__)

#: Seconds a collective operation may wait for the other processes before it fails.
DEFAULT_TIMEOUT = 300.0


def init_process_group(backend: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                       init_method: str | None = None, rank: int | None = None,
                       world_size: int | None = None, store=None) -> None:
    """Initialise the default torch.distributed process group with a bounded timeout.

    Without ``init_method`` the rendezvous is read from the environment variables torchrun sets
    (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``). ``backend`` defaults to
    ``"cpu:gloo,cuda:nccl"`` when CUDA is available (the solvers' float64 accumulators live on
    the CPU and go through Gloo, CUDA tensors through NCCL), else ``"gloo"``.

    Parameters
    ----------
    backend : str or None, default=None
        E.g. ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``.
    timeout : float, default=300
        Seconds any collective operation waits for the other processes before raising.
    init_method : str, optional
        E.g. ``"tcp://127.0.0.1:29500"``; default ``"env://"``.
    rank, world_size : int, optional
        Needed with a ``tcp://`` init method or a ``store``.
    store : torch.distributed.Store, optional
        A key-value store for the rendezvous instead of ``init_method`` (what :func:`spawn`
        uses: a store served by the parent on a port the OS assigned, so no port is guessed).

    Examples
    --------
    >>> init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
    ...                    world_size=1, timeout=30)
    >>> configured_timeout()
    30.0
    >>> destroy_process_group()
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}.")
    if dist.is_initialized():
        raise DistributedError("a torch.distributed process group is already initialised.")
    if backend is None:
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    kwargs: dict[str, Any] = {}
    if rank is not None:
        kwargs["rank"] = int(rank)
    if world_size is not None:
        kwargs["world_size"] = int(world_size)
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = init_method or "env://"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout)),
                            **kwargs)
    _GROUP_STATE["timeout"] = float(timeout)
    logger.debug("process group up: rank %d of %d (%s, timeout %.0f s)", dist.get_rank(),
                 dist.get_world_size(), backend, timeout)


def destroy_process_group() -> None:
    """Tear down the default process group if there is one (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _GROUP_STATE["timeout"] = None


def barrier() -> None:
    """Wait for every process (no-op on one process)."""
    if is_distributed():
        dist.barrier()


def free_port() -> int:
    """A TCP port on localhost that is free right now (for a single-host rendezvous).

    Another process may take it before it is used; :func:`spawn` does not rely on it (its
    rendezvous store listens on a port the OS assigns).
    """
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- rank-0-only output ------------------------------------------------------------------------
class _RankFilter(logging.Filter):
    """Prefixes records with the rank; drops records below ``min_other`` on ranks other than 0."""

    def __init__(self, min_other: int):
        super().__init__()
        self.min_other = min_other

    def filter(self, record: logging.LogRecord) -> bool:
        r = rank()
        record.rank = r
        return r == 0 or record.levelno >= self.min_other


def configure_logging(level: int = logging.INFO, *, other_ranks: int = logging.WARNING,
                      logger_name: str = "kernelflow") -> logging.Handler:
    """Send ``kernelflow`` log records to stderr: all from process 0, warnings from the others.

    Each line starts with ``[rank r]``. Returns the installed handler (remove it to undo).

    Examples
    --------
    >>> h = configure_logging(logging.WARNING)
    >>> logging.getLogger("kernelflow").removeHandler(h)
    """
    handler = logging.StreamHandler()
    handler.addFilter(_RankFilter(other_ranks))
    handler.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger(logger_name)
    log.addHandler(handler)
    log.setLevel(min(level, other_ranks))
    return handler


def save_model_rank0(estimator, path, **kwargs):
    """Write ``estimator`` with :func:`kernelflow.io.save_model` on process 0 only, then wait.

    Every process holds the same fitted model after a data-parallel fit, so one file suffices;
    the barrier keeps the other processes from reading it before it exists. Returns the path on
    process 0 and None elsewhere.
    """
    from ..io import save_model

    out = save_model(estimator, path, **kwargs) if rank() == 0 else None
    barrier()
    return out


# ---- spawning on one host ----------------------------------------------------------------------
def _child(rk: int, world: int, port: int, fn: Callable, args: tuple, timeout: float,
           threads: int | None, results) -> None:
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        # the parent serves the rendezvous store on ``port`` (bound before any child started)
        store = dist.TCPStore("127.0.0.1", port, world, False,
                              datetime.timedelta(seconds=float(timeout)))
        init_process_group("gloo", store=store, rank=rk, world_size=world, timeout=timeout)
        out = fn(*args)
        results.put((rk, "ok", out))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        results.put((rk, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        with contextlib.suppress(Exception):
            destroy_process_group()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


#: Imported once by the fork server, so that each process it forks starts without importing them.
_PRELOAD = ["torch", "numpy", "sklearn", "kernelflow.distributed.fit",
            "kernelflow.estimators.nystrom_ridge", "kernelflow.estimators.nystrom_robust",
            "kernelflow.estimators.doubly_stochastic_regressor"]


def _context(start_method: str | None):
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _end(procs) -> None:
    """Make every process exit: join briefly, then SIGTERM, then SIGKILL.

    SIGTERM stays pending on a stopped process (SIGSTOP, a debugger) and a process can ignore
    it; SIGKILL ends both, so no child outlives :func:`spawn` (multiprocessing would otherwise
    wait for it forever when the interpreter exits).
    """
    for p in procs:
        p.join(timeout=1.0)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


def spawn(fn: Callable, nprocs: int = 2, args: Sequence = (), *, timeout: float = 60.0,
          threads: int | None = 1, grace: float = 10.0, max_seconds: float | None = None,
          start_method: str | None = None) -> list:
    """Run ``fn(*args)`` on ``nprocs`` fresh processes joined in a Gloo group on localhost.

    ``fn`` must be importable by name (a module-level function). Inside it, the group is
    initialised (:mod:`kernelflow.collectives` reports the rank and world size) with
    collective ``timeout``; each process uses ``threads`` intra-op threads.

    Parameters
    ----------
    fn : callable
    nprocs : int, default=2
    args : sequence, default=()
    timeout : float, default=60
        Seconds a collective may wait; a process that dies makes the others fail within this.
    threads : int or None, default=1
        ``torch.set_num_threads`` in every process (None keeps torch's default).
    grace : float, default=10
        Seconds beyond ``timeout`` after a failure before the remaining processes are terminated
        (killed if they do not end within 2 s, e.g. a stopped process).
    max_seconds : float, optional
        Wall-clock limit of the whole run; processes still running then are terminated.
    start_method : {"forkserver", "spawn"} or None, default=None
        How processes start: "forkserver" (default where available) imports torch and
        kernelflow once in a server process and forks fresh processes from it, which never ran
        a thread pool; "spawn" starts fresh interpreters. "fork" is refused: forking a process
        whose thread pools have run is unsafe.

    Returns
    -------
    results : list
        ``fn``'s return value on each process, by rank.

    Raises
    ------
    DistributedError
        If any process raised, died or hung; the message names each failed rank and why.
    """
    if int(nprocs) < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}.")
    if start_method == "fork":
        raise ValueError("start_method='fork' is unsafe after torch has run threads; use "
                         "'forkserver' or 'spawn'.")
    ctx = _context(start_method)
    results = ctx.Queue()
    # the rendezvous store listens on a port the OS assigned and stays bound for the whole run,
    # so no other process can take it between choosing and using it
    store = dist.TCPStore("127.0.0.1", 0, int(nprocs), True,
                          datetime.timedelta(seconds=float(timeout)), wait_for_workers=False)
    port = int(store.port)
    procs = [ctx.Process(target=_child, args=(r, nprocs, port, fn, tuple(args), float(timeout),
                                              threads, results), daemon=True)
             for r in range(nprocs)]
    for p in procs:
        p.start()
    done: dict[int, tuple[str, Any]] = {}
    dead_since: dict[int, float] = {}
    deadline = None  # set after the first failure: the others must end within timeout + grace
    stop_at = None if max_seconds is None else time.monotonic() + float(max_seconds)
    try:
        while len(done) < nprocs:
            try:
                rk, status, value = results.get(timeout=0.2)
                done[rk] = (status, value)
                if status != "ok" and deadline is None:
                    deadline = time.monotonic() + timeout + grace
                continue
            except queue_mod.Empty:
                pass
            now = time.monotonic()
            for rk, p in enumerate(procs):
                if rk in done or p.is_alive():
                    continue
                # its result may still be in the pipe: blame it only after a second of silence
                if now - dead_since.setdefault(rk, now) > 1.0:
                    done[rk] = ("died", "process exited without a result "
                                        f"({_describe_exit(p.exitcode)})")
                    if deadline is None:
                        deadline = now + timeout + grace
            if deadline is not None and now > deadline:
                for rk in range(nprocs):
                    if rk not in done:
                        done[rk] = ("hung", f"no answer {timeout + grace:.0f} s after the first "
                                            "failure; terminated")
            if stop_at is not None and now > stop_at:
                for rk in range(nprocs):
                    if rk not in done:
                        done[rk] = ("hung", f"still running after max_seconds={max_seconds}; "
                                            "terminated")
    finally:
        _end(procs)
        del store
    failed = {rk: v for rk, v in sorted(done.items()) if v[0] != "ok"}
    if failed:
        lines = [f"rank {rk} {status}: {str(msg).strip().splitlines()[0] if msg else ''}"
                 for rk, (status, msg) in failed.items()]
        details = "\n\n".join(f"--- rank {rk} ---\n{msg}" for rk, (_, msg) in failed.items())
        raise DistributedError(
            f"{len(failed)} of {nprocs} processes failed:\n" + "\n".join(lines)
            + "\n\n" + details)
    return [done[rk][1] for rk in range(nprocs)]


def describe() -> str:
    """One line: this process's rank, world size and backend (for logs)."""
    if not is_distributed():
        return "single process"
    return f"rank {rank()} of {world_size()} ({dist.get_backend()})"
