/* ref_problem.c: the reference tests' problems, loss and gradients
 * (ref_problem.h). */
#include "ref_problem.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ------------------------------------------------------------------------ */
/* helpers                                                                  */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state; /* urand's, seeded by make_problem */

double urand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}

int irand(int lo, int hi) /* uniform in [lo, hi] */
{
    return lo + (int)((urand() + 1.0) * 0.5 * (hi - lo + 1)) % (hi - lo + 1);
}

double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

int *ialloc(size_t n)
{
    int *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

double *drand_array(size_t n, double lo, double hi)
{
    double *p = dalloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * 0.5 * (urand() + 1.0);
    return p;
}

int all_finite(const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]))
            return 0;
    return 1;
}



problem *make_problem(const config *c, uint64_t seed)
{
    problem *p = calloc(1, sizeof *p);
    assert_non_null(p);
    rng_state = seed * 2654435761u + 88172645463325252ull;

    ref_nsa_shape *sh = &p->sh;
    ref_nsa_shape_init(sh, c->B, c->T, c->HQ, c->H, c->DK, c->DV);
    sh->cu_seqlens = c->cu;
    sh->N = c->N;
    sh->block_size = c->bs;
    sh->block_count = c->S;
    sh->cmp_block = c->l;
    sh->cmp_stride = c->d;
    sh->window = c->w;
    sh->init_blocks = c->init;
    sh->local_blocks = c->local;
    assert_int_equal(ref_nsa_shape_check(sh), 0);

    p->NC = ref_total_cmp(sh);
    size_t BT = (size_t)c->B * c->T;
    p->nq = BT * c->HQ * c->DK;
    p->nk = BT * c->H * c->DK;
    p->nv = BT * c->H * c->DV;
    p->ng = BT * c->HQ;
    p->no = BT * c->HQ * c->DV;
    p->nkc = (size_t)c->B * p->NC * c->H * c->DK;
    p->nvc = (size_t)c->B * p->NC * c->H * c->DV;
    p->nbi = BT * c->H * c->S;
    p->nbc = BT * c->H;
    int Ds[2] = {c->DK, c->DV};
    int l = ref_cmp_block(sh);
    for (int x = 0; x < 2; x++) {
        p->nW[x] = (size_t)l * Ds[x] * Ds[x];
        p->nb[x] = (size_t)Ds[x];
        p->npe[x] = (size_t)l * Ds[x];
    }

    p->q = drand_array(p->nq, -1.5, 1.5);
    p->k = drand_array(p->nk, -1.5, 1.5);
    p->v = drand_array(p->nv, -1, 1);
    for (int x = 0; x < 3; x++)
        p->g[x] = drand_array(p->ng, 0.1, 1.0);
    p->kc = drand_array(p->nkc, -1.5, 1.5);
    p->vc = drand_array(p->nvc, -1, 1);
    for (int x = 0; x < 2; x++) {
        /* keep the linear compression's output O(1) */
        double a = 1.0 / sqrt((double)l * Ds[x]);
        p->W[x] = drand_array(p->nW[x], -a, a);
        p->bias[x] = drand_array(p->nb[x], -0.5, 0.5);
        p->pe[x] = drand_array(p->npe[x], -0.5, 0.5);
    }
    p->dout = drand_array(p->no, -1, 1);

    /* random block indices: -1, in range, duplicates, and past the query's
     * own block (ignored); random counts including out-of-range ones */
    p->bi = ialloc(p->nbi);
    int maxb = (c->T + c->bs - 1) / c->bs;
    for (size_t i = 0; i < p->nbi; i++)
        p->bi[i] = irand(-1, maxb);
    p->bc = ialloc(p->nbc);
    for (size_t i = 0; i < p->nbc; i++)
        p->bc[i] = irand(-1, c->S + 1);

    p->o = dalloc(p->no);
    p->kc_t = dalloc(p->nkc);
    p->vc_t = dalloc(p->nvc);
    p->bi_base = ialloc(p->nbi);
    p->bi_tmp = ialloc(p->nbi);
    p->gate_on[0] = p->gate_on[1] = p->gate_on[2] = 1;
    return p;
}

void free_problem(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    for (int x = 0; x < 3; x++)
        free(p->g[x]);
    free(p->kc);
    free(p->vc);
    for (int x = 0; x < 2; x++) {
        free(p->W[x]);
        free(p->bias[x]);
        free(p->pe[x]);
    }
    free(p->dout);
    free(p->bi);
    free(p->bc);
    free(p->o);
    free(p->kc_t);
    free(p->vc_t);
    free(p->bi_base);
    free(p->bi_tmp);
    free(p);
}

ref_nsa_inputs nsa_inputs(const problem *p)
{
    ref_nsa_inputs in;
    memset(&in, 0, sizeof in);
    in.q = p->q;
    in.k = p->k;
    in.v = p->v;
    in.g_cmp = p->gate_on[0] ? p->g[0] : NULL;
    in.g_slc = p->gate_on[1] ? p->g[1] : NULL;
    in.g_swa = p->gate_on[2] ? p->g[2] : NULL;
    in.k_cmp = p->give_cmp ? p->kc : NULL;
    in.v_cmp = p->give_cmp ? p->vc : NULL;
    in.block_indices = p->give_bi ? p->bi : NULL;
    in.block_counts = p->give_bc ? p->bc : NULL;
    return in;
}

/* L = sum(do * o).  Returns NAN when the top-k selection differs from the
 * one of the unperturbed problem (the loss is not differentiable there). */
long double loss(problem *p)
{
    const ref_nsa_shape *sh = &p->sh;
    const int *bc = p->give_bc ? p->bc : NULL;
    switch (p->mode) {
    case M_CMP:
        ref_cmp_fwd(sh, p->q, p->kc, p->vc, p->o, NULL);
        break;
    case M_SLC:
        ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, bc, p->o, NULL);
        break;
    case M_SWA:
        ref_swa_fwd(sh, p->q, p->k, p->v, p->o, NULL);
        break;
    case M_MEAN:
        ref_compress_mean(sh, p->k, sh->DK, p->kc_t);
        ref_compress_mean(sh, p->v, sh->DV, p->vc_t);
        ref_cmp_fwd(sh, p->q, p->kc_t, p->vc_t, p->o, NULL);
        break;
    case M_LINEAR:
        ref_compress_linear(sh, p->k, sh->DK, p->W[0], p->bias[0], p->pe[0],
                            p->kc_t);
        ref_compress_linear(sh, p->v, sh->DV, p->W[1], p->bias[1], p->pe[1],
                            p->vc_t);
        ref_cmp_fwd(sh, p->q, p->kc_t, p->vc_t, p->o, NULL);
        break;
    case M_COMPRESS: {
        long double L = 0.0;
        ref_compress_linear(sh, p->k, sh->DK, p->W[0], p->bias[0], p->pe[0],
                            p->kc_t);
        ref_compress_mean(sh, p->v, sh->DV, p->vc_t);
        for (size_t i = 0; i < p->nkc; i++)
            L += (long double)p->kc[i] * p->kc_t[i];
        for (size_t i = 0; i < p->nvc; i++)
            L += (long double)p->vc[i] * p->vc_t[i];
        return L;
    }
    case M_NSA: {
        ref_nsa_inputs in = nsa_inputs(p);
        ref_nsa_outputs out;
        memset(&out, 0, sizeof out);
        out.o = p->o;
        out.block_indices = p->bi_tmp;
        ref_nsa_fwd(sh, &in, &out);
        if (!p->give_bi) {
            if (!p->have_base) {
                memcpy(p->bi_base, p->bi_tmp, p->nbi * sizeof(int));
                p->have_base = 1;
            } else if (memcmp(p->bi_base, p->bi_tmp, p->nbi * sizeof(int))) {
                return NAN;
            }
        }
        break;
    }
    }
    long double L = 0.0;
    for (size_t i = 0; i < p->no; i++)
        L += (long double)p->dout[i] * p->o[i];
    return L;
}



grads analytic(problem *p)
{
    const ref_nsa_shape *sh = &p->sh;
    const int *bc = p->give_bc ? p->bc : NULL;
    grads g;
    g.dq = dalloc(p->nq);
    g.dk = dalloc(p->nk);
    g.dv = dalloc(p->nv);
    for (int x = 0; x < 3; x++)
        g.dg[x] = dalloc(p->ng);
    g.dkc = dalloc(p->nkc);
    g.dvc = dalloc(p->nvc);
    for (int x = 0; x < 2; x++) {
        g.dW[x] = dalloc(p->nW[x]);
        g.db[x] = dalloc(p->nb[x]);
        g.dpe[x] = dalloc(p->npe[x]);
    }
    switch (p->mode) {
    case M_CMP:
        ref_cmp_bwd(sh, p->q, p->kc, p->vc, p->dout, g.dq, g.dkc, g.dvc);
        break;
    case M_SLC:
        ref_slc_bwd(sh, p->q, p->k, p->v, p->bi, bc, p->dout, g.dq, g.dk,
                    g.dv);
        break;
    case M_SWA:
        ref_swa_bwd(sh, p->q, p->k, p->v, p->dout, g.dq, g.dk, g.dv);
        break;
    case M_MEAN:
        ref_compress_mean(sh, p->k, sh->DK, p->kc_t);
        ref_compress_mean(sh, p->v, sh->DV, p->vc_t);
        ref_cmp_bwd(sh, p->q, p->kc_t, p->vc_t, p->dout, g.dq, g.dkc, g.dvc);
        ref_compress_mean_bwd(sh, g.dkc, sh->DK, g.dk);
        ref_compress_mean_bwd(sh, g.dvc, sh->DV, g.dv);
        break;
    case M_LINEAR:
        ref_compress_linear(sh, p->k, sh->DK, p->W[0], p->bias[0], p->pe[0],
                            p->kc_t);
        ref_compress_linear(sh, p->v, sh->DV, p->W[1], p->bias[1], p->pe[1],
                            p->vc_t);
        ref_cmp_bwd(sh, p->q, p->kc_t, p->vc_t, p->dout, g.dq, g.dkc, g.dvc);
        ref_compress_linear_bwd(sh, p->k, sh->DK, p->W[0], p->pe[0], g.dkc,
                                g.dk, g.dW[0], g.db[0], g.dpe[0]);
        ref_compress_linear_bwd(sh, p->v, sh->DV, p->W[1], p->pe[1], g.dvc,
                                g.dv, g.dW[1], g.db[1], g.dpe[1]);
        break;
    case M_COMPRESS:
        ref_compress_linear_bwd(sh, p->k, sh->DK, p->W[0], p->pe[0], p->kc,
                                g.dk, g.dW[0], g.db[0], g.dpe[0]);
        ref_compress_mean_bwd(sh, p->vc, sh->DV, g.dv);
        break;
    case M_NSA: {
        ref_nsa_inputs in = nsa_inputs(p);
        ref_nsa_grads gr = {g.dq, g.dk, g.dv, g.dg[0], g.dg[1], g.dg[2],
                            g.dkc, g.dvc};
        ref_nsa_bwd(sh, &in, p->dout, &gr);
        break;
    }
    }
    return g;
}

void free_grads(grads *g)
{
    free(g->dq);
    free(g->dk);
    free(g->dv);
    for (int x = 0; x < 3; x++)
        free(g->dg[x]);
    free(g->dkc);
    free(g->dvc);
    for (int x = 0; x < 2; x++) {
        free(g->dW[x]);
        free(g->db[x]);
        free(g->dpe[x]);
    }
}

/* ------------------------------------------------------------------------ */
/* configurations                                                           */
/* ------------------------------------------------------------------------ */

/* T=13, HQ=6, H=2 (G=3), DK=8, DV=16, selection block 4, S=3, window 5,
 * compression 4/4, one forced init and one forced local block. */
const config CFG_A = {2, 13, 6, 2, 8, 16, NULL, 0,
                             4, 3, 4, 4, 5, 1, 1};
/* overlapping compression l=4, d=2 with selection block 8 */
const config CFG_B = {1, 19, 6, 2, 8, 16, NULL, 0,
                             8, 2, 4, 2, 5, 1, 1};
/* varlen: sequences of 3, 8 and 6 tokens (the first shorter than a block) */
const int CU[4] = {0, 3, 11, 17};
const config CFG_V = {1, 17, 6, 2, 8, 16, CU, 3, 4, 3, 4, 2, 5, 1, 1};
