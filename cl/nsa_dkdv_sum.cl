/*
 * nsa_dkdv_sum.cl: the sums of a split dk/dv pass (nsa_bwd_dkdv.cl and its
 * tensor-core path nsa_bwd_dkdv_warp.cl; which rows: nsa_dkdv.h). A tile
 * whose rows are many (the compressed branch's, the selected branch's heavy
 * blocks') is split NSPLIT ways, each group writing its part's sums to its
 * own slice of a [NSPLIT][B, rows, H, D] f32 region; these kernels add the
 * slices in split order, so the result is deterministic.
 *
 * Defines (besides nsa_dkdv.h): NSPLIT, ACCUM, TKK.
 */

/* dst[i] (+)= the sum of the NSPLIT slices' element i, in split order. */
__kernel void nsa_dkdv_sum(__global const float *part, idx_t part0, __global float *dst, idx_t dst0, idx_t n)
{
    const idx_t i = get_global_id(0);
    if (i >= n) return;
    float sum = 0.0f;
    for (int s = 0; s < NSPLIT; ++s) sum += part[part0 + (idx_t)s * n + i];
    dst[dst0 + i] = ACCUM ? dst[dst0 + i] + sum : sum;
}

#if HEAVY_PASS
/* The heavy pass's slices (nh key rows per batch row: heavy block hb's key
 * kk at row hb*NSUB*TKK + kk) summed in split order into the f32 [B, T, H, D]
 * gradient's rows of those keys' tokens. */
__kernel void nsa_dkdv_sum_heavy(__global const float *part, idx_t part0, __global float *dst, idx_t dst0, int nh,
                                 int H, int D, int T, __global const int *cu, idx_t cu0, int nseq,
                                 __global const int *cmp_off, idx_t cmp_off0, int nblk)
{
    cu += cu0;
    cmp_off += cmp_off0;
    const idx_t i = get_global_id(0), n = (idx_t)get_global_size(1) * nh * H * D;
    const int b = get_global_id(1);
    const idx_t at = (idx_t)b * nh * H * D + i;
    if (i >= (idx_t)nh * H * D) return;
    const idx_t dh = i / D; /* remainders as in rem_of (common.h) */
    const int d = (int)(i - dh * D), kr = (int)(dh / H), h = (int)(dh - (idx_t)kr * H);
    const int hb = kr / (NSUB * TKK), kk = rem_of(kr, hb, NSUB * TKK), blk = heavy_block(hb, nblk, cmp_off);
    (void)nseq;
#if VARLEN
    const int s = hb / INIT_BLOCKS, start = clamp(cu[s], 0, T), end = clamp(cu[s + 1], start, T);
    const int tok = start + (blk - (blk >= 0 ? cmp_off[s] : 0)) * BS + kk;
#else
    const int end = T, tok = blk * BS + kk;
#endif
    if (blk < 0 || kk >= BS || tok >= end) return;
    float sum = 0.0f;
    for (int sp = 0; sp < NSPLIT; ++sp) sum += part[part0 + (idx_t)sp * n + at];
    dst[dst0 + (((idx_t)b * T + tok) * H + h) * D + d] = sum;
}
#endif
