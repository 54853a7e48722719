/*
 * blocksparse_warp.h: what the block-sparse warp kernels share
 * (blocksparse_fwd_warp.cl, blocksparse_bwd_warp.cl): the positions and
 * segment ids of the rows a lane holds and of a tile staged in local memory
 * (stage_rows, warp_attn.h), and the element rule on a fragment.
 * Needs common.h, warp_mma.h, blocksparse.h; NW (warps per work-group).
 */

/* The tokens of the two fragment rows a lane holds (gq, gq+8 from token
 * r0; hr = 0, 1) out of n: tok (-1 past n), the clamped token read for it,
 * and its position and segment id (pos: NULL means token + shift). */
typedef struct {
    int tok[2], read[2], pos[2], seg[2];
} lane_rows;

inline lane_rows bs_lane_rows(int r0, int n, int shift, int b, __global const int *pos, idx_t p_off, idx4_t p_st,
                              __global const int *seg, idx_t s_off, idx4_t s_st)
{
    lane_rows x;
    const int gq = lane_id() >> 2;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int i = r0 + gq + 8 * hr, ic = clamp(i, 0, max(n - 1, 0));
        x.tok[hr] = i < n ? i : -1;
        x.read[hr] = ic;
        x.pos[hr] = pos ? pos[bs_at2(p_off, p_st, b, ic)] : ic + shift;
        x.seg[hr] = seg ? seg[bs_at2(s_off, s_st, b, ic)] : 0;
    }
    return x;
}

/* The positions and segment ids of a staged tile's `rows` tokens from t0
 * (of n; clamped). Every work-item calls it. */
inline void stage_tokens(__local int *pos_s, __local int *seg_s, int rows, int t0, int n, int shift, int b,
                         __global const int *pos, idx_t p_off, idx4_t p_st, __global const int *seg, idx_t s_off,
                         idx4_t s_st)
{
    for (int r = get_local_id(0); r < rows; r += NW * WARP) {
        const int i = min(t0 + r, n - 1);
        pos_s[r] = pos ? pos[bs_at2(p_off, p_st, b, i)] : i + shift;
        seg_s[r] = seg ? seg[bs_at2(s_off, s_st, b, i)] : 0;
    }
}

/* The rule of blocksparse.h for query token i (position pq, segment sq)
 * and key token j (pk, sk) in a PARTIAL tile. */
inline bool bs_pair_on(int pq, int sq, int pk, int sk, int i, int j, int wl, int wr, int has_seg,
                       __global const int *map, idx_t mbase, idx4_t map_st, int QB, int KB)
{
    return bs_visible(pq, sq, pk, sk, wl, wr, has_seg, bs_map_on(map, mbase, map_st.z, map_st.w, QB, KB, i, j));
}
