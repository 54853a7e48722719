/*
 * nsa_topk_warp.cl: the tensor-core path of the online top-k (same kernel
 * name, arguments and results as nsa_topk.cl): one warp per token and KV
 * group, its G heads in tiles of 16 rows (warp_attn.h). Pass 1 gives each
 * head's log-sum-exp over the visible compressed keys; pass 2 walks the
 * selection blocks in chunks of JB, sums each compressed key's probability
 * over the G heads (a column sum of the score fragments), scores the blocks
 * by the overlap rule and merges the chunk into the warp's top-S list: the
 * lanes test their blocks against the list's last entry at once, and only
 * the blocks that pass are inserted, in block order. No score reaches
 * global memory.
 *
 * Defines: G, NGT = ceil(G/16), NW, DK, KC, BS, S, CMP_L, CMP_D,
 * INIT_BLOCKS, LOCAL_BLOCKS, JB, PC_MAX, HAS_COUNTS.
 * NDRange: (32 * NW * ceil(T / NW), H, B).
 */

/* The query fragments of head tile `tile` (rows past G are zero). */
inline void topk_queries(__global const store_t *q, idx_t q_off, idx4_t q_st, int b, int t, int h, int tile, uint *qa)
{
    const int gq = lane_id() >> 2, r0 = tile * 16 + gq;
    load_afrag(q + at4(q_off, q_st, b, t, h * G + r0, 0), r0 < G, q + at4(q_off, q_st, b, t, h * G + r0 + 8, 0),
               r0 + 8 < G, DK, qa);
}

/* Pass 1: lse2 (log2 units) of the tile's rows over n keys; -inf for a row
 * past G or one that sees nothing. */
inline void topk_lse(const uint *qa, int tile, __global const store_t *k, idx_t k_rs, int n, float sl2, float *lse2,
                     __local uint *ws)
{
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, s[KC / 2], mx[2], alpha[2];
    for (int c0 = 0; c0 < n; c0 += KC) {
        const int hi = min(KC, n - c0);
        warp_scores(s, qa, k + (idx_t)c0 * k_rs, k_rs, 0, hi, ws);
        warp_mask(s, sl2, 0, hi, 0, hi, mx);
        warp_softmax(s, mx, m, l, alpha, ws);
    }
    const int gq = lane_id() >> 2;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lt = quad_sum(l[r], ws);
        lse2[r] = lt > 0.0f && tile * 16 + gq + 8 * r < G ? m[r] + log2(lt) : -INFINITY;
    }
}

/* Adds to colp[2*nb + e] the probabilities of the lane's two rows in
 * column 8*nb + 2t + e of the chunk's scores s (log2 units, masked). */
inline void topk_add_probs(const float *s, const float *lse2, float *colp)
{
#pragma unroll
    for (int nb = 0; nb < KC / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float p0 = lse2[0] == -INFINITY ? 0.0f : exp2(s[4 * nb + e] - lse2[0]);
            const float p1 = lse2[1] == -INFINITY ? 0.0f : exp2(s[4 * nb + 2 + e] - lse2[1]);
            colp[2 * nb + e] += p0 + p1;
        }
}

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void nsa_topk(
    __global const store_t *q, idx_t q_off, idx4_t q_st,
    __global const store_t *kc, idx_t kc_off, idx4_t kc_st, int nc_rows,
    __global const int *cu, idx_t cu0, int nseq, __global const int *cmp_off, idx_t cmp_off0,
    __global const int *bcnt, idx_t bc_off, idx4_t bc_st,
    __global int *bidx, idx_t bi_off, idx4_t bi_st,
    int T, float scale)
{
    __local uint wscr[NW * WARP_SCRATCH];
    __local float tv_all[NW * S], pc_all[NW * PC_MAX], bsc_all[NW * JB];
    __local int ti_all[NW * S];
    const int warp = get_local_id(0) / WARP, lane = lane_id(), gq = lane >> 2, tq = lane & 3;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
    __local float *tv = tv_all + warp * S, *pc = pc_all + warp * PC_MAX, *bsc = bsc_all + warp * JB;
    __local int *ti = ti_all + warp * S;
    const int t = get_group_id(0) * NW + warp, h = get_group_id(1), b = get_group_id(2);
    if (t >= T) return;
    cu += cu0;
    cmp_off += cmp_off0;
    (void)cmp_off; (void)bcnt;
    const seq_info sq = seq_of(cu, nseq, b, t, T);
    const int tl = t - sq.start, row0 = cmp_row0(cmp_off, sq), nvis = cmp_visible(tl, sq.len > 0, nc_rows, row0);
    __global const store_t *kb = kc + at4(kc_off, kc_st, b, row0, h, 0);
    const float sl2 = scale * LOG2E;

    uint qa[QA_WORDS];
    float lse2[2 * NGT];
    for (int tile = 0; tile < NGT; ++tile) {
        topk_queries(q, q_off, q_st, b, t, h, tile, qa);
        topk_lse(qa, tile, kb, kc_st.y, nvis, sl2, lse2 + 2 * tile, ws);
    }

    for (int i = lane; i < S; i += WARP) {
        tv[i] = -INFINITY;
        ti[i] = -1;
    }
    const int cur = tl / BS, ncand = sq.len > 0 ? cur + 1 : 0;
    for (int j0 = 0; j0 < ncand; j0 += JB) {
        const int nj = min(JB, ncand - j0);
        const int2 pr = cmp_keys_of_blocks(j0, j0 + nj, nvis);
        const int i_lo = pr.x, npc = pr.y - pr.x;
        for (int k0 = 0; k0 < npc; k0 += KC) {
            const int hi = min(KC, npc - k0);
            float colp[KC / 4], s[KC / 2], mx[2];
            for (int i = 0; i < KC / 4; ++i) colp[i] = 0.0f;
            for (int tile = 0; tile < NGT; ++tile) {
                if (NGT > 1) topk_queries(q, q_off, q_st, b, t, h, tile, qa);
                warp_scores(s, qa, kb + (idx_t)(i_lo + k0) * kc_st.y, kc_st.y, 0, hi, ws);
                warp_mask(s, sl2, 0, hi, 0, hi, mx);
                topk_add_probs(s, lse2 + 2 * tile, colp);
            }
#pragma unroll
            for (int nb = 0; nb < KC / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float p = column_sum(colp[2 * nb + e], ws);
                    const int c = 8 * nb + 2 * tq + e;
                    if (gq == 0 && c < hi) pc[k0 + c] = p;
                }
        }
        warp_sync(ws);
        for (int jj = lane; jj < nj; jj += WARP) bsc[jj] = block_score(pc, i_lo, pr.y, j0 + jj, cur);
        warp_sync(ws);
        /* Only blocks better than the list's last entry can enter it. */
        for (int base = 0; base < nj; base += WARP) {
            const int jj = base + lane;
            const uint pass = ballot(jj < nj && bsc[jj] > tv[S - 1], ws);
            if (lane == 0)
                for (uint bits = pass; bits; bits &= bits - 1) {
                    const int i = base + (int)(31 - clz(bits & (0u - bits)));
                    topk_insert(tv, ti, bsc[i], j0 + i);
                }
            warp_sync(ws);
        }
    }

    topk_store(tv, ti, bcnt, at4(bc_off, bc_st, b, t, h, 0), bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w, lane, WARP);
}
