/* bench_nsa.c: time of each NSA forward branch and of the whole forward at a
 * sweep of T, in the anchor configuration of ../shared/anchors (bf16, B = 1,
 * HQ = 64, H = 4, D = 128, 16 blocks of 64) unless told otherwise. Times are
 * medians of OpenCL profiling events after a warm-up, with inputs rotated
 * between two sets so caches do not flatter. Prints a table and JSON.
 *
 *   bench_nsa [--T 4096,8192] [--HQ 64] [--H 4] [--D 128] [--window 512]
 *             [--dtype bf16] [--repeat 5] [--json out.json]
 * The device is CLNSA_TEST_DEVICE ("P:D") or the first one found. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, T, HQ, H, D, window, repeat;
    clnsa_dtype dt;
} bench_cfg;

enum { BR_CMP, BR_TOPK, BR_SLC, BR_SWA, BR_ALL, BR_COUNT };
static const char *const branch_names[BR_COUNT] = {"cmp", "topk+slc", "slc", "swa", "nsa"};

typedef struct {
    cl_mem q, k, v, g, idx;
} input_set;

static test_env env;

static input_set make_inputs(const bench_cfg *c, uint64_t seed)
{
    input_set s;
    size_t nq = (size_t)c->B * c->T * c->HQ * c->D, nk = (size_t)c->B * c->T * c->H * c->D;
    size_t ng = (size_t)c->B * c->T * c->HQ, ni = (size_t)c->B * c->T * c->H * 16;
    double *x = alloc_uniform(nq, -1, 1, &seed);
    s.q = upload(&env, x, nq, c->dt, false);
    fill_uniform(x, nk, -1, 1, &seed);
    s.k = upload(&env, x, nk, c->dt, false);
    fill_uniform(x, nk, -1, 1, &seed);
    s.v = upload(&env, x, nk, c->dt, false);
    fill_uniform(x, ng, 0, 1, &seed);
    s.g = upload(&env, x, ng, c->dt, false);
    free(x);
    /* random causal block indices for the selection-only timing */
    int32_t *idx = malloc(ni * sizeof *idx);
    for (size_t r = 0; r < ni / 16; ++r) {
        int t = (int)(r / c->H % c->T), nb = t / 64 + 1;
        for (int j = 0; j < 16; ++j) idx[r * 16 + j] = j < nb ? (int)((r * 7919u + j * 104729u) % (unsigned)nb) : -1;
    }
    s.idx = upload_i32(&env, idx, ni);
    free(idx);
    return s;
}

static void free_inputs(input_set *s)
{
    clReleaseMemObject(s->q);
    clReleaseMemObject(s->k);
    clReleaseMemObject(s->v);
    clReleaseMemObject(s->g);
    clReleaseMemObject(s->idx);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of one branch configuration, from the end of a marker
 * enqueued just before the forward to the end of the forward's last command
 * (the chain may hold several kernels); -1 on error. */
static double time_branch(const bench_cfg *c, int br, input_set *sets, cl_mem o, cl_mem bi, cl_mem lse,
                          cl_command_queue q)
{
    clnsa_nsa_config cfg;
    clnsa_nsa_config_init(&cfg);
    cfg.window = (br == BR_SWA || br == BR_ALL) ? c->window : 0;
    if ((br == BR_SWA) && cfg.window == 0) return -1;
    double *ms = calloc((size_t)c->repeat, sizeof *ms);
    cl_mem ws = NULL;
    size_t ws_bytes = 0;
    double med = -1;
    for (int it = -1; it < c->repeat; ++it) {
        input_set *s = &sets[(it + 2) % 2];
        clnsa_nsa_inputs in;
        memset(&in, 0, sizeof in);
        in.q = tensor4(s->q, c->dt, c->B, c->T, c->HQ, c->D);
        in.k = tensor4(s->k, c->dt, c->B, c->T, c->H, c->D);
        in.v = tensor4(s->v, c->dt, c->B, c->T, c->H, c->D);
        clnsa_tensor g = tensor3(s->g, c->dt, c->B, c->T, c->HQ);
        if (br == BR_CMP || br == BR_ALL) in.g_cmp = g;
        if (br == BR_TOPK || br == BR_SLC || br == BR_ALL) in.g_slc = g;
        if (br == BR_SWA || (br == BR_ALL && cfg.window > 0)) in.g_swa = g;
        if (br == BR_SLC) in.block_indices = tensor4(s->idx, CLNSA_DTYPE_I32, c->B, c->T, c->H, 16);
        clnsa_nsa_outputs out;
        memset(&out, 0, sizeof out);
        out.o = tensor4(o, c->dt, c->B, c->T, c->HQ, c->D);
        out.block_indices = tensor4(bi, CLNSA_DTYPE_I32, c->B, c->T, c->H, 16);
        out.lse_cmp = tensor3(lse, CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
        if (!ws) {
            if (clnsa_nsa_forward_workspace_size(env.ctx, q, &cfg, &in, &out, &ws_bytes) != CLNSA_SUCCESS) goto fail;
            cl_int err;
            ws = clCreateBuffer(env.cl, CL_MEM_READ_WRITE, ws_bytes ? ws_bytes : 4, NULL, &err);
        }
        cl_event start, end;
        clEnqueueMarkerWithWaitList(q, 0, NULL, &start);
        if (clnsa_nsa_forward(env.ctx, q, &cfg, &in, &out, ws, ws_bytes, 1, &start, &end) != CLNSA_SUCCESS) {
            clReleaseEvent(start);
            goto fail;
        }
        clWaitForEvents(1, &end);
        cl_ulong a = 0, b = 0;
        clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_END, sizeof a, &a, NULL);
        clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
        if (it >= 0) ms[it] = (double)(b - a) * 1e-6;
        
        clReleaseEvent(start);
        clReleaseEvent(end);
    }
    qsort(ms, (size_t)c->repeat, sizeof *ms, cmp_double);
    med = ms[c->repeat / 2];
    goto done;
fail:
    fprintf(stderr, "bench: %s: %s\n", branch_names[br], clnsa_last_error(env.ctx));
done:
    if (ws) clReleaseMemObject(ws);
    free(ms);
    return med;
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

int main(int argc, char **argv)
{
    bench_cfg c = {1, 0, 64, 4, 128, 512, 5, CLNSA_DTYPE_BF16};
    int Ts[16] = {4096, 8192, 16384, 32768, 65536}, nT = 5;
    const char *json = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--T")) nT = parse_list(v, Ts, 16);
        else if (!strcmp(k, "--HQ")) c.HQ = atoi(v);
        else if (!strcmp(k, "--H")) c.H = atoi(v);
        else if (!strcmp(k, "--D")) c.D = atoi(v);
        else if (!strcmp(k, "--window")) c.window = atoi(v);
        else if (!strcmp(k, "--repeat")) c.repeat = atoi(v) > 0 ? atoi(v) : 1;
        else if (!strcmp(k, "--json")) json = v;
        else if (!strcmp(k, "--dtype"))
            c.dt = !strcmp(v, "f32") ? CLNSA_DTYPE_F32 : !strcmp(v, "f16") ? CLNSA_DTYPE_F16 : CLNSA_DTYPE_BF16;
        else {
            fprintf(stderr, "bench_nsa: unknown option %s\n", k);
            return 2;
        }
    }
    test_env_open(&env);
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(env.cl, env.device, CL_QUEUE_PROFILING_ENABLE, &err);
    const clnsa_device_info *di = clnsa_context_device_info(env.ctx);
    printf("device: %s (%s, %s), dtype %s, B=%d HQ=%d H=%d D=%d, 16 blocks of 64, window %d, median of %d\n",
           di->name, di->platform_name, di->driver_version, clnsa_dtype_name(c.dt), c.B, c.HQ, c.H, c.D, c.window,
           c.repeat);
    printf("%8s %10s %10s %10s %10s %10s  (ms)\n", "T", "cmp", "topk+slc", "slc", "swa", "nsa");
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (jf)
        fprintf(jf, "{\"device\": \"%s\", \"driver\": \"%s\", \"dtype\": \"%s\", \"B\": %d, \"HQ\": %d, \"H\": %d, \"D\": %d, "
                    "\"window\": %d, \"path\": \"portable\", \"results\": [",
                di->name, di->driver_version, clnsa_dtype_name(c.dt), c.B, c.HQ, c.H, c.D, c.window);
    for (int ti = 0; ti < nT; ++ti) {
        c.T = Ts[ti];
        input_set sets[2] = {make_inputs(&c, 1), make_inputs(&c, 2)};
        cl_mem o = poisoned(&env, (size_t)c.B * c.T * c.HQ * c.D, c.dt);
        cl_mem bi = poisoned(&env, (size_t)c.B * c.T * c.H * 16, CLNSA_DTYPE_I32);
        cl_mem lse = poisoned(&env, (size_t)c.B * c.T * c.HQ, CLNSA_DTYPE_F32);
        double ms[BR_COUNT];
        printf("%8d", c.T);
        for (int br = 0; br < BR_COUNT; ++br) {
            ms[br] = time_branch(&c, br, sets, o, bi, lse, q);
            printf(" %10.3f", ms[br]);
            fflush(stdout);
        }
        printf("\n");
        if (jf) {
            fprintf(jf, "%s{\"T\": %d", ti ? ", " : "", c.T);
            for (int br = 0; br < BR_COUNT; ++br) fprintf(jf, ", \"%s_fwd_ms\": %.4f", branch_names[br], ms[br]);
            fprintf(jf, "}");
        }
        clReleaseMemObject(o);
        clReleaseMemObject(bi);
        clReleaseMemObject(lse);
        free_inputs(&sets[0]);
        free_inputs(&sets[1]);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    clReleaseCommandQueue(q);
    test_env_close(&env);
    return 0;
}
