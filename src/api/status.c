/* status.c: version, status names, dtypes, and the per-thread error message. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)

const char *clnsa_version(void)
{
    return STR(CLNSA_VERSION_MAJOR) "." STR(CLNSA_VERSION_MINOR) "." STR(CLNSA_VERSION_PATCH);
}

int clnsa_version_number(void) { return CLNSA_VERSION_NUMBER; }

const char *clnsa_status_string(clnsa_status status)
{
    switch (status) {
    case CLNSA_SUCCESS: return "CLNSA_SUCCESS";
    case CLNSA_ERROR_NULL_ARGUMENT: return "CLNSA_ERROR_NULL_ARGUMENT";
    case CLNSA_ERROR_INVALID_ARGUMENT: return "CLNSA_ERROR_INVALID_ARGUMENT";
    case CLNSA_ERROR_INVALID_DTYPE: return "CLNSA_ERROR_INVALID_DTYPE";
    case CLNSA_ERROR_SHAPE_MISMATCH: return "CLNSA_ERROR_SHAPE_MISMATCH";
    case CLNSA_ERROR_OUT_OF_BOUNDS: return "CLNSA_ERROR_OUT_OF_BOUNDS";
    case CLNSA_ERROR_UNSUPPORTED_DEVICE: return "CLNSA_ERROR_UNSUPPORTED_DEVICE";
    case CLNSA_ERROR_BUILD_FAILED: return "CLNSA_ERROR_BUILD_FAILED";
    case CLNSA_ERROR_OPENCL: return "CLNSA_ERROR_OPENCL";
    case CLNSA_ERROR_OUT_OF_HOST_MEMORY: return "CLNSA_ERROR_OUT_OF_HOST_MEMORY";
    case CLNSA_ERROR_WORKSPACE_TOO_SMALL: return "CLNSA_ERROR_WORKSPACE_TOO_SMALL";
    case CLNSA_ERROR_INVALID_LAYOUT: return "CLNSA_ERROR_INVALID_LAYOUT";
    case CLNSA_ERROR_BLAS: return "CLNSA_ERROR_BLAS";
    }
    return "CLNSA_ERROR_UNKNOWN_STATUS";
}

size_t clnsa_dtype_size(clnsa_dtype dtype)
{
    switch (dtype) {
    case CLNSA_DTYPE_F32: case CLNSA_DTYPE_I32: return 4;
    case CLNSA_DTYPE_F16: case CLNSA_DTYPE_BF16: return 2;
    default: return 0;
    }
}

const char *clnsa_dtype_name(clnsa_dtype dtype)
{
    switch (dtype) {
    case CLNSA_DTYPE_F32: return "f32";
    case CLNSA_DTYPE_F16: return "f16";
    case CLNSA_DTYPE_BF16: return "bf16";
    case CLNSA_DTYPE_I32: return "i32";
    default: return "invalid";
    }
}

/* One message slot per thread, tagged with the context it belongs to: a
 * context shared by threads never mixes their messages. Large enough for a
 * kernel build log. */
static _Thread_local struct {
    const clnsa_context *ctx;
    char text[16384];
} last_error;

void cx_clear(const clnsa_context *ctx)
{
    last_error.ctx = ctx;
    last_error.text[0] = '\0';
}

clnsa_status cx_size_query(const clnsa_context *ctx, size_t *bytes)
{
    if (!ctx) return CLNSA_ERROR_NULL_ARGUMENT;
    cx_clear(ctx);
    if (!bytes) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "bytes: expected a pointer, got NULL");
    *bytes = 0;
    return CLNSA_SUCCESS;
}

clnsa_status cx_fail(const clnsa_context *ctx, clnsa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    last_error.ctx = ctx;
    vsnprintf(last_error.text, sizeof last_error.text, fmt, ap);
    va_end(ap);
    return status;
}

const char *clnsa_last_error(const clnsa_context *ctx)
{
    return last_error.ctx == ctx ? last_error.text : "";
}

const char *cl_error_name(cl_int err)
{
    switch (err) {
#define E(x) case x: return #x;
    E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE) E(CL_COMPILER_NOT_AVAILABLE)
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES) E(CL_OUT_OF_HOST_MEMORY)
    E(CL_PROFILING_INFO_NOT_AVAILABLE) E(CL_BUILD_PROGRAM_FAILURE) E(CL_INVALID_VALUE)
    E(CL_INVALID_DEVICE) E(CL_INVALID_CONTEXT) E(CL_INVALID_COMMAND_QUEUE) E(CL_INVALID_MEM_OBJECT)
    E(CL_INVALID_BUILD_OPTIONS) E(CL_INVALID_PROGRAM) E(CL_INVALID_PROGRAM_EXECUTABLE)
    E(CL_INVALID_KERNEL_NAME) E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX) E(CL_INVALID_ARG_VALUE)
    E(CL_INVALID_ARG_SIZE) E(CL_INVALID_KERNEL_ARGS) E(CL_INVALID_WORK_DIMENSION)
    E(CL_INVALID_WORK_GROUP_SIZE) E(CL_INVALID_WORK_ITEM_SIZE) E(CL_INVALID_GLOBAL_OFFSET)
    E(CL_INVALID_EVENT_WAIT_LIST) E(CL_INVALID_EVENT) E(CL_INVALID_OPERATION)
    E(CL_INVALID_BUFFER_SIZE) E(CL_INVALID_GLOBAL_WORK_SIZE) E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
#undef E
    default: return "CL_UNKNOWN_ERROR";
    }
}

clnsa_status cx_fail_cl(const clnsa_context *ctx, cl_int err, const char *what)
{
    return cx_fail(ctx, CLNSA_ERROR_OPENCL, "%s failed: %s (%d)", what, cl_error_name(err), (int)err);
}

int cx_env_int(const char *name, int fallback)
{
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end;
    long v = strtol(s, &end, 0);
    return (*end == '\0' && v >= 0 && v <= 0x7fffffff) ? (int)v : fallback;
}

size_t round_up(size_t x, size_t m) { return m ? (x + m - 1) / m * m : x; }
