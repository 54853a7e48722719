/* context.c: the opaque context around the caller's cl_context and device. */
#include "internal.h"
#include "tuning/tuning.h"

#include <clblast_c.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dup_or_null(const char *s)
{
    if (!s || !*s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static clnsa_status create_fail(char *msg, size_t size, clnsa_status st, const char *text)
{
    if (msg && size) snprintf(msg, size, "%s", text);
    return st;
}

clnsa_status clnsa_context_create(cl_context cl_ctx, cl_device_id device,
                                  const clnsa_context_options *options, clnsa_context **out,
                                  char *msg, size_t msg_size)
{
    if (!out) return create_fail(msg, msg_size, CLNSA_ERROR_NULL_ARGUMENT, "out: expected a non-NULL pointer, got NULL");
    *out = NULL;
    if (!cl_ctx) return create_fail(msg, msg_size, CLNSA_ERROR_NULL_ARGUMENT, "cl_ctx: expected a cl_context, got NULL");
    if (!device) return create_fail(msg, msg_size, CLNSA_ERROR_NULL_ARGUMENT, "device: expected a cl_device_id, got NULL");

    /* The device must belong to the context. */
    cl_uint ndev = 0;
    if (clGetContextInfo(cl_ctx, CL_CONTEXT_NUM_DEVICES, sizeof ndev, &ndev, NULL) != CL_SUCCESS || ndev == 0)
        return create_fail(msg, msg_size, CLNSA_ERROR_OPENCL, "cl_ctx: clGetContextInfo failed (not a valid cl_context?)");
    cl_device_id devs[64];
    if (ndev > 64) ndev = 64;
    clGetContextInfo(cl_ctx, CL_CONTEXT_DEVICES, ndev * sizeof(cl_device_id), devs, NULL);
    bool found = false;
    for (cl_uint i = 0; i < ndev; ++i) found = found || devs[i] == device;
    if (!found) return create_fail(msg, msg_size, CLNSA_ERROR_INVALID_ARGUMENT, "device: expected a device of cl_ctx, got another one");

    if (options && (options->matrix_path < CLNSA_MATRIX_AUTO || options->matrix_path > CLNSA_MATRIX_EMULATED)) {
        char text[160];
        snprintf(text, sizeof text, "options.matrix_path: expected CLNSA_MATRIX_AUTO, _PORTABLE or _EMULATED (0..2), got %d",
                 (int)options->matrix_path);
        return create_fail(msg, msg_size, CLNSA_ERROR_INVALID_ARGUMENT, text);
    }
    if (options && options->allow_tf32 != 0 && options->allow_tf32 != 1) {
        char text[96];
        snprintf(text, sizeof text, "options.allow_tf32: expected 0 or 1, got %d", options->allow_tf32);
        return create_fail(msg, msg_size, CLNSA_ERROR_INVALID_ARGUMENT, text);
    }
    clnsa_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return create_fail(msg, msg_size, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory");
    clnsa_status st = clnsa_probe_device(device, &ctx->info);
    if (st != CLNSA_SUCCESS) {
        free(ctx);
        return create_fail(msg, msg_size, st, "device: probing the device failed");
    }
    if (ctx->info.opencl_c_major < 1 || (ctx->info.opencl_c_major == 1 && ctx->info.opencl_c_minor < 2)) {
        char text[256];
        snprintf(text, sizeof text, "device: expected OpenCL C 1.2 or later, got '%s'", ctx->info.opencl_c_version);
        free(ctx);
        return create_fail(msg, msg_size, CLNSA_ERROR_UNSUPPORTED_DEVICE, text);
    }
    const char *tuning = options && options->tuning_file ? options->tuning_file : getenv("CLNSA_TUNING_FILE");
    if (tuning && *tuning) {
        char text[512];
        st = tune_file_load(tuning, &ctx->tuning, text, sizeof text);
        if (st != CLNSA_SUCCESS) {
            free(ctx);
            return create_fail(msg, msg_size, st, text);
        }
    }
    const char *dir = options && options->kernel_dir ? options->kernel_dir : getenv("CLNSA_KERNEL_DIR");
    ctx->kernel_dir = dup_or_null(dir);
    ctx->extra_options = dup_or_null(options ? options->extra_build_options : NULL);
    ctx->cache_dir = program_cache_dir(options ? options->cache_dir : NULL);
    ctx->matrix_path = options ? options->matrix_path : CLNSA_MATRIX_AUTO;
    const char *mma = getenv("CLNSA_MMA");
    if (ctx->matrix_path == CLNSA_MATRIX_AUTO && mma)
        ctx->matrix_path = strcmp(mma, "0") == 0 ? CLNSA_MATRIX_PORTABLE
                           : strcmp(mma, "emulate") == 0 ? CLNSA_MATRIX_EMULATED : CLNSA_MATRIX_AUTO;
    const char *tf32 = getenv("CLNSA_TF32");
    ctx->tf32 = (options && options->allow_tf32) || (tf32 && strcmp(tf32, "1") == 0);
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_cond_init(&ctx->built, NULL);
    clRetainContext(cl_ctx);
    clRetainDevice(device);
    ctx->cl = cl_ctx;
    ctx->device = device;
    *out = ctx;
    if (msg && msg_size) msg[0] = '\0';
    return CLNSA_SUCCESS;
}

void clnsa_context_destroy(clnsa_context *ctx)
{
    if (!ctx) return;
    /* CLBlast keeps the programs it built in a process-wide cache keyed by
     * cl_context, which it only empties at exit. Those programs hold the
     * caller's cl_context (a program retains its context), so without this
     * every context that ran linear compression would live until exit, and
     * at exit CLBlast would release programs of long-gone contexts after
     * other libraries' exit handlers ran (Oclgrind's runtime aborts with
     * "corrupted double-linked list" there). The cache has no per-context
     * eviction: this empties it for the whole process, which only costs
     * other CLBlast users a rebuild. */
    if (__atomic_load_n(&ctx->blas_used, __ATOMIC_RELAXED)) CLBlastClearCache();
    for (program_entry *e = ctx->programs, *next; e; e = next) {
        next = e->next;
        if (e->program) clReleaseProgram(e->program);
        free(e->key);
        free(e);
    }
    pthread_mutex_destroy(&ctx->lock);
    pthread_cond_destroy(&ctx->built);
    tune_file_free(ctx->tuning);
    free(ctx->cache_dir);
    clReleaseDevice(ctx->device);
    clReleaseContext(ctx->cl);
    free(ctx->kernel_dir);
    free(ctx->extra_options);
    free(ctx);
}
