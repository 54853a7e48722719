/* nsa_compress.c: the sequence offsets and compressed keys/values of NSA's
 * compressed branch: mean pooling, or linear compression (gather, then one
 * CLBlast SGEMM per tensor with the bias preset in C). */
#include "nsa.h"

#include <clblast_c.h>
#include <stdlib.h>
#include <string.h>

enum { STEP_KERNEL, STEP_GEMM };

typedef struct {
    int kind;
    cl_kernel kernel;
    size_t global[3], local[3];
    /* GEMM C[m,n] += A[m,k] . B[k,n] (f32, row-major, all in the workspace) */
    size_t m, n, k, a_off, b_off, c_off;
} step;

struct nsa_compress_plan {
    cl_mem ws;
    int nsteps;
    step steps[10];
};

static const char *const compress_files[] = {"common.h", "nsa_compress.cl", NULL};

static clnsa_status add_kernel(clnsa_context *ctx, nsa_compress_plan *p, cl_program prog, const char *name,
                               size_t g0, size_t g1, size_t g2, kargs *a)
{
    step *s = &p->steps[p->nsteps];
    memset(s, 0, sizeof *s);
    clnsa_status st = kernel_create(ctx, prog, name, &s->kernel);
    if (st != CLNSA_SUCCESS) return st;
    p->nsteps++;
    s->kind = STEP_KERNEL;
    size_t lx = g0 >= 64 ? 64 : 1;
    s->local[0] = lx;
    s->local[1] = s->local[2] = 1;
    s->global[0] = round_up(g0, lx);
    s->global[1] = g1;
    s->global[2] = g2;
    a->kernel = s->kernel;
    a->next = 0;
    a->err = CL_SUCCESS;
    return CLNSA_SUCCESS;
}

static clnsa_status args_done(clnsa_context *ctx, const kargs *a, const char *name)
{
    return a->err == CL_SUCCESS ? CLNSA_SUCCESS : cx_fail_cl(ctx, a->err, name);
}

/* The arguments every row-mapping kernel ends with. */
static void seq_args(kargs *a, const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay)
{
    ka_mem(a, pb->varlen ? in->cu_seqlens.data : NULL);
    ka_idx(a, pb->varlen ? (int64_t)in->cu_seqlens.offset : 0);
    ka_int(a, pb->N);
    ka_mem(a, pb->varlen ? ws : NULL);
    ka_idx(a, (int64_t)(lay->cmp_off / sizeof(cl_int)));
    ka_int(a, pb->T);
    ka_int(a, pb->cfg.cmp_block);
    ka_int(a, pb->cfg.cmp_stride);
}

static clnsa_status plan_mean(clnsa_context *ctx, nsa_compress_plan *p, cl_program prog, const nsa_problem *pb,
                              const clnsa_nsa_inputs *in, const nsa_workspace *lay, const clnsa_tensor *x,
                              const clnsa_tensor *dst, int D)
{
    const size_t rows = (size_t)pb->B * pb->nc_rows;
    kargs a = {.idx_long = pb->idx_long};
    clnsa_status st = add_kernel(ctx, p, prog, "mean_pool", (size_t)D, (size_t)pb->H, rows, &a);
    if (st != CLNSA_SUCCESS) return st;
    ka_tensor(&a, x);
    ka_mem(&a, p->ws);
    ka_idx(&a, (int64_t)dst->offset);
    ka_int(&a, D);
    ka_int(&a, pb->H);
    ka_int(&a, (int)rows);
    ka_int(&a, pb->nc_rows);
    seq_args(&a, pb, in, p->ws, lay);
    return args_done(ctx, &a, "mean_pool arguments");
}

static clnsa_status plan_linear(clnsa_context *ctx, nsa_compress_plan *p, cl_program prog, const nsa_problem *pb,
                                const clnsa_nsa_inputs *in, const nsa_workspace *lay, const clnsa_tensor *x,
                                const clnsa_tensor *w, const clnsa_tensor *bias, const clnsa_tensor *pe,
                                const clnsa_tensor *dst, int D)
{
    const size_t rows = (size_t)pb->B * pb->nc_rows, crows = rows * pb->H, l = (size_t)pb->cfg.cmp_block;
    const bool f32 = pb->dtype == CLNSA_DTYPE_F32;
    /* f32 storage: SGEMM writes straight into the compressed tensor */
    const size_t c_off = f32 ? dst->offset : lay->y / sizeof(float);
    kargs a = {.idx_long = pb->idx_long};
    size_t n_prep = l * D * D > crows * D ? l * D * D : crows * D;
    clnsa_status st = add_kernel(ctx, p, prog, "linear_prepare", n_prep, 1, 1, &a);
    if (st != CLNSA_SUCCESS) return st;
    ka_tensor(&a, w);
    ka_tensor(&a, bias);
    ka_mem(&a, p->ws);
    ka_idx(&a, (int64_t)(lay->w32 / sizeof(float)));
    ka_mem(&a, p->ws);
    ka_idx(&a, (int64_t)c_off);
    ka_int(&a, (int)(l * D));
    ka_int(&a, D);
    ka_int(&a, (int)crows);
    if ((st = args_done(ctx, &a, "linear_prepare arguments")) != CLNSA_SUCCESS) return st;

    if ((st = add_kernel(ctx, p, prog, "linear_gather", l * D, (size_t)pb->H, rows, &a)) != CLNSA_SUCCESS) return st;
    ka_tensor(&a, x);
    ka_tensor(&a, pe);
    ka_mem(&a, p->ws);
    ka_idx(&a, (int64_t)(lay->xg / sizeof(float)));
    ka_int(&a, D);
    ka_int(&a, pb->H);
    ka_int(&a, (int)rows);
    ka_int(&a, pb->nc_rows);
    seq_args(&a, pb, in, p->ws, lay);
    if ((st = args_done(ctx, &a, "linear_gather arguments")) != CLNSA_SUCCESS) return st;

    step *g = &p->steps[p->nsteps++];
    memset(g, 0, sizeof *g);
    g->kind = STEP_GEMM;
    g->m = crows;
    g->n = (size_t)D;
    g->k = l * D;
    g->a_off = lay->xg / sizeof(float);
    g->b_off = lay->w32 / sizeof(float);
    g->c_off = c_off;
    if (f32) return CLNSA_SUCCESS;

    if ((st = add_kernel(ctx, p, prog, "store_from_f32", crows * D, 1, 1, &a)) != CLNSA_SUCCESS) return st;
    ka_mem(&a, p->ws);
    ka_idx(&a, (int64_t)c_off);
    ka_mem(&a, p->ws);
    ka_idx(&a, (int64_t)dst->offset);
    ka_int(&a, (int)(crows * D));
    return args_done(ctx, &a, "store_from_f32 arguments");
}

clnsa_status nsa_compress_prepare(clnsa_context *ctx, const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws,
                                  const nsa_workspace *lay, nsa_compress_plan **out)
{
    *out = NULL;
    if (!pb->varlen && (!pb->need_cmp || pb->cmp_given)) return CLNSA_SUCCESS;
    nsa_compress_plan *p = calloc(1, sizeof *p);
    if (!p) return cx_fail(ctx, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    p->ws = ws;
    char defines[256];
    nsa_base_defines(pb, defines, sizeof defines);
    cl_program prog;
    clnsa_status st = program_get(ctx, compress_files, defines, &prog);
    if (st == CLNSA_SUCCESS && pb->varlen) {
        kargs a = {.idx_long = pb->idx_long};
        st = add_kernel(ctx, p, prog, "seq_offsets", 1, 1, 1, &a);
        if (st == CLNSA_SUCCESS) {
            ka_mem(&a, in->cu_seqlens.data);
            ka_idx(&a, (int64_t)in->cu_seqlens.offset);
            ka_int(&a, pb->N);
            ka_int(&a, pb->T);
            ka_int(&a, pb->cfg.cmp_stride);
            ka_mem(&a, ws);
            ka_idx(&a, (int64_t)(lay->cmp_off / sizeof(cl_int)));
            st = args_done(ctx, &a, "seq_offsets arguments");
        }
    }
    if (st == CLNSA_SUCCESS && pb->need_cmp && !pb->cmp_given) {
        clnsa_tensor kc, vc;
        nsa_cmp_views(pb, in, ws, lay, &kc, &vc);
        if (pb->linear) {
            st = plan_linear(ctx, p, prog, pb, in, lay, &in->k, &in->w_k, &in->b_k, &in->pe_k, &kc, pb->DK);
            if (st == CLNSA_SUCCESS)
                st = plan_linear(ctx, p, prog, pb, in, lay, &in->v, &in->w_v, &in->b_v, &in->pe_v, &vc, pb->DV);
        } else {
            st = plan_mean(ctx, p, prog, pb, in, lay, &in->k, &kc, pb->DK);
            if (st == CLNSA_SUCCESS) st = plan_mean(ctx, p, prog, pb, in, lay, &in->v, &vc, pb->DV);
        }
    }
    if (st != CLNSA_SUCCESS) {
        nsa_compress_release(p);
        return st;
    }
    *out = p;
    return CLNSA_SUCCESS;
}

static clnsa_status enqueue_gemm(clnsa_context *ctx, const nsa_compress_plan *p, const step *s, cmd_chain *chain)
{
    /* CLBlast takes no wait list: a barrier orders it after the chain. */
    clnsa_status st = chain_barrier(ctx, chain);
    if (st != CLNSA_SUCCESS) return st;
    cl_event ev = NULL;
    cl_command_queue q = chain->queue;
    CLBlastStatusCode bs = CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, s->m,
                                                      s->n, s->k, 1.0f, p->ws, s->a_off, s->k, p->ws, s->b_off, s->n, 1.0f,
                                                      p->ws, s->c_off, s->n, &q, &ev, p->ws);
    if (bs != CLBlastSuccess) return cx_fail(ctx, CLNSA_ERROR_BLAS, "CLBlastSgemm (linear compression) failed: status %d", (int)bs);
    chain_adopt(chain, ev);
    /* CLBlast may enqueue more than the command its event stands for: wait
     * for everything enqueued so far (a barrier without a list does). */
    cl_int err = clEnqueueBarrierWithWaitList(q, 0, NULL, &ev);
    if (err != CL_SUCCESS) return cx_fail_cl(ctx, err, "clEnqueueBarrierWithWaitList");
    chain_adopt(chain, ev);
    return CLNSA_SUCCESS;
}

clnsa_status nsa_compress_enqueue(clnsa_context *ctx, nsa_compress_plan *p, cmd_chain *chain)
{
    for (int i = 0; p && i < p->nsteps; ++i) {
        const step *s = &p->steps[i];
        clnsa_status st = s->kind == STEP_GEMM ? enqueue_gemm(ctx, p, s, chain)
                                               : chain_kernel(ctx, chain, s->kernel, s->global, s->local);
        if (st != CLNSA_SUCCESS) return st;
    }
    return CLNSA_SUCCESS;
}

void nsa_compress_release(nsa_compress_plan *p)
{
    if (!p) return;
    for (int i = 0; i < p->nsteps; ++i)
        if (p->steps[i].kernel) clReleaseKernel(p->steps[i].kernel);
    free(p);
}
