/* test_api.c: the public API's contract on bad input: every rejected call
 * returns its own status and a message naming the argument, and enqueues
 * nothing (outputs and workspace stay byte-identical, *event is NULL).
 * Also: status strings, version, recovery after a failure. (Threads sharing
 * one context and strided views: test_api_runtime.c; guard regions around
 * every op's outputs: test_guard.c.) */
#include "api_problem.h"
#include "guard.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define F32 CLNSA_DTYPE_F32
#define I32 CLNSA_DTYPE_I32

static test_env env;

/* ------------------------------------------------------------ helpers */

static cl_mem make_buffer(const test_env *e, size_t bytes)
{
    cl_int err;
    cl_mem m = clCreateBuffer(e->cl, CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    return m;
}

/* Writes a byte pattern over the whole buffer (blocking) and returns it. */
static unsigned char *sentinel(cl_command_queue q, cl_mem m, unsigned salt)
{
    size_t n = mem_bytes(m);
    unsigned char *p = malloc(n);
    for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(i * 131u + 17u + salt * 7u);
    assert_int_equal(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, p, 0, NULL, NULL), CL_SUCCESS);
    return p;
}

/* ------------------------------------------------------- failing calls */

/* The fixture every bad-input test starts from: a valid call. */
static const shape base_shape = {2, 20, 4, 2, 16, 8, 3, 4, NULL, 0};
static problem base;

typedef struct {
    clnsa_context *ctx;
    cl_command_queue queue;
    clnsa_nsa_config cfg_v;
    clnsa_nsa_inputs in_v;
    clnsa_nsa_outputs out_v;
    cl_mem ws;
    size_t ws_bytes;
    cl_uint nwait;
    const cl_event *wait;
    bool null_cfg, null_in, null_out; /* pass NULL for that pointer */
} call;

static call valid_call(void)
{
    call c;
    memset(&c, 0, sizeof c);
    c.ctx = env.ctx;
    c.queue = env.queue;
    c.cfg_v = base.cfg;
    c.in_v = base.in;
    c.out_v = base.out;
    c.ws = base.ws;
    c.ws_bytes = base.ws_bytes;
    return c;
}

/* The message names the argument: it contains `name`; a name written with
 * a trailing ':' must open the message ("q: expected ..."). */
static bool names(const char *msg, const char *name)
{
    size_t n = strlen(name);
    if (n && name[n - 1] == ':') return strncmp(msg, name, n) == 0;
    return strstr(msg, name) != NULL;
}

enum {
    NO_WS_QUERY = 1, /* the failure belongs to the forward alone (queue, workspace, device) */
    NO_MESSAGE = 2,  /* no context to hold a message */
};

#define MAX_WATCH 15

/* Runs c (its *_v members, or NULL where asked), expects
 * `want` and a message containing `name`, and checks that no output buffer
 * and no workspace was touched and that *event came back NULL. */
static void expect_fail_(call c, clnsa_status want, const char *name, unsigned flags, int line)
{
    const clnsa_nsa_config *cfg = c.null_cfg ? NULL : &c.cfg_v;
    const clnsa_nsa_inputs *in = c.null_in ? NULL : &c.in_v;
    const clnsa_nsa_outputs *out = c.null_out ? NULL : &c.out_v;

    /* every buffer the call could write: the fixture's outputs, the call's
     * outputs and its workspace */
    cl_mem watch[MAX_WATCH];
    int nw = 0;
    cl_mem cand[] = {base.o, base.lse[0], base.lse[1], base.lse[2], base.bi, base.ws, c.ws,
                     out ? out->o.data : NULL, out ? out->lse_cmp.data : NULL, out ? out->lse_slc.data : NULL,
                     out ? out->lse_swa.data : NULL, out ? out->block_indices.data : NULL, out ? out->o_cmp.data : NULL,
                     out ? out->o_slc.data : NULL, out ? out->o_swa.data : NULL};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; ++i) {
        bool dup = !cand[i];
        for (int j = 0; j < nw && !dup; ++j) dup = watch[j] == cand[i];
        if (!dup) watch[nw++] = cand[i];
    }
    unsigned char *before[MAX_WATCH];
    for (int i = 0; i < nw; ++i) before[i] = sentinel(env.queue, watch[i], (unsigned)i);

    if (!(flags & NO_WS_QUERY)) {
        size_t bytes = 12345;
        clnsa_status st = clnsa_nsa_forward_workspace_size(c.ctx, c.queue, cfg, in, out, &bytes);
        if (st != want)
            print_error("line %d: workspace_size returned %s (%s), expected %s\n", line, clnsa_status_string(st),
                        c.ctx ? clnsa_last_error(c.ctx) : "", clnsa_status_string(want));
        assert_int_equal(st, want);
        if (!(flags & NO_MESSAGE)) assert_true(names(clnsa_last_error(c.ctx), name));
    }

    cl_event ev = (cl_event)(uintptr_t)0x1234; /* must be overwritten with NULL */
    clnsa_status st = clnsa_nsa_forward(c.ctx, c.queue, cfg, in, out, c.ws, c.ws_bytes, c.nwait, c.wait, &ev);
    const char *msg = c.ctx ? clnsa_last_error(c.ctx) : "";
    if (st != want || (!(flags & NO_MESSAGE) && !names(msg, name)))
        print_error("line %d: forward returned %s with \"%s\", expected %s naming \"%s\"\n", line,
                    clnsa_status_string(st), msg, clnsa_status_string(want), name);
    else
        print_message("  %-33s %s\n", clnsa_status_string(st), (flags & NO_MESSAGE) ? "(no context)" : msg);
    assert_int_equal(st, want);
    if (!(flags & NO_MESSAGE)) {
        assert_non_null(strstr(msg, name));
        assert_true(names(msg, name));
    }
    assert_null(ev);

    assert_int_equal(clFinish(env.queue), CL_SUCCESS);
    if (c.queue && c.queue != env.queue) assert_int_equal(clFinish(c.queue), CL_SUCCESS);
    for (int i = 0; i < nw; ++i) {
        unsigned char *after = read_all(env.queue, watch[i]);
        if (memcmp(before[i], after, mem_bytes(watch[i])) != 0)
            print_error("line %d: buffer %d was written by a failed call\n", line, i);
        assert_memory_equal(before[i], after, mem_bytes(watch[i]));
        free(after);
        free(before[i]);
    }
}

#define expect_fail(c, want, name, flags) expect_fail_((c), (want), (name), (flags), __LINE__)

/* Buffers of the right dtype and enough bytes for a view of n elements. */
static cl_mem scratch[32];
static int nscratch;
static cl_mem big(size_t elems)
{
    assert_true(nscratch < 32);
    return scratch[nscratch++] = make_buffer(&env, elems * 4);
}

/* ------------------------------------------------------------ NULLs */

static void test_null_ctx(void **state)
{
    (void)state;
    call c = valid_call();
    c.ctx = NULL;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "", NO_MESSAGE);
}

static void test_null_config(void **state)
{
    (void)state;
    call c = valid_call();
    c.null_cfg = true;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "config:", 0);
}

static void test_null_inputs(void **state)
{
    (void)state;
    call c = valid_call();
    c.null_in = true;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "in:", 0);
}

static void test_null_outputs(void **state)
{
    (void)state;
    call c = valid_call();
    c.null_out = true;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "out:", 0);
}

static void test_null_queue(void **state)
{
    (void)state;
    call c = valid_call();
    c.queue = NULL;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "queue:", NO_WS_QUERY);
}

/* The four workspace queries without a place for their answer: refused,
 * naming bytes, before anything else is looked at (the other arguments
 * here are NULL or would fail later). */
static void test_null_bytes(void **state)
{
    (void)state;
    for (int i = 0; i < 4; ++i) {
        clnsa_status st =
            i == 0 ? clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &base.cfg, &base.in, &base.out, NULL)
            : i == 1 ? clnsa_nsa_backward_workspace_size(env.ctx, env.queue, &base.cfg, &base.in, &base.out, NULL, NULL, NULL)
            : i == 2 ? clnsa_blocksparse_forward_workspace_size(env.ctx, NULL, NULL, NULL, NULL)
                     : clnsa_blocksparse_backward_workspace_size(env.ctx, NULL, NULL, NULL, NULL, NULL);
        assert_int_equal(st, CLNSA_ERROR_NULL_ARGUMENT);
        assert_true(names(clnsa_last_error(env.ctx), "bytes:"));
    }
    size_t bytes = 12345; /* a query that fails says 0 */
    assert_int_equal(clnsa_nsa_backward_workspace_size(env.ctx, env.queue, &base.cfg, &base.in, &base.out, NULL, NULL, &bytes),
                     CLNSA_ERROR_NULL_ARGUMENT);
    assert_int_equal(bytes, 0);
}

static void test_null_buffers(void **state)
{
    (void)state;
    call c = valid_call();
    c.in_v.q.data = NULL;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "q:", 0);
    c = valid_call();
    c.in_v.v.data = NULL;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "v:", 0);
    c = valid_call();
    c.out_v.o.data = NULL;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "o:", 0);
    c = valid_call(); /* top-k runs (g_slc, no indices given): out.block_indices is required */
    c.out_v.block_indices.data = NULL;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "out.block_indices:", 0);
    c = valid_call();
    c.nwait = 1;
    c.wait = NULL;
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "wait_list:", NO_WS_QUERY);
}

/* ------------------------------------------------------------ context */

static void test_context_create_null_context(void **state)
{
    (void)state;
    char msg[256] = "untouched";
    clnsa_context *ctx = (clnsa_context *)(uintptr_t)0x1234;
    clnsa_status st = clnsa_context_create(NULL, env.device, NULL, &ctx, msg, sizeof msg);
    print_message("  %s: %s\n", clnsa_status_string(st), msg);
    assert_int_equal(st, CLNSA_ERROR_NULL_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(msg, "cl_ctx"));

    ctx = (clnsa_context *)(uintptr_t)0x1234;
    st = clnsa_context_create(env.cl, NULL, NULL, &ctx, msg, sizeof msg);
    assert_int_equal(st, CLNSA_ERROR_NULL_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(msg, "device"));

    st = clnsa_context_create(env.cl, env.device, NULL, NULL, msg, sizeof msg);
    assert_int_equal(st, CLNSA_ERROR_NULL_ARGUMENT);
    assert_non_null(strstr(msg, "out"));
}

static void test_context_create_foreign_device(void **state)
{
    (void)state;
    /* A device that is not in env.cl: another device of the platform, or a
     * sub-device of ours (a distinct cl_device_id). */
    cl_device_id devs[64], other = NULL;
    cl_uint nd = 0, nsub = 0;
    if (clGetDeviceIDs(env.platform, CL_DEVICE_TYPE_ALL, 16, devs, &nd) == CL_SUCCESS)
        for (cl_uint i = 0; i < nd && !other; ++i)
            if (devs[i] != env.device) other = devs[i];
    /* Only where the device says it can be partitioned: Mesa's rusticl
     * reports 0 sub-devices and leaves clCreateSubDevices out of its ICD
     * dispatch table, so calling it through the loader jumps to NULL. */
    cl_uint max_sub = 0;
    if (clGetDeviceInfo(env.device, CL_DEVICE_PARTITION_MAX_SUB_DEVICES, sizeof max_sub, &max_sub, NULL) != CL_SUCCESS)
        max_sub = 0;
    if (!other && max_sub >= 2) {
        cl_uint cus = 0;
        clGetDeviceInfo(env.device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL);
        cl_device_partition_property props[] = {CL_DEVICE_PARTITION_EQUALLY, (cl_device_partition_property)(cus / 2), 0};
        if (cus >= 2 && clCreateSubDevices(env.device, props, 64, devs, &nsub) == CL_SUCCESS && nsub >= 1)
            other = devs[0];
        else nsub = 0;
    }
    if (!other) {
        print_message("  no second device and no sub-devices: cannot build a device outside the context\n");
        skip();
    }
    char msg[256] = "untouched";
    clnsa_context *ctx = (clnsa_context *)(uintptr_t)0x1234;
    clnsa_status st = clnsa_context_create(env.cl, other, NULL, &ctx, msg, sizeof msg);
    print_message("  %s: %s\n", clnsa_status_string(st), msg);
    assert_int_equal(st, CLNSA_ERROR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(msg, "device"));
    for (cl_uint i = 0; i < nsub; ++i) clReleaseDevice(devs[i]);
}

/* ------------------------------------------------------------ dtypes */

static void test_unknown_dtype(void **state)
{
    (void)state;
    call c = valid_call();
    c.in_v.q.dtype = (clnsa_dtype)99;
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "q:", 0);
    c = valid_call();
    c.out_v.o.dtype = (clnsa_dtype)99;
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "o:", 0);
}

static void test_dtype_mismatch(void **state)
{
    (void)state;
    call c = valid_call();
    c.in_v.k.dtype = CLNSA_DTYPE_F16; /* the f32 buffer is large enough for the f16 view */
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "k:", 0);
    c = valid_call();
    c.in_v.g_cmp.dtype = CLNSA_DTYPE_BF16;
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "g_cmp:", 0);
    c = valid_call();
    c.in_v.q.dtype = I32; /* q must be a float */
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "q:", 0);
    c = valid_call();
    c.out_v.lse_slc.dtype = I32; /* lse is always f32 */
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "lse_slc:", 0);
    c = valid_call();
    c.out_v.block_indices.dtype = F32;
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "out.block_indices:", 0);
}

/* The saved branch outputs: checked like o in the forward; the backward
 * takes them for every branch that is on or for none, and refuses some
 * without enqueueing anything. */
static void test_saved_branch_outputs(void **state)
{
    (void)state;
    const shape *sh = &base_shape;
    const size_t nq = (size_t)sh->B * sh->T * sh->HQ;
    call c = valid_call();
    c.out_v.o_slc = tensor4(big(nq * sh->D), F32, sh->B, sh->T + 1, sh->HQ, sh->D);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "o_slc:", 0);
    c = valid_call();
    c.out_v.o_cmp = tensor4(big(nq * sh->D), CLNSA_DTYPE_BF16, sh->B, sh->T, sh->HQ, sh->D);
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "o_cmp:", 0);

    clnsa_nsa_outputs saved = base.out;
    saved.o_cmp = tensor4(big(nq * sh->D), F32, sh->B, sh->T, sh->HQ, sh->D);
    const clnsa_tensor dout = tensor4(big(nq * sh->D), F32, sh->B, sh->T, sh->HQ, sh->D);
    clnsa_nsa_grads gr = {0};
    gr.dq = tensor4(big(nq * sh->D), F32, sh->B, sh->T, sh->HQ, sh->D);
    gr.dk = tensor4(big(nq * sh->D), F32, sh->B, sh->T, sh->H, sh->D);
    gr.dv = tensor4(big(nq * sh->D), F32, sh->B, sh->T, sh->H, sh->D);
    size_t bytes = 1;
    assert_int_equal(clnsa_nsa_backward_workspace_size(env.ctx, env.queue, &base.cfg, &base.in, &saved, &dout, &gr, &bytes),
                     CLNSA_ERROR_NULL_ARGUMENT);
    assert_true(names(clnsa_last_error(env.ctx), "saved.o_slc:"));
    unsigned char *before = sentinel(env.queue, gr.dq.data, 3);
    cl_event ev = (cl_event)(uintptr_t)0x1234;
    assert_int_equal(clnsa_nsa_backward(env.ctx, env.queue, &base.cfg, &base.in, &saved, &dout, &gr, base.ws, base.ws_bytes,
                                        0, NULL, &ev),
                     CLNSA_ERROR_NULL_ARGUMENT);
    print_message("  %s\n", clnsa_last_error(env.ctx));
    assert_true(names(clnsa_last_error(env.ctx), "saved.o_slc:"));
    assert_null(ev);
    assert_int_equal(clFinish(env.queue), CL_SUCCESS);
    unsigned char *after = read_all(env.queue, gr.dq.data);
    assert_memory_equal(before, after, mem_bytes(gr.dq.data));
    free(before);
    free(after);
}

/* ------------------------------------------------------------ shapes */

static void test_shape_T_differs(void **state)
{
    (void)state;
    call c = valid_call();
    c.in_v.k.shape[1] = base_shape.T - 1;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "k:", 0);
    c = valid_call();
    c.in_v.v.shape[1] = base_shape.T - 1;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "v:", 0);
    c = valid_call();
    c.in_v.g_slc.shape[1] = base_shape.T - 1;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "g_slc:", 0);
    c = valid_call();
    c.out_v.o.shape[1] = base_shape.T - 1;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "o:", 0);
    c = valid_call();
    c.in_v.k.rank = 3;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "k:", 0);
}

static void test_shape_H_not_dividing(void **state)
{
    (void)state;
    const shape *s = &base_shape;
    call c = valid_call();
    c.in_v.k = tensor4(big((size_t)s->B * s->T * 3 * s->D), F32, s->B, s->T, 3, s->D); /* HQ = 4 */
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "k:", 0);
    c = valid_call(); /* v's H must equal k's */
    c.in_v.v = tensor4(big((size_t)s->B * s->T * 4 * s->D), F32, s->B, s->T, 4, s->D);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "v:", 0);
}

static void test_shape_head_dim_not_multiple_of_8(void **state)
{
    (void)state;
    const shape *s = &base_shape;
    call c = valid_call();
    c.in_v.q.shape[3] = 12;
    c.in_v.k.shape[3] = 12;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "q (DK)", 0);
    c = valid_call(); /* q and k agree with DK = 16, v has DV = 20 */
    c.in_v.v = tensor4(big((size_t)s->B * s->T * s->H * 20), F32, s->B, s->T, s->H, 20);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "v (DV)", 0);
    c = valid_call(); /* k's DK differs from q's */
    c.in_v.k.shape[3] = 8;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "k:", 0);
}

static void test_shape_head_dim_too_large(void **state)
{
    (void)state;
    const shape *s = &base_shape;
    const size_t nq = (size_t)s->B * s->T * s->HQ, nk = (size_t)s->B * s->T * s->H;
    call c = valid_call();
    c.in_v.q = tensor4(big(nq * 264), F32, s->B, s->T, s->HQ, 264);
    c.in_v.k = tensor4(big(nk * 264), F32, s->B, s->T, s->H, 264);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "q (DK)", 0);
    c = valid_call();
    c.in_v.v = tensor4(big(nk * 264), F32, s->B, s->T, s->H, 264);
    c.out_v.o = tensor4(big(nq * 264), F32, s->B, s->T, s->HQ, 264);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "v (DV)", 0);
    /* A head dim beyond int: broadcast (stride 0) so that the view fits its
     * buffer, and 2^32 + 16 must not pass for 16. */
    c = valid_call();
    c.in_v.q.shape[3] = ((int64_t)1 << 32) + 16;
    c.in_v.q.strides[3] = 0;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "q (DK)", 0);
    c = valid_call();
    c.in_v.k.shape[2] = ((int64_t)1 << 32) + 2;
    c.in_v.k.strides[2] = 0;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "k:", 0);
}

/* ------------------------------------------------------------ layouts */

static void test_view_out_of_bounds(void **state)
{
    (void)state;
    const shape *s = &base_shape;
    call c = valid_call();
    c.in_v.q.strides[0] += 1; /* the last batch row runs one element past */
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "q:", 0);
    c = valid_call();
    c.in_v.k.offset = 1;
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "k:", 0);
    c = valid_call();
    c.in_v.v.strides[2] = s->D + 1; /* a padded head stride the buffer does not have */
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "v:", 0);
    c = valid_call();
    c.out_v.o.offset = 3;
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "o:", 0);
    c = valid_call();
    c.out_v.lse_swa.strides[1] = s->HQ + 1;
    c.out_v.lse_swa.strides[0] = (int64_t)s->T * (s->HQ + 1);
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "lse_swa:", 0);
    c = valid_call();
    c.out_v.block_indices.offset = 1;
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "out.block_indices:", 0);
    /* A view in a smaller buffer (CL_MEM_SIZE, not the shape, is the limit). */
    c = valid_call();
    c.in_v.g_swa.data = big((size_t)s->B * s->T * s->HQ - 1);
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "g_swa:", 0);
    /* Strides so large that the extent wraps around 64 bits must not pass. */
    c = valid_call();
    c.in_v.q.strides[1] = (int64_t)1 << 62;
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "q:", 0);
    c = valid_call();
    c.in_v.k.strides[0] = INT64_MAX;
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "k:", 0);
    c = valid_call();
    c.in_v.v.offset = SIZE_MAX - 4;
    expect_fail(c, CLNSA_ERROR_OUT_OF_BOUNDS, "v:", 0);
}

static void test_negative_stride(void **state)
{
    (void)state;
    call c = valid_call();
    c.in_v.k.strides[2] = -base_shape.D;
    c.in_v.k.offset = (size_t)base_shape.D; /* so that the view would stay inside */
    expect_fail(c, CLNSA_ERROR_INVALID_LAYOUT, "k:", 0);
    c = valid_call();
    c.in_v.q.strides[3] = -1;
    expect_fail(c, CLNSA_ERROR_INVALID_LAYOUT, "q:", 0);
    c = valid_call();
    c.out_v.o.strides[0] = -1;
    expect_fail(c, CLNSA_ERROR_INVALID_LAYOUT, "o:", 0);
}

static void test_output_self_overlap(void **state)
{
    (void)state;
    call c = valid_call();
    c.out_v.o.strides[1] = 0; /* every t writes the same row */
    expect_fail(c, CLNSA_ERROR_INVALID_LAYOUT, "o:", 0);
    c = valid_call();
    c.out_v.o.strides[2] = base_shape.D / 2; /* heads half overlap */
    expect_fail(c, CLNSA_ERROR_INVALID_LAYOUT, "o:", 0);
    c = valid_call();
    c.out_v.lse_cmp.strides[2] = 0;
    expect_fail(c, CLNSA_ERROR_INVALID_LAYOUT, "lse_cmp:", 0);
    c = valid_call();
    c.out_v.block_indices.strides[3] = 0;
    expect_fail(c, CLNSA_ERROR_INVALID_LAYOUT, "out.block_indices:", 0);
}

/* ------------------------------------------------------------ combinations */

static void test_g_swa_without_window(void **state)
{
    (void)state;
    call c = valid_call();
    c.cfg_v.window = 0;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "window", 0);
}

static void test_cu_seqlens_with_batch(void **state)
{
    (void)state;
    const int cu[] = {0, 7, 20};
    cl_mem m = upload_i32(&env, cu, 3);
    scratch[nscratch++] = m;
    int64_t n = 3;
    call c = valid_call(); /* B = 2 */
    c.in_v.cu_seqlens = clnsa_tensor_contiguous(m, I32, 1, &n);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "cu_seqlens", 0);
    c.in_v.cu_seqlens.dtype = F32;
    expect_fail(c, CLNSA_ERROR_INVALID_DTYPE, "cu_seqlens", 0);
    c.in_v.cu_seqlens.dtype = I32;
    c.in_v.cu_seqlens.shape[0] = 1; /* no sequence */
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "cu_seqlens", 0);
}

static void test_workspace_too_small(void **state)
{
    (void)state;
    assert_true(base.ws_bytes > 0);
    call c = valid_call();
    c.ws_bytes = base.ws_bytes - 1;
    expect_fail(c, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace:", NO_WS_QUERY);
    c = valid_call();
    c.ws = NULL;
    expect_fail(c, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace:", NO_WS_QUERY);
    c = valid_call(); /* the size claimed is right, the buffer is smaller */
    c.ws = big(base.ws_bytes / 4 - 1);
    expect_fail(c, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace:", NO_WS_QUERY);
}

static void test_block_indices_last_dim(void **state)
{
    (void)state;
    const shape *s = &base_shape;
    cl_mem m = big((size_t)s->B * s->T * s->H * (s->S + 1));
    call c = valid_call();
    c.in_v.block_indices = tensor4(m, I32, s->B, s->T, s->H, s->S + 1);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "block_indices:", 0);
    c = valid_call();
    c.out_v.block_indices = tensor4(m, I32, s->B, s->T, s->H, s->S - 1);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "out.block_indices:", 0);
    c = valid_call();
    c.in_v.block_indices = tensor4(m, I32, s->B, s->T, s->H, s->S);
    c.in_v.block_counts = tensor3(m, I32, s->B, s->T, s->H + 1);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "block_counts:", 0);
}

static void test_k_cmp_without_v_cmp(void **state)
{
    (void)state;
    const shape *s = &base_shape;
    const int nc = (s->T + s->bs - 1) / s->bs;
    cl_mem m = big((size_t)s->B * nc * s->H * s->D);
    call c = valid_call();
    c.in_v.k_cmp = tensor4(m, F32, s->B, nc, s->H, s->D);
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "v_cmp:", 0);
    c = valid_call();
    c.in_v.v_cmp = tensor4(m, F32, s->B, nc, s->H, s->D);
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "k_cmp:", 0);
    c = valid_call(); /* wrong number of compressed rows */
    c.in_v.k_cmp = tensor4(m, F32, s->B, nc - 1, s->H, s->D);
    c.in_v.v_cmp = tensor4(m, F32, s->B, nc - 1, s->H, s->D);
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "k_cmp:", 0);
}

static void test_w_k_without_w_v(void **state)
{
    (void)state;
    const int l = base_shape.bs, D = base_shape.D;
    int64_t sw[2] = {(int64_t)l * D, D}, sb = D;
    cl_mem m = big((size_t)l * D * D);
    call c = valid_call();
    c.in_v.w_k = clnsa_tensor_contiguous(m, F32, 2, sw);
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "w_v:", 0);
    c = valid_call(); /* a bias without weights */
    c.in_v.b_k = clnsa_tensor_contiguous(m, F32, 1, &sb);
    expect_fail(c, CLNSA_ERROR_NULL_ARGUMENT, "w_k:", 0);
    c = valid_call(); /* w_v of the wrong shape */
    c.in_v.w_k = clnsa_tensor_contiguous(m, F32, 2, sw);
    c.in_v.w_v = clnsa_tensor_contiguous(m, F32, 2, sw);
    c.in_v.w_v.shape[0] -= 1;
    expect_fail(c, CLNSA_ERROR_SHAPE_MISMATCH, "w_v:", 0);
}

static void test_config_out_of_range(void **state)
{
    (void)state;
    call c = valid_call();
    c.cfg_v.block_size = 0;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.block_size:", 0);
    c = valid_call();
    c.cfg_v.window = -1;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.window:", 0);
    c = valid_call();
    c.cfg_v.scale = NAN;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.scale:", 0);
    c = valid_call();
    c.cfg_v.scale = INFINITY;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.scale:", 0);
    c = valid_call();
    c.cfg_v.scale = -0.5f;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.scale:", 0);
    c = valid_call(); /* subnormal: NVIDIA's compiler flushes it to 0 (NaN from -inf * 0) */
    c.cfg_v.scale = 1e-40f;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.scale:", 0);
    c = valid_call(); /* past 1e30: scale * log2(e) times a score may overflow */
    c.cfg_v.scale = 1e31f;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.scale:", 0);
    c = valid_call();
    c.cfg_v.block_count = 0;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.block_count:", 0);
    c = valid_call();
    c.cfg_v.cmp_stride = -4;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.cmp_stride:", 0);
    c = valid_call();
    c.cfg_v.init_blocks = -1;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.init_blocks:", 0);
    c = valid_call();
    c.cfg_v.keep_ds = 4;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.keep_ds:", 0);
}

static void test_unsupported_device(void **state)
{
    (void)state;
    /* The probe reads CLNSA_MAX_LOCAL_MEM when the context is created. */
    assert_int_equal(setenv("CLNSA_MAX_LOCAL_MEM", "64", 1), 0);
    clnsa_context *small = NULL;
    char msg[256];
    clnsa_status st = clnsa_context_create(env.cl, env.device, NULL, &small, msg, sizeof msg);
    unsetenv("CLNSA_MAX_LOCAL_MEM");
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_int_equal(clnsa_context_device_info(small)->local_mem_size, 64);
    assert_true(clnsa_context_device_info(env.ctx)->local_mem_size > 64);

    call c = valid_call();
    c.ctx = small;
    expect_fail(c, CLNSA_ERROR_UNSUPPORTED_DEVICE, "local memory", NO_WS_QUERY);
    assert_non_null(strstr(clnsa_last_error(small), "device"));
    c.in_v.g_slc.data = NULL; /* without top-k the attention kernel is the one refused */
    expect_fail(c, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device", NO_WS_QUERY);
    clnsa_context_destroy(small);

    /* The environment variable is gone: a new context gets the real limit. */
    st = clnsa_context_create(env.cl, env.device, NULL, &small, msg, sizeof msg);
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_int_equal(clnsa_context_device_info(small)->local_mem_size,
                     clnsa_context_device_info(env.ctx)->local_mem_size);
    clnsa_context_destroy(small);
}

/* ------------------------------------------------------------ misc API */

static void test_status_strings(void **state)
{
    (void)state;
    const clnsa_status all[] = {
        CLNSA_SUCCESS, CLNSA_ERROR_NULL_ARGUMENT, CLNSA_ERROR_INVALID_ARGUMENT, CLNSA_ERROR_INVALID_DTYPE,
        CLNSA_ERROR_SHAPE_MISMATCH, CLNSA_ERROR_OUT_OF_BOUNDS, CLNSA_ERROR_UNSUPPORTED_DEVICE,
        CLNSA_ERROR_BUILD_FAILED, CLNSA_ERROR_OPENCL, CLNSA_ERROR_OUT_OF_HOST_MEMORY,
        CLNSA_ERROR_WORKSPACE_TOO_SMALL, CLNSA_ERROR_INVALID_LAYOUT, CLNSA_ERROR_BLAS,
    };
    const size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; ++i) {
        const char *s = clnsa_status_string(all[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 0);
        assert_non_null(strstr(s, "CLNSA_"));
        for (size_t j = 0; j < i; ++j) assert_string_not_equal(s, clnsa_status_string(all[j]));
    }
    assert_string_equal(clnsa_status_string(CLNSA_SUCCESS), "CLNSA_SUCCESS");
    assert_string_equal(clnsa_status_string(CLNSA_ERROR_SHAPE_MISMATCH), "CLNSA_ERROR_SHAPE_MISMATCH");
    /* a value outside the enum still gets a string, distinct from the real ones */
    const char *unk = clnsa_status_string((clnsa_status)-999);
    assert_non_null(unk);
    for (size_t j = 0; j < n; ++j) assert_string_not_equal(unk, clnsa_status_string(all[j]));
}

static void test_version(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", CLNSA_VERSION_MAJOR, CLNSA_VERSION_MINOR, CLNSA_VERSION_PATCH);
    assert_non_null(clnsa_version());
    assert_string_equal(clnsa_version(), want);
    assert_int_equal(clnsa_version_number(), CLNSA_VERSION_NUMBER);
    assert_int_equal(CLNSA_VERSION_NUMBER,
                     CLNSA_VERSION_MAJOR * 10000 + CLNSA_VERSION_MINOR * 100 + CLNSA_VERSION_PATCH);
}

static void test_dtype_helpers(void **state)
{
    (void)state;
    assert_int_equal(clnsa_dtype_size(F32), 4);
    assert_int_equal(clnsa_dtype_size(CLNSA_DTYPE_F16), 2);
    assert_int_equal(clnsa_dtype_size(CLNSA_DTYPE_BF16), 2);
    assert_int_equal(clnsa_dtype_size(I32), 4);
    assert_int_equal(clnsa_dtype_size(CLNSA_DTYPE_INVALID), 0);
    assert_int_equal(clnsa_dtype_size((clnsa_dtype)99), 0);
    assert_non_null(clnsa_dtype_name((clnsa_dtype)99));
}

static void test_recovers_after_failure(void **state)
{
    (void)state;
    call c = valid_call();
    c.cfg_v.block_size = 0;
    expect_fail(c, CLNSA_ERROR_INVALID_ARGUMENT, "config.block_size:", 0);
    assert_string_not_equal(clnsa_last_error(env.ctx), "");

    /* the same context, the same buffers: a valid call now succeeds */
    cl_event ev = NULL;
    clnsa_status st = clnsa_nsa_forward(env.ctx, env.queue, &base.cfg, &base.in, &base.out, base.ws, base.ws_bytes,
                                        0, NULL, &ev);
    if (st) print_error("%s\n", clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_string_equal(clnsa_last_error(env.ctx), "");
    assert_non_null(ev);
    assert_int_equal(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
    const size_t n = (size_t)base_shape.B * base_shape.T * base_shape.HQ * base_shape.D;
    double *o = malloc(n * sizeof *o);
    download(&env, base.o, n, F32, o);
    for (size_t i = 0; i < n; ++i) assert_true(isfinite(o[i]));
    free(o);

    /* a failure of workspace_size, then a good one: the message is cleared */
    size_t bytes = 0;
    c = valid_call();
    c.in_v.q.dtype = (clnsa_dtype)99;
    assert_int_equal(clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &c.cfg_v, &c.in_v, &c.out_v, &bytes),
                     CLNSA_ERROR_INVALID_DTYPE);
    assert_string_not_equal(clnsa_last_error(env.ctx), "");
    assert_int_equal(clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &base.cfg, &base.in, &base.out, &bytes),
                     CLNSA_SUCCESS);
    assert_int_equal(bytes, base.ws_bytes);
    assert_string_equal(clnsa_last_error(env.ctx), "");
}

/* ------------------------------------------------------------ main */

static int setup(void **state)
{
    (void)state;
    test_env_open(&env);
    problem_make(&base, &env, &base_shape, 7);
    clnsa_status st = problem_workspace(&base, &env, env.queue);
    if (st != CLNSA_SUCCESS) {
        fprintf(stderr, "fixture: %s: %s\n", clnsa_status_string(st), clnsa_last_error(env.ctx));
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < nscratch; ++i) clReleaseMemObject(scratch[i]);
    nscratch = 0;
    problem_free(&base);
    test_env_close(&env);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_ctx),
        cmocka_unit_test(test_null_config),
        cmocka_unit_test(test_null_inputs),
        cmocka_unit_test(test_null_outputs),
        cmocka_unit_test(test_null_queue),
        cmocka_unit_test(test_null_buffers),
        cmocka_unit_test(test_null_bytes),
        cmocka_unit_test(test_context_create_null_context),
        cmocka_unit_test(test_context_create_foreign_device),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_dtype_mismatch),
        cmocka_unit_test(test_saved_branch_outputs),
        cmocka_unit_test(test_shape_T_differs),
        cmocka_unit_test(test_shape_H_not_dividing),
        cmocka_unit_test(test_shape_head_dim_not_multiple_of_8),
        cmocka_unit_test(test_shape_head_dim_too_large),
        cmocka_unit_test(test_view_out_of_bounds),
        cmocka_unit_test(test_negative_stride),
        cmocka_unit_test(test_output_self_overlap),
        cmocka_unit_test(test_g_swa_without_window),
        cmocka_unit_test(test_cu_seqlens_with_batch),
        cmocka_unit_test(test_workspace_too_small),
        cmocka_unit_test(test_block_indices_last_dim),
        cmocka_unit_test(test_k_cmp_without_v_cmp),
        cmocka_unit_test(test_w_k_without_w_v),
        cmocka_unit_test(test_config_out_of_range),
        cmocka_unit_test(test_unsupported_device),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_dtype_helpers),
        cmocka_unit_test(test_recovers_after_failure),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
