/*
 * nsa_bwd_dq.cl: dq of the NSA backward, one token and GT query heads of one
 * KV group per work-group, the three branches in turn over the same key
 * ranges as the forward (nsa_ranges.h). dq is owned by its query: written
 * once, no atomics. Per key tile, in one pass:
 *   p = exp(scale q.k - lse_b),  ds = p * (g_b do.v - D_b),  dq += scale ds k
 * with lse_b saved by the forward and D_b = g_b * (do . o_b) from the
 * prologue (nsa_fwd.cl with BWD_PRE).
 * DS_KEEP: the selected branch's ds comes from what its dk/dv pass kept
 * (nsa_bwd_dkdv.cl, at ds + ds0), so that branch takes one product, dq,
 * instead of three.
 *
 * Defines: WG, G, GT, NGT, DK, DV, TK, DQ_N = ceil(GT*DK/WG), HAS_CMP,
 * HAS_SLC, HAS_SWA, HAS_COUNTS, BS, S, CMP_L, CMP_D, WINDOW, DS_KEEP, KSP.
 * NDRange: (WG * T * NGT, H, B).
 */

#define DQ_SMEM_PARAMS                                                                          \
    __local float *qs, __local float *dos, __local float *ks, __local float *vs, __local float *ps, \
        __local float *row_lse, __local float *row_d, __local float *row_g
#define DQ_SMEM qs, dos, ks, vs, ps, row_lse, row_d, row_g

#define DQ_ONE_COL (WG % DK == 0)
/* dq's outputs in 4 x 4 blocks a work-item where they are 16 a work-item
 * (common.h's accumulate_block), as the forward's P V (attn_tile.h) */
#define DQ_BLOCK BLOCK_OF(GT, DK, WG)
#define KS_FLOATS ((TK * KPAD(DK) + 3) / 4 * 4)
/* the row stride of a kept branch's K tiles: unpadded where the blocks
 * read them, 16 bytes at a time (no score loop reads them) */
#define KEPT_KS (DQ_BLOCK ? DK : KPAD(DK))
/* keys a tile where dS was kept (dq_kept_range) */
#if DS_KEEP && 2 * TK * KEPT_KS <= KS_FLOATS + TK * KPAD(DV)
#define KEPT_TK (2 * TK)
#else
#define KEPT_TK TK
#endif

/* Output element i of work-item lid: its row *g and column *d; false
 * where it lies past the tile. */
inline bool dq_elem(int i, int lid, int *g, int *d) { return tile_elem(DQ_BLOCK, i, lid, WG, GT, DK, g, d); }

/* dq += scale ps K over a tile of nk keys, already in ks (rows ks_stride
 * apart) and ps (rows of tk). */
inline void dq_accumulate(DQ_SMEM_PARAMS, float dq[DQ_N], int tk, int ks_stride, int nk, float scale, int lid)
{
    int row[DQ_N], col[DQ_N]; /* the output's row g (-1 past the tile) and column d */
    float a[DQ_N];
    for (int i = 0; i < DQ_N; ++i) {
        int g, d;
        row[i] = dq_elem(i, lid, &g, &d) ? g : -1;
        col[i] = d;
        a[i] = 0.0f;
    }
#if DQ_BLOCK
    accumulate_block(ps, tk, row[0], true, ks, ks_stride, col[0], a, nk);
#else
    accumulate_rows(ps, tk, ks, ks_stride, row, col, a, DQ_N, nk, DQ_ONE_COL);
#endif
    for (int i = 0; i < DQ_N; ++i)
        if (row[i] >= 0) dq[i] = fma(scale, a[i], dq[i]);
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* One key tile of nk keys, already in ks / vs: ds into ps (0 for keys past
 * nk, score_tile), then dq. */
inline void dq_tile(DQ_SMEM_PARAMS, float dq[DQ_N], int nk, float scale, int lid)
{
    for (int it = lid; it < GT / TILE_SR * TILE_COLS; it += WG) {
        int jt, key[2];
        float s[2][2], dp[2][2];
        const int g0 = score_tile_qk(qs, ks, it, TILE_COLS, TILE_SR, TILE_SC, nk, &jt, key, s);
        dot_tile(dos, DV, g0, vs, KPAD(DV), key, DV, TILE_SR, TILE_SC, dp);
        for (int r = 0; r < TILE_SR; ++r)
            for (int c = 0; c < TILE_SC; ++c) {
                const int g = g0 + r, j = jt + c * TILE_COLS;
                float ds = 0.0f;
                if (j < nk && row_lse[g] != -INFINITY) {
                    const float p = exp(s[r][c] * scale - row_lse[g]);
                    ds = p * (row_g[g] * dp[r][c] - row_d[g]);
                }
                ps[g * TK + j] = ds;
            }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    dq_accumulate(DQ_SMEM, dq, TK, KPAD(DK), nk, scale, lid);
}

inline void dq_range(DQ_SMEM_PARAMS, float dq[DQ_N], float scale, int lid,
                     __global const store_t *k, idx_t k_base, idx_t k_rs, idx_t k_cs,
                     __global const store_t *v, idx_t v_base, idx_t v_rs, idx_t v_cs, int key0, int n)
{
    for (int k0 = 0; k0 < n; k0 += TK) {
        int nk = min(TK, n - k0);
        idx_t r = (idx_t)(key0 + k0);
        load_tile(ks, KPAD(DK), nk, DK, k, k_base + r * k_rs, k_rs, k_cs, lid, WG);
        load_tile(vs, KPAD(DV), nk, DV, v, v_base + r * v_rs, v_rs, v_cs, lid, WG);
        barrier(CLK_LOCAL_MEM_FENCE);
        dq_tile(DQ_SMEM, dq, nk, scale, lid);
    }
}

#if DS_KEEP
/* The n keys from key0 of a selected block, whose ds the dk/dv pass kept
 * in the region from `region` (heads from g0, ng of them), KEPT_TK keys a
 * tile: the K tile takes V's room too, so that this branch, one product a
 * tile where the others take three, has half the barriers and loads. */
inline void dq_kept_range(DQ_SMEM_PARAMS, float dq[DQ_N], float scale, int lid, __global const store_t *k,
                          idx_t k_base, idx_t k_rs, idx_t k_cs, __global const store_t *ds, long region, int g0, int ng,
                          int key0, int n)
{
    for (int k0 = 0; k0 < n; k0 += KEPT_TK) {
        const int nk = min(KEPT_TK, n - k0);
        load_tile(ks, KEPT_KS, nk, DK, k, k_base + (idx_t)(key0 + k0) * k_rs, k_rs, k_cs, lid, WG);
        for (int i = lid; i < GT * KEPT_TK; i += WG) { /* a key's heads side by side, as they are kept */
            const int j = i / GT, g = rem_of(i, j, GT);
            ps[g * KEPT_TK + j] = j < nk && g < ng ? LOAD(ds, region + ds_elem(k0 + j, g0 + g)) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        dq_accumulate(DQ_SMEM, dq, KEPT_TK, KEPT_KS, nk, scale, lid);
    }
}
#endif

/* Per-row lse, D and gate of one branch into local memory. */
inline void dq_rows(DQ_SMEM_PARAMS, int ng, int lid, __global const float *lse, idx_t lse_base, idx_t lse_hs,
                    __global const float *dlt, idx_t dlt_base, idx_t dlt_hs,
                    __global const store_t *gate, idx_t gate_base, idx_t gate_hs)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int g0 = 0; g0 < GT; g0 += WG) {
        const int g = g0 + lid;
        if (g >= GT) break;
        row_lse[g] = g < ng ? lse[lse_base + g * lse_hs] : -INFINITY;
        row_d[g] = g < ng ? dlt[dlt_base + g * dlt_hs] : 0.0f;
        row_g[g] = g < ng ? LOAD(gate, gate_base + g * gate_hs) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void nsa_bwd_dq(
    NSA_QUERY_ARGS, NSA_DQ_OUT_ARGS DQ_DS_ARGS)
{
    __local float qs[GT * DK] LOCAL_TILE, dos[GT * DV] LOCAL_TILE, ps[GT * KEPT_TK] LOCAL_TILE;
#if KEPT_TK > TK
    /* the K and V tiles side by side (V's from a 16-byte boundary), so
     * that the kept branch's K tiles can take both */
    __local float kv[KS_FLOATS + TK * KPAD(DV)] LOCAL_TILE;
    __local float *ks = kv, *vs = kv + KS_FLOATS;
#else /* apart: through one array's pointers, dq took 2.5% longer */
    __local float ks[TK * KPAD(DK)] LOCAL_TILE, vs[TK * KPAD(DV)] LOCAL_TILE;
#endif
    __local float row_lse[GT], row_d[GT], row_g[GT];
    const int lid = get_local_id(0);
    cu += cu0;
    cmp_off += cmp_off0;
    const int t = get_group_id(0) / NGT, g0 = (get_group_id(0) % NGT) * GT;
    const int h = get_group_id(1), b = get_group_id(2);
    const int ng = min(GT, G - g0), hq0 = h * G + g0;
    const seq_info sq = seq_of(cu, nseq, b, t, T);
    const int tl = t - sq.start;
    const bool live = sq.len > 0;
    (void)kc; (void)vc; (void)nc_rows; (void)cmp_off; (void)bidx; (void)bcnt;

    for (int i = lid; i < GT * DK; i += WG) {
        int g = i / DK, d = i - g * DK;
        qs[i] = (g < ng) ? LOAD(q, at4(q_off, q_st, b, t, hq0 + g, d)) : 0.0f;
    }
    for (int i = lid; i < GT * DV; i += WG) {
        int g = i / DV, d = i - g * DV;
        dos[i] = (g < ng) ? LOAD(dout, at4(do_off, do_st, b, t, hq0 + g, d)) : 0.0f;
    }
    float dq[DQ_N];
    for (int i = 0; i < DQ_N; ++i) dq[i] = 0.0f;

#if HAS_CMP
    dq_rows(DQ_SMEM, ng, lid, lse_cmp, at4(lc_off, lc_st, b, t, hq0, 0), lc_st.z, d_cmp,
            at4(xc_off, xc_st, b, t, hq0, 0), xc_st.z, g_cmp, at4(gc_off, gc_st, b, t, hq0, 0), gc_st.z);
    {
        const int row0 = cmp_row0(cmp_off, sq), nvis = cmp_visible(tl, live, nc_rows, row0);
        dq_range(DQ_SMEM, dq, scale, lid, kc, at4(kc_off, kc_st, b, 0, h, 0), kc_st.y, kc_st.w, vc,
                 at4(vc_off, vc_st, b, 0, h, 0), vc_st.y, vc_st.w, row0, nvis);
    }
#endif
#if HAS_SLC
#if !DS_KEEP
    dq_rows(DQ_SMEM, ng, lid, lse_slc, at4(ls_off, ls_st, b, t, hq0, 0), ls_st.z, d_slc,
            at4(xs_off, xs_st, b, t, hq0, 0), xs_st.z, g_slc, at4(gs_off, gs_st, b, t, hq0, 0), gs_st.z);
#endif
    {
        const int nslots = slc_slots(bcnt, at4(bc_off, bc_st, b, t, h, 0), live);
        const idx_t kb = at4(k_off, k_st, b, sq.start, h, 0), vb = at4(v_off, v_st, b, sq.start, h, 0);
        for (int s = 0; s < nslots; ++s) {
            const int2 r = slc_slot(bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w, s, tl);
#if DS_KEEP
            (void)vb;
            dq_kept_range(DQ_SMEM, dq, scale, lid, k, kb, k_st.y, k_st.w, ds,
                          ds0 + ds_slot_region(b, t, h, get_num_groups(1), T, s), g0, ng, r.x, r.y);
#else
            dq_range(DQ_SMEM, dq, scale, lid, k, kb, k_st.y, k_st.w, v, vb, v_st.y, v_st.w, r.x, r.y);
#endif
        }
    }
#endif
#if HAS_SWA
    dq_rows(DQ_SMEM, ng, lid, lse_swa, at4(lw_off, lw_st, b, t, hq0, 0), lw_st.z, d_swa,
            at4(xw_off, xw_st, b, t, hq0, 0), xw_st.z, g_swa, at4(gw_off, gw_st, b, t, hq0, 0), gw_st.z);
    {
        const int key0 = swa_key0(tl);
        const idx_t kb = at4(k_off, k_st, b, sq.start, h, 0), vb = at4(v_off, v_st, b, sq.start, h, 0);
        dq_range(DQ_SMEM, dq, scale, lid, k, kb, k_st.y, k_st.w, v, vb, v_st.y, v_st.w, key0,
                 live ? tl + 1 - key0 : 0);
    }
#endif

    for (int i = 0; i < DQ_N; ++i) {
        int g, d;
        if (dq_elem(i, lid, &g, &d) && g < ng) STORE(dq_out, at4(dq_off, dq_st, b, t, hq0 + g, d), dq[i]);
    }
}
