/* nsa_case.c: see nsa_case.h. */
#include "nsa_case.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

dbuf dev_rand(const test_env *env, size_t n, double lo, double hi, clnsa_dtype dt, uint64_t *seed)
{
    dbuf b = {NULL, alloc_uniform(n, lo, hi, seed), n};
    b.m = upload(env, b.h, n, dt, true);
    return b;
}

void dfree(dbuf *b)
{
    if (b->m) clReleaseMemObject(b->m);
    free(b->h);
    memset(b, 0, sizeof *b);
}

double nsa_tol(const nsa_case *c) { return c->dt != CLNSA_DTYPE_F32 ? 1e-2 : c->tf32 ? 2e-3 : 2e-5; }

static int *random_indices(const nsa_case *c, int *counts, uint64_t *seed)
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

ref_nsa_shape nsa_case_shape(const nsa_case *c)
{
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
    return sh;
}

static void setup_inputs(const test_env *env, nsa_run *r, uint64_t *seed)
{
    const nsa_case *c = r->c;
    const clnsa_dtype dt = c->dt;
    const int l = r->l, NC = r->NC;
    r->q = dev_rand(env, r->nq * c->DK, -1, 1, dt, seed);
    r->k = dev_rand(env, r->nk * c->DK, -1, 1, dt, seed);
    r->v = dev_rand(env, r->nk * c->DV, -1, 1, dt, seed);
    if (c->cmp) r->gc = dev_rand(env, r->nq, 0, 1, dt, seed);
    if (c->slc) r->gs = dev_rand(env, r->nq, 0, 1, dt, seed);
    if (c->swa) r->gw = dev_rand(env, r->nq, 0, 1, dt, seed);
    if (c->given_cmp) {
        r->kc = dev_rand(env, (size_t)c->B * NC * c->H * c->DK, -1, 1, dt, seed);
        r->vc = dev_rand(env, (size_t)c->B * NC * c->H * c->DV, -1, 1, dt, seed);
    }
    if (c->linear) {
        r->wk = dev_rand(env, (size_t)l * c->DK * c->DK, -0.3, 0.3, dt, seed);
        r->wv = dev_rand(env, (size_t)l * c->DV * c->DV, -0.3, 0.3, dt, seed);
        r->bk = dev_rand(env, (size_t)c->DK, -1, 1, dt, seed);
        r->bv = dev_rand(env, (size_t)c->DV, -1, 1, dt, seed);
        if (c->pe) {
            r->pk = dev_rand(env, (size_t)l * c->DK, -1, 1, dt, seed);
            r->pv = dev_rand(env, (size_t)l * c->DV, -1, 1, dt, seed);
        }
    }
    r->counts = c->counts ? malloc(r->nk * sizeof *r->counts) : NULL;
    r->given = c->given_idx ? random_indices(c, r->counts, seed) : NULL;
    if (r->counts && !r->given) free(random_indices(c, r->counts, seed));
}

static void describe_inputs(const test_env *env, nsa_run *r)
{
    const nsa_case *c = r->c;
    const clnsa_dtype dt = c->dt;
    const int l = r->l, NC = r->NC;
    clnsa_nsa_inputs *in = &r->in;
    memset(in, 0, sizeof *in);
    in->q = tensor4(r->q.m, dt, c->B, c->T, c->HQ, c->DK);
    in->k = tensor4(r->k.m, dt, c->B, c->T, c->H, c->DK);
    in->v = tensor4(r->v.m, dt, c->B, c->T, c->H, c->DV);
    if (r->gc.m) in->g_cmp = tensor3(r->gc.m, dt, c->B, c->T, c->HQ);
    if (r->gs.m) in->g_slc = tensor3(r->gs.m, dt, c->B, c->T, c->HQ);
    if (r->gw.m) in->g_swa = tensor3(r->gw.m, dt, c->B, c->T, c->HQ);
    if (c->cu) {
        r->cu_m = upload_i32(env, c->cu, (size_t)c->N + 1);
        int64_t s = c->N + 1;
        in->cu_seqlens = clnsa_tensor_contiguous(r->cu_m, CLNSA_DTYPE_I32, 1, &s);
    }
    if (r->kc.m) {
        in->k_cmp = tensor4(r->kc.m, dt, c->B, NC, c->H, c->DK);
        in->v_cmp = tensor4(r->vc.m, dt, c->B, NC, c->H, c->DV);
    }
    if (r->wk.m) {
        int64_t sw[2] = {(int64_t)l * c->DK, c->DK}, sv[2] = {(int64_t)l * c->DV, c->DV};
        int64_t spk[2] = {l, c->DK}, spv[2] = {l, c->DV}, sbk = c->DK, sbv = c->DV;
        in->w_k = clnsa_tensor_contiguous(r->wk.m, dt, 2, sw);
        in->w_v = clnsa_tensor_contiguous(r->wv.m, dt, 2, sv);
        in->b_k = clnsa_tensor_contiguous(r->bk.m, dt, 1, &sbk);
        in->b_v = clnsa_tensor_contiguous(r->bv.m, dt, 1, &sbv);
        if (r->pk.m) {
            in->pe_k = clnsa_tensor_contiguous(r->pk.m, dt, 2, spk);
            in->pe_v = clnsa_tensor_contiguous(r->pv.m, dt, 2, spv);
        }
    }
    if (r->given) {
        r->idx_m = upload_i32(env, r->given, r->nk * c->S);
        in->block_indices = tensor4(r->idx_m, CLNSA_DTYPE_I32, c->B, c->T, c->H, c->S);
    }
    if (r->counts) {
        r->cnt_m = upload_i32(env, r->counts, r->nk);
        in->block_counts = tensor3(r->cnt_m, CLNSA_DTYPE_I32, c->B, c->T, c->H);
    }
}

void nsa_run_setup(const test_env *env, nsa_run *r, const nsa_case *c, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    r->sh = nsa_case_shape(c);
    r->NC = ref_total_cmp(&r->sh);
    r->l = ref_cmp_block(&r->sh);
    r->nq = (size_t)c->B * c->T * c->HQ;
    r->nk = (size_t)c->B * c->T * c->H;
    setup_inputs(env, r, &seed);
    describe_inputs(env, r);

    clnsa_nsa_config_init(&r->cfg);
    r->cfg.block_size = c->bs;
    r->cfg.block_count = c->S;
    r->cfg.cmp_block = c->cmp_l;
    r->cfg.cmp_stride = c->cmp_d;
    r->cfg.window = c->window;
    r->cfg.init_blocks = c->init_blocks;
    r->cfg.local_blocks = c->local_blocks;

    clnsa_nsa_outputs *out = &r->out;
    memset(out, 0, sizeof *out);
    r->o_m = poisoned(env, r->nq * c->DV, c->dt);
    for (int i = 0; i < 3; ++i) r->lse_m[i] = poisoned(env, r->nq, CLNSA_DTYPE_F32);
    r->bi_m = poisoned(env, r->nk * c->S, CLNSA_DTYPE_I32);
    out->o = tensor4(r->o_m, c->dt, c->B, c->T, c->HQ, c->DV);
    out->lse_cmp = tensor3(r->lse_m[0], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out->lse_slc = tensor3(r->lse_m[1], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out->lse_swa = tensor3(r->lse_m[2], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out->block_indices = tensor4(r->bi_m, CLNSA_DTYPE_I32, c->B, c->T, c->H, c->S);
}

void nsa_run_save_branches(const test_env *env, nsa_run *r)
{
    const nsa_case *c = r->c;
    const bool on[3] = {c->cmp, c->slc, c->swa};
    clnsa_tensor *ob[3] = {&r->out.o_cmp, &r->out.o_slc, &r->out.o_swa};
    for (int i = 0; i < 3; ++i) {
        if (!on[i]) continue;
        r->ob_m[i] = poisoned(env, r->nq * c->DV, c->dt);
        *ob[i] = tensor4(r->ob_m[i], c->dt, c->B, c->T, c->HQ, c->DV);
    }
}

/* The compressed tensors as the device computes them, for the reference. */
static void ref_compressed(nsa_run *r)
{
    const nsa_case *c = r->c;
    const size_t nkc = (size_t)c->B * r->NC * c->H * c->DK, nvc = (size_t)c->B * r->NC * c->H * c->DV;
    if (c->given_cmp) {
        r->rkc = malloc(nkc * sizeof *r->rkc);
        r->rvc = malloc(nvc * sizeof *r->rvc);
        memcpy(r->rkc, r->kc.h, nkc * sizeof *r->rkc);
        memcpy(r->rvc, r->vc.h, nvc * sizeof *r->rvc);
        return;
    }
    r->rkc = calloc(nkc, sizeof *r->rkc);
    r->rvc = calloc(nvc, sizeof *r->rvc);
    if (c->linear) {
        ref_compress_linear(&r->sh, r->k.h, c->DK, r->wk.h, r->bk.h, r->pk.h, r->rkc);
        ref_compress_linear(&r->sh, r->v.h, c->DV, r->wv.h, r->bv.h, r->pv.h, r->rvc);
    } else {
        ref_compress_mean(&r->sh, r->k.h, c->DK, r->rkc);
        ref_compress_mean(&r->sh, r->v.h, c->DV, r->rvc);
    }
    round_to(r->rkc, nkc, c->dt);
    round_to(r->rvc, nvc, c->dt);
}

void nsa_run_drop_lse(nsa_run *r)
{
    const clnsa_tensor none = {0};
    r->out.lse_cmp = r->out.lse_slc = r->out.lse_swa = none;
    r->lse_dropped = true;
}

void nsa_run_forward(const test_env *env, nsa_run *r)
{
    const nsa_case *c = r->c;
    size_t ws_bytes = 0;
    clnsa_status st = clnsa_nsa_forward_workspace_size(env->ctx, env->queue, &r->cfg, &r->in, &r->out, &ws_bytes);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env->ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    r->ws = ws_bytes ? poisoned(env, ws_bytes / 4, CLNSA_DTYPE_F32) : NULL;
    cl_event ev = NULL;
    st = clnsa_nsa_forward(env->ctx, env->queue, &r->cfg, &r->in, &r->out, r->ws, ws_bytes, 0, NULL, &ev);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env->ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_non_null(ev);
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
    r->o = malloc(r->nq * c->DV * sizeof *r->o);
    download(env, r->o_m, r->nq * c->DV, c->dt, r->o);
    for (int i = 0; i < 3; ++i) {
        r->lse[i] = malloc(r->nq * sizeof(double));
        download(env, r->lse_m[i], r->nq, CLNSA_DTYPE_F32, r->lse[i]);
        if (!r->ob_m[i]) continue;
        r->ob[i] = malloc(r->nq * c->DV * sizeof(double));
        download(env, r->ob_m[i], r->nq * c->DV, c->dt, r->ob[i]);
    }
    r->topk_ran = c->slc && !r->given;
    r->bi = malloc(r->nk * c->S * sizeof *r->bi);
    if (r->topk_ran) download_i32(env, r->bi_m, r->nk * c->S, r->bi);
    else if (r->given) memcpy(r->bi, r->given, r->nk * c->S * sizeof *r->bi);
    ref_compressed(r);
}

ref_nsa_inputs nsa_run_ref_inputs(const nsa_run *r)
{
    ref_nsa_inputs rin = {r->q.h, r->k.h, r->v.h, r->gc.h, r->gs.h, r->gw.h, r->rkc, r->rvc,
                          r->c->slc ? r->bi : NULL, r->counts};
    return rin;
}

void nsa_run_free(nsa_run *r)
{
    free(r->o);
    free(r->bi);
    free(r->rkc);
    free(r->rvc);
    free(r->given);
    free(r->counts);
    for (int i = 0; i < 3; ++i) {
        free(r->lse[i]);
        free(r->ob[i]);
        clReleaseMemObject(r->lse_m[i]);
        if (r->ob_m[i]) clReleaseMemObject(r->ob_m[i]);
    }
    clReleaseMemObject(r->o_m);
    clReleaseMemObject(r->bi_m);
    cl_mem extra[] = {r->ws, r->cu_m, r->idx_m, r->cnt_m};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; ++i)
        if (extra[i]) clReleaseMemObject(extra[i]);
    dbuf *all[] = {&r->q, &r->k, &r->v, &r->gc, &r->gs, &r->gw, &r->kc, &r->vc,
                   &r->wk, &r->wv, &r->bk, &r->bv, &r->pk, &r->pv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) dfree(all[i]);
}

bool nsa_case_selected(const char *name)
{
    const char *only = getenv("CLNSA_TEST_CASE");
    if (!only || !*only) return true;
    const size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == '|') && (p[n] == '\0' || p[n] == '|')) return true;
    return false;
}

static int cmp_desc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* One row's selection against the reference importances imp[0 .. nc-1]. */
static size_t check_selection(const int *row, int S, int nsel, const double *imp, int nc, double rtol)
{
    double *sorted = malloc((size_t)nc * sizeof *sorted);
    memcpy(sorted, imp, (size_t)nc * sizeof *sorted);
    qsort(sorted, (size_t)nc, sizeof *sorted, cmp_desc);
    const double last = nsel > 0 ? sorted[nsel - 1] : INFINITY;
    const double floor_ = isinf(last) ? last : last - rtol * fmax(1.0, fabs(last));
    free(sorted);
    size_t bad = 0;
    int count = 0;
    for (int s = 0; s < S; ++s) {
        const int j = row[s];
        if (j < 0) continue;
        ++count;
        bool dup = false;
        for (int u = 0; u < s; ++u) dup = dup || row[u] == j;
        bad += dup || j >= nc || !(imp[j] >= floor_);
    }
    return bad + (count != nsel);
}

static void check_topk(const nsa_run *r)
{
    const nsa_case *c = r->c;
    const double rtol = c->dt == CLNSA_DTYPE_F32 && !c->tf32 ? 1e-5 : 2e-3;
    double *imp = malloc(((size_t)c->T + 1) * sizeof *imp);
    size_t bad_rows = 0;
    for (int s = 0; s < ref_num_seqs(&r->sh); ++s) {
        const ref_seq sq = ref_get_seq(&r->sh, s);
        for (int t = 0; t < sq.len; ++t)
            for (int h = 0; h < c->H; ++h) {
                const size_t row = ((size_t)sq.b * c->T + sq.start + t) * c->H + h;
                const int nc = ref_block_importance(&r->sh, r->q.h, r->rkc, s, t, h, imp);
                int nsel = c->S;
                if (r->counts) nsel = r->counts[row] < 0 ? 0 : r->counts[row] > c->S ? c->S : r->counts[row];
                if (nsel > nc) nsel = nc;
                bad_rows += check_selection(r->bi + row * c->S, c->S, nsel, imp, nc, rtol) != 0;
            }
    }
    free(imp);
    if (bad_rows) print_error("%s: top-k: %zu rows differ from the reference beyond near-ties\n", c->name, bad_rows);
    assert_int_equal(bad_rows, 0);
}

void nsa_check_forward(const nsa_run *r)
{
    const nsa_case *c = r->c;
    const double tol = nsa_tol(c);
    if (r->topk_ran) check_topk(r);
    ref_nsa_inputs rin = nsa_run_ref_inputs(r);
    double *ro = calloc(r->nq * c->DV, sizeof *ro), *rl[3], *rob[3];
    for (int i = 0; i < 3; ++i) {
        rl[i] = calloc(r->nq, sizeof(double));
        rob[i] = calloc(r->nq * c->DV, sizeof(double));
    }
    ref_nsa_outputs rout = {ro, rob[0], rob[1], rob[2], rl[0], rl[1], rl[2], NULL};
    ref_nsa_fwd(&r->sh, &rin, &rout);
    check_err("o", c->name, rel_l2(r->o, ro, r->nq * c->DV), tol);
    const bool on[3] = {c->cmp, c->slc, c->swa};
    for (int i = 0; i < 3; ++i) {
        if (!on[i]) continue;
        static const char *const lse_name[3] = {"lse_cmp", "lse_slc", "lse_swa"}, *const ob_name[3] = {"o_cmp", "o_slc", "o_swa"};
        if (!r->lse_dropped) check_err(lse_name[i], c->name, rel_l2_lse(r->lse[i], rl[i], r->nq), tol);
        if (r->ob[i]) check_err(ob_name[i], c->name, rel_l2(r->ob[i], rob[i], r->nq * c->DV), tol);
    }
    free(ro);
    for (int i = 0; i < 3; ++i) {
        free(rl[i]);
        free(rob[i]);
    }
}

/* The shapes both the forward and the backward tests run: G in {1, 2, 3, 4,
 * 16, 20}, DK != DV (DV = 40: more dims than a row's 32 lanes), T not a
 * multiple of any block, varlen with sequences
 * shorter than a block (and an empty one), overlapping compression with a
 * larger selection block, block_count above the number of blocks, counts as a
 * tensor, given indices and compressed tensors, linear compression, the
 * paper's setting, f16 and bf16. */
#define F32 CLNSA_DTYPE_F32
static const int cu3[] = {0, 5, 5, 43, 70};

/* name, B, T, HQ, H, DK, DV, cu, N, bs, S, l, d, w, init, local, cmp, slc, swa, given_idx, counts,
 * given_cmp, linear, pe, dtype */
const nsa_case nsa_cases[] = {
    {"all branches G=1", 2, 37, 2, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 5, 1, 2, true, true, true, false, false, false, false, false, F32, false},
    {"G=3 DK!=DV", 1, 45, 6, 2, 24, 40, NULL, 0, 8, 4, 8, 8, 9, 1, 2, true, true, true, false, false, false, false, false, F32, false},
    {"G=2 overlap 8/4 sel 16", 1, 53, 4, 2, 16, 8, NULL, 0, 16, 3, 8, 4, 0, 1, 2, true, true, false, false, false, false, false, false, F32, false},
    {"G=4 block_count > blocks", 1, 21, 8, 2, 8, 16, NULL, 0, 8, 6, 8, 8, 0, 1, 2, true, true, false, false, false, false, false, false, F32, false},
    {"G=16 one kv head", 1, 29, 16, 1, 16, 24, NULL, 0, 8, 3, 8, 8, 4, 1, 1, true, true, true, false, false, false, false, false, F32, false},
    {"G=20 > head tile", 1, 19, 20, 1, 8, 8, NULL, 0, 4, 3, 4, 4, 3, 1, 2, true, true, true, false, false, false, false, false, F32, false},
    {"varlen short seqs", 1, 70, 6, 2, 16, 16, cu3, 4, 8, 3, 8, 8, 6, 1, 2, true, true, true, false, false, false, false, false, F32, false},
    {"varlen overlap topk", 1, 70, 4, 1, 8, 16, cu3, 4, 16, 3, 8, 4, 0, 1, 2, true, true, false, false, false, false, false, false, F32, false},
    {"given indices and counts", 2, 33, 6, 3, 16, 8, NULL, 0, 8, 4, 8, 8, 0, 1, 2, false, true, false, true, true, false, false, false, F32, false},
    {"topk with counts tensor", 1, 41, 4, 2, 8, 8, NULL, 0, 8, 4, 8, 8, 0, 1, 2, true, true, false, false, true, false, false, false, F32, false},
    {"given k_cmp v_cmp", 2, 30, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 0, 1, 2, true, true, false, false, false, true, false, false, F32, false},
    {"varlen given cmp", 1, 70, 2, 1, 8, 8, cu3, 4, 8, 3, 8, 8, 0, 1, 2, true, true, false, false, false, true, false, false, F32, false},
    {"paper setting 32/16/64, 16 blocks, window 512", 1, 700, 2, 1, 16, 16, NULL, 0, 64, 16, 32, 16, 512, 1, 2, true, true, true, false, false, false, false, false, F32, false},
    {"window only", 1, 40, 3, 1, 16, 16, NULL, 0, 8, 3, 8, 8, 7, 1, 2, false, false, true, false, false, false, false, false, F32, false},
    {"f16 all", 1, 37, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 5, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_F16, false},
    {"bf16 all", 1, 37, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 5, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_BF16, false},
    {"bf16 varlen", 1, 70, 6, 2, 16, 8, cu3, 4, 8, 3, 8, 8, 6, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_BF16, false},
    /* head tiles of 16 and DK % 16 == 0: the tensor-core path on NVIDIA sm_80+ */
    {"bf16 G=16 DK=32", 1, 45, 16, 1, 32, 16, NULL, 0, 8, 3, 8, 8, 6, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_BF16, false},
    {"f16 G=16 DK=48 varlen", 1, 70, 32, 2, 48, 16, cu3, 4, 16, 3, 8, 4, 5, 1, 2, true, true, true, false, false, false, false, false, CLNSA_DTYPE_F16, false},
    {"linear compression", 1, 35, 4, 2, 8, 16, NULL, 0, 8, 3, 4, 4, 0, 1, 2, true, true, false, false, false, false, true, true, F32, false},
    {"linear compression varlen, overlap 8/4, no pe", 1, 70, 4, 2, 8, 16, cu3, 4, 8, 3, 8, 4, 0, 1, 2, true, true, false, false, false, false, true, false, F32, false},
    {"linear compression varlen, bf16, no pe", 1, 70, 4, 2, 8, 16, cu3, 4, 8, 3, 4, 4, 0, 1, 2, true, true, false, false, false, false, true, false, CLNSA_DTYPE_BF16, false},
};
const size_t nsa_case_count = sizeof nsa_cases / sizeof nsa_cases[0];

const nsa_case *nsa_case_named(const char *name)
{
    for (size_t i = 0; i < nsa_case_count; ++i)
        if (strcmp(nsa_cases[i].name, name) == 0) return &nsa_cases[i];
    return NULL;
}
