"""The device check: every accelerator path of kernelflow, timed against the chip's limits.

Sections (each timed, each guarded: a failure is recorded in the JSON and the run goes on; each
has a time allowance, and the JSON and the table are rewritten after every section so that a run
stopped from outside keeps what it measured):

tests    ``tests/test_cuda.py`` on the device: every estimator family against the CPU result,
         the GPU-only branches, the device budget, model files GPU -> CPU -> GPU.
engine   Gaussian K·v and Kᵀu throughput in float32, TF32 and float64 at n = 1e5-1e6 rows,
         d = 3-64, against the chip's roofline (spec sheet peaks from the device name, and the
         GEMM, exp and copy rates measured in this run); the tile size; the same product on the
         host CPU for a ratio.
nystrom  Nyström kernel ridge at n = 1e7, M = 2e4, d = 9, float32, data drawn on the device: time
         and RMSE against the noiseless function, default solver and each solver; one pass over
         the data on the device and on the host CPU for a ratio.
exact    exact kernel ridge at n = 2e4 and 5e4 and the gradient / sign / coordinate paths at
         n = 2e4, on the device and on the host CPU.
memory   peak device memory (torch.cuda.max_memory_allocated) of every section against the
         budget the engine read at its start (half the free device memory by default).

``--device cpu --quick`` runs the same code at tiny sizes on the CPU (a CI smoke test); its
figures are not GPU figures.

    python benchmarks/gpu/check.py --out gpu_out                 # through run.sh on the device
    python benchmarks/gpu/check.py --out gpu_out --device cpu --quick
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import signal
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sections  # noqa: E402  (the directory of this script)

ORDER = ("tests", "engine", "nystrom", "exact", "memory")
# time allowances in seconds on the device (full mode) and in quick mode; the full run's sum
# (with imports and the start) stays under 8 minutes
ALLOWANCE = {"tests": 100, "engine": 70, "nystrom": 140, "exact": 100, "memory": 5}
QUICK_ALLOWANCE = {"tests": 40, "engine": 15, "nystrom": 20, "exact": 15, "memory": 5}


class SectionTimeout(Exception):
    """A section used up its time allowance."""


def _alarm(signum, frame):
    raise SectionTimeout("time allowance used up")


def device_info(device: torch.device) -> dict:
    info: dict = {"type": device.type, "name": platform.processor() or "cpu",
                  "cpus": os.cpu_count(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, total_memory=int(p.total_memory),
                    multiprocessors=int(p.multi_processor_count),
                    capability=f"{p.major}.{p.minor}")
    info["spec"] = sections.spec_peaks(info["name"]) if device.type == "cuda" else None
    return info


def _commit() -> str | None:
    """The checkout's commit, when git and the repository are there."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).resolve().parent
                              ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_outputs(out: Path, result: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "gpu_check.md").write_text(sections.markdown(result))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_out")
    parser.add_argument("--device", default=None,
                        help="cuda (default when available) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke test)")
    parser.add_argument("--sections", default=",".join(ORDER),
                        help=f"comma-separated subset of {','.join(ORDER)}")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every section's time allowance")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the full check's sizes (a trial on a smaller machine)")
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(wanted) - set(ORDER)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {ORDER}")

    result: dict = {
        "schema": 1,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "bash benchmarks/gpu/run.sh " + " ".join(sys.argv[1:]).replace(
            f"--out {args.out}", "").strip(),
        "commit": _commit(),
        "quick": bool(args.quick),
        "scale": args.scale,
        "device": device_info(device),
        "sections": {},
    }
    ctx = sections.Context(device=device, quick=args.quick, out=out, result=result,
                           scale=args.scale)
    result["headline"] = ctx.headline  # filled by the sections as they go
    allowance = QUICK_ALLOWANCE if args.quick else ALLOWANCE
    signal.signal(signal.SIGALRM, _alarm)
    for name in ORDER:
        if name not in wanted:
            result["sections"][name] = {"status": "skipped", "reason": "not selected"}
            continue
        limit = allowance[name] * args.budget_scale
        record: dict = {"status": "running", "allowance_s": limit, "rows": [], "notes": []}
        result["sections"][name] = record
        print(f"== {name} (allowance {limit:.0f} s)", flush=True)
        ctx.begin(name, record, limit)
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, limit + 15)  # hard stop past the soft deadline
        try:
            getattr(sections, f"section_{name}")(ctx)
            record["status"] = "ok" if not record.get("failed_rows") else "partial"
        except SectionTimeout:
            record["status"] = "timeout"
            record["error"] = f"stopped after {limit + 15:.0f} s"
        except BaseException as exc:  # noqa: BLE001 - record and go on
            if isinstance(exc, KeyboardInterrupt):
                raise
            record["status"] = "failed"
            record["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            record["traceback"] = traceback.format_exc()[-4000:]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            record["seconds"] = round(time.perf_counter() - t0, 2)
            ctx.end(name, record)
        print(f"   {name}: {record['status']} in {record['seconds']} s"
              + (f" ({record['error']})" if "error" in record else ""), flush=True)
        write_outputs(out, result)
    write_outputs(out, result)
    print(sections.markdown(result))
    bad = [n for n, r in result["sections"].items() if r["status"] in ("failed", "timeout")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
