/* nsa_fwd.c: the NSA forward: compression, online top-k, then one fused
 * kernel for the three branches. Every kernel is built and given its
 * arguments before the first command is enqueued, so a failure enqueues
 * nothing. */
#include "nsa.h"

#include <stdio.h>
#include <string.h>

static const char *const topk_files[] = {"common.h", "nsa_topk.cl", NULL};
static const char *const fwd_files[] = {"common.h", "attn_tile.h", "nsa_fwd.cl", NULL};

typedef struct {
    cl_kernel kernel;
    size_t global[3], local[3];
} launch;

static void seq_args(kargs *a, const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay)
{
    ka_mem(a, pb->varlen ? in->cu_seqlens.data : NULL);
    ka_idx(a, pb->varlen ? (int64_t)in->cu_seqlens.offset : 0);
    ka_int(a, pb->N);
    ka_mem(a, pb->varlen ? ws : NULL);
    ka_idx(a, (int64_t)(lay->cmp_off / sizeof(cl_int)));
}

static clnsa_status make_kernel(clnsa_context *ctx, const char *const *files, const char *defines, const char *name,
                                launch *l, kargs *a, bool idx_long)
{
    cl_program prog;
    clnsa_status st = program_get(ctx, files, defines, &prog);
    if (st == CLNSA_SUCCESS) st = kernel_create(ctx, prog, name, &l->kernel);
    a->kernel = l->kernel;
    a->next = 0;
    a->err = CL_SUCCESS;
    a->idx_long = idx_long;
    return st;
}

static clnsa_status prepare_topk(clnsa_context *ctx, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                                 const clnsa_nsa_outputs *out, const clnsa_tensor *kc, cl_mem ws,
                                 const nsa_workspace *lay, launch *l)
{
    topk_params tp;
    const clnsa_nsa_config *c = &pb->cfg;
    if (tune_nsa_topk(&ctx->info, pb->G, pb->DK, pb->S, c->block_size, c->cmp_block, c->cmp_stride, &tp) != CLNSA_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device: top-k needs more local memory than the %llu bytes it has",
                       (unsigned long long)ctx->info.local_mem_size);
    char defines[1024];
    size_t n = 0;
    nsa_base_defines(pb, defines, sizeof defines);
    n = strlen(defines);
    snprintf(defines + n, sizeof defines - n,
             "#define WG %zu\n#define G %d\n#define GT %d\n#define DK %d\n#define TK %d\n#define BS %d\n#define S %d\n"
             "#define CMP_L %d\n#define CMP_D %d\n#define INIT_BLOCKS %d\n#define LOCAL_BLOCKS %d\n#define JB %d\n"
             "#define PC_MAX %lld\n#define HAS_COUNTS %d\n",
             tp.wg, pb->G, tp.gt, pb->DK, tp.tk, c->block_size, pb->S, c->cmp_block, c->cmp_stride, c->init_blocks,
             c->local_blocks, tp.jb, (long long)tp.pc_max, tensor_present(&in->block_counts) ? 1 : 0);
    kargs a;
    clnsa_status st = make_kernel(ctx, topk_files, defines, "nsa_topk", l, &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    ka_tensor(&a, &in->q);
    ka_tensor(&a, kc);
    ka_int(&a, pb->nc_rows);
    seq_args(&a, pb, in, ws, lay);
    ka_tensor(&a, &in->block_counts);
    ka_tensor(&a, &out->block_indices);
    ka_int(&a, pb->T);
    ka_float(&a, c->scale);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "nsa_topk arguments");
    size_t g[3] = {tp.wg * (size_t)pb->T, (size_t)pb->H, (size_t)pb->B}, lo[3] = {tp.wg, 1, 1};
    memcpy(l->global, g, sizeof g);
    memcpy(l->local, lo, sizeof lo);
    return CLNSA_SUCCESS;
}

static clnsa_status prepare_attn(clnsa_context *ctx, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                                 const clnsa_nsa_outputs *out, const clnsa_tensor *kc, const clnsa_tensor *vc,
                                 cl_mem ws, const nsa_workspace *lay, launch *l)
{
    attn_params ap;
    if (tune_nsa_attn(&ctx->info, pb->G, pb->DK, pb->DV, &ap) != CLNSA_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device: the NSA forward needs more local memory than the %llu bytes it has",
                       (unsigned long long)ctx->info.local_mem_size);
    const clnsa_nsa_config *c = &pb->cfg;
    const int ngt = (pb->G + ap.gt - 1) / ap.gt;
    const int acc_n = (int)((ap.gt * pb->DV + ap.wg - 1) / ap.wg);
    char defines[1024];
    nsa_base_defines(pb, defines, sizeof defines);
    size_t n = strlen(defines);
    snprintf(defines + n, sizeof defines - n,
             "#define WG %zu\n#define G %d\n#define GT %d\n#define NGT %d\n#define DK %d\n#define DV %d\n#define TK %d\n"
             "#define ACC_N %d\n#define HAS_CMP %d\n#define HAS_SLC %d\n#define HAS_SWA %d\n#define HAS_COUNTS %d\n"
             "#define BS %d\n#define S %d\n#define CMP_L %d\n#define CMP_D %d\n#define WINDOW %d\n",
             ap.wg, pb->G, ap.gt, ngt, pb->DK, pb->DV, ap.tk, acc_n, pb->has_cmp, pb->has_slc, pb->has_swa,
             tensor_present(&in->block_counts) ? 1 : 0, c->block_size, pb->S, c->cmp_block, c->cmp_stride,
             c->window > 0 ? c->window : 1);
    kargs a;
    clnsa_status st = make_kernel(ctx, fwd_files, defines, "nsa_fwd", l, &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    const clnsa_tensor *bidx = tensor_present(&in->block_indices) ? &in->block_indices : &out->block_indices;
    const clnsa_tensor none = {0};
    ka_tensor(&a, &in->q);
    ka_tensor(&a, &in->k);
    ka_tensor(&a, &in->v);
    ka_tensor(&a, pb->has_cmp ? kc : &none);
    ka_tensor(&a, pb->has_cmp ? vc : &none);
    ka_int(&a, pb->nc_rows);
    ka_tensor(&a, &in->g_cmp);
    ka_tensor(&a, &in->g_slc);
    ka_tensor(&a, &in->g_swa);
    seq_args(&a, pb, in, ws, lay);
    ka_tensor(&a, pb->has_slc ? bidx : &none);
    ka_tensor(&a, &in->block_counts);
    ka_tensor(&a, &out->o);
    ka_tensor(&a, pb->has_cmp ? &out->lse_cmp : &none);
    ka_tensor(&a, pb->has_slc ? &out->lse_slc : &none);
    ka_tensor(&a, pb->has_swa ? &out->lse_swa : &none);
    ka_int(&a, pb->T);
    ka_float(&a, c->scale);
    if (a.err != CL_SUCCESS) return cx_fail_cl(ctx, a.err, "nsa_fwd arguments");
    size_t g[3] = {ap.wg * (size_t)pb->T * (size_t)ngt, (size_t)pb->H, (size_t)pb->B}, lo[3] = {ap.wg, 1, 1};
    memcpy(l->global, g, sizeof g);
    memcpy(l->local, lo, sizeof lo);
    return CLNSA_SUCCESS;
}

clnsa_status clnsa_nsa_forward_workspace_size(clnsa_context *ctx, cl_command_queue queue, const clnsa_nsa_config *config,
                                              const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *out, size_t *bytes)
{
    if (!ctx) return CLNSA_ERROR_NULL_ARGUMENT;
    cx_clear(ctx);
    if (!bytes) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "bytes: expected a pointer, got NULL");
    nsa_problem pb;
    nsa_workspace lay;
    clnsa_status st = nsa_validate(ctx, config, in, out, &pb);
    if (st == CLNSA_SUCCESS) st = nsa_plan_workspace(ctx, queue, &pb, &lay);
    *bytes = st == CLNSA_SUCCESS ? lay.total : 0;
    return st;
}

clnsa_status clnsa_nsa_forward(clnsa_context *ctx, cl_command_queue queue, const clnsa_nsa_config *config,
                               const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *out, cl_mem workspace,
                               size_t workspace_bytes, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    if (!ctx) return CLNSA_ERROR_NULL_ARGUMENT;
    cx_clear(ctx);
    if (event) *event = NULL;
    if (!queue) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "queue: expected a cl_command_queue, got NULL");
    if (nwait && !wait) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "wait_list: expected %u events, got NULL", nwait);
    nsa_problem pb;
    nsa_workspace lay;
    clnsa_status st = nsa_validate(ctx, config, in, out, &pb);
    if (st == CLNSA_SUCCESS) st = nsa_plan_workspace(ctx, queue, &pb, &lay);
    if (st != CLNSA_SUCCESS) return st;
    if (lay.total > 0) {
        size_t have = 0;
        if (!workspace || clGetMemObjectInfo(workspace, CL_MEM_SIZE, sizeof have, &have, NULL) != CL_SUCCESS)
            return cx_fail(ctx, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace: expected a buffer of %zu bytes, got %s", lay.total,
                           workspace ? "an invalid cl_mem" : "NULL");
        if (workspace_bytes < lay.total || have < lay.total)
            return cx_fail(ctx, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace: expected at least %zu bytes, got %zu (buffer holds %zu)",
                           lay.total, workspace_bytes, have);
    }

    clnsa_tensor kc = {0}, vc = {0};
    if (pb.need_cmp) nsa_cmp_views(&pb, in, workspace, &lay, &kc, &vc);
    nsa_compress_plan *cp = NULL;
    launch topk = {0}, attn = {0};
    st = nsa_compress_prepare(ctx, &pb, in, workspace, &lay, &cp);
    if (st == CLNSA_SUCCESS && pb.run_topk) st = prepare_topk(ctx, &pb, in, out, &kc, workspace, &lay, &topk);
    if (st == CLNSA_SUCCESS) st = prepare_attn(ctx, &pb, in, out, &kc, &vc, workspace, &lay, &attn);

    cmd_chain chain;
    chain_init(&chain, queue, nwait, wait);
    if (st == CLNSA_SUCCESS) st = nsa_compress_enqueue(ctx, cp, &chain);
    if (st == CLNSA_SUCCESS && pb.run_topk) st = chain_kernel(ctx, &chain, topk.kernel, topk.global, topk.local);
    if (st == CLNSA_SUCCESS) st = chain_kernel(ctx, &chain, attn.kernel, attn.global, attn.local);
    if (st == CLNSA_SUCCESS) st = chain_finish(ctx, &chain, event);
    else chain_finish(ctx, &chain, NULL);
    nsa_compress_release(cp);
    if (topk.kernel) clReleaseKernel(topk.kernel);
    if (attn.kernel) clReleaseKernel(attn.kernel);
    return st;
}
