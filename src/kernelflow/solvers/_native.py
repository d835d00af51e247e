"""Compiled inner loops of sign and coordinate descent (``kernelflow._paths``, C).

The extension is built when the package is installed (``setup.py``; optional, so an install
without a C compiler still succeeds). Without it, or with the environment variable
``KERNELFLOW_NATIVE=0``, :func:`available` is False and the solvers use their tensor code.

:func:`run_problems` runs P independent problems: problem p starts at alpha = 0 on kernel
``K[kernel_of[p]]``, targets ``Y[target_of[p]]`` and the rows ``train[fold_of[p]]``, takes
sign-descent or coordinate-descent steps of size eta, and after every step scores the weighted
squared error on the rows with ``wval[fold_of[p]] > 0``, stopping after ``patience`` steps
without a strict improvement (the rule of :mod:`.path_cv`) or after ``max_iter`` steps. Each step
costs O(n) plus O(n) per flipped sign (sign descent) or per moved coefficient (coordinate
descent); when most signs reverse, O(n) per sign that did not.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import torch

from ..utils._threads import available_threads

__all__ = ["available", "run_problems", "status"]

logger = logging.getLogger("kernelflow")

_METHODS = {"sign": 0, "coordinate": 1}
#: validation losses of the compiled loops (the VLOSS_* codes of paths.c)
_VALIDATION_LOSSES = {"squared": 0, "absolute": 1, "huber": 2}
_I64 = ctypes.POINTER(ctypes.c_int64)
_F64 = ctypes.POINTER(ctypes.c_double)
_U8 = ctypes.POINTER(ctypes.c_uint8)
# sign descent recomputes its running sums from alpha every max(RESYNC, n) steps (bounds the
# rounding drift at O(n) amortised cost per step)
RESYNC = 256
#: Below this many estimated row updates (problems x rows x expected steps) a call runs on the
#: calling thread: handing slices to worker threads costs more than the loops themselves.
SMALL_WORK = 20_000_000
_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    """One lasting pool per thread count (no pool is created or torn down per call)."""
    pool = _POOLS.get(threads)
    if pool is None:
        pool = _POOLS[threads] = ThreadPoolExecutor(threads,
                                                    thread_name_prefix="kernelflow-paths")
    return pool


_REASON: list[str] = []


def _unavailable(reason: str):
    _REASON.append(reason)
    logger.warning("the compiled loops of sign and coordinate descent are unavailable (%s); "
                   "those solvers run as slower tensor code. Reinstall with a C compiler "
                   "(pip install -e . --no-deps) to build them.", reason)


@lru_cache(maxsize=1)
def _library():
    if os.environ.get("KERNELFLOW_NATIVE", "1") == "0":
        _REASON.append("disabled by KERNELFLOW_NATIVE=0")
        return None
    spec = importlib.util.find_spec("kernelflow._paths")
    if spec is None or spec.origin is None:
        return _unavailable("the extension kernelflow._paths was not built")
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError as exc:
        return _unavailable(f"kernelflow._paths cannot be loaded: {exc}")
    for suffix, real in (("f64", ctypes.c_double), ("f32", ctypes.c_float)):
        fn = getattr(lib, f"kf_paths_{suffix}")
        ptr = ctypes.POINTER(real)
        fn.argtypes = [ctypes.c_int32, ptr, ctypes.c_int64, ctypes.c_int64, _I64, ptr, _I64,
                       _U8, _F64, _I64, ctypes.c_int32, _F64, real, ctypes.c_int64,
                       ctypes.c_int64, ctypes.c_int64, _F64, _I64, _I64, ptr]
        fn.restype = ctypes.c_int
        prox = getattr(lib, f"kf_prox_linf_{suffix}", None)
        if prox is not None:  # absent from an extension built before it existed
            prox.argtypes = [ptr, ptr, ctypes.c_int64, ctypes.c_int64, ptr, ptr]
            prox.restype = None
        step = getattr(lib, f"kf_ista_linf_step_{suffix}", None)
        if step is not None:
            step.argtypes = [ptr, ptr, ptr, ptr, ptr, ctypes.c_int64, ctypes.c_int64, _F64]
            step.restype = ctypes.c_int
    return lib


def _compiled(stem: str, dtype):
    """The compiled entry ``kf_<stem>_f64`` / ``_f32`` for a float64 / float32 (NumPy or torch)
    dtype and its ctypes element type, or None when the extension or the entry is missing."""
    lib = _library()
    suffix = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32", torch.float64: "f64",
              torch.float32: "f32"}.get(dtype)
    fn = getattr(lib, f"kf_{stem}_{suffix}", None) if lib is not None and suffix else None
    if fn is None:
        return None
    return fn, ctypes.c_double if suffix == "f64" else ctypes.c_float


def has_ista_linf_step() -> bool:
    """Whether :func:`ista_linf_step` runs compiled code."""
    return _compiled("ista_linf_step", torch.float64) is not None


def ista_linf_step(A: np.ndarray, P: np.ndarray, Y: np.ndarray, eta: np.ndarray,
                   c: np.ndarray) -> np.ndarray | None:
    """One capped-ISTA step with the l-infinity prox on the rows of A (B, n), in place
    (``A <- prox_{c_b ||.||_inf}(A - eta_b (P - Y))``, compiled); returns ||A_new - A_old|| per
    row, or None when the compiled code is unavailable. All arrays are C-contiguous, of A's
    dtype (float32 or float64); eta and c have shape (B,)."""
    entry = _compiled("ista_linf_step", A.dtype)
    if entry is None:
        return None
    fn, real = entry
    B, n = A.shape
    for arr in (P, Y):
        if arr.shape != (B, n) or arr.dtype != A.dtype or not arr.flags.c_contiguous:
            raise ValueError("P and Y must be C-contiguous arrays shaped and typed like A.")
    if not A.flags.c_contiguous or eta.shape != (B,) or c.shape != (B,):
        raise ValueError("A must be C-contiguous, eta and c of shape (B,).")
    moved = np.empty(B, dtype=np.float64)
    code = fn(
        _ptr(A, real), _ptr(P, real), _ptr(Y, real), _ptr(eta, real), _ptr(c, real), B, n,
        _ptr(moved, ctypes.c_double))
    if code != 0:
        raise MemoryError("kernelflow._paths could not allocate its scratch memory.")
    return moved


def prox_linf_rows(v: torch.Tensor, c: torch.Tensor) -> torch.Tensor | None:
    """The prox of c_b ||.||_inf of every row b of a CPU float32/float64 tensor v of shape
    (B, n), compiled (see ``_native/prox_impl.h``); ``c`` has shape (B,). None when the compiled
    code is unavailable."""
    entry = _compiled("prox_linf", v.dtype)
    if entry is None:
        return None
    fn, real = entry
    V = np.ascontiguousarray(v.detach().numpy())
    C = np.ascontiguousarray(c.detach().to(v.dtype).numpy().reshape(-1))
    B, n = V.shape
    if C.size != B:
        raise ValueError(f"c must hold one threshold per row ({B}), got {C.size}.")
    out = np.empty_like(V)
    theta = np.empty(B, dtype=V.dtype)
    fn(_ptr(V, real), _ptr(C, real), B, n, _ptr(out, real), _ptr(theta, real))
    return torch.from_numpy(out)


def available(method: str | None = None, tensor: torch.Tensor | None = None) -> bool:
    """Whether the compiled loops can run ``method`` on ``tensor`` (CPU, float32/float64)."""
    if _library() is None:
        return False
    if method is not None and method not in _METHODS:
        return False
    return tensor is None or (tensor.device.type == "cpu"
                              and tensor.dtype in (torch.float32, torch.float64))


def status() -> str:
    """One line saying whether the compiled loops are active, and why not.

    Examples
    --------
    >>> status().split(":")[0] in ("active", "unavailable")
    True
    """
    spec = importlib.util.find_spec("kernelflow._paths") if _library() is not None else None
    if spec is not None:
        return f"active: {spec.origin}"
    return f"unavailable: {_REASON[-1] if _REASON else 'unknown reason'}"


def _ptr(a: np.ndarray, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def run_problems(method: str, K: torch.Tensor, Y: torch.Tensor, train: torch.Tensor,
                 wval: torch.Tensor, kernel_of, target_of, fold_of, *, eta: float,
                 max_iter: int, patience: int | None = None, return_alpha: bool = False,
                 n_threads: int | None = None, validation_loss: str = "squared",
                 epsilon=None, _stepwise: bool = False):
    """Run the problems described in the module docstring.

    Parameters
    ----------
    method : {"sign", "coordinate"}
    K : tensor of shape (G, n, n)
        Symmetric kernels, float32 or float64 on the CPU.
    Y : tensor of shape (T, n)
        Targets (same dtype).
    train : tensor of shape (F, n)
        Non-zero on each fold's training rows.
    wval : tensor of shape (F, n)
        Validation weights (0 off the validation rows; all 0: no early stopping).
    kernel_of, target_of, fold_of : sequences of P ints
    eta : float
    max_iter : int
    patience : int, optional
        Steps without improvement before a problem stops (None: never).
    validation_loss : {"squared", "absolute", "huber"}, default="squared"
        The validation error (as :data:`kernelflow.solvers.losses.RESIDUAL_LOSSES` defines it).
    epsilon : array-like of shape (F,), optional
        Huber's threshold per fold (required with ``validation_loss="huber"``).
    return_alpha : bool, default=False
        Also return the final coefficients, shape (P, n).
    n_threads : int, optional
        Threads over problems (default: the caller's torch thread count, see
        :func:`kernelflow.utils._threads.available_threads`, and one thread when the
        estimated work, P n min(max_iter, 20 patience), is below ``SMALL_WORK``).
    _stepwise : bool, default=False
        Sign descent: visit every step instead of skipping the runs of steps without a sign
        change (the same results; kept to check the skipping loop against).

    Returns
    -------
    best : ndarray (P,) float64, best_iter : ndarray (P,) int64, n_iter : ndarray (P,) int64,
    and alpha : tensor (P, n) when ``return_alpha``.
    """
    lib = _library()
    if lib is None:
        raise RuntimeError("the compiled extension kernelflow._paths is not available.")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {tuple(_METHODS)}, got {method!r}.")
    dtype = K.dtype
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    real = ctypes.c_double if dtype == torch.float64 else ctypes.c_float
    fn = lib.kf_paths_f64 if dtype == torch.float64 else lib.kf_paths_f32
    Kn = np.ascontiguousarray(K.detach().cpu().numpy(), dtype=np_dtype)
    Yn = np.ascontiguousarray(Y.detach().cpu().numpy(), dtype=np_dtype)
    Tn = np.ascontiguousarray((train != 0).cpu().numpy(), dtype=np.uint8)
    Wn = np.ascontiguousarray(wval.detach().cpu().to(torch.float64).numpy())
    G, n = Kn.shape[0], Kn.shape[-1]
    idx = [np.ascontiguousarray(np.asarray(v, dtype=np.int64).reshape(-1))
           for v in (kernel_of, target_of, fold_of)]
    P = idx[0].size
    if any(v.size != P for v in idx):
        raise ValueError("kernel_of, target_of and fold_of must have the same length.")
    for v, hi, name in zip(idx, (G, Yn.shape[0], Tn.shape[0]), ("kernel", "target", "fold")):
        if P and (v.min() < 0 or v.max() >= hi):
            raise ValueError(f"{name} index out of range [0, {hi}).")
    if Kn.shape != (G, n, n) or Yn.shape[1:] != (n,) or Tn.shape[1:] != (n,) \
            or Wn.shape != Tn.shape:
        raise ValueError("inconsistent shapes of K, Y, train and wval.")
    if validation_loss not in _VALIDATION_LOSSES:
        raise ValueError(f"validation_loss must be one of {tuple(_VALIDATION_LOSSES)}, got "
                         f"{validation_loss!r}.")
    eps = None
    if validation_loss == "huber":
        if epsilon is None:
            raise ValueError("validation_loss='huber' needs epsilon (one threshold per fold).")
        eps = np.ascontiguousarray(np.asarray(epsilon, dtype=np.float64).reshape(-1))
        if eps.size != Tn.shape[0] or not bool(np.all(np.isfinite(eps) & (eps > 0))):
            raise ValueError("epsilon must hold one positive finite threshold per fold.")
    best = np.full(P, np.inf)
    best_it = np.zeros(P, dtype=np.int64)
    n_iter = np.zeros(P, dtype=np.int64)
    alpha = np.zeros((P, n), dtype=np_dtype) if return_alpha else None
    patience = int(max_iter) + 1 if patience is None else int(patience)

    code = _METHODS[method] | (2 if _stepwise else 0)

    def run(lo: int, hi: int) -> int:
        if hi <= lo:
            return 0
        return fn(
            code, _ptr(Kn, real), n, hi - lo, _ptr(idx[0][lo:hi], ctypes.c_int64),
            _ptr(Yn, real), _ptr(idx[1][lo:hi], ctypes.c_int64), _ptr(Tn, ctypes.c_uint8),
            _ptr(Wn, ctypes.c_double), _ptr(idx[2][lo:hi], ctypes.c_int64),
            _VALIDATION_LOSSES[validation_loss],
            None if eps is None else _ptr(eps, ctypes.c_double), real(eta),
            int(max_iter), patience, RESYNC, _ptr(best[lo:hi], ctypes.c_double),
            _ptr(best_it[lo:hi], ctypes.c_int64), _ptr(n_iter[lo:hi], ctypes.c_int64),
            None if alpha is None else _ptr(alpha[lo:], real),
        )

    if not n_threads:
        steps = min(int(max_iter), 20 * patience)
        n_threads = 1 if P * n * steps < SMALL_WORK else available_threads()
    threads = max(1, min(P, n_threads))
    if threads == 1:
        codes = [run(0, P)]
    else:  # ctypes releases the GIL; small slices keep the threads evenly loaded
        size = max(1, P // (8 * threads))
        codes = list(_pool(threads).map(lambda lo: run(lo, min(P, lo + size)),
                                        range(0, P, size)))
    if any(c != 0 for c in codes):
        raise MemoryError("kernelflow._paths could not allocate its scratch memory.")
    if return_alpha:
        return best, best_it, n_iter, torch.from_numpy(alpha).to(K.device)
    return best, best_it, n_iter
