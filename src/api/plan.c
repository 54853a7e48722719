/* plan.c: an op's commands, prepared in full (programs built, kernels
 * created, arguments set) before the first one is enqueued, so that a failure
 * while preparing enqueues nothing. Steps run in order on one chain. */
#include "internal.h"
#include "tuning/tuning.h"

#include <clblast_c.h>
#include <stdlib.h>
#include <string.h>

clnsa_status plan_add_kernel(clnsa_context *ctx, op_plan *p, cl_program prog, const char *name, const size_t global[3],
                             size_t local0, kargs *a, bool idx_long)
{
    if (p->nsteps == PLAN_MAX_STEPS) return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "internal: plan has too many steps");
    plan_step *s = &p->steps[p->nsteps];
    memset(s, 0, sizeof *s);
    clnsa_status st = kernel_create(ctx, prog, name, &s->kernel);
    if (st != CLNSA_SUCCESS) return st;
    p->nsteps++;
    s->kind = PLAN_KERNEL;
    s->local[0] = local0;
    s->local[1] = s->local[2] = 1;
    s->global[0] = round_up(global[0] ? global[0] : 1, local0);
    s->global[1] = global[1] ? global[1] : 1;
    s->global[2] = global[2] ? global[2] : 1;
    s->name = name;
    a->kernel = s->kernel;
    a->next = 0;
    a->err = CL_SUCCESS;
    a->idx_long = idx_long;
    return CLNSA_SUCCESS;
}

clnsa_status plan_args_done(clnsa_context *ctx, const kargs *a, const char *name)
{
    return a->err == CL_SUCCESS ? CLNSA_SUCCESS : cx_fail_cl(ctx, a->err, name);
}

clnsa_status plan_add_gemm(clnsa_context *ctx, op_plan *p, cl_mem buf, bool trans_a, bool trans_b, size_t m, size_t n,
                           size_t k, size_t a_off, size_t a_ld, size_t b_off, size_t b_ld, float beta, size_t c_off,
                           size_t c_ld)
{
    if (p->nsteps == PLAN_MAX_STEPS) return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "internal: plan has too many steps");
    plan_step *s = &p->steps[p->nsteps++];
    memset(s, 0, sizeof *s);
    s->kind = PLAN_GEMM;
    s->gemm_buf = buf;
    s->trans_a = trans_a;
    s->trans_b = trans_b;
    s->m = m;
    s->n = n;
    s->k = k;
    s->a_off = a_off;
    s->a_ld = a_ld;
    s->b_off = b_off;
    s->b_ld = b_ld;
    s->beta = beta;
    s->c_off = c_off;
    s->c_ld = c_ld;
    s->name = "CLBlastSgemm";
    return CLNSA_SUCCESS;
}

/* GEMMs run on CLBlast, which takes no wait list: a barrier on the chain
 * before, and one on everything enqueued after (CLBlast may enqueue more
 * than the command its event stands for). Operands and CLBlast's scratch
 * all live in the one workspace buffer, the scratch at offset 0. */
static clnsa_status enqueue_gemm(clnsa_context *ctx, const plan_step *s, cmd_chain *chain)
{
    clnsa_status st = chain_barrier(ctx, chain);
    if (st != CLNSA_SUCCESS) return st;
    cl_event ev = NULL;
    cl_command_queue q = chain->queue;
    __atomic_store_n(&ctx->blas_used, 1, __ATOMIC_RELAXED);
    CLBlastStatusCode bs = CLBlastSgemmWithTempBuffer(
        CLBlastLayoutRowMajor, s->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
        s->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, s->m, s->n, s->k, 1.0f, s->gemm_buf, s->a_off, s->a_ld,
        s->gemm_buf, s->b_off, s->b_ld, s->beta, s->gemm_buf, s->c_off, s->c_ld, &q, &ev, s->gemm_buf);
    if (bs != CLBlastSuccess) return cx_fail(ctx, CLNSA_ERROR_BLAS, "CLBlastSgemm failed: status %d", (int)bs);
    chain_adopt(chain, ev);
    cl_int err = clEnqueueBarrierWithWaitList(q, 0, NULL, &ev);
    if (err != CL_SUCCESS) return cx_fail_cl(ctx, err, "clEnqueueBarrierWithWaitList");
    chain_adopt(chain, ev);
    return CLNSA_SUCCESS;
}

/* Is `name` one of the comma-separated names of `list`? */
static bool name_listed(const char *name, const char *list)
{
    if (strcmp(list, "*") == 0) return true;
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

clnsa_status plan_enqueue(clnsa_context *ctx, const op_plan *p, cmd_chain *chain)
{
    tune_hook *h = tune_hook_get(ctx); /* the tuner times one kernel's events */
    for (int i = 0; i < p->nsteps; ++i) {
        const plan_step *s = &p->steps[i];
        clnsa_status st = s->kind == PLAN_GEMM ? enqueue_gemm(ctx, s, chain)
                                               : chain_kernel(ctx, chain, s->kernel, s->global, s->local);
        if (st != CLNSA_SUCCESS) return st;
        if (h && h->capture && s->kind == PLAN_KERNEL && name_listed(s->name, h->capture) && h->nevents < PLAN_MAX_STEPS &&
            clRetainEvent(chain->last) == CL_SUCCESS) {
            h->event_kernels[h->nevents] = s->name;
            h->events[h->nevents++] = chain->last;
        }
    }
    return CLNSA_SUCCESS;
}

void plan_release(op_plan *p)
{
    for (int i = 0; i < p->nsteps; ++i)
        if (p->steps[i].kernel) clReleaseKernel(p->steps[i].kernel);
    p->nsteps = 0;
}

clnsa_status plan_run(clnsa_context *ctx, op_plan *p, clnsa_status prepared, cl_command_queue queue, cl_uint nwait,
                      const cl_event *wait, cl_event *event)
{
    clnsa_status st = prepared;
    const tune_hook *h = tune_hook_get(ctx);
    if (h && h->build_only) { /* the tuner's background builds: everything but the enqueue */
        if (event) *event = NULL;
        plan_release(p);
        return st;
    }
    cmd_chain chain;
    chain_init(&chain, queue, nwait, wait);
    if (st == CLNSA_SUCCESS) st = plan_enqueue(ctx, p, &chain);
    if (st == CLNSA_SUCCESS) st = chain_finish(ctx, &chain, event);
    else chain_finish(ctx, &chain, NULL);
    plan_release(p);
    return st;
}

clnsa_status op_begin(clnsa_context *ctx, cl_command_queue queue, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    if (event) *event = NULL;
    if (!ctx) return CLNSA_ERROR_NULL_ARGUMENT;
    cx_clear(ctx);
    if (!queue) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "queue: expected a cl_command_queue, got NULL");
    if (nwait && !wait) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "wait_list: expected %u events, got NULL", nwait);
    return CLNSA_SUCCESS;
}
