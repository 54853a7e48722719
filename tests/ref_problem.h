/* ref_problem.h: what the tests of the double-precision reference share
 * (test_ref.c: semantics, test_ref_grad.c: gradients): small random
 * problems, the loss L = sum(do * o) of the function a problem names, and
 * its analytic gradients from the *_bwd functions. */
#ifndef CLNSA_TEST_REF_PROBLEM_H
#define CLNSA_TEST_REF_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "nsa_ref.h"

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

/* Gradients, all zeroed then accumulated by the bwd functions. */
typedef struct {
    double *dq, *dk, *dv, *dg[3], *dkc, *dvc, *dW[2], *db[2], *dpe[2];
} grads;

/* The shared configurations (ref_problem.c). */
extern const config CFG_A, CFG_B, CFG_V;
extern const int CU[4];

/* A problem of configuration c with random inputs from seed (also seeds
 * urand); mode M_CMP until the caller says otherwise. */
problem *make_problem(const config *c, uint64_t seed);
void free_problem(problem *p);
/* The inputs of ref_nsa_fwd / _bwd for the problem as it stands. */
ref_nsa_inputs nsa_inputs(const problem *p);
/* L = sum(do * o) of the function p->mode names (NAN when it fails). */
long double loss(problem *p);
/* dL/d(every input) from the *_bwd functions; free with free_grads. */
grads analytic(problem *p);
void free_grads(grads *g);

/* Zeroed arrays (asserted allocated), random numbers from make_problem's
 * seed: urand in [-1, 1), irand in [lo, hi], drand_array in [lo, hi). */
double *dalloc(size_t n);
int *ialloc(size_t n);
double urand(void);
int irand(int lo, int hi);
double *drand_array(size_t n, double lo, double hi);
/* Whether no element is NaN. */
int all_finite(const double *x, size_t n);

#endif
