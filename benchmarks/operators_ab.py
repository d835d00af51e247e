"""The kernel engine against an earlier revision of itself, measured in the same run.

Loads ``src/kernelflow/operators.py`` as it was at ``--baseline`` (a git revision) next to the
current one and times ``K @ V`` and ``K^T K V`` on the same operators, interleaving the two
(the speed of a shared machine drifts). Prints new/old time ratios (below 1: faster now) and
the largest difference between the two results.

    python benchmarks/operators_ab.py --baseline 07fb46c           # n in {5000, 10000, 20000}
    python benchmarks/operators_ab.py --baseline 07fb46c --quick   # n in {2000, 5000}
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import torch
from _common import best_time, machine_info, print_table

from kernelflow import operators as current
from kernelflow.kernels import Gaussian, Matern

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_baseline(rev: str):
    """The engine module of revision ``rev`` (its relative imports made absolute)."""
    text = subprocess.run(["git", "show", f"{rev}:src/kernelflow/operators.py"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout
    text = text.replace("from .kernels import", "from kernelflow.kernels import")
    path = os.path.join(tempfile.mkdtemp(), "baseline_operators.py")
    with open(path, "w") as fh:
        fh.write(text)
    spec = importlib.util.spec_from_file_location("baseline_operators", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_operators"] = module
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision of the baseline engine")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    old = load_baseline(args.baseline)
    sizes = [2000, 5000] if args.quick else [5000, 10000, 20000]
    print(machine_info())
    rows = []
    for dtype in (torch.float32, torch.float64):
        for n in sizes:
            for d, kernel in ((3, Gaussian(2.0)), (16, Gaussian(4.0)), (8, Matern(3.0, 1.5))):
                g = torch.Generator().manual_seed(0)
                X = torch.randn(n, d, generator=g, dtype=dtype)
                V = torch.randn(n, 4, generator=g, dtype=dtype)
                a = old.KernelOperator(kernel, X, options=old.Options(memory_budget=2**30))
                b = current.KernelOperator(kernel, X, options=current.Options(memory_budget=2**30))
                diff = float((a @ V - b @ V).abs().max())
                t = {"old_mv": [], "new_mv": [], "old_ktk": [], "new_ktk": []}
                for _ in range(args.rounds):
                    t["old_mv"].append(best_time(lambda a=a, V=V: a @ V, repeat=1))
                    t["new_mv"].append(best_time(lambda b=b, V=V: b @ V, repeat=1))
                    t["old_ktk"].append(best_time(lambda a=a, V=V: a.kt_k_matmul(V), repeat=1))
                    t["new_ktk"].append(best_time(lambda b=b, V=V: b.kt_k_matmul(V), repeat=1))
                best = {k: min(v) for k, v in t.items()}
                rows.append({"dtype": str(dtype).replace("torch.", ""), "n": n, "d": d,
                             "kernel": type(kernel).__name__,
                             "matmul_old_s": best["old_mv"], "matmul_new_s": best["new_mv"],
                             "matmul_new/old": best["new_mv"] / best["old_mv"],
                             "ktk_new/old": best["new_ktk"] / best["old_ktk"],
                             "max_abs_diff": diff})
    print_table(rows)


if __name__ == "__main__":
    main()
