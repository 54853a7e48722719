/*
 * common.h: helpers shared by every clnsa kernel. The host prepends this file
 * to each program, after the build-time defines:
 *   STORAGE   0 = f32, 1 = f16, 2 = bf16 (storage type of the float tensors)
 *   IDX_LONG  1 when an element offset may exceed 2^31 - 1 (64-bit indexing)
 *   VARLEN    1 when cu_seqlens describes the sequences
 * Arithmetic is always f32; storage is converted at load and store (LOAD8:
 * eight consecutive elements of a global buffer in one load, the first at a
 * multiple of 8 elements from the buffer's start: vload8 would promise the
 * compiler only the element's alignment, and NVIDIA's then loads piecewise).
 */

#if IDX_LONG
typedef long idx_t;
typedef long4 idx4_t;
#else
typedef int idx_t;
typedef int4 idx4_t;
#endif

/* f16 storage needs no cl_khr_fp16: vload_half/vstore_half are core. bf16 is
 * the top half of an f32, rounded to nearest even on store. */
#if STORAGE == 0
typedef float store_t;
#define LOAD(p, i) ((p)[i])
#define LOAD8(p, i) (*(__global const float8 *)((p) + (i)))
#define STORE(p, i, x) ((p)[i] = (x))
#elif STORAGE == 1
typedef half store_t;
#define LOAD(p, i) vload_half((i), (p))
#define LOAD8(p, i) load_half8((p) + (i))
#define STORE(p, i, x) vstore_half_rte((x), (i), (p))
/* One 16-byte read, the halves converted in registers: NVIDIA's OpenCL
 * reads vloada_half8's eight halves one by one (its PTX: 16-bit loads).
 * On the H200 at the anchor's shape at 64k in f16 (2026-11-30) this took
 * the forward given the selection (its add_partial) from 14.69-14.76 to
 * 14.01-14.08 ms and nsa_bwd_delta from 1.32 to 0.89; the halves decoded
 * by hand from the words instead took 14.17-14.33 and 1.45-1.48. */
inline float8 load_half8(__global const half *p)
{
    const uint4 w = *(__global const uint4 *)p;
    return vload_half8(0, (const __private half *)&w);
}
#elif STORAGE == 2
typedef ushort store_t;
#define LOAD(p, i) as_float(((uint)(p)[i]) << 16)
#define LOAD8(p, i) as_float8(convert_uint8(*(__global const ushort8 *)((p) + (i))) << 16)
#define STORE(p, i, x) ((p)[i] = bf16_from_float(x))
inline ushort bf16_from_float(float x)
{
    uint u = as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
#else
#error "STORAGE must be 0 (f32), 1 (f16) or 2 (bf16)"
#endif

/* Element offset of [i0, i1, i2, i3] in a strided view. */
inline idx_t at4(idx_t off, idx4_t st, int i0, int i1, int i2, int i3)
{
    return off + (idx_t)i0 * st.x + (idx_t)i1 * st.y + (idx_t)i2 * st.z + (idx_t)i3 * st.w;
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* x - q*d for q = x / d (q, d < 2^23): the remainder of a division the
 * caller also needs. Not x % d: LLVM turns a division and a remainder of the
 * same operands into a `freeze`, which Oclgrind 21.10's uninitialized-value
 * checker cannot run, and x - q*d by a constant back into x % d; mul24 hides
 * the product from both. */
inline int rem_of(int x, int q, int d) { return x - mul24(q, d); }

/* The sequence that token t of batch row b belongs to. Without VARLEN a batch
 * row is one sequence of T tokens. With VARLEN, cu_seqlens is clamped so that
 * a malformed array can give wrong results but never an out-of-bounds access;
 * a token past cu_seqlens[nseq] belongs to no sequence (len = 0). */
typedef struct {
    int id;    /* sequence index (the batch row without VARLEN) */
    int start; /* first token of the sequence, in the row's token index */
    int len;
} seq_info;

inline seq_info seq_of(__global const int *cu, int nseq, int b, int t, int T)
{
    seq_info s;
#if VARLEN
    int lo = 0, hi = nseq - 1; /* largest s with cu[s] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= t) lo = mid; else hi = mid - 1;
    }
    int start = clamp(cu[lo], 0, T), end = clamp(cu[lo + 1], start, T);
    s.id = lo;
    s.start = start;
    s.len = (t >= start && t < end) ? end - start : 0;
#else
    (void)cu; (void)nseq; (void)t;
    s.id = b;
    s.start = 0;
    s.len = T;
#endif
    return s;
}

/* Key tiles are read column-wise by neighbouring work-items (key j, then
 * j+1, same d): rows padded by one float land in different local-memory
 * banks instead of all in one. (Padded to a multiple of 4 floats and read
 * 16 bytes at a time they measured slower: dk/dv 139 -> 168 ms, dq 85 ->
 * 93 at 16k on the H100.) */
#define KPAD(d) ((d) + 1)

/* Local tiles are declared 16-byte aligned: float arrays are otherwise
 * only 4-byte aligned, and NVIDIA's compiler then reads the consecutive
 * floats of an unpadded row (a q row in the score loops) one at a time
 * where it can read four at once. At 16k on the H100 this took the
 * portable forward from 84.5 to 70.9 ms, the top-k from 12.1 to 8.6 and
 * dq from 111.1 to 85.4. */
#define LOCAL_TILE __attribute__((aligned(16)))

/* Tiles are copied 8 elements a work-item (LOAD8) where the rows are
 * contiguous and start at multiples of 8 elements (the usual case: a
 * [.., tokens, heads, dim] tensor), which takes the per-element address
 * arithmetic and most of the load instructions out of the copy. A warp's
 * 32 work-items take 8 rows by 4 pieces, so that with a row stride of
 * KPAD the 8 stores of each piece land in 32 different banks. Slot i's
 * row, and *c its first column (ncols a multiple of 32, parts = ncols / 32). */
inline int piece_row(int i, int parts, int *c)
{
    const int blk = i >> 5, l = i & 31, rb = blk / parts;
    *c = 32 * rem_of(blk, rb, parts) + 8 * (l & 3);
    return 8 * rb + (l >> 2);
}

inline void put8(__local float *d, float8 x)
{
    d[0] = x.s0; d[1] = x.s1; d[2] = x.s2; d[3] = x.s3;
    d[4] = x.s4; d[5] = x.s5; d[6] = x.s6; d[7] = x.s7;
}

/* Copies `nrows` rows of `ncols` elements from a strided view into a local
 * tile whose rows are `dst_stride` floats apart, converting to f32. All
 * work-items of the group call it; the caller places the barriers. */
inline void load_tile(__local float *dst, int dst_stride, int nrows, int ncols,
                      __global const store_t *src, idx_t base, idx_t row_stride, idx_t col_stride,
                      int lid, int nthreads)
{
    if (col_stride == 1 && ncols % 32 == 0 && base % 8 == 0 && row_stride % 8 == 0 && dst_stride % 32 == 0) {
        /* unpadded rows (every row in the same banks): a warp's work-items
         * take consecutive pieces of one row instead, 16 bytes a store */
        const int per = ncols / 8;
        for (int i = lid; i < nrows * per; i += nthreads) {
            const int r = i / per, c = 8 * rem_of(i, r, per);
            const float8 x = LOAD8(src, base + (idx_t)r * row_stride + c);
            vstore4(x.lo, 0, dst + r * dst_stride + c);
            vstore4(x.hi, 0, dst + r * dst_stride + c + 4);
        }
        return;
    }
    if (col_stride == 1 && ncols % 32 == 0 && base % 8 == 0 && row_stride % 8 == 0) {
        const int parts = ncols / 32;
        for (int i = lid; i < (nrows + 7) / 8 * parts * 32; i += nthreads) {
            int c;
            const int r = piece_row(i, parts, &c);
            if (r < nrows) put8(dst + r * dst_stride + c, LOAD8(src, base + (idx_t)r * row_stride + c));
        }
        return;
    }
    for (int i = lid; i < nrows * ncols; i += nthreads) {
        int r = i / ncols, c = i - r * ncols;
        dst[r * dst_stride + c] = LOAD(src, base + (idx_t)r * row_stride + (idx_t)c * col_stride);
    }
}

/* load_tile for the first `valid` of `nrows` rows; the rest are zeros. */
inline void load_tile_zero(__local float *dst, int dst_stride, int nrows, int valid, int ncols,
                           __global const store_t *src, idx_t base, idx_t row_stride, idx_t col_stride, int lid,
                           int nthreads)
{
    valid = clamp(valid, 0, nrows);
    load_tile(dst, dst_stride, valid, ncols, src, base, row_stride, col_stride, lid, nthreads);
    for (int i = lid; i < (nrows - valid) * ncols; i += nthreads) {
        const int r = i / ncols, c = i - r * ncols;
        dst[(valid + r) * dst_stride + c] = 0.0f;
    }
}

/* The same for rows from anywhere: row r from src + at[r] (at[r] < 0:
 * zeros), times mul[r] where `scaled`; `aligned`: every at[r] is a
 * multiple of 8 elements. */
inline void gather_rows(__local float *dst, int dst_stride, int nrows, int ncols, __global const store_t *src,
                        __local const idx_t *at, idx_t col_stride, bool aligned, __local const float *mul, bool scaled,
                        int lid, int nthreads)
{
    if (aligned && col_stride == 1 && ncols % 32 == 0) {
        const int parts = ncols / 32;
        for (int i = lid; i < (nrows + 7) / 8 * parts * 32; i += nthreads) {
            int c;
            const int r = piece_row(i, parts, &c);
            if (r >= nrows) continue;
            const idx_t a = at[r];
            const float8 x = a >= 0 ? LOAD8(src, a + c) : (float8)(0.0f);
            put8(dst + r * dst_stride + c, scaled ? mul[r] * x : x);
        }
        return;
    }
    for (int i = lid; i < nrows * ncols; i += nthreads) {
        const int r = i / ncols, c = i - r * ncols;
        const idx_t a = at[r];
        const float x = a >= 0 ? LOAD(src, a + (idx_t)c * col_stride) : 0.0f;
        dst[r * dst_stride + c] = scaled ? mul[r] * x : x;
    }
}

/* Products from local tiles, shared by the portable kernels (attention
 * forward, top-k, dq, dk/dv, the block-sparse backward). Each sum runs in
 * element order, as the reference's, so the tiling changes no result bit;
 * it only cuts local-memory reads per product, which bound these loops. */

/* A work-item's tile of dot products: TILE_SR_OF rows by TILE_SC_OF keys
 * (at most 2x2) where the work-group has that many per work-item, so that
 * each element read feeds two products (one product a work-item took two
 * reads). Function-like macros so that #if can pick them per kernel. */
#define TILE_SR_OF(rows, keys, wg) (((rows) * (keys) >= 4 * (wg) && (rows) % 2 == 0 && (keys) % 2 == 0) ? 2 : 1)
#define TILE_SC_OF(rows, keys, wg) (((rows) * (keys) >= 2 * (wg) && (keys) % 2 == 0) ? 2 : 1)
/* The score tiles of a per-query kernel (GT rows by TK keys, WG work-items:
 * attn_tile.h, nsa_topk.cl, nsa_bwd_dq.cl): a work-item's TILE_SR rows by
 * TILE_SC keys, its keys TILE_COLS apart so that neighbouring work-items
 * read neighbouring (padded) key rows. */
#define TILE_SR TILE_SR_OF(GT, TK, WG)
#define TILE_SC TILE_SC_OF(GT, TK, WG)
#define TILE_COLS (TK / TILE_SC)

/* Score tile `it` of a work-group's rows x keys products, cut in tiles of
 * sr rows by sc keys that lie cols = keys / sc apart (so that neighbouring
 * work-items read neighbouring rows): its first row; *jt its first key,
 * key[c] its keys clamped to the nk loaded (a key past them reads key
 * nk-1's row, and the caller masks its products). */
inline int score_tile(int it, int cols, int sr, int sc, int nk, int *jt, int *key)
{
    const int gt = it / cols;
    *jt = rem_of(it, gt, cols);
    for (int c = 0; c < sc; ++c) key[c] = min(*jt + c * cols, nk - 1);
    return gt * sr;
}

/* dot[r][c] = a[row0 + r] . b[key[c]] over n elements, for r < sr and
 * c < sc (sr, sc <= 2, constants at the call site); rows of a and b are
 * a_stride and b_stride apart. */
inline void dot_tile(__local const float *a, int a_stride, int row0, __local const float *b, int b_stride, const int *key,
                     int n, int sr, int sc, float dot[2][2])
{
    for (int r = 0; r < sr; ++r)
        for (int c = 0; c < sc; ++c) dot[r][c] = 0.0f;
    for (int d = 0; d < n; ++d) {
        float bd[2];
        for (int c = 0; c < sc; ++c) bd[c] = b[key[c] * b_stride + d];
        for (int r = 0; r < sr; ++r) {
            const float ad = a[(row0 + r) * a_stride + d];
            for (int c = 0; c < sc; ++c) dot[r][c] = fma(ad, bd[c], dot[r][c]);
        }
    }
}

/* score_tile's tile `it` and its scores' dot products: the tile's rows of
 * qs (DK wide) with its keys' rows of ks (KPAD(DK) apart) into dot; returns
 * the first row, and *jt, key[] as score_tile. Every portable score walk
 * opens with it; the backward's go on to dO . V over the same keys.
 * (Programs without attention, DK undefined, do not get it.) */
#ifdef DK
inline int score_tile_qk(__local const float *qs, __local const float *ks, int it, int cols, int sr, int sc, int nk,
                         int *jt, int *key, float dot[2][2])
{
    const int g0 = score_tile(it, cols, sr, sc, nk, jt, key);
    dot_tile(qs, DK, g0, ks, KPAD(DK), key, DK, sr, sc, dot);
    return g0;
}
#endif

/* The 4 x 4 block of outputs a work-item owns where a tile's outputs are
 * exactly 16 a work-item (BLOCK_OF): with `cols`/4 blocks a block row,
 * block lid's output i is row 4 (lid / (cols/4)) + i / 4, column
 * 4 (lid % (cols/4)) + i % 4. */
#define BLOCK_OF(rows, cols, wg) ((rows) % 4 == 0 && (cols) % 4 == 0 && (wg) * 16 == (rows) * (cols))
inline void block_elem(int i, int lid, int cols, int *r, int *c)
{
    const int rb = lid / (cols / 4);
    *r = 4 * rb + i / 4;
    *c = 4 * rem_of(lid, rb, cols / 4) + (i & 3);
}

/* Output i of work-item lid in a rows x cols tile: its block's (block:
 * BLOCK_OF holds), else element lid + i*wg of the row-major tile; false
 * where that lies past the tile. */
inline bool tile_elem(bool block, int i, int lid, int wg, int rows, int cols, int *r, int *c)
{
    if (block) {
        block_elem(i, lid, cols, r, c);
        return true;
    }
    const int x = lid + i * wg;
    *r = x / cols;
    *c = rem_of(x, *r, cols);
    return x < rows * cols;
}

/* acc[4r + c] += sum over j < n of a(r, j) * m[j * m_stride + c0 + c] for
 * r, c < 4, in j order (as accumulate_rows: the same bits), where a(r, j)
 * is a[(r0 + r) * a_stride + j] (a_rows) or a[j * a_stride + r0 + r]. Per
 * 16 products a work-item reads 2 float4 (one of a, the same for a whole
 * warp where its work-items share r0, and one of m), where one output a
 * work-item (accumulate_rows) read 5 floats. m's rows are read 16 bytes at
 * a time where m_stride allows (unpadded tiles). */
inline void accumulate_block(__local const float *a, int a_stride, int r0, bool a_rows, __local const float *m,
                             int m_stride, int c0, float acc[16], int n)
{
    const int n4 = a_rows ? n / 4 * 4 : 0;
    for (int j = 0; j < n4; j += 4) {
        const float4 m0 = vload4(0, m + j * m_stride + c0), m1 = vload4(0, m + (j + 1) * m_stride + c0);
        const float4 m2 = vload4(0, m + (j + 2) * m_stride + c0), m3 = vload4(0, m + (j + 3) * m_stride + c0);
        for (int r = 0; r < 4; ++r) {
            const float4 p = vload4(0, a + (r0 + r) * a_stride + j);
            float *x = acc + 4 * r;
            x[0] = fma(p.w, m3.x, fma(p.z, m2.x, fma(p.y, m1.x, fma(p.x, m0.x, x[0]))));
            x[1] = fma(p.w, m3.y, fma(p.z, m2.y, fma(p.y, m1.y, fma(p.x, m0.y, x[1]))));
            x[2] = fma(p.w, m3.z, fma(p.z, m2.z, fma(p.y, m1.z, fma(p.x, m0.z, x[2]))));
            x[3] = fma(p.w, m3.w, fma(p.z, m2.w, fma(p.y, m1.w, fma(p.x, m0.w, x[3]))));
        }
    }
    for (int j = n4; j < n; ++j) {
        const float4 mv = vload4(0, m + j * m_stride + c0);
        const float4 av = a_rows ? (float4)(a[r0 * a_stride + j], a[(r0 + 1) * a_stride + j], a[(r0 + 2) * a_stride + j],
                                            a[(r0 + 3) * a_stride + j])
                                 : vload4(0, a + j * a_stride + r0);
        const float ar[4] = {av.x, av.y, av.z, av.w};
        for (int r = 0; r < 4; ++r) {
            float *x = acc + 4 * r;
            x[0] = fma(ar[r], mv.x, x[0]);
            x[1] = fma(ar[r], mv.y, x[1]);
            x[2] = fma(ar[r], mv.z, x[2]);
            x[3] = fma(ar[r], mv.w, x[3]);
        }
    }
}

/* acc[i] += sum over j < n of p[row[i] * p_stride + j] * m[j * m_stride + col[i]],
 * in j order, for the n_acc outputs with row[i] >= 0. j runs outermost,
 * four a step, so that a work-item reads p four at a time (as a float4
 * where p_stride allows) and, where all its outputs share a column
 * (one_col), each m element once for them all. */
inline void accumulate_rows(__local const float *p, int p_stride, __local const float *m, int m_stride,
                            const int *row, const int *col, float *acc, int n_acc, int n, bool one_col)
{
    const bool vec = p_stride % 4 == 0;
    const int n4 = n / 4 * 4;
    for (int j = 0; j < n4; j += 4) {
        float4 m4 = (float4)(m[j * m_stride + col[0]], m[(j + 1) * m_stride + col[0]], m[(j + 2) * m_stride + col[0]],
                             m[(j + 3) * m_stride + col[0]]);
        for (int i = 0; i < n_acc; ++i) {
            if (row[i] < 0) continue;
            if (!one_col) {
                const int c = col[i];
                m4 = (float4)(m[j * m_stride + c], m[(j + 1) * m_stride + c], m[(j + 2) * m_stride + c],
                              m[(j + 3) * m_stride + c]);
            }
            const int pi = row[i] * p_stride + j;
            const float4 p4 = vec ? vload4(0, p + pi) : (float4)(p[pi], p[pi + 1], p[pi + 2], p[pi + 3]);
            acc[i] = fma(p4.w, m4.w, fma(p4.z, m4.z, fma(p4.y, m4.y, fma(p4.x, m4.x, acc[i]))));
        }
    }
    for (int j = n4; j < n; ++j)
        for (int i = 0; i < n_acc; ++i)
            if (row[i] >= 0) acc[i] = fma(p[row[i] * p_stride + j], m[j * m_stride + col[i]], acc[i]);
}
