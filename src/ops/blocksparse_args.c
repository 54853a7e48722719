/* blocksparse_args.c: validation of a block-sparse attention call, the
 * workspace layout of its tile layouts, and the launch plans shared by the
 * forward, the backward and the mask builders. */
#include "blocksparse.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void clnsa_blocksparse_config_init(clnsa_blocksparse_config *c)
{
    if (!c) return;
    c->scale = 0.0f;
    c->softcap = 0.0f;
    c->causal = 0;
    c->window_left = -1;
    c->window_right = -1;
    c->q_block = 64;
    c->kv_block = 64;
}

static clnsa_status check_config(clnsa_context *ctx, const clnsa_blocksparse_config *c)
{
    clnsa_status st = param_check(ctx, "config.scale", c->scale, "1/sqrt(D)");
    if (st == CLNSA_SUCCESS) st = param_check(ctx, "config.softcap", c->softcap, "off");
    if (st != CLNSA_SUCCESS) return st;
    if (c->causal != 0 && c->causal != 1)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "config.causal: expected 0 or 1, got %d", c->causal);
    if (c->window_left < -1 || c->window_right < -1)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "config.window_%s: expected >= 0 or -1 (unbounded), got %d",
                       c->window_left < -1 ? "left" : "right", c->window_left < -1 ? c->window_left : c->window_right);
    if (c->q_block < 1 || c->kv_block < 1 || c->q_block > (1 << 24) || c->kv_block > (1 << 24))
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "config.%s: expected 1..%d, got %d",
                       c->q_block < 1 || c->q_block > (1 << 24) ? "q_block" : "kv_block", 1 << 24,
                       c->q_block < 1 || c->q_block > (1 << 24) ? c->q_block : c->kv_block);
    return CLNSA_SUCCESS;
}

/* The mask as [b, hq, qb, kb] with stride 0 where shared. */
static clnsa_status check_mask(clnsa_context *ctx, const clnsa_tensor *m, bs_problem *pb)
{
    const int r = m->rank;
    if (r < 2 || r > 4)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "block_mask: expected rank 2, 3 or 4 ([B', HQ', NQB, NKB]), got %d", r);
    tensor_spec s = {"block_mask", CLNSA_DTYPE_I32, r, {-1, -1, -1, -1}, false};
    s.shape[r - 2] = pb->NQB;
    s.shape[r - 1] = pb->NKB;
    CHECK(tensor_check(ctx, m, &s));
    int64_t eb = r == 4 ? m->shape[0] : 1, eh = r >= 3 ? m->shape[r - 3] : 1;
    if ((eb != 1 && eb != pb->B) || (eh != 1 && eh != pb->HQ))
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH,
                       "block_mask: expected batch extent 1 or B = %d and head extent 1 or HQ = %d, got %lld and %lld", pb->B,
                       pb->HQ, (long long)eb, (long long)eh);
    int64_t sb = r == 4 ? m->strides[0] : 0, sh = r >= 3 ? m->strides[r - 3] : 0;
    pb->map_b = (eb > 1 && sb != 0) ? pb->B : 1;
    pb->map_h = (eh > 1 && sh != 0) ? pb->HQ : 1;
    pb->map_st[0] = pb->map_b > 1 ? sb : 0;
    pb->map_st[1] = pb->map_h > 1 ? sh : 0;
    pb->map_st[2] = m->strides[r - 2];
    pb->map_st[3] = m->strides[r - 1];
    pb->map_off = m->offset;
    pb->has_map = true;
    return CLNSA_SUCCESS;
}

clnsa_status bs_validate(clnsa_context *ctx, const clnsa_blocksparse_config *cfg, const clnsa_blocksparse_inputs *in,
                         bs_problem *pb)
{
    if (!cfg) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "config: expected a clnsa_blocksparse_config, got NULL");
    if (!in) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "in: expected clnsa_blocksparse_inputs, got NULL");
    memset(pb, 0, sizeof *pb);
    CHECK(check_config(ctx, cfg));
    pb->cfg = *cfg;
    CHECK(tensor_check(ctx, &in->q, &(tensor_spec){"q", CLNSA_DTYPE_INVALID, 4, {-1, -1, -1, -1}, false}));
    const clnsa_tensor *q = &in->q;
    if (q->shape[0] < 1 || q->shape[1] < 1 || q->shape[2] < 1 || q->shape[0] > 65535 || q->shape[1] > (1 << 30) ||
        q->shape[2] > 65535)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH,
                       "q: expected B, Tq, HQ >= 1 (B, HQ <= 65535, Tq <= 2^30), got [%lld, %lld, %lld, %lld]",
                       (long long)q->shape[0], (long long)q->shape[1], (long long)q->shape[2], (long long)q->shape[3]);
    pb->dtype = q->dtype;
    pb->B = (int)q->shape[0];
    pb->Tq = (int)q->shape[1];
    pb->HQ = (int)q->shape[2];
    pb->D = (int)q->shape[3];
    CHECK(head_dim_check(ctx, "q (D)", pb->D));
    CHECK(tensor_check(ctx, &in->k, &(tensor_spec){"k", pb->dtype, 4, {pb->B, -1, -1, pb->D}, false}));
    if (in->k.shape[1] < 1 || in->k.shape[1] > (1 << 30))
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "k: expected Tk in 1..2^30, got %lld", (long long)in->k.shape[1]);
    pb->Tk = (int)in->k.shape[1];
    pb->H = (int)in->k.shape[2];
    if (pb->H < 1 || pb->HQ % pb->H)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "k: expected a KV head count H >= 1 dividing HQ = %d, got H = %d",
                       pb->HQ, pb->H);
    pb->G = pb->HQ / pb->H;
    CHECK(tensor_check(ctx, &in->v, &(tensor_spec){"v", pb->dtype, 4, {pb->B, pb->Tk, pb->H, -1}, false}));
    pb->DV = (int)in->v.shape[3];
    CHECK(head_dim_check(ctx, "v (DV)", pb->DV));
    if (pb->cfg.scale == 0.0f) pb->cfg.scale = 1.0f / sqrtf((float)pb->D);

    const int B = pb->B;
    CHECK(tensor_check_opt(ctx, &in->q_positions, (tensor_spec){"q_positions", CLNSA_DTYPE_I32, 2, {B, pb->Tq}, false}));
    CHECK(tensor_check_opt(ctx, &in->kv_positions, (tensor_spec){"kv_positions", CLNSA_DTYPE_I32, 2, {B, pb->Tk}, false}));
    pb->has_pos_q = tensor_present(&in->q_positions);
    pb->has_pos_k = tensor_present(&in->kv_positions);
    if (tensor_present(&in->q_segment_ids) != tensor_present(&in->kv_segment_ids))
        return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "%s: expected a buffer when %s is given (both or neither), got NULL",
                       tensor_present(&in->q_segment_ids) ? "kv_segment_ids" : "q_segment_ids",
                       tensor_present(&in->q_segment_ids) ? "q_segment_ids" : "kv_segment_ids");
    CHECK(tensor_check_opt(ctx, &in->q_segment_ids, (tensor_spec){"q_segment_ids", CLNSA_DTYPE_I32, 2, {B, pb->Tq}, false}));
    CHECK(tensor_check_opt(ctx, &in->kv_segment_ids, (tensor_spec){"kv_segment_ids", CLNSA_DTYPE_I32, 2, {B, pb->Tk}, false}));
    pb->has_seg = tensor_present(&in->q_segment_ids);
    CHECK(tensor_check_opt(ctx, &in->sinks, (tensor_spec){"sinks", CLNSA_DTYPE_F32, 1, {pb->HQ}, false}));
    pb->has_sinks = tensor_present(&in->sinks);
    pb->NQB = (int)((pb->Tq + (int64_t)cfg->q_block - 1) / cfg->q_block);
    pb->NKB = (int)((pb->Tk + (int64_t)cfg->kv_block - 1) / cfg->kv_block);
    pb->map_b = pb->map_h = 1;
    if (tensor_present(&in->block_mask)) CHECK(check_mask(ctx, &in->block_mask, pb));
    const clnsa_tensor *all[] = {&in->q, &in->k, &in->v, &in->q_positions, &in->kv_positions, &in->q_segment_ids,
                                 &in->kv_segment_ids, &in->sinks, &in->block_mask};
    pb->idx_long = pb->idx_long || tensors_need_long_index(all, sizeof all / sizeof all[0]);
    return CLNSA_SUCCESS;
}

/* ------------------------------------------------------------ layouts */

size_t bs_take(size_t *cursor, size_t bytes)
{
    size_t at = round_up(*cursor, 256);
    *cursor = at + bytes;
    return at;
}

/* Key tiles of query tile [r0, r1) that causal / window can leave visible
 * with default positions: the same tests as bs_classify's EMPTY, solved for
 * the interval of key tiles. */
static int64_t row_bound(const bs_problem *pb, int r0, int r1, int BK, int NKT)
{
    const clnsa_blocksparse_config *c = &pb->cfg;
    const int64_t off = (int64_t)pb->Tk - pb->Tq, qmin = r0 + off, qmax = r1 - 1 + off;
    int64_t lo = INT64_MIN, hi = INT64_MAX; /* need kmax >= lo and kmin <= hi */
    if (c->window_left >= 0) lo = qmin - c->window_left;
    if (c->causal) hi = qmax;
    if (c->window_right >= 0 && qmax + c->window_right < hi) hi = qmax + c->window_right;
    if (lo > pb->Tk - 1 || hi < 0) return 0;
    int64_t kt_lo = lo <= 0 ? 0 : lo / BK, kt_hi = hi / BK;
    if (kt_hi > NKT - 1) kt_hi = NKT - 1;
    return kt_hi >= kt_lo ? kt_hi - kt_lo + 1 : 0;
}

clnsa_status bs_layout_plan(clnsa_context *ctx, const bs_problem *pb, int BQ, int BK, bool transposed, size_t *cursor,
                            bs_layout *lay)
{
    memset(lay, 0, sizeof *lay);
    lay->BQ = BQ;
    lay->BK = BK;
    lay->NQT = (int)((pb->Tq + (int64_t)BQ - 1) / BQ);
    lay->NKT = (int)((pb->Tk + (int64_t)BK - 1) / BK);
    const bool per_row = pb->has_pos_q || pb->has_pos_k || pb->has_seg;
    lay->sb = per_row ? pb->B : 1;
    lay->lb = per_row || pb->map_b > 1 ? pb->B : 1;
    lay->lh = pb->map_h > 1 ? pb->HQ : 1;
    lay->transposed = transposed;
    int64_t per_slice = 0;
    for (int qt = 0; qt < lay->NQT; ++qt) {
        const int r0 = qt * BQ, r1 = r0 + BQ < pb->Tq ? r0 + BQ : pb->Tq;
        per_slice += pb->has_pos_q || pb->has_pos_k ? lay->NKT : row_bound(pb, r0, r1, BK, lay->NKT);
    }
    const int64_t slices = (int64_t)lay->lb * lay->lh;
    lay->cap = per_slice * slices;
    if (lay->cap > INT_MAX - 1 || slices * (lay->NQT + (int64_t)lay->NKT) + 1 > INT_MAX)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT,
                       "q: the tile layout would need %lld entries (%lld layouts of %d x %d tiles), more than int32 indexes",
                       (long long)lay->cap, (long long)slices, lay->NQT, lay->NKT);
    const size_t I = sizeof(cl_int);
    lay->qstats = bs_take(cursor, I * BS_STATS_INTS * (size_t)lay->sb * lay->NQT);
    lay->kstats = bs_take(cursor, I * BS_STATS_INTS * (size_t)lay->sb * lay->NKT);
    lay->row_off = bs_take(cursor, I * ((size_t)slices * lay->NQT + 1));
    lay->row_full = bs_take(cursor, I * (size_t)slices * lay->NQT);
    lay->cols = bs_take(cursor, I * (size_t)(lay->cap > 0 ? lay->cap : 1));
    if (transposed) {
        lay->col_off = bs_take(cursor, I * ((size_t)slices * lay->NKT + 1));
        lay->col_full = bs_take(cursor, I * (size_t)slices * lay->NKT);
        lay->rows = bs_take(cursor, I * (size_t)(lay->cap > 0 ? lay->cap : 1));
    }
    return CLNSA_SUCCESS;
}

void bs_base_defines(const bs_problem *pb, char *buf, size_t size)
{
    int storage = pb->dtype == CLNSA_DTYPE_F32 ? 0 : pb->dtype == CLNSA_DTYPE_F16 ? 1 : 2;
    snprintf(buf, size, "#define STORAGE %d\n#define IDX_LONG %d\n#define VARLEN 0\n", storage, pb->idx_long ? 1 : 0);
}

size_t bs_rule_defines(const bs_problem *pb, char *buf, size_t size)
{
    const clnsa_blocksparse_config *c = &pb->cfg;
    bs_base_defines(pb, buf, size);
    const size_t n = strlen(buf);
    snprintf(buf + n, size - n, "#define CAUSAL %d\n#define WINDOW %d\n#define SOFTCAP %d\n#define SINKS %d\n", c->causal ? 1 : 0,
             c->window_left >= 0 || c->window_right >= 0 ? 1 : 0, c->softcap > 0.0f ? 1 : 0, pb->has_sinks ? 1 : 0);
    return strlen(buf);
}

/* QK_CHAINS 2 (warp_attn.h) in both programs: on the H200 the dense
 * causal forward at 64k 486.7 -> 479.5 ms, dk/dv 936.9 -> 911.5 and dq
 * 444.6 -> 451.2 (the backward program is one build), 2026-11-26. */
size_t bs_warp_defines(const bs_problem *pb, warp_mode warp, size_t wg, int kc, bool bwd, char *buf, size_t size)
{
    int krow, vrow;
    tune_warp_rows(pb->D, pb->DV, pb->dtype == CLNSA_DTYPE_F32 ? 4 : 2, bwd, &krow, &vrow);
    const size_t n = bs_rule_defines(pb, buf, size);
    snprintf(buf + n, size - n,
             "#define NW %zu\n#define KC %d\n#define DK %d\n#define DV %d\n#define KROW %d\n#define VROW %d\n"
             "#define MMA_NV %d\n#define ACC_TRANS 1\n#define QK_CHAINS 2\n",
             wg / 32, kc, pb->D, pb->DV, krow, vrow, warp == WARP_NV ? 1 : 0);
    return strlen(buf);
}

tune_problem bs_tune_problem(const bs_problem *pb)
{
    tune_problem t = {.dk = pb->D, .dv = pb->DV, .g = pb->G, .dtype = pb->dtype};
    return t;
}

clnsa_status bs_check_workspace(clnsa_context *ctx, cl_mem ws, size_t ws_bytes, size_t need)
{
    if (need == 0) return CLNSA_SUCCESS;
    size_t have = 0;
    if (!ws || clGetMemObjectInfo(ws, CL_MEM_SIZE, sizeof have, &have, NULL) != CL_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace: expected a buffer of %zu bytes, got %s", need,
                       ws ? "an invalid cl_mem" : "NULL");
    if (ws_bytes < need || have < need)
        return cx_fail(ctx, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace: expected at least %zu bytes, got %zu (buffer holds %zu)",
                       need, ws_bytes, have);
    return CLNSA_SUCCESS;
}

/* ------------------------------------------------------------ launches */

clnsa_status bs_plan_kernel(clnsa_context *ctx, bs_plan *plan, const char *const *files, const char *defines,
                            const char *name, bool idx_long, kargs *a)
{
    cl_program prog;
    clnsa_status st = program_get(ctx, files, defines, &prog);
    return st == CLNSA_SUCCESS ? plan_add_kernel(ctx, plan, prog, name, (size_t[3]){1, 1, 1}, 1, a, idx_long) : st;
}

void bs_plan_range(bs_plan *plan, size_t g0, size_t g1, size_t g2, size_t l0)
{
    plan_step *l = &plan->steps[plan->nsteps - 1];
    l->global[0] = round_up(g0 ? g0 : 1, l0);
    l->global[1] = g1 ? g1 : 1;
    l->global[2] = g2 ? g2 : 1;
    l->local[0] = l0;
    l->local[1] = 1;
    l->local[2] = 1;
}

void ka_ws_int(kargs *a, cl_mem ws, size_t byte_off)
{
    ka_mem(a, ws);
    ka_idx(a, (int64_t)(byte_off / sizeof(cl_int)));
}

void ka_map(kargs *a, const bs_problem *pb, const clnsa_tensor *mask)
{
    clnsa_tensor m = {0};
    if (pb->has_map) {
        m = *mask;
        m.rank = 4;
        m.offset = pb->map_off;
        for (int i = 0; i < 4; ++i) m.strides[i] = pb->map_st[i];
    }
    ka_tensor(a, &m);
}
