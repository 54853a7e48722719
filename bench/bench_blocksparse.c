/* bench_blocksparse.c: block-sparse attention forward and backward time at a
 * sweep of T, for three patterns of the same kernels:
 *   dense    causal, no block mask (the baseline every speedup is against);
 *   window   causal sliding window of --window keys (window_left = W - 1);
 *   sparse   a random block mask of --density (0.1 = 90% sparse) blocks of
 *            --block x --block, shared by all heads, not causal (each query
 *            block keeps its diagonal block, so no row is empty).
 * Times are medians of --repeat runs after a warm-up, from OpenCL profiling
 * events (a marker just before the op to the op's last command, layout
 * building included). Prints a table and, with --json, writes JSON.
 *
 *   bench_blocksparse [--T 1024,2048] [--B 1] [--HQ 8] [--H 2] [--D 64]
 *                     [--window 1024] [--density 0.1] [--block 64]
 *                     [--dtype f32|f16|bf16] [--repeat 5] [--no-bwd] [--json out.json]
 * On the GPU machine: --T 4096,8192,16384,32768,65536 --HQ 16 --H 4 --D 128.
 * The device is CLNSA_TEST_DEVICE ("P:D" or a platform name word) or the first one found. */
#include "bench_util.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, T, HQ, H, D, window, block, repeat, bwd;
    double density;
    clnsa_dtype dt;
} bench_cfg;

enum { P_DENSE, P_WINDOW, P_SPARSE, P_COUNT };
static const char *const pattern_names[P_COUNT] = {"dense_causal", "window", "sparse"};

static test_env env;

typedef struct {
    cl_mem q, k, v, dout, o, lse, dq, dk, dv, mask;
    double mask_density; /* measured */
} bufs;

static cl_mem rand_buf(size_t n, clnsa_dtype dt, uint64_t *seed)
{
    double *x = alloc_uniform(n, -1, 1, seed);
    cl_mem m = upload(&env, x, n, dt, false);
    free(x);
    return m;
}

static bufs make_bufs(const bench_cfg *c)
{
    uint64_t seed = 7;
    bufs b;
    const size_t nq = (size_t)c->B * c->T * c->HQ * c->D, nk = (size_t)c->B * c->T * c->H * c->D;
    b.q = rand_buf(nq, c->dt, &seed);
    b.k = rand_buf(nk, c->dt, &seed);
    b.v = rand_buf(nk, c->dt, &seed);
    b.dout = rand_buf(nq, c->dt, &seed);
    b.o = poisoned(&env, nq, c->dt);
    b.lse = poisoned(&env, (size_t)c->B * c->T * c->HQ, CLNSA_DTYPE_F32);
    b.dq = poisoned(&env, nq, c->dt);
    b.dk = poisoned(&env, nk, c->dt);
    b.dv = poisoned(&env, nk, c->dt);
    const int nb = (c->T + c->block - 1) / c->block;
    int32_t *m = malloc((size_t)nb * nb * sizeof *m);
    size_t on = 0;
    double r;
    for (int i = 0; i < nb; ++i)
        for (int j = 0; j < nb; ++j) {
            fill_uniform(&r, 1, 0, 1, &seed);
            m[(size_t)i * nb + j] = i == j || r < c->density;
            on += (size_t)m[(size_t)i * nb + j];
        }
    b.mask = upload_i32(&env, m, (size_t)nb * nb);
    b.mask_density = (double)on / ((double)nb * nb);
    free(m);
    return b;
}

static void free_bufs(bufs *b)
{
    cl_mem all[] = {b->q, b->k, b->v, b->dout, b->o, b->lse, b->dq, b->dk, b->dv, b->mask};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) clReleaseMemObject(all[i]);
}

/* Median forward and backward ms of one pattern; -1 on failure. */
static void time_pattern(const bench_cfg *c, int pat, const bufs *b, cl_command_queue q, double *fwd_ms, double *bwd_ms)
{
    clnsa_blocksparse_config cfg;
    clnsa_blocksparse_config_init(&cfg);
    cfg.causal = pat != P_SPARSE;
    if (pat == P_WINDOW) cfg.window_left = c->window - 1;
    cfg.q_block = cfg.kv_block = c->block;
    clnsa_blocksparse_inputs in;
    memset(&in, 0, sizeof in);
    in.q = tensor4(b->q, c->dt, c->B, c->T, c->HQ, c->D);
    in.k = tensor4(b->k, c->dt, c->B, c->T, c->H, c->D);
    in.v = tensor4(b->v, c->dt, c->B, c->T, c->H, c->D);
    const int nb = (c->T + c->block - 1) / c->block;
    int64_t ms[2] = {nb, nb};
    if (pat == P_SPARSE) in.block_mask = clnsa_tensor_contiguous(b->mask, CLNSA_DTYPE_I32, 2, ms);
    clnsa_blocksparse_outputs out = {tensor4(b->o, c->dt, c->B, c->T, c->HQ, c->D),
                                     tensor3(b->lse, CLNSA_DTYPE_F32, c->B, c->T, c->HQ)};
    clnsa_blocksparse_grad_inputs gin = {out.o, out.lse, tensor4(b->dout, c->dt, c->B, c->T, c->HQ, c->D)};
    clnsa_blocksparse_grads gr = {tensor4(b->dq, c->dt, c->B, c->T, c->HQ, c->D), tensor4(b->dk, c->dt, c->B, c->T, c->H, c->D),
                                  tensor4(b->dv, c->dt, c->B, c->T, c->H, c->D), {0}};
    size_t fb = 0, bb = 0;
    double *t = calloc(2 * (size_t)c->repeat, sizeof *t);
    cl_mem ws = NULL;
    *fwd_ms = *bwd_ms = -1;
    if (clnsa_blocksparse_forward_workspace_size(env.ctx, &cfg, &in, &out, &fb) != CLNSA_SUCCESS ||
        (c->bwd && clnsa_blocksparse_backward_workspace_size(env.ctx, &cfg, &in, &gin, &gr, &bb) != CLNSA_SUCCESS))
        goto fail;
    const size_t wsb = fb > bb ? fb : bb;
    cl_int err;
    ws = clCreateBuffer(env.cl, CL_MEM_READ_WRITE, wsb ? wsb : 4, NULL, &err);
    if (err != CL_SUCCESS) goto fail;
    for (int it = -1; it < c->repeat; ++it)
        for (int pass = 0; pass < (c->bwd ? 2 : 1); ++pass) {
            cl_event start, end = NULL;
            clEnqueueMarkerWithWaitList(q, 0, NULL, &start);
            clnsa_status st = pass == 0
                                  ? clnsa_blocksparse_forward(env.ctx, q, &cfg, &in, &out, ws, wsb, 1, &start, &end)
                                  : clnsa_blocksparse_backward(env.ctx, q, &cfg, &in, &gin, &gr, ws, wsb, 1, &start, &end);
            if (st != CLNSA_SUCCESS) {
                clReleaseEvent(start);
                goto fail;
            }
            clWaitForEvents(1, &end);
            if (it >= 0) t[pass * c->repeat + it] = bench_span_ms(start, end);
            clReleaseEvent(start);
            clReleaseEvent(end);
        }
    *fwd_ms = bench_median(t, (size_t)c->repeat);
    if (c->bwd) {
        *bwd_ms = bench_median(t + c->repeat, (size_t)c->repeat);
    }
    goto done;
fail:
    fprintf(stderr, "bench_blocksparse: %s: %s\n", pattern_names[pat], clnsa_last_error(env.ctx));
done:
    if (ws) clReleaseMemObject(ws);
    free(t);
}

/* Fraction of (query, key) pairs a pattern leaves visible (causal and the
 * window counted exactly; the mask by its blocks). */
static double visible_fraction(const bench_cfg *c, int pat, double mask_density)
{
    const double T = c->T;
    if (pat == P_DENSE) return (T + 1) / (2 * T);
    if (pat == P_SPARSE) return mask_density;
    const double W = c->window < c->T ? c->window : c->T;
    return (W * T - W * (W - 1) / 2) / (T * T);
}

int main(int argc, char **argv)
{
    bench_cfg c = {1, 0, 8, 2, 64, 1024, 64, 5, 1, 0.1, CLNSA_DTYPE_F32};
    int Ts[16] = {1024, 2048}, nT = 2;
    const char *json = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(k, "--no-bwd")) {
            c.bwd = 0;
            continue;
        }
        if (!strcmp(k, "--help")) {
            printf("bench_blocksparse [--T 1024,2048] [--B 1] [--HQ 8] [--H 2] [--D 64] [--window 1024] [--density 0.1]\n"
                   "                  [--block 64] [--dtype f32|f16|bf16] [--repeat 5] [--no-bwd] [--json FILE]\n");
            return 0;
        }
        ++i;
        if (!strcmp(k, "--T")) nT = bench_parse_list(v, Ts, 16);
        else if (!strcmp(k, "--B")) c.B = atoi(v);
        else if (!strcmp(k, "--HQ")) c.HQ = atoi(v);
        else if (!strcmp(k, "--H")) c.H = atoi(v);
        else if (!strcmp(k, "--D")) c.D = atoi(v);
        else if (!strcmp(k, "--window")) c.window = atoi(v);
        else if (!strcmp(k, "--density")) c.density = atof(v);
        else if (!strcmp(k, "--block")) c.block = atoi(v);
        else if (!strcmp(k, "--repeat")) c.repeat = atoi(v) > 0 ? atoi(v) : 1;
        else if (!strcmp(k, "--json")) json = v;
        else if (!strcmp(k, "--dtype"))
            c.dt = !strcmp(v, "f32") ? CLNSA_DTYPE_F32 : !strcmp(v, "f16") ? CLNSA_DTYPE_F16 : CLNSA_DTYPE_BF16;
        else {
            fprintf(stderr, "bench_blocksparse: unknown option %s (see --help)\n", k);
            return 2;
        }
    }
    if (c.B < 1 || c.H < 1 || c.HQ < c.H || c.HQ % c.H || c.D < 8 || c.D % 8 || c.window < 1 || c.block < 1 || nT < 1) {
        fprintf(stderr, "bench_blocksparse: bad sizes (need B, H >= 1, H | HQ, D a multiple of 8, window, block >= 1)\n");
        return 2;
    }
    test_env_open(&env);
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(env.cl, env.device, CL_QUEUE_PROFILING_ENABLE, &err);
    const clnsa_device_info *di = clnsa_context_device_info(env.ctx);
    printf("device: %s (%s, %s), dtype %s, B=%d HQ=%d H=%d D=DV=%d, window %d, mask blocks %d (density %.2f), median of %d\n",
           di->name, di->platform_name, di->driver_version, clnsa_dtype_name(c.dt), c.B, c.HQ, c.H, c.D, c.window, c.block,
           c.density, c.repeat);
    printf("%8s %-13s %9s %10s %10s %9s %9s\n", "T", "pattern", "visible", "fwd ms", "bwd ms", "fwd x", "bwd x");
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) fprintf(stderr, "bench_blocksparse: cannot write %s\n", json);
    if (jf)
        fprintf(jf, "{\"device\": \"%s\", \"platform\": \"%s\", \"driver\": \"%s\", \"dtype\": \"%s\", \"B\": %d, \"HQ\": %d, "
                    "\"H\": %d, \"D\": %d, \"window\": %d, \"block\": %d, \"density\": %.3f, \"repeat\": %d, \"results\": [",
                di->name, di->platform_name, di->driver_version, clnsa_dtype_name(c.dt), c.B, c.HQ, c.H, c.D, c.window,
                c.block, c.density, c.repeat);
    for (int ti = 0; ti < nT; ++ti) {
        c.T = Ts[ti];
        bufs b = make_bufs(&c);
        double f[P_COUNT], bw[P_COUNT];
        for (int p = 0; p < P_COUNT; ++p) {
            time_pattern(&c, p, &b, q, &f[p], &bw[p]);
            const double vis = visible_fraction(&c, p, b.mask_density);
            const double fx = f[p] > 0 && f[P_DENSE] > 0 ? f[P_DENSE] / f[p] : 0;
            const double bx = bw[p] > 0 && bw[P_DENSE] > 0 ? bw[P_DENSE] / bw[p] : 0;
            printf("%8d %-13s %8.1f%% %10.3f %10.3f %8.2fx %8.2fx\n", c.T, pattern_names[p], 100 * vis, f[p], bw[p], fx, bx);
            fflush(stdout);
            if (jf)
                fprintf(jf, "%s{\"T\": %d, \"pattern\": \"%s\", \"visible_fraction\": %.5f, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, "
                            "\"fwd_speedup_vs_dense_causal\": %.3f, \"bwd_speedup_vs_dense_causal\": %.3f}",
                        ti || p ? ", " : "", c.T, pattern_names[p], vis, f[p], bw[p], fx, bx);
        }
        free_bufs(&b);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    clReleaseCommandQueue(q);
    test_env_close(&env);
    return 0;
}
