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
#define LOAD8(p, i) vloada_half8(0, (p) + (i))
#define STORE(p, i, x) vstore_half_rte((x), (i), (p))
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
 * banks instead of all in one. */
#define KPAD(d) ((d) + 1)

/* Copies `nrows` rows of `ncols` elements from a strided view into a local
 * tile whose rows are `dst_stride` floats apart, converting to f32. All
 * work-items of the group call it; the caller places the barriers. */
inline void load_tile(__local float *dst, int dst_stride, int nrows, int ncols,
                      __global const store_t *src, idx_t base, idx_t row_stride, idx_t col_stride,
                      int lid, int nthreads)
{
    for (int i = lid; i < nrows * ncols; i += nthreads) {
        int r = i / ncols, c = i - r * ncols;
        dst[r * dst_stride + c] = LOAD(src, base + (idx_t)r * row_stride + (idx_t)c * col_stride);
    }
}
