/*
 * nsa_ref.h - plain C, double precision reference implementation of
 * DeepSeek's Native Sparse Attention (NSA), forward and backward.
 *
 * This is the oracle every OpenCL kernel of clnsa is checked against.  It is
 * written for clarity, not speed: every function is a direct transcription of
 * the semantics below, with O(T^2) loops and no tiling.
 *
 * ===========================================================================
 * Layout
 * ===========================================================================
 * All tensors are dense, row-major, in the natural layout [B, T, H, D]:
 *   q        [B, T, HQ, DK]         query heads, HQ = G * H
 *   k        [B, T, H,  DK]         key heads
 *   v        [B, T, H,  DV]         value heads (DK != DV is allowed)
 *   o, o_*   [B, T, HQ, DV]
 *   lse_*    [B, T, HQ]             natural-log log-sum-exp of the scores
 *   g_cmp, g_slc, g_swa [B, T, HQ]  gates
 *   k_cmp    [B, NC, H, DK]         compressed keys   (see "Compression")
 *   v_cmp    [B, NC, H, DV]         compressed values
 *   block_indices [B, T, H, S]      int, S = block_count
 *   block_counts  [B, T, H]         int
 * Query head hq belongs to KV head h = hq / G.
 * Index arithmetic is done in int64_t; ints are enough for the dimensions.
 *
 * ===========================================================================
 * Sequences
 * ===========================================================================
 * cu_seqlens == NULL: batch row b is one sequence of T tokens.
 * cu_seqlens != NULL ("varlen"): B must be 1, cu_seqlens has N+1 entries,
 *   cu_seqlens[0] == 0, non-decreasing, cu_seqlens[N] == T; sequence s is the
 *   tokens [cu[s], cu[s+1]) of the single batch row.  Lengths may be 0 or
 *   shorter than a block.
 * The "local position" of a token is its index minus the start of its
 * sequence.  Nothing ever crosses a sequence boundary.  All positions and
 * block indices below are local.
 *
 * ===========================================================================
 * Parameters (ref_nsa_shape)
 * ===========================================================================
 *   l' = block_size   selection block                     (default 64)
 *   S  = block_count  selected blocks per query           (default 16)
 *   l  = cmp_block    compression block  (<= 0 -> l')
 *   d  = cmp_stride   compression stride (<= 0 -> l')
 *   w  = window       sliding window; 0 = empty window (branch contributes 0)
 *   init_blocks       forced leading blocks               (default 1)
 *   local_blocks      forced blocks ending at the query's (default 2)
 *   scale             softmax scale (<= 0 -> 1/sqrt(DK))
 * ref_nsa_shape_init() fills in the defaults.
 *
 * ===========================================================================
 * 1. Compression
 * ===========================================================================
 * A sequence of length len has nc(len) = ceil(len / d) compressed tokens
 * (0 when len == 0).  Compressed token i covers the tokens at local positions
 * [i*d, i*d + l) that exist in the sequence.
 * Mean pooling: xc[i] = mean of the covered tokens, averaged over the REAL
 *   count (a block running past the sequence end is averaged over its real
 *   tokens only).
 * Linear: per KV head, x_i = concat_{j=0..l-1} (x[i*d + j] + pe[j]) (each a
 *   D vector; a token past the sequence end contributes a zero vector and NO
 *   pe), xc[i][c] = sum_r x_i[r] * W[r*D + c] + bias[c], W is [l*D, D],
 *   bias [D] or NULL, pe [l, D] or NULL.
 * Packing: without varlen NC = ceil(T/d) and xc is [B, NC, H, D].  With
 *   varlen B = 1 and the sequences' compressed tokens are concatenated in
 *   order: NC = sum_s nc(len_s), sequence s starts at row sum_{s'<s} nc(len_s').
 *
 * ===========================================================================
 * 2. Compressed attention (cmp)
 * ===========================================================================
 * Query at local position t sees compressed token i iff i*d + l - 1 <= t.
 * z_i = scale * q . k_cmp[i];  o_cmp = sum_i softmax(z)_i v_cmp[i];
 * lse_cmp = log sum_i exp(z_i).  Nothing visible: o_cmp = 0, lse = -inf.
 *
 * ===========================================================================
 * 3. Top-k block selection
 * ===========================================================================
 * Selection block j = local positions [j*l', (j+1)*l').  For query t the
 * candidates are blocks j = 0 .. tb, tb = floor(t / l').
 * P[i] = sum over the G query heads g of KV head h of exp(z_{g,i} - lse_cmp_g)
 *   for the compressed tokens i visible to t (P = 0 when none is visible).
 * importance[j] = sum of P[i] over visible i whose span [i*d, i*d + l)
 *   intersects [j*l', (j+1)*l')  (with l = d = l' simply P[j]).
 * Forced blocks: j < init_blocks, and tb - local_blocks < j <= tb.
 * S_eff = S, or clamp(block_counts[b,t,h], 0, S) when block_counts != NULL.
 * The row holds the first min(S_eff, tb + 1) candidates in this order:
 *   forced blocks first, by ascending index; then the others by importance
 *   descending, ties by ascending index.  (If there are more forced blocks
 *   than slots, the forced blocks with the lowest indices win.)
 * Remaining slots are -1.
 *
 * ===========================================================================
 * 4. Selected attention (slc)
 * ===========================================================================
 * Query t, head hq looks at row (b, t, h = hq/G) of block_indices and at its
 * first S_eff slots (S_eff as above; block_counts may be NULL).  A negative
 * index is unused; an index j > tb contributes nothing; duplicates count once.
 * The query attends to every key s <= t whose block s / l' is among those
 * slots (the union of the selected blocks, causally cut), in ascending order.
 * Empty set: o = 0, lse = -inf.
 *
 * ===========================================================================
 * 5. Sliding window (swa)
 * ===========================================================================
 * Query t attends to the keys s with t - w < s <= t.  w = 0: empty set.
 *
 * ===========================================================================
 * 6. Gated sum
 * ===========================================================================
 * o = g_cmp * o_cmp + g_slc * o_slc + g_swa * o_swa, gates broadcast over
 * DV; a NULL gate turns its branch off.
 *
 * ===========================================================================
 * Backward conventions
 * ===========================================================================
 * Every *_bwd function ACCUMULATES (+=) into its gradient outputs; the caller
 * zeroes them.  Any gradient output pointer may be NULL (not wanted).
 * Forward functions OVERWRITE their outputs.
 * There is no gradient through top-k: block indices are a constant input.
 * Gate gradients: dg_b[b,t,hq] = sum_c do[b,t,hq,c] * o_b[b,t,hq,c].
 * Temporaries are malloc'ed; an allocation failure aborts the process.
 * No function validates its shape: call ref_nsa_shape_check() first.
 */
#ifndef CLNSA_NSA_REF_H
#define CLNSA_NSA_REF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int B, T, HQ, H, DK, DV;
    const int *cu_seqlens; /* NULL, or N+1 host offsets (then B == 1) */
    int N;                 /* number of sequences when cu_seqlens != NULL */
    int block_size;        /* l'  selection block                       */
    int block_count;       /* S   selected blocks per query (row width)  */
    int cmp_block;         /* l   compression block,  <= 0 -> block_size */
    int cmp_stride;        /* d   compression stride, <= 0 -> block_size */
    int window;            /* w   sliding window, 0 = off (empty)        */
    int init_blocks;       /* forced leading blocks                      */
    int local_blocks;      /* forced blocks ending at the query's block  */
    double scale;          /* softmax scale, <= 0 -> 1/sqrt(DK)          */
} ref_nsa_shape;

/* One sequence: batch row b, tokens [start, start + len) of that row,
 * compressed rows [cstart, cstart + nc) of that row of k_cmp / v_cmp. */
typedef struct {
    int b, start, len, cstart, nc;
} ref_seq;

/* ---- shape helpers ------------------------------------------------------ */
/* Fill in sizes and defaults (block_size 64, block_count 16, cmp_block =
 * cmp_stride = 0 i.e. equal to block_size, window 0, init 1, local 2,
 * scale 1/sqrt(DK), no cu_seqlens). */
void   ref_nsa_shape_init(ref_nsa_shape *sh, int B, int T, int HQ, int H,
                          int DK, int DV);
/* 0 when the shape is consistent, otherwise a negative code. */
int    ref_nsa_shape_check(const ref_nsa_shape *sh);
int    ref_cmp_block(const ref_nsa_shape *sh);   /* effective l */
int    ref_cmp_stride(const ref_nsa_shape *sh);  /* effective d */
double ref_scale(const ref_nsa_shape *sh);       /* effective scale */
int    ref_num_cmp(int len, int stride);         /* ceil(len / stride) */
int    ref_total_cmp(const ref_nsa_shape *sh);   /* NC (rows per batch row) */
int    ref_num_seqs(const ref_nsa_shape *sh);    /* B, or N with varlen */
ref_seq ref_get_seq(const ref_nsa_shape *sh, int s);

/* ---- 1. compression ----------------------------------------------------- */
/* x [B,T,H,D] -> xc [B,NC,H,D] (overwritten). */
void ref_compress_mean(const ref_nsa_shape *sh, const double *x, int D,
                       double *xc);
/* dx[token] += dxc[i] / count_i for each compressed token i covering it. */
void ref_compress_mean_bwd(const ref_nsa_shape *sh, const double *dxc, int D,
                           double *dx);
/* W [l*D, D], bias [D] or NULL, pe [l, D] or NULL. */
void ref_compress_linear(const ref_nsa_shape *sh, const double *x, int D,
                         const double *W, const double *bias,
                         const double *pe, double *xc);
/* Accumulates dx [B,T,H,D], dW [l*D,D], dbias [D], dpe [l,D] (each may be
 * NULL).  pe is the same (possibly NULL) pe as in the forward. */
void ref_compress_linear_bwd(const ref_nsa_shape *sh, const double *x, int D,
                             const double *W, const double *pe,
                             const double *dxc, double *dx, double *dW,
                             double *dbias, double *dpe);

/* ---- 2. compressed attention -------------------------------------------- */
/* o [B,T,HQ,DV], lse [B,T,HQ] (lse may be NULL). */
void ref_cmp_fwd(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
                 const double *v_cmp, double *o, double *lse);
void ref_cmp_bwd(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
                 const double *v_cmp, const double *do_, double *dq,
                 double *dk_cmp, double *dv_cmp);

/* ---- 3. top-k ----------------------------------------------------------- */
/* The importance of the blocks 0 .. tb that position t of sequence s sees
 * (tb = t / block_size), for KV head h: imp[j] (+inf for forced blocks).
 * Returns tb + 1. */
int ref_block_importance(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
                         int s, int t, int h, double *imp);
/* block_indices [B,T,H,S] (overwritten); block_counts [B,T,H] or NULL. */
void ref_topk(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
              const int *block_counts, int *block_indices);

/* ---- 4. selected attention ---------------------------------------------- */
void ref_slc_fwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, const int *block_indices,
                 const int *block_counts, double *o, double *lse);
void ref_slc_bwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, const int *block_indices,
                 const int *block_counts, const double *do_, double *dq,
                 double *dk, double *dv);

/* ---- 5. sliding window -------------------------------------------------- */
void ref_swa_fwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, double *o, double *lse);
void ref_swa_bwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, const double *do_, double *dq, double *dk,
                 double *dv);

/* ---- 6. full NSA -------------------------------------------------------- */
typedef struct {
    const double *q, *k, *v;             /* required                        */
    const double *g_cmp, *g_slc, *g_swa; /* [B,T,HQ]; NULL = branch off     */
    const double *k_cmp, *v_cmp;         /* NULL = mean pooling of k / v    */
    const int *block_indices;            /* [B,T,H,S]; NULL = run ref_topk  */
    const int *block_counts;             /* [B,T,H];   NULL = S everywhere  */
} ref_nsa_inputs;

typedef struct {
    double *o;                           /* [B,T,HQ,DV] required            */
    double *o_cmp, *o_slc, *o_swa;       /* optional, ungated branch outputs */
    double *lse_cmp, *lse_slc, *lse_swa; /* optional [B,T,HQ]               */
    int *block_indices;                  /* optional [B,T,H,S]: indices used */
} ref_nsa_outputs;

typedef struct {
    double *dq, *dk, *dv;                /* accumulated, may be NULL         */
    double *dg_cmp, *dg_slc, *dg_swa;    /* accumulated, may be NULL         */
    double *dk_cmp, *dv_cmp;             /* [B,NC,H,D]: receive the gradient
                                            when in->k_cmp / in->v_cmp were
                                            given (else it flows into dk/dv
                                            through mean pooling)           */
} ref_nsa_grads;

/* The forward computes k_cmp/v_cmp (mean pooling unless given), the block
 * indices (ref_topk on q and k_cmp unless given), all three branches, and
 * the gated sum.  The backward recomputes the forward and accumulates. */
void ref_nsa_fwd(const ref_nsa_shape *sh, const ref_nsa_inputs *in,
                 const ref_nsa_outputs *out);
void ref_nsa_bwd(const ref_nsa_shape *sh, const ref_nsa_inputs *in,
                 const double *do_, const ref_nsa_grads *grads);

/* calloc for the reference's temporaries (n or size 0 allocates one byte);
 * out of memory, it prints a message and aborts (see the header's top). */
void *ref_xcalloc(size_t n, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* CLNSA_NSA_REF_H */
