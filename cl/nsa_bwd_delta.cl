/*
 * nsa_bwd_delta.cl: the backward prologue when the forward saved each
 * branch's output o_b (clnsa_nsa_outputs.o_cmp / o_slc / o_swa): per query
 * row, dg_b = do . o_b (to the optional gate gradient) and the softmax
 * correction D_b = g_b dg_b, which nsa_fwd.cl's BWD_PRE mode otherwise gets
 * by recomputing the three branches. A streaming pass over do and the o_b.
 *
 * A row is (batch, token, query head); a work-group takes RW heads of one
 * token, LANES lanes a row. A lane loads its dims of do once (lane, lane +
 * LANES, ...; with ROW_VEC, 8 at a time) and the same dims of every
 * branch's o_b, all loads before the first sum so that they are in flight
 * together, and leaves one partial sum per branch in local memory; after
 * the one barrier, lane i < 3 adds branch i's LANES partial sums in order:
 * the same result for every launch (deterministic). The NDRange spells out
 * the row, so no index is split by division (whose remainder LLVM pairs
 * into a `freeze`, which Oclgrind cannot run: common.h, rem_of).
 * Defines (besides common.h): DV, HAS_CMP, HAS_SLC, HAS_SWA, RW, ROW_VEC,
 * LANES (16 with ROW_VEC, else 32). NDRange (LANES * RW * ceil(HQ / RW), T, B).
 */

/* ROW_VEC (set by the host when do and every o_b have aligned rows; DV is a
 * multiple of 8, validated): a lane loads 8 consecutive dims at a time and
 * LANES = 16 lanes take a row, so that a warp keeps two rows' loads in
 * flight (4 dims a lane and 32 lanes a row kept one: 1.55 ms at T = 64k on
 * an H100, 1.45x the memory's floor). Else one dim a lane, 32 lanes a row.
 * The host defines LANES. */
#if ROW_VEC
#define VW 8
typedef float8 lane_vec;
inline float8 load_dims(__global const store_t *p, idx_t row, idx_t col_stride, int d) { return LOAD8(p, row + d); }
inline float fma4(float4 a, float4 b, float c) { return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, c)))); }
inline float fma_dims(float8 a, float8 b, float c) { return fma4(a.hi, b.hi, fma4(a.lo, b.lo, c)); }
#else
#define VW 1
typedef float lane_vec;
inline float load_dims(__global const store_t *p, idx_t row, idx_t col_stride, int d) { return LOAD(p, row + d * col_stride); }
#define fma_dims fma
#endif
/* the steps of VW dims a lane takes along a row */
#define LANE_STEPS ((DV + VW * LANES - 1) / (VW * LANES))

/* The first of the VW dims a lane loads at step i (past DV: none). */
inline int lane_dim(int lane, int i) { return VW * (lane + i * LANES); }

/* This lane's partial sum of do . o_b over its dims of row (b, t, hq). */
inline float branch_part(const lane_vec *dov, int lane, bool live, int b, int t, int hq, __global const store_t *ob,
                         idx_t ob_off, idx4_t st)
{
    float part = 0.0f;
    const idx_t row = at4(ob_off, st, b, t, hq, 0);
    if (live)
#pragma unroll
        for (int i = 0; i < LANE_STEPS; ++i) {
            const int d = lane_dim(lane, i);
            if (d < DV) part = fma_dims(dov[i], load_dims(ob, row, st.w, d), part);
        }
    return part;
}

/* The lane that finishes the branch: the row's sum of the LANES partial sums
 * in red, to dg_b (when asked) and, times the gate, to D_b. */
inline void branch_finish(__local const float *red, int b, int t, int hq, __global const store_t *gate, idx_t g_off,
                          idx4_t g_st, __global float *dlt, idx_t dl_off, idx4_t dl_st, __global store_t *dg,
                          idx_t dg_off, idx4_t dg_st)
{
    float sum = 0.0f;
    for (int i = 0; i < LANES; ++i) sum += red[i];
    if (dg) STORE(dg, at4(dg_off, dg_st, b, t, hq, 0), sum);
    dlt[at4(dl_off, dl_st, b, t, hq, 0)] = LOAD(gate, at4(g_off, g_st, b, t, hq, 0)) * sum;
}

/* The arguments of one branch: its saved output, gate, D and dg. */
#define BRANCH_ARGS(X)                                                                                              \
    __global const store_t *o_##X, idx_t o_##X##_off, idx4_t o_##X##_st, __global const store_t *g_##X,           \
        idx_t g_##X##_off, idx4_t g_##X##_st, __global float *d_##X, idx_t d_##X##_off, idx4_t d_##X##_st,         \
        __global store_t *dg_##X, idx_t dg_##X##_off, idx4_t dg_##X##_st

/* Branch X, slot I of the scratch: its partial sum, then its row sum */
#define BRANCH_PART(X, I) red[(I) * LANES * RW + lane] = branch_part(dov, lane, live, b, t, hq, o_##X, o_##X##_off, o_##X##_st)
#define BRANCH_FINISH(X, I)                                                                                         \
    if (live && lane == (I))                                                                                        \
    branch_finish(red + (I) * LANES * RW, b, t, hq, g_##X, g_##X##_off, g_##X##_st, d_##X, d_##X##_off,         \
                  d_##X##_st, dg_##X, dg_##X##_off, dg_##X##_st)

__kernel __attribute__((reqd_work_group_size(LANES * RW, 1, 1))) void nsa_bwd_delta(
    __global const store_t *dout, idx_t do_off, idx4_t do_st, BRANCH_ARGS(cmp), BRANCH_ARGS(slc),
    BRANCH_ARGS(swa), int HQ)
{
    /* per branch, RW rows of LANES partial sums */
    __local float red_all[3 * LANES * RW];
    /* unsigned: the division and remainder by LANES stay shifts and masks */
    const uint lid = get_local_id(0), slot = lid / LANES;
    const int lane = (int)(lid % LANES);
    __local float *red = red_all + slot * LANES;
    const int head = get_group_id(0) * RW + slot;
    /* heads past HQ still reach the barrier */
    const bool live = head < HQ;
    const int hq = live ? head : 0, t = get_global_id(1), b = get_global_id(2);
    lane_vec dov[LANE_STEPS];
    const idx_t do_row = at4(do_off, do_st, b, t, hq, 0);
#pragma unroll
    for (int i = 0; i < LANE_STEPS; ++i) {
        const int d = lane_dim(lane, i);
        dov[i] = live && d < DV ? load_dims(dout, do_row, do_st.w, d) : (lane_vec)0.0f;
    }
#if HAS_CMP
    BRANCH_PART(cmp, 0);
#endif
#if HAS_SLC
    BRANCH_PART(slc, 1);
#endif
#if HAS_SWA
    BRANCH_PART(swa, 2);
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
#if HAS_CMP
    BRANCH_FINISH(cmp, 0);
#endif
#if HAS_SLC
    BRANCH_FINISH(slc, 1);
#endif
#if HAS_SWA
    BRANCH_FINISH(swa, 2);
#endif
}
