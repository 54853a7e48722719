/* test_nsa_fwd.c: the NSA forward against the double-precision reference on
 * random shapes (not multiples of the tiles), with poisoned outputs, each
 * branch's saved output included; and the portable forward's P V step in
 * 4 x 4 blocks, forced by a tuning file. */
#include "nsa_case.h"
#include "programs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

static void run_case(const test_env *te, const nsa_case *c, uint64_t seed)
{
    if (!nsa_case_selected(c->name)) return;
    nsa_run r;
    nsa_run_setup(te, &r, c, seed);
    nsa_run_save_branches(te, &r);
    nsa_run_forward(te, &r);
    nsa_check_forward(&r);
    nsa_run_free(&r);
}

/* Every case of the shared list; CLNSA_TEST_CASE=name runs one (debugging). */
static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < nsa_case_count; ++i) run_case(&env, &nsa_cases[i], 1234 + i);
}

/* attn_tile.h's PV_BLOCK (each work-item 16 outputs in 4 x 4 blocks, the
 * V tile unpadded: the tuned shape on GPUs, WG 128, GT 16, DV 128) at the
 * shapes of the f32 cases with 16 heads or more a group, through a tuning
 * file: GT 16 and WG = GT * DV / 16 (the second case's second head tile
 * holds 4 heads of 16). */
static void test_pv_blocks(void **state)
{
    (void)state;
    test_env te = env;
    te.ctx = test_context_with_tuning(
        &env, NULL, " {\"family\": \"nsa_fwd\", \"shape\": {\"dv\": 24}, \"params\": {\"WG\": 24, \"GT\": 16, \"TK\": 8}},\n"
              " {\"family\": \"nsa_fwd\", \"shape\": {\"dv\": 8}, \"params\": {\"WG\": 8, \"GT\": 16, \"TK\": 4}}");
    const char *built[2] = {"#define WG 24\n#define GT 16\n", "#define WG 8\n#define GT 16\n"};
    for (size_t i = 0; i < nsa_case_count; ++i) {
        const nsa_case *c = &nsa_cases[i];
        if (c->HQ / c->H < 16 || c->dt != CLNSA_DTYPE_F32 || !nsa_case_selected(c->name)) continue;
        assert_true(c->DV == 24 || c->DV == 8);
        run_case(&te, c, 5678 + i);
        if (!tune_env_overrides()) assert_true(program_built_with(te.ctx, "nsa_fwd.cl", built[c->DV == 8], NULL));
    }
    clnsa_context_destroy(te.ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_pv_blocks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
