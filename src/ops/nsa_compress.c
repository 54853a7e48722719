/* nsa_compress.c: the sequence offsets and compressed keys/values of NSA's
 * compressed branch, as steps of an op plan: mean pooling, or linear
 * compression (gather, then one CLBlast SGEMM per tensor with the bias
 * preset in C). The backward recomputes them with the same steps. */
#include "nsa.h"

static const char *const compress_files[] = {"common.h", "nsa_compress.cl", NULL};

clnsa_status nsa_compress_program(clnsa_context *ctx, const nsa_problem *pb, cl_program *prog)
{
    char defines[256];
    nsa_base_defines(pb, defines, sizeof defines);
    return program_get(ctx, compress_files, defines, prog);
}

void nsa_seq_args(kargs *a, const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws, size_t off_bytes)
{
    ka_mem(a, pb->varlen ? in->cu_seqlens.data : NULL);
    ka_idx(a, pb->varlen ? (int64_t)in->cu_seqlens.offset : 0);
    ka_int(a, pb->N);
    ka_mem(a, pb->varlen ? ws : NULL);
    ka_idx(a, (int64_t)(off_bytes / sizeof(cl_int)));
}

/* The arguments every row-mapping kernel of nsa_compress.cl ends with. */
static void row_args(kargs *a, const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay)
{
    nsa_seq_args(a, pb, in, ws, lay->cmp_off);
    ka_int(a, pb->T);
    ka_int(a, pb->cfg.cmp_block);
    ka_int(a, pb->cfg.cmp_stride);
}

clnsa_status nsa_plan_offsets(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                              const clnsa_nsa_inputs *in, cl_mem ws, size_t off_bytes, int stride)
{
    kargs a;
    const size_t g[3] = {1, 1, 1};
    clnsa_status st = plan_add_kernel(ctx, p, prog, "seq_offsets", g, 1, &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    ka_mem(&a, in->cu_seqlens.data);
    ka_idx(&a, (int64_t)in->cu_seqlens.offset);
    ka_int(&a, pb->N);
    ka_int(&a, pb->T);
    ka_int(&a, stride);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)(off_bytes / sizeof(cl_int)));
    return plan_args_done(ctx, &a, "seq_offsets arguments");
}

static size_t local_for(size_t n) { return n >= 64 ? 64 : 1; }

static clnsa_status plan_mean(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                              const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay, const clnsa_tensor *kc,
                              const clnsa_tensor *vc)
{
    const size_t rows = (size_t)pb->B * pb->nc_rows;
    const size_t g[3] = {(size_t)(pb->DK > pb->DV ? pb->DK : pb->DV), (size_t)pb->H, 2 * rows};
    kargs a;
    clnsa_status st = plan_add_kernel(ctx, p, prog, "mean_pool", g, local_for(g[0]), &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    ka_tensor(&a, &in->k);
    ka_tensor(&a, &in->v);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)kc->offset);
    ka_idx(&a, (int64_t)vc->offset);
    ka_int(&a, pb->DK);
    ka_int(&a, pb->DV);
    ka_int(&a, pb->H);
    ka_int(&a, (int)rows);
    ka_int(&a, pb->nc_rows);
    row_args(&a, pb, in, ws, lay);
    return plan_args_done(ctx, &a, "mean_pool arguments");
}

clnsa_status nsa_plan_linear_inputs(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                                    const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay,
                                    const clnsa_tensor *x, const clnsa_tensor *w, const clnsa_tensor *bias,
                                    const clnsa_tensor *pe, size_t c_off, int D)
{
    const size_t rows = (size_t)pb->B * pb->nc_rows, crows = rows * pb->H, l = (size_t)pb->cfg.cmp_block;
    const size_t n_prep = l * D * D > crows * D ? l * D * D : crows * D;
    kargs a;
    clnsa_status st = plan_add_kernel(ctx, p, prog, "linear_prepare", (size_t[3]){n_prep, 1, 1}, 64, &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    ka_tensor(&a, w);
    ka_tensor(&a, bias);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)(lay->w32 / sizeof(float)));
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)c_off);
    ka_int(&a, (int)(l * D));
    ka_int(&a, D);
    ka_int(&a, (int)crows);
    if ((st = plan_args_done(ctx, &a, "linear_prepare arguments")) != CLNSA_SUCCESS) return st;

    const size_t g[3] = {l * D, (size_t)pb->H, rows};
    if ((st = plan_add_kernel(ctx, p, prog, "linear_gather", g, local_for(g[0]), &a, pb->idx_long)) != CLNSA_SUCCESS)
        return st;
    ka_tensor(&a, x);
    ka_tensor(&a, pe);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)(lay->xg / sizeof(float)));
    ka_int(&a, D);
    ka_int(&a, pb->H);
    ka_int(&a, (int)rows);
    ka_int(&a, pb->nc_rows);
    row_args(&a, pb, in, ws, lay);
    return plan_args_done(ctx, &a, "linear_gather arguments");
}

static clnsa_status plan_linear(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                                const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay, const clnsa_tensor *x,
                                const clnsa_tensor *w, const clnsa_tensor *bias, const clnsa_tensor *pe,
                                const clnsa_tensor *dst, int D)
{
    const size_t crows = (size_t)pb->B * pb->nc_rows * pb->H, l = (size_t)pb->cfg.cmp_block;
    const bool f32 = pb->dtype == CLNSA_DTYPE_F32;
    /* f32 storage: SGEMM writes straight into the compressed tensor */
    const size_t c_off = f32 ? dst->offset : lay->y / sizeof(float);
    clnsa_status st = nsa_plan_linear_inputs(ctx, p, prog, pb, in, ws, lay, x, w, bias, pe, c_off, D);
    if (st == CLNSA_SUCCESS)
        st = plan_add_gemm(ctx, p, ws, false, false, crows, (size_t)D, l * D, lay->xg / sizeof(float), l * D,
                           lay->w32 / sizeof(float), (size_t)D, 1.0f, c_off, (size_t)D);
    if (st != CLNSA_SUCCESS || f32) return st;
    kargs a;
    if ((st = plan_add_kernel(ctx, p, prog, "store_from_f32", (size_t[3]){crows * D, 1, 1}, 64, &a, pb->idx_long)) !=
        CLNSA_SUCCESS)
        return st;
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)c_off);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)dst->offset);
    ka_int(&a, (int)(crows * D));
    return plan_args_done(ctx, &a, "store_from_f32 arguments");
}

clnsa_status nsa_plan_compress(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                               cl_mem ws, const nsa_workspace *lay)
{
    if (!pb->varlen && (!pb->need_cmp || pb->cmp_given)) return CLNSA_SUCCESS;
    cl_program prog;
    clnsa_status st = nsa_compress_program(ctx, pb, &prog);
    if (st == CLNSA_SUCCESS && pb->varlen)
        st = nsa_plan_offsets(ctx, p, prog, pb, in, ws, lay->cmp_off, pb->cfg.cmp_stride);
    if (st != CLNSA_SUCCESS || !pb->need_cmp || pb->cmp_given) return st;
    clnsa_tensor kc, vc;
    nsa_cmp_views(pb, in, ws, lay, &kc, &vc);
    if (pb->linear) {
        st = plan_linear(ctx, p, prog, pb, in, ws, lay, &in->k, &in->w_k, &in->b_k, &in->pe_k, &kc, pb->DK);
        if (st == CLNSA_SUCCESS)
            st = plan_linear(ctx, p, prog, pb, in, ws, lay, &in->v, &in->w_v, &in->b_v, &in->pe_v, &vc, pb->DV);
        return st;
    }
    return plan_mean(ctx, p, prog, pb, in, ws, lay, &kc, &vc);
}
