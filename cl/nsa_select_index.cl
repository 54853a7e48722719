/*
 * nsa_select_index.cl: inverts block_indices [B, T, H, S] into, per batch
 * row and KV head, a list of the query tokens that selected each selection
 * block, in token order, so that the backward's dk/dv of the selected branch
 * is owned by the block (nsa_bwd_dkdv.cl). An entry is token * S + slot:
 * which of the token's slots holds the block (where the dk/dv pass keeps dS
 * for dq, nsa_bwd_dkdv_warp.cl's DS_KEEP). Deterministic without atomics:
 * tokens are cut into chunks of CHUNK, one work-group of IDX_WG work-items a
 * chunk; the work-group counts its chunk's selections per block, the counts
 * are scanned, and the same work-group writes its tokens at the scanned
 * offsets. Counts are [B, H, nblk, nchunk], a block's chunks side by side,
 * so that the scan reads them in a row; linear in T since nchunk <= 1024.
 *
 * A chunk's (token, slot) entries go through the work-group IDX_WG at a time
 * (a round), token-major, so a block's entries keep token order: an entry's
 * place among its round's entries of the same block (its rank) comes from
 * comparing block numbers in local memory, and only the round's last entry
 * of a block updates that block's count word. One work-item walking its
 * chunk's entries alone would wait on each count word's read, add and write
 * in turn (1.6 ms at T = 64k on an H100).
 *
 * Blocks are numbered per batch row: block j of sequence s is
 * blk_off[s] + j with VARLEN, else j (nblk blocks per row).
 * Defines: BS, S, HAS_COUNTS, VARLEN, CHUNK, IDX_WG (and nsa_ranges.h's).
 */

#define ROUNDS ((CHUNK * S + IDX_WG - 1) / IDX_WG)

inline int blk_base(__global const int *blk_off, seq_info sq)
{
#if VARLEN
    return blk_off[sq.id];
#else
    (void)blk_off; (void)sq;
    return 0;
#endif
}

/* The count word of (batch row b, head h, block j, chunk c). */
inline idx_t cnt_at(int b, int h, int H, int j, int c, int nblk, int nchunk)
{
    return (((idx_t)b * H + h) * nblk + j) * nchunk + c;
}

/* The sum of v over the work-group's items before this one (returned) and
 * over all of them (*all). part holds IDX_WG ints. */
inline int wg_exclusive_sum(int v, __local int *part, int *all)
{
    const int lid = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE); /* the previous call's readers are done */
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    int before = 0, sum = 0;
    for (int i = 0; i < IDX_WG; ++i) {
        const int p = part[i];
        before += i < lid ? p : 0;
        sum += p;
    }
    *all = sum;
    return before;
}

/* One entry of a round: token t selected block j (-1: no entry) in its
 * slot s, the rank-th of the round's entries of j, the round's last entry
 * of j. */
typedef struct {
    int t, s, j, rank;
    bool last;
} sel_entry;

#define SEL_ENTRY_ARGS                                                                                       \
    __global const int *bidx, idx_t bi_off, idx4_t bi_st, __global const int *bcnt, idx_t bc_off, idx4_t bc_st, \
        __global const int *cu, int nseq, __global const int *blk_off, int b, int h, int c, int T

/* Entry r * IDX_WG + lid of chunk c: slot e % S of token c * CHUNK + e / S.
 * Starts with a barrier that also orders the previous round's count words
 * before this round's. jl holds IDX_WG ints. */
inline sel_entry round_entry(SEL_ENTRY_ARGS, int r, __local int *jl)
{
    const int lid = get_local_id(0), e = r * IDX_WG + lid, tok = e / S;
    sel_entry x;
    x.t = c * CHUNK + tok;
    x.j = -1;
    x.s = rem_of(e, tok, S); /* not e % S: common.h, rem_of */
    if (e < CHUNK * S && x.t < T) {
        const seq_info sq = seq_of(cu, nseq, b, x.t, T);
        if (x.s < slc_slots(bcnt, at4(bc_off, bc_st, b, x.t, h, 0), sq.len > 0)) {
            const int2 k = slc_slot(bidx, at4(bi_off, bi_st, b, x.t, h, 0), bi_st.w, x.s, x.t - sq.start);
            if (k.y > 0) x.j = blk_base(blk_off, sq) + k.x / BS;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    jl[lid] = x.j;
    barrier(CLK_LOCAL_MEM_FENCE);
    x.rank = 0;
    x.last = x.j >= 0;
    for (int i = 0; i < IDX_WG; ++i) {
        const bool same = jl[i] == x.j;
        x.rank += same && i < lid;
        x.last = x.last && !(same && i > lid);
    }
    return x;
}

/* counts[blk][c] for the tokens of chunk c */
__kernel __attribute__((reqd_work_group_size(IDX_WG, 1, 1))) void sel_count(
    __global const int *bidx, idx_t bi_off, idx4_t bi_st, __global const int *bcnt, idx_t bc_off, idx4_t bc_st,
    __global const int *cu, idx_t cu0, int nseq, __global const int *blk_off, idx_t blk_off0, __global int *cnt,
    idx_t cnt0, int nblk, int nchunk, int T)
{
    const int c = get_group_id(0), h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    __local int jl[IDX_WG];
    __global int *row = cnt + cnt0 + cnt_at(b, h, H, 0, c, nblk, nchunk);
    for (int j = get_local_id(0); j < nblk; j += IDX_WG) row[(idx_t)j * nchunk] = 0;
    for (int r = 0; r < ROUNDS; ++r) {
        const sel_entry x = round_entry(bidx, bi_off, bi_st, bcnt, bc_off, bc_st, cu + cu0, nseq, blk_off + blk_off0, b,
                                        h, c, T, r, jl);
        if (x.last) row[(idx_t)x.j * nchunk] += x.rank + 1;
    }
}

/* Per block: counts become chunk offsets within the block's list, and the
 * block's total goes to lst_start[blk + 1]. */
__kernel __attribute__((reqd_work_group_size(IDX_WG, 1, 1))) void sel_prefix(
    __global int *cnt, idx_t cnt0, __global int *lst_start, idx_t ls0, int nblk, int nchunk)
{
    const int j = get_group_id(0), h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    __local int part[IDX_WG];
    __global int *col = cnt + cnt0 + cnt_at(b, h, H, j, 0, nblk, nchunk);
    int run = 0;
    for (int c0 = 0; c0 < nchunk; c0 += IDX_WG) {
        const int c = c0 + (int)get_local_id(0);
        int all;
        const int before = wg_exclusive_sum(c < nchunk ? col[c] : 0, part, &all);
        if (c < nchunk) col[c] = run + before;
        run += all;
    }
    if (get_local_id(0) == 0) lst_start[ls0 + ((idx_t)b * H + h) * (nblk + 1) + j + 1] = run;
}

/* Per (batch row, head): block totals -> list starts (inclusive scan). */
__kernel __attribute__((reqd_work_group_size(IDX_WG, 1, 1))) void sel_starts(
    __global int *lst_start, idx_t ls0, int nblk)
{
    const int h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    __local int part[IDX_WG];
    __global int *st = lst_start + ls0 + ((idx_t)b * H + h) * (nblk + 1);
    int run = 0;
    for (int j0 = 0; j0 < nblk; j0 += IDX_WG) {
        const int j = j0 + (int)get_local_id(0);
        const int n = j < nblk ? st[j + 1] : 0;
        int all;
        const int before = wg_exclusive_sum(n, part, &all);
        if (j < nblk) st[j + 1] = run + before + n;
        run += all;
    }
    if (get_local_id(0) == 0) st[0] = 0;
}

/* Each chunk writes its entries (token * S + slot), in token order, at its
 * offsets in each list. */
__kernel __attribute__((reqd_work_group_size(IDX_WG, 1, 1))) void sel_scatter(
    __global const int *bidx, idx_t bi_off, idx4_t bi_st, __global const int *bcnt, idx_t bc_off, idx4_t bc_st,
    __global const int *cu, idx_t cu0, int nseq, __global const int *blk_off, idx_t blk_off0, __global int *cnt,
    idx_t cnt0, __global const int *lst_start, idx_t ls0, __global int *lst, idx_t lst0, int nblk, int nchunk, int T)
{
    const int c = get_group_id(0), h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    __local int jl[IDX_WG];
    __global int *row = cnt + cnt0 + cnt_at(b, h, H, 0, c, nblk, nchunk);
    __global const int *st = lst_start + ls0 + ((idx_t)b * H + h) * (nblk + 1);
    __global int *out = lst + lst0 + ((idx_t)b * H + h) * (idx_t)T * S;
    for (int r = 0; r < ROUNDS; ++r) {
        const sel_entry x = round_entry(bidx, bi_off, bi_st, bcnt, bc_off, bc_st, cu + cu0, nseq, blk_off + blk_off0, b,
                                        h, c, T, r, jl);
        int at = 0; /* the chunk's offset in block x.j's list */
        if (x.j >= 0) {
            at = row[(idx_t)x.j * nchunk];
            out[st[x.j] + at + x.rank] = x.t * S + x.s;
        }
        barrier(CLK_GLOBAL_MEM_FENCE); /* every entry has read its block's offset */
        if (x.last) row[(idx_t)x.j * nchunk] = at + x.rank + 1;
    }
}
