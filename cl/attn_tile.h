/*
 * attn_tile.h: online-softmax attention of a tile of query rows (the GT query
 * heads of one KV group that a work-group owns) to a stream of key tiles.
 * Every branch of NSA and the dense baseline reduce to "attend these rows to a
 * contiguous range of keys", so they all go through attend_range().
 *
 * Required defines: WG (work-group size), GT (query rows per work-group),
 * DK, DV (head dims), TK (keys per tile), ACC_N = ceil(GT*DV / WG)
 * (output elements each work-item owns).
 *
 * Local memory (floats): qs[GT*DK], ks[TK*KPAD(DK)], vs[TK*VPAD], ps[GT*TK],
 * and m, l, alpha[GT] (running max, running sum, last rescale factor).
 * Rows past the real head count hold zero queries; their results are unused.
 */

/* The local arrays travel as separate pointers (not in a struct: PoCL 3.1
 * was seen to lose stores made through __local pointers held in a struct). */
#define ATTN_SMEM_PARAMS                                                                     \
    __local float *qs, __local float *ks, __local float *vs, __local float *ps,               \
        __local float *m_run, __local float *l_run, __local float *alpha
#define ATTN_SMEM qs, ks, vs, ps, m_run, l_run, alpha

inline void attn_reset(ATTN_SMEM_PARAMS, float acc[ACC_N], int lid)
{
    for (int g = lid; g < GT; g += WG) {
        m_run[g] = -INFINITY;
        l_run[g] = 0.0f;
    }
    for (int i = 0; i < ACC_N; ++i) acc[i] = 0.0f;
}

/* Which outputs a work-item owns. PV_BLOCK (the tile's outputs exactly 16
 * a work-item): a 4 x 4 block (common.h's block_elem, accumulate_block),
 * the V tile then unpadded so that a warp's reads of a key row are
 * contiguous: per 4 keys 4 float4 of P (one per row, the same for the
 * whole warp) and 4 of V for 64 products. At 16k on the H100 the portable
 * forward took 33.3 ms where it took 63.8 with the layout kept elsewhere:
 * element lid + i*WG of the row-major tile, one column of 16 rows at the
 * tuned shape, so 16 float4 of P and 4 V values for the same products. */
#define PV_BLOCK (TK % 4 == 0 && BLOCK_OF(GT, DV, WG))
#if PV_BLOCK
#define VPAD DV
#else
#define VPAD KPAD(DV)
#endif

/* Output element i of work-item lid: its row *g and column *d; false
 * where it lies past the tile. */
inline bool acc_elem(int i, int lid, int *g, int *d) { return tile_elem(PV_BLOCK, i, lid, WG, GT, DV, g, d); }

/* acc = alpha * acc + P V over the tile's nk keys, each output's sum in key
 * order (as the reference). */
#define PV_ONE_COL (WG % DV == 0)
inline void accumulate_pv(ATTN_SMEM_PARAMS, float acc[ACC_N], int nk, int lid)
{
    int row[ACC_N], col[ACC_N]; /* the output's row g (-1 past the tile) and column d */
    for (int i = 0; i < ACC_N; ++i) {
        int g, d;
        row[i] = acc_elem(i, lid, &g, &d) ? g : -1;
        col[i] = d;
        if (row[i] >= 0) acc[i] *= alpha[row[i]];
    }
#if PV_BLOCK
    accumulate_block(ps, TK, row[0], true, vs, VPAD, col[0], acc, nk);
#else
    accumulate_rows(ps, TK, vs, VPAD, row, col, acc, ACC_N, nk, PV_ONE_COL);
#endif
}

/* Where a tile's rows are long, the softmax's exponentials are spread over
 * the work-group (at the cost of one more barrier) instead of taken by
 * each row's own work-item while the others wait: at TK 32 (16k, H100)
 * the forward went from 70.9 to 63.8 ms; at TK 16 (the backward
 * prologue's pick) the spread step measured 12.7% slower. The sums keep
 * their order either way. */
#define SOFTMAX_SPREAD (TK >= 32)

/* The online-softmax step of one key tile whose scores are already in ps
 * (row g's nk scores at ps[g*TK ..]; -inf = masked) and whose values are in
 * vs: rescales the rows' state and acc, adds p.v. Ends with a barrier so
 * that the caller may overwrite the tile afterwards. */
inline void attend_scores(ATTN_SMEM_PARAMS, float acc[ACC_N], int nk, int lid)
{
    /* A row whose max is still -inf has seen no key: keep its state, p = 0.
     * (Written as an outer uniform loop: PoCL 3.1 miscompiles this body in
     * the form `for (g = lid; g < GT; g += WG)`; Oclgrind finds no race.) */
    for (int g0 = 0; g0 < GT; g0 += WG) {
        const int g = g0 + lid;
        if (g >= GT) break;
        const float m_old = m_run[g];
        float m_new = m_old;
        for (int j = 0; j < nk; ++j) m_new = fmax(m_new, ps[g * TK + j]);
        alpha[g] = (m_new == -INFINITY) ? 1.0f : exp(m_old - m_new);
        m_run[g] = m_new;
#if !SOFTMAX_SPREAD
        float sum = 0.0f;
        for (int j = 0; j < nk; ++j) {
            const float p = (m_new == -INFINITY) ? 0.0f : exp(ps[g * TK + j] - m_new);
            ps[g * TK + j] = p;
            sum += p;
        }
        l_run[g] = l_run[g] * alpha[g] + sum;
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#if SOFTMAX_SPREAD
    for (int i0 = 0; i0 < GT * TK; i0 += WG) {
        const int i = i0 + lid, g = i / TK, j = rem_of(i, g, TK);
        if (i >= GT * TK) break;
        const float m = m_run[g];
        if (j < nk) ps[i] = (m == -INFINITY) ? 0.0f : exp(ps[i] - m);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int g0 = 0; g0 < GT; g0 += WG) { /* the sums: no barrier before the P V step, which does not read them */
        const int g = g0 + lid;
        if (g >= GT) break;
        float sum = 0.0f;
        for (int j = 0; j < nk; ++j) sum += ps[g * TK + j];
        l_run[g] = l_run[g] * alpha[g] + sum;
    }
#endif
    accumulate_pv(ATTN_SMEM, acc, nk, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* One key tile of nk keys, already in ks / vs: the scores (keys past nk
 * masked), then attend_scores. Ends with a barrier. */
inline void attend_tile(ATTN_SMEM_PARAMS, float acc[ACC_N], int nk, float scale, int lid)
{
    for (int it = lid; it < GT / TILE_SR * TILE_COLS; it += WG) {
        int j0, key[2];
        float dot[2][2];
        const int g0 = score_tile_qk(qs, ks, it, TILE_COLS, TILE_SR, TILE_SC, nk, &j0, key, dot);
        for (int r = 0; r < TILE_SR; ++r)
            for (int c = 0; c < TILE_SC; ++c) {
                const int j = j0 + c * TILE_COLS;
                ps[(g0 + r) * TK + j] = j < nk ? dot[r][c] * scale : -INFINITY;
            }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    attend_scores(ATTN_SMEM, acc, nk, lid);
}

/* Attends to keys key0 .. key0+n-1 of a [.., keys, .., dim] strided view:
 * key r's element c is at k_base + r*k_rs + c*k_cs (same for v). */
inline void attend_range(ATTN_SMEM_PARAMS, float acc[ACC_N], float scale, int lid,
                         __global const store_t *k, idx_t k_base, idx_t k_rs, idx_t k_cs,
                         __global const store_t *v, idx_t v_base, idx_t v_rs, idx_t v_cs,
                         int key0, int n)
{
    for (int k0 = 0; k0 < n; k0 += TK) {
        int nk = min(TK, n - k0);
        idx_t r = (idx_t)(key0 + k0);
        load_tile(ks, KPAD(DK), nk, DK, k, k_base + r * k_rs, k_rs, k_cs, lid, WG);
        load_tile(vs, VPAD, nk, DV, v, v_base + r * v_rs, v_rs, v_cs, lid, WG);
        barrier(CLK_LOCAL_MEM_FENCE);
        attend_tile(ATTN_SMEM, acc, nk, scale, lid);
    }
}

/* Normalized output of row g (0 when the row saw nothing) and its lse. */
inline float attn_out(ATTN_SMEM_PARAMS, float acc_i, int g)
{
    float l = l_run[g];
    return l > 0.0f ? acc_i / l : 0.0f;
}

inline float attn_lse(ATTN_SMEM_PARAMS, int g)
{
    float l = l_run[g];
    return l > 0.0f ? m_run[g] + log(l) : -INFINITY;
}
