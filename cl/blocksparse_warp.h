/*
 * blocksparse_warp.h: what the block-sparse warp kernels share
 * (blocksparse_fwd_warp.cl, blocksparse_bwd_warp.cl): the positions and
 * segment ids of the rows a lane holds and of a tile staged in local memory
 * (stage_rows, warp_attn.h), the staging of key rows, and the element rule
 * on a fragment.
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

/* Starts staging the KC keys from key row `row` of key tile `col` (tiles of
 * `tile` keys, col clamped to the nkt tiles): K and V rows (asynchronously
 * on NVIDIA; zeros past Tk), the keys' positions and segment ids. Every
 * work-item calls it. Needs KC, KROW, VROW, DK, DV. */
inline void stage_keys(int col, int tile, int row, int nkt, int b, int h, int Tk, __global const store_t *k, idx_t k_off,
                       idx4_t k_st, __global const store_t *v, idx_t v_off, idx4_t v_st, __global const int *pos_k,
                       idx_t pk_off, idx4_t pk_st, __global const int *seg_k, idx_t sk_off, idx4_t sk_st,
                       __local word4_t *k_raw, __local word4_t *v_raw, __local int *kpos, __local int *kseg)
{
    const int j0 = clamp(col, 0, nkt - 1) * tile + row, nk = clamp(Tk - j0, 0, KC), jr = min(j0, Tk - 1);
    stage_rows((__local store_t *)k_raw, KROW, KC, DK, k + at4(k_off, k_st, b, jr, h, 0), k_st.y, nk);
    stage_rows((__local store_t *)v_raw, VROW, KC, DV, v + at4(v_off, v_st, b, jr, h, 0), v_st.y, nk);
    stage_tokens(kpos, kseg, KC, jr, Tk, 0, b, pos_k, pk_off, pk_st, seg_k, sk_off, sk_st);
}

/* The rule of blocksparse.h for query token i (position pq, segment sq)
 * and key token j (pk, sk) in a PARTIAL tile. */
inline bool bs_pair_on(int pq, int sq, int pk, int sk, int i, int j, int wl, int wr, int has_seg,
                       __global const int *map, idx_t mbase, idx4_t map_st, int QB, int KB)
{
    return bs_visible(pq, sq, pk, sk, wl, wr, has_seg, bs_map_on(map, mbase, map_st.z, map_st.w, QB, KB, i, j));
}
