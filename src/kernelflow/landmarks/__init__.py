"""Nyström landmark (centre) selection and column subset selection.

Every selector follows :class:`LandmarkSelector` (``select(X, kernel, k, random_state=...)``
returning a :class:`Selection`) and is registered by name in ``SELECTORS``, so estimators
accept a name, a selector object or explicit centres through :func:`resolve_centers`.

=====================  =====================================================  ==============
name                   method                                                 kernel entries
=====================  =====================================================  ==============
``uniform``            uniform without replacement                            0
``pivoted_cholesky``   greedy pivoted Cholesky                                (k+1) n
``rpcholesky``         randomly pivoted Cholesky (Chen et al.)                (k+1) n
``block_rpcholesky``   blocked RPCholesky                                     (k+1) n
``rls``                recursive ridge leverage scores (Musco and Musco)      O(n k)
``bless``              coarse-to-fine leverage scores (Rudi et al.)           O(n k)
``kmeans``             k-means centroids (not data points)                    0
``kdpp``               exact k-DPP, small n                                   n^2
``greedy``             greedy forward selection (Farahat et al.)              n^2
``continuous``         continuous optimisation (Mathur, Moka and Botev)       products only
=====================  =====================================================  ==============
"""

from ._access import DenseGram, FeatureGram, GramAccess, KernelGram
from ._base import (
    SELECTORS,
    LandmarkSelector,
    Selection,
    Uniform,
    check_k,
    register_selector,
    resolve_centers,
)
from ._relaxation import (
    frobenius_gradient,
    frobenius_loss,
    relaxed_nystroem,
    stochastic_gradient,
    t_from_w,
    trace_gradient,
    trace_loss,
    w_from_t,
)
from .bless import BLESS, bless
from .cholesky import BlockRPCholesky, PivotedCholesky, RPCholesky, pivoted_cholesky
from .continuous import (
    ContinuousResult,
    ContinuousSelector,
    continuous_column_subset,
    continuous_landmarks,
    search_lambda,
)
from .dpp import KDPP, sample_kdpp
from .greedy import GreedySelector, greedy_selection
from .kmeans import KMeansCenters, kmeans
from .leverage import RecursiveRLS, recursive_rls, ridge_leverage_scores
from .metrics import (
    approximation_factor,
    best_rank_k_errors,
    column_subset_error,
    nystroem_errors,
    nystroem_factor,
)

for _name, _cls in {
    "pivoted_cholesky": PivotedCholesky,
    "rpcholesky": RPCholesky,
    "block_rpcholesky": BlockRPCholesky,
    "rls": RecursiveRLS,
    "bless": BLESS,
    "kmeans": KMeansCenters,
    "kdpp": KDPP,
    "greedy": GreedySelector,
    "continuous": ContinuousSelector,
}.items():
    register_selector(_name, _cls)

__all__ = [
    "SELECTORS",
    "BLESS",
    "BlockRPCholesky",
    "ContinuousResult",
    "ContinuousSelector",
    "DenseGram",
    "FeatureGram",
    "GramAccess",
    "GreedySelector",
    "KDPP",
    "KMeansCenters",
    "KernelGram",
    "LandmarkSelector",
    "PivotedCholesky",
    "RPCholesky",
    "RecursiveRLS",
    "Selection",
    "Uniform",
    "approximation_factor",
    "best_rank_k_errors",
    "bless",
    "check_k",
    "column_subset_error",
    "continuous_column_subset",
    "continuous_landmarks",
    "frobenius_gradient",
    "frobenius_loss",
    "greedy_selection",
    "kmeans",
    "nystroem_errors",
    "nystroem_factor",
    "pivoted_cholesky",
    "recursive_rls",
    "register_selector",
    "relaxed_nystroem",
    "resolve_centers",
    "ridge_leverage_scores",
    "sample_kdpp",
    "search_lambda",
    "stochastic_gradient",
    "t_from_w",
    "trace_gradient",
    "trace_loss",
    "w_from_t",
]
