/*
 * nsa_dkdv.h: what a key-owned dk/dv work-group of the NSA backward takes
 * (nsa_bwd_dkdv.cl, and its tensor-core path nsa_bwd_dkdv_warp.cl): a tile
 * of TKK keys of one KV head and the query rows (token, head of the group)
 * that see them.
 *   BRANCH 0 (compressed): keys are compressed rows; the queries are the
 *            tokens from the first that sees the tile to the sequence end.
 *   BRANCH 1 (selected): keys are a selection block (a sub-tile of it); the
 *            queries are the block's inverted list (nsa_select_index.cl),
 *            in token order. With VARLEN, `cmp_off` holds the selection-block
 *            offsets.
 *   BRANCH 2 (window): keys are a token tile; the queries are the next
 *            WINDOW tokens of each key.
 * Query row rr of a tile is token rr / G of its range, head rr % G.
 *
 * HEAVY (BRANCH 1, top-k ran): the first INIT_BLOCKS blocks of
 * each sequence are forced for every token, so their lists hold every row
 * of the sequence: the main pass leaves them (writing zeros) to a second
 * launch, HEAVY_PASS, whose groups split their rows NSPLIT ways.
 *
 * Defines: G, BRANCH, BS, S, CMP_L, CMP_D, WINDOW, VARLEN, INIT_BLOCKS,
 * HEAVY, HEAVY_PASS, NSPLIT, ACCUM, DS_KEEP (with KSP).
 */
#ifndef HEAVY
#define HEAVY 0
#endif
#ifndef HEAVY_PASS
#define HEAVY_PASS 0
#endif
/* Whether this launch leaves the forced initial blocks' rows alone (the
 * HEAVY main pass), as one literal: a constant operand of && makes NVIDIA's
 * compiler print a warning on the caller's stdout. */
#if HEAVY && !HEAVY_PASS
#define SKIP_INIT_ROWS 1
#else
#define SKIP_INIT_ROWS 0
#endif
/* Whether a pass adds its sums to the gradient in place (ACCUM, unsplit)
 * rather than writing them (or its split's slice), one literal likewise. */
#if ACCUM && NSPLIT == 1
#define ADD_IN_PLACE 1
#else
#define ADD_IN_PLACE 0
#endif

/* The arguments of both kernels, in the order plan_dkdv() sets them. */
#define DKDV_ARGS                                                                                              \
    __global const store_t *q, idx_t q_off, idx4_t q_st,                                                       \
        __global const store_t *k, idx_t k_off, idx4_t k_st, /* keys: k, or k_cmp */                           \
        __global const store_t *v, idx_t v_off, idx4_t v_st,                                                  \
        int nrows_k, /* key rows per batch row: T, or the compressed rows */                                   \
        __global const store_t *gate, idx_t g_off, idx4_t g_st, __global const int *cu, idx_t cu0, int nseq, \
        __global const int *cmp_off, idx_t cmp_off0, __global const int *lst, idx_t lst0,                    \
        __global const int *lst_start, idx_t lst_start0, int nblk, __global const store_t *dout, idx_t do_off, \
        idx4_t do_st, __global const float *lse, idx_t l_off, idx4_t l_st, __global const float *dlt,         \
        idx_t x_off, idx4_t x_st, __global float *dk, idx_t dk0, __global float *dv, idx_t dv0, int T, float scale

/* DS_KEEP (nsa_ranges.h): the pass also writes the rows' dS for dq. */
#if DS_KEEP
#if BRANCH == 2 || (BRANCH == 0 && VARLEN)
#error "DS_KEEP is the selected branch's, and the compressed one's without VARLEN"
#endif
#define DKDV_DS_ARGS , __global store_t *ds, long ds0
#else
#define DKDV_DS_ARGS
#endif

typedef struct {
    int key0, nk;          /* rows key0 .. key0+nk-1 of the key tensor */
    int kp0, kstart, kend; /* BRANCH 1: local position of key 0, its sequence [kstart, kend) */
    int q_lo, q_hi;        /* BRANCH 1: the tile's part of the list; else its query tokens */
    idx_t lrow;            /* BRANCH 1: where the (batch, head) lists start */
} dkdv_tile;

/* Key j of the tile: (local position, first token of its sequence, end of
 * its sequence); for BRANCH 0 the position is the compressed index. */
inline int3 dkdv_key(dkdv_tile kt, int j, int b, int T, __global const int *cu, int nseq, __global const int *cmp_off)
{
#if BRANCH == 1
    (void)b; (void)T; (void)cu; (void)nseq; (void)cmp_off;
    return (int3)(kt.kp0 + j, kt.kstart, kt.kend);
#elif BRANCH == 0
    (void)b;
#if VARLEN
    int r = kt.key0 + j, lo = 0, hi = nseq - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cmp_off[mid] <= r) lo = mid; else hi = mid - 1;
    }
    const int ks = clamp(cu[lo], 0, T);
    return (int3)(r - cmp_off[lo], ks, clamp(cu[lo + 1], ks, T));
#else
    (void)cu; (void)nseq; (void)cmp_off;
    return (int3)(kt.key0 + j, 0, T);
#endif
#else
    (void)cmp_off;
    const seq_info sk = seq_of(cu, nseq, b, kt.key0 + j, T);
    return (int3)(kt.key0 + j - sk.start, sk.start, sk.start + sk.len);
#endif
}

#define NSUB ((BS + TKK - 1) / TKK) /* BRANCH 1: tiles per selection block */

/* HEAVY_PASS: the block of heavy ordinal hb (INIT_BLOCKS per sequence),
 * or -1 when the sequence has fewer blocks. */
inline int heavy_block(int hb, int nblk, __global const int *cmp_off)
{
#if VARLEN
    const int s = hb / INIT_BLOCKS, blk = cmp_off[s] + hb % INIT_BLOCKS;
    return blk < cmp_off[s + 1] ? blk : -1;
#else
    (void)cmp_off;
    return hb < nblk ? hb : -1;
#endif
}

/* The tile of work-group x (TKK keys; BRANCH 1: block x / NSUB, sub-tile
 * x % NSUB; HEAVY_PASS: heavy ordinal x / NSUB). */
inline dkdv_tile dkdv_tile_of(int x, int b, int h, int H, int T, int nrows_k, __global const int *cu, int nseq,
                              __global const int *cmp_off, __global const int *lst_start, int nblk)
{
    dkdv_tile kt;
#if BRANCH == 1
    const int sub = x % NSUB;
#if HEAVY_PASS
    const int blk = heavy_block(x / NSUB, nblk, cmp_off);
#else
    const int blk = x / NSUB;
#endif
#if VARLEN
    int s_id = 0;
    {
        int lo = 0, hi = nseq - 1; /* largest s with cmp_off[s] <= blk */
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (cmp_off[mid] <= blk) lo = mid; else hi = mid - 1;
        }
        s_id = lo;
    }
    kt.kstart = clamp(cu[s_id], 0, T);
    kt.kend = clamp(cu[s_id + 1], kt.kstart, T);
    const int jblk = blk - cmp_off[s_id];
    const bool valid = blk >= 0 && blk < cmp_off[nseq];
#else
    (void)cu; (void)nseq; (void)cmp_off;
    kt.kstart = 0;
    kt.kend = T;
    const int jblk = blk;
    const bool valid = blk >= 0 && blk < nblk;
#endif
    kt.kp0 = jblk * BS + sub * TKK;
    kt.nk = valid ? clamp(min(BS - sub * TKK, TKK), 0, max(0, kt.kend - kt.kstart - kt.kp0)) : 0;
    kt.key0 = kt.kstart + kt.kp0;
    const idx_t lbase = ((idx_t)b * H + h) * (nblk + 1);
    /* HEAVY main pass: a heavy block's rows are the second launch's */
    const bool rows = valid && !(SKIP_INIT_ROWS && jblk < INIT_BLOCKS);
    kt.q_lo = rows ? lst_start[lbase + blk] : 0;
    kt.q_hi = rows ? lst_start[lbase + blk + 1] : 0;
    kt.lrow = ((idx_t)b * H + h) * (idx_t)T * S;
#else
    (void)H; (void)lst_start; (void)nblk;
    kt.key0 = x * TKK;
    kt.nk = clamp(nrows_k - kt.key0, 0, TKK);
    kt.kp0 = kt.kstart = kt.kend = 0;
    kt.lrow = 0;
    /* query tokens: from the first that sees key 0 to the end of the last
     * key's sequence (bounded by the window) */
    kt.q_lo = T;
    kt.q_hi = 0;
    if (kt.nk > 0) {
        const int3 first = dkdv_key(kt, 0, b, T, cu, nseq, cmp_off), last = dkdv_key(kt, kt.nk - 1, b, T, cu, nseq, cmp_off);
#if BRANCH == 0
        kt.q_lo = first.y + first.x * CMP_D + CMP_L - 1;
        kt.q_hi = last.z;
#else
        kt.q_lo = kt.key0;
        kt.q_hi = min(last.z, kt.key0 + kt.nk - 1 + WINDOW);
#endif
    }
    kt.q_hi = max(kt.q_hi, kt.q_lo);
#endif
    return kt;
}

/* The tile's query rows: (q_hi - q_lo) tokens of G heads each. */
inline int dkdv_rows(dkdv_tile kt) { return (kt.q_hi - kt.q_lo) * G; }

#if BRANCH == 1
/* Where query row rr's list entry lies in lst (token * S + slot,
 * nsa_select_index.cl), for rows of the tile. */
inline idx_t dkdv_entry_at(dkdv_tile kt, int rr) { return kt.lrow + kt.q_lo + rr / G; }
#endif

/* Query row rr's list entry (BRANCH 1; 0 past the tile's rows), read once
 * for its token and slot below; 0 for the branches without a list. */
inline int dkdv_row_entry(dkdv_tile kt, int rr, __global const int *lst)
{
#if BRANCH == 1
    return rr < dkdv_rows(kt) ? lst[dkdv_entry_at(kt, rr)] : 0;
#else
    (void)kt; (void)rr; (void)lst;
    return 0;
#endif
}

/* The slot of the token that selected the tile's block, from its entry
 * (BRANCH 1; 0 for the others). */
inline int dkdv_entry_slot(int e)
{
#if BRANCH == 1
    return rem_of(e, e / S, S);
#else
    (void)e;
    return 0;
#endif
}

/* The token of query row rr (-1 past the tile's rows); BRANCH 1: from its
 * list entry e (dkdv_row_entry), else e is not used. */
inline int dkdv_entry_token(dkdv_tile kt, int rr, int e)
{
    if (rr >= dkdv_rows(kt)) return -1;
#if BRANCH == 1
    return e / S;
#else
    (void)e;
    return kt.q_lo + rr / G;
#endif
}

/* The head (in the group) of query row rr. */
inline int dkdv_row_head(int rr) { return rem_of(rr, rr / G, G); }

/* Does token t see key (local position kp, sequence [ks, ke))? */
inline bool sees(int t, int kp, int ks, int ke)
{
    if (t < ks || t >= ke) return false;
    const int tl = t - ks;
#if BRANCH == 0
    return kp * CMP_D + CMP_L - 1 <= tl; /* kp is the compressed index */
#elif BRANCH == 1
    return kp <= tl;
#else
    return kp <= tl && tl - kp < WINDOW;
#endif
}
