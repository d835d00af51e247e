/* Native inner loops of kernel sign descent and kernel coordinate descent.
 *
 * Early stopping cross-validates hundreds of small problems, each a sequential loop of up to
 * 10^4 cheap steps: per step O(n) work for the residual signs and O(n) per flipped sign (sign
 * descent) or per moved coefficient (coordinate descent). In tensor code every step pays the
 * fixed cost of several library calls; here it costs only its arithmetic. The functions are
 * called through ctypes (kernelflow.solvers._native), which releases the GIL, so independent
 * batches of problems can run on several threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The skipping loops decide a sign change by the same expression as the step-by-step loops:
   no fused multiply-add may change one of them and not the other. */
#pragma GCC optimize("fp-contract=off")
/* 64-byte vector values inside the default (non-AVX-512) clones: static helpers only, so the
   ABI note does not concern any caller outside this file. */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TARGET_CLONES
#endif

enum { VLOSS_SQUARED = 0, VLOSS_ABSOLUTE = 1, VLOSS_HUBER = 2 };

#define REAL double
#define RINT int64_t
#define SUFFIX f64
#include "paths_impl.h"
#include "prox_impl.h"
#undef REAL
#undef RINT
#undef SUFFIX

#define REAL float
#define RINT int32_t
#define SUFFIX f32
#include "paths_impl.h"
#include "prox_impl.h"
#undef REAL
#undef RINT
#undef SUFFIX

enum { METHOD_SIGN = 0, METHOD_COORDINATE = 1, FLAG_STEPWISE = 2 };

/* Grows *buf to hold `size` bytes; returns 0 on failure. */
static int reserve(void **buf, size_t *have, size_t size)
{
    if (size <= *have)
        return 1;
    void *p = realloc(*buf, size);
    if (!p)
        return 0;
    *buf = p;
    *have = size;
    return 1;
}

/* P problems. Problem p runs on kernel K[kernel_of[p]] (n x n, symmetric, row-major), targets
 * Y[target_of[p]], training rows train[fold_of[p]] != 0 and validation weights
 * wval[fold_of[p]] (rows with weight 0 are not validation rows), scored by the validation loss
 * vloss (VLOSS_*; Huber's threshold veps[fold_of[p]]). Outputs per problem: the best
 * validation error and its step (1-based; 0 if never finite), the steps run, and (if alpha is
 * not NULL) the final coefficients (P x n). Returns 0, or -1 if memory is missing. */
#define DEFINE_ENTRY(REAL_T, SFX)                                                             \
    int kf_paths_##SFX(int32_t method, const REAL_T *K, int64_t n, int64_t P,                  \
                       const int64_t *kernel_of, const REAL_T *Y, const int64_t *target_of,    \
                       const uint8_t *train, const double *wval, const int64_t *fold_of,       \
                       int32_t vloss, const double *veps, REAL_T eta, int64_t max_iter,        \
                       int64_t patience, int64_t resync,                                       \
                       double *best, int64_t *best_it, int64_t *n_iter, REAL_T *alpha)         \
    {                                                                                          \
        const int64_t ld_max = 2 * n + 16;                                                     \
        int64_t *ints = malloc(sizeof(int64_t) * (size_t)(2 * ld_max));                       \
        REAL_T *reals = malloc(sizeof(REAL_T) * (size_t)(7 * ld_max));                        \
        double *wv = malloc(sizeof(double) * (size_t)(n + 1));                                \
        double *count = malloc(sizeof(double) * (size_t)(n + 1));                             \
        void *local = NULL;                                                                    \
        size_t local_size = 0;                                                                 \
        int status = (ints && reals && wv && count) ? 0 : -1;                                  \
        int64_t *col = ints, *idx = ints + ld_max;                                            \
        REAL_T *yl = reals, *r = reals + ld_max, *w = reals + 2 * ld_max,                      \
               *sg = reals + 3 * ld_max, *sn = reals + 4 * ld_max, *coef = reals + 5 * ld_max, \
               *keep = reals + 6 * ld_max;                                                     \
        for (int64_t p = 0; p < P && status == 0; ++p) {                                       \
            const uint8_t *m = train + fold_of[p] * n;                                         \
            const double *vw = wval + fold_of[p] * n;                                          \
            const REAL_T *Kp = K + kernel_of[p] * n * n;                                       \
            const REAL_T *y = Y + target_of[p] * n;                                            \
            const double eps = veps ? veps[fold_of[p]] : 0.0;                                  \
            int64_t n_tr = 0, n_val = 0;                                                       \
            for (int64_t i = 0; i < n; ++i)                                                    \
                if (m[i])                                                                      \
                    col[n_tr++] = i;                                                           \
            for (int64_t i = 0; i < n; ++i)                                                    \
                if (vw[i] != 0) {                                                              \
                    col[n_tr + n_val] = i;                                                     \
                    wv[n_val++] = vw[i];                                                       \
                }                                                                              \
            const REAL_T *L = Kp;                                                              \
            int64_t ld = n;                                                                    \
            if (!(n_val == 0 && n_tr == n)) { /* a local copy: training rows, then the rest */ \
                ld = (n_tr + n_val + 15) / 16 * 16; /* whole 64-byte vectors */                \
                if (!reserve(&local, &local_size, sizeof(REAL_T) * (size_t)(n_tr * ld + 1))) { \
                    status = -1;                                                               \
                    break;                                                                     \
                }                                                                              \
                REAL_T *Lw = local;                                                            \
                for (int64_t t = 0; t < n_tr; ++t) {                                           \
                    const REAL_T *src = Kp + col[t] * n;                                       \
                    for (int64_t c = 0; c < n_tr + n_val; ++c)                                 \
                        Lw[t * ld + c] = src[col[c]];                                          \
                    for (int64_t c = n_tr + n_val; c < ld; ++c)                                \
                        Lw[t * ld + c] = 0;                                                    \
                }                                                                              \
                L = Lw;                                                                        \
            }                                                                                  \
            for (int64_t c = 0; c < ld; ++c)                                                   \
                yl[c] = c < n_tr + n_val ? y[col[c]] : 0;                                      \
            for (int64_t c = 0; c < ld; ++c)                                                   \
                r[c] = yl[c];                                                                  \
            best[p] = INFINITY;                                                                \
            best_it[p] = 0;                                                                    \
            if ((method & 1) == METHOD_SIGN)                                                   \
                n_iter[p] = sign_problem_##SFX(L, ld, yl, n_tr, wv, n_val, vloss, eps, eta,    \
                                               max_iter, patience, resync,                     \
                                               !(method & FLAG_STEPWISE), count, r, w, sg, sn, \
                                               coef, keep, idx, best + p, best_it + p);        \
            else                                                                               \
                n_iter[p] = coordinate_problem_##SFX(L, ld, n_tr, wv, n_val, vloss, eps, eta,  \
                                                     max_iter, patience, count, r, coef, idx,  \
                                                     best + p, best_it + p);                   \
            if (alpha) {                                                                       \
                REAL_T *a = alpha + p * n;                                                     \
                for (int64_t i = 0; i < n; ++i)                                                \
                    a[i] = 0;                                                                  \
                for (int64_t t = 0; t < n_tr; ++t)                                             \
                    a[col[t]] = eta * (REAL_T)count[t];                                        \
            }                                                                                  \
        }                                                                                      \
        free(ints);                                                                            \
        free(reals);                                                                           \
        free(wv);                                                                              \
        free(count);                                                                           \
        free(local);                                                                           \
        return status;                                                                         \
    }

DEFINE_ENTRY(double, f64)
DEFINE_ENTRY(float, f32)

/* An importable (empty) module, so that the library builds and installs as an extension. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_paths", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__paths(void) { return PyModule_Create(&module); }
