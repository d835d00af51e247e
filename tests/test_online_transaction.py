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
