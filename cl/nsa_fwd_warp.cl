/*
 * nsa_fwd_warp.cl: the tensor-core path of the NSA forward (and, with
 * BWD_PRE, of the backward prologue): the same kernel name, arguments and
 * results as nsa_fwd.cl, computed by warps (warp_attn.h). One warp owns a
 * token and a tile of 16 query heads of one KV group (heads past G are zero
 * rows), keeps the queries in registers for the three branches, and sums
 * the gated branch outputs in its slice of local memory (sum_branches).
 *
 * With FUSED_TOPK (NGT = 1, S <= 32, the compressed branch on) the warp
 * also runs the online top-k between the compressed and selected branches
 * (nsa_topk_warp.h): the compressed branch's row statistics are the top-k's
 * pass 1, so only pass 2 is left, on the queries already in registers; the
 * selection is written to bidx (block_indices) and read from the list's
 * registers. At 64k on the H200 (anchor configuration) this forward takes
 * 27.1 ms where the separate top-k kernel and the forward took 7.1 + 24.0.
 *
 * Defines (besides common.h, warp_mma.h, warp_softmax.h, warp_attn.h, nsa_ranges.h): G,
 * NGT = ceil(G/16) head tiles, NW warps per work-group, HAS_CMP, HAS_SLC,
 * HAS_SWA, HAS_COUNTS, BS, S, CMP_L, CMP_D, WINDOW, BWD_PRE, OUT_VEC (o's
 * rows aligned for vector stores), SAVE_VEC (likewise the saved branch
 * outputs'), FUSED_TOPK (then nsa_topk_warp.h and its JB, PC_MAX,
 * INIT_BLOCKS, LOCAL_BLOCKS), V_EARLY or V_STAGE (how V is read, with
 * ACC_TRANS for V_STAGE: warp_attn.h), CMP_TILE (with V_STAGE, without
 * FUSED_TOPK: the compressed rows staged once for the work-group,
 * warp_attn.h), WHOLE_SLC and WHOLE_CMP_SWA (the branches whose whole
 * chunks run unguarded: warp_attn.h's warp_attend_range), ADD_PARTIAL (1:
 * o holds the compressed branch's output on entry, ungated, from the split
 * forward's first half, nsa_cmp_topk_wgmma.cl or this kernel with
 * WRITE_PARTIAL; 2: the argument o_cmp holds it, rows aligned for 16-byte
 * reads; the kernel adds g_cmp times it to its branches), WRITE_PARTIAL
 * (that first half: the one branch, the compressed, written ungated).
 * NDRange: (32 * NW * ceil(T*NGT / NW), H, B); warp w of group x owns token
 * (x*NW + w) / NGT and head tile (x*NW + w) % NGT.
 */

/* The split forward's partial in o is o_cmp, not g_cmp * o_cmp: a convex
 * combination of value rows, it stays within the storage type's range
 * (f16's too) whatever the gates, as the whole sum of the fused kernel,
 * kept in floats, does (sum_word). */
#ifndef ADD_PARTIAL
#define ADD_PARTIAL 0
#endif
#ifndef WRITE_PARTIAL
#define WRITE_PARTIAL 0
#endif
/* SLC_SORT: the forward given the selection walks each row's blocks in
 * ascending order, as the one that runs the top-k does (nsa_topk_list.h's
 * list_ascending), so that the split and fused forwards sum a row's blocks
 * in one order. Its time is within noise: the split forward at 64k on the
 * H200 took 21.17-21.27 ms with it, 21.32 without (2026-11-30). */
#ifndef SLC_SORT
#define SLC_SORT 0
#endif

#if CMP_TILE && !ACC_TRANS
#error "CMP_TILE reads V through lds_accumulate_trans: build with ACC_TRANS 1"
#endif

/* The elements of the memory of the warps' V tiles (V_STAGE), which holds
 * the work-group's compressed tile too (CMP_TILE). */
#if CMP_TILE && 2 * WG_CHUNK > NW * KC * VT_RS
#define VT_ALL (2 * WG_CHUNK)
#else
#define VT_ALL (NW * KC * VT_RS)
#endif

/* Reads the lane's DV/4 values of row `row` (dims from 2t*DV/8). */
inline void load_row_part(__global const store_t *p, idx_t row, idx_t ds, bool valid, float *x)
{
    const int d0 = 2 * (lane_id() & 3) * (DV / 8);
#pragma unroll
    for (int e = 0; e < DV / 4; ++e) x[e] = valid ? LOAD(p, row + (idx_t)(d0 + e) * ds) : 0.0f;
}

/* The words of the sum of the branches (below): a pair of the storage type
 * (bf16 has f32's range; f32 is exact), or of floats for f16, whose range
 * a partial sum may leave where the final one does not (the gates are
 * inputs, not bounded). */
#if STORAGE == 1
typedef float2 sum_word;
inline sum_word sum_pack(float lo, float hi, __local uint *ws)
{
    (void)ws;
    return (float2)(lo, hi);
}
inline float sum_elem(sum_word w, int hi) { return hi ? w.y : w.x; }
#else
typedef word_t sum_word;
inline sum_word sum_pack(float lo, float hi, __local uint *ws) { return pack_f32x2(lo, hi, ws); }
inline float sum_elem(sum_word w, int hi) { return word_elem(w, hi); }
#endif

#if ADD_PARTIAL
/* Adds g_cmp * o (o: the split forward's compressed branch, ungated; gate:
 * g_cmp's row gq at gate_base) to the lane's rows gq and gq + 8 of acc.
 * Both rows are read before the kernel stores either: the stores may alias
 * the reads, so the compiler keeps a later row's reads behind an earlier
 * row's stores, two round trips to memory at the warp's end. Where the
 * rows allow it (OUT_VEC or ADD_PARTIAL 2: dims contiguous, 16-byte
 * aligned; 16-bit types;
 * acc in load_cols' order, its DV/4 values of a row contiguous) they come
 * in 16-byte pieces. On the H200 at 64k (2026-11-30) the forward given the
 * selection went 14.37-14.45 -> 13.77-13.84 ms against each row read
 * element by element after the last row's stores; asking L2 for the rows
 * at the warp's start (prefetch.global.L2::evict_last) lost instead (14.49
 * -> 15.06). */
inline void add_partial(float *acc, __global const store_t *o, idx_t row0, idx_t hs, idx_t ds, int ng,
                        __global const store_t *gate, idx_t gate_base, idx_t gate_hs)
{
    const int gq = lane_id() >> 2;
    float g[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) g[hr] = gq + 8 * hr < ng ? LOAD(gate, gate_base + (gq + 8 * hr) * gate_hs) : 0.0f;
#if (OUT_VEC || ADD_PARTIAL == 2) && !ACC_TRANS && STORAGE != 0 && DV % 32 == 0
    (void)ds;
    float8 x[2][DV / 32];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const bool on = gq + 8 * hr < ng;
        __global const store_t *p = o + row0 + min(gq + 8 * hr, ng - 1) * hs + row_col(DV, 0);
#pragma unroll
        for (int i = 0; i < DV / 32; ++i) x[hr][i] = on ? LOAD8(p, 8 * i) : (float8)(0.0f);
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int i = 0; i < DV / 32; ++i) {
            float xs[8];
            vstore8(x[hr][i], 0, xs);
#pragma unroll
            for (int k = 0; k < 8; ++k)
                acc[row_index(DV, hr, 8 * i + k)] = fma(g[hr], xs[k], acc[row_index(DV, hr, 8 * i + k)]);
        }
#else
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
        if (gq + 8 * hr < ng) add_row_strided(acc, o, row0 + (gq + 8 * hr) * hs, ds, DV, hr, g[hr]);
#endif
}
#endif

#if !BWD_PRE
/* The gated branch outputs are summed in the warp's slice of local memory
 * (outs: ACC_N/2 words a lane, acc's pairs rounded as sum_word says, as
 * the output is in the end): the first branch stores f * o_b there, a
 * middle one adds to it, and the last adds the slice to its own and leaves
 * the whole sum in acc for the kernel's final store. In words, not floats,
 * the slice is half the size (the L1 the driver leaves the warps grows):
 * H200, the forward that runs the top-k, 8k 1.863 -> 1.811 ms, 64k 24.71
 * -> 24.21, window 512 at 16k 5.85 -> 5.70. A program of one branch needs
 * no slice and has none: the forward given indices, whose local memory the
 * slice was, ran 16.2 -> 14.9 ms at 64k without it. Summed in o's own rows
 * instead, the sum cost the forwards of two and three branches 2.5-5%. */
inline void sum_branches(float *acc, const float *f, __local sum_word *outs, bool first, bool last, __local uint *ws)
{
    const int lane = lane_id();
#pragma unroll
    for (int i = 0; i < ACC_N; i += 2) { /* acc[i], acc[i + 1]: one row */
        const float g = f[(i >> 1) & 1];
        float x0 = g * acc[i], x1 = g * acc[i + 1];
        if (!first) {
            const sum_word w = outs[i / 2 * WARP + lane];
            x0 += sum_elem(w, 0);
            x1 += sum_elem(w, 1);
        }
        if (last) {
            acc[i] = x0;
            acc[i + 1] = x1;
        } else {
            outs[i / 2 * WARP + lane] = sum_pack(x0, x1, ws);
        }
    }
}
#endif

/* One branch's rows are final: adds gate * o_b to the sum of the branches
 * (sum_branches; `first` and `last` say where this branch falls among those
 * the program runs) and saves its lse and, when asked (ob), o_b itself
 * (forward), or writes dg_b = do . o_b and D_b = g_b dg_b (prologue). Row
 * hr of the lane is head row gq + 8*hr of the tile. */
inline void warp_branch_done(const float *m, float *l, float *acc, __local sum_word *outs, bool first, bool last, int ng,
                             __global const store_t *gate, idx_t gate_base, idx_t gate_hs,
                             __global float *lse, idx_t lse_base, idx_t lse_hs,
                             __global const store_t *dout, idx_t do_base, idx_t do_hs, idx_t do_ds,
                             __global store_t *dg, idx_t dg_base, idx_t dg_hs,
                             __global store_t *ob, idx_t ob_base, idx_t ob_hs, idx_t ob_ds, __local uint *ws)
{
    const int lane = lane_id(), gq = lane >> 2, t = lane & 3;
    float lse_r[2], f[2];
    warp_finish(m, l, lse_r, ws);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = gq + 8 * hr;
        /* the split forward's first half (WRITE_PARTIAL) leaves its branch ungated */
        const float g = r >= ng ? 0.0f : WRITE_PARTIAL ? 1.0f : LOAD(gate, gate_base + r * gate_hs);
        f[hr] = l[hr] > 0.0f ? 1.0f / l[hr] : 0.0f;
#if BWD_PRE
        float x[DV / 4], dot = 0.0f;
        load_row_part(dout, do_base + r * do_hs, do_ds, r < ng, x);
#pragma unroll
        for (int e = 0; e < DV / 4; ++e) dot = fma(x[e], row_value(acc, DV, hr, e), dot);
        dot = quad_sum(dot * f[hr], ws);
        if (t == 0 && r < ng) {
            if (dg) STORE(dg, dg_base + r * dg_hs, dot);
            lse[lse_base + r * lse_hs] = g * dot; /* the prologue's D_b */
        }
#else
#if SAVE_VEC && ACC_TRANS
        if (ob) /* the same for the whole warp */
            store_row_wide(ob + ob_base + min(r, ng - 1) * ob_hs, DV, acc, hr, f[hr], r < ng, ws);
#else
        if (ob && r < ng) {
#if SAVE_VEC
            store_row(ob + ob_base + r * ob_hs, DV, acc, hr, f[hr], ws);
#else
            store_row_strided(ob, ob_base + r * ob_hs, ob_ds, DV, acc, hr, f[hr]);
#endif
        }
#endif
        f[hr] *= g;
        if (t == 0 && r < ng && lse) lse[lse_base + r * lse_hs] = lse_r[hr];
#endif
    }
#if BWD_PRE
    (void)outs; (void)first; (void)last; (void)ob; (void)ob_base; (void)ob_hs; (void)ob_ds;
#else
    (void)dout; (void)do_base; (void)do_hs; (void)do_ds; (void)dg; (void)dg_base; (void)dg_hs;
    sum_branches(acc, f, outs, first, last, ws);
#endif
}

/* A branch is done: X names its tensors (cmp, slc, swa) and x their
 * offsets and strides (c, s, w), as the kernel arguments spell them;
 * first and last as warp_branch_done. */
#define BRANCH_DONE(X, x, first, last, dout, do_base, do_hs, do_ds, dg, dg_base, dg_hs, ob, ob_base, ob_hs, ob_ds) \
    warp_branch_done(m, l, acc, outs, first, last, ng, g_##X, at4(g##x##_off, g##x##_st, b, t, hq0, 0), g##x##_st.z, \
                     lse_##X,                                                                                     \
                     at4(l##x##_off, l##x##_st, b, t, hq0, 0), l##x##_st.z, dout, do_base, do_hs, do_ds, dg,     \
                     dg_base, dg_hs, ob, ob_base, ob_hs, ob_ds, ws)
#if BWD_PRE
#define DONE(X, x, first, last)                                                                                   \
    BRANCH_DONE(X, x, first, last, o, at4(o_off, o_st, b, t, hq0, 0), o_st.z, o_st.w, dg_##X,                     \
                at4(d##x##_off, d##x##_st, b, t, hq0, 0), d##x##_st.z, NULL, 0, 0, 0)
#else
#define DONE(X, x, first, last)                                                                                   \
    BRANCH_DONE(X, x, first, last, NULL, 0, 0, 0, NULL, 0, 0, o_##X, at4(o##x##_off, o##x##_st, b, t, hq0, 0),    \
                o##x##_st.z, o##x##_st.w)
#endif

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void nsa_fwd(
    NSA_QUERY_ARGS, NSA_FWD_OUT_ARGS)
{
    __local uint wscr[NW * WARP_SCRATCH];
#if FUSED_TOPK
    __local float pc_all[NW * PC_MAX];
#endif
    const int warp = get_local_id(0) / WARP, lane = lane_id(), gq = lane >> 2;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
#if !BWD_PRE && HAS_CMP + HAS_SLC + HAS_SWA > 1
    __local sum_word out_all[NW * ACC_N / 2 * WARP];
    __local sum_word *outs = out_all + warp * ACC_N / 2 * WARP;
#else
    __local sum_word *outs = NULL;
#endif
#if V_STAGE
    /* the warps' V tiles; with CMP_TILE, before them, the work-group's
     * compressed tile in the same memory */
    __local word4_t vt_raw[VT_ALL / 8];
    __local store_t *vt = (__local store_t *)vt_raw + warp * KC * VT_RS;
#else
    __local store_t *vt = NULL;
#endif
    const int wid = get_group_id(0) * NW + warp, t = wid / NGT, g0 = (wid % NGT) * 16;
    cu += cu0;
    cmp_off += cmp_off0;
    const int h = get_group_id(1), b = get_group_id(2);
#if CMP_TILE
    /* The work-group shares a compressed tile when its tokens are all of
     * one sequence (the same for every work-item; n_wg: what its last
     * token sees, the most of any); else (a sequence's or T's end) each
     * warp reads its own rows. */
    const int t_lo = get_group_id(0) * NW / NGT, t_hi = (get_group_id(0) * NW + NW - 1) / NGT;
    const seq_info sq_lo = seq_of(cu, nseq, b, t_lo, T), sq_hi = seq_of(cu, nseq, b, min(t_hi, T - 1), T);
    const bool wg_tile = t_hi < T && sq_lo.id == sq_hi.id && sq_lo.len > 0 && sq_hi.len > 0;
    const int n_wg = cmp_visible(t_hi - sq_hi.start, true, nc_rows, cmp_row0(cmp_off, sq_hi));
#endif
    if (t >= T) return;
    const int ng = min(16, G - g0), hq0 = h * G + g0;
    const seq_info sq = seq_of(cu, nseq, b, t, T);
    const int tl = t - sq.start;
    const bool live = sq.len > 0;
    const float sl2 = scale * LOG2E;
    const int row0 = cmp_row0(cmp_off, sq), nvis = cmp_visible(tl, live, nc_rows, row0);
    (void)kc; (void)vc; (void)nc_rows; (void)cmp_off; (void)bidx; (void)bcnt; (void)tl; (void)row0; (void)nvis;

    word_t qa[QA_WORDS];
    load_afrag(q + at4(q_off, q_st, b, t, hq0 + gq, 0), gq < ng, q + at4(q_off, q_st, b, t, hq0 + gq + 8, 0),
               gq + 8 < ng, DK, qa);
    float m[2], l[2], acc[ACC_N];

#if HAS_CMP
    warp_reset(m, l, acc);
#if CMP_TILE
    if (wg_tile)
        wg_attend_range(qa, m, l, acc, kc + at4(kc_off, kc_st, b, row0, h, 0), kc_st.y,
                        vc + at4(vc_off, vc_st, b, row0, h, 0), vc_st.y, nvis, n_wg, sl2, (__local store_t *)vt_raw, ws);
    else
#endif
        warp_attend_range(qa, m, l, acc, kc + at4(kc_off, kc_st, b, row0, h, 0), kc_st.y,
                          vc + at4(vc_off, vc_st, b, row0, h, 0), vc_st.y, nvis, sl2, WHOLE_CMP_SWA, 0, vt, ws);
    DONE(cmp, c, true, !HAS_SLC && !HAS_SWA);
#endif

#if FUSED_TOPK
    /* pass 2 of the top-k, with the compressed branch's log-sum-exp (l is
     * now each row's whole sum) */
    TOPK_LIST(list);
    {
        float lse2[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) lse2[r] = gq + 8 * r < ng && l[r] > 0.0f ? m[r] + log2(l[r]) : INFINITY;
        const int cur = tl / BS;
        topk_select(qa, q + at4(q_off, q_st, b, t, hq0, 0), q_st.z, lse2, kc + at4(kc_off, kc_st, b, row0, h, 0),
                    kc_st.y, nvis, cur, live ? cur + 1 : 0, sl2, pc_all + warp * PC_MAX, &list, ws);
        list_store(&list, bcnt, at4(bc_off, bc_st, b, t, h, 0), bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w);
    }
#endif

#if HAS_SLC
    warp_reset(m, l, acc);
    {
        const int nslots = slc_slots(bcnt, at4(bc_off, bc_st, b, t, h, 0), live);
        __global const store_t *kb = k + at4(k_off, k_st, b, sq.start, h, 0), *vb = v + at4(v_off, v_st, b, sq.start, h, 0);
#if FUSED_TOPK
        const int jl = list_ascending(&list, nslots, ws); /* lane s: slot s's block */
#else
        const idx_t row = at4(bi_off, bi_st, b, t, h, 0);
#if SLC_SORT && SLC_LANES
        const int jl = lanes_ascending(slc_lane_block(bidx, row, bi_st.w, nslots, tl, ws), ws);
#else
        const int jl = slc_lane_block(bidx, row, bi_st.w, nslots, tl, ws);
#endif
#endif
        for (int s = 0; s < nslots; ++s) {
#if FUSED_TOPK
            const int2 r = slc_lane_keys(jl, s, tl, ws); /* distinct blocks */
#else
            const int2 r = slc_slot_warp(jl, bidx, row, bi_st.w, s, tl, ws);
#endif
            if (r.y == 0) continue; /* the same for the whole warp */
            warp_attend_range(qa, m, l, acc, kb + (idx_t)r.x * k_st.y, k_st.y, vb + (idx_t)r.x * v_st.y, v_st.y, r.y,
                              sl2, WHOLE_SLC, K_LINES, vt, ws);
        }
    }
    DONE(slc, s, !HAS_CMP, !HAS_SWA);
#endif

#if HAS_SWA
    warp_reset(m, l, acc);
    {
        const int key0 = swa_key0(tl);
        __global const store_t *kb = k + at4(k_off, k_st, b, sq.start + key0, h, 0);
        __global const store_t *vb = v + at4(v_off, v_st, b, sq.start + key0, h, 0);
        warp_attend_range(qa, m, l, acc, kb, k_st.y, vb, v_st.y, live ? tl + 1 - key0 : 0, sl2, WHOLE_CMP_SWA, 0, vt,
                          ws);
    }
    DONE(swa, w, !HAS_CMP && !HAS_SLC, true);
#endif

#if !BWD_PRE
#if ADD_PARTIAL
    { /* the partial: in o_cmp (ADD_PARTIAL 2) or in o */
        const idx_t p_off = ADD_PARTIAL == 2 ? oc_off : o_off;
        const idx4_t p_st = ADD_PARTIAL == 2 ? oc_st : o_st;
        add_partial(acc, ADD_PARTIAL == 2 ? o_cmp : o, at4(p_off, p_st, b, t, hq0, 0), p_st.z, p_st.w, ng, g_cmp,
                    at4(gc_off, gc_st, b, t, hq0, 0), gc_st.z);
    }
#endif
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) { /* acc: the gated sum of the branches */
        const int r = gq + 8 * hr;
#if OUT_VEC && ACC_TRANS
        store_row_wide(o + at4(o_off, o_st, b, t, hq0 + min(r, ng - 1), 0), DV, acc, hr, 1.0f, r < ng, ws);
#elif OUT_VEC
        if (r < ng) store_row(o + at4(o_off, o_st, b, t, hq0 + r, 0), DV, acc, hr, 1.0f, ws);
#else
        if (r < ng) store_row_strided(o, at4(o_off, o_st, b, t, hq0 + r, 0), o_st.w, DV, acc, hr, 1.0f);
#endif
    }
#endif
}
