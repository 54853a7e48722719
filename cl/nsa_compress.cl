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

/* out[r, h, d] = mean of x over the existing tokens of compressed block r;
 * keys and values in one launch (z: which tensor, then the row), so the
 * forward's first kernel is one short launch, not two. */
__kernel void mean_pool(__global const store_t *xk, idx_t xk_off, idx4_t xk_st, __global const store_t *xv,
                        idx_t xv_off, idx4_t xv_st, __global store_t *out, idx_t outk0, idx_t outv0, int DK, int DV,
                        int H, int nrows, int nc_per_b, __global const int *cu, idx_t cu0, int nseq,
                        __global const int *cmp_off, idx_t cmp_off0, int T, int cmp_l, int cmp_d)
{
    cu += cu0;
    cmp_off += cmp_off0;
    const int d = get_global_id(0), h = get_global_id(1), z = get_global_id(2);
    const bool vals = z >= nrows;
    const int r = vals ? z - nrows : z, D = vals ? DV : DK;
    if (d >= D || h >= H || r >= nrows) return;
    __global const store_t *x = vals ? xv : xk;
    const idx_t x_off = vals ? xv_off : xk_off;
    const idx4_t x_st = vals ? xv_st : xk_st;
    int b, start, len, i;
    float mean = 0.0f;
    if (cmp_row(r, nc_per_b, cu, nseq, cmp_off, T, &b, &start, &len, &i)) {
        const int p0 = i * cmp_d, p1 = min(len, p0 + cmp_l);
        float sum = 0.0f;
        for (int p = p0; p < p1; ++p) sum += LOAD(x, at4(x_off, x_st, b, start + p, h, d));
        mean = p1 > p0 ? sum / (float)(p1 - p0) : 0.0f;
    }
    STORE(out, (vals ? outv0 : outk0) + ((idx_t)r * H + h) * D + d, mean);
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

/* ------------------------------------------------------------ backward */

/* Finishes dk (or dv) of the tokens: the f32 partial sums of the selected
 * and window branches (`part`, dense [B, T, H, D], may be NULL) plus the
 * compressed branch's gradient brought back through the compression:
 *   mean pooling (linear = 0): dxc [rows, H, D], each covering compressed
 *     token i adds dxc[i] / (its real token count);
 *   linear (linear = 1): dxc is dX [rows*H, l*D] = dk_cmp . W^T, token at
 *     position j of block i adds dX[i][j*D + d].
 * dxc may be NULL (no compressed branch, or given compressed tensors).
 * A gather over the covering blocks, in index order: deterministic. A
 * work-item finishes 4 dims (D is a multiple of 8; part and dxc start at
 * multiples of 4 floats): one work-item a dim spent 5x the time its bytes
 * take at the memory's rate on the token and block arithmetic. Work-items
 * run over a token's (head, 4 dims) pairs, so that a work-group can take
 * all of a token's heads rather than 32 work-items (a GPU holds only so
 * many work-groups a compute unit). */
__kernel void grad_finish(__global const float *part, idx_t part0, __global const float *dxc, idx_t dxc0,
                          int linear, __global store_t *dx, idx_t dx_off, idx4_t dx_st, int D, int H,
                          int nc_per_b, __global const int *cu, idx_t cu0, int nseq,
                          __global const int *cmp_off, idx_t cmp_off0, int T, int cmp_l, int cmp_d)
{
    const int per = D / 4, i = get_global_id(0), h = i / per, d = 4 * (i - h * per), bt = get_global_id(2);
    if (h >= H) return;
    cu += cu0;
    cmp_off += cmp_off0;
    const int b = bt / T, t = bt - b * T;
    float4 val = part ? *(__global const float4 *)(part + part0 + ((idx_t)bt * H + h) * D + d) : (float4)(0.0f);
    if (dxc) {
        const seq_info sq = seq_of(cu, nseq, b, t, T);
        const int tl = t - sq.start;
#if VARLEN
        const int row0 = sq.len > 0 ? cmp_off[sq.id] : 0;
#else
        const int row0 = b * nc_per_b;
#endif
        const int i_lo = tl >= cmp_l ? ceil_div(tl - cmp_l + 1, cmp_d) : 0;
        for (int i = i_lo; sq.len > 0 && i <= tl / cmp_d; ++i) {
            const idx_t r = row0 + i;
            if (linear)
                val += *(__global const float4 *)(dxc + dxc0 + (r * H + h) * (idx_t)(cmp_l * D) + (tl - i * cmp_d) * D + d);
            else
                val += *(__global const float4 *)(dxc + dxc0 + (r * H + h) * D + d) /
                       (float)(min(sq.len, i * cmp_d + cmp_l) - i * cmp_d);
        }
    }
    const idx_t at = at4(dx_off, dx_st, b, t, h, d);
    STORE(dx, at, val.x);
    STORE(dx, at + dx_st.w, val.y);
    STORE(dx, at + 2 * dx_st.w, val.z);
    STORE(dx, at + 3 * dx_st.w, val.w);
}

/* Dense f32 [B*rows, H, D] -> a strided [B, rows, H, D] view in the storage
 * type (dk_cmp / dv_cmp of given compressed tensors). */
__kernel void store_view_from_f32(__global const float *src, idx_t src0, __global store_t *dst, idx_t dst_off,
                                  idx4_t dst_st, int D, int H, int rows)
{
    const int d = get_global_id(0), h = get_global_id(1), br = get_global_id(2);
    if (d >= D || h >= H) return;
    const int b = br / rows, r = br - b * rows;
    STORE(dst, at4(dst_off, dst_st, b, r, h, d), src[src0 + ((idx_t)br * H + h) * D + d]);
}

/* Linear compression, backward of the bias and position embedding, summed
 * in a fixed order over rows and heads:
 *   db[c] = sum dk_cmp[row, h, c],  dpe[j, c] = sum dX[row*H + h][j*D + c]
 * over the blocks whose position j holds a real token. One work-item per
 * column of [l*D] (dpe) and, for the first D of them, of db. */
__kernel void linear_param_grads(__global const float *dxc, idx_t dxc0, __global const float *dX, idx_t dX0,
                                 __global store_t *db, idx_t db_off, idx4_t db_st,
                                 __global store_t *dpe, idx_t dpe_off, idx4_t dpe_st, int D, int H, int nrows,
                                 int nc_per_b, __global const int *cu, idx_t cu0, int nseq,
                                 __global const int *cmp_off, idx_t cmp_off0, int T, int cmp_l, int cmp_d)
{
    const int jd = get_global_id(0);
    if (jd >= cmp_l * D) return;
    cu += cu0;
    cmp_off += cmp_off0;
    const int j = jd / D, c = jd - j * D;
    float sb = 0.0f, sp = 0.0f;
    for (int r = 0; r < nrows; ++r) {
        int b, start, len, i;
        if (!cmp_row(r, nc_per_b, cu, nseq, cmp_off, T, &b, &start, &len, &i)) continue;
        const bool real = i * cmp_d + j < len;
        for (int h = 0; h < H; ++h) {
            if (jd < D) sb += dxc[dxc0 + ((idx_t)r * H + h) * D + c];
            if (real) sp += dX[dX0 + ((idx_t)r * H + h) * (cmp_l * D) + jd];
        }
    }
    if (db && jd < D) STORE(db, at4(db_off, db_st, c, 0, 0, 0), sb);
    if (dpe) STORE(dpe, at4(dpe_off, dpe_st, j, c, 0, 0), sp);
}

/* Dense f32 [R, C] -> a strided 2-d view in the storage type (dW). */
__kernel void store_2d_from_f32(__global const float *src, idx_t src0, __global store_t *dst, idx_t dst_off,
                                idx4_t dst_st, int R, int C)
{
    const int c = get_global_id(0), r = get_global_id(1);
    if (c < C && r < R) STORE(dst, at4(dst_off, dst_st, r, c, 0, 0), src[src0 + (idx_t)r * C + c]);
}

/* Zeroes n floats (a GEMM's C before beta = 0, which would keep a NaN). */
__kernel void fill_zero(__global float *p, idx_t p0, int n)
{
    const int gid = get_global_id(0);
    if (gid < n) p[p0 + gid] = 0.0f;
}
