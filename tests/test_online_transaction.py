"""``learn_one`` rounds played into a new state and committed by assignment (no state copy).

``PKAWVTaylor.learn_one`` computes the round with ``RecursiveAWV.step`` into a new state object
whose ``A⁻¹`` lives in a spare buffer, then commits it with one assignment. These tests check the
arithmetic (bit for bit the two-phase ``begin``/``end``), that the old state is never written, and
that an interruption at any point of a round leaves the learner exactly as it was.
"""

from __future__ import annotations

import copy
import os
import sys

import numpy as np
import pytest

import kernelflow
from kernelflow.online import PKAWVTaylor
from kernelflow.online._updates import RecursiveAWV

pytestmark = pytest.mark.filterwarnings("ignore:X does not have valid feature names")

PKG = os.path.dirname(kernelflow.__file__)
ATOMIC_FILE = os.path.join(PKG, "utils", "_atomic.py")


class _Boom(Exception):
    pass


def _raise_at_call(k: int):
    """A profile hook raising at the k-th call of a kernelflow function (outside _atomic)."""
    count = [0]

    def hook(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if not f.startswith(PKG) or f == ATOMIC_FILE:
            return
        count[0] += 1
        if count[0] == k:
            raise _Boom(f"injected at call {k}")

    return hook, count


def _rows(n=15, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, d))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)
    return X, y


def _state(est):
    s = est._awv
    return s.A_inv.copy(), s.b.copy(), s.w.copy(), s.count, est.n_rounds_


@pytest.mark.parametrize("awv", [True, False])
def test_step_is_begin_end_bit_for_bit_and_leaves_the_state(awv):
    rng = np.random.default_rng(1)
    r = 7
    two_phase = RecursiveAWV(r, 0.5, refresh=5)
    state = RecursiveAWV(r, 0.5, refresh=5)
    for _ in range(12):  # crosses two refreshes of w
        v, y = rng.normal(size=r), float(rng.normal())
        before = (state.A_inv.copy(), state.b.copy(), state.w.copy(), state.count)
        y2, new = state.step(v, y, awv)
        # the old state is untouched (its buffers may be reused only after it is replaced)
        np.testing.assert_array_equal(state.A_inv, before[0])
        np.testing.assert_array_equal(state.b, before[1])
        np.testing.assert_array_equal(state.w, before[2])
        assert state.count == before[3]
        y1 = two_phase.begin(v, awv)
        two_phase.end(y)
        assert y1 == y2
        assert new.A_inv is not state.A_inv
        np.testing.assert_array_equal(np.triu(new.A_inv), np.triu(two_phase.A_inv))
        np.testing.assert_array_equal(new.b, two_phase.b)
        np.testing.assert_array_equal(new.w, two_phase.w)
        assert new.count == two_phase.count
        state = new


def test_two_steps_from_one_state_do_not_share_a_buffer():
    # a state stepped twice (a shallow copy of the learner, or a restored round) must give two
    # independent results: the spare buffer is handed out once
    rng = np.random.default_rng(2)
    s0 = RecursiveAWV(5, 1.0)
    _, s1 = s0.step(rng.normal(size=5), 0.3, True)
    _, s2 = s1.step(rng.normal(size=5), -0.2, True)  # writes into s0's old buffer
    v = rng.normal(size=5)
    _, a = s2.step(v, 1.0, True)
    a_copy = a.A_inv.copy()
    _, b = s2.step(v, 1.0, True)
    assert a.A_inv is not b.A_inv
    np.testing.assert_array_equal(a.A_inv, a_copy)
    np.testing.assert_array_equal(a.A_inv, b.A_inv)


def test_learn_one_equals_fit_and_partial_fit_replaces_the_state():
    X, y = _rows(40)
    keys = ["a", "b", "c"]
    one = PKAWVTaylor(degree=3, awv=True)
    for row, target in zip(X, y):
        one.learn_one(dict(zip(keys, row)), float(target))
    ref = PKAWVTaylor(degree=3, awv=True).fit(X, y)
    np.testing.assert_allclose(one.predict(X[:10]), ref.predict(X[:10]), rtol=1e-10, atol=1e-12)
    old = one._awv
    A_old = old.A_inv.copy()
    one.partial_fit(X[:5], y[:5])
    assert one._awv is not old
    np.testing.assert_array_equal(old.A_inv, A_old)


@pytest.mark.parametrize("center", [None, "first_batch"])
def test_learn_one_interrupted_anywhere_is_exactly_undone(center):
    X, y = _rows(15)
    keys = ["a", "b", "c"]
    est = PKAWVTaylor(degree=2, center=center)
    for t in range(11):
        est.learn_one(dict(zip(keys, X[t])), float(y[t]))
    row, target = dict(zip(keys, X[11])), float(y[11])

    hook, count = _raise_at_call(None)
    dry = copy.deepcopy(est)
    sys.setprofile(hook)
    try:
        dry.learn_one(row, target)
    finally:
        sys.setprofile(None)
    n_calls = count[0]
    assert n_calls > 2

    ref = copy.deepcopy(est)
    ref.learn_one(row, target)
    before = _state(est)
    out_before = est.predict(X[:5])
    for k in range(1, n_calls + 1):
        hook, _ = _raise_at_call(k)
        sys.setprofile(hook)
        try:
            with pytest.raises(_Boom):
                est.learn_one(row, target)
        finally:
            sys.setprofile(None)
        after = _state(est)
        for u, v in zip(before, after):
            np.testing.assert_array_equal(u, v)
        np.testing.assert_array_equal(est.predict(X[:5]), out_before)
    # and it continues exactly as if nothing had happened
    est.learn_one(row, target)
    np.testing.assert_array_equal(est.predict(X[:5]), ref.predict(X[:5]))
    np.testing.assert_array_equal(np.triu(est._awv.A_inv), np.triu(ref._awv.A_inv))


def test_refused_row_leaves_the_learner_and_its_buffers():
    X, y = _rows(8)
    keys = ["a", "b", "c"]
    est = PKAWVTaylor(degree=2)
    for t in range(6):
        est.learn_one(dict(zip(keys, X[t])), float(y[t]))
    before = _state(est)
    state = est._awv
    for bad in ({"a": np.nan, "b": 0.0, "c": 0.0}, {"a": 0.0, "b": 0.0, "c": np.inf},
                {"a": 1e300, "b": 1e300, "c": 0.0}, {"a": 0.0, "b": 0.0}):
        with pytest.raises(ValueError):
            est.learn_one(bad, 1.0)
    with pytest.raises(ValueError, match="finite"):
        est.learn_one(dict(zip(keys, X[6])), float("nan"))
    assert est._awv is state
    for u, v in zip(before, _state(est)):
        np.testing.assert_array_equal(u, v)


# ---- every learner: a failure anywhere in a continuing call is undone bit for bit ---------------
# The rounds write their history buffers in place through an undo log and replace everything else
# (see ``kernelflow.online._base``); the snapshot keeps references only. These tests compare the
# *whole* instance dictionary, buffers included, with a deep copy taken before the call.
from kernelflow.online import FOGD, KernelAWV, PKAWVNystrom, ProsNKONS  # noqa: E402
from kernelflow.online._updates import KORS, GrowingCholeskyInverse, UndoLog  # noqa: E402


def _deep_equal(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return (a.shape == b.shape and a.dtype == b.dtype
                and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_deep_equal(u, v) for u, v in zip(a, b))
    if hasattr(a, "__dict__") and not isinstance(a, type) and not callable(a):
        return _deep_equal(vars(a), vars(b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - no equality: identity
        return a is b


def _assert_bit_identical(before: dict, est) -> None:
    assert sorted(before) == sorted(est.__dict__)
    bad = [k for k in before if not _deep_equal(before[k], est.__dict__[k])]
    assert not bad, f"changed by the failed call: {bad}"


def _count_calls(est, call) -> int:
    hook, count = _raise_at_call(None)
    dry = copy.deepcopy(est)
    sys.setprofile(hook)
    try:
        call(dry)
    finally:
        sys.setprofile(None)
    return count[0]


def _fail_everywhere(est, call, X_probe, step=1):
    """Inject a failure at each kernelflow call of ``call``; the learner must be bit-identical."""
    n_calls = _count_calls(est, call)
    assert n_calls > 2
    before = copy.deepcopy(est.__dict__)
    out = est.predict(X_probe)
    for k in range(1, n_calls + 1, step):
        hook, _ = _raise_at_call(k)
        sys.setprofile(hook)
        try:
            with pytest.raises(_Boom):
                call(est)
        finally:
            sys.setprofile(None)
        _assert_bit_identical(before, est)
    np.testing.assert_array_equal(est.predict(X_probe), out)
    return n_calls


def _round_where(make, X, y, keys, want):
    """The first round t (after 3) whose learn_one inserts ("insert") / flushes ("flush")."""
    est = make()
    for t in range(len(y)):
        if t >= 3:
            m, p = est.dictionary_.shape[0], len(est._pend)
            probe = copy.deepcopy(est)
            probe.learn_one(dict(zip(keys, X[t])), float(y[t]))
            if want == "insert" and probe.dictionary_.shape[0] > m:
                return t
            if want == "flush" and m and len(probe._pend) < p:
                return t
            if want == "plain" and probe.dictionary_.shape[0] == m and len(probe._pend) > p:
                return t
        est.learn_one(dict(zip(keys, X[t])), float(y[t]))
    pytest.skip(f"no {want} round in the stream")


NYSTROM_CASES = {
    "awv": lambda: PKAWVNystrom(sigma=0.5, random_state=0),
    "krr": lambda: PKAWVNystrom(sigma=0.5, awv=False, random_state=0),
    "all-updown": lambda: PKAWVNystrom(sigma=0.5, dictionary="all", cholesky_insert="updown"),
}


@pytest.mark.parametrize("kind", ["plain", "insert", "flush"])
@pytest.mark.parametrize("case", list(NYSTROM_CASES))
def test_nystrom_learn_one_failure_anywhere_is_undone_bit_for_bit(case, kind):
    make = NYSTROM_CASES[case]
    X, y = _rows(140, d=2, seed=3)
    keys = ["a", "b"]
    t = _round_where(make, X, y, keys, kind)
    est = make()
    for s in range(t):
        est.learn_one(dict(zip(keys, X[s])), float(y[s]))
    row, target = dict(zip(keys, X[t])), float(y[t])
    ref = copy.deepcopy(est)
    _fail_everywhere(est, lambda e: e.learn_one(row, target), X[:6])
    # the learner continues exactly as one never interrupted
    for s in range(t, min(t + 70, len(y))):
        est.learn_one(dict(zip(keys, X[s])), float(y[s]))
        ref.learn_one(dict(zip(keys, X[s])), float(y[s]))
    _assert_bit_identical(copy.deepcopy(ref.__dict__), est)


def test_nystrom_known_inputs_learn_one_failure_is_undone():
    X, y = _rows(60, d=2, seed=4)
    est = PKAWVNystrom(sigma=0.5, known_inputs=True, random_state=0).fit(X[:40], y[:40])
    row, target = {0: X[40, 0], 1: X[40, 1]}, float(y[40])
    _fail_everywhere(est, lambda e: e.learn_one(row, target), X[:6])


@pytest.mark.parametrize("make", [
    lambda: PKAWVNystrom(sigma=0.5, random_state=1),
    lambda: KernelAWV(sigma=0.5),
    lambda: ProsNKONS(sigma=0.5, random_state=1),
    lambda: FOGD(n_components=20, random_state=1),
], ids=["PKAWVNystrom", "KernelAWV", "ProsNKONS", "FOGD"])
def test_partial_fit_and_learn_one_failures_are_undone_bit_for_bit(make):
    X, y = _rows(90, d=2, seed=5)
    est = make().partial_fit(X[:40], y[:40])
    ref = copy.deepcopy(est)
    # a block of rounds (with insertions for the dictionary learners), every 3rd call
    _fail_everywhere(est, lambda e: e.partial_fit(X[40:70], y[40:70]), X[:6], step=3)
    row, target = {0: X[70, 0], 1: X[70, 1]}, float(y[70])
    _fail_everywhere(est, lambda e: e.learn_one(row, target), X[:6])
    est.partial_fit(X[40:70], y[40:70])
    ref.partial_fit(X[40:70], y[40:70])
    np.testing.assert_array_equal(est.predict(X[:20]), ref.predict(X[:20]))


@pytest.mark.parametrize("cls", [KernelAWV, PKAWVNystrom])
def test_divergence_after_the_writes_leaves_the_buffers_bit_identical(cls, monkeypatch):
    X, y = _rows(30, d=2, seed=6)
    est = cls(sigma=0.5)
    for t in range(20):
        est.learn_one({"a": X[t, 0], "b": X[t, 1]}, float(y[t]))
    before = copy.deepcopy(est.__dict__)
    played = cls._one_round

    def overflowing(self, row, target):  # the round runs (and writes), then reports NaN
        played(self, row, target)
        return float("nan")

    monkeypatch.setattr(cls, "_one_round", overflowing)
    with pytest.raises(ValueError, match="non-finite prediction"):
        est.learn_one({"a": X[20, 0], "b": X[20, 1]}, float(y[20]))
    _assert_bit_identical(before, est)


# ---- a round costs what it writes, not the size of the state ------------------------------------
def _round_peak_bytes(est, row, target) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        est.learn_one(row, target)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_nystrom_round_allocates_nothing_of_the_history_size():
    X, y = _rows(1500, d=4, seed=7)
    keys = list(range(4))  # fit on an array names the features 0..d-1
    est = PKAWVNystrom(sigma=1.0, random_state=0)
    est.fit(X[:1490], y[:1490])
    history = est._X.nbytes + est._K.nbytes + est._Y.nbytes
    peaks = []
    for t in range(1490, 1500):
        m, p = est.dictionary_.shape[0], len(est._pend)
        peak = _round_peak_bytes(est, dict(zip(keys, X[t])), float(y[t]))
        if est.dictionary_.shape[0] == m and len(est._pend) == p + 1:  # no insertion, no flush
            peaks.append(peak)
    assert peaks
    # a copy of the state (the former undo copy) would allocate the history at least once
    assert max(peaks) < history / 8, (max(peaks), history)


def test_kernel_awv_round_allocates_nothing_of_the_factor_size():
    X, y = _rows(700, d=3, seed=8)
    est = KernelAWV(sigma=0.5).fit(X[:690], y[:690])
    used = 8 * est._chol.n ** 2  # the used block of L⁻¹
    peak = _round_peak_bytes(est, dict(enumerate(X[690])), float(y[690]))
    assert peak < used / 8, (peak, used)


# ---- the pieces ---------------------------------------------------------------------------------
def test_undo_log_rollback_restores_and_is_idempotent():
    a = np.arange(6.0)
    b = np.zeros((3, 2))
    log = UndoLog()
    log.write(a, slice(1, 4), -1.0)
    log.write(b, (1, slice(None)), [5.0, 6.0])
    log.write(a, 2, 9.0)  # the same place twice: the oldest value wins
    saved = list(log.entries)
    log.rollback()
    np.testing.assert_array_equal(a, np.arange(6.0))
    np.testing.assert_array_equal(b, np.zeros((3, 2)))
    assert log.entries == []
    # a rollback interrupted half-way is completed by replaying the whole log again
    a[:] = 7.0
    log.entries = saved
    for arr, index, old in reversed(saved[1:]):
        arr[index] = old
    log.rollback()
    np.testing.assert_array_equal(a[1:4], [1.0, 2.0, 3.0])


def test_growing_cholesky_writes_through_the_log():
    rng = np.random.default_rng(9)
    X = rng.normal(size=(12, 2))
    K = np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1))
    G = GrowingCholeskyInverse(capacity=16)
    for t in range(10):
        G.append(K[:t, t], K[t, t] + 0.5)
        G.set_label(float(t))
    Linv, z, n = G.Linv.copy(), G.z.copy(), G.n
    log = UndoLog()
    snapshot = G.__atomic_copy__({})  # counters only: the buffers are shared
    assert snapshot.Linv is G.Linv
    G.append(K[:10, 10], K[10, 10] + 0.5, log)
    G.set_label(1.0, log)
    log.rollback()
    np.testing.assert_array_equal(G.Linv, Linv)
    np.testing.assert_array_equal(G.z, z)
    assert snapshot.n == n


def test_kors_draws_come_from_the_counter_stream_and_copy_in_constant_size():
    kors = KORS(1.0, 0.5, 1.0, "inverse", 7)
    seed = np.random.RandomState(7).randint(0, 2**31 - 1)
    assert kors.seed == seed
    expected = np.concatenate([np.random.default_rng([seed, j]).random(256) for j in range(2)])
    draws = [kors._uniform() for _ in range(300)]
    np.testing.assert_array_equal(draws, expected[:300])
    # a copy shares the arrays (replaced, never written) and has its own position
    twin = kors.__atomic_copy__({})
    assert twin.T is kors.T and twin.S is kors.S
    a = [kors._uniform() for _ in range(5)]
    b = [twin._uniform() for _ in range(5)]
    assert a == b == list(expected[300:305])
    assert kors.draws == twin.draws == 305
