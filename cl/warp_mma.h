/*
 * warp_mma.h: warp-level tensor-core operations for the warp kernels
 * (warp_attn.h and the *_warp kernels). A warp is 32 consecutive local ids;
 * it owns a tile of 16 query rows and computes with 16x8x16 matrix products
 * (f32 accumulators) and exchanges values across its lanes.
 *
 *   MMA_NV = 1  NVIDIA compute capability 8.0+, through inline PTX:
 *               mma.sync, shfl.sync, vote.sync, bar.warp.sync, cp.async. Any number of
 *               warps per work-group; warps never wait for each other.
 *   MMA_NV = 0  the same operations emulated in local memory with barriers,
 *               so that the warp kernels run, and are tested, on any OpenCL
 *               device (PoCL in CI). Requires one warp per work-group: every
 *               call is made by the whole warp, which mma.sync requires too.
 *
 * Every function takes the warp's scratch (WARP_SCRATCH words of local
 * memory; unused on NVIDIA) so that both builds share one kernel source.
 *
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4*gq + t:
 *   A 16x16 row-major: a0 = A[gq][2t, 2t+1], a1 = A[gq+8][2t, 2t+1],
 *                      a2 = A[gq][2t+8, 2t+9], a3 = A[gq+8][2t+8, 2t+9];
 *   B 16x8 (k x n):    b0 = B[2t, 2t+1][gq], b1 = B[2t+8, 2t+9][gq];
 *   C 16x8:            c0, c1 = C[gq][2t, 2t+1], c2, c3 = C[gq+8][2t, 2t+1].
 * Each of a0..b1 is a word_t, two consecutive elements of the storage type,
 * the lower index first: a uint of two 16-bit values (f16, bf16: one
 * mma.m16n8k16), or, in the TF32 mode (STORAGE 0: f32 storage), a float2
 * whose values the product rounds to TF32 (10-bit mantissa, to nearest)
 * and which takes two mma.m16n8k8.tf32, k-slots t and t+4 of the first
 * holding the k indices 2t and 2t+1 (the second: 2t+8, 2t+9), so that the
 * fragments above, and every kernel built on them, stay the same.
 *
 * Defines: STORAGE (0 = f32 in the TF32 mode, 1 = f16, 2 = bf16), MMA_NV.
 */
#ifndef MMA_NV
#define MMA_NV 0
#endif

#define WARP 32

/* The fragment word (two elements) and vectors of two and four of them,
 * which hold 4 and 8 consecutive elements of a row (WORD_UINTS: 32-bit
 * words in one). */
#if STORAGE == 0
typedef float2 word_t;
typedef float4 word2_t;
typedef float8 word4_t;
#define WORD_UINTS 2
#else
typedef uint word_t;
typedef uint2 word2_t;
typedef uint4 word4_t;
#define WORD_UINTS 1
#endif

#if MMA_NV
#define WARP_SCRATCH 1
#else
#define WARP_SCRATCH ((6 * WORD_UINTS + 1) * WARP) /* mma operands, then one word per lane */
#endif

/* Stores four (STORE_WORDS4), two (STORE_WORDS2) or one (STORE_WORD) words w at piece i of p
 * (aligned to the piece): one wide store on NVIDIA (vstoreN only promises
 * element alignment, so it would be split). The emulated build uses vstoreN:
 * Oclgrind 21.10 compiles the vector-pointer store into a store of an
 * undefined vector followed by its elements and reports the first as an
 * uninitialized write. */
#if MMA_NV
#define STORE_WORDS4(w, i, p) (((__global word4_t *)(p))[i] = (w))
#define STORE_WORDS2(w, i, p) (((__global word2_t *)(p))[i] = (w))
#define STORE_WORD(w, p) (*(__global word_t *)(p) = (w))
#elif STORAGE == 0
#define STORE_WORDS4(w, i, p) vstore8((w), (i), (__global float *)(p))
#define STORE_WORDS2(w, i, p) vstore4((w), (i), (__global float *)(p))
#define STORE_WORD(w, p) vstore2((w), 0, (__global float *)(p))
#else
#define STORE_WORD(w, p) (*(__global uint *)(p) = (w))
#define STORE_WORDS4(w, i, p) vstore4((w), (i), (__global uint *)(p))
#define STORE_WORDS2(w, i, p) vstore2((w), (i), (__global uint *)(p))
#endif

#if STORAGE == 2
#define MMA_AB "bf16"
#elif STORAGE == 1
#define MMA_AB "f16"
#elif STORAGE != 0
#error "the warp kernels take f16, bf16, or f32 in the TF32 mode"
#endif

inline int lane_id(void) { return (int)get_local_id(0) & (WARP - 1); }

/* Element `hi` (0 or 1) of a word, as a float. */
inline float word_elem(word_t w, int hi)
{
#if STORAGE == 0
    return hi ? w.y : w.x;
#else
    const uint h = hi ? w >> 16 : w & 0xffffu;
#if STORAGE == 2
    return as_float(h << 16);
#else
    /* vload_half from a private copy: one conversion instruction where the
     * device has one (cvt.f32.f16 on NVIDIA), where the exponent's cases
     * decoded by hand took two branches. That decode, once an element in
     * nsa_bwd_dkdv_warp.cl's inner loop (rec_gate), made the f16 dk/dv
     * pass 1.24x bf16's on the H200 (11.02 against 8.92 ms at 16k,
     * 2026-11-30). */
    const ushort bits = (ushort)h;
    return vload_half(0, (const __private half *)&bits);
#endif
#endif
}

/* Two elements from two words: (element `hi` of x, same of y). */
inline word_t pick_pair(word_t x, word_t y, int hi)
{
#if STORAGE == 0
    return hi ? (float2)(x.y, y.y) : (float2)(x.x, y.x);
#elif MMA_NV
    /* one byte permute, where the shifts and masks below took two or three
     * instructions (bytes 0-3: x, 4-7: y) */
    uint r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(hi ? 0x7632 : 0x5410));
    return r;
#else
    return hi ? (x >> 16) | (y & 0xffff0000u) : (x & 0xffffu) | (y << 16);
#endif
}

#if MMA_NV

#if STORAGE == 0
/* x rounded to TF32 (to nearest, ties away), as the mma operand bits. */
inline uint tf32_bits(float x)
{
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

/* c += A B for k indices 2t, 2t+1 of lane t (one 16x8x8 product). */
inline void mma1688(float *c, float2 a0, float2 a1, float2 b)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(tf32_bits(a0.x)), "r"(tf32_bits(a1.x)), "r"(tf32_bits(a0.y)), "r"(tf32_bits(a1.y)),
          "r"(tf32_bits(b.x)), "r"(tf32_bits(b.y)));
}

/* c += A B for one 16x8x16 product. */
inline void mma16816(float *c, word_t a0, word_t a1, word_t a2, word_t a3, word_t b0, word_t b1, __local uint *ws)
{
    (void)ws;
    mma1688(c, a0, a1, b0);
    mma1688(c, a2, a3, b1);
}

/* Two floats as a word (the product rounds them). */
inline word_t pack_f32x2(float lo, float hi, __local uint *ws)
{
    (void)ws;
    return (float2)(lo, hi);
}
#else
/* c += A B for one 16x8x16 product. */
inline void mma16816(float *c, word_t a0, word_t a1, word_t a2, word_t a3, word_t b0, word_t b1, __local uint *ws)
{
    (void)ws;
    asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two floats rounded to the 16-bit type and packed (lo in the low half). */
inline word_t pack_f32x2(float lo, float hi, __local uint *ws)
{
    (void)ws;
    uint d;
    asm("cvt.rn." MMA_AB "x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
#endif

inline float shfl_xor(float x, int mask, __local uint *ws)
{
    (void)ws;
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(x), "r"(mask));
    return r;
}

/* Lane src's x. */
inline float shfl_idx(float x, int src, __local uint *ws)
{
    (void)ws;
    float r;
    asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(x), "r"(src));
    return r;
}

/* Bit i set when lane i's flag is nonzero. */
inline uint ballot(int flag, __local uint *ws)
{
    (void)ws;
    uint r;
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.s32 p, %1, 0;\n\tvote.sync.ballot.b32 %0, p, 0xffffffff;\n\t}"
                 : "=r"(r)
                 : "r"(flag));
    return r;
}

/* Orders the warp's local-memory accesses before and after it. */
inline void warp_sync(__local uint *ws)
{
    (void)ws;
    asm volatile("bar.warp.sync 0xffffffff;" ::: "memory");
}

/* Asynchronous copies into local memory (cp.async, sm_80+): 16 bytes from
 * src to dst, or 16 zero bytes when !valid (src is then not read, but must
 * be an address of the buffer). `cached` keeps the bytes in L1 too (.ca),
 * for rows that other work-groups on the compute unit are likely to read
 * (compressed rows, the forced blocks); else they go through L2 only (.cg).
 * copy_async_commit() closes the work-item's batch; copy_async_wait() waits
 * for all of them, after which a barrier (warp_sync for a warp's own
 * copies) makes the data visible. The local address is the pointer's
 * offset in the shared window, which is what cp.async takes. */
#define CP_ASYNC16(level, dst, src, valid)                                                                       \
    asm volatile("cp.async." level ".shared.global [%0], [%1], 16, %2;" ::"r"((uint)(size_t)(dst)), "l"(src), \
                 "r"((valid) ? 16 : 0)                                                                          \
                 : "memory")
inline void copy16_async(__local void *dst, __global const void *src, bool valid, bool cached)
{
    if (cached) CP_ASYNC16("ca", dst, src, valid);
    else CP_ASYNC16("cg", dst, src, valid);
}

/* The same for one 4-byte word (zero when !valid). */
inline void copy4_async(__local void *dst, __global const void *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"((uint)(size_t)dst), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}

/* The 2 bytes at src (4-byte aligned) into the low half of the word at dst,
 * the high half zero: a 16-bit element that may end its buffer. */
inline void copy2_async(__local void *dst, __global const void *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"((uint)(size_t)dst), "l"(src), "r"(valid ? 2 : 0)
                 : "memory");
}

inline void copy_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }

inline void copy_async_wait(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* Waits for all but the last committed batch. */
inline void copy_async_wait_prior(void) { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

#else /* emulation: one warp per work-group */

inline void warp_sync(__local uint *ws)
{
    (void)ws;
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Plain copies: the barrier after copy_async_wait() orders them. */
inline void copy16_async(__local void *dst, __global const void *src, bool valid, bool cached)
{
    (void)cached;
    *(__local uint4 *)dst = valid ? *(__global const uint4 *)src : (uint4)(0u);
}

inline void copy4_async(__local void *dst, __global const void *src, bool valid)
{
    *(__local uint *)dst = valid ? *(__global const uint *)src : 0u;
}

inline void copy2_async(__local void *dst, __global const void *src, bool valid)
{
    *(__local uint *)dst = valid ? (uint)*(__global const ushort *)src : 0u;
}

inline void copy_async_commit(void) {}

inline void copy_async_wait(void) {}

inline void copy_async_wait_prior(void) {}

/* An operand value as the tensor cores take it: TF32 rounds to nearest,
 * ties away (cvt.rna; the exponent carries on overflow of the mantissa). */
inline float mma_operand(float x)
{
#if STORAGE == 0
    const uint u = as_uint(x);
    return (u & 0x7f800000u) == 0x7f800000u ? x : as_float((u + 0x1000u) & 0xffffe000u);
#else
    return x;
#endif
}

/* Element (r, k) of A or (k, n) of B from the words the lanes posted. */
inline float frag_a(__local const word_t *ws, int r, int k)
{
    const int lane = (r & 7) * 4 + ((k & 7) >> 1), reg = (r >> 3) + ((k >> 3) << 1);
    return mma_operand(word_elem(ws[lane * 6 + reg], k & 1));
}

inline float frag_b(__local const word_t *ws, int k, int n)
{
    const int lane = n * 4 + ((k & 7) >> 1);
    return mma_operand(word_elem(ws[lane * 6 + 4 + (k >> 3)], k & 1));
}

inline void mma16816(float *c, word_t a0, word_t a1, word_t a2, word_t a3, word_t b0, word_t b1, __local uint *ws)
{
    const int lane = lane_id(), gq = lane >> 2, t = lane & 3;
    __local word_t *all = (__local word_t *)ws, *mine = all + lane * 6;
    mine[0] = a0;
    mine[1] = a1;
    mine[2] = a2;
    mine[3] = a3;
    mine[4] = b0;
    mine[5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i) {
        const int r = gq + (i >> 1) * 8, n = 2 * t + (i & 1);
        float sum = c[i];
        for (int k = 0; k < 16; ++k) sum = fma(frag_a(all, r, k), frag_b(all, k, n), sum);
        c[i] = sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

inline word_t pack_f32x2(float lo, float hi, __local uint *ws)
{
#if STORAGE == 0
    (void)ws;
    return (float2)(lo, hi);
#elif STORAGE == 2
    (void)ws;
    return (uint)bf16_from_float(lo) | ((uint)bf16_from_float(hi) << 16);
#else
    /* this lane's own word, past the mma operands: no other lane touches
     * it, so no barrier */
    __local uint *word = ws + 6 * WARP * WORD_UINTS + lane_id();
    vstore_half_rte(lo, 0, (__local half *)word);
    vstore_half_rte(hi, 1, (__local half *)word);
    return *word;
#endif
}

inline float shfl_idx(float x, int src, __local uint *ws)
{
    ws[lane_id()] = as_uint(x);
    barrier(CLK_LOCAL_MEM_FENCE);
    const float r = as_float(ws[src]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float shfl_xor(float x, int mask, __local uint *ws) { return shfl_idx(x, lane_id() ^ mask, ws); }

inline uint ballot(int flag, __local uint *ws)
{
    const int lane = lane_id();
    ws[lane] = flag ? 1u << lane : 0u;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint r = 0;
    for (int i = 0; i < WARP; ++i) r |= ws[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

#endif

/* Word w through the float shuffle SHFL (shfl_idx, shfl_xor) with argument
 * arg: two shuffles in f32, one for a pair of 16-bit elements. */
#if STORAGE == 0
#define WORD_SHFL(SHFL, w, arg, ws) ((float2)(SHFL((w).x, arg, ws), SHFL((w).y, arg, ws)))
#else
#define WORD_SHFL(SHFL, w, arg, ws) as_uint(SHFL(as_float(w), arg, ws))
#endif

/* The transpose of an 8x8 matrix of 16-bit elements (f32 in the TF32
 * mode) held one word a lane as a fragment (lane (gq, t): row gq, columns
 * 2t, 2t+1): lane (gq, t) gets the old rows 2t, 2t+1 of column gq. On
 * NVIDIA with 16-bit types one movmatrix; else two shuffles (four in f32)
 * from the lanes that hold those rows. */
#if MMA_NV && STORAGE != 0
inline word_t mat8_trans(word_t w, __local uint *ws)
{
    (void)ws;
    uint r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(w));
    return r;
}
#else
inline word_t mat8_trans(word_t w, __local uint *ws)
{
    const int gq = lane_id() >> 2, t = lane_id() & 3, src = 8 * t + (gq >> 1);
    return pick_pair(WORD_SHFL(shfl_idx, w, src, ws), WORD_SHFL(shfl_idx, w, src + 4, ws), gq & 1);
}
#endif

/* Max and sum over the 4 lanes of a fragment row (same gq). */
inline float quad_max(float x, __local uint *ws)
{
    x = fmax(x, shfl_xor(x, 1, ws));
    return fmax(x, shfl_xor(x, 2, ws));
}

inline float quad_sum(float x, __local uint *ws)
{
    x += shfl_xor(x, 1, ws);
    return x + shfl_xor(x, 2, ws);
}

/* The 4x4 transpose of words among a quad's lanes: lane t's x[k] becomes
 * lane k's x[t]. Two butterfly stages, on bit 1 of the lane and index,
 * then bit 0: a lane keeps the words whose index bit equals its own and
 * trades the others with its partner. */
inline void quad_transpose(word_t *x, __local uint *ws)
{
    const int t = lane_id() & 3;
#pragma unroll
    for (int bit = 2; bit >= 1; bit >>= 1) {
        const bool hi = (t & bit) != 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (k & bit) continue;
            const word_t got = WORD_SHFL(shfl_xor, hi ? x[k] : x[k | bit], bit, ws);
            if (hi) x[k] = got;
            else x[k | bit] = got;
        }
    }
}

/* Stores scale * row hr (0: gq, 1: gq + 8) of an accumulator c in mma's
 * C layout (c[4j + 2hr + e] holds column 8j + 2t + e, t the lane's place in
 * its quad) at row, dim columns (a multiple of 32), 16 bytes a store where
 * `on` (every lane calls it): word 4j + k lies at column 32j + 8k + 2t, so
 * a transpose of words across the quad (quad_transpose) gives lane t the
 * columns 32j + 8t .. + 7. The warp kernels (warp_attn.h's store_row_wide)
 * and the wgmma kernel (nsa_cmp_topk_wgmma.cl) store through it. */
inline void store_acc_row(__global store_t *row, int dim, const float *c, int hr, float scale, bool on, __local uint *ws)
{
    const int t = lane_id() & 3;
#pragma unroll
    for (int j = 0; j < dim / 32; ++j) {
        word_t x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float *v = c + 16 * j + 4 * k + 2 * hr;
            x[k] = pack_f32x2(scale * v[0], scale * v[1], ws);
        }
        quad_transpose(x, ws);
        if (on) STORE_WORDS4((word4_t)(x[0], x[1], x[2], x[3]), 0, row + 32 * j + 8 * t);
    }
}

/* Whether a lane below this one, of lanes 0 .. n-1 (n <= WARP), holds
 * the same key: n shuffles. */
inline bool lower_lane_holds(uint key, int n, __local uint *ws)
{
    bool held = false;
    for (int u = 0; u < n; ++u) held |= as_uint(shfl_idx(as_float(key), u, ws)) == key && u < lane_id();
    return held;
}

/* The sums of each of x[0 .. N-1] (N a power of two, 2 or more: the
 * top-k calls it with KC/4, at least 4) over the 8 lanes of a fragment
 * column (same t), by halving: on each of the lane bits 4, 8, 16 a lane
 * keeps half of its values and adds its partner's copies of that half, so
 * N values take N/2 + N/4 + ... shuffles where summing each one apart
 * takes 3N (the top-k's pass 2 alone, H200 at 64k: 4.76 -> 4.08 ms; the
 * forward that runs it 24.17 -> 24.03-24.15). The lane ends with
 * COLSUM_HELD(N) whole sums in x[0 ..], those of x[*first ..]; where
 * N < 8 the lanes that differ in bit 16 (and, N < 4, bit 8) hold the same
 * ones. */
#define COLSUM_HELD(N) ((N) >= 8 ? (N) / 8 : 1)
/* Whether the lane is the one of those holding the same sums that stores them. */
#define COLSUM_OWNER(N) ((N) >= 8 || (lane_id() & ((N) >= 4 ? 16 : 24)) == 0)
inline void column_sums(float *x, int n, int *first, __local uint *ws)
{
    int m = n;
    *first = 0;
#pragma unroll
    for (int bit = 4; bit <= 16; bit <<= 1) {
        const bool hi = (lane_id() & bit) != 0;
        if (m == 1) {
            x[0] += shfl_xor(x[0], bit, ws);
            continue;
        }
        m >>= 1;
#pragma unroll
        for (int i = 0; i < m; ++i) {
            const float give = hi ? x[i] : x[i + m];
            x[i] = (hi ? x[i + m] : x[i]) + shfl_xor(give, bit, ws);
        }
        if (hi) *first += m;
    }
}
