/* tune_op.h: the op calls of `clnsa tune` (cmd_tune.c): the inputs of
 * one NSA or block-sparse call at a size and dtype, running it, and reading
 * back and comparing its outputs (the check of each candidate against the
 * safe default). */
#ifndef CLNSA_TUNE_OP_H
#define CLNSA_TUNE_OP_H

#include "cli_common.h"

#include <stdbool.h>

/* clnsa tune's options (cmd_tune.c reads them): the timed lengths T[0 ..
 * nT-1] from the list Ts. */
#define TUNE_MAX_T 6 /* nsa_fwd_split tries each and never: at most 8 values (tune_param) */
typedef struct {
    int D, DV, G, H, block, S, dtype, window, budget, seed, repeat, verify_T, jobs, max_seconds;
    int T[TUNE_MAX_T], nT;
    const char *Ts, *family, *out, *device;
} tune_opts;

/* The tensors of one op call at one size and dtype: the NSA, or (bs) the
 * block-sparse attention, which uses q, k, v, o, lse[0] and the gradients. */
typedef struct {
    bool bwd, given_idx, bs;
    int T, HQ, H, DK, DV, S;
    clnsa_dtype dt;
    cl_mem q, k, v, g[3], idx, o, lse[3], bi, dout, dq, dk, dv, dg[3], ws;
    size_t ws_bytes;
    clnsa_nsa_config cfg;
    clnsa_nsa_inputs in;
    clnsa_nsa_outputs out;
    clnsa_nsa_grads gr;
    clnsa_tensor dout_t;
    clnsa_blocksparse_config bcfg;
    clnsa_blocksparse_inputs bin;
    clnsa_blocksparse_outputs bout;
    clnsa_blocksparse_grad_inputs bgin;
    clnsa_blocksparse_grads bgr;
} op_setup;

/* An op's outputs, read back as f32 (tune_result_get). */
typedef struct {
    float *f[6];   /* forward: o, lse x3; backward: dq, dk, dv, dg x3 */
    size_t n[6];
    int32_t *bi;   /* forward when top-k ran */
    size_t nbi;
} op_result;

void tune_setup_free(op_setup *s);
/* Inputs of the NSA at T tokens in dtype dt: all three branches (the
 * window only when --window > 0; no compressed branch when no_cmp, no
 * selected branch, and so no top-k, when no_slc); given
 * block indices when given_idx (so that top-k does not run), laid out as
 * the library's top-k lays them out (cli_causal_selection: the forced
 * blocks first, then distinct random ones);
 * for the backward, the forward's saved tensors are computed once here. */
int tune_setup_make(const cli_env *env, op_setup *s, const tune_opts *o, int T, clnsa_dtype dt, bool bwd, bool given_idx,
                    bool no_cmp, bool no_slc);
/* Block-sparse attention at T tokens: causal, with the --window as its
 * left window (none at 0), no block mask. */
int tune_bs_setup_make(const cli_env *env, op_setup *s, const tune_opts *o, int T, clnsa_dtype dt, bool bwd);
/* One call of the op (forward, or backward); its event in *done. */
clnsa_status tune_call_op(const cli_env *env, op_setup *s, bool bwd, cl_event *done);
/* The op's workspace size (the forward's and, for a backward setup, the
 * backward's) under the current thread's tuning hook. */
clnsa_status tune_workspace_query(const cli_env *env, op_setup *s, size_t *bytes);
/* Reports st or waits for and releases ev: 0, or -1 with a message naming what. */
int tune_finish(const cli_env *env, clnsa_status st, cl_event ev, const char *what);
void tune_result_free(op_result *r);
/* The op's outputs, read back as f32. */
int tune_result_get(const cli_env *env, const op_setup *s, op_result *r);
/* Worst relative L2 error over the float outputs (0 when bitwise equal;
 * -inf entries, as in lse, must match exactly); +inf on a NaN, a -inf
 * mismatch or another set of selected blocks. */
double tune_result_error(const op_result *a, const op_result *ref, int S);

#endif
