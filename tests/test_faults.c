/* test_faults.c: concurrency and faults (issue 8).
 *  - The backward from several threads, each on its own queue, on one
 *    context: bitwise the gradients of serial runs.
 *  - A kernel build failure (CLNSA_BUILD_OPTIONS that break the kernels):
 *    CLNSA_ERROR_BUILD_FAILED with the build log in the message, nothing
 *    enqueued, and the context works once the options are fixed.
 *  - A kernel that compiles with a warning (a copy of cl/ with one added,
 *    read through the context's kernel_dir): with CLNSA_BUILD_LOG=werror,
 *    as the tests run, CLNSA_ERROR_BUILD_FAILED naming the warning and
 *    nothing enqueued; with the log off, the same sources build and run.
 *    On PoCL and NVIDIA (Mesa's compiler logs no warnings).
 *  - An enqueue failure injected through the CLNSA_FAULT_INJECT test hook
 *    (src/api/tensor.c): CL_MEM_OBJECT_ALLOCATION_FAILURE, and, as a
 *    *simulated* device lost or exhausted in the middle of an op,
 *    CL_DEVICE_NOT_AVAILABLE and CL_OUT_OF_RESOURCES, at the first, a middle
 *    and the last kernel of the forward and the backward: CLNSA_ERROR_OPENCL
 *    naming the error, no event, and afterwards the same context gives
 *    bitwise the results of an undisturbed run. A real device loss cannot be
 *    produced on a CPU device: the hook fails the enqueue call itself, which
 *    is where a driver reports it first.
 *  - A failure after the call returned: an event in the wait list ends in an
 *    error status (as commands do when a device is lost); the ops' events
 *    end in an error, and the context works afterwards. Skipped on PoCL
 *    (its abort) and on NVIDIA under MALLOC_PERTURB_ (the driver exits). */
#include "nsa_bwd_run.h"

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static test_env env;

static const nsa_case *named(const char *name)
{
    const nsa_case *c = nsa_case_named(name);
    if (!c) print_error("no case named '%s' in nsa_case.c\n", name);
    assert_non_null(c);
    return c;
}

/* ------------------------------------------------ backward on threads */

#define NTHREADS 3
static const char *const mt_cases[] = {"all branches G=1", "G=3 DK!=DV", "varlen short seqs",
                                       "given indices and counts", "window only", "bf16 all"};
#define NMT (sizeof mt_cases / sizeof mt_cases[0])

typedef struct {
    int id;
    cl_command_queue queue;
    nsa_run *runs;
    bwd_bufs b[NMT];
    clnsa_status st[NMT];
} mt_thread;

static void *mt_work(void *arg)
{
    mt_thread *t = arg;
    for (size_t j = 0; j < NMT; ++j) {
        const size_t i = (j + (size_t)t->id) % NMT; /* each thread in another order */
        t->st[i] = bwd_enqueue_wait(&env, t->queue, &t->b[i], &t->runs[i], NULL);
        if (t->st[i] == CLNSA_SUCCESS) bwd_read(&env, t->queue, &t->b[i], &t->runs[i]);
    }
    return NULL;
}

static void test_backward_threads(void **state)
{
    (void)state;
    nsa_run runs[NMT];
    bwd_bufs serial[NMT];
    for (size_t i = 0; i < NMT; ++i) {
        nsa_run_setup(&env, &runs[i], named(mt_cases[i]), 500 + i);
        nsa_run_forward(&env, &runs[i]);
        bwd_setup(&env, &serial[i], &runs[i], 900 + i);
        clnsa_status st = bwd_enqueue_wait(&env, env.queue, &serial[i], &runs[i], NULL);
        if (st) print_error("%s: %s\n", mt_cases[i], clnsa_last_error(env.ctx));
        assert_int_equal(st, CLNSA_SUCCESS);
        bwd_read(&env, env.queue, &serial[i], &runs[i]);
    }
    static mt_thread th[NTHREADS];
    pthread_t tid[NTHREADS];
    for (int t = 0; t < NTHREADS; ++t) {
        th[t].id = t;
        th[t].runs = runs;
        cl_int err;
        th[t].queue = clCreateCommandQueue(env.cl, env.device, 0, &err);
        assert_int_equal(err, CL_SUCCESS);
        for (size_t i = 0; i < NMT; ++i) bwd_setup(&env, &th[t].b[i], &runs[i], 900 + i);
    }
    for (int t = 0; t < NTHREADS; ++t) assert_int_equal(pthread_create(&tid[t], NULL, mt_work, &th[t]), 0);
    for (int t = 0; t < NTHREADS; ++t) assert_int_equal(pthread_join(tid[t], NULL), 0);
    int compared = 0;
    for (int t = 0; t < NTHREADS; ++t) {
        for (size_t i = 0; i < NMT; ++i) {
            if (th[t].st[i] != CLNSA_SUCCESS) print_error("thread %d, %s: %s\n", t, mt_cases[i], clnsa_status_string(th[t].st[i]));
            assert_int_equal(th[t].st[i], CLNSA_SUCCESS);
            for (int g = 0; g < G_COUNT; ++g) {
                if (!serial[i].g[g].m) continue;
                const bool same = memcmp(serial[i].g[g].dev, th[t].b[i].g[g].dev, serial[i].g[g].n * sizeof(double)) == 0;
                if (!same) print_error("thread %d, %s: %s differs from the serial run\n", t, mt_cases[i], serial[i].g[g].name);
                assert_true(same);
                ++compared;
            }
            bwd_free(&th[t].b[i]);
        }
        clReleaseCommandQueue(th[t].queue);
    }
    print_message("  %d gradients of %d backwards on %d threads (own queues) bitwise equal to the serial run\n", compared,
                  (int)(NTHREADS * NMT), NTHREADS);
    for (size_t i = 0; i < NMT; ++i) {
        bwd_free(&serial[i]);
        nsa_run_free(&runs[i]);
    }
}

/* ---------------------------------------------------- build failure */

static clnsa_status forward_once(nsa_run *r, cl_event *ev)
{
    size_t bytes = 0;
    *ev = NULL;
    clnsa_status st = clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &r->cfg, &r->in, &r->out, &bytes);
    if (st != CLNSA_SUCCESS) return st;
    if (!r->ws && bytes) r->ws = poisoned(&env, bytes / 4 + 1, CLNSA_DTYPE_F32);
    return clnsa_nsa_forward(env.ctx, env.queue, &r->cfg, &r->in, &r->out, r->ws, bytes, 0, NULL, ev);
}

static bool all_nan(cl_mem m, size_t n, clnsa_dtype dt)
{
    double *x = malloc(n * sizeof *x);
    download(&env, m, n, dt, x);
    bool nan = true;
    for (size_t i = 0; i < n; ++i) nan = nan && isnan(x[i]);
    free(x);
    return nan;
}

static void test_build_failure(void **state)
{
    (void)state;
    /* A macro that turns every barrier into a call of an undeclared
     * function: an error in every OpenCL C compiler, with a log. */
    const char *bad = "-Dbarrier=clnsa_no_such_function";
    nsa_run r;
    nsa_run_setup(&env, &r, named("G=3 DK!=DV"), 31);
    assert_int_equal(setenv("CLNSA_BUILD_OPTIONS", bad, 1), 0);
    cl_event ev;
    clnsa_status st = forward_once(&r, &ev);
    const char *msg = clnsa_last_error(env.ctx);
    print_message("  forward: %s: %.200s...\n", clnsa_status_string(st), msg);
    assert_int_equal(st, CLNSA_ERROR_BUILD_FAILED);
    assert_null(ev);
    assert_non_null(strstr(msg, bad));                    /* the options */
    assert_non_null(strstr(msg, "clnsa_no_such_function")); /* the log */
    assert_true(all_nan(r.o_m, r.nq * r.c->DV, r.c->dt)); /* nothing ran */

    /* The backward fails the same way (its programs differ). */
    bwd_bufs b;
    bwd_setup(&env, &b, &r, 32);
    bool got_event = true;
    st = bwd_enqueue_wait(&env, env.queue, &b, &r, &got_event);
    print_message("  backward: %s\n", clnsa_status_string(st));
    assert_int_equal(st, CLNSA_ERROR_BUILD_FAILED);
    assert_false(got_event);

    /* Fixed options: the same context builds and runs, forward and backward. */
    assert_int_equal(unsetenv("CLNSA_BUILD_OPTIONS"), 0);
    nsa_run_forward(&env, &r);
    ref_nsa_inputs rin = nsa_run_ref_inputs(&r);
    double *ro = calloc(r.nq * r.c->DV, sizeof *ro);
    ref_nsa_outputs rout = {ro, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    ref_nsa_fwd(&r.sh, &rin, &rout);
    const double e = rel_l2(r.o, ro, r.nq * r.c->DV);
    print_message("  after the failure: forward o rel L2 %.3g\n", e);
    assert_true(e < nsa_tol(r.c));
    st = bwd_enqueue_wait(&env, env.queue, &b, &r, NULL);
    assert_int_equal(st, CLNSA_SUCCESS);
    bwd_read(&env, env.queue, &b, &r);
    bwd_reference(&b, &r);
    const double ed = rel_l2_floor(b.g[G_DQ].dev, b.g[G_DQ].ref, b.g[G_DQ].n, 1e-2);
    print_message("  after the failure: backward dq rel L2 %.3g\n", ed);
    assert_true(ed < 5e-5);
    free(ro);
    bwd_free(&b);
    nsa_run_free(&r);
}

/* --------------------------------------------------- build warnings */

static struct {
    char dir[64];
    clnsa_context *saved; /* env.ctx while the probe's context stands in */
} warn;

/* Puts env.ctx back and removes the copied sources, whatever the test did. */
static int build_warning_teardown(void **state)
{
    (void)state;
    if (warn.saved) {
        clnsa_context_destroy(env.ctx);
        env.ctx = warn.saved;
        warn.saved = NULL;
    }
    setenv("CLNSA_BUILD_LOG", "werror", 1);
    if (warn.dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", warn.dir);
        if (system(cmd) != 0) print_message("  could not remove %s\n", warn.dir);
        warn.dir[0] = 0;
    }
    return 0;
}

static void test_build_warning(void **state)
{
    (void)state;
    const char *src = getenv("CLNSA_TEST_KERNEL_SRC"), *mode = getenv("CLNSA_BUILD_LOG");
    if (!src || !mode || strcmp(mode, "werror") != 0) {
        print_message("  skipped: run through meson test (CLNSA_TEST_KERNEL_SRC, CLNSA_BUILD_LOG=werror)\n");
        skip();
    }
    const clnsa_vendor vendor = clnsa_context_device_info(env.ctx)->vendor;
    if (vendor != CLNSA_VENDOR_POCL && vendor != CLNSA_VENDOR_NVIDIA) { /* Mesa's log has no warnings */
        print_message("  skipped: this device's compiler logs no warnings\n");
        skip();
    }
    static const char prefix[] = "/tmp/clnsa-warn-";
    snprintf(warn.dir, sizeof warn.dir, "%sXXXXXX", prefix);
    assert_non_null(mkdtemp(warn.dir));
    char cmd[1024], path[128];
    snprintf(cmd, sizeof cmd, "cp -r '%s'/. '%s'/", src, warn.dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/common.h", warn.dir);
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    /* named after the folder: a source no driver has compiled (NVIDIA's
     * keeps compiled programs, and a cached one comes with no log) */
    fprintf(f, "\ninline int clnsa_warning_probe_%s(int x) { return x && 2; }\n", warn.dir + strlen(prefix));
    fclose(f);

    clnsa_context_options o = {0};
    o.kernel_dir = warn.dir;
    o.cache_dir = warn.dir; /* nothing cached from the real sources */
    char msg[256];
    clnsa_context *ctx = NULL;
    assert_int_equal(clnsa_context_create(env.cl, env.device, &o, &ctx, msg, sizeof msg), CLNSA_SUCCESS);
    warn.saved = env.ctx;
    env.ctx = ctx;
    nsa_run r;
    nsa_run_setup(&env, &r, named("G=3 DK!=DV"), 41);
    cl_event ev;
    clnsa_status st = forward_once(&r, &ev);
    const char *err = clnsa_last_error(ctx);
    print_message("  werror: %s: %.120s...\n", clnsa_status_string(st), err);
    assert_int_equal(st, CLNSA_ERROR_BUILD_FAILED);
    assert_null(ev);
    const char *log = strstr(err, "(CLNSA_BUILD_LOG=werror):\n");
    assert_non_null(log);
    assert_non_null(strstr(log, "warning")); /* the compiler's log follows */
    assert_true(all_nan(r.o_m, r.nq * r.c->DV, r.c->dt));

    assert_int_equal(setenv("CLNSA_BUILD_LOG", "0", 1), 0);
    nsa_run_forward(&env, &r); /* asserts success */
    nsa_run_free(&r);
}

/* ---------------------------------------------------- injected faults */

static const struct {
    int code;
    const char *name;
} faults[] = {
    {-4, "CL_MEM_OBJECT_ALLOCATION_FAILURE"}, /* allocation failure */
    {-2, "CL_DEVICE_NOT_AVAILABLE"},          /* simulated device loss */
    {-5, "CL_OUT_OF_RESOURCES"},              /* simulated device exhaustion / loss */
};

static void set_fault(int n, int code, const char *label)
{
    char spec[64];
    snprintf(spec, sizeof spec, "enqueue:%d:%d:%s", n, code, label); /* the label makes each spec new */
    assert_int_equal(setenv("CLNSA_FAULT_INJECT", spec, 1), 0);
}

/* An undisturbed forward and backward (the reference results), and a second
 * set of gradient buffers for the disturbed runs. */
typedef struct {
    nsa_run r;
    double *o_clean, *o;
    bwd_bufs clean, b;
} clean_run;

static void clean_setup(clean_run *cr, uint64_t seed)
{
    nsa_run_setup(&env, &cr->r, named("all branches G=1"), seed);
    nsa_run_forward(&env, &cr->r);
    cr->o_clean = cr->r.o;
    cr->r.o = NULL;
    cr->o = malloc(cr->r.nq * cr->r.c->DV * sizeof *cr->o);
    bwd_setup(&env, &cr->clean, &cr->r, seed + 1);
    assert_int_equal(bwd_enqueue_wait(&env, env.queue, &cr->clean, &cr->r, NULL), CLNSA_SUCCESS);
    bwd_read(&env, env.queue, &cr->clean, &cr->r);
    bwd_setup(&env, &cr->b, &cr->r, seed + 1);
}

/* The forward, then the backward, on the test queue: bitwise the clean run's. */
static void expect_clean(clean_run *cr)
{
    nsa_run *r = &cr->r;
    cl_event ev = NULL;
    assert_int_equal(forward_once(r, &ev), CLNSA_SUCCESS);
    assert_non_null(ev);
    assert_int_equal(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
    download(&env, r->o_m, r->nq * r->c->DV, r->c->dt, cr->o);
    assert_memory_equal(cr->o, cr->o_clean, r->nq * r->c->DV * sizeof *cr->o);
    assert_int_equal(bwd_enqueue_wait(&env, env.queue, &cr->b, r, NULL), CLNSA_SUCCESS);
    bwd_read(&env, env.queue, &cr->b, r);
    for (int g = 0; g < G_COUNT; ++g)
        if (cr->b.g[g].m) assert_memory_equal(cr->b.g[g].dev, cr->clean.g[g].dev, cr->b.g[g].n * sizeof(double));
}

static void clean_free(clean_run *cr)
{
    free(cr->o);
    free(cr->o_clean);
    bwd_free(&cr->b);
    bwd_free(&cr->clean);
    nsa_run_free(&cr->r);
}

static void test_injected_faults(void **state)
{
    (void)state;
    clean_run cr;
    clean_setup(&cr, 41);
    nsa_run *r = &cr.r;

    /* The forward enqueues 3 kernels here (mean pool, top-k, attention):
     * fail each; the backward 17 on PoCL (its passes depend on the device's
     * tuning): fail the first, the seventh and the twelfth. */
    const int fwd_at[3] = {1, 2, 3}, bwd_at[3] = {1, 7, 12};
    int runs = 0;
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; ++f)
        for (int k = 0; k < 3; ++k) {
            char label[32];
            snprintf(label, sizeof label, "fwd%zu.%d", f, k);
            set_fault(fwd_at[k], faults[f].code, label);
            cl_event ev;
            clnsa_status st = forward_once(r, &ev);
            const char *msg = clnsa_last_error(env.ctx);
            if (k == 0 && f == 0) print_message("  forward, kernel %d: %s: %s\n", fwd_at[k], clnsa_status_string(st), msg);
            assert_int_equal(st, CLNSA_ERROR_OPENCL);
            assert_null(ev);
            assert_non_null(strstr(msg, faults[f].name));
            assert_non_null(strstr(msg, "clEnqueueNDRangeKernel"));
            assert_int_equal(clFinish(env.queue), CL_SUCCESS); /* what was enqueued before still completes */
            assert_int_equal(unsetenv("CLNSA_FAULT_INJECT"), 0);

            snprintf(label, sizeof label, "bwd%zu.%d", f, k);
            set_fault(bwd_at[k], faults[f].code, label);
            bool got_event = true;
            st = bwd_enqueue_wait(&env, env.queue, &cr.b, r, &got_event);
            msg = clnsa_last_error(env.ctx);
            if (k == 1) print_message("  backward, kernel %d: %s: %s\n", bwd_at[k], clnsa_status_string(st), msg);
            assert_int_equal(st, CLNSA_ERROR_OPENCL);
            assert_false(got_event);
            assert_non_null(strstr(msg, faults[f].name));
            assert_int_equal(clFinish(env.queue), CL_SUCCESS);
            assert_int_equal(unsetenv("CLNSA_FAULT_INJECT"), 0);
            expect_clean(&cr); /* the same context, undisturbed */
            runs += 2;
        }
    print_message("  %d injected enqueue failures: each returned CLNSA_ERROR_OPENCL and no event; the next call matched "
                  "the undisturbed run bitwise\n", runs);
    clean_free(&cr);
}

/* A failure on the device after the call returned, as a lost device shows
 * it: an event the op waits on (a user event standing for the previous
 * command) ends in an error status. The forward and backward accept it,
 * their own event ends in an error too (they do not report success for work
 * that never ran), and the context then gives the undisturbed results on
 * another queue. */
static void test_failed_dependency(void **state)
{
    (void)state;
    char platform[128] = "";
    clGetPlatformInfo(env.platform, CL_PLATFORM_NAME, sizeof platform, platform, NULL);
    if (strstr(platform, "Portable Computing Language")) {
        /* PoCL 3.1 aborts the process (pocl_update_event_failed: pthread
         * EINVAL) when a failed event propagates down a chain of commands
         * whose intermediate events were released, as any caller may do; a
         * 3-kernel program without clnsa shows it. Run on rusticl in CI. */
        print_message("  skipped on PoCL (failed-event propagation aborts in PoCL 3.1); runs on rusticl\n");
        skip();
    }
    if (clnsa_context_device_info(env.ctx)->vendor == CLNSA_VENDOR_NVIDIA && getenv("MALLOC_PERTURB_")) {
        /* NVIDIA's driver 580 ends the process (exit status 255) between
         * clSetUserEventStatus and the events' status when malloc
         * perturbation is on (meson test sets MALLOC_PERTURB_), after every
         * kernel of both ops was enqueued; without it the test passes (H200,
         * 2026-11-24). A 3-kernel chain without clnsa did not reproduce it. */
        print_message("  skipped on NVIDIA under MALLOC_PERTURB_ (the driver exits); run the executable directly\n");
        skip();
    }
    clean_run cr;
    clean_setup(&cr, 61);
    nsa_run *r = &cr.r;
    bwd_bufs *b = &cr.b;

    cl_int err;
    cl_command_queue lost = clCreateCommandQueue(env.cl, env.device, 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_event dep = clCreateUserEvent(env.cl, &err);
    assert_int_equal(err, CL_SUCCESS);
    size_t fbytes = 0, bbytes = 0;
    assert_int_equal(clnsa_nsa_forward_workspace_size(env.ctx, lost, &r->cfg, &r->in, &r->out, &fbytes), CLNSA_SUCCESS);
    assert_int_equal(bwd_enqueue_wait(&env, env.queue, b, r, NULL), CLNSA_SUCCESS); /* sizes b's workspace */
    bbytes = b->ws_bytes;
    cl_event fev = NULL, bev = NULL;
    assert_int_equal(clnsa_nsa_forward(env.ctx, lost, &r->cfg, &r->in, &r->out, r->ws, fbytes, 1, &dep, &fev), CLNSA_SUCCESS);
    assert_int_equal(clnsa_nsa_backward(env.ctx, lost, &r->cfg, &r->in, &r->out, &b->dout, &b->grads, b->ws, bbytes, 1, &fev,
                                        &bev),
                     CLNSA_SUCCESS);
    assert_non_null(fev);
    assert_non_null(bev);
    assert_int_equal(clSetUserEventStatus(dep, CL_DEVICE_NOT_AVAILABLE), CL_SUCCESS);
    cl_event both[2] = {fev, bev};
    clWaitForEvents(2, both); /* an error code here is expected */
    for (int i = 0; i < 2; ++i) {
        cl_int status = CL_COMPLETE;
        assert_int_equal(clGetEventInfo(both[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL),
                         CL_SUCCESS);
        print_message("  %s waiting on a failed event: execution status %d\n", i ? "backward" : "forward", status);
        assert_true(status < 0);
        clReleaseEvent(both[i]);
    }
    clReleaseEvent(dep);
    clFinish(lost);
    clReleaseCommandQueue(lost);

    expect_clean(&cr);
    clean_free(&cr);
}

/* A workspace one byte short: rejected before anything is enqueued, and the
 * next call with the right size works. */
static void test_workspace_short_then_ok(void **state)
{
    (void)state;
    nsa_run r;
    nsa_run_setup(&env, &r, named("window only"), 51);
    size_t bytes = 0;
    assert_int_equal(clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &r.cfg, &r.in, &r.out, &bytes), CLNSA_SUCCESS);
    if (bytes > 0) {
        cl_mem ws = poisoned(&env, bytes / 4 + 1, CLNSA_DTYPE_F32);
        cl_event ev = NULL;
        clnsa_status st = clnsa_nsa_forward(env.ctx, env.queue, &r.cfg, &r.in, &r.out, ws, bytes - 1, 0, NULL, &ev);
        assert_int_equal(st, CLNSA_ERROR_WORKSPACE_TOO_SMALL);
        assert_null(ev);
        assert_true(all_nan(r.o_m, r.nq * r.c->DV, r.c->dt));
        clReleaseMemObject(ws);
    }
    nsa_run_forward(&env, &r);
    nsa_run_free(&r);
}

static int setup(void **state)
{
    (void)state;
    unsetenv("CLNSA_FAULT_INJECT");
    unsetenv("CLNSA_BUILD_OPTIONS");
    test_env_open(&env);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_env_close(&env);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_threads),
        cmocka_unit_test(test_build_failure),
        cmocka_unit_test_teardown(test_build_warning, build_warning_teardown),
        cmocka_unit_test(test_injected_faults),
        cmocka_unit_test(test_failed_dependency),
        cmocka_unit_test(test_workspace_short_then_ok),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
