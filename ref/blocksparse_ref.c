/* blocksparse_ref.c: see blocksparse_ref.h. */
#include "blocksparse_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_bs_problem_init(ref_bs_problem *p, int B, int Tq, int Tk, int HQ, int H, int D, int DV)
{
    memset(p, 0, sizeof *p);
    p->B = B;
    p->Tq = Tq;
    p->Tk = Tk;
    p->HQ = HQ;
    p->H = H;
    p->D = D;
    p->DV = DV;
    p->window_left = -1;
    p->window_right = -1;
    p->mask_b = 1;
    p->mask_h = 1;
    p->q_block = 64;
    p->kv_block = 64;
}

static double scale_of(const ref_bs_problem *p) { return p->scale > 0 ? p->scale : 1.0 / sqrt((double)p->D); }

int ref_bs_visible(const ref_bs_problem *p, int b, int hq, int i, int j)
{
    if (p->mask) {
        const int64_t nqb = (p->Tq + p->q_block - 1) / p->q_block, nkb = (p->Tk + p->kv_block - 1) / p->kv_block;
        const int64_t mb = p->mask_b > 1 ? b : 0, mh = p->mask_h > 1 ? hq : 0;
        if (!p->mask[((mb * p->mask_h + mh) * nqb + i / p->q_block) * nkb + j / p->kv_block]) return 0;
    }
    const int64_t pq = p->pos_q ? p->pos_q[(int64_t)b * p->Tq + i] : (int64_t)i + p->Tk - p->Tq;
    const int64_t pk = p->pos_k ? p->pos_k[(int64_t)b * p->Tk + j] : j;
    if (p->causal && pk > pq) return 0;
    if (p->window_left >= 0 && pk < pq - p->window_left) return 0;
    if (p->window_right >= 0 && pk > pq + p->window_right) return 0;
    if (p->seg_q) {
        const int sq = p->seg_q[(int64_t)b * p->Tq + i], sk = p->seg_k[(int64_t)b * p->Tk + j];
        if (sq < 0 || sq != sk) return 0;
    }
    return 1;
}

/* Scores of row (b, i, hq): z[j] (valid where vis[j]), dz/du in dc[j]. */
static void row_scores(const ref_bs_problem *p, const double *q, const double *k, int b, int i, int hq, double *z,
                       double *dc, char *vis)
{
    const int G = p->HQ / p->H, h = hq / G, D = p->D;
    const double sc = scale_of(p);
    const double *qi = q + (((int64_t)b * p->Tq + i) * p->HQ + hq) * D;
    for (int j = 0; j < p->Tk; ++j) {
        vis[j] = (char)ref_bs_visible(p, b, hq, i, j);
        z[j] = 0;
        dc[j] = 1;
        if (!vis[j]) continue;
        const double *kj = k + (((int64_t)b * p->Tk + j) * p->H + h) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qi[d] * kj[d];
        double u = sc * dot;
        if (p->softcap > 0) {
            double t = tanh(u / p->softcap);
            z[j] = p->softcap * t;
            dc[j] = 1 - t * t;
        } else {
            z[j] = u;
        }
    }
}

/* lse of a row; -inf when nothing is visible and there is no sink. */
static double row_lse(const ref_bs_problem *p, int hq, const double *z, const char *vis)
{
    double m = p->sinks ? p->sinks[hq] : -INFINITY;
    for (int j = 0; j < p->Tk; ++j)
        if (vis[j] && z[j] > m) m = z[j];
    if (m == -INFINITY) return -INFINITY;
    double s = p->sinks ? exp(p->sinks[hq] - m) : 0;
    for (int j = 0; j < p->Tk; ++j)
        if (vis[j]) s += exp(z[j] - m);
    return m + log(s);
}

void ref_bs_fwd(const ref_bs_problem *p, const double *q, const double *k, const double *v, double *o, double *lse)
{
    const int G = p->HQ / p->H, DV = p->DV;
    double *z = malloc(sizeof(double) * (size_t)p->Tk), *dc = malloc(sizeof(double) * (size_t)p->Tk);
    char *vis = malloc((size_t)p->Tk);
    if (!z || !dc || !vis) abort();
    for (int b = 0; b < p->B; ++b)
        for (int i = 0; i < p->Tq; ++i)
            for (int hq = 0; hq < p->HQ; ++hq) {
                const int h = hq / G;
                row_scores(p, q, k, b, i, hq, z, dc, vis);
                const double l = row_lse(p, hq, z, vis);
                const int64_t r = ((int64_t)b * p->Tq + i) * p->HQ + hq;
                double *oi = o + r * DV;
                for (int d = 0; d < DV; ++d) oi[d] = 0;
                if (lse) lse[r] = l;
                if (l == -INFINITY) continue;
                for (int j = 0; j < p->Tk; ++j) {
                    if (!vis[j]) continue;
                    const double pj = exp(z[j] - l);
                    const double *vj = v + (((int64_t)b * p->Tk + j) * p->H + h) * DV;
                    for (int d = 0; d < DV; ++d) oi[d] += pj * vj[d];
                }
            }
    free(z);
    free(dc);
    free(vis);
}

void ref_bs_bwd(const ref_bs_problem *p, const double *q, const double *k, const double *v, const double *do_,
                double *dq, double *dk, double *dv, double *dsinks)
{
    const int G = p->HQ / p->H, D = p->D, DV = p->DV;
    const double sc = scale_of(p);
    double *z = malloc(sizeof(double) * (size_t)p->Tk), *dc = malloc(sizeof(double) * (size_t)p->Tk);
    double *pr = malloc(sizeof(double) * (size_t)p->Tk), *o = malloc(sizeof(double) * (size_t)DV);
    char *vis = malloc((size_t)p->Tk);
    if (!z || !dc || !pr || !o || !vis) abort();
    for (int b = 0; b < p->B; ++b)
        for (int i = 0; i < p->Tq; ++i)
            for (int hq = 0; hq < p->HQ; ++hq) {
                const int h = hq / G;
                row_scores(p, q, k, b, i, hq, z, dc, vis);
                const double l = row_lse(p, hq, z, vis);
                if (l == -INFINITY) continue;
                const int64_t r = ((int64_t)b * p->Tq + i) * p->HQ + hq;
                const double *qi = q + r * D, *doi = do_ + r * DV;
                for (int d = 0; d < DV; ++d) o[d] = 0;
                for (int j = 0; j < p->Tk; ++j) {
                    pr[j] = vis[j] ? exp(z[j] - l) : 0;
                    if (!vis[j]) continue;
                    const double *vj = v + (((int64_t)b * p->Tk + j) * p->H + h) * DV;
                    for (int d = 0; d < DV; ++d) o[d] += pr[j] * vj[d];
                }
                double delta = 0;
                for (int d = 0; d < DV; ++d) delta += o[d] * doi[d];
                if (dsinks && p->sinks) dsinks[hq] -= exp(p->sinks[hq] - l) * delta;
                for (int j = 0; j < p->Tk; ++j) {
                    if (!vis[j]) continue;
                    const int64_t kr = ((int64_t)b * p->Tk + j) * p->H + h;
                    const double *vj = v + kr * DV, *kj = k + kr * D;
                    double dp = 0;
                    for (int d = 0; d < DV; ++d) dp += doi[d] * vj[d];
                    const double du = pr[j] * (dp - delta) * dc[j] * sc;
                    if (dv)
                        for (int d = 0; d < DV; ++d) dv[kr * DV + d] += pr[j] * doi[d];
                    if (dk)
                        for (int d = 0; d < D; ++d) dk[kr * D + d] += du * qi[d];
                    if (dq)
                        for (int d = 0; d < D; ++d) dq[r * D + d] += du * kj[d];
                }
            }
    free(z);
    free(dc);
    free(pr);
    free(o);
    free(vis);
}

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

void ref_bs_block_mask(int kind, int Tq, int Tk, int q_block, int kv_block, int window_left, int window_right,
                       int stride, int global_tokens, const int *seg_q, const int *seg_k, int *out)
{
    const int nqb = (Tq + q_block - 1) / q_block, nkb = (Tk + kv_block - 1) / kv_block;
    const int64_t off = (int64_t)Tk - Tq;
    for (int qb = 0; qb < nqb; ++qb)
        for (int kb = 0; kb < nkb; ++kb) {
            int on = 0;
            const int i0 = qb * q_block, i1 = i0 + q_block < Tq ? i0 + q_block : Tq;
            const int j0 = kb * kv_block, j1 = j0 + kv_block < Tk ? j0 + kv_block : Tk;
            if (kind == REF_MASK_ALL) on = 1;
            else if (kind == REF_MASK_STRIDED) {
                int64_t d = floor_div(i0 + off, kv_block) - kb;
                on = ((d % stride) + stride) % stride == 0;
            } else if (kind == REF_MASK_GLOBAL) {
                for (int j = j0; j < j1 && !on; ++j) on = j < global_tokens;
            } else {
                for (int i = i0; i < i1 && !on; ++i)
                    for (int j = j0; j < j1 && !on; ++j) {
                        const int64_t pq = i + off;
                        if (kind == REF_MASK_CAUSAL) on = j <= pq;
                        else if (kind == REF_MASK_WINDOW)
                            on = (window_left < 0 || j >= pq - window_left) && (window_right < 0 || j <= pq + window_right);
                        else if (kind == REF_MASK_SEGMENT) on = seg_q[i] >= 0 && seg_q[i] == seg_k[j];
                    }
            }
            out[qb * nkb + kb] = on;
        }
}
