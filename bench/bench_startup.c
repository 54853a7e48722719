/* bench_startup.c: start-up time, from clnsa_context_create to the first NSA
 * forward's result (clFinish), with the on-disk program cache off, cold (an
 * empty folder) and warm (the folder the cold run filled). Each run makes a
 * new cl_context and clnsa context, so nothing is kept in memory between
 * runs; the inputs are uploaded before the clock starts.
 *
 *   bench_startup [--T 256] [--HQ 16] [--H 1] [--D 128] [--dtype bf16] [--repeat 3] [--json out.json]
 *
 * The device is CLNSA_TEST_DEVICE ("P:D" or a platform-name word) or the
 * first one found. PoCL's own kernel cache is turned off (POCL_KERNEL_CACHE=0
 * unless set) so that "off" pays the compiler, as on a driver without one. */
#include "bench_util.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int T, HQ, H, D, repeat;
    clnsa_dtype dt;
} cfg;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* One start-up on a fresh cl_context: -1 on failure. */
static double startup_ms(cl_device_id dev, const cfg *c, const char *cache_dir)
{
    cl_int err;
    test_env e = {0};
    e.device = dev;
    e.cl = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    e.queue = clCreateCommandQueue(e.cl, dev, 0, &err);
    uint64_t seed = 7;
    const size_t nq = (size_t)c->T * c->HQ, nk = (size_t)c->T * c->H;
    double *x = alloc_uniform(nq * c->D, -1, 1, &seed);
    cl_mem q = upload(&e, x, nq * c->D, c->dt, false), k = upload(&e, x, nk * c->D, c->dt, false),
           v = upload(&e, x + nk * c->D, nk * c->D, c->dt, false), g = upload(&e, x, nq, c->dt, false);
    free(x);
    cl_mem o = poisoned(&e, nq * c->D, c->dt), bi = poisoned(&e, nk * 16, CLNSA_DTYPE_I32), ws = NULL;
    double ms = -1;

    const double t0 = now_ms();
    clnsa_context_options opt = {0};
    opt.cache_dir = cache_dir;
    char msg[256];
    clnsa_context *ctx = NULL;
    if (clnsa_context_create(e.cl, dev, &opt, &ctx, msg, sizeof msg) != CLNSA_SUCCESS) {
        fprintf(stderr, "bench_startup: %s\n", msg);
        goto done;
    }
    clnsa_nsa_config cfg;
    clnsa_nsa_config_init(&cfg);
    cfg.window = 64;
    clnsa_nsa_inputs in = {0};
    in.q = tensor4(q, c->dt, 1, c->T, c->HQ, c->D);
    in.k = tensor4(k, c->dt, 1, c->T, c->H, c->D);
    in.v = tensor4(v, c->dt, 1, c->T, c->H, c->D);
    in.g_cmp = in.g_slc = in.g_swa = tensor3(g, c->dt, 1, c->T, c->HQ);
    clnsa_nsa_outputs out = {0};
    out.o = tensor4(o, c->dt, 1, c->T, c->HQ, c->D);
    out.block_indices = tensor4(bi, CLNSA_DTYPE_I32, 1, c->T, c->H, 16);
    size_t bytes = 0;
    if (clnsa_nsa_forward_workspace_size(ctx, e.queue, &cfg, &in, &out, &bytes) != CLNSA_SUCCESS) goto fail;
    ws = clCreateBuffer(e.cl, CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    if (clnsa_nsa_forward(ctx, e.queue, &cfg, &in, &out, ws, bytes, 0, NULL, NULL) != CLNSA_SUCCESS) goto fail;
    clFinish(e.queue);
    ms = now_ms() - t0;
    goto done;
fail:
    fprintf(stderr, "bench_startup: %s\n", clnsa_last_error(ctx));
done:
    clnsa_context_destroy(ctx);
    cl_mem all[] = {q, k, v, g, o, bi, ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
    clReleaseCommandQueue(e.queue);
    clReleaseContext(e.cl);
    return ms;
}

static int count_files(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s/*.clbin 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = 0;
        pclose(p);
    }
    return n;
}

int main(int argc, char **argv)
{
    cfg c = {256, 16, 1, 128, 3, CLNSA_DTYPE_BF16};
    const char *json = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--T")) c.T = atoi(v);
        else if (!strcmp(k, "--HQ")) c.HQ = atoi(v);
        else if (!strcmp(k, "--H")) c.H = atoi(v);
        else if (!strcmp(k, "--D")) c.D = atoi(v);
        else if (!strcmp(k, "--repeat")) c.repeat = atoi(v) > 0 ? atoi(v) : 1;
        else if (!strcmp(k, "--json")) json = v;
        else if (!strcmp(k, "--dtype"))
            c.dt = !strcmp(v, "f32") ? CLNSA_DTYPE_F32 : !strcmp(v, "f16") ? CLNSA_DTYPE_F16 : CLNSA_DTYPE_BF16;
        else {
            fprintf(stderr, "bench_startup: unknown option %s\n", k);
            return 2;
        }
    }
    setenv("POCL_KERNEL_CACHE", "0", 0);
    test_env env;
    test_env_open(&env);
    const clnsa_device_info *di = clnsa_context_device_info(env.ctx);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/clnsa-startup-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    printf("device: %s (%s, %s); NSA forward, all branches with top-k, %s, T=%d HQ=%d H=%d D=%d; "
           "POCL_KERNEL_CACHE=%s\n",
           di->name, di->platform_name, di->driver_version, clnsa_dtype_name(c.dt), c.T, c.HQ, c.H, c.D,
           getenv("POCL_KERNEL_CACHE"));
    /* off: the cache turned off through CLNSA_CACHE=0, as a user would */
    double off[16], warm[16], cold;
    const int n = c.repeat < 16 ? c.repeat : 16;
    setenv("CLNSA_CACHE", "0", 1);
    for (int i = 0; i < n; ++i) off[i] = startup_ms(env.device, &c, dir);
    unsetenv("CLNSA_CACHE");
    cold = startup_ms(env.device, &c, dir);
    const int files = count_files(dir);
    for (int i = 0; i < n; ++i) warm[i] = startup_ms(env.device, &c, dir);
    const double off_ms = bench_median(off, (size_t)n), warm_ms = bench_median(warm, (size_t)n);
    printf("%-34s %10s\n", "start-up to first result", "ms");
    printf("%-34s %10.1f  (median of %d)\n", "disk cache off (CLNSA_CACHE=0)", off_ms, n);
    printf("%-34s %10.1f  (wrote %d programs)\n", "disk cache cold (empty folder)", cold, files);
    printf("%-34s %10.1f  (median of %d)\n", "disk cache warm", warm_ms, n);
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"device\": \"%s\", \"driver\": \"%s\", \"dtype\": \"%s\", \"T\": %d, \"HQ\": %d, \"H\": %d, \"D\": %d, "
                       "\"off_ms\": %.2f, \"cold_ms\": %.2f, \"warm_ms\": %.2f, \"programs\": %d}\n",
                    di->name, di->driver_version, clnsa_dtype_name(c.dt), c.T, c.HQ, c.H, c.D, off_ms, cold, warm_ms,
                    files);
            fclose(f);
        }
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_startup: could not remove %s\n", dir);
    test_env_close(&env);
    return 0;
}
