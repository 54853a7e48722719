/*
 * nsa_ranges.h: which keys a query sees in each NSA branch, as contiguous
 * ranges, for the per-query kernels (forward, backward prologue, dq). The
 * per-key kernels of the backward use the inverse rules (nsa_bwd_dkdv.cl).
 *
 * Defines: BS, S, CMP_L, CMP_D, WINDOW, VARLEN, HAS_COUNTS, INIT_BLOCKS,
 * LOCAL_BLOCKS.
 */

/* The leading arguments of every per-query kernel (nsa_fwd, nsa_bwd_dq), in
 * the order nsa_plan_query_kernel() sets them: q, k, v, the compressed K/V
 * and their row count, the gates, the sequences, the selection (written by
 * a forward that runs the top-k itself: FUSED_TOPK). */
#if FUSED_TOPK
#define BIDX_CONST
#else
#define BIDX_CONST const
#endif
#define NSA_QUERY_ARGS                                                                    \
    __global const store_t *q, idx_t q_off, idx4_t q_st, __global const store_t *k,       \
        idx_t k_off, idx4_t k_st, __global const store_t *v, idx_t v_off, idx4_t v_st,    \
        __global const store_t *kc, idx_t kc_off, idx4_t kc_st, __global const store_t *vc, \
        idx_t vc_off, idx4_t vc_st, int nc_rows, __global const store_t *g_cmp,           \
        idx_t gc_off, idx4_t gc_st, __global const store_t *g_slc, idx_t gs_off,          \
        idx4_t gs_st, __global const store_t *g_swa, idx_t gw_off, idx4_t gw_st,          \
        __global const int *cu, idx_t cu0, int nseq, __global const int *cmp_off,         \
        idx_t cmp_off0, __global BIDX_CONST int *bidx, idx_t bi_off, idx4_t bi_st,        \
        __global const int *bcnt, idx_t bc_off, idx4_t bc_st

/* nsa_fwd's arguments after NSA_QUERY_ARGS (nsa_fwd.cl, nsa_fwd_warp.cl):
 * o (dout in the prologue), the lse (D_b in the prologue), and with
 * BWD_PRE the gate gradients, else the optional ungated branch outputs
 * saved for the backward (o_cmp, o_slc, o_swa; NULL: not saved). */
#if BWD_PRE
#define NSA_FWD_OUT_ARGS                                                                                   \
    __global const store_t *o, idx_t o_off, idx4_t o_st, __global float *lse_cmp, idx_t lc_off, idx4_t lc_st, \
        __global float *lse_slc, idx_t ls_off, idx4_t ls_st, __global float *lse_swa, idx_t lw_off,          \
        idx4_t lw_st, int T, float scale, __global store_t *dg_cmp, idx_t dc_off, idx4_t dc_st,            \
        __global store_t *dg_slc, idx_t ds_off, idx4_t ds_st, __global store_t *dg_swa, idx_t dw_off,       \
        idx4_t dw_st
#else
#define NSA_FWD_OUT_ARGS                                                                                   \
    __global store_t *o, idx_t o_off, idx4_t o_st, __global float *lse_cmp, idx_t lc_off, idx4_t lc_st,     \
        __global float *lse_slc, idx_t ls_off, idx4_t ls_st, __global float *lse_swa, idx_t lw_off,          \
        idx4_t lw_st, int T, float scale, __global store_t *o_cmp, idx_t oc_off, idx4_t oc_st,               \
        __global store_t *o_slc, idx_t os_off, idx4_t os_st, __global store_t *o_swa, idx_t ow_off,          \
        idx4_t ow_st
#endif

/* nsa_bwd_dq's arguments after NSA_QUERY_ARGS (nsa_bwd_dq.cl,
 * nsa_bwd_dq_warp.cl): dout, each branch's lse and D, dq. */
#define NSA_DQ_OUT_ARGS                                                                                    \
    __global const store_t *dout, idx_t do_off, idx4_t do_st, __global const float *lse_cmp, idx_t lc_off,   \
        idx4_t lc_st, __global const float *lse_slc, idx_t ls_off, idx4_t ls_st,                            \
        __global const float *lse_swa, idx_t lw_off, idx4_t lw_st, __global const float *d_cmp,             \
        idx_t xc_off, idx4_t xc_st, __global const float *d_slc, idx_t xs_off, idx4_t xs_st,                \
        __global const float *d_swa, idx_t xw_off, idx4_t xw_st, __global store_t *dq_out, idx_t dq_off,    \
        idx4_t dq_st, int T, float scale

/* Compressed: the first cmp_visible() rows of the sequence's compressed
 * tensor (row0 .. row0 + n - 1), clipped to the rows that exist. */
inline int cmp_visible(int tl, bool live, int nc_rows, int row0)
{
    int n = live && tl >= CMP_L - 1 ? (tl - (CMP_L - 1)) / CMP_D + 1 : 0;
    return clamp(nc_rows - row0, 0, n);
}

inline int cmp_row0(__global const int *cmp_off, seq_info sq)
{
#if VARLEN
    return cmp_off[sq.id];
#else
    (void)cmp_off; (void)sq;
    return 0;
#endif
}

/* Selection: block j's keys seen by the query at local position tl, as
 * keys (x) .. x + y - 1 (local positions). An unused (negative) or future
 * block gives y = 0, so no index reads out of bounds. (Returned by value:
 * PoCL 3.1 mishandles private variables whose address is taken in code
 * that spans barriers.) */
inline int2 slc_block_keys(int j, int tl)
{
    const bool skip = j < 0 || j > tl / BS;
    const int key0 = skip ? 0 : j * BS;
    return (int2)(key0, skip ? 0 : min(BS, tl + 1 - key0));
}

/* Slot s of the row at bidx[row], as slc_block_keys gives its block; a
 * repeat of an earlier slot's block gives y = 0, so a duplicate counts
 * once. */
inline int2 slc_slot(__global const int *bidx, idx_t row, idx_t slot_stride, int s, int tl)
{
    const int j = bidx[row + (idx_t)s * slot_stride];
    bool dup = false;
    for (int e = 0; e < s; ++e) dup = dup || (bidx[row + (idx_t)e * slot_stride] == j);
    return slc_block_keys(dup ? -1 : j, tl);
}

/* The forced blocks of a query in block cur: the initial ones and the
 * local ones (the top-k scores them +inf, whatever their importance). */
inline bool block_forced(int j, int cur) { return j < INIT_BLOCKS || j > cur - LOCAL_BLOCKS; }

#ifdef WARP_SCRATCH
/* The warp kernels (warp_mma.h) read a row's S <= 32 slots at once, slot s
 * in lane s, and drop repeats by shuffles, where slc_slot reads the s
 * earlier slots again for slot s, one load after another (the selected
 * forward given indices: 1.3% at 8k on the H100, 0.6% at 64k). The lane's
 * block (slc_lane_block: lane s < n, slot s's, -1 where slc_slot gives no
 * keys; unread, -1, without SLC_LANES) then gives slot s's keys, on every
 * lane (slc_slot_warp). */
#ifndef SLC_LANES
#define SLC_LANES (S <= WARP)
#endif
/* In the stage of span k of a bitonic sort over the warp's lanes, at the
 * step with lane ^ s: whether the lane keeps the earlier of the two (the
 * better entry of nsa_topk_list.h's list; the lower block here). */
inline bool bitonic_keeps_first(int lane, int k, int s) { return ((lane & s) == 0) == ((lane & k) == 0); }

/* The lanes' blocks (-1: none) in ascending order, lane i the i-th, the
 * -1 after the others: a bitonic sort over the warp, 15 steps of one
 * shuffle. */
inline int lanes_ascending(int j, __local uint *ws)
{
    const int lane = lane_id();
    int key = j < 0 ? INT_MAX : j;
    for (int k = 2; k <= WARP; k <<= 1)
        for (int s = k >> 1; s > 0; s >>= 1) {
            const int other = as_int(shfl_xor(as_float(key), s, ws));
            key = bitonic_keeps_first(lane, k, s) ? min(key, other) : max(key, other);
        }
    return key == INT_MAX ? -1 : key;
}

inline int slc_lane_block(__global const int *bidx, idx_t row, idx_t slot_stride, int n, int tl, __local uint *ws)
{
#if SLC_LANES
    const int s = lane_id();
    const int j = s < n ? bidx[row + (idx_t)s * slot_stride] : -1;
    const bool use = j >= 0 && j <= tl / BS;
    const bool repeat = lower_lane_holds(use ? (uint)j : UINT_MAX, n, ws); /* by every lane: it shuffles */
    return use && !repeat ? j : -1;
#else
    (void)bidx; (void)row; (void)slot_stride; (void)n; (void)tl; (void)ws;
    return -1;
#endif
}

/* Slot s's keys from the lanes' blocks jl (lane s: slot s's), on every
 * lane. */
inline int2 slc_lane_keys(int jl, int s, int tl, __local uint *ws)
{
    return slc_block_keys(as_int(shfl_idx(as_float(jl), s, ws)), tl);
}

inline int2 slc_slot_warp(int jl, __global const int *bidx, idx_t row, idx_t slot_stride, int s, int tl,
                          __local uint *ws)
{
#if SLC_LANES
    (void)bidx; (void)row; (void)slot_stride;
    return slc_lane_keys(jl, s, tl, ws);
#else
    (void)jl; (void)ws;
    return slc_slot(bidx, row, slot_stride, s, tl);
#endif
}
#endif

/* The selected branch's dS kept for dq (DS_KEEP: nsa_bwd_dkdv_warp.cl
 * writes it, nsa_bwd_dq_warp.cl reads it): per (batch, token, KV head,
 * slot) the dS of the G heads and the block's KSP keys (BS rounded up to
 * 16; zeros past the block's end), in the storage type, laid out as dk/dv's
 * fragments give it:
 *   DS_BY_KEY (G a multiple of 16, so that a 16-row k-step of dk/dv's
 *     query rows is 16 heads of one token): [KSP][G], a key's heads of each
 *     16 in the order 0, 1, 8, 9, 2, 3, 10, 11, ..., so that a lane stores
 *     the words of two fragments as one 8-byte word, and a key's 16 heads
 *     are 32 contiguous bytes;
 *   else [G][KSP], a head's keys of each 16 in that order (the fragments
 *     transposed first).
 * dq transposes what DS_BY_KEY stores (mat8_trans) as it loads it. */
#define DS_BY_KEY (G % 16 == 0)
#ifndef DS_KEEP
#define DS_KEEP 0
#endif
#if DS_KEEP
#define DQ_DS_ARGS , __global const store_t *ds, long ds0
#else
#define DQ_DS_ARGS
#endif

#if DS_KEEP
/* Where the dS of key `key` and head `head` lies in a kept region (the
 * portable kernels, which read and write it one element at a time): the
 * fragments' order within each 16, 0, 1, 8, 9, 2, 3, 10, 11, ..., is
 * position 4 (i / 2) + i % 2 for i < 8, that + 2 for i - 8. */
inline int ds_order16(int i) { return 4 * ((i & 7) >> 1) + (i & 1) + (i >= 8 ? 2 : 0); }
inline int ds_elem(int key, int head)
{
    return DS_BY_KEY ? key * G + (head & ~15) + ds_order16(head & 15) : head * KSP + (key & ~15) + ds_order16(key & 15);
}

/* The first element of the kept dS region of (batch, token, KV head, slot). */
inline long ds_slot_region(int b, int t, int h, int H, int T, int slot)
{
    return ((((long)b * T + t) * H + h) * S + slot) * G * KSP;
}
#endif

/* The compressed branch's dS kept for dq (DSC_KEEP: the compressed dk/dv
 * pass writes it, dq reads it): per (batch, KV head) the tokens in order,
 * token tl holding the G heads' dS over its visible compressed keys rounded
 * up to 16 (dsc_keys, zeros past them), laid out as DS_BY_KEY says for the
 * selected branch ([keys][G] or [G][keys]). Unclamped, so that a region's
 * place depends on the token alone; batches without varlen only (the
 * compressed dk/dv tiles cross sequences). B*H*dsc_keys_before(T)*G
 * elements, quadratic in T: 4.4 GB at T = 64k, HQ = 64, strides of 64, bf16. */
inline int dsc_keys(int tl) { return tl >= CMP_L - 1 ? 16 * ((tl - (CMP_L - 1)) / (16 * CMP_D) + 1) : 0; }

/* The keys the tokens before tl hold: the sum of dsc_keys(u) over u < tl,
 * 16 (m + E q(q-1)/2 + q r) for the m = qE + r tokens from CMP_L - 1 on,
 * E = 16 CMP_D. */
inline long dsc_keys_before(int tl)
{
    const long m = max(0, tl - (CMP_L - 1)), e = 16L * CMP_D, q = m / e, r = m - q * e;
    return 16 * (m + e * q * (q - 1) / 2 + q * r);
}

/* Where token t's region starts, in keys (of G elements) from the first. */
inline long dsc_region(int b, int h, int H, int T, int t)
{
    return (long)(b * H + h) * dsc_keys_before(T) + dsc_keys_before(t);
}

inline int slc_slots(__global const int *bcnt, idx_t cnt_at, bool live)
{
#if HAS_COUNTS
    return live ? clamp(bcnt[cnt_at], 0, S) : 0;
#else
    (void)bcnt; (void)cnt_at;
    return live ? S : 0;
#endif
}

/* Sliding window: keys t - WINDOW < s <= t. */
inline int swa_key0(int tl) { return max(0, tl - WINDOW + 1); }

/* Top-k scoring (nsa_topk.cl, nsa_topk_warp.cl): the compressed keys [x, y)
 * whose spans [i*CMP_D, i*CMP_D + CMP_L) meet selection blocks j0 .. j1-1,
 * of the nvis visible ones. */
inline int2 cmp_keys_of_blocks(int j0, int j1, int nvis)
{
    const int lo_tok = j0 * BS - (CMP_L - 1);
    const int lo = lo_tok > 0 ? ceil_div(lo_tok, CMP_D) : 0;
    const int hi = min(nvis, (j1 * BS - 1) / CMP_D + 1);
    return (int2)(lo, max(lo, hi));
}

/* Block j's importance: the summed probabilities pc[i - i_lo] of the
 * compressed keys overlapping it (pc holds keys i_lo .. i_hi-1); +inf for
 * the forced initial and local blocks (cur: the query's own block). */
inline float block_score(__local const float *pc, int i_lo, int i_hi, int j, int cur)
{
    if (block_forced(j, cur)) return INFINITY;
    const int2 r = cmp_keys_of_blocks(j, j + 1, i_hi);
    float score = 0.0f;
    for (int i = max(i_lo, r.x); i < r.y; ++i) score += pc[i - i_lo];
    return score;
}

/* Inserts (score, j) into the sorted top-S list unless it is not better
 * than the last entry; equal scores keep the earlier (lower) block first. */
inline void topk_insert(__local float *tv, __local int *ti, float score, int j)
{
    if (!(score > tv[S - 1])) return;
    int p = S - 1;
    while (p > 0 && score > tv[p - 1]) {
        tv[p] = tv[p - 1];
        ti[p] = ti[p - 1];
        --p;
    }
    tv[p] = score;
    ti[p] = j;
}

/* How many of the list's entries a row keeps: its block_counts entry
 * clamped to [0, S], else S. */
inline int topk_nsel(__global const int *bcnt, idx_t cnt_at)
{
#if HAS_COUNTS
    return clamp(bcnt[cnt_at], 0, S);
#else
    (void)bcnt; (void)cnt_at;
    return S;
#endif
}

/* Writes the list's first block_counts (or S) entries as the row's
 * selection, -1 for the rest and for unfilled entries; work-item i of n
 * writes slots i, i+n, ... */
inline void topk_store(__local const float *tv, __local const int *ti, __global const int *bcnt, idx_t cnt_at,
                       __global int *bidx, idx_t row, idx_t slot_stride, int i, int n)
{
    const int nsel = topk_nsel(bcnt, cnt_at);
    for (int s = i; s < S; s += n) bidx[row + (idx_t)s * slot_stride] = (s < nsel && tv[s] > -INFINITY) ? ti[s] : -1;
}
