/*
 * nsa_select_index.cl: inverts block_indices [B, T, H, S] into, per batch
 * row and KV head, a list of the query tokens that selected each selection
 * block, in token order, so that the backward's dk/dv of the selected branch
 * is owned by the block (nsa_bwd_dkdv.cl). Deterministic without atomics:
 * tokens are cut into chunks of CHUNK; one work-item per chunk counts, the
 * counts are scanned, and the same work-item scatters its tokens in order.
 * A work-item's increments wait on each other (read, add, write), so its
 * chunk is kept short (the host picks up to 1024 chunks: ~64 tokens at
 * T = 64k) to give the device enough of them. Counts are [B, H, nblk,
 * nchunk], a block's chunks side by side, so that neighbouring work-items
 * zero and update neighbouring words; linear in T since nchunk <= 1024.
 *
 * Blocks are numbered per batch row: block j of sequence s is
 * blk_off[s] + j with VARLEN, else j (nblk blocks per row).
 * Defines: BS, S, HAS_COUNTS, VARLEN, CHUNK (and nsa_ranges.h's).
 */

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

/* counts[blk][c] for the tokens of chunk c */
__kernel void sel_count(__global const int *bidx, idx_t bi_off, idx4_t bi_st,
                        __global const int *bcnt, idx_t bc_off, idx4_t bc_st,
                        __global const int *cu, idx_t cu0, int nseq,
                        __global const int *blk_off, idx_t blk_off0,
                        __global int *cnt, idx_t cnt0, int nblk, int nchunk, int T)
{
    const int c = get_global_id(0), h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    if (c >= nchunk) return;
    cu += cu0;
    blk_off += blk_off0;
    __global int *row = cnt + cnt0 + cnt_at(b, h, H, 0, c, nblk, nchunk);
    for (int j = 0; j < nblk; ++j) row[(idx_t)j * nchunk] = 0;
    for (int t = c * CHUNK; t < min(T, (c + 1) * CHUNK); ++t) {
        const seq_info sq = seq_of(cu, nseq, b, t, T);
        const int tl = t - sq.start, base = blk_base(blk_off, sq);
        const int nslots = slc_slots(bcnt, at4(bc_off, bc_st, b, t, h, 0), sq.len > 0);
        for (int s = 0; s < nslots; ++s) {
            const int2 r = slc_slot(bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w, s, tl);
            if (r.y > 0) row[(idx_t)(base + r.x / BS) * nchunk]++;
        }
    }
}

/* Per block: counts become chunk offsets within the block's list, and the
 * block's total goes to lst_start[blk + 1]. */
__kernel void sel_prefix(__global int *cnt, idx_t cnt0, __global int *lst_start, idx_t ls0, int nblk,
                         int nchunk)
{
    const int j = get_global_id(0), h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    if (j >= nblk) return;
    __global int *col = cnt + cnt0 + cnt_at(b, h, H, j, 0, nblk, nchunk);
    int run = 0;
    for (int c = 0; c < nchunk; ++c) {
        const int n = col[c];
        col[c] = run;
        run += n;
    }
    lst_start[ls0 + ((idx_t)b * H + h) * (nblk + 1) + j + 1] = run;
}

/* Per (batch row, head): block totals -> list starts (inclusive scan). */
__kernel void sel_starts(__global int *lst_start, idx_t ls0, int nblk)
{
    const int h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    if (get_global_id(0) != 0) return;
    __global int *st = lst_start + ls0 + ((idx_t)b * H + h) * (nblk + 1);
    st[0] = 0;
    for (int j = 0; j < nblk; ++j) st[j + 1] += st[j];
}

/* Each chunk writes its tokens, in order, at its offsets in each list. */
__kernel void sel_scatter(__global const int *bidx, idx_t bi_off, idx4_t bi_st,
                          __global const int *bcnt, idx_t bc_off, idx4_t bc_st,
                          __global const int *cu, idx_t cu0, int nseq,
                          __global const int *blk_off, idx_t blk_off0,
                          __global int *cnt, idx_t cnt0, __global const int *lst_start, idx_t ls0,
                          __global int *lst, idx_t lst0, int nblk, int nchunk, int T)
{
    const int c = get_global_id(0), h = get_global_id(1), b = get_global_id(2), H = get_global_size(1);
    if (c >= nchunk) return;
    cu += cu0;
    blk_off += blk_off0;
    __global int *row = cnt + cnt0 + cnt_at(b, h, H, 0, c, nblk, nchunk);
    __global const int *st = lst_start + ls0 + ((idx_t)b * H + h) * (nblk + 1);
    __global int *out = lst + lst0 + ((idx_t)b * H + h) * (idx_t)T * S;
    for (int t = c * CHUNK; t < min(T, (c + 1) * CHUNK); ++t) {
        const seq_info sq = seq_of(cu, nseq, b, t, T);
        const int tl = t - sq.start, base = blk_base(blk_off, sq);
        const int nslots = slc_slots(bcnt, at4(bc_off, bc_st, b, t, h, 0), sq.len > 0);
        for (int s = 0; s < nslots; ++s) {
            const int2 r = slc_slot(bidx, at4(bi_off, bi_st, b, t, h, 0), bi_st.w, s, tl);
            if (r.y > 0) {
                const int j = base + r.x / BS;
                out[st[j] + row[(idx_t)j * nchunk]++] = t;
            }
        }
    }
}
