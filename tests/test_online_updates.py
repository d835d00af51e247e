"""Rank-one update helpers of the online learners and the KORS sampler."""

import math

import numpy as np
import pytest

from kernelflow.features.taylor import taylor_features
from kernelflow.online._updates import (
    KORS,
    GrowingCholeskyInverse,
    RecursiveAWV,
    block_inverse_append,
    chol_append,
    chol_downdate,
    chol_update,
)


def _spd(rng, m):
    A = rng.standard_normal((m + 3, m))
    return A.T @ A + 0.5 * np.eye(m)


@pytest.mark.parametrize("m", [1, 2, 7, 30])
def test_cholesky_update_and_downdate(rng, m):
    H = _spd(rng, m)
    R = np.linalg.cholesky(H).T.copy()
    x = rng.standard_normal(m)
    R1 = chol_update(R.copy(), x)
    np.testing.assert_allclose(R1.T @ R1, H + np.outer(x, x), atol=1e-10)
    assert np.allclose(R1, np.triu(R1))
    R2 = chol_downdate(R1.copy(), x)
    np.testing.assert_allclose(R2.T @ R2, H, atol=1e-10)
    np.testing.assert_allclose(R2, R, atol=1e-9)  # unique factor with a positive diagonal
    with pytest.raises(np.linalg.LinAlgError):
        chol_downdate(R.copy(), 10 * np.linalg.norm(H) * np.eye(m)[0])


@pytest.mark.parametrize("method", ["updown", "border"])
@pytest.mark.parametrize("m", [0, 1, 5, 20])
def test_cholesky_append(rng, method, m):
    H = _spd(rng, m + 1)
    R = np.linalg.cholesky(H[:m, :m]).T.copy() if m else np.zeros((0, 0))
    R_new = chol_append(R, H[:m, m], H[m, m], method=method)
    np.testing.assert_allclose(R_new.T @ R_new, H, atol=1e-9)
    assert np.allclose(R_new, np.triu(R_new))


def test_cholesky_append_updown_identity(rng):
    # u uᵀ - v vᵀ = [[0, c], [cᵀ, dd]] with g = sqrt(1 + dd), u = (c/(1+g), g), v = (c/(1+g), -1)
    c, dd = rng.standard_normal(4), 3.7
    g = math.sqrt(1 + dd)
    u, v = np.append(c / (1 + g), g), np.append(c / (1 + g), -1.0)
    target = np.zeros((5, 5))
    target[:4, 4] = target[4, :4] = c
    target[4, 4] = dd
    np.testing.assert_allclose(np.outer(u, u) - np.outer(v, v), target, atol=1e-12)


def test_block_inverse_append(rng):
    A = _spd(rng, 6)
    inv = np.zeros((0, 0))
    for k in range(6):
        inv = block_inverse_append(inv, A[:k, k], A[k, k])
        np.testing.assert_allclose(inv, np.linalg.inv(A[: k + 1, : k + 1]), rtol=1e-9, atol=1e-10)


def test_sherman_morrison_equals_batch_solve_every_round(rng):
    """Algorithm 1's state equals the batch ridge solution after every round (AWV and KRR)."""
    X = rng.uniform(-1, 1, (80, 3))
    y = rng.uniform(-1, 1, 80)
    V = taylor_features(X, sigma=1.0, M=3)
    lam = 0.7
    state = RecursiveAWV(V.shape[1], lam, refresh=10**9)
    for t in range(len(y)):
        A_prev = lam * np.eye(V.shape[1]) + V[:t].T @ V[:t]
        b_prev = V[:t].T @ y[:t]
        A = A_prev + np.outer(V[t], V[t])
        krr_expected = V[t] @ np.linalg.solve(A_prev, b_prev)
        awv_expected = V[t] @ np.linalg.solve(A, b_prev)
        pure = state.predict_batch(V[t : t + 1], awv=True)[0]
        pure_krr = state.predict_batch(V[t : t + 1], awv=False)[0]
        got = state.begin(V[t], awv=True)
        assert got == pytest.approx(awv_expected, abs=1e-11)
        assert pure == pytest.approx(awv_expected, abs=1e-11)
        assert pure_krr == pytest.approx(krr_expected, abs=1e-11)
        np.testing.assert_allclose(state.full_inverse(), np.linalg.inv(A), atol=1e-11)
        state.end(y[t])
        np.testing.assert_allclose(state.w, np.linalg.solve(A, b_prev + y[t] * V[t]), atol=1e-11)


def test_krr_prediction_of_recursive_state(rng):
    V = rng.standard_normal((30, 5)) * 0.3
    y = rng.standard_normal(30)
    state = RecursiveAWV(5, 1.0)
    for t in range(30):
        expected = V[t] @ np.linalg.solve(np.eye(5) + V[:t].T @ V[:t], V[:t].T @ y[:t])
        assert state.begin(V[t], awv=False) == pytest.approx(expected, abs=1e-12)
        state.end(y[t])


def test_growing_cholesky_inverse(rng):
    X = rng.uniform(-1, 1, (40, 2))
    y = rng.standard_normal(40)
    K = np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1))
    lam = 0.5
    G = GrowingCholeskyInverse(capacity=4)  # forces several reallocations
    for t in range(40):
        y_krr, delta2 = G.append(K[:t, t], K[t, t] + lam)
        expected = K[t, :t] @ np.linalg.solve(K[:t, :t] + lam * np.eye(t), y[:t]) if t else 0.0
        assert y_krr == pytest.approx(expected, abs=1e-11)
        s2 = K[t, t] - (K[t, :t] @ np.linalg.solve(K[:t, :t] + lam * np.eye(t), K[:t, t])
                        if t else 0.0)
        assert delta2 == pytest.approx(lam + s2, abs=1e-11)
        G.set_label(y[t])
    L = np.linalg.cholesky(K + lam * np.eye(40))
    np.testing.assert_allclose(G.Linv[:40, :40] @ L, np.eye(40), atol=1e-9)


def test_kors_first_probability_and_determinism():
    # empty dictionary: τ = (1+ε)κ/(κ+μ) -> p = 0.75 for κ = μ = 1, ε = 0.5, β = 1 (digest)
    kors = KORS(1.0, 0.5, 1.0, "inverse", np.random.RandomState(0))
    assert kors.probability(np.zeros(0), 1.0) == pytest.approx(0.75)
    draws = []
    for seed in (3, 3):
        k = KORS(1.0, 0.5, 1.0, "inverse", np.random.RandomState(seed))
        draws.append([k.step(np.zeros(0), 1.0) if k.S.size == 0 else None for _ in range(5)])
    assert draws[0] == draws[1]


def test_kors_probability_matches_explicit_formula(rng):
    X = rng.uniform(-1, 1, (12, 2))
    K = np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1))
    mu, eps, beta = 0.3, 0.5, 2.0
    for weights in ("inverse", "sqrt"):
        kors = KORS(mu, eps, beta, weights, np.random.RandomState(1))
        idx = []
        for t in range(12):
            b = K[idx, t]
            S_bar = np.append(kors.S, 1.0)
            J = idx + [t]
            Kbar = K[np.ix_(J, J)]
            s_bar = S_bar * K[J, t]
            T = np.linalg.inv(S_bar[:, None] * Kbar * S_bar[None] + mu * np.eye(len(J)))
            tau = (1 + eps) / mu * (K[t, t] - s_bar @ T @ s_bar)
            assert kors.probability(b, K[t, t]) == pytest.approx(min(max(beta * tau, 0), 1),
                                                                  abs=1e-10)
            if kors.step(b, K[t, t]):
                idx.append(t)
            S = kors.S
            expected_T = np.linalg.inv(S[:, None] * K[np.ix_(idx, idx)] * S[None]
                                       + mu * np.eye(len(idx)))
            np.testing.assert_allclose(kors.T, expected_T, atol=1e-9)


@pytest.mark.parametrize("awv", [True, False])
@pytest.mark.parametrize("block", [1, 7, 64])
def test_blocked_rounds_equal_sherman_morrison_rounds(rng, awv, block):
    V = taylor_features(rng.uniform(-1, 1, (150, 3)), M=2)
    y = rng.uniform(-1, 1, 150)
    seq, blk = RecursiveAWV(V.shape[1], 0.8), RecursiveAWV(V.shape[1], 0.8)
    p_seq = np.empty(150)
    for t in range(150):
        p_seq[t] = seq.begin(V[t], awv)
        seq.end(y[t])
    p_blk = np.empty(150)
    blk.run_blocked(V[:100], y[:100], awv, p_blk[:100], block=block)  # continues across calls
    blk.run_blocked(V[100:], y[100:], awv, p_blk[100:], block=block)
    np.testing.assert_allclose(p_blk, p_seq, atol=1e-12)
    np.testing.assert_allclose(blk.full_inverse(), seq.full_inverse(), atol=1e-12)
    np.testing.assert_allclose(blk.w, seq.w, atol=1e-12)
    # and each prediction is the batch ridge solve on the rounds before it
    for t in (0, 63, 64, 149):
        A = 0.8 * np.eye(V.shape[1]) + V[: t + awv].T @ V[: t + awv]
        assert p_blk[t] == pytest.approx(V[t] @ np.linalg.solve(A, V[:t].T @ y[:t]), abs=1e-11)
