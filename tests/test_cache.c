/* test_cache.c: the on-disk program cache (src/program/cache.c). A second
 * context builds nothing from source; a truncated or corrupted file is
 * rebuilt (same results); another driver version misses; CLNSA_CACHE=0
 * writes nothing; no temporary file is left behind. PoCL's own kernel cache
 * is turned off (POCL_KERNEL_CACHE=0, before the first OpenCL call) so the
 * build times printed are the compiler's. Linked with the static library:
 * it reads the context's counters. */
#include "nsa_case.h"

#include "internal.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static test_env env;
static char dir[64];
static double *reference_o; /* the first run's output */
static size_t reference_n;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static clnsa_context *cached_context(void)
{
    clnsa_context_options o = {0};
    o.cache_dir = dir;
    clnsa_context *ctx = NULL;
    char msg[256];
    assert_int_equal(clnsa_context_create(env.cl, env.device, &o, &ctx, msg, sizeof msg), CLNSA_SUCCESS);
    return ctx;
}

/* Cache files in the folder (and temporary files, which must not stay). */
static int count_files(const char *suffix, char *first, size_t size)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name), sl = strlen(suffix);
        if (len > sl && strcmp(e->d_name + len - sl, suffix) == 0) {
            if (first && n == 0) snprintf(first, size, "%s/%s", dir, e->d_name);
            ++n;
        }
    }
    closedir(d);
    return n;
}

static int count_tmp(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* The NSA forward (compression, top-k, the three branches: 3 programs) on
 * ctx; checks the output against the first run's, bitwise. */
static double run_forward(clnsa_context *ctx)
{
    nsa_case c = {"cache", 1, 40, 4, 2, 16, 16, NULL, 0, 8, 3, 8, 8, 5, 1, 2, true, true, true,
                  false, false, false, false, false, CLNSA_DTYPE_F32, false};
    test_env te = env;
    te.ctx = ctx;
    nsa_run r;
    nsa_run_setup(&te, &r, &c, 42);
    const double t0 = now_ms();
    nsa_run_forward(&te, &r);
    const double ms = now_ms() - t0;
    const size_t n = r.nq * c.DV;
    if (!reference_o) {
        reference_o = malloc(n * sizeof *reference_o);
        memcpy(reference_o, r.o, n * sizeof *reference_o);
        reference_n = n;
    } else {
        assert_int_equal(n, reference_n);
        assert_memory_equal(r.o, reference_o, n * sizeof *reference_o);
    }
    nsa_run_free(&r);
    return ms;
}

static void test_second_context_hits(void **state)
{
    (void)state;
    clnsa_context *a = cached_context();
    const double cold = run_forward(a);
    const unsigned built = a->stats.builds;
    assert_true(built >= 3);
    assert_int_equal(a->stats.disk_hits, 0);
    assert_int_equal(a->stats.disk_writes, built);
    assert_int_equal(count_files(".clbin", NULL, 0), (int)built);
    clnsa_context_destroy(a);

    clnsa_context *b = cached_context();
    const double warm = run_forward(b);
    assert_int_equal(b->stats.builds, 0);
    assert_int_equal(b->stats.disk_hits, built);
    assert_int_equal(b->stats.disk_writes, 0);
    print_message("first forward with %u programs: %.0f ms built from source, %.0f ms from the disk cache\n", built,
                  cold, warm);
    clnsa_context_destroy(b);
    assert_int_equal(count_tmp(), 0);
}

static void test_truncated_file_is_rebuilt(void **state)
{
    (void)state;
    char path[256];
    assert_true(count_files(".clbin", path, sizeof path) > 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    clnsa_context *c = cached_context();
    run_forward(c); /* same output, bitwise */
    assert_int_equal(c->stats.builds, 1);
    assert_int_equal(c->stats.disk_bad, 1);
    assert_int_equal(c->stats.disk_writes, 1);
    clnsa_context_destroy(c);
    /* rewritten whole: the next context takes every program from the disk
     * (not the size: PoCL's binaries of one program can differ by a few
     * bytes from one build to the next) */
    clnsa_context *d = cached_context();
    run_forward(d);
    assert_int_equal(d->stats.builds, 0);
    assert_int_equal(d->stats.disk_bad, 0);
    clnsa_context_destroy(d);

    /* one flipped byte in the binary: the checksum refuses it */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, -16, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -16, SEEK_END);
    fputc(ch ^ 0x5a, f);
    fclose(f);
    c = cached_context();
    run_forward(c);
    assert_int_equal(c->stats.builds, 1);
    assert_int_equal(c->stats.disk_bad, 1);
    clnsa_context_destroy(c);
    assert_int_equal(count_tmp(), 0);
}

static void test_driver_change_misses(void **state)
{
    (void)state;
    const int before = count_files(".clbin", NULL, 0);
    clnsa_context *c = cached_context();
    /* a driver update, simulated: the key holds the driver version */
    strncat(c->info.driver_version, " (updated)", sizeof c->info.driver_version - strlen(c->info.driver_version) - 1);
    run_forward(c);
    assert_int_equal(c->stats.disk_hits, 0);
    assert_int_equal(c->stats.disk_bad, 0); /* other names: nothing even read */
    assert_true(c->stats.builds >= 3);
    assert_int_equal(count_files(".clbin", NULL, 0), before + (int)c->stats.builds);
    clnsa_context_destroy(c);
}

static void test_cache_off(void **state)
{
    (void)state;
    const int before = count_files(".clbin", NULL, 0);
    assert_int_equal(setenv("CLNSA_CACHE", "0", 1), 0);
    clnsa_context *c = cached_context();
    unsetenv("CLNSA_CACHE");
    assert_null(c->cache_dir);
    run_forward(c);
    assert_int_equal(c->stats.disk_hits + c->stats.disk_misses + c->stats.disk_writes, 0);
    assert_int_equal(count_files(".clbin", NULL, 0), before);
    clnsa_context_destroy(c);
}

static int setup(void **state)
{
    (void)state;
    setenv("POCL_KERNEL_CACHE", "0", 0);
    snprintf(dir, sizeof dir, "/tmp/clnsa-cache-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    test_env_open(&env);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_env_close(&env);
    free(reference_o);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_context_hits),
        cmocka_unit_test(test_truncated_file_is_rebuilt),
        cmocka_unit_test(test_driver_change_misses),
        cmocka_unit_test(test_cache_off),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
