/*
 * nsa_fwd.cl: the NSA forward for one token and GT query heads of one KV
 * group per work-group: compressed, selected and sliding-window branches in
 * turn, each an online softmax over contiguous key ranges (attn_tile.h), their
 * gated sum written once. The queries stay in local memory for all three
 * branches, and each key tile is fetched once for the GT heads.
 *
 * Defines (besides common.h and attn_tile.h): G (heads per KV group),
 * NGT = ceil(G/GT), HAS_CMP, HAS_SLC, HAS_SWA, HAS_COUNTS, BS (selection
 * block), S (slots per row), CMP_L, CMP_D, WINDOW.
 * NDRange: (WG * T * NGT, H, B); group (t*NGT + head tile, kv head, batch).
 *
 * With BWD_PRE the same kernel is the backward's prologue: it recomputes each
 * branch's output o_b, and instead of o it reads the output gradient (in the
 * `o` argument) and writes, per query row, dg_b = do . o_b (to the optional
 * dg tensors) and the softmax correction D_b = g_b * dg_b (f32, in the lse
 * arguments). Rows are reduced in a fixed order: deterministic.
 */

/* Adds gate * (branch output) to out[], saves the branch lse and, when
 * asked (ob), the ungated branch output. */
inline void finish_branch(ATTN_SMEM_PARAMS, const float acc[ACC_N], float out[ACC_N], int lid, int ng,
                          __global const store_t *gate, idx_t gate_base, idx_t gate_hs,
                          __global float *lse, idx_t lse_base, idx_t lse_hs,
                          __global store_t *ob, idx_t ob_base, idx_t ob_hs, idx_t ob_ds)
{
    for (int i = 0; i < ACC_N; ++i) {
        int g, d;
        if (!acc_elem(i, lid, &g, &d) || g >= ng) continue;
        const float x = attn_out(ATTN_SMEM, acc[i], g);
        out[i] += LOAD(gate, gate_base + g * gate_hs) * x;
        if (ob) STORE(ob, ob_base + g * ob_hs + d * ob_ds, x);
    }
    if (lse)
        for (int g = lid; g < ng; g += WG) lse[lse_base + g * lse_hs] = attn_lse(ATTN_SMEM, g);
}

/* Backward prologue: per row, dg = do . o_b summed in a fixed order. */
inline void finish_branch_pre(ATTN_SMEM_PARAMS, const float acc[ACC_N], __local float *red, int lid,
                              int ng, __global const store_t *dout, idx_t do_base, idx_t do_hs,
                              idx_t do_ds, __global const store_t *gate, idx_t gate_base,
                              idx_t gate_hs, __global float *dlt, idx_t dlt_base, idx_t dlt_hs,
                              __global store_t *dg, idx_t dg_base, idx_t dg_hs)
{
    for (int i = 0; i < ACC_N; ++i) {
        int g, d;
        if (acc_elem(i, lid, &g, &d))
            red[g * DV + d] = g < ng ? LOAD(dout, do_base + g * do_hs + d * do_ds) * attn_out(ATTN_SMEM, acc[i], g)
                              : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int g0 = 0; g0 < ng; g0 += WG) {
        const int g = g0 + lid;
        if (g >= ng) break;
        float sum = 0.0f;
        for (int d = 0; d < DV; ++d) sum += red[g * DV + d];
        if (dg) STORE(dg, dg_base + g * dg_hs, sum);
        dlt[dlt_base + g * dlt_hs] = LOAD(gate, gate_base + g * gate_hs) * sum;
    }
}

/* A branch is done: X names its tensors (cmp, slc, swa) and x their
 * offsets and strides (c, s, w), as the kernel arguments spell them. */
#if BWD_PRE
#define FINISH(X, x)                                                                                    \
    finish_branch_pre(ATTN_SMEM, acc, red, lid, ng, o, at4(o_off, o_st, b, t, hq0, 0), o_st.z, o_st.w,  \
                      g_##X, at4(g##x##_off, g##x##_st, b, t, hq0, 0), g##x##_st.z, lse_##X,           \
                      at4(l##x##_off, l##x##_st, b, t, hq0, 0), l##x##_st.z, dg_##X,                   \
                      at4(d##x##_off, d##x##_st, b, t, hq0, 0), d##x##_st.z)
#else
#define FINISH(X, x)                                                                                    \
    finish_branch(ATTN_SMEM, acc, out, lid, ng, g_##X, at4(g##x##_off, g##x##_st, b, t, hq0, 0),        \
                  g##x##_st.z, lse_##X, at4(l##x##_off, l##x##_st, b, t, hq0, 0), l##x##_st.z, o_##X,   \
                  at4(o##x##_off, o##x##_st, b, t, hq0, 0), o##x##_st.z, o##x##_st.w)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void nsa_fwd(
    NSA_QUERY_ARGS, NSA_FWD_OUT_ARGS)
{
    __local float qs[GT * DK] LOCAL_TILE, ks[TK * KPAD(DK)] LOCAL_TILE, vs[TK * VPAD] LOCAL_TILE;
    __local float ps[GT * TK] LOCAL_TILE, m_run[GT], l_run[GT], alpha[GT];
#if BWD_PRE
    __local float red[GT * DV] LOCAL_TILE;
#endif
    const int lid = get_local_id(0);
    cu += cu0;
    cmp_off += cmp_off0;
    const int t = get_group_id(0) / NGT, g0 = (get_group_id(0) % NGT) * GT;
    const int h = get_group_id(1), b = get_group_id(2);
    const int ng = min(GT, G - g0), hq0 = h * G + g0;
    const seq_info sq = seq_of(cu, nseq, b, t, T);
    const int tl = t - sq.start; /* local position */

    for (int i = lid; i < GT * DK; i += WG) {
        int g = i / DK, d = i - g * DK;
        qs[i] = (g < ng) ? LOAD(q, at4(q_off, q_st, b, t, hq0 + g, d)) : 0.0f;
    }
    float acc[ACC_N], out[ACC_N];
    for (int i = 0; i < ACC_N; ++i) out[i] = 0.0f;
    (void)kc; (void)vc; (void)nc_rows; (void)cmp_off; (void)bidx; (void)bcnt;
    /* Everything below is uniform over the work-group. A token outside any
     * sequence attends to nothing (o = 0, lse = -inf); barriers are never
     * inside a branch, only in loops whose trip count is then zero. */
    const bool live = sq.len > 0;

#if HAS_CMP
    attn_reset(ATTN_SMEM, acc, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    {
        const int row0 = cmp_row0(cmp_off, sq), nvis = cmp_visible(tl, live, nc_rows, row0);
        attend_range(ATTN_SMEM, acc, scale, lid, kc, at4(kc_off, kc_st, b, 0, h, 0), kc_st.y, kc_st.w,
                     vc, at4(vc_off, vc_st, b, 0, h, 0), vc_st.y, vc_st.w, row0, nvis);
    }
    FINISH(cmp, c);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

#if HAS_SLC
    attn_reset(ATTN_SMEM, acc, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    {
        const int nslots = slc_slots(bcnt, at4(bc_off, bc_st, b, t, h, 0), live);
        const idx_t kb = at4(k_off, k_st, b, sq.start, h, 0), vb = at4(v_off, v_st, b, sq.start, h, 0);
        for (int s = 0; s < nslots; ++s) {
            const int2 r = slc_slot(bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w, s, tl);
            attend_range(ATTN_SMEM, acc, scale, lid, k, kb, k_st.y, k_st.w, v, vb, v_st.y, v_st.w, r.x, r.y);
        }
    }
    FINISH(slc, s);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

#if HAS_SWA
    attn_reset(ATTN_SMEM, acc, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    {
        const int key0 = swa_key0(tl);
        idx_t kb = at4(k_off, k_st, b, sq.start, h, 0), vb = at4(v_off, v_st, b, sq.start, h, 0);
        attend_range(ATTN_SMEM, acc, scale, lid, k, kb, k_st.y, k_st.w, v, vb, v_st.y, v_st.w, key0,
                     live ? tl + 1 - key0 : 0);
    }
    FINISH(swa, w);
#endif

#if !BWD_PRE
    for (int i = 0; i < ACC_N; ++i) {
        int g, d;
        if (acc_elem(i, lid, &g, &d) && g < ng) STORE(o, at4(o_off, o_st, b, t, hq0 + g, d), out[i]);
    }
#endif
}
