"""The residual-loss registry: one definition of each loss for every user."""

import numpy as np
import pytest
import torch

from kernelflow.estimators._paths import VALIDATION_LOSSES
from kernelflow.solvers import early_stopping, nystrom_robust, path_cv
from kernelflow.solvers.losses import RESIDUAL_LOSSES, get_residual_loss
from kernelflow.solvers.m_estimators import huber_weights

R = torch.tensor([-5.0, -1.5, -0.3, 0.0, 0.2, 0.9, 4.0], dtype=torch.float64)
EPS = 1.0


@pytest.mark.parametrize("name", sorted(RESIDUAL_LOSSES))
def test_psi_is_the_derivative_of_rho(name):
    lf = get_residual_loss(name)
    r = R[R != 0]  # the absolute loss has a kink at 0
    h = 1e-6
    fd = (lf.rho(r + h, EPS) - lf.rho(r - h, EPS)) / (2 * h)
    np.testing.assert_allclose(lf.psi(r, EPS), fd, atol=1e-6)


@pytest.mark.parametrize("name", sorted(RESIDUAL_LOSSES))
def test_irls_weight_times_r_is_psi(name):
    lf = get_residual_loss(name)
    w = lf.irls_weight(R, EPS)
    nz = R != 0
    np.testing.assert_allclose((w * R)[nz], lf.psi(R, EPS)[nz], rtol=1e-15)
    assert bool((w >= 0).all())


@pytest.mark.parametrize("name", sorted(RESIDUAL_LOSSES))
def test_validation_error_and_smoothness(name):
    lf = get_residual_loss(name)
    expected = R.square() if name == "squared" else lf.rho(R, EPS)
    np.testing.assert_allclose(lf.error(R, EPS), expected)
    r = R.clone()
    np.testing.assert_allclose(lf.error(r, EPS, inplace=True), expected)
    if lf.smoothness is not None:  # psi is Lipschitz with that constant
        d = (lf.psi(R[1:], EPS) - lf.psi(R[:-1], EPS)).abs() / (R[1:] - R[:-1]).abs()
        assert float(d.max()) <= lf.smoothness + 1e-12


def test_every_user_takes_its_names_from_the_registry():
    names = set(RESIDUAL_LOSSES)
    assert set(early_stopping.LOSSES) == names
    assert set(path_cv.VALIDATION_LOSSES) == names
    assert set(nystrom_robust.LOSSES) == names
    assert VALIDATION_LOSSES == names


def test_huber_irls_weights_are_the_registry_weights():
    k = torch.tensor([[0.5], [2.0]], dtype=torch.float64)
    w = huber_weights(R.expand(2, -1), k)
    expected = torch.where(R.abs() > k, k / R.abs().clamp_min(1e-300), torch.ones_like(R))
    torch.testing.assert_close(w, expected, rtol=0, atol=0)


def test_unknown_names_are_refused_with_the_option_name():
    with pytest.raises(ValueError, match="validation_loss must be one of"):
        get_residual_loss("hinge", what="validation_loss")
    with pytest.raises(ValueError, match="loss must be one of"):
        get_residual_loss(None)
