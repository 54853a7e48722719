/* nsa_bwd_run.h: the NSA backward of an nsa_run (nsa_case.h) on any queue:
 * every gradient the case calls for (dq, dk, dv, the gate gradients of the
 * branches that are on, dk_cmp / dv_cmp for given compressed tensors, the
 * weight, bias and position-embedding gradients of linear compression),
 * poisoned before each run, read back, and the reference gradients. The
 * calls return statuses instead of asserting, so that they can run on
 * threads. */
#ifndef CLNSA_NSA_BWD_RUN_H
#define CLNSA_NSA_BWD_RUN_H

#include "nsa_case.h"

enum { G_DQ, G_DK, G_DV, G_DGC, G_DGS, G_DGW, G_DKC, G_DVC, G_DWK, G_DBK, G_DPK, G_DWV, G_DBV, G_DPV, G_COUNT };

/* One gradient: its device buffer (NULL when the case has none), its
 * elements, the values read back and the reference's. */
typedef struct {
    const char *name;
    cl_mem m;
    size_t n;
    double *dev, *ref;
} grad_buf;

typedef struct {
    grad_buf g[G_COUNT];
    clnsa_nsa_grads grads; /* views of g[*].m */
    clnsa_tensor dout;
    dbuf dO;
    cl_mem ws;
    size_t ws_bytes;
} bwd_bufs;

/* The output gradient (random, from seed) and the gradient buffers. */
void bwd_setup(const test_env *env, bwd_bufs *b, const nsa_run *r, uint64_t seed);
/* Queries the workspace (allocated on first need, NaN-filled), poisons the
 * gradients, enqueues the backward on `queue` with b->grads and waits for it.
 * *got_event (if given) tells whether an event came back (a failed call must
 * return none). */
clnsa_status bwd_enqueue_wait(const test_env *env, cl_command_queue queue, bwd_bufs *b, const nsa_run *r,
                              bool *got_event);
/* Reads the gradients back (blocking on `queue`). */
void bwd_read(const test_env *env, cl_command_queue queue, bwd_bufs *b, const nsa_run *r);
/* The reference gradients, carried back through the case's compression. */
void bwd_reference(bwd_bufs *b, const nsa_run *r);
void bwd_free(bwd_bufs *b);
/* The backward on env's queue, asserting success and an event, and its
 * gradients read back. */
void bwd_run_device(const test_env *env, bwd_bufs *b, const nsa_run *r);
/* Asserts each gradient against the reference's: relative L2 within 5e-5
 * (f32) or 2e-2 (f16 / bf16); one that is zero in exact arithmetic (the
 * bias of the compressed keys, under the softmax's shift invariance) by
 * its largest absolute value instead: 1e-4 (f32), or 2e-2 of the largest
 * reference gradient value (f16 / bf16). */
void bwd_compare(const bwd_bufs *b, const nsa_case *c);

#endif
