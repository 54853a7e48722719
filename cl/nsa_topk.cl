/*
 * nsa_topk.cl: online top-k block selection for one token and one KV group
 * per work-group. Pass 1 finds each query head's log-sum-exp over the visible
 * compressed keys; pass 2 walks the selection blocks in chunks of JB, turns
 * the compressed scores of the chunk into probabilities summed over the G
 * heads (kept in local memory only), scores each block by the overlap rule,
 * and merges the chunk into a running top-S list. No score ever reaches
 * global memory.
 *
 * Defines: WG, G, GT (heads per pass over the group), DK, TK (compressed keys
 * per tile), BS, S, CMP_L, CMP_D, INIT_BLOCKS, LOCAL_BLOCKS, JB, PC_MAX
 * (compressed keys a chunk can overlap), HAS_COUNTS.
 * NDRange: (WG * T, H, B).
 */

inline void load_queries(__local float *qs, __global const store_t *q, idx_t q_off, idx4_t q_st,
                         int b, int t, int hq0, int ng, int lid)
{
    for (int i = lid; i < GT * DK; i += WG) {
        int g = i / DK, d = i - g * DK;
        qs[i] = (g < ng) ? LOAD(q, at4(q_off, q_st, b, t, hq0 + g, d)) : 0.0f;
    }
}

/* ps[g][j] = scale * q_g . k_j for the tile in ks (-inf past nk or ng), in
 * common.h's score tiles (TILE_SR rows by TILE_SC keys a work-item, each
 * element read feeding two products where one took two reads). */
inline void tile_scores(__local const float *qs, __local const float *ks, __local float *ps,
                        int nk, int ng, float scale, int lid)
{
    for (int it = lid; it < GT / TILE_SR * TILE_COLS; it += WG) {
        int jt, key[2];
        float dot[2][2];
        const int g0 = score_tile_qk(qs, ks, it, TILE_COLS, TILE_SR, TILE_SC, nk, &jt, key, dot);
        for (int r = 0; r < TILE_SR; ++r)
            for (int c = 0; c < TILE_SC; ++c) {
                const int g = g0 + r, j = jt + c * TILE_COLS;
                ps[g * TK + j] = j < nk && g < ng ? dot[r][c] * scale : -INFINITY;
            }
    }
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void nsa_topk(
    __global const store_t *q, idx_t q_off, idx4_t q_st,
    __global const store_t *kc, idx_t kc_off, idx4_t kc_st, int nc_rows,
    __global const int *cu, idx_t cu0, int nseq, __global const int *cmp_off, idx_t cmp_off0,
    __global const int *bcnt, idx_t bc_off, idx4_t bc_st,
    __global int *bidx, idx_t bi_off, idx4_t bi_st,
    int T, float scale)
{
    __local float qs[GT * DK] LOCAL_TILE, ks[TK * KPAD(DK)] LOCAL_TILE, ps[GT * TK] LOCAL_TILE, lse[G], pc[PC_MAX];
    __local float bsc[JB], tv[S];
    __local int ti[S];
    const int lid = get_local_id(0);
    cu += cu0;
    cmp_off += cmp_off0;
    const int t = get_group_id(0), h = get_group_id(1), b = get_group_id(2);
    const seq_info sq = seq_of(cu, nseq, b, t, T);
    const int tl = t - sq.start;
    (void)cmp_off; (void)bcnt;

    int nvis = (sq.len > 0 && tl >= CMP_L - 1) ? (tl - (CMP_L - 1)) / CMP_D + 1 : 0;
#if VARLEN
    const int row0 = cmp_off[sq.id];
#else
    const int row0 = 0;
#endif
    nvis = clamp(nc_rows - row0, 0, nvis);
    const idx_t kbase = at4(kc_off, kc_st, b, row0, h, 0);

    /* Pass 1: lse of each head over the visible compressed keys. */
    for (int g0 = 0; g0 < G; g0 += GT) {
        const int ng = min(GT, G - g0);
        float m_run = -INFINITY, l_run = 0.0f; /* meaningful in work-item g < ng */
        load_queries(qs, q, q_off, q_st, b, t, h * G + g0, ng, lid);
        for (int k0 = 0; k0 < nvis; k0 += TK) {
            const int nk = min(TK, nvis - k0);
            barrier(CLK_LOCAL_MEM_FENCE);
            load_tile(ks, KPAD(DK), nk, DK, kc, kbase + (idx_t)k0 * kc_st.y, kc_st.y, kc_st.w, lid, WG);
            barrier(CLK_LOCAL_MEM_FENCE);
            tile_scores(qs, ks, ps, nk, ng, scale, lid);
            barrier(CLK_LOCAL_MEM_FENCE);
            if (lid < ng) {
                float mx = m_run;
                for (int j = 0; j < nk; ++j) mx = fmax(mx, ps[lid * TK + j]);
                float sum = 0.0f;
                for (int j = 0; j < nk; ++j) sum += exp(ps[lid * TK + j] - mx);
                l_run = l_run * exp(m_run - mx) + sum;
                m_run = mx;
            }
        }
        if (lid < ng) lse[g0 + lid] = l_run > 0.0f ? m_run + log(l_run) : -INFINITY;
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* Pass 2: block importance chunk by chunk, merged into the top-S list. */
    for (int i = lid; i < S; i += WG) {
        tv[i] = -INFINITY;
        ti[i] = -1;
    }
    const int cur = tl / BS, ncand = sq.len > 0 ? cur + 1 : 0;
    for (int j0 = 0; j0 < ncand; j0 += JB) {
        const int nj = min(JB, ncand - j0);
        const int2 pr = cmp_keys_of_blocks(j0, j0 + nj, nvis);
        const int i_lo = pr.x, i_hi = pr.y, npc = i_hi - i_lo;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = lid; i < PC_MAX; i += WG) pc[i] = 0.0f;
        for (int g0 = 0; g0 < G; g0 += GT) {
            const int ng = min(GT, G - g0);
            if (G > GT) {
                barrier(CLK_LOCAL_MEM_FENCE);
                load_queries(qs, q, q_off, q_st, b, t, h * G + g0, ng, lid);
            }
            for (int k0 = 0; k0 < npc; k0 += TK) {
                const int nk = min(TK, npc - k0);
                barrier(CLK_LOCAL_MEM_FENCE);
                load_tile(ks, KPAD(DK), nk, DK, kc, kbase + (idx_t)(i_lo + k0) * kc_st.y, kc_st.y, kc_st.w,
                          lid, WG);
                barrier(CLK_LOCAL_MEM_FENCE);
                tile_scores(qs, ks, ps, nk, ng, scale, lid);
                barrier(CLK_LOCAL_MEM_FENCE);
                for (int j = lid; j < nk; j += WG) {
                    float p = 0.0f;
                    for (int g = 0; g < ng; ++g) {
                        float z = ps[g * TK + j], ls = lse[g0 + g];
                        p += (ls == -INFINITY) ? 0.0f : exp(z - ls);
                    }
                    pc[k0 + j] += p;
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int jj = lid; jj < nj; jj += WG) {
            bsc[jj] = block_score(pc, i_lo, i_hi, j0 + jj, cur);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid == 0)
            for (int jj = 0; jj < nj; ++jj) topk_insert(tv, ti, bsc[jj], j0 + jj);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    topk_store(tv, ti, bcnt, at4(bc_off, bc_st, b, t, h, 0), bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w, lid, WG);
}
