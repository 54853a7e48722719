/* nsa_bwd_run.h: the NSA backward of an nsa_run (nsa_case.h) on any queue,
 * its gradients read back, and the reference gradients. Covers the cases
 * without given compressed tensors or linear compression (dq, dk, dv and
 * the gate gradients of the branches that are on). Used by the robustness
 * and fault tests; the calls return statuses instead of asserting, so that
 * they can run on threads. */
#ifndef CLNSA_NSA_BWD_RUN_H
#define CLNSA_NSA_BWD_RUN_H

#include "nsa_case.h"

enum { BW_DQ, BW_DK, BW_DV, BW_DGC, BW_DGS, BW_DGW, BW_COUNT };

typedef struct {
    cl_mem m[BW_COUNT];   /* poisoned before each run; NULL when absent */
    size_t n[BW_COUNT];
    double *dev[BW_COUNT]; /* read back by bwd_read */
    double *ref[BW_COUNT]; /* filled by bwd_reference */
    dbuf dO;
    clnsa_tensor dout;
    clnsa_nsa_grads grads;
    cl_mem ws;
    size_t ws_bytes;
} bwd_bufs;

extern const char *const bwd_names[BW_COUNT];

void bwd_setup(const test_env *env, bwd_bufs *b, const nsa_run *r, uint64_t seed);
/* Queries the workspace (allocated once), poisons the gradients, enqueues
 * the backward on `queue` and waits for it. *got_event (if given) tells
 * whether an event came back (a failed call must return none). */
clnsa_status bwd_enqueue_wait(const test_env *env, cl_command_queue queue, bwd_bufs *b, const nsa_run *r,
                              bool *got_event);
/* Reads the gradients back (blocking on `queue`). */
void bwd_read(const test_env *env, cl_command_queue queue, bwd_bufs *b, const nsa_run *r);
void bwd_reference(bwd_bufs *b, const nsa_run *r);
void bwd_free(bwd_bufs *b);

#endif
