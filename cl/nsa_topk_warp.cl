/*
 * nsa_topk_warp.cl: the tensor-core path of the online top-k (same kernel
 * name, arguments and results as nsa_topk.cl; the method: nsa_topk_warp.h):
 * pass 1 for each head's log-sum-exp, then pass 2.
 *
 * Defines: those of nsa_topk_warp.h, NW.
 * NDRange: (32 * NW * ceil(T / NW), H, B).
 */

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void nsa_topk(
    __global const store_t *q, idx_t q_off, idx4_t q_st,
    __global const store_t *kc, idx_t kc_off, idx4_t kc_st, int nc_rows,
    __global const int *cu, idx_t cu0, int nseq, __global const int *cmp_off, idx_t cmp_off0,
    __global const int *bcnt, idx_t bc_off, idx4_t bc_st,
    __global int *bidx, idx_t bi_off, idx4_t bi_st,
    int T, float scale)
{
    __local uint wscr[NW * WARP_SCRATCH];
    __local float pc_all[NW * PC_MAX];
    const int warp = get_local_id(0) / WARP;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
    TOPK_LIST(list);
    const int t = get_group_id(0) * NW + warp, h = get_group_id(1), b = get_group_id(2);
    if (t >= T) return;
    cu += cu0;
    cmp_off += cmp_off0;
    (void)cmp_off; (void)bcnt;
    const seq_info sq = seq_of(cu, nseq, b, t, T);
    const int tl = t - sq.start, row0 = cmp_row0(cmp_off, sq), nvis = cmp_visible(tl, sq.len > 0, nc_rows, row0);
    __global const store_t *kb = kc + at4(kc_off, kc_st, b, row0, h, 0), *qh = q + at4(q_off, q_st, b, t, h * G, 0);
    const float sl2 = scale * LOG2E;

    word_t qa[QA_WORDS];
    float lse2[2 * NGT];
    for (int tile = NGT - 1; tile >= 0; --tile) { /* tile 0 last: topk_select starts with it */
        topk_queries(qh, q_st.z, tile, qa);
        topk_lse(qa, tile, kb, kc_st.y, nvis, sl2, lse2 + 2 * tile, ws);
    }
    const int cur = tl / BS;
    topk_select(qa, qh, q_st.z, lse2, kb, kc_st.y, nvis, cur, sq.len > 0 ? cur + 1 : 0, sl2, pc_all + warp * PC_MAX,
                &list, ws);
    list_store(&list, bcnt, at4(bc_off, bc_st, b, t, h, 0), bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w);
}
