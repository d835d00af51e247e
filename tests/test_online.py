"""Online learners: exactness, the paper's regret bounds, state size and the two APIs."""

import copy
import math

import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import check_estimator

from kernelflow.datasets._online import scale_to_unit_box
from kernelflow.features.taylor import taylor_features, theoretical_taylor_degree
from kernelflow.online import (
    FOGD,
    KernelAWV,
    PKAWVNystrom,
    PKAWVTaylor,
    ProsNKONS,
    greedy_adversary,
    online_krr_predictions,
)
from kernelflow.online.evaluate import iter_chunks, progressive_validation

LEARNERS = [
    KernelAWV(),
    KernelAWV(awv=False),
    PKAWVTaylor(degree=2),
    PKAWVNystrom(random_state=0),
    PKAWVNystrom(known_inputs=True, random_state=0),
    FOGD(n_components=20),
    ProsNKONS(random_state=0),
]
# check_estimator's data are standardised (far apart for σ = 1): a larger KORS ridge keeps the
# dictionaries, hence the run time, small
# (the default KernelAWV() is checked in test_common.py)
CHECKED = LEARNERS[1:3] + [PKAWVNystrom(mu=20.0, random_state=0),
                          PKAWVNystrom(mu=20.0, known_inputs=True, random_state=0),
                          LEARNERS[5], ProsNKONS(mu=20.0, random_state=0)]


def _gauss(A, B, sigma=1.0):
    return np.exp(-0.5 * ((A[:, None] - B[None]) ** 2).sum(-1) / sigma**2)


def _data(rng, n=60, d=3):
    X = rng.uniform(-1, 1, (n, d))
    y = np.clip(np.sin(3 * X[:, 0]) + 0.3 * rng.standard_normal(n), -1, 1)
    return X, y


def _regret_lhs(K, y, pred, lam):
    """sup_f [R_n(f) - λ‖f‖²] = Σ(y-ŷ)² - λ yᵀ(K+λI)⁻¹y."""
    return float(((y - pred) ** 2).sum() - lam * y @ np.linalg.solve(K + lam * np.eye(len(y)), y))


def _logdet(K, lam):
    return float(np.linalg.slogdet(np.eye(len(K)) + K / lam)[1])


def _state(learner):
    return copy.deepcopy({k: v for k, v in vars(learner).items()})


def _same(va, vb, where="state"):
    if isinstance(va, np.ndarray):
        np.testing.assert_array_equal(va, vb, err_msg=where)
    elif isinstance(va, np.random.RandomState):
        _same(va.get_state(), vb.get_state(), where)
    elif isinstance(va, tuple | list):
        assert len(va) == len(vb), where
        for i, (p, q) in enumerate(zip(va, vb)):
            _same(p, q, f"{where}[{i}]")
    elif isinstance(va, dict):
        _same_state(va, vb)
    elif hasattr(va, "__dict__") and not isinstance(va, type):
        _same_state(vars(va), vars(vb))
    else:
        assert va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb)), where


def _same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        _same(a[k], b[k], k)


@pytest.mark.parametrize("est", CHECKED, ids=lambda e: repr(e))
def test_check_estimator(est):
    check_estimator(est)


# ---- exactness ------------------------------------------------------------------------------
@pytest.mark.parametrize("awv", [True, False])
def test_kernel_awv_matches_closed_forms(rng, awv):
    X, y = _data(rng, 50)
    lam, sigma = 0.8, 0.7
    K = _gauss(X, X, sigma)
    pred = KernelAWV(lam, sigma=sigma, awv=awv).progressive_predict(X, y)
    for t in range(50):
        if awv:  # eq. 3 = KRR on x_1..x_t with labels (y_1..y_{t-1}, 0)
            expected = K[t, : t + 1] @ np.linalg.solve(K[: t + 1, : t + 1] + lam * np.eye(t + 1),
                                                      np.append(y[:t], 0.0))
        else:
            expected = K[t, :t] @ np.linalg.solve(K[:t, :t] + lam * np.eye(t), y[:t]) if t else 0
        assert pred[t] == pytest.approx(expected, abs=1e-10)
    np.testing.assert_allclose(online_krr_predictions(K.copy(), y, lam, awv=awv), pred, atol=1e-10)


def test_awv_is_shrunk_krr(rng):
    X, y = _data(rng, 40)
    krr = KernelAWV(awv=False).progressive_predict(X, y)
    awv = KernelAWV().progressive_predict(X, y)
    K = _gauss(X, X)
    for t in range(1, 40):
        s2 = 1.0 - K[t, :t] @ np.linalg.solve(K[:t, :t] + np.eye(t), K[:t, t])
        assert awv[t] == pytest.approx(krr[t] / (1.0 + s2), abs=1e-12)


@pytest.mark.parametrize("awv", [True, False])
@pytest.mark.parametrize("known_inputs", [False, True])
def test_nystrom_with_every_point_is_kernel_awv(rng, awv, known_inputs):
    X, y = _data(rng, 60, 5)
    exact = KernelAWV(sigma=0.5, awv=awv).progressive_predict(X, y)
    ny = PKAWVNystrom(sigma=0.5, dictionary="all", awv=awv, known_inputs=known_inputs)
    np.testing.assert_allclose(ny.progressive_predict(X, y), exact, atol=1e-11)
    assert len(ny.dictionary_indices_) == 60
    # pure predictions agree where the subspace holds the representer: at dictionary points, and
    # anywhere for KRR (its solution lies in the span of the past inputs)
    Xn = X[:5] if awv else rng.uniform(-1, 1, (5, 5))
    ref = KernelAWV(sigma=0.5, awv=awv).fit(X, y)
    np.testing.assert_allclose(ny.predict(Xn), ref.predict(Xn), atol=1e-10)


@pytest.mark.parametrize("insert", ["border", "updown"])
def test_nystrom_invariants_every_round(rng, insert):
    X, y = _data(rng, 120, 2)
    lam = 1.0
    ny = PKAWVNystrom(lam, sigma=0.4, cholesky_insert=insert, random_state=0)
    for t in range(120):
        ny.partial_fit(X[t : t + 1], y[t : t + 1])
        m = len(ny.dictionary_indices_)
        D = X[ny.dictionary_indices_]
        np.testing.assert_array_equal(ny.dictionary_, D)
        K = _gauss(X[: t + 1], D, 0.4)
        H = K.T @ K + lam * _gauss(D, D, 0.4)
        assert ny._R.shape == (m, m)
        P = ny._K[ny._pend, :m]  # rows not yet absorbed in R (Woodbury)
        np.testing.assert_allclose(ny._R.T @ ny._R + P.T @ P, H, atol=1e-9)
        np.testing.assert_allclose(ny._q, K.T @ y[: t + 1], atol=1e-10)
        np.testing.assert_allclose(ny._R.T @ ny._zq, ny._q, atol=1e-9)
        x_new = rng.uniform(-1, 1, (1, 2))
        b = _gauss(x_new, D, 0.4)[0]
        alpha = np.linalg.solve(H + np.outer(b, b), K.T @ y[: t + 1])
        assert ny.predict(x_new)[0] == pytest.approx(b @ alpha, abs=1e-9)
    assert 3 < m < 120


def test_nystrom_blocked_rounds_equal_sequential_rounds(rng):
    """partial_fit (blocks between insertions) = round by round (_begin/_end)."""
    X, y = _data(rng, 250, 2)
    for awv in (True, False):
        a = PKAWVNystrom(sigma=0.5, awv=awv, random_state=3)
        pa = a.progressive_predict(X, y)
        b = PKAWVNystrom(sigma=0.5, awv=awv, random_state=3)
        pb = []
        for t in range(250):
            pb.append(b._begin(X[t]) if t else (b.learn_one(dict(enumerate(X[0])), y[0]) or 0.0))
            if t:
                b._end(y[t])
                b.n_rounds_ += 1
        assert a.dictionary_indices_ == b.dictionary_indices_
        np.testing.assert_allclose(pa, pb, atol=1e-10)
        m = a.dictionary_.shape[0]
        Pa, Pb = a._K[a._pend, :m], b._K[b._pend, :m]
        np.testing.assert_allclose(a._R.T @ a._R + Pa.T @ Pa, b._R.T @ b._R + Pb.T @ Pb,
                                   atol=1e-9)


def test_taylor_converges_to_kernel_awv(rng):
    # digest §4.4 (4): max difference decreases with M (0.098/0.030/0.0097/9.5e-5 on its toy)
    X, y = _data(rng, 60)
    exact = KernelAWV().progressive_predict(X, y)
    diffs = [np.abs(PKAWVTaylor(degree=M).progressive_predict(X, y) - exact).max()
             for M in (2, 3, 4, 8)]
    assert all(b < a for a, b in zip(diffs, diffs[1:]))
    assert diffs[-1] < 1e-3


@pytest.mark.parametrize("awv", [True, False])
def test_taylor_equals_linear_ridge_on_its_features(rng, awv):
    X, y = _data(rng, 50)
    V = taylor_features(X, sigma=1.0, M=3)
    pred = PKAWVTaylor(0.5, degree=3, awv=awv).progressive_predict(X, y)
    for t in range(50):
        A = 0.5 * np.eye(V.shape[1]) + V[: t + awv].T @ V[: t + awv]
        assert pred[t] == pytest.approx(V[t] @ np.linalg.solve(A, V[:t].T @ y[:t]), abs=1e-11)
    ordered = PKAWVTaylor(0.5, degree=3, awv=awv, feature_mode="ordered")
    np.testing.assert_allclose(ordered.progressive_predict(X, y), pred, atol=1e-10)


# ---- regret bounds ---------------------------------------------------------------------------
def test_prop1_regret_bound_kernel_awv(rng):
    X, y = _data(rng, 80, 3)
    lam = 1.0
    K = _gauss(X, X)
    lhs = _regret_lhs(K, y, KernelAWV(lam).progressive_predict(X, y), lam)
    B = np.abs(y).max()
    ld = _logdet(K, lam)
    d_eff = float(np.trace(K @ np.linalg.inv(K + lam * np.eye(len(y)))))
    assert lhs <= B**2 * ld <= B**2 * math.log(math.e + math.e * len(y) / lam) * d_eff
    assert lhs > 0  # the bound is not vacuous here


def test_prop1_and_theorem4_on_greedy_adversary():
    n, d, lam = 10, 2, 1.0
    M = theoretical_taylor_degree(n, R=math.sqrt(d), sigma=1.0, alpha=lam)  # 16
    for learner, factor in ((KernelAWV(lam), 1.0), (PKAWVTaylor(lam, degree=M), 1.5)):
        X, y, pred, regret = greedy_adversary(learner, n=n, d=d, alpha=lam, n_candidates=32,
                                              polish=False, random_state=0)
        K = _gauss(X, X)
        assert regret[-1] == pytest.approx(_regret_lhs(K, y, pred, lam), abs=1e-9)
        assert regret[-1] <= factor * _logdet(K, lam)  # B = 1


def test_theorem4_regret_bound_taylor(rng):
    n, d, lam, R = 60, 2, 1.0, 0.5
    U = rng.standard_normal((n, d))
    X = U / np.linalg.norm(U, axis=1, keepdims=True) * rng.uniform(0, R, (n, 1))
    y = rng.uniform(-1, 1, n)
    M = theoretical_taylor_degree(n, R=R, alpha=lam)
    K = _gauss(X, X)
    lhs = _regret_lhs(K, y, PKAWVTaylor(lam, degree=M).progressive_predict(X, y), lam)
    assert lhs <= 1.5 * np.abs(y).max() ** 2 * _logdet(K, lam)


@pytest.mark.parametrize("M", [1, 2, 3])
def test_theorem3_fixed_subspace_bound_small_degree(rng, M):
    X, y = _data(rng, 70, 2)
    lam, B = 1.0, 1.0
    K = _gauss(X, X)
    Phi = taylor_features(X, M=M)
    mu = float(np.linalg.eigvalsh(K - Phi @ Phi.T)[-1])
    lhs = _regret_lhs(K, y, PKAWVTaylor(lam, degree=M).progressive_predict(X, y), lam)
    assert lhs <= B**2 * _logdet(K, lam) + (mu + lam) * len(y) * mu * B**2 / lam**2


# ---- state size ------------------------------------------------------------------------------
def _nbytes(obj, seen=None):
    seen = set() if seen is None else seen
    total = 0
    for v in vars(obj).values():
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif hasattr(v, "__dict__") and not isinstance(v, type) and not callable(v):
            total += _nbytes(v, seen)
    return total


def test_taylor_state_does_not_grow(rng):
    X = rng.uniform(-1, 1, (3000, 4))
    y = np.sin(X.sum(1))
    model = PKAWVTaylor(degree=3).partial_fit(X[:10], y[:10])
    size = (_nbytes(model), model.state_size_)
    model.partial_fit(X[10:], y[10:])
    assert (_nbytes(model), model.state_size_) == size
    assert model.state_size_ == 35 * 35 + 2 * 35


def test_nystrom_state_grows_only_with_dictionary(rng):
    X = rng.uniform(-1, 1, (1500, 2))
    y = np.sin(3 * X[:, 0])
    known = PKAWVNystrom(sigma=0.5, known_inputs=True, random_state=0).fit(X, y)
    m = len(known.dictionary_indices_)
    assert known._fixed.A_inv.shape == (m, m) and known._embed.shape == (m, m)
    seq = PKAWVNystrom(sigma=0.5, random_state=0)
    sizes = []
    for chunk in range(3):
        seq.partial_fit(X[500 * chunk : 500 * (chunk + 1)], y[500 * chunk : 500 * (chunk + 1)])
        m = len(seq.dictionary_indices_)
        assert seq._R.shape == (m, m) and seq._q.shape == (m,) and seq._kors.T.shape == (m, m)
        sizes.append(m)
    assert sizes[0] <= sizes[1] <= sizes[2] < 200  # the dictionary saturates


# ---- protocol and APIs -----------------------------------------------------------------------
@pytest.mark.parametrize("est", LEARNERS[:4] + LEARNERS[5:], ids=lambda e: repr(e))
def test_strict_protocol_prediction_ignores_current_label(rng, est):
    X, y = _data(rng, 40)
    y2 = y.copy()
    y2[25] += 5.0
    p1 = copy.deepcopy(est).progressive_predict(X, y)
    p2 = copy.deepcopy(est).progressive_predict(X, y2)
    np.testing.assert_array_equal(p1[:26], p2[:26])
    if not isinstance(est, ProsNKONS):  # its restarts may forget y_25 at once
        assert not np.allclose(p1[26:], p2[26:])


@pytest.mark.parametrize("est", [KernelAWV(), PKAWVTaylor(), FOGD(n_components=30)],
                         ids=lambda e: repr(e))
def test_predict_is_pure_and_equals_next_round(rng, est):
    X, y = _data(rng, 30)
    est.fit(X, y)
    x = rng.uniform(-1, 1, (1, 3))
    before = _state(est)
    p = est.predict(x)
    _same_state(before, _state(est))
    assert est.predict_one({i: v for i, v in enumerate(x[0])}) == pytest.approx(p[0], abs=1e-14)
    assert est.progressive_predict(x, [0.3])[0] == pytest.approx(p[0], abs=1e-12)


@pytest.mark.parametrize("est", LEARNERS[:4] + LEARNERS[5:], ids=lambda e: repr(e))
def test_learn_one_equals_partial_fit(rng, est):
    X, y = _data(rng, 30)
    a, b = copy.deepcopy(est), copy.deepcopy(est)
    assert a.predict_one({"u": 0.1, "v": 0.2, "w": 0.3}) == 0.0  # before any round
    for t in range(30):
        a.learn_one({"u": X[t, 0], "v": X[t, 1], "w": X[t, 2]}, y[t])
    b.partial_fit(X, y)
    Xn = rng.uniform(-1, 1, (4, 3))
    np.testing.assert_allclose(a.predict(Xn), b.predict(Xn), atol=1e-12)
    assert a.n_rounds_ == b.n_rounds_ == 30
    assert list(a.feature_names_in_) == ["u", "v", "w"]


def test_bad_rows_raise_and_leave_state_unchanged(rng):
    X, y = _data(rng, 20)
    for est in (PKAWVTaylor(), PKAWVNystrom(random_state=0), KernelAWV(), ProsNKONS(
            random_state=0), FOGD(n_components=10)):
        for t in range(20):
            est.learn_one({"a": X[t, 0], "b": X[t, 1], "c": X[t, 2]}, y[t])
        before = _state(est)
        bad = [
            ({"a": 0.1, "b": 0.2}, 0.5, "missing"),
            ({"a": 0.1, "b": float("nan"), "c": 0.0}, 0.5, "NaN"),
            ({"a": 0.1, "b": 0.2, "c": 0.3, "d": 1.0}, 0.5, "unexpected"),
            ({"a": 0.1, "b": "x", "c": 0.3}, 0.5, "non-numeric"),
            ({"a": 0.1, "b": 0.2, "c": 0.3}, float("inf"), "finite"),
            ([0.1, 0.2, 0.3], 0.5, "dict"),
        ]
        for x, yy, msg in bad:
            with pytest.raises((ValueError, TypeError), match=msg):
                est.learn_one(x, yy)
            _same_state(before, _state(est))
        with pytest.raises(ValueError, match="features"):
            est.partial_fit(X[:3, :2], y[:3])
        with pytest.raises(ValueError, match="NaN"):
            est.partial_fit(np.where(np.eye(3, 3, dtype=bool), np.nan, X[:3]), y[:3])
        _same_state(before, _state(est))


def test_torch_in_torch_out(rng):
    X, y = _data(rng, 25)
    for est in (PKAWVTaylor(), KernelAWV()):
        p = est.progressive_predict(torch.tensor(X), torch.tensor(y))
        assert torch.is_tensor(p) and p.dtype == torch.float64
        out = est.predict(torch.tensor(X[:3], dtype=torch.float32))
        assert torch.is_tensor(out) and out.dtype == torch.float32


def test_river_progressive_val_score(rng):
    river = pytest.importorskip("river")
    from river import evaluate, metrics

    X, y = _data(rng, 200)
    rows = [({f"x{j}": float(v) for j, v in enumerate(row)}, float(t)) for row, t in zip(X, y)]
    model = PKAWVTaylor(degree=3)
    metric = evaluate.progressive_val_score(rows, model, metrics.MSE())
    ours = PKAWVTaylor(degree=3).progressive_predict(X, y)
    assert metric.get() == pytest.approx(float(np.mean((ours - y) ** 2)), rel=1e-10)
    assert isinstance(model, river.base.Regressor) and model.n_rounds_ == 200


# ---- runner and baselines --------------------------------------------------------------------
def test_progressive_validation_runner(rng):
    X, y = _data(rng, 300)
    res = progressive_validation(PKAWVTaylor(degree=3), iter_chunks(X, y, 64),
                                 comparator=lambda Z: np.sin(3 * Z[:, 0]))
    direct = PKAWVTaylor(degree=3).progressive_predict(X, y)
    np.testing.assert_allclose(res.y_pred, direct, atol=1e-12)
    np.testing.assert_allclose(res.cumulative_loss, np.cumsum((y - direct) ** 2))
    np.testing.assert_allclose(res.regret, res.cumulative_loss
                               - np.cumsum((y - np.sin(3 * X[:, 0])) ** 2))
    assert res.n_rounds == 300 and (np.diff(res.elapsed) >= 0).all() and not res.truncated
    cut = progressive_validation(KernelAWV(), iter_chunks(X, y, 50), time_limit=0.0,
                                 loss="zero_one")
    assert cut.truncated and cut.n_rounds == 50
    assert set(np.unique(cut.losses)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="loss"):
        progressive_validation(KernelAWV(), iter_chunks(X, y), loss="hinge")


def test_fogd_round_is_one_gradient_step(rng):
    X, y = _data(rng, 10)
    est = FOGD(n_components=50, learning_rate=0.1).fit(X[:9], y[:9])
    w0 = est.coef_.copy()
    z = est._features(X[9:])[0]
    yhat = est.progressive_predict(X[9:], y[9:])[0]
    assert yhat == pytest.approx(z @ w0)
    np.testing.assert_allclose(est.coef_, w0 - 0.1 * 2 * (yhat - y[9]) * z)
    Z = est._features(X)
    assert np.abs(Z @ Z.T - _gauss(X, X)).max() < 0.5  # 50 frequencies: rough approximation


def test_prosnkons_restarts_and_clipping(rng):
    X, y = _data(rng, 150, 2)
    est = ProsNKONS(sigma=0.5, C=0.5, random_state=0)
    pred = est.progressive_predict(X, y)
    assert est.n_restarts_ == est.dictionary_.shape[0] > 1
    assert np.abs(pred).max() <= 0.5 + 1e-12
    assert np.abs(est.predict(X)).max() <= 0.5 + 1e-12


def test_scale_to_unit_box(rng):
    A = rng.standard_normal((500, 3)) * [1, 10, 0]
    S = scale_to_unit_box(A)
    assert S.min() >= -1 and S.max() <= 1
    np.testing.assert_allclose(S[:, :2].min(0), -1)
    np.testing.assert_allclose(S[:, :2].max(0), 1)
    assert (S[:, 2] == 0).all()
