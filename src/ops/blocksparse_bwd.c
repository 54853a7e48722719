/* blocksparse_bwd.c: the block-sparse attention backward. The layout is
 * built at the backward's own tiles, rows and transposed; then the row sums
 * delta, dk/dv per key tile, dq per query tile, and dsinks. On the
 * tensor-core path (f16 / bf16 on a device with it, or emulated) dk/dv and
 * dq are blocksparse_bwd_warp.cl's, on square tiles of 16 tokens per warp.
 * Every kernel is built and given its arguments before the first command is
 * enqueued. */
#include "blocksparse.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *const bwd_files[] = {"common.h", "blocksparse.h", "blocksparse_bwd.cl", NULL};
static const char *const bwd_warp_files[] = {WARP_KERNEL_HEADERS, "blocksparse.h", "blocksparse_warp.h",
                                             "blocksparse_bwd_warp.cl", NULL};

typedef struct {
    bs_problem pb;
    bs_tile_params tp; /* the portable kernels' (delta and dsinks always run them) */
    warp_mode warp;
    bs_tile_params wp; /* the warp kernels' */
    bs_layout lay;
    size_t delta;
    size_t total;
    bool want_dq, want_dkdv, want_dsinks;
} bwd_setup;

static clnsa_status setup(clnsa_context *ctx, const clnsa_blocksparse_config *cfg, const clnsa_blocksparse_inputs *in,
                          const clnsa_blocksparse_grad_inputs *gin, const clnsa_blocksparse_grads *gr, bwd_setup *s)
{
    memset(s, 0, sizeof *s);
    bs_problem *pb = &s->pb;
    clnsa_status st = bs_validate(ctx, cfg, in, pb);
    if (st != CLNSA_SUCCESS) return st;
    if (!gin) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "gin: expected clnsa_blocksparse_grad_inputs, got NULL");
    if (!gr) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "grads: expected clnsa_blocksparse_grads, got NULL");
    const int64_t B = pb->B, Tq = pb->Tq, HQ = pb->HQ;
    if (B * Tq * HQ > INT_MAX)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "q: the backward expects B*Tq*HQ <= 2^31 - 1, got %lld",
                       (long long)(B * Tq * HQ));
    tensor_spec specs[] = {
        {"gin.o", pb->dtype, 4, {B, Tq, HQ, pb->DV}, false},
        {"gin.lse", CLNSA_DTYPE_F32, 3, {B, Tq, HQ, 0}, false},
        {"gin.dout", pb->dtype, 4, {B, Tq, HQ, pb->DV}, false},
    };
    const clnsa_tensor *req[] = {&gin->o, &gin->lse, &gin->dout};
    for (int i = 0; i < 3; ++i)
        if ((st = tensor_check(ctx, req[i], &specs[i])) != CLNSA_SUCCESS) return st;
    if ((st = tensor_check_opt(ctx, &gr->dq, (tensor_spec){"grads.dq", pb->dtype, 4, {B, Tq, HQ, pb->D}, true})) ||
        (st = tensor_check_opt(ctx, &gr->dk, (tensor_spec){"grads.dk", pb->dtype, 4, {B, pb->Tk, pb->H, pb->D}, true})) ||
        (st = tensor_check_opt(ctx, &gr->dv, (tensor_spec){"grads.dv", pb->dtype, 4, {B, pb->Tk, pb->H, pb->DV}, true})) ||
        (st = tensor_check_opt(ctx, &gr->dsinks, (tensor_spec){"grads.dsinks", CLNSA_DTYPE_F32, 1, {HQ}, true})))
        return st;
    if (tensor_present(&gr->dsinks) && !pb->has_sinks)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "grads.dsinks: expected absent without in.sinks, got a buffer");
    s->want_dq = tensor_present(&gr->dq);
    s->want_dkdv = tensor_present(&gr->dk) || tensor_present(&gr->dv);
    s->want_dsinks = tensor_present(&gr->dsinks);
    const clnsa_tensor *all[] = {&gin->o, &gin->lse, &gin->dout, &gr->dq, &gr->dk, &gr->dv, &gr->dsinks};
    pb->idx_long = pb->idx_long || tensors_need_long_index(all, sizeof all / sizeof all[0]);
    tune_problem tp_pb = bs_tune_problem(pb);
    if (tune_blocksparse(ctx, TF_BS_BWD, &tp_pb, &s->tp) != CLNSA_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE,
                       "device: the block-sparse backward needs more local memory than the %llu bytes it has",
                       (unsigned long long)ctx->info.local_mem_size);
    const clnsa_tensor *rows[] = {&in->q, &in->k, &in->v, &gin->dout};
    s->warp = device_warp_path(ctx, pb->dtype, pb->D, pb->DV, rows, sizeof rows / sizeof rows[0]);
    tp_pb.warp_emulated = s->warp == WARP_EMULATED;
    if (s->warp != WARP_OFF && tune_blocksparse(ctx, TF_BS_BWD_WARP, &tp_pb, &s->wp) != CLNSA_SUCCESS) {
        s->warp = WARP_OFF; /* the portable kernels then */
        cx_clear(ctx);
    }
    const bs_tile_params *lt = s->warp != WARP_OFF ? &s->wp : &s->tp;
    size_t cursor = 0;
    if (s->want_dq || s->want_dkdv) {
        st = bs_layout_plan(ctx, pb, lt->bq, lt->bk, true, &cursor, &s->lay);
        if (st != CLNSA_SUCCESS) return st;
    }
    s->delta = bs_take(&cursor, sizeof(float) * (size_t)(B * Tq * HQ));
    s->total = round_up(cursor, 256);
    return CLNSA_SUCCESS;
}

static void bwd_defines(const bwd_setup *s, char *buf, size_t size)
{
    const bs_problem *pb = &s->pb;
    const size_t wg = s->tp.wg;
    const int bq = s->tp.bq, bk = s->tp.bk;
    const size_t n = bs_rule_defines(pb, buf, size);
    snprintf(buf + n, size - n,
             "#define WG %zu\n#define BQ %d\n#define BK %d\n#define DK %d\n#define DV %d\n#define NQD %d\n#define NKD %d\n"
             "#define NVD %d\n",
             wg, bq, bk, pb->D, pb->DV, (int)(((size_t)bq * pb->D + wg - 1) / wg), (int)(((size_t)bk * pb->D + wg - 1) / wg),
             (int)(((size_t)bk * pb->DV + wg - 1) / wg));
}

/* BWD_IN_PARAMS of blocksparse_bwd.cl; `transposed` picks the layout. */
static void in_args(kargs *a, const bwd_setup *s, const clnsa_blocksparse_inputs *in,
                    const clnsa_blocksparse_grad_inputs *gin, cl_mem ws, bool transposed)
{
    const bs_problem *pb = &s->pb;
    const bs_layout *lay = &s->lay;
    const clnsa_blocksparse_config *c = &pb->cfg;
    const clnsa_tensor none = {0};
    ka_tensor(a, &in->q);
    ka_tensor(a, &in->k);
    ka_tensor(a, &in->v);
    ka_tensor(a, &gin->dout);
    ka_tensor(a, &gin->lse);
    ka_mem(a, ws);
    ka_idx(a, (int64_t)(s->delta / sizeof(float)));
    ka_tensor(a, pb->has_pos_q ? &in->q_positions : &none);
    ka_tensor(a, pb->has_pos_k ? &in->kv_positions : &none);
    ka_tensor(a, pb->has_seg ? &in->q_segment_ids : &none);
    ka_tensor(a, pb->has_seg ? &in->kv_segment_ids : &none);
    ka_map(a, pb, &in->block_mask);
    ka_int(a, c->q_block);
    ka_int(a, c->kv_block);
    ka_ws_int(a, ws, transposed ? lay->col_off : lay->row_off);
    ka_ws_int(a, ws, transposed ? lay->col_full : lay->row_full);
    ka_ws_int(a, ws, transposed ? lay->rows : lay->cols);
    ka_int(a, (int)lay->cap);
    ka_int(a, lay->lb > 1 ? lay->lh : 0);
    ka_int(a, lay->lh > 1 ? 1 : 0);
    ka_int(a, lay->NQT);
    ka_int(a, lay->NKT);
    ka_int(a, pb->Tq);
    ka_int(a, pb->Tk);
    ka_int(a, pb->HQ);
    ka_int(a, pb->G);
    ka_float(a, c->scale);
    ka_float(a, c->softcap > 0.0f ? c->softcap : 1.0f);
    ka_int(a, c->window_left);
    ka_int(a, c->window_right);
}

/* bs_bwd_dkdv or bs_bwd_dq as the plan's next launch, with the inputs'
 * arguments (BWD_IN_PARAMS): the warp kernel on the warp path (chunks of 16
 * query rows for dk/dv, whose registers hold K, V and both gradients; 32
 * keys for dq where its tiles have them), else the portable one. */
static clnsa_status plan_tile_kernel(clnsa_context *ctx, bs_plan *plan, const bwd_setup *s, const char *name,
                                     const char *defines, const clnsa_blocksparse_inputs *in,
                                     const clnsa_blocksparse_grad_inputs *gin, cl_mem ws, kargs *a)
{
    const bool dkdv = strcmp(name, "bs_bwd_dkdv") == 0;
    char wdef[1024];
    if (s->warp != WARP_OFF)
        bs_warp_defines(&s->pb, s->warp, s->wp.wg, tune_bs_bwd_warp_kc(s->wp.wg, dkdv), true, wdef, sizeof wdef);
    clnsa_status st = bs_plan_kernel(ctx, plan, s->warp != WARP_OFF ? bwd_warp_files : bwd_files,
                                     s->warp != WARP_OFF ? wdef : defines, name, s->pb.idx_long, a);
    if (st != CLNSA_SUCCESS) return st;
    in_args(a, s, in, gin, ws, dkdv);
    return CLNSA_SUCCESS;
}

static clnsa_status prepare(clnsa_context *ctx, const bwd_setup *s, const clnsa_blocksparse_inputs *in,
                            const clnsa_blocksparse_grad_inputs *gin, const clnsa_blocksparse_grads *gr, cl_mem ws,
                            bs_plan *plan)
{
    const bs_problem *pb = &s->pb;
    const size_t wg = s->tp.wg, aux = tune_blocksparse_aux_wg(&ctx->info);
    const clnsa_tensor none = {0};
    char defines[1024];
    bwd_defines(s, defines, sizeof defines);
    clnsa_status st = CLNSA_SUCCESS;
    kargs a;
    if (s->want_dq || s->want_dkdv) st = bs_layout_prepare(ctx, pb, in, &s->lay, ws, plan);
    if (st != CLNSA_SUCCESS) return st;

    if ((st = bs_plan_kernel(ctx, plan, bwd_files, defines, "bs_bwd_delta", pb->idx_long, &a)) != CLNSA_SUCCESS) return st;
    ka_tensor(&a, &gin->o);
    ka_tensor(&a, &gin->dout);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)(s->delta / sizeof(float)));
    ka_int(&a, pb->Tq);
    ka_int(&a, pb->HQ);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_bwd_delta arguments");
    bs_plan_range(plan, (size_t)pb->Tq * pb->HQ, (size_t)pb->B, 1, aux);

    const size_t twg = s->warp != WARP_OFF ? s->wp.wg : wg; /* the tile kernels' work-group */
    if (s->want_dkdv) {
        if ((st = plan_tile_kernel(ctx, plan, s, "bs_bwd_dkdv", defines, in, gin, ws, &a)) != CLNSA_SUCCESS) return st;
        ka_tensor(&a, tensor_present(&gr->dk) ? &gr->dk : &none);
        ka_tensor(&a, tensor_present(&gr->dv) ? &gr->dv : &none);
        if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_bwd_dkdv arguments");
        bs_plan_range(plan, twg * (size_t)s->lay.NKT, (size_t)pb->H, (size_t)pb->B, twg);
    }
    if (s->want_dq) {
        if ((st = plan_tile_kernel(ctx, plan, s, "bs_bwd_dq", defines, in, gin, ws, &a)) != CLNSA_SUCCESS) return st;
        ka_tensor(&a, &gr->dq);
        if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_bwd_dq arguments");
        bs_plan_range(plan, twg * (size_t)s->lay.NQT, (size_t)pb->HQ, (size_t)pb->B, twg);
    }
    if (s->want_dsinks) {
        if ((st = bs_plan_kernel(ctx, plan, bwd_files, defines, "bs_bwd_dsink", pb->idx_long, &a)) != CLNSA_SUCCESS) return st;
        ka_tensor(&a, &in->sinks);
        ka_tensor(&a, &gin->lse);
        ka_mem(&a, ws);
        ka_idx(&a, (int64_t)(s->delta / sizeof(float)));
        ka_tensor(&a, &gr->dsinks);
        ka_int(&a, pb->B);
        ka_int(&a, pb->Tq);
        ka_int(&a, pb->HQ);
        if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_bwd_dsink arguments");
        bs_plan_range(plan, wg * (size_t)pb->HQ, 1, 1, wg);
    }
    return CLNSA_SUCCESS;
}

clnsa_status clnsa_blocksparse_backward_workspace_size(clnsa_context *ctx, const clnsa_blocksparse_config *config,
                                                       const clnsa_blocksparse_inputs *in,
                                                       const clnsa_blocksparse_grad_inputs *gin,
                                                       const clnsa_blocksparse_grads *grads, size_t *bytes)
{
    CHECK(cx_size_query(ctx, bytes));
    bwd_setup s;
    clnsa_status st = setup(ctx, config, in, gin, grads, &s);
    *bytes = st == CLNSA_SUCCESS ? s.total : 0;
    return st;
}

clnsa_status clnsa_blocksparse_backward(clnsa_context *ctx, cl_command_queue queue, const clnsa_blocksparse_config *config,
                                        const clnsa_blocksparse_inputs *in, const clnsa_blocksparse_grad_inputs *gin,
                                        const clnsa_blocksparse_grads *grads, cl_mem workspace, size_t workspace_bytes,
                                        cl_uint nwait, const cl_event *wait, cl_event *event)
{
    clnsa_status begun = op_begin(ctx, queue, nwait, wait, event);
    if (begun != CLNSA_SUCCESS) return begun;
    bwd_setup s;
    clnsa_status st = setup(ctx, config, in, gin, grads, &s);
    if (st == CLNSA_SUCCESS) st = bs_check_workspace(ctx, workspace, workspace_bytes, s.total);
    if (st != CLNSA_SUCCESS) return st;
    bs_plan plan = {0};
    st = prepare(ctx, &s, in, gin, grads, workspace, &plan);
    return plan_run(ctx, &plan, st, queue, nwait, wait, event);
}
