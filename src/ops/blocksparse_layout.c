/* blocksparse_layout.c: the kernels that build a tile layout on the device
 * (cl/blocksparse_mask.cl): tile statistics of both sides, then per layout
 * row the counts, their prefix sum and the tile lists; the transposed form
 * (per key tile, the query tiles) the same way, from the same
 * classification. */
#include "blocksparse.h"

#include <stdio.h>
#include <string.h>

const char *const bs_mask_files[] = {"common.h", "blocksparse.h", "blocksparse_mask.cl", NULL};

void bs_mask_defines(const clnsa_context *ctx, bool idx_long, char *buf, size_t size)
{
    snprintf(buf, size, "#define STORAGE 0\n#define IDX_LONG %d\n#define VARLEN 0\n#define SCAN_WG %zu\n",
             idx_long ? 1 : 0, tune_blocksparse_aux_wg(&ctx->info));
}

static clnsa_status stats_kernel(clnsa_context *ctx, const bs_problem *pb, const char *defines, bs_plan *plan,
                                 const clnsa_tensor *pos, const clnsa_tensor *seg, int T, int tile, int def_off, int nt,
                                 int sb, cl_mem ws, size_t at)
{
    kargs a;
    clnsa_status st = bs_plan_kernel(ctx, plan, bs_mask_files, defines, "bs_tile_stats", pb->idx_long, &a);
    if (st != CLNSA_SUCCESS) return st;
    const clnsa_tensor none = {0};
    ka_tensor(&a, pos ? pos : &none);
    ka_tensor(&a, seg ? seg : &none);
    ka_int(&a, T);
    ka_int(&a, tile);
    ka_int(&a, def_off);
    ka_int(&a, nt);
    ka_ws_int(&a, ws, at);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_tile_stats arguments");
    size_t wg = tune_blocksparse_aux_wg(&ctx->info);
    bs_plan_range(plan, (size_t)nt, (size_t)sb, 1, wg);
    return CLNSA_SUCCESS;
}

/* The arguments of BS_LAYOUT_PARAMS. */
static void layout_args(kargs *a, const bs_problem *pb, const clnsa_blocksparse_inputs *in, const bs_layout *lay,
                        cl_mem ws, bool transposed)
{
    const clnsa_blocksparse_config *c = &pb->cfg;
    ka_mem(a, ws);
    ka_idx(a, (int64_t)(lay->qstats / sizeof(cl_int)));
    ka_idx(a, (int64_t)(lay->kstats / sizeof(cl_int)));
    ka_int(a, lay->sb > 1);
    ka_map(a, pb, &in->block_mask);
    ka_int(a, c->q_block);
    ka_int(a, c->kv_block);
    ka_int(a, c->causal);
    ka_int(a, c->window_left);
    ka_int(a, c->window_right);
    ka_int(a, pb->has_seg);
    ka_int(a, pb->Tq);
    ka_int(a, pb->Tk);
    ka_int(a, lay->BQ);
    ka_int(a, lay->BK);
    ka_int(a, lay->NQT);
    ka_int(a, lay->NKT);
    ka_int(a, lay->lh);
    ka_int(a, transposed);
}

static clnsa_status csr_kernels(clnsa_context *ctx, const bs_problem *pb, const clnsa_blocksparse_inputs *in,
                                const bs_layout *lay, const char *defines, cl_mem ws, bool transposed, bs_plan *plan)
{
    const size_t wg = tune_blocksparse_aux_wg(&ctx->info);
    const int nr = transposed ? lay->NKT : lay->NQT, slices = lay->lb * lay->lh;
    const size_t off = transposed ? lay->col_off : lay->row_off, full = transposed ? lay->col_full : lay->row_full;
    const size_t list = transposed ? lay->rows : lay->cols;
    kargs a;
    clnsa_status st = bs_plan_kernel(ctx, plan, bs_mask_files, defines, "bs_layout_count", pb->idx_long, &a);
    if (st != CLNSA_SUCCESS) return st;
    layout_args(&a, pb, in, lay, ws, transposed);
    ka_ws_int(&a, ws, off);
    ka_ws_int(&a, ws, full);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_layout_count arguments");
    bs_plan_range(plan, (size_t)nr, (size_t)slices, 1, wg);

    st = bs_plan_kernel(ctx, plan, bs_mask_files, defines, "bs_scan", pb->idx_long, &a);
    if (st != CLNSA_SUCCESS) return st;
    ka_ws_int(&a, ws, off);
    ka_int(&a, nr * slices);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_scan arguments");
    bs_plan_range(plan, wg, 1, 1, wg);

    st = bs_plan_kernel(ctx, plan, bs_mask_files, defines, "bs_layout_fill", pb->idx_long, &a);
    if (st != CLNSA_SUCCESS) return st;
    layout_args(&a, pb, in, lay, ws, transposed);
    ka_ws_int(&a, ws, off);
    ka_ws_int(&a, ws, list);
    ka_int(&a, (int)lay->cap);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "bs_layout_fill arguments");
    bs_plan_range(plan, (size_t)nr, (size_t)slices, 1, wg);
    return CLNSA_SUCCESS;
}

clnsa_status bs_layout_prepare(clnsa_context *ctx, const bs_problem *pb, const clnsa_blocksparse_inputs *in,
                               const bs_layout *lay, cl_mem ws, bs_plan *plan)
{
    char defines[256];
    bs_mask_defines(ctx, pb->idx_long, defines, sizeof defines);
    const clnsa_tensor *sq = pb->has_seg ? &in->q_segment_ids : NULL, *sk = pb->has_seg ? &in->kv_segment_ids : NULL;
    clnsa_status st = stats_kernel(ctx, pb, defines, plan, pb->has_pos_q ? &in->q_positions : NULL, sq, pb->Tq, lay->BQ,
                                   pb->Tk - pb->Tq, lay->NQT, lay->sb, ws, lay->qstats);
    if (st == CLNSA_SUCCESS)
        st = stats_kernel(ctx, pb, defines, plan, pb->has_pos_k ? &in->kv_positions : NULL, sk, pb->Tk, lay->BK, 0,
                          lay->NKT, lay->sb, ws, lay->kstats);
    if (st == CLNSA_SUCCESS) st = csr_kernels(ctx, pb, in, lay, defines, ws, false, plan);
    if (st == CLNSA_SUCCESS && lay->transposed) st = csr_kernels(ctx, pb, in, lay, defines, ws, true, plan);
    return st;
}
