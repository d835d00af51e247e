"""The Nyström solvers take the source's moments from a caller that already has them: the same
coefficients, bit for bit, without the pass over the rows that computes them."""

import pytest
import torch

import kernelflow.solvers.nystrom as nys
from kernelflow.kernels import Gaussian
from kernelflow.solvers.nystrom_eigen_cg import nystrom_eigen_cg
from kernelflow.solvers.nystrom_robust import nystrom_robust
from kernelflow.sources import ArraySource

F64 = torch.float64


def _source(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, dtype=F64, generator=g)
    y = torch.stack([torch.sin(X.sum(1)), X[:, 0]], 1) + 0.1 * torch.randn(n, 2, dtype=F64,
                                                                          generator=g)
    w = torch.rand(n, dtype=F64, generator=g) + 0.5
    return X, ArraySource(X, y, w)


def _counting(monkeypatch):
    calls = []
    real = nys.source_moments

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nys, "source_moments", counted)
    return calls


SOLVERS = {
    "cg": lambda src, C, **kw: nys.nystrom_krr(src, Gaussian(1.0), C, 0.3, solver="cg", **kw),
    "direct": lambda src, C, **kw: nys.nystrom_krr(src, Gaussian(1.0), C, 0.3, solver="direct",
                                                   **kw),
    "eigen_cg": lambda src, C, **kw: nystrom_eigen_cg(src, Gaussian(1.0), C, 0.3, rank=10, **kw),
    "robust": lambda src, C, **kw: nystrom_robust(src, Gaussian(1.0), C, loss="huber",
                                                  alpha=0.3, max_iter=15, **kw),
}


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_given_moments_skip_the_pass_and_change_nothing(name, monkeypatch):
    X, src = _source()
    moments = nys.source_moments(src)
    calls = _counting(monkeypatch)
    ref = SOLVERS[name](src, X[:25])
    assert len(calls) == 1
    sol = SOLVERS[name](src, X[:25], moments=moments)
    assert len(calls) == 1  # not computed again
    assert torch.equal(sol.coef, ref.coef) and sol.n_iter == ref.n_iter
    if name == "robust":
        assert torch.equal(sol.intercept, ref.intercept)  # the weighted sum of y is used
    else:
        assert sol.total_weight == ref.total_weight == pytest.approx(float(moments[0]))


def test_given_moments_are_the_ones_used():
    # W only normalises (1): the coefficients stay, the reported weight is the given one; the
    # squared loss starts its intercept at the given weighted mean sum(w y) / W
    X, src = _source()
    W, ysum, n = nys.source_moments(src)
    a = nys.nystrom_krr(src, Gaussian(1.0), X[:25], 0.3, solver="direct",
                        moments=(2 * W, ysum, n))
    b = nys.nystrom_krr(src, Gaussian(1.0), X[:25], 0.3, solver="direct")
    assert a.total_weight == 2 * W and b.total_weight == W
    torch.testing.assert_close(a.coef, b.coef, rtol=1e-8, atol=1e-10)
    kw = dict(loss="squared", max_iter=0)
    shifted = nystrom_robust(src, Gaussian(1.0), X[:25], moments=(W, ysum + W, n), **kw)
    plain = nystrom_robust(src, Gaussian(1.0), X[:25], **kw)
    torch.testing.assert_close(shifted.intercept, plain.intercept + 1.0)
    torch.testing.assert_close(plain.intercept, ysum / W)


def test_direct_solve_refined_by_cg_reads_the_moments_once(monkeypatch):
    # a residual check that never passes: plain Gram, whitened Gram, then CG from that solution;
    # the CG run reuses the moments of the first stage
    for name, value in (("_CHECK_SLACK", -1.0), ("_CHECK_EXCESS", -1.0), ("_CHECK_MIN", -1.0)):
        monkeypatch.setattr(nys, name, value)
    X, src = _source()
    calls = _counting(monkeypatch)
    with pytest.warns(RuntimeWarning, match="rounding allows"):
        sol = nys.nystrom_krr(src, Gaussian(1.0), X[:25], 0.3, solver="direct", tol=1e-10,
                              max_iter=200)
    assert [s for s, _ in sol.history] == ["direct", "direct", "cg"] and len(calls) == 1
    ref = nys.nystrom_direct(src, Gaussian(1.0), X[:25], 0.3)
    torch.testing.assert_close(sol.coef, ref, rtol=1e-6, atol=1e-8)
