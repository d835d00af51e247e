"""Hyperparameters learned by gradient: criteria, their gradients, the optimiser, the options."""

import math

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from kernelflow.estimators import KernelRidge, KernelRidgeCV, NystromKernelRidge
from kernelflow.hyperparameters import (
    krr_gcv_error,
    krr_loo_error,
    krr_negative_log_marginal_likelihood,
    learn_hyperparameters,
    nystrom_negative_log_marginal_likelihood,
    nystrom_validation_error,
)
from kernelflow.kernels import Gaussian, Laplace, Linear, Matern, Scaled

F64 = torch.float64


def _problem(n=40, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=F64)
    return X, (y - y.mean()).reshape(-1, 1)


def _criteria(X, Y, C, kernel_of):
    n_tr = X.shape[0] - 10
    return {
        "marginal_likelihood": lambda p, a: krr_negative_log_marginal_likelihood(
            kernel_of(p)(X), Y, a),
        "loo": lambda p, a: krr_loo_error(kernel_of(p)(X), Y, a),
        "gcv": lambda p, a: krr_gcv_error(kernel_of(p)(X), Y, a),
        "validation": lambda p, a: nystrom_validation_error(
            kernel_of(p)(X[:n_tr], C), kernel_of(p)(C), kernel_of(p)(X[n_tr:], C), Y[:n_tr],
            Y[n_tr:], a),
        "nystrom_marginal_likelihood": lambda p, a: nystrom_negative_log_marginal_likelihood(
            kernel_of(p)(X, C), kernel_of(p)(C), kernel_of(p).diag(X), Y, a),
    }


KERNEL_OF = {
    "gaussian-ard": (lambda p: Gaussian(p[:3].exp()), [0.1, -0.2, 0.4]),
    "matern-ard": (lambda p: Matern(p[:3].exp(), nu=2.5), [0.1, -0.2, 0.4]),
    "laplace": (lambda p: Laplace(p[0].exp()), [0.3]),
    "composite": (lambda p: Gaussian(p[0].exp()) + Scaled(Linear(), p[1].exp()), [0.2, -1.0]),
}


def _five_point_gradient(value, theta, h=1e-3):
    """Central differences of ``value`` at ``theta`` on five points: truncation O(h^4)."""
    fd = torch.empty_like(theta)
    with torch.no_grad():
        for i in range(theta.numel()):
            e = torch.zeros_like(theta)
            e[i] = h
            fd[i] = (8 * (value(theta + e) - value(theta - e))
                     - (value(theta + 2 * e) - value(theta - 2 * e))) / (12 * h)
    return fd


@pytest.mark.parametrize("name", list(KERNEL_OF))
@pytest.mark.parametrize(
    "criterion", ["marginal_likelihood", "loo", "gcv", "validation", "nystrom_marginal_likelihood"]
)
def test_gradients_match_finite_differences(criterion, name):
    X, Y = _problem()
    C = X[::3]
    kernel_of, p0 = KERNEL_OF[name]
    f = _criteria(X, Y, C, kernel_of)[criterion]
    theta = torch.tensor(p0 + [math.log(0.05)], dtype=F64, requires_grad=True)

    def value(t):
        return f(t[:-1], t[-1].exp())

    value(theta).backward()
    grad = theta.grad.clone()
    torch.testing.assert_close(grad, _five_point_gradient(value, theta), rtol=1e-6, atol=1e-9)


def test_loo_criterion_is_the_brute_force_leave_one_out_error():
    X, Y = _problem(n=25)
    K = Gaussian(0.7)(X)
    errs = []
    for i in range(25):
        keep = torch.arange(25) != i
        c = torch.linalg.solve(K[keep][:, keep] + 0.1 * torch.eye(24, dtype=F64), Y[keep])
        errs.append(float((K[i, keep] @ c - Y[i]) ** 2))
    assert math.isclose(float(krr_loo_error(K, Y, 0.1)), np.mean(errs), rel_tol=1e-10)


def test_gcv_criterion_is_the_hat_matrix_formula():
    X, Y = _problem(n=25)
    K = Gaussian(0.7)(X)
    H = K @ torch.linalg.inv(K + 0.1 * torch.eye(25, dtype=F64))
    R = Y - H @ Y
    expected = 25 * float((R * R).sum()) / float(torch.trace(torch.eye(25, dtype=F64) - H)) ** 2
    assert math.isclose(float(krr_gcv_error(K, Y, 0.1)), expected, rel_tol=1e-10)


def test_marginal_likelihood_equals_scikit_learn_with_the_profiled_amplitude():
    X, Y = _problem(n=30)
    sigma, alpha = 0.6, 0.05
    K = Gaussian(sigma)(X)
    A = K + alpha * torch.eye(30, dtype=F64)
    s2 = float(Y[:, 0] @ torch.linalg.solve(A, Y[:, 0])) / 30
    kern = ConstantKernel(s2, "fixed") * RBF(sigma, "fixed") + WhiteKernel(alpha * s2, "fixed")
    gp = GaussianProcessRegressor(kern, alpha=0.0, optimizer=None).fit(X.numpy(), Y[:, 0].numpy())
    ours = float(krr_negative_log_marginal_likelihood(K, Y, alpha))
    assert math.isclose(ours, -gp.log_marginal_likelihood_value_ / 30, rel_tol=1e-10)


def test_nystrom_criteria_with_all_points_as_centres_are_exact():
    X, Y = _problem(n=30)
    k = Gaussian([0.5, 1.0, 2.0])
    a = nystrom_negative_log_marginal_likelihood(k(X, X), k(X), k.diag(X), Y, 0.05)
    b = krr_negative_log_marginal_likelihood(k(X), Y, 0.05)
    assert math.isclose(float(a), float(b), rel_tol=1e-8)


def _irrelevant(n=120, n_noise=4, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-2, 2, size=(2 * n, 1 + n_noise))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(2 * n)
    return X[:n], y[:n], X[n:], y[n:]


@pytest.mark.parametrize("criterion", ["marginal_likelihood", "loo", "gcv"])
def test_learned_ard_beats_the_defaults_with_irrelevant_features(criterion):
    X, y, Xt, yt = _irrelevant()
    learned = KernelRidge(sigma="ard", learn_hyperparameters=criterion).fit(X, y)
    default = KernelRidgeCV().fit(X, y)
    assert learned.score(Xt, yt) > default.score(Xt, yt) + 0.05
    assert learned.score(Xt, yt) > 0.95
    assert np.all(learned.sigma_[0] < learned.sigma_[1:])


@pytest.mark.parametrize("criterion", ["validation", "nystrom_marginal_likelihood"])
def test_learned_nystrom_beats_the_default_with_irrelevant_features(criterion):
    X, y, Xt, yt = _irrelevant(n=150)
    kw = dict(n_components=40, random_state=0)
    learned = NystromKernelRidge(sigma="ard", learn_hyperparameters=criterion, **kw).fit(X, y)
    default = NystromKernelRidge(alpha=1e-2, **kw).fit(X, y)
    assert learned.score(Xt, yt) > default.score(Xt, yt) + 0.05
    assert learned.sigma_.shape == (5,) and learned.alpha_ > 0


def test_learned_values_are_fitted_attributes_and_params_stay():
    X, y, _, _ = _irrelevant(n=60, n_noise=1)
    model = KernelRidge(alpha=0.3, sigma="ard", learn_hyperparameters="gcv")
    pipe = make_pipeline(StandardScaler(), model).fit(X, y)
    fitted = pipe[-1]
    assert fitted.alpha == 0.3 and fitted.sigma == "ard"
    assert fitted.alpha_ != 0.3 and isinstance(fitted.sigma_, np.ndarray)
    assert np.array_equal(fitted.kernel_.sigma, fitted.sigma_)
    assert not hasattr(clone(fitted), "alpha_")
    # refitting with the learned values as fixed parameters gives the same predictions
    fixed = KernelRidge(alpha=fitted.alpha_, sigma=fitted.sigma_).fit(pipe[0].transform(X), y)
    np.testing.assert_allclose(fixed.predict(pipe[0].transform(X)), pipe.predict(X), rtol=1e-10)


def test_scalar_bandwidth_stays_scalar_and_composites_learn_their_scales():
    X, y, Xt, yt = _irrelevant(n=60, n_noise=0)
    model = KernelRidge(learn_hyperparameters="marginal_likelihood").fit(X, y)
    assert isinstance(model.sigma_, float)
    k = Gaussian(1.0) + 1.0 * Linear()
    model = KernelRidge(kernel=k, learn_hyperparameters="loo").fit(X, y)
    assert model.kernel_.k2.scale != 1.0 and model.kernel_.k1.sigma != 1.0
    assert k.k2.scale == 1.0  # the given kernel is not mutated
    assert model.sigma_ is None and model.score(Xt, yt) > 0.9


def test_hostile_inputs_are_refused():
    X, Y = _problem(n=20)
    with pytest.raises(ValueError, match="criterion"):
        learn_hyperparameters(X, Y, Gaussian(1.0), criterion="bogus")
    with pytest.raises(ValueError, match="centres"):
        learn_hyperparameters(X, Y, Gaussian(1.0), criterion="validation")
    Xn = X.clone()
    Xn[0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        learn_hyperparameters(Xn, Y, Gaussian(1.0))
    with pytest.raises(ValueError, match="Nothing to learn"):
        learn_hyperparameters(X, Y, Linear(), learn_alpha=False)
    with pytest.raises(ValueError, match="alpha"):
        learn_hyperparameters(X, Y, Gaussian(1.0), alpha=-1.0)
    with pytest.raises(ValueError, match="sample_weight"):
        KernelRidge(learn_hyperparameters="loo").fit(X.numpy(), Y[:, 0].numpy(),
                                                     sample_weight=np.ones(20))
    with pytest.raises(ValueError, match="learn_hyperparameters"):
        KernelRidge(learn_hyperparameters="validation").fit(X.numpy(), Y[:, 0].numpy())
    with pytest.raises(ValueError, match="learn_hyperparameters"):
        NystromKernelRidge(learn_hyperparameters="loo").fit(X.numpy(), Y[:, 0].numpy())


def test_fixed_alpha_is_kept_and_bounds_hold():
    X, Y = _problem(n=30)
    res = learn_hyperparameters(X, Y, Gaussian([1.0, 1.0, 1.0]), alpha=0.07, learn_alpha=False,
                                sigma_bounds=(0.5, 2.0), n_restarts=2)
    assert res.alpha == 0.07
    ref = float(torch.cdist(X, X)[torch.triu_indices(30, 30, 1).unbind()].median())
    assert np.all(res.kernel.sigma >= 0.5 * ref * (1 - 1e-9))
    assert np.all(res.kernel.sigma <= 2.0 * ref * (1 + 1e-9))
    assert len(res.values) == 2 and res.value == min(res.values)


def test_learned_model_file_round_trip(tmp_path):
    from kernelflow.io import load_model, save_model

    X, y, Xt, _ = _irrelevant(n=50, n_noise=1)
    model = KernelRidge(sigma="ard", learn_hyperparameters="gcv").fit(X, y)
    loaded = load_model(save_model(model, tmp_path / "learned.npz"))
    np.testing.assert_array_equal(loaded.predict(Xt), model.predict(Xt))
    np.testing.assert_array_equal(loaded.sigma_, model.sigma_)
    assert loaded.alpha_ == model.alpha_


@pytest.mark.parametrize("p0", [[0.1, -0.2, 0.4], [0.3]])
@pytest.mark.parametrize("criterion", ["marginal_likelihood", "loo", "gcv"])
def test_closed_form_gaussian_bandwidth_gradient_matches_finite_differences(criterion, p0):
    from kernelflow.solvers.hyperparameters import _gram

    X, Y = _problem()
    X = X + 3.0  # off-centre inputs: the closed form centres them
    f = {"marginal_likelihood": krr_negative_log_marginal_likelihood, "loo": krr_loo_error,
         "gcv": krr_gcv_error}[criterion]
    theta = torch.tensor(p0 + [math.log(0.05)], dtype=F64, requires_grad=True)

    def value(t):
        s = t[:-1].exp() if len(p0) > 1 else t[0].exp()
        return f(_gram(Gaussian(s), X), Y, t[-1].exp())

    value(theta).backward()
    grad = theta.grad.clone()
    torch.testing.assert_close(grad, _five_point_gradient(value, theta), rtol=1e-6, atol=1e-9)
    # the same values and gradient as autograd through the kernel
    t2 = theta.detach().clone().requires_grad_(True)
    s2 = t2[:-1].exp() if len(p0) > 1 else t2[0].exp()
    f(Gaussian(s2)(X), Y, t2[-1].exp()).backward()
    torch.testing.assert_close(theta.grad, t2.grad, rtol=1e-10, atol=1e-13)
    s3 = (theta.detach()[:-1] if len(p0) > 1 else theta.detach()[0]).exp().requires_grad_(True)
    assert torch.equal(_gram(Gaussian(s3), X), Gaussian(s3.detach())(X))


@pytest.mark.parametrize("criterion", ["marginal_likelihood", "loo", "gcv"])
def test_reported_value_and_signal_variance_are_those_of_the_learned_parameters(criterion):
    X, y, _, _ = _irrelevant(n=80, n_noise=2)
    Xs, Y = torch.as_tensor(X), torch.as_tensor(y - y.mean()).reshape(-1, 1)
    res = learn_hyperparameters(Xs, Y, Gaussian([1.0] * 3), criterion=criterion)
    f = {"marginal_likelihood": krr_negative_log_marginal_likelihood, "loo": krr_loo_error,
         "gcv": krr_gcv_error}[criterion]
    K = res.kernel(Xs)
    assert res.value == pytest.approx(float(f(K, Y, res.alpha)), rel=1e-12)
    if criterion == "marginal_likelihood":
        A = K + res.alpha * torch.eye(80, dtype=F64)
        s2 = float(Y[:, 0] @ torch.linalg.solve(A, Y[:, 0])) / 80
        assert res.signal_variance == pytest.approx(s2, rel=1e-10)


def _smooth_noise_free(n=150, seed=3):
    # a smooth target with a little noise: the learned penalty falls far below the float32
    # search's floor, so the search changes precision on the way
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=F64) * 4 - 2
    y = torch.sin(2 * X[:, 0]) * torch.cos(X[:, 1]) + 1e-3 * torch.randn(n, generator=g,
                                                                        dtype=F64)
    return X, (y - y.mean()).reshape(-1, 1)


@pytest.mark.parametrize("criterion", ["marginal_likelihood", "loo", "gcv"])
@pytest.mark.parametrize("problem", ["irrelevant", "smooth"])
def test_float32_search_ends_at_a_float64_optimum(criterion, problem):
    """The float32 search (screening and L-BFGS on float32 kernels, float64 below the penalty
    floor and for the last iterations) reaches the float64 search's optimum: the reported value
    is the float64 criterion of the returned parameters, its float64 gradient is small, and it
    is no worse than the float64 search's by more than the stopping tolerance."""
    from kernelflow.solvers.hyperparameters import _FLOAT32_MIN_ALPHA

    if problem == "irrelevant":
        X, y, _, _ = _irrelevant(n=120, n_noise=2)
        X, Y = torch.as_tensor(X), torch.as_tensor(y - y.mean()).reshape(-1, 1)
    else:
        X, Y = _smooth_noise_free()
    d = X.shape[1]
    f = {"marginal_likelihood": krr_negative_log_marginal_likelihood, "loo": krr_loo_error,
         "gcv": krr_gcv_error}[criterion]
    res64 = learn_hyperparameters(X, Y, Gaussian([1.0] * d), criterion=criterion,
                                  search_dtype="float64")
    res32 = learn_hyperparameters(X, Y, Gaussian([1.0] * d), criterion=criterion,
                                  search_dtype="float32")
    auto = learn_hyperparameters(X, Y, Gaussian([1.0] * d), criterion=criterion)
    assert auto.value == res32.value and np.array_equal(auto.kernel.sigma, res32.kernel.sigma)
    if problem == "smooth":
        assert res32.alpha < _FLOAT32_MIN_ALPHA  # the search changed precision on the way
    assert res32.value == pytest.approx(float(f(res32.kernel(X), Y, res32.alpha)), rel=1e-12)
    tol = 1e-4 if criterion == "marginal_likelihood" else 1e-6
    scale = 1.0 if criterion == "marginal_likelihood" else abs(res64.value)
    assert res32.value <= res64.value + 20 * tol * max(scale, 1.0)
    # the float64 gradient (log parameters) at the returned point is small
    theta = torch.tensor(np.log(np.append(res32.kernel.sigma, res32.alpha)),
                         requires_grad=True)
    f(Gaussian(theta[:d].exp())(X), Y, theta[d].exp()).backward()
    assert float(theta.grad.abs().max()) < 1e-2 * max(1.0, abs(res32.value))


def test_search_dtype_is_checked_and_float64_for_other_kernels():
    X, Y = _problem(n=30)
    with pytest.raises(ValueError, match="search_dtype"):
        learn_hyperparameters(X, Y, Gaussian(1.0), search_dtype="float16")
    with pytest.raises(ValueError, match="shift-invariant"):
        learn_hyperparameters(X, Y, Gaussian(1.0) + Linear(), search_dtype="float32")
    # a kernel that is not shift invariant is searched in float64 only: auto equals float64
    k = Gaussian(1.0) + Scaled(Linear(), 0.1)
    a = learn_hyperparameters(X, Y, k)
    b = learn_hyperparameters(X, Y, k, search_dtype="float64")
    assert a.value == b.value and a.alpha == b.alpha
    # the Nyström criteria are searched in float64
    C = X[:10]
    a = learn_hyperparameters(X, Y, Gaussian(1.0), criterion="nystrom_marginal_likelihood",
                              centers=C)
    b = learn_hyperparameters(X, Y, Gaussian(1.0), criterion="nystrom_marginal_likelihood",
                              centers=C, search_dtype="float64")
    assert a.value == b.value and a.alpha == b.alpha


def test_float32_search_of_off_centre_inputs_is_exact():
    # inputs far from the origin: without centring before the cast, float32 distances would
    # lose every digit; the search is the same as on centred inputs
    X, y, _, _ = _irrelevant(n=80, n_noise=1)
    X, Y = torch.as_tensor(X), torch.as_tensor(y - y.mean()).reshape(-1, 1)
    a = learn_hyperparameters(X, Y, Gaussian([1.0] * X.shape[1]), search_dtype="float32")
    b = learn_hyperparameters(X + 1e6, Y, Gaussian([1.0] * X.shape[1]),
                              search_dtype="float32")
    assert b.value == pytest.approx(a.value, abs=1e-6)
    np.testing.assert_allclose(b.kernel.sigma, a.kernel.sigma, rtol=1e-3)


# ---- optimiser options of the estimators -------------------------------------------------------


def test_restarts_are_seeded_and_never_worse():
    X, y, _, _ = _irrelevant(n=60, n_noise=2)
    base = KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood").fit(X, y)
    runs = [KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood",
                        n_restarts_optimizer=3, random_state=rs).fit(X, y) for rs in (5, 5, 6)]
    res = runs[0].hyperparameters_
    assert len(res.values) == 4 and res.value == min(res.values)
    assert res.values[0] == pytest.approx(base.hyperparameters_.value, rel=1e-12)
    assert res.value <= base.hyperparameters_.value
    np.testing.assert_array_equal(runs[0].hyperparameters_.values, runs[1].hyperparameters_.values)
    assert runs[0].hyperparameters_.values[1:] != runs[2].hyperparameters_.values[1:]


def test_solver_random_starts_lie_within_the_bounds():
    X, Y = _problem(n=30)
    res = learn_hyperparameters(X, Y, Gaussian([1.0, 1.0, 1.0]), n_random_starts=2,
                                sigma_bounds=(0.5, 2.0), alpha_bounds=(1e-2, 1e-1),
                                random_state=3)
    ref = float(torch.cdist(X, X)[torch.triu_indices(30, 30, 1).unbind()].median())
    assert len(res.values) == 3
    assert np.all((res.kernel.sigma >= 0.5 * ref * (1 - 1e-9))
                  & (res.kernel.sigma <= 2.0 * ref * (1 + 1e-9)))
    assert 1e-2 * (1 - 1e-9) <= res.alpha <= 1e-1 * (1 + 1e-9)


@pytest.mark.parametrize("make", [
    lambda **kw: KernelRidge(sigma="ard", learn_hyperparameters="marginal_likelihood", **kw),
    lambda **kw: NystromKernelRidge(n_components=20, sigma="ard", random_state=0,
                                    learn_hyperparameters="nystrom_marginal_likelihood", **kw),
])
def test_estimator_bounds_hold(make):
    X, y, _, _ = _irrelevant(n=60, n_noise=2)
    model = make(alpha_bounds=(0.2, 0.5), sigma_bounds=(0.5, 1.5)).fit(X, y)
    ref = float(torch.cdist(torch.as_tensor(X), torch.as_tensor(X))[
        torch.triu_indices(60, 60, 1).unbind()].median())
    assert 0.2 * (1 - 1e-9) <= model.alpha_ <= 0.5 * (1 + 1e-9)
    assert np.all((model.sigma_ >= 0.5 * ref * (1 - 1e-9))
                  & (model.sigma_ <= 1.5 * ref * (1 + 1e-9)))


@pytest.mark.parametrize("params, match", [
    ({"sigma_bounds": (2.0, 1.0)}, "sigma_bounds"),
    ({"sigma_bounds": (0.0, 1.0)}, "sigma_bounds"),
    ({"sigma_bounds": (1.0,)}, "sigma_bounds"),
    ({"alpha_bounds": (1e-3, float("inf"))}, "alpha_bounds"),
    ({"alpha_bounds": ("a", "b")}, "alpha_bounds"),
    ({"n_restarts_optimizer": -1}, "n_restarts_optimizer"),
    ({"n_restarts_optimizer": 1.5}, "n_restarts_optimizer"),
])
@pytest.mark.parametrize("cls", [KernelRidge, NystromKernelRidge])
def test_bad_optimiser_options_are_refused(cls, params, match):
    X, y, _, _ = _irrelevant(n=30, n_noise=1)
    with pytest.raises(ValueError, match=match):
        cls(**params).fit(X, y)
    with pytest.raises(ValueError, match="n_random_starts"):
        learn_hyperparameters(torch.as_tensor(X), torch.as_tensor(y - y.mean()),
                              Gaussian(1.0), n_random_starts=-2)


@pytest.mark.parametrize("criterion", ["validation", "nystrom_marginal_likelihood"])
def test_nystrom_learning_reports_its_signal_variance(criterion):
    X, y, _, _ = _irrelevant(n=80, n_noise=1)
    model = NystromKernelRidge(n_components=25, sigma="ard", random_state=0,
                               learn_hyperparameters=criterion).fit(X, 40.0 * y)
    s2 = model.hyperparameters_.signal_variance
    k = model.kernel_
    C, Xs = model.centers_, torch.as_tensor(X)
    yc = torch.as_tensor(40.0 * (y - y.mean()))
    Q = k(Xs, C) @ torch.linalg.solve(k(C), k(C, Xs))
    q = float(yc @ torch.linalg.solve(Q + model.alpha_ * torch.eye(80, dtype=F64), yc))
    assert s2 == model.signal_variance_ == pytest.approx(q / 80, rel=1e-6)
    assert model.noise_variance_ == pytest.approx(s2 * model.alpha_, rel=1e-12)
