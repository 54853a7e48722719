/*
 * test_blocksparse_ref.c - tests of the double-precision block-sparse
 * attention reference (ref/blocksparse_ref.h).
 *
 * 1. Gradient checks: for L = sum(do * o), every entry of dq, dk, dv and
 *    dsinks from ref_bs_bwd is compared with the central difference
 *    (L(x + eps) - L(x - eps)) / (2 eps), with the soft cap, sinks,
 *    segments, positions, windows and block masks on and off.
 * 2. Semantics: fully masked rows (o = 0, lse = -inf or the sink), the sink
 *    as one extra logit, the builders' block masks covering the element
 *    rules they are named after, and a few hand-checked masks.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "blocksparse_ref.h"

static uint64_t rng = 0x1234567u;

static double urand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

static double *rand_array(size_t n, double amp)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; ++i) p[i] = amp * urand();
    return p;
}

static double *zeros(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static double loss(const ref_bs_problem *p, const double *q, const double *k, const double *v, const double *dout)
{
    size_t n = (size_t)p->B * p->Tq * p->HQ * p->DV;
    double *o = zeros(n), l = 0;
    ref_bs_fwd(p, q, k, v, o, NULL);
    for (size_t i = 0; i < n; ++i) l += o[i] * dout[i];
    free(o);
    return l;
}

/* Central differences of every entry of x against the analytic g. */
static void fd_check(const char *what, ref_bs_problem *p, double *x, size_t n, const double *g, const double *q,
                     const double *k, const double *v, const double *dout)
{
    const double eps = 1e-5;
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
        const double x0 = x[i];
        x[i] = x0 + eps;
        const double lp = loss(p, q, k, v, dout);
        x[i] = x0 - eps;
        const double lm = loss(p, q, k, v, dout);
        x[i] = x0;
        const double num = (lp - lm) / (2 * eps), err = fabs(num - g[i]) / (1e-3 + fabs(num));
        if (err > worst) worst = err;
        if (err > 1e-6) print_error("%s[%zu]: analytic %.10g, numeric %.10g\n", what, i, g[i], num);
    }
    assert_true(worst <= 1e-6);
}

typedef struct {
    const char *name;
    int B, Tq, Tk, HQ, H, D, DV;
    double softcap;
    int causal, wl, wr;
    bool sinks, seg, pos, mask;
    int qb, kb;
} fd_case;

static void run_fd(const fd_case *c)
{
    ref_bs_problem p;
    ref_bs_problem_init(&p, c->B, c->Tq, c->Tk, c->HQ, c->H, c->D, c->DV);
    p.softcap = c->softcap;
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.q_block = c->qb;
    p.kv_block = c->kb;
    const size_t nq = (size_t)c->B * c->Tq * c->HQ, nk = (size_t)c->B * c->Tk * c->H;
    double *q = rand_array(nq * c->D, 1.5), *k = rand_array(nk * c->D, 1.5), *v = rand_array(nk * c->DV, 1);
    double *dout = rand_array(nq * c->DV, 1), *sinks = rand_array((size_t)c->HQ, 1);
    int *sq = calloc((size_t)c->B * c->Tq, sizeof(int)), *sk = calloc((size_t)c->B * c->Tk, sizeof(int));
    int *pq = calloc((size_t)c->B * c->Tq, sizeof(int)), *pk = calloc((size_t)c->B * c->Tk, sizeof(int));
    const int nqb = (c->Tq + c->qb - 1) / c->qb, nkb = (c->Tk + c->kb - 1) / c->kb;
    int *mask = calloc((size_t)c->B * c->HQ * nqb * nkb, sizeof(int));
    for (int b = 0; b < c->B; ++b) {
        for (int i = 0; i < c->Tq; ++i) {
            sq[b * c->Tq + i] = i < 2 ? -1 : (i * 3) / c->Tq; /* padding first */
            pq[b * c->Tq + i] = 2 * i + b;
        }
        for (int j = 0; j < c->Tk; ++j) {
            sk[b * c->Tk + j] = (j * 3) / c->Tk;
            pk[b * c->Tk + j] = (int)(c->Tk - 1 - j) + (j % 3);
        }
    }
    for (size_t i = 0; i < (size_t)c->B * c->HQ * nqb * nkb; ++i) mask[i] = urand() > -0.4;
    if (c->sinks) p.sinks = sinks;
    if (c->seg) {
        p.seg_q = sq;
        p.seg_k = sk;
    }
    if (c->pos) {
        p.pos_q = pq;
        p.pos_k = pk;
    }
    if (c->mask) {
        p.mask = mask;
        p.mask_b = c->B;
        p.mask_h = c->HQ;
    }
    double *dq = zeros(nq * c->D), *dk = zeros(nk * c->D), *dv = zeros(nk * c->DV), *ds = zeros((size_t)c->HQ);
    ref_bs_bwd(&p, q, k, v, dout, dq, dk, dv, ds);
    fd_check("dq", &p, q, nq * c->D, dq, q, k, v, dout);
    fd_check("dk", &p, k, nk * c->D, dk, q, k, v, dout);
    fd_check("dv", &p, v, nk * c->DV, dv, q, k, v, dout);
    if (c->sinks) fd_check("dsinks", &p, sinks, (size_t)c->HQ, ds, q, k, v, dout);
    free(q); free(k); free(v); free(dout); free(sinks); free(sq); free(sk); free(pq); free(pk); free(mask);
    free(dq); free(dk); free(dv); free(ds);
}

static void test_gradients(void **state)
{
    (void)state;
    static const fd_case cases[] = {
        {"dense", 1, 5, 5, 2, 1, 3, 2, 0, 0, -1, -1, false, false, false, false, 2, 2},
        {"causal softcap sinks G=2", 1, 6, 9, 4, 2, 3, 4, 1.5, 1, -1, -1, true, false, false, false, 2, 2},
        {"window segments", 2, 7, 6, 2, 2, 2, 3, 0, 0, 2, 1, false, true, false, false, 3, 2},
        {"positions mask softcap", 2, 6, 5, 3, 1, 3, 2, 0.7, 1, 3, -1, false, false, true, true, 2, 3},
        {"everything", 1, 8, 7, 2, 1, 4, 3, 2.0, 1, 4, 0, true, true, false, true, 3, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_fd(&cases[i]);
}

/* Rows that see nothing: o = 0 and lse = -inf, or the sink. The sink is one
 * extra logit: with one visible key, p = 1 / (1 + exp(s - z)). */
static void test_empty_rows_and_sink(void **state)
{
    (void)state;
    ref_bs_problem p;
    ref_bs_problem_init(&p, 1, 4, 4, 1, 1, 2, 2);
    int sq[4] = {-1, 0, 0, 1}, sk[4] = {0, 0, 2, 2};
    p.seg_q = sq;
    p.seg_k = sk;
    double q[8] = {1, 0, 0.5, 0.25, -1, 2, 0.3, 0.3}, k[8] = {1, 1, 0.5, -0.5, 2, 0, -1, 0};
    double v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, o[8], lse[4], sink = 0.7;
    ref_bs_fwd(&p, q, k, v, o, lse);
    for (int r = 0; r < 4; r += 3) { /* rows 0 (padding) and 3 (no key of segment 1) */
        assert_true(lse[r] == -INFINITY);
        assert_true(o[2 * r] == 0 && o[2 * r + 1] == 0);
    }
    p.sinks = &sink;
    ref_bs_fwd(&p, q, k, v, o, lse);
    assert_true(lse[0] == sink && lse[3] == sink && o[0] == 0 && o[7] == 0);
    /* row 1 sees keys 0 and 1 (segment 0) */
    const double sc = 1 / sqrt(2.0), z0 = sc * (0.5 * 1 + 0.25 * 1), z1 = sc * (0.5 * 0.5 - 0.25 * 0.5);
    const double den = exp(z0) + exp(z1) + exp(sink);
    assert_true(fabs(lse[1] - log(den)) < 1e-12);
    assert_true(fabs(o[2] - (exp(z0) * 1 + exp(z1) * 3) / den) < 1e-12);
}

/* A builder's block mask never hides what its element rule shows: the
 * attention with the rule and the mask equals the attention with the rule. */
static void test_builders_cover_rules(void **state)
{
    (void)state;
    const int Tq = 13, Tk = 21, qb = 4, kb = 5, nqb = 4, nkb = 5;
    int seg_q[13], seg_k[21], m[20];
    for (int i = 0; i < Tq; ++i) seg_q[i] = i == 5 ? -1 : i / 5;
    for (int j = 0; j < Tk; ++j) seg_k[j] = (j + 3) / 8;
    for (int kind = REF_MASK_CAUSAL; kind <= REF_MASK_SEGMENT; ++kind) {
        if (kind == REF_MASK_STRIDED || kind == REF_MASK_GLOBAL) continue;
        ref_bs_block_mask(kind, Tq, Tk, qb, kb, 6, 2, 1, 0, seg_q, seg_k, m);
        for (int i = 0; i < Tq; ++i)
            for (int j = 0; j < Tk; ++j) {
                const int pq = i + Tk - Tq;
                int rule = kind == REF_MASK_CAUSAL   ? j <= pq
                           : kind == REF_MASK_WINDOW ? (j >= pq - 6 && j <= pq + 2)
                                                     : (seg_q[i] >= 0 && seg_q[i] == seg_k[j]);
                if (rule) assert_int_equal(m[(i / qb) * nkb + j / kb], 1);
            }
        /* and it is tight: every block that is on holds a pair the rule shows */
        for (int b = 0; b < nqb * nkb; ++b) {
            if (!m[b]) continue;
            int any = 0;
            for (int i = (b / nkb) * qb; i < Tq && i < (b / nkb + 1) * qb; ++i)
                for (int j = (b % nkb) * kb; j < Tk && j < (b % nkb + 1) * kb; ++j) {
                    const int pq = i + Tk - Tq;
                    any |= kind == REF_MASK_CAUSAL   ? j <= pq
                           : kind == REF_MASK_WINDOW ? (j >= pq - 6 && j <= pq + 2)
                                                     : (seg_q[i] >= 0 && seg_q[i] == seg_k[j]);
                }
            assert_true(any);
        }
    }
    /* strided: every second key block counted back from the diagonal block */
    ref_bs_block_mask(REF_MASK_STRIDED, 8, 8, 2, 2, -1, -1, 2, 0, NULL, NULL, m);
    static const int strided[16] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1};
    assert_memory_equal(m, strided, sizeof strided);
    /* global: the first 3 tokens are in key block 0 (blocks of 4) */
    ref_bs_block_mask(REF_MASK_GLOBAL, 8, 9, 4, 4, -1, -1, 1, 3, NULL, NULL, m);
    static const int global[6] = {1, 0, 0, 1, 0, 0};
    assert_memory_equal(m, global, sizeof global);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_empty_rows_and_sink),
        cmocka_unit_test(test_builders_cover_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
