/*
 * nsa_cmp_topk_wgmma.cl: the first half of the split NSA forward on
 * Hopper (src/ops/nsa_fwd.c's plan_cmp_topk_wgmma): the compressed branch
 * and the top-k on warpgroup products (warpgroup_mma.h). It writes o_cmp,
 * ungated, into o (the forward given the selection then adds g_cmp times
 * it to the other branches: nsa_fwd_warp.cl's ADD_PARTIAL), lse_cmp and
 * o_cmp where asked, and the selection into block_indices, with the rules
 * of the warp kernels' top-k (nsa_topk_warp.h): the same scores, forced
 * blocks, list and order.
 *
 * Warp-specialized and persistent: a work-group is one producer warpgroup
 * and NCONS consumer warpgroups, and loops over tiles of TOKS = 4 * NCONS
 * consecutive tokens of one batch row and KV head, the heaviest (last)
 * tokens first.
 * - The producer keeps NSTK stages of KC compressed keys of K in flight
 *   (K-major, wgmma's core matrices) and NSTV stages of V (MN-major), one
 *   work-item each, a stage one bulk copy by the copy engine
 *   (mbar_copy_bulk) from the image of the rings that nsa_cmp_tiles (the
 *   program's other kernel) writes first: the compressed K/V of each chunk
 *   rearranged, 16 KB a chunk. A stage's bytes complete its "full"
 *   mbarrier; consumers release it on its "empty" one. Against cp.async
 *   by two warps a ring (eight lanes copying eight keys' 16-byte pieces of
 *   one core matrix, as nsa_cmp_tiles now does), the kernel went 6.15-6.20
 *   -> 5.31-5.35 ms at 64k on the H200 (2026-11-30).
 * - A consumer warpgroup owns 4 tokens' 16 query heads (G = 16): 64 rows,
 *   warp w the rows of token 4 * (its index) + w, in mma.sync's fragments.
 *   Per chunk of KC keys: Q K^T (m64n32k16), the online softmax on each
 *   warp's fragments (warp_softmax.h), P V (m64n64k16, two halves of D).
 *   The softmax's slack (RESCALE_SLACK: O rescaled only when a row's max
 *   moves by more) took the kernel from 6.76 to 6.51 ms at 64k on the H200
 *   (2026-11-30).
 *   After the tile, K is streamed again for the top-k's second pass: each
 *   head's exp2(s - lse) summed over the 16 heads per key (the importance
 *   of the block that compressed key is: compressed and selection blocks
 *   are the same), merged 32 blocks at a time into the warp's list
 *   (nsa_topk_list.h).
 * - setmaxnreg: the producer drops to 24 registers, the consumers rise to
 *   160, under the program's cap of 128 (WG_MAXNREG). Without it ptxas
 *   serialized two consumers' products (C7520): 5.86 ms against 4.23 with
 *   three consumers and the registers moved (bench/results/session30_*).
 *   With the copy engine's stages the producer needs few: 24 / 160 took
 *   the kernel from 5.32-5.35 to 5.27-5.30 ms at 64k against 32 / 152
 *   (H200, 2026-11-30).
 *
 * Defines (besides common.h, warp_mma.h with MMA_NV 1, warp_softmax.h,
 * warpgroup_mma.h, nsa_ranges.h, nsa_topk_list.h): G 16, DK = DV = 128,
 * BS = CMP_L = CMP_D, S <= 32, NH (KV heads), NCONS, KC 32, NSTK,
 * NSTV, INIT_BLOCKS, LOCAL_BLOCKS, HAS_COUNTS, FUSED_TOPK 1 (block_indices
 * written).
 * NDRange: (128 * (NCONS + 1) * work-groups, 1, 1), work-groups at most the
 * tiles (one a compute unit is the host's choice); nsa_cmp_tiles: one
 * work-item a 16-byte piece of the image (chunk_tile).
 */

#if G != 16 || DK != 128 || DV != 128 || CMP_L != BS || CMP_D != BS || S > WARP || VARLEN || KC != 32
#error "nsa_cmp_topk_wgmma.cl takes G 16, DK = DV = 128, compressed blocks equal to selection blocks, S <= 32, no varlen, KC 32"
#endif
#define TOKS (4 * NCONS)
#define WG_D DK /* the head dim, 128: the host sizes the image (nsa_cmp_tiles_bytes) from DK too */

typedef struct {
    int b, tok0, h;
} cmp_tile;

/* Tile i of the persistent loop, heaviest first. Every work-group then
 * meets its tile boundaries (where the queries are read and o written) at
 * about the same time as the others; rotating each one's list of tiles to
 * spread them out was level (4.65 ms at 64k on the H100, 2026-12-07, the
 * fifty-second session in bench/RESULTS_ROUNDS_2026-12-07.md). */
inline cmp_tile tile_at(int i, int T, int B)
{
    cmp_tile t;
    t.h = i % NH;
    t.b = (i / NH) % B;
    t.tok0 = (ceil_div(T, TOKS) - 1 - i / (NH * B)) * TOKS;
    return t;
}

inline int visible_keys(int tok, int T, int nc_rows) { return tok < T ? cmp_visible(tok, true, nc_rows, 0) : 0; }

/* The keys the tile's last token sees: the most of any of its tokens. */
inline int tile_keys(cmp_tile t, int T, int nc_rows) { return visible_keys(min(t.tok0 + TOKS, T) - 1, T, nc_rows); }

/* Where chunk c (of nch) of KV head h of batch row b starts in the
 * image of the rings: its K stage, then its V stage, as the rings hold
 * them. */
inline idx_t chunk_tile(int b, int h, int c, int nch) { return (((idx_t)b * NH + h) * nch + c) * (2 * KC * WG_D); }

/* The rings' image of the compressed K and V (chunk_tile): work-item j of
 * a stage's KC * WG_D / 8 copies the 16-byte piece kp of key n's row, so
 * that eight consecutive work-items fill one core matrix (128 contiguous
 * bytes of a K stage); zeros past the keys. */
__kernel void nsa_cmp_tiles(__global const store_t *kc, idx_t kc_off, idx4_t kc_st, __global const store_t *vc,
                            idx_t vc_off, idx4_t vc_st, int nc_rows, int B, __global store_t *tiles, idx_t tiles_off)
{
    const int per = KC * WG_D / 8, nch = ceil_div(nc_rows, KC);
    const idx_t gid = get_global_id(0), chunk = gid / (2 * per);
    const int j = (int)(gid % per), kv = (int)(gid / per % 2);
    if (chunk >= (idx_t)B * NH * nch) return;
    const int c = (int)(chunk % nch), h = (int)(chunk / nch % NH), b = (int)(chunk / ((idx_t)nch * NH));
    const int n = j / WG_D * 8 + j % 8, kp = j / 8 % (WG_D / 8), key = c * KC + n, row = min(key, nc_rows - 1);
    const int at = kv ? kp * (KC * 8) + n / 8 * 64 + n % 8 * 8 : n / 8 * (WG_D * 8) + kp * 64 + n % 8 * 8;
    __global const store_t *src =
        kv ? vc + at4(vc_off, vc_st, b, row, h, 8 * kp) : kc + at4(kc_off, kc_st, b, row, h, 8 * kp);
    *(__global uint4 *)(tiles + tiles_off + chunk_tile(b, h, c, nch) + kv * (KC * WG_D) + at) =
        key < nc_rows ? *(__global const uint4 *)src : (uint4)(0u);
}

/* A producer (one work-item): every tile's chunks of K (kv 0, passes 2:
 * the branch, then the importance) or V (kv 1, passes 1) into its ring. */
inline void produce(__local ushort *ring, int nst, __local ulong *full, __local ulong *empty,
                    __global const store_t *tiles, int kv, int passes, int T, int B, int nc_rows, int ntiles)
{
    const int nch_all = ceil_div(nc_rows, KC);
    uint it = 0;
    for (int i = get_group_id(0); i < ntiles; i += get_num_groups(0)) {
        const cmp_tile tl = tile_at(i, T, B);
        const int nch = ceil_div(tile_keys(tl, T, nc_rows), KC);
        for (int c = 0; c < nch * passes; ++c, ++it) {
            const uint s = it % nst;
            mbar_wait(&empty[s], ((it / nst) & 1) ^ 1);
            mbar_copy_bulk(ring + s * (KC * WG_D), tiles + chunk_tile(tl.b, tl.h, c % nch, nch_all) + kv * (KC * WG_D),
                           KC * WG_D * sizeof(store_t), &full[s]);
        }
    }
}

/* The bytes of e elements of a stage, for the products' offsets: a k-step
 * (16 head dims of K, 16 keys of V) is two core matrices of 8 x 8, 128
 * elements, on both stages; the second half of V's D starts 64 * KC in. */
inline uint stage_bytes(int e) { return (uint)e * (uint)sizeof(ushort); }

/* Chunk it's scores s = Q K^T from K stage it % NSTK, which it waits for
 * and then releases. */
inline void stage_scores(float *s, word_t (*qa)[4], __local ushort (*kt)[KC * WG_D], __local ulong *kfull,
                         __local ulong *kempty, uint it)
{
    const uint sk = it % NSTK;
    mbar_wait(&kfull[sk], (it / NSTK) & 1); /* the copy engine's bytes: no proxy fence before wgmma */
#pragma unroll
    for (int j = 0; j < KC / 2; ++j) s[j] = 0.0f;
    wg_fence();
    const ulong d0 = wg_desc(kt[sk], 128, 2048); /* why once a stage: stage_values */
#pragma unroll
    for (int ks = 0; ks < WG_D / 16; ++ks)
        WGMMA_M64N32K16(MMA_AB, s, qa[ks], wg_desc_plus(d0, stage_bytes(ks * 128)), ks > 0, 0);
    wg_commit();
    wg_wait_all();
    mbar_arrive(&kempty[sk]);
}

/* o += P V from V stage it % NSTV, which it waits for and then releases. */
inline void stage_values(float *oacc, word_t (*pa)[4], __local ushort (*vt)[KC * WG_D], __local ulong *vfull,
                         __local ulong *vempty, uint it)
{
    const uint sv = it % NSTV;
    mbar_wait(&vfull[sv], (it / NSTV) & 1);
    wg_fence();
    /* The descriptor made once a stage, each product's an add to it: built
     * from each product's address, ptxas spent 6 uniform instructions a
     * product on it. 5.09-5.10 -> 4.89 ms at 64k on the H200 (2026-12-06). */
    const ulong d0 = wg_desc(vt[sv], 128, 16 * KC);
#pragma unroll
    for (int ks = 0; ks < KC / 16; ++ks)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
            WGMMA_M64N64K16(MMA_AB, oacc + 32 * hh, pa[ks], wg_desc_plus(d0, stage_bytes(ks * 128 + hh * 64 * KC)),
                            1, 1);
    wg_commit();
    wg_wait_all();
    mbar_arrive(&vempty[sv]);
}

/* Lane i's block score of a round of blocks c0 + i (the top-k's rules:
 * forced blocks +inf; blocks without a compressed key 0). */
inline float block_score_of(float imp, int j, int nvis, int cur)
{
    if (block_forced(j, cur)) return INFINITY;
    return j < nvis ? imp : 0.0f;
}

/* The lane holding column c (< 32) of a 32-key slice's column sums
 * after column_sums(v, 8): its v[i] was column 8 (i >> 1) + 2 t4 + (i & 1),
 * and column_sums leaves lane (gq, t4) the sum of v[i], i the bits of gq
 * reversed (it halves on lane bits 4, 8, 16, keeping the upper half on
 * bit 4 first). */
inline int column_lane(int c)
{
    const int i = 2 * (c >> 3) + (c & 1);
    return 4 * (((i >> 2) & 1) | (i & 2) | ((i & 1) << 2)) + ((c >> 1) & 3);
}

/* One chunk's round of the top-k's second pass for the warp's token: the
 * scores s of its 32 keys (c0 ..) to exp2(s - lse2) summed over the 16
 * heads per key (rows gq and gq + 8 in the lane, then column_sums across
 * the lanes), lane i taking key c0 + i, merged into the list. Returns the
 * list's last score. */
inline float importance_round(const float *s, int c0, int nvis, int cur, float sl2, const float *lse2, topk_list *list,
                              float last, __local uint *ws)
{
    float v[8];
    int first;
    /* No visibility test a sum: a column sum holds only its own column, and
     * block_score_of drops the keys past nvis. Dropping the 8 tests and
     * selects: 5.05-5.11 -> 5.03-5.04 ms at 64k on the H100 (2026-12-06).
     * Four of the 16 exponentials on the FMA pipe instead of the SFU (a
     * cubic and an exponent add, 8 instructions each) gained nothing
     * (5.04-5.10 ms), eight lost (5.15-5.20): the round is held by the
     * instructions it issues, not by the SFU. */
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) v[2 * j + e] = exp2(s[4 * j + e] * sl2 - lse2[0]) + exp2(s[4 * j + 2 + e] * sl2 - lse2[1]);
    column_sums(v, 8, &first, ws); /* the lane's v[0]: column_lane's inverse */
    (void)first;
    const float imp = shfl_idx(v[0], column_lane(lane_id()), ws);
    const int j = c0 + lane_id();
    const float sc = block_score_of(imp, j, nvis, cur);
    return list_add_round(list, j <= cur && sc > last, sc, c0, ws);
}

/* The top-k's second pass for the warp's token: each chunk's Q K^T again,
 * its round (importance_round), then the blocks past the chunks up to the
 * token's own (cur), which have no compressed key. Issuing the next
 * chunk's products before this one's round (two score tiles taking turns)
 * was 13% slower on the H200 (6.73 -> 7.58-7.62 ms at 64k, 2026-11-30):
 * ptxas serializes the products (C7514) once the round reads one tile
 * while the other's products are in flight. Again on the H100 (2026-12-06),
 * the tiles not zeroed and waited for with wait_group 1: 5.16 -> 6.96 ms at
 * 64k (spills under the cap of 128 registers, and the products serialized
 * again, C7518: a wait ptxas inserted in a divergent path), 8.1 with two
 * consumers of 240 registers (none); consumers issuing their products in
 * turns (named barriers) 5.57. The products and the rounds each run at
 * about half their units' rates and overlap little
 * (bench/RESULTS_ROUNDS_2026-12-06.md, forty-fourth session). With no
 * branch between the next products' issue and their wait (the list merged
 * after it), ptxas serializes and spills nothing, and the kernel is no
 * faster: 5.08 against 5.04-5.09 ms (H100, 2026-12-06, bench/RESULTS.md,
 * forty-seventh session). */
inline void importance_pass(__local ushort (*kt)[KC * WG_D], __local ulong *kfull, __local ulong *kempty,
                            word_t (*qa)[4], int nkeys, int nvis, int cur, float sl2, const float *lse2, topk_list *list,
                            uint *itk, __local uint *ws)
{
    float last = -INFINITY;
    int c0 = 0;
    for (; c0 < nkeys; c0 += KC, ++(*itk)) {
        float s[KC / 2];
        stage_scores(s, qa, kt, kfull, kempty, *itk);
        last = importance_round(s, c0, nvis, cur, sl2, lse2, list, last, ws);
    }
    for (; c0 <= cur; c0 += WARP) {
        const int j = c0 + lane_id();
        const float sc = block_score_of(0.0f, j, nvis, cur);
        last = list_add_round(list, j <= cur && sc > last, sc, c0, ws);
    }
}

/* Asks L1 for the warp's queries of its next tile (16 rows of 256 bytes,
 * a line a lane), which it reads at that tile's start, when the three
 * consumers all wait for theirs. On the H200 at 64k (2026-11-30): 5.32-5.35
 * -> 5.29-5.30 ms, and 5.27 with the registers below. */
inline void prefetch_next_queries(__global const store_t *q, idx_t q_off, idx4_t q_st, int i, int ntiles, int T, int B,
                                  int cw, int w)
{
    const int next = i + get_num_groups(0), lane = lane_id();
    if (next >= ntiles) return;
    const cmp_tile tn = tile_at(next, T, B);
    const int tok = min(tn.tok0 + 4 * cw + w, T - 1);
    asm volatile("prefetch.global.L1 [%0];" ::"l"(q + at4(q_off, q_st, tn.b, tok, tn.h * G + lane / 2, lane % 2 * 64))
                 : "memory");
}

/* A consumer warpgroup (cw of NCONS), warp w of it: its token of every
 * tile. Reading the next tile's queries during pass 2, when O's registers
 * are free, instead of at the tile's start lost: 6.20 -> 7.06-7.27 ms at
 * 64k on the H200 (2026-11-30). */
inline void consume(__local ushort (*kt)[KC * WG_D], __local ushort (*vt)[KC * WG_D], __local ulong *kfull,
                    __local ulong *kempty, __local ulong *vfull, __local ulong *vempty, __global const store_t *q,
                    idx_t q_off, idx4_t q_st, __global store_t *o, idx_t o_off, idx4_t o_st, __global float *lse_cmp,
                    idx_t lc_off, idx4_t lc_st, __global store_t *o_cmp, idx_t oc_off, idx4_t oc_st, __global int *bidx,
                    idx_t bi_off, idx4_t bi_st, __global const int *bcnt, idx_t bc_off, idx4_t bc_st, int nc_rows,
                    int T, int B, float scale, int ntiles, int cw, int w, __local uint *ws)
{
    const int lane = lane_id(), gq = lane >> 2, t4 = lane & 3;
    const float sl2 = scale * M_LOG2E_F;
    uint itk = 0, itv = 0;
    for (int i = get_group_id(0); i < ntiles; i += get_num_groups(0)) {
        const cmp_tile tl = tile_at(i, T, B);
        const int nkeys = tile_keys(tl, T, nc_rows), tok = tl.tok0 + 4 * cw + w, tq = min(tok, T - 1);
        const int nvis = visible_keys(tok, T, nc_rows), hq = tl.h * G + gq;
        word_t qa[WG_D / 16][4];
        __global const store_t *q0 = q + at4(q_off, q_st, tl.b, tq, hq, 2 * t4), *q1 = q0 + 8 * q_st.z;
#pragma unroll
        for (int s = 0; s < WG_D / 16; ++s) {
            qa[s][0] = tok < T ? *(__global const word_t *)(q0 + 16 * s) : 0;
            qa[s][1] = tok < T ? *(__global const word_t *)(q1 + 16 * s) : 0;
            qa[s][2] = tok < T ? *(__global const word_t *)(q0 + 16 * s + 8) : 0;
            qa[s][3] = tok < T ? *(__global const word_t *)(q1 + 16 * s + 8) : 0;
        }
        prefetch_next_queries(q, q_off, q_st, i, ntiles, T, B, cw, w);
        float oacc[WG_D / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, a[2]; /* O: mma's C layout */
#pragma unroll
        for (int j = 0; j < WG_D / 2; ++j) oacc[j] = 0.0f;
        for (int c0 = 0; c0 < nkeys; c0 += KC, ++itk, ++itv) {
            float s[KC / 2];
            word_t pa[KC / 16][4];
            stage_scores(s, qa, kt, kfull, kempty, itk);
            if (warp_softmax_masked(s, sl2, nvis - c0, m, l, a, ws)) {
#pragma unroll
                for (int j = 0; j < WG_D / 2; ++j) oacc[j] *= a[(j >> 1) & 1];
            }
#pragma unroll
            for (int ks = 0; ks < KC / 16; ++ks) p_afrag(s, ks, pa[ks], ws);
            stage_values(oacc, pa, vt, vfull, vempty, itv);
        }
        float lse2[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            l[hr] += shfl_xor(l[hr], 1, ws);
            l[hr] += shfl_xor(l[hr], 2, ws);
            lse2[hr] = l[hr] > 0.0f ? m[hr] + log2(l[hr]) : INFINITY; /* INFINITY: no probabilities */
            const int r = hq + 8 * hr;
            if (tok < T) {
                const float f = l[hr] > 0.0f ? 1.0f / l[hr] : 0.0f;
                store_acc_row(o + at4(o_off, o_st, tl.b, tok, r, 0), WG_D, oacc, hr, f, true, ws);
                if (o_cmp) store_acc_row(o_cmp + at4(oc_off, oc_st, tl.b, tok, r, 0), WG_D, oacc, hr, f, true, ws);
                if (lse_cmp && t4 == 0)
                    lse_cmp[at4(lc_off, lc_st, tl.b, tok, r, 0)] = l[hr] > 0.0f ? lse2[hr] / M_LOG2E_F : -INFINITY;
            }
        }
        TOPK_LIST(list);
        importance_pass(kt, kfull, kempty, qa, nkeys, nvis, tok < T ? tok / BS : -1, sl2, lse2, &list, &itk, ws);
        if (tok < T)
            list_store(&list, bcnt, at4(bc_off, bc_st, tl.b, tok, tl.h, 0), bidx, at4(bi_off, bi_st, tl.b, tok, tl.h, 0),
                       bi_st.w);
    }
}

__kernel __attribute__((reqd_work_group_size(128 * (NCONS + 1), 1, 1))) void nsa_cmp_topk_wgmma(
    NSA_QUERY_ARGS, NSA_FWD_OUT_ARGS, int B, __global const store_t *tiles, idx_t tiles_off)
{
    __local ushort kt[NSTK][KC * WG_D] __attribute__((aligned(128)));
    __local ushort vt[NSTV][KC * WG_D] __attribute__((aligned(128)));
    __local ulong kfull[NSTK], kempty[NSTK], vfull[NSTV], vempty[NSTV];
    __local uint ws[WARP_SCRATCH];
    (void)k; (void)k_off; (void)k_st; (void)v; (void)v_off; (void)v_st; (void)kc; (void)kc_off; (void)kc_st; (void)vc;
    (void)vc_off; (void)vc_st; (void)g_slc; (void)gs_off; (void)gs_st;
    (void)g_swa; (void)gw_off; (void)gw_st; (void)cu; (void)cu0; (void)nseq; (void)cmp_off; (void)cmp_off0;
    (void)lse_slc; (void)ls_off; (void)ls_st; (void)lse_swa; (void)lw_off; (void)lw_st; (void)o_slc; (void)os_off;
    (void)os_st; (void)o_swa; (void)ow_off; (void)ow_st;
    const int lid = get_local_id(0), wgi = lid / 128;
    const int ntiles = ceil_div(T, TOKS) * NH * B;
    if (lid < NSTK) {
        mbar_init(&kfull[lid], 1);
        mbar_init(&kempty[lid], 128 * NCONS);
    }
    if (lid >= 32 && lid < 32 + NSTV) {
        mbar_init(&vfull[lid - 32], 1);
        mbar_init(&vempty[lid - 32], 128 * NCONS);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (wgi == 0) {
        WG_REGS_DEC(24);
        if (lid == 0) produce(&kt[0][0], NSTK, kfull, kempty, tiles + tiles_off, 0, 2, T, B, nc_rows, ntiles);
        if (lid == 32) produce(&vt[0][0], NSTV, vfull, vempty, tiles + tiles_off, 1, 1, T, B, nc_rows, ntiles);
    } else {
        WG_REGS_INC(160);
        consume(kt, vt, kfull, kempty, vfull, vempty, q, q_off, q_st, o, o_off, o_st, lse_cmp, lc_off, lc_st, o_cmp,
                oc_off, oc_st, bidx, bi_off, bi_st, bcnt, bc_off, bc_st, nc_rows, T, B, scale, ntiles, wgi - 1,
                (lid / 32) % 4, ws);
    }
}
