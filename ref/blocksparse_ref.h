/*
 * blocksparse_ref.h - plain C, double precision reference of clnsa's
 * block-sparse attention, forward and backward, and of its block-mask
 * builders. Dense O(Tq*Tk) loops written from the definitions in clnsa.h,
 * for clarity, not speed: the oracle the OpenCL kernels are checked against.
 *
 * Layout: dense row-major tensors
 *   q [B, Tq, HQ, D], k [B, Tk, H, D], v [B, Tk, H, DV], o [B, Tq, HQ, DV],
 *   lse [B, Tq, HQ]; query head hq reads KV head hq / (HQ / H).
 * Visibility of key j to query i (batch b, head hq): all of
 *   mask[b', h', i / q_block, j / kv_block] != 0 (when mask != NULL; b' = b
 *     when mask_b > 1 else 0, h' likewise),
 *   causal: pos_k[j] <= pos_q[i],
 *   window_left >= 0: pos_k[j] >= pos_q[i] - window_left,
 *   window_right >= 0: pos_k[j] <= pos_q[i] + window_right,
 *   seg_q != NULL: seg_q[i] == seg_k[j] >= 0,
 * with pos_q[i] = i + Tk - Tq and pos_k[j] = j unless given ([B, Tq], [B, Tk]).
 * z_ij = scale q_i . k_j, or softcap * tanh(scale q_i . k_j / softcap);
 * p_ij = exp(z_ij - lse_i), lse_i = log(sum_j exp(z_ij) [+ exp(sink_hq)]);
 * o_i = sum_j p_ij v_j. A row with nothing visible: o = 0, lse = -inf (or
 * the sink).
 * Backward of L with dL/do = do: dq, dk, dv, dsinks are ACCUMULATED (+=);
 * any may be NULL. dsink_hq = -sum_{b,i} exp(sink - lse_i) sum_d o_id do_id.
 */
#ifndef CLNSA_BLOCKSPARSE_REF_H
#define CLNSA_BLOCKSPARSE_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int B, Tq, Tk, HQ, H, D, DV;
    double scale;                    /* <= 0 -> 1/sqrt(D) */
    double softcap;                  /* 0 = off */
    int causal;                      /* 0 or 1 */
    int window_left, window_right;   /* -1 = unbounded */
    const int *pos_q, *pos_k;        /* [B, Tq], [B, Tk] or NULL (defaults) */
    const int *seg_q, *seg_k;        /* [B, Tq], [B, Tk] or NULL (both or neither) */
    const double *sinks;             /* [HQ] or NULL */
    const int *mask;                 /* [mask_b, mask_h, NQB, NKB] or NULL */
    int mask_b, mask_h;              /* 1 (shared) or B / HQ */
    int q_block, kv_block;           /* mask units */
} ref_bs_problem;

/* Sizes and defaults: scale 1/sqrt(D), no soft cap, not causal, unbounded
 * window, no positions, segments, sinks or mask, blocks of 64. */
void ref_bs_problem_init(ref_bs_problem *p, int B, int Tq, int Tk, int HQ, int H, int D, int DV);
int ref_bs_visible(const ref_bs_problem *p, int b, int hq, int i, int j);
void ref_bs_fwd(const ref_bs_problem *p, const double *q, const double *k, const double *v, double *o,
                double *lse);
void ref_bs_bwd(const ref_bs_problem *p, const double *q, const double *k, const double *v, const double *do_,
                double *dq, double *dk, double *dv, double *dsinks);

/* Block-mask builders (clnsa.h's clnsa_block_mask_kind values 0..5), for one
 * batch row: out [NQB * NKB] = 0/1, NQB = ceil(Tq/q_block), NKB =
 * ceil(Tk/kv_block). seg_q [Tq] and seg_k [Tk] for kind 5 (SEGMENT). Each is
 * evaluated from its token-level definition by brute force. */
enum { REF_MASK_ALL, REF_MASK_CAUSAL, REF_MASK_WINDOW, REF_MASK_STRIDED, REF_MASK_GLOBAL, REF_MASK_SEGMENT };
void ref_bs_block_mask(int kind, int Tq, int Tk, int q_block, int kv_block, int window_left, int window_right,
                       int stride, int global_tokens, const int *seg_q, const int *seg_k, int *out);

#ifdef __cplusplus
}
#endif

#endif
