/*
 * blocksparse.h: device helpers shared by the block-sparse kernels (layout
 * building, forward, backward): the tile classification and the element rule.
 *
 * Tile statistics: 5 ints per tile of query (or key) tokens [r0, r1):
 *   [0] min position, [1] max position,
 *   [2] min segment id >= 0, [3] max segment id >= 0 (INT_MAX, INT_MIN when
 *       no token of the tile has one; 0, 0 without segment ids),
 *   [4] 1 when every token of the tile has one same segment id >= 0.
 * A tile pair is EMPTY when no (i, j) of it can be visible, FULL when every
 * (i, j) of it is visible (the kernels then check nothing per element), and
 * PARTIAL otherwise. EMPTY and FULL are only claimed when certain.
 */

#define BS_EMPTY 0
#define BS_PARTIAL 1
#define BS_FULL 2
#define BS_STATS 5

/* Element offset of [b, t] in a [B, T] int view (positions, segment ids). */
inline idx_t bs_at2(idx_t off, idx4_t st, int b, int t) { return off + (idx_t)b * st.x + (idx_t)t * st.y; }

/* The class of the tile pair: query tokens [r0, r1), key tokens [c0, c1)
 * (both non-empty), with their statistics `qs` and `ks`. The block mask
 * (absent when map is NULL) is read at blocks of QB x KB tokens from mbase
 * with strides msq, msk. causal / wl / wr / has_seg are the call's rules. */
inline int bs_classify(__global const int *qs, __global const int *ks, int causal, int wl, int wr, int has_seg,
                       __global const int *map, idx_t mbase, idx_t msq, idx_t msk, int QB, int KB, int r0,
                       int r1, int c0, int c1)
{
    const long qmin = qs[0], qmax = qs[1], kmin = ks[0], kmax = ks[1];
    bool all = true, none = false;
    if (causal) {
        all = all && kmax <= qmin;
        none = none || kmin > qmax;
    }
    if (wl >= 0) {
        all = all && kmin >= qmax - wl;
        none = none || kmax < qmin - wl;
    }
    if (wr >= 0) {
        all = all && kmax <= qmin + wr;
        none = none || kmin > qmax + wr;
    }
    if (has_seg) {
        const int q0 = qs[2], q1 = qs[3], k0 = ks[2], k1 = ks[3];
        none = none || q0 > q1 || k0 > k1 || q1 < k0 || k1 < q0;
        all = all && qs[4] && ks[4] && q0 == k0;
    }
    if (map && !none) {
        bool any = false, every = true;
        for (int qb = r0 / QB; qb <= (r1 - 1) / QB; ++qb)
            for (int kb = c0 / KB; kb <= (c1 - 1) / KB; ++kb) {
                const bool on = map[mbase + (idx_t)qb * msq + (idx_t)kb * msk] != 0;
                any = any || on;
                every = every && on;
            }
        none = !any;
        all = all && every;
    }
    return none ? BS_EMPTY : all ? BS_FULL : BS_PARTIAL;
}

/* The element rule of the attention kernels, for a PARTIAL tile: positions
 * pq, pk, segment ids sq, sk (ignored unless has_seg), and the block-mask
 * bit. CAUSAL and WINDOW are build-time switches; wl, wr (-1 = unbounded)
 * the window. */
inline bool bs_visible(int pq, int sq, int pk, int sk, int wl, int wr, int has_seg, bool map_on)
{
    bool ok = map_on;
#if CAUSAL
    ok = ok && pk <= pq;
#endif
#if WINDOW
    ok = ok && (wl < 0 || (long)pk >= (long)pq - wl) && (wr < 0 || (long)pk <= (long)pq + wr);
#else
    (void)wl;
    (void)wr;
#endif
    ok = ok && (!has_seg || (sq == sk && sq >= 0));
    return ok;
}

/* The block-mask bit of tokens (i, j), or true without a mask. */
inline bool bs_map_on(__global const int *map, idx_t mbase, idx_t msq, idx_t msk, int QB, int KB, int i, int j)
{
    return !map || map[mbase + (idx_t)(i / QB) * msq + (idx_t)(j / KB) * msk] != 0;
}

/* Score of a dot product: scale, then the soft cap when on. *dcap receives
 * dz/du (1 - tanh^2), which the backward needs. */
inline float bs_score(float dot, float scale, float softcap, float *dcap)
{
    float u = dot * scale;
#if SOFTCAP
    float t = tanh(u / softcap);
    *dcap = 1.0f - t * t;
    return softcap * t;
#else
    (void)softcap;
    *dcap = 1.0f;
    return u;
#endif
}

/* A row's layout entry: where its tiles start in the columns array, how many
 * are full (listed first) and how many in all. Values are clamped so that a
 * damaged layout gives wrong results, never an out-of-bounds read. */
inline int bs_row_span(__global const int *off, __global const int *full, int row, int cap, int *start, int *nfull)
{
    int s = clamp(off[row], 0, cap), e = clamp(off[row + 1], s, cap);
    *start = s;
    *nfull = clamp(full[row], 0, e - s);
    return e - s;
}

/* The arguments every backward tile kernel takes (inputs, rules, mask, row
 * sums): blocksparse_bwd.cl and blocksparse_bwd_warp.cl. */
#define BWD_IN_PARAMS                                                                                      \
    __global const store_t *q, idx_t q_off, idx4_t q_st, __global const store_t *k, idx_t k_off, idx4_t k_st,  \
        __global const store_t *v, idx_t v_off, idx4_t v_st, __global const store_t *dout, idx_t do_off,       \
        idx4_t do_st, __global const float *lse, idx_t lse_off, idx4_t lse_st, __global const float *delta,  \
        idx_t dl_off, __global const int *pos_q, idx_t pq_off, idx4_t pq_st, __global const int *pos_k,       \
        idx_t pk_off, idx4_t pk_st, __global const int *seg_q, idx_t sq_off, idx4_t sq_st,                   \
        __global const int *seg_k, idx_t sk_off, idx4_t sk_st, __global const int *map, idx_t map_off,       \
        idx4_t map_st, int QB, int KB, __global const int *lay_off, idx_t lo_off, __global const int *lay_full, \
        idx_t lf_off, __global const int *lay_idx, idx_t li_off, int cap, int lay_bs, int lay_hs, int NQT,     \
        int NKT, int Tq, int Tk, int HQ, int G, float scale, float softcap, int wl, int wr

/* The forward kernel's arguments: blocksparse_fwd.cl, blocksparse_fwd_warp.cl. */
#define FWD_PARAMS                                                                                         \
    __global const store_t *q, idx_t q_off, idx4_t q_st, __global const store_t *k, idx_t k_off, idx4_t k_st,  \
        __global const store_t *v, idx_t v_off, idx4_t v_st, __global const int *pos_q, idx_t pq_off,         \
        idx4_t pq_st, __global const int *pos_k, idx_t pk_off, idx4_t pk_st, __global const int *seg_q,       \
        idx_t sq_off, idx4_t sq_st, __global const int *seg_k, idx_t sk_off, idx4_t sk_st,                    \
        __global const float *sinks, idx_t sn_off, idx4_t sn_st, __global const int *map, idx_t map_off,     \
        idx4_t map_st, int QB, int KB, __global const int *lay_off, idx_t lo_off, __global const int *lay_full, \
        idx_t lf_off, __global const int *lay_cols, idx_t lc_off, int cap, int lay_bs, int lay_hs, int NQT,   \
        int NKT, __global store_t *o, idx_t o_off, idx4_t o_st, __global float *lse, idx_t lse_off,          \
        idx4_t lse_st, int Tq, int Tk, int G, float scale, float softcap, int wl, int wr

/* A row's normalization with a sink s (natural-log units): total =
 * l*exp(m) + exp(s), computed around M = max(m, s) so that neither term
 * overflows. Returns the row's lse; *f is the factor of its accumulator.
 * A row that saw nothing (l = 0): o = 0, lse = s. */
inline float bs_sink_norm(float m, float l, float sink, float *f)
{
    if (!(l > 0.0f)) {
        *f = 0.0f;
        return sink;
    }
    const float M = fmax(m, sink), em = exp(m - M), den = l * em + exp(sink - M);
    *f = em / den;
    return M + log(den);
}
