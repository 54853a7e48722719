/* cli_common.h: what the subcommands of the clnsa tool share: option
 * parsing, device selection, host<->device copies with dtype conversion,
 * timing with profiling events, and error printing.
 *
 * Every function that can fail prints ONE line on stderr saying what failed
 * and returns -1 (or NULL); the caller only has to exit non-zero. */
#ifndef CLNSA_CLI_COMMON_H
#define CLNSA_CLI_COMMON_H

#include "clnsa.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes of every subcommand. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* ------------------------------------------------------------- options */

typedef enum { OPT_INT, OPT_DOUBLE, OPT_STRING, OPT_FLAG, OPT_CHOICE } cli_opt_kind;

typedef struct {
    const char *name;    /* "--block-size" */
    cli_opt_kind kind;
    void *dst;           /* int*, double*, const char**, bool*, int* (index into choices) */
    long lo, hi;         /* OPT_INT: accepted range */
    const char *choices; /* OPT_CHOICE: "f32|f16|bf16" */
    const char *arg;     /* metavariable in the usage, e.g. "N" */
    const char *help;
} cli_opt;

/* Parses argv[first..argc) against `opts` ("--name value" or "--name=value").
 * Returns 0, CLI_USAGE after printing one line on stderr, or -1 when --help
 * was asked (the caller prints its usage and exits 0). Seen options are
 * flagged in `seen` (may be NULL; one bool per option). */
int cli_parse(const char *cmd, int argc, char **argv, int first, const cli_opt *opts, size_t n, bool *seen);
/* Prints the option table, one option a line. */
void cli_print_opts(FILE *f, const cli_opt *opts, size_t n);

/* "f32|f16|bf16" choice index to dtype. */
clnsa_dtype cli_dtype_from_choice(int index);

/* ------------------------------------------------------------- devices */

typedef struct {
    int plat_index, dev_index;
    cl_platform_id platform;
    cl_device_id device;
    cl_context cl;
    cl_command_queue queue; /* in order, CL_QUEUE_PROFILING_ENABLE */
    clnsa_context *ctx;
    const clnsa_device_info *info;
} cli_env;

/* Device (p, d) of the ICD's list (platform p, device d of CL_DEVICE_TYPE_ALL). */
int cli_get_device(int p, int d, cl_platform_id *platform, cl_device_id *device);
/* The device `run` uses without --device: $CLNSA_DEVICE ("P:D") if set, else
 * the first GPU, else PoCL's CPU device, else the first device. */
int cli_default_device(int *p, int *d);
/* Parses "P:D". */
int cli_parse_device(const char *spec, int *p, int *d);
/* Opens device `spec` ("P:D", NULL = default) with a profiling queue and a
 * clnsa context. */
int cli_open(cli_env *env, const char *spec);
void cli_close(cli_env *env);

/* Prints "<what>: <status name>: <clnsa_last_error>" on stderr. */
void cli_report(const cli_env *env, const char *what, clnsa_status st);
/* "CL_..." name of an OpenCL error code (or "OpenCL error N"). */
const char *cli_cl_error(cl_int err);

/* ------------------------------------------------------ host <-> device */

/* A buffer of `bytes` (at least 4), copied from `host` when non-NULL. */
cl_mem cli_buffer(const cli_env *env, size_t bytes, const void *host);
/* n floats stored as `dt` (f32, f16 or bf16; rounded to nearest even). */
cl_mem cli_upload_f32(const cli_env *env, const float *x, size_t n, clnsa_dtype dt);
/* n copies of `value` stored as `dt`. */
cl_mem cli_fill(const cli_env *env, size_t n, clnsa_dtype dt, float value);
cl_mem cli_upload_i32(const cli_env *env, const int32_t *x, size_t n);
/* Blocking reads of n elements of `dt` (any float dtype) as float, and of int32. */
int cli_download_f32(const cli_env *env, cl_mem m, size_t n, clnsa_dtype dt, float *out);
int cli_download_i32(const cli_env *env, cl_mem m, size_t n, int32_t *out);
/* The next value of a splitmix64 stream. */
uint64_t cli_rng(uint64_t *state);
/* n values uniform in [lo, hi) from the stream, stored as `dt`. */
cl_mem cli_random(const cli_env *env, size_t n, float lo, float hi, clnsa_dtype dt, uint64_t *state);
/* Token t's row of S distinct causal blocks (of `block` tokens): the
 * forced ones first, ascending, as the library's top-k lists them (the
 * init_blocks first blocks and the local_blocks ending at t's block; 0 and
 * 0 for none), then random ones from the stream; -1 in the slots past the
 * blocks t sees. */
void cli_causal_selection(int32_t *row, int S, int t, int block, int init_blocks, int local_blocks, uint64_t *state);
/* x rounded as storage in `dt` would round it. */
float cli_round(float x, clnsa_dtype dt);

/* malloc that prints "out of host memory" and returns NULL on failure;
 * never returns NULL for a size of 0. */
void *cli_malloc(size_t bytes);

/* --------------------------------------------------------------- timing */

/* Times what is enqueued between begin and end with profiling events: a
 * 4-byte fill held back by a user event opens the span (a real command, so
 * every driver profiles it), and the span leaves out the host's enqueue time.
 * A short busy kernel runs between the user event and the fill, so that the
 * timed commands have reached the device when the fill ends, as they have
 * behind earlier work in a real queue: the span holds no submission latency
 * (bench/sdpa.py holds the GPU with a sleep kernel the same way). */
typedef struct {
    cl_event user, hold, marker; /* marker: the fill's event */
    cl_mem scratch;
} cli_timer;

/* Enqueues the held-back fill; pass t->marker as the wait list of the work. */
int cli_timer_begin(const cli_env *env, cli_timer *t);
/* Releases the fill, waits for `done` and returns the device time in ms
 * from the fill's end to `done`'s end (-1 on error). Releases t's events,
 * not `done`. */
double cli_timer_end(cli_timer *t, cl_event done);
/* Monotonic host clock in ms. */
double cli_now_ms(void);
/* Sorts n times (ms) in ascending order, for medians and extremes. */
void cli_sort_doubles(double *x, size_t n);
/* The median of n times (the upper of the middle two where n is even);
 * sorts them. */
double cli_median(double *x, size_t n);

/* Whether a float config option (--scale, --softcap) keeps its meaning as
 * the float the config holds; if not (a nonzero value that becomes 0, the
 * default), says so for `clnsa cmd --opt`. The range is the library's to
 * check (clnsa.h's CLNSA_PARAM_MAX), and its error names the parameter. */
bool cli_param_ok(const char *cmd, const char *opt, double v);

/* Parses s, a comma-separated list of at most max integers in [lo, hi],
 * into out: their count, or -1 after a message naming cmd and opt. */
int cli_parse_int_list(const char *cmd, const char *opt, const char *s, int lo, int hi, int *out, int max);

/* ---------------------------------------------------------------- misc */

/* Contiguous views of rank 4 and 3. */
clnsa_tensor cli_t4(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d);
clnsa_tensor cli_t3(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b, int64_t c);

/* "[2, 160, 16, 32]" */
const char *cli_shape_str(int ndim, const int64_t *shape, char *buf, size_t size);
/* "dir/name" into buf. */
const char *cli_path(const char *dir, const char *name, char *buf, size_t size);
/* mkdir -p */
int cli_mkdirs(const char *dir);

#endif
