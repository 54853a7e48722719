/*
 * nsa_topk_warp.h: the online top-k of the tensor-core path, shared by its
 * kernel (nsa_topk_warp.cl) and the NSA forward that runs it between its
 * compressed and selected branches (nsa_fwd_warp.cl, FUSED_TOPK): a warp
 * per token and KV group, its G heads in tiles of 16 rows (warp_attn.h).
 * The log-sum-exp of each head over the visible compressed keys comes from
 * pass 1 (topk_lse) or the compressed branch; pass 2 (topk_select) walks
 * the selection blocks in chunks of JB, sums each compressed key's
 * probability over the G heads (a column sum of the score fragments),
 * scores the blocks by the overlap rule and merges them into the warp's
 * top-S list (nsa_topk_list.h). No score reaches global memory.
 *
 * Defines: G, NGT = ceil(G/16), DK, KC, BS, S, CMP_L, CMP_D, INIT_BLOCKS,
 * LOCAL_BLOCKS, JB, PC_MAX, HAS_COUNTS.
 */

/* The query fragments of head tile `tile` of a token's G heads (head g at
 * qh + g*hs; rows past G are zero). */
inline void topk_queries(__global const store_t *qh, idx_t hs, int tile, word_t *qa)
{
    const int r0 = tile * 16 + (lane_id() >> 2);
    load_afrag(qh + (idx_t)r0 * hs, r0 < G, qh + (idx_t)(r0 + 8) * hs, r0 + 8 < G, DK, qa);
}

/* Pass 1: lse2 (log2 units) of the tile's rows over n keys; +inf for a row
 * past G or one that sees nothing, so that pass 2 gives it zeros from exp2
 * itself (topk_add_probs), as nsa_cmp_topk_wgmma.cl's rows do. */
inline void topk_lse(const word_t *qa, int tile, __global const store_t *k, idx_t k_rs, int n, float sl2, float *lse2,
                     __local uint *ws)
{
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, s[KC / 2], alpha[2];
    for (int c0 = 0; c0 < n; c0 += KC) {
        const int hi = min(KC, n - c0);
        warp_scores(s, qa, k + (idx_t)c0 * k_rs, k_rs, 0, hi, 0, ws);
        warp_softmax_masked(s, sl2, hi, m, l, alpha, ws);
    }
    const int gq = lane_id() >> 2;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float lt = quad_sum(l[r], ws);
        lse2[r] = lt > 0.0f && tile * 16 + gq + 8 * r < G ? m[r] + log2(lt) : INFINITY;
    }
}

/* Adds to colp[2*nb + e] the probabilities of the lane's two rows in
 * column 8*nb + 2t + e of the chunk's scores s (masked, not scaled: sl2
 * rides in the exponentials). A row that sees nothing has lse2 +inf
 * (topk_lse), so exp2 itself gives its zeros with no test an element. */
inline void topk_add_probs(const float *s, float sl2, const float *lse2, float *colp)
{
#pragma unroll
    for (int nb = 0; nb < KC / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            colp[2 * nb + e] += exp2(s[4 * nb + e] * sl2 - lse2[0]) + exp2(s[4 * nb + 2 + e] * sl2 - lse2[1]);
}

/* Pass 2: scores the selection blocks 0 .. ncand-1 (cur: the query's own
 * block) JB at a time from the probabilities of the compressed keys they
 * overlap (kb: the first visible one, row stride k_rs; nvis visible),
 * summed over the G heads (query tiles from qh, head stride hs; qa holds
 * tile 0 on entry; lse2: two rows' log-sum-exp per tile, log2 units), and
 * merges them into the list. pc: the warp's PC_MAX floats. */
inline void topk_select(word_t *qa, __global const store_t *qh, idx_t hs, const float *lse2,
                        __global const store_t *kb, idx_t k_rs, int nvis, int cur, int ncand, float sl2,
                        __local float *pc, topk_list *list, __local uint *ws)
{
    const int lane = lane_id(), tq = lane & 3;
    for (int j0 = 0; j0 < ncand; j0 += JB) {
        const int nj = min(JB, ncand - j0);
        const int2 pr = cmp_keys_of_blocks(j0, j0 + nj, nvis);
        const int i_lo = pr.x, npc = pr.y - pr.x;
        for (int k0 = 0; k0 < npc; k0 += KC) {
            const int hi = min(KC, npc - k0);
            float colp[KC / 4], s[KC / 2], mx[2];
            for (int i = 0; i < KC / 4; ++i) colp[i] = 0.0f;
            for (int tile = 0; tile < NGT; ++tile) {
                if (NGT > 1) topk_queries(qh, hs, tile, qa);
                warp_scores(s, qa, kb + (idx_t)(i_lo + k0) * k_rs, k_rs, 0, hi, 0, ws);
                if (hi < KC) warp_mask(s, hi, mx); /* whole chunks: every key visible */
                topk_add_probs(s, sl2, lse2 + 2 * tile, colp);
            }
            /* colp[i] is column 8(i/2) + 2tq + i%2 */
            int i0;
            column_sums(colp, KC / 4, &i0, ws);
            const bool owner = COLSUM_OWNER(KC / 4);
#pragma unroll
            for (int u = 0; u < COLSUM_HELD(KC / 4); ++u) {
                const int i = i0 + u, c = 8 * (i >> 1) + 2 * tq + (i & 1);
                if (owner && c < hi) pc[k0 + c] = colp[u];
            }
        }
        warp_sync(ws);
        /* Only blocks better than the list's last entry can enter it. */
        float last = list_last(list, ws);
        for (int base = 0; base < nj; base += WARP) {
            const int jj = base + lane;
            const float sc = jj < nj ? block_score(pc, i_lo, pr.y, j0 + jj, cur) : -INFINITY;
            const bool enters = jj < nj && sc > last;
            last = list_add_round(list, enters, sc, j0 + base, ws);
        }
        warp_sync(ws); /* pc is read; the next chunk writes it */
    }
}
