/* test_nsa_fwd.c: the NSA forward against the double-precision reference on
 * random shapes (not multiples of the tiles), with poisoned outputs. */
#include "nsa_ref.h"
#include "testutil.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static test_env env;

typedef struct {
    const char *name;
    int B, T, HQ, H, DK, DV;
    const int *cu;
    int N;
    int bs, S, cmp_l, cmp_d, window, init_blocks, local_blocks;
    bool cmp, slc, swa;
    bool given_idx, counts, given_cmp, linear, pe;
    clnsa_dtype dt;
} fwd_case;

typedef struct {
    cl_mem m;
    double *h;
    size_t n;
} dbuf;

static dbuf dev_rand(size_t n, double lo, double hi, clnsa_dtype dt, uint64_t *seed)
{
    dbuf b = {NULL, alloc_uniform(n, lo, hi, seed), n};
    b.m = upload(&env, b.h, n, dt, true);
    return b;
}

static void dfree(dbuf *b)
{
    if (b->m) clReleaseMemObject(b->m);
    free(b->h);
}

static int *random_indices(const fwd_case *c, int *counts, uint64_t *seed)
{
    /* Random blocks, some -1, some duplicated or in the future, so every
     * documented rule is exercised. */
    size_t rows = (size_t)c->B * c->T * c->H;
    int *idx = malloc(rows * c->S * sizeof *idx);
    double r[4];
    for (size_t i = 0; i < rows; ++i) {
        int t = (int)(i / c->H % c->T), nb = t / c->bs + 1;
        for (int s = 0; s < c->S; ++s) {
            fill_uniform(r, 2, 0, 1, seed);
            idx[i * c->S + s] = r[0] < 0.1 ? -1 : r[0] < 0.15 ? nb + 2 : (int)(r[1] * nb);
        }
        if (counts) {
            fill_uniform(r, 1, 0, 1, seed);
            counts[i] = (int)(r[0] * (c->S + 2)) - 1;
        }
    }
    return idx;
}

static double tol(clnsa_dtype dt) { return dt == CLNSA_DTYPE_F32 ? 2e-5 : 1e-2; }

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

static void run_case(const fwd_case *c, uint64_t seed)
{
    const clnsa_dtype dt = c->dt;
    const size_t nq = (size_t)c->B * c->T * c->HQ, nk = (size_t)c->B * c->T * c->H;
    const size_t rows = nk, nl = nq;
    ref_nsa_shape sh;
    ref_nsa_shape_init(&sh, c->B, c->T, c->HQ, c->H, c->DK, c->DV);
    sh.cu_seqlens = c->cu;
    sh.N = c->N;
    sh.block_size = c->bs;
    sh.block_count = c->S;
    sh.cmp_block = c->cmp_l;
    sh.cmp_stride = c->cmp_d;
    sh.window = c->window;
    sh.init_blocks = c->init_blocks;
    sh.local_blocks = c->local_blocks;
    const int NC = ref_total_cmp(&sh), l = ref_cmp_block(&sh);

    dbuf q = dev_rand(nq * c->DK, -1, 1, dt, &seed), k = dev_rand(nk * c->DK, -1, 1, dt, &seed);
    dbuf v = dev_rand(nk * c->DV, -1, 1, dt, &seed);
    dbuf gc = {0}, gs = {0}, gw = {0}, kc = {0}, vc = {0}, wk = {0}, wv = {0}, bk = {0}, bv = {0}, pk = {0}, pv = {0};
    if (c->cmp) gc = dev_rand(nl, 0, 1, dt, &seed);
    if (c->slc) gs = dev_rand(nl, 0, 1, dt, &seed);
    if (c->swa) gw = dev_rand(nl, 0, 1, dt, &seed);
    if (c->given_cmp) {
        kc = dev_rand((size_t)c->B * NC * c->H * c->DK, -1, 1, dt, &seed);
        vc = dev_rand((size_t)c->B * NC * c->H * c->DV, -1, 1, dt, &seed);
    }
    if (c->linear) {
        wk = dev_rand((size_t)l * c->DK * c->DK, -0.3, 0.3, dt, &seed);
        wv = dev_rand((size_t)l * c->DV * c->DV, -0.3, 0.3, dt, &seed);
        bk = dev_rand((size_t)c->DK, -1, 1, dt, &seed);
        bv = dev_rand((size_t)c->DV, -1, 1, dt, &seed);
        if (c->pe) {
            pk = dev_rand((size_t)l * c->DK, -1, 1, dt, &seed);
            pv = dev_rand((size_t)l * c->DV, -1, 1, dt, &seed);
        }
    }
    int *counts = c->counts ? malloc(rows * sizeof *counts) : NULL;
    int *given = c->given_idx ? random_indices(c, counts, &seed) : NULL;
    if (counts && !given) random_indices(c, counts, &seed);

    clnsa_nsa_config cfg;
    clnsa_nsa_config_init(&cfg);
    cfg.block_size = c->bs;
    cfg.block_count = c->S;
    cfg.cmp_block = c->cmp_l;
    cfg.cmp_stride = c->cmp_d;
    cfg.window = c->window;
    cfg.init_blocks = c->init_blocks;
    cfg.local_blocks = c->local_blocks;

    clnsa_nsa_inputs in;
    memset(&in, 0, sizeof in);
    in.q = tensor4(q.m, dt, c->B, c->T, c->HQ, c->DK);
    in.k = tensor4(k.m, dt, c->B, c->T, c->H, c->DK);
    in.v = tensor4(v.m, dt, c->B, c->T, c->H, c->DV);
    if (gc.m) in.g_cmp = tensor3(gc.m, dt, c->B, c->T, c->HQ);
    if (gs.m) in.g_slc = tensor3(gs.m, dt, c->B, c->T, c->HQ);
    if (gw.m) in.g_swa = tensor3(gw.m, dt, c->B, c->T, c->HQ);
    cl_mem cu_m = NULL, idx_m = NULL, cnt_m = NULL;
    if (c->cu) {
        cu_m = upload_i32(&env, c->cu, (size_t)c->N + 1);
        int64_t s = c->N + 1;
        in.cu_seqlens = clnsa_tensor_contiguous(cu_m, CLNSA_DTYPE_I32, 1, &s);
    }
    if (kc.m) {
        in.k_cmp = tensor4(kc.m, dt, c->B, NC, c->H, c->DK);
        in.v_cmp = tensor4(vc.m, dt, c->B, NC, c->H, c->DV);
    }
    if (wk.m) {
        int64_t sw[2] = {(int64_t)l * c->DK, c->DK}, sv[2] = {(int64_t)l * c->DV, c->DV};
        int64_t spk[2] = {l, c->DK}, spv[2] = {l, c->DV}, sbk = c->DK, sbv = c->DV;
        in.w_k = clnsa_tensor_contiguous(wk.m, dt, 2, sw);
        in.w_v = clnsa_tensor_contiguous(wv.m, dt, 2, sv);
        in.b_k = clnsa_tensor_contiguous(bk.m, dt, 1, &sbk);
        in.b_v = clnsa_tensor_contiguous(bv.m, dt, 1, &sbv);
        if (pk.m) {
            in.pe_k = clnsa_tensor_contiguous(pk.m, dt, 2, spk);
            in.pe_v = clnsa_tensor_contiguous(pv.m, dt, 2, spv);
        }
    }
    if (given) {
        idx_m = upload_i32(&env, given, rows * c->S);
        in.block_indices = tensor4(idx_m, CLNSA_DTYPE_I32, c->B, c->T, c->H, c->S);
    }
    if (counts) {
        cnt_m = upload_i32(&env, counts, rows);
        in.block_counts = tensor3(cnt_m, CLNSA_DTYPE_I32, c->B, c->T, c->H);
    }

    clnsa_nsa_outputs out;
    memset(&out, 0, sizeof out);
    cl_mem o_m = poisoned(&env, nq * c->DV, dt);
    cl_mem lse_m[3] = {poisoned(&env, nl, CLNSA_DTYPE_F32), poisoned(&env, nl, CLNSA_DTYPE_F32),
                       poisoned(&env, nl, CLNSA_DTYPE_F32)};
    cl_mem bi_m = poisoned(&env, rows * c->S, CLNSA_DTYPE_I32);
    out.o = tensor4(o_m, dt, c->B, c->T, c->HQ, c->DV);
    out.lse_cmp = tensor3(lse_m[0], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out.lse_slc = tensor3(lse_m[1], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out.lse_swa = tensor3(lse_m[2], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out.block_indices = tensor4(bi_m, CLNSA_DTYPE_I32, c->B, c->T, c->H, c->S);

    size_t ws_bytes = 0;
    clnsa_status st = clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &cfg, &in, &out, &ws_bytes);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    cl_mem ws = ws_bytes ? poisoned(&env, ws_bytes / 4, CLNSA_DTYPE_F32) : NULL;
    cl_event ev = NULL;
    st = clnsa_nsa_forward(env.ctx, env.queue, &cfg, &in, &out, ws, ws_bytes, 0, NULL, &ev);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_non_null(ev);
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);

    /* device results */
    double *o = malloc(nq * c->DV * sizeof *o), *lse[3];
    download(&env, o_m, nq * c->DV, dt, o);
    int *bi = malloc(rows * c->S * sizeof *bi);
    download_i32(&env, bi_m, rows * c->S, bi);
    for (int i = 0; i < 3; ++i) {
        lse[i] = malloc(nl * sizeof(double));
        download(&env, lse_m[i], nl, CLNSA_DTYPE_F32, lse[i]);
    }

    /* reference: the compressed tensors are computed here (the device keeps
     * them in the storage type, so they are rounded the same way) and given */
    double *rkc = kc.h, *rvc = vc.h;
    const size_t nkc = (size_t)c->B * NC * c->H * c->DK, nvc = (size_t)c->B * NC * c->H * c->DV;
    if (!c->given_cmp) {
        rkc = calloc(nkc, sizeof *rkc);
        rvc = calloc(nvc, sizeof *rvc);
        if (c->linear) {
            ref_compress_linear(&sh, k.h, c->DK, wk.h, bk.h, pk.h, rkc);
            ref_compress_linear(&sh, v.h, c->DV, wv.h, bv.h, pv.h, rvc);
        } else {
            ref_compress_mean(&sh, k.h, c->DK, rkc);
            ref_compress_mean(&sh, v.h, c->DV, rvc);
        }
        round_to(rkc, nkc, dt);
        round_to(rvc, nvc, dt);
    }
    bool topk_ran = c->slc && !given;
    if (topk_ran && dt == CLNSA_DTYPE_F32) {
        int *rbi = malloc(rows * c->S * sizeof *rbi);
        ref_topk(&sh, q.h, rkc, counts, rbi);
        same_sets(bi, rbi, rows, c->S);
        free(rbi);
    }
    ref_nsa_inputs rin = {q.h, k.h, v.h, gc.h, gs.h, gw.h, rkc, rvc, topk_ran ? bi : given, counts};
    double *ro = calloc(nq * c->DV, sizeof *ro), *rl[3];
    for (int i = 0; i < 3; ++i) rl[i] = calloc(nl, sizeof(double));
    ref_nsa_outputs rout = {ro, NULL, NULL, NULL, rl[0], rl[1], rl[2], NULL};
    ref_nsa_fwd(&sh, &rin, &rout);

    double e = rel_l2(o, ro, nq * c->DV);
    if (!(e < tol(dt))) print_error("%s: o rel L2 %.3g\n", c->name, e);
    assert_true(e < tol(dt));
    bool on[3] = {c->cmp, c->slc, c->swa};
    for (int i = 0; i < 3; ++i) {
        if (!on[i]) continue;
        double el = rel_l2_lse(lse[i], rl[i], nl);
        if (!(el < tol(dt))) print_error("%s: lse[%d] rel L2 %.3g\n", c->name, i, el);
        assert_true(el < tol(dt));
    }

    free(o); free(bi); free(ro);
    for (int i = 0; i < 3; ++i) { free(lse[i]); free(rl[i]); clReleaseMemObject(lse_m[i]); }
    if (!c->given_cmp) { free(rkc); free(rvc); }
    free(given); free(counts);
    clReleaseMemObject(o_m); clReleaseMemObject(bi_m);
    if (ws) clReleaseMemObject(ws);
    if (cu_m) clReleaseMemObject(cu_m);
    if (idx_m) clReleaseMemObject(idx_m);
    if (cnt_m) clReleaseMemObject(cnt_m);
    dbuf *all[] = {&q, &k, &v, &gc, &gs, &gw, &kc, &vc, &wk, &wv, &bk, &bv, &pk, &pv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) dfree(all[i]);
}

#define F32 CLNSA_DTYPE_F32
static const int cu3[] = {0, 5, 5, 43, 70};

/* name, B, T, HQ, H, DK, DV, cu, N, bs, S, l, d, w, init, local, cmp, slc, swa, given_idx, counts,
 * given_cmp, linear, pe, dtype */
static const fwd_case cases[] = {
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
    fwd_case c = {"linear compression", 1, 35, 4, 2, 8, 16, NULL, 0, 8, 3, 4, 4, 0, 1, 2, true, true, false, false, false, false, true, true, F32};
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
