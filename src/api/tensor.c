/* tensor.c: validation of tensor views and float parameters, and passing them to kernels. */
#include "internal.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

clnsa_tensor clnsa_tensor_contiguous(cl_mem data, clnsa_dtype dtype, int rank, const int64_t *shape)
{
    clnsa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.rank = rank < 0 ? 0 : (rank > CLNSA_MAX_RANK ? CLNSA_MAX_RANK : rank);
    uint64_t s = 1; /* unsigned: absurd shapes wrap (the bounds check rejects them) instead of overflowing */
    for (int i = t.rank - 1; i >= 0; --i) {
        t.shape[i] = shape ? shape[i] : 0;
        t.strides[i] = (int64_t)(s & INT64_MAX);
        s *= t.shape[i] > 0 ? (uint64_t)t.shape[i] : 1u;
    }
    return t;
}

uint64_t tensor_extent(const clnsa_tensor *t)
{
    /* Also called on tensors an op ignores (never validated): their rank
     * may be anything, the arrays hold CLNSA_MAX_RANK. */
    const int rank = t->rank < CLNSA_MAX_RANK ? t->rank : CLNSA_MAX_RANK;
    uint64_t last = t->offset;
    for (int i = 0; i < rank; ++i) {
        if (t->shape[i] == 0) return 0;
        last += ((uint64_t)t->shape[i] - 1u) * (uint64_t)t->strides[i];
    }
    return last + 1;
}

clnsa_status tensor_check_opt(const clnsa_context *ctx, const clnsa_tensor *t, tensor_spec s)
{
    return tensor_present(t) ? tensor_check(ctx, t, &s) : CLNSA_SUCCESS;
}

bool tensors_need_long_index(const clnsa_tensor *const *ts, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if (tensor_present(ts[i]) && tensor_extent(ts[i]) > 0x7fffffffull) return true;
    return false;
}

clnsa_status head_dim_check(const clnsa_context *ctx, const char *name, int64_t d)
{
    if (d < 8 || d > 256 || d % 8)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "%s: expected a head dim that is a multiple of 8 in 8..256, got %lld",
                       name, (long long)d);
    return CLNSA_SUCCESS;
}

bool tensor_rows_aligned(const clnsa_tensor *t)
{
    if (!tensor_present(t)) return true;
    if (t->strides[t->rank - 1] != 1 || t->offset % 8) return false;
    for (int i = 0; i + 1 < t->rank; ++i)
        if (t->strides[i] % 8) return false;
    return true;
}

/* tensor_extent in bytes, or false when it does not fit in 64 bits (huge
 * strides or offset must not wrap around and pass the bounds check). */
static bool extent_bytes(const clnsa_tensor *t, uint64_t *bytes)
{
    uint64_t last = t->offset;
    for (int i = 0; i < t->rank; ++i)
        if (t->shape[i] == 0) {
            *bytes = 0;
            return true;
        }
    for (int i = 0; i < t->rank; ++i) {
        uint64_t step;
        if (__builtin_mul_overflow((uint64_t)t->shape[i] - 1u, (uint64_t)t->strides[i], &step) ||
            __builtin_add_overflow(last, step, &last))
            return false;
    }
    return !__builtin_add_overflow(last, 1, &last) && !__builtin_mul_overflow(last, clnsa_dtype_size(t->dtype), bytes);
}

static void shape_str(const int64_t *shape, int rank, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && n < size; ++i)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

static bool is_float(clnsa_dtype d)
{
    return d == CLNSA_DTYPE_F32 || d == CLNSA_DTYPE_F16 || d == CLNSA_DTYPE_BF16;
}

/* An output view may not write one element twice: sorted by stride, each
 * stride must step over everything the smaller strides span. */
static bool self_overlaps(const clnsa_tensor *t)
{
    int order[CLNSA_MAX_RANK], n = 0;
    for (int i = 0; i < t->rank; ++i)
        if (t->shape[i] > 1) order[n++] = i;
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && t->strides[order[j]] < t->strides[order[j - 1]]; --j) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    uint64_t span = 1; /* unsigned: huge strides wrap instead of overflowing (the bounds check rejects them) */
    for (int i = 0; i < n; ++i) {
        if ((uint64_t)t->strides[order[i]] < span) return true;
        span = (uint64_t)t->strides[order[i]] * (uint64_t)(t->shape[order[i]] - 1) + span;
    }
    return false;
}

clnsa_status tensor_check(const clnsa_context *ctx, const clnsa_tensor *t, const tensor_spec *sp)
{
    char want[96], got[96];
    if (!t || !t->data)
        return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "%s: expected a buffer, got NULL", sp->name);
    if (!is_float(t->dtype) && t->dtype != CLNSA_DTYPE_I32)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_DTYPE, "%s: expected dtype %s, got unknown dtype %d", sp->name,
                       sp->dtype ? clnsa_dtype_name(sp->dtype) : "f32, f16 or bf16", (int)t->dtype);
    if (sp->dtype ? t->dtype != sp->dtype : !is_float(t->dtype))
        return cx_fail(ctx, CLNSA_ERROR_INVALID_DTYPE, "%s: expected dtype %s, got %s", sp->name,
                       sp->dtype ? clnsa_dtype_name(sp->dtype) : "f32, f16 or bf16", clnsa_dtype_name(t->dtype));
    if (t->rank != sp->rank)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "%s: expected rank %d, got %d", sp->name, sp->rank, t->rank);
    for (int i = 0; i < sp->rank; ++i)
        if (t->shape[i] < 0 || (sp->shape[i] >= 0 && t->shape[i] != sp->shape[i])) {
            shape_str(sp->shape, sp->rank, want, sizeof want);
            shape_str(t->shape, t->rank, got, sizeof got);
            return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "%s: expected shape %s (-1 = any), got %s", sp->name, want, got);
        }
    for (int i = 0; i < t->rank; ++i)
        if (t->strides[i] < 0)
            return cx_fail(ctx, CLNSA_ERROR_INVALID_LAYOUT, "%s: expected strides >= 0, got %lld in dim %d", sp->name,
                           (long long)t->strides[i], i);
    if (sp->output && self_overlaps(t))
        return cx_fail(ctx, CLNSA_ERROR_INVALID_LAYOUT, "%s: an output view must not overlap itself, but its strides do", sp->name);
    size_t mem_size = 0;
    cl_int err = clGetMemObjectInfo(t->data, CL_MEM_SIZE, sizeof mem_size, &mem_size, NULL);
    if (err != CL_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "%s: expected a valid cl_mem, clGetMemObjectInfo says %s", sp->name,
                       cl_error_name(err));
    uint64_t need;
    if (!extent_bytes(t, &need))
        return cx_fail(ctx, CLNSA_ERROR_OUT_OF_BOUNDS, "%s: the view's offset and strides overflow 64 bits, but the buffer has %zu (CL_MEM_SIZE)",
                       sp->name, mem_size);
    if (need > mem_size)
        return cx_fail(ctx, CLNSA_ERROR_OUT_OF_BOUNDS, "%s: the view needs %llu bytes, but the buffer has %zu (CL_MEM_SIZE)",
                       sp->name, (unsigned long long)need, mem_size);
    return CLNSA_SUCCESS;
}

/* ----------------------------------------------------------- kernel args */

static void ka_raw(kargs *a, size_t size, const void *value)
{
    if (a->err == CL_SUCCESS) a->err = clSetKernelArg(a->kernel, a->next, size, value);
    a->next++;
}

void ka_mem(kargs *a, cl_mem m) { ka_raw(a, sizeof m, m ? &m : NULL); }
void ka_int(kargs *a, int v) { ka_raw(a, sizeof(cl_int), &v); }
void ka_float(kargs *a, float v) { ka_raw(a, sizeof(cl_float), &v); }

void ka_long(kargs *a, int64_t v)
{
    cl_long l = v;
    ka_raw(a, sizeof l, &l);
}

void ka_idx(kargs *a, int64_t v)
{
    if (a->idx_long) {
        cl_long l = v;
        ka_raw(a, sizeof l, &l);
    } else {
        cl_int i = (cl_int)v;
        ka_raw(a, sizeof i, &i);
    }
}

void ka_tensor(kargs *a, const clnsa_tensor *t)
{
    bool present = tensor_present(t);
    ka_mem(a, present ? t->data : NULL);
    ka_idx(a, present ? (int64_t)t->offset : 0);
    int64_t st[4] = {0, 0, 0, 0};
    for (int i = 0; present && i < t->rank && i < 4; ++i) st[i] = t->strides[i];
    if (a->idx_long) {
        cl_long4 v = {{st[0], st[1], st[2], st[3]}};
        ka_raw(a, sizeof v, &v);
    } else {
        cl_int4 v = {{(cl_int)st[0], (cl_int)st[1], (cl_int)st[2], (cl_int)st[3]}};
        ka_raw(a, sizeof v, &v);
    }
}

/* ----------------------------------------------------------- enqueuing */

void chain_init(cmd_chain *c, cl_command_queue q, cl_uint nwait, const cl_event *wait)
{
    c->queue = q;
    c->nwait = nwait;
    c->wait = wait;
    c->last = NULL;
}

void chain_adopt(cmd_chain *c, cl_event ev)
{
    if (c->last) clReleaseEvent(c->last);
    c->last = ev;
}

static void chain_waits(const cmd_chain *c, cl_uint *n, const cl_event **w)
{
    *n = c->last ? 1 : c->nwait;
    *w = c->last ? &c->last : c->wait;
}

/* Test hook (fault injection): CLNSA_FAULT_INJECT=enqueue:N[:CODE] makes the
 * Nth kernel enqueue counted from when the variable took its current value
 * (process-wide, 1-based) fail with CODE instead of being enqueued (default
 * CL_MEM_OBJECT_ALLOCATION_FAILURE, -4; e.g. -2 CL_DEVICE_NOT_AVAILABLE or
 * -5 CL_OUT_OF_RESOURCES simulate a device lost or exhausted mid-op). Only
 * read when set, so it costs one getenv per enqueue otherwise. */
static cl_int injected_fault(void)
{
    const char *spec = getenv("CLNSA_FAULT_INJECT");
    if (!spec || strncmp(spec, "enqueue:", 8) != 0) return CL_SUCCESS;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static char seen[64];
    static long count;
    pthread_mutex_lock(&lock);
    if (strncmp(seen, spec, sizeof seen - 1) != 0) {
        snprintf(seen, sizeof seen, "%s", spec);
        count = 0;
    }
    const long n = ++count;
    pthread_mutex_unlock(&lock);
    char *end;
    const long which = strtol(spec + 8, &end, 10);
    const long code = *end == ':' ? strtol(end + 1, NULL, 10) : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    return n == which && code < 0 ? (cl_int)code : CL_SUCCESS;
}

clnsa_status chain_kernel(clnsa_context *ctx, cmd_chain *c, cl_kernel k, const size_t *global, const size_t *local)
{
    cl_uint n;
    const cl_event *w;
    chain_waits(c, &n, &w);
    cl_event ev = NULL;
    if (getenv("CLNSA_TRACE_KERNELS")) { /* test hook: which kernels ran (coverage of the Oclgrind runs) */
        char name[128] = "?";
        clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
        name[sizeof name - 1] = '\0';
        fprintf(stderr, "clnsa-trace: kernel %s local %zu\n", name, local ? local[0] : 0);
    }
    /* The device's limits, as probed (lowered by CLNSA_MAX_LOCAL_MEM /
     * CLNSA_MAX_WORK_GROUP to simulate other vendors): a kernel that would
     * not fit them is refused here, so that a simulated limit is as strict
     * as a real one; and the work-group size must be the kernel's
     * reqd_work_group_size. */
    size_t reqd[3] = {0, 0, 0};
    cl_ulong kmem = 0;
    if (local && clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof reqd, reqd, NULL) ==
                     CL_SUCCESS && reqd[0] && reqd[0] != local[0])
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "internal: kernel enqueued with a work-group of %zu, but compiled for %zu",
                       local[0], reqd[0]);
    if (local && local[0] * local[1] * local[2] > ctx->info.max_work_group_size)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device: a work-group of %zu exceeds the device's maximum %zu",
                       local[0] * local[1] * local[2], ctx->info.max_work_group_size);
    /* Local memory only against a simulated limit: real drivers enforce
     * their own, and rusticl reports twice the declared arrays for
     * nsa_bwd_dkdv at 512 work-items yet runs it within its 32 KiB. */
    if (getenv("CLNSA_MAX_LOCAL_MEM") &&
        clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof kmem, &kmem, NULL) == CL_SUCCESS &&
        kmem > ctx->info.local_mem_size)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device: a kernel needs %llu bytes of local memory, the device has %llu",
                       (unsigned long long)kmem, (unsigned long long)ctx->info.local_mem_size);
    if (getenv("CLNSA_TRACE_KERNELS")) fprintf(stderr, "clnsa-trace: local memory %llu of %llu\n", (unsigned long long)kmem,
                                               (unsigned long long)ctx->info.local_mem_size);
    const cl_int fault = injected_fault();
    cl_int err = fault != CL_SUCCESS ? fault : clEnqueueNDRangeKernel(c->queue, k, 3, NULL, global, local, n, w, &ev);
    if (err != CL_SUCCESS) {
        char name[128] = "?", what[192];
        clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
        name[sizeof name - 1] = '\0';
        snprintf(what, sizeof what, "clEnqueueNDRangeKernel (kernel %s)", name);
        return cx_fail_cl(ctx, err, what);
    }
    chain_adopt(c, ev);
    return CLNSA_SUCCESS;
}

clnsa_status chain_barrier(clnsa_context *ctx, cmd_chain *c)
{
    cl_uint n;
    const cl_event *w;
    chain_waits(c, &n, &w);
    if (n == 0) return CLNSA_SUCCESS;
    cl_event ev = NULL;
    cl_int err = clEnqueueBarrierWithWaitList(c->queue, n, w, &ev);
    if (err != CL_SUCCESS) return cx_fail_cl(ctx, err, "clEnqueueBarrierWithWaitList");
    chain_adopt(c, ev);
    return CLNSA_SUCCESS;
}

clnsa_status chain_finish(clnsa_context *ctx, cmd_chain *c, cl_event *event)
{
    if (!c->last && event) {
        cl_int err = clEnqueueMarkerWithWaitList(c->queue, c->nwait, c->wait, &c->last);
        if (err != CL_SUCCESS) return cx_fail_cl(ctx, err, "clEnqueueMarkerWithWaitList");
    }
    if (event) *event = c->last;
    else if (c->last) clReleaseEvent(c->last);
    c->last = NULL;
    return CLNSA_SUCCESS;
}

clnsa_status param_check(const clnsa_context *ctx, const char *name, float v, const char *zero_means)
{
    if (v == 0.0f || (v >= FLT_MIN && v <= CLNSA_PARAM_MAX)) return CLNSA_SUCCESS;
    return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "%s: expected 0 (%s) or a value in [%g, %g], got %g", name, zero_means,
                   (double)FLT_MIN, (double)CLNSA_PARAM_MAX, (double)v);
}
