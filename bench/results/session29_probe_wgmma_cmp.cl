/* Probe (not a library kernel): NSA's compressed branch on wgmma, the anchor's shapes (D 128,
 * G 16, H 4, compressed blocks of 64 with stride 64). A warpgroup owns 4 consecutive tokens'
 * 16 query heads of one KV head: 64 rows, warp w the rows of token 4*(its warpgroup) + w, in
 * mma.sync's fragments. WGN warpgroups a work-group share the K and V chunk tiles. */
#define D 128
#define G 16
#define HQ 64
#define NH 4
#define CB 64
#ifndef KC
#define KC 64
#endif
#ifndef ASYNC
#define ASYNC 0
#endif
#ifndef DB
#define DB 0
#endif
#ifndef PIPE
#define PIPE 0
#endif
#define NBUF (DB || PIPE ? 2 : 1)
/* Parts left out, for timing only (results then wrong): 1 the softmax (P = the scaled scores),
 * 2 O's rescale, 4 the copies after the first chunk, 8 the Q K^T products, 16 the P V products. */
#ifndef SKIP
#define SKIP 0
#endif
/* PP 1: the warpgroups take turns on the tensor cores (named barriers): S of warpgroup 0, 1, ..
 * then P V of 0, 1, .., so that each softmax runs while others' products do. */
#ifndef PP
#define PP 0
#endif
inline void named_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
inline void named_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }

/* 16 bytes global -> local, zero-filled where !valid. */
inline void copy16(__local void *dst, __global const void *src, bool valid)
{
#if ASYNC
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((uint)(size_t)dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
#else
    *(__local uint4 *)dst = valid ? *(__global const uint4 *)src : (uint4)(0);
#endif
}

/* Chunk c0's K rows (K-major; v 0) or V rows (MN-major; v 1) into tile t, no commit. */
inline void stage_one(__local ushort *t, __global const ushort *src, int v, int c0, int nvis_max, int h, int lid)
{
#pragma unroll 4
    for (int i = lid; i < KC * D / 8; i += 128 * WGN) {
        const int n = i / (D / 8), kp = i % (D / 8), key = c0 + n;
        const bool ok = key < nvis_max;
        const size_t off = ((size_t)(ok ? key : 0) * NH + h) * D + kp * 8;
        copy16(v ? t + kp * (KC * 8) + (n / 8) * 64 + (n % 8) * 8 : t + (n / 8) * 1024 + kp * 64 + (n % 8) * 8, src + off,
               ok);
    }
}

inline void qk_issue(float *s, uint (*qa)[4], __local ushort *kt)
{
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
#if KC == 64
        WGMMA_M64N64K16_BF16(s, qa[ks], wg_desc(kt + ks * 128, 128, 2048), ks > 0, 0);
#else
        WGMMA_M64N32K16_BF16(s, qa[ks], wg_desc(kt + ks * 128, 128, 2048), ks > 0, 0);
#endif
    }
}

inline void pv_issue(float (*oacc)[32], uint (*pa)[4], __local ushort *vt)
{
#pragma unroll
    for (int ks = 0; ks < KC / 16; ++ks)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
            WGMMA_M64N64K16_BF16(oacc[hh], pa[ks], wg_desc(vt + ks * 128 + hh * 64 * KC, 128, 16 * KC), 1, 1);
}

/* Chunk c0's K (K-major) and V (MN-major) rows into the tiles. */
inline void stage(__local ushort *kt, __local ushort *vt, __global const ushort *kc, __global const ushort *vc, int c0,
                  int nvis_max, int h, int lid)
{
#pragma unroll 4
    for (int i = lid; i < KC * D / 8; i += 128 * WGN) {
        const int n = i / (D / 8), kp = i % (D / 8), key = c0 + n;
        const bool ok = key < nvis_max;
        const size_t off = ((size_t)(ok ? key : 0) * NH + h) * D + kp * 8;
        copy16(kt + (n / 8) * 1024 + kp * 64 + (n % 8) * 8, kc + off, ok);
        copy16(vt + kp * (KC * 8) + (n / 8) * 64 + (n % 8) * 8, vc + off, ok);
    }
#if ASYNC
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

inline float shfl_xor_f(float x, int m)
{
    uint r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(as_uint(x)), "r"(m));
    return as_float(r);
}

inline uint pack_bf16(float lo, float hi)
{
    uint r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

inline uint ld_pair(__global const ushort *p) { return *(__global const uint *)p; }

/* The chunk's scores s (in place: probabilities), the running max and sum of
 * the rows, O rescaled, P as A fragments. */
inline void softmax_p(float *s, int c0, int nvis, int t4, float scale_log2, float *m0, float *m1, float *l0, float *l1,
                      float (*oacc)[32], uint (*pa)[4])
{
    float mx0 = (*m0), mx1 = (*m1);
#pragma unroll
    for (int j = 0; j < KC / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
        const bool vis = c0 + 8 * j + 2 * t4 + e < nvis;
        s[4 * j + e] = vis ? s[4 * j + e] * scale_log2 : -INFINITY;
        s[4 * j + 2 + e] = vis ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
        mx0 = fmax(mx0, s[4 * j + e]);
        mx1 = fmax(mx1, s[4 * j + 2 + e]);
        }
    mx0 = fmax(mx0, shfl_xor_f(mx0, 1));
    mx0 = fmax(mx0, shfl_xor_f(mx0, 2));
    mx1 = fmax(mx1, shfl_xor_f(mx1, 1));
    mx1 = fmax(mx1, shfl_xor_f(mx1, 2));
    const float a0 = mx0 == -INFINITY ? 1.0f : exp2((*m0) - mx0), a1 = mx1 == -INFINITY ? 1.0f : exp2((*m1) - mx1);
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    (*m0) = mx0;
    (*m1) = mx1;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int j = 0; j < KC / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
        s[4 * j + e] = exp2(s[4 * j + e] - b0);
        s[4 * j + 2 + e] = exp2(s[4 * j + 2 + e] - b1);
        r0 += s[4 * j + e];
        r1 += s[4 * j + 2 + e];
        }
    (*l0) = (*l0) * a0 + r0;
    (*l1) = (*l1) * a1 + r1;
#if !(SKIP & 2)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
        oacc[hh][4 * j] *= a0;
        oacc[hh][4 * j + 1] *= a0;
        oacc[hh][4 * j + 2] *= a1;
        oacc[hh][4 * j + 3] *= a1;
        }
#endif
#pragma unroll
    for (int ks = 0; ks < KC / 16; ++ks) {
        pa[ks][0] = pack_bf16(s[8 * ks], s[8 * ks + 1]);
        pa[ks][1] = pack_bf16(s[8 * ks + 2], s[8 * ks + 3]);
        pa[ks][2] = pack_bf16(s[8 * ks + 4], s[8 * ks + 5]);
        pa[ks][3] = pack_bf16(s[8 * ks + 6], s[8 * ks + 7]);
    }
}

__kernel __attribute__((reqd_work_group_size(128 * WGN, 1, 1))) void
cmp_fwd(__global const ushort *q, __global const ushort *kc, __global const ushort *vc, __global float *o,
        __global float *lse, int T, float scale_log2)
{
    __local ushort ktiles[NBUF][KC * D] __attribute__((aligned(128)));
    __local ushort vtiles[NBUF][KC * D] __attribute__((aligned(128)));
    const int lid = get_local_id(0), wgi = lid / 128, w = (lid / 32) % 4, lane = lid % 32, gq = lane / 4, t4 = lane % 4;
    const int h = get_group_id(1);
    const int tok0 = get_group_id(0) * 4 * WGN;
    const int tok = tok0 + 4 * wgi + w;
    const int tok_last = min(tok0 + 4 * WGN - 1, T - 1);
    const int nvis_max = (tok_last + 1) / CB;
    const int nvis = tok < T ? (tok + 1) / CB : 0;
    const int hq0 = h * G + gq, hq1 = hq0 + 8;

    uint qa[8][4];
    for (int s = 0; s < 8; ++s) {
        if (tok < T) {
            __global const ushort *q0 = q + ((size_t)tok * HQ + hq0) * D + 16 * s + 2 * t4;
            __global const ushort *q1 = q + ((size_t)tok * HQ + hq1) * D + 16 * s + 2 * t4;
            qa[s][0] = ld_pair(q0);
            qa[s][1] = ld_pair(q1);
            qa[s][2] = ld_pair(q0 + 8);
            qa[s][3] = ld_pair(q1 + 8);
        } else {
            qa[s][0] = qa[s][1] = qa[s][2] = qa[s][3] = 0;
        }
    }
    float oacc[2][32];
    for (int hh = 0; hh < 2; ++hh)
        for (int i = 0; i < 32; ++i) oacc[hh][i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

#if PIPE
    /* Chunk c's K and V in ktiles/vtiles[c & 1]; S(c+1) runs during chunk c's softmax. */
    const int nch = (nvis_max + KC - 1) / KC;
    float s_cur[KC / 2], s_next[KC / 2];
    for (int i = 0; i < KC / 2; ++i) s_cur[i] = s_next[i] = 0.0f;
    if (nch > 0) {
        stage_one(ktiles[0], kc, 0, 0, nvis_max, h, lid);
        stage_one(vtiles[0], vc, 1, 0, nvis_max, h, lid);
        if (nch > 1) stage_one(ktiles[1], kc, 0, KC, nvis_max, h, lid);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        wg_shared_fence();
        barrier(CLK_LOCAL_MEM_FENCE);
        wg_fence();
        qk_issue(s_cur, qa, ktiles[0]);
        wg_commit();
        wg_wait_all();
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int c = 0; c < nch; ++c) {
        const int c0 = c * KC;
        if (c + 2 < nch) stage_one(ktiles[c & 1], kc, 0, c0 + 2 * KC, nvis_max, h, lid);
        if (c + 1 < nch) stage_one(vtiles[(c + 1) & 1], vc, 1, c0 + KC, nvis_max, h, lid);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        wg_shared_fence();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (c + 1 < nch) {
            wg_fence();
            qk_issue(s_next, qa, ktiles[(c + 1) & 1]);
            wg_commit();
        }
        uint pa[KC / 16][4];
        softmax_p(s_cur, c0, nvis, t4, scale_log2, &m0, &m1, &l0, &l1, oacc, pa);
        wg_fence();
        pv_issue(oacc, pa, vtiles[c & 1]);
        wg_commit();
        wg_wait_all();
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = 0; i < KC / 2; ++i) s_cur[i] = s_next[i];
    }
#else
#if DB
    if (nvis_max > 0) stage(ktiles[0], vtiles[0], kc, vc, 0, nvis_max, h, lid);
#endif
    for (int c0 = 0, buf = 0; c0 < nvis_max; c0 += KC, buf ^= NBUF - 1) {
        __local ushort *ktile = ktiles[buf], *vtile = vtiles[buf];
#if DB
        if (c0 + KC < nvis_max && !(SKIP & 4)) {
            stage(ktiles[buf ^ 1], vtiles[buf ^ 1], kc, vc, c0 + KC, nvis_max, h, lid);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
#else
        barrier(CLK_LOCAL_MEM_FENCE);
        stage(ktile, vtile, kc, vc, c0, nvis_max, h, lid);
#if ASYNC
        asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
#endif
        wg_shared_fence();
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[KC / 2];
        for (int i = 0; i < KC / 2; ++i) s[i] = 0.0f;
#if PP
        if (wgi > 0) named_sync(wgi); /* S_wgi: the previous warpgroup's S is done */
#endif
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 8 * !(SKIP & 8); ++ks) {
#if KC == 64
            WGMMA_M64N64K16_BF16(s, qa[ks], wg_desc(ktile + ks * 128, 128, 2048), ks > 0, 0);
#else
            WGMMA_M64N32K16_BF16(s, qa[ks], wg_desc(ktile + ks * 128, 128, 2048), ks > 0, 0);
#endif
        }
        wg_commit();
        wg_wait_all();
#if PP
        named_arrive(wgi < WGN - 1 ? wgi + 1 : WGN); /* S_(wgi+1), or P_0 after the last S */
#endif

        uint pa[KC / 16][4];
#if SKIP & 1
        for (int ks = 0; ks < KC / 16; ++ks)
            for (int i = 0; i < 4; ++i) pa[ks][i] = pack_bf16(s[8 * ks + 2 * i] * scale_log2, s[8 * ks + 2 * i + 1]);
#else
        softmax_p(s, c0, nvis, t4, scale_log2, &m0, &m1, &l0, &l1, oacc, pa);
#endif
#if PP
        named_sync(WGN + wgi); /* P_wgi: the last S (wgi 0) or the previous warpgroup's P V is done */
#endif
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < KC / 16 * !(SKIP & 16); ++ks)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                WGMMA_M64N64K16_BF16(oacc[hh], pa[ks], wg_desc(vtile + ks * 128 + hh * 64 * KC, 128, 16 * KC), 1, 1);
        wg_commit();
        wg_wait_all();
#if PP
        if (wgi < WGN - 1) named_arrive(WGN + wgi + 1);
#endif
#if DB
        barrier(CLK_LOCAL_MEM_FENCE); /* this buffer is staged again next chunk but one */
#endif
    }
#endif
    l0 += shfl_xor_f(l0, 1);
    l0 += shfl_xor_f(l0, 2);
    l1 += shfl_xor_f(l1, 1);
    l1 += shfl_xor_f(l1, 2);
    if (tok >= T) return;
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    for (int hh = 0; hh < 2; ++hh)
        for (int j = 0; j < 8; ++j)
            for (int e = 0; e < 2; ++e) {
                const int d = 64 * hh + 8 * j + 2 * t4 + e;
                o[((size_t)tok * HQ + hq0) * D + d] = oacc[hh][4 * j + e] * i0;
                o[((size_t)tok * HQ + hq1) * D + d] = oacc[hh][4 * j + 2 + e] * i1;
            }
    if (t4 == 0) {
        lse[(size_t)tok * HQ + hq0] = l0 > 0.0f ? m0 * 0.69314718f + log(l0) : -INFINITY;
        lse[(size_t)tok * HQ + hq1] = l1 > 0.0f ? m1 * 0.69314718f + log(l1) : -INFINITY;
    }
}
