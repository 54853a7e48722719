/* api_problem.c: the API tests' small forward (api_problem.h). */
#include "api_problem.h"

#include <stdlib.h>
#include <string.h>

#define F32 CLNSA_DTYPE_F32
#define I32 CLNSA_DTYPE_I32

void problem_make(problem *p, const test_env *e, const shape *sh, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->sh = *sh;
    const size_t nq = (size_t)sh->B * sh->T * sh->HQ, nk = (size_t)sh->B * sh->T * sh->H;
    double *x = alloc_uniform(nq * sh->D, -1, 1, &seed);
    p->q = upload(e, x, nq * sh->D, F32, false);
    fill_uniform(x, nk * sh->D, -1, 1, &seed);
    p->k = upload(e, x, nk * sh->D, F32, false);
    fill_uniform(x, nk * sh->D, -1, 1, &seed);
    p->v = upload(e, x, nk * sh->D, F32, false);
    for (int i = 0; i < 3; ++i) {
        fill_uniform(x, nq, 0, 1, &seed);
        p->g[i] = upload(e, x, nq, F32, false);
    }
    free(x);
    p->o = poisoned(e, nq * sh->D, F32);
    for (int i = 0; i < 3; ++i) p->lse[i] = poisoned(e, nq, F32);
    p->bi = poisoned(e, nk * sh->S, I32);

    clnsa_nsa_config_init(&p->cfg);
    p->cfg.block_size = sh->bs;
    p->cfg.block_count = sh->S;
    p->cfg.window = sh->window;
    memset(&p->in, 0, sizeof p->in);
    p->in.q = tensor4(p->q, F32, sh->B, sh->T, sh->HQ, sh->D);
    p->in.k = tensor4(p->k, F32, sh->B, sh->T, sh->H, sh->D);
    p->in.v = tensor4(p->v, F32, sh->B, sh->T, sh->H, sh->D);
    p->in.g_cmp = tensor3(p->g[0], F32, sh->B, sh->T, sh->HQ);
    p->in.g_slc = tensor3(p->g[1], F32, sh->B, sh->T, sh->HQ);
    p->in.g_swa = tensor3(p->g[2], F32, sh->B, sh->T, sh->HQ);
    if (sh->cu) {
        p->cu = upload_i32(e, sh->cu, (size_t)sh->N + 1);
        int64_t n = sh->N + 1;
        p->in.cu_seqlens = clnsa_tensor_contiguous(p->cu, I32, 1, &n);
    }
    memset(&p->out, 0, sizeof p->out);
    p->out.o = tensor4(p->o, F32, sh->B, sh->T, sh->HQ, sh->D);
    p->out.lse_cmp = tensor3(p->lse[0], F32, sh->B, sh->T, sh->HQ);
    p->out.lse_slc = tensor3(p->lse[1], F32, sh->B, sh->T, sh->HQ);
    p->out.lse_swa = tensor3(p->lse[2], F32, sh->B, sh->T, sh->HQ);
    p->out.block_indices = tensor4(p->bi, I32, sh->B, sh->T, sh->H, sh->S);
}

clnsa_status problem_workspace(problem *p, const test_env *e, cl_command_queue q)
{
    clnsa_status st = clnsa_nsa_forward_workspace_size(e->ctx, q, &p->cfg, &p->in, &p->out, &p->ws_bytes);
    if (st != CLNSA_SUCCESS) return st;
    if (p->ws) clReleaseMemObject(p->ws);
    p->ws = NULL;
    if (p->ws_bytes) {
        cl_int err;
        p->ws = clCreateBuffer(e->cl, CL_MEM_READ_WRITE, p->ws_bytes, NULL, &err);
        if (err != CL_SUCCESS) return CLNSA_ERROR_OPENCL;
    }
    return CLNSA_SUCCESS;
}

clnsa_status problem_run(problem *p, const test_env *e, cl_command_queue q)
{
    clnsa_status st = problem_workspace(p, e, q);
    if (st != CLNSA_SUCCESS) return st;
    cl_event ev = NULL;
    st = clnsa_nsa_forward(e->ctx, q, &p->cfg, &p->in, &p->out, p->ws, p->ws_bytes, 0, NULL, &ev);
    if (st != CLNSA_SUCCESS) return st;
    if (!ev || clWaitForEvents(1, &ev) != CL_SUCCESS) return CLNSA_ERROR_OPENCL;
    clReleaseEvent(ev);
    return CLNSA_SUCCESS;
}

void problem_free(problem *p)
{
    cl_mem all[] = {p->q, p->k, p->v, p->g[0], p->g[1], p->g[2], p->cu, p->o,
                    p->lse[0], p->lse[1], p->lse[2], p->bi, p->ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
    memset(p, 0, sizeof *p);
}

