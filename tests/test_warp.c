/* test_warp.c: the tensor-core path's warp kernels (cl/warp_*.h) against the
 * double-precision reference, forward and backward, on shapes that take
 * that path (f16 / bf16, and f32 in the TF32 mode; head dims multiples of
 * 16): on NVIDIA's tensor
 * cores where the device has them, emulated elsewhere (PoCL in CI), so the
 * same kernel source is checked on every device. Shapes are not multiples
 * of the key chunk, sequences of varlen batches are empty or shorter than a
 * block, G = 20 takes two head tiles; outputs are poisoned (the forward's
 * saved branch outputs too, read by every other backward). Each case also
 * asserts that the warp kernels ran (their programs were built). */
#include "nsa_bwd_run.h"
#include "programs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static test_env env;
static bool emulated; /* the warp kernels run emulated: one warp a work-group */

static int setup(void **state)
{
    (void)state;
    test_env_open(&env);
    const char *path = test_env_use_warp_path(&env);
    emulated = strcmp(path, "emulated") == 0;
    printf("warp kernels: %s\n", path);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_env_close(&env);
    return 0;
}

#define BF16 CLNSA_DTYPE_BF16
#define F16 CLNSA_DTYPE_F16
#define F32 CLNSA_DTYPE_F32
static const int cu_w[] = {0, 7, 7, 60, 100};

/* name, B, T, HQ, H, DK, DV, cu, N, bs, S, l, d, w, init, local, cmp, slc, swa, given_idx, counts,
 * given_cmp, linear, pe, dtype, tf32 */
static const nsa_case warp_cases[] = {
    /* the configuration of "warp tiny" (the same programs), more tokens */
    {"warp G=16 all branches", 1, 45, 16, 1, 16, 16, NULL, 0, 16, 2, 8, 8, 8, 1, 2, true, true, true, false, false, false, false, false, BF16, false},
    {"warp G=4 DK=32 DV=64 varlen overlap 16/8", 1, 100, 8, 2, 32, 64, cu_w, 4, 32, 3, 16, 8, 20, 1, 2, true, true, true, false, false, false, false, false, F16, false},
    /* f32 in the TF32 mode: 8-element rows of 32 bytes, two m16n8k8 per product */
    {"warp TF32 G=4 DK=32 DV=64 varlen", 1, 100, 8, 2, 32, 64, cu_w, 4, 32, 3, 16, 8, 20, 1, 2, true, true, true, false, false, false, false, false, F32, true},
    /* rows of 64 and 128 elements: the swizzled local tiles of the dk/dv kernel (warp_attn.h's tile_col) */
    {"warp DK=128 DV=64 swizzled tiles", 1, 40, 4, 2, 128, 64, NULL, 0, 16, 2, 8, 8, 8, 1, 2, true, true, true, false, false, false, false, false, BF16, false},
    {"warp G=20 two head tiles", 1, 45, 20, 1, 32, 32, NULL, 0, 16, 4, 16, 16, 24, 1, 2, true, true, true, false, false, false, false, false, BF16, false},
    {"warp DK=48 DV=16 given indices and counts", 2, 40, 8, 2, 48, 16, NULL, 0, 8, 5, 8, 8, 0, 1, 2, false, true, false, true, true, false, false, false, BF16, false},
    {"warp given k_cmp v_cmp, G=2", 2, 50, 4, 2, 32, 32, NULL, 0, 16, 3, 16, 16, 0, 1, 2, true, true, false, false, false, true, false, false, F16, false},
    {"warp linear compression", 1, 70, 16, 1, 32, 16, NULL, 0, 16, 3, 16, 16, 0, 1, 2, true, true, false, false, false, false, true, true, BF16, false},
    /* the configuration of the G=20 case: the same programs (PoCL compiles each in ~40 s) */
    {"warp T=1", 1, 1, 20, 1, 32, 32, NULL, 0, 16, 4, 16, 16, 24, 1, 2, true, true, true, false, false, false, false, false, BF16, false},
    {"warp paper setting 32/16/64, 16 blocks, window 128", 1, 200, 16, 1, 32, 32, NULL, 0, 64, 16, 32, 16, 128, 1, 2, true, true, true, false, false, false, false, false, BF16, false},
    /* S > 32: the top-k keeps its list in local memory (nsa_topk_warp.h), the forward runs it
     * as its own kernel; forward only (the backward reads the indices as for any S) */
    {"warp S=40 list in local memory (forward)", 1, 200, 4, 2, 16, 16, NULL, 0, 4, 40, 4, 4, 0, 1, 2, true, true, false, false, false, false, false, false, BF16, false},
    /* no selected branch: the forward stages V (V_STAGE), rows padded (DV = 48), and reads the
     * compressed rows from the work-group's tile (warp_attn.h's CMP_TILE; several chunks of it
     * in test_cmp_tile_work_groups, on the GPU) */
    {"warp compressed and window only", 1, 70, 8, 2, 32, 48, NULL, 0, 16, 2, 16, 8, 20, 1, 2, true, false, true, false, false, false, false, false, F16, false},
    /* G = 32 in the TF32 mode: two head tiles, the kept dS key-major (nsa_ranges.h's DS_BY_KEY) in f32 */
    {"warp TF32 G=32 dS kept key-major", 1, 30, 32, 1, 16, 16, NULL, 0, 16, 2, 8, 8, 0, 1, 2, true, true, false, false, false, false, false, false, F32, true},
    /* the compressed branch alone: its forward stages V and runs whole chunks unguarded, no top-k */
    {"warp compressed only", 1, 71, 16, 1, 32, 32, NULL, 0, 16, 2, 16, 16, 0, 1, 2, true, false, false, false, false, false, false, false, BF16, false},
    /* 75 compressed keys a late token, in the forward that runs the top-k: its compressed branch
     * over several chunks (whole ones, then a partial one) and the top-k's pass 2 over several
     * windows of JB blocks; the fused forwards of the other cases see at most 12 (the S=40 case's
     * 50 run the top-k as its own kernel) */
    {"warp long compressed", 1, 600, 16, 1, 16, 16, NULL, 0, 8, 8, 8, 8, 0, 1, 2, true, true, false, false, false, false, false, false, BF16, false},
    /* small enough for Oclgrind (.ci/matrix.sh): every warp kernel, the split and heavy passes */
    {"warp tiny", 1, 20, 16, 1, 16, 16, NULL, 0, 16, 2, 8, 8, 8, 1, 2, true, true, true, false, false, false, false, false, BF16, false},
    /* DV = 128, as in the anchor configuration: the forward given indices and the backward's prologue (an
     * even place in the table: no saved branch outputs) read V rows into registers in two 16-byte pieces a
     * row (warp_attn.h's load_cols) and store two (store_row). A case of its own, last so that the others
     * keep their places: test_forward_families, which Oclgrind runs (.ci/matrix.sh), keeps the DV 16 one.
     * DK = 64: the forward given indices reads its K rows in whole lines there (warp_attn.h's K_LINES),
     * which needs DK a multiple of 64 (the DV 16 case keeps DK 48, the reads' 16-element tail). */
    {"warp DK=64 DV=128 given indices and counts", 2, 40, 8, 2, 64, 128, NULL, 0, 8, 5, 8, 8, 0, 1, 2, false, true, false, true, true, false, false, false, BF16, false},
};
static const size_t warp_case_count = sizeof warp_cases / sizeof warp_cases[0];

static const nsa_case *case_named(const char *name)
{
    for (size_t i = 0; i < warp_case_count; ++i)
        if (strcmp(warp_cases[i].name, name) == 0) return &warp_cases[i];
    fail_msg("no case %s", name);
    return NULL;
}

static bool built(const char *file) { return program_built(env.ctx, file); }

/* Whether a case whose top-k runs takes it inside the forward's warp kernel
 * (src/ops/nsa_fwd.c, choose_fused_topk) rather than as its own kernel. */
static bool topk_fused(const nsa_case *c)
{
    const char *e = getenv("CLNSA_FUSED_TOPK");
    return c->cmp && c->HQ / c->H <= 16 && c->S <= 32 && !(e && strcmp(e, "0") == 0);
}

/* Whether the forward that may read a work-group's compressed tile does
 * (unless CLNSA_CMP_TILE=0 says not to), and its define. */
static bool cmp_tile_on(void)
{
    const char *e = getenv("CLNSA_CMP_TILE");
    return !(e && atoi(e) == 0);
}

static const char *cmp_tile_define(void) { return cmp_tile_on() ? "#define CMP_TILE 1\n" : "#define CMP_TILE 0\n"; }

/* The programs each case must have built are asserted over the cases that
 * ran (CLNSA_TEST_CASE may pick a few, as .ci/matrix.sh does). */
static void test_forward(void **state)
{
    (void)state;
    bool ran = false, topk_kernel = false, fused = false, unfused = false, unfused_noslc = false, lines = false;
    for (size_t i = 0; i < warp_case_count; ++i) {
        const nsa_case *c = &warp_cases[i];
        if (!nsa_case_selected(c->name)) continue;
        nsa_run r;
        nsa_run_setup(&env, &r, c, 500 + i);
        nsa_run_save_branches(&env, &r);
        /* every other case as inference: no lse asked */
        if (i % 2) nsa_run_drop_lse(&r);
        nsa_run_forward(&env, &r);
        nsa_check_forward(&r);
        ran = true;
        if (r.topk_ran) *(topk_fused(c) ? &fused : &topk_kernel) = true;
        const bool own_topk = r.topk_ran && topk_fused(c);
        if (!own_topk) *(c->slc ? &unfused : &unfused_noslc) = true;
        if (!own_topk && c->slc && c->dt != CLNSA_DTYPE_F32 && c->DK % 64 == 0) lines = true;
        nsa_run_free(&r);
    }
    if (ran) assert_true(built("nsa_fwd_warp.cl"));
    if (topk_kernel) assert_true(built("nsa_topk_warp.cl"));
    /* The compressed rows come from the work-group's tile (warp_attn.h's CMP_TILE, unless
     * CLNSA_CMP_TILE=0 says not to) in the forward that stages V without running the top-k,
     * never in the one that runs it. */
    const char *tile = cmp_tile_define();
    if (fused) /* the forward that runs the top-k itself stages V, whole chunks unguarded in its selected branch,
                * K rows read as fragments */
        assert_true(built("#define FUSED_TOPK 1\n") &&
                    built("#define K_LINES 0\n#define CMP_TILE 0\n#define V_EARLY 0\n#define V_STAGE 1\n#define ACC_TRANS 1\n"
                          "#define WHOLE_SLC 1\n#define WHOLE_CMP_SWA 0\n"));
    if (unfused) /* the forward without it loads V with K and runs whole chunks unguarded in every branch */
        assert_true(built("#define CMP_TILE 0\n#define V_EARLY 1\n#define V_STAGE 0\n#define ACC_TRANS 0\n#define WHOLE_SLC 1\n"
                          "#define WHOLE_CMP_SWA 1\n"));
    if (lines) /* ... and reads its selected K rows as whole lines in 16-bit types, DK a multiple of 64 */
        assert_true(built("#define K_LINES 1\n#define CMP_TILE 0\n#define V_EARLY 1\n"));
    if (unfused_noslc) /* ... but stages V where no selected branch runs (every such case has the compressed branch) */
        assert_true(program_built_with(env.ctx, tile, "#define V_EARLY 0\n#define V_STAGE 1\n#define ACC_TRANS 1\n#define WHOLE_SLC 1\n"
                                       "#define WHOLE_CMP_SWA 1\n", NULL));
}

/* Mesa (rusticl): the library refuses the emulated backward, whose dk/dv
 * llvmpipe gets wrong (docs/RELIABILITY.md): the refusal is what is checked,
 * with no event and nothing enqueued. */
static bool backward_refused(bwd_bufs *b, const nsa_run *r)
{
    if (clnsa_context_device_info(env.ctx)->vendor != CLNSA_VENDOR_MESA) return false;
    bool got_event = true;
    assert_int_equal(bwd_enqueue_wait(&env, env.queue, b, r, &got_event), CLNSA_ERROR_UNSUPPORTED_DEVICE);
    assert_false(got_event);
    assert_non_null(strstr(clnsa_last_error(env.ctx), "matrix_path: "));
    return true;
}

/* dq reads the dS that the selected and compressed branches' dk/dv passes
 * keep (config.keep_ds, both by default), or recomputes it: both kept in
 * most cases, the compressed branch's alone in every fourth from the third,
 * neither in every fourth from the fourth (varlen batches keep only the
 * selected branch's). Which ran is asserted through the programs built. */
static int keep_ds_of(size_t i)
{
    static const int modes[4] = {CLNSA_KEEP_DS_SELECTED | CLNSA_KEEP_DS_COMPRESSED,
                                 CLNSA_KEEP_DS_SELECTED | CLNSA_KEEP_DS_COMPRESSED, CLNSA_KEEP_DS_COMPRESSED, 0};
    return modes[i % 4];
}

static void test_backward(void **state)
{
    (void)state;
    bool kept = false, recomputed = false, cmp_kept = false, cmp_recomputed = false;
    for (size_t i = 0; i < warp_case_count; ++i) {
        const nsa_case *c = &warp_cases[i];
        if (!nsa_case_selected(c->name) || strstr(c->name, "(forward)")) continue;
        nsa_run r;
        nsa_run_setup(&env, &r, c, 900 + i);
        if (i % 2 == 1) nsa_run_save_branches(&env, &r); /* the backward's prologue reads them */
        nsa_run_forward(&env, &r);
        r.cfg.keep_ds = keep_ds_of(i);
        bwd_bufs b;
        bwd_setup(&env, &b, &r, 77 + i);
        if (!backward_refused(&b, &r)) {
            bwd_run_device(&env, &b, &r);
            bwd_reference(&b, &r);
            bwd_compare(&b, c);
            if (c->slc) *(r.cfg.keep_ds & CLNSA_KEEP_DS_SELECTED ? &kept : &recomputed) = true;
            if (c->cmp && !c->cu) *(r.cfg.keep_ds & CLNSA_KEEP_DS_COMPRESSED ? &cmp_kept : &cmp_recomputed) = true;
        }
        bwd_free(&b);
        nsa_run_free(&r);
    }
    /* dq's defines end with these (src/ops/nsa_fwd.c); the dk/dv pass's
     * DS_KEEP follows its BRANCH (src/ops/nsa_bwd.c) */
    if (kept) assert_true(built("#define WHOLE_CMP_SWA 0\n#define DS_KEEP 1\n") && built("#define BRANCH 1\n#define DS_KEEP 1\n"));
    if (recomputed) assert_true(built("#define WHOLE_CMP_SWA 0\n#define DS_KEEP 0\n"));
    if (cmp_kept) assert_true(built("#define DSC_KEEP 1\n") && built("#define BRANCH 0\n#define DS_KEEP 1\n"));
    if (cmp_recomputed) assert_true(built("#define DSC_KEEP 0\n") && built("#define BRANCH 0\n#define DS_KEEP 0\n"));
}

static size_t bwd_workspace(clnsa_context *ctx, nsa_run *r, bwd_bufs *b, int keep_ds)
{
    size_t bytes = 0;
    r->cfg.keep_ds = keep_ds;
    assert_int_equal(clnsa_nsa_backward_workspace_size(ctx, env.queue, &r->cfg, &r->in, &r->out, &b->dout, &b->grads, &bytes),
                     CLNSA_SUCCESS);
    return bytes;
}

/* A context like env.ctx whose largest allocation is `limit` bytes. */
static clnsa_context *context_with_limit(size_t limit)
{
    char value[32], msg[256];
    snprintf(value, sizeof value, "%zu", limit);
    assert_int_equal(setenv("CLNSA_MAX_MEM_ALLOC", value, 1), 0);
    /* env.ctx's options, so that only the allocation limit differs */
    const clnsa_context_options o = test_warp_options(clnsa_context_device_info(env.ctx));
    clnsa_context *ctx = NULL;
    const clnsa_status st = clnsa_context_create(env.cl, env.device, &o, &ctx, msg, sizeof msg);
    unsetenv("CLNSA_MAX_MEM_ALLOC");
    assert_int_equal(st, CLNSA_SUCCESS);
    return ctx;
}

/* The kept dS takes B*T*HQ*S*round16(block_size) elements of the workspace
 * for the selected branch and, for the compressed one, B*HQ*16 elements
 * per token and 16 of its visible compressed keys (each region 256-byte
 * aligned). Where the workspace would pass the device's largest allocation
 * (CLNSA_MAX_MEM_ALLOC lowers it), the compressed region is left out
 * first, then the selected one, and the compressed one kept alone if it
 * fits by itself. */
static void test_keep_ds_workspace(void **state)
{
    (void)state;
    if (clnsa_context_device_info(env.ctx)->vendor == CLNSA_VENDOR_MESA) {
        printf("skipped on Mesa: the library refuses the emulated backward there\n");
        return;
    }
    const nsa_case *c = case_named("warp tiny"); /* bf16, block 16, no varlen */
    nsa_run r;
    nsa_run_setup(&env, &r, c, 4242);
    bwd_bufs b;
    bwd_setup(&env, &b, &r, 4243);
    size_t keys = 0; /* each token's visible compressed keys, rounded up to 16, summed */
    for (int t = c->cmp_l - 1; t < c->T; ++t) keys += ((t - (c->cmp_l - 1)) / c->cmp_d + 1 + 15) / 16 * 16;
    const size_t ds = (size_t)c->B * c->T * c->HQ * c->S * ((c->bs + 15) / 16 * 16) * 2;
    const size_t dsc = (size_t)c->B * c->HQ * keys * 2;
    assert_true(dsc < ds); /* so that the compressed region alone fits under the selected one's size */
    const size_t lean = bwd_workspace(env.ctx, &r, &b, 0), slc = bwd_workspace(env.ctx, &r, &b, CLNSA_KEEP_DS_SELECTED);
    const size_t cmp = bwd_workspace(env.ctx, &r, &b, CLNSA_KEEP_DS_COMPRESSED);
    const size_t both = bwd_workspace(env.ctx, &r, &b, CLNSA_KEEP_DS_SELECTED | CLNSA_KEEP_DS_COMPRESSED);
    assert_true(slc >= lean + ds && slc < lean + ds + 256);
    assert_true(cmp >= lean + dsc && cmp < lean + dsc + 256);
    assert_true(both >= lean + ds + dsc && both < lean + ds + dsc + 512);

    const size_t limits[3] = {both - 1, slc - 1, cmp - 1}, expect[3] = {slc, cmp, lean};
    for (int i = 0; i < 3; ++i) {
        clnsa_context *small = context_with_limit(limits[i]);
        assert_int_equal(bwd_workspace(small, &r, &b, CLNSA_KEEP_DS_SELECTED | CLNSA_KEEP_DS_COMPRESSED), expect[i]);
        clnsa_context_destroy(small);
    }
    bwd_free(&b);
    nsa_run_free(&r);
}

/* The forward of case c on te, with fresh inputs, checked against the
 * reference; forward_checked: of the case named `name`. */
static void case_checked(test_env *te, const nsa_case *c, uint64_t seed)
{
    nsa_run r;
    nsa_run_setup(te, &r, c, seed);
    nsa_run_forward(te, &r);
    nsa_check_forward(&r);
    nsa_run_free(&r);
}

static void forward_checked(test_env *te, const char *name, uint64_t seed) { case_checked(te, case_named(name), seed); }

/* The forward kernel's uses take their chunk and work-group from families
 * of their own: the forward that runs the top-k (nsa_fwd_fused_warp), the
 * forward given its selection with the compressed branch (nsa_fwd_cmp_warp)
 * and without it (nsa_fwd_warp), the forward without the selected branch
 * (nsa_fwd_cmp_tile_warp: test_cmp_tile_work_groups), and the backward's prologue
 * (nsa_bwd_pre_warp). A user file gives the forwards three different
 * chunks, and the prologue another than the compressed forward's; each
 * kernel is built with its own family's and is right. */
static void test_forward_families(void **state)
{
    (void)state;
    const clnsa_context_options o = test_warp_options(clnsa_context_device_info(env.ctx));
    test_env te = env;
    te.ctx = test_context_with_tuning(&env, &o,
                                      " {\"family\": \"nsa_fwd_fused_warp\", \"params\": {\"WG\": 32, \"KC\": 16}},\n"
                                      " {\"family\": \"nsa_fwd_cmp_warp\", \"params\": {\"WG\": 32, \"KC\": 32}},\n"
                                      " {\"family\": \"nsa_fwd_warp\", \"params\": {\"WG\": 32, \"KC\": 64}},\n"
                                      " {\"family\": \"nsa_bwd_pre_warp\", \"params\": {\"WG\": 32, \"KC\": 16}}");

    /* warp tiny: the top-k runs, fused unless CLNSA_FUSED_TOPK=0 says otherwise */
    forward_checked(&te, "warp tiny", 4300);
    if (topk_fused(case_named("warp tiny")))
        assert_true(program_built_with(te.ctx, "#define KC 16\n", "#define FUSED_TOPK 1\n", NULL));
    assert_false(program_built_with(te.ctx, "#define KC 32\n", "#define FUSED_TOPK 1\n", NULL));
    assert_false(program_built_with(te.ctx, "#define KC 64\n", "#define FUSED_TOPK 1\n", NULL));
    /* ... and given the top-k kernel's selection */
    const char *was = getenv("CLNSA_FUSED_TOPK");
    char saved[16];
    snprintf(saved, sizeof saved, "%s", was ? was : "");
    assert_int_equal(setenv("CLNSA_FUSED_TOPK", "0", 1), 0);
    forward_checked(&te, "warp tiny", 4301);
    if (was) setenv("CLNSA_FUSED_TOPK", saved, 1);
    else unsetenv("CLNSA_FUSED_TOPK");
    assert_true(program_built_with(te.ctx, "nsa_fwd_warp.cl", "#define KC 32\n", "#define HAS_CMP 1\n"));
    /* given indices, no compressed branch */
    forward_checked(&te, "warp DK=48 DV=16 given indices and counts", 4302);
    assert_true(program_built_with(te.ctx, "nsa_fwd_warp.cl", "#define KC 64\n", "#define HAS_CMP 0\n"));
    assert_false(program_built_with(te.ctx, "nsa_fwd_warp.cl", "#define KC 64\n", "#define HAS_CMP 1\n"));
    /* the backward's prologue (no saved branch outputs) with the compressed branch */
    const nsa_case *c = case_named("warp tiny");
    nsa_run r;
    nsa_run_setup(&te, &r, c, 4303);
    nsa_run_forward(&te, &r);
    bwd_bufs b;
    bwd_setup(&te, &b, &r, 4304);
    if (clnsa_context_device_info(te.ctx)->vendor != CLNSA_VENDOR_MESA) { /* refused there: test_backward */
        bwd_run_device(&te, &b, &r);
        bwd_reference(&b, &r);
        bwd_compare(&b, c);
        assert_true(program_built_with(te.ctx, "#define KC 16\n", "#define BWD_PRE 1\n", NULL));
        assert_false(program_built_with(te.ctx, "#define KC 32\n", "#define BWD_PRE 1\n", NULL));
    }
    bwd_free(&b);
    nsa_run_free(&r);
    clnsa_context_destroy(te.ctx);
}

/* The forward that reads the compressed rows from its work-group's tile
 * (warp_attn.h's CMP_TILE) with 4 and 2 warps a work-group (chunks of 16
 * keys; and 4 warps with chunks of 32, the H200's fastest), the tile shared
 * where a work-group's tokens are of one sequence and read warp by warp
 * where they straddle a sequence's end (the varlen case), with the window
 * and without it (the compressed branch alone). Its work-group
 * and chunk come from a family of its own (nsa_fwd_cmp_tile_warp), which
 * the user file sets here. On the emulated path, where a group is always
 * one warp, only that: the compressed branch alone takes that family's
 * chunk, not nsa_fwd_cmp_warp's (with CLNSA_CMP_TILE=0, the other way). */
static void test_cmp_tile_work_groups(void **state)
{
    (void)state;
    /* up to 73 compressed keys a token; on PoCL (where it would only compile programs of its
     * own) not a case of the table */
    static const int cu[] = {0, 37, 37, 330, 400};
    static const nsa_case c = {"warp compressed and window, varlen, work-groups", 1, 400, 16, 1, 16, 16, cu, 4, 8, 2, 4, 4, 16, 1, 2,
                               true, false, true, false, false, false, false, false, BF16, false};
    if (!nsa_case_selected(c.name)) return;
    nsa_case c1 = c; /* the same without the window: the compressed branch alone */
    c1.name = "warp compressed only, varlen, work-groups";
    c1.swa = false;
    const clnsa_context_options o = test_warp_options(clnsa_context_device_info(env.ctx));
    const bool tiled = cmp_tile_on();
    if (emulated) {
        test_env te = env;
        te.ctx = test_context_with_tuning(&env, &o,
                                          " {\"family\": \"nsa_fwd_cmp_tile_warp\", \"params\": {\"WG\": 32, \"KC\": 16}},\n"
                                          " {\"family\": \"nsa_fwd_cmp_warp\", \"params\": {\"WG\": 32, \"KC\": 32}}");
        forward_checked(&te, "warp compressed only", 4510);
        assert_true(program_built_with(te.ctx, "#define HAS_SLC 0\n", tiled ? "#define KC 16\n" : "#define KC 32\n",
                                       cmp_tile_define()));
        clnsa_context_destroy(te.ctx);
        return;
    }
    static const char *const entries[] = {" {\"family\": \"nsa_fwd_cmp_tile_warp\", \"params\": {\"WG\": 128, \"KC\": 16}},\n"
                                          " {\"family\": \"nsa_fwd_cmp_warp\", \"params\": {\"WG\": 32, \"KC\": 32}}",
                                          " {\"family\": \"nsa_fwd_cmp_tile_warp\", \"params\": {\"WG\": 64, \"KC\": 16}},\n"
                                          " {\"family\": \"nsa_fwd_cmp_warp\", \"params\": {\"WG\": 32, \"KC\": 32}}",
                                          " {\"family\": \"nsa_fwd_cmp_tile_warp\", \"params\": {\"WG\": 128, \"KC\": 32}},\n"
                                          " {\"family\": \"nsa_fwd_cmp_warp\", \"params\": {\"WG\": 32, \"KC\": 16}}"};
    static const char *const nw[] = {"#define NW 4\n", "#define NW 2\n", "#define NW 4\n"};
    static const char *const kc[] = {"#define KC 16\n", "#define KC 16\n", "#define KC 32\n"};
    /* with CLNSA_CMP_TILE=0 the program is the untiled one, of nsa_fwd_cmp_warp's entries */
    static const char *const kc_untiled[] = {"#define KC 32\n", "#define KC 32\n", "#define KC 16\n"};
    for (int i = 0; i < 3; ++i) {
        test_env te = env;
        te.ctx = test_context_with_tuning(&env, &o, entries[i]);
        case_checked(&te, &c1, 4520 + (uint64_t)i);
        case_checked(&te, &c, 4500 + (uint64_t)i);
        assert_true(program_built_with(te.ctx, tiled ? nw[i] : "#define NW 1\n", tiled ? kc[i] : kc_untiled[i], cmp_tile_define()));
        clnsa_context_destroy(te.ctx);
    }
}

/* The forward sums its gated branches in floats where storage is f16: with
 * values near 25000 and gates near 1.5, 1.5 and -2.5, the first two
 * branches' sum (about 75000) leaves f16's range (65504) where the output
 * (about 12500) does not; summed in f16 pairs, as bf16 sums are, the
 * output would be inf. */
static void test_f16_sum_range(void **state)
{
    (void)state;
    const char *name = "warp G=4 DK=32 DV=64 varlen overlap 16/8";
    if (!nsa_case_selected(name)) return;
    const nsa_case *c = case_named(name);
    assert_true(c->dt == F16 && c->cmp && c->slc && c->swa);
    nsa_run r;
    uint64_t seed = 4400;
    nsa_run_setup(&env, &r, c, seed);
    struct {
        dbuf *b;
        size_t n;
        double lo, hi;
    } big[] = {{&r.v, r.nk * c->DV, 24000, 26000},
               {&r.gc, r.nq, 1.4, 1.6},
               {&r.gs, r.nq, 1.4, 1.6},
               {&r.gw, r.nq, -2.6, -2.4}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; ++i) {
        dfree(big[i].b);
        *big[i].b = dev_rand(&env, big[i].n, big[i].lo, big[i].hi, F16, &seed);
    }
    r.in.v = tensor4(r.v.m, F16, c->B, c->T, c->H, c->DV);
    r.in.g_cmp = tensor3(r.gc.m, F16, c->B, c->T, c->HQ);
    r.in.g_slc = tensor3(r.gs.m, F16, c->B, c->T, c->HQ);
    r.in.g_swa = tensor3(r.gw.m, F16, c->B, c->T, c->HQ);
    nsa_run_forward(&env, &r);
    nsa_check_forward(&r);
    nsa_run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_backward),
        cmocka_unit_test(test_keep_ds_workspace),
        cmocka_unit_test(test_forward_families),
        cmocka_unit_test(test_cmp_tile_work_groups),
        cmocka_unit_test(test_f16_sum_range),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
