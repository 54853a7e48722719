/* guard.c: see guard.h. */
#include "guard.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum { GUARD_BEFORE = 37, GUARD_GAP = 3, GUARD_AFTER = 29 };

size_t mem_bytes(cl_mem m)
{
    size_t n = 0;
    assert_int_equal(clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof n, &n, NULL), CL_SUCCESS);
    return n;
}

unsigned char *read_all(cl_command_queue q, cl_mem m)
{
    const size_t n = mem_bytes(m);
    unsigned char *p = malloc(n);
    assert_int_equal(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, p, 0, NULL, NULL), CL_SUCCESS);
    return p;
}

static size_t elements(const clnsa_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->rank; ++d) n *= (size_t)t->shape[d];
    return n;
}

/* Element offsets of a view in C order of its indices. */
static size_t *view_offsets(const clnsa_tensor *t)
{
    const size_t n = elements(t);
    size_t *at = malloc((n ? n : 1) * sizeof *at);
    int64_t idx[CLNSA_MAX_RANK] = {0};
    for (size_t i = 0; i < n; ++i) {
        size_t o = t->offset;
        for (int d = 0; d < t->rank; ++d) o += (size_t)(idx[d] * t->strides[d]);
        at[i] = o;
        for (int d = t->rank - 1; d >= 0; --d) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    return at;
}

void guard_place(const test_env *env, guard_view *g, const clnsa_tensor *like, bool gaps, unsigned salt)
{
    memset(g, 0, sizeof *g);
    if (!like->data) return;
    clnsa_tensor v = *like;
    const int r = v.rank;
    int64_t stride = 1;
    for (int d = r - 1; d >= 0; --d) {
        v.strides[d] = stride;
        stride *= v.shape[d] + (gaps && d == r - 1 && r > 1 ? GUARD_GAP : 0);
    }
    v.offset = GUARD_BEFORE;
    const size_t es = clnsa_dtype_size(v.dtype);
    g->bytes = es * (GUARD_BEFORE + (size_t)stride + GUARD_AFTER);
    g->before = malloc(g->bytes);
    for (size_t i = 0; i < g->bytes; ++i) g->before[i] = (unsigned char)(i * 131u + 17u + salt * 7u);
    cl_int err;
    v.data = clCreateBuffer(env->cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, g->bytes, g->before, &err);
    assert_int_equal(err, CL_SUCCESS);
    g->view = v;
}

size_t guard_check(const test_env *env, const guard_view *g, const clnsa_tensor *expect, const char *what)
{
    if (!g->view.data) return 0;
    const size_t es = clnsa_dtype_size(g->view.dtype), n = elements(&g->view);
    assert_int_equal(n, elements(expect));
    unsigned char *got = read_all(env->queue, g->view.data), *want = read_all(env->queue, expect->data);
    size_t *at = view_offsets(&g->view), *ref_at = view_offsets(expect);
    bool *inside = calloc(g->bytes, 1);
    for (size_t i = 0; i < n; ++i) {
        if (memcmp(got + es * at[i], want + es * ref_at[i], es) != 0) {
            print_error("%s: element %zu differs from the contiguous run\n", what, i);
            fail();
        }
        memset(inside + es * at[i], 1, es);
    }
    size_t guarded = 0;
    for (size_t b = 0; b < g->bytes; ++b) {
        if (inside[b]) continue;
        if (got[b] != g->before[b]) {
            print_error("%s: guard byte %zu (element %zu of the buffer) was written\n", what, b, b / es);
            fail();
        }
        ++guarded;
    }
    free(inside);
    free(at);
    free(ref_at);
    free(got);
    free(want);
    return guarded;
}

void guard_free(guard_view *g)
{
    if (g->view.data) clReleaseMemObject(g->view.data);
    free(g->before);
    memset(g, 0, sizeof *g);
}

void snapshot_add(const test_env *env, snapshot *s, const clnsa_tensor *t, size_t count)
{
    for (size_t i = 0; i < count; ++i) {
        if (!t[i].data) continue;
        bool seen = false;
        for (int j = 0; j < s->n; ++j) seen |= s->m[j] == t[i].data;
        if (seen) continue;
        assert_true(s->n < SNAPSHOT_MAX);
        s->m[s->n] = t[i].data;
        s->data[s->n++] = read_all(env->queue, t[i].data);
    }
}

void snapshot_check(const test_env *env, snapshot *s, const char *what)
{
    for (int j = 0; j < s->n; ++j) {
        unsigned char *now = read_all(env->queue, s->m[j]);
        if (memcmp(now, s->data[j], mem_bytes(s->m[j])) != 0) {
            print_error("%s: input buffer %d changed\n", what, j);
            fail();
        }
        free(now);
        free(s->data[j]);
    }
    s->n = 0;
}
