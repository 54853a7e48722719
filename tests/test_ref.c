/*
 * test_ref.c - semantics of the double-precision NSA reference (ref/):
 * hand-computed compression values, empty key sets, top-k padding / forced
 * blocks / ordering, duplicated block indices, and the NSA function agreeing
 * with its branches. Gradients: test_ref_grad.c.
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

/* ------------------------------------------------------------------------ */
/* semantics tests                                                          */
/* ------------------------------------------------------------------------ */

static void test_compress_values(void **state)
{
    (void)state;
    ref_nsa_shape sh;
    const double x[5] = {1, 2, 3, 4, 5};
    double xc[4];

    /* l = 3, d = 2: [0,3) -> 2, [2,5) -> 4, [4,5) -> 5 (partial block) */
    ref_nsa_shape_init(&sh, 1, 5, 1, 1, 1, 1);
    sh.block_size = 4;
    sh.cmp_block = 3;
    sh.cmp_stride = 2;
    assert_int_equal(ref_num_cmp(5, 2), 3);
    assert_int_equal(ref_num_cmp(0, 2), 0);
    assert_int_equal(ref_total_cmp(&sh), 3);
    ref_compress_mean(&sh, x, 1, xc);
    assert_true(xc[0] == 2.0 && xc[1] == 4.0 && xc[2] == 5.0);

    /* varlen {0, 3, 3, 5} (an empty sequence), l = d = 2:
     * [1,2] -> 1.5, [3] -> 3, (empty), [4,5] -> 4.5 */
    const int cu[4] = {0, 3, 3, 5};
    sh.cu_seqlens = cu;
    sh.N = 3;
    sh.cmp_block = 2;
    assert_int_equal(ref_nsa_shape_check(&sh), 0);
    assert_int_equal(ref_total_cmp(&sh), 3);
    assert_int_equal(ref_get_seq(&sh, 2).cstart, 2);
    ref_compress_mean(&sh, x, 1, xc);
    assert_true(xc[0] == 1.5 && xc[1] == 3.0 && xc[2] == 4.5);

    /* linear, l = d = 2, W = [1, 1], pe = [10, 100], b = 0.5 on x[0..3):
     * (1+10)+(2+100)+0.5 = 113.5; (3+10)+0+0.5 = 13.5 (no pe past end) */
    const double W[2] = {1, 1}, pe[2] = {10, 100}, b[1] = {0.5};
    ref_nsa_shape_init(&sh, 1, 3, 1, 1, 1, 1);
    sh.block_size = 2;
    ref_compress_linear(&sh, x, 1, W, b, pe, xc);
    assert_true(xc[0] == 113.5 && xc[1] == 13.5);
    ref_compress_linear(&sh, x, 1, W, NULL, NULL, xc);
    assert_true(xc[0] == 3.0 && xc[1] == 3.0);

    /* shape validation */
    ref_nsa_shape_init(&sh, 1, 5, 6, 4, 8, 8);
    assert_true(ref_nsa_shape_check(&sh) != 0); /* HQ % H != 0 */
    ref_nsa_shape_init(&sh, 1, 5, 6, 2, 8, 8);
    assert_int_equal(ref_nsa_shape_check(&sh), 0);
    sh.cu_seqlens = cu;
    sh.N = 2;                                   /* cu[2] = 3 != T */
    assert_true(ref_nsa_shape_check(&sh) != 0);
}

/* Queries that see nothing: o = 0, lse = -inf, no NaN anywhere. */
static void test_empty_queries(void **state)
{
    (void)state;
    problem *p = make_problem(&CFG_A, 30);
    const ref_nsa_shape *sh = &p->sh;
    const int T = sh->T, HQ = sh->HQ, DV = sh->DV;
    double *lse = dalloc(p->ng);

    /* cmp: compressed token 0 becomes visible at t = l - 1 = 3 */
    ref_cmp_fwd(sh, p->q, p->kc, p->vc, p->o, lse);
    for (int b = 0; b < sh->B; b++)
        for (int t = 0; t < T; t++)
            for (int hq = 0; hq < HQ; hq++) {
                size_t r = ((size_t)b * T + t) * HQ + hq;
                if (t < 3) {
                    assert_true(isinf(lse[r]) && lse[r] < 0);
                    for (int c = 0; c < DV; c++)
                        assert_true(p->o[r * DV + c] == 0.0);
                } else {
                    assert_true(isfinite(lse[r]));
                }
            }

    /* slc with every index unused (-1 or past the query's block) */
    for (size_t i = 0; i < p->nbi; i++)
        p->bi[i] = (i % 2) ? -1 : 1000;
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, NULL, p->o, lse);
    for (size_t r = 0; r < p->ng; r++) {
        assert_true(isinf(lse[r]) && lse[r] < 0);
        for (int c = 0; c < DV; c++)
            assert_true(p->o[r * DV + c] == 0.0);
    }
    /* slc with block_counts all 0 */
    for (size_t i = 0; i < p->nbi; i++)
        p->bi[i] = 0;
    for (size_t i = 0; i < p->nbc; i++)
        p->bc[i] = 0;
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, p->bc, p->o, lse);
    for (size_t r = 0; r < p->ng; r++)
        assert_true(isinf(lse[r]) && lse[r] < 0);

    /* window 0: empty */
    ref_nsa_shape sh0 = *sh;
    sh0.window = 0;
    ref_swa_fwd(&sh0, p->q, p->k, p->v, p->o, lse);
    for (size_t r = 0; r < p->ng; r++) {
        assert_true(isinf(lse[r]) && lse[r] < 0);
        for (int c = 0; c < DV; c++)
            assert_true(p->o[r * DV + c] == 0.0);
    }

    /* full NSA backward with empty rows everywhere stays finite */
    p->mode = M_NSA;
    p->give_bi = 1;
    p->give_bc = 1;
    assert_true(!isnan((double)loss(p)));
    assert_true(all_finite(p->o, p->no));
    grads g = analytic(p);
    assert_true(all_finite(g.dq, p->nq));
    assert_true(all_finite(g.dk, p->nk));
    assert_true(all_finite(g.dv, p->nv));
    for (int x = 0; x < 3; x++)
        assert_true(all_finite(g.dg[x], p->ng));
    free_grads(&g);
    free(lse);
    free_problem(p);
}

/* Rows are padded with -1 beyond min(S_eff, #candidates); entries are
 * distinct candidates. */
static void test_topk_padding(void **state)
{
    (void)state;
    config c = CFG_A;
    c.S = 6; /* T = 13, block 4: at most 4 candidates */
    for (int use_bc = 0; use_bc < 2; use_bc++) {
        problem *p = make_problem(&c, 31 + use_bc);
        const ref_nsa_shape *sh = &p->sh;
        ref_compress_mean(sh, p->k, sh->DK, p->kc);
        ref_topk(sh, p->q, p->kc, use_bc ? p->bc : NULL, p->bi);
        for (int b = 0; b < sh->B; b++)
            for (int t = 0; t < sh->T; t++)
                for (int h = 0; h < sh->H; h++) {
                    size_t r = ((size_t)b * sh->T + t) * sh->H + h;
                    const int *row = p->bi + r * sh->block_count;
                    int seff = sh->block_count;
                    if (use_bc) {
                        seff = p->bc[r] < 0 ? 0 : p->bc[r];
                        if (seff > sh->block_count)
                            seff = sh->block_count;
                    }
                    int ncand = t / sh->block_size + 1;
                    int nsel = seff < ncand ? seff : ncand;
                    for (int s = 0; s < sh->block_count; s++) {
                        if (s >= nsel) {
                            assert_int_equal(row[s], -1);
                            continue;
                        }
                        assert_true(row[s] >= 0 && row[s] < ncand);
                        for (int s2 = 0; s2 < s; s2++)
                            assert_true(row[s2] != row[s]);
                    }
                }
        free_problem(p);
    }
}

/* Forced blocks come first in ascending order and are always present; the
 * others are ordered by importance, recomputed here independently: P[i]
 * from the compressed branch's lse, and compressed token i counts for block
 * j iff one of the positions it covers lies in block j. */
static void check_topk_order(const config *c, uint64_t seed)
{
    problem *p = make_problem(c, seed);
    const ref_nsa_shape *sh = &p->sh;
    const int T = sh->T, HQ = sh->HQ, H = sh->H, DK = sh->DK, S = c->S;
    const int G = HQ / H, NC = p->NC;
    double *lse = dalloc(p->ng);
    ref_cmp_fwd(sh, p->q, p->kc, p->vc, p->o, lse);
    ref_topk(sh, p->q, p->kc, NULL, p->bi);

    for (int sid = 0; sid < ref_num_seqs(sh); sid++) {
        ref_seq sq = ref_get_seq(sh, sid);
        for (int t = 0; t < sq.len; t++) {
            int tok = sq.start + t;
            for (int h = 0; h < H; h++) {
                const int *row =
                    p->bi + (((size_t)sq.b * T + tok) * H + h) * S;
                int tb = t / c->bs;
                double imp[64] = {0};
                char forced[64] = {0}, chosen[64] = {0};
                int nforced = 0;
                assert_true(tb < 64);
                for (int j = 0; j <= tb; j++) {
                    forced[j] = j < c->init || j > tb - c->local;
                    nforced += forced[j];
                }
                for (int i = 0; i * c->d + c->l - 1 <= t; i++) {
                    double P = 0.0;
                    for (int g = 0; g < G; g++) {
                        size_t r = ((size_t)sq.b * T + tok) * HQ + h * G + g;
                        const double *qr = p->q + r * DK;
                        const double *kr =
                            p->kc + (((size_t)sq.b * NC + sq.cstart + i) * H +
                                     h) * DK;
                        double z = 0;
                        for (int e = 0; e < DK; e++)
                            z += qr[e] * kr[e];
                        P += exp(z * sh->scale - lse[r]);
                    }
                    char hit[64] = {0};
                    for (int pos = i * c->d; pos < i * c->d + c->l; pos++)
                        if (pos / c->bs <= tb)
                            hit[pos / c->bs] = 1;
                    for (int j = 0; j <= tb; j++)
                        if (hit[j])
                            imp[j] += P;
                }
                int nsel = S < tb + 1 ? S : tb + 1;
                assert_true(nforced <= S);
                for (int s = 0; s < nsel; s++) {
                    int j = row[s];
                    assert_true(j >= 0 && j <= tb);
                    chosen[j] = 1;
                    if (s < nforced) {
                        assert_true(forced[j]);
                        if (s > 0)
                            assert_true(row[s - 1] < j);
                    } else {
                        assert_false(forced[j]);
                        if (s > nforced)
                            assert_true(imp[row[s - 1]] >= imp[j] - 1e-12);
                    }
                }
                for (int s = nsel; s < S; s++)
                    assert_int_equal(row[s], -1);
                for (int j = 0; j <= tb; j++) {
                    if (forced[j])
                        assert_true(chosen[j]);
                    else if (!chosen[j] && nsel > nforced)
                        assert_true(imp[j] <= imp[row[nsel - 1]] + 1e-12);
                }
            }
        }
    }
    free(lse);
    free_problem(p);
}

static void test_topk_forced_and_order(void **state)
{
    (void)state;
    /* l = d = l' */
    const config c1 = {2, 29, 6, 2, 8, 16, NULL, 0, 4, 4, 4, 4, 5, 1, 2};
    /* overlapping compression l=4, d=2, selection block 8 */
    const config c2 = {1, 45, 6, 2, 8, 16, NULL, 0, 8, 3, 4, 2, 5, 1, 1};
    /* l=6, d=4 straddling selection blocks of 4; no forced blocks */
    const config c3 = {1, 40, 6, 2, 8, 16, NULL, 0, 4, 3, 6, 4, 5, 0, 0};
    /* varlen: sequences of 3, 8, 6 */
    const config c4 = {1, 17, 6, 2, 8, 16, CU, 3, 4, 2, 4, 2, 5, 1, 0};
    check_topk_order(&c1, 33);
    check_topk_order(&c2, 36);
    check_topk_order(&c3, 37);
    check_topk_order(&c4, 38);
}

/* The key set is the union of the selected blocks: duplicated or ignored
 * entries change nothing. */
static void test_slc_duplicates(void **state)
{
    (void)state;
    config c = CFG_A;
    c.S = 4;
    problem *p = make_problem(&c, 34);
    const ref_nsa_shape *sh = &p->sh;
    int *bi2 = ialloc(p->nbi);
    double *o2 = dalloc(p->no), *lse1 = dalloc(p->ng), *lse2 = dalloc(p->ng);
    /* row A: {0, 0, 2, 2} vs row B: {2, -1, 0, 99} (99: past the query) */
    for (size_t r = 0; r < p->nbc; r++) {
        int *a = p->bi + r * 4, *bb = bi2 + r * 4;
        a[0] = 0, a[1] = 0, a[2] = 2, a[3] = 2;
        bb[0] = 2, bb[1] = -1, bb[2] = 0, bb[3] = 99;
    }
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, NULL, p->o, lse1);
    ref_slc_fwd(sh, p->q, p->k, p->v, bi2, NULL, o2, lse2);
    for (size_t i = 0; i < p->no; i++)
        assert_true(fabs(p->o[i] - o2[i]) <= 1e-14);
    for (size_t i = 0; i < p->ng; i++)
        assert_true(lse1[i] == lse2[i] || fabs(lse1[i] - lse2[i]) <= 1e-14);

    /* gradients agree too */
    double *dq1 = dalloc(p->nq), *dq2 = dalloc(p->nq);
    double *dk1 = dalloc(p->nk), *dk2 = dalloc(p->nk);
    ref_slc_bwd(sh, p->q, p->k, p->v, p->bi, NULL, p->dout, dq1, dk1, NULL);
    ref_slc_bwd(sh, p->q, p->k, p->v, bi2, NULL, p->dout, dq2, dk2, NULL);
    for (size_t i = 0; i < p->nq; i++)
        assert_true(fabs(dq1[i] - dq2[i]) <= 1e-13);
    for (size_t i = 0; i < p->nk; i++)
        assert_true(fabs(dk1[i] - dk2[i]) <= 1e-13);

    /* block_counts = 2 on row B keeps only {2}: same as row {2,-1,-1,-1} */
    for (size_t r = 0; r < p->nbc; r++) {
        int *a = p->bi + r * 4;
        a[0] = 2, a[1] = -1, a[2] = -1, a[3] = -1;
        p->bc[r] = 2;
    }
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, NULL, p->o, lse1);
    ref_slc_fwd(sh, p->q, p->k, p->v, bi2, p->bc, o2, lse2);
    for (size_t i = 0; i < p->no; i++)
        assert_true(fabs(p->o[i] - o2[i]) <= 1e-14);

    free(bi2);
    free(o2);
    free(lse1);
    free(lse2);
    free(dq1);
    free(dq2);
    free(dk1);
    free(dk2);
    free_problem(p);
}

/* Sliding window w >= T and selection of every block both equal full
 * causal attention; the full NSA's internal top-k equals running it by hand. */
static void test_consistency(void **state)
{
    (void)state;
    problem *p = make_problem(&CFG_V, 35);
    ref_nsa_shape sh = p->sh;
    double *o2 = dalloc(p->no), *lse1 = dalloc(p->ng), *lse2 = dalloc(p->ng);

    sh.window = sh.T;
    sh.block_count = 5; /* >= blocks per sequence */
    int *all = ialloc((size_t)sh.T * sh.H * 5);
    for (int i = 0; i < sh.T * sh.H * 5; i++)
        all[i] = i % 5;
    ref_swa_fwd(&sh, p->q, p->k, p->v, p->o, lse1);
    ref_slc_fwd(&sh, p->q, p->k, p->v, all, NULL, o2, lse2);
    for (size_t i = 0; i < p->no; i++)
        assert_true(fabs(p->o[i] - o2[i]) <= 1e-14);
    for (size_t i = 0; i < p->ng; i++)
        assert_true(fabs(lse1[i] - lse2[i]) <= 1e-14);
    free(all);

    /* full NSA: internal top-k == explicit mean pooling + ref_topk */
    sh = p->sh;
    p->mode = M_NSA;
    p->give_bc = 1;
    ref_nsa_inputs in = nsa_inputs(p);
    ref_nsa_outputs out;
    memset(&out, 0, sizeof out);
    out.o = p->o;
    out.block_indices = p->bi_tmp;
    ref_nsa_fwd(&sh, &in, &out);
    ref_compress_mean(&sh, p->k, sh.DK, p->kc);
    ref_compress_mean(&sh, p->v, sh.DV, p->vc);
    ref_topk(&sh, p->q, p->kc, p->bc, p->bi);
    assert_memory_equal(p->bi, p->bi_tmp, p->nbi * sizeof(int));
    in.k_cmp = p->kc;
    in.v_cmp = p->vc;
    in.block_indices = p->bi;
    out.o = o2;
    out.block_indices = NULL;
    ref_nsa_fwd(&sh, &in, &out);
    for (size_t i = 0; i < p->no; i++)
        assert_true(p->o[i] == o2[i]);

    free(o2);
    free(lse1);
    free(lse2);
    free_problem(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compress_values),
        cmocka_unit_test(test_empty_queries),
        cmocka_unit_test(test_topk_padding),
        cmocka_unit_test(test_topk_forced_and_order),
        cmocka_unit_test(test_slc_duplicates),
        cmocka_unit_test(test_consistency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
