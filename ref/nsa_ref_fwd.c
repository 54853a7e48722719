/*
 * nsa_ref_fwd.c - full NSA forward: compression, top-k, the three branches
 * and the gated sum.  See nsa_ref.h, sections 1-6.
 */
#include "nsa_ref.h"

#include <stdlib.h>
#include <string.h>

/* out[r, c] += g[r] * x[r, c] for r < rows, c < D (g broadcast over D). */
static void add_gated(int64_t rows, int D, const double *g, const double *x,
                      double *out)
{
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < D; c++)
            out[r * D + c] += g[r] * x[r * D + c];
}

void ref_nsa_fwd(const ref_nsa_shape *sh, const ref_nsa_inputs *in,
                 const ref_nsa_outputs *out)
{
    const int B = sh->B, T = sh->T, HQ = sh->HQ, H = sh->H;
    const int DK = sh->DK, DV = sh->DV, S = sh->block_count;
    const int NC = ref_total_cmp(sh);
    const int64_t rows = (int64_t)B * T * HQ;       /* query rows */
    const int64_t nbi = (int64_t)B * T * H * S;     /* block index entries */

    /* 1. compressed keys / values */
    double *kc_own = NULL, *vc_own = NULL;
    const double *kc = in->k_cmp, *vc = in->v_cmp;
    if (!kc) {
        kc_own = ref_xcalloc((size_t)B * NC * H * DK, sizeof *kc_own);
        ref_compress_mean(sh, in->k, DK, kc_own);
        kc = kc_own;
    }
    if (!vc) {
        vc_own = ref_xcalloc((size_t)B * NC * H * DV, sizeof *vc_own);
        ref_compress_mean(sh, in->v, DV, vc_own);
        vc = vc_own;
    }

    /* 3. block selection */
    int *bi_own = NULL;
    const int *bi = in->block_indices;
    if (!bi) {
        bi_own = ref_xcalloc((size_t)nbi, sizeof *bi_own);
        ref_topk(sh, in->q, kc, in->block_counts, bi_own);
        bi = bi_own;
    }
    if (out->block_indices)
        memcpy(out->block_indices, bi, (size_t)nbi * sizeof *bi);

    /* 2, 4, 5. the branches (always computed; the gates decide) */
    double *o_cmp = out->o_cmp ? out->o_cmp
                               : ref_xcalloc((size_t)rows * DV, sizeof *o_cmp);
    double *o_slc = out->o_slc ? out->o_slc
                               : ref_xcalloc((size_t)rows * DV, sizeof *o_slc);
    double *o_swa = out->o_swa ? out->o_swa
                               : ref_xcalloc((size_t)rows * DV, sizeof *o_swa);
    ref_cmp_fwd(sh, in->q, kc, vc, o_cmp, out->lse_cmp);
    ref_slc_fwd(sh, in->q, in->k, in->v, bi, in->block_counts, o_slc,
                out->lse_slc);
    ref_swa_fwd(sh, in->q, in->k, in->v, o_swa, out->lse_swa);

    /* 6. gated sum */
    memset(out->o, 0, (size_t)rows * DV * sizeof *out->o);
    if (in->g_cmp)
        add_gated(rows, DV, in->g_cmp, o_cmp, out->o);
    if (in->g_slc)
        add_gated(rows, DV, in->g_slc, o_slc, out->o);
    if (in->g_swa)
        add_gated(rows, DV, in->g_swa, o_swa, out->o);

    if (!out->o_cmp)
        free(o_cmp);
    if (!out->o_slc)
        free(o_slc);
    if (!out->o_swa)
        free(o_swa);
    free(bi_own);
    free(kc_own);
    free(vc_own);
}
