/* nsa_case.h: one NSA test case on the device and in the reference: random
 * inputs (rounded to the storage dtype so both sides see the same values),
 * poisoned outputs, the forward run, and the reference's compressed tensors.
 * Used by the forward and backward tests. */
#ifndef CLNSA_NSA_CASE_H
#define CLNSA_NSA_CASE_H

#include "nsa_ref.h"
#include "testutil.h"

typedef struct {
    const char *name;
    int B, T, HQ, H, DK, DV;
    const int *cu;
    int N;
    int bs, S, cmp_l, cmp_d, window, init_blocks, local_blocks;
    bool cmp, slc, swa;
    bool given_idx, counts, given_cmp, linear, pe;
    clnsa_dtype dt;
    bool tf32; /* f32 in the TF32 mode (a context with allow_tf32, test_warp) */
} nsa_case;

typedef struct {
    cl_mem m; /* device copy, NULL when absent */
    double *h; /* host values as the device sees them */
    size_t n;
} dbuf;

typedef struct {
    const nsa_case *c;
    ref_nsa_shape sh;
    int NC, l;
    size_t nq, nk; /* B*T*HQ and B*T*H rows */
    dbuf q, k, v, gc, gs, gw, kc, vc, wk, wv, bk, bv, pk, pv;
    int *counts, *given; /* host block_counts / given block_indices, or NULL */
    cl_mem cu_m, idx_m, cnt_m;
    clnsa_nsa_config cfg;
    clnsa_nsa_inputs in;
    clnsa_nsa_outputs out;
    cl_mem o_m, lse_m[3], bi_m, ws;
    bool lse_dropped; /* nsa_run_drop_lse */
    cl_mem ob_m[3]; /* saved branch outputs (nsa_run_save_branches), else NULL */
    /* after nsa_run_forward: device results */
    double *o, *lse[3], *ob[3];
    int *bi;        /* block indices used: the top-k's, or the given ones */
    bool topk_ran;
    double *rkc, *rvc; /* reference compressed K/V (rounded like the device's) */
} nsa_run;

dbuf dev_rand(const test_env *env, size_t n, double lo, double hi, clnsa_dtype dt, uint64_t *seed);
void dfree(dbuf *b);
ref_nsa_shape nsa_case_shape(const nsa_case *c);
/* Builds the inputs and poisoned outputs. */
void nsa_run_setup(const test_env *env, nsa_run *r, const nsa_case *c, uint64_t seed);
/* Asks the forward to save each branch's output (poisoned buffers for the
 * branches that are on), which the backward then reads instead of
 * recomputing them. */
void nsa_run_save_branches(const test_env *env, nsa_run *r);
/* Asks the forward for no lse (inference): the checks then skip them. */
void nsa_run_drop_lse(nsa_run *r);
/* Runs the forward on the device (asserting success) and reads the results. */
void nsa_run_forward(const test_env *env, nsa_run *r);
/* The reference inputs for this run: with the device's block indices. */
ref_nsa_inputs nsa_run_ref_inputs(const nsa_run *r);
void nsa_run_free(nsa_run *r);
/* The relative L2 tolerance of a case's forward results: 2e-5 in f32, 2e-3
 * in the TF32 mode, 1e-2 with 16-bit storage. */
double nsa_tol(const nsa_case *c);

/* CLNSA_TEST_CASE=name runs only the case of that name, or of the names
 * separated by '|' (debugging). */
bool nsa_case_selected(const char *name);
/* Asserts the forward's results against the double-precision reference: o,
 * each branch's lse and saved output within nsa_tol, and, when the top-k ran, its
 * selection: per row the reference's number of blocks, none repeated, each
 * one's reference importance at least the reference's last selected block's
 * (up to a relative 1e-5, 2e-3 for f16 / bf16 storage and TF32, so that a near-tie
 * may go either way). */
void nsa_check_forward(const nsa_run *r);

/* The shared case list (see nsa_case.c), and one of it by name or NULL. */
extern const nsa_case nsa_cases[];
extern const size_t nsa_case_count;
const nsa_case *nsa_case_named(const char *name);

#endif
