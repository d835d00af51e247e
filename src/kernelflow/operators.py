"""The kernel engine: a lazily evaluated kernel matrix K(X1, X2).

Every solver multiplies by kernel matrices through :class:`KernelOperator`. The operator owns
tiling, memory budgets, dtypes and devices; the kernel (see :mod:`kernelflow.kernels`) only says
how to compute one block.

A product ``K @ V`` visits the matrix tile by tile: each tile is computed (one GEMM on prepared
inputs plus an elementwise kernel map, in place) and immediately multiplied into the output, so
the n1 x n2 matrix never exists. Tiles are sized to stay in cache and never exceed the memory
budget.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import torch

from .kernels import Kernel, _common_shift

__all__ = ["Options", "KernelOperator", "available_memory", "memory_budget"]

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
    tile_bytes : int, default=2**23
        Target size of one kernel tile in bytes (8 MiB: 2**21 entries in float32, 2**20 in
        float64). Each tile is written by a GEMM, exponentiated in place and read by the
        product with the right-hand side while it is still in cache; 8 MiB was the fastest
        size for both dtypes on the reference machine (``docs/performance/foundation.md``).
    tile_elements : int, optional
        Number of kernel entries per tile; overrides ``tile_bytes`` when given.
    accumulate_float64 : bool, default=False
        Compute tiles in the input dtype but accumulate products in float64.
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
    tile_bytes: int = 2**23
    tile_elements: int | None = None
    accumulate_float64: bool = False
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
    under its address-space limit (``RLIMIT_AS``/``RLIMIT_DATA`` minus the current size).

    Examples
    --------
    >>> available_memory() > 0
    True
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    limits = [_host_available(), _cgroup_available(), _rlimit_available()]
    return int(min(v for v in limits if v is not None))


def memory_budget(options: Options | None = None, device=None) -> int:
    """Bytes one engine call may use: ``options.memory_budget`` or a fraction of what is free
    (see :func:`available_memory`: host, cgroup and address-space limits)."""
    options = options or Options()
    if options.memory_budget is not None:
        return int(options.memory_budget)
    return int(options.memory_fraction * available_memory(device))


class KernelOperator:
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
    4096 the column dimension is split as well.

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
        X1 = X1 if device is None else X1.to(device)
        self.symmetric = X2 is None
        X2 = X1 if X2 is None else (X2 if device is None else X2.to(device))
        if X1.ndim != 2 or X2.ndim != 2 or X1.shape[1] != X2.shape[1]:
            raise ValueError(
                f"X1 and X2 must be 2-D with the same number of columns, got {tuple(X1.shape)} "
                f"and {tuple(X2.shape)}."
            )
        if X1.dtype != X2.dtype:
            raise TypeError(f"X1 and X2 must share a dtype, got {X1.dtype} and {X2.dtype}.")
        self.X1, self.X2 = X1, X2
        shift = _common_shift(X1, X2) if kernel.is_stationary else None
        self._P1 = kernel._prepare(X1 if shift is None else X1 - shift, 0)
        self._P2 = kernel._prepare(X2 if shift is None else X2 - shift, 1)

    # ---- basic properties ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return (self.X1.shape[0], self.X2.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.X1.dtype

    @property
    def device(self) -> torch.device:
        return self.X1.device

    def _budget(self) -> int:
        return memory_budget(self.options, self.device)

    def _acc_dtype(self, V: torch.Tensor) -> torch.dtype:
        if self.options.accumulate_float64:
            return torch.float64
        return torch.promote_types(self.dtype, V.dtype)

    def fits_in_memory(self, copies: int = 1) -> bool:
        """Whether ``copies`` dense n1 x n2 matrices fit in the memory budget."""
        n1, n2 = self.shape
        return copies * n1 * n2 * self.X1.element_size() <= self._budget()

    def _tiles(self, n_cols_rhs: int = 1, full_rows: bool = False):
        """Row and column block sizes: cache-sized tiles within the memory budget."""
        n1, n2 = self.shape
        item = self.X1.element_size()
        budget_elems = max(self._budget() // (3 * item), 4096)  # tile + kernel scratch
        target = min(self.options.tile_size(item), budget_elems)
        bm = n2 if full_rows else min(n2, 4096)
        bn = max(1, min(n1, target // max(bm, 1)))
        if full_rows and bn * bm > budget_elems:
            raise MemoryError(
                f"One row of K ({n2} columns) does not fit in the memory budget of "
                f"{self._budget()} bytes."
            )
        return bn, bm

    def _tile(self, i0, i1, j0, j1) -> torch.Tensor:
        return self.kernel._block(self._P1[i0:i1], self._P2[j0:j1])

    # ---- products -----------------------------------------------------------------------------
    def _check_rhs(self, V: torch.Tensor, n: int, name: str):
        if not isinstance(V, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(V).__name__}.")
        if V.shape[0] != n or V.ndim > 2:
            raise ValueError(f"{name} must have shape ({n},) or ({n}, t), found {tuple(V.shape)}.")
        squeeze = V.ndim == 1
        V = V.reshape(n, -1)
        if V.device != self.device:
            V = V.to(self.device)
        return V, squeeze

    def matmul(self, V: torch.Tensor) -> torch.Tensor:
        """K @ V for V of shape (n2,) or (n2, t); returns (n1,) or (n1, t)."""
        n1, n2 = self.shape
        V, squeeze = self._check_rhs(V, n2, "V")
        acc = self._acc_dtype(V)
        Vc = V.to(self.dtype)
        Vc = V.to(acc) if acc != self.dtype else Vc
        out = torch.zeros(n1, V.shape[1], dtype=acc, device=self.device)
        bn, bm = self._tiles(V.shape[1])
        for i0 in range(0, n1, bn):
            i1 = min(i0 + bn, n1)
            for j0 in range(0, n2, bm):
                j1 = min(j0 + bm, n2)
                out[i0:i1] += torch.mm(self._tile(i0, i1, j0, j1).to(acc), Vc[j0:j1])
        return out[:, 0] if squeeze else out

    __matmul__ = matmul

    def t_matmul(self, V: torch.Tensor) -> torch.Tensor:
        """K.T @ V for V of shape (n1,) or (n1, t); returns (n2,) or (n2, t)."""
        if self.symmetric:
            return self.matmul(V)
        n1, n2 = self.shape
        V, squeeze = self._check_rhs(V, n1, "V")
        acc = self._acc_dtype(V)
        Vc = V.to(self.dtype)
        Vc = V.to(acc) if acc != self.dtype else Vc
        out = torch.zeros(n2, V.shape[1], dtype=acc, device=self.device)
        bn, bm = self._tiles(V.shape[1])
        for i0 in range(0, n1, bn):
            i1 = min(i0 + bn, n1)
            for j0 in range(0, n2, bm):
                j1 = min(j0 + bm, n2)
                out[j0:j1] += torch.mm(self._tile(i0, i1, j0, j1).to(acc).T, Vc[i0:i1])
        return out[:, 0] if squeeze else out

    def kt_k_matmul(self, V: torch.Tensor, W: torch.Tensor | None = None,
                    row_weights: torch.Tensor | None = None) -> torch.Tensor:
        """K.T @ (D (K @ V + W)) in one pass over row blocks (the Nyström normal-equation product).

        ``D`` is ``diag(row_weights)`` (identity when None). V has shape (n2, t), W (n1, t).
        Cost O(n1 n2 (d + 2t)); each row block of K is computed once.
        """
        n1, n2 = self.shape
        V, squeeze = self._check_rhs(V, n2, "V")
        if W is not None:
            W, _ = self._check_rhs(W, n1, "W")
        acc = self._acc_dtype(V)
        Vc = V.to(self.dtype)
        out = torch.zeros(n2, V.shape[1], dtype=acc, device=self.device)
        bn, _ = self._tiles(V.shape[1], full_rows=True)
        if self.dtype == torch.float32 and acc == torch.float64:
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
            return out[:, 0] if squeeze else out
        Vc = V.to(acc) if acc != self.dtype else Vc
        for i0 in range(0, n1, bn):
            i1 = min(i0 + bn, n1)
            T = self._tile(i0, i1, 0, n2).to(acc)
            U = torch.mm(T, Vc)
            if W is not None:
                U += W[i0:i1].to(acc)
            if row_weights is not None:
                U *= row_weights[i0:i1].to(acc).reshape(-1, 1)
            out += torch.mm(T.T, U)
        return out[:, 0] if squeeze else out

    # ---- blocks -------------------------------------------------------------------------------
    def diagonal(self) -> torch.Tensor:
        """Diagonal k(x1_i, x2_i), i < min(n1, n2)."""
        if self.symmetric:
            return self.kernel.diag(self.X1)
        n = min(self.shape)
        out = torch.empty(n, dtype=self.dtype, device=self.device)
        for i0 in range(0, n, 256):  # small square blocks: their diagonals are the pairs
            i1 = min(i0 + 256, n)
            out[i0:i1] = self.kernel._block(self._P1[i0:i1], self._P2[i0:i1]).diagonal()
        return out

    def rows(self, idx) -> torch.Tensor:
        """Dense rows K[idx, :] of shape (len(idx), n2)."""
        idx = torch.as_tensor(idx, device=self.device).reshape(-1)
        return self.kernel._block(self._P1[idx], self._P2)

    def columns(self, idx) -> torch.Tensor:
        """Dense columns K[:, idx] of shape (n1, len(idx))."""
        idx = torch.as_tensor(idx, device=self.device).reshape(-1)
        return self.kernel._block(self._P1, self._P2[idx])

    def block(self, rows, cols) -> torch.Tensor:
        """Dense sub-matrix ``K[rows][:, cols]``."""
        r = torch.as_tensor(rows, device=self.device).reshape(-1)
        c = torch.as_tensor(cols, device=self.device).reshape(-1)
        return self.kernel._block(self._P1[r], self._P2[c])

    def to_dense(self) -> torch.Tensor:
        """The full matrix; raises ``MemoryError`` if it exceeds the memory budget.

        Factorising it needs about as much again (the factor); callers that factorise check
        ``fits_in_memory(copies=2)``.
        """
        if not self.fits_in_memory(copies=1):
            n1, n2 = self.shape
            raise MemoryError(
                f"K of shape ({n1}, {n2}) needs {n1 * n2 * self.X1.element_size()} bytes, above "
                f"the memory budget of {self._budget()} bytes; use products instead."
            )
        # Symmetric up to rounding in the GEMM; factorisations read one triangle only.
        return self.kernel._block(self._P1, self._P2)

    def __repr__(self):
        return f"KernelOperator({self.kernel!r}, shape={self.shape}, dtype={self.dtype})"
