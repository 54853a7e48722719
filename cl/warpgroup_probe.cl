/*
 * warpgroup_probe.cl: the warpgroup path (warpgroup_mma.h) checked and
 * measured: what tests/test_warpgroup.c and bench/bench_peak run.
 *
 * warpgroup_product: one wgmma.m64nNk16 (bf16 in, f32 out; N = PRODUCT_N:
 * 16, 32 or 64) of a 64x16 A (row-major) by a 16xN B (row-major, k x n) staged
 * in local memory in the layout TRANS_B names: K-major (0, as K is read for
 * Q K^T) or MN-major (1, as V is read for P V). Exact products show that
 * the driver took the sm_90a PTX and that the fragments and layouts in
 * warpgroup_mma.h hold. One work-group of one warpgroup.
 *
 * warpgroup_registers (where WG_MAXNREG is defined): two warpgroups trade
 * registers (setmaxnreg), each then writing its index + 1.
 */
#ifndef PRODUCT_N
#define PRODUCT_N 16
#endif

__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void
warpgroup_product(__global const ushort *a, __global const ushort *b, __global float *d)
{
    /* Core matrices of 128 bytes, 128 apart along k (lbo), 256 along n (sbo). */
    __local ushort tile[16 * PRODUCT_N] __attribute__((aligned(128)));
    const int lid = get_local_id(0);
    for (int i = lid; i < 16 * PRODUCT_N; i += 128) {
        const int k = i / PRODUCT_N, n = i % PRODUCT_N;
#if TRANS_B
        tile[(n / 8) * 128 + (k / 8) * 64 + (k % 8) * 8 + n % 8] = b[i];
#else
        tile[(n / 8) * 128 + (k / 8) * 64 + (n % 8) * 8 + k % 8] = b[i];
#endif
    }
    wg_shared_fence();
    barrier(CLK_LOCAL_MEM_FENCE);

    const int lane = lid % 32, gq = lane / 4, t = lane % 4, r0 = 16 * (lid / 32) + gq, r1 = r0 + 8;
    uint fa[4];
    fa[0] = a[r0 * 16 + 2 * t] | (uint)a[r0 * 16 + 2 * t + 1] << 16;
    fa[1] = a[r1 * 16 + 2 * t] | (uint)a[r1 * 16 + 2 * t + 1] << 16;
    fa[2] = a[r0 * 16 + 2 * t + 8] | (uint)a[r0 * 16 + 2 * t + 9] << 16;
    fa[3] = a[r1 * 16 + 2 * t + 8] | (uint)a[r1 * 16 + 2 * t + 9] << 16;
    float acc[PRODUCT_N / 2];
    for (int i = 0; i < PRODUCT_N / 2; ++i) acc[i] = 0.0f;
    wg_fence();
#if PRODUCT_N == 64
    WGMMA_M64N64K16_BF16(acc, fa, wg_desc(tile, 128, 256), 0, TRANS_B);
#elif PRODUCT_N == 32
    WGMMA_M64N32K16_BF16(acc, fa, wg_desc(tile, 128, 256), 0, TRANS_B);
#else
    WGMMA_M64N16K16_BF16(acc, fa, wg_desc(tile, 128, 256), 0, TRANS_B);
#endif
    wg_commit();
    wg_wait_all();
    for (int j = 0; j < PRODUCT_N / 8; ++j) {
        d[r0 * PRODUCT_N + 8 * j + 2 * t] = acc[4 * j];
        d[r0 * PRODUCT_N + 8 * j + 2 * t + 1] = acc[4 * j + 1];
        d[r1 * PRODUCT_N + 8 * j + 2 * t] = acc[4 * j + 2];
        d[r1 * PRODUCT_N + 8 * j + 2 * t + 1] = acc[4 * j + 3];
    }
}

/* warpgroup_rate: the tensor cores' rate through wgmma.m64n64k16, for
 * bench_peak: each warpgroup runs `iters` groups of 8 products (two
 * independent accumulator sets) on a B tile of small values; the sum is
 * stored so that nothing is optimized away. */
__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void warpgroup_rate(__global float *out, uint iters)
{
    __local ushort tile[1024] __attribute__((aligned(128)));
    const int lid = get_local_id(0);
    for (int i = lid; i < 1024; i += 128) tile[i] = (ushort)(0x3c00 + i % 8);
    wg_shared_fence();
    barrier(CLK_LOCAL_MEM_FENCE);
    uint fa[4];
    for (int i = 0; i < 4; ++i) fa[i] = 0x3c003c00u + (uint)(lid + i);
    float acc[2][32];
    for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 32; ++i) acc[j][i] = 0.0f;
    const ulong desc = wg_desc(tile, 128, 256);
    for (uint it = 0; it < iters; ++it) {
        wg_fence();
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
            for (int j = 0; j < 2; ++j) WGMMA_M64N64K16_BF16(acc[j], fa, desc, 1, 0);
        }
        wg_commit();
        wg_wait_all();
    }
    float s = 0.0f;
    for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 32; ++i) s += acc[j][i];
    out[get_global_id(0)] = s;
}

#ifdef WG_MAXNREG
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void warpgroup_registers(__global float *out)
{
    if (get_local_id(0) < 128) {
        WG_REGS_DEC(40);
        out[get_global_id(0)] = 1.0f;
    } else {
        WG_REGS_INC(2 * WG_MAXNREG - 40);
        out[get_global_id(0)] = 2.0f;
    }
}
#endif
