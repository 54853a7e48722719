/*
 * blocksparse_mask.cl: block masks and tile layouts of block-sparse attention.
 *
 * Layouts (block-sparse rows, CSR) are built in three steps from the tile
 * statistics (blocksparse.h): bs_layout_count counts each row's (or, for
 * the transposed form, each column's) FULL and visible tiles, bs_scan turns
 * the counts into offsets, bs_layout_fill lists the tiles, FULL ones first,
 * each group ascending. Every row is computed by one work-item from the same
 * classification, so the count and fill passes agree, and the result does not
 * depend on the work-group size.
 *
 * Defines (besides common.h): SCAN_WG, the work-group size of bs_scan.
 */

/* Statistics of the tiles [t*tile, min(T, (t+1)*tile)) of batch row b.
 * Positions default to r + def_off. NDRange (>= nt, batch rows). */
__kernel void bs_tile_stats(__global const int *pos, idx_t pos_off, idx4_t pos_st,
                            __global const int *seg, idx_t seg_off, idx4_t seg_st,
                            int T, int tile, int def_off, int nt, __global int *out, idx_t out_off)
{
    const int t = get_global_id(0), b = get_global_id(1);
    if (t >= nt) return;
    const int r0 = t * tile, r1 = min(T, r0 + tile);
    int pmin = INT_MAX, pmax = INT_MIN, smin = INT_MAX, smax = INT_MIN, valid = 1;
    for (int r = r0; r < r1; ++r) {
        const int p = pos ? pos[bs_at2(pos_off, pos_st, b, r)] : r + def_off;
        pmin = min(pmin, p);
        pmax = max(pmax, p);
        if (seg) {
            const int s = seg[bs_at2(seg_off, seg_st, b, r)];
            if (s >= 0) {
                smin = min(smin, s);
                smax = max(smax, s);
            } else {
                valid = 0;
            }
        }
    }
    if (!seg) smin = smax = 0;
    __global int *o = out + out_off + ((idx_t)b * nt + t) * BS_STATS;
    o[0] = pmin;
    o[1] = pmax;
    o[2] = smin;
    o[3] = smax;
    o[4] = valid && smin == smax;
}

/* The arguments shared by the count and fill kernels. */
#define BS_LAYOUT_PARAMS                                                                              \
    __global const int *st, idx_t qst_off, idx_t kst_off, int sb_on, __global const int *map,          \
        idx_t map_off, idx4_t map_st, int QB, int KB, int causal, int wl, int wr, int has_seg, int Tq, \
        int Tk, int BQ, int BK, int NQT, int NKT, int lh, int transposed

/* Class of tile pair `o` of row r (the q tile r and key tile o, or the key
 * tile r and q tile o when transposed) of slice s = b * lh + hq. */
inline int bs_pair(BS_LAYOUT_PARAMS, int s, int r, int o)
{
    const int b = s / lh, hq = s - b * lh, bst = sb_on ? b : 0;
    const int qt = transposed ? o : r, kt = transposed ? r : o;
    const int r0 = qt * BQ, r1 = min(Tq, r0 + BQ), c0 = kt * BK, c1 = min(Tk, c0 + BK);
    __global const int *qs = st + qst_off + ((idx_t)bst * NQT + qt) * BS_STATS;
    __global const int *ks = st + kst_off + ((idx_t)bst * NKT + kt) * BS_STATS;
    const idx_t mbase = map_off + (idx_t)b * map_st.x + (idx_t)hq * map_st.y;
    return bs_classify(qs, ks, causal, wl, wr, has_seg, map, mbase, map_st.z, map_st.w, QB, KB, r0, r1, c0, c1);
}
#define BS_LAYOUT_ARGS st, qst_off, kst_off, sb_on, map, map_off, map_st, QB, KB, causal, wl, wr, has_seg, Tq, Tk, \
                       BQ, BK, NQT, NKT, lh, transposed

/* cnt[s*nr + r] = visible tiles of row r, full[s*nr + r] = FULL ones.
 * NDRange (>= nr, slices). */
__kernel void bs_layout_count(BS_LAYOUT_PARAMS, __global int *cnt, idx_t cnt_off, __global int *full,
                              idx_t full_off)
{
    const int r = get_global_id(0), s = get_global_id(1);
    const int nr = transposed ? NKT : NQT, no = transposed ? NQT : NKT;
    if (r >= nr) return;
    int n = 0, nf = 0;
    for (int o = 0; o < no; ++o) {
        const int c = bs_pair(BS_LAYOUT_ARGS, s, r, o);
        n += c != BS_EMPTY;
        nf += c == BS_FULL;
    }
    cnt[cnt_off + (idx_t)s * nr + r] = n;
    full[full_off + (idx_t)s * nr + r] = nf;
}

/* In-place exclusive prefix sum of a[0..n), total into a[n]. One work-group
 * of SCAN_WG work-items, each owning a contiguous chunk. */
__kernel __attribute__((reqd_work_group_size(SCAN_WG, 1, 1))) void bs_scan(__global int *a, idx_t a_off, int n)
{
    __local int part[SCAN_WG];
    a += a_off;
    const int lid = get_local_id(0), chunk = (n + SCAN_WG - 1) / SCAN_WG;
    const int lo = min(n, lid * chunk), hi = min(n, lo + chunk);
    int sum = 0;
    for (int i = lo; i < hi; ++i) sum += a[i];
    part[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        int run = 0;
        for (int p = 0; p < SCAN_WG; ++p) {
            const int x = part[p];
            part[p] = run;
            run += x;
        }
        a[n] = run;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int run = part[lid];
    for (int i = lo; i < hi; ++i) {
        const int x = a[i];
        a[i] = run;
        run += x;
    }
}

/* Lists row r's tiles at off[s*nr + r]: FULL ones, then PARTIAL ones, each
 * ascending; nothing is written past cap. NDRange (>= nr, slices). */
__kernel void bs_layout_fill(BS_LAYOUT_PARAMS, __global const int *off, idx_t off_off, __global int *cols,
                             idx_t cols_off, int cap)
{
    const int r = get_global_id(0), s = get_global_id(1);
    const int nr = transposed ? NKT : NQT, no = transposed ? NQT : NKT;
    if (r >= nr) return;
    int at = off[off_off + (idx_t)s * nr + r];
    for (int pass = BS_FULL; pass >= BS_PARTIAL; --pass)
        for (int o = 0; o < no; ++o)
            if (bs_pair(BS_LAYOUT_ARGS, s, r, o) == pass) {
                if (at >= 0 && at < cap) cols[cols_off + at] = o;
                ++at;
            }
}

/* ----------------------------------------------------------- builders */

#define MASK_ALL 0
#define MASK_CAUSAL 1
#define MASK_WINDOW 2
#define MASK_STRIDED 3
#define MASK_GLOBAL 4
#define MASK_SEGMENT 5
#define OP_SET 0
#define OP_AND 1
#define OP_OR 2

inline int floor_div(long a, long b) { return (int)(a >= 0 ? a / b : -((-a + b - 1) / b)); }

/* Block (qb, kb) of mask kind `kind` for batch row b (see clnsa.h). */
inline int bs_block_on(int kind, int b, int qb, int kb, int Tq, int Tk, int QB, int KB, int wl, int wr, int stride,
                       int nglobal, __global const int *sq, idx_t sq_off, idx4_t sq_st, __global const int *sk,
                       idx_t sk_off, idx4_t sk_st)
{
    const int i0 = qb * QB, i1 = min(Tq, i0 + QB), j0 = kb * KB, j1 = min(Tk, j0 + KB);
    const long off = (long)Tk - Tq, p0 = i0 + off, p1 = i1 - 1 + off; /* first and last query position */
    switch (kind) {
    case MASK_ALL: return 1;
    case MASK_CAUSAL: return j0 <= p1;
    case MASK_WINDOW: return (wl < 0 || j1 - 1 >= p0 - wl) && (wr < 0 || j0 <= p1 + wr);
    case MASK_STRIDED: {
        const int d = floor_div(p0, KB) - kb;
        return (d % stride + stride) % stride == 0;
    }
    case MASK_GLOBAL: return (long)j0 < nglobal;
    case MASK_SEGMENT:
        for (int i = i0; i < i1; ++i) {
            const int s = sq[bs_at2(sq_off, sq_st, b, i)];
            if (s < 0) continue;
            for (int j = j0; j < j1; ++j)
                if (sk[bs_at2(sk_off, sk_st, b, j)] == s) return 1;
        }
        return 0;
    }
    return 0;
}

/* NDRange (>= NKB, NQB, mask batch rows * heads). */
__kernel void bs_mask_build(int kind, int op, __global int *m, idx_t m_off, idx4_t m_st, int NQB, int NKB, int nh,
                            int Tq, int Tk, int QB, int KB, int wl, int wr, int stride, int nglobal,
                            __global const int *sq, idx_t sq_off, idx4_t sq_st,
                            __global const int *sk, idx_t sk_off, idx4_t sk_st)
{
    const int kb = get_global_id(0), qb = get_global_id(1), s = get_global_id(2);
    if (kb >= NKB || qb >= NQB) return;
    const int b = s / nh, h = s - b * nh;
    const idx_t at = m_off + (idx_t)b * m_st.x + (idx_t)h * m_st.y + (idx_t)qb * m_st.z + (idx_t)kb * m_st.w;
    const int on = bs_block_on(kind, b, qb, kb, Tq, Tk, QB, KB, wl, wr, stride, nglobal, sq, sq_off, sq_st, sk,
                               sk_off, sk_st);
    m[at] = op == OP_SET ? on : op == OP_AND ? (on && m[at] != 0) : (on || m[at] != 0);
}

/* out = a op b; strides of a and b are 0 where they broadcast.
 * NDRange (>= NKB, NQB, out batch rows * heads). */
__kernel void bs_mask_combine(int op, __global const int *a, idx_t a_off, idx4_t a_st,
                              __global const int *bm, idx_t b_off, idx4_t b_st,
                              __global int *m, idx_t m_off, idx4_t m_st, int NQB, int NKB, int nh)
{
    const int kb = get_global_id(0), qb = get_global_id(1), s = get_global_id(2);
    if (kb >= NKB || qb >= NQB) return;
    const int b = s / nh, h = s - b * nh;
    const int x = a[a_off + (idx_t)b * a_st.x + (idx_t)h * a_st.y + (idx_t)qb * a_st.z + (idx_t)kb * a_st.w] != 0;
    const int y = bm[b_off + (idx_t)b * b_st.x + (idx_t)h * b_st.y + (idx_t)qb * b_st.z + (idx_t)kb * b_st.w] != 0;
    m[m_off + (idx_t)b * m_st.x + (idx_t)h * m_st.y + (idx_t)qb * m_st.z + (idx_t)kb * m_st.w] =
        op == OP_AND ? (x && y) : (x || y);
}
