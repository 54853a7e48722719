/*
 * nsa_ref_bwd.c - full NSA backward.  Recomputes the forward, then for every
 * gated branch b: dg_b += sum_c do * o_b, and the branch backward runs with
 * do_b = g_b * do.  The compressed branch's gradient flows into dk_cmp /
 * dv_cmp when those tensors were given, otherwise through mean pooling into
 * dk / dv.  No gradient flows through top-k.
 */
#include "nsa_ref.h"

#include <stdlib.h>

/* dob = g * do (g broadcast over D); dg += sum_c do * o (dg may be NULL). */
static void gate_split(int64_t rows, int D, const double *g, const double *do_,
                       const double *o, double *dob, double *dg)
{
    for (int64_t r = 0; r < rows; r++) {
        double acc = 0.0;
        for (int c = 0; c < D; c++) {
            dob[r * D + c] = g[r] * do_[r * D + c];
            acc += do_[r * D + c] * o[r * D + c];
        }
        if (dg)
            dg[r] += acc;
    }
}

void ref_nsa_bwd(const ref_nsa_shape *sh, const ref_nsa_inputs *in,
                 const double *do_, const ref_nsa_grads *gr)
{
    const int B = sh->B, T = sh->T, HQ = sh->HQ, H = sh->H;
    const int DK = sh->DK, DV = sh->DV, S = sh->block_count;
    const int NC = ref_total_cmp(sh);
    const int64_t rows = (int64_t)B * T * HQ;
    const size_t nkc = (size_t)B * NC * H * DK, nvc = (size_t)B * NC * H * DV;

    /* recompute the forward: branch outputs and the block indices used */
    double *o = ref_xcalloc((size_t)rows * DV, sizeof *o);
    double *o_cmp = ref_xcalloc((size_t)rows * DV, sizeof *o_cmp);
    double *o_slc = ref_xcalloc((size_t)rows * DV, sizeof *o_slc);
    double *o_swa = ref_xcalloc((size_t)rows * DV, sizeof *o_swa);
    int *bi = ref_xcalloc((size_t)B * T * H * S, sizeof *bi);
    ref_nsa_outputs fw = {o, o_cmp, o_slc, o_swa, NULL, NULL, NULL, bi};
    ref_nsa_fwd(sh, in, &fw);

    double *dob = ref_xcalloc((size_t)rows * DV, sizeof *dob);

    if (in->g_cmp) {
        double *kc_own = NULL, *vc_own = NULL;
        const double *kc = in->k_cmp, *vc = in->v_cmp;
        if (!kc) {
            kc_own = ref_xcalloc(nkc, sizeof *kc_own);
            ref_compress_mean(sh, in->k, DK, kc_own);
            kc = kc_own;
        }
        if (!vc) {
            vc_own = ref_xcalloc(nvc, sizeof *vc_own);
            ref_compress_mean(sh, in->v, DV, vc_own);
            vc = vc_own;
        }
        double *dkc = ref_xcalloc(nkc, sizeof *dkc);
        double *dvc = ref_xcalloc(nvc, sizeof *dvc);

        gate_split(rows, DV, in->g_cmp, do_, o_cmp, dob, gr->dg_cmp);
        ref_cmp_bwd(sh, in->q, kc, vc, dob, gr->dq, dkc, dvc);

        if (in->k_cmp) {
            if (gr->dk_cmp)
                for (size_t i = 0; i < nkc; i++)
                    gr->dk_cmp[i] += dkc[i];
        } else if (gr->dk) {
            ref_compress_mean_bwd(sh, dkc, DK, gr->dk);
        }
        if (in->v_cmp) {
            if (gr->dv_cmp)
                for (size_t i = 0; i < nvc; i++)
                    gr->dv_cmp[i] += dvc[i];
        } else if (gr->dv) {
            ref_compress_mean_bwd(sh, dvc, DV, gr->dv);
        }
        free(dkc);
        free(dvc);
        free(kc_own);
        free(vc_own);
    }
    if (in->g_slc) {
        gate_split(rows, DV, in->g_slc, do_, o_slc, dob, gr->dg_slc);
        ref_slc_bwd(sh, in->q, in->k, in->v, bi, in->block_counts, dob, gr->dq,
                    gr->dk, gr->dv);
    }
    if (in->g_swa) {
        gate_split(rows, DV, in->g_swa, do_, o_swa, dob, gr->dg_swa);
        ref_swa_bwd(sh, in->q, in->k, in->v, dob, gr->dq, gr->dk, gr->dv);
    }

    free(dob);
    free(o);
    free(o_cmp);
    free(o_slc);
    free(o_swa);
    free(bi);
}
