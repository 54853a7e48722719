/* testutil.c: see testutil.h. */
#define _GNU_SOURCE /* strcasestr */
#include "testutil.h"

#include "fp16.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static void die(const char *what, cl_int err)
{
    fprintf(stderr, "test setup: %s failed (%d)\n", what, (int)err);
    exit(1);
}

void test_env_open(test_env *env)
{
    memset(env, 0, sizeof *env);
    const char *req = getenv("CLNSA_REQUIRE_DEVICE");
    bool require = req && strcmp(req, "1") == 0;
    cl_platform_id plats[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS) np = 0;
    /* CLNSA_TEST_DEVICE: "P:D" indices, or a word of the platform name */
    int want_p = -1, want_d = 0;
    const char *sel = getenv("CLNSA_TEST_DEVICE");
    if (sel && sscanf(sel, "%d:%d", &want_p, &want_d) != 2) {
        for (cl_uint p = 0; p < np && want_p < 0; ++p) {
            char name[256] = "";
            clGetPlatformInfo(plats[p], CL_PLATFORM_NAME, sizeof name, name, NULL);
            if (strcasestr(name, sel)) want_p = (int)p;
        }
        want_d = 0;
    }
    for (cl_uint p = 0; p < np && !env->device; ++p) {
        if (want_p >= 0 && (int)p != want_p) continue;
        cl_device_id devs[16];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS || nd == 0) continue;
        int d = want_p >= 0 ? want_d : 0;
        if (d < (int)nd) {
            env->platform = plats[p];
            env->device = devs[d];
        }
    }
    if (!env->device) {
        fprintf(stderr, "no OpenCL device found (install pocl-opencl-icd for a CPU device)%s\n",
                require ? "; CLNSA_REQUIRE_DEVICE=1 makes this a failure" : ": skipping");
        exit(require ? 1 : 77);
    }
    cl_int err;
    env->cl = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) die("clCreateContext", err);
    env->queue = clCreateCommandQueue(env->cl, env->device, 0, &err);
    if (err != CL_SUCCESS) die("clCreateCommandQueue", err);
    char msg[512];
    clnsa_status st = clnsa_context_create(env->cl, env->device, NULL, &env->ctx, msg, sizeof msg);
    if (st != CLNSA_SUCCESS) {
        fprintf(stderr, "clnsa_context_create: %s: %s\n", clnsa_status_string(st), msg);
        exit(1);
    }
}

static bool has_tensor_cores(const clnsa_device_info *info)
{
    return info->vendor == CLNSA_VENDOR_NVIDIA && info->nv_compute_major >= 8;
}

clnsa_context_options test_warp_options(const clnsa_device_info *info)
{
    clnsa_context_options o = {0};
    o.matrix_path = has_tensor_cores(info) ? CLNSA_MATRIX_AUTO : CLNSA_MATRIX_EMULATED;
    o.allow_tf32 = 1;
    return o;
}

const char *test_env_use_warp_path(test_env *env)
{
    const clnsa_device_info *info = clnsa_context_device_info(env->ctx);
    const bool nv = has_tensor_cores(info);
    const clnsa_context_options o = test_warp_options(info);
    clnsa_context_destroy(env->ctx);
    char msg[512];
    clnsa_status st = clnsa_context_create(env->cl, env->device, &o, &env->ctx, msg, sizeof msg);
    if (st != CLNSA_SUCCESS) {
        fprintf(stderr, "clnsa_context_create: %s: %s\n", clnsa_status_string(st), msg);
        exit(1);
    }
    return nv ? "NVIDIA tensor cores" : "emulated";
}

clnsa_context *test_context_with_tuning(const test_env *env, const clnsa_context_options *base, const char *entries)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/clnsa_test_tuning_%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "{\"clnsa_tuning\": 1, \"entries\": [\n%s\n]}\n", entries) < 0 || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write the tuning file\n", path);
        exit(1);
    }
    clnsa_context_options o = {0};
    if (base) o = *base;
    o.tuning_file = path;
    clnsa_context *ctx = NULL;
    char msg[512];
    const clnsa_status st = clnsa_context_create(env->cl, env->device, &o, &ctx, msg, sizeof msg);
    remove(path);
    if (st != CLNSA_SUCCESS) {
        fprintf(stderr, "clnsa_context_create with %s: %s: %s\n", path, clnsa_status_string(st), msg);
        exit(1);
    }
    return ctx;
}

void test_env_close(test_env *env)
{
    clnsa_context_destroy(env->ctx);
    clReleaseCommandQueue(env->queue);
    clReleaseContext(env->cl);
    memset(env, 0, sizeof *env);
}

static uint64_t next(uint64_t *s)
{
    /* splitmix64: small, deterministic, good enough for test data */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fill_uniform(double *x, size_t n, double lo, double hi, uint64_t *seed)
{
    for (size_t i = 0; i < n; ++i) x[i] = lo + (hi - lo) * ((double)(next(seed) >> 11) / 9007199254740992.0);
}

double *alloc_uniform(size_t n, double lo, double hi, uint64_t *seed)
{
    double *x = malloc((n ? n : 1) * sizeof *x);
    if (!x) abort();
    fill_uniform(x, n, lo, hi, seed);
    return x;
}

void round_to(double *x, size_t n, clnsa_dtype dt)
{
    for (size_t i = 0; i < n; ++i) {
        float f = (float)x[i];
        if (dt == CLNSA_DTYPE_F16) f = fp16_to_f32(fp16_from_f32(f));
        else if (dt == CLNSA_DTYPE_BF16) f = bf16_to_f32(bf16_from_f32(f));
        x[i] = f;
    }
}

static cl_mem make(const test_env *env, size_t bytes, const void *host)
{
    cl_int err;
    cl_mem m = clCreateBuffer(env->cl, CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0), bytes ? bytes : 4,
                              (void *)host, &err);
    if (err != CL_SUCCESS) die("clCreateBuffer", err);
    return m;
}

cl_mem upload(const test_env *env, const double *x, size_t n, clnsa_dtype dt, bool round_x)
{
    size_t es = clnsa_dtype_size(dt);
    unsigned char *buf = malloc(n * es + 4);
    for (size_t i = 0; i < n; ++i) {
        float f = (float)x[i];
        if (dt == CLNSA_DTYPE_F32) memcpy(buf + 4 * i, &f, 4);
        else {
            uint16_t h = dt == CLNSA_DTYPE_F16 ? fp16_from_f32(f) : bf16_from_f32(f);
            memcpy(buf + 2 * i, &h, 2);
        }
    }
    if (round_x) round_to((double *)x, n, dt);
    cl_mem m = make(env, n * es, n ? buf : NULL);
    free(buf);
    return m;
}

cl_mem upload_i32(const test_env *env, const int32_t *x, size_t n) { return make(env, n * 4, n ? x : NULL); }

cl_mem poisoned(const test_env *env, size_t n, clnsa_dtype dt)
{
    size_t es = clnsa_dtype_size(dt);
    unsigned char *buf = malloc(n * es + 4);
    for (size_t i = 0; i < n; ++i) {
        if (dt == CLNSA_DTYPE_F32) {
            float f = NAN;
            memcpy(buf + 4 * i, &f, 4);
        } else if (dt == CLNSA_DTYPE_I32) {
            int32_t v = 0x7fffffff;
            memcpy(buf + 4 * i, &v, 4);
        } else {
            uint16_t h = 0x7e00 | (dt == CLNSA_DTYPE_BF16 ? 0x7f80 : 0);
            memcpy(buf + 2 * i, &h, 2);
        }
    }
    cl_mem m = make(env, n * es, n ? buf : NULL);
    free(buf);
    return m;
}

void download(const test_env *env, cl_mem m, size_t n, clnsa_dtype dt, double *out)
{
    size_t es = clnsa_dtype_size(dt);
    unsigned char *buf = malloc(n * es + 4);
    cl_int err = clEnqueueReadBuffer(env->queue, m, CL_TRUE, 0, n * es, buf, 0, NULL, NULL);
    if (err != CL_SUCCESS) die("clEnqueueReadBuffer", err);
    for (size_t i = 0; i < n; ++i) {
        if (dt == CLNSA_DTYPE_F32) {
            float f;
            memcpy(&f, buf + 4 * i, 4);
            out[i] = f;
        } else {
            uint16_t h;
            memcpy(&h, buf + 2 * i, 2);
            out[i] = dt == CLNSA_DTYPE_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
        }
    }
    free(buf);
}

void download_i32(const test_env *env, cl_mem m, size_t n, int32_t *out)
{
    cl_int err = clEnqueueReadBuffer(env->queue, m, CL_TRUE, 0, n * 4, out, 0, NULL, NULL);
    if (err != CL_SUCCESS) die("clEnqueueReadBuffer", err);
}

double rel_l2(const double *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(x[i])) return INFINITY;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double rel_l2_floor(const double *x, const double *ref, size_t n, double floor_rms)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(x[i])) return INFINITY;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    const double fl = floor_rms * floor_rms * (double)n;
    return sqrt(num / (den > fl ? den : fl));
}

double rel_l2_lse(const double *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (isinf(ref[i]) || isinf(x[i])) {
            if (x[i] != ref[i]) return INFINITY;
            continue;
        }
        if (isnan(x[i])) return INFINITY;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

clnsa_tensor tensor4(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d)
{
    int64_t s[4] = {a, b, c, d};
    return clnsa_tensor_contiguous(m, dt, 4, s);
}

clnsa_tensor tensor3(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c)
{
    int64_t s[3] = {a, b, c};
    return clnsa_tensor_contiguous(m, dt, 3, s);
}

const char *golden_dir(void)
{
    const char *d = getenv("CLNSA_GOLDEN_DIR");
    return d && *d ? d : NULL;
}

void assert_ok(const test_env *env, clnsa_status st, const char *what)
{
    if (st != CLNSA_SUCCESS) print_error("%s: %s: %s\n", what, clnsa_status_string(st), clnsa_last_error(env->ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
}

void wait_release(cl_event ev)
{
    assert_non_null(ev);
    assert_int_equal(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
}

void check_err(const char *what, const char *name, double e, double t)
{
    if (getenv("CLNSA_TEST_VERBOSE")) printf("  %s: %s rel L2 %.3g\n", name, what, e);
    if (!(e <= t)) print_error("%s: %s rel L2 %.3g > %.3g\n", name, what, e, t);
    assert_true(e <= t);
}
