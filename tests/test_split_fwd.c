/* test_split_fwd.c: the split NSA forward (src/ops/nsa_fwd.c, plan_split),
 * at every T through a user tuning file (nsa_fwd_split's MIN_T 1): the compressed branch alone
 * writes o_cmp, ungated, into o (ADD_PARTIAL 1), or into the caller's
 * o_cmp where the branches' outputs are saved (ADD_PARTIAL 2), the top-k
 * picks the blocks, and the forward given them adds g_cmp times it to its
 * branches (nsa_fwd_warp.cl's ADD_PARTIAL); each case runs both ways. On an
 * NVIDIA device of compute capability 9.0 the first two are one warpgroup
 * kernel (nsa_cmp_topk_wgmma.cl) at the shapes it takes (G 16, D 128,
 * compressed blocks equal to the selection blocks); elsewhere the warp
 * kernels run them (emulated on PoCL). Against the double-precision
 * reference, outputs poisoned, each branch's saved output and lse and the
 * selection checked (nsa_check_forward); which kernels ran is asserted
 * through the programs built. The split starts at the length the tuning
 * file names, and CLNSA_SPLIT_FWD=0 turns it off. */
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

/* The warp kernels, and the split at every length through a user tuning
 * file, once for the executable. */
static void split_env(void)
{
    static bool done;
    if (done) return;
    done = true;
    printf("warp kernels: %s\n", test_env_use_warp_path(&env));
    const clnsa_context_options o = test_warp_options(clnsa_context_device_info(env.ctx));
    clnsa_context *split = test_context_with_tuning(&env, &o, TEST_TUNING_SPLIT_ALWAYS);
    clnsa_context_destroy(env.ctx);
    env.ctx = split;
}

#define BF16 CLNSA_DTYPE_BF16
#define F16 CLNSA_DTYPE_F16

/* name, B, T, HQ, H, DK, DV, cu, N, bs, S, l, d, w, init, local, cmp, slc, swa, given_idx, counts,
 * given_cmp, linear, pe, dtype, tf32 */
/* test_warp's "warp G=16 all branches" at DV 32, where the forward given the selection reads o's
 * partial in 16-byte pieces; and in f32 on TF32, where it reads it element by element
 * (add_partial's other branch). */
static const nsa_case warp_cases[] = {
    {"split warp G=16 all branches", 1, 45, 16, 1, 16, 32, NULL, 0, 16, 2, 8, 8, 8, 1, 2, true, true, true, false, false, false, false, false, BF16, false},
    {"split warp G=16 all branches, f32 TF32", 1, 45, 16, 1, 16, 32, NULL, 0, 16, 2, 8, 8, 8, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_F32, true},
};

/* The warpgroup kernel's shapes: tiles of 12 tokens (T not a multiple), B > 1, several KV heads,
 * blocks of 64 and 32, block_counts, a window, tokens that see no compressed key (T 13), forced
 * blocks at both ends. The first two save the branches' outputs (the partial through o_cmp), the
 * first and third check the lse. */
static const nsa_case wgmma_cases[] = {
    {"split wgmma bf16 blocks 64, 16 selected", 2, 777, 32, 2, 128, 128, NULL, 0, 64, 16, 64, 64, 0, 1, 2, true, true, false, false, false, false, false, false, BF16, false},
    {"split wgmma f16 blocks 32, counts, window 100", 1, 500, 16, 1, 128, 128, NULL, 0, 32, 8, 32, 32, 100, 2, 1, true, true, true, false, true, false, false, false, F16, false},
    {"split wgmma bf16 T=13 no compressed key yet", 1, 13, 64, 4, 128, 128, NULL, 0, 16, 4, 16, 16, 0, 1, 1, true, true, false, false, false, false, false, false, BF16, false},
    {"split wgmma bf16 32 selected, no forced block", 1, 2100, 16, 1, 128, 128, NULL, 0, 64, 32, 64, 64, 0, 0, 0, true, true, false, false, false, false, false, false, BF16, false},
};

static void run_case(const nsa_case *c, uint64_t seed, bool lse, bool save)
{
    nsa_run r;
    nsa_run_setup(&env, &r, c, seed);
    if (save) nsa_run_save_branches(&env, &r);
    if (!lse) nsa_run_drop_lse(&r);
    nsa_run_forward(&env, &r);
    nsa_check_forward(&r);
    nsa_run_free(&r);
}

/* The warp kernels' split, on every device with the warp path. */
static void test_split_warp(void **state)
{
    (void)state;
    split_env();
    if (device_wgmma(env.ctx)) /* the shape is not the warpgroup kernel's: the warp kernels run it */
        print_message("(a Hopper device: the warp kernels' split at a shape the warpgroup kernel does not take)\n");
    for (size_t i = 0; i < sizeof warp_cases / sizeof warp_cases[0]; ++i) {
        if (!nsa_case_selected(warp_cases[i].name)) continue;
        for (int save = 0; save < 2; ++save) {
            print_message("%s, %s\n", warp_cases[i].name, save ? "branches saved" : "o alone");
            run_case(&warp_cases[i], 77 + i, true, save);
        }
    }
    for (int from = 1; from <= 2; ++from) {
        char partial[32];
        snprintf(partial, sizeof partial, "#define ADD_PARTIAL %d\n", from);
        assert_true(program_built_with(env.ctx, "nsa_fwd_warp.cl", partial, "#define HAS_CMP 0\n"));
    }
    assert_true(program_built_with(env.ctx, "nsa_fwd_warp.cl", "#define HAS_CMP 1\n#define HAS_SLC 0\n#define HAS_SWA 0\n",
                                   NULL));
    assert_true(program_built(env.ctx, "nsa_topk_warp.cl"));
    assert_false(program_built(env.ctx, "nsa_cmp_topk_wgmma.cl"));
}

/* The warpgroup kernel's split, where device_wgmma says it runs. */
static void test_split_wgmma(void **state)
{
    (void)state;
    split_env();
    if (!device_wgmma(env.ctx)) {
        print_message("skipped: %s is not an NVIDIA device of compute capability 9.0 (or CLNSA_WGMMA=0)\n",
                      clnsa_context_device_info(env.ctx)->name);
        skip();
    }
    for (size_t i = 0; i < sizeof wgmma_cases / sizeof wgmma_cases[0]; ++i) {
        if (!nsa_case_selected(wgmma_cases[i].name)) continue;
        print_message("%s\n", wgmma_cases[i].name);
        run_case(&wgmma_cases[i], 900 + i, i % 2 == 0, i < 2);
    }
    assert_true(program_built(env.ctx, "nsa_cmp_topk_wgmma.cl"));
    assert_true(program_built_with(env.ctx, "nsa_fwd_warp.cl", "#define ADD_PARTIAL 1\n", NULL));
    assert_true(program_built_with(env.ctx, "nsa_fwd_warp.cl", "#define ADD_PARTIAL 2\n", NULL));
}

/* The forward splits from the length the tuning database names
 * (nsa_fwd_split's MIN_T), here a user file's: a case at a length from it
 * splits (on Hopper's warpgroup kernel at its shapes), one below does not,
 * nor does the first with CLNSA_SPLIT_FWD=0; each in a context of its own,
 * the split told by the programs built. */
#define MIN_T_WGMMA 600 /* between the cases' two lengths: 777 and 500 */
#define MIN_T_WARP 40   /* 45 and 30 */
static void test_split_from_tuned_length(void **state)
{
    (void)state;
    split_env();
    const bool wgmma = device_wgmma(env.ctx);
    nsa_case at = wgmma ? wgmma_cases[0] : warp_cases[0]; /* T 777 / 45 */
    nsa_case below = at;
    below.T = wgmma ? 500 : 30;
    const int min_t = wgmma ? MIN_T_WGMMA : MIN_T_WARP;
    const char *entries = wgmma ? TEST_TUNING_SPLIT_FROM(MIN_T_WGMMA) : TEST_TUNING_SPLIT_FROM(MIN_T_WARP);
    const clnsa_context_options base = test_warp_options(clnsa_context_device_info(env.ctx));
    clnsa_context *const own = env.ctx;
    for (int i = 0; i < 3; ++i) {
        const nsa_case *c = i == 1 ? &below : &at;
        if (i == 2) setenv("CLNSA_SPLIT_FWD", "0", 1);
        env.ctx = test_context_with_tuning(&env, &base, entries);
        print_message("%s at T %d, MIN_T %d%s\n", c->name, c->T, min_t, i == 2 ? ", CLNSA_SPLIT_FWD=0" : "");
        run_case(c, 950 + i, true, false);
        unsetenv("CLNSA_SPLIT_FWD");
        const bool split = program_built_with(env.ctx, "nsa_fwd_warp.cl", "#define ADD_PARTIAL 1\n", NULL);
        const bool on_wgmma = program_built(env.ctx, "nsa_cmp_topk_wgmma.cl");
        clnsa_context_destroy(env.ctx);
        env.ctx = own;
        assert_int_equal(split, i == 0);
        assert_int_equal(on_wgmma, i == 0 && wgmma);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_warp),
        cmocka_unit_test(test_split_wgmma),
        cmocka_unit_test(test_split_from_tuned_length),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
