"""Doubly stochastic functional gradients: Eq. 7 closed form, Lemma 8, O(1/t), losses, GP."""

import numpy as np
import pytest
import torch
from _helpers import torch_regression_data

import kernelflow.solvers.doubly_stochastic as ds
from kernelflow.features.random import random_features
from kernelflow.kernels import Gaussian
from kernelflow.solvers.doubly_stochastic import (
    DoublyStochasticModel,
    StepSchedule,
    gp_posterior,
    iterate_weights,
)
from kernelflow.solvers.losses import LOSSES, get_loss

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n=32, d=2, seed=0):
    return torch_regression_data(n, d, lambda X: torch.sin(2 * X[:, 0]) * torch.cos(X[:, -1]),
                                 seed=seed)


def _run_recording(model, X, y, batches):
    """Run the model and record g_i = (1/b) Σ l'(f_i(x), y) Φ_i(x) from regenerated features."""
    grads = []
    for idx in batches:
        Xb, yb = X[idx], y[idx, None]
        F = model.decision_function(Xb)
        G = model.loss.derivative(F, yb)
        Phi = random_features(model.kernel, Xb, model.seed, model.n_blocks, model.block_size)
        grads.append(Phi.T @ G / len(idx))
        model.step(Xb, yb)
    return grads


def test_closed_form_theta_nu_one_every_weight_is_minus_theta_over_t():
    X, y = _data()
    nu, theta = 0.25, 4.0  # theta * nu = 1
    m = DoublyStochasticModel(Gaussian(0.7), 2, 1, alpha=nu, block_size=4, seed=3,
                              schedule=StepSchedule("inverse", eta0=theta))
    g = torch.Generator().manual_seed(1)
    T = 25
    grads = _run_recording(m, X, y, [torch.randint(0, 32, (3,), generator=g) for _ in range(T)])
    coef = m.coef.reshape(T, 4, 1)
    for i in range(T):
        torch.testing.assert_close(coef[i], -theta / T * grads[i], rtol=1e-10, atol=1e-13)
    a = iterate_weights([theta / t for t in range(1, T + 1)], nu)
    torch.testing.assert_close(a, torch.full((T,), -theta / T, dtype=F64))


@pytest.mark.parametrize("schedule,nu", [
    (StepSchedule("inverse_scaling", eta0=0.8, decay=0.3), 0.05),
    (StepSchedule("constant", eta0=0.9), 1.0),  # factor 0.1: the lazy scale is renormalised
    (StepSchedule("inverse", eta0=6.0), 0.5),  # theta nu = 3: factors <= 0 early on
])
def test_coefficients_match_eq7(schedule, nu):
    X, y = _data(seed=2)
    m = DoublyStochasticModel(Gaussian(0.9), 2, 1, alpha=nu, block_size=6, seed=5,
                              schedule=schedule)
    g = torch.Generator().manual_seed(4)
    T = 20
    grads = _run_recording(m, X, y, [torch.randint(0, 32, (4,), generator=g) for _ in range(T)])
    a = iterate_weights([schedule(t) for t in range(1, T + 1)], nu)
    coef = m.coef.reshape(T, 6, 1)
    for i in range(T):
        torch.testing.assert_close(coef[i], a[i] * grads[i], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("theta_nu", [1.0, 1.5, 2.0, 2.5, 3.0])
def test_lemma8_weights_bounded_by_theta_over_t(theta_nu):
    theta, t = 2.0, 400
    a = iterate_weights([theta / j for j in range(1, t + 1)], theta_nu / theta)
    assert float(a.abs().max()) <= theta / t * (1 + 1e-12)
    if float(theta_nu).is_integer():
        assert torch.all(a[: int(theta_nu) - 1] == 0)


def test_lemma8_violated_for_small_theta_nu():
    theta, t = 2.0, 400
    a = iterate_weights([theta / j for j in range(1, t + 1)], 0.5 / theta)
    assert float(a.abs().max()) > 10 * theta / t


def test_error_to_exact_krr_decreases_at_rate_one_over_t():
    # digest §5.4 (5): small KRR, theta nu = 1, averaged over streams; fit the log-log slope
    n, nu, theta = 32, 0.1, 10.0
    X, y = _data(n, d=1, seed=0)
    k = Gaussian(0.7)
    K = k(X)
    f_star = K @ torch.linalg.solve(K + n * nu * torch.eye(n, dtype=F64), y)
    checkpoints = [32, 64, 128, 256, 512]
    errs = np.zeros((6, len(checkpoints)))
    for s in range(6):
        m = DoublyStochasticModel(k, 1, 1, alpha=nu, block_size=8, seed=s,
                                  schedule=StepSchedule("inverse", eta0=theta))
        g = torch.Generator().manual_seed(100 + s)
        c = 0
        for t in range(1, checkpoints[-1] + 1):
            idx = torch.randint(0, n, (4,), generator=g)
            m.step(X[idx], y[idx, None])
            if t == checkpoints[c]:
                errs[s, c] = float(((m.decision_function(X)[:, 0] - f_star) ** 2).mean())
                c += 1
    slope = np.polyfit(np.log(checkpoints), np.log(errs.mean(0)), 1)[0]
    assert slope < -0.8, slope
    assert errs.mean(0)[-1] < 1e-3


def test_preconditioned_first_step_is_block_ridge():
    X, y = _data(20)
    lam, nu, gamma = 0.3, 0.01, 0.7
    m = DoublyStochasticModel(Gaussian(1.0), 2, 1, alpha=nu, block_size=8, seed=1,
                              precondition=lam, schedule=StepSchedule("constant", eta0=gamma))
    m.step(X, y[:, None])
    Phi = random_features(m.kernel, X, 1, 0, 8)
    H = Phi.T @ Phi / 20
    H = H + (lam * H.diagonal().mean() + nu) * torch.eye(8, dtype=F64)
    expected = -gamma * torch.linalg.solve(H, Phi.T @ (-y[:, None]) / 20)
    torch.testing.assert_close(m.coef, expected)


def test_averaged_iterate_is_mean_of_iterates():
    X, y = _data(24)
    m = DoublyStochasticModel(Gaussian(1.0), 2, 1, alpha=0.05, block_size=4, seed=0,
                              average=True, fit_intercept=True)
    Xt = X[:5]
    preds = []
    for t in range(6):
        m.step(X[4 * t: 4 * t + 4], y[4 * t: 4 * t + 4, None])
        preds.append(m.decision_function(Xt))
    torch.testing.assert_close(m.decision_function(Xt, averaged=True),
                               torch.stack(preds).mean(0))


def test_max_blocks_caps_memory_and_revisits():
    X, y = _data(40)
    m = DoublyStochasticModel(Gaussian(1.0), 2, 1, block_size=4, seed=0, max_blocks=3)
    for t in range(10):
        m.step(X[4 * t: 4 * t + 4], y[4 * t: 4 * t + 4, None])
    assert m.n_blocks == 3 and m.coef.shape == (12, 1)


def test_sums_go_through_all_reduce(monkeypatch):
    # two identical shards (a simulated world of 2) must take exactly the single-process step
    X, y = _data(16)
    ref = DoublyStochasticModel(Gaussian(1.0), 2, 1, block_size=4, seed=0, precondition=0.1)
    for _ in range(3):
        ref.step(X, y[:, None])
    calls = []

    def doubled(tensor):
        calls.append(tensor.numel())
        return tensor.mul_(2.0)

    monkeypatch.setattr(ds, "all_reduce_sum", doubled)
    m = DoublyStochasticModel(Gaussian(1.0), 2, 1, block_size=4, seed=0, precondition=0.1)
    for _ in range(3):
        m.step(X, y[:, None])
    assert len(calls) == 3
    torch.testing.assert_close(m.coef, ref.coef)


def test_prediction_is_batch_invariant_and_state_roundtrips():
    X, y = _data(50)
    m = DoublyStochasticModel(Gaussian(1.0), 2, 1, block_size=8, seed=9, cache_bytes=0)
    for t in range(5):
        m.step(X[10 * t: 10 * t + 10], y[10 * t: 10 * t + 10, None])
    full = m.decision_function(X)
    parts = torch.cat([m.decision_function(X[i: i + 7]) for i in range(0, 50, 7)])
    torch.testing.assert_close(full, parts)
    m2 = DoublyStochasticModel(Gaussian(1.0), 2, 1, block_size=8, seed=9).load_state(m.state())
    torch.testing.assert_close(m2.decision_function(X), full)


def test_divergence_raises():
    X, y = _data(16)
    m = DoublyStochasticModel(Gaussian(1.0), 2, 1, block_size=4, seed=0, alpha=0.0,
                              schedule=StepSchedule("constant", eta0=1e300))
    with pytest.raises(FloatingPointError, match="diverged"):
        for _ in range(5):
            m.step(X, 1e10 * y[:, None])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_derivatives_match_finite_differences(name):
    loss = get_loss(name, epsilon=0.3, quantile=0.7)
    g = torch.Generator().manual_seed(0)
    C = 3 if name == "softmax" else 1
    u = torch.randn(50, C, generator=g, dtype=F64) * 2
    if name == "softmax":
        y = torch.nn.functional.one_hot(torch.randint(0, C, (50,), generator=g), C).to(F64)
    elif loss.is_classification:
        y = torch.where(torch.rand(50, 1, generator=g) < 0.5, -1.0, 1.0).to(F64)
    else:
        y = torch.randn(50, C, generator=g, dtype=F64)
    h = 1e-6
    num = torch.zeros_like(u)
    for c in range(C):
        e = torch.zeros_like(u)
        e[:, c] = h
        num[:, c] = (loss.value(u + e, y) - loss.value(u - e, y)) / (2 * h)
    ana = loss.derivative(u, y)
    # ignore points within h of a kink of the non-smooth losses
    kinks = {"hinge": 1 - y * u, "squared_hinge": 1 - y * u, "huber": (u - y).abs() - 0.3,
             "epsilon_insensitive": (u - y).abs() - 0.3, "absolute_error": u - y,
             "quantile": u - y, "novelty": u - y}
    ok = (kinks[name].abs() > 1e-4) if name in kinks else torch.ones_like(u, dtype=torch.bool)
    assert ok.float().mean() > 0.9
    torch.testing.assert_close(ana[ok], num[ok], rtol=1e-5, atol=1e-6)


def test_novelty_offset_tracks_the_nu_quantile():
    X, _ = _data(400, seed=3)
    nu = 0.2
    m = DoublyStochasticModel(Gaussian(1.0), 2, 1, loss="novelty", alpha=nu, block_size=16,
                              seed=0, schedule=StepSchedule("inverse_scaling", decay=0.05))
    g = torch.Generator().manual_seed(0)
    for _ in range(800):
        idx = torch.randint(0, 400, (32,), generator=g)
        m.step(X[idx], torch.zeros(32, 1, dtype=F64))
    frac_out = float((m.decision_function(X)[:, 0] < m.offset).double().mean())
    assert abs(frac_out - nu) < 0.05, frac_out


def test_gp_posterior_matches_closed_form():
    n, sigma2 = 48, 0.1
    X, y = _data(n, d=1, seed=4)
    Xs = torch.linspace(-1.5, 1.5, 5, dtype=F64)[:, None]
    k = Gaussian(0.6)
    A = k(X) + sigma2 * torch.eye(n, dtype=F64)
    Ks = k(X, Xs)
    mean_exact = Ks.T @ torch.linalg.solve(A, y)
    var_exact = 1.0 - (Ks * torch.linalg.solve(A, Ks)).sum(0)
    mean, var = gp_posterior(k, X, y, Xs, noise_variance=sigma2, n_iter=300, batch_size=48,
                             block_size=128, schedule=StepSchedule("constant", eta0=1.0))
    assert float((mean - mean_exact).abs().max()) < 0.1
    assert float((var - var_exact).abs().max()) < 0.05
    assert float(var_exact.min()) < 0.05 and float(var.max()) < 0.25
