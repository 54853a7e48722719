/* test_nsa_fwd.c: the NSA forward against the double-precision reference on
 * random shapes (not multiples of the tiles), with poisoned outputs. */
#include "nsa_case.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static test_env env;

static void same_sets(const int *a, const int *b, size_t rows, int S)
{
    size_t bad = 0;
    for (size_t r = 0; r < rows; ++r)
        for (int s = 0; s < S; ++s) {
            bool found = false;
            for (int u = 0; u < S; ++u) found = found || a[r * S + s] == b[r * S + u];
            if (!found) ++bad;
        }
    if (bad) print_error("top-k: %zu entries differ from the reference\n", bad);
    assert_int_equal(bad, 0);
}

static void run_case(const nsa_case *c, uint64_t seed)
{
    nsa_run r;
    nsa_run_setup(&env, &r, c, seed);
    nsa_run_forward(&env, &r);
    const double tol = nsa_tol(c->dt);
    if (r.topk_ran && c->dt == CLNSA_DTYPE_F32) {
        int *rbi = malloc(r.nk * c->S * sizeof *rbi);
        ref_topk(&r.sh, r.q.h, r.rkc, r.counts, rbi);
        same_sets(r.bi, rbi, r.nk, c->S);
        free(rbi);
    }
    ref_nsa_inputs rin = nsa_run_ref_inputs(&r);
    double *ro = calloc(r.nq * c->DV, sizeof *ro), *rl[3];
    for (int i = 0; i < 3; ++i) rl[i] = calloc(r.nq, sizeof(double));
    ref_nsa_outputs rout = {ro, NULL, NULL, NULL, rl[0], rl[1], rl[2], NULL};
    ref_nsa_fwd(&r.sh, &rin, &rout);

    double e = rel_l2(r.o, ro, r.nq * c->DV);
    if (!(e < tol)) print_error("%s: o rel L2 %.3g\n", c->name, e);
    assert_true(e < tol);
    bool on[3] = {c->cmp, c->slc, c->swa};
    for (int i = 0; i < 3; ++i) {
        if (!on[i]) continue;
        double el = rel_l2_lse(r.lse[i], rl[i], r.nq);
        if (!(el < tol)) print_error("%s: lse[%d] rel L2 %.3g\n", c->name, i, el);
        assert_true(el < tol);
    }
    free(ro);
    for (int i = 0; i < 3; ++i) free(rl[i]);
    nsa_run_free(&r);
}

#define F32 CLNSA_DTYPE_F32
static const int cu3[] = {0, 5, 5, 43, 70};

/* name, B, T, HQ, H, DK, DV, cu, N, bs, S, l, d, w, init, local, cmp, slc, swa, given_idx, counts,
 * given_cmp, linear, pe, dtype */
static const nsa_case cases[] = {
    {"all branches G=1", 2, 37, 2, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 5, 1, 2, true, true, true, false, false, false, false, false, F32},
    {"G=3 DK!=DV", 1, 45, 6, 2, 24, 16, NULL, 0, 8, 4, 8, 8, 9, 1, 2, true, true, true, false, false, false, false, false, F32},
    {"G=2 overlap 8/4 sel 16", 1, 53, 4, 2, 16, 8, NULL, 0, 16, 3, 8, 4, 0, 1, 2, true, true, false, false, false, false, false, false, F32},
    {"G=4 block_count > blocks", 1, 21, 8, 2, 8, 16, NULL, 0, 8, 6, 8, 8, 0, 1, 2, true, true, false, false, false, false, false, false, F32},
    {"G=16 one kv head", 1, 29, 16, 1, 16, 24, NULL, 0, 8, 3, 8, 8, 4, 1, 1, true, true, true, false, false, false, false, false, F32},
    {"G=20 > head tile", 1, 19, 20, 1, 8, 8, NULL, 0, 4, 3, 4, 4, 3, 1, 2, true, true, true, false, false, false, false, false, F32},
    {"varlen short seqs", 1, 70, 6, 2, 16, 16, cu3, 4, 8, 3, 8, 8, 6, 1, 2, true, true, true, false, false, false, false, false, F32},
    {"varlen overlap topk", 1, 70, 4, 1, 8, 16, cu3, 4, 16, 3, 8, 4, 0, 1, 2, true, true, false, false, false, false, false, false, F32},
    {"given indices and counts", 2, 33, 6, 3, 16, 8, NULL, 0, 8, 4, 8, 8, 0, 1, 2, false, true, false, true, true, false, false, false, F32},
    {"topk with counts tensor", 1, 41, 4, 2, 8, 8, NULL, 0, 8, 4, 8, 8, 0, 1, 2, true, true, false, false, true, false, false, false, F32},
    {"given k_cmp v_cmp", 2, 30, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 0, 1, 2, true, true, false, false, false, true, false, false, F32},
    {"varlen given cmp", 1, 70, 2, 1, 8, 8, cu3, 4, 8, 3, 8, 8, 0, 1, 2, true, true, false, false, false, true, false, false, F32},
    {"paper setting 32/16/64, 16 blocks, window 512", 1, 700, 2, 1, 16, 16, NULL, 0, 64, 16, 32, 16, 512, 1, 2, true, true, true, false, false, false, false, false, F32},
    {"window only", 1, 40, 3, 1, 16, 16, NULL, 0, 8, 3, 8, 8, 7, 1, 2, false, false, true, false, false, false, false, false, F32},
    {"f16 all", 1, 37, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 5, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_F16},
    {"bf16 all", 1, 37, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 5, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_BF16},
    {"bf16 varlen", 1, 70, 6, 2, 16, 8, cu3, 4, 8, 3, 8, 8, 6, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_BF16},
};

static void test_cases(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE"); /* run one case by name while debugging */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        if (!only || strcmp(only, cases[i].name) == 0) run_case(&cases[i], 1234 + i);
}

static void test_linear(void **state)
{
    (void)state;
    nsa_case c = {"linear compression", 1, 35, 4, 2, 8, 16, NULL, 0, 8, 3, 4, 4, 0, 1, 2, true, true, false, false, false, false, true, true, F32};
    run_case(&c, 77);
    c.name = "linear compression varlen, bf16, no pe";
    c.cu = cu3;
    c.N = 4;
    c.T = 70;
    c.pe = false;
    c.dt = CLNSA_DTYPE_BF16;
    run_case(&c, 78);
}

static int setup(void **state)
{
    (void)state;
    test_env_open(&env);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_env_close(&env);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_linear),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
