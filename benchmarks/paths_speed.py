"""Speed of the path solvers against the naive O(n^2)-per-step updates, measured in the same run.

Baseline ("naive"): the update rules as written in the paper, recomputing the residual
r = y - K alpha with a full product every step (and K_val alpha for validation monitoring), as the
reference implementation does. Ours:

* coordinate descent: residual updated with one kernel column per step, O(n);
* sign descent: K sign(r) updated with the rows of K whose residual sign flipped;
* both run in the compiled loop (``kernelflow.solvers._native``) when it is built; the column
  "tensor loop" times the same updates written as torch operations (the fallback), to show
  what the compiled loop adds, most of all at the papers' small n;
* gradient descent: one eigendecomposition, then every iterate's validation predictions from
  blocked products (closed form alpha_k = U diag((1 - (1 - eta s)^k) / s) U^T y);
* coordinate descent matrix-free (K not stored): one kernel column computed per step vs a
  tiled full product per step.

Usage::

    python benchmarks/paths_speed.py            # full sizes
    python benchmarks/paths_speed.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import time
from functools import partial

import torch

from kernelflow.kernels import Gaussian
from kernelflow.operators import KernelOperator, Options
from kernelflow.solvers import _native
from kernelflow.solvers.early_stopping import early_stopped_path
from kernelflow.solvers.paths import (
    coordinate_descent_path,
    coordinate_step,
    gradient_descent_path,
    gradient_step,
    largest_eigenvalue,
    sign_gradient_path,
    sign_step,
)


def _data(n, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(X.sum(1)) + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y - y.mean()


def _time(fn, repeat=1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


@contextlib.contextmanager
def tensor_loop():
    """Run the path solvers without the compiled extension."""
    saved = _native.available
    _native.available = lambda *args, **kwargs: False
    try:
        yield
    finally:
        _native.available = saved


def naive_loop(step, K, y, eta, steps):
    alpha = torch.zeros_like(y)
    for _ in range(steps):
        alpha = step(alpha, y - K @ alpha, eta)
    return alpha


def naive_gd_validation(K, Kv, y, yv, eta, steps):
    alpha = torch.zeros_like(y)
    losses = [float(((Kv @ alpha - yv) ** 2).mean())]
    for _ in range(steps):
        alpha = alpha + eta * (y - K @ alpha)
        losses.append(float(((Kv @ alpha - yv) ** 2).mean()))
    return torch.tensor(losses, dtype=torch.float64)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1, as the paper's one-core timings)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [500, 2000] if args.quick else [1000, 4000]
    steps = 300 if args.quick else 2000
    rows = []

    for n in [80] + sizes:  # 80: one training fold of the papers' 100-row protocol
        X, y = _data(n)
        K = Gaussian(1.0)(X)
        eta, k = 0.01, (10_000 if n == 80 else steps)
        t_naive, a_naive = _time(partial(naive_loop, coordinate_step, K, y, eta, k))
        run = partial(coordinate_descent_path, K, y, learning_rate=eta, max_iter=k)
        t_fast, res = _time(run)
        with tensor_loop():
            t_tensor, res_t = _time(run)
        assert torch.allclose(res.alpha, a_naive, atol=1e-10)
        assert torch.allclose(res_t.alpha, a_naive, atol=1e-10)
        rows.append(("coordinate descent (dense K)", n, k, t_naive, t_tensor, t_fast))

        eta_s = 0.01 if n == 80 else 1e-4
        t_naive, a_naive = _time(partial(naive_loop, sign_step, K, y, eta_s, k))
        run = partial(sign_gradient_path, K, y, learning_rate=eta_s, max_iter=k)
        t_fast, res = _time(run)
        with tensor_loop():
            t_tensor, res_t = _time(run)
        assert torch.allclose(res.alpha, a_naive, atol=1e-10)
        assert torch.allclose(res_t.alpha, a_naive, atol=1e-10)
        rows.append(("sign descent (dense K)", n, k, t_naive, t_tensor, t_fast))

    # Gradient descent with validation monitoring: the whole validation curve.
    for n in ([100, 500] if args.quick else [100, 1000]):
        X, y = _data(n + n // 9)
        K, Kv = Gaussian(1.0)(X[:n]), Gaussian(1.0)(X[n:], X[:n])
        yt, yv = y[:n], y[n:]
        gd_steps = 2000 if args.quick else 10000
        eta = 1.0 / largest_eigenvalue(K)
        t_naive, curve = _time(partial(naive_gd_validation, K, Kv, yt, yv, eta, gd_steps))
        t_fast, es = _time(partial(
            early_stopped_path, gradient_descent_path, K, yt, Kv, yv, n_iter_no_change=10**9,
            learning_rate=eta, max_iter=gd_steps, method="spectral"))
        assert torch.allclose(es.validation_losses, curve, rtol=1e-6, atol=1e-10)
        rows.append(("GD validation curve (spectral)", n, gd_steps, t_naive, None, t_fast))
        # Refit after k steps: closed form vs k products.
        t_naive, a_naive = _time(partial(naive_loop, gradient_step, K, yt, eta, gd_steps))
        t_fast, res = _time(partial(gradient_descent_path, K, yt, learning_rate=eta,
                                    max_iter=gd_steps, method="spectral"))
        assert torch.allclose(res.alpha, a_naive, rtol=1e-6, atol=1e-8)
        rows.append(("GD refit after k steps (spectral)", n, gd_steps, t_naive, None, t_fast))

    # Matrix-free coordinate descent: per-step cost with K never stored.
    n_free = 20_000 if args.quick else 100_000
    X, y = _data(n_free, d=2)
    op = KernelOperator(Gaussian(0.5), X, options=Options(memory_budget=2**28))
    naive_steps, fast_steps = 3, (200 if args.quick else 1000)
    t_naive, _ = _time(partial(naive_loop, coordinate_step, op, y, 0.01, naive_steps))
    t_fast, res = _time(partial(coordinate_descent_path, op, y, learning_rate=0.01,
                                max_iter=fast_steps))
    rows.append(("coordinate descent (matrix-free)", n_free, fast_steps,
                 t_naive / naive_steps * fast_steps, None, t_fast))

    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, float64, CPU, "
          f"compiled loops {'on' if _native.available() else 'OFF (not built)'}")
    print(f"{'method':36s} {'n':>7s} {'steps':>6s} {'naive [s]':>10s} {'tensor loop [s]':>15s} "
          f"{'ours [s]':>9s} {'vs naive':>9s} {'vs tensor loop':>14s}")
    for name, n, k, tn, tt, tf in rows:
        tensor = f"{tt:15.3f}" if tt is not None else f"{'-':>15s}"
        gain = f"{tt / tf:13.1f}x" if tt is not None else f"{'-':>14s}"
        print(f"{name:36s} {n:7d} {k:6d} {tn:10.3f} {tensor} {tf:9.3f} {tn / tf:8.1f}x {gain}")
    print("matrix-free naive time extrapolated from", naive_steps, "full products")


if __name__ == "__main__":
    main()
