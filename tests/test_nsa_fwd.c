/* test_nsa_fwd.c: the NSA forward against the double-precision reference on
 * random shapes (not multiples of the tiles), with poisoned outputs. */
#include "nsa_case.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

static void same_sets(const int *a, const int *b, size_t rows, int S)
{
    size_t bad = 0;
    for (size_t r = 0; r < rows; ++r)
        for (int s = 0; s < S; ++s) {
            bool found = false;
            for (int u = 0; u < S; ++u) found = found || a[r * S + s] == b[r * S + u];
            if (!found) ++bad;
        }
    if (bad) print_error("top-k: %zu entries differ from the reference\n", bad);
    assert_int_equal(bad, 0);
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
    const double tol = nsa_tol(c->dt);
    if (r.topk_ran && c->dt == CLNSA_DTYPE_F32) {
        int *rbi = malloc(r.nk * c->S * sizeof *rbi);
        ref_topk(&r.sh, r.q.h, r.rkc, r.counts, rbi);
        same_sets(r.bi, rbi, r.nk, c->S);
        free(rbi);
    }
    ref_nsa_inputs rin = nsa_run_ref_inputs(&r);
    double *ro = calloc(r.nq * c->DV, sizeof *ro), *rl[3];
    for (int i = 0; i < 3; ++i) rl[i] = calloc(r.nq, sizeof(double));
    ref_nsa_outputs rout = {ro, NULL, NULL, NULL, rl[0], rl[1], rl[2], NULL};
    ref_nsa_fwd(&r.sh, &rin, &rout);

    double e = rel_l2(r.o, ro, r.nq * c->DV);
    if (!(e < tol)) print_error("%s: o rel L2 %.3g\n", c->name, e);
    assert_true(e < tol);
    bool on[3] = {c->cmp, c->slc, c->swa};
    for (int i = 0; i < 3; ++i) {
        if (!on[i]) continue;
        double el = rel_l2_lse(r.lse[i], rl[i], r.nq);
        if (!(el < tol)) print_error("%s: lse[%d] rel L2 %.3g\n", c->name, i, el);
        assert_true(el < tol);
    }
    free(ro);
    for (int i = 0; i < 3; ++i) free(rl[i]);
    nsa_run_free(&r);
}

/* Every case of the shared list; CLNSA_TEST_CASE=name runs one (debugging). */
static void test_cases(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE");
    for (size_t i = 0; i < nsa_case_count; ++i)
        if (!only || strcmp(only, nsa_cases[i].name) == 0) run_case(&nsa_cases[i], 1234 + i);
}



int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
