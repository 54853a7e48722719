/* nsa_args.c: validation of an NSA call and the layout of its workspace. */
#include "nsa.h"

#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void clnsa_nsa_config_init(clnsa_nsa_config *c)
{
    if (!c) return;
    c->block_size = 64;
    c->block_count = 16;
    c->cmp_block = 0; /* 0: same as block_size */
    c->cmp_stride = 0;
    c->window = 0;
    c->init_blocks = 1;
    c->local_blocks = 2;
    c->scale = 0.0f;
    c->keep_ds = CLNSA_KEEP_DS_SELECTED | CLNSA_KEEP_DS_COMPRESSED;
}

static clnsa_status check_config(clnsa_context *ctx, const clnsa_nsa_config *c)
{
    struct { const char *name; int v, lo, hi; } r[] = {
        {"config.block_size", c->block_size, 1, 1 << 20},   {"config.block_count", c->block_count, 1, 1024},
        {"config.cmp_block", c->cmp_block, 0, 1 << 20},     {"config.cmp_stride", c->cmp_stride, 0, 1 << 20},
        {"config.window", c->window, 0, 1 << 30},           {"config.init_blocks", c->init_blocks, 0, 1 << 20},
        {"config.local_blocks", c->local_blocks, 0, 1 << 20}, {"config.keep_ds", c->keep_ds, 0, 3},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; ++i)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "%s: expected %d..%d, got %d", r[i].name, r[i].lo,
                           r[i].hi, r[i].v);
    return param_check(ctx, "config.scale", c->scale, "1/sqrt(DK)");
}

static tensor_spec spec(const char *name, clnsa_dtype dt, int rank, int64_t a, int64_t b, int64_t c, int64_t d,
                        bool output)
{
    tensor_spec s = {name, dt, rank, {a, b, c, d}, output};
    return s;
}

static clnsa_status check_linear(clnsa_context *ctx, const clnsa_nsa_inputs *in, const nsa_problem *pb)
{
    const int l = pb->cfg.cmp_block;
    if (tensor_present(&in->k_cmp))
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "w_k: linear compression and given k_cmp/v_cmp exclude each other, got both");
    if (!tensor_present(&in->w_v))
        return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "w_v: expected a buffer when w_k is given (linear compression), got NULL");
    CHECK(tensor_check(ctx, &in->w_k, &(tensor_spec){"w_k", pb->dtype, 2, {(int64_t)l * pb->DK, pb->DK}, false}));
    CHECK(tensor_check(ctx, &in->w_v, &(tensor_spec){"w_v", pb->dtype, 2, {(int64_t)l * pb->DV, pb->DV}, false}));
    CHECK(tensor_check_opt(ctx, &in->b_k, (tensor_spec){"b_k", pb->dtype, 1, {pb->DK}, false}));
    CHECK(tensor_check_opt(ctx, &in->b_v, (tensor_spec){"b_v", pb->dtype, 1, {pb->DV}, false}));
    CHECK(tensor_check_opt(ctx, &in->pe_k, (tensor_spec){"pe_k", pb->dtype, 2, {l, pb->DK}, false}));
    CHECK(tensor_check_opt(ctx, &in->pe_v, (tensor_spec){"pe_v", pb->dtype, 2, {l, pb->DV}, false}));
    return CLNSA_SUCCESS;
}

static clnsa_status check_qkv(clnsa_context *ctx, const clnsa_nsa_inputs *in, nsa_problem *pb)
{
    CHECK(tensor_check(ctx, &in->q, &(tensor_spec){"q", CLNSA_DTYPE_INVALID, 4, {-1, -1, -1, -1}, false}));
    pb->dtype = in->q.dtype;
    pb->B = (int)in->q.shape[0];
    pb->T = (int)in->q.shape[1];
    pb->HQ = (int)in->q.shape[2];
    pb->DK = (int)in->q.shape[3];
    if (in->q.shape[0] < 1 || in->q.shape[1] < 1 || in->q.shape[2] < 1 || in->q.shape[1] > (1 << 30) ||
        in->q.shape[0] > 65535 || in->q.shape[2] > 65535)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "q: expected B, T, HQ >= 1 (B, HQ <= 65535, T <= 2^30), got [%lld, %lld, %lld, %lld]",
                       (long long)in->q.shape[0], (long long)in->q.shape[1], (long long)in->q.shape[2], (long long)in->q.shape[3]);
    CHECK(head_dim_check(ctx, "q (DK)", in->q.shape[3]));
    CHECK(tensor_check(ctx, &in->k, &(tensor_spec){"k", pb->dtype, 4, {pb->B, pb->T, -1, pb->DK}, false}));
    if (in->k.shape[2] < 1 || pb->HQ % in->k.shape[2])
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "k: expected a KV head count H >= 1 dividing HQ = %d, got H = %lld", pb->HQ,
                       (long long)in->k.shape[2]);
    pb->H = (int)in->k.shape[2];
    pb->G = pb->HQ / pb->H;
    CHECK(tensor_check(ctx, &in->v, &(tensor_spec){"v", pb->dtype, 4, {pb->B, pb->T, pb->H, -1}, false}));
    CHECK(head_dim_check(ctx, "v (DV)", in->v.shape[3]));
    pb->DV = (int)in->v.shape[3];
    return CLNSA_SUCCESS;
}

static clnsa_status check_inputs(clnsa_context *ctx, const clnsa_nsa_inputs *in, nsa_problem *pb)
{
    const int B = pb->B, T = pb->T, HQ = pb->HQ, H = pb->H;
    CHECK(tensor_check_opt(ctx, &in->g_cmp, spec("g_cmp", pb->dtype, 3, B, T, HQ, 0, false)));
    CHECK(tensor_check_opt(ctx, &in->g_slc, spec("g_slc", pb->dtype, 3, B, T, HQ, 0, false)));
    CHECK(tensor_check_opt(ctx, &in->g_swa, spec("g_swa", pb->dtype, 3, B, T, HQ, 0, false)));
    pb->has_cmp = tensor_present(&in->g_cmp);
    pb->has_slc = tensor_present(&in->g_slc);
    pb->has_swa = tensor_present(&in->g_swa);
    if (pb->has_swa && pb->cfg.window == 0)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "config.window: expected > 0 when g_swa is given, got 0");

    if (tensor_present(&in->cu_seqlens)) {
        CHECK(tensor_check(ctx, &in->cu_seqlens, &(tensor_spec){"cu_seqlens", CLNSA_DTYPE_I32, 1, {-1}, false}));
        /* N <= 2^30 keeps the row counts below in int (a stride-0 view passes the bounds check at any N) */
        if (in->cu_seqlens.shape[0] < 2 || in->cu_seqlens.shape[0] > (1 << 30) + 1)
            return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "cu_seqlens: expected [N+1] with 1 <= N <= 2^30, got [%lld]",
                           (long long)in->cu_seqlens.shape[0]);
        if (B != 1) return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "q: expected B = 1 with cu_seqlens, got B = %d", B);
        pb->varlen = true;
        pb->N = (int)in->cu_seqlens.shape[0] - 1;
    }
    const int d = pb->cfg.cmp_stride;
    pb->nc_rows = pb->varlen ? (T + d - 1) / d + pb->N : (T + d - 1) / d;

    pb->cmp_given = tensor_present(&in->k_cmp) || tensor_present(&in->v_cmp);
    if (pb->cmp_given) {
        int64_t nc = pb->varlen ? -1 : (T + d - 1) / d;
        CHECK(tensor_check(ctx, &in->k_cmp, &(tensor_spec){"k_cmp", pb->dtype, 4, {B, nc, H, pb->DK}, false}));
        CHECK(tensor_check(ctx, &in->v_cmp, &(tensor_spec){"v_cmp", pb->dtype, 4, {B, in->k_cmp.shape[1], H, pb->DV}, false}));
        pb->nc_rows = (int)in->k_cmp.shape[1];
    }
    pb->linear = tensor_present(&in->w_k);
    if (pb->linear) CHECK(check_linear(ctx, in, pb));
    else if (tensor_present(&in->w_v) || tensor_present(&in->b_k) || tensor_present(&in->pe_k) ||
             tensor_present(&in->b_v) || tensor_present(&in->pe_v))
        return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "w_k: expected a buffer when other linear-compression weights are given, got NULL");

    CHECK(tensor_check_opt(ctx, &in->block_indices, spec("block_indices", CLNSA_DTYPE_I32, 4, B, T, H, pb->S, false)));
    CHECK(tensor_check_opt(ctx, &in->block_counts, spec("block_counts", CLNSA_DTYPE_I32, 3, B, T, H, 0, false)));
    pb->run_topk = pb->has_slc && !tensor_present(&in->block_indices);
    pb->need_cmp = pb->has_cmp || pb->run_topk;
    return CLNSA_SUCCESS;
}

/* The optional ungated branch outputs o_cmp, o_slc, o_swa: checked when
 * present; the backward takes them for all the branches that are on or
 * for none. */
static clnsa_status check_branch_outputs(clnsa_context *ctx, const clnsa_nsa_outputs *out, nsa_problem *pb, bool saved)
{
    const struct { const clnsa_tensor *t; const char *name; bool on; } ob[] = {
        {&out->o_cmp, saved ? "saved.o_cmp" : "o_cmp", pb->has_cmp},
        {&out->o_slc, saved ? "saved.o_slc" : "o_slc", pb->has_slc},
        {&out->o_swa, saved ? "saved.o_swa" : "o_swa", pb->has_swa},
    };
    int given = 0, on = 0, missing = -1, present = -1;
    for (int i = 0; i < 3; ++i) {
        CHECK(tensor_check_opt(ctx, ob[i].t, (tensor_spec){ob[i].name, pb->dtype, 4, {pb->B, pb->T, pb->HQ, pb->DV}, !saved}));
        if (!ob[i].on) continue;
        ++on;
        if (tensor_present(ob[i].t)) {
            ++given;
            if (present < 0) present = i;
        } else if (missing < 0) {
            missing = i;
        }
    }
    if (saved && given > 0 && given < on)
        return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT,
                       "%s: expected a buffer since %s is given (the backward takes the saved outputs of every "
                       "branch that is on, or of none), got NULL",
                       ob[missing].name, ob[present].name);
    pb->saved_branches = saved && on > 0 && given == on;
    return CLNSA_SUCCESS;
}

/* The forward's outputs, or (backward) what the forward saved: then o is not
 * read, and the lse of every branch that is on and the top-k's indices are
 * inputs that must be there. */
static clnsa_status check_outputs(clnsa_context *ctx, const clnsa_nsa_outputs *out, nsa_problem *pb, bool saved)
{
    const int B = pb->B, T = pb->T, HQ = pb->HQ;
    const bool w = !saved;
    if (!saved) CHECK(tensor_check(ctx, &out->o, &(tensor_spec){"o", pb->dtype, 4, {B, T, HQ, pb->DV}, true}));
    const struct { const clnsa_tensor *t; const char *name; bool on; } lse[] = {
        {&out->lse_cmp, saved ? "saved.lse_cmp" : "lse_cmp", pb->has_cmp},
        {&out->lse_slc, saved ? "saved.lse_slc" : "lse_slc", pb->has_slc},
        {&out->lse_swa, saved ? "saved.lse_swa" : "lse_swa", pb->has_swa},
    };
    for (int i = 0; i < 3; ++i) {
        tensor_spec sp = spec(lse[i].name, CLNSA_DTYPE_F32, 3, B, T, HQ, 0, w);
        CHECK(saved && lse[i].on ? tensor_check(ctx, lse[i].t, &sp) : tensor_check_opt(ctx, lse[i].t, sp));
    }
    CHECK(check_branch_outputs(ctx, out, pb, saved));
    if (pb->run_topk)
        CHECK(tensor_check(ctx, &out->block_indices,
                           &(tensor_spec){saved ? "saved.block_indices" : "out.block_indices", CLNSA_DTYPE_I32, 4,
                                          {B, T, pb->H, pb->S}, w}));
    return CLNSA_SUCCESS;
}

/* The warp path of a validated call: the inputs it reads whole must have
 * aligned rows (the outputs may have any layout: OUT_VEC). */
static warp_mode choose_warp(const clnsa_context *ctx, const nsa_problem *pb, const clnsa_nsa_inputs *in)
{
    const clnsa_tensor *rows[] = {&in->q, &in->k, &in->v, &in->k_cmp, &in->v_cmp};
    return device_warp_path(ctx, pb->dtype, pb->DK, pb->DV, rows, sizeof rows / sizeof rows[0]);
}

clnsa_status nsa_validate(clnsa_context *ctx, const clnsa_nsa_config *cfg, const clnsa_nsa_inputs *in,
                          const clnsa_nsa_outputs *out, bool saved, nsa_problem *pb)
{
    if (!ctx) return CLNSA_ERROR_NULL_ARGUMENT;
    if (!cfg) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "config: expected a clnsa_nsa_config, got NULL");
    if (!in) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "in: expected clnsa_nsa_inputs, got NULL");
    if (!out)
        return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, saved ? "saved: expected the forward's clnsa_nsa_outputs, got NULL"
                                                             : "out: expected clnsa_nsa_outputs, got NULL");
    memset(pb, 0, sizeof *pb);
    CHECK(check_config(ctx, cfg));
    pb->cfg = *cfg;
    if (!pb->cfg.cmp_block) pb->cfg.cmp_block = pb->cfg.block_size;
    if (!pb->cfg.cmp_stride) pb->cfg.cmp_stride = pb->cfg.block_size;
    pb->S = pb->cfg.block_count;
    CHECK(check_qkv(ctx, in, pb));
    if (pb->cfg.scale == 0.0f) pb->cfg.scale = 1.0f / sqrtf((float)pb->DK);
    CHECK(check_inputs(ctx, in, pb));
    CHECK(check_outputs(ctx, out, pb, saved));
    const clnsa_tensor *all[] = {&in->q, &in->k, &in->v, &in->g_cmp, &in->g_slc, &in->g_swa, &in->k_cmp,
                                 &in->v_cmp, &in->block_indices, &in->block_counts, &out->o, &out->lse_cmp,
                                 &out->lse_slc, &out->lse_swa, &out->block_indices, &out->o_cmp, &out->o_slc,
                                 &out->o_swa};
    pb->idx_long = tensors_need_long_index(all, sizeof all / sizeof all[0]) ||
                   (uint64_t)pb->nc_rows * pb->B * pb->H * (pb->DK > pb->DV ? pb->DK : pb->DV) * pb->cfg.cmp_block > 0x7fffffffull;
    pb->warp = choose_warp(ctx, pb, in);
    /* Mesa 22.3's llvmpipe computes wrong (infinite) dk / dv in the emulated
     * dk/dv kernel once a key tile has a few hundred query rows, where PoCL,
     * Oclgrind and NVIDIA agree with the reference (docs/RELIABILITY.md). */
    if (saved && pb->warp == WARP_EMULATED && ctx->info.vendor == CLNSA_VENDOR_MESA)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE,
                       "matrix_path: the emulated tensor-core backward is wrong on Mesa's OpenCL "
                       "(docs/RELIABILITY.md); expected CLNSA_MATRIX_AUTO or CLNSA_MATRIX_PORTABLE there, got CLNSA_MATRIX_EMULATED");
    return CLNSA_SUCCESS;
}

/* ----------------------------------------------------------- workspace */

static size_t take(size_t *cursor, size_t bytes)
{
    size_t at = round_up(*cursor, 256);
    *cursor = at + bytes;
    return at;
}

clnsa_status nsa_plan_workspace(clnsa_context *ctx, cl_command_queue queue, const nsa_problem *pb, bool forward,
                                nsa_workspace *ws)
{
    memset(ws, 0, sizeof *ws);
    size_t cur = 0;
    const size_t rows = (size_t)pb->B * pb->nc_rows, es = clnsa_dtype_size(pb->dtype);
    const size_t dmax = (size_t)(pb->DK > pb->DV ? pb->DK : pb->DV), l = (size_t)pb->cfg.cmp_block;
    if (pb->need_cmp && pb->linear) {
        /* CLBlast's scratch must start at offset 0: it takes the buffer alone. */
        size_t tb_k = 0, tb_v = 0;
        cl_command_queue q = queue;
        if (!queue) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "queue: expected the queue of the call (needed for CLBlast's scratch size), got NULL");
        __atomic_store_n(&ctx->blas_used, 1, __ATOMIC_RELAXED);
        CLBlastStatusCode s1 = CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo,
                                                          rows * pb->H, pb->DK, l * pb->DK, 0, l * pb->DK, 0, pb->DK, 0, pb->DK, &q, &tb_k);
        CLBlastStatusCode s2 = CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo,
                                                          rows * pb->H, pb->DV, l * pb->DV, 0, l * pb->DV, 0, pb->DV, 0, pb->DV, &q, &tb_v);
        if (s1 != CLBlastSuccess || s2 != CLBlastSuccess)
            return cx_fail(ctx, CLNSA_ERROR_BLAS, "CLBlastSGemmTempBufferSize failed: %d", (int)(s1 != CLBlastSuccess ? s1 : s2));
        take(&cur, tb_k > tb_v ? tb_k : tb_v);
    }
    if (pb->varlen) ws->cmp_off = take(&cur, sizeof(cl_int) * (size_t)(pb->N + 1));
    if (pb->need_cmp && !pb->cmp_given) {
        ws->kc = take(&cur, rows * pb->H * pb->DK * es);
        ws->vc = take(&cur, rows * pb->H * pb->DV * es);
        if (pb->linear) {
            ws->xg = take(&cur, rows * pb->H * l * dmax * sizeof(float));
            ws->w32 = take(&cur, l * dmax * dmax * sizeof(float));
            ws->y = take(&cur, rows * pb->H * dmax * sizeof(float));
        }
    }
    const size_t tiles = forward ? nsa_cmp_tiles_bytes(ctx, pb) : 0;
    if (tiles) ws->cmp_tiles = take(&cur, tiles);
    ws->total = cur ? round_up(cur, 256) : 0;
    return CLNSA_SUCCESS;
}

void nsa_base_defines(const nsa_problem *pb, char *buf, size_t size)
{
    int storage = pb->dtype == CLNSA_DTYPE_F32 ? 0 : pb->dtype == CLNSA_DTYPE_F16 ? 1 : 2;
    snprintf(buf, size, "#define STORAGE %d\n#define IDX_LONG %d\n#define VARLEN %d\n", storage, pb->idx_long ? 1 : 0,
             pb->varlen ? 1 : 0);
}

void nsa_cmp_views(const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay,
                   clnsa_tensor *kc, clnsa_tensor *vc)
{
    if (pb->cmp_given) {
        *kc = in->k_cmp;
        *vc = in->v_cmp;
        return;
    }
    const size_t es = clnsa_dtype_size(pb->dtype);
    int64_t sk[4] = {pb->B, pb->nc_rows, pb->H, pb->DK}, sv[4] = {pb->B, pb->nc_rows, pb->H, pb->DV};
    *kc = clnsa_tensor_contiguous(ws, pb->dtype, 4, sk);
    *vc = clnsa_tensor_contiguous(ws, pb->dtype, 4, sv);
    kc->offset = lay->kc / es;
    vc->offset = lay->vc / es;
}
