/* test_tuning.c: the parameter database (src/tuning): the built-in entries
 * match the families' table; the lookup order (user file over database over
 * safe default, the most specific shape class first, an entry that does not
 * fit the device falls through, f16 and bf16 serving each other); a
 * candidate that exceeds local memory is rejected before anything is
 * compiled; a short `clnsa tune` run completes and its file loads back and
 * is used. Linked with the static library: it
 * calls the internals. */
#include "nsa_case.h"
#include "programs.h"

#include "tuning/tuning.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static test_env env;
static char tmpdir[64];

/* The shape class of the PoCL entries in tuning/pocl.json. */
static const tune_problem tiny = {.dk = 32, .dv = 32, .g = 4, .block = 16, .dtype = CLNSA_DTYPE_F32, .S = 4, .cmp_block = 16,
                                  .cmp_stride = 16};
/* A shape class no built-in entry names. */
static const tune_problem other = {.dk = 24, .dv = 16, .g = 3, .block = 8, .dtype = CLNSA_DTYPE_F16, .S = 3, .cmp_block = 8,
                                   .cmp_stride = 8};

static const char *write_file(const char *name, const char *text)
{
    static char path[160];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static clnsa_context *context_with(const char *tuning_file, clnsa_status want)
{
    clnsa_context_options o = {0};
    o.tuning_file = tuning_file;
    clnsa_context *ctx = NULL;
    char msg[512] = "";
    clnsa_status st = clnsa_context_create(env.cl, env.device, &o, &ctx, msg, sizeof msg);
    if (st != want) print_error("context with %s: %s: %s\n", tuning_file, clnsa_status_string(st), msg);
    assert_int_equal(st, want);
    if (want != CLNSA_SUCCESS) assert_non_null(strstr(msg, "tuning file"));
    return ctx;
}

static tune_choice choose(clnsa_context *ctx, int family, const tune_problem *pb)
{
    tune_choice c;
    assert_int_equal(tune_choose(ctx, family, pb, &c), CLNSA_SUCCESS);
    return c;
}

static void expect(const tune_choice *c, tune_source src, int v0, int v1, int v2)
{
    if (c->source != src || c->v[0] != v0 || c->v[1] != v1 || c->v[2] != v2)
        print_error("got %d %d %d from source %d (%s), expected %d %d %d from %d\n", c->v[0], c->v[1], c->v[2],
                    (int)c->source, c->where, v0, v1, v2, (int)src);
    assert_int_equal(c->source, src);
    assert_int_equal(c->v[0], v0);
    assert_int_equal(c->v[1], v1);
    assert_int_equal(c->v[2], v2);
}

/* The first built-in entry that applies to this device for the family and
 * the tiny shape class, or NULL. */
static const tune_entry *builtin_for(const clnsa_device_info *info, int family)
{
    for (size_t i = 0; i < clnsa_tuning_db_count; ++i) {
        const tune_entry *e = &clnsa_tuning_db[i];
        if (strcmp(e->family, tune_families[family].name) == 0 && tune_entry_applies(e, info) && e->dk == tiny.dk &&
            e->g == tiny.g && e->block == tiny.block)
            return e;
    }
    return NULL;
}

static void test_builtin_entries_resolve(void **state)
{
    (void)state;
    for (size_t i = 0; i < clnsa_tuning_db_count; ++i) {
        const tune_entry *e = &clnsa_tuning_db[i];
        const int f = tune_family_find(e->family);
        if (f < 0) print_error("built-in entry %zu: unknown family %s\n", i, e->family);
        assert_true(f >= 0);
        assert_int_equal(e->nparams, tune_families[f].nparams);
        for (int p = 0; p < e->nparams; ++p) assert_true(tune_param_find(&tune_families[f], e->names[p]) >= 0);
    }
}

static void test_lookup_order(void **state)
{
    (void)state;
    const clnsa_device_info *info = clnsa_context_device_info(env.ctx);
    int safe[TUNE_MAX_PARAMS];

    /* no entry for this shape class: the safe default */
    assert_true(tune_safe_default(info, TF_NSA_BWD_DQ, &other, safe));
    tune_choice c = choose(env.ctx, TF_NSA_BWD_DQ, &other);
    expect(&c, TUNE_SRC_DEFAULT, safe[0], safe[1], safe[2]);

    /* the database, where it has an entry for this device (PoCL here) */
    const tune_entry *db = builtin_for(info, TF_NSA_FWD);
    if (db) {
        c = choose(env.ctx, TF_NSA_FWD, &tiny);
        assert_true(c.source == TUNE_SRC_DEVICE || c.source == TUNE_SRC_ARCH || c.source == TUNE_SRC_VENDOR);
        assert_non_null(strstr(c.where, "database"));
    } else {
        print_message("no built-in entry applies to %s: database step not checked\n", info->name);
    }

    /* a user file comes first; within it the most specific shape class */
    char text[2048];
    snprintf(text, sizeof text,
             "{\"clnsa_tuning\": 1, \"entries\": [\n"
             " {\"vendor\": \"%s\", \"architecture\": \"%s\", \"device\": \"%s\", \"family\": \"nsa_fwd\",\n"
             "  \"shape\": {\"dk\": 32, \"dv\": 32, \"g\": 4, \"block\": 16, \"dtype\": \"f32\"},\n"
             "  \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}},\n"
             " {\"family\": \"nsa_fwd\", \"shape\": {\"dk\": 32}, \"params\": {\"WG\": 32, \"GT\": 2, \"TK\": 16}},\n"
             " {\"vendor\": \"*\", \"family\": \"nsa_bwd_dq\", \"shape\": {\"dk\": \"*\"},\n"
             "  \"params\": {\"WG\": 32, \"GT\": 2, \"TK\": 16}},\n"
             " {\"family\": \"nsa_topk\", \"params\": {\"WG\": 32, \"GT\": 2, \"TK\": 60000, \"JB\": 8}}\n"
             "]}\n",
             tune_vendor_key(info->vendor), info->architecture, info->name);
    const char *path = write_file("user.json", text);
    clnsa_context *ctx = context_with(path, CLNSA_SUCCESS);
    c = choose(ctx, TF_NSA_FWD, &tiny);
    expect(&c, TUNE_SRC_USER, 16, 1, 8);
    assert_non_null(strstr(c.where, "user.json"));
    tune_problem dk32 = other;
    dk32.dk = 32;
    c = choose(ctx, TF_NSA_FWD, &dk32); /* only the dk-only entry matches */
    expect(&c, TUNE_SRC_USER, 32, 2, 16);
    c = choose(ctx, TF_NSA_BWD_DQ, &other); /* wildcards everywhere */
    expect(&c, TUNE_SRC_USER, 32, 2, 16);
    /* TK=60000 does not fit the local memory: falls through */
    c = choose(ctx, TF_NSA_TOPK, &other);
    assert_int_equal(c.source, TUNE_SRC_DEFAULT);
    clnsa_context_destroy(ctx);

    /* CLNSA_TUNING_FILE when the option is absent */
    assert_int_equal(setenv("CLNSA_TUNING_FILE", path, 1), 0);
    ctx = context_with(NULL, CLNSA_SUCCESS);
    unsetenv("CLNSA_TUNING_FILE");
    c = choose(ctx, TF_NSA_FWD, &tiny);
    expect(&c, TUNE_SRC_USER, 16, 1, 8);
    clnsa_context_destroy(ctx);

    /* CLNSA_TUNE_WG (a debugging knob) overrides every source */
    assert_int_equal(setenv("CLNSA_TUNE_WG", "16", 1), 0);
    c = choose(env.ctx, TF_NSA_FWD, &tiny);
    unsetenv("CLNSA_TUNE_WG");
    assert_int_equal(c.source, TUNE_SRC_ENV);
    assert_int_equal(c.v[0], 16);

    /* a broken or wrong file fails the context creation, naming the problem */
    context_with(write_file("bad1.json", "{\"clnsa_tuning\": 1, \"entries\": [}"), CLNSA_ERROR_INVALID_ARGUMENT);
    context_with(write_file("bad2.json", "{\"clnsa_tuning\": 1, \"entries\": [{\"family\": \"nsa_fwd\", "
                                         "\"params\": {\"WG\": 64, \"GT\": 4, \"TKK\": 8}}]}"),
                 CLNSA_ERROR_INVALID_ARGUMENT);
    context_with(write_file("bad3.json", "{\"clnsa_tuning\": 1, \"entries\": [{\"family\": \"nsa_fwd\", "
                                         "\"params\": {\"WG\": 64, \"GT\": 4}}]}"),
                 CLNSA_ERROR_INVALID_ARGUMENT);
    context_with("/nonexistent/clnsa-tuning.json", CLNSA_ERROR_INVALID_ARGUMENT);
}

/* An entry of one 16-bit type serves the other where no entry names it;
 * an entry of the problem's own dtype wins however little else it names,
 * and f32 takes neither. */
static void test_dtype_sibling(void **state)
{
    (void)state;
    const char *bf16_only = "{\"clnsa_tuning\": 1, \"entries\": [\n"
                            " {\"family\": \"nsa_bwd_pre\", \"shape\": {\"dk\": 24, \"dtype\": \"bf16\"},\n"
                            "  \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}}\n]}\n";
    clnsa_context *ctx = context_with(write_file("bf16.json", bf16_only), CLNSA_SUCCESS);
    tune_problem pb = other; /* f16 */
    tune_choice c = choose(ctx, TF_NSA_BWD_PRE, &pb);
    expect(&c, TUNE_SRC_USER, 16, 1, 8);
    assert_non_null(strstr(c.where, "(for f16)"));
    pb.dtype = CLNSA_DTYPE_BF16;
    c = choose(ctx, TF_NSA_BWD_PRE, &pb);
    expect(&c, TUNE_SRC_USER, 16, 1, 8);
    assert_null(strstr(c.where, "(for"));
    pb.dtype = CLNSA_DTYPE_F32;
    c = choose(ctx, TF_NSA_BWD_PRE, &pb);
    assert_true(c.source != TUNE_SRC_USER);
    clnsa_context_destroy(ctx);

    const char *both = "{\"clnsa_tuning\": 1, \"entries\": [\n"
                       " {\"family\": \"nsa_bwd_pre\", \"shape\": {\"dk\": 24, \"dtype\": \"bf16\"},\n"
                       "  \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}},\n"
                       " {\"family\": \"nsa_bwd_pre\", \"shape\": {\"dtype\": \"f16\"},\n"
                       "  \"params\": {\"WG\": 32, \"GT\": 2, \"TK\": 16}}\n]}\n";
    ctx = context_with(write_file("both.json", both), CLNSA_SUCCESS);
    pb.dtype = CLNSA_DTYPE_F16;
    c = choose(ctx, TF_NSA_BWD_PRE, &pb);
    expect(&c, TUNE_SRC_USER, 32, 2, 16);
    clnsa_context_destroy(ctx);
}

/* nsa_fwd_split's MIN_T, a length and no tiles: never by default; a user
 * file's entry is taken whatever CLNSA_TUNE_WG says (no work-group size);
 * "never" (TUNE_SPLIT_NEVER) is a value; 0, a larger one or a work-group
 * size fail the file. */
static void test_split_length(void **state)
{
    (void)state;
    tune_choice c = choose(env.ctx, TF_NSA_FWD_SPLIT, &other);
    expect(&c, TUNE_SRC_DEFAULT, TUNE_SPLIT_NEVER, 0, 0);
    char text[1024];
    snprintf(text, sizeof text,
             "{\"clnsa_tuning\": 1, \"entries\": [\n"
             " {\"family\": \"nsa_fwd_split\", \"shape\": {\"dk\": 24}, \"params\": {\"MIN_T\": 600}},\n"
             " {\"family\": \"nsa_fwd_split\", \"shape\": {\"dk\": 32}, \"params\": {\"MIN_T\": %d}}\n]}\n",
             TUNE_SPLIT_NEVER);
    clnsa_context *ctx = context_with(write_file("split.json", text), CLNSA_SUCCESS);
    assert_int_equal(setenv("CLNSA_TUNE_WG", "16", 1), 0);
    c = choose(ctx, TF_NSA_FWD_SPLIT, &other);
    unsetenv("CLNSA_TUNE_WG");
    expect(&c, TUNE_SRC_USER, 600, 0, 0);
    tune_problem pb = other;
    pb.dk = 32;
    c = choose(ctx, TF_NSA_FWD_SPLIT, &pb);
    expect(&c, TUNE_SRC_USER, TUNE_SPLIT_NEVER, 0, 0);
    clnsa_context_destroy(ctx);
    const char *bad[] = {"\"WG\": 64", "\"MIN_T\": 0", "\"MIN_T\": 1073741825"};
    for (int i = 0; i < 3; ++i) {
        snprintf(text, sizeof text, "{\"clnsa_tuning\": 1, \"entries\": [{\"family\": \"nsa_fwd_split\", \"params\": {%s}}]}",
                 bad[i]);
        context_with(write_file("split_bad.json", text), CLNSA_ERROR_INVALID_ARGUMENT);
    }
}

/* The shape's window ranks without excluding: with entries for the window
 * on, off and unnamed, each problem takes its own; an unnamed one comes
 * before the other window's, which is taken where it is the only one;
 * among the entries of a window, the one naming more fields first; the
 * other window's entry of this device after the problem's window's default
 * of its architecture, and after the other 16-bit type's entry of the
 * problem's window. A window other than "on", "off" or "*" fails the
 * file. */
static void test_window_rank(void **state)
{
    (void)state;
    const char *all = "{\"clnsa_tuning\": 1, \"entries\": [\n"
                      " {\"family\": \"nsa_bwd_pre\", \"shape\": {\"dk\": 24, \"window\": \"on\"}, \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}},\n"
                      " {\"family\": \"nsa_bwd_pre\", \"shape\": {\"dk\": 24, \"window\": \"off\"}, \"params\": {\"WG\": 32, \"GT\": 1, \"TK\": 8}},\n"
                      " {\"family\": \"nsa_bwd_pre\", \"shape\": {\"dk\": 24}, \"params\": {\"WG\": 64, \"GT\": 1, \"TK\": 8}},\n"
                      " {\"family\": \"nsa_bwd_dq\", \"shape\": {\"dk\": 24, \"window\": \"off\"}, \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}},\n"
                      " {\"family\": \"nsa_bwd_dq\", \"shape\": {\"dk\": 24, \"dv\": 16}, \"params\": {\"WG\": 32, \"GT\": 1, \"TK\": 8}},\n"
                      " {\"family\": \"nsa_topk\", \"shape\": {\"dk\": 24, \"window\": \"off\"}, \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8, \"JB\": 8}},\n"
                      " {\"family\": \"nsa_topk\", \"shape\": {\"dk\": 24}, \"params\": {\"WG\": 32, \"GT\": 1, \"TK\": 8, \"JB\": 8}}\n]}\n";
    clnsa_context *ctx = context_with(write_file("window.json", all), CLNSA_SUCCESS);
    tune_problem on = other, off = other;
    on.swa = true;
    off.swa = false;
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_PRE, &on)}, TUNE_SRC_USER, 16, 1, 8);
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_PRE, &off)}, TUNE_SRC_USER, 32, 1, 8);
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_DQ, &off)}, TUNE_SRC_USER, 32, 1, 8); /* dv named first */
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_DQ, &on)}, TUNE_SRC_USER, 32, 1, 8);
    expect((const tune_choice[]){choose(ctx, TF_NSA_TOPK, &on)}, TUNE_SRC_USER, 32, 1, 8);  /* unnamed before off */
    expect((const tune_choice[]){choose(ctx, TF_NSA_TOPK, &off)}, TUNE_SRC_USER, 16, 1, 8);
    clnsa_context_destroy(ctx);
    const char *one = "{\"clnsa_tuning\": 1, \"entries\": [{\"family\": \"nsa_bwd_pre\", \"shape\": {\"window\": \"off\"}, "
                      "\"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}}]}";
    ctx = context_with(write_file("window_off.json", one), CLNSA_SUCCESS);
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_PRE, &on)}, TUNE_SRC_USER, 16, 1, 8);
    clnsa_context_destroy(ctx);
    const clnsa_device_info *info = clnsa_context_device_info(env.ctx);
    char levels[2048];
    snprintf(levels, sizeof levels,
             "{\"clnsa_tuning\": 1, \"entries\": [\n"
             " {\"vendor\": \"%s\", \"architecture\": \"%s\", \"device\": \"%s\", \"family\": \"nsa_bwd_pre\",\n"
             "  \"shape\": {\"dk\": 24, \"dtype\": \"f16\", \"window\": \"on\"}, \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}},\n"
             " {\"vendor\": \"%s\", \"architecture\": \"%s\", \"family\": \"nsa_bwd_pre\",\n"
             "  \"shape\": {\"dk\": 24, \"dtype\": \"f16\", \"window\": \"off\"}, \"params\": {\"WG\": 32, \"GT\": 1, \"TK\": 8}},\n"
             " {\"family\": \"nsa_bwd_dq\", \"shape\": {\"dk\": 24, \"dtype\": \"f16\", \"window\": \"off\"},\n"
             "  \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}},\n"
             " {\"family\": \"nsa_bwd_dq\", \"shape\": {\"dk\": 24, \"dtype\": \"bf16\", \"window\": \"on\"},\n"
             "  \"params\": {\"WG\": 32, \"GT\": 1, \"TK\": 8}}\n]}\n",
             tune_vendor_key(info->vendor), info->architecture, info->name, tune_vendor_key(info->vendor),
             info->architecture);
    ctx = context_with(write_file("window_levels.json", levels), CLNSA_SUCCESS);
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_PRE, &off)}, TUNE_SRC_USER, 32, 1, 8); /* the architecture's */
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_PRE, &on)}, TUNE_SRC_USER, 16, 1, 8);
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_DQ, &on)}, TUNE_SRC_USER, 32, 1, 8);
    expect((const tune_choice[]){choose(ctx, TF_NSA_BWD_DQ, &off)}, TUNE_SRC_USER, 16, 1, 8);
    clnsa_context_destroy(ctx);
    context_with(write_file("window_bad.json", "{\"clnsa_tuning\": 1, \"entries\": [{\"family\": \"nsa_bwd_pre\", "
                                               "\"shape\": {\"window\": 512}, \"params\": {\"WG\": 16, \"GT\": 1, \"TK\": 8}}]}"),
                 CLNSA_ERROR_INVALID_ARGUMENT);
}

/* A database entry that does not fit the device falls through to the safe
 * default (the device made smaller with CLNSA_MAX_LOCAL_MEM). */
static void test_database_entry_too_big(void **state)
{
    (void)state;
    const clnsa_device_info *info = clnsa_context_device_info(env.ctx);
    const tune_entry *db = builtin_for(info, TF_NSA_FWD);
    if (!db) {
        print_message("no built-in entry applies to %s: skipped\n", info->name);
        return;
    }
    int v[TUNE_MAX_PARAMS];
    for (int i = 0; i < db->nparams; ++i) v[tune_param_find(&tune_families[TF_NSA_FWD], db->names[i])] = db->values[i];
    const size_t need = tune_families[TF_NSA_FWD].local_bytes(v, &tiny);
    char lm[32];
    snprintf(lm, sizeof lm, "%zu", need + 512 - 4);
    assert_int_equal(setenv("CLNSA_MAX_LOCAL_MEM", lm, 1), 0);
    clnsa_context *small = context_with(NULL, CLNSA_SUCCESS);
    unsetenv("CLNSA_MAX_LOCAL_MEM");
    tune_choice c = choose(small, TF_NSA_FWD, &tiny);
    assert_true(c.source != TUNE_SRC_DEVICE);
    assert_true(tune_families[TF_NSA_FWD].local_bytes(c.v, &tiny) <= need - 4);
    clnsa_context_destroy(small);
}

/* The warp forward's V tile (V_STAGE) is counted where the program has it:
 * always in the forward that runs the top-k, never in the backward's
 * prologue, in the forward given its selection only where no selected
 * branch runs. Counted everywhere, it kept WG 128 out of the search on a
 * 48 KB device (D 128: 49 KB counted, 33 used). Likewise the gated sum of
 * the branches: only where the forward runs more than one (or may: a
 * problem whose branches are not known). */
static void test_warp_v_tile_bytes(void **state)
{
    (void)state;
    tune_problem pb = tiny;
    int v[TUNE_MAX_PARAMS] = {128, 16};
    const size_t tile = 4 * 16 * (32 + 8) * sizeof(float); /* four warps, KC = 16 rows of DV + 8 floats (DV 32 is padded) */
    const size_t sum = 4 * 16 * 32 * sizeof(float);        /* four warps, 16 rows of DV elements (f32 here) */
    pb.slc = false;
    const size_t staged = tune_families[TF_NSA_FWD_WARP].local_bytes(v, &pb);
    assert_int_equal(tune_families[TF_NSA_FWD_CMP_WARP].local_bytes(v, &pb), staged);
    assert_int_equal(tune_families[TF_NSA_FWD_FUSED_WARP].local_bytes(v, &pb), staged);
    assert_int_equal(tune_families[TF_NSA_BWD_PRE_WARP].local_bytes(v, &pb), staged - tile - sum);
    pb.slc = true;
    assert_int_equal(tune_families[TF_NSA_FWD_WARP].local_bytes(v, &pb), staged - tile);
    assert_int_equal(tune_families[TF_NSA_FWD_FUSED_WARP].local_bytes(v, &pb), staged);
    pb.branches = 1; /* the selected branch alone */
    assert_int_equal(tune_families[TF_NSA_FWD_WARP].local_bytes(v, &pb), staged - tile - sum);
    pb.branches = 2;
    assert_int_equal(tune_families[TF_NSA_FWD_WARP].local_bytes(v, &pb), staged - tile);
    /* the sum in bf16 pairs, half the f32 one; f16 keeps floats (its range) */
    pb.dtype = CLNSA_DTYPE_BF16;
    assert_int_equal(tune_families[TF_NSA_FWD_WARP].local_bytes(v, &pb), staged - tile - sum / 2);
    pb.dtype = CLNSA_DTYPE_F16;
    assert_int_equal(tune_families[TF_NSA_FWD_WARP].local_bytes(v, &pb), staged - tile);

    /* the safe defaults on a 48 KB GPU at D 128: one warp, KC 64; the fused
     * forward's shrinks from four warps to two (V tiles of 16 KB, sums of 4 KB) */
    const clnsa_device_info gpu = {.local_mem_size = 49152, .max_work_group_size = 1024, .preferred_wg_multiple = 32};
    const tune_problem big = {.dk = 128, .dv = 128, .g = 16, .block = 64, .dtype = CLNSA_DTYPE_BF16, .S = 16,
                              .cmp_block = 64, .cmp_stride = 64, .slc = true};
    const int families[] = {TF_NSA_FWD_WARP, TF_NSA_FWD_CMP_WARP, TF_NSA_BWD_PRE_WARP, TF_NSA_FWD_FUSED_WARP};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; ++i) {
        int safe[TUNE_MAX_PARAMS] = {0};
        assert_true(tune_safe_default(&gpu, families[i], &big, safe));
        assert_int_equal(safe[0], families[i] == TF_NSA_FWD_FUSED_WARP ? 64 : 32);
        assert_int_equal(safe[1], 64);
    }
    /* the forward without the selected branch, its compressed tile shared by
     * the work-group: four warps, KC 16 (KC 64's two chunks would be 64 KB) */
    tune_problem tiled = big;
    tiled.slc = false;
    tiled.cmp_tile = true;
    tiled.branches = 1;
    int safe[TUNE_MAX_PARAMS] = {0};
    assert_true(tune_safe_default(&gpu, TF_NSA_FWD_CMP_TILE_WARP, &tiled, safe));
    assert_int_equal(safe[0], 128);
    assert_int_equal(safe[1], 16);
    int kc64[TUNE_MAX_PARAMS] = {128, 64};
    assert_false(tune_fits(&gpu, TF_NSA_FWD_CMP_TILE_WARP, kc64, &tiled, false, NULL, 0));
}

/* The forward that runs the top-k holds the top-k's scores (PC_MAX floats a
 * warp) beside its own tiles: its family counts them, so that a candidate
 * that fits only without them is dropped (the planner would otherwise fall
 * back to the separate top-k, and the tuner time that). */
static void test_fused_counts_topk_scores(void **state)
{
    (void)state;
    tune_problem pb = tiny;
    int v[TUNE_MAX_PARAMS] = {64, 16};
    const size_t plain = tune_families[TF_NSA_FWD_WARP].local_bytes(v, &pb);
    assert_int_equal(tune_families[TF_NSA_FWD_FUSED_WARP].local_bytes(v, &pb), plain); /* JB not known */
    pb.fused_jb = 32;
    const size_t pc_max = (32 * 16 + 16 - 2) / 16 + 2; /* compressed keys of 32 blocks of 16, stride 16 */
    const size_t fused = tune_families[TF_NSA_FWD_FUSED_WARP].local_bytes(v, &pb);
    assert_int_equal(fused, plain + 2 * sizeof(float) * pc_max); /* two warps */

    char lm[32];
    snprintf(lm, sizeof lm, "%zu", fused + 512 - 4); /* tune_fits keeps 512 bytes back */
    assert_int_equal(setenv("CLNSA_MAX_LOCAL_MEM", lm, 1), 0);
    clnsa_context *small = context_with(NULL, CLNSA_SUCCESS);
    unsetenv("CLNSA_MAX_LOCAL_MEM");
    const clnsa_device_info *info = clnsa_context_device_info(small);
    char why[200] = "";
    assert_true(tune_fits(info, TF_NSA_FWD_WARP, v, &pb, false, NULL, 0));
    assert_false(tune_fits(info, TF_NSA_FWD_FUSED_WARP, v, &pb, false, why, sizeof why));
    assert_non_null(strstr(why, "local memory"));
    clnsa_context_destroy(small);
}

static nsa_case tiny_case(void)
{
    /* name, B, T, HQ, H, DK, DV, cu, N, bs, S, l, d, w, init, local, cmp, slc, swa, given_idx, counts,
     * given_cmp, linear, pe, dtype */
    nsa_case c = {"tiny", 1, 45, 8, 2, 32, 32, NULL, 0, 16, 4, 16, 16, 8, 1, 2, true, true, true,
                  false, false, false, false, false, CLNSA_DTYPE_F32, false};
    return c;
}

static void test_reject_before_compiling(void **state)
{
    (void)state;
    const clnsa_device_info *info = clnsa_context_device_info(env.ctx);
    int v[TUNE_MAX_PARAMS] = {64, 4, 32};
    char why[200];
    v[2] = (int)(info->local_mem_size / 4 / 33) + 64; /* more keys per tile than local memory holds */
    assert_false(tune_fits(info, TF_NSA_FWD, v, &tiny, false, why, sizeof why));
    assert_non_null(strstr(why, "local memory"));

    /* forced on a call: refused before its program is built */
    nsa_case c = tiny_case();
    nsa_run r;
    nsa_run_setup(&env, &r, &c, 5);
    nsa_run_forward(&env, &r); /* the other programs of the forward exist now */
    const unsigned builds = env.ctx->stats.builds, hits = env.ctx->stats.disk_hits;
    tune_hook h = {.ctx = env.ctx, .family = TF_NSA_FWD, .v = {v[0], v[1], v[2], 0}};
    tune_hook_set(&h);
    size_t ws_bytes = 0;
    assert_int_equal(clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &r.cfg, &r.in, &r.out, &ws_bytes), CLNSA_SUCCESS);
    cl_mem ws = clCreateBuffer(env.cl, CL_MEM_READ_WRITE, ws_bytes ? ws_bytes : 4, NULL, NULL);
    clnsa_status st = clnsa_nsa_forward(env.ctx, env.queue, &r.cfg, &r.in, &r.out, ws, ws_bytes, 0, NULL, NULL);
    tune_hook_set(NULL);
    assert_int_equal(st, CLNSA_ERROR_UNSUPPORTED_DEVICE);
    assert_int_equal(env.ctx->stats.builds, builds);
    assert_int_equal(env.ctx->stats.disk_hits, hits);
    char defines[64];
    snprintf(defines, sizeof defines, "#define TK %d\n", v[2]);
    assert_false(program_built_with(env.ctx, defines, "", NULL));
    clReleaseMemObject(ws);
    nsa_run_free(&r);
}

/* Runs a shell command of the clnsa tool whose output goes to tmpdir/log;
 * on failure prints that log, and fails. */
/* The clnsa tool (CLNSA_EXE, set by meson), or NULL with a word: the tests
 * that run it skip that part. */
static const char *clnsa_tool(void)
{
    const char *exe = getenv("CLNSA_EXE");
    if (exe && access(exe, X_OK) == 0) return exe;
    print_message("CLNSA_EXE is not set to the clnsa tool: its runs are skipped\n");
    return NULL;
}

static void run_tool(const char *cmd, const char *log)
{
    const int rc = system(cmd);
    if (rc != 0) {
        char cat[256];
        snprintf(cat, sizeof cat, "cat %s/%s", tmpdir, log);
        if (system(cat)) print_error("(no log)\n");
    }
    assert_int_equal(rc, 0);
}

/* The text of the file at path, cut to size - 1 bytes. */
static void read_text(const char *path, char *text, size_t size)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    text[fread(text, 1, size - 1, f)] = '\0';
    fclose(f);
}

/* A list of lengths that is not one (a word, an empty entry, seven
 * lengths) is refused, with a message naming --T, before anything runs. */
static void bad_lengths_refused(const char *exe)
{
    static const char *const bad[] = {"45,x", "45,", "1,2,3,4,5,6,7", "0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char cmd[1024], log[160], text[512];
        snprintf(log, sizeof log, "%s/bad_T.log", tmpdir);
        snprintf(cmd, sizeof cmd, "%s tune --family nsa_fwd --T %s > %s 2>&1", exe, bad[i], log);
        assert_int_not_equal(system(cmd), 0);
        read_text(log, text, sizeof text);
        if (!strstr(text, "--T: expected a comma-separated list")) print_error("--T %s: %s\n", bad[i], text);
        assert_non_null(strstr(text, "--T: expected a comma-separated list"));
    }
}

/* `clnsa tune --merge` of a result: folded into DIR/<vendor>.json, which
 * then holds its family; the same result with candidates --max-seconds cut
 * ("skipped") is refused, naming --partial, and merged with it. */
static void merge_result(const char *exe, const char *result)
{
    char text[16384], cut[160], dir[160], cmd[1024], log[160];
    read_text(result, text, sizeof text);
    char *at = strstr(text, "\"skipped\": 0,");
    assert_non_null(at);
    at[strlen("\"skipped\": ")] = '2';
    snprintf(cut, sizeof cut, "%s/cut.json", tmpdir);
    FILE *f = fopen(cut, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/db", tmpdir);
    snprintf(log, sizeof log, "%s/merge.log", tmpdir);
    const char *vendor = tune_vendor_key(clnsa_context_device_info(env.ctx)->vendor);
    const char *runs[][2] = {{result, ""}, {cut, ""}, {cut, " --partial"}};
    for (int i = 0; i < 3; ++i) {
        snprintf(cmd, sizeof cmd, "%s tune --merge %s --into %s%s > %s 2>&1", exe, runs[i][0], dir, runs[i][1], log);
        const int rc = system(cmd);
        read_text(log, text, sizeof text);
        if ((rc == 0) != (i != 1)) print_error("%s: exit %d: %s\n", cmd, rc, text);
        assert_int_equal(rc == 0, i != 1);
        if (i == 1) assert_non_null(strstr(text, "--partial"));
        snprintf(cmd, sizeof cmd, "%s/%s.json", dir, vendor);
        read_text(cmd, text, sizeof text);
        assert_non_null(strstr(text, "\"family\": \"nsa_fwd\""));
    }
}

/* `clnsa tune` on a tiny shape class (with a device made smaller, so some
 * candidates are dropped before compiling) at two lengths, each
 * candidate's times at both written beside the time that weighs them,
 * then its file as the user file: the tuned parameters are chosen and
 * built, and the forward agrees with the default context's; --merge
 * takes it, and refuses it cut short (merge_result). (The
 * block-sparse families' run below times one length.) Malformed lengths
 * are refused. */
static void test_tune_run(void **state)
{
    (void)state;
    const char *exe = clnsa_tool();
    if (!exe) skip();
    bad_lengths_refused(exe);
    char out[160], cmd[1024];
    snprintf(out, sizeof out, "%s/tuned.json", tmpdir);
    const char *dev = getenv("CLNSA_TEST_DEVICE");
    char devopt[64] = "";
    int p, d;
    if (dev && sscanf(dev, "%d:%d", &p, &d) == 2) snprintf(devopt, sizeof devopt, " --device %d:%d", p, d);
    snprintf(cmd, sizeof cmd,
             "CLNSA_MAX_LOCAL_MEM=12288 %s tune --family nsa_fwd,nsa_bwd_dkdv --D 32 --G 4 --block 16 --dtype f32 "
             "--T 45,60 --H 2 --S 4 --window 8 --budget 3 --repeat 1 --seed 3 --out %s%s > %s/tune.log 2>&1",
             exe, out, devopt, tmpdir);
    run_tool(cmd, "tune.log");

    tune_file *tf = NULL;
    char msg[512];
    assert_int_equal(tune_file_load(out, &tf, msg, sizeof msg), CLNSA_SUCCESS);
    assert_int_equal(tf->count, 2);
    const tune_entry *fwd = strcmp(tf->entries[0].family, "nsa_fwd") == 0 ? &tf->entries[0] : &tf->entries[1];
    assert_string_equal(fwd->family, "nsa_fwd");
    int v[TUNE_MAX_PARAMS];
    for (int i = 0; i < fwd->nparams; ++i) v[tune_param_find(&tune_families[TF_NSA_FWD], fwd->names[i])] = fwd->values[i];
    /* every candidate it kept fits the smaller device */
    clnsa_device_info small = *clnsa_context_device_info(env.ctx);
    small.local_mem_size = 12288;
    assert_true(tune_fits(&small, TF_NSA_FWD, v, &tiny, false, NULL, 0));
    tune_file_free(tf);
    char text[16384];
    read_text(out, text, sizeof text);
    assert_non_null(strstr(text, "\"unfit\": "));
    assert_null(strstr(text, "\"unfit\": 0,"));
    assert_non_null(strstr(text, "\"T\": [45, 60]"));
    assert_non_null(strstr(text, "\"ms_at_T\": ["));
    assert_non_null(strstr(text, "\"time_ms_at_T\": ["));
    merge_result(exe, out);

    clnsa_context *tuned = context_with(out, CLNSA_SUCCESS);
    tune_choice c = choose(tuned, TF_NSA_FWD, &tiny);
    expect(&c, TUNE_SRC_USER, v[0], v[1], v[2]);

    nsa_case cs = tiny_case();
    nsa_run a, b;
    test_env te = env;
    te.ctx = tuned;
    nsa_run_setup(&env, &a, &cs, 9);
    nsa_run_forward(&env, &a);
    nsa_run_setup(&te, &b, &cs, 9);
    nsa_run_forward(&te, &b);
    char defines[96];
    snprintf(defines, sizeof defines, "#define WG %d\n#define GT %d\n", v[0], v[1]);
    assert_true(program_built_with(tuned, defines, "", NULL));
    const double e = rel_l2(b.o, a.o, a.nq * cs.DV);
    if (!(e <= 1e-5)) print_error("tuned forward differs from the default context's: rel L2 %.3g\n", e);
    assert_true(e <= 1e-5);
    nsa_run_free(&a);
    nsa_run_free(&b);
    clnsa_context_destroy(tuned);
}

/* `clnsa tune --family nsa_fwd_split` on the tensor-core path (emulated on
 * a device without tensor cores) at two lengths: its candidates are the
 * lengths and never, each checked against the never's output (the split
 * against the fused forward at --verify-T, in bf16), and its pick loads
 * back as a user file's MIN_T. */
static void test_tune_split(void **state)
{
    (void)state;
    const char *exe = clnsa_tool();
    if (!exe) skip();
    char out[160], cmd[1024];
    snprintf(out, sizeof out, "%s/split.json", tmpdir);
    snprintf(cmd, sizeof cmd,
             "CLNSA_MMA=%s %s tune --family nsa_fwd_split --D 32 --G 4 --block 16 --dtype bf16 --T 40,70 --H 1 --S 4 "
             "--window 0 --repeat 1 --verify-T 40 --out %s > %s/split.log 2>&1",
             clnsa_context_device_info(env.ctx)->nv_compute_major >= 8 ? "auto" : "emulate", exe, out, tmpdir);
    run_tool(cmd, "split.log");
    char text[16384];
    read_text(out, text, sizeof text);
    assert_non_null(strstr(text, "\"space\": 3,"));
    assert_non_null(strstr(text, "\"wrong\": 0,"));
    tune_file *tf = NULL;
    char msg[512];
    assert_int_equal(tune_file_load(out, &tf, msg, sizeof msg), CLNSA_SUCCESS);
    assert_int_equal(tf->count, 1);
    const int min_t = tf->entries[0].values[0];
    assert_true(min_t == 40 || min_t == 70 || min_t == TUNE_SPLIT_NEVER);
    tune_file_free(tf);
    clnsa_context *ctx = context_with(out, CLNSA_SUCCESS);
    const tune_problem pb = {.dk = 32, .dv = 32, .g = 4, .block = 16, .dtype = CLNSA_DTYPE_BF16, .S = 4, .cmp_block = 16,
                             .cmp_stride = 16};
    expect((const tune_choice[]){choose(ctx, TF_NSA_FWD_SPLIT, &pb)}, TUNE_SRC_USER, min_t, 0, 0);
    clnsa_context_destroy(ctx);
}

/* One block-sparse forward + backward (causal, window 13) on `ctx`; the
 * outputs and gradients read back into out[0..4) (o, lse, dq, dk, dv). */
static void blocksparse_run(clnsa_context *ctx, double *out[5], size_t n[5])
{
    const int T = 53, H = 2, HQ = 8, D = 32;
    const int64_t sq[4] = {1, T, HQ, D}, sk[4] = {1, T, H, D}, sl[3] = {1, T, HQ};
    const size_t nq = (size_t)T * HQ * D, nk = (size_t)T * H * D;
    uint64_t seed = 77;
    double *hq = alloc_uniform(nq, -1, 1, &seed), *hk = alloc_uniform(nk, -1, 1, &seed), *hv = alloc_uniform(nk, -1, 1, &seed);
    double *hd = alloc_uniform(nq, -1, 1, &seed);
    cl_mem m[9] = {upload(&env, hq, nq, CLNSA_DTYPE_F32, false), upload(&env, hk, nk, CLNSA_DTYPE_F32, false),
                   upload(&env, hv, nk, CLNSA_DTYPE_F32, false), poisoned(&env, nq, CLNSA_DTYPE_F32),
                   poisoned(&env, (size_t)T * HQ, CLNSA_DTYPE_F32), upload(&env, hd, nq, CLNSA_DTYPE_F32, false),
                   poisoned(&env, nq, CLNSA_DTYPE_F32), poisoned(&env, nk, CLNSA_DTYPE_F32), poisoned(&env, nk, CLNSA_DTYPE_F32)};
    clnsa_blocksparse_config cfg;
    clnsa_blocksparse_config_init(&cfg);
    cfg.causal = 1;
    cfg.window_left = 13;
    const clnsa_tensor q = clnsa_tensor_contiguous(m[0], CLNSA_DTYPE_F32, 4, sq);
    const clnsa_blocksparse_inputs in = {.q = q, .k = clnsa_tensor_contiguous(m[1], CLNSA_DTYPE_F32, 4, sk),
                                         .v = clnsa_tensor_contiguous(m[2], CLNSA_DTYPE_F32, 4, sk)};
    const clnsa_blocksparse_outputs o = {clnsa_tensor_contiguous(m[3], CLNSA_DTYPE_F32, 4, sq),
                                         clnsa_tensor_contiguous(m[4], CLNSA_DTYPE_F32, 3, sl)};
    const clnsa_blocksparse_grad_inputs gin = {o.o, o.lse, clnsa_tensor_contiguous(m[5], CLNSA_DTYPE_F32, 4, sq)};
    const clnsa_blocksparse_grads gr = {.dq = clnsa_tensor_contiguous(m[6], CLNSA_DTYPE_F32, 4, sq),
                                        .dk = clnsa_tensor_contiguous(m[7], CLNSA_DTYPE_F32, 4, sk),
                                        .dv = clnsa_tensor_contiguous(m[8], CLNSA_DTYPE_F32, 4, sk)};
    size_t fb = 0, bb = 0;
    assert_int_equal(clnsa_blocksparse_forward_workspace_size(ctx, &cfg, &in, &o, &fb), CLNSA_SUCCESS);
    assert_int_equal(clnsa_blocksparse_backward_workspace_size(ctx, &cfg, &in, &gin, &gr, &bb), CLNSA_SUCCESS);
    cl_mem ws = poisoned(&env, (fb > bb ? fb : bb) / 4 + 1, CLNSA_DTYPE_F32);
    assert_int_equal(clnsa_blocksparse_forward(ctx, env.queue, &cfg, &in, &o, ws, fb, 0, NULL, NULL), CLNSA_SUCCESS);
    assert_int_equal(clnsa_blocksparse_backward(ctx, env.queue, &cfg, &in, &gin, &gr, ws, bb, 0, NULL, NULL),
                     CLNSA_SUCCESS);
    const size_t sizes[5] = {nq, (size_t)T * HQ, nq, nk, nk};
    for (int i = 0; i < 5; ++i) {
        n[i] = sizes[i];
        out[i] = malloc(n[i] * sizeof(double));
        download(&env, m[i == 0 ? 3 : i == 1 ? 4 : 4 + i], n[i], CLNSA_DTYPE_F32, out[i]);
    }
    clReleaseMemObject(ws);
    for (int i = 0; i < 9; ++i) clReleaseMemObject(m[i]);
    free(hq);
    free(hk);
    free(hv);
    free(hd);
}

/* The tuner's build-only mode (its background builds, beside the thread
 * that times) makes an op build its programs and enqueue nothing. The
 * block-sparse ops ran their kernels under it until 2026-12-07, competing
 * with the timed runs: here their outputs must stay poisoned. */
static void test_build_only_enqueues_nothing(void **state)
{
    (void)state;
    tune_hook h = {.ctx = env.ctx, .family = -1, .build_only = true};
    double *out[5];
    size_t n[5];
    tune_hook_set(&h);
    blocksparse_run(env.ctx, out, n);
    tune_hook_set(NULL);
    for (int i = 0; i < 5; ++i) {
        for (size_t j = 0; j < n[i]; ++j) assert_true(isnan(out[i][j]));
        free(out[i]);
    }
}

/* The block-sparse families: a user file's tiles are taken and built,
 * CLNSA_TUNE_WG replaces only their work-group size (the tiles, and so the
 * summation order, stay), and `clnsa tune --family blocksparse` on a tiny
 * class writes entries that load back and give the default's results. */
static void test_blocksparse_families(void **state)
{
    (void)state;
    const clnsa_device_info *info = clnsa_context_device_info(env.ctx);
    const tune_problem bs = {.dk = 32, .dv = 32, .g = 4, .dtype = CLNSA_DTYPE_F32};
    char text[1024];
    snprintf(text, sizeof text,
             "{\"clnsa_tuning\": 1, \"entries\": [\n"
             " {\"vendor\": \"%s\", \"family\": \"blocksparse_fwd\", \"shape\": {\"dk\": 32, \"g\": 4},\n"
             "  \"params\": {\"WG\": 32, \"BQ\": 8, \"BK\": 24}},\n"
             " {\"family\": \"blocksparse_bwd\", \"params\": {\"WG\": 32, \"BQ\": 24, \"BK\": 8}}\n"
             "]}\n",
             tune_vendor_key(info->vendor));
    clnsa_context *ctx = context_with(write_file("bs.json", text), CLNSA_SUCCESS);
    tune_choice c = choose(ctx, TF_BS_FWD, &bs);
    expect(&c, TUNE_SRC_USER, 32, 8, 24);
    c = choose(ctx, TF_BS_BWD, &bs);
    expect(&c, TUNE_SRC_USER, 32, 24, 8);
    assert_int_equal(setenv("CLNSA_TUNE_WG", "64", 1), 0);
    c = choose(ctx, TF_BS_BWD, &bs);
    unsetenv("CLNSA_TUNE_WG");
    expect(&c, TUNE_SRC_USER, 64, 24, 8);
    assert_int_equal(setenv("CLNSA_TUNE_BS_FWD_BQ", "16", 1), 0);
    c = choose(ctx, TF_BS_FWD, &bs);
    unsetenv("CLNSA_TUNE_BS_FWD_BQ");
    assert_int_equal(c.source, TUNE_SRC_ENV);
    assert_int_equal(c.v[1], 16);

    double *ref[5], *got[5];
    size_t n[5];
    blocksparse_run(env.ctx, ref, n);
    blocksparse_run(ctx, got, n);
    assert_true(program_built_with(ctx, "#define GT 8\n#define TK 24\n", "", NULL));
    assert_true(program_built_with(ctx, "#define BQ 24\n#define BK 8\n", "", NULL));
    for (int i = 0; i < 5; ++i) {
        const double e = rel_l2_lse(got[i], ref[i], n[i]);
        if (!(e <= 1e-5)) print_error("output %d with the user file's tiles: rel L2 %.3g\n", i, e);
        assert_true(e <= 1e-5);
        free(got[i]);
    }
    clnsa_context_destroy(ctx);

    const char *exe = clnsa_tool();
    if (!exe) {
        for (int i = 0; i < 5; ++i) free(ref[i]);
        return;
    }
    char out[160], cmd[1024];
    snprintf(out, sizeof out, "%s/bs_tuned.json", tmpdir);
    snprintf(cmd, sizeof cmd,
             "%s tune --family blocksparse --D 32 --G 4 --dtype f32 --T 40 --H 2 --window 13 --budget 3 --repeat 1 "
             "--out %s > %s/bs_tune.log 2>&1",
             exe, out, tmpdir);
    run_tool(cmd, "bs_tune.log");
    tune_file *tf = NULL;
    char msg[512];
    assert_int_equal(tune_file_load(out, &tf, msg, sizeof msg), CLNSA_SUCCESS);
    assert_int_equal(tf->count, 2);
    assert_int_equal(tf->entries[0].block, 0); /* "*": no selection block for block-sparse */
    tune_file_free(tf);
    ctx = context_with(out, CLNSA_SUCCESS);
    assert_int_equal(choose(ctx, TF_BS_FWD, &bs).source, TUNE_SRC_USER);
    assert_int_equal(choose(ctx, TF_BS_BWD, &bs).source, TUNE_SRC_USER);
    blocksparse_run(ctx, got, n);
    for (int i = 0; i < 5; ++i) {
        assert_true(rel_l2_lse(got[i], ref[i], n[i]) <= 1e-5);
        free(got[i]);
        free(ref[i]);
    }
    clnsa_context_destroy(ctx);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/clnsa-tuning-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    test_env_open(&env);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_env_close(&env);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_entries_resolve),
        cmocka_unit_test(test_lookup_order),
        cmocka_unit_test(test_dtype_sibling),
        cmocka_unit_test(test_split_length),
        cmocka_unit_test(test_window_rank),
        cmocka_unit_test(test_database_entry_too_big),
        cmocka_unit_test(test_fused_counts_topk_scores),
        cmocka_unit_test(test_warp_v_tile_bytes),
        cmocka_unit_test(test_reject_before_compiling),
        cmocka_unit_test(test_tune_run),
        cmocka_unit_test(test_tune_split),
        cmocka_unit_test(test_blocksparse_families),
        cmocka_unit_test(test_build_only_enqueues_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
