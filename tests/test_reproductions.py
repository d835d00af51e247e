"""Core functions of the reproduction scripts, at tiny sizes, asserting real properties."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mathur_cssp_factor_is_at_least_one_and_greedy_beats_uniform():
    from sklearn.datasets import load_breast_cancer

    mod = _load("repro_mathur")
    X = load_breast_cancer().data[:200]
    X = (X - X.mean(0)) / X.std(0)
    res = mod.cssp_factors(X, [5], selectors=["uniform", "greedy", "continuous"], trials=3)
    for s in res:
        assert all(v >= 1 - 1e-9 for v in res[s][5])  # no k columns beat the best rank k
    assert res["greedy"][5][0] < np.mean(res["uniform"][5])
    assert np.median(res["continuous"][5]) < np.mean(res["uniform"][5])


def test_mathur_nystrom_residual_matches_direct_projection():
    mod = _load("repro_mathur")
    rng = np.random.default_rng(0)
    A = rng.standard_normal((30, 8))
    K = A @ A.T
    idx = np.array([0, 3, 7])
    tr, fro2 = mod.nystrom_residual(K, idx)
    # K = A A^T: the Nystrom residual is A (I - P) A^T with P the projector on the rows A[idx]
    Q, _ = np.linalg.qr(A[idx].T)
    R = A @ (np.eye(8) - Q @ Q.T) @ A.T
    assert tr == pytest.approx(np.trace(R), rel=1e-9)
    assert fro2 == pytest.approx((R**2).sum(), rel=1e-9)


def test_mathur_relaxed_objective_at_corners_is_the_nystrom_error_plus_penalty():
    import torch

    from kernelflow.kernels import Gaussian
    from kernelflow.landmarks import ContinuousSelector

    mod = _load("repro_mathur")
    X = torch.as_tensor(np.random.default_rng(1).standard_normal((60, 2)))
    ker = Gaussian(1.0)
    K = ker(X, X)
    res = ContinuousSelector(max_iter=60).run(X, ker, 5, random_state=0)
    greedy = np.array([0, 10, 20, 30, 40])
    out = mod.relaxed_check(K, res, greedy, delta=0.1)
    # Lemma 2.6: at a binary s, g_lam(s) = ||K - K_s||_F^2 + lam |s| for any delta
    assert out["g_cont"] == pytest.approx(mod._frob2(K, res.support) + 5 * res.lam, rel=1e-8)
    assert out["g_greedy"] == pytest.approx(mod._frob2(K, greedy) + 5 * res.lam, rel=1e-8)
    assert out["sum_t"] == pytest.approx(float(res.t.sum()))


def test_dai_averaged_error_decreases_near_one_over_t():
    mod = _load("repro_dai")
    t, e, ea, slope = mod.rate_curve(n=256, iters=64, batch=32)
    assert ea[-1] < ea[0] / 4
    assert slope < -0.7  # the O(1/t) rate (or faster on this finite set)


def test_dai_races_share_batches_and_clock_training():
    mod = _load("repro_dai")
    seen, err, secs, refs = mod.regression_race(n=256, iters=16, batch=32, components=(32,),
                                                block=32)
    assert list(err) == ["doubly SGD", "RFF r=32", "Nystrom r=32"]
    assert seen.tolist() == [128, 256, 512]
    for k in err:
        assert len(err[k]) == len(seen) and np.all(np.diff(secs[k]) >= 0)
    assert err["doubly SGD"][-1] < err["doubly SGD"][0]
    assert err["doubly SGD"][-1] < np.var(mod.make_doubly_stochastic_regression(
        2000, random_state=2)[1])  # better than the constant predictor
    assert set(refs) == {"exact KRR", "Nystrom KRR m=32"}
    seen, err, secs, refs = mod.classification_race(n=512, iters=8, batch=64, components=(32,),
                                                    block=32)
    assert seen.tolist() == [256, 512]
    assert all(0 <= e <= 1 for v in err.values() for e in v)
    assert err["doubly SGD"][-1] < 0.45  # two balanced classes: chance is 0.5


def test_dai_gp_posterior_approaches_the_exact_gp():
    mod = _load("repro_dai")
    gp = mod.gp_curves(n=256, n_test=16, iters=64, block=64)
    assert gp["t"].tolist() == [16, 32, 64]
    assert gp["mean_err"][-1] < gp["mean_err"][0]
    assert gp["var_err"][-1] < gp["var_err"][0]
    assert gp["mean_err"][-1] < 0.1 * np.var(gp["y"])


def test_jezequel_pkawv_learns_and_batch_improves_with_prefix():
    from kernelflow.datasets._online import load_online_stream

    mod = _load("repro_jezequel")
    X, y = load_online_stream("flights", n=1600, shuffle=True)
    curves = mod.online_curves(X[:1000], y[:1000], degrees=(2,), which={"PKAWV-Taylor M=2"})
    c = curves["PKAWV-Taylor M=2"]
    majority = min(np.mean(y[:1000] == 1), np.mean(y[:1000] == -1))
    assert c.rounds == 1000 and not c.truncated
    assert c.average[-1] < majority - 0.05  # better than the majority class
    assert np.all(np.diff(c.elapsed) >= 0)
    rows = mod.batch_curve(X, y, [200, 1000], n_components=100, horizon=600)
    assert len(rows) == 2 and rows[1][2] < majority


def test_jezequel_every_paper_learner_runs_and_exact_krr_paths_agree():
    from kernelflow.datasets._online import load_online_stream

    mod = _load("repro_jezequel")
    X, y = load_online_stream("flights", n=300, shuffle=True)
    curves = mod.online_curves(X, y, degrees=(2, 3, 4))
    assert set(curves) == {"PKAWV-Taylor M=2", "PKAWV-Taylor M=3", "PKAWV-Taylor M=4",
                           "PKAWV-Nystrom (KORS)", "FOGD D=1000", "Pros-N-KONS", mod.KRR}
    assert all(c.rounds == 300 and np.all(np.isin(c.losses, (0.0, 1.0)))
               for c in curves.values())
    # the incremental exact learner and the one-Cholesky predictions make the same mistakes
    chol, _ = mod.exact_krr_curve(X, y)
    np.testing.assert_array_equal(curves[mod.KRR].losses, chol.losses)
    assert chol.elapsed is None


def test_jezequel_equal_time_rows_take_the_state_reached_within_the_time():
    mod = _load("repro_jezequel")
    losses = np.array([1.0, 0.0, 0.0, 1.0])
    c = mod.Curve(losses, np.cumsum(losses) / np.arange(1, 5), np.array([0.1, 0.2, 0.5, 2.0]))
    assert c.at_time(0.05)[0] == 0 and np.isnan(c.at_time(0.05)[1])
    assert c.at_time(0.5) == (3, pytest.approx(1 / 3))
    assert c.recent(2) == 0.5
    batch = [(100, 0.3, 0.4), (1000, 1.5, 0.2), (10000, 20.0, 0.1)]
    rows = dict(mod.equal_time_rows({"online": c}, {"batch": batch}, [0.2, 2.0, 30.0]))
    assert rows["online"] == [(2, 0.5), (4, 0.5), (4, 0.5)]
    assert rows["batch"][0][0] == 0 and rows["batch"][1:] == [(1000, 0.2), (10000, 0.1)]
