/* test_nsa_bwd.c: the NSA backward against the double-precision reference's
 * gradients (themselves checked by finite differences in test_ref), on
 * random shapes, with poisoned outputs, every other case from the forward's
 * saved branch outputs (the others recompute them), every third with dq
 * recomputing the selected branch's dS (config.keep_ds 0; the others read
 * what the dk/dv pass kept); and its determinism:
 * bitwise equal gradients run after run and across work-group sizes; and
 * do as a padded view; and dq's and dk/dv's 4 x 4 output blocks, forced by a
 * tuning file. */
#include "nsa_bwd_run.h"
#include "programs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

TEST_ENV_GROUP

/* b's do copied into rows padded to DV + pad (NaN in the padding) and b.dout
 * made a view of them; returns the buffer, for the caller to release. */
static cl_mem pad_dout(bwd_bufs *b, const nsa_run *r, int pad)
{
    const nsa_case *c = r->c;
    const int64_t row = c->DV + pad;
    double *padded = malloc(r->nq * (size_t)row * sizeof *padded);
    assert_non_null(padded);
    for (size_t i = 0; i < r->nq; ++i)
        for (int64_t d = 0; d < row; ++d) padded[i * row + d] = d < c->DV ? b->dO.h[i * c->DV + d] : NAN;
    cl_mem m = upload(&env, padded, r->nq * (size_t)row, c->dt, false);
    free(padded);
    b->dout = tensor4(m, c->dt, c->B, c->T, c->HQ, c->DV);
    b->dout.strides[2] = row;
    b->dout.strides[1] = c->HQ * row;
    b->dout.strides[0] = c->T * c->HQ * row;
    return m;
}

/* One case against the reference; with pad > 0, do as a padded view. */
static void run_case_on(const test_env *te, const nsa_case *c, uint64_t seed, bool saved_branches, int pad, int keep_ds)
{
    if (!nsa_case_selected(c->name)) return;
    nsa_run r;
    nsa_run_setup(te, &r, c, seed);
    r.cfg.keep_ds = keep_ds;
    if (saved_branches) nsa_run_save_branches(te, &r);
    nsa_run_forward(te, &r);
    bwd_bufs b;
    bwd_setup(te, &b, &r, seed + 99);
    cl_mem padded = pad ? pad_dout(&b, &r, pad) : NULL;
    bwd_run_device(te, &b, &r);
    bwd_reference(&b, &r);
    bwd_compare(&b, c);
    if (padded) clReleaseMemObject(padded);
    bwd_free(&b);
    nsa_run_free(&r);
}

static void run_case(const nsa_case *c, uint64_t seed, bool saved_branches, int pad, int keep_ds)
{
    run_case_on(&env, c, seed, saved_branches, pad, keep_ds);
}

/* Every case of the shared list; CLNSA_TEST_CASE=name runs one (debugging). */
static void test_cases(void **state)
{
    (void)state;
    const int kept = CLNSA_KEEP_DS_SELECTED | CLNSA_KEEP_DS_COMPRESSED;
    for (size_t i = 0; i < nsa_case_count; ++i) run_case(&nsa_cases[i], 4321 + i, i % 2 == 1, 0, i % 3 == 2 ? 0 : kept);
}

/* Same inputs: bitwise equal gradients twice, and with another work-group size. */
static void test_determinism(void **state)
{
    (void)state;
    const nsa_case *c = nsa_case_named("varlen short seqs");
    assert_non_null(c);
    if (!nsa_case_selected(c->name)) skip();
    nsa_run r;
    nsa_run_setup(&env, &r, c, 7);
    nsa_run_forward(&env, &r);
    bwd_bufs b[3];
    const char *wg[3] = {NULL, NULL, "32"};
    for (int k = 0; k < 3; ++k) {
        if (wg[k]) setenv("CLNSA_TUNE_WG", wg[k], 1);
        bwd_setup(&env, &b[k], &r, 11);
        bwd_run_device(&env, &b[k], &r);
        unsetenv("CLNSA_TUNE_WG");
    }
    for (int k = 1; k < 3; ++k)
        for (int i = 0; i < G_COUNT; ++i) {
            if (!b[0].g[i].m) continue;
            const bool same = memcmp(b[0].g[i].dev, b[k].g[i].dev, b[0].g[i].n * sizeof(double)) == 0;
            if (!same) print_error("%s differs between run 0 and run %d\n", b[0].g[i].name, k);
            assert_true(same);
        }
    for (int k = 0; k < 3; ++k) bwd_free(&b[k]);
    nsa_run_free(&r);
}

/* do as a view of rows padded to DV + 4: a row stride that is not a multiple
 * of 8, so the prologue from the saved branch outputs (nsa_bwd_delta.cl)
 * reads it one dim at a time, not 8 (ROW_VEC); the same gradients against
 * the reference. */
static void test_padded_dout(void **state)
{
    (void)state;
    const nsa_case *c = nsa_case_named("G=3 DK!=DV");
    assert_non_null(c);
    if (!nsa_case_selected(c->name)) skip();
    run_case(c, 55, true, 4, CLNSA_KEEP_DS_SELECTED);
}

/* dq's and dk/dv's outputs in 4 x 4 blocks (nsa_bwd_dq.cl's DQ_BLOCK,
 * with the kept branch's K tiles unpadded; nsa_bwd_dkdv.cl's DKDV_BLOCK),
 * the tuned shapes on GPUs (WG 128 = 16 heads by D 128 / 16, and 16 keys
 * by D 128 / 16), at the test cases' head dims through a tuning file: on
 * the f32 cases with DK = DV or 16 heads a group, dS kept and not. */
static void test_blocks(void **state)
{
    (void)state;
    test_env te = env;
    te.ctx = test_context_with_tuning(
        &env, NULL, " {\"family\": \"nsa_bwd_dq\", \"shape\": {\"dk\": 16}, \"params\": {\"WG\": 16, \"GT\": 16, \"TK\": 8}},\n"
              " {\"family\": \"nsa_bwd_dq\", \"shape\": {\"dk\": 8}, \"params\": {\"WG\": 8, \"GT\": 16, \"TK\": 8}},\n"
              " {\"family\": \"nsa_bwd_dkdv\", \"shape\": {\"dk\": 16, \"dv\": 16}, \"params\": {\"WG\": 16, \"TKK\": 16, \"RQ\": 8}},\n"
              " {\"family\": \"nsa_bwd_dkdv\", \"shape\": {\"dk\": 8, \"dv\": 8}, \"params\": {\"WG\": 8, \"TKK\": 16, \"RQ\": 8}}");
    bool dq_block = false, dkdv_block = false;
    for (size_t i = 0; i < nsa_case_count; ++i) {
        const nsa_case *c = &nsa_cases[i];
        const bool g16 = c->HQ / c->H >= 16;
        if (c->dt != CLNSA_DTYPE_F32 || (c->DK != c->DV && !g16) || !nsa_case_selected(c->name)) continue;
        run_case_on(&te, c, 2468 + i, i % 2 == 0, 0, g16 && i % 2 ? 0 : CLNSA_KEEP_DS_SELECTED);
        dq_block = dq_block || (g16 && (c->DK == 16 || c->DK == 8));
        dkdv_block = dkdv_block || (c->DK == c->DV && (c->DK == 16 || c->DK == 8));
    }
    /* the entries apply unless the environment overrides them; Mesa's
     * llvmpipe takes no dk/dv tile of more than 2 outputs a work-item (the
     * tuning's workaround, mesa_dkdv_ok) */
    const bool mesa = clnsa_context_device_info(env.ctx)->vendor == CLNSA_VENDOR_MESA, used = !tune_env_overrides();
    if (dq_block && used) assert_true(program_built_with(te.ctx, "nsa_bwd_dq.cl", "#define GT 16\n", NULL));
    if (dkdv_block && !mesa && used)
        assert_true(program_built_with(te.ctx, "nsa_bwd_dkdv.cl", "#define TKK 16\n#define RQ 8\n", NULL));
    clnsa_context_destroy(te.ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_padded_dout),
        cmocka_unit_test(test_blocks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
