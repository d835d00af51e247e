/* Sign and coordinate descent paths for one element type; included by paths.c with
 * REAL (double or float) and SUFFIX (f64 or f32) defined.
 *
 * A problem starts from alpha = 0 on some rows of a symmetric kernel (its training rows; the
 * other coefficients stay 0) and keeps the residual r = y - K alpha on its training and
 * validation rows:
 *
 *   sign:        alpha_t += eta sign(r_t) on training rows, sign(0) = 0
 *   coordinate:  alpha_m += eta sign(r_m) on every training row m attaining max |r| over the
 *                training rows (all ties move)
 *
 * Layout. The problem works on a local copy L of K: row t is training row t, columns are the
 * training rows then the validation rows, padded with zero columns to a multiple of 16
 * (so r, y and w have ld entries, training entries first); a problem whose training rows are
 * all the rows, in order, uses K itself. Every update of r or of w = K s is then a sum of a
 * few rows of L, computed by `add_rows` with a block of r (or w) held in registers.
 *
 * Sign descent keeps the residual as an anchor r and its change per step c = eta L^T s for the
 * current signs s: J steps after the anchor the residual is r - J c. A step whose signs do not
 * change touches neither; a flipped sign moves the anchor to the current residual and changes c
 * by eta times the change of sign times one row; when most signs reverse, c is negated and
 * corrected by the rows whose sign did not reverse, and when that is still more rows than
 * there are non-zero signs, c is summed from scratch. alpha = eta * count with count the
 * running sum of the signs (integers, exact in double). Every max(resync, n_tr) steps r and
 * c are recomputed from count (two dense products, so O(n) per step on average), which bounds
 * the rounding drift of the running sums.
 * After a step without a sign change the loop finds, from the crossings r_t / c_t checked with
 * the same expression, the next step at which a sign changes, and skips the steps before it,
 * scoring only their validation entries: the same results as visiting every step.
 *
 * After every step the weighted validation error (squared, absolute or Huber with threshold
 * veps, by vloss) on the validation entries is recorded; the problem stops after `patience`
 * steps without a strict improvement, or after max_iter steps.
 */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* The sums of rows may fuse multiplies and adds (everything else is compiled without: see
 * paths.c). */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
/* x[0:ld] += sum_q coef[q] * L[row[q], 0:ld] (rows of L are ld apart). A block of x is held in
 * vector registers while all rows are added to it (GCC vector extensions; 64-byte vectors are
 * split by the compiler where the target has narrower ones). With n_max > 0 it also returns
 * max_{j < n_max} |x_j| of the new x (NaN entries ignored, as `a > top ? a : top` does; the
 * maximum is exact in any order), so that coordinate descent needs no separate pass for it;
 * with n_max = 0 it returns 0. */
typedef REAL CAT(vec, SUFFIX) __attribute__((vector_size(64)));
typedef RINT CAT(ivec, SUFFIX) __attribute__((vector_size(64)));
/* every bit of a RINT but the sign: x & KF_ABS_BITS is |x| for a REAL x of the same width */
#ifndef KF_ABS_BITS
#define KF_ABS_BITS ((RINT)(~(uint64_t)0 >> (65 - 8 * sizeof(RINT))))
#endif

/* lane-wise max of |x| into m (whole vectors below n_max only; the rest is scalar) */
#define KF_MAX_ABS(m, x)                                                                       \
    do {                                                                                       \
        const I a_ = (I)(x) & sign_off;                                                        \
        const I gt_ = (V)a_ > (m);                                                             \
        (m) = (V)((a_ & gt_) | ((I)(m) & ~gt_));                                               \
    } while (0)

TARGET_CLONES static REAL CAT(add_rows, SUFFIX)(const REAL *restrict L, int64_t ld,
                                                const int64_t *restrict row,
                                                const REAL *restrict coef, int64_t count,
                                                REAL *restrict x, int64_t n_max)
{
    typedef CAT(vec, SUFFIX) V;
    typedef CAT(ivec, SUFFIX) I;
    enum { VL = (int)(sizeof(V) / sizeof(REAL)) };
    const I sign_off = (I){0} + KF_ABS_BITS;
    V m = {0};
    int64_t j0 = 0;
    for (; j0 + 4 * VL <= ld; j0 += 4 * VL) {
        V a0, a1, a2, a3;
        memcpy(&a0, x + j0, sizeof(V));
        memcpy(&a1, x + j0 + VL, sizeof(V));
        memcpy(&a2, x + j0 + 2 * VL, sizeof(V));
        memcpy(&a3, x + j0 + 3 * VL, sizeof(V));
        for (int64_t q = 0; q < count; ++q) {
            const REAL *src = L + row[q] * ld + j0;
            const V c = (V){0} + coef[q];
            V s0, s1, s2, s3;
            memcpy(&s0, src, sizeof(V));
            memcpy(&s1, src + VL, sizeof(V));
            memcpy(&s2, src + 2 * VL, sizeof(V));
            memcpy(&s3, src + 3 * VL, sizeof(V));
            a0 += c * s0;
            a1 += c * s1;
            a2 += c * s2;
            a3 += c * s3;
        }
        memcpy(x + j0, &a0, sizeof(V));
        memcpy(x + j0 + VL, &a1, sizeof(V));
        memcpy(x + j0 + 2 * VL, &a2, sizeof(V));
        memcpy(x + j0 + 3 * VL, &a3, sizeof(V));
        if (j0 + VL <= n_max)
            KF_MAX_ABS(m, a0);
        if (j0 + 2 * VL <= n_max)
            KF_MAX_ABS(m, a1);
        if (j0 + 3 * VL <= n_max)
            KF_MAX_ABS(m, a2);
        if (j0 + 4 * VL <= n_max)
            KF_MAX_ABS(m, a3);
    }
    for (; j0 + VL <= ld; j0 += VL) {
        V a0;
        memcpy(&a0, x + j0, sizeof(V));
        for (int64_t q = 0; q < count; ++q) {
            V s0;
            memcpy(&s0, L + row[q] * ld + j0, sizeof(V));
            a0 += ((V){0} + coef[q]) * s0;
        }
        memcpy(x + j0, &a0, sizeof(V));
        if (j0 + VL <= n_max)
            KF_MAX_ABS(m, a0);
    }
    for (; j0 < ld; ++j0) {
        REAL a = x[j0];
        for (int64_t q = 0; q < count; ++q)
            a += coef[q] * L[row[q] * ld + j0];
        x[j0] = a;
    }
    REAL top = 0;
    for (int j = 0; j < VL; ++j)
        top = m[j] > top ? m[j] : top;
    for (int64_t j = n_max - n_max % VL; j < n_max; ++j) { /* the last, partial vector */
        const REAL b = x[j] < 0 ? -x[j] : x[j];
        top = b > top ? b : top;
    }
    return top;
}
#undef KF_MAX_ABS

#pragma GCC pop_options

/* Weighted validation error of the validation entries of r - J c (the residual J steps after
 * the anchor r, each step moving it by -c; c NULL: r itself): squared (vloss 0), absolute (1)
 * or Huber with threshold veps (2), as kernelflow.solvers.losses defines them. */
static double CAT(val_error, SUFFIX)(const REAL *r, const REAL *c, REAL J, const double *wval,
                                     int64_t n_val, int32_t vloss, double veps)
{
    double e = 0.0;
    for (int64_t v = 0; v < n_val; ++v) {
        const REAL d = c ? r[v] - J * c[v] : r[v];
        const double a = fabs((double)d);
        if (vloss == VLOSS_SQUARED)
            e += wval[v] * a * a;
        else if (vloss == VLOSS_ABSOLUTE)
            e += wval[v] * a;
        else
            e += wval[v] * (a <= veps ? 0.5 * a * a : veps * (a - 0.5 * veps));
    }
    return isfinite(e) ? e : INFINITY;
}

/* The patience rule after step k; returns 1 when the problem stops there. */
static int CAT(stops, SUFFIX)(const REAL *r_val, const REAL *c_val, REAL J, const double *wval,
                              int64_t n_val, int32_t vloss, double veps, int64_t k,
                              int64_t patience, double *best, int64_t *best_it)
{
    if (n_val == 0)
        return 0;
    const double err = CAT(val_error, SUFFIX)(r_val, c_val, J, wval, n_val, vloss, veps);
    if (err < *best) {
        *best = err;
        *best_it = k;
    }
    return k - *best_it >= patience;
}

/* r = y - eta * sum_t c_t L[t, :] */
static void CAT(residual, SUFFIX)(const REAL *L, int64_t ld, const REAL *y, int64_t n_tr,
                                  const double *count, REAL eta, int64_t *idx, REAL *coef,
                                  REAL *r)
{
    int64_t m = 0;
    for (int64_t t = 0; t < n_tr; ++t) {
        idx[m] = t;
        coef[m] = -eta * (REAL)count[t];
        m += count[t] != 0;
    }
    for (int64_t j = 0; j < ld; ++j)
        r[j] = y[j];
    CAT(add_rows, SUFFIX)(L, ld, idx, coef, m, r, 0);
}

/* New signs of r[0:n_tr] - J c[0:n_tr] into sn, their changes sn - sign into d, sn + sign
 * into k (non-zero where a sign did not reverse), and the running sums of the signs (the
 * coefficients in units of eta) into count; returns the number of changes and stores the
 * number of non-zero signs in *n_nonzero and of signs that did not reverse in *n_keep. All
 * zeros are +0. Branch-free, so it vectorises. */
TARGET_CLONES static int64_t CAT(new_signs, SUFFIX)(int64_t n_tr, const REAL *restrict r,
                                                    const REAL *restrict c, REAL J,
                                                    const REAL *restrict sign,
                                                    REAL *restrict sn, REAL *restrict d,
                                                    REAL *restrict k, double *restrict count,
                                                    int64_t *n_nonzero, int64_t *n_keep)
{
    int64_t flips = 0, nonzero = 0, keep = 0;
    for (int64_t t = 0; t < n_tr; ++t) {
        const REAL v = r[t] - J * c[t];
        const REAL s = (REAL)(v > 0) - (REAL)(v < 0);
        sn[t] = s;
        d[t] = s - sign[t];
        k[t] = s + sign[t];
        count[t] += (double)s;
        nonzero += s != 0;
        flips += s != sign[t];
        keep += s + sign[t] != 0;
    }
    *n_nonzero = nonzero;
    *n_keep = keep;
    return flips;
}

/* The rows t < n_tr with v[t] != 0 into idx, with coef = eta v[t]; returns their number. The
 * values are small integers whose zeros are +0, so a block of 8 is all zero exactly when the OR
 * of its bit patterns is: the scan costs little where few rows qualify. coef may be v (each
 * block is read before any of it is written). */
TARGET_CLONES static int64_t CAT(gather, SUFFIX)(int64_t n_tr, const REAL *v, REAL eta,
                                                 int64_t *restrict idx, REAL *coef)
{
    typedef uint64_t CAT(bits, SUFFIX) __attribute__((vector_size(8 * sizeof(REAL))));
    int64_t m = 0, t0 = 0;
    for (; t0 + 8 <= n_tr; t0 += 8) {
        CAT(bits, SUFFIX) b;
        memcpy(&b, v + t0, sizeof b);
        uint64_t any = 0;
        for (int j = 0; j < (int)(sizeof b / sizeof b[0]); ++j)
            any |= b[j];
        if (!any)
            continue;
        REAL blk[8];
        memcpy(blk, v + t0, sizeof blk);
        for (int j = 0; j < 8; ++j)
            if (blk[j] != 0) {
                idx[m] = t0 + j;
                coef[m++] = eta * blk[j];
            }
    }
    for (; t0 < n_tr; ++t0) {
        const REAL x = v[t0];
        if (x != 0) {
            idx[m] = t0;
            coef[m++] = eta * x;
        }
    }
    return m;
}

/* r = r - J c (the residual J steps after the anchor, by the expression of `new_signs`). */
TARGET_CLONES static void CAT(move_anchor, SUFFIX)(int64_t ld, REAL *restrict r,
                                                   const REAL *restrict c, REAL J)
{
    for (int64_t j = 0; j < ld; ++j)
        r[j] = r[j] - J * c[j];
}

TARGET_CLONES static void CAT(negate, SUFFIX)(int64_t ld, REAL *restrict c)
{
    for (int64_t j = 0; j < ld; ++j)
        c[j] = -c[j];
}

/* The first J in [J0, J_end) at which the sign of some r[t] - J c[t] (t < n_tr) differs from
 * sign[t], or J_end when none does. Exact: the residual J steps after the anchor is computed by
 * the same expression as in `new_signs`, and it is monotone in J (rounding is monotone), so the
 * analytic crossing r / c only narrows the search; the expression decides. */
static int64_t CAT(next_flip, SUFFIX)(int64_t n_tr, const REAL *r, const REAL *c,
                                      const REAL *sign, int64_t J0, int64_t J_end)
{
    const double tol = sizeof(REAL) == sizeof(double) ? 1e-14 : 1e-5;
    int64_t next = J_end;
    for (int64_t t = 0; t < n_tr && next > J0; ++t) {
        const REAL s = sign[t], ct = c[t], rt = r[t];
        if (s == 0) {
            if (ct != 0 || !(rt == 0))
                next = J0; /* leaves zero at once (or cannot be told apart): no skip */
            continue;
        }
        if (!(s * ct > 0)) {
            if (s * ct == 0 || s * ct < 0)
                continue; /* constant or moving away from zero: never flips */
            next = J0; /* not a number */
            continue;
        }
        /* all J <= cross (1 - tol) - 1 keep the sign (the product J c stays below |r|) */
        const double cross = (double)rt / (double)ct;
        const double safe = cross * (1.0 - tol) - 1.0;
        if (safe >= (double)(next - 1))
            continue;
        int64_t J = safe > (double)J0 ? (int64_t)safe : J0;
        while (J < next && s * (rt - (REAL)J * ct) > 0)
            ++J;
        next = J;
    }
    return next;
}

/* Scratch (length ld each): c, sign, sn, coef, keep (REAL); idx (int64). On entry r = y; on
 * exit count holds alpha / eta. The residual is kept as an anchor r and a per-step change
 * c = eta K sign: J steps after the anchor it is r - J c, so steps without a sign change leave
 * r and c untouched, and with `jump` the loop skips from one sign change (or patience
 * checkpoint) to the next, scoring only the validation entries of the skipped steps. */
static int64_t CAT(sign_problem, SUFFIX)(const REAL *L, int64_t ld, const REAL *y,
                                         int64_t n_tr, const double *wval, int64_t n_val,
                                         int32_t vloss, double veps,
                                         REAL eta, int64_t max_iter, int64_t patience,
                                         int64_t resync, int jump, double *count, REAL *r,
                                         REAL *c, REAL *sign, REAL *sn, REAL *coef,
                                         REAL *keep, int64_t *idx, double *best,
                                         int64_t *best_it)
{
    int64_t k = 0, since = 0, ka = 0;
    /* a recomputation costs two dense products: at most one per n_tr steps keeps it O(n) per
       step on average */
    const int64_t period = resync > n_tr ? resync : n_tr;
    for (int64_t t = 0; t < n_tr; ++t) {
        count[t] = 0;
        sign[t] = 0;
    }
    for (int64_t j = 0; j < ld; ++j)
        c[j] = 0;
    while (k < max_iter) {
        if (since == period) { /* recompute r from the coefficients; w from scratch below */
            CAT(residual, SUFFIX)(L, ld, y, n_tr, count, eta, idx, coef, r);
            ka = k;
            for (int64_t t = 0; t < n_tr; ++t)
                sign[t] = 0;
            for (int64_t j = 0; j < ld; ++j)
                c[j] = 0;
            since = 0;
        }
        const REAL J = (REAL)(k - ka);
        int64_t n_nonzero, n_keep;
        const int64_t n_flip = CAT(new_signs, SUFFIX)(n_tr, r, c, J, sign, sn, coef, keep,
                                                      count, &n_nonzero, &n_keep);
        if (n_flip > 0) { /* a new anchor: the residual now */
            CAT(move_anchor, SUFFIX)(ld, r, c, J);
            ka = k;
            /* the new c = eta K sn from the fewest rows of L: the old c plus eta times the
               changes of sign (n_flip rows), minus the old c plus eta times (sn + sign) (the
               rows whose sign did not reverse: few where most signs flip, as in the
               oscillation of narrow bandwidths), or from scratch (the non-zero signs) */
            int64_t m;
            if (n_flip <= n_keep && n_flip < n_nonzero) {
                m = CAT(gather, SUFFIX)(n_tr, coef, eta, idx, coef);
            } else if (n_keep < n_nonzero) {
                m = CAT(gather, SUFFIX)(n_tr, keep, eta, idx, coef);
                CAT(negate, SUFFIX)(ld, c);
            } else {
                m = CAT(gather, SUFFIX)(n_tr, sn, eta, idx, coef);
                memset(c, 0, sizeof(REAL) * (size_t)ld);
            }
            CAT(add_rows, SUFFIX)(L, ld, idx, coef, m, c, 0);
        }
        REAL *tmp = sign; /* the new signs become the current ones */
        sign = sn;
        sn = tmp;
        ++k;
        ++since;
        if (CAT(stops, SUFFIX)(r + n_tr, c + n_tr, (REAL)(k - ka), wval, n_val, vloss, veps, k,
                               patience, best, best_it))
            break;
        if (jump && n_flip == 0) {
            /* the steps before the next sign change or recomputation have no flip (tried only
               after a step without one: where signs flip at every step, the search would not
               pay) */
            int64_t limit = max_iter - k;
            limit = limit < period - since ? limit : period - since;
            const int64_t J_next = CAT(next_flip, SUFFIX)(n_tr, r, c, sign, k - ka,
                                                          k - ka + limit);
            int64_t done = 0, stop = 0;
            const int64_t m = J_next - (k - ka);
            if (n_val == 0) { /* nothing to score per step */
                done = m;
                k += m;
                since += m;
            } else {
                while (done < m && !stop) {
                    ++done;
                    ++k;
                    ++since;
                    stop = CAT(stops, SUFFIX)(r + n_tr, c + n_tr, (REAL)(k - ka), wval,
                                              n_val, vloss, veps, k, patience, best, best_it);
                }
            }
            if (done > 0)
                for (int64_t t = 0; t < n_tr; ++t)
                    count[t] += (double)done * (double)sign[t];
            if (stop)
                break;
        }
    }
    return k;
}

/* max_t |r_t| over t < n_tr (NaN entries ignored, as `a > top ? a : top` does): add_rows
 * with no rows. */
static REAL CAT(max_abs, SUFFIX)(const REAL *L, int64_t ld, REAL *r, int64_t n_tr)
{
    return CAT(add_rows, SUFFIX)(L, ld, NULL, NULL, 0, r, n_tr);
}

/* The rows t < n_tr with |r_t| == top > 0, in increasing order, into idx with coef =
 * -eta sign(r_t); returns their number (|r_t| is r_t with its sign bit cleared, the same value
 * as the scalar `r < 0 ? -r : r` wherever it can equal top). */
TARGET_CLONES static int64_t CAT(ties, SUFFIX)(const REAL *restrict r, int64_t n_tr, REAL top,
                                               REAL eta, int64_t *restrict idx,
                                               REAL *restrict coef)
{
    typedef CAT(vec, SUFFIX) V;
    typedef CAT(ivec, SUFFIX) I;
    enum { VL = (int)(sizeof(V) / sizeof(REAL)) };
    const I sign_off = (I){0} + KF_ABS_BITS;
    int64_t n_tie = 0;
    if (!(top > 0))
        return 0;
    const V tv = (V){0} + top;
    int64_t t0 = 0;
    for (; t0 + VL <= n_tr; t0 += VL) {
        V x;
        memcpy(&x, r + t0, sizeof x);
        const I eq = (V)((I)x & sign_off) == tv;
        RINT any = 0;
        for (int j = 0; j < VL; ++j)
            any |= eq[j];
        if (!any)
            continue;
        for (int j = 0; j < VL; ++j)
            if (eq[j]) {
                idx[n_tie] = t0 + j;
                coef[n_tie++] = x[j] > 0 ? -eta : eta; /* r moves against the step */
            }
    }
    for (int64_t t = t0; t < n_tr; ++t) {
        if ((r[t] < 0 ? -r[t] : r[t]) == top) {
            idx[n_tie] = t;
            coef[n_tie++] = r[t] > 0 ? -eta : eta;
        }
    }
    return n_tie;
}

/* Scratch (length ld each): coef (REAL), idx (int64). On entry r = y; on exit count holds
 * alpha / eta. */
static int64_t CAT(coordinate_problem, SUFFIX)(const REAL *L, int64_t ld, int64_t n_tr,
                                               const double *wval, int64_t n_val,
                                               int32_t vloss, double veps, REAL eta,
                                               int64_t max_iter, int64_t patience,
                                               double *count, REAL *r, REAL *coef,
                                               int64_t *idx, double *best, int64_t *best_it)
{
    int64_t k = 0;
    for (int64_t t = 0; t < n_tr; ++t)
        count[t] = 0;
    REAL top = CAT(max_abs, SUFFIX)(L, ld, r, n_tr); /* then kept by add_rows */
    while (k < max_iter) {
        const int64_t n_tie = CAT(ties, SUFFIX)(r, n_tr, top, eta, idx, coef);
        if (!(top > 0) && n_val == 0) {
            break; /* zero residual: the path has ended (with validation rows, keep counting
                      steps, as the patience rule does) */
        }
        /* every tied row moves by its residual's sign from before the step */
        for (int64_t q = 0; q < n_tie; ++q)
            count[idx[q]] += coef[q] < 0 ? 1.0 : -1.0;
        top = CAT(add_rows, SUFFIX)(L, ld, idx, coef, n_tie, r, n_tr);
        ++k;
        if (CAT(stops, SUFFIX)(r + n_tr, NULL, 0, wval, n_val, vloss, veps, k, patience, best,
                               best_it))
            break;
    }
    return k;
}
