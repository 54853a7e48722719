/*
 * nsa_ref.c - shape helpers, the three attention branches (forward and
 * backward) and top-k block selection.  See nsa_ref.h for the semantics.
 */
#include "nsa_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* small utilities                                                          */
/* ------------------------------------------------------------------------ */

void *ref_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "nsa_ref: out of memory\n");
        abort();
    }
    return p;
}

/* Offset of element (b, t, h, c) of a [B, T, H, D] tensor. */
static int64_t at4(int b, int t, int h, int c, int T, int H, int D)
{
    return (((int64_t)b * T + t) * H + h) * D + c;
}

/* Offset of element (b, t, h) of a [B, T, H] tensor. */
static int64_t at3(int b, int t, int h, int T, int H)
{
    return ((int64_t)b * T + t) * H + h;
}

static double dot(const double *a, const double *b, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static int clampi(int x, int lo, int hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* ------------------------------------------------------------------------ */
/* shape helpers                                                            */
/* ------------------------------------------------------------------------ */

void ref_nsa_shape_init(ref_nsa_shape *sh, int B, int T, int HQ, int H,
                        int DK, int DV)
{
    memset(sh, 0, sizeof *sh);
    sh->B = B;
    sh->T = T;
    sh->HQ = HQ;
    sh->H = H;
    sh->DK = DK;
    sh->DV = DV;
    sh->cu_seqlens = NULL;
    sh->N = 0;
    sh->block_size = 64;
    sh->block_count = 16;
    sh->cmp_block = 0;  /* = block_size */
    sh->cmp_stride = 0; /* = block_size */
    sh->window = 0;
    sh->init_blocks = 1;
    sh->local_blocks = 2;
    sh->scale = DK > 0 ? 1.0 / sqrt((double)DK) : 1.0;
}

int ref_cmp_block(const ref_nsa_shape *sh)
{
    return sh->cmp_block > 0 ? sh->cmp_block : sh->block_size;
}

int ref_cmp_stride(const ref_nsa_shape *sh)
{
    return sh->cmp_stride > 0 ? sh->cmp_stride : sh->block_size;
}

double ref_scale(const ref_nsa_shape *sh)
{
    return sh->scale > 0.0 ? sh->scale : 1.0 / sqrt((double)sh->DK);
}

int ref_nsa_shape_check(const ref_nsa_shape *sh)
{
    if (sh->B < 1 || sh->T < 0 || sh->H < 1 || sh->HQ < 1 || sh->DK < 1 ||
        sh->DV < 1)
        return -1;
    if (sh->HQ % sh->H != 0)
        return -2;
    if (sh->block_size < 1 || sh->block_count < 0 || sh->window < 0 ||
        sh->init_blocks < 0 || sh->local_blocks < 0)
        return -3;
    if (ref_cmp_block(sh) < 1 || ref_cmp_stride(sh) < 1)
        return -4;
    if (sh->cu_seqlens) {
        if (sh->B != 1 || sh->N < 0 || sh->cu_seqlens[0] != 0 ||
            sh->cu_seqlens[sh->N] != sh->T)
            return -5;
        for (int s = 0; s < sh->N; s++)
            if (sh->cu_seqlens[s + 1] < sh->cu_seqlens[s])
                return -5;
    }
    return 0;
}

int ref_num_cmp(int len, int stride)
{
    return len > 0 ? (len + stride - 1) / stride : 0;
}

int ref_num_seqs(const ref_nsa_shape *sh)
{
    return sh->cu_seqlens ? sh->N : sh->B;
}

int ref_total_cmp(const ref_nsa_shape *sh)
{
    int d = ref_cmp_stride(sh);
    if (!sh->cu_seqlens)
        return ref_num_cmp(sh->T, d);
    int nc = 0;
    for (int s = 0; s < sh->N; s++)
        nc += ref_num_cmp(sh->cu_seqlens[s + 1] - sh->cu_seqlens[s], d);
    return nc;
}

ref_seq ref_get_seq(const ref_nsa_shape *sh, int s)
{
    ref_seq sq;
    int d = ref_cmp_stride(sh);
    if (!sh->cu_seqlens) {
        sq.b = s;
        sq.start = 0;
        sq.len = sh->T;
        sq.cstart = 0;
    } else {
        sq.b = 0;
        sq.start = sh->cu_seqlens[s];
        sq.len = sh->cu_seqlens[s + 1] - sh->cu_seqlens[s];
        sq.cstart = 0;
        for (int r = 0; r < s; r++)
            sq.cstart += ref_num_cmp(sh->cu_seqlens[r + 1] -
                                     sh->cu_seqlens[r], d);
    }
    sq.nc = ref_num_cmp(sq.len, d);
    return sq;
}

/* ------------------------------------------------------------------------ */
/* one query row of softmax attention over an explicit list of key rows     */
/* ------------------------------------------------------------------------ */

/* p_i = softmax(scale * q.k_i)_i over the n rows kr[i]; returns
 * lse = log sum_i exp(scale * q.k_i) (-inf when n == 0). */
static double attn_row_probs(const double *q, int DK, double scale, int n,
                             const double *const *kr, double *p)
{
    if (n == 0)
        return -INFINITY;
    double m = -INFINITY;
    for (int i = 0; i < n; i++) {
        p[i] = scale * dot(q, kr[i], DK);
        if (p[i] > m)
            m = p[i];
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp(p[i] - m);
    double lse = m + log(sum);
    for (int i = 0; i < n; i++)
        p[i] = exp(p[i] - lse);
    return lse;
}

/* o = sum_i p_i v_i, lse as above.  n == 0: o = 0, lse = -inf.
 * p is scratch of n doubles. */
static void attn_row_fwd(const double *q, int DK, int DV, double scale, int n,
                         const double *const *kr, const double *const *vr,
                         double *p, double *o, double *lse)
{
    *lse = attn_row_probs(q, DK, scale, n, kr, p);
    for (int c = 0; c < DV; c++)
        o[c] = 0.0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < DV; c++)
            o[c] += p[i] * vr[i][c];
}

/* Standard softmax-attention backward for one query row, accumulating:
 *   dp_i = do . v_i,  delta = sum_i p_i dp_i (= do . o),
 *   ds_i = p_i (dp_i - delta),
 *   dq += scale sum_i ds_i k_i,  dk_i += scale ds_i q,  dv_i += p_i do.
 * dq, dkr, dvr may be NULL; scratch holds 2n doubles. */
static void attn_row_bwd(const double *q, int DK, int DV, double scale, int n,
                         const double *const *kr, const double *const *vr,
                         const double *do_, double *dq, double *const *dkr,
                         double *const *dvr, double *scratch)
{
    double *p = scratch, *dp = scratch + n;
    attn_row_probs(q, DK, scale, n, kr, p);

    double delta = 0.0;
    for (int i = 0; i < n; i++) {
        dp[i] = dot(do_, vr[i], DV);
        delta += p[i] * dp[i];
    }
    for (int i = 0; i < n; i++) {
        double ds = p[i] * (dp[i] - delta);
        if (dq)
            for (int c = 0; c < DK; c++)
                dq[c] += scale * ds * kr[i][c];
        if (dkr)
            for (int c = 0; c < DK; c++)
                dkr[i][c] += scale * ds * q[c];
        if (dvr)
            for (int c = 0; c < DV; c++)
                dvr[i][c] += p[i] * do_[c];
    }
}

/* ------------------------------------------------------------------------ */
/* key sets of the three branches                                           */
/* ------------------------------------------------------------------------ */

enum branch_kind { BR_CMP, BR_SLC, BR_SWA };

typedef struct {
    enum branch_kind kind;
    const int *block_indices; /* BR_SLC */
    const int *block_counts;  /* BR_SLC, may be NULL */
} branch;

/* Number of compressed tokens visible to the query at local position t:
 * those i with i*d + l - 1 <= t. */
static int cmp_visible(const ref_nsa_shape *sh, int t)
{
    int l = ref_cmp_block(sh), d = ref_cmp_stride(sh);
    if (t < l - 1)
        return 0;
    return (t - (l - 1)) / d + 1;
}

/* S_eff of row (b, token, h). */
static int slots_used(const ref_nsa_shape *sh, const int *block_counts, int b,
                      int token, int h)
{
    if (!block_counts)
        return sh->block_count;
    return clampi(block_counts[at3(b, token, h, sh->T, sh->H)], 0,
                  sh->block_count);
}

/* Fill keys[] with the local key positions (tokens, or compressed tokens for
 * BR_CMP) seen by the query at local position t of sequence sq, KV head h,
 * in ascending order; return their number.  mask: scratch of >= T bytes. */
static int branch_keys(const ref_nsa_shape *sh, const branch *br,
                       const ref_seq *sq, int t, int h, unsigned char *mask,
                       int *keys)
{
    int n = 0;
    switch (br->kind) {
    case BR_CMP: {
        int nv = cmp_visible(sh, t);
        for (int i = 0; i < nv; i++)
            keys[n++] = i;
        break;
    }
    case BR_SLC: {
        int bs = sh->block_size, S = sh->block_count;
        int tb = t / bs;
        int token = sq->start + t;
        int seff = slots_used(sh, br->block_counts, sq->b, token, h);
        const int *row = br->block_indices + at4(sq->b, token, h, 0, sh->T,
                                                 sh->H, S);
        memset(mask, 0, (size_t)tb + 1);
        for (int slot = 0; slot < seff; slot++) {
            int j = row[slot];
            if (j >= 0 && j <= tb)
                mask[j] = 1; /* duplicates simply set the flag again */
        }
        for (int s = 0; s <= t; s++)
            if (mask[s / bs])
                keys[n++] = s;
        break;
    }
    case BR_SWA: {
        int lo = t - sh->window + 1;
        for (int s = lo < 0 ? 0 : lo; s <= t; s++)
            keys[n++] = s;
        break;
    }
    }
    return n;
}

/* Forward (do_ == NULL) or backward (do_ != NULL) of one branch over every
 * query.  For BR_CMP, k and v are the compressed tensors [B, NC, H, D]. */
static void branch_run(const ref_nsa_shape *sh, const branch *br,
                       const double *q, const double *k, const double *v,
                       double *o, double *lse, const double *do_, double *dq,
                       double *dk, double *dv)
{
    const int T = sh->T, HQ = sh->HQ, H = sh->H, DK = sh->DK, DV = sh->DV;
    const int G = HQ / H;
    const double scale = ref_scale(sh);
    /* rows per batch row of k / v */
    const int TK = br->kind == BR_CMP ? ref_total_cmp(sh) : T;
    const int maxn = (TK > T ? TK : T) + 1;

    int *keys = ref_xcalloc((size_t)maxn, sizeof *keys);
    unsigned char *mask = ref_xcalloc((size_t)maxn, 1);
    const double **kr = ref_xcalloc((size_t)maxn, sizeof *kr);
    const double **vr = ref_xcalloc((size_t)maxn, sizeof *vr);
    double **dkr = ref_xcalloc((size_t)maxn, sizeof *dkr);
    double **dvr = ref_xcalloc((size_t)maxn, sizeof *dvr);
    double *scratch = ref_xcalloc(2 * (size_t)maxn, sizeof *scratch);

    for (int s = 0; s < ref_num_seqs(sh); s++) {
        ref_seq sq = ref_get_seq(sh, s);
        int base = br->kind == BR_CMP ? sq.cstart : sq.start;
        for (int t = 0; t < sq.len; t++) {
            int token = sq.start + t;
            for (int hq = 0; hq < HQ; hq++) {
                int h = hq / G;
                int n = branch_keys(sh, br, &sq, t, h, mask, keys);
                for (int i = 0; i < n; i++) {
                    int row = base + keys[i];
                    kr[i] = k + at4(sq.b, row, h, 0, TK, H, DK);
                    vr[i] = v + at4(sq.b, row, h, 0, TK, H, DV);
                    dkr[i] = dk ? dk + at4(sq.b, row, h, 0, TK, H, DK) : NULL;
                    dvr[i] = dv ? dv + at4(sq.b, row, h, 0, TK, H, DV) : NULL;
                }
                const double *qr = q + at4(sq.b, token, hq, 0, T, HQ, DK);
                if (!do_) {
                    double l;
                    attn_row_fwd(qr, DK, DV, scale, n, kr, vr, scratch,
                                 o + at4(sq.b, token, hq, 0, T, HQ, DV), &l);
                    if (lse)
                        lse[at3(sq.b, token, hq, T, HQ)] = l;
                } else {
                    attn_row_bwd(qr, DK, DV, scale, n, kr, vr,
                                 do_ + at4(sq.b, token, hq, 0, T, HQ, DV),
                                 dq ? dq + at4(sq.b, token, hq, 0, T, HQ, DK)
                                    : NULL,
                                 dk ? dkr : NULL, dv ? dvr : NULL, scratch);
                }
            }
        }
    }
    free(keys);
    free(mask);
    free(kr);
    free(vr);
    free(dkr);
    free(dvr);
    free(scratch);
}

/* ------------------------------------------------------------------------ */
/* public branch entry points                                               */
/* ------------------------------------------------------------------------ */

void ref_cmp_fwd(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
                 const double *v_cmp, double *o, double *lse)
{
    branch br = {BR_CMP, NULL, NULL};
    branch_run(sh, &br, q, k_cmp, v_cmp, o, lse, NULL, NULL, NULL, NULL);
}

void ref_cmp_bwd(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
                 const double *v_cmp, const double *do_, double *dq,
                 double *dk_cmp, double *dv_cmp)
{
    branch br = {BR_CMP, NULL, NULL};
    branch_run(sh, &br, q, k_cmp, v_cmp, NULL, NULL, do_, dq, dk_cmp, dv_cmp);
}

void ref_slc_fwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, const int *block_indices,
                 const int *block_counts, double *o, double *lse)
{
    branch br = {BR_SLC, block_indices, block_counts};
    branch_run(sh, &br, q, k, v, o, lse, NULL, NULL, NULL, NULL);
}

void ref_slc_bwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, const int *block_indices,
                 const int *block_counts, const double *do_, double *dq,
                 double *dk, double *dv)
{
    branch br = {BR_SLC, block_indices, block_counts};
    branch_run(sh, &br, q, k, v, NULL, NULL, do_, dq, dk, dv);
}

void ref_swa_fwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, double *o, double *lse)
{
    branch br = {BR_SWA, NULL, NULL};
    branch_run(sh, &br, q, k, v, o, lse, NULL, NULL, NULL, NULL);
}

void ref_swa_bwd(const ref_nsa_shape *sh, const double *q, const double *k,
                 const double *v, const double *do_, double *dq, double *dk,
                 double *dv)
{
    branch br = {BR_SWA, NULL, NULL};
    branch_run(sh, &br, q, k, v, NULL, NULL, do_, dq, dk, dv);
}

/* ------------------------------------------------------------------------ */
/* top-k block selection                                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
    int j;          /* block index */
    int forced;     /* 1 for init / local blocks */
    double imp;     /* importance */
} candidate;

/* forced first (ascending index), then importance descending, then index
 * ascending: a total order, so qsort's result is deterministic. */
static int candidate_cmp(const void *pa, const void *pb)
{
    const candidate *a = pa, *b = pb;
    if (a->forced != b->forced)
        return a->forced ? -1 : 1;
    if (!a->forced && a->imp != b->imp)
        return a->imp > b->imp ? -1 : 1;
    return (a->j > b->j) - (a->j < b->j);
}

int ref_block_importance(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
                         int s, int t, int h, double *imp)
{
    const int HQ = sh->HQ, H = sh->H, DK = sh->DK, T = sh->T;
    const int G = HQ / H, bs = sh->block_size;
    const int l = ref_cmp_block(sh), d = ref_cmp_stride(sh);
    const int NC = ref_total_cmp(sh);
    const double scale = ref_scale(sh);
    const ref_seq sq = ref_get_seq(sh, s);
    const int token = sq.start + t, nv = cmp_visible(sh, t), tb = t / bs;
    /* P[i]: compressed-attention probabilities summed over the group's G
     * query heads. */
    double *P = ref_xcalloc((size_t)nv + 1, sizeof *P);
    double *z = ref_xcalloc((size_t)nv + 1, sizeof *z);
    for (int g = 0; g < G; g++) {
        const double *qr = q + at4(sq.b, token, h * G + g, 0, T, HQ, DK);
        double m = -INFINITY, sum = 0.0;
        for (int i = 0; i < nv; i++) {
            z[i] = scale * dot(qr, k_cmp + at4(sq.b, sq.cstart + i, h, 0, NC, H, DK), DK);
            if (z[i] > m)
                m = z[i];
        }
        for (int i = 0; i < nv; i++)
            sum += exp(z[i] - m);
        const double lse = m + log(sum);
        for (int i = 0; i < nv; i++)
            P[i] += exp(z[i] - lse);
    }
    /* block importance (overlap rule); forced blocks +inf */
    for (int j = 0; j <= tb; j++) {
        imp[j] = 0.0;
        for (int i = 0; i < nv; i++)
            if (i * d < (j + 1) * bs && i * d + l > j * bs)
                imp[j] += P[i];
        if (j < sh->init_blocks || j > tb - sh->local_blocks)
            imp[j] = INFINITY;
    }
    free(P);
    free(z);
    return tb + 1;
}

void ref_topk(const ref_nsa_shape *sh, const double *q, const double *k_cmp,
              const int *block_counts, int *block_indices)
{
    const int T = sh->T, H = sh->H, S = sh->block_count;
    double *imp = ref_xcalloc((size_t)T + 1, sizeof *imp);
    candidate *cand = ref_xcalloc((size_t)T + 1, sizeof *cand);

    for (int s = 0; s < ref_num_seqs(sh); s++) {
        ref_seq sq = ref_get_seq(sh, s);
        for (int t = 0; t < sq.len; t++) {
            int token = sq.start + t;
            for (int h = 0; h < H; h++) {
                const int nc = ref_block_importance(sh, q, k_cmp, s, t, h, imp);
                for (int j = 0; j < nc; j++) {
                    cand[j].j = j;
                    cand[j].forced = isinf(imp[j]);
                    cand[j].imp = imp[j];
                }
                qsort(cand, (size_t)nc, sizeof *cand, candidate_cmp);

                int seff = slots_used(sh, block_counts, sq.b, token, h);
                int nsel = seff < nc ? seff : nc;
                int *row = block_indices + at4(sq.b, token, h, 0, T, H, S);
                for (int slot = 0; slot < S; slot++)
                    row[slot] = slot < nsel ? cand[slot].j : -1;
            }
        }
    }
    free(imp);
    free(cand);
}
