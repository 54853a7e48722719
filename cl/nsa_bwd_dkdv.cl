/*
 * nsa_bwd_dkdv.cl: dk and dv of one NSA branch, owned by the keys: one
 * work-group per tile of TKK keys of one KV head (nsa_dkdv.h) walks every
 * query row that sees those keys (all G heads of the group per query token)
 * and keeps the tile's dk/dv in registers, so each is written once, with no
 * atomics. Per chunk of RQ query rows (token, head):
 *   p = exp(scale q.k - lse), dp = g do.v, ds = p (dp - D),
 *   dv += p g do, dk += scale ds q.
 * Output: f32 partial sums, written (ACCUM 0) or added (ACCUM 1) in place,
 * [B, rows, H, D] dense; the tokens' final dk/dv are finished by
 * nsa_grad_finish (nsa_compress.cl), which adds the compressed branch.
 *
 * A tile with many rows (the compressed branch's; the selected branch's
 * heavy blocks, nsa_dkdv.h) would keep one work-group busy long after the
 * others finish: NSPLIT > 1 splits its rows, each group writing its part's
 * sums to its own slice ([NSPLIT][B, rows, H, D]), which nsa_dkdv_sum.cl
 * adds in split order.
 *
 * DS_KEEP (the selected branch): the pass also writes each row's dS at
 * ds + ds0 (nsa_ranges.h's layout), which dq then reads instead of
 * recomputing p and dp, two of its three products.
 *
 * Defines (besides nsa_dkdv.h): WG, DK, DV, TKK, RQ, DK_N = ceil(TKK*DK/WG),
 * DV_N = ceil(TKK*DV/WG), ACCUM, NSPLIT, DS_KEEP and KSP.
 * NDRange: (WG * tiles * NSPLIT, H, B).
 */
#if DS_KEEP && BRANCH != 1
#error "the portable dk/dv pass keeps the selected branch's dS only"
#endif

/* Query rows a work-item takes per key in the scores: two where the chunk
 * has two pairs per work-item, so that each read of the key tiles, which
 * are padded and so read one float at a time (the unpadded q and do rows
 * four at once), feeds both rows' products. */
#define SCORE_ROWS (RQ % 2 == 0 && RQ * TKK >= 2 * WG ? 2 : 1)

#define DV_ONE_COL (WG % DV == 0)
#define DK_ONE_COL (WG % DK == 0)
/* dk's and dv's outputs in 4 x 4 blocks (4 keys by 4 columns) a work-item
 * where they are 16 a work-item (common.h's accumulate_block): per row
 * one float4 each of p, dS, do and q for 32 products */
#define DKDV_BLOCK (DK == DV && BLOCK_OF(TKK, DK, WG))

/* Output element i of work-item lid (dk's and dv's alike): its key *j
 * and column *d; false where it lies past the tile. */
inline bool dkdv_elem(int i, int lid, int dim, int *j, int *d)
{
    return tile_elem(DKDV_BLOCK, i, lid, WG, TKK, dim, j, d);
}

/* dv += P^T (g do) and dk += scale dS^T Q over the chunk's RQ rows, each
 * sum in row order. The rows run outermost, so that a work-item's outputs
 * of one column (WG a multiple of the head dim) share each read of a do or
 * q element: with the rows innermost every product took two local reads. */
inline void accumulate_dkdv(__local const float *pp, __local const float *dss, __local const float *qs,
                            __local const float *dos, float *dka, float *dva, float scale, int lid)
{
    float a[DK_N];
#if DKDV_BLOCK
    int j0, d0;
    dkdv_elem(0, lid, DK, &j0, &d0);
    for (int i = 0; i < 16; ++i) a[i] = 0.0f;
    accumulate_block(pp, TKK, j0, false, dos, DV, d0, dva, RQ);
    accumulate_block(dss, TKK, j0, false, qs, DK, d0, a, RQ);
    for (int i = 0; i < 16; ++i) dka[i] = fma(scale, a[i], dka[i]);
#elif WG == DV && WG == DK && TKK % 4 == 0
    /* work-item lid owns column lid of every key's dv and dk, so its
     * outputs' keys are 0 .. TKK-1 in order, and a row's probabilities
     * and dS are read four at a time, one read for the whole warp */
    for (int i = 0; i < TKK; ++i) a[i] = 0.0f;
    for (int r = 0; r < RQ; ++r) {
        const float dov = dos[r * DV + lid], qv = qs[r * DK + lid];
        for (int i = 0; i < TKK; i += 4) {
            const float4 p4 = *(__local const float4 *)(pp + r * TKK + i);
            const float4 s4 = *(__local const float4 *)(dss + r * TKK + i);
            dva[i] = fma(p4.x, dov, dva[i]);
            dva[i + 1] = fma(p4.y, dov, dva[i + 1]);
            dva[i + 2] = fma(p4.z, dov, dva[i + 2]);
            dva[i + 3] = fma(p4.w, dov, dva[i + 3]);
            a[i] = fma(s4.x, qv, a[i]);
            a[i + 1] = fma(s4.y, qv, a[i + 1]);
            a[i + 2] = fma(s4.z, qv, a[i + 2]);
            a[i + 3] = fma(s4.w, qv, a[i + 3]);
        }
    }
    for (int i = 0; i < TKK; ++i) dka[i] = fma(scale, a[i], dka[i]);
#else
    int vkey[DV_N], vcol[DV_N], kkey[DK_N], kcol[DK_N]; /* each output's key j and column d */
    for (int i = 0; i < DV_N; ++i) dkdv_elem(i, lid, DV, &vkey[i], &vcol[i]);
    for (int i = 0; i < DK_N; ++i) {
        dkdv_elem(i, lid, DK, &kkey[i], &kcol[i]);
        a[i] = 0.0f;
    }
    for (int r = 0; r < RQ; ++r) {
        const float dov = dos[r * DV + vcol[0]], qv = qs[r * DK + kcol[0]];
        for (int i = 0; i < DV_N; ++i)
            if (lid + i * WG < TKK * DV)
                dva[i] = fma(pp[r * TKK + vkey[i]], DV_ONE_COL ? dov : dos[r * DV + vcol[i]], dva[i]);
        for (int i = 0; i < DK_N; ++i)
            if (lid + i * WG < TKK * DK) a[i] = fma(dss[r * TKK + kkey[i]], DK_ONE_COL ? qv : qs[r * DK + kcol[i]], a[i]);
    }
    for (int i = 0; i < DK_N; ++i)
        if (lid + i * WG < TKK * DK) dka[i] = fma(scale, a[i], dka[i]);
#endif
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void nsa_bwd_dkdv(DKDV_ARGS DKDV_DS_ARGS)
{
    /* the q and do rows unpadded, so 16-byte aligned: the score loop reads
     * them four floats at a time (padded as the key tiles, the pass took
     * 139.5 ms where it takes 121.9 at 16k on the H100) */
    __local float qs[RQ * DK] LOCAL_TILE, dos[RQ * DV] LOCAL_TILE, ks[TKK * KPAD(DK)] LOCAL_TILE;
    __local float vs[TKK * KPAD(DV)] LOCAL_TILE, pp[RQ * TKK] LOCAL_TILE, dss[RQ * TKK] LOCAL_TILE;
    __local float row_lse[RQ], row_d[RQ], row_g[RQ];
    __local int row_tok[RQ], kpos[TKK], kstart[TKK], kend[TKK];
    __local idx_t row_q[RQ], row_do[RQ]; /* the rows' q and do (-1: none) */
#if DS_KEEP
    __local long row_ds[RQ]; /* the rows' kept dS regions (-1: none) */
#endif
    const int lid = get_local_id(0), h = get_group_id(1), b = get_group_id(2);
    const int H = get_num_groups(1);
    cu += cu0;
    cmp_off += cmp_off0;
    lst += lst0;
    lst_start += lst_start0;
    const int split = get_group_id(0) % NSPLIT;
    const dkdv_tile kt = dkdv_tile_of(get_group_id(0) / NSPLIT, b, h, H, T, nrows_k, cu, nseq, cmp_off, lst_start, nblk);
    const int nk = kt.nk, key0 = kt.key0;
#if DS_KEEP
    const int kb = kt.kp0 % BS; /* key 0's place in its block */
#endif
    const bool q_vec = (q_off | q_st.x | q_st.y | q_st.z) % 8 == 0;
    const bool do_vec = (do_off | do_st.x | do_st.y | do_st.z) % 8 == 0;
    for (int j = lid; j < TKK; j += WG) {
        const int3 ki = j < nk ? dkdv_key(kt, j, b, T, cu, nseq, cmp_off) : (int3)(0);
        kpos[j] = ki.x;
        kstart[j] = ki.y;
        kend[j] = ki.z;
    }
    load_tile(ks, KPAD(DK), nk, DK, k, at4(k_off, k_st, b, key0, h, 0), k_st.y, k_st.w, lid, WG);
    load_tile(vs, KPAD(DV), nk, DV, v, at4(v_off, v_st, b, key0, h, 0), v_st.y, v_st.w, lid, WG);
    barrier(CLK_LOCAL_MEM_FENCE);

    float dka[DK_N], dva[DV_N];
    for (int i = 0; i < DK_N; ++i) dka[i] = 0.0f;
    for (int i = 0; i < DV_N; ++i) dva[i] = 0.0f;

    /* this split's rows: whole chunks of RQ, so no chunk is shared */
    const int nrows = dkdv_rows(kt), per = (nrows + RQ * NSPLIT - 1) / (RQ * NSPLIT) * RQ;
    const int r_end = min(nrows, (split + 1) * per);
    for (int r0 = split * per; r0 < r_end; r0 += RQ) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = lid; r < RQ; r += WG) {
            const int rr = r0 + r, e = dkdv_row_entry(kt, rr, lst), tok = dkdv_entry_token(kt, rr, e);
            row_tok[r] = tok;
            const int hq = h * G + (rr % G);
            row_lse[r] = tok >= 0 ? lse[at4(l_off, l_st, b, tok, hq, 0)] : -INFINITY;
            row_d[r] = tok >= 0 ? dlt[at4(x_off, x_st, b, tok, hq, 0)] : 0.0f;
            row_g[r] = tok >= 0 ? LOAD(gate, at4(g_off, g_st, b, tok, hq, 0)) : 0.0f;
            row_q[r] = tok >= 0 ? at4(q_off, q_st, b, tok, hq, 0) : -1;
            row_do[r] = tok >= 0 ? at4(do_off, do_st, b, tok, hq, 0) : -1;
#if DS_KEEP
            row_ds[r] = tok >= 0 ? ds0 + ds_slot_region(b, tok, h, H, T, dkdv_entry_slot(e)) : -1;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        gather_rows(qs, DK, RQ, DK, q, row_q, q_st.w, q_vec, row_g, false, lid, WG);
        gather_rows(dos, DV, RQ, DV, dout, row_do, do_st.w, do_vec, row_g, true, lid, WG); /* g do */
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int it = lid; it < RQ / SCORE_ROWS * TKK; it += WG) {
            const int rt = it / TKK, j = rem_of(it, rt, TKK), r0s = rt * SCORE_ROWS;
            bool on[SCORE_ROWS], any = false;
            for (int u = 0; u < SCORE_ROWS; ++u) {
                const int r = r0s + u, tok = row_tok[r];
                on[u] = j < nk && tok >= 0 && row_lse[r] != -INFINITY && sees(tok, kpos[j], kstart[j], kend[j]);
                any = any || on[u];
            }
            const int key[2] = {min(j, nk - 1), 0};
            float s[2][2] = {{0.0f}}, dp[2][2] = {{0.0f}};
            if (any) {
                dot_tile(qs, DK, r0s, ks, KPAD(DK), key, DK, SCORE_ROWS, 1, s);
                dot_tile(dos, DV, r0s, vs, KPAD(DV), key, DV, SCORE_ROWS, 1, dp);
            }
            for (int u = 0; u < SCORE_ROWS; ++u) {
                const int r = r0s + u;
                const float p = on[u] ? exp(s[u][0] * scale - row_lse[r]) : 0.0f;
                const float dsv = on[u] ? p * (dp[u][0] - row_d[r]) : 0.0f;
                pp[r * TKK + j] = p;
                dss[r * TKK + j] = dsv;
#if DS_KEEP
                if (j < nk && row_ds[r] >= 0) STORE(ds, row_ds[r] + ds_elem(kb + j, dkdv_row_head(r0 + r)), dsv);
#endif
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        accumulate_dkdv(pp, dss, qs, dos, dka, dva, scale, lid);
    }

    /* dense [B, nrows_k, H, D] f32, this split's slice; the heavy pass's
     * rows are the heavy blocks' keys in order (nrows_k of them) */
    const idx_t slice = (idx_t)split * get_num_groups(2) * nrows_k * H;
    const int krow0 = HEAVY_PASS ? (int)(get_group_id(0) / NSPLIT) * TKK : key0;
    for (int i = 0; i < DK_N; ++i) {
        int j, d;
        if (dkdv_elem(i, lid, DK, &j, &d) && j < nk) {
            idx_t at = dk0 + (slice + ((idx_t)b * nrows_k + krow0 + j) * H + h) * DK + d;
            dk[at] = ADD_IN_PLACE ? dk[at] + dka[i] : dka[i];
        }
    }
    for (int i = 0; i < DV_N; ++i) {
        int j, d;
        if (dkdv_elem(i, lid, DV, &j, &d) && j < nk) {
            idx_t at = dv0 + (slice + ((idx_t)b * nrows_k + krow0 + j) * H + h) * DV + d;
            dv[at] = ADD_IN_PLACE ? dv[at] + dva[i] : dva[i];
        }
    }
}
