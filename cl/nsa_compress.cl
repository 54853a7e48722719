/*
 * nsa_compress.cl: building the compressed keys/values of NSA's compressed
 * branch, and the small conversions around CLBlast's SGEMM for the linear
 * compression. Compressed rows are packed per sequence (see clnsa.h): with
 * VARLEN, sequence s starts at row cmp_off[s]; otherwise each batch row has
 * ceil(T/d) rows. Outputs here are dense: [rows, H, D].
 */

/* Map packed compressed row r to (batch row, sequence, block i in it).
 * Returns false for rows past the last sequence's blocks. */
inline bool cmp_row(int r, int nc_per_b, __global const int *cu, int nseq,
                    __global const int *cmp_off, int T, int *b, int *start, int *len, int *i)
{
#if VARLEN
    if (r >= cmp_off[nseq]) return false;
    int lo = 0, hi = nseq - 1; /* largest s with cmp_off[s] <= r */
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cmp_off[mid] <= r) lo = mid; else hi = mid - 1;
    }
    *b = 0;
    *start = clamp(cu[lo], 0, T);
    *len = clamp(cu[lo + 1], *start, T) - *start;
    *i = r - cmp_off[lo];
#else
    (void)cu; (void)nseq; (void)cmp_off;
    *b = r / nc_per_b;
    *start = 0;
    *len = T;
    *i = r - *b * nc_per_b;
#endif
    return true;
}

/* One work-item: cmp_off[s] = sum of ceil(len_s'/d) over s' < s, s <= nseq. */
__kernel void seq_offsets(__global const int *cu, idx_t cu0, int nseq, int T, int cmp_d,
                          __global int *cmp_off, idx_t cmp_off0)
{
    if (get_global_id(0) != 0) return;
    cu += cu0;
    cmp_off += cmp_off0;
    int off = 0;
    for (int s = 0; s < nseq; ++s) {
        cmp_off[s] = off;
        int a = clamp(cu[s], 0, T), e = clamp(cu[s + 1], a, T);
        off += ceil_div(e - a, cmp_d);
    }
    cmp_off[nseq] = off;
}

/* out[r, h, d] = mean of x over the existing tokens of compressed block r. */
__kernel void mean_pool(__global const store_t *x, idx_t x_off, idx4_t x_st,
                        __global store_t *out, idx_t out0, int D, int H, int nrows, int nc_per_b,
                        __global const int *cu, idx_t cu0, int nseq,
                        __global const int *cmp_off, idx_t cmp_off0, int T, int cmp_l, int cmp_d)
{
    cu += cu0;
    cmp_off += cmp_off0;
    out += out0;
    const int d = get_global_id(0), h = get_global_id(1), r = get_global_id(2);
    if (d >= D || h >= H || r >= nrows) return;
    int b, start, len, i;
    float mean = 0.0f;
    if (cmp_row(r, nc_per_b, cu, nseq, cmp_off, T, &b, &start, &len, &i)) {
        const int p0 = i * cmp_d, p1 = min(len, p0 + cmp_l);
        float sum = 0.0f;
        for (int p = p0; p < p1; ++p) sum += LOAD(x, at4(x_off, x_st, b, start + p, h, d));
        mean = p1 > p0 ? sum / (float)(p1 - p0) : 0.0f;
    }
    STORE(out, ((idx_t)r * H + h) * D + d, mean);
}

/* Linear compression, step 1: xg[(r*H + h), j*D + d] = x[token] + pe[j, d]
 * (zero past the sequence end), f32, ready for one SGEMM with W [l*D, D]. */
__kernel void linear_gather(__global const store_t *x, idx_t x_off, idx4_t x_st,
                            __global const store_t *pe, idx_t pe_off, idx4_t pe_st,
                            __global float *xg, idx_t xg0, int D, int H, int nrows, int nc_per_b,
                            __global const int *cu, idx_t cu0, int nseq,
                            __global const int *cmp_off, idx_t cmp_off0, int T, int cmp_l, int cmp_d)
{
    cu += cu0;
    cmp_off += cmp_off0;
    xg += xg0;
    const int jd = get_global_id(0), h = get_global_id(1), r = get_global_id(2);
    if (jd >= cmp_l * D || h >= H || r >= nrows) return;
    const int j = jd / D, d = jd - j * D;
    int b, start, len, i;
    float val = 0.0f;
    if (cmp_row(r, nc_per_b, cu, nseq, cmp_off, T, &b, &start, &len, &i)) {
        const int p = i * cmp_d + j;
        if (p < len) {
            val = LOAD(x, at4(x_off, x_st, b, start + p, h, d));
            if (pe) val += LOAD(pe, at4(pe_off, pe_st, j, d, 0, 0));
        }
    }
    xg[((idx_t)r * H + h) * (cmp_l * D) + jd] = val;
}

/* Linear compression, step 0: W (strided, storage type) -> dense f32 at w32,
 * and the GEMM's C rows preset to the bias (or zero), so SGEMM runs with
 * beta = 1 and adds the bias for free. */
__kernel void linear_prepare(__global const store_t *w, idx_t w_off, idx4_t w_st,
                             __global const store_t *bias, idx_t b_off, idx4_t b_st,
                             __global float *w32, idx_t w32_0, __global float *c, idx_t c0, int KD, int D,
                             int crows)
{
    w32 += w32_0;
    c += c0;
    const int gid = get_global_id(0);
    if (gid < KD * D) {
        const int r = gid / D, col = gid - r * D;
        w32[gid] = LOAD(w, at4(w_off, w_st, r, col, 0, 0));
    }
    if (gid < crows * D) {
        const int col = gid % D;
        c[gid] = bias ? LOAD(bias, at4(b_off, b_st, col, 0, 0, 0)) : 0.0f;
    }
}

/* Linear compression, step 2 (f16/bf16 storage): dense f32 -> storage type. */
__kernel void store_from_f32(__global const float *src, idx_t src0, __global store_t *dst,
                             idx_t dst0, int n)
{
    src += src0;
    dst += dst0;
    const int gid = get_global_id(0);
    if (gid < n) STORE(dst, gid, src[gid]);
}
