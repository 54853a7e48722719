/*
 * nsa_bwd_dq_warp.cl: the tensor-core path of dq (same kernel name,
 * arguments and results as nsa_bwd_dq.cl): one warp per token and tile of
 * 16 query heads of a KV group, the three branches in turn over the key
 * ranges of the forward (nsa_ranges.h). Per chunk of keys, in mma fragments
 * (warp_attn.h):
 *   P = exp(scale Q K^T - lse_b),  dP = dO V^T,  dS = P (g_b dP - D_b),
 *   dQ += scale dS K
 * dq is owned by its query: written once, no atomics.
 *
 * K is read in two layouts: as Q K^T's B fragments and as dS K's. Read
 * from global memory, the second (load_cols) took 4-row pieces and byte
 * permutes per product; so each warp copies its chunks' K rows into two
 * local tiles (cp.async, the next chunk's during this one) and reads both
 * layouts from there, dS K through ldmatrix.trans (the host builds this
 * program with ACC_TRANS). V, read once, stays in global memory. At 64k in
 * the anchor configuration on an H100 (2026-11-25): 30.2 -> 25.0 ms; with
 * the copies through L2 only (.cg), 37.9.
 *
 * DS_KEEP: the selected branch's dS comes from what the dk/dv pass kept
 * (at ds + ds0, laid out as nsa_ranges.h's DS_BY_KEY says), so that branch
 * takes one product, dS K, instead of three. At 64k in the anchor
 * configuration on an H100 (2026-11-25): dq 24.8 -> 18.2 ms, the dk/dv
 * pass that keeps dS 40.4 -> 43.4.
 *
 * DSC_KEEP: the same for the compressed branch, whose dS the compressed
 * dk/dv pass keeps (nsa_ranges.h's dsc_region), at dsc + dsc0. At 64k in
 * the anchor configuration on an H200 (2026-11-26): dq 18.0 -> 14.1 ms,
 * 11.9 with chunks of 16 keys (tuned apart from the recomputing dq's, the
 * nsa_bwd_dq_recompute_warp family), the compressed dk/dv pass +1.5 ms.
 *
 * Defines: as nsa_fwd_warp.cl (OUT_VEC: dq's rows aligned for vector
 * stores), ACC_TRANS = 1, DS_KEEP, KSP, DSC_KEEP. NDRange: as
 * nsa_fwd_warp.cl.
 */

#ifndef DSC_KEEP
#define DSC_KEEP 0
#endif
#if DSC_KEEP && VARLEN
#error "DSC_KEEP: batches without varlen only (nsa_ranges.h)"
#endif
#if DSC_KEEP
#define DQ_DSC_ARGS , __global const store_t *dsc, long dsc0
#else
#define DQ_DSC_ARGS
#endif

/* The lane's two rows' lse (log2 units), D and gate for one branch. */
inline void dq_rows(float *lse2, float *dd, float *gg, int ng, __global const float *lse, idx_t lse_base, idx_t lse_hs,
                    __global const float *dlt, idx_t dlt_base, idx_t dlt_hs, __global const store_t *gate,
                    idx_t gate_base, idx_t gate_hs)
{
    const int gq = lane_id() >> 2;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = gq + 8 * hr;
        const bool v = r < ng;
        lse2[hr] = v ? lse[lse_base + r * lse_hs] * LOG2E : -INFINITY;
        dd[hr] = v ? dlt[dlt_base + r * dlt_hs] : 0.0f;
        gg[hr] = v ? LOAD(gate, gate_base + r * gate_hs) : 0.0f;
    }
}

/* A warp's K tile: KC rows, unpadded and swizzled where DK allows
 * (warp_attn.h, TILE_SWIZZLED), else padded to 16-byte rows 4 banks apart. */
#define KT_RS (DK % 64 == 0 ? DK : DK + 8)
#if !ACC_TRANS
#error "nsa_bwd_dq_warp.cl accumulates from local tiles: build it with ACC_TRANS 1"
#endif

/* Starts copying the warp's chunk of K rows (zeros from row `valid` on),
 * kept in L1 too: the tokens of a compute unit share the compressed rows
 * and the forced blocks. */
inline void stage_k(__local store_t *kt, __global const store_t *k, idx_t k_rs, int valid)
{
    stage_rows_by(kt, KT_RS, KC, DK, k, k_rs, valid, lane_id(), WARP, true);
}

/* Tile i of the warp's two K tiles, once the copy of its chunk is done.
 * The next chunk's copy (`valid` rows from next; none: 0) into the other
 * tile is started first, so that it runs while this one computes; the
 * first chunk's copy is started by the caller. */
inline __local store_t *k_tile_ready(__local store_t *kt, int i, __global const store_t *next, idx_t k_rs, int valid,
                                     __local uint *ws)
{
    warp_sync(ws); /* every lane is done reading the other tile (the chunk before) */
    if (valid > 0) {
        stage_k(kt + (i ^ 1) * KC * KT_RS, next, k_rs, valid);
        copy_async_wait_prior();
    } else {
        copy_async_wait();
    }
    warp_sync(ws);
    return kt + i * KC * KT_RS;
}

/* dq += dS K over keys 0 .. n-1 of k / v (row strides k_rs, v_rs); kt
 * holds the warp's two K tiles, the next chunk's copied while this one
 * computes. */
inline void dq_range(const word_t *qa, const word_t *doa, float *dq, const float *lse2, const float *dd, const float *gg,
                     __global const store_t *k, idx_t k_rs, __global const store_t *v, idx_t v_rs, int n, float sl2,
                     __local store_t *kt, __local uint *ws)
{
    const int t = lane_id() & 3;
    if (n > 0) stage_k(kt, k, k_rs, min(KC, n));
    for (int c0 = 0; c0 < n; c0 += KC) {
        const int hi = min(KC, n - c0);
        __local const store_t *cur =
            k_tile_ready(kt, (c0 / KC) & 1, k + (idx_t)(c0 + KC) * k_rs, k_rs, clamp(n - c0 - KC, 0, KC), ws);
        float s[KC / 2], dp[KC / 2];
        lds_products(s, qa, cur, KT_RS, 0, hi, DK, ws);
        warp_products(dp, doa, v + (idx_t)c0 * v_rs, v_rs, 0, hi, DV, ws);
#pragma unroll
        for (int nb = 0; nb < KC / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = 8 * nb + 2 * t + (e & 1), r = e >> 1;
                const float p = j < hi && lse2[r] != -INFINITY ? exp2(s[4 * nb + e] * sl2 - lse2[r]) : 0.0f;
                s[4 * nb + e] = p * (gg[r] * dp[4 * nb + e] - dd[r]);
            }
        lds_accumulate_trans(dq, s, cur, KT_RS, DK, ws);
    }
    warp_sync(ws); /* the next range's first copy may overwrite what was read */
}

#if DS_KEEP || DSC_KEEP
/* A chunk's k-steps of a kept dS region (p: the tile's first head at key 0;
 * stride: the region's keys, where a head's keys are a row), keys c0 on, hi
 * of them (heads from ng on absent, as are k-steps past the chunk's keys),
 * as loaded: DS_BY_KEY, a[kk][0] the words of keys gq (heads 2t, 2t+1 and
 * 8+2t, 9+2t), a[kk][1] of keys gq+8, to be transposed (kept_afrag_step);
 * else a[kk][0] a0 and a2 of row gq, a[kk][1] a1 and a3. */
inline void kept_load(word2_t a[KC / 16][2], __global const store_t *p0, int stride, int c0, int hi, int ng)
{
    const int gq = lane_id() >> 2;
#if DS_BY_KEY
    __global const store_t *p = p0 + (long)(c0 + gq) * G + 4 * (lane_id() & 3);
    const idx_t step = 16 * G, off8 = 8 * G;
    const bool v0 = true, v8 = true; /* G heads: whole tiles */
    (void)ng; (void)stride;
#else
    __global const store_t *p = p0 + (long)gq * stride + c0 + 4 * (lane_id() & 3);
    const idx_t step = 16, off8 = 8 * stride;
    const bool v0 = gq < ng, v8 = gq + 8 < ng;
#endif
#pragma unroll
    for (int kk = 0; kk < KC / 16; ++kk) {
        a[kk][0] = 16 * kk < hi && v0 ? *(__global const word2_t *)(p + kk * step) : (word2_t)(0);
        a[kk][1] = 16 * kk < hi && v8 ? *(__global const word2_t *)(p + kk * step + off8) : (word2_t)(0);
    }
}

/* The A fragments a0 .. a3 of dS for one k-step, from its words as loaded. */
inline void kept_afrag_step(const word2_t *x, word_t *w, __local uint *ws)
{
#if DS_BY_KEY /* 8x8 pieces of dS^T: keys 0-7 x heads 0-7, x heads 8-15, keys 8-15 x ... */
    w[0] = mat8_trans(x[0].lo, ws);
    w[1] = mat8_trans(x[0].hi, ws);
    w[2] = mat8_trans(x[1].lo, ws);
    w[3] = mat8_trans(x[1].hi, ws);
#else
    (void)ws;
    w[0] = x[0].lo;
    w[1] = x[1].lo;
    w[2] = x[0].hi;
    w[3] = x[1].hi;
#endif
}

/* dq += dS K for a chunk of hi keys (its dS words in a, its K rows in the
 * tile cur), then a takes the next chunk's words (an). */
inline void kept_chunk(float *dq, word2_t a[KC / 16][2], word2_t an[KC / 16][2], __local const store_t *cur, int hi,
                       __local uint *ws)
{
#pragma unroll
    for (int kk = 0; kk < KC / 16; ++kk) {
        if (16 * kk < hi) { /* the same for the whole warp */
            word_t w[4];
            kept_afrag_step(a[kk], w, ws);
            lds_accumulate_step(dq, w, cur, KT_RS, kk, DK, ws);
        }
        a[kk][0] = an[kk][0];
        a[kk][1] = an[kk][1];
    }
}
#endif

#if DSC_KEEP
/* The compressed branch with the kept dS (p: the token's region, at the
 * tile's first head; stride: its keys): dq += dS K over the n visible keys
 * in chunks of KC, each chunk's dS words and K rows fetched while the one
 * before computes. */
inline void dq_cmp_kept(float *dq, __global const store_t *p, int stride, int ng, int n, __global const store_t *k,
                        idx_t k_rs, __local store_t *kt, __local uint *ws)
{
    word2_t a[KC / 16][2], an[KC / 16][2];
    kept_load(a, p, stride, 0, min(KC, n), ng);
    if (n > 0) stage_k(kt, k, k_rs, min(KC, n));
    for (int c0 = 0, i = 0; c0 < n; c0 += KC, i ^= 1) {
        const int next = clamp(n - c0 - KC, 0, KC);
        kept_load(an, p, stride, c0 + KC, next, ng);
        __local const store_t *cur = k_tile_ready(kt, i, k + (idx_t)(c0 + KC) * k_rs, k_rs, next, ws);
        kept_chunk(dq, a, an, cur, min(KC, n - c0), ws);
    }
    warp_sync(ws); /* the next range's first copy may overwrite what was read */
}
#endif

#if DS_KEEP
/* The selected branch with the kept dS: dq += dS K over the keys of the
 * token's slots, taken as one stream of chunks of KC keys (a slot's keys
 * from key0, n of them), so that each chunk's dS words and K rows are
 * fetched while the chunk before computes, across slots too. */
typedef struct {
    int s, c0, key0, n; /* slot s (nslots: done), its chunk from key c0 */
} slc_chunk;

inline slc_chunk slc_next(slc_chunk c, int jl, __global const int *bidx, idx_t row, idx_t slot_stride, int nslots,
                          int tl, __local uint *ws)
{
    c.c0 += KC;
    while (c.c0 >= c.n && ++c.s < nslots) {
        const int2 r = slc_slot_warp(jl, bidx, row, slot_stride, c.s, tl, ws);
        c.key0 = r.x;
        c.n = r.y;
        c.c0 = 0;
    }
    return c;
}

/* Slot c.s's region (ds: the tile's first head of slot 0). */
inline __global const store_t *slot_region(__global const store_t *ds, slc_chunk c)
{
    return ds + (long)c.s * KSP * G;
}

/* The chunk's keys, none past the last slot. */
inline int slc_chunk_keys(slc_chunk c, int nslots) { return c.s < nslots ? min(KC, c.n - c.c0) : 0; }

inline void dq_selected_kept(float *dq, __global const store_t *ds, int ng, __global const int *bidx, idx_t row,
                             idx_t slot_stride, int nslots, int tl, __global const store_t *k, idx_t k_rs,
                             __local store_t *kt, __local uint *ws)
{
    const int jl = slc_lane_block(bidx, row, slot_stride, nslots, tl, ws);
    slc_chunk c = {-1, 0, 0, 0};
    c = slc_next(c, jl, bidx, row, slot_stride, nslots, tl, ws);
    word2_t a[KC / 16][2], an[KC / 16][2];
    kept_load(a, slot_region(ds, c), KSP, c.c0, slc_chunk_keys(c, nslots), ng);
    if (c.s < nslots) stage_k(kt, k + (idx_t)(c.key0 + c.c0) * k_rs, k_rs, slc_chunk_keys(c, nslots));
    for (int i = 0; c.s < nslots; i ^= 1) {
        const slc_chunk nx = slc_next(c, jl, bidx, row, slot_stride, nslots, tl, ws);
        const int next = slc_chunk_keys(nx, nslots);
        kept_load(an, slot_region(ds, nx), KSP, nx.c0, next, ng);
        __local const store_t *cur = k_tile_ready(kt, i, k + (idx_t)(nx.key0 + nx.c0) * k_rs, k_rs, next, ws);
        kept_chunk(dq, a, an, cur, slc_chunk_keys(c, nslots), ws);
        c = nx;
    }
    warp_sync(ws); /* the next range's first copy may overwrite what was read */
}
#endif

#define ROWS(lse, lse_base, lse_hs, dlt, dlt_base, dlt_hs, gate, gate_base, gate_hs) \
    dq_rows(lse2, dd, gg, ng, lse, lse_base, lse_hs, dlt, dlt_base, dlt_hs, gate, gate_base, gate_hs)

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void nsa_bwd_dq(
    NSA_QUERY_ARGS, NSA_DQ_OUT_ARGS DQ_DS_ARGS DQ_DSC_ARGS)
{
    __local uint wscr[NW * WARP_SCRATCH];
    const int warp = get_local_id(0) / WARP, gq = lane_id() >> 2;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
    __local word4_t kt_raw[NW * 2 * KC * KT_RS / 8]; /* store_t may be half, which local arrays cannot be */
    __local store_t *kt = (__local store_t *)kt_raw + warp * 2 * KC * KT_RS;
    /* int, not get_group_id's size_t: with the index in 64 bits NVIDIA's
     * compiler made dq 5-6% slower at 8k (H100, 2026-11-28) */
    const int wid = (int)get_group_id(0) * NW + warp, t = wid / NGT, g0 = (wid % NGT) * 16;
    if (t >= T) return;
    cu += cu0;
    cmp_off += cmp_off0;
    const int h = get_group_id(1), b = get_group_id(2);
    const int ng = min(16, G - g0), hq0 = h * G + g0;
    const seq_info sq = seq_of(cu, nseq, b, t, T);
    const int tl = t - sq.start;
    const bool live = sq.len > 0;
    const float sl2 = scale * LOG2E;
    (void)kc; (void)vc; (void)nc_rows; (void)cmp_off; (void)bidx; (void)bcnt; (void)tl;

    word_t qa[QA_WORDS], doa[DV / 4];
    load_afrag(q + at4(q_off, q_st, b, t, hq0 + gq, 0), gq < ng, q + at4(q_off, q_st, b, t, hq0 + gq + 8, 0),
               gq + 8 < ng, DK, qa);
    load_afrag(dout + at4(do_off, do_st, b, t, hq0 + gq, 0), gq < ng, dout + at4(do_off, do_st, b, t, hq0 + gq + 8, 0),
               gq + 8 < ng, DV, doa);
    float dq[DK / 2], lse2[2], dd[2], gg[2];
#pragma unroll
    for (int i = 0; i < DK / 2; ++i) dq[i] = 0.0f;

#if HAS_CMP
    {
        const int row0 = cmp_row0(cmp_off, sq), nvis = cmp_visible(tl, live, nc_rows, row0);
#if DSC_KEEP /* no VARLEN: t is tl */
        const int keys = dsc_keys(t);
        __global const store_t *p = dsc + dsc0 + dsc_region(b, h, get_num_groups(1), T, t) * G + (DS_BY_KEY ? g0 : g0 * keys);
        dq_cmp_kept(dq, p, keys, ng, nvis, kc + at4(kc_off, kc_st, b, row0, h, 0), kc_st.y, kt, ws);
#else
        ROWS(lse_cmp, at4(lc_off, lc_st, b, t, hq0, 0), lc_st.z, d_cmp, at4(xc_off, xc_st, b, t, hq0, 0), xc_st.z, g_cmp,
             at4(gc_off, gc_st, b, t, hq0, 0), gc_st.z);
        dq_range(qa, doa, dq, lse2, dd, gg, kc + at4(kc_off, kc_st, b, row0, h, 0), kc_st.y,
                 vc + at4(vc_off, vc_st, b, row0, h, 0), vc_st.y, nvis, sl2, kt, ws);
#endif
    }
#endif
#if HAS_SLC
#if DS_KEEP
    /* the tile's first head of slot 0; a slot's are G * KSP further */
    __global const store_t *ds_t =
        ds + ds0 + ds_slot_region(b, t, h, get_num_groups(1), T, 0) + (DS_BY_KEY ? g0 : g0 * KSP);
#else
    ROWS(lse_slc, at4(ls_off, ls_st, b, t, hq0, 0), ls_st.z, d_slc, at4(xs_off, xs_st, b, t, hq0, 0), xs_st.z, g_slc,
         at4(gs_off, gs_st, b, t, hq0, 0), gs_st.z);
#endif
    {
        const int nslots = slc_slots(bcnt, at4(bc_off, bc_st, b, t, h, 0), live);
        __global const store_t *kb = k + at4(k_off, k_st, b, sq.start, h, 0);
#if DS_KEEP
        dq_selected_kept(dq, ds_t, ng, bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w, nslots, tl, kb, k_st.y, kt, ws);
#else
        __global const store_t *vb = v + at4(v_off, v_st, b, sq.start, h, 0);
        const idx_t row = at4(bi_off, bi_st, b, t, h, 0);
        const int jl = slc_lane_block(bidx, row, bi_st.w, nslots, tl, ws);
        for (int s = 0; s < nslots; ++s) {
            const int2 r = slc_slot_warp(jl, bidx, row, bi_st.w, s, tl, ws);
            if (r.y == 0) continue; /* the same for the whole warp */
            dq_range(qa, doa, dq, lse2, dd, gg, kb + (idx_t)r.x * k_st.y, k_st.y, vb + (idx_t)r.x * v_st.y, v_st.y, r.y,
                     sl2, kt, ws);
        }
#endif
    }
#endif
#if HAS_SWA
    ROWS(lse_swa, at4(lw_off, lw_st, b, t, hq0, 0), lw_st.z, d_swa, at4(xw_off, xw_st, b, t, hq0, 0), xw_st.z, g_swa,
         at4(gw_off, gw_st, b, t, hq0, 0), gw_st.z);
    {
        const int key0 = swa_key0(tl);
        dq_range(qa, doa, dq, lse2, dd, gg, k + at4(k_off, k_st, b, sq.start + key0, h, 0), k_st.y,
                 v + at4(v_off, v_st, b, sq.start + key0, h, 0), v_st.y, live ? tl + 1 - key0 : 0, sl2, kt, ws);
    }
#endif

#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = gq + 8 * hr;
#if OUT_VEC
        store_row_wide(dq_out + at4(dq_off, dq_st, b, t, hq0 + min(r, ng - 1), 0), DK, dq, hr, scale, r < ng, ws);
#else
        if (r < ng) store_row_strided(dq_out, at4(dq_off, dq_st, b, t, hq0 + r, 0), dq_st.w, DK, dq, hr, scale);
#endif
    }
}
