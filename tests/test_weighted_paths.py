"""Sample weights in the early-stopped paths and the penalised estimator; the validation loss.

Weights are defined so that an integer weight equals repeating the row (the copies of a row move
together and their coefficients add up), and a zero weight equals removing it.
"""

import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import check_sample_weight_equivalence_on_dense_data

from kernelflow.estimators.coordinate_descent import KernelCoordinateDescent
from kernelflow.estimators.gradient_descent import KernelGradientDescent
from kernelflow.estimators.penalized import PenalizedKernelRegressor
from kernelflow.estimators.sign_gradient import KernelSignGradient
from kernelflow.kernels import Gaussian
from kernelflow.operators import KernelOperator
from kernelflow.solvers.early_stopping import (
    early_stopped_path,
    validation_loss,
    validation_weights,
    weighted_path,
)
from kernelflow.solvers.paths import (
    coordinate_descent_path,
    gradient_descent_path,
    sign_gradient_path,
)

PATHS = [gradient_descent_path, sign_gradient_path, coordinate_descent_path]
PATH_ESTIMATORS = [KernelGradientDescent, KernelSignGradient, KernelCoordinateDescent]


# the deprecated weighted_path is kept working: these tests call it on purpose
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:weighted_path is deprecated:DeprecationWarning")]


def test_weighted_path_is_deprecated_and_equals_run_path():
    from kernelflow.solvers.paths.driver import run_path
    from kernelflow.solvers.paths.rules import SignRule

    K = torch.eye(3, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    w = torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="run_path"):
        old = weighted_path(sign_gradient_path, K, y, w, learning_rate=0.1, max_iter=5)
    new = run_path(SignRule(), K, y, sample_weight=w, learning_rate=0.1, max_iter=5)
    assert torch.equal(old.alpha, new.alpha)


def _problem(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, dtype=torch.float64, generator=g) * 6 - 3
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(n, dtype=torch.float64, generator=g)
    w = torch.randint(1, 4, (n,), generator=g).to(torch.float64)
    return X, y, w


def _repeat(w):
    return torch.repeat_interleave(torch.arange(w.numel()), w.to(torch.long))


@pytest.mark.parametrize("path", PATHS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("lr", [0.02, "auto"])
def test_weighted_path_equals_repeated_rows(path, lr):
    X, y, w = _problem()
    k = Gaussian(1.0)
    K, Ke = k(X, X), k(X[:5] + 0.1, X)
    idx = _repeat(w)
    ref = path(K[idx][:, idx], y[idx], learning_rate=lr, max_iter=300, K_eval=Ke[:, idx])
    res = weighted_path(path, K, y, w, learning_rate=lr, max_iter=300, K_eval=Ke)
    assert res.learning_rate == pytest.approx(ref.learning_rate, rel=1e-12)
    summed = torch.zeros_like(y).index_add_(0, idx, ref.alpha)  # copies' coefficients add up
    torch.testing.assert_close(res.alpha, summed, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res.eval_predictions, ref.eval_predictions, rtol=1e-10,
                               atol=1e-12)


def test_weighted_rules_one_step():
    # the update rules themselves: alpha_1 = eta W r_0, eta W sign(r_0), eta w_m sign(r_m) e_m
    X, y, w = _problem(n=6)
    K = Gaussian(1.0)(X, X)
    eta = 0.1
    for path, direction in [(gradient_descent_path, y), (sign_gradient_path, torch.sign(y))]:
        a1 = weighted_path(path, K, y, w, learning_rate=eta, max_iter=1).alpha
        torch.testing.assert_close(a1, eta * w * direction)
    a1 = weighted_path(coordinate_descent_path, K, y, w, learning_rate=eta, max_iter=1).alpha
    m = int(torch.argmax(y.abs()))
    expected = torch.zeros_like(y)
    expected[m] = eta * w[m] * torch.sign(y[m])
    torch.testing.assert_close(a1, expected)


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.5, False), (0.5, True)])
def test_weighted_gradient_spectral_matches_matrix_free_loop(momentum, nesterov):
    # dense K: plain GD on W^1/2 K W^1/2 (closed form); operator: the loop alpha += eta W r
    X, y, w = _problem(n=30)
    k = Gaussian(0.7)
    dense = weighted_path(gradient_descent_path, k(X, X), y, w, learning_rate=0.02,
                          max_iter=150, momentum=momentum, nesterov=nesterov)
    loop = weighted_path(gradient_descent_path, KernelOperator(k, X), y, w, learning_rate=0.02,
                         max_iter=150, momentum=momentum, nesterov=nesterov, method="iterative")
    torch.testing.assert_close(dense.alpha, loop.alpha, rtol=1e-9, atol=1e-11)
    # validation predictions of the matrix-free run: K(X_val, X) alpha
    Xv = X[:7] + 0.1
    ev = weighted_path(gradient_descent_path, KernelOperator(k, X), y, w, learning_rate=0.02,
                       max_iter=150, momentum=momentum, nesterov=nesterov, method="iterative",
                       K_eval=KernelOperator(k, Xv, X))
    torch.testing.assert_close(ev.eval_predictions, k(Xv, X) @ dense.alpha, rtol=1e-9,
                               atol=1e-11)


def test_weighted_gradient_too_large_step_raises():
    X, y, w = _problem(n=30)
    K = Gaussian(2.0)(X, X)
    s_max = float(torch.linalg.eigvalsh(w.sqrt()[:, None] * K * w.sqrt()[None])[-1])
    with pytest.raises(FloatingPointError):
        weighted_path(gradient_descent_path, KernelOperator(Gaussian(2.0), X), y, w,
                      learning_rate=2.5 / s_max, max_iter=10)


def test_validation_weights_split_by_content():
    X, y, w = _problem(n=40)
    w_tr, w_va = validation_weights(X, y, None, 0.2, random_state=3)
    assert int((w_va > 0).sum()) == 8  # ceil(0.2 * 40) distinct rows
    assert bool(((w_tr > 0) ^ (w_va > 0)).all())
    # row order does not matter
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    p_tr, p_va = validation_weights(X[perm], y[perm], None, 0.2, random_state=3)
    torch.testing.assert_close(p_va, w_va[perm])
    # integer weights split like repeated rows: copies never straddle the split
    idx = _repeat(w)
    r_tr, r_va = validation_weights(X[idx], y[idx], None, 0.2, random_state=3)
    q_tr, q_va = validation_weights(X, y, w, 0.2, random_state=3)
    torch.testing.assert_close(torch.zeros(40, dtype=torch.float64).index_add_(0, idx, r_va), q_va)
    assert float(q_va.sum()) >= 0.2 * float(w.sum())
    # zero weights are on neither side; the seed changes the split
    w0 = w.clone()
    w0[:5] = 0
    z_tr, z_va = validation_weights(X, y, w0, 0.2, random_state=3)
    assert float((z_tr[:5] + z_va[:5]).abs().sum()) == 0.0
    assert not torch.equal(validation_weights(X, y, None, 0.2, random_state=4)[1], w_va)
    with pytest.raises(ValueError, match="2 samples"):
        validation_weights(X[:1], y[:1], None, 0.2)


def test_weighted_validation_loss_equals_repeated_validation_rows():
    X, y, w = _problem(n=40)
    k = Gaussian(1.0)
    tr, va = torch.arange(30), torch.arange(30, 40)
    idx = va[_repeat(w[va])]
    for loss in ["squared", "absolute"]:
        for path in PATHS:
            rep = early_stopped_path(path, k(X[tr], X[tr]), y[tr], k(X[idx], X[tr]), y[idx],
                                     learning_rate=0.05, max_iter=400, n_iter_no_change=30,
                                     validation_loss=loss)
            wgt = early_stopped_path(path, k(X[tr], X[tr]), y[tr], k(X[va], X[tr]), y[va],
                                     learning_rate=0.05, max_iter=400, n_iter_no_change=30,
                                     validation_weight=w[va], validation_loss=loss)
            assert rep.best_iteration == wgt.best_iteration
            torch.testing.assert_close(rep.validation_losses, wgt.validation_losses,
                                       rtol=1e-12, atol=1e-14)


def test_validation_loss_values():
    p, yv = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[1.0, 4.0, 1.0]])
    assert float(validation_loss(p, yv)) == pytest.approx(5.0 / 3)
    assert float(validation_loss(p, yv, loss="absolute")) == pytest.approx(1.0)
    assert float(validation_loss(p, yv, torch.tensor([0.0, 1.0, 3.0]))) == pytest.approx(7 / 4)
    blocks = validation_loss(torch.stack([p, yv]), yv)  # leading dimensions are kept
    assert blocks.shape == (2,) and float(blocks[1]) == 0.0
    # Huber: epsilon = 1.345 * 1.4826 * MAD(y_val) = 1.345 * 1.4826 * 0 -> rms fallback
    eps = 1.345 * float(yv.square().mean().sqrt())
    d = torch.tensor([0.0, 2.0, 1.0])
    want = torch.where(d <= eps, 0.5 * d**2, eps * (d - 0.5 * eps)).mean()
    assert float(validation_loss(p, yv, loss="huber")) == pytest.approx(float(want))
    with pytest.raises(ValueError, match="validation_loss"):
        validation_loss(p, yv, loss="hinge")


def _weighted_data(n=30, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.randn(n)
    sw = rng.randint(0, 4, size=n)
    sw[:3] = [0, 2, 3]
    return X, y, sw


ESTIMATORS = [
    KernelGradientDescent(sigma=1.0, random_state=0),
    KernelGradientDescent(sigma=1.0, random_state=0, method="iterative", momentum=0.3),
    KernelSignGradient(sigma=1.0, random_state=0, max_iter=3000),
    KernelSignGradient(sigma=1.0, random_state=0, max_iter=3000, validation_loss="absolute"),
    KernelCoordinateDescent(sigma=1.0, random_state=0, max_iter=3000),
    KernelSignGradient(sigma=1.0, early_stopping=False, max_iter=400, learning_rate=0.01),
    PenalizedKernelRegressor(alpha=0.5, penalty="linf", sigma=0.3),
    PenalizedKernelRegressor(alpha=0.05, penalty="l1", sigma=0.3),
    PenalizedKernelRegressor(alpha=0.1, penalty="l2", sigma=0.3),
]


@pytest.mark.parametrize("est", ESTIMATORS, ids=repr)
def test_integer_weights_equal_repeated_rows(est):
    X, y, sw = _weighted_data()
    perm = np.random.RandomState(1).permutation(len(y))  # the weighted rows in another order
    weighted = est.__class__(**est.get_params()).fit(X[perm], y[perm], sample_weight=sw[perm])
    repeated = est.__class__(**est.get_params()).fit(np.repeat(X, sw, 0), np.repeat(y, sw))
    grid = np.linspace(-3, 3, 25)[:, None]
    np.testing.assert_allclose(weighted.predict(grid), repeated.predict(grid), rtol=1e-8,
                               atol=1e-10)
    if hasattr(est, "n_iter_no_change") and est.early_stopping:
        assert weighted.n_iter_ == repeated.n_iter_ > 0


@pytest.mark.parametrize("est", ESTIMATORS[::2], ids=repr)
def test_zero_weight_equals_removed_row(est):
    X, y, _ = _weighted_data()
    sw = np.ones(len(y))
    sw[[2, 7, 11]] = 0
    keep = sw > 0
    weighted = est.__class__(**est.get_params()).fit(X, y, sample_weight=sw)
    removed = est.__class__(**est.get_params()).fit(X[keep], y[keep])
    grid = np.linspace(-3, 3, 25)[:, None]
    np.testing.assert_allclose(weighted.predict(grid), removed.predict(grid), rtol=1e-10,
                               atol=1e-12)
    ones = est.__class__(**est.get_params()).fit(X[keep], y[keep], sample_weight=sw[keep])
    np.testing.assert_allclose(ones.predict(grid), removed.predict(grid), rtol=0, atol=0)


def test_weights_change_the_fit_and_the_stopping_time():
    # weight on the rows near x = 2 pulls the early-stopped fit there
    X, y, _ = _weighted_data(n=60, seed=2)
    sw = np.where(np.abs(X[:, 0] - 2) < 0.5, 20.0, 1.0)
    y = y + np.where(np.abs(X[:, 0] - 2) < 0.5, 1.0, 0.0)
    for cls in PATH_ESTIMATORS:
        plain = cls(sigma=0.5, random_state=0, max_iter=3000).fit(X, y)
        heavy = cls(sigma=0.5, random_state=0, max_iter=3000).fit(X, y, sample_weight=sw)
        near = np.abs(X[:, 0] - 2) < 0.5
        err_plain = np.abs(plain.predict(X[near]) - y[near]).mean()
        err_heavy = np.abs(heavy.predict(X[near]) - y[near]).mean()
        assert err_heavy < err_plain


@pytest.mark.parametrize("est", PATH_ESTIMATORS + [PenalizedKernelRegressor])
def test_sklearn_sample_weight_equivalence(est):
    check_sample_weight_equivalence_on_dense_data(est.__name__, est())


@pytest.mark.parametrize("cls", PATH_ESTIMATORS + [PenalizedKernelRegressor])
def test_bad_sample_weight(cls):
    X, y, _ = _weighted_data()
    with pytest.raises(ValueError, match="(?i)negative"):
        cls(sigma=1.0).fit(X, y, sample_weight=-np.ones(len(y)))
    with pytest.raises(ValueError, match="positive|non-zero"):
        cls(sigma=1.0).fit(X, y, sample_weight=np.zeros(len(y)))
    with pytest.raises(ValueError):
        cls(sigma=1.0).fit(X, y, sample_weight=np.ones(len(y) - 1))


# ---- the monitored validation loss -----------------------------------------------------------
@pytest.mark.parametrize("path", PATHS, ids=lambda f: f.__name__)
def test_absolute_validation_loss_survives_an_outlier_among_validation_rows(path):
    # A clean sine; one validation response is a gross outlier at x = -pi/2, where the truth is
    # -1. Fitting moves the prediction there from 0 towards -1, away from the outlier (+30): its
    # squared error grows by about 61, more than the other rows' errors shrink, so the squared
    # validation loss rises from the first steps and stops the run at once. The absolute loss
    # grows by at most 1 there and keeps falling elsewhere: the run continues.
    rng = np.random.RandomState(0)
    x_tr = np.linspace(-3, 3, 60)
    x_va = np.r_[-np.pi / 2, rng.uniform(-3, 3, 9)]
    y_tr = np.sin(x_tr) + 0.05 * rng.randn(60)
    y_va = np.sin(x_va)
    y_va[0] = 30.0
    k = Gaussian(0.7)
    Xt, Xv = torch.tensor(x_tr)[:, None], torch.tensor(x_va)[:, None]
    Xg = torch.linspace(-3, 3, 200, dtype=torch.float64)[:, None]
    out = {}
    for loss in ["squared", "absolute"]:
        res = early_stopped_path(path, k(Xt, Xt), torch.tensor(y_tr), k(Xv, Xt),
                                 torch.tensor(y_va), learning_rate=0.005, max_iter=5000,
                                 n_iter_no_change=100, validation_loss=loss)
        pred = k(Xg, Xt) @ res.best_alpha
        out[loss] = (res.best_iteration, float((pred - torch.sin(Xg[:, 0])).square().mean()))
    assert out["squared"][0] == 0  # alpha = 0: the prediction stays 0
    assert out["absolute"][0] > 20
    assert out["absolute"][1] < 0.01 * out["squared"][1]


def test_absolute_validation_loss_in_the_estimator():
    # Cauchy noise (Allerbo Eq. 17 on [-3, 3]); with random_state=0 the held-out rows contain a
    # gross outlier, which ends the squared-loss run early.
    rng = np.random.RandomState(47)
    X = rng.uniform(-3, 3, size=(100, 1))
    f = np.sin(X[:, 0])
    y = f + 0.1 * rng.standard_cauchy(100)
    sq = KernelSignGradient(sigma=1.0, random_state=0, validation_loss="squared").fit(X, y)
    ab = KernelSignGradient(sigma=1.0, random_state=0, validation_loss="absolute").fit(X, y)
    assert ab.n_iter_ > sq.n_iter_
    assert np.median(np.abs(ab.predict(X) - f)) < 0.5 * np.median(np.abs(sq.predict(X) - f))
    # the monitored values are mean absolute errors: at alpha = 0 that of the centred targets
    yc = y - y.mean()
    _, w_va = validation_weights(torch.tensor(X), torch.tensor(yc), None, 0.1, random_state=0)
    val = w_va.numpy() > 0
    assert ab.validation_losses_[0] == pytest.approx(np.abs(yc[val]).mean(), rel=1e-12)
    assert sq.validation_losses_[0] == pytest.approx(np.square(yc[val]).mean(), rel=1e-12)
    with pytest.raises(ValueError):
        KernelSignGradient(validation_loss="hinge").fit(X, y)


def test_weighted_l2_penalty_is_weighted_kernel_ridge():
    # repeated rows give (K + lambda W^-1) alpha = y: the weighted data fit
    # sum_i w_i (y_i - f_i)^2 / 2 + lambda / 2 ||f||_H^2
    X, y, sw = _weighted_data()
    keep = sw > 0
    X, y, w = X[keep], y[keep], sw[keep].astype(float)
    model = PenalizedKernelRegressor(alpha=0.1, penalty="l2", sigma=0.5, fit_intercept=False,
                                     tol=1e-10).fit(X, y, sample_weight=w)
    K = Gaussian(0.5)(torch.tensor(X), torch.tensor(X)).numpy()
    alpha = np.linalg.solve(K + 0.1 * np.diag(1 / w), y)
    np.testing.assert_allclose(model.dual_coef_.numpy(), alpha, rtol=1e-7, atol=1e-9)
