/* nsa_bwd_run.c: see nsa_bwd_run.h. */
#include "nsa_bwd_run.h"

#include <stdlib.h>
#include <string.h>

const char *const bwd_names[BW_COUNT] = {"dq", "dk", "dv", "dg_cmp", "dg_slc", "dg_swa"};

static cl_mem make(const test_env *env, size_t bytes)
{
    cl_int err;
    cl_mem m = clCreateBuffer(env->cl, CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    return err == CL_SUCCESS ? m : NULL;
}

void bwd_setup(const test_env *env, bwd_bufs *b, const nsa_run *r, uint64_t seed)
{
    const nsa_case *c = r->c;
    const clnsa_dtype dt = c->dt;
    memset(b, 0, sizeof *b);
    b->dO = dev_rand(env, r->nq * c->DV, -1, 1, dt, &seed);
    b->dout = tensor4(b->dO.m, dt, c->B, c->T, c->HQ, c->DV);
    const size_t n[BW_COUNT] = {r->nq * c->DK, r->nk * c->DK, r->nk * c->DV, r->nq, r->nq, r->nq};
    const bool on[BW_COUNT] = {true, true, true, c->cmp, c->slc, c->swa};
    for (int i = 0; i < BW_COUNT; ++i) {
        if (!on[i]) continue;
        b->n[i] = n[i];
        b->m[i] = make(env, n[i] * clnsa_dtype_size(dt));
        b->dev[i] = calloc(n[i] ? n[i] : 1, sizeof(double));
        b->ref[i] = calloc(n[i] ? n[i] : 1, sizeof(double));
    }
    b->grads.dq = tensor4(b->m[BW_DQ], dt, c->B, c->T, c->HQ, c->DK);
    b->grads.dk = tensor4(b->m[BW_DK], dt, c->B, c->T, c->H, c->DK);
    b->grads.dv = tensor4(b->m[BW_DV], dt, c->B, c->T, c->H, c->DV);
    if (b->m[BW_DGC]) b->grads.dg_cmp = tensor3(b->m[BW_DGC], dt, c->B, c->T, c->HQ);
    if (b->m[BW_DGS]) b->grads.dg_slc = tensor3(b->m[BW_DGS], dt, c->B, c->T, c->HQ);
    if (b->m[BW_DGW]) b->grads.dg_swa = tensor3(b->m[BW_DGW], dt, c->B, c->T, c->HQ);
}

clnsa_status bwd_enqueue_wait(const test_env *env, cl_command_queue queue, bwd_bufs *b, const nsa_run *r,
                              bool *got_event)
{
    if (got_event) *got_event = false;
    size_t bytes = 0;
    clnsa_status st = clnsa_nsa_backward_workspace_size(env->ctx, queue, &r->cfg, &r->in, &r->out, &b->dout, &b->grads,
                                                        &bytes);
    if (st != CLNSA_SUCCESS) return st;
    if (bytes > b->ws_bytes) {
        if (b->ws) clReleaseMemObject(b->ws);
        b->ws = make(env, bytes);
        b->ws_bytes = bytes;
        if (!b->ws) return CLNSA_ERROR_OPENCL;
    }
    const float nan_pattern = __builtin_nanf("");
    for (int i = 0; i < BW_COUNT; ++i) { /* NaN bytes in any dtype */
        const size_t fill = b->n[i] * clnsa_dtype_size(r->c->dt) / 4 * 4;
        if (b->m[i] && fill &&
            clEnqueueFillBuffer(queue, b->m[i], &nan_pattern, sizeof nan_pattern, 0, fill, 0, NULL, NULL) != CL_SUCCESS)
            return CLNSA_ERROR_OPENCL;
    }
    cl_event ev = NULL;
    st = clnsa_nsa_backward(env->ctx, queue, &r->cfg, &r->in, &r->out, &b->dout, &b->grads, b->ws, b->ws_bytes, 0, NULL,
                            &ev);
    if (got_event) *got_event = ev != NULL;
    if (ev) {
        if (clWaitForEvents(1, &ev) != CL_SUCCESS && st == CLNSA_SUCCESS) st = CLNSA_ERROR_OPENCL;
        clReleaseEvent(ev);
    }
    return st;
}

void bwd_read(const test_env *env, cl_command_queue queue, bwd_bufs *b, const nsa_run *r)
{
    test_env e = *env;
    e.queue = queue;
    for (int i = 0; i < BW_COUNT; ++i)
        if (b->m[i]) download(&e, b->m[i], b->n[i], r->c->dt, b->dev[i]);
}

void bwd_reference(bwd_bufs *b, const nsa_run *r)
{
    const nsa_case *c = r->c;
    ref_nsa_inputs rin = nsa_run_ref_inputs(r);
    const size_t nkc = (size_t)c->B * r->NC * c->H;
    double *dkc = calloc(nkc * c->DK + 1, sizeof(double)), *dvc = calloc(nkc * c->DV + 1, sizeof(double));
    for (int i = 0; i < BW_COUNT; ++i)
        if (b->ref[i]) memset(b->ref[i], 0, b->n[i] * sizeof(double));
    ref_nsa_grads rg = {b->ref[BW_DQ], b->ref[BW_DK], b->ref[BW_DV], b->ref[BW_DGC], b->ref[BW_DGS], b->ref[BW_DGW],
                        dkc, dvc};
    ref_nsa_bwd(&r->sh, &rin, b->dO.h, &rg);
    if (c->cmp) {
        ref_compress_mean_bwd(&r->sh, dkc, c->DK, b->ref[BW_DK]);
        ref_compress_mean_bwd(&r->sh, dvc, c->DV, b->ref[BW_DV]);
    }
    free(dkc);
    free(dvc);
}

void bwd_free(bwd_bufs *b)
{
    for (int i = 0; i < BW_COUNT; ++i) {
        if (b->m[i]) clReleaseMemObject(b->m[i]);
        free(b->dev[i]);
        free(b->ref[i]);
    }
    if (b->ws) clReleaseMemObject(b->ws);
    dfree(&b->dO);
    memset(b, 0, sizeof *b);
}
