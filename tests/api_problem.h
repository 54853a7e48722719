/* api_problem.h: a small NSA forward with every branch (top-k running, all
 * outputs present) for the API tests (test_api.c, test_api_runtime.c):
 * made from a shape, sized, run and freed. */
#ifndef CLNSA_TEST_API_PROBLEM_H
#define CLNSA_TEST_API_PROBLEM_H

#include "testutil.h"

/* batch, tokens, query and KV heads, head dim, block size and count,
 * window */
typedef struct {
    int B, T, HQ, H, D, bs, S, window;
    const int *cu; /* varlen offsets (B = 1) or NULL */
    int N;
} shape;

typedef struct {
    shape sh;
    cl_mem q, k, v, g[3], cu, o, lse[3], bi, ws;
    size_t ws_bytes;
    clnsa_nsa_config cfg;
    clnsa_nsa_inputs in;
    clnsa_nsa_outputs out;
} problem;

/* Fresh f32 inputs from seed, poisoned outputs, the default config with
 * the shape's block size, count and window. */
void problem_make(problem *p, const test_env *e, const shape *sh, uint64_t seed);
/* Sizes and allocates the workspace for the problem as it stands now. */
clnsa_status problem_workspace(problem *p, const test_env *e, cl_command_queue q);
/* Runs the forward on q and waits for it. */
clnsa_status problem_run(problem *p, const test_env *e, cl_command_queue q);
void problem_free(problem *p);

#endif
