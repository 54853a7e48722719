/* nsa.h: what the NSA host code shares between validation, compression,
 * top-k and the attention kernels. */
#ifndef CLNSA_OPS_NSA_H
#define CLNSA_OPS_NSA_H

#include "internal.h"
#include "tuning/tuning.h"

/* A validated NSA call: sizes, which branches and paths run. */
typedef struct {
    clnsa_nsa_config cfg; /* defaults resolved, scale set */
    int B, T, HQ, H, G, DK, DV, S;
    int N;       /* sequences with cu_seqlens, else 0 */
    bool varlen;
    clnsa_dtype dtype;
    bool has_cmp, has_slc, has_swa;
    bool cmp_given, linear, run_topk, need_cmp; /* need_cmp: compressed K/V are read */
    bool idx_long;
    int nc_rows; /* rows of the compressed tensors per batch row */
} nsa_problem;

/* Where the forward's scratch lives inside the caller's workspace (bytes). */
typedef struct {
    size_t cmp_off;    /* int32 [N+1], varlen only */
    size_t kc, vc;     /* compressed K/V in the storage dtype, unless given */
    size_t xg, w32, y; /* linear compression: gathered blocks, f32 weights, f32 result */
    size_t total;
} nsa_workspace;

clnsa_status nsa_validate(clnsa_context *ctx, const clnsa_nsa_config *cfg, const clnsa_nsa_inputs *in,
                          const clnsa_nsa_outputs *out, nsa_problem *pb);
clnsa_status nsa_plan_workspace(clnsa_context *ctx, cl_command_queue queue, const nsa_problem *pb,
                                nsa_workspace *ws);
/* "-DSTORAGE=.. -DIDX_LONG=.. -DVARLEN=.." for this problem. */
void nsa_base_defines(const nsa_problem *pb, char *buf, size_t size);

/* Views of the compressed K/V the kernels read: given, or in the workspace. */
void nsa_cmp_views(const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws,
                   const nsa_workspace *lay, clnsa_tensor *kc, clnsa_tensor *vc);

/* Enqueues the sequence offsets and the compression into the workspace.
 * Kernels are created and their arguments set before anything is enqueued. */
typedef struct nsa_compress_plan nsa_compress_plan;
clnsa_status nsa_compress_prepare(clnsa_context *ctx, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                                  cl_mem ws, const nsa_workspace *lay, nsa_compress_plan **plan);
clnsa_status nsa_compress_enqueue(clnsa_context *ctx, nsa_compress_plan *plan, cmd_chain *chain);
void nsa_compress_release(nsa_compress_plan *plan);

#endif
