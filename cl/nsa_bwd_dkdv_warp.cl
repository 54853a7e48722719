/*
 * nsa_bwd_dkdv_warp.cl: the tensor-core path of the key-owned dk/dv pass
 * (same kernel name, arguments and results as nsa_bwd_dkdv.cl; which keys
 * and rows: nsa_dkdv.h). A work-group owns TKK = 16*NW keys, a warp 16 of
 * them as the rows of its fragments; their K and V stay in registers. The
 * query rows that see the tile go through local memory KC at a time (Q, dO,
 * lse, D, gate, copied once for all warps, the next chunk's while this one
 * is computed), and per chunk each warp computes,
 * with the keys as the M dimension (so P^T and dS^T are A operands as they
 * come out of the score fragments):
 *   S^T = K Q^T, P^T = exp(scale S^T - lse), dP^T = V dO^T,
 *   dS^T = P^T (g dP^T - D), dV += (g P^T) dO, dK += scale dS^T Q.
 * dK, dV are owned by their keys: written once, no atomics.
 *
 * The compressed branch has few key tiles and many rows each: NSPLIT > 1
 * splits each tile's rows into NSPLIT parts, each group writing its part's
 * sums to its own slice of dk / dv ([NSPLIT][B, rows, H, D]), and
 * nsa_dkdv_sum.cl adds the slices in split order: still deterministic. The
 * heavy blocks of the selected branch (nsa_dkdv.h) take the same way, their
 * slices summed by nsa_dkdv_sum_heavy into the blocks' token rows.
 *
 * DS_KEEP (BRANCH 1, and BRANCH 0 without VARLEN): the pass also writes
 * dS, which dq then reads instead of recomputing P and dP
 * (nsa_bwd_dq_warp.cl), at ds + ds0 in the layouts of nsa_ranges.h
 * (DS_BY_KEY; the compressed branch's dsc_region) (keep_ds_step).
 *
 * Defines (besides nsa_dkdv.h): NW, DK, DV, KC (16 or 32), ACCUM, NSPLIT,
 * TKK = 16*NW, DS_KEEP, KSP. NDRange: (32 * NW * tiles * NSPLIT, H, B).
 */

#define RQ KC /* query rows per chunk */
/* row strides of the staged rows, in elements: rows of a multiple of 64
 * elements unpadded, so swizzled (warp_attn.h's tile_col: both ways of
 * reading them, lds_kfrag and lds_bfrag_trans, conflict-free), others
 * padded to 16-byte aligned rows 4 banks apart */
#define QPAD (DK % 64 ? DK + 8 : DK)
#define DPAD (DV % 64 ? DV + 8 : DV)

/* A chunk's query row, as the loop reads it: one 16-byte word in local
 * memory, so that a lane takes each of its rows with one local read where
 * the token, lse, D and gate took four (and the gate's half a fifth).
 * At 64k in the anchor configuration on an H100 (2026-11-27, clock reads
 * between the phases of a chunk) these reads, waited on one after another
 * in a pass that holds 255 registers, made the weights' loop (P, dS) the
 * longest phase of a chunk: 2500 of 7300 cycles.
 *   x: the row's token (-1: none), bit REC_HI set where its gate is the high
 *      half of w (a 16-bit gate comes as the aligned word that holds it);
 *      written by the work-item that works the token out, two chunks ahead;
 *   y, z, w: its lse (natural log: the product scales it), D and gate
 *      word, copied asynchronously a chunk ahead (fetch_row_values).
 * Tokens stay below 2^30 (the host takes T <= 2^30: nsa_args.c). */
#define REC_HI (1 << 30)

inline int rec_token(int x) { return x < 0 ? -1 : x & ~REC_HI; }

/* Record word x for token tok of query row rr (the gate's half from the
 * element's place: the buffer starts 4-byte aligned). */
inline int rec_code(int tok, int rr, int b, int h, idx_t g_off, idx4_t g_st)
{
    if (tok < 0) return -1;
#if STORAGE == 0
    (void)rr; (void)b; (void)h; (void)g_off; (void)g_st;
    return tok;
#else
    const int odd = (int)(at4(g_off, g_st, b, tok, h * G + dkdv_row_head(rr), 0) & 1);
    return odd ? tok | REC_HI : tok;
#endif
}

/* The gate of a row from its record. */
inline float rec_gate(uint4 x)
{
#if STORAGE == 0
    return as_float(x.w);
#else
    return word_elem(x.w, ((int)x.x & REC_HI) != 0);
#endif
}

/* Starts copying the Q and dO rows of the chunk of query rows from r0
 * (row r of the token in rec[r], -1: zeros) into qs and dos; asynchronous on
 * NVIDIA (copy_chunk_async). All work-items call it: RPT work-items per
 * row, each copying every RPT-th 16-byte piece of its row's Q and dO, so
 * that the token lookup and the row addresses are worked out once per row
 * and work-item, not once per piece (per piece, they took about a fifth of
 * the pass's time on the H200). */
#define RPT (NW * WARP / RQ)
#if RPT * RQ != NW * WARP
#error "the row fetch needs the work-group size to be a multiple of the chunk's rows"
#endif
inline void fetch_query_rows(int r0, int b, int h, __local const uint4 *rec, __global const store_t *q, idx_t q_off,
                             idx4_t q_st, __global const store_t *dout, idx_t do_off, idx4_t do_st, __local store_t *qs,
                             __local store_t *dos)
{
    const int r = get_local_id(0) / RPT, part = rem_of(get_local_id(0), r, RPT);
    const int t = rec_token((int)rec[r].x), hq = h * G + dkdv_row_head(r0 + r);
    __global const store_t *qrow = q + at4(q_off, q_st, b, max(t, 0), hq, 0);
    __global const store_t *drow = dout + at4(do_off, do_st, b, max(t, 0), hq, 0);
    for (int c = 8 * part; c < DK; c += 8 * RPT)
        copy_chunk_async(qs + r * QPAD + tile_col(r, c, QPAD, DK), qrow + c, t >= 0, false);
    for (int c = 8 * part; c < DV; c += 8 * RPT)
        copy_chunk_async(dos + r * DPAD + tile_col(r, c, DPAD, DV), drow + c, t >= 0, false);
    copy_async_commit();
}

/* Work-item r < RQ's part of staging a chunk: the lse, D and gate of
 * query row rr (record word x, from the chunk before) into its record,
 * copied asynchronously with the chunk's rows (zeros for no token). Loaded
 * into registers a chunk ahead and stored at its end, as they were, they
 * held the pass up: at 64k in the anchor configuration on an H100
 * (2026-11-27) the copies took the selected pass from 28.6-28.8 to
 * 26.4-26.7 ms, the dk/dv passes in all from 45.4-45.7 to 42.9-43.2. */
inline void fetch_row_values(int rr, int x, int b, int h, __global const store_t *gate, idx_t g_off, idx4_t g_st,
                             __global const float *lse, idx_t l_off, idx4_t l_st, __global const float *dlt,
                             idx_t x_off, idx4_t x_st, __local uint4 *rec)
{
    const int tok = rec_token(x), hq = h * G + dkdv_row_head(rr), t = max(tok, 0);
    __local uint *w = (__local uint *)rec;
    copy4_async(w + 1, lse + at4(l_off, l_st, b, t, hq, 0), tok >= 0);
    copy4_async(w + 2, dlt + at4(x_off, x_st, b, t, hq, 0), tok >= 0);
    const idx_t gi = at4(g_off, g_st, b, t, hq, 0);
#if STORAGE == 0
    copy4_async(w + 3, gate + gi, tok >= 0);
#else
    /* an odd element is the high half of the word before it, an even one
     * the low half of its own, copied alone (the next may lie past the
     * buffer) */
    if (x & REC_HI) copy4_async(w + 3, gate + gi - 1, tok >= 0);
    else copy2_async(w + 3, gate + gi, tok >= 0);
#endif
}

#if BRANCH == 1
/* Work-item r < RQ's part of fetching the list entries of the chunk from
 * r0 (dkdv_entry_at), copied asynchronously as the per-row values are, a
 * chunk before they are decoded into its tokens (and kept-dS places), two
 * before its rows are copied. Read when decoded, as they were, they held
 * the pass up too: at 64k in the anchor configuration on an H100
 * (2026-11-27) the copies took the selected pass from 26.1-26.8 to
 * 25.2-25.6 ms. */
inline void fetch_entries(dkdv_tile kt, int r0, __global const int *lst, __local int *ent)
{
    const int r = get_local_id(0), rr = r0 + r;
    const bool in = rr < dkdv_rows(kt);
    copy4_async(ent + r, lst + dkdv_entry_at(kt, in ? rr : 0), in);
}
#endif

#if DS_KEEP
/* Where query row rr's dS lies in ds: at, the element of its key 0 (head 0
 * where DS_BY_KEY; -1: nowhere) in units of 16 (regions and head rows are
 * whole 16-key steps), an int to spare the registers of this pass, which
 * spills; and lim, its keys (16-key steps from lim on are not stored): the
 * compressed branch's, per row; the selected one's, KSP. Worked out once
 * per row, by the work-items that stage the row's values. */
typedef struct {
    int at, lim;
} ds_place;

inline ds_place ds_row(int rr, int tok, int slot, int b, int h, int H, int T)
{
    ds_place x = {-1, 0};
    if (tok < 0) return x;
#if BRANCH == 1 /* (batch, token, KV head, slot): [KSP][G] or [G][KSP] */
    x.lim = KSP;
    x.at = (((b * T + tok) * H + h) * S + slot) * G * (KSP / 16);
#else
    (void)slot;
    x.lim = dsc_keys(tok);
    x.at = (int)(dsc_region(b, h, H, T, tok) * G / 16);
#endif
    if (!DS_BY_KEY) x.at += dkdv_row_head(rr) * (x.lim / 16);
    return x;
}

inline void ds_place_put(ds_place x, int r, __local int *at_s, __local int *lim_s)
{
    at_s[r] = x.at;
    if (BRANCH == 0) lim_s[r] = x.lim;
}

/* Whether the row whose place is at i takes the 16-key step from kb. */
inline bool ds_stored(__local const int *at, __local const int *lim, int i, int kb)
{
#if BRANCH == 1
    (void)lim;
    return at[i] >= 0 && kb < KSP;
#else
    return at[i] >= 0 && kb < lim[i];
#endif
}

/* Stores k-step kk's dS (query rows r0 + 16kk .. +15, their places in at
 * and lim) from its dS^T A fragments a: keys kb .. kb+15 of the row's
 * region (the block's, or the compressed keys the token sees). a[0], a[1]
 * are keys gq, gq+8 of query rows 2t, 2t+1, a[2], a[3] of rows 8+2t, 9+2t.
 * DS_BY_KEY: the 16 rows are heads of one token, so (a[0], a[2]) is one
 * 8-byte word of key gq, (a[1], a[3]) of key gq+8. Else each 8x8 piece,
 * transposed, gives lane (gq, t) keys 2t, 2t+1 and 8+2t, 9+2t of a query
 * row, one 8-byte word. */
inline void keep_ds_step(__global store_t *ds, const word_t *a, int kk, int r0, __local const int *at,
                         __local const int *lim, int kb, __local uint *ws)
{
    const int gq = lane_id() >> 2, t = lane_id() & 3;
#if DS_BY_KEY
    (void)ws;
    if (!ds_stored(at, lim, 16 * kk, kb)) return;
    __global store_t *p = ds + 16 * (long)at[16 * kk] + (kb + gq) * G + dkdv_row_head(r0 + 16 * kk) + 4 * t;
    STORE_WORDS2((word2_t)(a[0], a[2]), 0, p);
    STORE_WORDS2((word2_t)(a[1], a[3]), 0, p + 8 * G);
#else
    (void)r0;
#pragma unroll
    for (int g8 = 0; g8 < 2; ++g8) {
        const word2_t w = (word2_t)(mat8_trans(a[2 * g8], ws), mat8_trans(a[2 * g8 + 1], ws));
        const int i = 16 * kk + 8 * g8 + gq;
        if (ds_stored(at, lim, i, kb)) STORE_WORDS2(w, 0, ds + 16 * (long)at[i] + kb + 4 * t);
    }
#endif
}
#endif

/* Adds (ADD_IN_PLACE, nsa_dkdv.h) or writes the lane's values of key row hr
 * (gq, gq+8) of a dense f32 [B, rows, H, dim] gradient, times scale. */
inline void store_key_row(__global float *g, idx_t at, int dim, const float *c, int hr, float scale)
{
#pragma unroll
    for (int e = 0; e < dim / 4; ++e) {
        const idx_t i = at + row_col(dim, e);
        const float x = scale * row_value(c, dim, hr, e);
        g[i] = ADD_IN_PLACE ? g[i] + x : x;
    }
}

__kernel __attribute__((reqd_work_group_size(NW * WARP, 1, 1))) void nsa_bwd_dkdv(DKDV_ARGS DKDV_DS_ARGS)
{
    __local uint wscr[NW * WARP_SCRATCH];
    /* read and written in chunks of 8 elements: word4_t arrays for the alignment
     * (f16 arrays would need cl_khr_fp16 anyway) */
    __local word4_t q_raw[2][RQ * QPAD / 8], do_raw[2][RQ * DPAD / 8];
    __local uint4 rec_s[3][RQ]; /* chunk c's records in slot tc, c+1's in tn, c+2's in tf (below) */
#if DS_KEEP
    __local int dsat_s[3][RQ], dslim_s[3][RQ]; /* dslim_s: BRANCH 0's */
    ds += ds0;
#endif
#if BRANCH == 1
    __local int ent_s[2][RQ]; /* list entries of chunk c+2 in slot c & 1 */
#endif
    const int warp = get_local_id(0) / WARP, lane = lane_id(), gq = lane >> 2, tq = lane & 3;
    __local uint *ws = wscr + warp * WARP_SCRATCH;
    const int h = get_group_id(1), b = get_group_id(2), H = get_num_groups(1);
    cu += cu0;
    cmp_off += cmp_off0;
    lst += lst0;
    lst_start += lst_start0;
    const int split = get_group_id(0) % NSPLIT;
    const dkdv_tile kt = dkdv_tile_of(get_group_id(0) / NSPLIT, b, h, H, T, nrows_k, cu, nseq, cmp_off, lst_start, nblk);
    const float sl2 = scale * LOG2E;
#if DS_KEEP
    /* the warp's first key in a row's region: its place in the block, or
     * its compressed index */
    const int kb = (BRANCH == 1 ? kt.kp0 % BS : kt.key0) + (int)(get_local_id(0) / WARP) * 16;
#endif

    /* this lane's two keys (fragment rows gq, gq+8 of the warp's 16) */
    int3 key[2];
    bool kv[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int j = warp * 16 + gq + 8 * hr;
        kv[hr] = j < kt.nk;
        key[hr] = kv[hr] ? dkdv_key(kt, j, b, T, cu, nseq, cmp_off) : (int3)(0);
    }
    const int j0 = kt.key0 + warp * 16 + gq;
    word_t ka[DK / 4], va[DV / 4];
    load_afrag(k + at4(k_off, k_st, b, j0, h, 0), kv[0], k + at4(k_off, k_st, b, j0 + 8, h, 0), kv[1], DK, ka);
    load_afrag(v + at4(v_off, v_st, b, j0, h, 0), kv[0], v + at4(v_off, v_st, b, j0 + 8, h, 0), kv[1], DV, va);
    float dka[DK / 2], dva[DV / 2];
#pragma unroll
    for (int i = 0; i < DK / 2; ++i) dka[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < DV / 2; ++i) dva[i] = 0.0f;

    /* this split's rows: whole chunks of RQ, staged two deep: while the
     * warps compute chunk c, chunk c+1's rows and per-row values are on
     * their way (cp.async), and work-items 0 .. RQ-1 work out chunk c+2's
     * tokens (which the row copies wait on) and kept-dS places, from list
     * entries copied the chunk before (BRANCH 1) */
    const int nrows = dkdv_rows(kt), per = (nrows + RQ * NSPLIT - 1) / (RQ * NSPLIT) * RQ;
    const int r_begin = split * per, nchunks = ceil_div(max(0, min(nrows, r_begin + per) - r_begin), RQ);
    const int lid = get_local_id(0);
    if (lid < RQ)
        for (int i = 0; i < 2; ++i) {
            const int rr = r_begin + i * RQ + lid, e = dkdv_row_entry(kt, rr, lst);
            const int tok = dkdv_entry_token(kt, rr, e);
            rec_s[i][lid].x = (uint)rec_code(tok, rr, b, h, g_off, g_st);
#if DS_KEEP
            ds_place_put(ds_row(rr, tok, dkdv_entry_slot(e), b, h, H, T), lid, dsat_s[i], dslim_s[i]);
#endif
        }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (nchunks > 0) {
        if (lid < RQ) {
            fetch_row_values(r_begin + lid, (int)rec_s[0][lid].x, b, h, gate, g_off, g_st, lse, l_off, l_st, dlt, x_off,
                             x_st, rec_s[0] + lid);
#if BRANCH == 1
            fetch_entries(kt, r_begin + 2 * RQ, lst, ent_s[0]);
#endif
        }
        fetch_query_rows(r_begin, b, h, rec_s[0], q, q_off, q_st, dout, do_off, do_st, (__local store_t *)q_raw[0],
                         (__local store_t *)do_raw[0]);
        copy_async_wait();
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int tc = 0, tn = 1, tf = 2; /* rec_s of chunks c, c+1, c+2 */
    for (int c = 0; c < nchunks; ++c) {
        const int r0 = r_begin + c * RQ, cur = c & 1;
        int code2 = -1;
#if DS_KEEP
        ds_place ds2 = {-1, 0};
#endif
        if (lid < RQ) {
            const int rr = r0 + 2 * RQ + lid;
#if BRANCH == 1
            const int e = ent_s[cur][lid]; /* chunk c+2's entries, slot (c+2) & 1 */
#else
            const int e = 0; /* no list */
#endif
            const int tok2 = dkdv_entry_token(kt, rr, e);
            code2 = rec_code(tok2, rr, b, h, g_off, g_st);
#if DS_KEEP
            ds2 = ds_row(rr, tok2, dkdv_entry_slot(e), b, h, H, T);
#endif
        }
        __local const store_t *qs = (__local const store_t *)q_raw[cur], *dos = (__local const store_t *)do_raw[cur];
        __local const uint4 *rec_r = rec_s[tc];
        float s[KC / 2], dp[KC / 2];
        lds_products(s, ka, qs, QPAD, 0, KC, DK, ws);
        lds_products(dp, va, dos, DPAD, 0, KC, DV, ws);
        /* the next chunk's copies go out here, behind the products' tile
         * reads: issued before them they made the pass slower (selected
         * pass 28.0 -> 26.5 ms at 64k on the H100 when moved), probably
         * because the products waited behind their address arithmetic */
        if (c + 1 < nchunks) {
            if (lid < RQ) {
                fetch_row_values(r0 + RQ + lid, (int)rec_s[tn][lid].x, b, h, gate, g_off, g_st, lse, l_off, l_st, dlt,
                                 x_off, x_st, rec_s[tn] + lid);
#if BRANCH == 1
                fetch_entries(kt, r0 + 3 * RQ, lst, ent_s[cur ^ 1]); /* chunk c+3's */
#endif
            }
            fetch_query_rows(r0 + RQ, b, h, rec_s[tn], q, q_off, q_st, dout, do_off, do_st,
                             (__local store_t *)q_raw[cur ^ 1], (__local store_t *)do_raw[cur ^ 1]);
        }
#pragma unroll
        for (int i = 0; i < KC / 2; ++i) {
            const int r = 8 * (i >> 2) + 2 * tq + (i & 1), hr = (i >> 1) & 1; /* query row, key row */
            const uint4 x = rec_r[r];
            const int tok = rec_token((int)x.x);
            const float lse_r = as_float(x.y), g = rec_gate(x);
            const bool on = kv[hr] && tok >= 0 && lse_r != -INFINITY && sees(tok, key[hr].x, key[hr].y, key[hr].z);
            const float p = on ? exp2(s[i] * sl2 - lse_r * LOG2E) : 0.0f;
            s[i] = p * (g * dp[i] - as_float(x.z)); /* dS^T */
            dp[i] = g * p;                   /* g P^T */
        }
        lds_accumulate_trans(dva, dp, dos, DPAD, DV, ws);
#if DS_KEEP
#pragma unroll
        for (int kk = 0; kk < KC / 16; ++kk) { /* dS's fragments packed once for both */
            word_t a[4];
            p_afrag(s, kk, a, ws);
            lds_accumulate_step(dka, a, qs, QPAD, kk, DK, ws);
            keep_ds_step(ds, a, kk, r0, dsat_s[tc], dslim_s[tc], kb, ws);
        }
#else
        lds_accumulate_trans(dka, s, qs, QPAD, DK, ws);
#endif

        if (lid < RQ) {
            rec_s[tf][lid].x = (uint)code2;
#if DS_KEEP
            ds_place_put(ds2, lid, dsat_s[tf], dslim_s[tf]);
#endif
        }
        copy_async_wait();
        barrier(CLK_LOCAL_MEM_FENCE);
        const int t0 = tc;
        tc = tn;
        tn = tf;
        tf = t0;
    }

    /* dense [B, nrows_k, H, D] f32, this split's slice; the heavy pass's
     * rows are the heavy blocks' keys in order (nrows_k of them) */
    const idx_t slice = (idx_t)split * get_num_groups(2) * nrows_k * H;
    const int krow = HEAVY_PASS ? (int)(get_group_id(0) / NSPLIT) * TKK + warp * 16 + gq : j0;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        if (!kv[hr]) continue;
        const idx_t row = slice + ((idx_t)b * nrows_k + krow + 8 * hr) * H + h;
        store_key_row(dk, dk0 + row * DK, DK, dka, hr, scale);
        store_key_row(dv, dv0 + row * DV, DV, dva, hr, 1.0f);
    }
}
