/*
 * warpgroup_mma.h: Hopper's warpgroup matrix products (wgmma, sm_90a) for
 * the kernels of NVIDIA devices of compute capability 9.0.
 *
 * A warpgroup is four consecutive warps (local ids 128w .. 128w + 127). One
 * wgmma.m64nNk16 multiplies a 64x16 A, from registers in mma.m16n8k16's
 * fragments (warp i of the group holds rows 16i .. 16i + 15), by a 16xN B in
 * local memory, into f32 accumulators in mma.m16n8k16's C fragments, warp i
 * holding rows 16i .. 16i + 15 and N/2 floats a lane, column block j (8
 * columns) in d[4j .. 4j + 3]. The accumulators of one product are thus the
 * A fragment of the next (two columns a word), as in the warp kernels.
 *
 * B is read through a descriptor (wg_desc) in the layout without swizzling:
 * "core matrices" of 8 rows of 16 bytes (8 elements), each 128 contiguous
 * bytes, lbo bytes apart along k and sbo bytes apart along n, in both
 *   K-major B (trans-b 0, e.g. K for Q K^T): a core matrix's rows are 8
 *     columns n, each holding 8 consecutive k;
 *   MN-major B (trans-b 1, e.g. V for P V): its rows are 8 rows k, each
 *     holding 8 consecutive n.
 * (Checked exact on the H200 with both layouts, 2026-11-29; lbo and sbo
 * swapped, both are wrong: tests/test_warpgroup.c,
 * bench/results/session29_probe_wgmma.c.)
 * Local memory written by ordinary stores must be made visible to wgmma's
 * reads by wg_shared_fence and a barrier. A product of n16 runs at about 60%
 * of the tensor cores' rate, n32 at 95%, n64 and wider at the full rate
 * (975.6 TFLOP/s on the H200 in bench_peak, against mma.sync's 646.1).
 *
 * NVIDIA's OpenCL compiles for sm_90, whose ptxas rejects these
 * instructions, so each is written as a PTX comment behind SM90A_MARK; the
 * host turns them into instructions in the compiled PTX and builds that for
 * sm_90a (src/program/ptx_sm90a.c). The program must define WGMMA_NV 1, which
 * is what asks the host to do so.
 */
#if !WGMMA_NV
#error "warpgroup_mma.h needs WGMMA_NV 1 (an NVIDIA device of compute capability 9.0)"
#endif

#define SM90A_MARK "// @sm_90a "
#define WG_STR(x) #x
#define WG_XSTR(x) WG_STR(x) /* a macro argument's value as text */

/* Before the first product whose registers (A, accumulators) other
 * instructions wrote. */
inline void wg_fence(void) { asm volatile(SM90A_MARK "wgmma.fence.sync.aligned;" ::: "memory"); }
/* Closes a group of issued products. */
inline void wg_commit(void) { asm volatile(SM90A_MARK "wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* Waits until every committed group is done (accumulators readable). */
inline void wg_wait_all(void) { asm volatile(SM90A_MARK "wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
/* Local-memory stores by this work-item, visible to wgmma after a barrier. */
inline void wg_shared_fence(void) { asm volatile(SM90A_MARK "fence.proxy.async.shared::cta;" ::: "memory"); }

/* setmaxnreg: this warpgroup's registers a work-item lowered or raised to n
 * (a multiple of 8, 24 .. 256), so that producer warps can give theirs to the
 * consumers. ptxas honours it only in a kernel capped at entry: the program
 * defines WG_MAXNREG, which the host writes as each kernel's .maxnreg. */
#define WG_REGS_DEC(n) asm volatile(SM90A_MARK "setmaxnreg.dec.sync.aligned.u32 " WG_XSTR(n) ";" ::: "memory")
#define WG_REGS_INC(n) asm volatile(SM90A_MARK "setmaxnreg.inc.sync.aligned.u32 " WG_XSTR(n) ";" ::: "memory")

/* The descriptor of a B operand at p (16-byte aligned) in the layout above. */
inline ulong wg_desc(__local const void *p, uint lbo, uint sbo)
{
    const uint addr = (uint)(size_t)p;
    return (ulong)((addr & 0x3FFFF) >> 4) | ((ulong)(lbo >> 4) << 16) | ((ulong)(sbo >> 4) << 32);
}

/* The descriptor of the operand `bytes` (a multiple of 16) past d's: the
 * address field only (it cannot carry out: local memory is under 256 KB). */
inline ulong wg_desc_plus(ulong d, uint bytes) { return d + (ulong)(bytes >> 4); }

/* The products' shared parts: the predicate "accumulate" (operand n), the
 * inputs (A's four words, B's descriptor, the flag), and the tail of the
 * instruction with B's layout. */
#define WG_PRED(n) "{\n" SM90A_MARK ".reg .pred p;\n" SM90A_MARK "setp.ne.b32 p, %" #n ", 0;\n" SM90A_MARK
#define WG_TAIL(TRANS_B) ", p, 1, 1, " WG_XSTR(TRANS_B) ";\n}"
#define WG_IN(a, desc, accumulate)                                                                                     \
    "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "l"(desc), "r"((accumulate) ? 1 : 0)
#define WG_F8(d, i)                                                                                                    \
    "+f"((d)[i]), "+f"((d)[i + 1]), "+f"((d)[i + 2]), "+f"((d)[i + 3]), "+f"((d)[i + 4]), "+f"((d)[i + 5]),           \
        "+f"((d)[i + 6]), "+f"((d)[i + 7])

/* d (8 floats: two column blocks) = A B, plus d where accumulate; A and B
 * of type AB ("bf16" or "f16": warp_mma.h's MMA_AB), B 16x16, K-major
 * (TRANS_B 0) or MN-major (1), an immediate in the instruction (hence
 * macros). a: four words, A's fragment; desc: wg_desc of B. */
#define WGMMA_M64N16K16(AB, d, a, desc, accumulate, TRANS_B)                                                           \
    asm volatile(WG_PRED(13) "wgmma.mma_async.sync.aligned.m64n16k16.f32." AB "." AB " {%0,%1,%2,%3,%4,%5,%6,%7}, "   \
                             "{%8,%9,%10,%11}, %12" WG_TAIL(TRANS_B)                                                   \
                 : WG_F8(d, 0)                                                                                         \
                 : WG_IN(a, desc, accumulate)                                                                          \
                 : "memory")

/* d (16 floats: four column blocks) = A B (+ d), B 16x32. */
#define WGMMA_M64N32K16(AB, d, a, desc, accumulate, TRANS_B)                                                           \
    asm volatile(WG_PRED(21) "wgmma.mma_async.sync.aligned.m64n32k16.f32." AB "." AB " "                               \
                             "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20"         \
                             WG_TAIL(TRANS_B)                                                                          \
                 : WG_F8(d, 0), WG_F8(d, 8)                                                                            \
                 : WG_IN(a, desc, accumulate)                                                                          \
                 : "memory")

/* d (32 floats: eight column blocks) = A B (+ d), B 16x64. */
#define WGMMA_M64N64K16(AB, d, a, desc, accumulate, TRANS_B)                                                           \
    asm volatile(WG_PRED(37) "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB " "                               \
                             "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                 \
                             "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36" \
                             WG_TAIL(TRANS_B)                                                                          \
                 : WG_F8(d, 0), WG_F8(d, 8), WG_F8(d, 16), WG_F8(d, 24)                                                \
                 : WG_IN(a, desc, accumulate)                                                                          \
                 : "memory")

/* The bf16 products (the probes' and test_warpgroup's names). */
#define WGMMA_M64N16K16_BF16(d, a, desc, accumulate, TRANS_B) WGMMA_M64N16K16("bf16", d, a, desc, accumulate, TRANS_B)
#define WGMMA_M64N32K16_BF16(d, a, desc, accumulate, TRANS_B) WGMMA_M64N32K16("bf16", d, a, desc, accumulate, TRANS_B)
#define WGMMA_M64N64K16_BF16(d, a, desc, accumulate, TRANS_B) WGMMA_M64N64K16("bf16", d, a, desc, accumulate, TRANS_B)

/* mbarriers in local memory (sm_80 on), for warp-specialized kernels: a
 * producer's copies arrive on a stage's "full" barrier, its consumers on
 * its "empty" one, and each side waits for the other's phase. */
#define WG_LADDR(p) ((uint)(size_t)(p))
inline void mbar_init(__local ulong *b, uint count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(WG_LADDR(b)), "r"(count) : "memory");
}
inline void mbar_arrive(__local ulong *b)
{
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(WG_LADDR(b)) : "memory");
}
/* Arrives on b, telling it to expect `bytes` more, and copies those bytes
 * from src to dst (both 16-byte aligned, bytes a multiple of 16) with the
 * copy engine (cp.async.bulk, sm_90), whose arrival completes them: one
 * work-item fills a whole stage. Against 64 work-items' cp.async of 16
 * bytes each, the kernel of nsa_cmp_topk_wgmma.cl went 6.15-6.20 -> 5.31-5.35 ms
 * at 64k on the H200 (2026-11-30). */
inline void mbar_copy_bulk(__local void *dst, __global const void *src, uint bytes, __local ulong *b)
{
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(WG_LADDR(b)),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     WG_LADDR(dst)),
                 "l"(src), "r"(bytes), "r"(WG_LADDR(b))
                 : "memory");
}
/* Waits until the phase of parity `parity` has completed. */
inline void mbar_wait(__local ulong *b, uint parity)
{
    uint ok;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok)
                     : "r"(WG_LADDR(b)), "r"(parity)
                     : "memory");
    } while (!ok);
}
