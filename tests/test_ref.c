/*
 * test_ref.c - tests of the double-precision NSA reference (ref/).
 *
 * 1. Gradient checks: for a scalar loss L = sum(do * o) every analytic
 *    gradient entry produced by the *_bwd functions is compared with the
 *    central finite difference (L(x + eps) - L(x - eps)) / (2 eps).
 * 2. Semantics checks: hand-computed compression values, empty key sets,
 *    top-k padding / forced blocks / ordering, duplicated block indices.
 *
 * Only ref_dep (ref/nsa_ref.h), cmocka and libm are needed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nsa_ref.h"

/* ------------------------------------------------------------------------ */
/* helpers                                                                  */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state;

static double urand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}

static int irand(int lo, int hi) /* uniform in [lo, hi] */
{
    return lo + (int)((urand() + 1.0) * 0.5 * (hi - lo + 1)) % (hi - lo + 1);
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static int *ialloc(size_t n)
{
    int *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static double *drand_array(size_t n, double lo, double hi)
{
    double *p = dalloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * 0.5 * (urand() + 1.0);
    return p;
}

static int all_finite(const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]))
            return 0;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* a problem instance: shape, inputs, and which function the loss runs      */
/* ------------------------------------------------------------------------ */

enum mode {
    M_CMP,    /* ref_cmp_fwd on given k_cmp / v_cmp                         */
    M_SLC,    /* ref_slc_fwd on given block indices / counts                */
    M_SWA,    /* ref_swa_fwd                                                */
    M_MEAN,   /* mean pooling of k, v, then ref_cmp_fwd                     */
    M_LINEAR, /* linear compression of k, v, then ref_cmp_fwd               */
    M_NSA,    /* ref_nsa_fwd                                                */
    M_COMPRESS /* L = sum(wk * linear(k)) + sum(wv * mean(v)), with the random
                  weights wk, wv stored in kc, vc                           */
};

typedef struct {
    int B, T, HQ, H, DK, DV;
    const int *cu;
    int N;
    int bs, S, l, d, w, init, local;
} config;

typedef struct {
    ref_nsa_shape sh;
    int NC;
    size_t nq, nk, nv, ng, nkc, nvc, no, nbi, nbc, nW[2], nb[2], npe[2];
    double *q, *k, *v, *g[3], *kc, *vc, *W[2], *bias[2], *pe[2], *dout;
    int *bi, *bc;
    /* scratch */
    double *o, *kc_t, *vc_t;
    int *bi_base, *bi_tmp;
    /* what the loss does */
    enum mode mode;
    int gate_on[3];  /* M_NSA: pass g_cmp / g_slc / g_swa            */
    int give_cmp;    /* M_NSA: pass k_cmp / v_cmp                     */
    int give_bi;     /* M_NSA: pass block_indices                     */
    int give_bc;     /* M_SLC / M_NSA: pass block_counts              */
    int have_base;   /* M_NSA with top-k: bi_base holds the selection */
} problem;

static problem *make_problem(const config *c, uint64_t seed)
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

static void free_problem(problem *p)
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

static ref_nsa_inputs nsa_inputs(const problem *p)
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
static long double loss(problem *p)
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

/* Gradients, all zeroed then accumulated by the bwd functions. */
typedef struct {
    double *dq, *dk, *dv, *dg[3], *dkc, *dvc, *dW[2], *db[2], *dpe[2];
} grads;

static grads analytic(problem *p)
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

static void free_grads(grads *g)
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

/* eps = 1e-5: with the loss accumulated in long double the remaining noise
 * is the rounding inside o (~1e-16 relative), giving errors ~1e-8 at
 * eps = 1e-5 while the O(eps^2) truncation error stays below 1e-9; at
 * eps = 1e-6 the rounding noise alone reaches ~2e-7. */
static double FD_EPS = 1e-5;
#define FD_TOL 1e-6
/* Relative error |num - ana| / max(|num|, |ana|, FD_FLOOR): relative for
 * entries of size >= FD_FLOOR, absolute (scaled) below. */
#define FD_FLOOR 1e-3

static int fd_skipped; /* entries skipped because top-k flipped */

/* Tensors with more than FD_MAX_CHECK entries are checked on a random
 * sample of FD_MAX_CHECK entries (keeps the test fast at -O0). */
#define FD_MAX_CHECK 96

/* Compare the entries of the analytic gradient ana of parameter x[0..n)
 * with central differences of the loss.  Unless may_vanish, the gradient
 * must not be identically zero (which would make the check vacuous). */
static void fd_check_ex(problem *p, double *x, const double *ana, size_t n,
                        const char *name, int may_vanish)
{
    double max_err = 0.0, max_ana = 0.0;
    size_t worst = 0;
    size_t nchk = n <= FD_MAX_CHECK ? n : FD_MAX_CHECK;
    for (size_t it = 0; it < nchk; it++) {
        size_t i = n <= FD_MAX_CHECK ? it : (size_t)irand(0, (int)n - 1);
        double save = x[i];
        x[i] = save + FD_EPS;
        long double lp = loss(p);
        x[i] = save - FD_EPS;
        long double lm = loss(p);
        x[i] = save;
        if (isnan((double)lp) || isnan((double)lm)) {
            fd_skipped++;
            continue;
        }
        double num = (double)((lp - lm) / (2.0L * FD_EPS));
        double den = fmax(fmax(fabs(num), fabs(ana[i])), FD_FLOOR);
        double err = fabs(num - ana[i]) / den;
        if (err > max_err) {
            max_err = err;
            worst = i;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (fabs(ana[i]) > max_ana)
            max_ana = fabs(ana[i]);
    if (getenv("FD_VERBOSE"))
        fprintf(stderr, "%-8s n=%-5zu max_err %.3g max|g| %.3g\n", name, n,
                max_err, max_ana);
    if (max_err >= FD_TOL)
        print_error("%s: max relative error %.3g at entry %zu (analytic "
                    "%.12g)\n",
                    name, max_err, worst, ana[worst]);
    assert_true(max_err < FD_TOL);
    /* the check is only meaningful if the gradient is not identically 0 */
    if (may_vanish)
        return;
    if (max_ana <= 1e-3)
        print_error("%s: gradient is (nearly) zero\n", name);
    assert_true(max_ana > 1e-3);
}

static void fd_check(problem *p, double *x, const double *ana, size_t n,
                     const char *name)
{
    fd_check_ex(p, x, ana, n, name, 0);
}

/* Run the analytic backward of p->mode and check every relevant gradient. */
static void check_grads(problem *p)
{
    fd_skipped = 0;
    if (getenv("FD_EPS"))
        FD_EPS = atof(getenv("FD_EPS"));
    p->have_base = 0;
    assert_true(!isnan((double)loss(p))); /* records the top-k selection */
    grads g = analytic(p);
    assert_true(all_finite(g.dq, p->nq));
    if (p->mode != M_COMPRESS)
        fd_check(p, p->q, g.dq, p->nq, "dq");
    switch (p->mode) {
    case M_CMP:
        fd_check(p, p->kc, g.dkc, p->nkc, "dk_cmp");
        fd_check(p, p->vc, g.dvc, p->nvc, "dv_cmp");
        break;
    case M_COMPRESS:
        fd_check(p, p->W[0], g.dW[0], p->nW[0], "dW");
        fd_check(p, p->bias[0], g.db[0], p->nb[0], "dbias");
        fd_check(p, p->pe[0], g.dpe[0], p->npe[0], "dpe");
        fd_check(p, p->k, g.dk, p->nk, "dk");
        fd_check(p, p->v, g.dv, p->nv, "dv");
        break;
    case M_LINEAR:
        fd_check(p, p->W[0], g.dW[0], p->nW[0], "dW_k");
        /* a bias shared by all keys shifts every score of a query by the
         * same q.b, which softmax cancels: db_k is exactly 0 */
        fd_check_ex(p, p->bias[0], g.db[0], p->nb[0], "db_k", 1);
        for (size_t i = 0; i < p->nb[0]; i++)
            assert_true(fabs(g.db[0][i]) < 1e-12);
        /* so does pe (every visible compressed token is a full block) */
        fd_check_ex(p, p->pe[0], g.dpe[0], p->npe[0], "dpe_k", 1);
        fd_check(p, p->W[1], g.dW[1], p->nW[1], "dW_v");
        fd_check(p, p->bias[1], g.db[1], p->nb[1], "db_v");
        fd_check(p, p->pe[1], g.dpe[1], p->npe[1], "dpe_v");
        /* fall through */
    case M_SLC:
    case M_SWA:
    case M_MEAN:
        fd_check(p, p->k, g.dk, p->nk, "dk");
        fd_check(p, p->v, g.dv, p->nv, "dv");
        break;
    case M_NSA: {
        static const char *gname[3] = {"dg_cmp", "dg_slc", "dg_swa"};
        /* with given k_cmp/v_cmp and no sliding window/selection, k and v
         * may not reach the loss at all */
        if (p->gate_on[1] || (p->gate_on[2] && p->sh.window > 0) ||
            (p->gate_on[0] && !p->give_cmp)) {
            fd_check(p, p->k, g.dk, p->nk, "dk");
            fd_check(p, p->v, g.dv, p->nv, "dv");
        }
        for (int x = 0; x < 3; x++) {
            if (p->gate_on[x])
                fd_check(p, p->g[x], g.dg[x], p->ng, gname[x]);
            else
                for (size_t i = 0; i < p->ng; i++)
                    assert_true(g.dg[x][i] == 0.0);
        }
        if (p->give_cmp && p->gate_on[0]) {
            fd_check(p, p->kc, g.dkc, p->nkc, "dk_cmp");
            fd_check(p, p->vc, g.dvc, p->nvc, "dv_cmp");
        }
        break;
    }
    }
    /* a flipped selection is a measure-zero event for random data */
    assert_true(fd_skipped <= 4);
    free_grads(&g);
}

/* ------------------------------------------------------------------------ */
/* configurations                                                           */
/* ------------------------------------------------------------------------ */

/* T=13, HQ=6, H=2 (G=3), DK=8, DV=16, selection block 4, S=3, window 5,
 * compression 4/4, one forced init and one forced local block. */
static const config CFG_A = {2, 13, 6, 2, 8, 16, NULL, 0,
                             4, 3, 4, 4, 5, 1, 1};
/* overlapping compression l=4, d=2 with selection block 8 */
static const config CFG_B = {1, 19, 6, 2, 8, 16, NULL, 0,
                             8, 2, 4, 2, 5, 1, 1};
/* varlen: sequences of 3, 8 and 6 tokens (the first shorter than a block) */
static const int CU[4] = {0, 3, 11, 17};
static const config CFG_V = {1, 17, 6, 2, 8, 16, CU, 3, 4, 3, 4, 2, 5, 1, 1};

static void run_mode(const config *c, enum mode m, int give_bc, uint64_t seed)
{
    problem *p = make_problem(c, seed);
    p->mode = m;
    p->give_bc = give_bc;
    check_grads(p);
    free_problem(p);
}

/* ------------------------------------------------------------------------ */
/* gradient tests                                                           */
/* ------------------------------------------------------------------------ */

static void test_grad_cmp(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_CMP, 0, 1);
    run_mode(&CFG_B, M_CMP, 0, 2);
    run_mode(&CFG_V, M_CMP, 0, 3);
}

static void test_grad_slc(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_SLC, 0, 4);
    run_mode(&CFG_A, M_SLC, 1, 5);
    run_mode(&CFG_V, M_SLC, 1, 6);
}

static void test_grad_swa(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_SWA, 0, 7);
    run_mode(&CFG_V, M_SWA, 0, 8);
}

static void test_grad_mean_chain(void **state)
{
    (void)state;
    run_mode(&CFG_A, M_MEAN, 0, 9);
    run_mode(&CFG_B, M_MEAN, 0, 10);
    run_mode(&CFG_V, M_MEAN, 0, 11);
}

static void test_grad_linear(void **state)
{
    (void)state;
    run_mode(&CFG_B, M_LINEAR, 0, 12);
    run_mode(&CFG_V, M_LINEAR, 0, 13);
    /* the compression alone, where partial blocks at sequence ends count */
    run_mode(&CFG_B, M_COMPRESS, 0, 22);
    run_mode(&CFG_V, M_COMPRESS, 0, 23);
}

static void run_nsa(const config *c, int gc, int gs, int gw, int give_cmp,
                    int give_bi, int give_bc, uint64_t seed)
{
    problem *p = make_problem(c, seed);
    p->mode = M_NSA;
    p->gate_on[0] = gc;
    p->gate_on[1] = gs;
    p->gate_on[2] = gw;
    p->give_cmp = give_cmp;
    p->give_bi = give_bi;
    p->give_bc = give_bc;
    check_grads(p);
    free_problem(p);
}

static void test_grad_nsa(void **state)
{
    (void)state;
    run_nsa(&CFG_A, 1, 1, 1, 0, 0, 0, 14); /* top-k from mean pooling */
    run_nsa(&CFG_B, 1, 1, 1, 0, 0, 1, 15); /* overlap, block_counts */
}

static void test_grad_nsa_varlen(void **state)
{
    (void)state;
    run_nsa(&CFG_V, 1, 1, 1, 0, 0, 0, 16);
    run_nsa(&CFG_V, 1, 1, 1, 1, 1, 1, 17); /* given k_cmp, v_cmp, indices */
}

static void test_grad_nsa_gates(void **state)
{
    (void)state;
    run_nsa(&CFG_A, 1, 0, 0, 0, 0, 0, 18);
    run_nsa(&CFG_A, 0, 1, 0, 0, 1, 1, 19);
    run_nsa(&CFG_A, 0, 0, 1, 0, 0, 0, 20);
    run_nsa(&CFG_A, 1, 0, 1, 1, 0, 0, 21); /* given k_cmp / v_cmp */
}

/* ------------------------------------------------------------------------ */
/* semantics tests                                                          */
/* ------------------------------------------------------------------------ */

static void test_compress_values(void **state)
{
    (void)state;
    ref_nsa_shape sh;
    const double x[5] = {1, 2, 3, 4, 5};
    double xc[4];

    /* l = 3, d = 2: [0,3) -> 2, [2,5) -> 4, [4,5) -> 5 (partial block) */
    ref_nsa_shape_init(&sh, 1, 5, 1, 1, 1, 1);
    sh.block_size = 4;
    sh.cmp_block = 3;
    sh.cmp_stride = 2;
    assert_int_equal(ref_num_cmp(5, 2), 3);
    assert_int_equal(ref_num_cmp(0, 2), 0);
    assert_int_equal(ref_total_cmp(&sh), 3);
    ref_compress_mean(&sh, x, 1, xc);
    assert_true(xc[0] == 2.0 && xc[1] == 4.0 && xc[2] == 5.0);

    /* varlen {0, 3, 3, 5} (an empty sequence), l = d = 2:
     * [1,2] -> 1.5, [3] -> 3, (empty), [4,5] -> 4.5 */
    const int cu[4] = {0, 3, 3, 5};
    sh.cu_seqlens = cu;
    sh.N = 3;
    sh.cmp_block = 2;
    assert_int_equal(ref_nsa_shape_check(&sh), 0);
    assert_int_equal(ref_total_cmp(&sh), 3);
    assert_int_equal(ref_get_seq(&sh, 2).cstart, 2);
    ref_compress_mean(&sh, x, 1, xc);
    assert_true(xc[0] == 1.5 && xc[1] == 3.0 && xc[2] == 4.5);

    /* linear, l = d = 2, W = [1, 1], pe = [10, 100], b = 0.5 on x[0..3):
     * (1+10)+(2+100)+0.5 = 113.5; (3+10)+0+0.5 = 13.5 (no pe past end) */
    const double W[2] = {1, 1}, pe[2] = {10, 100}, b[1] = {0.5};
    ref_nsa_shape_init(&sh, 1, 3, 1, 1, 1, 1);
    sh.block_size = 2;
    ref_compress_linear(&sh, x, 1, W, b, pe, xc);
    assert_true(xc[0] == 113.5 && xc[1] == 13.5);
    ref_compress_linear(&sh, x, 1, W, NULL, NULL, xc);
    assert_true(xc[0] == 3.0 && xc[1] == 3.0);

    /* shape validation */
    ref_nsa_shape_init(&sh, 1, 5, 6, 4, 8, 8);
    assert_true(ref_nsa_shape_check(&sh) != 0); /* HQ % H != 0 */
    ref_nsa_shape_init(&sh, 1, 5, 6, 2, 8, 8);
    assert_int_equal(ref_nsa_shape_check(&sh), 0);
    sh.cu_seqlens = cu;
    sh.N = 2;                                   /* cu[2] = 3 != T */
    assert_true(ref_nsa_shape_check(&sh) != 0);
}

/* Queries that see nothing: o = 0, lse = -inf, no NaN anywhere. */
static void test_empty_queries(void **state)
{
    (void)state;
    problem *p = make_problem(&CFG_A, 30);
    const ref_nsa_shape *sh = &p->sh;
    const int T = sh->T, HQ = sh->HQ, DV = sh->DV;
    double *lse = dalloc(p->ng);

    /* cmp: compressed token 0 becomes visible at t = l - 1 = 3 */
    ref_cmp_fwd(sh, p->q, p->kc, p->vc, p->o, lse);
    for (int b = 0; b < sh->B; b++)
        for (int t = 0; t < T; t++)
            for (int hq = 0; hq < HQ; hq++) {
                size_t r = ((size_t)b * T + t) * HQ + hq;
                if (t < 3) {
                    assert_true(isinf(lse[r]) && lse[r] < 0);
                    for (int c = 0; c < DV; c++)
                        assert_true(p->o[r * DV + c] == 0.0);
                } else {
                    assert_true(isfinite(lse[r]));
                }
            }

    /* slc with every index unused (-1 or past the query's block) */
    for (size_t i = 0; i < p->nbi; i++)
        p->bi[i] = (i % 2) ? -1 : 1000;
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, NULL, p->o, lse);
    for (size_t r = 0; r < p->ng; r++) {
        assert_true(isinf(lse[r]) && lse[r] < 0);
        for (int c = 0; c < DV; c++)
            assert_true(p->o[r * DV + c] == 0.0);
    }
    /* slc with block_counts all 0 */
    for (size_t i = 0; i < p->nbi; i++)
        p->bi[i] = 0;
    for (size_t i = 0; i < p->nbc; i++)
        p->bc[i] = 0;
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, p->bc, p->o, lse);
    for (size_t r = 0; r < p->ng; r++)
        assert_true(isinf(lse[r]) && lse[r] < 0);

    /* window 0: empty */
    ref_nsa_shape sh0 = *sh;
    sh0.window = 0;
    ref_swa_fwd(&sh0, p->q, p->k, p->v, p->o, lse);
    for (size_t r = 0; r < p->ng; r++) {
        assert_true(isinf(lse[r]) && lse[r] < 0);
        for (int c = 0; c < DV; c++)
            assert_true(p->o[r * DV + c] == 0.0);
    }

    /* full NSA backward with empty rows everywhere stays finite */
    p->mode = M_NSA;
    p->give_bi = 1;
    p->give_bc = 1;
    assert_true(!isnan((double)loss(p)));
    assert_true(all_finite(p->o, p->no));
    grads g = analytic(p);
    assert_true(all_finite(g.dq, p->nq));
    assert_true(all_finite(g.dk, p->nk));
    assert_true(all_finite(g.dv, p->nv));
    for (int x = 0; x < 3; x++)
        assert_true(all_finite(g.dg[x], p->ng));
    free_grads(&g);
    free(lse);
    free_problem(p);
}

/* Rows are padded with -1 beyond min(S_eff, #candidates); entries are
 * distinct candidates. */
static void test_topk_padding(void **state)
{
    (void)state;
    config c = CFG_A;
    c.S = 6; /* T = 13, block 4: at most 4 candidates */
    for (int use_bc = 0; use_bc < 2; use_bc++) {
        problem *p = make_problem(&c, 31 + use_bc);
        const ref_nsa_shape *sh = &p->sh;
        ref_compress_mean(sh, p->k, sh->DK, p->kc);
        ref_topk(sh, p->q, p->kc, use_bc ? p->bc : NULL, p->bi);
        for (int b = 0; b < sh->B; b++)
            for (int t = 0; t < sh->T; t++)
                for (int h = 0; h < sh->H; h++) {
                    size_t r = ((size_t)b * sh->T + t) * sh->H + h;
                    const int *row = p->bi + r * sh->block_count;
                    int seff = sh->block_count;
                    if (use_bc) {
                        seff = p->bc[r] < 0 ? 0 : p->bc[r];
                        if (seff > sh->block_count)
                            seff = sh->block_count;
                    }
                    int ncand = t / sh->block_size + 1;
                    int nsel = seff < ncand ? seff : ncand;
                    for (int s = 0; s < sh->block_count; s++) {
                        if (s >= nsel) {
                            assert_int_equal(row[s], -1);
                            continue;
                        }
                        assert_true(row[s] >= 0 && row[s] < ncand);
                        for (int s2 = 0; s2 < s; s2++)
                            assert_true(row[s2] != row[s]);
                    }
                }
        free_problem(p);
    }
}

/* Forced blocks come first in ascending order and are always present; the
 * others are ordered by importance, recomputed here independently: P[i]
 * from the compressed branch's lse, and compressed token i counts for block
 * j iff one of the positions it covers lies in block j. */
static void check_topk_order(const config *c, uint64_t seed)
{
    problem *p = make_problem(c, seed);
    const ref_nsa_shape *sh = &p->sh;
    const int T = sh->T, HQ = sh->HQ, H = sh->H, DK = sh->DK, S = c->S;
    const int G = HQ / H, NC = p->NC;
    double *lse = dalloc(p->ng);
    ref_cmp_fwd(sh, p->q, p->kc, p->vc, p->o, lse);
    ref_topk(sh, p->q, p->kc, NULL, p->bi);

    for (int sid = 0; sid < ref_num_seqs(sh); sid++) {
        ref_seq sq = ref_get_seq(sh, sid);
        for (int t = 0; t < sq.len; t++) {
            int tok = sq.start + t;
            for (int h = 0; h < H; h++) {
                const int *row =
                    p->bi + (((size_t)sq.b * T + tok) * H + h) * S;
                int tb = t / c->bs;
                double imp[64] = {0};
                char forced[64] = {0}, chosen[64] = {0};
                int nforced = 0;
                assert_true(tb < 64);
                for (int j = 0; j <= tb; j++) {
                    forced[j] = j < c->init || j > tb - c->local;
                    nforced += forced[j];
                }
                for (int i = 0; i * c->d + c->l - 1 <= t; i++) {
                    double P = 0.0;
                    for (int g = 0; g < G; g++) {
                        size_t r = ((size_t)sq.b * T + tok) * HQ + h * G + g;
                        const double *qr = p->q + r * DK;
                        const double *kr =
                            p->kc + (((size_t)sq.b * NC + sq.cstart + i) * H +
                                     h) * DK;
                        double z = 0;
                        for (int e = 0; e < DK; e++)
                            z += qr[e] * kr[e];
                        P += exp(z * sh->scale - lse[r]);
                    }
                    char hit[64] = {0};
                    for (int pos = i * c->d; pos < i * c->d + c->l; pos++)
                        if (pos / c->bs <= tb)
                            hit[pos / c->bs] = 1;
                    for (int j = 0; j <= tb; j++)
                        if (hit[j])
                            imp[j] += P;
                }
                int nsel = S < tb + 1 ? S : tb + 1;
                assert_true(nforced <= S);
                for (int s = 0; s < nsel; s++) {
                    int j = row[s];
                    assert_true(j >= 0 && j <= tb);
                    chosen[j] = 1;
                    if (s < nforced) {
                        assert_true(forced[j]);
                        if (s > 0)
                            assert_true(row[s - 1] < j);
                    } else {
                        assert_false(forced[j]);
                        if (s > nforced)
                            assert_true(imp[row[s - 1]] >= imp[j] - 1e-12);
                    }
                }
                for (int s = nsel; s < S; s++)
                    assert_int_equal(row[s], -1);
                for (int j = 0; j <= tb; j++) {
                    if (forced[j])
                        assert_true(chosen[j]);
                    else if (!chosen[j] && nsel > nforced)
                        assert_true(imp[j] <= imp[row[nsel - 1]] + 1e-12);
                }
            }
        }
    }
    free(lse);
    free_problem(p);
}

static void test_topk_forced_and_order(void **state)
{
    (void)state;
    /* l = d = l' */
    const config c1 = {2, 29, 6, 2, 8, 16, NULL, 0, 4, 4, 4, 4, 5, 1, 2};
    /* overlapping compression l=4, d=2, selection block 8 */
    const config c2 = {1, 45, 6, 2, 8, 16, NULL, 0, 8, 3, 4, 2, 5, 1, 1};
    /* l=6, d=4 straddling selection blocks of 4; no forced blocks */
    const config c3 = {1, 40, 6, 2, 8, 16, NULL, 0, 4, 3, 6, 4, 5, 0, 0};
    /* varlen: sequences of 3, 8, 6 */
    const config c4 = {1, 17, 6, 2, 8, 16, CU, 3, 4, 2, 4, 2, 5, 1, 0};
    check_topk_order(&c1, 33);
    check_topk_order(&c2, 36);
    check_topk_order(&c3, 37);
    check_topk_order(&c4, 38);
}

/* The key set is the union of the selected blocks: duplicated or ignored
 * entries change nothing. */
static void test_slc_duplicates(void **state)
{
    (void)state;
    config c = CFG_A;
    c.S = 4;
    problem *p = make_problem(&c, 34);
    const ref_nsa_shape *sh = &p->sh;
    int *bi2 = ialloc(p->nbi);
    double *o2 = dalloc(p->no), *lse1 = dalloc(p->ng), *lse2 = dalloc(p->ng);
    /* row A: {0, 0, 2, 2} vs row B: {2, -1, 0, 99} (99: past the query) */
    for (size_t r = 0; r < p->nbc; r++) {
        int *a = p->bi + r * 4, *bb = bi2 + r * 4;
        a[0] = 0, a[1] = 0, a[2] = 2, a[3] = 2;
        bb[0] = 2, bb[1] = -1, bb[2] = 0, bb[3] = 99;
    }
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, NULL, p->o, lse1);
    ref_slc_fwd(sh, p->q, p->k, p->v, bi2, NULL, o2, lse2);
    for (size_t i = 0; i < p->no; i++)
        assert_true(fabs(p->o[i] - o2[i]) <= 1e-14);
    for (size_t i = 0; i < p->ng; i++)
        assert_true(lse1[i] == lse2[i] || fabs(lse1[i] - lse2[i]) <= 1e-14);

    /* gradients agree too */
    double *dq1 = dalloc(p->nq), *dq2 = dalloc(p->nq);
    double *dk1 = dalloc(p->nk), *dk2 = dalloc(p->nk);
    ref_slc_bwd(sh, p->q, p->k, p->v, p->bi, NULL, p->dout, dq1, dk1, NULL);
    ref_slc_bwd(sh, p->q, p->k, p->v, bi2, NULL, p->dout, dq2, dk2, NULL);
    for (size_t i = 0; i < p->nq; i++)
        assert_true(fabs(dq1[i] - dq2[i]) <= 1e-13);
    for (size_t i = 0; i < p->nk; i++)
        assert_true(fabs(dk1[i] - dk2[i]) <= 1e-13);

    /* block_counts = 2 on row B keeps only {2}: same as row {2,-1,-1,-1} */
    for (size_t r = 0; r < p->nbc; r++) {
        int *a = p->bi + r * 4;
        a[0] = 2, a[1] = -1, a[2] = -1, a[3] = -1;
        p->bc[r] = 2;
    }
    ref_slc_fwd(sh, p->q, p->k, p->v, p->bi, NULL, p->o, lse1);
    ref_slc_fwd(sh, p->q, p->k, p->v, bi2, p->bc, o2, lse2);
    for (size_t i = 0; i < p->no; i++)
        assert_true(fabs(p->o[i] - o2[i]) <= 1e-14);

    free(bi2);
    free(o2);
    free(lse1);
    free(lse2);
    free(dq1);
    free(dq2);
    free(dk1);
    free(dk2);
    free_problem(p);
}

/* Sliding window w >= T and selection of every block both equal full
 * causal attention; the full NSA's internal top-k equals running it by hand. */
static void test_consistency(void **state)
{
    (void)state;
    problem *p = make_problem(&CFG_V, 35);
    ref_nsa_shape sh = p->sh;
    double *o2 = dalloc(p->no), *lse1 = dalloc(p->ng), *lse2 = dalloc(p->ng);

    sh.window = sh.T;
    sh.block_count = 5; /* >= blocks per sequence */
    int *all = ialloc((size_t)sh.T * sh.H * 5);
    for (int i = 0; i < sh.T * sh.H * 5; i++)
        all[i] = i % 5;
    ref_swa_fwd(&sh, p->q, p->k, p->v, p->o, lse1);
    ref_slc_fwd(&sh, p->q, p->k, p->v, all, NULL, o2, lse2);
    for (size_t i = 0; i < p->no; i++)
        assert_true(fabs(p->o[i] - o2[i]) <= 1e-14);
    for (size_t i = 0; i < p->ng; i++)
        assert_true(fabs(lse1[i] - lse2[i]) <= 1e-14);
    free(all);

    /* full NSA: internal top-k == explicit mean pooling + ref_topk */
    sh = p->sh;
    p->mode = M_NSA;
    p->give_bc = 1;
    ref_nsa_inputs in = nsa_inputs(p);
    ref_nsa_outputs out;
    memset(&out, 0, sizeof out);
    out.o = p->o;
    out.block_indices = p->bi_tmp;
    ref_nsa_fwd(&sh, &in, &out);
    ref_compress_mean(&sh, p->k, sh.DK, p->kc);
    ref_compress_mean(&sh, p->v, sh.DV, p->vc);
    ref_topk(&sh, p->q, p->kc, p->bc, p->bi);
    assert_memory_equal(p->bi, p->bi_tmp, p->nbi * sizeof(int));
    in.k_cmp = p->kc;
    in.v_cmp = p->vc;
    in.block_indices = p->bi;
    out.o = o2;
    out.block_indices = NULL;
    ref_nsa_fwd(&sh, &in, &out);
    for (size_t i = 0; i < p->no; i++)
        assert_true(p->o[i] == o2[i]);

    free(o2);
    free(lse1);
    free(lse2);
    free_problem(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compress_values),
        cmocka_unit_test(test_empty_queries),
        cmocka_unit_test(test_topk_padding),
        cmocka_unit_test(test_topk_forced_and_order),
        cmocka_unit_test(test_slc_duplicates),
        cmocka_unit_test(test_consistency),
        cmocka_unit_test(test_grad_cmp),
        cmocka_unit_test(test_grad_slc),
        cmocka_unit_test(test_grad_swa),
        cmocka_unit_test(test_grad_mean_chain),
        cmocka_unit_test(test_grad_linear),
        cmocka_unit_test(test_grad_nsa),
        cmocka_unit_test(test_grad_nsa_varlen),
        cmocka_unit_test(test_grad_nsa_gates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
