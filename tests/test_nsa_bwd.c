/* test_nsa_bwd.c: the NSA backward against the double-precision reference's
 * gradients (themselves checked by finite differences in test_ref), on
 * random shapes, with poisoned outputs; and its determinism: bitwise equal
 * gradients run after run and across work-group sizes. */
#include "nsa_bwd_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

TEST_ENV_GROUP

static double grad_tol(clnsa_dtype dt) { return dt == CLNSA_DTYPE_F32 ? 5e-5 : 2e-2; }

/* Relative L2 against the reference; a gradient that is zero in exact
 * arithmetic (the bias of the compressed keys, under the softmax's shift
 * invariance) is checked by its largest absolute value instead. */
static void bwd_compare(const bwd_bufs *b, const nsa_case *c)
{
    for (int i = 0; i < G_COUNT; ++i) {
        const grad_buf *g = &b->g[i];
        if (!g->m) continue;
        double ref2 = 0, amax = 0;
        for (size_t j = 0; j < g->n; ++j) {
            ref2 += g->ref[j] * g->ref[j];
            amax = fmax(amax, fabs(g->dev[j]));
        }
        const bool zero = ref2 < 1e-20 * (double)g->n;
        double e = zero ? (isfinite(amax) ? amax : INFINITY) : rel_l2(g->dev, g->ref, g->n);
        const double tol = zero ? 1e-4 : grad_tol(c->dt);
        if (!(e < tol)) print_error("%s: %s %s %.3g\n", c->name, g->name, zero ? "max |x| (exact 0)" : "rel L2", e);
        assert_true(e < tol);
    }
}

/* The backward on the test queue, asserting success, and its gradients read back. */
static void run_device(bwd_bufs *b, const nsa_run *r)
{
    bool got_event = false;
    const clnsa_status st = bwd_enqueue_wait(&env, env.queue, b, r, &got_event);
    if (st) print_error("%s: %s\n", r->c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_true(got_event);
    bwd_read(&env, env.queue, b, r);
}

/* CLNSA_TEST_CASE=name runs only the case of that name (in every test). */
static bool selected(const char *name)
{
    const char *only = getenv("CLNSA_TEST_CASE");
    return !only || !*only || strcmp(only, name) == 0;
}

static void run_case(const nsa_case *c, uint64_t seed)
{
    if (!selected(c->name)) return;
    nsa_run r;
    nsa_run_setup(&env, &r, c, seed);
    nsa_run_forward(&env, &r);
    bwd_bufs b;
    bwd_setup(&env, &b, &r, seed + 99);
    run_device(&b, &r);
    bwd_reference(&b, &r);
    bwd_compare(&b, c);
    bwd_free(&b);
    nsa_run_free(&r);
}

/* Every case of the shared list; CLNSA_TEST_CASE=name runs one (debugging). */
static void test_cases(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE");
    for (size_t i = 0; i < nsa_case_count; ++i)
        if (!only || strcmp(only, nsa_cases[i].name) == 0) run_case(&nsa_cases[i], 4321 + i);
}

/* Same inputs: bitwise equal gradients twice, and with another work-group size. */
static void test_determinism(void **state)
{
    (void)state;
    const nsa_case *c = nsa_case_named("varlen short seqs");
    assert_non_null(c);
    if (!selected(c->name)) skip();
    nsa_run r;
    nsa_run_setup(&env, &r, c, 7);
    nsa_run_forward(&env, &r);
    bwd_bufs b[3];
    const char *wg[3] = {NULL, NULL, "32"};
    for (int k = 0; k < 3; ++k) {
        if (wg[k]) setenv("CLNSA_TUNE_WG", wg[k], 1);
        bwd_setup(&env, &b[k], &r, 11);
        run_device(&b[k], &r);
        unsetenv("CLNSA_TUNE_WG");
    }
    for (int k = 1; k < 3; ++k)
        for (int i = 0; i < G_COUNT; ++i) {
            if (!b[0].g[i].m) continue;
            const bool same = memcmp(b[0].g[i].dev, b[k].g[i].dev, b[0].g[i].n * sizeof(double)) == 0;
            if (!same) print_error("%s differs between run 0 and run %d\n", b[0].g[i].name, k);
            assert_true(same);
        }
    for (int k = 0; k < 3; ++k) bwd_free(&b[k]);
    nsa_run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
