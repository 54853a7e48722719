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

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void bs_fwd(FWD_PARAMS)
{
    __local float qs[GT * DK] LOCAL_TILE, ks[TK * KPAD(DK)] LOCAL_TILE, vs[TK * VPAD] LOCAL_TILE;
    __local float ps[GT * TK] LOCAL_TILE, m_run[GT], l_run[GT], alpha[GT];
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
        load_tile(vs, VPAD, nk, DV, v, at4(v_off, v_st, b, j0, h, 0), v_st.y, v_st.w, lid, WG);
        for (int j = lid; j < TK; j += WG) {
            const int jj = min(j0 + j, Tk - 1);
            kpos[j] = pos_k ? pos_k[bs_at2(pk_off, pk_st, b, jj)] : jj;
            kseg[j] = has_seg ? seg_k[bs_at2(sk_off, sk_st, b, jj)] : 0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int x0 = 0; x0 < GT / TILE_SR * TILE_COLS; x0 += WG) {
            const int it = x0 + lid;
            if (it >= GT / TILE_SR * TILE_COLS) break;
            int jt, key[2];
            float dot[2][2];
            const int g0 = score_tile_qk(qs, ks, it, TILE_COLS, TILE_SR, TILE_SC, nk, &jt, key, dot);
            for (int r = 0; r < TILE_SR; ++r)
                for (int c = 0; c < TILE_SC; ++c) {
                    const int g = g0 + r, j = jt + c * TILE_COLS;
                    float s = -INFINITY;
                    if (j < nk && (!partial || bs_visible(qpos[g], qseg[g], kpos[j], kseg[j], wl, wr, has_seg,
                                                          bs_map_on(map, mbase, map_st.z, map_st.w, QB, KB,
                                                                    min(i0 + g, Tq - 1), j0 + j)))) {
                        float dcap;
                        s = bs_score(dot[r][c], scale, softcap, &dcap);
                    }
                    ps[g * TK + j] = s;
                }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        attend_scores(ATTN_SMEM, acc, nk, lid);
    }

    /* Normalization (with a sink: bs_sink_norm). */
#if SINKS
    const float sink = sinks[sn_off + (idx_t)hq * sn_st.x];
#endif
    for (int i = 0; i < ACC_N; ++i) {
        int g, d;
        if (acc_elem(i, lid, &g, &d) && g < nq) {
#if SINKS
            float f;
            bs_sink_norm(m_run[g], l_run[g], sink, &f);
            const float val = acc[i] * f;
#else
            const float val = attn_out(ATTN_SMEM, acc[i], g);
#endif
            STORE(o, at4(o_off, o_st, b, i0 + g, hq, d), val);
        }
    }
    if (lse)
        for (int g = lid; g < nq; g += WG) {
#if SINKS
            float f;
            const float r = bs_sink_norm(m_run[g], l_run[g], sink, &f);
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
