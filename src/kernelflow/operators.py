"""Linear operators: the kernel engine and every other matrix the solvers multiply by.

One interface, :class:`LinearOperator`, serves every solver. A subclass implements a few
methods (``shape``, ``dtype``, ``device`` and ``_matmul``; optionally ``_t_matmul``,
``_diagonal``, ``_block`` when it can do better than the generic versions) and inherits the
rest: ``matmul``/``@``, ``t_matmul``, ``rmatmul``, ``kt_k_matmul``, ``diagonal``, ``rows``,
``columns``, ``column``, ``block``, ``to_dense`` and ``fits_in_memory``, all with the same
argument checks. The subclasses:

- :class:`KernelOperator`: a lazily evaluated kernel matrix K(X1, X2) (the tiled engine);
- :class:`DenseOperator`: a stored matrix (also the precomputed kernel);
- :class:`ScaledOperator`: D1 K D2 with diagonal D1, D2 (sample weights, masks);
- :class:`SubsetOperator`: the rows/columns view ``K[rows][:, cols]``;
- :class:`FeatureOperator`: Phi1 Phi2^T from an explicit feature map;
- :class:`BatchedMaskedOperator`: a batch of masked problems sharing one operator.

:func:`as_operator` turns a tensor into a :class:`DenseOperator` and returns operators unchanged.

A product ``K @ V`` visits the matrix tile by tile: each tile is computed (one GEMM on prepared
inputs plus an elementwise kernel map, in place) and immediately multiplied into the output, so
the n1 x n2 matrix never exists. Tiles are sized to stay in cache and never exceed the memory
budget.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from .kernels import Kernel, _common_shift

__all__ = [
    "Options",
    "LinearOperator",
    "KernelOperator",
    "DenseOperator",
    "ScaledOperator",
    "SubsetOperator",
    "FeatureOperator",
    "BatchedMaskedOperator",
    "as_operator",
    "available_memory",
    "memory_budget",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    """Performance options shared by the kernel engine and the solvers.

    Parameters
    ----------
    memory_budget : int, optional
        Bytes that one call may allocate for kernel tiles and dense kernel matrices. ``None``
        means ``memory_fraction`` of the memory available when the call starts.
    memory_fraction : float, default=0.5
        Fraction of available memory used when ``memory_budget`` is None.
    tile_bytes : int, default=2**21
        Target size of one kernel tile in bytes (2 MiB: 2**19 entries in float32, 2**18 in
        float64). Each tile is written by a GEMM, exponentiated in place and read by the
        product(s) with the right-hand side while it is still in cache; 2 MiB was the fastest
        size for both dtypes and for square and Nyström products on the reference machine
        (``docs/performance/foundation.md``).
    tile_elements : int, optional
        Number of kernel entries per tile; overrides ``tile_bytes`` when given.
    accumulate_float64 : bool, default=False
        Compute tiles in the input dtype but accumulate products in float64.
    products_float64 : bool, default=False
        Kernel values in the input dtype (float32), products and sums in float64: each tile
        (or chunk of stored rows) is up-cast before it is multiplied. Float32 products of
        float32 values err by about eps32 |K| |V|, an error that is not a fixed matrix (it
        changes with V): iterative solvers whose preconditioned system reaches below eps32
        times its largest eigenvalue lose positive curvature on it and drift. Costs the
        products in float64 (the kernel values, the costly part of a streamed product, stay
        float32); no effect on float64 operators.
    device : str or torch.device, optional
        Device of the computation; ``None`` keeps the inputs' device.
    cholesky_max_size : int, default=30000
        Largest n for which dense factorisations are attempted (also subject to the budget).
    cg_tol : float, optional
        Default relative residual tolerance of conjugate gradients; ``None`` picks 1e-7 in
        float32 and 1e-12 in float64.

    Examples
    --------
    >>> import dataclasses
    >>> opts = dataclasses.replace(Options(), memory_budget=2**30)
    >>> opts.memory_budget
    1073741824
    """

    memory_budget: int | None = None
    memory_fraction: float = 0.5
    tile_bytes: int = 2**21
    tile_elements: int | None = None
    accumulate_float64: bool = False
    products_float64: bool = False
    device: str | torch.device | None = None
    cholesky_max_size: int = 30000
    cg_tol: float | None = None

    def replace(self, **changes) -> Options:
        return dataclasses.replace(self, **changes)

    def tile_size(self, itemsize: int) -> int:
        """Kernel entries per tile for elements of ``itemsize`` bytes."""
        if self.tile_elements is not None:
            return int(self.tile_elements)
        return max(1, int(self.tile_bytes) // int(itemsize))

    def cg_tolerance(self, dtype: torch.dtype) -> float:
        if self.cg_tol is not None:
            return self.cg_tol
        return 1e-7 if dtype == torch.float32 else 1e-12


_UNLIMITED = 2**60  # cgroup "no limit" values are near 2**63


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    if text in ("", "max"):
        return None
    try:
        value = int(text.split()[0])
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def _cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 memory-controller path (from /proc/self/cgroup)."""
    v2 = v1 = None
    try:
        with open(proc_cgroup) as fh:
            for line in fh:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                if parts[0] == "0" and parts[1] == "":
                    v2 = parts[2]
                elif "memory" in parts[1].split(","):
                    v1 = parts[2]
    except OSError:
        pass
    return v2, v1


def _cgroup_available(root: str = "/sys/fs/cgroup",
                      proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """Bytes left under this process's cgroup memory limit (v2 or v1), None when unlimited.

    Every level from the process's own cgroup up to the root is read (the tightest limit wins);
    inside a container the cgroup namespace makes the mount point the process's own cgroup.
    """
    v2_path, v1_path = _cgroup_paths(proc_cgroup)
    best = None

    def consider(limit_file, usage_file):
        nonlocal best
        limit = _read_int(limit_file)
        if limit is None:
            return
        usage = _read_int(usage_file) or 0
        left = max(0, limit - usage)
        best = left if best is None else min(best, left)

    def levels(base, rel):
        rel = (rel or "/").strip("/")
        parts = rel.split("/") if rel else []
        dirs = [os.path.join(base, *parts[:i]) for i in range(len(parts), -1, -1)]
        return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)] or [base]

    if os.path.exists(os.path.join(root, "cgroup.controllers")):  # unified (v2) hierarchy
        for d in levels(root, v2_path):
            consider(os.path.join(d, "memory.max"), os.path.join(d, "memory.current"))
    v1_root = os.path.join(root, "memory")
    if os.path.isdir(v1_root):
        for d in levels(v1_root, v1_path):
            consider(os.path.join(d, "memory.limit_in_bytes"),
                     os.path.join(d, "memory.usage_in_bytes"))
    return best


def _rlimit_available() -> int | None:
    """Bytes of address space left under ``RLIMIT_AS`` (and ``RLIMIT_DATA``), None if unlimited."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    best = None
    for name, field in (("RLIMIT_AS", "VmSize:"), ("RLIMIT_DATA", "VmData:")):
        lim = getattr(resource, name, None)
        if lim is None:
            continue
        soft, _ = resource.getrlimit(lim)
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        used = 0
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith(field):
                        used = int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            pass
        left = max(0, int(soft) - used)
        best = left if best is None else min(best, left)
    return best


def _host_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def available_memory(device: torch.device | str | None = None) -> int:
    """Bytes available now on ``device``: for the CPU, the smallest of the host's free memory
    (``MemAvailable``), what is left under this process's cgroup memory limit (v2
    ``memory.max - memory.current``, v1 ``memory.limit_in_bytes - memory.usage_in_bytes``) and
    under its address-space limit (``RLIMIT_AS``/``RLIMIT_DATA`` minus the current size); for a
    CUDA device, the device's free memory (``torch.cuda.mem_get_info``), to which the blocks
    cached by PyTorch's allocator but not in use are added (they are free to this process).

    Examples
    --------
    >>> available_memory() > 0
    True
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free) + max(0, int(cached))
    limits = [_host_available(), _cgroup_available(), _rlimit_available()]
    return int(min(v for v in limits if v is not None))


def memory_budget(options: Options | None = None, device=None) -> int:
    """Bytes one engine call may use: ``options.memory_budget`` or a fraction of what is free
    on the device of the computation (see :func:`available_memory`: host, cgroup and
    address-space limits on the CPU, free device memory on a GPU).

    The device is ``device`` when given, else ``options.device``, else the CPU.

    Examples
    --------
    >>> memory_budget(Options(memory_budget=2**20))
    1048576
    """
    options = options or Options()
    if options.memory_budget is not None:
        return int(options.memory_budget)
    if device is None:
        device = options.device
    return int(options.memory_fraction * available_memory(device))


def _oom_advice(exc: BaseException, what: str, device) -> str:
    """The message of the ``MemoryError`` that replaces an allocator's out-of-memory error."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    try:
        free = f"{available_memory(device) / 2**30:.2f} GiB"
    except Exception:  # noqa: BLE001 - advice only
        free = "an unknown amount"
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    where = ("free on that device" if device.type != "cpu"
             else "available (host, cgroup and RLIMIT_AS limits)")
    return (
        f"{what} ran out of memory on {device} ({first}). {free} are {where} now. Lower the "
        "problem size (fewer rows, n_components or block_size), use float32, or set "
        "options=Options(memory_budget=...) below that figure: the engine sizes its tiles and "
        "decides what to store from the budget."
    )


#: CUDA's out-of-memory error (``torch.OutOfMemoryError`` from torch 2.5 on, a RuntimeError).
_OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def _translate_oom(method):
    """Re-raise an allocator's out-of-memory error (``torch.OutOfMemoryError``, which CUDA
    raises, or the CPU allocator's ``RuntimeError``) inside an operator method as a
    ``MemoryError`` with advice; the original error is its ``__cause__``."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except _OUT_OF_MEMORY as exc:
            raise MemoryError(_oom_advice(exc, f"{type(self).__name__}.{name}",
                                          _safe_device(self))) from exc
        except RuntimeError as exc:
            if "can't allocate memory" not in str(exc):
                raise
            raise MemoryError(_oom_advice(exc, f"{type(self).__name__}.{name}",
                                          _safe_device(self))) from exc

    return wrapper


def _safe_device(op) -> torch.device | None:
    try:
        return op.device
    except Exception:  # noqa: BLE001 - advice only
        return None


def _index(idx, n: int, device, name: str) -> torch.Tensor:
    """Validated int64 positions in [0, n) from a list, array, tensor or boolean mask."""
    if isinstance(idx, slice):
        return torch.arange(n, device=device)[idx]
    t = torch.as_tensor(idx, device=device)
    if t.dtype == torch.bool:
        if t.ndim != 1 or t.shape[0] != n:
            raise ValueError(f"{name} mask must have shape ({n},), found {tuple(t.shape)}.")
        return torch.nonzero(t).reshape(-1)
    if t.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    if t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must hold integer positions, got dtype {t.dtype}.")
    t = t.reshape(-1).long()
    if int(t.min()) < -n or int(t.max()) >= n:
        raise IndexError(f"{name} holds positions outside [0, {n}).")
    return torch.where(t < 0, t + n, t)


class LinearOperator:
    """A matrix of shape (n1, n2) known through its products.

    Subclasses implement ``shape``, ``dtype``, ``device`` and ``_matmul(V)`` (V of shape
    (n2, t), already checked, returns (n1, t)); they may override ``_t_matmul``,
    ``_diagonal``, ``_block`` and ``_kt_k_matmul`` with faster versions. The generic
    ``_t_matmul`` and ``_block`` go through ``_matmul`` with unit vectors (O(n1 n2 k) for k
    unit vectors), the generic ``_diagonal`` through square blocks.

    The public methods check their arguments once, for every subclass: right-hand sides must
    be tensors of the right length (1-D or 2-D), positions integers in range.

    Examples
    --------
    >>> import torch
    >>> K = as_operator(torch.tensor([[2.0, 1.0], [1.0, 3.0]]))
    >>> K @ torch.tensor([1.0, 1.0])
    tensor([3., 4.])
    >>> K.rmatmul(torch.tensor([[1.0, 0.0]]))
    tensor([[2., 1.]])
    """

    options: Options = Options()

    # ---- what a subclass provides -------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def device(self) -> torch.device:  # pragma: no cover - abstract
        raise NotImplementedError

    def _matmul(self, V: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _t_matmul(self, V: torch.Tensor) -> torch.Tensor:
        n1, n2 = self.shape
        acc = self._acc_dtype(V)
        out = torch.zeros(n2, V.shape[1], dtype=acc, device=self.device)
        step = max(1, 4096 * 64 // max(n2, 1))
        for i0 in range(0, n1, step):  # row blocks: (K[i0:i1])^T V[i0:i1]
            rows = torch.arange(i0, min(i0 + step, n1), device=self.device)
            out += self._block(rows, torch.arange(n2, device=self.device)).to(acc).T @ \
                V[i0:i0 + rows.shape[0]].to(acc)
        return out

    def _block(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        n2 = self.shape[1]
        E = torch.zeros(n2, cols.shape[0], dtype=self.dtype, device=self.device)
        E[cols, torch.arange(cols.shape[0], device=self.device)] = 1
        return self._matmul(E)[rows].to(self.dtype)

    def _diagonal(self) -> torch.Tensor:
        n = min(self.shape)
        out = torch.empty(n, dtype=self.dtype, device=self.device)
        for i0 in range(0, n, 256):  # small square blocks: their diagonals are the pairs
            idx = torch.arange(i0, min(i0 + 256, n), device=self.device)
            out[i0:i0 + idx.shape[0]] = self._block(idx, idx).diagonal()
        return out

    def _kt_k_matmul(self, V, W, row_weights):
        U = self._matmul(V)
        if W is not None:
            U = U + W.to(U.dtype)
        if row_weights is not None:
            U = U * row_weights.to(U.dtype).reshape(-1, 1)
        return self._t_matmul(U)

    # ---- derived ------------------------------------------------------------------------------
    @property
    def symmetric(self) -> bool:
        return False

    @property
    def T(self) -> LinearOperator:
        """The transpose as an operator (a view, nothing is computed)."""
        return self if self.symmetric else _Transposed(self)

    def _element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def _budget(self) -> int:
        return memory_budget(self.options, self.device)

    def _acc_dtype(self, V: torch.Tensor) -> torch.dtype:
        if self.options.accumulate_float64 or self.options.products_float64:
            return torch.float64
        return torch.promote_types(self.dtype, V.dtype)

    def fits_in_memory(self, copies: int = 1) -> bool:
        """Whether ``copies`` dense n1 x n2 matrices fit in the memory budget."""
        n1, n2 = self.shape
        return copies * n1 * n2 * self._element_size() <= self._budget()

    def _check_rhs(self, V, n: int, name: str):
        if not isinstance(V, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(V).__name__}.")
        if V.ndim not in (1, 2) or V.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},) or ({n}, t), found {tuple(V.shape)}.")
        if V.is_complex() or not V.is_floating_point():
            V = V.to(self.dtype)
        squeeze = V.ndim == 1
        V = V.reshape(n, -1)
        if V.device != self.device:
            V = V.to(self.device)
        return V, squeeze

    def _empty(self, n: int, V: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n, V.shape[1], dtype=self._acc_dtype(V), device=self.device)

    @_translate_oom
    def matmul(self, V: torch.Tensor) -> torch.Tensor:
        """K @ V for V of shape (n2,) or (n2, t); returns (n1,) or (n1, t)."""
        n1, n2 = self.shape
        V, squeeze = self._check_rhs(V, n2, "V")
        out = self._empty(n1, V) if 0 in (n1, n2, V.shape[1]) else self._matmul(V)
        return out[:, 0] if squeeze else out

    def __matmul__(self, V):
        return self.matmul(V)

    @_translate_oom
    def t_matmul(self, V: torch.Tensor) -> torch.Tensor:
        """K.T @ V for V of shape (n1,) or (n1, t); returns (n2,) or (n2, t)."""
        n1, n2 = self.shape
        V, squeeze = self._check_rhs(V, n1, "V")
        if 0 in (n1, n2, V.shape[1]):
            out = self._empty(n2, V)
        else:
            out = self._matmul(V) if self.symmetric else self._t_matmul(V)
        return out[:, 0] if squeeze else out

    def rmatmul(self, A: torch.Tensor) -> torch.Tensor:
        """A @ K.T = (K @ A.T).T for A of shape (B, n2); returns (B, n1).

        The batch layout of the path solvers: row b of A is the coefficient vector of
        problem b.
        """
        n2 = self.shape[1]
        if not isinstance(A, torch.Tensor):
            raise TypeError(f"A must be a torch.Tensor, got {type(A).__name__}.")
        if A.ndim != 2 or A.shape[1] != n2:
            raise ValueError(f"A must have shape (B, {n2}), found {tuple(A.shape)}.")
        return self.matmul(A.T.contiguous()).T

    @_translate_oom
    def kt_k_matmul(self, V: torch.Tensor, W: torch.Tensor | None = None,
                    row_weights: torch.Tensor | None = None) -> torch.Tensor:
        """K.T @ (D (K @ V + W)) (the normal-equation product); D = diag(row_weights).

        V has shape (n2,) or (n2, t), W (n1, t) and ``row_weights`` (n1,).
        """
        n1, n2 = self.shape
        V, squeeze = self._check_rhs(V, n2, "V")
        if W is not None:
            W, _ = self._check_rhs(W, n1, "W")
            if W.shape[1] != V.shape[1]:
                raise ValueError(f"W must have {V.shape[1]} columns, found {W.shape[1]}.")
        if row_weights is not None and tuple(row_weights.shape) != (n1,):
            raise ValueError(
                f"row_weights must have shape ({n1},), found {tuple(row_weights.shape)}.")
        if 0 in (n1, n2, V.shape[1]):
            out = self._empty(n2, V)
        else:
            out = self._kt_k_matmul(V, W, row_weights)
        return out[:, 0] if squeeze else out

    def diagonal(self) -> torch.Tensor:
        """Diagonal K[i, i], i < min(n1, n2)."""
        if min(self.shape) == 0:
            return torch.zeros(0, dtype=self.dtype, device=self.device)
        return self._diagonal()

    @_translate_oom
    def block(self, rows, cols) -> torch.Tensor:
        """Dense sub-matrix ``K[rows][:, cols]`` (positions, boolean masks or slices)."""
        n1, n2 = self.shape
        r = _index(rows, n1, self.device, "rows")
        c = _index(cols, n2, self.device, "cols")
        if r.shape[0] == 0 or c.shape[0] == 0:
            return torch.zeros(r.shape[0], c.shape[0], dtype=self.dtype, device=self.device)
        return self._block(r, c)

    def rows(self, idx) -> torch.Tensor:
        """Dense rows K[idx, :] of shape (len(idx), n2)."""
        return self.block(idx, slice(None))

    def columns(self, idx) -> torch.Tensor:
        """Dense columns K[:, idx] of shape (n1, len(idx))."""
        return self.block(slice(None), idx)

    def column(self, j: int) -> torch.Tensor:
        """Column K[:, j] of shape (n1,)."""
        return self.columns([int(j)])[:, 0]

    def subset(self, rows=None, cols=None) -> LinearOperator:
        """The operator of ``K[rows][:, cols]`` (``None`` keeps all rows / columns).

        Kernel, dense and feature operators return an operator of the same kind on the selected
        points (products cost O(len(rows) len(cols))); others a :class:`SubsetOperator` view.
        """
        n1, n2 = self.shape
        r = None if rows is None else _index(rows, n1, self.device, "rows")
        c = None if cols is None else _index(cols, n2, self.device, "cols")
        if r is None and c is None:
            return self
        return self._subset(r, c)

    def _subset(self, rows, cols) -> LinearOperator:
        return SubsetOperator(self, rows, cols)

    def to_dense(self) -> torch.Tensor:
        """The full matrix; raises ``MemoryError`` if it exceeds the memory budget."""
        if not self.fits_in_memory(copies=1):
            n1, n2 = self.shape
            raise MemoryError(
                f"K of shape ({n1}, {n2}) needs {n1 * n2 * self._element_size()} bytes, above "
                f"the memory budget of {self._budget()} bytes; use products instead."
            )
        return self.block(slice(None), slice(None))

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype})"


class _Transposed(LinearOperator):
    """K.T as an operator (products swap ``matmul`` and ``t_matmul``)."""

    def __init__(self, base: LinearOperator):
        self.base, self.options = base, base.options

    shape = property(lambda self: self.base.shape[::-1])
    dtype = property(lambda self: self.base.dtype)
    device = property(lambda self: self.base.device)
    T = property(lambda self: self.base)

    def _matmul(self, V):
        return self.base._t_matmul(V)

    def _t_matmul(self, V):
        return self.base._matmul(V)

    def _block(self, rows, cols):
        return self.base._block(cols, rows).T

    def _diagonal(self):
        return self.base._diagonal()


class KernelOperator(LinearOperator):
    """Lazy kernel matrix K(X1, X2) of shape (n1, n2).

    Products are computed tile by tile and never allocate more than the memory budget.

    Parameters
    ----------
    kernel : Kernel
    X1 : tensor of shape (n1, d)
    X2 : tensor of shape (n2, d), optional
        ``None`` means the symmetric matrix K(X1, X1).
    options : Options, optional

    Notes
    -----
    Cost of ``K @ V`` with V of shape (n2, t): O(n1 n2 (d + t)) flops plus n1 n2 kernel-map
    evaluations; memory O(tile + n1 t). Tiles are ``Options.tile_bytes`` large; for n2 larger than
    4096 the column dimension is split as well. The memory budget of a tile counts the kernel's
    own temporaries (:meth:`kernelflow.kernels.Kernel.extra_memory`).

    Examples
    --------
    >>> import torch
    >>> from kernelflow.kernels import Gaussian
    >>> X = torch.randn(500, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> K = KernelOperator(Gaussian(1.0), X)
    >>> v = torch.ones(500, dtype=torch.float64)
    >>> bool(torch.allclose(K @ v, K.to_dense() @ v))
    True
    """

    def __init__(self, kernel: Kernel, X1: torch.Tensor, X2: torch.Tensor | None = None, *,
                 options: Options | None = None):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a Kernel, got {type(kernel).__name__}.")
        kernel.validate()
        self.kernel = kernel
        self.options = options or Options()
        device = self.options.device
        if not isinstance(X1, torch.Tensor) or not (X2 is None or isinstance(X2, torch.Tensor)):
            raise TypeError("X1 and X2 must be torch tensors.")
        X1 = X1 if device is None else X1.to(device)
        self._symmetric = X2 is None
        X2 = X1 if X2 is None else (X2 if device is None else X2.to(device))
        if X1.ndim != 2 or X2.ndim != 2 or X1.shape[1] != X2.shape[1]:
            raise ValueError(
                f"X1 and X2 must be 2-D with the same number of columns, got {tuple(X1.shape)} "
                f"and {tuple(X2.shape)}."
            )
        if X1.dtype != X2.dtype:
            raise TypeError(f"X1 and X2 must share a dtype, got {X1.dtype} and {X2.dtype}.")
        self.X1, self.X2 = X1, X2
        shift = None
        if kernel.is_stationary and X1.shape[0] and X2.shape[0]:
            shift = _common_shift(X1, X2)
        self._P1 = kernel._prepare(X1 if shift is None else X1 - shift, 0)
        self._P2 = kernel._prepare(X2 if shift is None else X2 - shift, 1)

    # ---- basic properties ---------------------------------------------------------------------
    @property
    def symmetric(self) -> bool:
        return self._symmetric

    @property
    def shape(self) -> tuple[int, int]:
        return (self.X1.shape[0], self.X2.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.X1.dtype

    @property
    def device(self) -> torch.device:
        return self.X1.device

    def _tiles(self, n_cols_rhs: int = 1, full_rows: bool = False):
        """Row and column block sizes: cache-sized tiles within the memory budget.

        A tile of bn x bm entries needs ``3 bn bm + kernel.extra_memory(bn, bm)`` elements (the
        tile, the product's scratch and the kernel's temporaries); tiles shrink until that fits.
        """
        n1, n2 = self.shape
        item = self.X1.element_size()
        budget = self._budget()
        budget_elems = max(budget // (3 * item), 4096)
        target = min(self.options.tile_size(item), budget_elems)
        bm = n2 if full_rows else min(n2, 4096)
        bn = max(1, min(n1, target // max(bm, 1)))

        def need(rows):
            return (3 * rows * bm + self.kernel.extra_memory(rows, bm)) * item

        while bn > 1 and need(bn) > budget and bn * bm > 4096:
            bn = max(1, bn // 2)
        if full_rows and (bn * bm > budget_elems or need(bn) > max(budget, 3 * 4096 * item)):
            raise MemoryError(
                f"One row of K ({n2} columns) does not fit in the memory budget of "
                f"{budget} bytes."
            )
        return bn, bm

    def _tile(self, i0, i1, j0, j1) -> torch.Tensor:
        return self.kernel._block(self._P1[i0:i1], self._P2[j0:j1])

    # ---- products -----------------------------------------------------------------------------
    def _tiled(self, V: torch.Tensor, transpose: bool) -> torch.Tensor:
        """K @ V (or K.T @ V) tile by tile: each tile is computed and used while in cache."""
        n1, n2 = self.shape
        acc = self._acc_dtype(V)
        Vc = V.to(acc)
        out = torch.zeros(n2 if transpose else n1, V.shape[1], dtype=acc, device=self.device)
        bn, bm = self._tiles(V.shape[1])
        for i0 in range(0, n1, bn):
            i1 = min(i0 + bn, n1)
            for j0 in range(0, n2, bm):
                j1 = min(j0 + bm, n2)
                T = self._tile(i0, i1, j0, j1).to(acc)
                if transpose:
                    out[j0:j1] += torch.mm(T.T, Vc[i0:i1])
                else:
                    out[i0:i1] += torch.mm(T, Vc[j0:j1])
        return out

    def _matmul(self, V: torch.Tensor) -> torch.Tensor:
        return self._tiled(V, transpose=False)

    def _t_matmul(self, V: torch.Tensor) -> torch.Tensor:
        return self._tiled(V, transpose=True)

    def _kt_k_matmul(self, V, W, row_weights):
        """One pass over row blocks: each row block of K is computed once for both products.

        Cost O(n1 n2 (d + 2t)).
        """
        n1, n2 = self.shape
        acc = self._acc_dtype(V)
        Vc = V.to(self.dtype)
        out = torch.zeros(n2, V.shape[1], dtype=acc, device=self.device)
        bn, _ = self._tiles(V.shape[1], full_rows=True)
        if (self.dtype == torch.float32 and acc == torch.float64
                and not self.options.products_float64):
            # both products on the float32 tile (no up-cast of the tile); each tile's sum over
            # its rows (a few thousand) is added to the float64 output
            for i0 in range(0, n1, bn):
                i1 = min(i0 + bn, n1)
                T = self._tile(i0, i1, 0, n2)
                U = torch.mm(T, Vc)
                if W is not None:
                    U += W[i0:i1].to(self.dtype)
                if row_weights is not None:
                    U *= row_weights[i0:i1].to(self.dtype).reshape(-1, 1)
                out += torch.mm(T.T, U).to(acc)
            return out
        Vc = V.to(acc)
        # products_float64: each float32 tile up-cast into one reused buffer
        buf = (torch.empty(min(bn, n1), n2, dtype=acc, device=self.device)
               if self.dtype != acc and self.options.products_float64 else None)
        for i0 in range(0, n1, bn):
            i1 = min(i0 + bn, n1)
            T = self._tile(i0, i1, 0, n2)
            T = T.to(acc) if buf is None else buf[:i1 - i0].copy_(T)
            U = torch.mm(T, Vc)
            if W is not None:
                U += W[i0:i1].to(acc)
            if row_weights is not None:
                U *= row_weights[i0:i1].to(acc).reshape(-1, 1)
            out += torch.mm(T.T, U)
        return out

    # ---- blocks -------------------------------------------------------------------------------
    def _diagonal(self) -> torch.Tensor:
        if self.symmetric:
            return self.kernel.diag(self.X1)
        return super()._diagonal()

    def _block(self, rows, cols) -> torch.Tensor:
        n1, n2 = self.shape
        P1 = self._P1 if rows.shape[0] == n1 and _is_arange(rows) else self._P1[rows]
        P2 = self._P2 if cols.shape[0] == n2 and _is_arange(cols) else self._P2[cols]
        return self.kernel._block(P1, P2)

    def _subset(self, rows, cols):
        X1 = self.X1 if rows is None else self.X1[rows]
        if self.symmetric and (rows is cols or (rows is not None and cols is not None
                                                 and torch.equal(rows, cols))):
            return KernelOperator(self.kernel, X1, options=self.options)
        X2 = self.X2 if cols is None else self.X2[cols]
        return KernelOperator(self.kernel, X1, X2, options=self.options)

    def to_dense(self) -> torch.Tensor:
        """The full matrix; raises ``MemoryError`` if it exceeds the memory budget.

        Factorising it needs about as much again (the factor); callers that factorise check
        ``fits_in_memory(copies=2)``. Symmetric up to rounding in the GEMM; factorisations read
        one triangle only.
        """
        return super().to_dense()

    def __repr__(self):
        return f"KernelOperator({self.kernel!r}, shape={self.shape}, dtype={self.dtype})"


def _is_arange(idx: torch.Tensor) -> bool:
    n = idx.shape[0]
    return n == 0 or (int(idx[0]) == 0 and int(idx[-1]) == n - 1
                      and bool((idx[1:] > idx[:-1]).all()))


class DenseOperator(LinearOperator):
    """A stored matrix as an operator; also the precomputed kernel matrix.

    Parameters
    ----------
    K : tensor of shape (n1, n2)
    options : Options, optional
        With ``accumulate_float64`` the products are computed in K's dtype and summed in
        float64 over chunks of 1024 rows (a float32 sum over tens of thousands of rows loses
        the digits that a small ridge penalty needs).
    symmetric : bool, default=False
        Declare K symmetric: ``t_matmul`` is then ``matmul`` and columns are read as rows.
    cache_columns : bool, default=False
        Keep a contiguous copy of K.T so that ``columns``/``column`` read contiguous memory
        (coordinate descent reads one column per step); made on first use.

    Examples
    --------
    >>> import torch
    >>> K = DenseOperator(torch.eye(3, dtype=torch.float64))
    >>> K.column(1)
    tensor([0., 1., 0.], dtype=torch.float64)
    """

    _CHUNK = 1024
    _F64_VALUES = 2**18  # values up-cast at a time with ``products_float64``

    def __init__(self, K: torch.Tensor, *, options: Options | None = None,
                 symmetric: bool = False, cache_columns: bool = False):
        if not isinstance(K, torch.Tensor):
            raise TypeError(f"K must be a torch.Tensor, got {type(K).__name__}.")
        if K.ndim != 2:
            raise ValueError(f"K must be a 2-D matrix, found shape {tuple(K.shape)}.")
        if not K.is_floating_point():
            raise TypeError(f"K must have a floating dtype, got {K.dtype}.")
        self.options = options or Options()
        if self.options.device is not None:
            K = K.to(self.options.device)
        self.K = K
        if symmetric and K.shape[0] != K.shape[1]:
            raise ValueError(f"a symmetric K must be square, found shape {tuple(K.shape)}.")
        self._symmetric = bool(symmetric)
        self.cache_columns = cache_columns
        self._KT = None

    shape = property(lambda self: tuple(self.K.shape))
    dtype = property(lambda self: self.K.dtype)
    device = property(lambda self: self.K.device)

    @property
    def symmetric(self) -> bool:
        return self._symmetric

    def _f64_products(self) -> bool:
        return self.options.products_float64 and self.dtype != torch.float64

    def _f64_chunks(self):
        """(start, rows up-cast to float64) over K, 2**18 values at a time, in one reused
        buffer (a fresh float64 copy per chunk made the product 2-9x slower than the float32
        one, against 1.2-1.3x)."""
        n1, n2 = self.shape
        rows = min(n1, max(1, self._F64_VALUES // max(n2, 1)))
        buf = torch.empty(rows, n2, dtype=torch.float64, device=self.device)
        for r0 in range(0, n1, rows):
            K = buf[:min(rows, n1 - r0)]
            K.copy_(self.K[r0:r0 + rows])
            yield r0, K

    def _matmul(self, V):
        if self._f64_products():
            Vc = V.to(torch.float64)
            out = torch.empty(self.shape[0], V.shape[1], dtype=torch.float64, device=self.device)
            for r0, K in self._f64_chunks():
                torch.mm(K, Vc, out=out[r0:r0 + K.shape[0]])
            return out
        if self.options.accumulate_float64:
            return (self.K @ V.to(self.dtype)).to(torch.float64)
        acc = self._acc_dtype(V)
        return self.K.to(acc) @ V.to(acc)

    def _kt_k_matmul(self, V, W, row_weights):
        if not self._f64_products():
            return super()._kt_k_matmul(V, W, row_weights)
        # one read of each chunk of rows for both products
        Vc = V.to(torch.float64)
        out = torch.zeros(self.shape[1], V.shape[1], dtype=torch.float64, device=self.device)
        for r0, K in self._f64_chunks():
            U = K @ Vc
            r1 = r0 + K.shape[0]
            if W is not None:
                U += W[r0:r1].to(torch.float64)
            if row_weights is not None:
                U *= row_weights[r0:r1].to(torch.float64).reshape(-1, 1)
            out.addmm_(K.T, U)
        return out

    def _t_matmul(self, V):
        if self._f64_products():
            Vc = V.to(torch.float64)
            out = torch.zeros(self.shape[1], V.shape[1], dtype=torch.float64, device=self.device)
            for r0, K in self._f64_chunks():
                out.addmm_(K.T, Vc[r0:r0 + K.shape[0]])
            return out
        if self.options.accumulate_float64:
            out = torch.zeros(self.shape[1], V.shape[1], dtype=torch.float64, device=self.device)
            Vc = V.to(self.dtype)
            for s in range(0, self.shape[0], self._CHUNK):
                out += (self.K[s:s + self._CHUNK].T @ Vc[s:s + self._CHUNK]).to(torch.float64)
            return out
        acc = self._acc_dtype(V)
        return self.K.to(acc).T @ V.to(acc)

    def _diagonal(self):
        return self.K.diagonal().clone()

    def _columns_t(self):
        if self._symmetric:
            return self.K
        if self._KT is None:  # transpose once so that columns are contiguous rows
            self._KT = self.K.T.contiguous()
        return self._KT

    def _block(self, rows, cols):
        n1, n2 = self.shape
        full_r = rows.shape[0] == n1 and _is_arange(rows)
        full_c = cols.shape[0] == n2 and _is_arange(cols)
        if full_r and full_c:
            return self.K
        if full_r and (self.cache_columns or self._symmetric):
            return self._columns_t()[cols].T
        if full_r:
            return self.K[:, cols]
        if full_c:
            return self.K[rows]
        return self.K[rows][:, cols]

    def columns_t(self, idx) -> torch.Tensor:
        """K[:, idx].T of shape (len(idx), n1), gathered from contiguous rows."""
        return self._columns_t()[_index(idx, self.shape[1], self.device, "idx")]

    def column(self, j: int) -> torch.Tensor:
        """Column K[:, j] of shape (n1,), contiguous when ``cache_columns`` or symmetric."""
        if not (self.cache_columns or self._symmetric):
            return super().column(j)
        j = int(_index([int(j)], self.shape[1], self.device, "j")[0])
        return self._columns_t()[j]

    def _subset(self, rows, cols):
        K = self.K if rows is None else self.K[rows]
        K = K if cols is None else K[:, cols]
        same = rows is cols or (rows is not None and cols is not None and torch.equal(rows, cols))
        return DenseOperator(K, options=self.options, symmetric=self._symmetric and same)

    def to_dense(self) -> torch.Tensor:
        """The stored matrix itself (not a copy)."""
        return self.K


class ScaledOperator(LinearOperator):
    """D1 K D2 for diagonal D1 = diag(left) and D2 = diag(right) (either may be None).

    The operator of weighted problems (``left = right = sample_weight ** 0.5``) and of masks
    (0/1 scales).

    Examples
    --------
    >>> import torch
    >>> K = ScaledOperator(torch.ones(2, 2), left=torch.tensor([1.0, 2.0]))
    >>> K.to_dense()
    tensor([[1., 1.],
            [2., 2.]])
    """

    def __init__(self, base, left: torch.Tensor | None = None,
                 right: torch.Tensor | None = None):
        self.base = as_operator(base)
        self.options = self.base.options
        n1, n2 = self.base.shape
        self.left = self._scale(left, n1, "left")
        self.right = self._scale(right, n2, "right")

    def _scale(self, s, n, name):
        if s is None:
            return None
        s = torch.as_tensor(s, device=self.base.device)
        if s.ndim != 1 or s.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},), found {tuple(s.shape)}.")
        if not bool(torch.isfinite(s.double()).all()):
            raise ValueError(f"{name} must be finite.")
        return s.to(self.base.dtype)

    shape = property(lambda self: self.base.shape)
    dtype = property(lambda self: self.base.dtype)
    device = property(lambda self: self.base.device)

    @property
    def symmetric(self) -> bool:
        same = (self.left is None and self.right is None) or (
            self.left is not None and self.right is not None
            and bool(torch.equal(self.left, self.right)))
        return self.base.symmetric and same

    @staticmethod
    def _mul(V, s):
        return V if s is None else V * s.to(V.dtype).reshape(-1, 1)

    def _matmul(self, V):
        return self._mul(self.base._matmul(self._mul(V, self.right)), self.left)

    def _t_matmul(self, V):
        return self._mul(self.base._t_matmul(self._mul(V, self.left)), self.right)

    def _block(self, rows, cols):
        B = self.base._block(rows, cols)
        if self.left is not None:
            B = B * self.left[rows].reshape(-1, 1)
        if self.right is not None:
            B = B * self.right[cols].reshape(1, -1)
        return B

    def _diagonal(self):
        d = self.base._diagonal()
        n = d.shape[0]
        if self.left is not None:
            d = d * self.left[:n]
        if self.right is not None:
            d = d * self.right[:n]
        return d


class SubsetOperator(LinearOperator):
    """The view ``K[rows][:, cols]`` of an operator (``None`` keeps every row / column).

    Products scatter the right-hand side into the base's columns and gather the rows, so a
    lazy base stays lazy; for the training block of a fold, ``SubsetOperator(K, train, train)``.

    Examples
    --------
    >>> import torch
    >>> K = SubsetOperator(torch.arange(9.0).reshape(3, 3), rows=[0, 2], cols=[1])
    >>> K.to_dense()
    tensor([[1.],
            [7.]])
    """

    def __init__(self, base, rows=None, cols=None):
        self.base = as_operator(base)
        self.options = self.base.options
        n1, n2 = self.base.shape
        dev = self.base.device
        self.row_idx = None if rows is None else _index(rows, n1, dev, "rows")
        self.col_idx = None if cols is None else _index(cols, n2, dev, "cols")

    @property
    def shape(self):
        n1, n2 = self.base.shape
        return (n1 if self.row_idx is None else self.row_idx.shape[0],
                n2 if self.col_idx is None else self.col_idx.shape[0])

    dtype = property(lambda self: self.base.dtype)
    device = property(lambda self: self.base.device)

    @property
    def symmetric(self) -> bool:
        same = (self.row_idx is None and self.col_idx is None) or (
            self.row_idx is not None and self.col_idx is not None
            and bool(torch.equal(self.row_idx, self.col_idx)))
        return self.base.symmetric and same

    def _scatter(self, V, idx, n):
        if idx is None:
            return V
        out = torch.zeros(n, V.shape[1], dtype=V.dtype, device=V.device)
        return out.index_add_(0, idx, V)  # repeated positions add up

    def _matmul(self, V):
        out = self.base._matmul(self._scatter(V, self.col_idx, self.base.shape[1]))
        return out if self.row_idx is None else out[self.row_idx]

    def _t_matmul(self, V):
        out = self.base._t_matmul(self._scatter(V, self.row_idx, self.base.shape[0]))
        return out if self.col_idx is None else out[self.col_idx]

    def _block(self, rows, cols):
        r = rows if self.row_idx is None else self.row_idx[rows]
        c = cols if self.col_idx is None else self.col_idx[cols]
        return self.base._block(r, c)

    def _diagonal(self):
        n = min(self.shape)
        if self.row_idx is None and self.col_idx is None:
            return self.base._diagonal()
        if self.row_idx is not None and self.col_idx is not None and bool(
                torch.equal(self.row_idx[:n], self.col_idx[:n])) and self.base.symmetric:
            d = self.base._diagonal()
            return d[self.row_idx[:n]]
        return super()._diagonal()


class FeatureOperator(LinearOperator):
    """Phi1 Phi2^T from explicit features (random features, Taylor features, Nyström maps).

    Products cost O((n1 + n2) D t) for D features instead of O(n1 n2 t).

    Parameters
    ----------
    Phi1 : tensor of shape (n1, D)
    Phi2 : tensor of shape (n2, D), optional
        ``None`` means the symmetric Phi1 Phi1^T.
    options : Options, optional

    Examples
    --------
    >>> import torch
    >>> Phi = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    >>> FeatureOperator(Phi).to_dense()
    tensor([[1., 1.],
            [1., 2.]])
    """

    def __init__(self, Phi1: torch.Tensor, Phi2: torch.Tensor | None = None, *,
                 options: Options | None = None):
        for name, P in (("Phi1", Phi1), ("Phi2", Phi2)):
            if P is not None and not isinstance(P, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(P).__name__}.")
        self._symmetric = Phi2 is None
        Phi2 = Phi1 if Phi2 is None else Phi2
        if Phi1.ndim != 2 or Phi2.ndim != 2 or Phi1.shape[1] != Phi2.shape[1]:
            raise ValueError(
                f"Phi1 and Phi2 must be 2-D with the same number of features, got "
                f"{tuple(Phi1.shape)} and {tuple(Phi2.shape)}.")
        if Phi1.dtype != Phi2.dtype:
            raise TypeError(f"Phi1 and Phi2 must share a dtype, got {Phi1.dtype} and "
                            f"{Phi2.dtype}.")
        self.options = options or Options()
        self.Phi1, self.Phi2 = Phi1, Phi2

    shape = property(lambda self: (self.Phi1.shape[0], self.Phi2.shape[0]))
    dtype = property(lambda self: self.Phi1.dtype)
    device = property(lambda self: self.Phi1.device)

    @property
    def symmetric(self) -> bool:
        return self._symmetric

    def _matmul(self, V):
        acc = self._acc_dtype(V)
        return self.Phi1.to(acc) @ (self.Phi2.to(acc).T @ V.to(acc))

    def _t_matmul(self, V):
        acc = self._acc_dtype(V)
        return self.Phi2.to(acc) @ (self.Phi1.to(acc).T @ V.to(acc))

    def _block(self, rows, cols):
        return self.Phi1[rows] @ self.Phi2[cols].T

    def _diagonal(self):
        n = min(self.shape)
        return (self.Phi1[:n] * self.Phi2[:n]).sum(1)

    def _subset(self, rows, cols):
        P1 = self.Phi1 if rows is None else self.Phi1[rows]
        if self._symmetric and (rows is cols or (rows is not None and cols is not None
                                                 and torch.equal(rows, cols))):
            return FeatureOperator(P1, options=self.options)
        P2 = self.Phi2 if cols is None else self.Phi2[cols]
        return FeatureOperator(P1, P2, options=self.options)


class BatchedMaskedOperator:
    """B masked problems sharing one square operator: row b of the product is
    ``m_b * (K (m_b * a_b))`` for 0/1 masks m_b (the training rows of fold b).

    The batch layout of path cross-validation: coefficients of problem b live on all n rows with
    zeros outside its mask, and the product never moves the masked-out coordinates.

    Parameters
    ----------
    base : LinearOperator or tensor of shape (n, n)
    masks : tensor of shape (B, n)

    Examples
    --------
    >>> import torch
    >>> op = BatchedMaskedOperator(torch.ones(3, 3), torch.tensor([[1.0, 1.0, 0.0]]))
    >>> op.batch_matmul(torch.ones(1, 3))
    tensor([[2., 2., 0.]])
    """

    def __init__(self, base, masks: torch.Tensor):
        self.base = as_operator(base)
        n1, n2 = self.base.shape
        if n1 != n2:
            raise ValueError(f"the operator must be square, found shape {(n1, n2)}.")
        masks = torch.as_tensor(masks, device=self.base.device)
        if masks.ndim != 2 or masks.shape[1] != n1:
            raise ValueError(f"masks must have shape (B, {n1}), found {tuple(masks.shape)}.")
        self.masks = masks.to(self.base.dtype)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.masks.shape[0], *self.base.shape)

    def batch_matmul(self, A: torch.Tensor) -> torch.Tensor:
        """Row b: m_b * (K (m_b * A[b])); A of shape (B, n), returns (B, n)."""
        if not isinstance(A, torch.Tensor):
            raise TypeError(f"A must be a torch.Tensor, got {type(A).__name__}.")
        if tuple(A.shape) != tuple(self.masks.shape):
            raise ValueError(f"A must have shape {tuple(self.masks.shape)}, found "
                             f"{tuple(A.shape)}.")
        M = self.masks.to(A.dtype)
        return self.base.rmatmul(A * M) * M

    def operator(self, b: int) -> ScaledOperator:
        """Problem b as an n x n operator diag(m_b) K diag(m_b)."""
        return ScaledOperator(self.base, self.masks[b], self.masks[b])


def as_operator(K, *, options: Options | None = None) -> LinearOperator:
    """An operator for ``K``: operators are returned unchanged, a 2-D tensor (or array) becomes
    a :class:`DenseOperator`.

    Examples
    --------
    >>> import torch
    >>> op = as_operator(torch.eye(2))
    >>> type(op).__name__, as_operator(op) is op
    ('DenseOperator', True)
    """
    if isinstance(K, LinearOperator):
        return K
    if isinstance(K, torch.Tensor):
        return DenseOperator(K, options=options)
    if isinstance(K, np.ndarray):
        return DenseOperator(torch.from_numpy(np.ascontiguousarray(K)), options=options)
    raise TypeError(f"cannot make an operator from {type(K).__name__}; expected a torch.Tensor, "
                    "a NumPy array or a LinearOperator.")
