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
    bool saved_branches; /* backward: the forward saved every branch's output (o_cmp ...) */
    warp_mode warp; /* the tensor-core path's warp kernels, or WARP_OFF (nsa_validate) */
    /* forward: the warp kernel runs the top-k itself (nsa_fwd_warp.cl's
     * FUSED_TOPK) with top-k chunks of topk_jb blocks, topk_pc_max floats */
    bool fused_topk;
    int topk_jb;
    int64_t topk_pc_max;
    /* forward: where the warp kernel stages V and does not run the top-k,
     * its compressed branch reads its rows from a tile the work-group
     * shares (warp_attn.h's CMP_TILE) */
    bool cmp_tile;
    /* forward: the compressed branch's output, ungated, is on entry in o
     * (PARTIAL_IN_O) or in the caller's o_cmp (PARTIAL_IN_O_CMP), and the
     * warp kernel adds it times g_cmp (ADD_PARTIAL: the split forward's
     * second half, nsa_fwd.c); write_partial: the kernel is the first half
     * on the warp kernels and writes it (WRITE_PARTIAL) */
    enum { PARTIAL_NONE, PARTIAL_IN_O, PARTIAL_IN_O_CMP } add_partial;
    bool write_partial;
    /* backward: the selected (ds_keep) and compressed (dsc_keep) dk/dv
     * passes keep dS for dq (DS_KEEP, DSC_KEEP, nsa_bwd.c) */
    bool ds_keep, dsc_keep;
} nsa_problem;

/* Whether the forward's warp kernel can run the top-k itself at this group
 * and selection size (FUSED_TOPK: one head tile, the list in registers);
 * the forward also needs the compressed branch on, and the local memory
 * (src/ops/nsa_fwd.c, choose_fused_topk). `clnsa tune` skips the fused
 * family where this says no. */
static inline bool nsa_topk_fuses(int G, int S) { return G <= 16 && S <= 32; }

/* DS_KEEP's row of a (token, head, slot): the block's keys, rounded up to
 * whole 16-key steps. */
static inline int nsa_ds_row(const nsa_problem *pb) { return (pb->cfg.block_size + 15) / 16 * 16; }

/* DSC_KEEP's keys of the tokens before tl (cl/nsa_ranges.h's
 * dsc_keys_before, the same sum). */
static inline int64_t nsa_dsc_keys_before(const nsa_problem *pb, int tl)
{
    const int64_t m = tl - (pb->cfg.cmp_block - 1) > 0 ? tl - (pb->cfg.cmp_block - 1) : 0;
    const int64_t e = 16 * (int64_t)pb->cfg.cmp_stride, q = m / e, r = m - q * e;
    return 16 * (m + e * q * (q - 1) / 2 + q * r);
}

/* Bytes of an element of the storage dtype. */
static inline size_t nsa_elem_bytes(const nsa_problem *pb) { return pb->dtype == CLNSA_DTYPE_F32 ? 4 : 2; }

/* Where the forward's scratch lives inside the caller's workspace (bytes). */
typedef struct {
    size_t cmp_off;    /* int32 [N+1], varlen only */
    size_t kc, vc;     /* compressed K/V in the storage dtype, unless given */
    size_t xg, w32, y; /* linear compression: gathered blocks, f32 weights, f32 result */
    size_t cmp_tiles;  /* nsa_cmp_topk_wgmma.cl's image of the compressed K/V (nsa_cmp_tiles_bytes) */
    size_t total;
} nsa_workspace;

/* The tuning key of a call (src/tuning): its shape class and top-k's sizes. */
static inline tune_problem nsa_tune_problem(const nsa_problem *pb)
{
    tune_problem t = {.dk = pb->DK, .dv = pb->DV, .g = pb->G, .block = pb->cfg.block_size, .dtype = pb->dtype, .S = pb->S,
                      .cmp_block = pb->cfg.cmp_block, .cmp_stride = pb->cfg.cmp_stride,
                      .warp_emulated = pb->warp == WARP_EMULATED, .fused_jb = pb->fused_topk ? pb->topk_jb : 0,
                      .slc = pb->has_slc, .swa = pb->has_swa, .branches = pb->has_cmp + pb->has_slc + pb->has_swa, .cmp_tile = pb->cmp_tile};
    return t;
}

/* Whether the forward's compressed branch may read a work-group's tile
 * (nsa_problem's cmp_tile); CLNSA_CMP_TILE=0 keeps each warp reading its
 * own rows (for comparisons). */
static inline bool nsa_cmp_tile_on(void) { return cx_env_int("CLNSA_CMP_TILE", 1) != 0; }

/* Bytes of the image of the compressed K/V that nsa_cmp_topk_wgmma.cl's
 * rings copy from, where the forward may run that kernel (its device and
 * shapes); else 0. */
size_t nsa_cmp_tiles_bytes(const clnsa_context *ctx, const nsa_problem *pb);

/* saved: `out` is what the forward saved, read by the backward. */
clnsa_status nsa_validate(clnsa_context *ctx, const clnsa_nsa_config *cfg, const clnsa_nsa_inputs *in,
                          const clnsa_nsa_outputs *out, bool saved, nsa_problem *pb);
/* forward: the layout of the forward itself, which also holds the regions
 * only the forward reads (cmp_tiles); else the regions the backward shares. */
clnsa_status nsa_plan_workspace(clnsa_context *ctx, cl_command_queue queue, const nsa_problem *pb, bool forward,
                                nsa_workspace *ws);
/* "-DSTORAGE=.. -DIDX_LONG=.. -DVARLEN=.." for this problem. */
void nsa_base_defines(const nsa_problem *pb, char *buf, size_t size);

/* Views of the compressed K/V the kernels read: given, or in the workspace. */
void nsa_cmp_views(const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws,
                   const nsa_workspace *lay, clnsa_tensor *kc, clnsa_tensor *vc);

/* Steps that build the compressed K/V (and the sequence offsets) into the
 * workspace: mean pooling or linear compression; nothing when given. */
clnsa_status nsa_plan_compress(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                               cl_mem ws, const nsa_workspace *lay);
clnsa_status nsa_compress_program(clnsa_context *ctx, const nsa_problem *pb, cl_program *prog);
/* seq_offsets: per sequence, the sum of ceil(len/stride) before it. */
clnsa_status nsa_plan_offsets(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                              const clnsa_nsa_inputs *in, cl_mem ws, size_t off_bytes, int stride);
/* linear_prepare + linear_gather: f32 weights at lay->w32, the bias in C
 * (element offset c_off), the gathered blocks at lay->xg. */
clnsa_status nsa_plan_linear_inputs(clnsa_context *ctx, op_plan *p, cl_program prog, const nsa_problem *pb,
                                    const clnsa_nsa_inputs *in, cl_mem ws, const nsa_workspace *lay,
                                    const clnsa_tensor *x, const clnsa_tensor *w, const clnsa_tensor *bias,
                                    const clnsa_tensor *pe, size_t c_off, int D);
/* cu_seqlens, N, and an offsets array (element offset off_bytes/4 of ws). */
void nsa_seq_args(kargs *a, const nsa_problem *pb, const clnsa_nsa_inputs *in, cl_mem ws, size_t off_bytes);

/* The files of nsa_fwd.cl's program (the forward, and the backward prologue). */
extern const char *const nsa_fwd_files[];

/* The defines every per-query NSA kernel takes (dims, branches, blocks). */
void nsa_branch_defines(const nsa_problem *pb, const clnsa_nsa_inputs *in, char *buf, size_t size);
/* Builds a per-query kernel (nsa_fwd, or nsa_bwd_dq) as the next plan step
 * and sets its leading arguments, q .. block_counts; the caller adds the
 * mode's own. files: the portable kernel's (the warp path has its own);
 * acc_dim: the head dim of the per-row accumulator; stored: the per-row
 * output the kernel writes (o, dq; NULL for none); saves_aligned: the
 * forward's saved branch outputs (if any) have aligned rows. */
clnsa_status nsa_plan_query_kernel(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                                   const char *const *files, const char *name, attn_kind kind, int acc_dim,
                                   const clnsa_tensor *stored, bool saves_aligned, const clnsa_tensor *kc,
                                   const clnsa_tensor *vc, const clnsa_tensor *bidx, cl_mem ws, const nsa_workspace *lay,
                                   kargs *a);
/* An int32 array: its buffer (NULL: none) and the offset of its first
 * element, in elements. */
typedef struct {
    cl_mem mem;
    int64_t off;
} int_array;

/* The inverse of the selection (nsa_select_index.c). */
typedef struct {
    const clnsa_tensor *bidx, *bcnt; /* block_indices [B, T, H, S]; block_counts (no data: none) */
    int_array cu, blk_off;           /* cu_seqlens and each sequence's first block (varlen, else none) */
    int nseq;
    int_array cnt;       /* count words, [B, H, nblk, nchunk] */
    int_array lst_start; /* out: [B, H, nblk + 1], where each block's list starts */
    int_array lst;       /* out: [B, H, T * S], the lists */
    int B, T, H, nblk, chunk, nchunk; /* nchunk = ceil(T / chunk) chunks of tokens */
    size_t wg;                        /* work-items a chunk */
    bool idx_long;
} select_index_args;

/* The four steps that fill lst_start and lst, each block's list in token
 * order; defines: nsa_base_defines' and BS, S, HAS_COUNTS (nsa_ranges.h). */
clnsa_status nsa_plan_select_index(clnsa_context *ctx, op_plan *p, const char *defines, const select_index_args *x);

clnsa_status nsa_check_workspace(clnsa_context *ctx, const nsa_workspace *lay, cl_mem ws, size_t ws_bytes);

#endif
