/*
 * blocksparse_bwd_warp.cl: the tensor-core path of the block-sparse
 * backward's two tile kernels, bs_bwd_dkdv and bs_bwd_dq, with the names,
 * arguments and results of blocksparse_bwd.cl (whose bs_bwd_delta and
 * bs_bwd_dsink run beside them). Deterministic like them: every gradient
 * element is summed by one lane in the order of the layout's tiles.
 *
 * Both layouts have square tiles of BT = 16*NW tokens:
 *   bs_bwd_dq    a work-group owns a query tile of one head, warp w its rows
 *                16w .. 16w+15 (Q and dO in A fragments); each key tile of
 *                the layout row is staged in local memory once for all
 *                warps and taken in chunks of KC keys: S = Q K^T, dP = dO V^T,
 *                dS = P (dP - delta) [* dz/du], dQ += dS K.
 *   bs_bwd_dkdv  a work-group owns a key tile of one KV head, warp w its keys
 *                16w .. 16w+15 (K and V in A fragments); for each query head
 *                of the group, each query tile of the transposed layout is
 *                staged (Q, dO, lse, delta) and taken in chunks of KC rows:
 *                S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
 * Products run on warp_attn.h's lds_products / lds_accumulate. The host
 * builds the file twice: KC = 32 for dq, 16 for dk/dv (their registers).
 *
 * Defines (besides common.h, warp_mma.h, warp_attn.h, blocksparse.h,
 * blocksparse_warp.h): NW, KC, DK, DV, KROW and VROW (strides of staged
 * DK- and DV-wide rows), CAUSAL, WINDOW, SOFTCAP, SINKS.
 * NDRange: dq (32 * NW * NQT, HQ, B); dk/dv (32 * NW * NKT, H, B).
 */

#define BT (16 * NW)

/* Turns a chunk's products into the weights of the two accumulations:
 * s = Q.K (or K.Q) becomes P, dp = dO.V (or V.dO) becomes dS = P (dP -
 * delta) [* dz/du]. on[i] says whether fragment element i is visible; l and
 * dl are the element's row lse and delta. */
inline void bs_grad_weights(float *s, float *dp, int i, bool on, float l, float dl, float scale, float softcap)
{
    float dcap;
    const float z = bs_score(s[i], scale, softcap, &dcap);
    const float p = on && l != -INFINITY ? exp(z - l) : 0.0f;
    s[i] = p;
    dp[i] = p * (dp[i] - dl) * dcap;
}

/* The A fragments of the warp's 16 rows of a [B, T, heads, dim] view. */
inline void load_rows_afrag(__global const store_t *x, idx_t off, idx4_t st, int b, const lane_rows *r, int head,
                            int dim, uint *a)
{
    load_afrag(x + at4(off, st, b, r->read[0], head, 0), r->tok[0] >= 0, x + at4(off, st, b, r->read[1], head, 0),
               r->tok[1] >= 0, dim, a);
}

/* Stores scale * the lane's part of its two rows of a fragment accumulator
 * (absent tensors and rows past the end are skipped). */
inline void store_rows(__global store_t *x, idx_t off, idx4_t st, int b, const lane_rows *r, int head, int dim,
                       const float *c, float scale)
{
    if (!x) return;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
        if (r->tok[hr] >= 0) store_row_strided(x, at4(off, st, b, r->tok[hr], head, 0), st.w, dim, c, hr, scale);
}

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void bs_bwd_dq(
    BWD_IN_PARAMS, __global store_t *dq, idx_t dq_off, idx4_t dq_st)
{
    __local uint wscr[NW * WARP_SCRATCH];
    __local uint4 k_raw[BT * KROW / 8], v_raw[BT * VROW / 8];
    __local int kpos[BT], kseg[BT];
    __local store_t *ks = (__local store_t *)k_raw, *vs = (__local store_t *)v_raw;
    const int warp = get_local_id(0) / WARP, t = lane_id() & 3;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
    const int qt = get_group_id(0), hq = get_group_id(1), b = get_group_id(2), h = hq / G;
    const int r0 = qt * BT + 16 * warp;
    const bool busy = r0 < Tq; /* uniform over the warp */
    const int has_seg = seg_q != 0;
    delta += dl_off;
    lay_off += lo_off;
    lay_full += lf_off;
    lay_idx += li_off;

    const lane_rows qr = bs_lane_rows(r0, Tq, Tk - Tq, b, pos_q, pq_off, pq_st, seg_q, sq_off, sq_st);
    float l[2], dl[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int i = qr.read[hr];
        l[hr] = qr.tok[hr] >= 0 ? lse[lse_off + (idx_t)b * lse_st.x + (idx_t)i * lse_st.y + (idx_t)hq * lse_st.z]
                                : -INFINITY;
        dl[hr] = qr.tok[hr] >= 0 ? delta[((idx_t)b * Tq + i) * HQ + hq] : 0.0f;
    }
    uint qa[DK / 4], da[DV / 4];
    load_rows_afrag(q, q_off, q_st, b, &qr, hq, DK, qa);
    load_rows_afrag(dout, do_off, do_st, b, &qr, hq, DV, da);
    float acc[DK / 2];
#pragma unroll
    for (int i = 0; i < DK / 2; ++i) acc[i] = 0.0f;

    const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
    int start, nfull;
    const int ntiles = bs_row_span(lay_off, lay_full, (b * lay_bs + hq * lay_hs) * NQT + qt, cap, &start, &nfull);
    for (int tile = 0; tile < ntiles; ++tile) { /* ntiles is uniform: the barriers are safe */
        const int kt = clamp(lay_idx[start + tile], 0, NKT - 1), j0 = kt * BT, nk = min(BT, Tk - j0);
        const bool partial = tile >= nfull;
        barrier(CLK_LOCAL_MEM_FENCE);
        stage_rows(ks, KROW, BT, DK, k + at4(k_off, k_st, b, j0, h, 0), k_st.y, nk);
        stage_rows(vs, VROW, BT, DV, v + at4(v_off, v_st, b, j0, h, 0), v_st.y, nk);
        stage_tokens(kpos, kseg, BT, j0, Tk, 0, b, pos_k, pk_off, pk_st, seg_k, sk_off, sk_st);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!busy) continue;
        for (int c0 = 0; c0 < BT; c0 += KC) {
            float s[KC / 2], dp[KC / 2];
            lds_products(s, qa, ks + c0 * KROW, KROW, 0, KC, DK, ws);
            lds_products(dp, da, vs + c0 * VROW, VROW, 0, KC, DV, ws);
#pragma unroll
            for (int i = 0; i < KC / 2; ++i) {
                const int hr = (i >> 1) & 1, j = c0 + 8 * (i >> 2) + 2 * t + (i & 1);
                bool on = j < nk && qr.tok[hr] >= 0;
                if (on && partial)
                    on = bs_pair_on(qr.pos[hr], qr.seg[hr], kpos[j], kseg[j], qr.tok[hr], j0 + j, wl, wr, has_seg, map,
                                    mbase, map_st, QB, KB);
                bs_grad_weights(s, dp, i, on, l[hr], dl[hr], scale, softcap);
            }
            lds_accumulate(acc, dp, ks + c0 * KROW, KROW, 0, KC, DK, ws);
        }
    }
    if (busy) store_rows(dq, dq_off, dq_st, b, &qr, hq, DK, acc, scale);
}

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void bs_bwd_dkdv(
    BWD_IN_PARAMS, __global store_t *dk, idx_t dk_off, idx4_t dk_st, __global store_t *dv, idx_t dv_off,
    idx4_t dv_st)
{
    __local uint wscr[NW * WARP_SCRATCH];
    __local uint4 q_raw[BT * KROW / 8], do_raw[BT * VROW / 8];
    __local int qpos[BT], qseg[BT];
    __local float lse_s[BT], dl_s[BT];
    __local store_t *qs = (__local store_t *)q_raw, *dos = (__local store_t *)do_raw;
    const int warp = get_local_id(0) / WARP, t = lane_id() & 3;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
    const int kt = get_group_id(0), h = get_group_id(1), b = get_group_id(2);
    const int k0 = kt * BT + 16 * warp;
    const bool busy = k0 < Tk; /* uniform over the warp */
    const int has_seg = seg_q != 0;
    delta += dl_off;
    lay_off += lo_off;
    lay_full += lf_off;
    lay_idx += li_off;

    const lane_rows kr = bs_lane_rows(k0, Tk, 0, b, pos_k, pk_off, pk_st, seg_k, sk_off, sk_st);
    uint ka[DK / 4], va[DV / 4];
    load_rows_afrag(k, k_off, k_st, b, &kr, h, DK, ka);
    load_rows_afrag(v, v_off, v_st, b, &kr, h, DV, va);
    float dka[DK / 2], dva[DV / 2];
#pragma unroll
    for (int i = 0; i < DK / 2; ++i) dka[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < DV / 2; ++i) dva[i] = 0.0f;

    for (int g = 0; g < G; ++g) {
        const int hq = h * G + g;
        const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
        int start, nfull;
        const int ntiles = bs_row_span(lay_off, lay_full, (b * lay_bs + hq * lay_hs) * NKT + kt, cap, &start, &nfull);
        for (int tile = 0; tile < ntiles; ++tile) { /* uniform: the barriers are safe */
            const int qt = clamp(lay_idx[start + tile], 0, NQT - 1), i0 = qt * BT, nq = min(BT, Tq - i0);
            const bool partial = tile >= nfull;
            barrier(CLK_LOCAL_MEM_FENCE);
            stage_rows(qs, KROW, BT, DK, q + at4(q_off, q_st, b, i0, hq, 0), q_st.y, nq);
            stage_rows(dos, VROW, BT, DV, dout + at4(do_off, do_st, b, i0, hq, 0), do_st.y, nq);
            stage_tokens(qpos, qseg, BT, i0, Tq, Tk - Tq, b, pos_q, pq_off, pq_st, seg_q, sq_off, sq_st);
            for (int r = get_local_id(0); r < BT; r += NW * WARP) {
                const int i = min(i0 + r, Tq - 1);
                lse_s[r] = r < nq ? lse[lse_off + (idx_t)b * lse_st.x + (idx_t)i * lse_st.y + (idx_t)hq * lse_st.z]
                                  : -INFINITY;
                dl_s[r] = r < nq ? delta[((idx_t)b * Tq + i) * HQ + hq] : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (!busy) continue;
            for (int c0 = 0; c0 < BT; c0 += KC) {
                float s[KC / 2], dp[KC / 2];
                lds_products(s, ka, qs + c0 * KROW, KROW, 0, KC, DK, ws);
                lds_products(dp, va, dos + c0 * VROW, VROW, 0, KC, DV, ws);
#pragma unroll
                for (int i = 0; i < KC / 2; ++i) {
                    const int hr = (i >> 1) & 1, r = c0 + 8 * (i >> 2) + 2 * t + (i & 1); /* key row, query row */
                    bool on = r < nq && kr.tok[hr] >= 0;
                    if (on && partial)
                        on = bs_pair_on(qpos[r], qseg[r], kr.pos[hr], kr.seg[hr], i0 + r, kr.tok[hr], wl, wr, has_seg,
                                        map, mbase, map_st, QB, KB);
                    bs_grad_weights(s, dp, i, on, lse_s[r], dl_s[r], scale, softcap);
                }
                lds_accumulate(dva, s, dos + c0 * VROW, VROW, 0, KC, DV, ws);
                lds_accumulate(dka, dp, qs + c0 * KROW, KROW, 0, KC, DK, ws);
            }
        }
    }
    if (!busy) return;
    store_rows(dk, dk_off, dk_st, b, &kr, h, DK, dka, scale);
    store_rows(dv, dv_off, dv_st, b, &kr, h, DV, dva, 1.0f);
}
