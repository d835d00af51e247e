/* The proximal operator of c ||.||_inf row by row, for one element type; included by paths.c
 * with REAL and SUFFIX defined.
 *
 * prox(v) = clip(v, -theta, theta) with the level theta >= 0 solving
 * sum_i (|v_i| - theta)_+ = c, found by the Newton (Michelot) iteration of
 * kernelflow.solvers.prox from the cold start (sum |v| - c) / n: theta <- theta + (sum_{|v_i| >
 * theta} (|v_i| - theta) - c) / #{|v_i| > theta}, which stops exactly once the count repeats.
 * Rows with sum |v| <= c get 0 (theta 0), rows with c <= 0 keep v, other rows holding a NaN
 * get NaN (as in the tensor code). Sums accumulate in double. One pass of the iteration is
 * O(n); the proximal methods call this on thousands of short rows per step, where tensor code
 * pays its fixed cost per call many times over.
 */


/* Eight doubles (and 64-bit lanes) per vector, GCC vector extensions as in add_rows; the
 * elements are loaded eight at a time and widened to double. */
typedef double CAT(dlanes, SUFFIX) __attribute__((vector_size(64)));
typedef int64_t CAT(lanes, SUFFIX) __attribute__((vector_size(64)));
typedef REAL CAT(rvec, SUFFIX) __attribute__((vector_size(8 * sizeof(REAL))));

static inline __attribute__((always_inline)) CAT(dlanes, SUFFIX) CAT(abs8, SUFFIX)(const REAL *v)
{
    typedef CAT(dlanes, SUFFIX) D;
    typedef CAT(lanes, SUFFIX) I;
    CAT(rvec, SUFFIX) x;
    memcpy(&x, v, sizeof x);
    const D d = __builtin_convertvector(x, D);
    return (D)((I)d & ((I){0} + INT64_MAX)); /* clear the sign bits */
}

static inline __attribute__((always_inline)) double CAT(hsum, SUFFIX)(CAT(dlanes, SUFFIX) a)
{
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* The last n % 8 elements of v, zero-padded to eight: a zero adds nothing to either pass
 * (|0| - theta > 0 never holds, theta being >= 0). */
static inline __attribute__((always_inline)) CAT(dlanes, SUFFIX)
    CAT(abs_tail, SUFFIX)(const REAL *v, int64_t n)
{
    REAL buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t i0 = n - n % 8;
    for (int64_t i = i0; i < n; ++i)
        buf[i - i0] = v[i];
    return CAT(abs8, SUFFIX)(buf);
}

/* sum |v_i| in a fixed order (two vector lanes, then the tail) */
static inline __attribute__((always_inline)) double CAT(abs_sum, SUFFIX)(const REAL *restrict v,
                                                                         int64_t n)
{
    CAT(dlanes, SUFFIX) a0 = {0}, a1 = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 += CAT(abs8, SUFFIX)(v + i);
        a1 += CAT(abs8, SUFFIX)(v + i + 8);
    }
    if (i + 8 <= n) {
        a0 += CAT(abs8, SUFFIX)(v + i);
        i += 8;
    }
    if (i < n)
        a1 += CAT(abs_tail, SUFFIX)(v, n);
    return CAT(hsum, SUFFIX)(a0 + a1);
}

/* sum_i (|v_i| - theta)_+ into *s, #{|v_i| > theta} returned (theta >= 0). */
static inline __attribute__((always_inline)) int64_t
    CAT(level_pass, SUFFIX)(const REAL *restrict v, int64_t n, double theta, double *s)
{
    typedef CAT(dlanes, SUFFIX) D;
    typedef CAT(lanes, SUFFIX) I;
    D a0 = {0}, a1 = {0};
    I c0 = {0}, c1 = {0};
    const D th = (D){0} + theta;
#define KF_LEVEL_STEP(ABS, ACC, CNT)                                                           \
    do {                                                                                       \
        const D d_ = (ABS) - th;                                                               \
        const I m_ = d_ > 0; /* -1 where positive */                                          \
        ACC += (D)((I)d_ & m_);                                                                \
        CNT -= m_;                                                                             \
    } while (0)
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        KF_LEVEL_STEP(CAT(abs8, SUFFIX)(v + i), a0, c0);
        KF_LEVEL_STEP(CAT(abs8, SUFFIX)(v + i + 8), a1, c1);
    }
    if (i + 8 <= n) {
        KF_LEVEL_STEP(CAT(abs8, SUFFIX)(v + i), a0, c0);
        i += 8;
    }
    if (i < n)
        KF_LEVEL_STEP(CAT(abs_tail, SUFFIX)(v, n), a1, c1);
#undef KF_LEVEL_STEP
    *s = CAT(hsum, SUFFIX)(a0 + a1);
    const I c = c0 + c1;
    return ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
}

/* out may be v itself (the final loop reads v[i] before writing out[i]). */
TARGET_CLONES static void CAT(prox_linf_row, SUFFIX)(const REAL *v, double c, int64_t n,
                                                     REAL *out, REAL *theta_out)
{
    const double total = CAT(abs_sum, SUFFIX)(v, n);
    if (isnan(total) || isnan(c)) { /* no level: NaN, except that c <= 0 keeps v */
        for (int64_t i = 0; i < n; ++i)
            out[i] = c <= 0 ? v[i] : (REAL)NAN;
        *theta_out = (REAL)NAN;
        return;
    }
    if (total <= c) { /* inside the ball: the prox is 0 (or v itself when c <= 0) */
        for (int64_t i = 0; i < n; ++i)
            out[i] = c <= 0 ? v[i] : (REAL)0;
        *theta_out = 0;
        return;
    }
    const double radius = c > 0 ? c : 0.0;
    const double cold = fmax((total - radius) / (double)n, 0.0);
    double theta = cold;
    int64_t last = -1;
    for (int64_t pass = 0; pass < n + 2; ++pass) {
        double s;
        const int64_t k = CAT(level_pass, SUFFIX)(v, n, theta, &s);
        theta = fmax(k > 0 ? theta + (s - radius) / (double)k : cold, 0.0);
        if (k == last)
            break;
        last = k;
    }
    if (c <= 0) {
        for (int64_t i = 0; i < n; ++i)
            out[i] = v[i];
    } else {
        const REAL t = (REAL)theta;
        for (int64_t i = 0; i < n; ++i)
            out[i] = v[i] > t ? t : (v[i] < -t ? -t : v[i]);
    }
    *theta_out = (REAL)theta;
}

/* One step of capped ISTA with the l-infinity penalty on B rows of length n, in place:
 * a <- prox_{c ||.||_inf}(a - eta (p - y)) with p = K a (computed by the caller), and
 * moved[b] = ||a_new - a_old||_2. The step is formed by the expression of the tensor code
 * (no fused multiply-add: see paths.c), so only the level's rounding differs from it.
 * Returns 0, or -1 when scratch memory is missing. */
int CAT(kf_ista_linf_step, SUFFIX)(REAL *A, const REAL *P, const REAL *Y, const REAL *eta,
                                   const REAL *c, int64_t B, int64_t n, double *moved)
{
    REAL *v = malloc(sizeof(REAL) * (size_t)(n > 0 ? n : 1));
    if (!v)
        return -1;
    for (int64_t b = 0; b < B; ++b) {
        REAL *a = A + b * n;
        const REAL *p = P + b * n, *y = Y + b * n;
        const REAL e = eta[b];
        for (int64_t i = 0; i < n; ++i)
            v[i] = a[i] - e * (p[i] - y[i]);
        REAL theta;
        CAT(prox_linf_row, SUFFIX)(v, (double)c[b], n, v, &theta);
        double s = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const double d = (double)v[i] - (double)a[i];
            s += d * d;
            a[i] = v[i];
        }
        moved[b] = sqrt(s);
    }
    free(v);
    return 0;
}

/* B rows of length n (row-major v, out), thresholds c[B]; the levels into theta[B]. */
void CAT(kf_prox_linf, SUFFIX)(const REAL *v, const REAL *c, int64_t B, int64_t n, REAL *out,
                               REAL *theta)
{
    for (int64_t b = 0; b < B; ++b)
        CAT(prox_linf_row, SUFFIX)(v + b * n, (double)c[b], n, out + b * n, theta + b);
}
