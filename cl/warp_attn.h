/*
 * warp_attn.h: attention of one warp's 16 query rows to a stream of key
 * chunks, FlashAttention-2 style: the scores S = Q K^T, the probabilities P
 * and the output accumulator stay in mma fragments (warp_mma.h), the row
 * statistics are exchanged across the 4 lanes of a row, and P feeds the
 * P V product straight from the score registers. Keys and values are read
 * from global memory into registers, each lane reading whole 8- or 16-byte
 * pieces of a row; or, where the host says (V_STAGE below, the dq kernel's
 * K), copied into a warp's own local tile first, which only the warp's own
 * barrier (warp_sync) guards.
 *
 * The order in which a product's contraction index runs does not change
 * the product, so each one is permuted to make the reads contiguous:
 *   Q K^T  over the head dim: k-step kk of lane t covers dims
 *          kdim(kk, t) .. +3 (two words), so a lane reads 16 contiguous
 *          bytes of a row for two k-steps (load_kfrag);
 *   P V    over the keys: lane (gq, t) holds the keys 2t, 2t+1, 2t+8, 2t+9
 *          of each 16-key step (as the score fragments give them), and
 *          output column n = gq of n-block nb is dim gq*DV/8 + nb, so a lane
 *          reads DV/8 contiguous values of each of its 4 key rows
 *          (load_cols) and holds DV/4 contiguous output values of each of
 *          its two rows (store_rows).
 * Row stride, not dim stride, is free: the dim stride must be 1, and rows
 * 16-byte aligned (the host checks both before choosing this path).
 *
 * Defines: DK, DV (multiples of 16), KC (keys per chunk, a multiple of 16),
 * NW (warps per work-group).
 * Per lane: qa[DK/4] words (the 16 x DK query fragments), acc[DV/2] floats,
 * and, per row it holds (gq, gq+8), the running max m (log2 units) and the
 * lane's part of the running sum l.
 */

#ifndef V_EARLY
#define V_EARLY 0
#endif
#define QA_WORDS (DK / 4)
#define ACC_N (DV / 2)
#define LOG2E 1.4426950408889634f

/* Local tiles are read two ways: lds_kfrag takes 16-byte chunks, eight
 * lanes (a quarter-warp, served together) at a time, rows 2p and 2p+1 four
 * chunks each; lds_bfrag_trans's ldmatrix takes one chunk of eight
 * consecutive rows at a time. A padded row stride (16 bytes past a multiple
 * of 128) serves both; a tile stored unpadded (stride = dim, dim a multiple
 * of 64 elements: 128 bytes, 8 chunks) has chunk c of row r at c ^ s(r),
 * s(r) = 4 * bit 0 of r + bits 1-2 of r: eight consecutive rows take eight
 * distinct 4-bank groups, and rows 2p, 2p+1 differ in the 4, so lds_kfrag's
 * two rows take the two halves. tile_col gives the position of element e
 * (a chunk's first) of row r; padded tiles and global rows are not
 * swizzled. */
#define TILE_SWIZZLED(stride, dim) ((stride) == (dim) && (dim) % 64 == 0)

/* ACC_TRANS = 1 (programs whose accumulations read local tiles, through
 * lds_accumulate_trans): accumulators hold their columns in mma's own
 * order; 0 (warp_accumulate from global rows): in the order load_cols gives.
 * row_value, row_col and the stores follow it. */
#ifndef ACC_TRANS
#define ACC_TRANS 0
#endif

inline int tile_col(int r, int e, idx_t stride, int dim)
{
    const int m = (((r & 1) << 2) | ((r >> 1) & 3)) << 3;
    return TILE_SWIZZLED(stride, dim) ? e ^ m : e;
}

inline int global_col(int r, int e, idx_t stride, int dim)
{
    (void)r; (void)stride; (void)dim;
    return e;
}

/* The four words of x (8 elements) into w[0..3]: .lo.lo is a uint of a
 * uint4, a float2 of a float8. */
#define SPLIT_WORDS4(x, w) ((w)[0] = (x).lo.lo, (w)[1] = (x).lo.hi, (w)[2] = (x).hi.lo, (w)[3] = (x).hi.hi)

/* Starts copying 8 elements (a chunk: 16 bytes, 32 in f32) from src into
 * dst, or zeros when !valid (copy16_async, which says what `cached` does). */
inline void copy_chunk_async(__local store_t *dst, __global const store_t *src, bool valid, bool cached)
{
    for (int i = 0; i < 8; i += 16 / (int)sizeof(store_t)) copy16_async(dst + i, src + i, valid, cached);
}

/* Row reads (their loops have constant trip counts and unroll). Row r of a tile at base with row stride rs; zeros
 * where !valid. With guard, rows that are not valid are not read (they may
 * lie outside the buffer); without, row r is read whatever valid says (it
 * must be readable) and the words zeroed after: the loads are then
 * unconditional and share one row address, where predicated loads made
 * NVIDIA's compiler rebuild the 64-bit address for every piece (about 150
 * integer instructions per 32 mma in the forward's loop on the H200).
 *   load_kfrag, lds_kfrag (global or local memory: OpenCL 1.2 has no
 *     generic address space): the words lane t holds of a `dim`-long row
 *     for the k-steps of a product over that dim: k-step kk in words 2kk,
 *     2kk+1 (dims kdim(kk, t) .. +3);
 *   load_cols: dim/16 words of a global row, the dims gq*dim/8 ..
 *     +dim/8-1 of lane (gq, t) (local tiles are read by lds_bfrag_trans). */
#define ROW_PIECE(T, ptr, valid, guard) ((guard) && !(valid) ? (T)(0) : *(ptr))
#define DEFINE_KFRAG(SPACE, KFRAG, COL)                                                                            \
    inline void KFRAG(SPACE const store_t *base, idx_t rs, int r, int dim, bool valid, bool guard, word_t *w)     \
    {                                                                                                             \
        const int t = lane_id() & 3;                                                                              \
        SPACE const store_t *row = base + (idx_t)r * rs;                                                          \
        for (int kp = 0; kp < dim / 32; ++kp) {                                                                   \
            const word4_t x = ROW_PIECE(word4_t, (SPACE const word4_t *)(row + COL(r, 32 * kp + 8 * t, rs, dim)), \
                                        valid, guard);                                                            \
            SPLIT_WORDS4(valid ? x : (word4_t)(0), w + 4 * kp);                                                   \
        }                                                                                                         \
        if (dim % 32) {                                                                                           \
            const int kk = dim / 16 - 1;                                                                          \
            const word2_t x = ROW_PIECE(word2_t, (SPACE const word2_t *)(row + 16 * kk + 4 * t), valid, guard);    \
            w[2 * kk] = valid ? x.lo : (word_t)(0);                                                               \
            w[2 * kk + 1] = valid ? x.hi : (word_t)(0);                                                           \
        }                                                                                                         \
    }

DEFINE_KFRAG(__global, load_kfrag, global_col)
DEFINE_KFRAG(__local, lds_kfrag, tile_col)

/* K_LINES (set by the host): the B fragments of Q K^T read as whole lines.
 * load_kfrag's reads cover 8 rows x 16 elements a quad (half a 128-byte
 * line of each row in 16-bit types), which L1 serves at about half the
 * rate of whole lines (bench/RESULTS_ROUNDS_2026-11-28.md, twentieth session). Here the two
 * quads of a pair (gq = 2c, 2c+1: score columns 2c and 2c+1, both held by
 * lane t = c of the accumulators) read rows a = 2c and b = 2c+1 of the
 * n-block together, 64 contiguous elements a row and instruction: the
 * even quad takes a's first 32 and b's last 32 of each 64, the odd quad
 * the other halves. So in the k-steps of the first halves (kp even) the
 * columns are (a, b), in those of the last halves (b, a): each runs in an
 * accumulator of its own, and the scores are their sums across the pair
 * of columns (kline_reads and kline_words give the words in that order, the
 * SELs putting each quad's halves where its k-steps want them). Q's fragments
 * are unchanged: lane t still holds dims 32kp + 8t .. +7 of its row. */
#ifndef K_LINES
#define K_LINES 0
#endif
/* The pair's reads of row r's n-block (r = 8nb + gq): xy[2L], xy[2L+1] the
 * 64-element pieces L of rows a and b, each quad's half of them. */
inline void kline_reads(__global const store_t *base, idx_t rs, int r, int lo, int hi, int dim, word4_t *xy)
{
    const int t = lane_id() & 3, odd = (lane_id() >> 2) & 1, ra = r & ~1, rb = r | 1;
    __global const store_t *pa = base + (idx_t)clamp(ra, lo, hi - 1) * rs + 32 * odd + 8 * t;
    __global const store_t *pb = base + (idx_t)clamp(rb, lo, hi - 1) * rs + 32 * (odd ^ 1) + 8 * t;
    const bool va = ra >= lo && ra < hi, vb = rb >= lo && rb < hi;
    for (int L = 0; L < dim / 64; ++L) {
        /* unconditional reads of the clamped rows, zeroed after (as load_kfrag) */
        const word4_t x = *(__global const word4_t *)(pa + 64 * L), y = *(__global const word4_t *)(pb + 64 * L);
        xy[2 * L] = va ? x : (word4_t)(0);
        xy[2 * L + 1] = vb ? y : (word4_t)(0);
    }
}

/* kline_reads' pieces as load_kfrag's words: the even quad's first-half
 * k-steps (kp = 2L) take row a's piece and its last-half ones row b's, the
 * odd quad's the other way round (two SELs a word). */
inline void kline_words(const word4_t *xy, int dim, word_t *w)
{
    const int odd = (lane_id() >> 2) & 1;
    for (int L = 0; L < dim / 64; ++L) {
        SPLIT_WORDS4(odd ? xy[2 * L + 1] : xy[2 * L], w + 8 * L);
        SPLIT_WORDS4(odd ? xy[2 * L] : xy[2 * L + 1], w + 8 * L + 4);
    }
}

inline void load_cols(__global const store_t *base, idx_t rs, int r, int dim, bool valid, bool guard, word_t *w)
{
    const int n = dim / 16, e0 = (lane_id() >> 2) * (dim / 8);
    __global const store_t *row = base + (idx_t)r * rs;
    if (n % 4 == 0) {
        for (int i = 0; i < n / 4; ++i) {
            const word4_t x = ROW_PIECE(word4_t, (__global const word4_t *)(row + e0 + 8 * i), valid, guard);
            SPLIT_WORDS4(valid ? x : (word4_t)(0), w + 4 * i);
        }
    } else if (n % 2 == 0) {
        for (int i = 0; i < n / 2; ++i) {
            const word2_t x = ROW_PIECE(word2_t, (__global const word2_t *)(row + e0) + i, valid, guard);
            w[2 * i] = valid ? x.lo : (word_t)(0);
            w[2 * i + 1] = valid ? x.hi : (word_t)(0);
        }
    } else {
        for (int i = 0; i < n; ++i) {
            const word_t x = ROW_PIECE(word_t, (__global const word_t *)(row + e0) + i, valid, guard);
            w[i] = valid ? x : (word_t)(0);
        }
    }
}

/* Starts copying `rows` rows of `dim` elements (row r at src + r*rs) into
 * a local tile of `stride`-element rows (swizzled where tile_col says),
 * zeros from row `valid` on (zero keys and values keep masked products
 * finite); asynchronous on NVIDIA (copy_chunk_async): the tile is complete
 * after copy_async_wait() and a barrier. The `step` work-items from
 * `first` (a work-group's, or a warp's lanes) call it; `cached` as
 * copy16_async. */
inline void stage_rows_by(__local store_t *dst, int stride, int rows, int dim, __global const store_t *src, idx_t rs,
                          int valid, int first, int step, bool cached)
{
    const int per = dim / 8;
    for (int i = first; i < rows * per; i += step) {
        const int r = i / per, c = 8 * rem_of(i, r, per);
        const idx_t from = (idx_t)min(r, max(valid - 1, 0)) * rs + c;
        copy_chunk_async(dst + r * stride + tile_col(r, c, stride, dim), src + from, r < valid, cached);
    }
    copy_async_commit();
}

/* The same by every work-item of the NW warps, through L2 only. */
inline void stage_rows(__local store_t *dst, int stride, int rows, int dim, __global const store_t *src, idx_t rs,
                       int valid)
{
    stage_rows_by(dst, stride, rows, dim, src, rs, valid, get_local_id(0), NW * WARP, false);
}

/* The A fragments of 16 rows for a product over `dim`: row gq at r0, row
 * gq+8 at r8 (either absent: zeros). qa[4*kk + i] = a_i of k-step kk. */
inline void load_afrag(__global const store_t *r0, bool v0, __global const store_t *r8, bool v8, int dim, word_t *qa)
{
    word_t w0[32], w8[32];
    load_kfrag(r0, 0, 0, dim, v0, true, w0);
    load_kfrag(r8, 0, 0, dim, v8, true, w8);
#pragma unroll
    for (int kk = 0; kk < dim / 16; ++kk) {
        qa[4 * kk] = w0[2 * kk];
        qa[4 * kk + 1] = w8[2 * kk];
        qa[4 * kk + 2] = w0[2 * kk + 1];
        qa[4 * kk + 3] = w8[2 * kk + 1];
    }
}

/* c[4*nb ..] += A B for the `dim`/8 n-blocks of B, whose 16 k-rows (the
 * keys 2t, 2t+1, 2t+8, 2t+9 of lane t) were read by load_cols. */
inline void mma_cols(float *c, word_t a0, word_t a1, word_t a2, word_t a3, const word_t *k0, const word_t *k1,
                     const word_t *k8, const word_t *k9, int dim, __local uint *ws)
{
#pragma unroll
    for (int nb = 0; nb < dim / 8; ++nb) {
        const int w = nb >> 1, hi = nb & 1;
        mma16816(c + 4 * nb, a0, a1, a2, a3, pick_pair(k0[w], k1[w], hi), pick_pair(k8[w], k9[w], hi), ws);
    }
}

/* The B fragments of two n-blocks of a product over a local tile's rows
 * (k) and columns (n): rows r0 .. r0+15, columns c0 .. c0+15 of x (row
 * stride rs, a multiple of 8; c0 a multiple of 8, swizzled as tile_col
 * says): b[0], b[1] of columns c0 .. c0+7, b[2], b[3] of the next eight.
 * On NVIDIA with 16-bit types one ldmatrix.trans (lanes 0-7 name the rows
 * of the first 8x8 matrix, 8-15 the second's, ...); else element by element. */
inline word_t lds_elem_pair(__local const store_t *x, int rs, int r, int col, int dim)
{
    const int i0 = r * rs + tile_col(r, col & ~7, rs, dim) + (col & 7);
    const int i1 = (r + 1) * rs + tile_col(r + 1, col & ~7, rs, dim) + (col & 7);
#if STORAGE == 0
    return (float2)(x[i0], x[i1]);
#else
    __local const ushort *u = (__local const ushort *)x;
    return (uint)u[i0] | ((uint)u[i1] << 16);
#endif
}

inline void lds_bfrag_trans(__local const store_t *x, int rs, int r0, int c0, int dim, word_t *b)
{
    const int lane = lane_id();
#if MMA_NV && STORAGE != 0
    const int m = lane >> 3, r = r0 + (lane & 7) + 8 * (m & 1), c = c0 + 8 * (m >> 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"((uint)(size_t)(x + r * rs + tile_col(r, c, rs, dim))));
#else
    const int gq = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) b[i] = lds_elem_pair(x, rs, r0 + 2 * t + 8 * (i & 1), c0 + 8 * (i >> 1) + gq, dim);
#endif
}

/* lds_accumulate_trans: c += P X as warp_accumulate, for all KC rows of a
 * local tile, with the columns in mma's own order (ACC_TRANS): c[4*nb ..]
 * holds columns 8*nb + 2t, 2t+1 of rows gq, gq+8 (no byte permutes to pair
 * rows up, as load_cols' reads need). lds_accumulate_step: the same over
 * the tile's rows 16*kk .. 16*kk+15, for A fragments a[0..3] given (as
 * p_afrag gives them). */
inline void lds_accumulate_step(float *c, const word_t *a, __local const store_t *x, int x_rs, int kk, int dim,
                                __local uint *ws)
{
#pragma unroll
    for (int nb = 0; nb < dim / 8; nb += 2) {
        word_t b[4];
        lds_bfrag_trans(x, x_rs, 16 * kk, 8 * nb, dim, b);
        mma16816(c + 4 * nb, a[0], a[1], a[2], a[3], b[0], b[1], ws);
        mma16816(c + 4 * nb + 4, a[0], a[1], a[2], a[3], b[2], b[3], ws);
    }
}

inline void lds_accumulate_trans(float *c, const float *p, __local const store_t *x, int x_rs, int dim, __local uint *ws)
{
#pragma unroll
    for (int kk = 0; kk < KC / 16; ++kk) {
        word_t a[4];
        p_afrag(p, kk, a, ws);
        lds_accumulate_step(c, a, x, x_rs, kk, dim, ws);
    }
}

/* Element e (of dim/4) of the values of one row (hr = 0: row gq, 1: row
 * gq+8) that lane t holds, and its column: with ACC_TRANS, columns 8*(e/2)
 * + 2t + e%2 (mma's order); else dims 2t*dim/8 + e, contiguous (the order
 * load_cols gives). */
inline int row_index(int dim, int hr, int e)
{
#if ACC_TRANS
    (void)dim;
    return 4 * (e >> 1) + 2 * hr + (e & 1);
#else
    const int nb = e < dim / 8 ? e : e - dim / 8;
    return 4 * nb + 2 * hr + (e < dim / 8 ? 0 : 1);
#endif
}

inline float row_value(const float *c, int dim, int hr, int e) { return c[row_index(dim, hr, e)]; }

inline int row_col(int dim, int e)
{
    const int t = lane_id() & 3;
#if ACC_TRANS
    (void)dim;
    return 8 * (e >> 1) + 2 * t + (e & 1);
#else
    return 2 * t * (dim / 8) + e;
#endif
}

/* Word i of the lane's part of row hr: values 2i, 2i+1, times scale,
 * rounded to the storage type. */
inline word_t row_word(const float *c, int dim, int hr, int i, float scale, __local uint *ws)
{
    return pack_f32x2(scale * row_value(c, dim, hr, 2 * i), scale * row_value(c, dim, hr, 2 * i + 1), ws);
}

/* Stores scale * (the lane's part of row hr) at row + 2t*dim/8, in the
 * widest pieces its dim/8 words allow. */
inline void store_row(__global store_t *row, int dim, const float *c, int hr, float scale, __local uint *ws)
{
    const int n = dim / 8; /* words */
    __global store_t *p = row + row_col(dim, 0);
    if (ACC_TRANS) { /* word i at column 8i + 2t */
#pragma unroll
        for (int i = 0; i < n; ++i) STORE_WORD(row_word(c, dim, hr, i, scale, ws), p + 8 * i);
    } else if (n % 4 == 0) {
#pragma unroll
        for (int i = 0; i < n / 4; ++i)
            STORE_WORDS4((word4_t)(row_word(c, dim, hr, 4 * i, scale, ws), row_word(c, dim, hr, 4 * i + 1, scale, ws),
                                   row_word(c, dim, hr, 4 * i + 2, scale, ws), row_word(c, dim, hr, 4 * i + 3, scale, ws)),
                         i, p);
    } else if (n % 2 == 0) {
#pragma unroll
        for (int i = 0; i < n / 2; ++i)
            STORE_WORDS2((word2_t)(row_word(c, dim, hr, 2 * i, scale, ws), row_word(c, dim, hr, 2 * i + 1, scale, ws)), i, p);
    } else {
#pragma unroll
        for (int i = 0; i < n; ++i) ((__global word_t *)p)[i] = row_word(c, dim, hr, i, scale, ws);
    }
}

#if ACC_TRANS
/* store_row for the ACC_TRANS layout, where `on` (every lane calls it):
 * warp_mma.h's store_acc_row, one 16-byte store where store_row makes four
 * of 4 bytes (on an H200 at 64k the NSA forward that runs the top-k went
 * 25.67 -> 25.22 ms, dq 11.98 -> 11.77). A separate function: in the
 * kernels built without ACC_TRANS a store_row taking the flag changed
 * ptxas's registers (the selected forward given indices 168 -> 176, 15.5
 * -> 18.2 ms). */
inline void store_row_wide(__global store_t *row, int dim, const float *c, int hr, float scale, bool on, __local uint *ws)
{
    if (dim % 32) {
        if (on) store_row(row, dim, c, hr, scale, ws);
        return;
    }
    store_acc_row(row, dim, c, hr, scale, on, ws);
}
#endif

/* The same values stored one by one: row element d at p[row + d*ds]. */
inline void store_row_strided(__global store_t *p, idx_t row, idx_t ds, int dim, const float *c, int hr, float scale)
{
#pragma unroll
    for (int e = 0; e < dim / 4; ++e) STORE(p, row + (idx_t)row_col(dim, e) * ds, scale * row_value(c, dim, hr, e));
}

/* Adds f times the lane's part of a row at p + row (dim stride ds) to row
 * hr of c. */
inline void add_row_strided(float *c, __global const store_t *p, idx_t row, idx_t ds, int dim, int hr, float f)
{
#pragma unroll
    for (int e = 0; e < dim / 4; ++e)
        c[row_index(dim, hr, e)] = fma(f, LOAD(p, row + (idx_t)row_col(dim, e) * ds), c[row_index(dim, hr, e)]);
}

inline void warp_reset(float *m, float *l, float *acc)
{
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int i = 0; i < ACC_N; ++i) acc[i] = 0.0f;
}

/* The chunk's two products:
 *   PRODUCTS(s, a, k, k_rs, lo, hi, dim, ws): s[4*nb ..] = A K^T for the KC
 *     keys from row k (row stride k_rs) whose chunk index lies in [lo, hi)
 *     (lo < hi; rows outside read as zero, and only rows lo .. hi-1 are
 *     read: each row is clamped into the range), over `dim`: the scores Q
 *     K^T (dim DK), or dO V^T (dim DV) in the backward; for keys in global
 *     memory (warp_products) or staged in local memory by the work-group
 *     (lds_products);
 *   warp_accumulate(c, p, x, x_rs, lo, hi, dim, ws): c += P X for the
 *     chunk's weights p (score fragments: P V, or dS K in the backward) and
 *     the global rows of x whose chunk index lies in [lo, hi) (others read
 *     as zero), over `dim` output columns (lds_accumulate_trans: the same
 *     for a local tile). P is rounded to the 16-bit type for the product,
 *     as FlashAttention does. */
/* QK_CHAINS (set by the host): each n-block of PRODUCTS sums its k-steps
 * in that many accumulators, added at the end, so that that many mma
 * chains run side by side, where one chain of dim/16 dependent products
 * waits out the mma latency at every step. 2 pays in the NSA forward
 * (H200, 64k: 25.23 -> 24.90 ms) and top-k (6.76 -> 6.68) at the same 168
 * registers, in the backward's prologue (BWD_PRE: 29.44 -> 28.93) and in
 * the block-sparse kernels (src/ops/blocksparse_args.c); dk/dv and dq,
 * short of registers, keep 1 (dk/dv 45.8 -> 50.5 ms, dq 11.7 -> 11.9). */
#ifndef QK_CHAINS
#define QK_CHAINS 1
#endif
#define DEFINE_CHUNK_PRODUCTS(SPACE, PRODUCTS, KFRAG)                                                              \
    inline void PRODUCTS(float *s, const word_t *a, SPACE const store_t *k, idx_t k_rs, int lo, int hi, int dim,    \
                         __local uint *ws)                                                                        \
    {                                                                                                             \
        const int gq = lane_id() >> 2;                                                                            \
        _Pragma("unroll") for (int nb = 0; nb < KC / 8; ++nb)                                                     \
        {                                                                                                         \
            const int j = 8 * nb + gq;                                                                            \
            word_t kw[32];                                                                                        \
            KFRAG(k, k_rs, clamp(j, lo, hi - 1), dim, j >= lo && j < hi, false, kw);                              \
            float part[QK_CHAINS][4];                                                                             \
            _Pragma("unroll") for (int c = 0; c < QK_CHAINS; ++c) part[c][0] = part[c][1] = part[c][2] = part[c][3] = 0.0f; \
            _Pragma("unroll") for (int kk = 0; kk < dim / 16; ++kk)                                               \
                mma16816(part[kk % QK_CHAINS], a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3], kw[2 * kk], \
                         kw[2 * kk + 1], ws);                                                                     \
            _Pragma("unroll") for (int e = 0; e < 4; ++e)                                                         \
            {                                                                                                     \
                float x = part[0][e];                                                                             \
                _Pragma("unroll") for (int c = 1; c < QK_CHAINS; ++c) x += part[c][e];                            \
                s[4 * nb + e] = x;                                                                                \
            }                                                                                                     \
        }                                                                                                         \
    }

DEFINE_CHUNK_PRODUCTS(__global, warp_products, load_kfrag)
DEFINE_CHUNK_PRODUCTS(__local, lds_products, lds_kfrag)

/* warp_products with K_LINES's reads (above): the k-steps of first halves
 * (kp = kk/2 even) in p[0], of last halves in p[1], the columns of p[1]
 * swapped within the lane's pair. */
inline void line_products(float *s, const word_t *a, __global const store_t *k, idx_t k_rs, int lo, int hi,
                          __local uint *ws)
{
    const int gq = lane_id() >> 2;
    /* every n-block's reads before any product: read per n-block, the fused
     * forward lost 8% to reads ptxas held back, and 2% read so. DK/32
     * pieces an n-block (2 where DK < 64, whose programs compile this
     * function but never call it). */
    word4_t xy[KC / 8][DK >= 64 ? DK / 32 : 2];
#pragma unroll
    for (int nb = 0; nb < KC / 8; ++nb) kline_reads(k, k_rs, 8 * nb + gq, lo, hi, DK, xy[nb]);
#pragma unroll
    for (int nb = 0; nb < KC / 8; ++nb) {
        word_t kw[DK / 8];
        kline_words(xy[nb], DK, kw);
        float p[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < DK / 16; ++kk)
            mma16816(p[(kk >> 1) & 1], a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3], kw[2 * kk], kw[2 * kk + 1],
                     ws);
        s[4 * nb] = p[0][0] + p[1][1];
        s[4 * nb + 1] = p[0][1] + p[1][0];
        s[4 * nb + 2] = p[0][2] + p[1][3];
        s[4 * nb + 3] = p[0][3] + p[1][2];
    }
}

/* warp_accumulate one k-step kk at a time: the words of the 4 rows a lane
 * reads for it (16kk + 2t, +1, +8, +9; load_cols, dim/16 <= COL_WORDS
 * words each), then its products. */
#define COL_WORDS ((DK > DV ? DK : DV) / 16)
inline void load_step_cols(word_t xs[4][COL_WORDS], __global const store_t *x, idx_t x_rs, int kk, int lo, int hi, int dim)
{
    const int j0 = 16 * kk + 2 * (lane_id() & 3);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = j0 + (i & 1) + 8 * (i >> 1);
        load_cols(x, x_rs, clamp(j, lo, hi - 1), dim, j >= lo && j < hi, false, xs[i]);
    }
}

inline void mma_step_cols(float *c, const float *p, int kk, word_t xs[4][COL_WORDS], int dim, __local uint *ws)
{
    word_t a[4];
    p_afrag(p, kk, a, ws);
    mma_cols(c, a[0], a[1], a[2], a[3], xs[0], xs[1], xs[2], xs[3], dim, ws);
}

inline void warp_accumulate(float *c, const float *p, __global const store_t *x, idx_t x_rs, int lo, int hi, int dim,
                            __local uint *ws)
{
#pragma unroll
    for (int kk = 0; kk < KC / 16; ++kk) {
        word_t xs[4][COL_WORDS];
        load_step_cols(xs, x, x_rs, kk, lo, hi, dim);
        mma_step_cols(c, p, kk, xs, dim, ws);
    }
}

/* The scores of a chunk of global K rows, read as whole lines with `lines`
 * (a constant at each call; K_LINES above). */
inline void warp_scores(float *s, const word_t *qa, __global const store_t *k, idx_t k_rs, int lo, int hi,
                        int lines, __local uint *ws)
{
    if (DK % 64 == 0 && lines) line_products(s, qa, k, k_rs, lo, hi, ws);
    else warp_products(s, qa, k, k_rs, lo, hi, DK, ws);
}

/* warp_softmax_masked and p_afrag, the online softmax of a chunk: warp_softmax.h. */

/* With V_STAGE (set by the host where it pays, instead of V_EARLY; needs
 * ACC_TRANS) the chunk's V rows are copied into the warp's local tile vt
 * (KC rows of VT_RS) at the chunk's start, kept in L1 too (.ca), and P V
 * reads them through ldmatrix.trans after the softmax: the copies' latency
 * passes under Q K^T and the softmax without holding registers, and the
 * compressed and window rows that neighbouring tokens share come from L1.
 * At 64k on an H100 (2026-11-25): the forward that runs the top-k 26.3 ->
 * 25.8 ms; the compressed branch alone 7.94 -> 7.24 against V_EARLY; the
 * selected branch alone 17.15 -> 17.36, so it keeps V_EARLY. */
#ifndef V_STAGE
#define V_STAGE 0
#endif
#if V_STAGE && !ACC_TRANS
#error "V_STAGE reads V through lds_accumulate_trans: build with ACC_TRANS 1"
#endif
#define VT_RS (DV % 64 == 0 ? DV : DV + 8)

/* One chunk of the online softmax: keys k, v (row strides k_rs, v_rs) at
 * chunk positions 0 .. n-1 (n <= KC), seen by every row.
 * With V_EARLY (set by the host) the chunk's V rows are loaded with its K
 * rows, before Q K^T, so that their latency passes under the products and
 * the softmax: KC/4 * DV/16 more words a lane (32 at KC = 16). The forward
 * without the top-k gains (selected branch with given indices at 64k on
 * the H200: 16.6 -> 16.2 ms); the one with it, which keeps the top-k's
 * state live too, did not (26.7 -> 27.0 ms). */
inline void warp_attend_chunk(const word_t *qa, float *m, float *l, float *acc, __global const store_t *k, idx_t k_rs,
                              __global const store_t *v, idx_t v_rs, int n, float scale_log2, int lines,
                              __local store_t *vt, __local uint *ws)
{
    float s[KC / 2], alpha[2];
#if V_STAGE
    warp_sync(ws); /* every lane is done reading the last chunk's tile */
    stage_rows_by(vt, VT_RS, KC, DV, v, v_rs, n, lane_id(), WARP, true);
#else
    (void)vt;
#endif
#if V_EARLY
    word_t xs[KC / 16][4][COL_WORDS];
#pragma unroll
    for (int kk = 0; kk < KC / 16; ++kk) load_step_cols(xs[kk], v, v_rs, kk, 0, n, DV);
#endif
    warp_scores(s, qa, k, k_rs, 0, n, lines, ws);
    if (warp_softmax_masked(s, scale_log2, n, m, l, alpha, ws)) {
#pragma unroll
        for (int i = 0; i < ACC_N; ++i) acc[i] *= alpha[(i >> 1) & 1];
    }
#if V_STAGE
    copy_async_wait();
    warp_sync(ws);
    lds_accumulate_trans(acc, s, vt, VT_RS, DV, ws);
#elif V_EARLY
#pragma unroll
    for (int kk = 0; kk < KC / 16; ++kk) mma_step_cols(acc, s, kk, xs[kk], DV, ws);
#else
    warp_accumulate(acc, s, v, v_rs, 0, n, DV, ws);
#endif
}

/* Attends the rows to n keys from row k0 / v0, all rows seeing all of them.
 * With `whole` (a constant at each call: the host's WHOLE_SLC and
 * WHOLE_CMP_SWA say which branches), a whole chunk (every one but a range's
 * last) goes through a call of its own, whose bounds are constants: the
 * compiler then drops the per-row clamps and the zeroing of every loaded
 * word (64 SELs), 207 instructions a chunk instead of 295 in the selected
 * forward's SASS.
 * Measured at 64k on the H200 (2026-11-25): the forward with given indices
 * 16.2 -> 15.5 ms, the one after the separate top-k 15.8 -> 15.0 (every
 * branch split); the forward that runs the top-k 26.7 -> 26.2 with its
 * selected branch split, but 194 registers and 31.1 ms with every branch
 * split. dq's loop, split the same way, went 30.4 -> 31.7 ms. */
inline void warp_attend_range(const word_t *qa, float *m, float *l, float *acc, __global const store_t *k, idx_t k_rs,
                              __global const store_t *v, idx_t v_rs, int n, float scale_log2, int whole, int lines,
                              __local store_t *vt, __local uint *ws)
{
    for (int c0 = 0; c0 < n; c0 += KC) {
        const int hi = min(KC, n - c0);
        __global const store_t *kc0 = k + (idx_t)c0 * k_rs, *vc0 = v + (idx_t)c0 * v_rs;
        if (whole && hi == KC) warp_attend_chunk(qa, m, l, acc, kc0, k_rs, vc0, v_rs, KC, scale_log2, lines, vt, ws);
        else warp_attend_chunk(qa, m, l, acc, kc0, k_rs, vc0, v_rs, hi, scale_log2, lines, vt, ws);
    }
}

/* CMP_TILE (set by the host for the forward that stages V and does not run
 * the top-k): the warps of a work-group, neighbouring tokens of one
 * sequence, attend to prefixes of the same compressed rows, so each chunk
 * of them is copied once into a tile the work-group shares
 * (wg_attend_range), where each warp read its own rows through L1
 * (warp_attend_range). KT_RS: the staged K rows' stride (as VT_RS for V);
 * WG_CHUNK: one staged chunk, KC K rows then KC V rows; the tile holds
 * two. The copies keep the rows in L1 too (copy16_async's `cached`): the
 * other work-groups on the compute unit read the same rows. */
#ifndef CMP_TILE
#define CMP_TILE 0
#endif
#define KT_RS (DK % 64 == 0 ? DK : DK + 8)
#define WG_CHUNK (KC * (KT_RS + VT_RS))

#if CMP_TILE /* only its programs carry the work-group's code (barriers) */
/* Starts copying keys 0 .. n-1 (0 < n <= KC; zeros after) into the KC
 * rows at c, every work-item of the work-group taking its part. */
inline void wg_stage_keys(__local store_t *c, __global const store_t *k, idx_t k_rs, int n)
{
    stage_rows_by(c, KT_RS, KC, DK, k, k_rs, n, get_local_id(0), NW * WARP, true);
}

/* The same for a chunk of keys and values (K rows, then V rows). */
inline void wg_stage_chunk(__local store_t *c, __global const store_t *k, idx_t k_rs, __global const store_t *v,
                           idx_t v_rs, int n)
{
    wg_stage_keys(c, k, k_rs, n);
    stage_rows_by(c + KC * KT_RS, VT_RS, KC, DV, v, v_rs, n, get_local_id(0), NW * WARP, true);
}

/* The work-group's copies so far are in, and every warp is done with the
 * chunk it read before. */
inline void wg_chunk_done(void)
{
    copy_async_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* warp_attend_chunk on a staged chunk c, of which the warp sees the first
 * n keys (n >= 1; more than KC: all). */
inline void lds_attend_chunk(const word_t *qa, float *m, float *l, float *acc, __local const store_t *c, int n,
                             float scale_log2, __local uint *ws)
{
    float s[KC / 2], alpha[2];
    lds_products(s, qa, c, KT_RS, 0, KC, DK, ws);
    if (warp_softmax_masked(s, scale_log2, n, m, l, alpha, ws)) {
#pragma unroll
        for (int i = 0; i < ACC_N; ++i) acc[i] *= alpha[(i >> 1) & 1];
    }
    lds_accumulate_trans(acc, s, c + KC * KT_RS, VT_RS, DV, ws);
}

/* warp_attend_range for the whole work-group (every work-item calls it,
 * with the same n_wg): the warp attends to the first n of the n_wg keys
 * from k / v (n <= n_wg), which are staged a chunk at a time in the two
 * chunks at tile, the next one copied while the warps compute this one. */
inline void wg_attend_range(const word_t *qa, float *m, float *l, float *acc, __global const store_t *k, idx_t k_rs,
                            __global const store_t *v, idx_t v_rs, int n, int n_wg, float scale_log2,
                            __local store_t *tile, __local uint *ws)
{
    if (n_wg > 0) wg_stage_chunk(tile, k, k_rs, v, v_rs, min(KC, n_wg));
    wg_chunk_done();
    for (int c0 = 0, cb = 0; c0 < n_wg; c0 += KC, cb ^= 1) {
        if (c0 + KC < n_wg)
            wg_stage_chunk(tile + (cb ^ 1) * WG_CHUNK, k + (idx_t)(c0 + KC) * k_rs, k_rs, v + (idx_t)(c0 + KC) * v_rs,
                           v_rs, min(KC, n_wg - c0 - KC));
        if (c0 < n) lds_attend_chunk(qa, m, l, acc, tile + cb * WG_CHUNK, n - c0, scale_log2, ws);
        wg_chunk_done();
    }
}
#endif

/* The whole row's sum of probabilities (from the lanes' parts) and lse
 * (natural log; -inf for a row that saw nothing). */
inline void warp_finish(const float *m, float *l, float *lse, __local uint *ws)
{
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] = quad_sum(l[r], ws);
        lse[r] = l[r] > 0.0f ? (m[r] + log2(l[r])) / LOG2E : -INFINITY;
    }
}
