/* nsa_bwd.c: the NSA backward, as one op plan:
 *   1. recompute the compressed K/V (and the sequence/block offsets);
 *   2. prologue: per row dg_b = do.o_b, D_b = g_b dg_b, from the forward's
 *      saved o_b (nsa_bwd_delta.cl) or recomputing them (nsa_fwd.cl, BWD_PRE);
 *   3. selected branch: invert block_indices into per-block query lists
 *      (nsa_select_index.cl), and its dk/dv partial sums, owned by the keys,
 *      into an f32 buffer (nsa_bwd_dkdv.cl); this pass also keeps dS for
 *      dq where the workspace allows (DS_KEEP; on the warp path the
 *      compressed branch's pass too, DSC_KEEP);
 *   4. dq, owned by the query (nsa_bwd_dq.cl);
 *   5. the window's dk/dv partial sums, added to the selected branch's; the
 *      compressed branch's into its own buffer (nsa_bwd_dkdv.cl);
 *   6. finish: the compressed gradient back through mean pooling / linear
 *      compression (CLBlast SGEMMs) / to the caller's dk_cmp, dv_cmp, added
 *      to the partial sums and stored as dk, dv (nsa_compress.cl).
 * No floating-point atomics anywhere, so the result is bitwise reproducible. */
#include "nsa.h"

#include <clblast_c.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *const dq_files[] = {"common.h", "nsa_ranges.h", "nsa_bwd_dq.cl", NULL};
static const char *const dkdv_files[] = {"common.h", "nsa_ranges.h", "nsa_dkdv.h", "nsa_bwd_dkdv.cl", "nsa_dkdv_sum.cl",
                                         NULL};
static const char *const dkdv_warp_files[] = {WARP_KERNEL_HEADERS, "nsa_ranges.h", "nsa_dkdv.h",
                                              "nsa_bwd_dkdv_warp.cl", "nsa_dkdv_sum.cl", NULL};
static const char *const delta_files[] = {"common.h", "nsa_bwd_delta.cl", NULL};

/* The heavy blocks (nsa_dkdv.h): the selected branch's first INIT_BLOCKS
 * blocks of each sequence when top-k ran, their rows split so that there
 * are about 8 groups per compute unit, up to 64 splits. Unsplit, each such
 * tile's group walks every row of the sequence long after the others are
 * done. nh: the heavy key rows per batch row (whole tiles of TKK keys per
 * block). */
typedef struct {
    int nsplit, nh;
} heavy_layout;

static heavy_layout heavy_of(const clnsa_context *ctx, const nsa_problem *pb, int tkk)
{
    heavy_layout hl = {0, 0};
    if (!pb->has_slc || !pb->run_topk || pb->cfg.init_blocks <= 0 || tkk <= 0) return hl;
    const int64_t nhb = (int64_t)pb->cfg.init_blocks * (pb->varlen ? pb->N : 1), nsub = (pb->cfg.block_size + tkk - 1) / tkk;
    const int64_t nh = nhb * nsub * tkk;
    if (nh > INT_MAX) return hl; /* the kernels count rows in int: the main pass takes these blocks unsplit */
    const int64_t groups = nhb * nsub * pb->H * pb->B;
    const int64_t want = ((int64_t)ctx->info.compute_units * 8 + groups - 1) / groups;
    hl.nsplit = (int)(want < 1 ? 1 : want > 64 ? 64 : want);
    hl.nh = (int)nh;
    return hl;
}

/* Where the backward's own scratch lives, after the forward's (bytes). */
typedef struct {
    nsa_workspace fwd;
    size_t blk_off, dlt[3], dk32, dv32, dkc32, dvc32, dx, dw32, cnt, lst_start, lst;
    size_t split_part; /* the compressed dk/dv pass's per-split sums */
    size_t heavy_part; /* the heavy blocks' per-split sums */
    size_t ds, dsc;    /* the selected and compressed branches' dS, with ds_keep, dsc_keep */
    bool ds_keep, dsc_keep;
    heavy_layout heavy;
    int nblk, chunk, nchunk, nsplit;
    size_t total;
} bwd_workspace;

typedef struct {
    const clnsa_nsa_inputs *in;
    const clnsa_nsa_outputs *saved;
    const clnsa_tensor *dout;
    const clnsa_nsa_grads *gr;
    cl_mem ws;
    const bwd_workspace *lay;
    clnsa_tensor kc, vc, bidx, dlt[3];
} bwd_args;

/* ------------------------------------------------------------ validation */

static tensor_spec spec4(const char *name, clnsa_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, bool out)
{
    tensor_spec s = {name, dt, d < 0 ? 3 : 4, {a, b, c, d < 0 ? 0 : d}, out};
    return s;
}

static clnsa_status check_req(clnsa_context *ctx, const clnsa_tensor *t, tensor_spec s, bool required)
{
    return required ? tensor_check(ctx, t, &s) : tensor_check_opt(ctx, t, s);
}

static clnsa_status validate_bwd(clnsa_context *ctx, const clnsa_nsa_config *cfg, const clnsa_nsa_inputs *in,
                                 const clnsa_nsa_outputs *saved, const clnsa_tensor *dout, const clnsa_nsa_grads *gr,
                                 nsa_problem *pb)
{
    CHECK(nsa_validate(ctx, cfg, in, saved, true, pb));
    if (!dout) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "dout: expected a tensor, got NULL");
    if (!gr) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "grads: expected clnsa_nsa_grads, got NULL");
    const int B = pb->B, T = pb->T, HQ = pb->HQ, H = pb->H, DK = pb->DK, DV = pb->DV, l = pb->cfg.cmp_block;
    const clnsa_dtype dt = pb->dtype;
    CHECK(tensor_check(ctx, dout, &(tensor_spec){"dout", dt, 4, {B, T, HQ, DV}, false}));
    CHECK(tensor_check(ctx, &gr->dq, &(tensor_spec){"grads.dq", dt, 4, {B, T, HQ, DK}, true}));
    CHECK(tensor_check(ctx, &gr->dk, &(tensor_spec){"grads.dk", dt, 4, {B, T, H, DK}, true}));
    CHECK(tensor_check(ctx, &gr->dv, &(tensor_spec){"grads.dv", dt, 4, {B, T, H, DV}, true}));
    CHECK(tensor_check_opt(ctx, &gr->dg_cmp, spec4("grads.dg_cmp", dt, B, T, HQ, -1, true)));
    CHECK(tensor_check_opt(ctx, &gr->dg_slc, spec4("grads.dg_slc", dt, B, T, HQ, -1, true)));
    CHECK(tensor_check_opt(ctx, &gr->dg_swa, spec4("grads.dg_swa", dt, B, T, HQ, -1, true)));
    const int64_t nc = pb->nc_rows;
    CHECK(check_req(ctx, &gr->dk_cmp, spec4("grads.dk_cmp", dt, B, nc, H, DK, true), pb->cmp_given));
    CHECK(check_req(ctx, &gr->dv_cmp, spec4("grads.dv_cmp", dt, B, nc, H, DV, true), pb->cmp_given));
    const bool lin = pb->linear && pb->need_cmp;
    CHECK(check_req(ctx, &gr->dw_k, (tensor_spec){"grads.dw_k", dt, 2, {(int64_t)l * DK, DK}, true}, lin));
    CHECK(check_req(ctx, &gr->dw_v, (tensor_spec){"grads.dw_v", dt, 2, {(int64_t)l * DV, DV}, true}, lin));
    CHECK(check_req(ctx, &gr->db_k, (tensor_spec){"grads.db_k", dt, 1, {DK}, true}, lin && tensor_present(&in->b_k)));
    CHECK(check_req(ctx, &gr->db_v, (tensor_spec){"grads.db_v", dt, 1, {DV}, true}, lin && tensor_present(&in->b_v)));
    CHECK(check_req(ctx, &gr->dpe_k, (tensor_spec){"grads.dpe_k", dt, 2, {l, DK}, true}, lin && tensor_present(&in->pe_k)));
    CHECK(check_req(ctx, &gr->dpe_v, (tensor_spec){"grads.dpe_v", dt, 2, {l, DV}, true}, lin && tensor_present(&in->pe_v)));
    const clnsa_tensor *more[] = {dout, &gr->dq, &gr->dk, &gr->dv, &gr->dk_cmp, &gr->dv_cmp};
    pb->idx_long = pb->idx_long || tensors_need_long_index(more, sizeof more / sizeof more[0]);
    if ((uint64_t)B * H * (uint64_t)T * pb->S > 0x7fffffffull) pb->idx_long = true;
    /* the selection's inverse holds token * S + slot in an int, and splits
     * it with 24-bit products (common.h's rem_of) */
    if (pb->has_slc && ((uint64_t)T * pb->S > 0x7fffffffull || T >= (1 << 24)))
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT,
                       "q: the backward's selected branch takes T < 2^24 and T * block_count < 2^31, got T = %d, "
                       "block_count = %d", T, pb->S);
    if (!tensor_rows_aligned(dout)) pb->warp = WARP_OFF; /* the warp dq reads dout's rows whole */
    return CLNSA_SUCCESS;
}

/* ------------------------------------------------------------- workspace */

static size_t take(size_t *cursor, size_t bytes)
{
    size_t at = round_up(*cursor, 256);
    *cursor = at + bytes;
    return at;
}

static clnsa_status gemm_scratch(clnsa_context *ctx, cl_command_queue queue, const nsa_problem *pb, size_t *bytes)
{
    *bytes = 0;
    if (!pb->linear || !pb->need_cmp) return CLNSA_SUCCESS;
    const size_t M = (size_t)pb->B * pb->nc_rows * pb->H, l = (size_t)pb->cfg.cmp_block;
    const int dims[2] = {pb->DK, pb->DV};
    for (int i = 0; i < 2; ++i) {
        size_t D = (size_t)dims[i], a = 0, b = 0;
        cl_command_queue q = queue;
        __atomic_store_n(&ctx->blas_used, 1, __ATOMIC_RELAXED);
        /* dX = dXc . W^T and dW = X^T . dXc */
        CLBlastStatusCode s1 = CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, M,
                                                          l * D, D, 0, D, 0, D, 0, l * D, &q, &a);
        CLBlastStatusCode s2 = CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor, CLBlastTransposeYes, CLBlastTransposeNo,
                                                          l * D, D, M, 0, l * D, 0, D, 0, D, &q, &b);
        if (s1 != CLBlastSuccess || s2 != CLBlastSuccess)
            return cx_fail(ctx, CLNSA_ERROR_BLAS, "CLBlastSGemmTempBufferSize failed: %d", (int)(s1 != CLBlastSuccess ? s1 : s2));
        if (a > *bytes) *bytes = a;
        if (b > *bytes) *bytes = b;
    }
    return CLNSA_SUCCESS;
}

/* The compressed dk/dv pass has one work-group per tile of keys (a few
 * dozen): its rows are split so that there are about 16 groups per
 * compute unit (nominal tiles of 64 keys), up to 64 splits. The groups'
 * rows differ (causal), so finer splits even them out: at 64k on the H200
 * (anchor configuration) dk/dv took 51.2 ms at 4 groups per unit, 45.9-46.2
 * at 8, 45.65-45.73 at 16 and 45.63 at 32 (bench/RESULTS_ROUNDS_2026-11-26.md), each split
 * adding its slices of dk and dv to the workspace (4 MiB a split there). */
static int cmp_splits(const clnsa_context *ctx, const nsa_problem *pb)
{
    if (!pb->has_cmp) return 1;
    const int64_t tiles = ((int64_t)pb->nc_rows + 63) / 64 * pb->H * pb->B;
    const int64_t want = ((int64_t)ctx->info.compute_units * 16 + tiles - 1) / (tiles ? tiles : 1);
    return (int)(want < 1 ? 1 : want > 64 ? 64 : want);
}

/* The dk/dv pass's parameters on this device (the warp path's in *wp, the
 * portable one's in *dp; either may be NULL) and its keys per tile, 0 when
 * no choice fits the device. */
static int dkdv_tile_keys(clnsa_context *ctx, const nsa_problem *pb, warp_params *wp, dkdv_params *dp)
{
    const tune_problem tpb = nsa_tune_problem(pb);
    warp_params w;
    dkdv_params d;
    if (!wp) wp = &w;
    if (!dp) dp = &d;
    if (pb->warp != WARP_OFF) return tune_nsa_warp(ctx, TF_NSA_DKDV_WARP, &tpb, wp) == CLNSA_SUCCESS ? (int)(wp->wg / 2) : 0;
    return tune_nsa_dkdv(ctx, &tpb, dp) == CLNSA_SUCCESS ? dp->tkk : 0;
}

/* The kept dS regions (DS_KEEP, DSC_KEEP) go last, from cur, so that
 * leaving them out leaves the rest where it is: both where the workspace
 * then fits the device's largest allocation, else the selected branch's
 * alone (linear in T, where the compressed one's is quadratic), else the
 * compressed one's alone. The tensor-core dk/dv pass numbers their
 * elements in units of 16 in an int. The portable path keeps the selected
 * branch's only. */
static void place_kept_ds(const clnsa_context *ctx, const nsa_problem *pb, bwd_workspace *w, size_t cur)
{
    const size_t BT = (size_t)pb->B * pb->T, eb = nsa_elem_bytes(pb);
    const size_t slc_elems = BT * pb->HQ * (size_t)pb->S * (size_t)nsa_ds_row(pb);
    const size_t cmp_elems = (size_t)pb->B * pb->HQ * (size_t)nsa_dsc_keys_before(pb, pb->T);
    const bool warp = pb->warp != WARP_OFF;
    const bool slc = pb->has_slc && (pb->cfg.keep_ds & CLNSA_KEEP_DS_SELECTED) && slc_elems / 16 <= 0x7fffffffu;
    const bool cmp = warp && pb->has_cmp && (pb->cfg.keep_ds & CLNSA_KEEP_DS_COMPRESSED) && !pb->varlen &&
                     cmp_elems / 16 <= 0x7fffffffu;
    const size_t slc_bytes = slc_elems * eb, cmp_bytes = cmp_elems * eb;
    const bool tries[3][2] = {{slc, cmp}, {slc, false}, {false, cmp}};
    for (int i = 0; i < 3; ++i) {
        if (!tries[i][0] && !tries[i][1]) continue;
        size_t at = cur;
        const size_t ds = tries[i][0] ? take(&at, slc_bytes) : 0, dsc = tries[i][1] ? take(&at, cmp_bytes) : 0;
        if (round_up(at, 256) > ctx->info.max_mem_alloc_size) continue;
        w->ds_keep = tries[i][0];
        w->dsc_keep = tries[i][1];
        w->ds = ds;
        w->dsc = dsc;
        cur = at;
        break;
    }
    w->total = round_up(cur, 256);
}

static clnsa_status plan_bwd_workspace(clnsa_context *ctx, cl_command_queue queue, const nsa_problem *pb,
                                       bwd_workspace *w)
{
    memset(w, 0, sizeof *w);
    size_t scratch;
    CHECK(gemm_scratch(ctx, queue, pb, &scratch));
    CHECK(nsa_plan_workspace(ctx, queue, pb, false, &w->fwd));
    /* CLBlast's scratch sits at offset 0 (it takes the buffer alone): grow
     * the forward's region there if the backward's GEMMs need more. */
    size_t shift = 0;
    if (scratch > 0) {
        size_t fwd_scratch = w->fwd.cmp_off ? w->fwd.cmp_off : w->fwd.kc;
        if (scratch > fwd_scratch) shift = round_up(scratch - fwd_scratch, 256);
    }
    const bool own_cmp = pb->need_cmp && !pb->cmp_given, lin = own_cmp && pb->linear;
    const struct { size_t *at; bool exists; } regions[] = {
        {&w->fwd.cmp_off, pb->varlen}, {&w->fwd.kc, own_cmp}, {&w->fwd.vc, own_cmp},
        {&w->fwd.xg, lin}, {&w->fwd.w32, lin}, {&w->fwd.y, lin},
    };
    for (size_t i = 0; i < sizeof regions / sizeof regions[0]; ++i)
        if (regions[i].exists) *regions[i].at += shift;
    size_t cur = w->fwd.total + shift;
    const size_t BT = (size_t)pb->B * pb->T, rows = (size_t)pb->B * pb->nc_rows, H = (size_t)pb->H;
    const size_t dmax = (size_t)(pb->DK > pb->DV ? pb->DK : pb->DV), l = (size_t)pb->cfg.cmp_block;
    bool on[3] = {pb->has_cmp, pb->has_slc, pb->has_swa};
    for (int b = 0; b < 3; ++b)
        if (on[b]) w->dlt[b] = take(&cur, BT * pb->HQ * sizeof(float));
    if (pb->has_slc || pb->has_swa) {
        w->dk32 = take(&cur, BT * H * pb->DK * sizeof(float));
        w->dv32 = take(&cur, BT * H * pb->DV * sizeof(float));
    }
    if (pb->need_cmp) {
        w->dkc32 = take(&cur, rows * H * pb->DK * sizeof(float));
        w->dvc32 = take(&cur, rows * H * pb->DV * sizeof(float));
        if (pb->linear) {
            w->dx = take(&cur, rows * H * l * dmax * sizeof(float));
            w->dw32 = take(&cur, l * dmax * dmax * sizeof(float));
        }
    }
    w->nsplit = cmp_splits(ctx, pb);
    if (w->nsplit > 1)
        w->split_part = take(&cur, (size_t)w->nsplit * rows * H * (size_t)(pb->DK + pb->DV) * sizeof(float));
    w->heavy = heavy_of(ctx, pb, dkdv_tile_keys(ctx, pb, NULL, NULL));
    if (w->heavy.nsplit > 0)
        w->heavy_part = take(&cur, (size_t)w->heavy.nsplit * pb->B * w->heavy.nh * H * (size_t)(pb->DK + pb->DV) * sizeof(float));
    if (pb->has_slc) {
        const int bs = pb->cfg.block_size;
        w->nblk = (pb->T + bs - 1) / bs + (pb->varlen ? pb->N : 0);
        /* up to 1024 chunks of at least 16 tokens (nsa_select_index.cl) */
        w->chunk = (pb->T + 1023) / 1024 > 16 ? (pb->T + 1023) / 1024 : 16;
        w->nchunk = (pb->T + w->chunk - 1) / w->chunk;
        if (pb->varlen) w->blk_off = take(&cur, sizeof(cl_int) * (size_t)(pb->N + 1));
        w->cnt = take(&cur, sizeof(cl_int) * (size_t)pb->B * H * w->nchunk * w->nblk);
        w->lst_start = take(&cur, sizeof(cl_int) * (size_t)pb->B * H * (w->nblk + 1));
        w->lst = take(&cur, sizeof(cl_int) * BT * H * pb->S);
    }
    place_kept_ds(ctx, pb, w, cur);
    return CLNSA_SUCCESS;
}

/* ------------------------------------------------------------------ steps */

static clnsa_tensor ws_view3(cl_mem ws, size_t off_bytes, int64_t a, int64_t b, int64_t c)
{
    int64_t s[3] = {a, b, c};
    clnsa_tensor t = clnsa_tensor_contiguous(ws, CLNSA_DTYPE_F32, 3, s);
    t.offset = off_bytes / sizeof(float);
    return t;
}

/* The prologue from the forward's saved branch outputs: nsa_bwd_delta. */
static clnsa_status plan_delta(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x)
{
    char d[512];
    nsa_base_defines(pb, d, sizeof d);
    const bool on[3] = {pb->has_cmp, pb->has_slc, pb->has_swa};
    const clnsa_tensor *saves[3] = {&x->saved->o_cmp, &x->saved->o_slc, &x->saved->o_swa};
    /* rows read 8 dims at a time, 16 lanes a row, where every one of them allows it */
    bool row_vec = tensor_rows_aligned(x->dout);
    for (int b = 0; b < 3; ++b) row_vec = row_vec && (!on[b] || tensor_rows_aligned(saves[b]));
    const size_t lanes = row_vec ? 16 : 32;
    /* work-groups of 256 where the device allows, heads of one token (up to HQ) */
    size_t rw = ctx->info.max_work_group_size >= 256 ? 256 / lanes : 1;
    if (rw > (size_t)pb->HQ) rw = (size_t)pb->HQ;
    const size_t per_wg = lanes * rw, n = strlen(d);
    snprintf(d + n, sizeof d - n,
             "#define DV %d\n#define HAS_CMP %d\n#define HAS_SLC %d\n#define HAS_SWA %d\n#define RW %zu\n#define ROW_VEC %d\n"
             "#define LANES %zu\n",
             pb->DV, pb->has_cmp, pb->has_slc, pb->has_swa, rw, row_vec, lanes);
    cl_program prog;
    CHECK(program_get(ctx, delta_files, d, &prog));
    kargs a;
    CHECK(plan_add_kernel(ctx, p, prog, "nsa_bwd_delta",
                          (size_t[3]){per_wg * (((size_t)pb->HQ + rw - 1) / rw), (size_t)pb->T, (size_t)pb->B}, per_wg, &a,
                          pb->idx_long));
    ka_tensor(&a, x->dout);
    const clnsa_tensor none = {0};
    const clnsa_tensor *gates[3] = {&x->in->g_cmp, &x->in->g_slc, &x->in->g_swa};
    const clnsa_tensor *dg[3] = {&x->gr->dg_cmp, &x->gr->dg_slc, &x->gr->dg_swa};
    for (int b = 0; b < 3; ++b) {
        ka_tensor(&a, on[b] ? saves[b] : &none);
        ka_tensor(&a, on[b] ? gates[b] : &none);
        ka_tensor(&a, &x->dlt[b]);
        ka_tensor(&a, on[b] ? dg[b] : &none);
    }
    ka_int(&a, pb->HQ);
    return plan_args_done(ctx, &a, "nsa_bwd_delta arguments");
}

/* Step 2: D_b and dg_b, from the saved branch outputs or recomputed. */
static clnsa_status plan_prologue(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x)
{
    if (pb->saved_branches) return plan_delta(ctx, p, pb, x);
    kargs a;
    const clnsa_tensor none = {0};
    CHECK(nsa_plan_query_kernel(ctx, p, pb, x->in, nsa_fwd_files, "nsa_fwd", ATTN_BWD_PRE, pb->DV, NULL, true, &x->kc, &x->vc,
                                &x->bidx, x->ws, &x->lay->fwd, &a));
    ka_tensor(&a, x->dout);
    for (int b = 0; b < 3; ++b) ka_tensor(&a, &x->dlt[b]);
    ka_int(&a, pb->T);
    ka_float(&a, pb->cfg.scale);
    ka_tensor(&a, pb->has_cmp ? &x->gr->dg_cmp : &none);
    ka_tensor(&a, pb->has_slc ? &x->gr->dg_slc : &none);
    ka_tensor(&a, pb->has_swa ? &x->gr->dg_swa : &none);
    return plan_args_done(ctx, &a, "nsa_fwd (backward prologue) arguments");
}

/* A kept dS region (DS_KEEP, DSC_KEEP at byte offset `at`), the last
 * arguments of dq and of the dk/dv pass that writes it: the workspace and
 * the region's element offset, 64-bit whatever idx_t is (the selected
 * region passes 2^31 elements from T = 32k at HQ = 64). */
static void ds_args(kargs *a, const nsa_problem *pb, const bwd_args *x, size_t at)
{
    ka_mem(a, x->ws);
    ka_long(a, (int64_t)(at / nsa_elem_bytes(pb)));
}

static clnsa_status plan_dq(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x)
{
    kargs a;
    const clnsa_tensor none = {0};
    CHECK(nsa_plan_query_kernel(ctx, p, pb, x->in, dq_files, "nsa_bwd_dq", ATTN_DQ, pb->DK, &x->gr->dq, true, &x->kc, &x->vc, &x->bidx,
                                x->ws, &x->lay->fwd, &a));
    ka_tensor(&a, x->dout);
    ka_tensor(&a, pb->has_cmp ? &x->saved->lse_cmp : &none);
    ka_tensor(&a, pb->has_slc ? &x->saved->lse_slc : &none);
    ka_tensor(&a, pb->has_swa ? &x->saved->lse_swa : &none);
    for (int b = 0; b < 3; ++b) ka_tensor(&a, &x->dlt[b]);
    ka_tensor(&a, &x->gr->dq);
    ka_int(&a, pb->T);
    ka_float(&a, pb->cfg.scale);
    if (pb->ds_keep) ds_args(&a, pb, x, x->lay->ds);
    if (pb->dsc_keep) ds_args(&a, pb, x, x->lay->dsc);
    return plan_args_done(ctx, &a, "nsa_bwd_dq arguments");
}

static clnsa_status plan_index(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x, const char *defines)
{
    const bwd_workspace *w = x->lay;
    select_index_args a = {
        .bidx = &x->bidx,
        .bcnt = &x->in->block_counts,
        .cu = {pb->varlen ? x->in->cu_seqlens.data : NULL, pb->varlen ? (int64_t)x->in->cu_seqlens.offset : 0},
        .blk_off = {pb->varlen ? x->ws : NULL, (int64_t)(w->blk_off / 4)},
        .nseq = pb->N,
        .cnt = {x->ws, (int64_t)(w->cnt / 4)},
        .lst_start = {x->ws, (int64_t)(w->lst_start / 4)},
        .lst = {x->ws, (int64_t)(w->lst / 4)},
        .B = pb->B,
        .T = pb->T,
        .H = pb->H,
        .nblk = w->nblk,
        .chunk = w->chunk,
        .nchunk = w->nchunk,
        .wg = ctx->info.max_work_group_size < 64 ? ctx->info.max_work_group_size : 64,
        .idx_long = pb->idx_long,
    };
    return nsa_plan_select_index(ctx, p, defines, &a);
}

/* The arguments of a dk/dv kernel after the key tensors: see DKDV_ARGS. */
static void dkdv_args(kargs *a, const nsa_problem *pb, const bwd_args *x, int branch, int nrows_k, size_t dk_at, size_t dv_at)
{
    const bwd_workspace *w = x->lay;
    const clnsa_tensor *gates[3] = {&x->in->g_cmp, &x->in->g_slc, &x->in->g_swa};
    const clnsa_tensor *lses[3] = {&x->saved->lse_cmp, &x->saved->lse_slc, &x->saved->lse_swa};
    ka_tensor(a, &x->in->q);
    ka_tensor(a, branch == 0 ? &x->kc : &x->in->k);
    ka_tensor(a, branch == 0 ? &x->vc : &x->in->v);
    ka_int(a, nrows_k);
    ka_tensor(a, gates[branch]);
    nsa_seq_args(a, pb, x->in, x->ws, branch == 1 ? w->blk_off : w->fwd.cmp_off);
    ka_mem(a, branch == 1 ? x->ws : NULL);
    ka_idx(a, (int64_t)(w->lst / 4));
    ka_mem(a, branch == 1 ? x->ws : NULL);
    ka_idx(a, (int64_t)(w->lst_start / 4));
    ka_int(a, w->nblk);
    ka_tensor(a, x->dout);
    ka_tensor(a, lses[branch]);
    ka_tensor(a, &x->dlt[branch]);
    ka_mem(a, x->ws);
    ka_idx(a, (int64_t)(dk_at / 4));
    ka_mem(a, x->ws);
    ka_idx(a, (int64_t)(dv_at / 4));
    ka_int(a, pb->T);
    ka_float(a, pb->cfg.scale);
}

/* nsa_dkdv_sum(_heavy): each of dk, dv's split slices at part[i], summed
 * into the f32 gradient at dst[i]. */
static clnsa_status plan_split_sums(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                                    const bwd_args *x, bool heavy, int nh, const size_t part[2], const size_t dst[2])
{
    const int dims[2] = {pb->DK, pb->DV};
    const size_t rows = (size_t)(heavy ? nh : pb->nc_rows) * pb->H;
    for (int i = 0; i < 2; ++i) {
        kargs a;
        const size_t n = rows * (size_t)dims[i] * (heavy ? 1 : (size_t)pb->B);
        CHECK(plan_add_kernel(ctx, p, prog, heavy ? "nsa_dkdv_sum_heavy" : "nsa_dkdv_sum",
                              (size_t[3]){n, heavy ? (size_t)pb->B : 1, 1}, 64, &a, pb->idx_long));
        ka_mem(&a, x->ws);
        ka_idx(&a, (int64_t)(part[i] / 4));
        ka_mem(&a, x->ws);
        ka_idx(&a, (int64_t)(dst[i] / 4));
        if (heavy) {
            ka_int(&a, nh);
            ka_int(&a, pb->H);
            ka_int(&a, dims[i]);
            ka_int(&a, pb->T);
            nsa_seq_args(&a, pb, x->in, x->ws, x->lay->blk_off);
            ka_int(&a, x->lay->nblk);
        } else {
            ka_idx(&a, (int64_t)n);
        }
        CHECK(plan_args_done(ctx, &a, heavy ? "nsa_dkdv_sum_heavy arguments" : "nsa_dkdv_sum arguments"));
    }
    return CLNSA_SUCCESS;
}

/* Whether a branch's dk/dv pass writes its dS for dq (DS_KEEP: the
 * selected branch's with ds_keep, the compressed one's with dsc_keep). */
static bool keeps_ds(const nsa_problem *pb, int branch)
{
    return (branch == 1 && pb->ds_keep) || (branch == 0 && pb->dsc_keep);
}

/* One launch of a dk/dv kernel (`files`; `path_defines`: the path's own, wg
 * work-items a group): `groups` tiles of tkk keys, split nsplit ways (pass:
 * 0 main, 1 the heavy blocks), and the sums of the slices when split. */
static clnsa_status plan_dkdv_pass(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x, int branch,
                                   bool accum, const char *const *files, const char *path_defines, size_t wg, size_t groups,
                                   int pass)
{
    const bwd_workspace *w = x->lay;
    const int nsplit = pass ? w->heavy.nsplit : branch == 0 ? w->nsplit : 1;
    const bool heavy = branch == 1 && w->heavy.nsplit > 0;
    const bool keep = keeps_ds(pb, branch);
    char d[3072];
    snprintf(d, sizeof d, "%s#define ACCUM %d\n#define NSPLIT %d\n#define HEAVY %d\n#define HEAVY_PASS %d\n", path_defines,
             accum ? 1 : 0, nsplit, heavy, pass);
    cl_program prog;
    CHECK(program_get(ctx, files, d, &prog));
    kargs a;
    CHECK(plan_add_kernel(ctx, p, prog, "nsa_bwd_dkdv", (size_t[3]){wg * groups * (size_t)nsplit, (size_t)pb->H, (size_t)pb->B},
                          wg, &a, pb->idx_long));
    const int nkeys = pass ? w->heavy.nh : branch == 0 ? pb->nc_rows : pb->T;
    const size_t slice = (size_t)nsplit * pb->B * nkeys * pb->H * 4, base = pass ? w->heavy_part : w->split_part;
    const size_t part[2] = {base, base + slice * (size_t)pb->DK};
    const size_t dst[2] = {branch == 0 ? w->dkc32 : w->dk32, branch == 0 ? w->dvc32 : w->dv32};
    const bool split = pass || nsplit > 1;
    dkdv_args(&a, pb, x, branch, nkeys, split ? part[0] : dst[0], split ? part[1] : dst[1]);
    if (keep) ds_args(&a, pb, x, branch == 1 ? w->ds : w->dsc);
    CHECK(plan_args_done(ctx, &a, "nsa_bwd_dkdv arguments"));
    return split ? plan_split_sums(ctx, p, prog, pb, x, pass, nkeys, part, dst) : CLNSA_SUCCESS;
}

/* dk/dv partial sums of one branch (0 cmp, 1 slc, 2 swa): the main pass,
 * then the heavy blocks' (branch 1). */
static clnsa_status plan_dkdv(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x, int branch,
                              bool accum, const char *defines)
{
    const bwd_workspace *w = x->lay;
    const bool warp = pb->warp != WARP_OFF;
    dkdv_params dp;
    warp_params wp;
    const int tkk = dkdv_tile_keys(ctx, pb, &wp, &dp);
    if (tkk <= 0)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device: the dk/dv pass needs more local memory than the %llu bytes it has",
                       (unsigned long long)ctx->info.local_mem_size);
    const int nsub = (pb->cfg.block_size + tkk - 1) / tkk, nkeys = branch == 0 ? pb->nc_rows : pb->T;
    const size_t groups = branch == 1 ? (size_t)w->nblk * nsub : (size_t)(nkeys + tkk - 1) / tkk;
    char d[2560];
    if (warp) /* a warp per 16 keys */
        snprintf(d, sizeof d, "%s#define NW %zu\n#define TKK %d\n#define KC %d\n#define MMA_NV %d\n#define BRANCH %d\n"
                 "#define DS_KEEP %d\n#define ACC_TRANS 1\n#define KSP %d\n",
                 defines, wp.wg / 32, tkk, wp.kc, pb->warp == WARP_NV, branch,
                 keeps_ds(pb, branch), nsa_ds_row(pb));
    else
        snprintf(d, sizeof d,
                 "%s#define WG %zu\n#define TKK %d\n#define RQ %d\n#define DK_N %zu\n#define DV_N %zu\n#define BRANCH %d\n"
                 "#define DS_KEEP %d\n#define KSP %d\n",
                 defines, dp.wg, tkk, dp.rq, ((size_t)tkk * pb->DK + dp.wg - 1) / dp.wg, ((size_t)tkk * pb->DV + dp.wg - 1) / dp.wg,
                 branch, keeps_ds(pb, branch), nsa_ds_row(pb));
    const char *const *files = warp ? dkdv_warp_files : dkdv_files;
    const size_t wg = warp ? wp.wg : dp.wg;
    CHECK(plan_dkdv_pass(ctx, p, pb, x, branch, accum, files, d, wg, groups, 0));
    const int nhb = w->heavy.nh / (nsub * tkk);
    return branch == 1 && w->heavy.nsplit > 0 ? plan_dkdv_pass(ctx, p, pb, x, branch, accum, files, d, wg, (size_t)nhb * nsub, 1)
                                              : CLNSA_SUCCESS;
}

static void compress_row_args(kargs *a, const nsa_problem *pb, const bwd_args *x)
{
    nsa_seq_args(a, pb, x->in, x->ws, x->lay->fwd.cmp_off);
    ka_int(a, pb->T);
    ka_int(a, pb->cfg.cmp_block);
    ka_int(a, pb->cfg.cmp_stride);
}

static clnsa_status plan_fill_zero(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb, cl_mem ws,
                                   size_t off_bytes, size_t n)
{
    kargs a;
    CHECK(plan_add_kernel(ctx, p, prog, "fill_zero", (size_t[3]){n, 1, 1}, 64, &a, pb->idx_long));
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)(off_bytes / 4));
    ka_int(&a, (int)n);
    return plan_args_done(ctx, &a, "fill_zero arguments");
}

/* No workspace region (an offset of 0 is a real region). */
#define NO_REGION ((size_t)-1)

/* dk (or dv) of the tokens: partial sums + the compressed gradient through
 * its compression (dxc_off: dense f32 source; NO_REGION for none). */
static clnsa_status plan_finish(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb, const bwd_args *x,
                                size_t part_off, size_t dxc_off, bool linear, const clnsa_tensor *dst, int D)
{
    kargs a;
    /* 4 dims a work-item, a token's heads a work-group (nsa_compress.cl) */
    const size_t n = (size_t)D / 4 * pb->H, cap = ctx->info.max_work_group_size < 128 ? ctx->info.max_work_group_size : 128;
    CHECK(plan_add_kernel(ctx, p, prog, "grad_finish", (size_t[3]){n, 1, (size_t)pb->B * pb->T}, n < cap ? n : cap, &a,
                          pb->idx_long));
    ka_mem(&a, part_off != NO_REGION ? x->ws : NULL);
    ka_idx(&a, part_off != NO_REGION ? (int64_t)(part_off / 4) : 0);
    ka_mem(&a, dxc_off != NO_REGION ? x->ws : NULL);
    ka_idx(&a, dxc_off != NO_REGION ? (int64_t)(dxc_off / 4) : 0);
    ka_int(&a, linear ? 1 : 0);
    ka_tensor(&a, dst);
    ka_int(&a, D);
    ka_int(&a, pb->H);
    ka_int(&a, pb->nc_rows);
    nsa_seq_args(&a, pb, x->in, x->ws, x->lay->fwd.cmp_off);
    ka_int(&a, pb->T);
    ka_int(&a, pb->cfg.cmp_block);
    ka_int(&a, pb->cfg.cmp_stride);
    return plan_args_done(ctx, &a, "grad_finish arguments");
}

/* Linear compression of one tensor (k or v): dX = dXc W^T, dW = X^T dXc,
 * db, dpe, then dk from dX. */
static clnsa_status plan_linear_bwd(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                                    const bwd_args *x, bool is_k, size_t part_off)
{
    const bwd_workspace *w = x->lay;
    const clnsa_nsa_inputs *in = x->in;
    const int D = is_k ? pb->DK : pb->DV;
    const size_t M = (size_t)pb->B * pb->nc_rows * pb->H, lD = (size_t)pb->cfg.cmp_block * D;
    const size_t dxc = is_k ? w->dkc32 : w->dvc32;
    CHECK(nsa_plan_linear_inputs(ctx, p, prog, pb, in, x->ws, &w->fwd, is_k ? &in->k : &in->v, is_k ? &in->w_k : &in->w_v,
                                 is_k ? &in->b_k : &in->b_v, is_k ? &in->pe_k : &in->pe_v, w->fwd.y / 4, D));
    CHECK(plan_fill_zero(ctx, p, prog, pb, x->ws, w->dx, M * lD));
    CHECK(plan_add_gemm(ctx, p, x->ws, false, true, M, lD, (size_t)D, dxc / 4, (size_t)D, w->fwd.w32 / 4, (size_t)D, 1.0f,
                        w->dx / 4, lD));
    CHECK(plan_fill_zero(ctx, p, prog, pb, x->ws, w->dw32, lD * D));
    CHECK(plan_add_gemm(ctx, p, x->ws, true, false, lD, (size_t)D, M, w->fwd.xg / 4, lD, dxc / 4, (size_t)D, 1.0f,
                        w->dw32 / 4, (size_t)D));
    kargs a;
    CHECK(plan_add_kernel(ctx, p, prog, "store_2d_from_f32", (size_t[3]){(size_t)D, lD, 1}, D >= 64 ? 64 : 8, &a,
                          pb->idx_long));
    ka_mem(&a, x->ws);
    ka_idx(&a, (int64_t)(w->dw32 / 4));
    ka_tensor(&a, is_k ? &x->gr->dw_k : &x->gr->dw_v);
    ka_int(&a, (int)lD);
    ka_int(&a, D);
    CHECK(plan_args_done(ctx, &a, "store_2d_from_f32 arguments"));
    const clnsa_tensor none = {0};
    const clnsa_tensor *db = is_k ? &x->gr->db_k : &x->gr->db_v, *dpe = is_k ? &x->gr->dpe_k : &x->gr->dpe_v;
    const bool has_b = tensor_present(is_k ? &in->b_k : &in->b_v), has_pe = tensor_present(is_k ? &in->pe_k : &in->pe_v);
    CHECK(plan_add_kernel(ctx, p, prog, "linear_param_grads", (size_t[3]){lD, 1, 1}, 64, &a, pb->idx_long));
    ka_mem(&a, x->ws);
    ka_idx(&a, (int64_t)(dxc / 4));
    ka_mem(&a, x->ws);
    ka_idx(&a, (int64_t)(w->dx / 4));
    ka_tensor(&a, has_b ? db : &none);
    ka_tensor(&a, has_pe ? dpe : &none);
    ka_int(&a, D);
    ka_int(&a, pb->H);
    ka_int(&a, pb->B * pb->nc_rows);
    ka_int(&a, pb->nc_rows);
    compress_row_args(&a, pb, x);
    CHECK(plan_args_done(ctx, &a, "linear_param_grads arguments"));
    return plan_finish(ctx, p, prog, pb, x, part_off, w->dx, true, is_k ? &x->gr->dk : &x->gr->dv, D);
}

static clnsa_status plan_store_cmp_grad(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                                        const bwd_args *x, size_t src, const clnsa_tensor *dst, int D)
{
    kargs a;
    CHECK(plan_add_kernel(ctx, p, prog, "store_view_from_f32",
                          (size_t[3]){(size_t)D, (size_t)pb->H, (size_t)pb->B * pb->nc_rows}, D >= 64 ? 64 : 8, &a,
                          pb->idx_long));
    ka_mem(&a, x->ws);
    ka_idx(&a, (int64_t)(src / 4));
    ka_tensor(&a, dst);
    ka_int(&a, D);
    ka_int(&a, pb->H);
    ka_int(&a, pb->nc_rows);
    return plan_args_done(ctx, &a, "store_view_from_f32 arguments");
}

/* Step 6: the tokens' dk and dv, and the compressed tensors' gradients. */
static clnsa_status plan_finish_all(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x)
{
    const bwd_workspace *w = x->lay;
    cl_program prog;
    CHECK(nsa_compress_program(ctx, pb, &prog));
    const bool part = pb->has_slc || pb->has_swa;
    const size_t part_k = part ? w->dk32 : NO_REGION, part_v = part ? w->dv32 : NO_REGION;
    if (pb->need_cmp && !pb->has_cmp) { /* compressed K/V only fed top-k: no gradient */
        const size_t rows = (size_t)pb->B * pb->nc_rows * pb->H;
        CHECK(plan_fill_zero(ctx, p, prog, pb, x->ws, w->dkc32, rows * pb->DK));
        CHECK(plan_fill_zero(ctx, p, prog, pb, x->ws, w->dvc32, rows * pb->DV));
    }
    if (pb->need_cmp && pb->linear) {
        CHECK(plan_linear_bwd(ctx, p, prog, pb, x, true, part_k));
        return plan_linear_bwd(ctx, p, prog, pb, x, false, part_v);
    }
    if (pb->cmp_given) {
        CHECK(plan_store_cmp_grad(ctx, p, prog, pb, x, w->dkc32, &x->gr->dk_cmp, pb->DK));
        CHECK(plan_store_cmp_grad(ctx, p, prog, pb, x, w->dvc32, &x->gr->dv_cmp, pb->DV));
    }
    const bool pool = pb->has_cmp && !pb->cmp_given;
    CHECK(plan_finish(ctx, p, prog, pb, x, part_k, pool ? w->dkc32 : NO_REGION, false, &x->gr->dk, pb->DK));
    return plan_finish(ctx, p, prog, pb, x, part_v, pool ? w->dvc32 : NO_REGION, false, &x->gr->dv, pb->DV);
}

static clnsa_status plan_backward(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const bwd_args *x)
{
    CHECK(nsa_plan_compress(ctx, p, pb, x->in, x->ws, &x->lay->fwd));
    char defines[2048];
    nsa_branch_defines(pb, x->in, defines, sizeof defines);
    if (pb->has_slc && pb->varlen) {
        cl_program prog;
        CHECK(nsa_compress_program(ctx, pb, &prog));
        CHECK(nsa_plan_offsets(ctx, p, prog, pb, x->in, x->ws, x->lay->blk_off, pb->cfg.block_size));
    }
    CHECK(plan_prologue(ctx, p, pb, x));
    /* the selected and compressed passes before dq, which reads the dS
     * they keep (ds_keep, dsc_keep) */
    if (pb->has_slc) {
        CHECK(plan_index(ctx, p, pb, x, defines));
        CHECK(plan_dkdv(ctx, p, pb, x, 1, false, defines));
    }
    if (pb->has_cmp) CHECK(plan_dkdv(ctx, p, pb, x, 0, false, defines));
    CHECK(plan_dq(ctx, p, pb, x));
    if (pb->has_swa) CHECK(plan_dkdv(ctx, p, pb, x, 2, pb->has_slc, defines));
    return plan_finish_all(ctx, p, pb, x);
}

/* ------------------------------------------------------------------- API */

clnsa_status clnsa_nsa_backward_workspace_size(clnsa_context *ctx, cl_command_queue queue, const clnsa_nsa_config *config,
                                               const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *saved,
                                               const clnsa_tensor *dout, const clnsa_nsa_grads *grads, size_t *bytes)
{
    CHECK(cx_size_query(ctx, bytes));
    nsa_problem pb;
    bwd_workspace lay;
    CHECK(validate_bwd(ctx, config, in, saved, dout, grads, &pb));
    CHECK(plan_bwd_workspace(ctx, queue, &pb, &lay));
    *bytes = lay.total;
    return CLNSA_SUCCESS;
}

clnsa_status clnsa_nsa_backward(clnsa_context *ctx, cl_command_queue queue, const clnsa_nsa_config *config,
                                const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *saved, const clnsa_tensor *dout,
                                const clnsa_nsa_grads *grads, cl_mem workspace, size_t workspace_bytes, cl_uint nwait,
                                const cl_event *wait, cl_event *event)
{
    clnsa_status begun = op_begin(ctx, queue, nwait, wait, event);
    if (begun != CLNSA_SUCCESS) return begun;
    nsa_problem pb;
    bwd_workspace lay;
    CHECK(validate_bwd(ctx, config, in, saved, dout, grads, &pb));
    CHECK(plan_bwd_workspace(ctx, queue, &pb, &lay));
    pb.ds_keep = lay.ds_keep;
    pb.dsc_keep = lay.dsc_keep;
    nsa_workspace total = lay.fwd;
    total.total = lay.total;
    CHECK(nsa_check_workspace(ctx, &total, workspace, workspace_bytes));

    bwd_args x = {in, saved, dout, grads, workspace, &lay, {0}, {0}, {0}, {{0}}};
    if (pb.need_cmp) nsa_cmp_views(&pb, in, workspace, &lay.fwd, &x.kc, &x.vc);
    x.bidx = tensor_present(&in->block_indices) ? in->block_indices : saved->block_indices;
    const bool on[3] = {pb.has_cmp, pb.has_slc, pb.has_swa};
    for (int b = 0; b < 3; ++b)
        if (on[b]) x.dlt[b] = ws_view3(workspace, lay.dlt[b], pb.B, pb.T, pb.HQ);
    op_plan plan = {0};
    clnsa_status st = plan_backward(ctx, &plan, &pb, &x);
    return plan_run(ctx, &plan, st, queue, nwait, wait, event);
}
