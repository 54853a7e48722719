/* blocksparse_fwd.c: the block-sparse attention forward: the tile layout is
 * built in the workspace, then one kernel visits each query tile's key
 * tiles: blocksparse_fwd.cl, or on the tensor-core path (f16 / bf16 on a
 * device with it, or emulated) blocksparse_fwd_warp.cl, whose query tiles
 * are 16 rows per warp. Every kernel is built and given its arguments before
 * the first command is enqueued, so a failure enqueues nothing. */
#include "blocksparse.h"

#include <stdio.h>
#include <string.h>

static const char *const fwd_files[] = {"common.h", "attn_tile.h", "blocksparse.h", "blocksparse_fwd.cl", NULL};
static const char *const fwd_warp_files[] = {WARP_KERNEL_HEADERS, "blocksparse.h", "blocksparse_warp.h",
                                             "blocksparse_fwd_warp.cl", NULL};

typedef struct {
    bs_problem pb;
    warp_mode warp;
    bool out_vec; /* the warp kernel stores o's rows whole */
    bs_tile_params tp;
    bs_layout lay;
    size_t total;
} fwd_setup;

/* The tiles: on the warp path when the call takes it and its tiles fit the
 * device (else the portable kernel's). */
static clnsa_status choose_tiles(clnsa_context *ctx, const clnsa_blocksparse_inputs *in, fwd_setup *s)
{
    const bs_problem *pb = &s->pb;
    const clnsa_tensor *rows[] = {&in->q, &in->k, &in->v};
    tune_problem tp_pb = bs_tune_problem(pb);
    s->warp = device_warp_path(ctx, pb->dtype, pb->D, pb->DV, rows, sizeof rows / sizeof rows[0]);
    if (s->warp != WARP_OFF) {
        tp_pb.warp_emulated = s->warp == WARP_EMULATED;
        if (tune_blocksparse(ctx, TF_BS_FWD_WARP, &tp_pb, &s->tp) == CLNSA_SUCCESS) return CLNSA_SUCCESS;
        s->warp = WARP_OFF;
        cx_clear(ctx);
        tp_pb.warp_emulated = false;
    }
    return tune_blocksparse(ctx, TF_BS_FWD, &tp_pb, &s->tp);
}

static clnsa_status setup(clnsa_context *ctx, const clnsa_blocksparse_config *cfg, const clnsa_blocksparse_inputs *in,
                          const clnsa_blocksparse_outputs *out, fwd_setup *s)
{
    bs_problem *pb = &s->pb;
    clnsa_status st = bs_validate(ctx, cfg, in, pb);
    if (st != CLNSA_SUCCESS) return st;
    if (!out) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "out: expected clnsa_blocksparse_outputs, got NULL");
    st = tensor_check(ctx, &out->o, &(tensor_spec){"o", pb->dtype, 4, {pb->B, pb->Tq, pb->HQ, pb->DV}, true});
    if (st == CLNSA_SUCCESS && tensor_present(&out->lse))
        st = tensor_check(ctx, &out->lse, &(tensor_spec){"lse", CLNSA_DTYPE_F32, 3, {pb->B, pb->Tq, pb->HQ}, true});
    if (st != CLNSA_SUCCESS) return st;
    const clnsa_tensor *outs[] = {&out->o, &out->lse};
    pb->idx_long = pb->idx_long || tensors_need_long_index(outs, 2);
    s->out_vec = tensor_rows_aligned(&out->o);
    if (choose_tiles(ctx, in, s) != CLNSA_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE,
                       "device: the block-sparse forward needs more local memory than the %llu bytes it has",
                       (unsigned long long)ctx->info.local_mem_size);
    size_t cursor = 0;
    st = bs_layout_plan(ctx, pb, s->tp.bq, s->tp.bk, false, &cursor, &s->lay);
    s->total = round_up(cursor, 256);
    return st;
}

static clnsa_status prepare_attn(clnsa_context *ctx, const fwd_setup *s, const clnsa_blocksparse_inputs *in,
                                  const clnsa_blocksparse_outputs *out, cl_mem ws, bs_plan *plan)
{
    const bs_problem *pb = &s->pb;
    const bs_layout *lay = &s->lay;
    const size_t wg = s->tp.wg;
    char defines[1024];
    if (s->warp != WARP_OFF) {
        const size_t n = bs_warp_defines(pb, s->warp, wg, lay->BK, false, defines, sizeof defines);
        snprintf(defines + n, sizeof defines - n, "#define OUT_VEC %d\n", s->out_vec ? 1 : 0);
    } else {
        const size_t n = bs_rule_defines(pb, defines, sizeof defines);
        const int acc_n = (int)(((size_t)lay->BQ * pb->DV + wg - 1) / wg);
        snprintf(defines + n, sizeof defines - n,
                 "#define WG %zu\n#define GT %d\n#define TK %d\n#define DK %d\n#define DV %d\n#define ACC_N %d\n", wg,
                 lay->BQ, lay->BK, pb->D, pb->DV, acc_n);
    }
    kargs a;
    clnsa_status st = bs_plan_kernel(ctx, plan, s->warp != WARP_OFF ? fwd_warp_files : fwd_files, defines, "bs_fwd",
                                     pb->idx_long, &a);
    if (st != CLNSA_SUCCESS) return st;
    const clnsa_tensor none = {0};
    const clnsa_blocksparse_config *c = &pb->cfg;
    ka_tensor(&a, &in->q);
    ka_tensor(&a, &in->k);
    ka_tensor(&a, &in->v);
    ka_tensor(&a, pb->has_pos_q ? &in->q_positions : &none);
    ka_tensor(&a, pb->has_pos_k ? &in->kv_positions : &none);
    ka_tensor(&a, pb->has_seg ? &in->q_segment_ids : &none);
    ka_tensor(&a, pb->has_seg ? &in->kv_segment_ids : &none);
    ka_tensor(&a, pb->has_sinks ? &in->sinks : &none);
    ka_map(&a, pb, &in->block_mask);
    ka_int(&a, c->q_block);
    ka_int(&a, c->kv_block);
    ka_ws_int(&a, ws, lay->row_off);
    ka_ws_int(&a, ws, lay->row_full);
    ka_ws_int(&a, ws, lay->cols);
    ka_int(&a, (int)lay->cap);
    ka_int(&a, lay->lb > 1 ? lay->lh : 0);
    ka_int(&a, lay->lh > 1 ? 1 : 0);
    ka_int(&a, lay->NQT);
    ka_int(&a, lay->NKT);
    ka_tensor(&a, &out->o);
    ka_tensor(&a, tensor_present(&out->lse) ? &out->lse : &none);
    ka_int(&a, pb->Tq);
    ka_int(&a, pb->Tk);
    ka_int(&a, pb->G);
    ka_float(&a, c->scale);
    ka_float(&a, c->softcap > 0.0f ? c->softcap : 1.0f);
    ka_int(&a, c->window_left);
    ka_int(&a, c->window_right);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_fwd arguments");
    bs_plan_range(plan, wg * (size_t)lay->NQT, (size_t)pb->HQ, (size_t)pb->B, wg);
    return CLNSA_SUCCESS;
}

clnsa_status clnsa_blocksparse_forward_workspace_size(clnsa_context *ctx, const clnsa_blocksparse_config *config,
                                                      const clnsa_blocksparse_inputs *in,
                                                      const clnsa_blocksparse_outputs *out, size_t *bytes)
{
    CHECK(cx_size_query(ctx, bytes));
    fwd_setup s;
    clnsa_status st = setup(ctx, config, in, out, &s);
    *bytes = st == CLNSA_SUCCESS ? s.total : 0;
    return st;
}

clnsa_status clnsa_blocksparse_forward(clnsa_context *ctx, cl_command_queue queue, const clnsa_blocksparse_config *config,
                                       const clnsa_blocksparse_inputs *in, const clnsa_blocksparse_outputs *out,
                                       cl_mem workspace, size_t workspace_bytes, cl_uint nwait, const cl_event *wait,
                                       cl_event *event)
{
    clnsa_status begun = op_begin(ctx, queue, nwait, wait, event);
    if (begun != CLNSA_SUCCESS) return begun;
    fwd_setup s;
    clnsa_status st = setup(ctx, config, in, out, &s);
    if (st == CLNSA_SUCCESS) st = bs_check_workspace(ctx, workspace, workspace_bytes, s.total);
    if (st != CLNSA_SUCCESS) return st;

    bs_plan plan = {0};
    st = bs_layout_prepare(ctx, &s.pb, in, &s.lay, workspace, &plan);
    if (st == CLNSA_SUCCESS) st = prepare_attn(ctx, &s, in, out, workspace, &plan);
    return plan_run(ctx, &plan, st, queue, nwait, wait, event);
}
