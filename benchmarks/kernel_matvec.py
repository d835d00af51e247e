"""Throughput of the kernel engine's K @ v against this machine's roofline.

The roofline of a Gaussian K @ v with K of shape (n, n) and inputs of dimension d is the time the
machine's own primitives need for the unavoidable work, both measured in this run:

    T_roof = n^2 / R_exp  +  2 n^2 (d + 3) / R_gemm

(n^2 exponentials, a GEMM of inner dimension d + 2 giving the exponents, and the product with v),
where R_exp is the rate of in-place ``exp_`` on a cache-sized buffer and R_gemm the rate of a
2048 x 2048 GEMM, in the same dtype and with all threads. The table reports T_roof / T_measured,
both the best of ``--rounds`` interleaved rounds (roofline, then product), and the median of
the per-round fractions (the speed of a shared virtual machine drifts between runs).

It also runs K @ v at n = 200 000 in a separate process under the default memory budget and
reports the peak resident memory.

    python benchmarks/kernel_matvec.py          # n in {1e4, 5e4} x d in {3, 16, 128}; 1e5 at d=16
    python benchmarks/kernel_matvec.py --quick    # small sizes
"""

from __future__ import annotations

import argparse

import torch
from _common import (
    best_time,
    dump_json,
    exp_throughput,
    gemm_throughput,
    machine_info,
    print_table,
    run_isolated,
)

from kernelflow.kernels import Gaussian
from kernelflow.operators import KernelOperator, Options, memory_budget

LARGE_N_CODE = """
import time, torch
from kernelflow.kernels import Gaussian
from kernelflow.operators import KernelOperator, memory_budget
torch.manual_seed(0)
n, d = {n}, {d}
X = torch.randn(n, d, dtype=torch.float32)
v = torch.randn(n, dtype=torch.float32)
op = KernelOperator(Gaussian({sigma}), X)
t0 = time.perf_counter(); out = op @ v; dt = time.perf_counter() - t0
RESULT = {{"n": n, "d": d, "seconds": dt, "budget_mb": memory_budget() / 2**20,
          "dense_matrix_mb": n * n * 4 / 2**20, "finite": bool(torch.isfinite(out).all())}}
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--sizes", default=None,
                        help="comma-separated n x d pairs, e.g. 50000x16 (default: the full set)")
    parser.add_argument("--skip-large", action="store_true", help="skip the n = 200 000 run")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved measurement rounds per size (best is reported)")
    args = parser.parse_args(argv)

    sizes = [(5000, d) for d in (3, 16, 128)] + [(10000, 16)]
    if not args.quick:
        sizes = [(n, d) for n in (10000, 50000) for d in (3, 16, 128)] + [(100000, 16)]
    if args.sizes:
        sizes = [tuple(int(v) for v in item.split("x")) for item in args.sizes.split(",")]
    print(machine_info())
    rows = []
    roof = {}
    for dtype in (torch.float32, torch.float64):
        r_exp, r_gemm = exp_throughput(dtype), gemm_throughput(dtype)
        roof[str(dtype)] = {"exp_per_s": r_exp, "gemm_flops": r_gemm}
        print(f"{dtype}: exp {r_exp:.3g} elements/s, GEMM {r_gemm:.3g} flop/s")
        for n, d in sizes:
            g = torch.Generator().manual_seed(0)
            X = torch.randn(n, d, generator=g, dtype=dtype)
            v = torch.randn(n, generator=g, dtype=dtype)
            op = KernelOperator(Gaussian(float(d) ** 0.5), X, options=Options())
            # The machine's speed drifts (shared virtual machine): every round measures the
            # roofline and the product back to back; the table reports the best of each and
            # the median over rounds of the per-round fraction.
            rounds = []
            for _ in range(args.rounds if n <= 50000 else max(1, args.rounds - 1)):
                r_e, r_g = exp_throughput(dtype), gemm_throughput(dtype)
                t = best_time(lambda op=op, v=v: op @ v, repeat=2 if n <= 10000 else 1)
                rounds.append((t, n * n / r_e + 2.0 * n * n * (d + 3) / r_g))
            t = min(r[0] for r in rounds)
            t_roof = min(r[1] for r in rounds)
            per_round = sorted(r[1] / r[0] for r in rounds)
            rows.append({"dtype": str(dtype).replace("torch.", ""), "n": n, "d": d,
                         "seconds": t, "Gentries_per_s": n * n / t / 1e9,
                         "roofline_s": t_roof, "fraction_of_roofline": t_roof / t,
                         "per_round_median": per_round[len(per_round) // 2],
                         "rounds": len(rounds)})
    print_table(rows)
    if args.skip_large:
        dump_json(args.json, {"rows": rows, "roofline": roof})
        return
    big_n = 20000 if args.quick else 200000
    big = run_isolated(LARGE_N_CODE.format(n=big_n, d=16, sigma=4.0))
    print(f"\nK @ v at n = {big['n']}, d = 16, float32: {big['seconds']:.1f} s, peak RSS "
          f"{big['peak_rss_mb']:.0f} MB (memory budget {big['budget_mb']:.0f} MB; the dense "
          f"matrix would need {big['dense_matrix_mb']:.0f} MB)")
    print(f"default memory budget here: {memory_budget() / 2**20:.0f} MB")
    dump_json(args.json, {"rows": rows, "roofline": roof, "large": big})


if __name__ == "__main__":
    main()
