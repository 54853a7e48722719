/* bench_nsa.c: time of each NSA branch, forward and backward, and of the whole
 * NSA at a sweep of T, in the anchor configuration of ../shared/anchors
 * (bf16, B = 1, HQ = 64, H = 4, D = 128, 16 blocks of 64) unless told
 * otherwise. Times are medians of OpenCL profiling events after a warm-up,
 * with inputs rotated between two sets so caches do not flatter. Prints a
 * table and JSON.
 *
 *   bench_nsa [--T 4096,8192] [--HQ 64] [--H 4] [--D 128] [--window 512]
 *             [--dtype bf16] [--repeat 5] [--no-bwd] [--json out.json]
 * The device is CLNSA_TEST_DEVICE ("P:D" or a platform-name word) or the
 * first one found. Branches: cmp (compressed only), topk+slc (top-k and
 * selection), slc (selection with given random causal indices), swa
 * (window only), nsa (all three, with top-k). */
#include "bench_util.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, T, HQ, H, D, window, repeat, bwd;
    clnsa_dtype dt;
} bench_cfg;

enum { BR_CMP, BR_TOPK, BR_SLC, BR_SWA, BR_ALL, BR_COUNT };
static const char *const branch_names[BR_COUNT] = {"cmp", "topk+slc", "slc", "swa", "nsa"};

typedef struct {
    cl_mem q, k, v, g, idx, dout;
} input_set;

/* Outputs and gradients, shared by every branch at one T. */
typedef struct {
    cl_mem o, bi, lse[3], dq, dk, dv, dg[3];
} output_set;

static test_env env;

static cl_mem random_buffer(size_t n, double lo, double hi, clnsa_dtype dt, uint64_t *seed)
{
    double *x = alloc_uniform(n, lo, hi, seed);
    cl_mem m = upload(&env, x, n, dt, false);
    free(x);
    return m;
}

static input_set make_inputs(const bench_cfg *c, uint64_t seed)
{
    input_set s;
    const size_t nq = (size_t)c->B * c->T * c->HQ, nk = (size_t)c->B * c->T * c->H;
    s.q = random_buffer(nq * c->D, -1, 1, c->dt, &seed);
    s.k = random_buffer(nk * c->D, -1, 1, c->dt, &seed);
    s.v = random_buffer(nk * c->D, -1, 1, c->dt, &seed);
    s.g = random_buffer(nq, 0, 1, c->dt, &seed);
    s.dout = random_buffer(nq * c->D, -1, 1, c->dt, &seed);
    /* random causal block indices for the selection-only timing */
    int32_t *idx = malloc(nk * 16 * sizeof *idx);
    for (size_t r = 0; r < nk; ++r) {
        int t = (int)(r / c->H % c->T), nb = t / 64 + 1;
        for (int j = 0; j < 16; ++j) idx[r * 16 + j] = j < nb ? (int)((r * 7919u + j * 104729u) % (unsigned)nb) : -1;
    }
    s.idx = upload_i32(&env, idx, nk * 16);
    free(idx);
    return s;
}

static output_set make_outputs(const bench_cfg *c)
{
    output_set o;
    const size_t nq = (size_t)c->B * c->T * c->HQ, nk = (size_t)c->B * c->T * c->H;
    o.o = poisoned(&env, nq * c->D, c->dt);
    o.bi = poisoned(&env, nk * 16, CLNSA_DTYPE_I32);
    o.dq = poisoned(&env, nq * c->D, c->dt);
    o.dk = poisoned(&env, nk * c->D, c->dt);
    o.dv = poisoned(&env, nk * c->D, c->dt);
    for (int i = 0; i < 3; ++i) {
        o.lse[i] = poisoned(&env, nq, CLNSA_DTYPE_F32);
        o.dg[i] = poisoned(&env, nq, c->dt);
    }
    return o;
}

static void release_all(cl_mem *m, size_t n)
{
    for (size_t i = 0; i < n; ++i) clReleaseMemObject(m[i]);
}

static void describe(const bench_cfg *c, int br, const input_set *s, const output_set *o, clnsa_nsa_config *cfg,
                     clnsa_nsa_inputs *in, clnsa_nsa_outputs *out, clnsa_nsa_grads *gr, clnsa_tensor *dout)
{
    clnsa_nsa_config_init(cfg);
    cfg->window = (br == BR_SWA || br == BR_ALL) ? c->window : 0;
    memset(in, 0, sizeof *in);
    in->q = tensor4(s->q, c->dt, c->B, c->T, c->HQ, c->D);
    in->k = tensor4(s->k, c->dt, c->B, c->T, c->H, c->D);
    in->v = tensor4(s->v, c->dt, c->B, c->T, c->H, c->D);
    clnsa_tensor g = tensor3(s->g, c->dt, c->B, c->T, c->HQ);
    if (br == BR_CMP || br == BR_ALL) in->g_cmp = g;
    if (br == BR_TOPK || br == BR_SLC || br == BR_ALL) in->g_slc = g;
    if (br == BR_SWA || (br == BR_ALL && cfg->window > 0)) in->g_swa = g;
    if (br == BR_SLC) in->block_indices = tensor4(s->idx, CLNSA_DTYPE_I32, c->B, c->T, c->H, 16);
    memset(out, 0, sizeof *out);
    out->o = tensor4(o->o, c->dt, c->B, c->T, c->HQ, c->D);
    out->block_indices = tensor4(o->bi, CLNSA_DTYPE_I32, c->B, c->T, c->H, 16);
    out->lse_cmp = tensor3(o->lse[0], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out->lse_slc = tensor3(o->lse[1], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    out->lse_swa = tensor3(o->lse[2], CLNSA_DTYPE_F32, c->B, c->T, c->HQ);
    memset(gr, 0, sizeof *gr);
    gr->dq = tensor4(o->dq, c->dt, c->B, c->T, c->HQ, c->D);
    gr->dk = tensor4(o->dk, c->dt, c->B, c->T, c->H, c->D);
    gr->dv = tensor4(o->dv, c->dt, c->B, c->T, c->H, c->D);
    *dout = tensor4(s->dout, c->dt, c->B, c->T, c->HQ, c->D);
}

/* Median forward and backward ms of one branch configuration; -1 where it
 * failed or was not asked for. */
static void time_branch(const bench_cfg *c, int br, input_set *sets, const output_set *o, cl_command_queue q,
                        double *fwd_ms, double *bwd_ms)
{
    double *ms = calloc(2 * (size_t)c->repeat, sizeof *ms);
    cl_mem ws = NULL;
    size_t ws_bytes = 0;
    *fwd_ms = *bwd_ms = -1;
    for (int it = -1; it < c->repeat; ++it) {
        clnsa_nsa_config cfg;
        clnsa_nsa_inputs in;
        clnsa_nsa_outputs out;
        clnsa_nsa_grads gr;
        clnsa_tensor dout;
        describe(c, br, &sets[(it + 2) % 2], o, &cfg, &in, &out, &gr, &dout);
        if (!ws) {
            size_t fb = 0, bb = 0;
            if (clnsa_nsa_forward_workspace_size(env.ctx, q, &cfg, &in, &out, &fb) != CLNSA_SUCCESS ||
                (c->bwd && clnsa_nsa_backward_workspace_size(env.ctx, q, &cfg, &in, &out, &dout, &gr, &bb) != CLNSA_SUCCESS))
                goto fail;
            ws_bytes = fb > bb ? fb : bb;
            cl_int err;
            ws = clCreateBuffer(env.cl, CL_MEM_READ_WRITE, ws_bytes ? ws_bytes : 4, NULL, &err);
        }
        for (int pass = 0; pass < (c->bwd ? 2 : 1); ++pass) {
            cl_event start, end;
            clEnqueueMarkerWithWaitList(q, 0, NULL, &start);
            clnsa_status st = pass == 0 ? clnsa_nsa_forward(env.ctx, q, &cfg, &in, &out, ws, ws_bytes, 1, &start, &end)
                                        : clnsa_nsa_backward(env.ctx, q, &cfg, &in, &out, &dout, &gr, ws, ws_bytes, 1,
                                                             &start, &end);
            if (st != CLNSA_SUCCESS) {
                clReleaseEvent(start);
                goto fail;
            }
            clWaitForEvents(1, &end);
            if (it >= 0) ms[pass * c->repeat + it] = bench_span_ms(start, end);
            clReleaseEvent(start);
            clReleaseEvent(end);
        }
    }
    *fwd_ms = bench_median(ms, (size_t)c->repeat);
    if (c->bwd) {
        *bwd_ms = bench_median(ms + c->repeat, (size_t)c->repeat);
    }
    goto done;
fail:
    fprintf(stderr, "bench: %s: %s\n", branch_names[br], clnsa_last_error(env.ctx));
done:
    if (ws) clReleaseMemObject(ws);
    free(ms);
}

int main(int argc, char **argv)
{
    bench_cfg c = {1, 0, 64, 4, 128, 512, 5, 1, CLNSA_DTYPE_BF16};
    int Ts[16] = {4096, 8192, 16384, 32768, 65536}, nT = 5;
    const char *json = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(k, "--no-bwd")) {
            c.bwd = 0;
            continue;
        }
        ++i;
        if (!strcmp(k, "--T")) nT = bench_parse_list(v, Ts, 16);
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
    printf("device: %s (%s, %s), dtype %s, B=%d HQ=%d H=%d D=%d, 16 blocks of 64, window %d, median of %d\n", di->name,
           di->platform_name, di->driver_version, clnsa_dtype_name(c.dt), c.B, c.HQ, c.H, c.D, c.window, c.repeat);
    printf("%8s", "T");
    for (int br = 0; br < BR_COUNT; ++br) printf(" %10s %10s", branch_names[br], "bwd");
    printf("  (ms)\n");
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (jf)
        fprintf(jf, "{\"device\": \"%s\", \"driver\": \"%s\", \"dtype\": \"%s\", \"B\": %d, \"HQ\": %d, \"H\": %d, \"D\": %d, "
                    "\"window\": %d, \"path\": \"portable\", \"results\": [",
                di->name, di->driver_version, clnsa_dtype_name(c.dt), c.B, c.HQ, c.H, c.D, c.window);
    for (int ti = 0; ti < nT; ++ti) {
        c.T = Ts[ti];
        input_set sets[2] = {make_inputs(&c, 1), make_inputs(&c, 2)};
        output_set o = make_outputs(&c);
        printf("%8d", c.T);
        if (jf) fprintf(jf, "%s{\"T\": %d", ti ? ", " : "", c.T);
        for (int br = 0; br < BR_COUNT; ++br) {
            double f, b;
            time_branch(&c, br, sets, &o, q, &f, &b);
            printf(" %10.3f %10.3f", f, b);
            fflush(stdout);
            if (jf) fprintf(jf, ", \"%s_fwd_ms\": %.4f, \"%s_bwd_ms\": %.4f", branch_names[br], f, branch_names[br], b);
        }
        printf("\n");
        if (jf) fprintf(jf, "}");
        for (int s = 0; s < 2; ++s) release_all(&sets[s].q, sizeof sets[s] / sizeof(cl_mem));
        release_all(&o.o, sizeof o / sizeof(cl_mem));
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    clReleaseCommandQueue(q);
    test_env_close(&env);
    return 0;
}
