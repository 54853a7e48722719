/*
 * blocksparse_bwd.cl: the block-sparse attention backward, deterministic
 * (no atomics; every gradient element is summed by one work-item in a fixed
 * order that depends on the tiles, never on the work-group size).
 *
 *   bs_bwd_delta  delta_i = sum_d o_id * do_id, one work-item per row.
 *   bs_bwd_dkdv   a work-group owns one key tile of one KV head: for each of
 *                 the G query heads of the group and each query tile of the
 *                 transposed layout, P = exp(z - lse), dV += P^T dO,
 *                 dZ = P (dO V^T - delta) [* dz/du], dK += scale dZ^T Q.
 *   bs_bwd_dq     a work-group owns one query tile of one head: for each key
 *                 tile of the layout row, dQ += scale dZ K.
 *   bs_bwd_dsink  dsink_h = -sum_{b,i} exp(s_h - lse_i) delta_i, summed in
 *                 DSINK_LANES fixed lanes, then the lanes in order.
 *
 * Defines (besides common.h, blocksparse.h): WG, BQ, BK (tiles), DK, DV,
 * NQD = ceil(BQ*DK/WG), NKD = ceil(BK*DK/WG), NVD = ceil(BK*DV/WG), CAUSAL,
 * WINDOW, SOFTCAP, SINKS.
 * Local memory (floats): qs[BQ*DK], dos[BQ*DV], ks[BK*KPAD(DK)],
 * vs[BK*KPAD(DV)], ps[BQ*BK] (dk/dv: P; dq: dZ), dzs[BQ*BK] (dk/dv: dZ),
 * lse and delta [BQ].
 */

#define DSINK_LANES 64

/* dk/dv's and dq's outputs in 4 x 4 blocks a work-item where they are 16 a
 * work-item (common.h's accumulate_block, block_elem); else element
 * lid + i*WG of the row-major tile. The same sums in the same order. */
#define KV_BLOCK (DK == DV && BLOCK_OF(BK, DK, WG))
#define Q_BLOCK BLOCK_OF(BQ, DK, WG)

/* acc += P^T m over the tile's nq query rows (ps: BQ x BK; m: nq rows of
 * dim), for dv (m = do) and dk (m = q): a key j's column d, each sum in row
 * order. */
inline void accumulate_keys(__local const float *ps, __local const float *m, int dim, float *acc, int n_acc, int nq,
                            int lid)
{
#if KV_BLOCK
    int j, d;
    tile_elem(true, 0, lid, WG, BK, dim, &j, &d);
    accumulate_block(ps, BK, j, false, m, dim, d, acc, nq);
#else
    for (int i = 0; i < n_acc; ++i) {
        int j, d;
        if (tile_elem(false, i, lid, WG, BK, dim, &j, &d)) {
            float a = acc[i];
            for (int r = 0; r < nq; ++r) a = fma(ps[r * BK + j], m[r * dim + d], a);
            acc[i] = a;
        }
    }
#endif
}

/* The scores and dO.V of a tile pair in common.h's score tiles: SC_R rows
 * by SC_C keys a work-item (keys SC_COLS apart), each element read feeding
 * two products where the work-group has that many per work-item. */
#define SC_R TILE_SR_OF(BQ, BK, WG)
#define SC_C TILE_SC_OF(BQ, BK, WG)
#define SC_COLS (BK / SC_C)
#define SC_TILES (BQ / SC_R * SC_COLS)

/* Loads query tile qt of head hq (rows past Tq are zero): q, do, lse, delta,
 * positions and segment ids. */
inline void load_q_side(__local float *qs, __local float *dos, __local float *lse_s, __local float *dl_s,
                        __local int *qpos, __local int *qseg, __global const store_t *q, idx_t q_off,
                        idx4_t q_st, __global const store_t *dout, idx_t do_off, idx4_t do_st,
                        __global const float *lse, idx_t lse_off, idx4_t lse_st, __global const float *delta,
                        __global const int *pos_q, idx_t pq_off, idx4_t pq_st, __global const int *seg_q,
                        idx_t sq_off, idx4_t sq_st, int b, int hq, int i0, int nq, int Tq, int Tk, int HQ,
                        int lid)
{
    load_tile_zero(qs, DK, BQ, nq, DK, q, at4(q_off, q_st, b, i0, hq, 0), q_st.y, q_st.w, lid, WG);
    load_tile_zero(dos, DV, BQ, nq, DV, dout, at4(do_off, do_st, b, i0, hq, 0), do_st.y, do_st.w, lid, WG);
    for (int g = lid; g < BQ; g += WG) {
        const int i = min(i0 + g, Tq - 1);
        lse_s[g] = g < nq ? lse[lse_off + (idx_t)b * lse_st.x + (idx_t)i * lse_st.y + (idx_t)hq * lse_st.z]
                          : -INFINITY;
        dl_s[g] = g < nq ? delta[((idx_t)b * Tq + i) * HQ + hq] : 0.0f;
        qpos[g] = pos_q ? pos_q[bs_at2(pq_off, pq_st, b, i)] : i + (Tk - Tq);
        qseg[g] = seg_q ? seg_q[bs_at2(sq_off, sq_st, b, i)] : 0;
    }
}

/* Loads key tile kt of KV head h (rows past Tk are zero). */
inline void load_k_side(__local float *ks, __local float *vs, __local int *kpos, __local int *kseg,
                        __global const store_t *k, idx_t k_off, idx4_t k_st, __global const store_t *v,
                        idx_t v_off, idx4_t v_st, __global const int *pos_k, idx_t pk_off, idx4_t pk_st,
                        __global const int *seg_k, idx_t sk_off, idx4_t sk_st, int b, int h, int j0, int nk,
                        int Tk, int lid)
{
    load_tile_zero(ks, KPAD(DK), BK, nk, DK, k, at4(k_off, k_st, b, j0, h, 0), k_st.y, k_st.w, lid, WG);
    load_tile_zero(vs, KPAD(DV), BK, nk, DV, v, at4(v_off, v_st, b, j0, h, 0), v_st.y, v_st.w, lid, WG);
    for (int j = lid; j < BK; j += WG) {
        const int jj = min(j0 + j, Tk - 1);
        kpos[j] = pos_k ? pos_k[bs_at2(pk_off, pk_st, b, jj)] : jj;
        kseg[j] = seg_k ? seg_k[bs_at2(sk_off, sk_st, b, jj)] : 0;
    }
}

/* The tile pair's P (0 where masked or out of range) into ps where with_p
 * (dk/dv's dV needs it; dq does not), and dZ = P (dO . V - delta) [* dz/du]
 * into dzs: both products of a score tile in one walk, so that dz/du
 * stays in a register. */
inline void tile_grads(__local const float *qs, __local const float *ks, __local const float *dos,
                       __local const float *vs, __local float *ps, __local float *dzs, bool with_p,
                       __local const float *lse_s, __local const float *dl_s, __local const int *qpos,
                       __local const int *qseg, __local const int *kpos, __local const int *kseg,
                       __global const int *map, idx_t mbase, idx4_t map_st, int QB, int KB, int i0, int j0, int nq,
                       int nk, int Tq, bool partial, float scale, float softcap, int wl, int wr, int has_seg, int lid)
{
    for (int x0 = 0; x0 < SC_TILES; x0 += WG) {
        const int it = x0 + lid;
        if (it >= SC_TILES) break;
        int jt, key[2];
        float z[2][2], dp[2][2];
        const int g0 = score_tile_qk(qs, ks, it, SC_COLS, SC_R, SC_C, nk, &jt, key, z);
        dot_tile(dos, DV, g0, vs, KPAD(DV), key, DV, SC_R, SC_C, dp);
        for (int r = 0; r < SC_R; ++r)
            for (int cc = 0; cc < SC_C; ++cc) {
                const int g = g0 + r, j = jt + cc * SC_COLS, x = g * BK + j;
                const float l = lse_s[g];
                float p = 0.0f, c = 0.0f, dz = 0.0f;
                if (g < nq && j < nk && l != -INFINITY &&
                    (!partial || bs_visible(qpos[g], qseg[g], kpos[j], kseg[j], wl, wr, has_seg,
                                            bs_map_on(map, mbase, map_st.z, map_st.w, QB, KB, min(i0 + g, Tq - 1), j0 + j)))) {
                    p = exp(bs_score(z[r][cc], scale, softcap, &c) - l);
                }
                if (p != 0.0f) {
                    dz = p * (dp[r][cc] - dl_s[g]);
#if SOFTCAP
                    dz *= c;
#endif
                }
                if (with_p) ps[x] = p;
                dzs[x] = dz;
            }
    }
}

/* delta[(b*Tq + i)*HQ + hq] = sum_d o . do. NDRange (>= Tq*HQ, B). */
__kernel void bs_bwd_delta(__global const store_t *o, idx_t o_off, idx4_t o_st,
                           __global const store_t *dout, idx_t do_off, idx4_t do_st,
                           __global float *delta, idx_t dl_off, int Tq, int HQ)
{
    const int r = get_global_id(0), b = get_global_id(1);
    if (r >= Tq * HQ) return;
    const int i = r / HQ, hq = r - i * HQ;
    float s = 0.0f;
    for (int d = 0; d < DV; ++d)
        s = fma(LOAD(o, at4(o_off, o_st, b, i, hq, d)), LOAD(dout, at4(do_off, do_st, b, i, hq, d)), s);
    delta[dl_off + ((idx_t)b * Tq + i) * HQ + hq] = s;
}

/* NDRange (WG * NKT, H, B). The layout is the transposed one: per key tile,
 * the query tiles. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void bs_bwd_dkdv(
    BWD_IN_PARAMS, __global store_t *dk, idx_t dk_off, idx4_t dk_st, __global store_t *dv, idx_t dv_off,
    idx4_t dv_st)
{
    __local float qs[BQ * DK] LOCAL_TILE, dos[BQ * DV] LOCAL_TILE, ks[BK * KPAD(DK)] LOCAL_TILE;
    __local float vs[BK * KPAD(DV)] LOCAL_TILE, ps[BQ * BK] LOCAL_TILE, dzs[BQ * BK] LOCAL_TILE;
    __local float lse_s[BQ], dl_s[BQ];
    __local int qpos[BQ], qseg[BQ], kpos[BK], kseg[BK];
    const int lid = get_local_id(0);
    const int kt = get_group_id(0), h = get_group_id(1), b = get_group_id(2);
    const int j0 = kt * BK, nk = min(BK, Tk - j0);
    const int has_seg = seg_q != 0;
    delta += dl_off;
    lay_off += lo_off;
    lay_full += lf_off;
    lay_idx += li_off;

    load_k_side(ks, vs, kpos, kseg, k, k_off, k_st, v, v_off, v_st, pos_k, pk_off, pk_st, seg_k, sk_off, sk_st,
                b, h, j0, nk, Tk, lid);
    float acc_k[NKD], acc_v[NVD];
    for (int i = 0; i < NKD; ++i) acc_k[i] = 0.0f;
    for (int i = 0; i < NVD; ++i) acc_v[i] = 0.0f;

    for (int g = 0; g < G; ++g) {
        const int hq = h * G + g;
        const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
        int start, nfull;
        const int ntiles = bs_row_span(lay_off, lay_full, (b * lay_bs + hq * lay_hs) * NKT + kt, cap, &start, &nfull);
        for (int t = 0; t < ntiles; ++t) {
            const int qt = clamp(lay_idx[start + t], 0, NQT - 1);
            const int i0 = qt * BQ, nq = min(BQ, Tq - i0);
            barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's readers are done */
            load_q_side(qs, dos, lse_s, dl_s, qpos, qseg, q, q_off, q_st, dout, do_off, do_st, lse, lse_off, lse_st,
                        delta, pos_q, pq_off, pq_st, seg_q, sq_off, sq_st, b, hq, i0, nq, Tq, Tk, HQ, lid);
            barrier(CLK_LOCAL_MEM_FENCE);
            tile_grads(qs, ks, dos, vs, ps, dzs, true, lse_s, dl_s, qpos, qseg, kpos, kseg, map, mbase, map_st, QB, KB,
                       i0, j0, nq, nk, Tq, t >= nfull, scale, softcap, wl, wr, has_seg, lid);
            barrier(CLK_LOCAL_MEM_FENCE);
            accumulate_keys(ps, dos, DV, acc_v, NVD, nq, lid);
            accumulate_keys(dzs, qs, DK, acc_k, NKD, nq, lid);
        }
    }
    if (dk)
        for (int i = 0; i < NKD; ++i) {
            int j, d;
            if (tile_elem(KV_BLOCK, i, lid, WG, BK, DK, &j, &d) && j < nk)
                STORE(dk, at4(dk_off, dk_st, b, j0 + j, h, d), acc_k[i] * scale);
        }
    if (dv)
        for (int i = 0; i < NVD; ++i) {
            int j, d;
            if (tile_elem(KV_BLOCK, i, lid, WG, BK, DV, &j, &d) && j < nk)
                STORE(dv, at4(dv_off, dv_st, b, j0 + j, h, d), acc_v[i]);
        }
}

/* NDRange (WG * NQT, HQ, B). */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void bs_bwd_dq(
    BWD_IN_PARAMS, __global store_t *dq, idx_t dq_off, idx4_t dq_st)
{
    __local float qs[BQ * DK] LOCAL_TILE, dos[BQ * DV] LOCAL_TILE, ks[BK * KPAD(DK)] LOCAL_TILE;
    __local float vs[BK * KPAD(DV)] LOCAL_TILE, ps[BQ * BK] LOCAL_TILE; /* dZ */
    __local float lse_s[BQ], dl_s[BQ];
    __local int qpos[BQ], qseg[BQ], kpos[BK], kseg[BK];
    const int lid = get_local_id(0);
    const int qt = get_group_id(0), hq = get_group_id(1), b = get_group_id(2), h = hq / G;
    const int i0 = qt * BQ, nq = min(BQ, Tq - i0);
    const int has_seg = seg_q != 0;
    delta += dl_off;
    lay_off += lo_off;
    lay_full += lf_off;
    lay_idx += li_off;

    load_q_side(qs, dos, lse_s, dl_s, qpos, qseg, q, q_off, q_st, dout, do_off, do_st, lse, lse_off, lse_st, delta,
                pos_q, pq_off, pq_st, seg_q, sq_off, sq_st, b, hq, i0, nq, Tq, Tk, HQ, lid);
    float acc[NQD];
    for (int i = 0; i < NQD; ++i) acc[i] = 0.0f;
    const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
    int start, nfull;
    const int ntiles = bs_row_span(lay_off, lay_full, (b * lay_bs + hq * lay_hs) * NQT + qt, cap, &start, &nfull);
    for (int t = 0; t < ntiles; ++t) {
        const int kt = clamp(lay_idx[start + t], 0, NKT - 1);
        const int j0 = kt * BK, nk = min(BK, Tk - j0);
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's readers are done */
        load_k_side(ks, vs, kpos, kseg, k, k_off, k_st, v, v_off, v_st, pos_k, pk_off, pk_st, seg_k, sk_off, sk_st,
                    b, h, j0, nk, Tk, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
        tile_grads(qs, ks, dos, vs, ps, ps, false, lse_s, dl_s, qpos, qseg, kpos, kseg, map, mbase, map_st, QB, KB,
                   i0, j0, nq, nk, Tq, t >= nfull, scale, softcap, wl, wr, has_seg, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
#if Q_BLOCK
        {
            int g, d;
            tile_elem(true, 0, lid, WG, BQ, DK, &g, &d);
            accumulate_block(ps, BK, g, true, ks, KPAD(DK), d, acc, nk);
        }
#else
        for (int i = 0; i < NQD; ++i) {
            int g, d;
            if (tile_elem(false, i, lid, WG, BQ, DK, &g, &d)) {
                float a = acc[i];
                for (int j = 0; j < nk; ++j) a = fma(ps[g * BK + j], ks[j * KPAD(DK) + d], a);
                acc[i] = a;
            }
        }
#endif
    }
    for (int i = 0; i < NQD; ++i) {
        int g, d;
        if (tile_elem(Q_BLOCK, i, lid, WG, BQ, DK, &g, &d) && g < nq)
            STORE(dq, at4(dq_off, dq_st, b, i0 + g, hq, d), acc[i] * scale);
    }
}

#if SINKS
/* dsinks[hq] = -sum_{b,i} exp(s - lse) * delta. NDRange (WG * HQ). Lane p
 * sums rows p, p + DSINK_LANES, ... in order; lane sums are added in order. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void bs_bwd_dsink(
    __global const float *sinks, idx_t sn_off, idx4_t sn_st, __global const float *lse, idx_t lse_off,
    idx4_t lse_st, __global const float *delta, idx_t dl_off, __global float *dsinks, idx_t ds_off, idx4_t ds_st,
    int B, int Tq, int HQ)
{
    __local float lanes[DSINK_LANES];
    const int lid = get_local_id(0), hq = get_group_id(0);
    const float s = sinks[sn_off + (idx_t)hq * sn_st.x];
    const int n = B * Tq;
    for (int p0 = 0; p0 < DSINK_LANES; p0 += WG) {
        const int p = p0 + lid;
        if (p >= DSINK_LANES) break;
        float acc = 0.0f;
        for (int r = p; r < n; r += DSINK_LANES) {
            const int b = r / Tq, i = r - b * Tq;
            const float l = lse[lse_off + (idx_t)b * lse_st.x + (idx_t)i * lse_st.y + (idx_t)hq * lse_st.z];
            acc = fma(exp(s - l), delta[dl_off + ((idx_t)b * Tq + i) * HQ + hq], acc);
        }
        lanes[p] = acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        float total = 0.0f;
        for (int p = 0; p < DSINK_LANES; ++p) total += lanes[p];
        dsinks[ds_off + (idx_t)hq * ds_st.x] = -total;
    }
}
#endif
