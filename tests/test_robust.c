/* test_robust.c: numerical robustness of the NSA forward and backward on
 * degenerate inputs (issue 8), each against the double-precision reference
 * and the semantics documented in include/clnsa.h:
 *  - large logits (softmax scale x1e3): no overflow, no NaN / Inf;
 *  - all-equal scores (q = 0): uniform attention, and top-k ties broken
 *    towards the lower block index exactly as documented;
 *  - T = 1; empty sequences in varlen (repeated cu_seqlens values, first and
 *    last sequence empty);
 *  - queries that see nothing (the compressed branch before the first full
 *    block, every selected index unused): o of that branch 0, lse = -inf,
 *    gradients finite;
 *  - block_count larger than the number of blocks: unused slots are -1;
 *  - given indices duplicated, out of order and out of range (negative,
 *    INT_MIN, past the query's block, >= the number of blocks, INT_MAX) and
 *    block_counts out of range: duplicates count once, out-of-range indices
 *    select nothing, counts are clamped to [0, S].
 * Every output and gradient must be finite. The shapes are small so that the
 * whole file also runs under Oclgrind (.ci/matrix.sh), which checks that no
 * index makes a kernel read or write out of bounds. */
#include "nsa_bwd_run.h"

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

#define F32 CLNSA_DTYPE_F32

typedef void (*modifier)(nsa_run *r);

static bool finite_all(const double *x, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(x[i])) return false;
    return true;
}

/* Host values of an f32 input written back to its device buffer. */
static void rewrite_f32(dbuf *b)
{
    float *f = malloc(b->n * sizeof *f);
    for (size_t i = 0; i < b->n; ++i) f[i] = (float)b->h[i];
    assert_int_equal(clEnqueueWriteBuffer(env.queue, b->m, CL_TRUE, 0, b->n * sizeof *f, f, 0, NULL, NULL), CL_SUCCESS);
    free(f);
}

static void rewrite_indices(nsa_run *r)
{
    assert_non_null(r->given);
    assert_int_equal(clEnqueueWriteBuffer(env.queue, r->idx_m, CL_TRUE, 0, r->nk * r->c->S * sizeof(int), r->given, 0,
                                          NULL, NULL),
                     CL_SUCCESS);
    if (r->counts)
        assert_int_equal(clEnqueueWriteBuffer(env.queue, r->cnt_m, CL_TRUE, 0, r->nk * sizeof(int), r->counts, 0, NULL,
                                              NULL),
                         CL_SUCCESS);
}

/* Runs the forward and the backward of case c (after `mod` changed its
 * inputs, with the softmax scale multiplied by scale_mult) and compares
 * everything with the reference. */
static void run_robust(const nsa_case *c, uint64_t seed, modifier mod, double scale_mult, double tol, double gtol,
                       nsa_run *keep)
{
    if (!nsa_case_selected(c->name)) {
        if (keep) skip();
        return;
    }
    nsa_run r;
    nsa_run_setup(&env, &r, c, seed);
    if (scale_mult != 1.0) {
        const double s = scale_mult / sqrt((double)c->DK);
        r.cfg.scale = (float)s;
        r.sh.scale = (double)(float)s;
    }
    if (mod) mod(&r);
    nsa_run_forward(&env, &r);

    ref_nsa_inputs rin = nsa_run_ref_inputs(&r);
    double *ro = calloc(r.nq * c->DV, sizeof *ro), *rl[3];
    for (int i = 0; i < 3; ++i) rl[i] = calloc(r.nq, sizeof(double));
    ref_nsa_outputs rout = {ro, NULL, NULL, NULL, rl[0], rl[1], rl[2], NULL};
    ref_nsa_fwd(&r.sh, &rin, &rout);
    if (!finite_all(r.o, r.nq * c->DV)) print_error("%s: o has NaN or Inf\n", c->name);
    assert_true(finite_all(r.o, r.nq * c->DV));
    const double e = rel_l2(r.o, ro, r.nq * c->DV);
    const bool on[3] = {c->cmp, c->slc, c->swa};
    double el = 0;
    for (int i = 0; i < 3; ++i) {
        if (!on[i]) continue;
        /* -inf exactly where the reference has it (nothing visible), else finite */
        for (size_t j = 0; j < r.nq; ++j) {
            const bool ok = isinf(rl[i][j]) ? (isinf(r.lse[i][j]) && r.lse[i][j] < 0) : isfinite(r.lse[i][j]);
            if (!ok) print_error("%s: lse[%d][%zu] = %g, reference %g\n", c->name, i, j, r.lse[i][j], rl[i][j]);
            assert_true(ok);
        }
        const double x = rel_l2_lse(r.lse[i], rl[i], r.nq);
        if (x > el) el = x;
    }

    bwd_bufs b;
    bwd_setup(&env, &b, &r, seed + 7);
    clnsa_status st = bwd_enqueue_wait(&env, env.queue, &b, &r, NULL);
    if (st) print_error("%s: backward: %s\n", c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    bwd_read(&env, env.queue, &b, &r);
    bwd_reference(&b, &r);
    double eg = 0;
    const char *worst = "-";
    for (int g = 0; g < G_COUNT; ++g) {
        if (!b.g[g].m) continue;
        if (!finite_all(b.g[g].dev, b.g[g].n)) print_error("%s: %s has NaN or Inf\n", c->name, b.g[g].name);
        assert_true(finite_all(b.g[g].dev, b.g[g].n));
        const double x = rel_l2_floor(b.g[g].dev, b.g[g].ref, b.g[g].n, 1e-2);
        if (x > eg) eg = x, worst = b.g[g].name;
    }
    print_message("  %-44s o %.2g  lse %.2g  grads %.2g (%s)\n", c->name, e, el, eg, worst);
    assert_true(e < tol);
    assert_true(el < tol);
    assert_true(eg < gtol);
    bwd_free(&b);
    free(ro);
    for (int i = 0; i < 3; ++i) free(rl[i]);
    if (keep) *keep = r;
    else nsa_run_free(&r);
}

/* name, B, T, HQ, H, DK, DV, cu, N, bs, S, l, d, w, init, local, cmp, slc, swa, given_idx, counts,
 * given_cmp, linear, pe, dtype */
static const nsa_case all_branches = {"all branches", 1, 29, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 6, 1, 2,
                                      true, true, true, false, false, false, false, false, F32, false};

static void test_large_logits(void **state)
{
    (void)state;
    nsa_case c = all_branches;
    c.name = "scale x1e3, all branches";
    run_robust(&c, 11, NULL, 1e3, 1e-3, 1e-3, NULL);
    nsa_case v = c;
    v.name = "scale x1e3, given indices, G=1";
    v.HQ = 2;
    v.given_idx = true;
    v.counts = true;
    run_robust(&v, 12, NULL, 1e3, 1e-3, 1e-3, NULL);
}

static void zero_q(nsa_run *r)
{
    memset(r->q.h, 0, r->q.n * sizeof(double));
    rewrite_f32(&r->q);
}

static void test_all_equal_scores(void **state)
{
    (void)state;
    nsa_case c = all_branches;
    c.name = "all-equal scores (q = 0)";
    nsa_run r;
    run_robust(&c, 21, zero_q, 1.0, 2e-5, 5e-5, &r);
    /* top-k on all-equal importances: exactly the documented tie rule */
    int *rbi = malloc(r.nk * c.S * sizeof *rbi);
    ref_topk(&r.sh, r.q.h, r.rkc, NULL, rbi);
    assert_memory_equal(r.bi, rbi, r.nk * c.S * sizeof *rbi);
    free(rbi);
    nsa_run_free(&r);
}

static void test_T1(void **state)
{
    (void)state;
    nsa_case c = all_branches;
    c.name = "T = 1, B = 2";
    c.B = 2;
    c.T = 1;
    run_robust(&c, 31, NULL, 1.0, 2e-5, 5e-5, NULL);
}

static const int cu_empty[] = {0, 0, 6, 6, 6, 19, 19};

static void test_empty_sequences(void **state)
{
    (void)state;
    nsa_case c = all_branches;
    c.name = "varlen with empty sequences";
    c.T = 19;
    c.cu = cu_empty;
    c.N = 6;
    run_robust(&c, 41, NULL, 1.0, 2e-5, 5e-5, NULL);
    c.name = "varlen with empty sequences, given indices";
    c.given_idx = true;
    c.counts = true;
    c.cmp = false;
    run_robust(&c, 42, NULL, 1.0, 2e-5, 5e-5, NULL);
}

static void indices_unused(nsa_run *r)
{
    for (size_t i = 0; i < r->nk * r->c->S; ++i) r->given[i] = -1;
    rewrite_indices(r);
}

static void test_sees_nothing(void **state)
{
    (void)state;
    /* compressed branch: tokens t < cmp_block - 1 see no compressed token */
    nsa_case c = all_branches;
    c.name = "compressed only, early queries see nothing";
    c.slc = c.swa = false;
    c.window = 0;
    nsa_run r;
    run_robust(&c, 51, NULL, 1.0, 2e-5, 5e-5, &r);
    for (int t = 0; t < c.cmp_l - 1; ++t)
        for (int h = 0; h < c.HQ; ++h) assert_true(isinf(r.lse[0][(size_t)t * c.HQ + h]));
    nsa_run_free(&r);
    /* selected branch with every index unused: nothing at all */
    nsa_case s = all_branches;
    s.name = "selected only, every index -1";
    s.cmp = s.swa = false;
    s.window = 0;
    s.given_idx = true;
    run_robust(&s, 52, indices_unused, 1.0, 2e-5, 5e-5, &r);
    for (size_t i = 0; i < r.nq; ++i) assert_true(isinf(r.lse[1][i]) && r.lse[1][i] < 0);
    for (size_t i = 0; i < r.nq * s.DV; ++i) assert_true(r.o[i] == 0.0);
    nsa_run_free(&r);
}

static void test_block_count_above_blocks(void **state)
{
    (void)state;
    nsa_case c = all_branches;
    c.name = "block_count 8 > 3 blocks (top-k)";
    c.T = 20;
    c.S = 8;
    nsa_run r;
    run_robust(&c, 61, NULL, 1.0, 2e-5, 5e-5, &r);
    /* the top-k fills min(S, t/bs + 1) slots, distinct and in range; the rest are -1 */
    for (int b = 0; b < c.B; ++b)
        for (int t = 0; t < c.T; ++t)
            for (int h = 0; h < c.H; ++h) {
                const int *row = r.bi + (((size_t)b * c.T + t) * c.H + h) * c.S, nb = t / c.bs + 1;
                const int used = nb < c.S ? nb : c.S;
                for (int s = 0; s < c.S; ++s) {
                    if (s >= used) assert_int_equal(row[s], -1);
                    else {
                        assert_true(row[s] >= 0 && row[s] < nb);
                        for (int u = 0; u < s; ++u) assert_int_not_equal(row[u], row[s]);
                    }
                }
            }
    nsa_run_free(&r);
}

/* Duplicates and out-of-order indices; then everything out of range. */
static void indices_duplicated(nsa_run *r)
{
    const nsa_case *c = r->c;
    for (size_t i = 0; i < r->nk; ++i) {
        const int t = (int)(i / c->H % c->T), tb = t / c->bs;
        const int pat[6] = {tb, 0, tb, tb > 0 ? tb - 1 : 0, 0, tb};
        for (int s = 0; s < c->S; ++s) r->given[i * c->S + s] = pat[s % 6];
    }
    rewrite_indices(r);
}

static void indices_out_of_range(nsa_run *r)
{
    const nsa_case *c = r->c;
    const int nblocks = (c->T + c->bs - 1) / c->bs;
    for (size_t i = 0; i < r->nk; ++i) {
        const int t = (int)(i / c->H % c->T), tb = t / c->bs;
        const int pat[9] = {-5, INT_MIN, tb + 1, nblocks, 1000000, INT_MAX, tb, -1, 0};
        for (int s = 0; s < c->S; ++s) r->given[i * c->S + s] = pat[(s + (int)i) % 9];
        if (r->counts) {
            const int cnt[6] = {-3, 0, c->S + 5, INT_MAX, INT_MIN, c->S / 2};
            r->counts[i] = cnt[i % 6];
        }
    }
    rewrite_indices(r);
}

static void test_given_indices(void **state)
{
    (void)state;
    nsa_case c = all_branches;
    c.name = "duplicated, out-of-order indices";
    c.given_idx = true;
    c.S = 6;
    run_robust(&c, 71, indices_duplicated, 1.0, 2e-5, 5e-5, NULL);
    c.name = "indices and counts out of range";
    c.S = 9;
    c.counts = true;
    run_robust(&c, 72, indices_out_of_range, 1.0, 2e-5, 5e-5, NULL);
    c.name = "out of range, varlen with empty sequences";
    c.T = 19;
    c.cu = cu_empty;
    c.N = 6;
    run_robust(&c, 73, indices_out_of_range, 1.0, 2e-5, 5e-5, NULL);
}



int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_logits),      cmocka_unit_test(test_all_equal_scores),
        cmocka_unit_test(test_T1),                cmocka_unit_test(test_empty_sequences),
        cmocka_unit_test(test_sees_nothing),      cmocka_unit_test(test_block_count_above_blocks),
        cmocka_unit_test(test_given_indices),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
