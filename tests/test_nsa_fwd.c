/* test_nsa_fwd.c: the NSA forward against the double-precision reference on
 * random shapes (not multiples of the tiles), with poisoned outputs, each
 * branch's saved output included. */
#include "nsa_case.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

static void run_case(const nsa_case *c, uint64_t seed)
{
    if (!nsa_case_selected(c->name)) return;
    nsa_run r;
    nsa_run_setup(&env, &r, c, seed);
    nsa_run_save_branches(&env, &r);
    nsa_run_forward(&env, &r);
    nsa_check_forward(&r);
    nsa_run_free(&r);
}

/* Every case of the shared list; CLNSA_TEST_CASE=name runs one (debugging). */
static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < nsa_case_count; ++i) run_case(&nsa_cases[i], 1234 + i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
