/*
 * nsa_bwd_delta.cl: the backward prologue when the forward saved each
 * branch's output o_b (clnsa_nsa_outputs.o_cmp / o_slc / o_swa): per query
 * row, dg_b = do . o_b (to the optional gate gradient) and the softmax
 * correction D_b = g_b dg_b, which nsa_fwd.cl's BWD_PRE mode otherwise gets
 * by recomputing the three branches. A streaming pass over do and the o_b.
 *
 * A row is (batch, token, query head); a work-group takes RW heads of one
 * token, 32 lanes a row, each lane summing the dims lane, lane + 32, ...,
 * then lane 0 the 32 partial sums in order: the same result for every
 * launch (deterministic). The NDRange spells out the row, so no index is
 * split by division (whose remainder LLVM pairs into a `freeze`, which
 * Oclgrind cannot run: common.h, rem_of).
 * Defines (besides common.h): DV, HAS_CMP, HAS_SLC, HAS_SWA, RW.
 * NDRange (32 * RW * ceil(HQ / RW), T, B).
 */

#define LANES 32

/* One branch of row (b, t, hq): red is the row's LANES words of scratch. */
inline void branch_delta(__local float *red, int lane, bool live, int b, int t, int hq,
                         __global const store_t *dout, idx_t do_off, idx4_t do_st,
                         __global const store_t *ob, idx_t ob_off, idx4_t ob_st,
                         __global const store_t *gate, idx_t g_off, idx4_t g_st,
                         __global float *dlt, idx_t dl_off, idx4_t dl_st,
                         __global store_t *dg, idx_t dg_off, idx4_t dg_st)
{
    float part = 0.0f;
    if (live)
        for (int d = lane; d < DV; d += LANES)
            part = fma(LOAD(dout, at4(do_off, do_st, b, t, hq, d)), LOAD(ob, at4(ob_off, ob_st, b, t, hq, d)), part);
    red[lane] = part;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (live && lane == 0) {
        float sum = 0.0f;
        for (int i = 0; i < LANES; ++i) sum += red[i];
        if (dg) STORE(dg, at4(dg_off, dg_st, b, t, hq, 0), sum);
        dlt[at4(dl_off, dl_st, b, t, hq, 0)] = LOAD(gate, at4(g_off, g_st, b, t, hq, 0)) * sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* The arguments of one branch: its saved output, gate, D and dg. */
#define BRANCH_ARGS(X)                                                                                              \
    __global const store_t *o_##X, idx_t o_##X##_off, idx4_t o_##X##_st, __global const store_t *g_##X,           \
        idx_t g_##X##_off, idx4_t g_##X##_st, __global float *d_##X, idx_t d_##X##_off, idx4_t d_##X##_st,         \
        __global store_t *dg_##X, idx_t dg_##X##_off, idx4_t dg_##X##_st

#define BRANCH(X)                                                                                                   \
    branch_delta(red, lane, live, b, t, hq, dout, do_off, do_st, o_##X, o_##X##_off, o_##X##_st, g_##X,            \
                 g_##X##_off, g_##X##_st, d_##X, d_##X##_off, d_##X##_st, dg_##X, dg_##X##_off, dg_##X##_st)

__kernel __attribute__((reqd_work_group_size(LANES * RW, 1, 1))) void nsa_bwd_delta(
    __global const store_t *dout, idx_t do_off, idx4_t do_st, BRANCH_ARGS(cmp), BRANCH_ARGS(slc),
    BRANCH_ARGS(swa), int HQ)
{
    __local float red_all[LANES * RW];
    /* unsigned: the division and remainder by 32 stay shifts and masks */
    const uint lid = get_local_id(0), slot = lid / LANES;
    const int lane = (int)(lid % LANES);
    __local float *red = red_all + slot * LANES;
    const int head = get_group_id(0) * RW + slot;
    /* heads past HQ still reach the barriers */
    const bool live = head < HQ;
    const int hq = live ? head : 0, t = get_global_id(1), b = get_global_id(2);
#if HAS_CMP
    BRANCH(cmp);
#endif
#if HAS_SLC
    BRANCH(slc);
#endif
#if HAS_SWA
    BRANCH(swa);
#endif
}
