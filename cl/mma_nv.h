/*
 * mma_nv.h: NVIDIA tensor cores (compute capability 8.0 and later) from
 * OpenCL C through inline PTX, for the score tile S = Q K^T of attn_tile.h:
 * warp-level mma.sync.aligned.m16n8k16, bf16 or f16 in, f32 accumulate.
 *
 * Compiled only with MMA_NV = 1, which the host sets (src/device/probe.c,
 * device_mma_nv; opt-in with CLNSA_MMA=1 for now) on such devices for bf16 /
 * f16 storage: the f32 tiles in
 * local memory hold values loaded from that storage type, so packing them
 * back into it is exact and the products are the same as the FMA path's
 * up to the order of the f32 sums. Requires GT % 16 == 0, TK % 8 == 0,
 * DK % 16 == 0 and WG % 32 == 0 (a warp is 32 consecutive local ids).
 *
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4*gq + t:
 * A (16x16, row) a0 = A[gq][2t..2t+1], a1 = A[gq+8][2t..], a2 = A[gq][2t+8..],
 * a3 = A[gq+8][2t+8..]; B (16x8, col) b0 = B[2t..2t+1][gq], b1 = B[2t+8..][gq];
 * C (16x8) c0, c1 = C[gq][2t, 2t+1], c2, c3 = C[gq+8][2t, 2t+1]. A pair
 * packs the lower-indexed element in the low half.
 */
#ifndef MMA_NV
#define MMA_NV 0
#endif

#if MMA_NV
#if STORAGE == 2
#define MMA_AB "bf16"
/* A float that holds a bf16 exactly: its top half is the bf16. */
inline uint mma_pack(float lo, float hi) { return (as_uint(lo) >> 16) | (as_uint(hi) & 0xffff0000u); }
#elif STORAGE == 1
#define MMA_AB "f16"
inline uint mma_pack(float lo, float hi)
{
    uint d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
#else
#error "MMA_NV needs f16 or bf16 storage"
#endif

inline void mma_16816(float *c, uint a0, uint a1, uint a2, uint a3, uint b0, uint b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* ps[g*TK + j] = qs row g . ks row j for the whole GT x TK tile (raw dot
 * products; rows past the keys loaded hold stale values the caller masks),
 * one 16 x 8 block per warp at a time. */
inline void mma_scores(__local const float *qs, __local const float *ks, __local float *ps, int lid)
{
    const int lane = lid & 31, gq = lane >> 2, t = lane & 3;
    for (int blk = lid >> 5; blk < (GT / 16) * (TK / 8); blk += WG / 32) {
        const int r0 = blk / (TK / 8) * 16, n0 = blk % (TK / 8) * 8;
        __local const float *qa = qs + (r0 + gq) * DK + 2 * t, *qb = qa + 8 * DK;
        __local const float *kb = ks + (n0 + gq) * KPAD(DK) + 2 * t;
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 < DK; k0 += 16)
            mma_16816(c, mma_pack(qa[k0], qa[k0 + 1]), mma_pack(qb[k0], qb[k0 + 1]), mma_pack(qa[k0 + 8], qa[k0 + 9]),
                      mma_pack(qb[k0 + 8], qb[k0 + 9]), mma_pack(kb[k0], kb[k0 + 1]), mma_pack(kb[k0 + 8], kb[k0 + 9]));
        __local float *p0 = ps + (r0 + gq) * TK + n0 + 2 * t, *p1 = p0 + 8 * TK;
        p0[0] = c[0];
        p0[1] = c[1];
        p1[0] = c[2];
        p1[1] = c[3];
    }
}
#endif
