/*
 * nsa_topk_list.h: a warp's top-S list of selection blocks, shared by the
 * warp kernels' top-k (nsa_topk_warp.h) and the warpgroup kernel of the
 * compressed branch and top-k (nsa_cmp_topk_wgmma.cl). Candidates come 32
 * at a time, lane i's block j_base + i (list_add_round): the lanes test
 * their blocks against the list's last entry at once, and only the blocks
 * that pass are inserted, in block order.
 *
 * The list (topk_list) lives in registers, entry i in lane i, when S <= 32:
 * an insertion is a ballot for its position and a shuffle of the entries
 * after it, where a list in local memory took one lane a loop of dependent
 * loads and stores. Larger S keep the list in local memory (topk_insert,
 * nsa_ranges.h).
 *
 * Defines: S, HAS_COUNTS (and NW for a list in local memory).
 */

#define LIST_IN_REGISTERS (S <= WARP)
/* The candidates of a round that have to pass the list's last entry for
 * list_merge to take them all at once (fewer: list_insert each). */
#ifndef LIST_MERGE_MIN
#define LIST_MERGE_MIN 8
#endif

/* The warp's top-S list, sorted by score (best first; equal scores keep the
 * lower block first); -inf / -1 entries are unfilled. */
typedef struct {
#if LIST_IN_REGISTERS
    float v; /* lane i: entry i (lanes past S: unused) */
    int j;
#else
    __local float *tv;
    __local int *ti;
#endif
} topk_list;

/* Declares the warp's list L, empty, at kernel scope (where S > 32 needs
 * its local arrays, NW lists). */
#if LIST_IN_REGISTERS
#define TOPK_LIST(L) topk_list L = {-INFINITY, -1}
#else
#define TOPK_LIST(L)                          \
    __local float L##_tv[NW * S];             \
    __local int L##_ti[NW * S];               \
    topk_list L = list_in_local(L##_tv, L##_ti)

/* The warp's list in the work-group's arrays, emptied. */
inline topk_list list_in_local(__local float *tv_all, __local int *ti_all)
{
    const int warp = get_local_id(0) / WARP;
    topk_list L = {tv_all + warp * S, ti_all + warp * S};
    for (int i = lane_id(); i < S; i += WARP) {
        L.tv[i] = -INFINITY;
        L.ti[i] = -1;
    }
    return L;
}
#endif

/* The list's last entry's score, on every lane. */
inline float list_last(const topk_list *L, __local uint *ws)
{
#if LIST_IN_REGISTERS
    return shfl_idx(L->v, S - 1, ws);
#else
    (void)ws;
    return L->tv[S - 1];
#endif
}

/* Inserts (score, j), the same on every lane, unless it is not better than
 * the last entry (topk_insert's rule). */
inline void list_insert(topk_list *L, float score, int j, __local uint *ws)
{
    const int lane = lane_id();
#if LIST_IN_REGISTERS
    /* the entries that stay ahead form a prefix: at least as good; pos = S
     * changes nothing (no early return: PoCL hangs on a return that skips
     * the emulated shuffles' barriers, even when the whole warp takes it) */
    const int pos = popcount(ballot(lane < S && !(score > L->v), ws));
    const int prev = max(lane - 1, 0);
    const float v_prev = shfl_idx(L->v, prev, ws);
    const int j_prev = as_int(shfl_idx(as_float(L->j), prev, ws));
    if (lane >= pos) {
        L->v = lane == pos ? score : v_prev;
        L->j = lane == pos ? j : j_prev;
    }
#else
    if (lane == 0) topk_insert(L->tv, L->ti, score, j);
    warp_sync(ws);
#endif
}

#if LIST_IN_REGISTERS
/* Whether entry (va, ja) goes before (vb, jb) in the list: the higher
 * score, on a tie the lower block (list_insert's order). */
inline bool entry_before(float va, int ja, float vb, int jb) { return va > vb || (va == vb && ja < jb); }

/* One compare-exchange of a bitonic network: the lane keeps the earlier
 * (first) or the later of its entry and lane ^ s's. */
inline void entry_exchange(float *v, int *j, int s, bool first, __local uint *ws)
{
    const float ov = shfl_xor(*v, s, ws);
    const int oj = as_int(shfl_xor(as_float(*j), s, ws));
    if (entry_before(ov, oj, *v, *j) == first) {
        *v = ov;
        *j = oj;
    }
}

/* The stages of a bitonic network over the warp's lanes, from span k_first
 * on: 2 sorts the lanes' entries, best first; WARP only merges a bitonic
 * sequence. */
inline void entries_bitonic(float *v, int *j, int k_first, __local uint *ws)
{
    const int lane = lane_id();
    for (int k = k_first; k <= WARP; k <<= 1)
        for (int s = k >> 1; s > 0; s >>= 1) entry_exchange(v, j, s, bitonic_keeps_first(lane, k, s), ws);
}

/* Inserts the lanes' candidates (v, j; v = -inf: none) at once, giving
 * the list that list_insert one by one would: a bitonic sort of the 32,
 * best first, then the better of list entry i and candidate 31 - i (a
 * bitonic sequence holding the best 32 of both), then a bitonic merge.
 * Twenty steps of two shuffles, where each insertion is a chain of a
 * ballot and three shuffles: it pays where many enter, in the first
 * chunks of blocks. On the H200 (anchor shape, 2026-11-29) the insertions
 * took 0.06 of the forward's 1.81 ms at 8k and 0.7 of 24.1 at 64k; with
 * the merge the forward that runs the top-k took 1.774-1.782 ms at 8k
 * (1.796-1.805 without) and 24.22-24.24 at 64k (24.13-24.15). */
inline void list_merge(topk_list *L, float v, int j, __local uint *ws)
{
    const int lane = lane_id();
    entries_bitonic(&v, &j, 2, ws);
    const float cv = shfl_idx(v, WARP - 1 - lane, ws);
    const int cj = as_int(shfl_idx(as_float(j), WARP - 1 - lane, ws));
    float lv = lane < S ? L->v : -INFINITY;
    int lj = lane < S ? L->j : INT_MAX;
    if (entry_before(cv, cj, lv, lj)) {
        lv = cv;
        lj = cj;
    }
    entries_bitonic(&lv, &lj, WARP, ws);
    L->v = lv;
    L->j = lj;
}
#endif

/* Adds a round of candidates: lane i's block j_base + i with score sc
 * where it enters (beats the list's last entry), as list_insert one by one
 * in block order would, or at once (list_merge) where LIST_MERGE_MIN or
 * more enter. Returns the new last entry's score. Fewer entering blocks
 * placed at once by rank (two ballots each, none waiting on the others)
 * lost to the chain of insertions: nsa_cmp_topk_wgmma at 64k on the H100
 * went 5.08 -> 5.23-5.46 ms (2026-12-06, bench/RESULTS.md). */
inline float list_add_round(topk_list *L, bool enters, float sc, int j_base, __local uint *ws)
{
    const uint passed = ballot(enters, ws);
#if LIST_IN_REGISTERS
    if (popcount(passed) >= LIST_MERGE_MIN) { /* the same for the whole warp */
        list_merge(L, enters ? sc : -INFINITY, j_base + lane_id(), ws);
        return list_last(L, ws);
    }
#endif
    for (uint bits = passed; bits; bits &= bits - 1) {
        const int i = (int)(31 - clz(bits & (0u - bits)));
        list_insert(L, shfl_idx(sc, i, ws), j_base + i, ws);
    }
    return list_last(L, ws);
}

/* The block of slot s (-1: none), on every lane: slots past the row's
 * block_counts are empty, as list_store writes them. */
inline int list_block(const topk_list *L, int s, __local uint *ws)
{
#if LIST_IN_REGISTERS
    return as_int(shfl_idx(as_float(L->v > -INFINITY ? L->j : -1), s, ws));
#else
    (void)ws;
    return L->tv[s] > -INFINITY ? L->ti[s] : -1;
#endif
}

/* The first n entries' blocks in ascending order, lane s holding slot s's
 * (-1 past the filled ones; with SLC_ASCENDING 0, in the list's score
 * order; a list in local memory, S > 32, never runs in the fused forward),
 * for the selected branch to walk: neighbouring tokens, on neighbouring
 * warps, then meet the blocks they share at about the same time and read
 * them from L1 (host-sorted given indices ran 1-3.5% faster than in the
 * order drawn on the H100). A bitonic sort over the warp's 32 lanes: 15
 * steps of one shuffle each, once a token. */
#ifndef SLC_ASCENDING
#define SLC_ASCENDING 1
#endif
inline int list_ascending(const topk_list *L, int n, __local uint *ws)
{
    const int lane = lane_id();
#if LIST_IN_REGISTERS && SLC_ASCENDING
    /* entries_bitonic's network on the block alone: one shuffle a step,
     * where entries_bitonic's two cost the forward 0.3% at 64k (H200,
     * 2026-11-29: 24.28-24.32 ms against 24.23) */
    return lanes_ascending(lane < n && L->v > -INFINITY ? L->j : -1, ws);
#else
    const int j = list_block(L, lane, ws);
    return lane < n ? j : -1;
#endif
}

/* topk_store for the list. */
inline void list_store(const topk_list *L, __global const int *bcnt, idx_t cnt_at, __global int *bidx, idx_t row,
                       idx_t slot_stride)
{
    const int lane = lane_id();
#if LIST_IN_REGISTERS
    const int nsel = topk_nsel(bcnt, cnt_at);
    if (lane < S) bidx[row + (idx_t)lane * slot_stride] = lane < nsel && L->v > -INFINITY ? L->j : -1;
#else
    topk_store(L->tv, L->ti, bcnt, cnt_at, bidx, row, slot_stride, lane, WARP);
#endif
}

