/* blocksparse_mask.c: the block-mask builders (cl/blocksparse_mask.cl):
 * the pattern kinds, AND / OR of two masks, and a mask from a host array. */
#include "blocksparse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void clnsa_block_mask_desc_init(clnsa_block_mask_desc *d, clnsa_block_mask_kind kind, int Tq, int Tk)
{
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->Tq = Tq;
    d->Tk = Tk;
    d->q_block = 64;
    d->kv_block = 64;
    d->window_left = -1;
    d->window_right = -1;
    d->stride = 1;
    d->global_tokens = 0;
}

/* A mask view as [b, h, qb, kb] with zero strides where it has no such dim
 * or an extent of 1. */
typedef struct {
    int64_t nb, nh, nqb, nkb;
    int64_t st[4];
} mask_view;

static clnsa_status mask_view_of(clnsa_context *ctx, const char *name, const clnsa_tensor *m, bool output, mask_view *v)
{
    if (!m) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "%s: expected a clnsa_tensor, got NULL", name);
    if (m->data && (m->rank < 2 || m->rank > 4))
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "%s: expected rank 2, 3 or 4 ([B', HQ', NQB, NKB]), got %d", name,
                       m->rank);
    tensor_spec s = {name, CLNSA_DTYPE_I32, m->rank, {-1, -1, -1, -1}, output};
    clnsa_status st = tensor_check(ctx, m, &s);
    if (st != CLNSA_SUCCESS) return st;
    const int r = m->rank;
    v->nqb = m->shape[r - 2];
    v->nkb = m->shape[r - 1];
    v->nh = r >= 3 ? m->shape[r - 3] : 1;
    v->nb = r == 4 ? m->shape[0] : 1;
    v->st[0] = r == 4 && v->nb > 1 ? m->strides[0] : 0;
    v->st[1] = r >= 3 && v->nh > 1 ? m->strides[r - 3] : 0;
    v->st[2] = m->strides[r - 2];
    v->st[3] = m->strides[r - 1];
    int64_t nbh; /* checked: broadcast extents (stride 0) pass the bounds check at any size */
    if (__builtin_mul_overflow(v->nb, v->nh, &nbh) || nbh > 65535 * 65535LL || v->nqb > 0x7fffffff || v->nkb > 0x7fffffff)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH, "%s: too large", name);
    return CLNSA_SUCCESS;
}

static void ka_mask_view(kargs *a, const clnsa_tensor *m, const mask_view *v)
{
    clnsa_tensor t = *m;
    t.rank = 4;
    for (int i = 0; i < 4; ++i) t.strides[i] = v->st[i];
    ka_tensor(a, &t);
}

static bool mask_empty(const mask_view *v) { return v->nb == 0 || v->nh == 0 || v->nqb == 0 || v->nkb == 0; }

/* Plans `kernel` over the tensors `all` (three; the program's index width
 * follows the largest), leaving its arguments to the caller. */
static clnsa_status plan_mask_kernel(clnsa_context *ctx, const clnsa_tensor *const *all, const char *kernel, bs_plan *plan,
                                     kargs *a)
{
    const bool il = tensors_need_long_index(all, 3);
    char defines[256];
    bs_mask_defines(ctx, il, defines, sizeof defines);
    return bs_plan_kernel(ctx, plan, bs_mask_files, defines, kernel, il, a);
}

/* After the caller set the arguments (`what` names them in an error): one
 * work-item a block of `out`. */
static clnsa_status finish_mask_kernel(clnsa_context *ctx, bs_plan *plan, const kargs *a, const char *what,
                                       const mask_view *out)
{
    if (a->err != CL_SUCCESS) return cx_fail_cl(ctx, a->err, what);
    bs_plan_range(plan, (size_t)out->nkb, (size_t)out->nqb, (size_t)(out->nb * out->nh), tune_blocksparse_aux_wg(&ctx->info));
    return CLNSA_SUCCESS;
}


clnsa_status clnsa_block_mask_build(clnsa_context *ctx, cl_command_queue queue, const clnsa_block_mask_desc *d,
                                    clnsa_mask_op op, const clnsa_tensor *mask, cl_uint nwait, const cl_event *wait,
                                    cl_event *event)
{
    clnsa_status st = op_begin(ctx, queue, nwait, wait, event);
    if (st != CLNSA_SUCCESS) return st;
    if (!d) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "desc: expected a clnsa_block_mask_desc, got NULL");
    if (d->kind < CLNSA_BLOCK_MASK_ALL || d->kind > CLNSA_BLOCK_MASK_SEGMENT)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "desc.kind: expected a clnsa_block_mask_kind (0..5), got %d",
                       (int)d->kind);
    if (op < CLNSA_MASK_SET || op > CLNSA_MASK_OR)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "op: expected CLNSA_MASK_SET, _AND or _OR, got %d", (int)op);
    if (d->Tq < 1 || d->Tk < 1 || d->Tq > (1 << 30) || d->Tk > (1 << 30))
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "desc.Tq, desc.Tk: expected 1..2^30, got %d and %d", d->Tq, d->Tk);
    if (d->q_block < 1 || d->kv_block < 1)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "desc.q_block, desc.kv_block: expected >= 1, got %d and %d",
                       d->q_block, d->kv_block);
    if (d->window_left < -1 || d->window_right < -1)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "desc.window_left, desc.window_right: expected >= -1, got %d and %d",
                       d->window_left, d->window_right);
    if (d->kind == CLNSA_BLOCK_MASK_STRIDED && d->stride < 1)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "desc.stride: expected >= 1, got %d", d->stride);
    if (d->global_tokens < 0)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "desc.global_tokens: expected >= 0, got %d", d->global_tokens);
    mask_view v;
    st = mask_view_of(ctx, "mask", mask, true, &v);
    if (st != CLNSA_SUCCESS) return st;
    const int64_t nqb = (d->Tq + (int64_t)d->q_block - 1) / d->q_block, nkb = (d->Tk + (int64_t)d->kv_block - 1) / d->kv_block;
    if (v.nqb != nqb || v.nkb != nkb)
        return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH,
                       "mask: expected the last two extents [ceil(Tq/q_block), ceil(Tk/kv_block)] = [%lld, %lld], got [%lld, %lld]",
                       (long long)nqb, (long long)nkb, (long long)v.nqb, (long long)v.nkb);
    const clnsa_tensor none = {0};
    const clnsa_tensor *sq = &none, *sk = &none;
    if (d->kind == CLNSA_BLOCK_MASK_SEGMENT) {
        sq = &d->q_segment_ids;
        sk = &d->kv_segment_ids;
        st = tensor_check(ctx, sq, &(tensor_spec){"desc.q_segment_ids", CLNSA_DTYPE_I32, 2, {-1, d->Tq}, false});
        if (st == CLNSA_SUCCESS)
            st = tensor_check(ctx, sk, &(tensor_spec){"desc.kv_segment_ids", CLNSA_DTYPE_I32, 2, {sq->shape[0], d->Tk}, false});
        if (st != CLNSA_SUCCESS) return st;
        if (!(v.nb == sq->shape[0] || (sq->shape[0] == 1 && v.st[0] == 0)))
            return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH,
                           "mask: expected a batch extent equal to the segment ids' B = %lld (rank 4), got %lld",
                           (long long)sq->shape[0], (long long)v.nb);
    }
    /* An empty mask: nothing to write (the kernel divides by the head extent) */
    if (mask_empty(&v)) return plan_run(ctx, &(bs_plan){0}, CLNSA_SUCCESS, queue, nwait, wait, event);
    const clnsa_tensor *all[] = {mask, sq, sk};
    bs_plan plan = {0};
    kargs a;
    st = plan_mask_kernel(ctx, all, "bs_mask_build", &plan, &a);
    if (st == CLNSA_SUCCESS) {
        ka_int(&a, (int)d->kind);
        ka_int(&a, (int)op);
        ka_mask_view(&a, mask, &v);
        ka_int(&a, (int)v.nqb);
        ka_int(&a, (int)v.nkb);
        ka_int(&a, (int)v.nh);
        ka_int(&a, d->Tq);
        ka_int(&a, d->Tk);
        ka_int(&a, d->q_block);
        ka_int(&a, d->kv_block);
        ka_int(&a, d->window_left);
        ka_int(&a, d->window_right);
        ka_int(&a, d->stride < 1 ? 1 : d->stride);
        ka_int(&a, d->global_tokens);
        ka_tensor(&a, sq);
        ka_tensor(&a, sk);
        st = finish_mask_kernel(ctx, &plan, &a, "bs_mask_build arguments", &v);
    }
    return plan_run(ctx, &plan, st, queue, nwait, wait, event);
}

clnsa_status clnsa_block_mask_combine(clnsa_context *ctx, cl_command_queue queue, clnsa_mask_op op,
                                      const clnsa_tensor *a, const clnsa_tensor *b, const clnsa_tensor *out,
                                      cl_uint nwait, const cl_event *wait, cl_event *event)
{
    clnsa_status st = op_begin(ctx, queue, nwait, wait, event);
    if (st != CLNSA_SUCCESS) return st;
    if (op != CLNSA_MASK_AND && op != CLNSA_MASK_OR)
        return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "op: expected CLNSA_MASK_AND or CLNSA_MASK_OR, got %d", (int)op);
    mask_view va, vb, vo;
    if ((st = mask_view_of(ctx, "a", a, false, &va)) != CLNSA_SUCCESS) return st;
    if ((st = mask_view_of(ctx, "b", b, false, &vb)) != CLNSA_SUCCESS) return st;
    if ((st = mask_view_of(ctx, "out", out, true, &vo)) != CLNSA_SUCCESS) return st;
    const mask_view *in2[2] = {&va, &vb};
    for (int i = 0; i < 2; ++i) {
        const mask_view *v = in2[i];
        if (v->nqb != vo.nqb || v->nkb != vo.nkb || (v->nb != 1 && v->nb != vo.nb) || (v->nh != 1 && v->nh != vo.nh))
            return cx_fail(ctx, CLNSA_ERROR_SHAPE_MISMATCH,
                           "%s: expected [1 or %lld, 1 or %lld, %lld, %lld] to broadcast to out, got [%lld, %lld, %lld, %lld]",
                           i ? "b" : "a", (long long)vo.nb, (long long)vo.nh, (long long)vo.nqb, (long long)vo.nkb,
                           (long long)v->nb, (long long)v->nh, (long long)v->nqb, (long long)v->nkb);
    }
    /* An empty output: nothing to write (the kernel divides by the head extent) */
    if (mask_empty(&vo)) return plan_run(ctx, &(bs_plan){0}, CLNSA_SUCCESS, queue, nwait, wait, event);
    const clnsa_tensor *all[] = {a, b, out};
    bs_plan plan = {0};
    kargs k;
    st = plan_mask_kernel(ctx, all, "bs_mask_combine", &plan, &k);
    if (st == CLNSA_SUCCESS) {
        ka_int(&k, (int)op);
        ka_mask_view(&k, a, &va);
        ka_mask_view(&k, b, &vb);
        ka_mask_view(&k, out, &vo);
        ka_int(&k, (int)vo.nqb);
        ka_int(&k, (int)vo.nkb);
        ka_int(&k, (int)vo.nh);
        st = finish_mask_kernel(ctx, &plan, &k, "bs_mask_combine arguments", &vo);
    }
    return plan_run(ctx, &plan, st, queue, nwait, wait, event);
}

static void CL_CALLBACK free_staging(cl_event ev, cl_int status, void *data)
{
    (void)ev;
    (void)status;
    free(data);
}

clnsa_status clnsa_block_mask_from_host(clnsa_context *ctx, cl_command_queue queue, const uint8_t *host,
                                        const clnsa_tensor *mask, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    clnsa_status st = op_begin(ctx, queue, nwait, wait, event);
    if (st != CLNSA_SUCCESS) return st;
    if (!host) return cx_fail(ctx, CLNSA_ERROR_NULL_ARGUMENT, "host: expected a host array, got NULL");
    mask_view v;
    if ((st = mask_view_of(ctx, "mask", mask, true, &v)) != CLNSA_SUCCESS) return st;
    int64_t n = 1, s = 1;
    for (int i = mask->rank - 1; i >= 0; --i) {
        if (mask->shape[i] > 1 && mask->strides[i] != s)
            return cx_fail(ctx, CLNSA_ERROR_INVALID_LAYOUT, "mask: expected a contiguous (C-order) view, got stride %lld in dim %d",
                           (long long)mask->strides[i], i);
        /* checked: a broadcast extent (stride 0) passes the bounds check at any size */
        if (__builtin_mul_overflow(s, mask->shape[i], &s) || __builtin_mul_overflow(n, mask->shape[i], &n))
            return cx_fail(ctx, CLNSA_ERROR_INVALID_ARGUMENT, "mask: expected at most 2^63 entries, got shape extent %lld in dim %d",
                           (long long)mask->shape[i], i);
    }
    if (n == 0) return plan_run(ctx, &(bs_plan){0}, CLNSA_SUCCESS, queue, nwait, wait, event);
    cl_int *staging = malloc((size_t)n * sizeof *staging);
    if (!staging) return cx_fail(ctx, CLNSA_ERROR_OUT_OF_HOST_MEMORY, "out of host memory (%lld mask entries)", (long long)n);
    for (int64_t i = 0; i < n; ++i) staging[i] = host[i] != 0;
    cl_event ev = NULL;
    cl_int err = clEnqueueWriteBuffer(queue, mask->data, CL_FALSE, mask->offset * sizeof(cl_int), (size_t)n * sizeof(cl_int),
                                      staging, nwait, wait, &ev);
    if (err != CL_SUCCESS) {
        free(staging);
        return cx_fail_cl(ctx, err, "clEnqueueWriteBuffer (mask)");
    }
    /* The staging copy lives until the write completes. */
    err = clSetEventCallback(ev, CL_COMPLETE, free_staging, staging);
    if (err != CL_SUCCESS) {
        clWaitForEvents(1, &ev); /* cannot hand the copy over: keep it until done */
        free(staging);
    }
    if (event) *event = ev;
    else clReleaseEvent(ev);
    return CLNSA_SUCCESS;
}
