#!/usr/bin/env bash
# The prepared device check: every accelerator path of kernelflow, timed against the chip's limits.
#
#   bash benchmarks/gpu/run.sh                      # on a CUDA machine: the full check (< 8 min, H100)
#   bash benchmarks/gpu/run.sh --device cpu --quick # anywhere: tiny sizes (< 1 min), keeps it working
#
# Results go to $OUT (default ./gpu_out): gpu_check.json, gpu_check.md, check.log, tests.log.
# Other options are passed to check.py (e.g. --sections engine,nystrom; --budget-scale 0.5).
# Python: $PYTHON, else python3 (the interpreter that holds a CUDA build of torch).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${OUT:-$ROOT/gpu_out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
cd "$ROOT" || exit 2
export PYTHONUNBUFFERED=1

# kernelflow from this checkout when it is not installed (a bare device machine)
if ! "$PY" -c "import kernelflow" >/dev/null 2>&1; then
    export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi
# the optional compiled path loops, built in place when a C compiler is there (CPU figures use them)
case " $* " in
    *" --quick "*) ;;
    *) if ! "$PY" -c "import kernelflow._paths" >/dev/null 2>&1; then
           timeout 120 "$PY" setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 \
               || echo "compiled path loops not built (see build.log): tensor fallback" >&2
       fi ;;
esac

set -o pipefail
"$PY" "$HERE/check.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/check.log"
status=$?
echo "results: $OUT/gpu_check.json, $OUT/gpu_check.md"
exit $status
