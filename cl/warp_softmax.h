/*
 * warp_softmax.h: one step of the online softmax on a warp's mma C
 * fragments (warp_mma.h's layout: s[4 nb + 2 r + e] is row gq + 8 r,
 * column 8 nb + 2 t + e of a chunk of KC keys), shared by the warp kernels
 * (warp_attn.h) and the warpgroup kernel (nsa_cmp_topk_wgmma.cl, whose
 * m64 accumulators give each warp its 16 rows in the same layout).
 *
 * Defines: KC (keys per chunk, a multiple of 16).
 * Per lane, for the rows it holds (gq, gq + 8): the running max m (log2
 * units) and the lane's part of the running sum l.
 */

/* Masks chunk columns n and later (-inf) of the scores, not yet scaled,
 * and returns the row maxima of the lane's values (the scale rides in the
 * exponentials: warp_softmax_scaled). */
inline void warp_mask(float *s, int n, float *mx)
{
    const int t = lane_id() & 3;
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < KC / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int j = 8 * nb + 2 * t + e;
            const float s0 = j < n ? s[4 * nb + e] : -INFINITY;
            const float s1 = j < n ? s[4 * nb + 2 + e] : -INFINITY;
            s[4 * nb + e] = s0;
            s[4 * nb + 2 + e] = s1;
            mx[0] = fmax(mx[0], s0);
            mx[1] = fmax(mx[1], s1);
        }
}

/* The online-softmax step of one chunk of masked scores (log2 units, the
 * lane's row maxima in mx): updates m and the lane's part of l, turns s
 * into probabilities and gives each row's rescale factor. The running max
 * moves only when some row of the warp passes its own by more than
 * RESCALE_SLACK (log2 units), and then for every row: in between, P may
 * reach 2^RESCALE_SLACK, harmless in f32 and in the 16-bit P (the final
 * 1/l undoes it), and the warp skips rescaling its accumulators, which
 * after the first chunks is nearly always. Returns whether the max moved
 * (the same for the whole warp; alpha is 1 otherwise). */
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 8.0f
#endif
/* warp_softmax_scaled: the same step on the scores s * sl, s masked
 * unscaled (warp_mask) and mx then scaled (the max commutes with a positive scale), so
 * that the scale rides in each exponential's multiply-add instead of a
 * multiply an element (warp_softmax_masked, below);
 * warp_softmax is it with sl 1, for the block-sparse forward, whose
 * scores are already scaled and soft-capped (bs_warp_mask). */
inline bool warp_softmax_scaled(float *s, float sl, const float *mx, float *m, float *l, float *alpha,
                                __local uint *ws)
{
    float psum[2] = {0.0f, 0.0f}, rmax[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) rmax[r] = quad_max(mx[r], ws);
    const bool move = ballot(rmax[0] > m[0] + RESCALE_SLACK || rmax[1] > m[1] + RESCALE_SLACK, ws) != 0;
    /* A row whose max is still -inf has only -inf scores: subtracting 0
     * (base) instead gives its zeros from exp2 itself, with no test an
     * element. At 64k on the H100 (2026-12-06) nsa_cmp_topk_wgmma went
     * 5.15-5.21 -> 5.08-5.12 ms; nsa_fwd stayed at 14.89-14.97. */
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float m_new = move ? fmax(m[r], rmax[r]) : m[r];
        base[r] = m_new == -INFINITY ? 0.0f : m_new;
        /* Against base, not m_new: a row still at -inf gets 0 instead of
         * exp2(NaN), with no test of its own (its l and O are 0 either
         * way). nsa_fwd at 64k on the H100 (2026-12-07): 14.93-15.04 ->
         * 14.69-14.80 ms, and no spills (4 stores and loads before). */
        alpha[r] = exp2(m[r] - base[r]);
        m[r] = m_new;
    }
#pragma unroll
    for (int i = 0; i < KC / 2; ++i) {
        const int r = (i >> 1) & 1;
        const float p = exp2(s[i] * sl - base[r]);
        s[i] = p;
        psum[r] += p;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + psum[r];
    return move;
}
inline bool warp_softmax(float *s, const float *mx, float *m, float *l, float *alpha, __local uint *ws)
{
    return warp_softmax_scaled(s, 1.0f, mx, m, l, alpha, ws);
}

/* The online softmax step of a chunk of scores s (not yet scaled) whose
 * first n keys are visible: all of them but in a row's last chunks, so the
 * mask with n = KC, a call of its own, drops its compares and selects, and
 * the scale sl rides in the exponentials (warp_softmax_scaled). On H100s
 * (2026-12-07): nsa_cmp_topk_wgmma at 64k 4.82-4.85 -> 4.68-4.74 ms (the
 * mask alone 4.76-4.82, the scale alone 4.84; the whole softmax in two
 * calls, not only the mask, 5.14). The warp kernels' top-k takes it in
 * pass 1 and the same trick in pass 2 (nsa_topk_warp.h); the fused
 * forward, which runs pass 2 only, went 1.797-1.808 -> 1.787-1.792 ms at
 * 8k. warp_attn.h's chunks take it too, for one mechanism rather than for
 * speed: the forward given its selection at 64k 14.75-14.81 -> 14.74-14.75
 * ms, the fused one at 8k level (H100, 2026-12-07). */
inline bool warp_softmax_masked(float *s, float sl, int n, float *m, float *l, float *alpha, __local uint *ws)
{
    float mx[2];
    if (n >= KC) warp_mask(s, KC, mx);
    else warp_mask(s, n, mx);
    mx[0] *= sl;
    mx[1] *= sl;
    return warp_softmax_scaled(s, sl, mx, m, l, alpha, ws);
}

/* The A fragments of k-step kk of a product over the chunk's keys, from
 * score fragments p, rounded to the storage type. */
inline void p_afrag(const float *p, int kk, word_t *a, __local uint *ws)
{
    const float *p0 = p + 8 * kk, *p1 = p0 + 4;
    a[0] = pack_f32x2(p0[0], p0[1], ws);
    a[1] = pack_f32x2(p0[2], p0[3], ws);
    a[2] = pack_f32x2(p1[0], p1[1], ws);
    a[3] = pack_f32x2(p1[2], p1[3], ws);
}
