"""Model-file loading: memory on hostile files, and the cost of the checks on a valid file.

Part 1 loads hostile files, each in a fresh process, and prints the traced peak allocation,
the growth of the resident set and the time to refusal: three that attack the archive (a 2 MB
zip bomb inflating to 2 GiB, a ``.npy`` header declaring 2 GiB, a zip directory declaring
2 GiB) and five whose checksums are recomputed after forging what the file restores (a string
array of dtype ``<U999999``, engine options asking for 2**40-entry tiles, an ``Additive`` kernel
of 80 000 parts, a ``Pipeline(memory=...)`` cache directory, an ``SVC`` whose ``support_``
indexes past the training rows, which crashed ``decision_function`` when it loaded).

Part 2 saves a fitted ``KernelRidge`` and compares ``load_model`` (all checks, rebuilds the
estimator) with the baseline ``numpy.load(..., allow_pickle=False)`` reading every array of the
same file plus a SHA-256 of each (what the loader did before the checks), measured in the same
run; it also reports whether the loaded model's predictions are bit-identical.

    python benchmarks/model_file_loading.py --quick      # n = 2 000 rows
    python benchmarks/model_file_loading.py --n 50000    # about 20 MB of arrays
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np


def _npy_header(descr, shape):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _zip(entries):
    out, central = bytearray(), bytearray()
    for name, method, data, crc, size in entries:
        fname = name.encode()
        offset = len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data),
                           size, len(fname), 0) + fname + data
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc,
                               len(data), size, len(fname), 0, 0, 0, 0, 0, offset) + fname
    return bytes(out + central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries),
                                             len(entries), len(central), len(out), 0))


def _meta_entry(n):
    meta = {"format": "kernelflow-model", "format_version": 1,
            "estimator": {"name": None, "class": "sklearn.linear_model._ridge:Ridge",
                          "params": {"type": "dict", "items": []},
                          "state": {"type": "dict", "items": []}},
            "arrays": {"a0": {"dtype": "<f8", "shape": [n], "sha256": "0" * 64}}}
    from kernelflow.io import CHECKSUM_KEY, _metadata_digest

    meta[CHECKSUM_KEY] = _metadata_digest(meta)  # signed: refused for its sizes, not for that
    blob = json.dumps(meta).encode()
    data = _npy_header("|u1", (len(blob),)) + blob
    return ("__kernelflow__.npy", 0, data, zlib.crc32(data), len(data))


def hostile_files(directory: Path) -> dict[str, Path]:
    n = 2**28  # 2 GiB of float64
    header = _npy_header("<f8", (n,))
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = comp.compress(header) + comp.flush(zlib.Z_FULL_FLUSH)
    piece = comp.compress(bytes(2**20)) + comp.flush(zlib.Z_FULL_FLUSH)
    stream = head + piece * 2048 + comp.flush()
    small = header + bytes(64)
    files = {
        "zip bomb": [_meta_entry(n), ("a0.npy", 8, stream, 0, len(header) + 2**31)],
        "npy header declaring 2 GiB": [_meta_entry(n), ("a0.npy", 0, small, zlib.crc32(small),
                                                        len(small))],
        "zip directory declaring 2 GiB": [_meta_entry(n), ("a0.npy", 0, small, 0,
                                                           len(small) + 8 * n)],
    }
    out = {}
    for name, entries in files.items():
        path = directory / (name.replace(" ", "_") + ".npz")
        path.write_bytes(_zip(entries))
        out[name] = path
    return out


def _forge(path: Path, edit) -> Path:
    """Rewrite the metadata of a saved model with ``edit`` and recompute its checksum."""
    from kernelflow.io import CHECKSUM_KEY, META_KEY, _metadata_digest

    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(arrays.pop(META_KEY).tobytes())
    edit(meta, arrays)
    meta[CHECKSUM_KEY] = _metadata_digest(meta)
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **{META_KEY: blob}, **arrays)
    return path


def _state(meta: dict, name: str, value) -> None:
    meta["estimator"]["state"]["items"].append([name, value])


def forged_files(directory: Path) -> dict[str, Path]:
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    from kernelflow.estimators import KernelRidge
    from kernelflow.io import save_model
    from kernelflow.operators import Options

    rng = np.random.RandomState(0)
    X, y = rng.rand(30, 3), rng.rand(30)
    gauss = {"type": "object", "class": "kernelflow.kernels:Gaussian",
             "params": {"type": "dict", "items": [["sigma", 1.0]]}}
    wide = {"type": "object", "class": "kernelflow.kernels:Additive", "params": {
        "type": "dict", "items": [["parts", {"type": "list", "items": [
            {"type": "tuple", "items": [{"type": "list", "items": [0]}, gauss]}] * 80_000}]]}}

    def options(meta, arrays):
        for item in meta["estimator"]["params"]["items"]:
            if item[0] == "options":
                item[1]["fields"]["items"] = [["tile_elements", 2**40]]

    def memory(meta, arrays):
        meta["estimator"]["params"]["items"][0] = ["memory", str(directory / "cache")]

    def svc(meta, arrays):
        key = next(k for k, v in meta["arrays"].items() if v["dtype"] == "<i4")
        arrays[key] = np.full_like(arrays[key], 10**8)
        meta["arrays"][key]["sha256"] = hashlib.sha256(arrays[key].tobytes()).hexdigest()

    ridge = KernelRidge(alpha=0.1, options=Options()).fit(X, y)
    edits = {
        "string dtype <U999999 (x300)": (ridge, lambda m, a: _state(m, "names_", {
            "type": "str_array", "dtype": "<U999999", "shape": [300], "values": ["x"] * 300})),
        "Options(tile_elements=2**40)": (ridge, options),
        "Additive kernel, 80 000 parts": (ridge, lambda m, a: _state(m, "kernel_", wide)),
        "Pipeline(memory=dir)": (make_pipeline(StandardScaler(), KernelRidge()).fit(X, y),
                                 memory),
        "SVC, support_ past the rows": (SVC(kernel="precomputed").fit(X @ X.T, y > 0.5), svc),
    }
    out = {}
    for i, (name, (model, edit)) in enumerate(edits.items()):
        out[name] = _forge(save_model(model, directory / f"forged{i}.npz"), edit)
    return out


def part_hostile(directory: Path) -> None:
    print("hostile files (each in a fresh process, the class registry built before timing)")
    print(f"{'file':32s} {'size':>10s} {'traced peak':>12s} {'RSS growth':>11s} {'time':>9s}  "
          "refusal")
    for name, path in {**hostile_files(directory), **forged_files(directory)}.items():
        script = textwrap.dedent(f"""
            import resource, time, tracemalloc
            from kernelflow.io import ModelFileError, load_model
            from kernelflow.registry import lookup_model_class
            for cls in ("sklearn.pipeline:Pipeline", "sklearn.svm._classes:SVC"):
                lookup_model_class(cls)  # the registry is built once per process: not timed
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            tracemalloc.start()
            t0 = time.perf_counter()
            try:
                load_model({str(path)!r})
                message = "LOADED"
            except ModelFileError as exc:
                message = str(exc).split(": ", 1)[1]
            dt = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1]
            after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            print(peak, (after - before) * 1024, dt, message[:70])
        """)
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        if res.returncode:
            print(f"{name:32s} FAILED: {res.stderr.strip()[-200:]}")
            continue
        peak, growth, dt, message = res.stdout.strip().split(" ", 3)
        print(f"{name:32s} {path.stat().st_size / 2**20:8.3f}MB {int(peak) / 2**20:10.2f}MB "
              f"{int(growth) / 2**20:9.1f}MB {float(dt) * 1e3:7.1f}ms  {message}")


def part_valid(directory: Path, n: int, d: int, repeat: int) -> None:
    from kernelflow.estimators import KernelRidge
    from kernelflow.io import load_model, save_model

    rng = np.random.RandomState(0)
    X, y = rng.rand(n, d), rng.rand(n)
    model = KernelRidge(alpha=1.0, sigma=1.0)
    model.fit(X[:200], y[:200])
    model.X_fit_ = __import__("torch").from_numpy(X)  # a large model without an n x n solve
    model.dual_coef_ = __import__("torch").from_numpy(y.copy())
    path = save_model(model, directory / "valid.npz")

    def baseline():
        with np.load(path, allow_pickle=False) as f:
            for key in f.files:
                hashlib.sha256(f[key].tobytes()).hexdigest()

    def timed(fn):
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    load_model(path)  # warm: registry built once per process
    t_base, t_new = timed(baseline), timed(lambda: load_model(path))
    X_new = rng.rand(50, d)
    same = np.array_equal(load_model(path).predict(X_new), model.predict(X_new))
    size = path.stat().st_size / 2**20
    print(f"\nvalid model: n={n} d={d} file {size:.1f} MB (best of {repeat})")
    print(f"  baseline np.load + sha256 : {t_base * 1e3:8.2f} ms")
    print(f"  load_model (all checks)   : {t_new * 1e3:8.2f} ms   ratio {t_new / t_base:.2f}x")
    print(f"  predictions bit-identical : {same}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 2000, 3 repeats")
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--d", type=int, default=50)
    args = parser.parse_args(argv)
    n, repeat = (2000, 3) if args.quick else (args.n, 5)
    with tempfile.TemporaryDirectory() as tmp:
        part_hostile(Path(tmp))
        part_valid(Path(tmp), n, args.d, repeat)


if __name__ == "__main__":
    main()
