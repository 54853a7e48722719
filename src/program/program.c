/* program.c: kernel sources (embedded, or read from CLNSA_KERNEL_DIR), program
 * builds with the device's OpenCL C version, and the per-context cache in
 * memory (the cache on disk is cache.c). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len, cap;
} strbuf;

static bool sb_add(strbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->data, cap);
        if (!p) return false;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

static bool sb_str(strbuf *b, const char *s) { return sb_add(b, s, strlen(s)); }

static clnsa_status append_source(clnsa_context *ctx, strbuf *b, const char *name)
{
    if (ctx->kernel_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", ctx->kernel_dir, name);
        FILE *f = fopen(path, "rb");
        if (!f)
            return cx_fail(ctx, CLNSA_ERROR_BUILD_FAILED,
                           "kernel source: cannot open '%s' (CLNSA_KERNEL_DIR=%s)", path, ctx->kernel_dir);
        char chunk[8192];
        size_t n;
        bool ok = true;
        while (ok && (n = fread(chunk, 1, sizeof chunk, f)) > 0) ok = sb_add(b, chunk, n);
        fclose(f);
        return ok && sb_str(b, "\n") ? CLNSA_SUCCESS : cx_fail(ctx, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    for (size_t i = 0; i < clnsa_embedded_source_count; ++i)
        if (strcmp(clnsa_embedded_sources[i].name, name) == 0)
            return sb_add(b, clnsa_embedded_sources[i].text, clnsa_embedded_sources[i].size) && sb_str(b, "\n")
                       ? CLNSA_SUCCESS
                       : cx_fail(ctx, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    return cx_fail(ctx, CLNSA_ERROR_BUILD_FAILED, "kernel source: '%s' is not embedded in this build", name);
}

/* Options: the OpenCL C standard the device reports (never hard-coded: some
 * compilers reject -cl-std=CL3.0 while accepting the same source without it),
 * for the tensor-core programs (MMA_NV 1: f16/bf16 inputs, probabilities
 * rounded to 16 bits for their products) -cl-unsafe-math-optimizations, as
 * FlashAttention is built with fast math (on the H200, 2026-11-23: dense
 * forward 48.8 -> 44.6 ms at 16k, NSA forward 35.4 -> 33.5 ms at 64k; the
 * device tests pass with it), then the context's and CLNSA_BUILD_OPTIONS's
 * extras, joined by single spaces (the program cache's key holds the
 * string). On PoCL the optimizer is
 * off: PoCL 3.1 (Debian 12) gives wrong, run-to-run varying results for the
 * attention tiles when optimizing, where Oclgrind (which checks races and
 * uninitialized reads), NVIDIA's compiler and PoCL at -cl-opt-disable agree
 * with the reference. CLNSA_POCL_OPTIMIZE=1 turns it back on. */
static void build_options(const clnsa_context *ctx, const char *defines, char *buf, size_t size)
{
    const char *env = getenv("CLNSA_BUILD_OPTIONS");
    const bool no_opt = ctx->info.vendor == CLNSA_VENDOR_POCL && cx_env_int("CLNSA_POCL_OPTIMIZE", 0) == 0;
    const bool tensor_cores = strstr(defines, "#define MMA_NV 1\n") != NULL;
    const char *parts[] = {ctx->info.opencl_c_major > 1 || ctx->info.opencl_c_minor >= 2 ? "-cl-std=CL1.2" : NULL,
                           no_opt ? "-cl-opt-disable" : NULL, tensor_cores ? "-cl-unsafe-math-optimizations" : NULL,
                           ctx->extra_options, env};
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; ++i)
        if (parts[i] && *parts[i] && n < size) n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? " " : "", parts[i]);
}

/* The compiler's log of a program (malloc'ed; NULL when there is none). */
static char *build_log(const clnsa_context *ctx, cl_program p)
{
    size_t n = 0;
    if (clGetProgramBuildInfo(p, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS || n == 0) return NULL;
    char *log = calloc(n + 1, 1);
    if (log && clGetProgramBuildInfo(p, ctx->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS) {
        free(log);
        return NULL;
    }
    return log;
}

/* CLNSA_BUILD_LOG (kernel work, tests): "1" prints the compiler's log of
 * each program that built with one (warnings; NVIDIA's compiler prints
 * "N warnings generated." on the caller's stdout), "werror" fails a build
 * whose log has a warning (the tests set it: PoCL's compiler reports what
 * NVIDIA's warns about). */
static clnsa_status check_build_log(clnsa_context *ctx, cl_program p, const char *what)
{
    const char *mode = getenv("CLNSA_BUILD_LOG");
    if (!mode || !*mode || strcmp(mode, "0") == 0) return CLNSA_SUCCESS;
    char *log = build_log(ctx, p);
    clnsa_status st = CLNSA_SUCCESS;
    if (log && strspn(log, " \t\r\n") < strlen(log)) {
        if (strcmp(mode, "werror") == 0 && strstr(log, "warning")) {
            st = cx_fail(ctx, CLNSA_ERROR_BUILD_FAILED, "kernels %s built with warnings (CLNSA_BUILD_LOG=werror):\n%s", what, log);
            clReleaseProgram(p);
        } else {
            fprintf(stderr, "clnsa-build-log: %s\n%s\n", what, log);
        }
    }
    free(log);
    return st;
}

/* A program whose kernels use sm_90a instructions (cl/warpgroup_mma.h, built
 * with WGMMA_NV 1): its PTX, with those instructions turned on and the target
 * raised (ptx_sm90a.c), built again as a binary; the kernels capped at the
 * source's WG_MAXNREG registers where it defines one. Releases `compiled`. */
static clnsa_status rebuild_sm90a(clnsa_context *ctx, const char *src, cl_program compiled, const char *options,
                                  const char *what, cl_program *out)
{
    size_t len = 0;
    char *ptx = NULL, *ptx90a = NULL;
    const char *why = "its binary (the PTX) could not be read";
    if (clGetProgramInfo(compiled, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) == CL_SUCCESS && len &&
        (ptx = calloc(len + 1, 1)) && clGetProgramInfo(compiled, CL_PROGRAM_BINARIES, sizeof ptx, &ptx, NULL) == CL_SUCCESS)
        ptx90a = ptx_to_sm90a(ptx, sm90a_register_cap(src), &why);
    free(ptx);
    clReleaseProgram(compiled);
    *out = NULL;
    if (!ptx90a) return cx_fail(ctx, CLNSA_ERROR_BUILD_FAILED, "kernels %s for sm_90a: %s", what, why);
    cl_int err, bin_err = CL_SUCCESS;
    size_t n = strlen(ptx90a) + 1;
    const unsigned char *bin = (const unsigned char *)ptx90a;
    cl_program p = clCreateProgramWithBinary(ctx->cl, 1, &ctx->device, &n, &bin, &bin_err, &err);
    if (err == CL_SUCCESS && bin_err == CL_SUCCESS) err = clBuildProgram(p, 1, &ctx->device, options, NULL, NULL);
    else if (err == CL_SUCCESS) err = bin_err;
    free(ptx90a);
    if (err != CL_SUCCESS) {
        char *log = p ? build_log(ctx, p) : NULL;
        clnsa_status st = cx_fail(ctx, CLNSA_ERROR_BUILD_FAILED,
                                  "building kernels %s from their sm_90a PTX failed: %s (%d); the driver's JIT may not "
                                  "take sm_90a (CLNSA_WGMMA=0 keeps to mma.sync)\n%s",
                                  what, cl_error_name(err), (int)err, log ? log : "(no build log)");
        free(log);
        if (p) clReleaseProgram(p);
        return st;
    }
    const clnsa_status st = check_build_log(ctx, p, what); /* the JIT's log (-cl-nv-verbose: ptxas's) */
    *out = st == CLNSA_SUCCESS ? p : NULL;
    return st;
}

static clnsa_status build(clnsa_context *ctx, const char *src, const char *options, const char *what,
                          cl_program *out)
{
    cl_int err;
    cl_program p = clCreateProgramWithSource(ctx->cl, 1, &src, NULL, &err);
    if (err != CL_SUCCESS) return cx_fail_cl(ctx, err, "clCreateProgramWithSource");
    err = clBuildProgram(p, 1, &ctx->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        char *log = build_log(ctx, p);
        clnsa_status st = cx_fail(ctx, CLNSA_ERROR_BUILD_FAILED, "building kernels %s with options '%s' failed: %s (%d)\n%s",
                                  what, options, cl_error_name(err), (int)err, log ? log : "(no build log)");
        free(log);
        clReleaseProgram(p);
        return st;
    }
    const clnsa_status st = check_build_log(ctx, p, what);
    if (st == CLNSA_SUCCESS && strstr(src, "#define WGMMA_NV 1\n")) return rebuild_sm90a(ctx, src, p, options, what, out);
    *out = st == CLNSA_SUCCESS ? p : NULL;
    return st;
}

/* The program: a cached binary for exactly this text if the disk cache has
 * one, else built from source (and written to the cache). */
static clnsa_status build_text(clnsa_context *ctx, const char *const *files, const char *defines, const char *options,
                               const char *what, cl_program *out)
{
    strbuf src = {0};
    clnsa_status st = sb_str(&src, defines) && sb_str(&src, "\n") ? CLNSA_SUCCESS
                                                                   : cx_fail(ctx, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    for (const char *const *f = files; *f && st == CLNSA_SUCCESS; ++f) st = append_source(ctx, &src, *f);
    if (st == CLNSA_SUCCESS && !(*out = program_cache_load(ctx, src.data, options))) {
        st = build(ctx, src.data, options, what, out);
        if (st == CLNSA_SUCCESS) {
            atomic_fetch_add(&ctx->stats.builds, 1);
            program_cache_store(ctx, src.data, options, *out);
        }
    }
    free(src.data);
    return st;
}

clnsa_status program_get(clnsa_context *ctx, const char *const *files, const char *defines, cl_program *out)
{
    char options[1024];
    build_options(ctx, defines, options, sizeof options);
    strbuf key = {0};
    bool ok = true;
    for (const char *const *f = files; *f; ++f) ok = ok && sb_str(&key, *f) && sb_str(&key, " ");
    ok = ok && sb_str(&key, "|") && sb_str(&key, defines) && sb_str(&key, "|") && sb_str(&key, options);
    if (!ok) {
        free(key.data);
        return cx_fail(ctx, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }

    /* Builds run outside the lock, so that one thread's build does not stall
     * the others' calls; a thread asking for a program another one is
     * building waits for it (one build per program). */
    pthread_mutex_lock(&ctx->lock);
    program_entry *e;
    for (;;) {
        for (e = ctx->programs; e && strcmp(e->key, key.data) != 0; e = e->next) {
        }
        if (!e || e->program) break;
        pthread_cond_wait(&ctx->built, &ctx->lock);
    }
    if (e) {
        *out = e->program;
        pthread_mutex_unlock(&ctx->lock);
        free(key.data);
        return CLNSA_SUCCESS;
    }
    if (!(e = malloc(sizeof *e))) {
        pthread_mutex_unlock(&ctx->lock);
        free(key.data);
        return cx_fail(ctx, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    e->key = key.data;
    e->program = NULL;
    e->next = ctx->programs;
    ctx->programs = e;
    pthread_mutex_unlock(&ctx->lock);

    cl_program prog = NULL;
    clnsa_status st = build_text(ctx, files, defines, options, key.data, &prog);

    pthread_mutex_lock(&ctx->lock);
    if (st == CLNSA_SUCCESS) {
        e->program = prog;
        *out = prog;
    } else { /* unlink it: a waiting thread then tries the build itself */
        program_entry **pp = &ctx->programs;
        while (*pp != e) pp = &(*pp)->next;
        *pp = e->next;
        free(e->key);
        free(e);
    }
    pthread_cond_broadcast(&ctx->built);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

clnsa_status kernel_create(clnsa_context *ctx, cl_program prog, const char *name, cl_kernel *out)
{
    cl_int err;
    *out = clCreateKernel(prog, name, &err);
    return err == CL_SUCCESS ? CLNSA_SUCCESS : cx_fail_cl(ctx, err, name);
}
