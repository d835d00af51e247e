"""Two hosts for real: two network namespaces joined by a veth pair, one torchrun node in each.

Each namespace has its own network stack, with only a loopback and one end of the veth pair
(addresses in a private /24 that exists nowhere else), so the rendezvous (c10d) and the Gloo
collectives go over TCP between the two "hosts" exactly as between two machines. Needs root and
the ``ip`` tool (iproute2); elsewhere the tests skip and say why.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers import regression_data, sine_cosine

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from kernelflow.distributed import distributed_fit, shard_parquet  # noqa: E402
from kernelflow.estimators.doubly_stochastic_regressor import (  # noqa: E402
    DoublyStochasticRegressor,
)
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge  # noqa: E402
from kernelflow.io import load_model  # noqa: E402

N, D = 600, 2
PORT = 29517
SETUP_TIMEOUT = 15  # seconds for each `ip` command
RUN_TIMEOUT = 240  # seconds for a whole two-node fit (interpreter and torch start-up included)
COLLECTIVE_TIMEOUT = 30  # seconds a collective waits for the other node


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True,
                   timeout=SETUP_TIMEOUT)


@pytest.fixture(scope="module")
def hosts():
    """Two namespaces ``(name, veth, address)``; removed however the tests end."""
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces exist only on Linux")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` tool (iproute2) is not installed")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    tag = f"kf{os.getpid() % 100000}"
    net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    a, b = (f"{tag}a", f"{tag}va", f"{net}.1"), (f"{tag}b", f"{tag}vb", f"{net}.2")
    created = []
    try:
        for ns, _, _ in (a, b):
            _ip("netns", "add", ns)
            created.append(ns)
        # both ends are created inside the namespaces: nothing is added to the host's network
        _ip("-n", a[0], "link", "add", a[1], "type", "veth", "peer", "name", b[1], "netns", b[0])
        for ns, dev, addr in (a, b):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        for ns in created:
            with contextlib.suppress(Exception):
                _ip("netns", "del", ns)
        reason = getattr(exc, "stderr", None) or str(exc)
        pytest.skip(f"cannot create network namespaces: {str(reason).strip()}")
    try:
        yield a, b
    finally:
        for ns in created:
            _kill_namespace(ns)
            with contextlib.suppress(Exception):
                _ip("netns", "del", ns)


def _data():
    return regression_data(N, D, sine_cosine, bounds=(-3, 3))


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    """Two files of 300 rows in row groups of 100: each node gets three whole row groups."""
    X, y = _data()
    d = tmp_path_factory.mktemp("two_hosts")
    for i in range(2):
        part = slice(300 * i, 300 * (i + 1))
        table = pa.table({"x0": X[part, 0], "x1": X[part, 1], "y": y[part]})
        pq.write_table(table, d / f"part-{i}.parquet", row_group_size=100)
    return d


def _torchrun() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "torch.distributed.run"]


def _start_nodes(hosts, data, model: str, params: list[str], out: str, run_id: str, logs):
    """One torchrun node in each namespace; node 0 (the first namespace) hosts the rendezvous.

    Each node's standard output and error go to files under ``logs`` (no pipe can fill up).
    """
    (_, _, addr0), _ = hosts
    procs = []
    for node, (ns, dev, addr) in enumerate(hosts):
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=dev,
                   PYTHONUNBUFFERED="1")
        cmd = ["ip", "netns", "exec", ns, *_torchrun(),
               "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr0}:{PORT}",
               "--rdzv-id", run_id, "--rdzv-conf", f"is_host={int(node == 0)},join_timeout=120",
               "--local-addr", addr,
               "-m", "kernelflow.distributed", "fit", "--model", model, "--data", str(data),
               "--target", "y", "--timeout", str(COLLECTIVE_TIMEOUT), "--out", out,
               *[f"--param={p}" for p in params]]
        # a session of its own, so that the node (torchrun and its worker) can be killed whole
        with open(logs / f"node{node}.out", "w") as fout, \
                open(logs / f"node{node}.err", "w") as ferr:
            proc = subprocess.Popen(cmd, env=env, stdout=fout, stderr=ferr,
                                    start_new_session=True)
        proc.logs = (logs / f"node{node}.out", logs / f"node{node}.err")
        procs.append(proc)
    return procs


def _kill(proc) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in namespace ``ns`` (torchrun starts its workers in their own
    sessions, so killing the node's process group leaves the worker running): a host lost."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                              timeout=SETUP_TIMEOUT).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def _finish(procs, timeout: float) -> list[tuple[int, str, str]]:
    """(return code, stdout, stderr) of each node; every node is killed after ``timeout``."""
    deadline = time.monotonic() + timeout
    results = []
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                _kill(p)
            pytest.fail(f"a node did not finish within {timeout:.0f} s:\n"
                        f"{proc.logs[1].read_text()[-3000:]}")
        results.append((proc.returncode, proc.logs[0].read_text(), proc.logs[1].read_text()))
    return results


_MODELS = {
    "nystrom_ridge": (
        ["n_components=30", "alpha=1e-3", "sigma=1.0", "random_state=0"],
        lambda: NystromKernelRidge(30, alpha=1e-3, sigma=1.0, random_state=0),
    ),
    "doubly_stochastic": (
        ["sigma=1.0", "batch_size=64", "max_iter=3", "random_state=0"],
        lambda: DoublyStochasticRegressor(sigma=1.0, batch_size=64, max_iter=3,
                                          random_state=0),
    ),
}


@pytest.mark.parametrize("model", list(_MODELS))
def test_two_host_fit_equals_one_process(hosts, parquet_dir, tmp_path, model):
    params, make = _MODELS[model]
    out = str(tmp_path / f"{model}.npz")
    procs = _start_nodes(hosts, parquet_dir, model, params, out, f"fit-{model}", tmp_path)
    try:
        results = _finish(procs, RUN_TIMEOUT)
    finally:
        for p in procs:
            _kill(p)
        for ns, _, _ in hosts:
            _kill_namespace(ns)
    for node, (code, _, err) in enumerate(results):
        assert code == 0, f"node {node} failed:\n{err[-3000:]}"
    summary = [line for line in results[0][1].splitlines() if line.startswith("{")]
    assert len(summary) == 1 and '"processes": 2' in summary[0]
    X, _ = _data()
    ref = distributed_fit(make(), shard_parquet(parquet_dir, "y"))  # one process
    got = load_model(out).predict(X)
    expected = ref.predict(X)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 * np.abs(expected).max())


def test_killed_node_makes_the_other_exit_with_a_clear_error(hosts, parquet_dir, tmp_path):
    # enough epochs that the fit is still running when node 1 is killed
    params = ["sigma=1.0", "batch_size=8", "max_iter=100000", "tol=0", "early_stopping=False",
              "n_iter_no_change=100000", "random_state=0", "verbose=1"]
    out = str(tmp_path / "killed.npz")
    procs = _start_nodes(hosts, parquet_dir, "doubly_stochastic", params, out, "kill", tmp_path)
    try:
        _wait_until_fitting(procs[0], RUN_TIMEOUT)
        _kill_namespace(hosts[1][0])
        start = time.monotonic()
        (code, _, err), = _finish(procs[:1], COLLECTIVE_TIMEOUT + 90)
        elapsed = time.monotonic() - start
    finally:
        for p in procs:
            _kill(p)
        for ns, _, _ in hosts:
            _kill_namespace(ns)
    assert code != 0
    assert "error (rank 0)" in err, err[-3000:]
    assert "collective operation failed" in err, err[-3000:]
    assert elapsed < COLLECTIVE_TIMEOUT + 90
    assert not os.path.exists(out)


def _wait_until_fitting(proc, timeout: float) -> None:
    """Wait for node 0's first progress line: the fit is under way on both nodes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = proc.logs[1].read_text()
        if "DoublyStochasticRegressor" in seen:
            return
        if proc.poll() is not None:
            pytest.fail(f"node 0 ended before fitting:\n{seen[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"node 0 did not start fitting within {timeout:.0f} s")
