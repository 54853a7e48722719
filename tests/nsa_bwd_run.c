/* nsa_bwd_run.c: see nsa_bwd_run.h. */
#include "nsa_bwd_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

static cl_mem make(const test_env *env, size_t bytes)
{
    cl_int err;
    cl_mem m = clCreateBuffer(env->cl, CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    return err == CL_SUCCESS ? m : NULL;
}

static void grad_alloc(const test_env *env, grad_buf *g, const char *name, size_t n, clnsa_dtype dt)
{
    g->name = name;
    g->n = n;
    g->m = make(env, n * clnsa_dtype_size(dt));
    g->dev = calloc(n ? n : 1, sizeof(double));
    g->ref = calloc(n ? n : 1, sizeof(double));
}

static clnsa_tensor grad_view(const grad_buf *g, clnsa_dtype dt, int rank, int64_t a, int64_t b, int64_t c, int64_t d)
{
    const int64_t s[4] = {a, b, c, d};
    return clnsa_tensor_contiguous(g->m, dt, rank, s);
}

static void setup_compression_grads(const test_env *env, bwd_bufs *b, const nsa_run *r)
{
    const nsa_case *c = r->c;
    const clnsa_dtype dt = c->dt;
    const int64_t NC = r->NC, l = r->l;
    grad_buf *g = b->g;
    if (c->given_cmp) {
        grad_alloc(env, &g[G_DKC], "dk_cmp", (size_t)(c->B * NC * c->H * c->DK), dt);
        grad_alloc(env, &g[G_DVC], "dv_cmp", (size_t)(c->B * NC * c->H * c->DV), dt);
        b->grads.dk_cmp = grad_view(&g[G_DKC], dt, 4, c->B, NC, c->H, c->DK);
        b->grads.dv_cmp = grad_view(&g[G_DVC], dt, 4, c->B, NC, c->H, c->DV);
    }
    if (!c->linear) return;
    grad_alloc(env, &g[G_DWK], "dw_k", (size_t)(l * c->DK * c->DK), dt);
    grad_alloc(env, &g[G_DWV], "dw_v", (size_t)(l * c->DV * c->DV), dt);
    grad_alloc(env, &g[G_DBK], "db_k", (size_t)c->DK, dt);
    grad_alloc(env, &g[G_DBV], "db_v", (size_t)c->DV, dt);
    b->grads.dw_k = grad_view(&g[G_DWK], dt, 2, l * c->DK, c->DK, 0, 0);
    b->grads.dw_v = grad_view(&g[G_DWV], dt, 2, l * c->DV, c->DV, 0, 0);
    b->grads.db_k = grad_view(&g[G_DBK], dt, 1, c->DK, 0, 0, 0);
    b->grads.db_v = grad_view(&g[G_DBV], dt, 1, c->DV, 0, 0, 0);
    if (c->pe) {
        grad_alloc(env, &g[G_DPK], "dpe_k", (size_t)(l * c->DK), dt);
        grad_alloc(env, &g[G_DPV], "dpe_v", (size_t)(l * c->DV), dt);
        b->grads.dpe_k = grad_view(&g[G_DPK], dt, 2, l, c->DK, 0, 0);
        b->grads.dpe_v = grad_view(&g[G_DPV], dt, 2, l, c->DV, 0, 0);
    }
}

void bwd_setup(const test_env *env, bwd_bufs *b, const nsa_run *r, uint64_t seed)
{
    const nsa_case *c = r->c;
    const clnsa_dtype dt = c->dt;
    memset(b, 0, sizeof *b);
    b->dO = dev_rand(env, r->nq * c->DV, -1, 1, dt, &seed);
    b->dout = tensor4(b->dO.m, dt, c->B, c->T, c->HQ, c->DV);
    grad_alloc(env, &b->g[G_DQ], "dq", r->nq * c->DK, dt);
    grad_alloc(env, &b->g[G_DK], "dk", r->nk * c->DK, dt);
    grad_alloc(env, &b->g[G_DV], "dv", r->nk * c->DV, dt);
    b->grads.dq = grad_view(&b->g[G_DQ], dt, 4, c->B, c->T, c->HQ, c->DK);
    b->grads.dk = grad_view(&b->g[G_DK], dt, 4, c->B, c->T, c->H, c->DK);
    b->grads.dv = grad_view(&b->g[G_DV], dt, 4, c->B, c->T, c->H, c->DV);
    const bool on[3] = {c->cmp, c->slc, c->swa};
    clnsa_tensor *dg[3] = {&b->grads.dg_cmp, &b->grads.dg_slc, &b->grads.dg_swa};
    const char *dgn[3] = {"dg_cmp", "dg_slc", "dg_swa"};
    for (int i = 0; i < 3; ++i)
        if (on[i]) {
            grad_alloc(env, &b->g[G_DGC + i], dgn[i], r->nq, dt);
            *dg[i] = grad_view(&b->g[G_DGC + i], dt, 3, c->B, c->T, c->HQ, 0);
        }
    setup_compression_grads(env, b, r);
}

/* NaN bytes over the first `bytes` (rounded down to whole floats), written
 * from the host (blocking): Oclgrind's uninitialized-value check does not
 * count a clEnqueueFillBuffer as initializing. */
static cl_int poison(cl_command_queue queue, cl_mem m, size_t bytes)
{
    bytes = bytes / 4 * 4;
    if (!m || !bytes) return CL_SUCCESS;
    float *nan = malloc(bytes);
    if (!nan) return CL_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < bytes / 4; ++i) nan[i] = __builtin_nanf("");
    const cl_int err = clEnqueueWriteBuffer(queue, m, CL_TRUE, 0, bytes, nan, 0, NULL, NULL);
    free(nan);
    return err;
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
        if (!b->ws || poison(queue, b->ws, bytes) != CL_SUCCESS) return CLNSA_ERROR_OPENCL;
    }
    for (int i = 0; i < G_COUNT; ++i)
        if (poison(queue, b->g[i].m, b->g[i].n * clnsa_dtype_size(r->c->dt)) != CL_SUCCESS) return CLNSA_ERROR_OPENCL;
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
    for (int i = 0; i < G_COUNT; ++i)
        if (b->g[i].m) download(&e, b->g[i].m, b->g[i].n, r->c->dt, b->g[i].dev);
}

void bwd_reference(bwd_bufs *b, const nsa_run *r)
{
    const nsa_case *c = r->c;
    grad_buf *g = b->g;
    ref_nsa_inputs rin = nsa_run_ref_inputs(r);
    const size_t nkc = (size_t)c->B * r->NC * c->H;
    double *dkc = calloc(nkc * c->DK + 1, sizeof(double)), *dvc = calloc(nkc * c->DV + 1, sizeof(double));
    for (int i = 0; i < G_COUNT; ++i)
        if (g[i].ref) memset(g[i].ref, 0, g[i].n * sizeof(double));
    ref_nsa_grads rg = {g[G_DQ].ref, g[G_DK].ref, g[G_DV].ref, g[G_DGC].ref, g[G_DGS].ref, g[G_DGW].ref, dkc, dvc};
    ref_nsa_bwd(&r->sh, &rin, b->dO.h, &rg);
    if (c->given_cmp) {
        memcpy(g[G_DKC].ref, dkc, g[G_DKC].n * sizeof(double));
        memcpy(g[G_DVC].ref, dvc, g[G_DVC].n * sizeof(double));
    } else if (c->linear) {
        ref_compress_linear_bwd(&r->sh, r->k.h, c->DK, r->wk.h, r->pk.h, dkc, g[G_DK].ref, g[G_DWK].ref, g[G_DBK].ref,
                                g[G_DPK].ref);
        ref_compress_linear_bwd(&r->sh, r->v.h, c->DV, r->wv.h, r->pv.h, dvc, g[G_DV].ref, g[G_DWV].ref, g[G_DBV].ref,
                                g[G_DPV].ref);
    } else if (c->cmp) {
        ref_compress_mean_bwd(&r->sh, dkc, c->DK, g[G_DK].ref);
        ref_compress_mean_bwd(&r->sh, dvc, c->DV, g[G_DV].ref);
    }
    free(dkc);
    free(dvc);
}

void bwd_free(bwd_bufs *b)
{
    for (int i = 0; i < G_COUNT; ++i) {
        if (b->g[i].m) clReleaseMemObject(b->g[i].m);
        free(b->g[i].dev);
        free(b->g[i].ref);
    }
    if (b->ws) clReleaseMemObject(b->ws);
    dfree(&b->dO);
    memset(b, 0, sizeof *b);
}

void bwd_run_device(const test_env *env, bwd_bufs *b, const nsa_run *r)
{
    bool got_event = false;
    const clnsa_status st = bwd_enqueue_wait(env, env->queue, b, r, &got_event);
    if (st) print_error("%s: %s\n", r->c->name, clnsa_last_error(env->ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_true(got_event);
    bwd_read(env, env->queue, b, r);
}

void bwd_compare(const bwd_bufs *b, const nsa_case *c)
{
    const bool f32 = c->dt == CLNSA_DTYPE_F32 && !c->tf32;
    const double tol_dt = f32 ? 5e-5 : c->tf32 ? 5e-3 : 2e-2;
    /* With 16-bit storage (or TF32) the tensor-core path rounds P to the
     * storage type for P.V (as FlashAttention does), so the prologue's
     * D = do . o is within that rounding of sum(p dp), and a gradient that is
     * exactly zero (sum of ds) is only zero to that precision of the
     * gradients' scale. */
    double gmax = 0;
    for (int i = 0; i < G_COUNT; ++i)
        for (size_t j = 0; b->g[i].m && j < b->g[i].n; ++j) gmax = fmax(gmax, fabs(b->g[i].ref[j]));
    const double tol_zero = f32 ? 1e-4 : fmax(1e-4, 2e-2 * gmax);
    for (int i = 0; i < G_COUNT; ++i) {
        const grad_buf *g = &b->g[i];
        if (!g->m) continue;
        double ref2 = 0, amax = 0;
        for (size_t j = 0; j < g->n; ++j) {
            ref2 += g->ref[j] * g->ref[j];
            amax = fmax(amax, fabs(g->dev[j]));
        }
        const bool zero = ref2 < 1e-20 * (double)g->n;
        double e = zero ? (isfinite(amax) ? amax : INFINITY) : rel_l2(g->dev, g->ref, g->n);
        if (zero) {
            if (!(e < tol_zero)) print_error("%s: %s max |x| (exact 0) %.3g\n", c->name, g->name, e);
            assert_true(e < tol_zero);
        } else {
            check_err(g->name, c->name, e, tol_dt);
        }
    }
}
