/* testutil.h: what every device test needs: a device (or a skip), buffers
 * filled from host arrays in any dtype, poisoned outputs, and error norms. */
#ifndef CLNSA_TESTUTIL_H
#define CLNSA_TESTUTIL_H

#include "clnsa.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    cl_platform_id platform;
    cl_device_id device;
    cl_context cl;
    cl_command_queue queue;
    clnsa_context *ctx;
} test_env;

/* Opens the device chosen by CLNSA_TEST_DEVICE ("P:D" indices) or the first
 * one found. With no device: exits 77 (skip), or fails when
 * CLNSA_REQUIRE_DEVICE=1 so that a broken OpenCL install cannot pass. */
void test_env_open(test_env *env);
void test_env_close(test_env *env);
/* The options of a context on the tensor-core path's warp kernels: on
 * NVIDIA's tensor cores where the device has them (compute capability
 * 8.0+), else emulated (CLNSA_MATRIX_EMULATED); f32 calls take them in the
 * TF32 mode (allow_tf32). */
clnsa_context_options test_warp_options(const clnsa_device_info *info);
/* Re-creates env's clnsa context with test_warp_options. Returns which
 * path runs. */
const char *test_env_use_warp_path(test_env *env);

/* A second clnsa context on env's device with the options `base` (NULL:
 * the defaults) and a user tuning file (clnsa_context_options.tuning_file)
 * holding `entries` (JSON objects, comma-separated), for a test that needs
 * kernel parameters no database entry gives. Exits on failure. */
clnsa_context *test_context_with_tuning(const test_env *env, const clnsa_context_options *base, const char *entries);
/* An entry for it that splits the NSA forward from a length on (an integer
 * literal, or a macro naming one), with the window or without
 * (src/ops/nsa_fwd.c's choose_split). */
#define TEST_STR_(x) #x
#define TEST_STR(x) TEST_STR_(x)
#define TEST_TUNING_SPLIT_FROM(min_t) "{\"family\": \"nsa_fwd_split\", \"params\": {\"MIN_T\": " TEST_STR(min_t) "}}"
#define TEST_TUNING_SPLIT_ALWAYS TEST_TUNING_SPLIT_FROM(1)

/* A test executable whose tests share one device: defines `env` and the
 * CMocka group setup/teardown that open and close it (pass `setup` and
 * `teardown` to cmocka_run_group_tests). */
#define TEST_ENV_GROUP                                 \
    static test_env env;                               \
    static int setup(void **state)                     \
    {                                                  \
        (void)state;                                   \
        test_env_open(&env);                           \
        return 0;                                      \
    }                                                  \
    static int teardown(void **state)                  \
    {                                                  \
        (void)state;                                   \
        test_env_close(&env);                          \
        return 0;                                      \
    }

/* Deterministic uniform values in [lo, hi). */
void fill_uniform(double *x, size_t n, double lo, double hi, uint64_t *seed);
double *alloc_uniform(size_t n, double lo, double hi, uint64_t *seed);

/* A device buffer holding x converted to dtype (f32/f16/bf16), and the values
 * as the device sees them after rounding (written back into x when round_x). */
cl_mem upload(const test_env *env, const double *x, size_t n, clnsa_dtype dtype, bool round_x);
cl_mem upload_i32(const test_env *env, const int32_t *x, size_t n);
/* A buffer of n elements of dtype filled with NaN (floats) or 0x7fffffff (i32). */
cl_mem poisoned(const test_env *env, size_t n, clnsa_dtype dtype);
/* Reads n elements of dtype back as double (blocking). */
void download(const test_env *env, cl_mem m, size_t n, clnsa_dtype dtype, double *out);
void download_i32(const test_env *env, cl_mem m, size_t n, int32_t *out);
/* Rounds a host array as storage in dtype would. */
void round_to(double *x, size_t n, clnsa_dtype dtype);

/* ||x - ref|| / ||ref|| (or ||x|| when ref is all zero); NaN/inf in x gives +inf. */
double rel_l2(const double *x, const double *ref, size_t n);
/* Same, but the denominator is at least n * floor_rms^2: for gradients that
 * are zero in exact arithmetic (a bias under softmax shift invariance). */
double rel_l2_floor(const double *x, const double *ref, size_t n, double floor_rms);
/* Same, with -inf entries required to match exactly and skipped otherwise. */
double rel_l2_lse(const double *x, const double *ref, size_t n);
/* Asserts e <= t (NaN fails), printing "name: what rel L2 e" on failure,
 * and always when CLNSA_TEST_VERBOSE is set. */
void check_err(const char *what, const char *name, double e, double t);

/* Asserts st is CLNSA_SUCCESS, printing `what` and the context's last error
 * otherwise. */
void assert_ok(const test_env *env, clnsa_status st, const char *what);
/* Asserts the event exists and completes, then releases it. */
void wait_release(cl_event ev);

clnsa_tensor tensor4(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d);
clnsa_tensor tensor3(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c);

/* Directory of the golden cases (../shared/golden unpacked by the test
 * setup), or NULL with a message when absent. */
const char *golden_dir(void);

#endif
