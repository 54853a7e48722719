/* bench_clblast.c: the dense causal attention an OpenCL user can build
 * today from CLBlast's GEMMs, `clnsa bench`'s `clblast` baseline. Per query
 * head h of KV group g and chunk of query rows:
 *   S = scale Q_h K_g^T   (SGEMM, rows x keys, rows of the [T, heads, D] tensors
 *                          addressed through offsets and leading dimensions)
 *   P = softmax of each row of S over the keys it sees (causal_softmax)
 *   O_h = P V_g           (SGEMM)
 * and the backward, which recomputes P as a flash backward does:
 *   dP = dO_h V_g^T, dS = scale P (dP - rowsum(dO_h O_h)) (causal_dsoftmax),
 *   dV_g += P^T dO_h, dQ_h = dS K_g, dK_g += dS^T Q_h   (SGEMMs)
 * in f32: CLBlast has no bf16 GEMM, and a user converting bf16 would pay
 * that conversion too. The GEMMs compute every key, the masked half too,
 * which is what a GEMM does, but only up to each chunk of query rows' last
 * key. One score buffer (two in the backward) serves all heads and chunks
 * in turn. The results are checked against a double reference on the host
 * (outputs and dq of three tokens, dk and dv of the last key, every head)
 * before a time is reported. */
#include "bench_clblast.h"

#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* causal_softmax, one work-group per row (query row0 + group; ld keys): the max and the sum
 * over keys 0..i (local reductions), then the row rewritten as
 * probabilities, zeros past i. */
static const char *kernels_src =
    "#define WG 256\n"
    "__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))\n"
    "void causal_softmax(__global float *s, int ld, int row0)\n"
    "{\n"
    "    __local float red[WG];\n"
    "    const int i = row0 + get_group_id(0), lid = get_local_id(0);\n"
    "    __global float *row = s + (size_t)get_group_id(0) * ld;\n"
    "    float m = -INFINITY, sum = 0.0f;\n"
    "    for (int j = lid; j <= i; j += WG) m = fmax(m, row[j]);\n"
    "    red[lid] = m;\n"
    "    for (int w = WG / 2; w > 0; w /= 2) {\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        if (lid < w) red[lid] = fmax(red[lid], red[lid + w]);\n"
    "    }\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    m = red[0];\n"
    "    for (int j = lid; j <= i; j += WG) sum += exp(row[j] - m);\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    red[lid] = sum;\n"
    "    for (int w = WG / 2; w > 0; w /= 2) {\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        if (lid < w) red[lid] += red[lid + w];\n"
    "    }\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    const float inv = 1.0f / red[0];\n"
    "    for (int j = lid; j < ld; j += WG) row[j] = j <= i ? exp(row[j] - m) * inv : 0.0f;\n"
    "}\n"
    "/* one work-group per row: D = dO . O (a local reduction), then the row\n"
    " * of dP becomes dS = scale P (dP - D) */\n"
    "__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))\n"
    "void causal_dsoftmax(__global const float *p, __global float *dp, int ld, __global const float *dout,\n"
    "                     __global const float *o, int off, int rs, int D, float scale)\n"
    "{\n"
    "    __local float red[WG];\n"
    "    const int lid = get_local_id(0);\n"
    "    const size_t at = (size_t)off + (size_t)get_group_id(0) * rs, r = (size_t)get_group_id(0) * ld;\n"
    "    float dot = 0.0f;\n"
    "    for (int d = lid; d < D; d += WG) dot += dout[at + d] * o[at + d];\n"
    "    red[lid] = dot;\n"
    "    for (int w = WG / 2; w > 0; w /= 2) {\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        if (lid < w) red[lid] += red[lid + w];\n"
    "    }\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    const float dd = red[0];\n"
    "    for (int j = lid; j < ld; j += WG) dp[r + j] = scale * p[r + j] * (dp[r + j] - dd);\n"
    "}\n";

/* Query rows per chunk: CLBlast indexes a matrix with 32-bit integers, so
 * a score chunk stays within 2^30 elements (T = 64k fails otherwise). */
static int chunk_rows(int T) { return T <= (1 << 30) / T ? T : (1 << 30) / T; }

bool clblast_dense_fits(const cli_env *env, int T)
{
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(env->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    return (cl_ulong)chunk_rows(T) * (cl_ulong)T * 4u <= max_alloc;
}

typedef struct {
    cl_mem q, k, v, o, dout, dq, dk, dv; /* f32 [T, HQ or H, D] */
    cl_mem s, dp;                        /* score chunks: P, dP then dS */
    cl_kernel softmax, dsoftmax;
    int T, HQ, H, D;
} dense_run;

/* One SGEMM, row-major, C = alpha op(A) op(B) + beta C, on the queue;
 * the last argument receives its event when not NULL. */
static bool gemm(const cli_env *env, bool ta, bool tb, int m, int n, int k, float alpha, cl_mem a, size_t ao, size_t lda,
                 cl_mem b, size_t bo, size_t ldb, float beta, cl_mem c, size_t co, size_t ldc, cl_event *ev)
{
    cl_command_queue q = env->queue;
    return CLBlastSgemm(CLBlastLayoutRowMajor, ta ? CLBlastTransposeYes : CLBlastTransposeNo,
                        tb ? CLBlastTransposeYes : CLBlastTransposeNo, (size_t)m, (size_t)n, (size_t)k, alpha, a, ao, lda, b,
                        bo, ldb, beta, c, co, ldc, &q, ev) == CLBlastSuccess;
}

/* Rows r0 .. r0+nr-1 (one work-group each) of kernel k. */
static bool rows_kernel(const cli_env *env, cl_kernel k, int nr)
{
    const size_t lsz = 256, gsz = (size_t)nr * lsz;
    return clEnqueueNDRangeKernel(env->queue, k, 1, NULL, &gsz, &lsz, 0, NULL, NULL) == CL_SUCCESS;
}

/* P of head h for query rows r0 .. r0+nr-1 against keys 0 .. nk-1, in s. */
static bool probabilities(const cli_env *env, const dense_run *x, int h, int r0, int nr, int nk)
{
    const size_t qo = ((size_t)r0 * x->HQ + h) * x->D, ko = (size_t)(h / (x->HQ / x->H)) * x->D;
    return gemm(env, false, true, nr, nk, x->D, 1.0f / sqrtf((float)x->D), x->q, qo, (size_t)x->HQ * x->D, x->k, ko,
                (size_t)x->H * x->D, 0.0f, x->s, 0, (size_t)nk, NULL) &&
           clSetKernelArg(x->softmax, 0, sizeof x->s, &x->s) == CL_SUCCESS &&
           clSetKernelArg(x->softmax, 1, sizeof nk, &nk) == CL_SUCCESS &&
           clSetKernelArg(x->softmax, 2, sizeof r0, &r0) == CL_SUCCESS && rows_kernel(env, x->softmax, nr);
}

/* Enqueues one forward (bwd = false) or backward; *done: the last GEMM's
 * event. Query rows go in chunks of tc, each against the keys up to its
 * last row (causal). */
static int enqueue_pass(const cli_env *env, dense_run *x, bool bwd, cl_event *done)
{
    const int G = x->HQ / x->H, tc = chunk_rows(x->T), D = x->D;
    const size_t ldq = (size_t)x->HQ * D, ldk = (size_t)x->H * D;
    const float zero = 0.0f, scale = 1.0f / sqrtf((float)D);
    *done = NULL;
    if (bwd && (clEnqueueFillBuffer(env->queue, x->dk, &zero, sizeof zero, 0, (size_t)x->T * ldk * 4, 0, NULL, NULL) ||
                clEnqueueFillBuffer(env->queue, x->dv, &zero, sizeof zero, 0, (size_t)x->T * ldk * 4, 0, NULL, NULL)))
        return -1;
    for (int h = 0; h < x->HQ; ++h)
        for (int r0 = 0; r0 < x->T; r0 += tc) {
            const int nr = x->T - r0 < tc ? x->T - r0 : tc, nk = r0 + nr, off = (int)(((size_t)r0 * x->HQ + h) * D);
            const size_t qo = (size_t)off, ko = (size_t)(h / G) * D;
            cl_event ev = NULL, *last = h == x->HQ - 1 && r0 + nr == x->T ? &ev : NULL;
            bool ok = probabilities(env, x, h, r0, nr, nk);
            if (!bwd) {
                ok = ok && gemm(env, false, false, nr, D, nk, 1.0f, x->s, 0, nk, x->v, ko, ldk, 0.0f, x->o, qo, ldq, last);
            } else {
                const int rs = (int)ldq;
                ok = ok && gemm(env, false, true, nr, nk, D, 1.0f, x->dout, qo, ldq, x->v, ko, ldk, 0.0f, x->dp, 0, nk, NULL) &&
                     clSetKernelArg(x->dsoftmax, 0, sizeof x->s, &x->s) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 1, sizeof x->dp, &x->dp) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 2, sizeof nk, &nk) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 3, sizeof x->dout, &x->dout) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 4, sizeof x->o, &x->o) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 5, sizeof off, &off) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 6, sizeof rs, &rs) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 7, sizeof D, &D) == CL_SUCCESS &&
                     clSetKernelArg(x->dsoftmax, 8, sizeof scale, &scale) == CL_SUCCESS &&
                     rows_kernel(env, x->dsoftmax, nr) &&
                     gemm(env, true, false, nk, D, nr, 1.0f, x->s, 0, nk, x->dout, qo, ldq, 1.0f, x->dv, ko, ldk, NULL) &&
                     gemm(env, false, false, nr, D, nk, 1.0f, x->dp, 0, nk, x->k, ko, ldk, 0.0f, x->dq, qo, ldq, NULL) &&
                     gemm(env, true, false, nk, D, nr, 1.0f, x->dp, 0, nk, x->q, qo, ldq, 1.0f, x->dk, ko, ldk, last);
            }
            if (!ok) return -1;
            if (ev) *done = ev;
        }
    return *done ? 0 : -1;
}

/* Row t of head h against keys 0..t in double: p (normalized) and, with
 * dout, ds = scale p (dP - rowsum(dO O)) over the same keys. */
static void reference_row(const float *q, const float *k, const float *v, const float *dout, int t, int h, int HQ,
                          int H, int D, double *p, double *ds)
{
    const int g = h / (HQ / H);
    const float *qr = q + ((size_t)t * HQ + h) * D;
    const double scale = 1.0 / sqrt((double)D);
    double m = -INFINITY, sum = 0, dd = 0;
    for (int j = 0; j <= t; ++j) {
        double x = 0;
        for (int d = 0; d < D; ++d) x += (double)qr[d] * k[((size_t)j * H + g) * D + d];
        m = fmax(m, p[j] = x * scale);
    }
    for (int j = 0; j <= t; ++j) sum += (p[j] = exp(p[j] - m));
    for (int j = 0; j <= t; ++j) p[j] /= sum;
    if (!dout) return;
    const float *dr = dout + ((size_t)t * HQ + h) * D;
    for (int j = 0; j <= t; ++j) {
        double x = 0;
        for (int d = 0; d < D; ++d) x += (double)dr[d] * v[((size_t)j * H + g) * D + d];
        dd += p[j] * (ds[j] = x);
    }
    for (int j = 0; j <= t; ++j) ds[j] = scale * p[j] * (ds[j] - dd);
}

/* Adds a D-long row's squared error and squared reference to e[0], e[1]. */
static void row_error(const float *got, const double *ref, int D, double *e)
{
    for (int d = 0; d < D; ++d) {
        e[0] += (got[d] - ref[d]) * (got[d] - ref[d]);
        e[1] += ref[d] * ref[d];
    }
}

static double rel_l2(const double *e) { return sqrt(e[0] / fmax(e[1], 1e-30)); }

/* The relative L2 error of the checked rows: the forward's outputs of
 * tokens 0, T/2 and T-1 (every head), or the larger of the backward's dq
 * of those rows and dk, dv of the last key (every group; only the last
 * query sees it). Errors are pooled over the rows: token 0's dq is zero. */
static double check(const cli_env *env, const dense_run *x, bool bwd)
{
    const int T = x->T, HQ = x->HQ, H = x->H, D = x->D;
    const size_t nq = (size_t)T * HQ * D, nk = (size_t)T * H * D;
    float *q = cli_malloc(nq * 4), *k = cli_malloc(nk * 4), *v = cli_malloc(nk * 4), *out = cli_malloc(nq * 4);
    float *dout = bwd ? cli_malloc(nq * 4) : NULL, *dk = bwd ? cli_malloc(nk * 4) : NULL, *dv = bwd ? cli_malloc(nk * 4) : NULL;
    double *p = cli_malloc((size_t)T * sizeof *p), *ds = cli_malloc((size_t)T * sizeof *ds), *ref = cli_malloc((size_t)D * 3 * sizeof *ref);
    double worst = INFINITY;
    if (q && k && v && out && p && ds && ref && (!bwd || (dout && dk && dv)) &&
        !cli_download_f32(env, x->q, nq, CLNSA_DTYPE_F32, q) && !cli_download_f32(env, x->k, nk, CLNSA_DTYPE_F32, k) &&
        !cli_download_f32(env, x->v, nk, CLNSA_DTYPE_F32, v) &&
        !cli_download_f32(env, bwd ? x->dq : x->o, nq, CLNSA_DTYPE_F32, out) &&
        (!bwd || (!cli_download_f32(env, x->dout, nq, CLNSA_DTYPE_F32, dout) &&
                  !cli_download_f32(env, x->dk, nk, CLNSA_DTYPE_F32, dk) &&
                  !cli_download_f32(env, x->dv, nk, CLNSA_DTYPE_F32, dv)))) {
        double eq[2] = {0, 0}, ek[2] = {0, 0}, ev[2] = {0, 0};
        const int rows[3] = {0, T / 2, T - 1};
        for (int r = 0; r < 3; ++r)
            for (int h = 0; h < HQ; ++h) {
                const int t = rows[r], g = h / (HQ / H);
                reference_row(q, k, v, dout, t, h, HQ, H, D, p, ds);
                for (int d = 0; d < D; ++d) {
                    double acc = 0;
                    for (int j = 0; j <= t; ++j)
                        acc += bwd ? ds[j] * k[((size_t)j * H + g) * D + d] : p[j] * v[((size_t)j * H + g) * D + d];
                    ref[d] = acc;
                }
                row_error(out + ((size_t)t * HQ + h) * D, ref, D, eq);
            }
        for (int g = 0; bwd && g < H; ++g) { /* key T-1 */
            double *rk = ref + D, *rv = ref + 2 * D;
            for (int d = 0; d < D; ++d) rk[d] = rv[d] = 0;
            for (int h = g * (HQ / H); h < (g + 1) * (HQ / H); ++h) {
                reference_row(q, k, v, dout, T - 1, h, HQ, H, D, p, ds);
                for (int d = 0; d < D; ++d) {
                    rk[d] += ds[T - 1] * q[((size_t)(T - 1) * HQ + h) * D + d];
                    rv[d] += p[T - 1] * dout[((size_t)(T - 1) * HQ + h) * D + d];
                }
            }
            row_error(dk + ((size_t)(T - 1) * H + g) * D, rk, D, ek);
            row_error(dv + ((size_t)(T - 1) * H + g) * D, rv, D, ev);
        }
        worst = fmax(rel_l2(eq), bwd ? fmax(rel_l2(ek), rel_l2(ev)) : 0.0);
    }
    free(q), free(k), free(v), free(out), free(dout), free(dk), free(dv), free(p), free(ds), free(ref);
    return worst;
}

/* The median of `repeat` timed passes after a warm-up (it = -1, where
 * CLBlast builds its kernels), checked; -1 on failure. */
static double time_pass(const cli_env *env, dense_run *x, bool bwd, int repeat)
{
    double ms[64] = {0};
    int runs = 0;
    for (int it = -1; it < repeat && it < 64; ++it) {
        cli_timer t;
        cl_event done = NULL;
        if (cli_timer_begin(env, &t)) break;
        const int rc = enqueue_pass(env, x, bwd, &done);
        const double v = cli_timer_end(&t, rc ? NULL : done);
        if (done) clReleaseEvent(done);
        if (rc || v < 0) break;
        if (it >= 0) ms[runs++] = v;
    }
    const double rel = runs == repeat ? check(env, x, bwd) : INFINITY;
    if (runs == repeat && !(rel < 1e-4))
        fprintf(stderr, "clnsa bench: clblast: %s rel L2 %.3g against the host reference at T=%d\n",
                bwd ? "gradients'" : "output", rel, x->T);
    if (runs != repeat) fprintf(stderr, "clnsa bench: clblast: the CLBlast dense %s failed at T=%d\n", bwd ? "backward" : "forward", x->T);
    if (runs != repeat || !(rel < 1e-4)) return -1;
    return cli_median(ms, (size_t)runs);
}

int clblast_dense_ms(const cli_env *env, int T, int HQ, int H, int D, int repeat, double *fwd_ms, double *bwd_ms)
{
    uint64_t seed = 11;
    const size_t nq = (size_t)T * HQ * D, nk = (size_t)T * H * D, ns = (size_t)chunk_rows(T) * T * 4;
    const bool bwd = bwd_ms != NULL;
    dense_run x = {cli_random(env, nq, -1, 1, CLNSA_DTYPE_F32, &seed), cli_random(env, nk, -1, 1, CLNSA_DTYPE_F32, &seed),
                   cli_random(env, nk, -1, 1, CLNSA_DTYPE_F32, &seed), cli_buffer(env, nq * 4, NULL),
                   bwd ? cli_random(env, nq, -1, 1, CLNSA_DTYPE_F32, &seed) : NULL, bwd ? cli_buffer(env, nq * 4, NULL) : NULL,
                   bwd ? cli_buffer(env, nk * 4, NULL) : NULL, bwd ? cli_buffer(env, nk * 4, NULL) : NULL,
                   cli_buffer(env, ns, NULL), bwd ? cli_buffer(env, ns, NULL) : NULL, NULL, NULL, T, HQ, H, D};
    cl_int err = CL_SUCCESS;
    cl_program prog = clCreateProgramWithSource(env->cl, 1, &kernels_src, NULL, &err);
    if (err == CL_SUCCESS && clBuildProgram(prog, 1, &env->device, "", NULL, NULL) == CL_SUCCESS) {
        x.softmax = clCreateKernel(prog, "causal_softmax", &err);
        x.dsoftmax = clCreateKernel(prog, "causal_dsoftmax", &err);
    }
    *fwd_ms = -1;
    if (bwd) *bwd_ms = -1;
    const bool have = x.q && x.k && x.v && x.o && x.s && x.softmax && x.dsoftmax &&
                      (!bwd || (x.dout && x.dq && x.dk && x.dv && x.dp));
    if (have) *fwd_ms = time_pass(env, &x, false, repeat);
    if (have && bwd && *fwd_ms >= 0) *bwd_ms = time_pass(env, &x, true, repeat);
    if (x.softmax) clReleaseKernel(x.softmax);
    if (x.dsoftmax) clReleaseKernel(x.dsoftmax);
    if (prog) clReleaseProgram(prog);
    cl_mem all[10] = {x.q, x.k, x.v, x.o, x.dout, x.dq, x.dk, x.dv, x.s, x.dp};
    for (int i = 0; i < 10; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
    return *fwd_ms >= 0 && (!bwd || *bwd_ms >= 0) ? 0 : -1;
}
