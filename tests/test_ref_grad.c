/*
 * test_ref_grad.c - gradient checks of the double-precision NSA reference
 * (ref/): for a scalar loss L = sum(do * o) every analytic gradient entry
 * produced by the *_bwd functions is compared with the central finite
 * difference (L(x + eps) - L(x - eps)) / (2 eps). Semantics: test_ref.c.
 *
 * Only ref_dep (ref/nsa_ref.h), cmocka and libm are needed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ref_problem.h"

/* eps = 1e-5: with the loss accumulated in long double the remaining noise
 * is the rounding inside o (~1e-16 relative), giving errors ~1e-8 at
 * eps = 1e-5 while the O(eps^2) truncation error stays below 1e-9; at
 * eps = 1e-6 the rounding noise alone reaches ~2e-7. */
static double FD_EPS = 1e-5;
#define FD_TOL 1e-6
/* Relative error |num - ana| / max(|num|, |ana|, FD_FLOOR): relative for
 * entries of size >= FD_FLOOR, absolute (scaled) below. */
#define FD_FLOOR 1e-3

static int fd_skipped; /* entries skipped because top-k flipped */

/* Tensors with more than FD_MAX_CHECK entries are checked on a random
 * sample of FD_MAX_CHECK entries (keeps the test fast at -O0). */
#define FD_MAX_CHECK 96

/* Compare the entries of the analytic gradient ana of parameter x[0..n)
 * with central differences of the loss.  Unless may_vanish, the gradient
 * must not be identically zero (which would make the check vacuous). */
static void fd_check_ex(problem *p, double *x, const double *ana, size_t n,
                        const char *name, int may_vanish)
{
    double max_err = 0.0, max_ana = 0.0;
    size_t worst = 0;
    size_t nchk = n <= FD_MAX_CHECK ? n : FD_MAX_CHECK;
    for (size_t it = 0; it < nchk; it++) {
        size_t i = n <= FD_MAX_CHECK ? it : (size_t)irand(0, (int)n - 1);
        double save = x[i];
        x[i] = save + FD_EPS;
        long double lp = loss(p);
        x[i] = save - FD_EPS;
        long double lm = loss(p);
        x[i] = save;
        if (isnan((double)lp) || isnan((double)lm)) {
            fd_skipped++;
            continue;
        }
        double num = (double)((lp - lm) / (2.0L * FD_EPS));
        double den = fmax(fmax(fabs(num), fabs(ana[i])), FD_FLOOR);
        double err = fabs(num - ana[i]) / den;
        if (err > max_err) {
            max_err = err;
            worst = i;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (fabs(ana[i]) > max_ana)
            max_ana = fabs(ana[i]);
    if (getenv("FD_VERBOSE"))
        fprintf(stderr, "%-8s n=%-5zu max_err %.3g max|g| %.3g\n", name, n,
                max_err, max_ana);
    if (max_err >= FD_TOL)
        print_error("%s: max relative error %.3g at entry %zu (analytic "
                    "%.12g)\n",
                    name, max_err, worst, ana[worst]);
    assert_true(max_err < FD_TOL);
    /* the check is only meaningful if the gradient is not identically 0 */
    if (may_vanish)
        return;
    if (max_ana <= 1e-3)
        print_error("%s: gradient is (nearly) zero\n", name);
    assert_true(max_ana > 1e-3);
}

static void fd_check(problem *p, double *x, const double *ana, size_t n,
                     const char *name)
{
    fd_check_ex(p, x, ana, n, name, 0);
}

/* Run the analytic backward of p->mode and check every relevant gradient. */
static void check_grads(problem *p)
{
    fd_skipped = 0;
    if (getenv("FD_EPS"))
        FD_EPS = atof(getenv("FD_EPS"));
    p->have_base = 0;
    assert_true(!isnan((double)loss(p))); /* records the top-k selection */
    grads g = analytic(p);
    assert_true(all_finite(g.dq, p->nq));
    if (p->mode != M_COMPRESS)
        fd_check(p, p->q, g.dq, p->nq, "dq");
    switch (p->mode) {
    case M_CMP:
        fd_check(p, p->kc, g.dkc, p->nkc, "dk_cmp");
        fd_check(p, p->vc, g.dvc, p->nvc, "dv_cmp");
        break;
    case M_COMPRESS:
        fd_check(p, p->W[0], g.dW[0], p->nW[0], "dW");
        fd_check(p, p->bias[0], g.db[0], p->nb[0], "dbias");
        fd_check(p, p->pe[0], g.dpe[0], p->npe[0], "dpe");
        fd_check(p, p->k, g.dk, p->nk, "dk");
        fd_check(p, p->v, g.dv, p->nv, "dv");
        break;
    case M_LINEAR:
        fd_check(p, p->W[0], g.dW[0], p->nW[0], "dW_k");
        /* a bias shared by all keys shifts every score of a query by the
         * same q.b, which softmax cancels: db_k is exactly 0 */
        fd_check_ex(p, p->bias[0], g.db[0], p->nb[0], "db_k", 1);
        for (size_t i = 0; i < p->nb[0]; i++)
            assert_true(fabs(g.db[0][i]) < 1e-12);
        /* so does pe (every visible compressed token is a full block) */
        fd_check_ex(p, p->pe[0], g.dpe[0], p->npe[0], "dpe_k", 1);
        fd_check(p, p->W[1], g.dW[1], p->nW[1], "dW_v");
        fd_check(p, p->bias[1], g.db[1], p->nb[1], "db_v");
        fd_check(p, p->pe[1], g.dpe[1], p->npe[1], "dpe_v");
        /* fall through */
    case M_SLC:
    case M_SWA:
    case M_MEAN:
        fd_check(p, p->k, g.dk, p->nk, "dk");
        fd_check(p, p->v, g.dv, p->nv, "dv");
        break;
    case M_NSA: {
        static const char *gname[3] = {"dg_cmp", "dg_slc", "dg_swa"};
        /* with given k_cmp/v_cmp and no sliding window/selection, k and v
         * may not reach the loss at all */
        if (p->gate_on[1] || (p->gate_on[2] && p->sh.window > 0) ||
            (p->gate_on[0] && !p->give_cmp)) {
            fd_check(p, p->k, g.dk, p->nk, "dk");
            fd_check(p, p->v, g.dv, p->nv, "dv");
        }
        for (int x = 0; x < 3; x++) {
            if (p->gate_on[x])
                fd_check(p, p->g[x], g.dg[x], p->ng, gname[x]);
            else
                for (size_t i = 0; i < p->ng; i++)
                    assert_true(g.dg[x][i] == 0.0);
        }
        if (p->give_cmp && p->gate_on[0]) {
            fd_check(p, p->kc, g.dkc, p->nkc, "dk_cmp");
            fd_check(p, p->vc, g.dvc, p->nvc, "dv_cmp");
        }
        break;
    }
    }
    /* a flipped selection is a measure-zero event for random data */
    assert_true(fd_skipped <= 4);
    free_grads(&g);
}

static void run_mode(const config *c, enum mode m, int give_bc, uint64_t seed)
{
    problem *p = make_problem(c, seed);
    p->mode = m;
    p->give_bc = give_bc;
    check_grads(p);
    free_problem(p);
}

/* ------------------------------------------------------------------------ */
/* gradient tests                                                           */
/* ------------------------------------------------------------------------ */

static void test_grad_cmp(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_CMP, 0, 1);
    run_mode(&CFG_B, M_CMP, 0, 2);
    run_mode(&CFG_V, M_CMP, 0, 3);
}

static void test_grad_slc(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_SLC, 0, 4);
    run_mode(&CFG_A, M_SLC, 1, 5);
    run_mode(&CFG_V, M_SLC, 1, 6);
}

static void test_grad_swa(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_SWA, 0, 7);
    run_mode(&CFG_V, M_SWA, 0, 8);
}

static void test_grad_mean_chain(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_MEAN, 0, 9);
    run_mode(&CFG_B, M_MEAN, 0, 10);
    run_mode(&CFG_V, M_MEAN, 0, 11);
}

static void test_grad_linear(void **state)
{
    (void)state;
    run_mode(&CFG_B, M_LINEAR, 0, 12);
    run_mode(&CFG_V, M_LINEAR, 0, 13);
    /* the compression alone, where partial blocks at sequence ends count */
    run_mode(&CFG_B, M_COMPRESS, 0, 22);
    run_mode(&CFG_V, M_COMPRESS, 0, 23);
}

static void run_nsa(const config *c, int gc, int gs, int gw, int give_cmp,
                    int give_bi, int give_bc, uint64_t seed)
{
    problem *p = make_problem(c, seed);
    p->mode = M_NSA;
    p->gate_on[0] = gc;
    p->gate_on[1] = gs;
    p->gate_on[2] = gw;
    p->give_cmp = give_cmp;
    p->give_bi = give_bi;
    p->give_bc = give_bc;
    check_grads(p);
    free_problem(p);
}

static void test_grad_nsa(void **state)
{
    (void)state;
    run_nsa(&CFG_A, 1, 1, 1, 0, 0, 0, 14); /* top-k from mean pooling */
    run_nsa(&CFG_B, 1, 1, 1, 0, 0, 1, 15); /* overlap, block_counts */
}

static void test_grad_nsa_varlen(void **state)
{
    (void)state;
    run_nsa(&CFG_V, 1, 1, 1, 0, 0, 0, 16);
    run_nsa(&CFG_V, 1, 1, 1, 1, 1, 1, 17); /* given k_cmp, v_cmp, indices */
}

static void test_grad_nsa_gates(void **state)
{
    (void)state;
    run_nsa(&CFG_A, 1, 0, 0, 0, 0, 0, 18);
    run_nsa(&CFG_A, 0, 1, 0, 0, 1, 1, 19);
    run_nsa(&CFG_A, 0, 0, 1, 0, 0, 0, 20);
    run_nsa(&CFG_A, 1, 0, 1, 1, 0, 0, 21); /* given k_cmp / v_cmp */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_cmp),
        cmocka_unit_test(test_grad_slc),
        cmocka_unit_test(test_grad_swa),
        cmocka_unit_test(test_grad_mean_chain),
        cmocka_unit_test(test_grad_linear),
        cmocka_unit_test(test_grad_nsa),
        cmocka_unit_test(test_grad_nsa_varlen),
        cmocka_unit_test(test_grad_nsa_gates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
