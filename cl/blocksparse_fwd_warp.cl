/*
 * blocksparse_fwd_warp.cl: the tensor-core path of the block-sparse forward
 * (and so of the dense causal attention): the same kernel name, arguments
 * and results as blocksparse_fwd.cl, computed by warps (warp_attn.h).
 *
 * A work-group owns a tile of 16*NW query rows of one query head, warp w its
 * rows 16w .. 16w+15, and visits the key tiles of the tile's layout row
 * (FULL first, then PARTIAL ones, whose elements are masked). Each key tile
 * is staged once in local memory for all NW warps (the K and V rows every
 * warp of the group reads), the next one while the warps compute this one,
 * and its scores, probabilities and the output stay in the warps' mma
 * fragments.
 *
 * Defines (besides common.h, warp_mma.h, warp_softmax.h, warp_attn.h,
 * blocksparse.h, blocksparse_warp.h): NW
 * warps per work-group, KC = BK keys per tile, DK, DV, KROW and VROW (row
 * strides of the staged tiles in elements: multiples of 8, chosen by the
 * host against local-memory bank conflicts), CAUSAL, WINDOW, SOFTCAP,
 * SINKS, OUT_VEC (o's rows aligned for vector stores).
 * NDRange (32 * NW * NQT, HQ, B).
 */

/* Masks and scales the chunk's scores (log2 units) by the element rule and
 * returns the lane's row maxima: key j of the tile is visible when j < nk,
 * the row is a token, and in a PARTIAL tile when the rule allows it. */
inline void bs_warp_mask(float *s, const lane_rows *qr, __local const int *kpos, __local const int *kseg, int nk,
                         bool partial, int j0, int wl, int wr, int has_seg, __global const int *map, idx_t mbase,
                         idx4_t map_st, int QB, int KB, float scale, float softcap, float *mx)
{
    const int t = lane_id() & 3;
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < KC / 8; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int hr = i >> 1, j = 8 * nb + 2 * t + (i & 1);
            bool on = j < nk && qr->tok[hr] >= 0;
            if (on && partial)
                on = bs_pair_on(qr->pos[hr], qr->seg[hr], kpos[j], kseg[j], qr->tok[hr], j0 + j, wl, wr, has_seg, map,
                                mbase, map_st, QB, KB);
            float dcap;
            const float x = on ? bs_score(s[4 * nb + i], scale, softcap, &dcap) * LOG2E : -INFINITY;
            s[4 * nb + i] = x;
            mx[hr] = fmax(mx[hr], x);
        }
}

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void bs_fwd(FWD_PARAMS)
{
    __local uint wscr[NW * WARP_SCRATCH];
    __local word4_t k_raw[2][KC * KROW / 8], v_raw[2][KC * VROW / 8];
    __local int kpos[2][KC], kseg[2][KC];
    const int warp = get_local_id(0) / WARP;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
    const int qt = get_group_id(0), hq = get_group_id(1), b = get_group_id(2), h = hq / G;
    const int r0 = qt * 16 * NW + 16 * warp; /* the warp's first query row */
    const bool busy = r0 < Tq;               /* uniform over the warp */
    const int has_seg = seg_q != 0;
    lay_off += lo_off;
    lay_full += lf_off;
    lay_cols += lc_off;

    const lane_rows qr = bs_lane_rows(r0, Tq, Tk - Tq, b, pos_q, pq_off, pq_st, seg_q, sq_off, sq_st);
    word_t qa[QA_WORDS];
    load_afrag(q + at4(q_off, q_st, b, qr.read[0], hq, 0), qr.tok[0] >= 0, q + at4(q_off, q_st, b, qr.read[1], hq, 0),
               qr.tok[1] >= 0, DK, qa);
    float m[2], l[2], acc[ACC_N];
    warp_reset(m, l, acc);

    const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
    int start, nfull;
    const int ntiles = bs_row_span(lay_off, lay_full, (b * lay_bs + hq * lay_hs) * NQT + qt, cap, &start, &nfull);
    /* ntiles is uniform over the work-group: the barriers below are safe. */
    /* Two buffers: tile+1 is copied (asynchronously on NVIDIA) while the
     * warps compute tile. */
    if (ntiles > 0)
        stage_keys(lay_cols[start], KC, 0, NKT, b, h, Tk, k, k_off, k_st, v, v_off, v_st, pos_k, pk_off, pk_st, seg_k,
                   sk_off, sk_st, k_raw[0], v_raw[0], kpos[0], kseg[0]);
    copy_async_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int tile = 0; tile < ntiles; ++tile) {
        const int cur = tile & 1, j0 = clamp(lay_cols[start + tile], 0, NKT - 1) * KC, nk = min(KC, Tk - j0);
        if (tile + 1 < ntiles)
            stage_keys(lay_cols[start + tile + 1], KC, 0, NKT, b, h, Tk, k, k_off, k_st, v, v_off, v_st, pos_k, pk_off,
                       pk_st, seg_k, sk_off, sk_st, k_raw[cur ^ 1], v_raw[cur ^ 1], kpos[cur ^ 1], kseg[cur ^ 1]);
        if (busy) {
            float s[KC / 2], mx[2], alpha[2];
            lds_products(s, qa, (__local const store_t *)k_raw[cur], KROW, 0, KC, DK, ws);
            bs_warp_mask(s, &qr, kpos[cur], kseg[cur], nk, tile >= nfull, j0, wl, wr, has_seg, map, mbase, map_st, QB,
                         KB, scale, softcap, mx);
            if (warp_softmax(s, mx, m, l, alpha, ws)) {
#pragma unroll
                for (int i = 0; i < ACC_N; ++i) acc[i] *= alpha[(i >> 1) & 1];
            }
            lds_accumulate_trans(acc, s, (__local const store_t *)v_raw[cur], VROW, DV, ws);
        }
        copy_async_wait();
        barrier(CLK_LOCAL_MEM_FENCE); /* tile+1 is in; tile is read */
    }
    if (!busy) return;

#if SINKS
    const float sink = sinks[sn_off + (idx_t)hq * sn_st.x];
#else
    (void)sinks; (void)sn_off; (void)sn_st;
#endif
    const int t = lane_id() & 3;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const float lt = quad_sum(l[hr], ws), mn = m[hr] / LOG2E;
#if SINKS
        float f;
        const float r = bs_sink_norm(mn, lt, sink, &f);
#else
        const float f = lt > 0.0f ? 1.0f / lt : 0.0f, r = lt > 0.0f ? mn + log(lt) : -INFINITY;
#endif
        const int i = qr.tok[hr];
#if OUT_VEC
        store_row_wide(o + at4(o_off, o_st, b, max(i, 0), hq, 0), DV, acc, hr, f, i >= 0, ws);
#endif
        if (i < 0) continue;
#if !OUT_VEC
        store_row_strided(o, at4(o_off, o_st, b, i, hq, 0), o_st.w, DV, acc, hr, f);
#endif
        if (lse && t == 0) lse[lse_off + (idx_t)b * lse_st.x + (idx_t)i * lse_st.y + (idx_t)hq * lse_st.z] = r;
    }
}
