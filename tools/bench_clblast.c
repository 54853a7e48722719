/* bench_clblast.c: the dense causal attention an OpenCL user can build
 * today from CLBlast's GEMMs, `clnsa bench`'s `clblast` baseline (forward
 * only). Per query head h of KV group g:
 *   S = scale Q_h K_g^T   (SGEMM, rows x keys, rows of the [T, heads, D] tensors
 *                          addressed through offsets and leading dimensions)
 *   P = softmax of each row of S over the keys it sees (causal_softmax)
 *   O_h = P V_g           (SGEMM)
 * in f32: CLBlast has no bf16 GEMM, and a user converting bf16 would pay
 * that conversion too. The GEMMs compute every key, the masked half too,
 * which is what a GEMM does, but only up to each chunk of query rows' last
 * key. One score buffer serves all heads and chunks in turn.
 * The result is checked (three tokens, every head) against a double
 * reference on the host before a time is reported. */
#include "bench_clblast.h"

#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* One work-group per row (query row0 + group; ld keys): the max and the sum
 * over keys 0..i (local reductions), then the row rewritten as
 * probabilities, zeros past i. */
static const char *softmax_src =
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

/* Enqueues one forward; *done: the last GEMM's event. Query rows go in
 * chunks of tc, each against the keys up to its last row (causal). */
static int forward_once(const cli_env *env, cl_kernel softmax, const cl_mem qkv[3], cl_mem s, cl_mem o, int T, int HQ,
                        int H, int D, cl_event *done)
{
    const int G = HQ / H, tc = chunk_rows(T);
    const float scale = 1.0f / sqrtf((float)D);
    cl_command_queue q = env->queue;
    const size_t lsz = 256;
    *done = NULL;
    for (int h = 0; h < HQ; ++h)
        for (int r0 = 0; r0 < T; r0 += tc) {
            const int nr = T - r0 < tc ? T - r0 : tc, nk = r0 + nr;
            const size_t qo = ((size_t)r0 * HQ + h) * D, ko = (size_t)(h / G) * D, gsz = (size_t)nr * lsz;
            const bool last = h == HQ - 1 && r0 + nr == T;
            cl_event ev = NULL;
            if (CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, (size_t)nr, (size_t)nk, (size_t)D,
                             scale, qkv[0], qo, (size_t)HQ * D, qkv[1], ko, (size_t)H * D, 0.0f, s, 0, (size_t)nk, &q, NULL) !=
                    CLBlastSuccess ||
                clSetKernelArg(softmax, 0, sizeof s, &s) != CL_SUCCESS || clSetKernelArg(softmax, 1, sizeof nk, &nk) != CL_SUCCESS ||
                clSetKernelArg(softmax, 2, sizeof r0, &r0) != CL_SUCCESS ||
                clEnqueueNDRangeKernel(q, softmax, 1, NULL, &gsz, &lsz, 0, NULL, NULL) != CL_SUCCESS ||
                CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, (size_t)nr, (size_t)D, (size_t)nk, 1.0f, s,
                             0, (size_t)nk, qkv[2], ko, (size_t)H * D, 0.0f, o, qo, (size_t)HQ * D, &q, last ? &ev : NULL) !=
                    CLBlastSuccess)
                return -1;
            if (ev) *done = ev;
        }
    return *done ? 0 : -1;
}

/* The outputs of tokens 0, T/2 and T-1 (every head) against a double
 * reference on the host: the largest relative error of a row. */
static double check_rows(const cli_env *env, const cl_mem qkv[3], cl_mem o, int T, int HQ, int H, int D)
{
    const size_t nq = (size_t)T * HQ * D, nk = (size_t)T * H * D;
    float *q = cli_malloc(nq * 4), *k = cli_malloc(nk * 4), *v = cli_malloc(nk * 4), *out = cli_malloc(nq * 4);
    double *p = cli_malloc((size_t)T * sizeof *p), worst = INFINITY;
    if (q && k && v && out && p && !cli_download_f32(env, qkv[0], nq, CLNSA_DTYPE_F32, q) &&
        !cli_download_f32(env, qkv[1], nk, CLNSA_DTYPE_F32, k) && !cli_download_f32(env, qkv[2], nk, CLNSA_DTYPE_F32, v) &&
        !cli_download_f32(env, o, nq, CLNSA_DTYPE_F32, out)) {
        worst = 0;
        const int rows[3] = {0, T / 2, T - 1};
        for (int r = 0; r < 3; ++r)
            for (int h = 0; h < HQ; ++h) {
                const int t = rows[r], g = h / (HQ / H);
                const float *qr = q + ((size_t)t * HQ + h) * D;
                double m = -INFINITY, sum = 0, err = 0, norm = 0;
                for (int j = 0; j <= t; ++j) {
                    double x = 0;
                    for (int d = 0; d < D; ++d) x += (double)qr[d] * k[((size_t)j * H + g) * D + d];
                    p[j] = x / sqrt((double)D);
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j <= t; ++j) sum += (p[j] = exp(p[j] - m));
                for (int d = 0; d < D; ++d) {
                    double ref = 0;
                    for (int j = 0; j <= t; ++j) ref += p[j] * v[((size_t)j * H + g) * D + d];
                    ref /= sum;
                    const double e = out[((size_t)t * HQ + h) * D + d] - ref;
                    err += e * e;
                    norm += ref * ref;
                }
                worst = fmax(worst, sqrt(err / fmax(norm, 1e-30)));
            }
    }
    free(q), free(k), free(v), free(out), free(p);
    return worst;
}

double clblast_dense_forward_ms(const cli_env *env, int T, int HQ, int H, int D, int repeat)
{
    uint64_t seed = 11;
    const size_t nq = (size_t)T * HQ * D, nk = (size_t)T * H * D;
    cl_mem qkv[3] = {cli_random(env, nq, -1, 1, CLNSA_DTYPE_F32, &seed), cli_random(env, nk, -1, 1, CLNSA_DTYPE_F32, &seed),
                     cli_random(env, nk, -1, 1, CLNSA_DTYPE_F32, &seed)};
    cl_mem s = cli_buffer(env, (size_t)chunk_rows(T) * T * 4, NULL), o = cli_buffer(env, nq * 4, NULL);
    cl_int err = CL_SUCCESS;
    cl_program prog = clCreateProgramWithSource(env->cl, 1, &softmax_src, NULL, &err);
    cl_kernel softmax = NULL;
    if (err == CL_SUCCESS && clBuildProgram(prog, 1, &env->device, "", NULL, NULL) == CL_SUCCESS)
        softmax = clCreateKernel(prog, "causal_softmax", &err);
    double ms[64] = {0}, med = -1;
    int runs = 0;
    if (qkv[0] && qkv[1] && qkv[2] && s && o && softmax)
        for (int it = -1; it < repeat && it < 64; ++it) { /* it = -1: warm-up (CLBlast builds its kernels) */
            cli_timer t;
            cl_event done = NULL;
            if (cli_timer_begin(env, &t)) break;
            const int rc = forward_once(env, softmax, qkv, s, o, T, HQ, H, D, &done);
            const double x = cli_timer_end(&t, rc ? NULL : done);
            if (done) clReleaseEvent(done);
            if (rc || x < 0) break;
            if (it >= 0) ms[runs++] = x;
        }
    const double rel = runs == repeat ? check_rows(env, qkv, o, T, HQ, H, D) : INFINITY;
    if (runs == repeat && !(rel < 1e-4)) {
        fprintf(stderr, "clnsa bench: clblast: output rel L2 %.3g against the host reference at T=%d\n", rel, T);
        runs = 0;
    }
    if (runs == repeat) {
        cli_sort_doubles(ms, (size_t)runs);
        med = ms[runs / 2];
    } else {
        fprintf(stderr, "clnsa bench: clblast: the CLBlast dense forward failed at T=%d\n", T);
    }
    if (softmax) clReleaseKernel(softmax);
    if (prog) clReleaseProgram(prog);
    cl_mem all[5] = {qkv[0], qkv[1], qkv[2], s, o};
    for (int i = 0; i < 5; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
    return med;
}
