"""The path-rule contract: every fast backend a rule declares computes the reference path.

The reference is :func:`kernelflow.solvers.paths.driver.rule_path` (one product with K per step,
momentum and sample weights included). For every rule and every backend in ``rule.backends``
the backend's iterates (or what it derives from them: validation curves, fold scores) must
equal the reference's to tight tolerance, with and without sample weights where the rule
declares them, on a dense K and a matrix-free one. A rule declaring no backend runs through
the reference everywhere, and is refused where only fast backends exist (path CV).
"""

import math

import pytest
import torch

from kernelflow.kernels import Gaussian
from kernelflow.linalg import symmetric_eigh
from kernelflow.operators import KernelOperator
from kernelflow.solvers import _native
from kernelflow.solvers.early_stopping import early_stopped_path, fit_path, validation_loss
from kernelflow.solvers.path_cv import early_stopping_path_cv
from kernelflow.solvers.paths import gradient_descent_path, spectral_filter
from kernelflow.solvers.paths.driver import rule_path, run_path
from kernelflow.solvers.paths.rules import (
    BACKENDS,
    CoordinateRule,
    GradientRule,
    HuberRule,
    PathRule,
    RowMask,
    SignRule,
    largest_eigenvalue,
)
from kernelflow.utils.monitor import EarlyStopping

DT = torch.float64
N, STEPS = 32, 40
TOL = dict(rtol=1e-9, atol=1e-10)


class TanhRule(PathRule):
    """A new rule as an extension author writes it: a smooth clip, no fast backend."""

    name = "tanh"
    fast_backends = frozenset()

    def direction(self, residual, mask=None):
        return torch.tanh(residual)

    def learning_rate(self, K, y, s_max=None, sample_weight=None):
        return 1.0 / (largest_eigenvalue(K) if s_max is None else s_max)

    def max_step(self, s_max):
        return 2.0 / s_max if s_max > 0 else math.inf


RULES = {
    "gradient": GradientRule(),
    "heavy-ball": GradientRule(momentum=0.5),
    "nesterov": GradientRule(momentum=0.3, nesterov=True),
    "sign": SignRule(),
    "coordinate": CoordinateRule(),
    "huber": HuberRule(),
    "huber-0.2": HuberRule(0.2),
    "tanh": TanhRule(),
}


def _problem(n=N, t=None):
    g = torch.Generator().manual_seed(3)
    X = torch.rand(n + 10, 2, generator=g, dtype=DT) * 4
    y = torch.sin(X[:, 0]) + X[:, 1] + 0.3 * torch.randn(n + 10, generator=g, dtype=DT)
    if t is not None:
        y = torch.stack([y * (j + 1) for j in range(t)], dim=1)
    w = 0.5 + torch.rand(n, generator=g, dtype=DT)
    return X[:n], y[:n], X[n:], y[n:], w


def _step(rule, K, w=None):
    """A step well inside the rule's bound and coarse enough for a short path."""
    s = largest_eigenvalue(K if w is None else w.sqrt()[:, None] * K * w.sqrt()[None, :])
    return 0.5 / s if rule.bounded else 0.02


def _kernels(X, Xe, matrix_free):
    k = Gaussian(1.0)
    if matrix_free:
        return KernelOperator(k, X), KernelOperator(k, Xe, X), k(X, X)
    return k(X, X), k(Xe, X), k(X, X)


def _reference(rule, K, y, eta, Ke=None, w=None):
    return rule_path(rule, K, y, learning_rate=eta, max_iter=STEPS, K_eval=Ke, sample_weight=w,
                     record_path=True)


def _cases(backend):
    return [pytest.param(rule, id=name) for name, rule in RULES.items()
            if backend in rule.backends]


def test_every_declared_backend_is_known_and_tested():
    for rule in RULES.values():
        assert set(rule.backends) <= set(BACKENDS), rule
    declared = set().union(*(rule.backends for rule in RULES.values()))
    assert declared == set(BACKENDS)  # each backend below has a rule to check it with


@pytest.mark.parametrize("matrix_free", [False, True], ids=["dense", "operator"])
@pytest.mark.parametrize("rule", _cases("single"))
def test_single_path_equals_the_reference(rule, matrix_free):
    X, y, Xe, _, _ = _problem(t=2)
    K, Ke, Kd = _kernels(X, Xe, matrix_free)
    eta = _step(rule, Kd)
    ref = _reference(rule, K, y, eta, Ke)
    res = rule.single_path(K, y, learning_rate=eta, max_iter=STEPS, K_eval=Ke,
                           record_path=True)
    assert res.n_iter == ref.n_iter == STEPS
    torch.testing.assert_close(res.path, ref.path, **TOL)
    torch.testing.assert_close(res.eval_predictions, ref.eval_predictions, **TOL)
    torch.testing.assert_close(res.residual, ref.residual, **TOL)
    # without recording (a compiled loop where the rule has one) the end point is the same
    end = run_path(rule, K, y, learning_rate=eta, max_iter=STEPS)
    torch.testing.assert_close(end.alpha, ref.alpha, **TOL)


@pytest.mark.parametrize("matrix_free", [False, True], ids=["dense", "operator"])
@pytest.mark.parametrize("rule", _cases("weighted"))
def test_weighted_single_path_equals_the_reference(rule, matrix_free):
    X, y, Xe, _, w = _problem()
    K, Ke, Kd = _kernels(X, Xe, matrix_free)
    eta = _step(rule, Kd, w)
    ref = _reference(rule, K, y, eta, Ke, w)
    res = rule.single_path(K, y, sample_weight=w, learning_rate=eta, max_iter=STEPS,
                           K_eval=Ke, record_path=True)
    torch.testing.assert_close(res.path, ref.path, **TOL)
    torch.testing.assert_close(res.eval_predictions, ref.eval_predictions, **TOL)
    torch.testing.assert_close(run_path(rule, K, y, sample_weight=w, learning_rate=eta,
                                        max_iter=STEPS).alpha, ref.alpha, **TOL)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("rule", _cases("eigenbasis"))
def test_eigenbasis_path_equals_the_reference(rule, weighted):
    X, y, Xe, _, w = _problem()
    K, Ke, _ = _kernels(X, Xe, False)
    w = w if weighted else None
    M = K if w is None else w.sqrt()[:, None] * K * w.sqrt()[None, :]
    eta = _step(rule, K, w)
    ref = _reference(rule, K, y, eta, Ke, w)
    for kw in ({"method": "spectral"}, {"eigh": symmetric_eigh(M)}, {"method": "iterative"}):
        res = rule.single_path(K, y, sample_weight=w, learning_rate=eta, max_iter=STEPS,
                               K_eval=Ke, record_path=True, **kw)
        torch.testing.assert_close(res.path, ref.path, **TOL)
        torch.testing.assert_close(res.eval_predictions, ref.eval_predictions, **TOL)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("rule", _cases("spectral"))
def test_spectral_closed_form_equals_the_reference(rule, weighted):
    X, y, Xv, yv, w = _problem()
    K, Kv, _ = _kernels(X, Xv, False)
    w = w if weighted else None
    eta = _step(rule, K, w)
    ref = _reference(rule, K, y, eta, Kv, w)
    if w is None:  # alpha_k = U phi_k(s) U^T y
        s, U = symmetric_eigh(K)
        phi = spectral_filter(s, eta, torch.arange(STEPS + 1))
        torch.testing.assert_close((phi * (U.T @ y)) @ U.T, ref.path, **TOL)
    # the validation curve of early stopping, in blocks of iterations from the closed form
    curve = []
    rule_path(rule, K, y, learning_rate=eta, max_iter=STEPS, K_eval=Kv, sample_weight=w,
              callback=lambda k, a, r, e: curve.append(float(validation_loss(e, yv[None]))))
    es = early_stopped_path(rule, K, y, Kv, yv, n_iter_no_change=10 * STEPS, max_iter=STEPS,
                            learning_rate=eta, sample_weight=w)
    torch.testing.assert_close(es.validation_losses, torch.tensor(curve, dtype=DT), **TOL)
    torch.testing.assert_close(es.best_alpha, ref.path[es.best_iteration], **TOL)


def _fold_reference(rule, kernels, X, y, folds, eta, max_iter, patience):
    """Each (kernel, fold) problem by the reference driver with the patience rule of path CV
    (steps 1, 2, ... scored on the fold's validation rows)."""
    best = torch.zeros(len(kernels), len(folds), dtype=torch.long)
    score = torch.zeros(len(kernels), len(folds), dtype=DT)
    for i, k in enumerate(kernels):
        K = k(X, X)
        for f, va in enumerate(folds):
            tr = torch.tensor([j for j in range(len(y)) if j not in set(va)])
            va = torch.as_tensor(va)
            mon = EarlyStopping(patience)

            def callback(step, alpha, r, e, mon=mon, yv=y[va]):
                return step > 0 and mon.update(step, float(((e[0] - yv) ** 2).mean()))

            rule_path(rule, K[tr][:, tr], y[tr], learning_rate=eta, max_iter=max_iter,
                      K_eval=K[va][:, tr], callback=callback)
            best[i, f], score[i, f] = mon.best_iteration, mon.best_loss
    return best, score


def _cv_problem():
    X, y, _, _, _ = _problem(n=36)
    folds = [list(range(i, 36, 4)) for i in range(4)]
    return X, y, folds, [Gaussian(0.7), Gaussian(1.5)]


@pytest.mark.parametrize("rule", _cases("batched"))
def test_batched_path_cv_equals_the_reference_per_fold(rule):
    X, y, folds, kernels = _cv_problem()
    eta = min(_step(rule, k(X, X)) for k in kernels)
    res = early_stopping_path_cv(X, y, kernels, folds, method=rule, step_size=eta,
                                 max_iter=120, n_iter_no_change=15, backend="torch",
                                 spectral_gradient=False, low_rank=False, chunk_size=7)
    best, score = _fold_reference(rule, kernels, X, y, folds, eta, 120, 15)
    assert torch.equal(res.best_iter, best)
    torch.testing.assert_close(res.fold_mse, score, **TOL)


@pytest.mark.parametrize("rule", _cases("spectral"))
def test_spectral_path_cv_equals_the_reference_per_fold(rule):
    X, y, folds, kernels = _cv_problem()
    eta = min(_step(rule, k(X, X)) for k in kernels)
    res = early_stopping_path_cv(X, y, kernels, folds, method=rule, step_size=eta,
                                 max_iter=120, n_iter_no_change=15, spectral_gradient=True)
    best, score = _fold_reference(rule, kernels, X, y, folds, eta, 120, 15)
    assert torch.equal(res.best_iter, best)
    torch.testing.assert_close(res.fold_mse, score, rtol=1e-8, atol=1e-10)


@pytest.mark.skipif(not _native.available("sign", torch.zeros(1, dtype=DT)),
                    reason="compiled path loops not built")
@pytest.mark.parametrize("rule", _cases("native"))
def test_native_loops_equal_the_reference(rule):
    X, y, folds, kernels = _cv_problem()
    eta = 0.02
    res = early_stopping_path_cv(X, y, kernels, folds, method=rule, step_size=eta,
                                 max_iter=120, n_iter_no_change=15, backend="native")
    best, score = _fold_reference(rule, kernels, X, y, folds, eta, 120, 15)
    assert torch.equal(res.best_iter, best)
    torch.testing.assert_close(res.fold_mse, score, rtol=1e-8, atol=1e-10)
    K = kernels[0](X, X)  # the single path without callback runs the compiled loop
    torch.testing.assert_close(rule.single_path(K, y, learning_rate=eta, max_iter=STEPS).alpha,
                               _reference(rule, K, y, eta).alpha, **TOL)


def test_a_rule_without_backends_runs_through_the_reference_driver():
    rule = RULES["tanh"]
    X, y, Xe, _, w = _problem()
    K = Gaussian(1.0)(X, X)
    eta = _step(rule, K, w)
    for sw in (None, w):
        torch.testing.assert_close(
            run_path(rule, K, y, sample_weight=sw, learning_rate=eta, max_iter=STEPS,
                     method="spectral").alpha,  # a backend option it has no use for
            rule_path(rule, K, y, sample_weight=sw, learning_rate=eta, max_iter=STEPS).alpha,
            rtol=0, atol=0)
    fit = fit_path(rule, Gaussian(1.0), X, y, learning_rate=eta, max_iter=200, random_state=0)
    refit = rule_path(rule, K, y, learning_rate=eta, max_iter=fit.n_iter)
    torch.testing.assert_close(fit.alpha, refit.alpha, rtol=0, atol=0)
    with pytest.raises(ValueError, match="declares none"):
        early_stopping_path_cv(X, y, [Gaussian(1.0)], [list(range(0, N, 2))], method=rule)


def test_momentum_is_run_or_refused_never_dropped():
    X, y, _, _, _ = _problem()
    K = Gaussian(1.0)(X, X)
    eta = 0.5 / largest_eigenvalue(K)
    heavy = GradientRule(momentum=0.5)
    plain = rule_path(GradientRule(), K, y, learning_rate=eta, max_iter=STEPS).alpha
    moved = rule_path(heavy, K, y, learning_rate=eta, max_iter=STEPS).alpha
    assert not torch.allclose(plain, moved)
    torch.testing.assert_close(
        moved, gradient_descent_path(K, y, learning_rate=eta, max_iter=STEPS, momentum=0.5,
                                     method="iterative").alpha, **TOL)
    # the estimators' route: momentum given to fit_path lands on the rule
    a = fit_path(gradient_descent_path, Gaussian(1.0), X, y, momentum=0.5, random_state=0)
    b = fit_path(heavy, Gaussian(1.0), X, y, random_state=0)
    torch.testing.assert_close(a.alpha, b.alpha, rtol=0, atol=0)
    with pytest.raises(ValueError, match="declares none"):
        early_stopping_path_cv(X, y, [Gaussian(1.0)], [list(range(0, N, 2))], method=heavy,
                               step_size=eta)
    for other in (SignRule(), HuberRule()):  # rules without momentum refuse it
        with pytest.raises(TypeError, match="momentum"):
            fit_path(other, Gaussian(1.0), X, y, momentum=0.5)
    with pytest.raises(ValueError, match="no option momentum"):
        SignRule().with_options(momentum=0.5)


def test_huber_threshold_is_cached_on_the_row_mask_it_was_built_for():
    g = torch.Generator().manual_seed(0)
    R = torch.randn(3, 4, 9, generator=g, dtype=DT)
    mask = (torch.rand(4, 9, generator=g) > 0.3).to(DT).expand(3, 4, 9)
    rule = HuberRule()
    rows = RowMask(mask)
    a = rule.batched_step(torch.zeros_like(R), R.clone(), 0.5, rows)
    assert rows.cache  # the layout is kept for the next step
    eps = rule._tensor_threshold(R, mask)  # the tensor code: medians over the training rows
    torch.testing.assert_close(a, 0.5 * torch.minimum(torch.maximum(R, -eps), eps), **TOL)
    # another mask (a bare tensor or a new RowMask) is read afresh, not from a stale cache
    other = mask.clone()
    other[..., 0] = 1 - other[..., 0]
    b = rule.step(torch.zeros_like(R), R.clone(), 0.5, other)
    c = rule.batched_step(torch.zeros_like(R), R.clone(), 0.5, RowMask(other))
    torch.testing.assert_close(b, c, rtol=0, atol=0)
    assert not torch.equal(a, b)
