/* Probe (not a library kernel): NSA's compressed branch on wgmma, warp-specialized and
 * persistent, the anchor's shapes (D 128, G 16, H 4, compressed blocks of 64, stride 64).
 *
 * A work-group is one producer warpgroup and NCONS consumer warpgroups, and loops over tiles
 * (4 * NCONS consecutive tokens of one KV head; the heaviest, i.e. last, tokens first). The
 * producer's first two warps keep NSTK stages of KC compressed keys of K (K-major, in wgmma's
 * core-matrix layout) in flight with cp.async, its last two NSTV stages of V (MN-major), each
 * stage's arrival counted on an mbarrier (full); consumers release a K stage after Q K^T, a V
 * stage after P V, on another (empty). A consumer warpgroup owns 4 tokens' 16 query heads: 64
 * rows, warp w the rows of token 4 * (its consumer index) + w, in mma.sync's fragments. Output
 * bf16 as the library's. */
#define D 128
#define G 16
#define HQ 64
#define NH 4
#define CB 64
#ifndef KC
#define KC 32
#endif
#ifndef NSTK
#define NSTK 2
#endif
#ifndef NSTV
#define NSTV 2
#endif
/* PASS2 1: the top-k's second pass after each tile: the blocks' importance, written to imp
 * (not with LIST_ONLY 1), and the top-SEL list, written to idx. */
#ifndef LIST_ONLY
#define LIST_ONLY 0
#endif
#ifndef PASS2
#define PASS2 0
#endif
#define NCMAX 1024 /* compressed keys a row of imp (T up to 65536) */
/* LANES_BY_KEY 1: the producer's lanes copy across keys first (see produce). */
#ifndef LANES_BY_KEY
#define LANES_BY_KEY 0
#endif
/* PIPE 1: a consumer issues S of its next chunk before P V of this one (FlashAttention-3's
 * overlap within a warpgroup). */
#ifndef PIPE
#define PIPE 0
#endif
/* PIPE_ZERO 1: the next chunk's scores are cleared before its products, as without PIPE. */
#ifndef PIPE_ZERO
#define PIPE_ZERO 0
#endif
/* PREQ 1: a consumer asks L2 for its next tile's queries while it works on this one. */
#ifndef PREQ
#define PREQ 0
#endif
#ifndef NCONS
#define NCONS 2
#endif
/* REGS 1: the producer gives registers to the consumers (setmaxnreg): REG_LO a producer's,
 * REG_HI a consumer's (the program then defines WG_MAXNREG, the kernel's cap at entry). */
#ifndef REGS
#define REGS 0
#endif
/* Parts left out, for timing only (results then wrong): 1 the softmax, 4 the copies (the
 * producer only arrives), 8 the Q K^T products, 16 the P V products. */
#ifndef SKIP
#define SKIP 0
#endif
#define TOKS (4 * NCONS)

#define LADDR(p) ((uint)(size_t)(p))

/* mbar_init, mbar_arrive, mbar_wait: in warpgroup_mma.h since the library's kernel
 * (nsa_cmp_topk_wgmma.cl) took them from here. mbar_arrive_copies went back here when that
 * kernel's stages moved to bulk copies (2026-11-30). */
inline void mbar_arrive_copies(__local ulong *b)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(LADDR(b)) : "memory");
}
inline void copy16(__local void *dst, __global const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(LADDR(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

inline float shfl_xor_f(float x, int m)
{
    uint r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(as_uint(x)), "r"(m));
    return as_float(r);
}

inline float shfl_idx_f(float x, int i)
{
    uint r;
    asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(as_uint(x)), "r"(i));
    return as_float(r);
}

inline uint pack_bf16(float lo, float hi)
{
    uint r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

inline uint ld_pair(__global const ushort *p) { return *(__global const uint *)p; }

/* Tile i of the persistent loop: its first token and KV head, heaviest first. */
inline void tile_of(int i, int T, int *tok0, int *h)
{
    const int ngroups = (T + TOKS - 1) / TOKS;
    *tok0 = (ngroups - 1 - i / NH) * TOKS;
    *h = i % NH;
}

inline int tile_keys(int tok0, int T) { return (min(tok0 + TOKS, T)) / CB; }

/* A producer side: every tile's chunks of K (v 0, K-major) or V (v 1, MN-major) into its ring,
 * 64 work-items (pid). */
inline void produce(__local ushort *ring, int nst, __local ulong *full, __local ulong *empty,
                    __global const ushort *src, int v, int T, int ntiles, int pid)
{
    uint it = 0;
    for (int i = get_group_id(0); i < ntiles; i += get_num_groups(0)) {
        int tok0, h;
        tile_of(i, T, &tok0, &h);
        const int nkeys = tile_keys(tok0, T);
        /* With PASS2 K goes through twice: the compressed branch, then the importance. */
        for (int c = 0; c < (nkeys + KC - 1) / KC * (v ? 1 : 1 + PASS2); ++c, ++it) {
            const int c0 = c % ((nkeys + KC - 1) / KC) * KC;
            const uint s = it % nst, ph = (it / nst) & 1;
            mbar_wait(&empty[s], ph ^ 1);
            __local ushort *t = ring + s * (KC * D);
#if !(SKIP & 4)
#pragma unroll
            for (int j = pid; j < KC * D / 8; j += 64) {
#if LANES_BY_KEY
                /* Eight lanes, eight keys: their 16-byte pieces fill one core matrix (128
                 * contiguous bytes), so a warp's copies land without bank conflicts. */
                const int n = ((j >> 7) << 3) | (j & 7), kp = (j >> 3) & 15, key = c0 + n;
#else
                /* Sixteen lanes, one key row: pieces 128 (K) or 16 * KC (V) bytes apart, on the
                 * same banks. */
                const int n = j / (D / 8), kp = j % (D / 8), key = c0 + n;
#endif
                const bool ok = key < nkeys;
                const size_t off = ((size_t)(ok ? key : 0) * NH + h) * D + kp * 8;
                copy16(v ? t + kp * (KC * 8) + (n / 8) * 64 + (n % 8) * 8 : t + (n / 8) * 1024 + kp * 64 + (n % 8) * 8,
                       src + off, ok);
            }
#endif
            mbar_arrive_copies(&full[s]);
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

/* The chunk's scores s (in place: probabilities), the rows' running max and sum, O's rescale
 * factors a0 and a1 (rows g and g + 8), P as A fragments. */
inline void softmax_p(float *s, int c0, int nvis, int t4, float scale_log2, float *m0, float *m1, float *l0, float *l1,
                      float *a0_out, float *a1_out, uint (*pa)[4])
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
    (*a0_out) = a0;
    (*a1_out) = a1;
#pragma unroll
    for (int ks = 0; ks < KC / 16; ++ks) {
        pa[ks][0] = pack_bf16(s[8 * ks], s[8 * ks + 1]);
        pa[ks][1] = pack_bf16(s[8 * ks + 2], s[8 * ks + 3]);
        pa[ks][2] = pack_bf16(s[8 * ks + 4], s[8 * ks + 5]);
        pa[ks][3] = pack_bf16(s[8 * ks + 6], s[8 * ks + 7]);
    }
}

inline void rescale(float (*oacc)[32], float a0, float a1)
{
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            oacc[hh][4 * j] *= a0;
            oacc[hh][4 * j + 1] *= a0;
            oacc[hh][4 * j + 2] *= a1;
            oacc[hh][4 * j + 3] *= a1;
        }
}

/* Waits until at most one committed group is in flight. */
inline void wg_wait_1(void) { asm volatile(SM90A_MARK "wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

inline void qk_issue(float *s, uint (*qa)[4], __local ushort *kt)
{
#pragma unroll
    for (int ks = 0; ks < 8 * !(SKIP & 8); ++ks) {
#if KC == 64
        WGMMA_M64N64K16_BF16(s, qa[ks], wg_desc(kt + ks * 128, 128, 2048), ks > 0, 0);
#elif KC == 32
        WGMMA_M64N32K16_BF16(s, qa[ks], wg_desc(kt + ks * 128, 128, 2048), ks > 0, 0);
#else
        WGMMA_M64N16K16_BF16(s, qa[ks], wg_desc(kt + ks * 128, 128, 2048), ks > 0, 0);
#endif
    }
}

/* Chunk it's scores s = Q K^T, from K stage it % NSTK, which it waits for and then releases. */
inline void stage_scores(float *s, uint (*qa)[4], __local ushort (*kt)[KC * D], __local ulong *kfull,
                         __local ulong *kempty, uint it)
{
    const uint sk = it % NSTK;
    mbar_wait(&kfull[sk], (it / NSTK) & 1);
    wg_shared_fence();
#pragma unroll
    for (int j = 0; j < KC / 2; ++j) s[j] = 0.0f;
    wg_fence();
    qk_issue(s, qa, kt[sk]);
    wg_commit();
    wg_wait_all();
    mbar_arrive(&kempty[sk]);
}

inline void pv_issue(float (*oacc)[32], uint (*pa)[4], __local ushort *vt)
{
#pragma unroll
    for (int ks = 0; ks < KC / 16 * !(SKIP & 16); ++ks)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
            WGMMA_M64N64K16_BF16(oacc[hh], pa[ks], wg_desc(vt + ks * 128 + hh * 64 * KC, 128, 16 * KC), 1, 1);
}

/* The token's top-SEL list over its blocks (compressed = selection blocks), in the warp's lanes:
 * lane i < SEL holds entry i, best first (equal scores: the lower block first); -inf / -1
 * unfilled. Blocks 0 and nvis - 1 are forced (score +inf). */
#define SEL 16
inline bool entry_before(float va, int ja, float vb, int jb) { return va > vb || (va == vb && ja < jb); }

inline int shfl_xor_i(int x, int m) { return as_int(shfl_xor_f(as_float(x), m)); }

/* A compare-exchange with lane ^ m: the lane keeps the earlier entry if `first`. */
inline void exchange(float *v, int *j, int m, bool first)
{
    const float pv = shfl_xor_f(*v, m);
    const int pj = shfl_xor_i(*j, m);
    if (entry_before(pv, pj, *v, *j) == first) {
        *v = pv;
        *j = pj;
    }
}

/* Merges the lanes' candidates (v, j) into the list (lv, lj): a bitonic sort of the 32, the
 * better of list entry i and candidate 31 - i, a bitonic merge. */
inline void list_merge(float *lv, int *lj, float v, int j, int lane)
{
#pragma unroll
    for (int k = 2; k <= 32; k *= 2)
#pragma unroll
        for (int m = k / 2; m > 0; m /= 2) exchange(&v, &j, m, ((lane & m) == 0) == ((lane & k) == 0));
    const float rv = shfl_xor_f(v, 31);
    const int rj = shfl_xor_i(j, 31);
    if (entry_before(rv, rj, *lv, *lj)) {
        *lv = rv;
        *lj = rj;
    }
#pragma unroll
    for (int m = 16; m > 0; m /= 2) exchange(lv, lj, m, (lane & m) == 0);
    if (lane >= SEL) {
        *lv = -INFINITY;
        *lj = -1;
    }
}

inline uint ballot(bool p)
{
    uint r;
    asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0; vote.sync.ballot.b32 %0, p, 0xffffffff; }" : "=r"(r) : "r"(p ? 1 : 0));
    return r;
}

/* Inserts (v, j), the same on every lane, where it belongs (nothing if past the list). */
inline void list_insert(float *lv, int *lj, float v, int j, int lane)
{
    const int pos = popcount(ballot(lane < SEL && entry_before(*lv, *lj, v, j)));
    uint uv, uj;
    asm volatile("shfl.sync.up.b32 %0, %1, 1, 0, 0xffffffff;" : "=r"(uv) : "r"(as_uint(*lv)));
    asm volatile("shfl.sync.up.b32 %0, %1, 1, 0, 0xffffffff;" : "=r"(uj) : "r"((uint)*lj));
    if (pos < SEL && lane >= pos && lane < SEL) {
        *lv = lane == pos ? v : as_float(uv);
        *lj = lane == pos ? j : (int)uj;
    }
}

/* Adds a chunk's candidates, if any beats the list's last entry: one by one where fewer than
 * MERGE_MIN do, else merged at once. */
#ifndef MERGE_MIN
#define MERGE_MIN 33 /* 33: always merged */
#endif
inline void list_add(float *lv, int *lj, float v, int j, int lane)
{
    const float last_v = shfl_idx_f(*lv, SEL - 1);
    const int last_j = as_int(shfl_idx_f(as_float(*lj), SEL - 1));
    const bool enters = j >= 0 && entry_before(v, j, last_v, last_j);
    uint mask = ballot(enters);
    if (popcount(mask) >= MERGE_MIN) {
        list_merge(lv, lj, enters ? v : -INFINITY, enters ? j : -1, lane);
        return;
    }
    while (mask) {
        const int i = 31 - clz(mask & -mask);
        list_insert(lv, lj, shfl_idx_f(v, i), as_int(shfl_idx_f(as_float(j), i)), lane);
        mask &= mask - 1;
    }
}

#if PASS2
#if KC != 32
#error "PASS2 is written for chunks of 32 keys"
#endif
/* Half the values x (n of them) summed with the other half from the lane m apart: which half a
 * lane keeps is its bit b. */
#define HALVE(x, y, n, m, b)                                                                                           \
    for (int i_ = 0; i_ < (n) / 2; ++i_)                                                                               \
        y[i_] = ((b) ? x[i_ + (n) / 2] : x[i_]) + shfl_xor_f((b) ? x[i_] : x[i_ + (n) / 2], m);

/* The top-k's second pass: each chunk's Q K^T again, the probabilities exp(s - lse) of the 16
 * heads summed per key (NSA's block importance, compressed and selection blocks being the same),
 * written to imp[tok][h][key]. The sum over a column's rows: rows g and g + 8 in the lane, then
 * halvings across the lanes' g bits, after which lane (g, t4) holds the column
 * 8 (g >> 1) + 2 t4 + (g & 1). */
inline void importance(__local ushort (*kt)[KC * D], __local ulong *kfull, __local ulong *kempty, uint (*qa)[4],
                       __global float *imp, __global int *idx, int T, int tok, int h, int nkeys, int nvis,
                       float scale_log2, float m0, float m1, float l0, float l1, int gq, int t4, uint *itk)
{
    float lv = -INFINITY;
    int lj = -1;
    const float z0 = l0 > 0.0f ? m0 + log2(l0) : INFINITY, z1 = l1 > 0.0f ? m1 + log2(l1) : INFINITY;
    const int col = 8 * (gq >> 1) + 2 * t4 + (gq & 1);
    __global float *row = imp + ((size_t)tok * NH + h) * NCMAX;
    for (int c0 = 0; c0 < nkeys; c0 += KC, ++(*itk)) {
        float s[KC / 2];
        stage_scores(s, qa, kt, kfull, kempty, *itk);
        float v[8], v4[4], v2[2], v1[1];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool vis = c0 + 8 * j + 2 * t4 + e < nvis;
                v[2 * j + e] = vis ? exp2(s[4 * j + e] * scale_log2 - z0) + exp2(s[4 * j + 2 + e] * scale_log2 - z1) : 0.0f;
            }
        HALVE(v, v4, 8, 16, (gq >> 2) & 1)
        HALVE(v4, v2, 4, 8, (gq >> 1) & 1)
        HALVE(v2, v1, 2, 4, gq & 1)
#if !LIST_ONLY
        if (tok < T && c0 + col < nvis) row[c0 + col] = v1[0];
#endif
        const int jb = c0 + col;
        const bool vis = jb < nvis;
        list_add(&lv, &lj, vis ? (jb == 0 || jb == nvis - 1 ? INFINITY : v1[0]) : -INFINITY, vis ? jb : -1, 4 * gq + t4);
    }
    if (tok < T && 4 * gq + t4 < SEL) idx[((size_t)tok * NH + h) * SEL + 4 * gq + t4] = lj;
}
#endif

/* A consumer warpgroup (cw of NCONS): its 4 tokens of every tile. */
inline void consume(__local ushort (*kt)[KC * D], __local ushort (*vt)[KC * D], __local ulong *kfull,
                    __local ulong *kempty, __local ulong *vfull, __local ulong *vempty, __global const ushort *q, __global ushort *o, __global float *lse, __global float *imp, __global int *idx, int T,
                    int ntiles, float scale_log2, int cw, int w, int gq, int t4)
{
    uint itk = 0, itv = 0;
    for (int i = get_group_id(0); i < ntiles; i += get_num_groups(0)) {
        int tok0, h;
        tile_of(i, T, &tok0, &h);
        const int nkeys = tile_keys(tok0, T);
        const int tok = tok0 + 4 * cw + w;
        const int nvis = tok < T ? (tok + 1) / CB : 0;
        const int hq0 = h * G + gq, hq1 = hq0 + 8;
        uint qa[8][4];
#pragma unroll
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
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int j = 0; j < 32; ++j) oacc[hh][j] = 0.0f;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#if PREQ
        if (i + (int)get_num_groups(0) < ntiles) {
            int ntok0, nh;
            tile_of(i + get_num_groups(0), T, &ntok0, &nh);
            const int r = 32 * w + 8 * t4 + gq, ptok = ntok0 + 4 * cw + r / 32;
            if (ptok < T)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(q + ((size_t)ptok * HQ + nh * G + (r % 32) / 2) * D + (r % 2) * 64));
        }
#endif
#if PIPE
        /* S of chunk c + 1 runs during P V of chunk c; O is rescaled once P V is done. */
        const int nch = (nkeys + KC - 1) / KC;
        float s[KC / 2];
        uint pa[KC / 16][4], pn[KC / 16][4];
        float a0 = 1.0f, a1 = 1.0f;
        if (nch > 0) {
            mbar_wait(&kfull[itk % NSTK], (itk / NSTK) & 1);
            wg_shared_fence();
            wg_fence();
            qk_issue(s, qa, kt[itk % NSTK]);
            wg_commit();
            wg_wait_all();
            mbar_arrive(&kempty[itk % NSTK]);
            softmax_p(s, 0, nvis, t4, scale_log2, &m0, &m1, &l0, &l1, &a0, &a1, pa);
        }
        for (int c = 0; c < nch; ++c, ++itk, ++itv) {
            const uint sv = itv % NSTV, sk = (itk + 1) % NSTK;
            const bool more = c + 1 < nch;
            /* Issued on every chunk, the last one's on whatever the stage holds (not used), so
             * that the groups in flight are the same on every path: ptxas serializes the
             * products otherwise (C7514). */
            if (more) {
                mbar_wait(&kfull[sk], ((itk + 1) / NSTK) & 1);
                wg_shared_fence();
            }
#if PIPE_ZERO
#pragma unroll
            for (int j = 0; j < KC / 2; ++j) s[j] = 0.0f;
#endif
            wg_fence();
            qk_issue(s, qa, kt[sk]);
            wg_commit();
            mbar_wait(&vfull[sv], (itv / NSTV) & 1);
            wg_shared_fence();
            wg_fence();
            pv_issue(oacc, pa, vt[sv]);
            wg_commit();
            wg_wait_1();
            if (more) {
                mbar_arrive(&kempty[sk]);
                softmax_p(s, (c + 1) * KC, nvis, t4, scale_log2, &m0, &m1, &l0, &l1, &a0, &a1, pn);
            }
            wg_wait_all();
            mbar_arrive(&vempty[sv]);
            if (more) {
                rescale(oacc, a0, a1);
#pragma unroll
                for (int ks = 0; ks < KC / 16; ++ks)
#pragma unroll
                    for (int e = 0; e < 4; ++e) pa[ks][e] = pn[ks][e];
            }
        }
#else
        for (int c0 = 0; c0 < nkeys; c0 += KC, ++itk, ++itv) {
            const uint sv = itv % NSTV;
            float s[KC / 2];
            stage_scores(s, qa, kt, kfull, kempty, itk);
            uint pa[KC / 16][4];
#if SKIP & 1
#pragma unroll
            for (int ks = 0; ks < KC / 16; ++ks)
#pragma unroll
                for (int e = 0; e < 4; ++e) pa[ks][e] = pack_bf16(s[8 * ks + 2 * e] * scale_log2, s[8 * ks + 2 * e + 1]);
#else
            float a0, a1;
            softmax_p(s, c0, nvis, t4, scale_log2, &m0, &m1, &l0, &l1, &a0, &a1, pa);
            rescale(oacc, a0, a1);
#endif
            mbar_wait(&vfull[sv], (itv / NSTV) & 1);
            wg_shared_fence();
            wg_fence();
            pv_issue(oacc, pa, vt[sv]);
            wg_commit();
            wg_wait_all();
            mbar_arrive(&vempty[sv]);
        }
#endif
        l0 += shfl_xor_f(l0, 1);
        l0 += shfl_xor_f(l0, 2);
        l1 += shfl_xor_f(l1, 1);
        l1 += shfl_xor_f(l1, 2);
        if (tok < T) {
            const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
            __global uint *o0 = (__global uint *)(o + ((size_t)tok * HQ + hq0) * D + 2 * t4);
            __global uint *o1 = (__global uint *)(o + ((size_t)tok * HQ + hq1) * D + 2 * t4);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    o0[32 * hh + 4 * j] = pack_bf16(oacc[hh][4 * j] * i0, oacc[hh][4 * j + 1] * i0);
                    o1[32 * hh + 4 * j] = pack_bf16(oacc[hh][4 * j + 2] * i1, oacc[hh][4 * j + 3] * i1);
                }
            if (t4 == 0) {
                lse[(size_t)tok * HQ + hq0] = l0 > 0.0f ? m0 * 0.69314718f + log(l0) : -INFINITY;
                lse[(size_t)tok * HQ + hq1] = l1 > 0.0f ? m1 * 0.69314718f + log(l1) : -INFINITY;
            }
        }
#if PASS2
        importance(kt, kfull, kempty, qa, imp, idx, T, tok, h, nkeys, nvis, scale_log2, m0, m1, l0, l1, gq, t4, &itk);
#endif
    }
}

__kernel __attribute__((reqd_work_group_size(128 * (NCONS + 1), 1, 1))) void
cmp_ws(__global const ushort *q, __global const ushort *kc, __global const ushort *vc, __global ushort *o,
       __global float *lse, int T, float scale_log2, __global float *imp, __global int *idx)
{
    __local ushort kt[NSTK][KC * D] __attribute__((aligned(128)));
    __local ushort vt[NSTV][KC * D] __attribute__((aligned(128)));
    __local ulong kfull[NSTK], kempty[NSTK], vfull[NSTV], vempty[NSTV];
    const int lid = get_local_id(0), wgi = lid / 128, w = (lid / 32) % 4, lane = lid % 32;
    const int ntiles = (T + TOKS - 1) / TOKS * NH;
    if (lid < NSTK) {
        mbar_init(&kfull[lid], 64);
        mbar_init(&kempty[lid], 128 * NCONS);
    }
    if (lid >= 32 && lid < 32 + NSTV) {
        mbar_init(&vfull[lid - 32], 64);
        mbar_init(&vempty[lid - 32], 128 * NCONS);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (wgi == 0) {
#if REGS
        WG_REGS_DEC(REG_LO);
#endif
        if (lid < 64)
            produce(&kt[0][0], NSTK, kfull, kempty, kc, 0, T, ntiles, lid);
        else
            produce(&vt[0][0], NSTV, vfull, vempty, vc, 1, T, ntiles, lid - 64);
    } else {
#if REGS
        WG_REGS_INC(REG_HI);
#endif
        consume(kt, vt, kfull, kempty, vfull, vempty, q, o, lse, imp, idx, T, ntiles, scale_log2, wgi - 1, w, lane / 4, lane % 4);
    }
}
