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
 * The staged tiles go through local memory KC rows at a time, two buffers
 * deep: the next chunk is copied (asynchronously on NVIDIA) while the warps
 * compute this one. Products run on warp_attn.h's lds_products /
 * lds_accumulate_trans (ACC_TRANS). The host builds the file twice: KC = 32 for dq, 16 for
 * dk/dv (their registers).
 *
 * Defines (besides common.h, warp_mma.h, warp_softmax.h, warp_attn.h,
 * blocksparse.h, blocksparse_warp.h): NW, KC, DK, DV, KROW and VROW (strides of staged
 * DK- and DV-wide rows), CAUSAL, WINDOW, SOFTCAP, SINKS.
 * NDRange: dq (32 * NW * NQT, HQ, B); dk/dv (32 * NW * NKT, H, B).
 */

#define BT (16 * NW)
#define SUBS (BT / KC) /* chunks of KC rows per tile (KC <= BT) */

/* Chunk n of a layout row's tiles: (the tile's ordinal, its first row in
 * the tile). */
inline int2 tile_chunk(int n)
{
    const int tile = n / SUBS;
    return (int2)(tile, rem_of(n, tile, SUBS) * KC);
}

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
                            int dim, word_t *a)
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

/* Starts staging the KC rows from `row` of query tile `col` of head hq (as
 * blocksparse_warp.h's stage_keys the keys): Q and dO rows,
 * the rows' positions and segment ids, lse and delta (zeros past Tq: those
 * rows are masked). */
inline void stage_query_chunk(int col, int row, int nqt, int b, int hq, int Tq, int Tk, int HQ,
                              __global const store_t *q, idx_t q_off, idx4_t q_st, __global const store_t *dout,
                              idx_t do_off, idx4_t do_st, __global const int *pos_q, idx_t pq_off, idx4_t pq_st,
                              __global const int *seg_q, idx_t sq_off, idx4_t sq_st, __global const float *lse,
                              idx_t lse_off, idx4_t lse_st, __global const float *delta, __local word4_t *q_raw,
                              __local word4_t *do_raw, __local int *qpos, __local int *qseg, __local float *lse_s,
                              __local float *dl_s)
{
    const int i0 = clamp(col, 0, nqt - 1) * BT + row, nq = clamp(Tq - i0, 0, KC), ir = min(i0, Tq - 1);
    stage_rows((__local store_t *)q_raw, KROW, KC, DK, q + at4(q_off, q_st, b, ir, hq, 0), q_st.y, nq);
    stage_rows((__local store_t *)do_raw, VROW, KC, DV, dout + at4(do_off, do_st, b, ir, hq, 0), do_st.y, nq);
    stage_tokens(qpos, qseg, KC, ir, Tq, Tk - Tq, b, pos_q, pq_off, pq_st, seg_q, sq_off, sq_st);
    for (int r = get_local_id(0); r < KC; r += NW * WARP) {
        const int i = min(ir + r, Tq - 1);
        copy4_async(lse_s + r, lse + lse_off + (idx_t)b * lse_st.x + (idx_t)i * lse_st.y + (idx_t)hq * lse_st.z, r < nq);
        copy4_async(dl_s + r, delta + ((idx_t)b * Tq + i) * HQ + hq, r < nq);
    }
    copy_async_commit();
}

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void bs_bwd_dq(
    BWD_IN_PARAMS, __global store_t *dq, idx_t dq_off, idx4_t dq_st)
{
    __local uint wscr[NW * WARP_SCRATCH];
    __local word4_t k_raw[2][KC * KROW / 8], v_raw[2][KC * VROW / 8];
    __local int kpos[2][KC], kseg[2][KC];
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
    word_t qa[DK / 4], da[DV / 4];
    load_rows_afrag(q, q_off, q_st, b, &qr, hq, DK, qa);
    load_rows_afrag(dout, do_off, do_st, b, &qr, hq, DV, da);
    float acc[DK / 2];
#pragma unroll
    for (int i = 0; i < DK / 2; ++i) acc[i] = 0.0f;

    const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
    int start, nfull;
    const int ntiles = bs_row_span(lay_off, lay_full, (b * lay_bs + hq * lay_hs) * NQT + qt, cap, &start, &nfull);
    /* chunk n: tile_chunk(n) of the layout row's key tiles; nchunks is uniform */
    const int nchunks = ntiles * SUBS;
    if (nchunks > 0)
        stage_keys(lay_idx[start], BT, 0, NKT, b, h, Tk, k, k_off, k_st, v, v_off, v_st, pos_k, pk_off, pk_st, seg_k,
                   sk_off, sk_st, k_raw[0], v_raw[0], kpos[0], kseg[0]);
    copy_async_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int n = 0; n < nchunks; ++n) {
        const int2 at = tile_chunk(n), nx = tile_chunk(n + 1);
        const int tile = at.x, cur = n & 1, j0 = clamp(lay_idx[start + tile], 0, NKT - 1) * BT + at.y, nk = Tk - j0;
        if (n + 1 < nchunks)
            stage_keys(lay_idx[start + nx.x], BT, nx.y, NKT, b, h, Tk, k, k_off, k_st, v, v_off, v_st, pos_k, pk_off,
                       pk_st, seg_k, sk_off, sk_st, k_raw[cur ^ 1], v_raw[cur ^ 1], kpos[cur ^ 1], kseg[cur ^ 1]);
        if (busy) {
            __local const store_t *ks = (__local const store_t *)k_raw[cur], *vs = (__local const store_t *)v_raw[cur];
            const bool partial = tile >= nfull;
            float s[KC / 2], dp[KC / 2];
            lds_products(s, qa, ks, KROW, 0, KC, DK, ws);
            lds_products(dp, da, vs, VROW, 0, KC, DV, ws);
#pragma unroll
            for (int i = 0; i < KC / 2; ++i) {
                const int hr = (i >> 1) & 1, j = 8 * (i >> 2) + 2 * t + (i & 1);
                bool on = j < nk && qr.tok[hr] >= 0;
                if (on && partial)
                    on = bs_pair_on(qr.pos[hr], qr.seg[hr], kpos[cur][j], kseg[cur][j], qr.tok[hr], j0 + j, wl, wr,
                                    has_seg, map, mbase, map_st, QB, KB);
                bs_grad_weights(s, dp, i, on, l[hr], dl[hr], scale, softcap);
            }
            lds_accumulate_trans(acc, dp, ks, KROW, DK, ws);
        }
        copy_async_wait();
        barrier(CLK_LOCAL_MEM_FENCE); /* chunk n+1 is in; chunk n is read */
    }
    if (busy) store_rows(dq, dq_off, dq_st, b, &qr, hq, DK, acc, scale);
}

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void bs_bwd_dkdv(
    BWD_IN_PARAMS, __global store_t *dk, idx_t dk_off, idx4_t dk_st, __global store_t *dv, idx_t dv_off,
    idx4_t dv_st)
{
    __local uint wscr[NW * WARP_SCRATCH];
    __local word4_t q_raw[2][KC * KROW / 8], do_raw[2][KC * VROW / 8];
    __local int qpos[2][KC], qseg[2][KC];
    __local float lse_s[2][KC], dl_s[2][KC];
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
    word_t ka[DK / 4], va[DV / 4];
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
        /* chunk n: tile_chunk(n) of the query tiles; nchunks is uniform */
        const int nchunks = ntiles * SUBS;
        if (nchunks > 0)
            stage_query_chunk(lay_idx[start], 0, NQT, b, hq, Tq, Tk, HQ, q, q_off, q_st, dout, do_off, do_st, pos_q,
                              pq_off, pq_st, seg_q, sq_off, sq_st, lse, lse_off, lse_st, delta, q_raw[0], do_raw[0],
                              qpos[0], qseg[0], lse_s[0], dl_s[0]);
        copy_async_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int n = 0; n < nchunks; ++n) {
            const int2 at = tile_chunk(n), nx = tile_chunk(n + 1);
            const int tile = at.x, cur = n & 1, nb = cur ^ 1;
            const int i0 = clamp(lay_idx[start + tile], 0, NQT - 1) * BT + at.y, nq = Tq - i0;
            if (n + 1 < nchunks)
                stage_query_chunk(lay_idx[start + nx.x], nx.y, NQT, b, hq, Tq, Tk, HQ, q, q_off, q_st, dout, do_off,
                                  do_st, pos_q, pq_off, pq_st, seg_q, sq_off, sq_st, lse, lse_off, lse_st, delta,
                                  q_raw[nb], do_raw[nb], qpos[nb], qseg[nb], lse_s[nb], dl_s[nb]);
            if (busy) {
                __local const store_t *qs = (__local const store_t *)q_raw[cur];
                __local const store_t *dos = (__local const store_t *)do_raw[cur];
                const bool partial = tile >= nfull;
                float s[KC / 2], dp[KC / 2];
                lds_products(s, ka, qs, KROW, 0, KC, DK, ws);
                lds_products(dp, va, dos, VROW, 0, KC, DV, ws);
#pragma unroll
                for (int i = 0; i < KC / 2; ++i) {
                    const int hr = (i >> 1) & 1, r = 8 * (i >> 2) + 2 * t + (i & 1); /* key row, query row */
                    bool on = r < nq && kr.tok[hr] >= 0;
                    if (on && partial)
                        on = bs_pair_on(qpos[cur][r], qseg[cur][r], kr.pos[hr], kr.seg[hr], i0 + r, kr.tok[hr], wl, wr,
                                        has_seg, map, mbase, map_st, QB, KB);
                    bs_grad_weights(s, dp, i, on, lse_s[cur][r], dl_s[cur][r], scale, softcap);
                }
                lds_accumulate_trans(dva, s, dos, VROW, DV, ws);
                lds_accumulate_trans(dka, dp, qs, KROW, DK, ws);
            }
            copy_async_wait();
            barrier(CLK_LOCAL_MEM_FENCE); /* chunk n+1 is in; chunk n is read */
        }
    }
    if (!busy) return;
    store_rows(dk, dk_off, dk_st, b, &kr, h, DK, dka, scale);
    store_rows(dv, dv_off, dv_st, b, &kr, h, DV, dva, 1.0f);
}
