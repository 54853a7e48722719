/*
 * nsa_bwd_dkdv.cl: dk and dv of one NSA branch, owned by the keys: one
 * work-group per tile of TKK keys of one KV head walks every query row that
 * sees those keys (all G heads of the group per query token) and keeps the
 * tile's dk/dv in registers, so each is written once, with no atomics.
 *   BRANCH 0 (compressed): keys are compressed rows; the queries are the
 *            tokens from the first that sees the tile to the sequence end.
 *   BRANCH 1 (selected): keys are a selection block (a sub-tile of it); the
 *            queries are the block's inverted list (nsa_select_index.cl),
 *            in token order.
 *   BRANCH 2 (window): keys are a token tile; the queries are the next
 *            WINDOW tokens of each key.
 * Per chunk of RQ query rows (token, head):
 *   p = exp(scale q.k - lse), dp = g do.v, ds = p (dp - D),
 *   dv += p g do, dk += scale ds q.
 * Output: f32 partial sums, written (ACCUM 0) or added (ACCUM 1) in place,
 * [B, rows, H, D] dense; the tokens' final dk/dv are finished by
 * nsa_grad_finish (nsa_compress.cl), which adds the compressed branch.
 *
 * Defines: WG, G, DK, DV, TKK, RQ, DK_N = ceil(TKK*DK/WG),
 * DV_N = ceil(TKK*DV/WG), BRANCH, ACCUM, BS, S, CMP_L, CMP_D, WINDOW, VARLEN.
 * With BRANCH 1 and VARLEN, `cmp_off` holds the selection-block offsets.
 * NDRange: (WG * tiles, H, B).
 */

#define DKV_SMEM_PARAMS                                                                          \
    __local float *qs, __local float *dos, __local float *ks, __local float *vs, __local float *pp, \
        __local float *dss, __local float *row_lse, __local float *row_d, __local int *row_tok
#define DKV_SMEM qs, dos, ks, vs, pp, dss, row_lse, row_d, row_tok

/* The keys of this tile: key j is row key0 + j of the key tensor, at local
 * position kpos[j] of sequence kseq[j] (bounds of the sequence in token
 * index: [kstart, kend)). */
typedef struct {
    int key0, nk;
} key_tile;

/* Is key j (local position kp, sequence [ks_, ke_)) seen by token t? */
inline bool sees(int t, int kp, int ks_, int ke_)
{
    if (t < ks_ || t >= ke_) return false;
    const int tl = t - ks_;
#if BRANCH == 0
    return kp * CMP_D + CMP_L - 1 <= tl; /* kp is the compressed index */
#elif BRANCH == 1
    return kp <= tl;
#else
    return kp <= tl && tl - kp < WINDOW;
#endif
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void nsa_bwd_dkdv(
    __global const store_t *q, idx_t q_off, idx4_t q_st,
    __global const store_t *k, idx_t k_off, idx4_t k_st,   /* keys: k, or k_cmp */
    __global const store_t *v, idx_t v_off, idx4_t v_st,
    int nrows_k, /* key rows per batch row: T, or the compressed rows */
    __global const store_t *gate, idx_t g_off, idx4_t g_st,
    __global const int *cu, idx_t cu0, int nseq, __global const int *cmp_off, idx_t cmp_off0,
    __global const int *lst, idx_t lst0, __global const int *lst_start, idx_t lst_start0, int nblk,
    __global const store_t *dout, idx_t do_off, idx4_t do_st,
    __global const float *lse, idx_t l_off, idx4_t l_st,
    __global const float *dlt, idx_t x_off, idx4_t x_st,
    __global float *dk, idx_t dk0, __global float *dv, idx_t dv0,
    int T, float scale)
{
    __local float qs[RQ * DK], dos[RQ * DV], ks[TKK * KPAD(DK)], vs[TKK * KPAD(DV)], pp[RQ * TKK], dss[RQ * TKK];
    __local float row_lse[RQ], row_d[RQ];
    __local int row_tok[RQ], kpos[TKK], kstart[TKK], kend[TKK];
    const int lid = get_local_id(0), h = get_group_id(1), b = get_group_id(2);
    const int H = get_num_groups(1);
    cu += cu0;
    cmp_off += cmp_off0;
    lst += lst0;
    lst_start += lst_start0;
    (void)lst; (void)lst_start; (void)nblk; (void)cmp_off;

    /* --- which keys, and which query tokens [q_lo, q_hi) or list */
#if BRANCH == 1
    /* group x = block * NSUB + sub-tile; blocks are numbered per sequence
     * through cmp_off (here: the selection-block offsets) */
    const int NSUB = (BS + TKK - 1) / TKK;
    const int blk = get_group_id(0) / NSUB, sub = get_group_id(0) % NSUB;
#if VARLEN
    int s_id = 0;
    {
        int lo = 0, hi = nseq - 1; /* largest s with cmp_off[s] <= blk */
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (cmp_off[mid] <= blk) lo = mid; else hi = mid - 1;
        }
        s_id = lo;
    }
    const int s_start = clamp(cu[s_id], 0, T), s_end = clamp(cu[s_id + 1], s_start, T);
    const int jblk = blk - cmp_off[s_id];
    const bool valid_blk = blk < cmp_off[nseq];
#else
    const int s_start = 0, s_end = T, jblk = blk;
    const bool valid_blk = blk < nblk;
#endif
    const int kp0 = jblk * BS + sub * TKK; /* local position of key 0 */
    const int nk = valid_blk ? clamp(min(BS - sub * TKK, TKK), 0, max(0, s_end - s_start - kp0)) : 0;
    const int key0 = s_start + kp0;
    const idx_t lbase = ((idx_t)b * H + h) * (nblk + 1);
    const int q_lo = valid_blk ? lst_start[lbase + blk] : 0, q_hi = valid_blk ? lst_start[lbase + blk + 1] : 0;
    const idx_t lrow = ((idx_t)b * H + h) * (idx_t)T * S;
#else
    const int key0 = get_group_id(0) * TKK;
    const int nk = clamp(nrows_k - key0, 0, TKK);
#endif
    for (int j = lid; j < TKK; j += WG) {
        int kp = 0, ks_ = 0, ke_ = 0;
        if (j < nk) {
#if BRANCH == 1
            kp = kp0 + j;
            ks_ = s_start;
            ke_ = s_end;
#elif BRANCH == 0
#if VARLEN
            int r = key0 + j, lo = 0, hi = nseq - 1;
            while (lo < hi) {
                int mid = (lo + hi + 1) >> 1;
                if (cmp_off[mid] <= r) lo = mid; else hi = mid - 1;
            }
            ks_ = clamp(cu[lo], 0, T);
            ke_ = clamp(cu[lo + 1], ks_, T);
            kp = r - cmp_off[lo];
#else
            kp = key0 + j;
            ks_ = 0;
            ke_ = T;
#endif
#else
            seq_info sk = seq_of(cu, nseq, b, key0 + j, T);
            ks_ = sk.start;
            ke_ = sk.start + sk.len;
            kp = key0 + j - sk.start;
#endif
        }
        kpos[j] = kp;
        kstart[j] = ks_;
        kend[j] = ke_;
    }
    load_tile(ks, KPAD(DK), nk, DK, k, at4(k_off, k_st, b, key0, h, 0), k_st.y, k_st.w, lid, WG);
    load_tile(vs, KPAD(DV), nk, DV, v, at4(v_off, v_st, b, key0, h, 0), v_st.y, v_st.w, lid, WG);
    barrier(CLK_LOCAL_MEM_FENCE);
#if BRANCH != 1
    /* query tokens: from the first that sees key 0 to the end of the last
     * key's sequence (bounded by the window) */
    int q_lo = T, q_hi = 0;
    if (nk > 0) {
#if BRANCH == 0
        q_lo = kstart[0] + kpos[0] * CMP_D + CMP_L - 1;
        q_hi = kend[nk - 1];
#else
        q_lo = key0;
        q_hi = min(kend[nk - 1], key0 + nk - 1 + WINDOW);
#endif
    }
    q_hi = max(q_hi, q_lo);
#endif

    float dka[DK_N], dva[DV_N];
    for (int i = 0; i < DK_N; ++i) dka[i] = 0.0f;
    for (int i = 0; i < DV_N; ++i) dva[i] = 0.0f;

    const int nrows = (q_hi - q_lo) * G;
    for (int r0 = 0; r0 < nrows; r0 += RQ) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = lid; r < RQ; r += WG) {
            int rr = r0 + r, tok = -1;
            if (rr < nrows) {
#if BRANCH == 1
                tok = lst[lrow + q_lo + rr / G];
#else
                tok = q_lo + rr / G;
#endif
            }
            row_tok[r] = tok;
            const int hq = h * G + (rr % G);
            row_lse[r] = tok >= 0 ? lse[at4(l_off, l_st, b, tok, hq, 0)] : -INFINITY;
            row_d[r] = tok >= 0 ? dlt[at4(x_off, x_st, b, tok, hq, 0)] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = lid; i < RQ * DK; i += WG) {
            int r = i / DK, d = i - r * DK, tok = row_tok[r];
            qs[i] = tok >= 0 ? LOAD(q, at4(q_off, q_st, b, tok, h * G + (r0 + r) % G, d)) : 0.0f;
        }
        for (int i = lid; i < RQ * DV; i += WG) {
            int r = i / DV, d = i - r * DV, tok = row_tok[r], hq = h * G + (r0 + r) % G;
            dos[i] = tok >= 0 ? LOAD(gate, at4(g_off, g_st, b, tok, hq, 0)) *
                                    LOAD(dout, at4(do_off, do_st, b, tok, hq, d))
                              : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int idx = lid; idx < RQ * TKK; idx += WG) {
            int r = idx / TKK, j = idx - r * TKK, tok = row_tok[r];
            float p = 0.0f, ds = 0.0f;
            if (j < nk && tok >= 0 && row_lse[r] != -INFINITY && sees(tok, kpos[j], kstart[j], kend[j])) {
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < DK; ++d) s = fma(qs[r * DK + d], ks[j * KPAD(DK) + d], s);
                for (int d = 0; d < DV; ++d) dp = fma(dos[r * DV + d], vs[j * KPAD(DV) + d], dp);
                p = exp(s * scale - row_lse[r]);
                ds = p * (dp - row_d[r]);
            }
            pp[idx] = p;
            dss[idx] = ds;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = 0; i < DV_N; ++i) {
            int idx = lid + i * WG;
            if (idx < TKK * DV) {
                int j = idx / DV, d = idx - j * DV;
                float a = dva[i];
                for (int r = 0; r < RQ; ++r) a = fma(pp[r * TKK + j], dos[r * DV + d], a);
                dva[i] = a;
            }
        }
        for (int i = 0; i < DK_N; ++i) {
            int idx = lid + i * WG;
            if (idx < TKK * DK) {
                int j = idx / DK, d = idx - j * DK;
                float a = 0.0f;
                for (int r = 0; r < RQ; ++r) a = fma(dss[r * TKK + j], qs[r * DK + d], a);
                dka[i] = fma(scale, a, dka[i]);
            }
        }
    }

    /* dense [B, nrows_k, H, D] f32 */
    for (int i = 0; i < DK_N; ++i) {
        int idx = lid + i * WG, j = idx / DK, d = idx - j * DK;
        if (idx < TKK * DK && j < nk) {
            idx_t at = dk0 + (((idx_t)b * nrows_k + key0 + j) * H + h) * DK + d;
            dk[at] = ACCUM ? dk[at] + dka[i] : dka[i];
        }
    }
    for (int i = 0; i < DV_N; ++i) {
        int idx = lid + i * WG, j = idx / DV, d = idx - j * DV;
        if (idx < TKK * DV && j < nk) {
            idx_t at = dv0 + (((idx_t)b * nrows_k + key0 + j) * H + h) * DV + d;
            dv[at] = ACCUM ? dv[at] + dva[i] : dva[i];
        }
    }
}
