/* tune_op.c: the op calls of `clnsa tune` (tune_op.h). */
#include "tune_op.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ one setup */

void tune_setup_free(op_setup *s)
{
    cl_mem *all[] = {&s->q, &s->k, &s->v, &s->g[0], &s->g[1], &s->g[2], &s->idx, &s->o, &s->lse[0], &s->lse[1],
                     &s->lse[2], &s->bi, &s->dout, &s->dq, &s->dk, &s->dv, &s->dg[0], &s->dg[1], &s->dg[2], &s->ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (*all[i]) clReleaseMemObject(*all[i]);
    memset(s, 0, sizeof *s);
}

static int run_plain(const cli_env *env, op_setup *s, bool bwd);

/* The workspace at the safe default's tiles (tune_family_run grows it to the
 * candidates' largest before any of them runs); for a backward setup, the
 * forward's saved tensors. Frees the setup on failure. */
static int setup_workspace(const cli_env *env, op_setup *s)
{
    clnsa_status st = tune_workspace_query(env, s, &s->ws_bytes);
    if (st != CLNSA_SUCCESS) cli_report(env, "workspace size", st);
    if (st != CLNSA_SUCCESS || !(s->ws = cli_buffer(env, s->ws_bytes, NULL)) || (s->bwd && run_plain(env, s, false))) {
        tune_setup_free(s);
        return -1;
    }
    return 0;
}

int tune_setup_make(const cli_env *env, op_setup *s, const tune_opts *o, int T, clnsa_dtype dt, bool bwd, bool given_idx,
                    bool no_cmp, bool no_slc)
{
    memset(s, 0, sizeof *s);
    uint64_t seed = 0x5eed0000u + (uint64_t)o->seed;
    s->bwd = bwd;
    s->given_idx = given_idx;
    s->T = T;
    s->H = o->H;
    s->HQ = o->G * o->H;
    s->DK = o->D;
    s->DV = o->DV;
    s->S = o->S;
    s->dt = dt;
    const size_t nq = (size_t)T * s->HQ, nk = (size_t)T * s->H;
    clnsa_nsa_config_init(&s->cfg);
    s->cfg.block_size = s->cfg.cmp_block = s->cfg.cmp_stride = o->block;
    s->cfg.block_count = o->S;
    s->cfg.window = o->window;
    const int ngate = o->window > 0 ? 3 : 2;
    bool ok = (s->q = cli_random(env, nq * s->DK, -1, 1, dt, &seed)) && (s->k = cli_random(env, nk * s->DK, -1, 1, dt, &seed)) &&
              (s->v = cli_random(env, nk * s->DV, -1, 1, dt, &seed)) && (s->o = cli_fill(env, nq * s->DV, dt, 0)) &&
              (s->bi = cli_buffer(env, nk * s->S * 4, NULL));
    for (int i = 0; ok && i < ngate; ++i)
        ok = (s->g[i] = cli_random(env, nq, 0, 1, dt, &seed)) && (s->lse[i] = cli_buffer(env, nq * 4, NULL));
    if (ok && given_idx) {
        int32_t *idx = cli_malloc(nk * s->S * sizeof *idx);
        ok = idx != NULL;
        /* the library's own selection as the forward meets it after its
         * top-k (the split's second half): the forced blocks, which the
         * tokens of a block share, then distinct random ones */
        for (size_t r = 0; ok && r < nk; ++r)
            cli_causal_selection(idx + r * s->S, s->S, (int)(r / (size_t)s->H), o->block, s->cfg.init_blocks,
                                 s->cfg.local_blocks, &seed);
        ok = ok && (s->idx = cli_upload_i32(env, idx, nk * s->S));
        free(idx);
    }
    if (ok && bwd) {
        ok = (s->dout = cli_random(env, nq * s->DV, -1, 1, dt, &seed)) && (s->dq = cli_buffer(env, nq * s->DK * 4, NULL)) &&
             (s->dk = cli_buffer(env, nk * s->DK * 4, NULL)) && (s->dv = cli_buffer(env, nk * s->DV * 4, NULL));
        for (int i = 0; ok && i < ngate; ++i) ok = (s->dg[i] = cli_buffer(env, nq * 4, NULL)) != NULL;
    }
    if (!ok) {
        tune_setup_free(s);
        return -1;
    }
    clnsa_nsa_inputs *in = &s->in;
    in->q = cli_t4(s->q, dt, 1, T, s->HQ, s->DK);
    in->k = cli_t4(s->k, dt, 1, T, s->H, s->DK);
    in->v = cli_t4(s->v, dt, 1, T, s->H, s->DV);
    clnsa_tensor *gates[3] = {&in->g_cmp, &in->g_slc, &in->g_swa};
    for (int i = 0; i < ngate; ++i) *gates[i] = cli_t3(s->g[i], dt, 1, T, s->HQ);
    if (given_idx) in->block_indices = cli_t4(s->idx, CLNSA_DTYPE_I32, 1, T, s->H, s->S);
    clnsa_nsa_outputs *out = &s->out;
    out->o = cli_t4(s->o, dt, 1, T, s->HQ, s->DV);
    clnsa_tensor *lses[3] = {&out->lse_cmp, &out->lse_slc, &out->lse_swa};
    for (int i = 0; i < ngate; ++i) *lses[i] = cli_t3(s->lse[i], CLNSA_DTYPE_F32, 1, T, s->HQ);
    if (no_cmp) { /* the branch is off where its gate is absent; its lse is left out of the checks */
        in->g_cmp = out->lse_cmp = (clnsa_tensor){0};
        clReleaseMemObject(s->lse[0]);
        s->lse[0] = NULL;
    }
    if (no_slc) { /* likewise; no top-k runs, so no selection comes out */
        in->g_slc = out->lse_slc = (clnsa_tensor){0};
        clReleaseMemObject(s->lse[1]);
        s->lse[1] = NULL;
    } else {
        out->block_indices = cli_t4(s->bi, CLNSA_DTYPE_I32, 1, T, s->H, s->S);
    }
    if (bwd) {
        s->dout_t = cli_t4(s->dout, dt, 1, T, s->HQ, s->DV);
        s->gr.dq = cli_t4(s->dq, dt, 1, T, s->HQ, s->DK);
        s->gr.dk = cli_t4(s->dk, dt, 1, T, s->H, s->DK);
        s->gr.dv = cli_t4(s->dv, dt, 1, T, s->H, s->DV);
        clnsa_tensor *dg[3] = {&s->gr.dg_cmp, &s->gr.dg_slc, &s->gr.dg_swa};
        for (int i = 0; i < ngate; ++i) *dg[i] = cli_t3(s->dg[i], dt, 1, T, s->HQ);
    }
    return setup_workspace(env, s);
}

int tune_bs_setup_make(const cli_env *env, op_setup *s, const tune_opts *o, int T, clnsa_dtype dt, bool bwd)
{
    uint64_t seed = 0x5eed0000u + (uint64_t)o->seed;
    *s = (op_setup){.bwd = bwd, .bs = true, .T = T, .H = o->H, .HQ = o->G * o->H, .DK = o->D, .DV = o->DV, .dt = dt};
    const size_t nq = (size_t)T * s->HQ, nk = (size_t)T * s->H;
    clnsa_blocksparse_config_init(&s->bcfg);
    s->bcfg.causal = 1;
    s->bcfg.window_left = o->window > 0 ? o->window : -1;
    bool ok = (s->q = cli_random(env, nq * s->DK, -1, 1, dt, &seed)) && (s->k = cli_random(env, nk * s->DK, -1, 1, dt, &seed)) &&
              (s->v = cli_random(env, nk * s->DV, -1, 1, dt, &seed)) && (s->o = cli_fill(env, nq * s->DV, dt, 0)) &&
              (s->lse[0] = cli_buffer(env, nq * 4, NULL));
    if (ok && bwd)
        ok = (s->dout = cli_random(env, nq * s->DV, -1, 1, dt, &seed)) && (s->dq = cli_buffer(env, nq * s->DK * 4, NULL)) &&
             (s->dk = cli_buffer(env, nk * s->DK * 4, NULL)) && (s->dv = cli_buffer(env, nk * s->DV * 4, NULL));
    if (!ok) {
        tune_setup_free(s);
        return -1;
    }
    s->bin.q = cli_t4(s->q, dt, 1, T, s->HQ, s->DK);
    s->bin.k = cli_t4(s->k, dt, 1, T, s->H, s->DK);
    s->bin.v = cli_t4(s->v, dt, 1, T, s->H, s->DV);
    s->bout.o = cli_t4(s->o, dt, 1, T, s->HQ, s->DV);
    s->bout.lse = cli_t3(s->lse[0], CLNSA_DTYPE_F32, 1, T, s->HQ);
    s->bgin = (clnsa_blocksparse_grad_inputs){s->bout.o, s->bout.lse, bwd ? cli_t4(s->dout, dt, 1, T, s->HQ, s->DV) : s->bout.o};
    if (bwd) {
        s->bgr.dq = cli_t4(s->dq, dt, 1, T, s->HQ, s->DK);
        s->bgr.dk = cli_t4(s->dk, dt, 1, T, s->H, s->DK);
        s->bgr.dv = cli_t4(s->dv, dt, 1, T, s->H, s->DV);
    }
    return setup_workspace(env, s);
}

clnsa_status tune_call_op(const cli_env *env, op_setup *s, bool bwd, cl_event *done)
{
    if (s->bs && bwd)
        return clnsa_blocksparse_backward(env->ctx, env->queue, &s->bcfg, &s->bin, &s->bgin, &s->bgr, s->ws, s->ws_bytes, 0,
                                          NULL, done);
    if (s->bs)
        return clnsa_blocksparse_forward(env->ctx, env->queue, &s->bcfg, &s->bin, &s->bout, s->ws, s->ws_bytes, 0, NULL,
                                         done);
    if (bwd)
        return clnsa_nsa_backward(env->ctx, env->queue, &s->cfg, &s->in, &s->out, &s->dout_t, &s->gr, s->ws, s->ws_bytes,
                                  0, NULL, done);
    return clnsa_nsa_forward(env->ctx, env->queue, &s->cfg, &s->in, &s->out, s->ws, s->ws_bytes, 0, NULL, done);
}

clnsa_status tune_workspace_query(const cli_env *env, op_setup *s, size_t *bytes)
{
    size_t fb = 0, bb = 0;
    clnsa_status st;
    if (s->bs) {
        st = clnsa_blocksparse_forward_workspace_size(env->ctx, &s->bcfg, &s->bin, &s->bout, &fb);
        if (st == CLNSA_SUCCESS && s->bwd)
            st = clnsa_blocksparse_backward_workspace_size(env->ctx, &s->bcfg, &s->bin, &s->bgin, &s->bgr, &bb);
    } else {
        st = clnsa_nsa_forward_workspace_size(env->ctx, env->queue, &s->cfg, &s->in, &s->out, &fb);
        if (st == CLNSA_SUCCESS && s->bwd)
            st = clnsa_nsa_backward_workspace_size(env->ctx, env->queue, &s->cfg, &s->in, &s->out, &s->dout_t, &s->gr, &bb);
    }
    *bytes = fb > bb ? fb : bb;
    return st;
}

int tune_finish(const cli_env *env, clnsa_status st, cl_event ev, const char *what)
{
    if (st != CLNSA_SUCCESS) {
        cli_report(env, what, st);
        return -1;
    }
    cl_int err = ev ? clWaitForEvents(1, &ev) : CL_SUCCESS;
    if (ev) clReleaseEvent(ev);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clnsa tune: %s: %s\n", what, cli_cl_error(err));
        return -1;
    }
    return 0;
}

static int run_plain(const cli_env *env, op_setup *s, bool bwd)
{
    cl_event ev = NULL;
    return tune_finish(env, tune_call_op(env, s, bwd, &ev), ev, bwd ? "backward" : "forward (saved tensors)");
}

/* ------------------------------------------------------------ outputs */


void tune_result_free(op_result *r)
{
    for (int i = 0; i < 6; ++i) free(r->f[i]);
    free(r->bi);
    memset(r, 0, sizeof *r);
}

static int fetch(const cli_env *env, cl_mem m, size_t n, clnsa_dtype dt, float **out, size_t *nout)
{
    if (!m) return 0;
    if (!(*out = cli_malloc(n * sizeof **out)) || cli_download_f32(env, m, n, dt, *out)) return -1;
    *nout = n;
    return 0;
}

int tune_result_get(const cli_env *env, const op_setup *s, op_result *r)
{
    memset(r, 0, sizeof *r);
    const size_t nq = (size_t)s->T * s->HQ, nk = (size_t)s->T * s->H;
    int rc = 0;
    if (s->bwd) {
        rc |= fetch(env, s->dq, nq * s->DK, s->dt, &r->f[0], &r->n[0]);
        rc |= fetch(env, s->dk, nk * s->DK, s->dt, &r->f[1], &r->n[1]);
        rc |= fetch(env, s->dv, nk * s->DV, s->dt, &r->f[2], &r->n[2]);
        for (int i = 0; i < 3; ++i) rc |= fetch(env, s->dg[i], nq, s->dt, &r->f[3 + i], &r->n[3 + i]);
    } else {
        rc |= fetch(env, s->o, nq * s->DV, s->dt, &r->f[0], &r->n[0]);
        for (int i = 0; i < 3; ++i) rc |= fetch(env, s->lse[i], nq, CLNSA_DTYPE_F32, &r->f[1 + i], &r->n[1 + i]);
        if (s->out.block_indices.data && !s->given_idx) { /* the top-k's selection, where it ran */
            r->nbi = nk * s->S;
            rc |= !(r->bi = cli_malloc(r->nbi * sizeof *r->bi)) || cli_download_i32(env, s->bi, r->nbi, r->bi);
        }
    }
    if (rc) tune_result_free(r);
    return rc ? -1 : 0;
}

double tune_result_error(const op_result *a, const op_result *ref, int S)
{
    double worst = 0;
    for (int i = 0; i < 6; ++i) {
        if (!ref->f[i]) continue;
        if (memcmp(a->f[i], ref->f[i], ref->n[i] * sizeof(float)) == 0) continue;
        double num = 0, den = 0;
        for (size_t j = 0; j < ref->n[i]; ++j) {
            const double x = a->f[i][j], y = ref->f[i][j];
            if (isinf(y) || isinf(x)) {
                if (x != y) return INFINITY;
                continue;
            }
            if (isnan(x) != isnan(y)) return INFINITY;
            if (isnan(x)) continue;
            num += (x - y) * (x - y);
            den += y * y;
        }
        const double e = den > 0 ? sqrt(num / den) : sqrt(num);
        if (e > worst) worst = e;
    }
    for (size_t r = 0; ref->bi && r < ref->nbi / (size_t)S; ++r)
        for (int s = 0; s < S; ++s) {
            bool found = false;
            for (int u = 0; u < S && !found; ++u) found = a->bi[r * S + s] == ref->bi[r * S + u];
            if (!found) return INFINITY;
        }
    return worst;
}

