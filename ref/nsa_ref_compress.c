/*
 * nsa_ref_compress.c - key / value compression (mean pooling and linear),
 * forward and backward.  See nsa_ref.h, section 1.
 */
#include "nsa_ref.h"

#include <stddef.h>

/* Offset of element (b, t, h, c) of a [B, T, H, D] tensor. */
static int64_t at4(int b, int t, int h, int c, int T, int H, int D)
{
    return (((int64_t)b * T + t) * H + h) * D + c;
}

/* Number of real tokens covered by compressed token i of a sequence of
 * length len: local positions [i*d, min(i*d + l, len)). */
static int covered(int i, int l, int d, int len)
{
    int lo = i * d, hi = i * d + l;
    if (hi > len)
        hi = len;
    return hi > lo ? hi - lo : 0;
}

void ref_compress_mean(const ref_nsa_shape *sh, const double *x, int D,
                       double *xc)
{
    const int T = sh->T, H = sh->H, NC = ref_total_cmp(sh);
    const int l = ref_cmp_block(sh), d = ref_cmp_stride(sh);
    for (int s = 0; s < ref_num_seqs(sh); s++) {
        ref_seq sq = ref_get_seq(sh, s);
        for (int i = 0; i < sq.nc; i++) {
            int cnt = covered(i, l, d, sq.len); /* >= 1 since i*d < len */
            for (int h = 0; h < H; h++) {
                double *out = xc + at4(sq.b, sq.cstart + i, h, 0, NC, H, D);
                for (int c = 0; c < D; c++)
                    out[c] = 0.0;
                for (int j = 0; j < cnt; j++) {
                    const double *in =
                        x + at4(sq.b, sq.start + i * d + j, h, 0, T, H, D);
                    for (int c = 0; c < D; c++)
                        out[c] += in[c];
                }
                for (int c = 0; c < D; c++)
                    out[c] /= cnt;
            }
        }
    }
}

void ref_compress_mean_bwd(const ref_nsa_shape *sh, const double *dxc, int D,
                           double *dx)
{
    const int T = sh->T, H = sh->H, NC = ref_total_cmp(sh);
    const int l = ref_cmp_block(sh), d = ref_cmp_stride(sh);
    for (int s = 0; s < ref_num_seqs(sh); s++) {
        ref_seq sq = ref_get_seq(sh, s);
        for (int i = 0; i < sq.nc; i++) {
            int cnt = covered(i, l, d, sq.len);
            for (int h = 0; h < H; h++) {
                const double *g =
                    dxc + at4(sq.b, sq.cstart + i, h, 0, NC, H, D);
                for (int j = 0; j < cnt; j++) {
                    double *out =
                        dx + at4(sq.b, sq.start + i * d + j, h, 0, T, H, D);
                    for (int c = 0; c < D; c++)
                        out[c] += g[c] / cnt;
                }
            }
        }
    }
}

/* Linear compression of one compressed token:
 *   xc[c] = sum_{j < cnt} sum_e (x[i*d + j][e] + pe[j][e]) W[(j*D + e)*D + c]
 *           + bias[c]
 * where the l - cnt missing tokens past the sequence end contribute zero. */
void ref_compress_linear(const ref_nsa_shape *sh, const double *x, int D,
                         const double *W, const double *bias,
                         const double *pe, double *xc)
{
    const int T = sh->T, H = sh->H, NC = ref_total_cmp(sh);
    const int l = ref_cmp_block(sh), d = ref_cmp_stride(sh);
    for (int s = 0; s < ref_num_seqs(sh); s++) {
        ref_seq sq = ref_get_seq(sh, s);
        for (int i = 0; i < sq.nc; i++) {
            int cnt = covered(i, l, d, sq.len);
            for (int h = 0; h < H; h++) {
                double *out = xc + at4(sq.b, sq.cstart + i, h, 0, NC, H, D);
                for (int c = 0; c < D; c++)
                    out[c] = bias ? bias[c] : 0.0;
                for (int j = 0; j < cnt; j++) {
                    const double *in =
                        x + at4(sq.b, sq.start + i * d + j, h, 0, T, H, D);
                    for (int e = 0; e < D; e++) {
                        double xe = in[e] + (pe ? pe[(int64_t)j * D + e] : 0.0);
                        const double *wrow = W + ((int64_t)j * D + e) * D;
                        for (int c = 0; c < D; c++)
                            out[c] += xe * wrow[c];
                    }
                }
            }
        }
    }
}

void ref_compress_linear_bwd(const ref_nsa_shape *sh, const double *x, int D,
                             const double *W, const double *pe,
                             const double *dxc, double *dx, double *dW,
                             double *dbias, double *dpe)
{
    const int T = sh->T, H = sh->H, NC = ref_total_cmp(sh);
    const int l = ref_cmp_block(sh), d = ref_cmp_stride(sh);
    for (int s = 0; s < ref_num_seqs(sh); s++) {
        ref_seq sq = ref_get_seq(sh, s);
        for (int i = 0; i < sq.nc; i++) {
            int cnt = covered(i, l, d, sq.len);
            for (int h = 0; h < H; h++) {
                const double *g =
                    dxc + at4(sq.b, sq.cstart + i, h, 0, NC, H, D);
                if (dbias)
                    for (int c = 0; c < D; c++)
                        dbias[c] += g[c];
                for (int j = 0; j < cnt; j++) {
                    int64_t tok = at4(sq.b, sq.start + i * d + j, h, 0, T, H, D);
                    for (int e = 0; e < D; e++) {
                        int64_t r = (int64_t)j * D + e; /* row of W */
                        double xe = x[tok + e] + (pe ? pe[r] : 0.0);
                        double gx = 0.0; /* d loss / d x_i[r] */
                        for (int c = 0; c < D; c++) {
                            gx += W[r * D + c] * g[c];
                            if (dW)
                                dW[r * D + c] += xe * g[c];
                        }
                        if (dx)
                            dx[tok + e] += gx;
                        if (dpe)
                            dpe[r] += gx;
                    }
                }
            }
        }
    }
}
