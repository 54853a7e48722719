/*
 * blocksparse_fwd.cl: the block-sparse attention forward. A work-group owns
 * one tile of GT query rows of one query head and visits the key tiles of
 * its layout row (FULL tiles first, then PARTIAL ones, whose elements are
 * masked), each an online-softmax step of attn_tile.h.
 *
 * Defines (besides common.h, attn_tile.h, blocksparse.h): GT = BQ query rows
 * per tile, TK = BK keys per tile, CAUSAL, WINDOW, SOFTCAP, SINKS (0 or 1).
 * NDRange (WG * NQT, HQ, B); group (query tile, query head, batch row).
 */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void bs_fwd(
    __global const store_t *q, idx_t q_off, idx4_t q_st,
    __global const store_t *k, idx_t k_off, idx4_t k_st,
    __global const store_t *v, idx_t v_off, idx4_t v_st,
    __global const int *pos_q, idx_t pq_off, idx4_t pq_st,
    __global const int *pos_k, idx_t pk_off, idx4_t pk_st,
    __global const int *seg_q, idx_t sq_off, idx4_t sq_st,
    __global const int *seg_k, idx_t sk_off, idx4_t sk_st,
    __global const float *sinks, idx_t sn_off, idx4_t sn_st,
    __global const int *map, idx_t map_off, idx4_t map_st, int QB, int KB,
    __global const int *lay_off, idx_t lo_off, __global const int *lay_full, idx_t lf_off,
    __global const int *lay_cols, idx_t lc_off, int cap, int lay_bs, int lay_hs, int NQT, int NKT,
    __global store_t *o, idx_t o_off, idx4_t o_st,
    __global float *lse, idx_t lse_off, idx4_t lse_st,
    int Tq, int Tk, int G, float scale, float softcap, int wl, int wr)
{
    __local float qs[GT * DK], ks[TK * KPAD(DK)], vs[TK * DV], ps[GT * TK], m_run[GT], l_run[GT], alpha[GT];
    __local int qpos[GT], qseg[GT], kpos[TK], kseg[TK];
    const int lid = get_local_id(0);
    const int qt = get_group_id(0), hq = get_group_id(1), b = get_group_id(2), h = hq / G;
    const int i0 = qt * GT, nq = min(GT, Tq - i0);
    const int has_seg = seg_q != 0;
    lay_off += lo_off;
    lay_full += lf_off;
    lay_cols += lc_off;

    for (int i = lid; i < GT * DK; i += WG) {
        const int g = i / DK, d = i - g * DK;
        qs[i] = g < nq ? LOAD(q, at4(q_off, q_st, b, i0 + g, hq, d)) : 0.0f;
    }
    for (int g = lid; g < GT; g += WG) {
        const int i = min(i0 + g, Tq - 1);
        qpos[g] = pos_q ? pos_q[bs_at2(pq_off, pq_st, b, i)] : i + (Tk - Tq);
        qseg[g] = has_seg ? seg_q[bs_at2(sq_off, sq_st, b, i)] : 0;
    }
    float acc[ACC_N];
    attn_reset(ATTN_SMEM, acc, lid);
    barrier(CLK_LOCAL_MEM_FENCE);

    const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
    int start, nfull;
    const int ntiles = bs_row_span(lay_off, lay_full, (b * lay_bs + hq * lay_hs) * NQT + qt, cap, &start, &nfull);
    /* ntiles is uniform over the work-group: the barriers below are safe. */
    for (int t = 0; t < ntiles; ++t) {
        const int kt = clamp(lay_cols[start + t], 0, NKT - 1);
        const bool partial = t >= nfull;
        const int j0 = kt * TK, nk = min(TK, Tk - j0);
        load_tile(ks, KPAD(DK), nk, DK, k, at4(k_off, k_st, b, j0, h, 0), k_st.y, k_st.w, lid, WG);
        load_tile(vs, DV, nk, DV, v, at4(v_off, v_st, b, j0, h, 0), v_st.y, v_st.w, lid, WG);
        for (int j = lid; j < TK; j += WG) {
            const int jj = min(j0 + j, Tk - 1);
            kpos[j] = pos_k ? pos_k[bs_at2(pk_off, pk_st, b, jj)] : jj;
            kseg[j] = has_seg ? seg_k[bs_at2(sk_off, sk_st, b, jj)] : 0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int x0 = 0; x0 < GT * TK; x0 += WG) {
            const int idx = x0 + lid;
            if (idx >= GT * TK) break;
            const int g = idx / TK, j = idx - g * TK;
            float s = -INFINITY;
            if (j < nk &&
                (!partial || bs_visible(qpos[g], qseg[g], kpos[j], kseg[j], wl, wr, has_seg,
                                        bs_map_on(map, mbase, map_st.z, map_st.w, QB, KB, min(i0 + g, Tq - 1), j0 + j)))) {
                float dcap;
                s = bs_score(tile_dot(ATTN_SMEM, g, j), scale, softcap, &dcap);
            }
            ps[idx] = s;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        attend_scores(ATTN_SMEM, acc, nk, lid);
    }

    /* Normalization. With a sink s: total = l*exp(m) + exp(s), computed
     * around M = max(m, s) so that neither term overflows. */
#if SINKS
    const float sink = sinks[sn_off + (idx_t)hq * sn_st.x];
#endif
    for (int i = 0; i < ACC_N; ++i) {
        const int idx = lid + i * WG;
        const int g = idx / DV, d = idx - g * DV;
        if (idx < GT * DV && g < nq) {
#if SINKS
            const float m = m_run[g], l = l_run[g];
            float val = 0.0f;
            if (l > 0.0f) {
                const float M = fmax(m, sink), em = exp(m - M);
                val = acc[i] * em / (l * em + exp(sink - M));
            }
#else
            const float val = attn_out(ATTN_SMEM, acc[i], g);
#endif
            STORE(o, at4(o_off, o_st, b, i0 + g, hq, d), val);
        }
    }
    if (lse)
        for (int g = lid; g < nq; g += WG) {
#if SINKS
            const float m = m_run[g], l = l_run[g];
            float r = sink;
            if (l > 0.0f) {
                const float M = fmax(m, sink);
                r = M + log(l * exp(m - M) + exp(sink - M));
            }
#else
            const float r = attn_lse(ATTN_SMEM, g);
#endif
            lse[lse_off + (idx_t)b * lse_st.x + (idx_t)(i0 + g) * lse_st.y + (idx_t)hq * lse_st.z] = r;
        }
#if !SINKS
    (void)sinks;
    (void)sn_off;
    (void)sn_st;
#endif
}
