"""Why KQR (kernel quantile regression by MM) hits its iteration cap in cross-validation.

On the protocol of ``allerbo_real.py`` (stand-in data, 10 folds, Gaussian kernel, a g x g grid
of bandwidths and penalties, tau in {0.25, 0.5, 0.75}) the batched MM runs with the published
stopping rule (||alpha_k - alpha_{k-1}||_2 < 1e-5, at most 100 iterations) and again with a
larger cap. The script prints, per penalty, the share of problems that hit the cap and the size
of their last step in coefficients and in predictions, and whether the cross-validation choice
and the test R^2 change when the cap is raised.

Usage::

    python benchmarks/allerbo_kqr_cap.py --grid 6 --splits 1-2 --cap 400
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from allerbo_real import load  # noqa: E402
from allerbo_synthetic import KERNELS, r2  # noqa: E402

from kernelflow.datasets._allerbo import kfold_indices, subsample_protocol  # noqa: E402
from kernelflow.solvers.m_estimators import kernel_quantile_mm  # noqa: E402
from kernelflow.solvers.path_cv import fold_masks  # noqa: E402


def cv(X, y, Xte, sig, lam, folds, max_iter):
    kern = KERNELS["gaussian"]
    val = fold_masks(folds, X.shape[0])
    w = val.to(X.dtype) / val.sum(1, keepdim=True)
    taus = torch.tensor([0.25, 0.5, 0.75], dtype=X.dtype).reshape(1, 1, 1, 3)
    K = torch.stack([kern(s)(X, X) for s in sig])
    S, F, L = len(sig), len(folds), len(lam)
    Kb = K.reshape(S, 1, 1, 1, *K.shape[1:])
    lam_t = torch.tensor(lam, dtype=X.dtype).reshape(1, 1, L, 1)
    mask = (~val).to(X.dtype).reshape(1, F, 1, 1, -1)
    c0 = time.process_time()
    res = kernel_quantile_mm(Kb, y, lam_t, quantile=taus, mask=mask, max_iter=max_iter)
    cpu = time.process_time() - c0
    # the last step, in coefficients and in predictions: one more MM update from the result
    nxt = kernel_quantile_mm(Kb, y, lam_t, quantile=taus, mask=mask, max_iter=max_iter + 1)
    dcoef = (nxt.coef - res.coef).norm(dim=-1)
    dpred = ((nxt.coef - res.coef).unsqueeze(-2) @ Kb)[..., 0, :].abs().amax(-1)
    pred = (res.coef.unsqueeze(-2) @ Kb)[..., 0, :]
    mse = ((pred - y).square() * w.reshape(1, F, 1, 1, -1)).sum(-1).mean(1)
    i, j, k = np.unravel_index(int(torch.argmin(mse)), mse.shape)
    fit = kernel_quantile_mm(K[i], y, float(lam[j]), quantile=float(taus.flatten()[k]),
                             max_iter=max_iter)
    out = (kern(sig[i])(Xte, X) @ fit.coef).numpy()
    return dict(choice=(int(i), int(j), int(k)), pred=out, capped=~res.converged,
                dcoef=dcoef, dpred=dpred, coefnorm=res.coef.norm(dim=-1), mse=mse, cpu=cpu)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="concrete")
    ap.add_argument("--outliers", default="yes")
    ap.add_argument("--grid", type=int, default=6)
    ap.add_argument("--splits", default="1-2")
    ap.add_argument("--cap", type=int, default=400)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    X, y = load(args.data)
    lo, _, hi = args.splits.partition("-")
    sig, lam = np.geomspace(0.01, 1000, args.grid), np.geomspace(1e-6, 10, args.grid)
    for s in range(int(lo), int(hi or lo) + 1):
        X_tr, X_te, y_tr, y_te = subsample_protocol(X, y, outliers=args.outliers == "yes",
                                                    random_state=s)
        X_tr, X_te, y_tr = torch.tensor(X_tr), torch.tensor(X_te), torch.tensor(y_tr)
        folds = kfold_indices(len(y_tr), 10, random_state=s)
        a = cv(X_tr, y_tr, X_te, sig, lam, folds, 100)
        b = cv(X_tr, y_tr, X_te, sig, lam, folds, args.cap)
        print(f"\nsplit {s}: capped at 100: {float(a['capped'].double().mean()):.2f}, at "
              f"{args.cap}: {float(b['capped'].double().mean()):.2f}; CPU {a['cpu']:.1f} s / "
              f"{b['cpu']:.1f} s; choice {a['choice']} / {b['choice']}; test R^2 "
              f"{r2(y_te, a['pred']):.3f} / {r2(y_te, b['pred']):.3f}; "
              f"min CV MSE {float(a['mse'].min()):.4f} / {float(b['mse'].min()):.4f}; "
              f"std(y) {float(y_tr.std()):.3g}")
        print("| lambda | capped share (100) | median ||alpha|| of capped | median last step "
              "||d alpha|| | median last step max|K d alpha| (units of y) | capped share "
              f"({args.cap}) |")
        print("|---|---|---|---|---|---|")
        for j, lj in enumerate(lam):
            cap = a["capped"][:, :, j]
            sel = cap if bool(cap.any()) else torch.ones_like(cap)
            print(f"| {lj:.1e} | {float(cap.double().mean()):.2f} | "
                  f"{float(a['coefnorm'][:, :, j][sel].median()):.3g} | "
                  f"{float(a['dcoef'][:, :, j][sel].median()):.2e} | "
                  f"{float(a['dpred'][:, :, j][sel].median()):.2e} | "
                  f"{float(b['capped'][:, :, j].double().mean()):.2f} |", flush=True)


if __name__ == "__main__":
    main()
