"""Predictive variance and log marginal likelihood of the ridge estimators (GP reading)."""

import numpy as np
import pytest
import torch
from _helpers import regression_data
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF

from kernelflow.estimators import KernelRidge
from kernelflow.estimators.nystrom_ridge import NystromKernelRidge


def _data(n=60, d=3, t=None, seed=0):
    rng = np.random.RandomState(seed)
    X, y = regression_data(n, d, lambda X: np.sin(X[:, 0]) + 0.3 * X[:, 1], bounds=None, seed=rng)
    if t:
        y = np.column_stack([y * (k + 1) + k for k in range(t)])
    return X, y, rng.randn(25, d)


def _gpr(X, y, sigma, noise):
    return GaussianProcessRegressor(RBF(sigma, length_scale_bounds="fixed"), alpha=noise,
                                    optimizer=None, normalize_y=False).fit(X, y)


@pytest.mark.parametrize("noise", [1e-2, 0.5])
def test_exact_matches_sklearn_gpr(noise):
    X, y, Xt = _data()
    gp = _gpr(X, y, 1.3, noise)
    kr = KernelRidge(alpha=noise, sigma=1.3, fit_intercept=False).fit(X, y)
    m_ref, s_ref = gp.predict(Xt, return_std=True)
    m, s = kr.predict(Xt, return_std=True)
    np.testing.assert_allclose(m, m_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(s, s_ref, rtol=1e-8, atol=1e-10)
    _, c_ref = gp.predict(Xt, return_cov=True)
    _, c = kr.predict(Xt, return_cov=True)
    np.testing.assert_allclose(c, c_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(kr.log_marginal_likelihood(), gp.log_marginal_likelihood_value_,
                               rtol=1e-8)
    assert np.all(s >= 0) and np.all(np.isfinite(s))


def test_exact_multi_output_shapes_and_values():
    X, y, Xt = _data(t=2)
    gp = _gpr(X, y, 1.0, 0.1)
    kr = KernelRidge(alpha=0.1, sigma=1.0, fit_intercept=False).fit(X, y)
    m, s = kr.predict(Xt, return_std=True)
    m_ref, s_ref = gp.predict(Xt, return_std=True)
    assert m.shape == s.shape == (25, 2)
    np.testing.assert_allclose(s, np.broadcast_to(s_ref.reshape(25, -1), (25, 2)), rtol=1e-8)
    np.testing.assert_allclose(kr.log_marginal_likelihood(), gp.log_marginal_likelihood_value_,
                               rtol=1e-8)
    _, c = kr.predict(Xt, return_cov=True)
    assert c.shape == (25, 25, 2)


def test_per_target_alpha_is_per_target_noise():
    X, y, Xt = _data(t=2)
    kr = KernelRidge(alpha=[0.05, 0.5], sigma=1.0, fit_intercept=False).fit(X, y)
    _, s = kr.predict(Xt, return_std=True)
    lml = 0.0
    for j, a in enumerate([0.05, 0.5]):
        gp = _gpr(X, y[:, j], 1.0, a)
        np.testing.assert_allclose(s[:, j], gp.predict(Xt, return_std=True)[1], rtol=1e-8)
        lml += gp.log_marginal_likelihood_value_
    np.testing.assert_allclose(kr.log_marginal_likelihood(), lml, rtol=1e-8)


def test_weights_are_per_point_noise():
    X, y, Xt = _data()
    w = np.random.RandomState(1).uniform(0.5, 3.0, size=len(y))
    kr = KernelRidge(alpha=0.2, sigma=1.0, fit_intercept=False).fit(X, y, sample_weight=w)
    gp = _gpr(X, y, 1.0, 0.2 / w)
    np.testing.assert_allclose(kr.predict(Xt, return_std=True)[1],
                               gp.predict(Xt, return_std=True)[1], rtol=1e-8)
    np.testing.assert_allclose(kr.log_marginal_likelihood(), gp.log_marginal_likelihood_value_,
                               rtol=1e-8)
    # a zero weight removes the row
    w0 = w.copy()
    w0[:5] = 0.0
    kr0 = KernelRidge(alpha=0.2, sigma=1.0, fit_intercept=False).fit(X, y, sample_weight=w0)
    gp0 = _gpr(X[5:], y[5:], 1.0, 0.2 / w[5:])
    np.testing.assert_allclose(kr0.predict(Xt, return_std=True)[1],
                               gp0.predict(Xt, return_std=True)[1], rtol=1e-7)
    np.testing.assert_allclose(kr0.log_marginal_likelihood(), gp0.log_marginal_likelihood_value_,
                               rtol=1e-8)


def test_intercept_is_a_known_mean():
    X, y, Xt = _data()
    y = y + 5.0
    kr = KernelRidge(alpha=0.1, sigma=1.0).fit(X, y)
    gp = _gpr(X, y - y.mean(), 1.0, 0.1)
    m, s = kr.predict(Xt, return_std=True)
    np.testing.assert_allclose(m, gp.predict(Xt) + y.mean(), rtol=1e-8)
    np.testing.assert_allclose(s, gp.predict(Xt, return_std=True)[1], rtol=1e-8)


def test_refit_invalidates_the_factor():
    X, y, Xt = _data()
    kr = KernelRidge(alpha=0.1, sigma=1.0, fit_intercept=False).fit(X, y)
    s1 = kr.predict(Xt, return_std=True)[1]
    kr.set_params(alpha=1.0).fit(X, y)
    s2 = kr.predict(Xt, return_std=True)[1]
    np.testing.assert_allclose(s2, _gpr(X, y, 1.0, 1.0).predict(Xt, return_std=True)[1],
                               rtol=1e-8)
    assert np.all(s2 > s1)


def test_std_far_from_data_is_prior_and_torch_in_torch_out():
    X, y, _ = _data()
    kr = KernelRidge(alpha=0.1, sigma=1.0, fit_intercept=False).fit(torch.as_tensor(X), y)
    m, s = kr.predict(torch.full((2, 3), 100.0, dtype=torch.float64), return_std=True)
    assert isinstance(s, torch.Tensor)
    np.testing.assert_allclose(s.numpy(), 1.0, rtol=1e-12)


def test_refusals():
    X, y, Xt = _data()
    kr = KernelRidge(alpha=0.0, sigma=1.0).fit(X, y)
    with pytest.raises(ValueError, match="positive noise variance"):
        kr.predict(Xt, return_std=True)
    kr = KernelRidge(alpha=0.1, sigma=1.0).fit(X, y)
    with pytest.raises(ValueError, match="at most one"):
        kr.predict(Xt, return_std=True, return_cov=True)
    ny = NystromKernelRidge(n_components=10, alpha=0.1, sigma=1.0, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="compute_variance=True"):
        ny.predict(Xt, return_std=True)
    with pytest.raises(ValueError, match="compute_variance=True"):
        ny.log_marginal_likelihood()


@pytest.mark.parametrize("method", [True, "dtc", "fitc"])
@pytest.mark.parametrize("t", [None, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nystrom_all_centres_equals_exact(t, weighted, method):
    X, y, Xt = _data(n=50, t=t)
    w = np.random.RandomState(2).uniform(0.5, 2.0, len(X)) if weighted else None
    kw = dict(alpha=0.1, sigma=1.5)
    kr = KernelRidge(**kw).fit(X, y, sample_weight=w)
    ny = NystromKernelRidge(n_components=len(X), landmarks=X, compute_variance=method,
                            tol=1e-14, max_iter=500, **kw).fit(X, y, sample_weight=w)
    m, s = kr.predict(Xt, return_std=True)
    mn, sn = ny.predict(Xt, return_std=True)
    assert sn.shape == s.shape
    np.testing.assert_allclose(mn, m, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(sn, s, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ny.log_marginal_likelihood(), kr.log_marginal_likelihood(),
                               rtol=1e-7)
    c = kr.predict(Xt[:5], return_cov=True)[1]
    cn = ny.predict(Xt[:5], return_cov=True)[1]
    np.testing.assert_allclose(cn, c, rtol=1e-6, atol=1e-8)


def test_nystrom_dtc_formula_with_few_centres():
    # DTC: cov = k** - Q** + alpha k*M (K_Mn K_nM + alpha K_MM)^{-1} kM*, evidence N(y|0, Q+aI)
    X, y, Xt = _data(n=80)
    a, sig = 0.2, 1.0
    ny = NystromKernelRidge(n_components=12, alpha=a, sigma=sig, compute_variance=True,
                            fit_intercept=False, random_state=0).fit(X, y)
    C = ny.centers_.numpy()

    def k(A, B):
        return np.exp(-((A[:, None] - B[None]) ** 2).sum(-1) / (2 * sig**2))

    Kmm, Knm, Ksm = k(C, C), k(X, C), k(Xt, C)
    H = Knm.T @ Knm + a * Kmm
    var = 1.0 - np.einsum("ij,ij->i", Ksm @ np.linalg.inv(Kmm), Ksm)
    var += a * np.einsum("ij,ij->i", Ksm @ np.linalg.inv(H), Ksm)
    np.testing.assert_allclose(ny.predict(Xt, return_std=True)[1] ** 2, var, rtol=1e-6,
                               atol=1e-9)
    S = Knm @ np.linalg.solve(Kmm, Knm.T) + a * np.eye(len(X))
    _, logdet = np.linalg.slogdet(S)
    lml = -0.5 * y @ np.linalg.solve(S, y) - 0.5 * logdet - 0.5 * len(X) * np.log(2 * np.pi)
    np.testing.assert_allclose(ny.log_marginal_likelihood(), lml, rtol=1e-6)
    s = ny.predict(Xt, return_std=True)[1]
    assert np.all(np.isfinite(s)) and np.all(s >= 0)


def _fitc_dense(X, y, Xt, C, a, sig, w=None):
    """FITC by a dense GP whose training covariance is Q + diag(K - Q) + a W^{-1}."""
    def k(A, B):
        return np.exp(-((A[:, None] - B[None]) ** 2).sum(-1) / (2 * sig**2))

    Kmm_inv = np.linalg.inv(k(C, C))
    Q = k(X, C) @ Kmm_inv @ k(C, X)
    S = Q + np.diag(1.0 - np.diag(Q)) + a * np.diag(1.0 / (np.ones(len(X)) if w is None else w))
    Qsx = k(Xt, C) @ Kmm_inv @ k(C, X)  # FITC cross covariance; prior variance k** = 1
    var = 1.0 - np.einsum("ij,ji->i", Qsx, np.linalg.solve(S, Qsx.T))
    _, logdet = np.linalg.slogdet(S)
    lml = -0.5 * y @ np.linalg.solve(S, y) - 0.5 * logdet - 0.5 * len(X) * np.log(2 * np.pi)
    return var, lml, S


@pytest.mark.parametrize("weighted", [False, True])
def test_nystrom_fitc_equals_dense_fitc_gp(weighted):
    # FITC: prior Q + diag(K - Q); variance k** - Q*f (Q + diag(K - Q) + a W^-1)^-1 Qf*
    X, y, Xt = _data(n=70)
    w = np.random.RandomState(3).uniform(0.5, 2.0, len(X)) if weighted else None
    a, sig = 0.2, 1.0
    ny = NystromKernelRidge(n_components=10, alpha=a, sigma=sig, compute_variance="fitc",
                            fit_intercept=False, random_state=0).fit(X, y, sample_weight=w)
    var, lml, S = _fitc_dense(X, y, Xt, ny.centers_.numpy(), a, sig, w)
    np.testing.assert_allclose(ny.predict(Xt, return_std=True)[1] ** 2, var, rtol=1e-6,
                               atol=1e-9)
    np.testing.assert_allclose(ny.log_marginal_likelihood(), lml, rtol=1e-6)
    # the diagonal correction is exact at the training points: prior variance k(x_i, x_i)
    noise = a / (np.ones(len(X)) if w is None else w)
    np.testing.assert_allclose(np.diag(S) - noise, 1.0, rtol=1e-12)
    # ... which DTC is not: there the training prior variance q_ii falls short of k_ii
    dtc = NystromKernelRidge(n_components=10, alpha=a, sigma=sig, compute_variance="dtc",
                             fit_intercept=False, random_state=0).fit(X, y, sample_weight=w)
    assert not np.isclose(dtc.log_marginal_likelihood(), lml, rtol=1e-3)


def test_fitc_training_point_variance_and_refusal():
    # at a training point the FITC variance is that of a GP with prior variance k(x, x) there
    X, y, _ = _data(n=60)
    a, sig = 0.3, 1.2
    ny = NystromKernelRidge(n_components=8, alpha=a, sigma=sig, compute_variance="fitc",
                            fit_intercept=False, random_state=1).fit(X, y)
    var, _, _ = _fitc_dense(X, y, X[:10], ny.centers_.numpy(), a, sig)
    s = ny.predict(X[:10], return_std=True)[1]
    np.testing.assert_allclose(s**2, var, rtol=1e-6, atol=1e-9)
    assert np.all(s > 0) and np.all(s <= 1.0)  # between 0 and the prior k(x, x) = 1
    with pytest.raises(ValueError, match="compute_variance"):
        NystromKernelRidge(compute_variance="sor").fit(X, y)


# ---- learned hyperparameters: signal and noise variance ---------------------------------------


def _learned_data(n=120, seed=1):
    # a target on the scale of hundreds: the learned signal variance is far from 1
    rng = np.random.RandomState(seed)
    X = rng.randn(n, 3)
    y = 80.0 * np.sin(X[:, 0]) + 30.0 * X[:, 1] + 15.0 * rng.randn(n) + 150.0
    return X, y, rng.randn(30, 3)


@pytest.fixture(scope="module")
def learned_exact():
    X, y, Xt = _learned_data()
    return X, y, Xt, KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood").fit(
        X, y)


def test_learned_exact_is_scikit_learns_gp_at_the_learned_hyperparameters(learned_exact):
    from sklearn.gaussian_process.kernels import ConstantKernel, WhiteKernel

    X, y, Xt, kr = learned_exact
    s2, noise = kr.signal_variance_, kr.noise_variance_
    assert s2 > 100 and noise == pytest.approx(s2 * kr.alpha_, rel=1e-12)
    yc = y - y.mean()
    kernel = (ConstantKernel(s2, "fixed") * RBF(kr.sigma_, length_scale_bounds="fixed")
              + WhiteKernel(noise, "fixed"))
    gp = GaussianProcessRegressor(kernel, alpha=1e-300, optimizer=None).fit(X, yc)
    m_ref, s_ref = gp.predict(Xt, return_std=True)
    m, s = kr.predict(Xt, return_std=True)  # learned: a new observation's std, noise included
    np.testing.assert_allclose(m, m_ref + y.mean(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(s, s_ref, rtol=1e-8)
    _, c_ref = gp.predict(Xt, return_cov=True)
    np.testing.assert_allclose(kr.predict(Xt, return_cov=True)[1], c_ref, rtol=1e-8,
                               atol=1e-8 * s2)
    np.testing.assert_allclose(kr.log_marginal_likelihood(), gp.log_marginal_likelihood_value_,
                               rtol=1e-9)
    # the evidence is the maximised criterion (per-sample negative log evidence)
    assert kr.log_marginal_likelihood() == pytest.approx(-X.shape[0] * kr.hyperparameters_.value,
                                                         rel=1e-9)
    # latent std on request: the same without the noise
    _, s_lat = kr.predict(Xt, return_std=True, observation_noise=False)
    np.testing.assert_allclose(s**2 - s_lat**2, noise, rtol=1e-8)


def test_learned_signal_variance_leaves_the_mean_of_the_ridge_fit(learned_exact):
    X, y, Xt, kr = learned_exact
    fixed = KernelRidge(alpha=kr.alpha_, sigma=kr.sigma_).fit(X, y)
    np.testing.assert_array_equal(kr.predict(Xt), fixed.predict(Xt))
    assert fixed.signal_variance_ == 1.0 and fixed.noise_variance_ == kr.alpha_
    # unit-scale latent std times sqrt(s^2)
    np.testing.assert_allclose(kr.predict(Xt, return_std=True, observation_noise=False)[1],
                               np.sqrt(kr.signal_variance_) * fixed.predict(
                                   Xt, return_std=True)[1], rtol=1e-10)


def test_learned_multi_target_signal_variance_is_per_target():
    X, y, Xt = _learned_data(n=80)
    Y = np.column_stack([y, 0.01 * y])
    kr = KernelRidge(sigma=1.0, learn_hyperparameters="gcv").fit(X, Y)
    s2 = kr.signal_variance_
    assert s2.shape == (2,) and s2[0] == pytest.approx(1e4 * s2[1], rel=1e-9)
    _, s = kr.predict(Xt, return_std=True)
    np.testing.assert_allclose(s[:, 0], 100 * s[:, 1], rtol=1e-9)
    # evidence of both targets with their own scale: the sum of the single-target ones
    one = [KernelRidge(alpha=kr.alpha_, sigma=kr.sigma_).fit(X, Y[:, j]) for j in range(2)]
    for j, m in enumerate(one):
        m.signal_variance_ = float(s2[j])
    assert kr.log_marginal_likelihood() == pytest.approx(
        sum(m.log_marginal_likelihood() for m in one), rel=1e-10)


def _dense_dtc_evidence(K_nm, K_mm, y, alpha, s2):
    Q = K_nm @ torch.linalg.solve(K_mm, K_nm.T)
    C = s2 * (Q + alpha * torch.eye(Q.shape[0], dtype=Q.dtype))
    return float(torch.distributions.MultivariateNormal(torch.zeros(len(y), dtype=Q.dtype),
                                                        C).log_prob(y))


def test_learned_nystrom_variance_and_evidence_use_the_signal_variance():
    from kernelflow.kernels import Gaussian

    X, y, Xt = _learned_data(n=150)
    ny = NystromKernelRidge(n_components=40, sigma="ard", random_state=0, compute_variance=True,
                            learn_hyperparameters="nystrom_marginal_likelihood").fit(X, y)
    s2, a = ny.signal_variance_, ny.alpha_
    assert np.isfinite(ny.hyperparameters_.signal_variance) and s2 > 100
    k = Gaussian(ny.sigma_)
    C, Xs = ny.centers_, torch.as_tensor(X)
    K_nm, K_mm = k(Xs, C), k(C)
    yc = torch.as_tensor(y - y.mean())
    # the reported signal variance is the DTC profile y^T (Q + alpha I)^{-1} y / n
    Q = K_nm @ torch.linalg.solve(K_mm, K_nm.T)
    q = float(yc @ torch.linalg.solve(Q + a * torch.eye(150, dtype=F64), yc))
    assert s2 == pytest.approx(q / 150, rel=1e-6)
    assert ny.log_marginal_likelihood() == pytest.approx(
        _dense_dtc_evidence(K_nm, K_mm, yc, a, s2), rel=1e-6)
    fixed = NystromKernelRidge(n_components=40, sigma=ny.sigma_, alpha=a, random_state=0,
                               compute_variance=True).fit(X, y)
    _, s_unit = fixed.predict(Xt, return_std=True)
    _, s = ny.predict(Xt, return_std=True)
    np.testing.assert_allclose(s**2, s2 * s_unit**2 + ny.noise_variance_, rtol=1e-8)


F64 = torch.float64


@pytest.mark.parametrize("method", ["dtc", "fitc"])
def test_nystrom_variance_is_stable_at_learned_hyperparameters(method):
    # long learned bandwidths and a penalty near 1e-4 make K_MM ill-conditioned: the
    # whitened accumulation keeps the factorisation positive definite
    from sklearn.datasets import make_friedman1

    X, y = make_friedman1(n_samples=700, n_features=10, noise=1.0, random_state=0)
    X = (X - X.mean(0)) / X.std(0)
    ny = NystromKernelRidge(n_components=150, sigma="ard", random_state=0,
                            learn_hyperparameters="nystrom_marginal_likelihood",
                            compute_variance=method).fit(X[:500], y[:500])
    assert ny.alpha_ < 1e-2  # the regime where the unwhitened formula fails
    mean, std = ny.predict(X[500:], return_std=True)
    assert np.all(np.isfinite(std)) and np.all(std > 0)
    cover = np.mean(np.abs(y[500:] - mean) <= 1.96 * std)
    assert 0.88 <= cover <= 0.99
    assert np.isfinite(ny.log_marginal_likelihood())


def test_observation_noise_is_checked_and_refit_drops_learned_state(learned_exact):
    X, y, Xt, kr = learned_exact
    with pytest.raises(TypeError, match="observation_noise"):
        kr.predict(Xt, return_std=True, observation_noise="yes")
    plain = KernelRidge(sigma="ard", learn_hyperparameters="loo").fit(X, y)
    plain.set_params(learn_hyperparameters=None, sigma=1.0, alpha=0.3).fit(X, y)
    assert not hasattr(plain, "hyperparameters_") and not hasattr(plain, "alpha_")
    assert plain.signal_variance_ == 1.0 and plain.noise_variance_ == 0.3
    ref = KernelRidge(sigma=1.0, alpha=0.3).fit(X, y)
    np.testing.assert_array_equal(plain.predict(Xt, return_std=True)[1],
                                  ref.predict(Xt, return_std=True)[1])
