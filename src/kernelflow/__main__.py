"""``python -m kernelflow``: a small end-to-end fit on data shipped with scikit-learn."""

from __future__ import annotations

import time


def main() -> None:
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    from kernelflow.estimators import KernelRidgeCV

    X, y = load_diabetes(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_tr)
    start = time.perf_counter()
    model = KernelRidgeCV().fit(scaler.transform(X_tr), y_tr)
    elapsed = time.perf_counter() - start
    r2 = model.score(scaler.transform(X_te), y_te)
    print("kernelflow: KernelRidgeCV on scikit-learn's diabetes data (442 rows, 10 features)")
    print(f"  selected sigma = {model.sigma_:.3g}, alpha = {model.alpha_:.3g}")
    print(f"  test R^2 = {r2:.3f}   fit time = {elapsed:.2f} s")


if __name__ == "__main__":
    main()
