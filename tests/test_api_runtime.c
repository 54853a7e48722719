/* test_api_runtime.c: the public API at run time: threads sharing one
 * context (each on its own queue, racing on the program builds) give the
 * serial run's results bit for bit, and strided views (a slice of a wider
 * row, K and V stored head-major) give the contiguous layout's. */
#include "api_problem.h"
#include "guard.h" /* read_all */

#include <math.h>
#include <pthread.h>
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

TEST_ENV_GROUP

/* ------------------------------------------------------------ threads */

#define NTHREADS 4
#define NRUNS 3

static const int mt_cu[] = {0, 9, 9, 30};
static const shape mt_shapes[] = {
    {1, 33, 4, 2, 16, 8, 3, 5, NULL, 0},
    {2, 17, 6, 2, 8, 4, 4, 3, NULL, 0},
    {1, 30, 4, 1, 16, 8, 2, 6, mt_cu, 3},
};

typedef struct {
    int id;
    cl_command_queue queue; /* NULL: the serial run on env.queue */
    unsigned char *o[NRUNS];
    size_t bytes[NRUNS];
    clnsa_status st[NRUNS];
    char msg[256];
    int stale_message; /* clnsa_last_error was not "" after a success */
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    test_env e = env;
    if (w->queue) e.queue = w->queue;
    for (int j = 0; j < NRUNS; ++j) {
        const shape *sh = &mt_shapes[(w->id + j) % 3];
        problem p;
        problem_make(&p, &e, sh, 1000 + 10 * (uint64_t)w->id + (uint64_t)j);
        w->st[j] = problem_run(&p, &e, e.queue);
        if (w->st[j] != CLNSA_SUCCESS) {
            snprintf(w->msg, sizeof w->msg, "%s", clnsa_last_error(e.ctx));
        } else {
            if (clnsa_last_error(e.ctx)[0]) w->stale_message = 1;
            w->bytes[j] = (size_t)sh->B * sh->T * sh->HQ * sh->D * sizeof(float);
            w->o[j] = malloc(w->bytes[j]);
            if (clEnqueueReadBuffer(e.queue, p.o, CL_TRUE, 0, w->bytes[j], w->o[j], 0, NULL, NULL) != CL_SUCCESS)
                w->st[j] = CLNSA_ERROR_OPENCL;
        }
        problem_free(&p);
    }
    return NULL;
}

static void test_multithread(void **state)
{
    (void)state;
    worker par[NTHREADS], ser[NTHREADS];
    pthread_t th[NTHREADS];
    memset(par, 0, sizeof par);
    memset(ser, 0, sizeof ser);
    /* the threads first, so that they also race on building the programs */
    for (int t = 0; t < NTHREADS; ++t) {
        cl_int err;
        par[t].id = t;
        par[t].queue = clCreateCommandQueue(env.cl, env.device, 0, &err);
        assert_int_equal(err, CL_SUCCESS);
    }
    for (int t = 0; t < NTHREADS; ++t) assert_int_equal(pthread_create(&th[t], NULL, work, &par[t]), 0);
    for (int t = 0; t < NTHREADS; ++t) assert_int_equal(pthread_join(th[t], NULL), 0);
    for (int t = 0; t < NTHREADS; ++t) {
        ser[t].id = t;
        work(&ser[t]);
    }
    int compared = 0;
    for (int t = 0; t < NTHREADS; ++t) {
        clReleaseCommandQueue(par[t].queue);
        assert_int_equal(par[t].stale_message, 0);
        for (int j = 0; j < NRUNS; ++j) {
            if (par[t].st[j] || ser[t].st[j])
                print_error("thread %d run %d: %s / serial %s: %s%s\n", t, j, clnsa_status_string(par[t].st[j]),
                            clnsa_status_string(ser[t].st[j]), par[t].msg, ser[t].msg);
            assert_int_equal(par[t].st[j], CLNSA_SUCCESS);
            assert_int_equal(ser[t].st[j], CLNSA_SUCCESS);
            assert_int_equal(par[t].bytes[j], ser[t].bytes[j]);
            assert_memory_equal(par[t].o[j], ser[t].o[j], par[t].bytes[j]);
            /* and the result is a real one */
            const float *f = (const float *)par[t].o[j];
            for (size_t i = 0; i < par[t].bytes[j] / 4; ++i) assert_true(isfinite(f[i]));
            free(par[t].o[j]);
            free(ser[t].o[j]);
            ++compared;
        }
    }
    print_message("  %d forwards on %d threads identical to the serial run\n", compared, NTHREADS);
}

/* ------------------------------------------------------------ views */

/* q as a slice of a [B,T,HQ,2*DK] buffer, k and v stored [B,H,T,D]: the
 * same results as the contiguous layout. */
static void strided_case(const shape *sh, uint64_t seed)
{
    const int B = sh->B, T = sh->T, HQ = sh->HQ, H = sh->H, D = sh->D, S = sh->S;
    const size_t nq = (size_t)B * T * HQ, nk = (size_t)B * T * H;
    problem p;
    problem_make(&p, &env, sh, seed);
    assert_int_equal(problem_run(&p, &env, env.queue), CLNSA_SUCCESS);
    double *o_ref = malloc(nq * D * sizeof *o_ref), *o = malloc(nq * D * sizeof *o);
    download(&env, p.o, nq * D, F32, o_ref);
    int32_t *bi_ref = malloc(nk * S * 4), *bi = malloc(nk * S * 4);
    download_i32(&env, p.bi, nk * S, bi_ref);

    float *qh = (float *)read_all(env.queue, p.q), *kh = (float *)read_all(env.queue, p.k);
    float *vh = (float *)read_all(env.queue, p.v);
    /* q in the second half of each row of 2*D; the first half is NaN, so
     * reading it would show */
    float *q2 = malloc(nq * 2 * D * 4);
    for (size_t r = 0; r < nq; ++r)
        for (int d = 0; d < D; ++d) {
            q2[r * 2 * D + d] = NAN;
            q2[r * 2 * D + D + d] = qh[r * D + d];
        }
    float *kt = malloc(nk * D * 4), *vt = malloc(nk * D * 4);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h)
                for (int d = 0; d < D; ++d) {
                    size_t nat = (((size_t)b * T + t) * H + h) * D + d, tr = (((size_t)b * H + h) * T + t) * D + d;
                    kt[tr] = kh[nat];
                    vt[tr] = vh[nat];
                }
    cl_int err;
    cl_mem q2m = clCreateBuffer(env.cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, nq * 2 * D * 4, q2, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem ktm = clCreateBuffer(env.cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, nk * D * 4, kt, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem vtm = clCreateBuffer(env.cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, nk * D * 4, vt, &err);
    assert_int_equal(err, CL_SUCCESS);

    clnsa_nsa_inputs in = p.in;
    in.q = tensor4(q2m, F32, B, T, HQ, D);
    in.q.offset = (size_t)D;
    in.q.strides[0] = (int64_t)T * HQ * 2 * D;
    in.q.strides[1] = (int64_t)HQ * 2 * D;
    in.q.strides[2] = 2 * D;
    in.q.strides[3] = 1;
    clnsa_tensor *kv[2] = {&in.k, &in.v};
    cl_mem kvm[2] = {ktm, vtm};
    for (int i = 0; i < 2; ++i) {
        *kv[i] = tensor4(kvm[i], F32, B, T, H, D);
        kv[i]->strides[0] = (int64_t)H * T * D;
        kv[i]->strides[1] = D;
        kv[i]->strides[2] = (int64_t)T * D;
        kv[i]->strides[3] = 1;
    }
    cl_mem om = poisoned(&env, nq * D, F32), bm = poisoned(&env, nk * S, I32);
    clnsa_nsa_outputs out = p.out;
    out.o.data = om;
    out.block_indices.data = bm;
    size_t ws_bytes = 0;
    assert_int_equal(clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &p.cfg, &in, &out, &ws_bytes), CLNSA_SUCCESS);
    assert_int_equal(ws_bytes, p.ws_bytes);
    cl_event ev = NULL;
    clnsa_status st = clnsa_nsa_forward(env.ctx, env.queue, &p.cfg, &in, &out, p.ws, p.ws_bytes, 0, NULL, &ev);
    if (st) print_error("%s\n", clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_int_equal(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
    download(&env, om, nq * D, F32, o);
    download_i32(&env, bm, nk * S, bi);
    double maxd = 0;
    for (size_t i = 0; i < nq * D; ++i) {
        double d = fabs(o[i] - o_ref[i]);
        if (!(d <= maxd)) maxd = d; /* NaN sticks */
    }
    print_message("  %s: max |o_strided - o_contiguous| = %.3g\n", sh->cu ? "varlen" : "batched", maxd);
    assert_true(maxd < 1e-6);
    assert_memory_equal(bi, bi_ref, nk * S * 4);

    free(o_ref); free(o); free(bi_ref); free(bi);
    free(qh); free(kh); free(vh); free(q2); free(kt); free(vt);
    clReleaseMemObject(q2m); clReleaseMemObject(ktm); clReleaseMemObject(vtm);
    clReleaseMemObject(om); clReleaseMemObject(bm);
    problem_free(&p);
}

static void test_strided_views(void **state)
{
    (void)state;
    const shape batched = {2, 29, 4, 2, 16, 8, 3, 6, NULL, 0};
    strided_case(&batched, 99);
    static const int cu[] = {0, 13, 13, 41};
    const shape varlen = {1, 41, 6, 3, 8, 8, 3, 5, cu, 3};
    strided_case(&varlen, 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multithread),
        cmocka_unit_test(test_strided_views),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
