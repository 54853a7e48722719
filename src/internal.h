/* internal.h: what the parts of libclnsa share behind the public header. */
#ifndef CLNSA_INTERNAL_H
#define CLNSA_INTERNAL_H

#include "clnsa.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* ---------------------------------------------------------------- errors */

/* Records a message for this thread and context and returns `status`. */
clnsa_status cx_fail(const clnsa_context *ctx, clnsa_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clears this thread's message at the start of a public call. */
void cx_clear(const clnsa_context *ctx);
/* The start of a public workspace-size query: clears the message, checks
 * ctx and bytes and sets *bytes to 0, so that a query that fails says 0. */
clnsa_status cx_size_query(const clnsa_context *ctx, size_t *bytes);
/* Maps an OpenCL error to CLNSA_ERROR_OPENCL with "what: CL_... (code)". */
clnsa_status cx_fail_cl(const clnsa_context *ctx, cl_int err, const char *what);
const char *cl_error_name(cl_int err);

/* --------------------------------------------------------------- context */

typedef struct program_entry {
    char *key; /* file list + build options */
    cl_program program; /* NULL while a thread builds it */
    struct program_entry *next;
} program_entry;

/* What program_get did (tests and the start-up benchmark read them). */
typedef struct {
    atomic_uint builds;     /* programs built from source */
    atomic_uint disk_hits;  /* programs built from a cached binary */
    atomic_uint disk_misses;/* no usable cache file (absent, corrupt, mismatching, or refused by the driver) */
    atomic_uint disk_bad;   /* of the misses: a file that was there but not taken */
    atomic_uint disk_writes;/* cache files written */
} program_stats;

struct tune_file;

struct clnsa_context {
    cl_context cl;
    cl_device_id device;
    clnsa_device_info info;
    char *kernel_dir;    /* NULL: embedded sources */
    char *extra_options; /* NULL: none */
    pthread_mutex_t lock; /* guards `programs` and kernel argument setting */
    pthread_cond_t built; /* signalled when a program build ends */
    program_entry *programs;
    char *cache_dir;          /* on-disk program cache; NULL: off */
    struct tune_file *tuning; /* the user's tuning file; NULL: none */
    program_stats stats;
    int blas_used; /* CLBlast was called for this context (atomic; see clnsa_context_destroy) */
    clnsa_matrix_path matrix_path; /* resolved: never AUTO when the environment said otherwise */
    bool tf32; /* f32 calls may take the warp kernels in the TF32 mode (options.allow_tf32, $CLNSA_TF32) */
};

/* ----------------------------------------------------------------- device */

/* How a call's warp kernels (cl/warp_mma.h) run: not at all (the portable
 * kernels), on NVIDIA's tensor cores, or emulated. */
typedef enum { WARP_OFF, WARP_NV, WARP_EMULATED } warp_mode;

/* The headers every warp kernel's program starts with, in order (a
 * program's source is its files concatenated: warp_attn.h uses the other
 * three). */
#define WARP_KERNEL_HEADERS "common.h", "warp_mma.h", "warp_softmax.h", "warp_attn.h"

/* The context's matrix path (clnsa_context_options.matrix_path, else
 * $CLNSA_MMA) applied to the device and a storage dtype; the op still checks
 * its shapes and alignment (the warp kernels take f16 / bf16, and f32 in
 * the TF32 mode when the context allows it). */
warp_mode device_warp_mode(const clnsa_context *ctx, clnsa_dtype dtype);
/* Whether kernels may use Hopper's warpgroup products (cl/warpgroup_mma.h):
 * an NVIDIA device of compute capability exactly 9.0 (sm_90a instructions run
 * nowhere else), the tensor-core path not turned off, and CLNSA_WGMMA not 0. */
bool device_wgmma(const clnsa_context *ctx);
/* The mode narrowed to a call the warp kernels take: head dims multiples of
 * 16 up to 128, and the rows they read whole aligned (tensor_rows_aligned). */
warp_mode device_warp_path(const clnsa_context *ctx, clnsa_dtype dtype, int dk, int dv, const clnsa_tensor *const *rows,
                           size_t nrows);

/* ---------------------------------------------------------------- tensors */

/* What a tensor argument must look like. shape entries < 0 mean "any". */
typedef struct {
    const char *name;
    clnsa_dtype dtype; /* CLNSA_DTYPE_INVALID: any float dtype */
    int rank;
    int64_t shape[CLNSA_MAX_RANK];
    bool output;
} tensor_spec;

/* Validates presence, dtype, rank, shape, strides, self-overlap (outputs) and
 * bounds against CL_MEM_SIZE. */
clnsa_status tensor_check(const clnsa_context *ctx, const clnsa_tensor *t, const tensor_spec *spec);
static inline bool tensor_present(const clnsa_tensor *t) { return t && t->data != NULL; }
/* Largest element offset the view touches, plus one (0 for an empty view). */
uint64_t tensor_extent(const clnsa_tensor *t);
/* The warp kernels read and write whole 8- and 16-byte pieces of rows: unit
 * dim stride, and the other strides and the offset multiples of 8 elements
 * (true for an absent tensor). */
bool tensor_rows_aligned(const clnsa_tensor *t);
/* An optional tensor: absent is fine, present must match `s`. */
clnsa_status tensor_check_opt(const clnsa_context *ctx, const clnsa_tensor *t, tensor_spec s);
/* Does a present one of the n tensors reach past element 2^31 - 1? Then the
 * kernels index with 64-bit integers (IDX_LONG). NULL entries are absent. */
bool tensors_need_long_index(const clnsa_tensor *const *ts, size_t n);
/* A head dim the kernels take: a multiple of 8 in 8..256. */
clnsa_status head_dim_check(const clnsa_context *ctx, const char *name, int64_t d);

/* A float config parameter (scale, soft cap): 0 (its default: zero_means)
 * or a normal float no larger than CLNSA_PARAM_MAX (clnsa.h). The kernels
 * multiply it by log2(e) or divide by it in f32, and NVIDIA's compiler
 * flushes subnormals to zero: a subnormal scale became 0 there, and the
 * masked scores' -inf times 0 a NaN. */
clnsa_status param_check(const clnsa_context *ctx, const char *name, float v, const char *zero_means);

/* ---------------------------------------------------------------- kernels */

/* A kernel's arguments, appended in order; the first error sticks. */
typedef struct {
    cl_kernel kernel;
    cl_uint next;
    cl_int err;
    bool idx_long; /* idx_t is 64-bit in this program */
} kargs;

void ka_mem(kargs *a, cl_mem m);
void ka_int(kargs *a, int v);
void ka_float(kargs *a, float v);
void ka_idx(kargs *a, int64_t v);
void ka_long(kargs *a, int64_t v); /* a `long` argument, whatever idx_t is */
/* buffer, offset (idx_t), strides (idx4_t); an absent tensor passes NULL. */
void ka_tensor(kargs *a, const clnsa_tensor *t);

/* Builds (or finds in the context's cache) the program made of `files`
 * (NULL-terminated, common.h first) compiled with `defines`. */
clnsa_status program_get(clnsa_context *ctx, const char *const *files, const char *defines,
                         cl_program *out);
/* sm_90a's PTX from the PTX of a program built for sm_90 whose sm_90a
 * instructions are marked comments (src/program/ptx_sm90a.c, cl/warpgroup_mma.h),
 * each kernel capped at maxnreg registers where maxnreg > 0 (a program's
 * WG_MAXNREG; setmaxnreg needs it): malloc'ed, or NULL with *why saying what
 * was missing. */
char *ptx_to_sm90a(const char *ptx, int maxnreg, const char **why);
/* The register cap a program's source asks of its kernels ("#define
 * WG_MAXNREG n"), for ptx_to_sm90a; 0 where it defines none. */
int sm90a_register_cap(const char *src);
/* The on-disk program cache (src/program/cache.c). The folder for a new
 * context: `option`, else $CLNSA_CACHE_DIR, else $XDG_CACHE_HOME/clnsa, else
 * ~/.cache/clnsa; NULL when CLNSA_CACHE=0 or no folder is known. */
char *program_cache_dir(const char *option);
/* A program built from a cache file for exactly this source, options,
 * device, driver, platform and clnsa version; NULL on a miss. */
cl_program program_cache_load(clnsa_context *ctx, const char *src, const char *options);
/* Writes prog's binary to the cache (best effort, atomic). */
void program_cache_store(clnsa_context *ctx, const char *src, const char *options, cl_program prog);
/* Creates a kernel object of a cached program (the caller releases it). */
clnsa_status kernel_create(clnsa_context *ctx, cl_program prog, const char *name, cl_kernel *out);

/* Embedded kernel sources (generated at build time by scripts/embed_kernels.py). */
typedef struct {
    const char *name;
    const char *text;
    size_t size;
} embedded_source;
extern const embedded_source clnsa_embedded_sources[];
extern const size_t clnsa_embedded_source_count;

/* An in-order chain of enqueued commands: each waits for the previous one
 * (the first for the caller's wait list); the last event goes to the caller. */
typedef struct {
    cl_command_queue queue;
    cl_uint nwait;
    const cl_event *wait;
    cl_event last;
} cmd_chain;

void chain_init(cmd_chain *c, cl_command_queue q, cl_uint nwait, const cl_event *wait);
/* Enqueues kernel over `global` (3 dims, already multiples of `local`). */
clnsa_status chain_kernel(clnsa_context *ctx, cmd_chain *c, cl_kernel k, const size_t *global,
                          const size_t *local);
/* A barrier that waits for the chain so far (for CLBlast, which takes no wait list). */
clnsa_status chain_barrier(clnsa_context *ctx, cmd_chain *c);
/* Takes ownership of an event produced outside chain_kernel. */
void chain_adopt(cmd_chain *c, cl_event ev);
/* Hands the last event to the caller (or releases it); a chain with no
 * command gets a marker so the caller still receives an event. */
clnsa_status chain_finish(clnsa_context *ctx, cmd_chain *c, cl_event *event);

/* ------------------------------------------------------------------ plans */

/* An op's commands, all prepared before the first is enqueued. */
enum { PLAN_KERNEL, PLAN_GEMM };
#define PLAN_MAX_STEPS 48

typedef struct {
    int kind;
    const char *name;
    cl_kernel kernel;
    size_t global[3], local[3];
    /* GEMM, f32 row-major, operands in one buffer: C = op(A) op(B) + beta C */
    cl_mem gemm_buf;
    bool trans_a, trans_b;
    size_t m, n, k, a_off, a_ld, b_off, b_ld, c_off, c_ld;
    float beta;
} plan_step;

typedef struct {
    int nsteps;
    plan_step steps[PLAN_MAX_STEPS];
} op_plan;

/* Creates kernel `name` of `prog` as the next step over `global` (rounded up
 * to a multiple of local0) and points `a` at it for setting arguments. */
clnsa_status plan_add_kernel(clnsa_context *ctx, op_plan *p, cl_program prog, const char *name,
                             const size_t global[3], size_t local0, kargs *a, bool idx_long);
clnsa_status plan_args_done(clnsa_context *ctx, const kargs *a, const char *name);
clnsa_status plan_add_gemm(clnsa_context *ctx, op_plan *p, cl_mem buf, bool trans_a, bool trans_b,
                           size_t m, size_t n, size_t k, size_t a_off, size_t a_ld, size_t b_off,
                           size_t b_ld, float beta, size_t c_off, size_t c_ld);
clnsa_status plan_enqueue(clnsa_context *ctx, const op_plan *p, cmd_chain *chain);
void plan_release(op_plan *p);
/* The start of every enqueuing entry point: clears the caller's event and
 * this thread's message, and checks the queue and the wait list. */
clnsa_status op_begin(clnsa_context *ctx, cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                      cl_event *event);
/* Enqueues the plan if `prepared` is CLNSA_SUCCESS, hands the last event to
 * the caller, and releases the plan either way. */
clnsa_status plan_run(clnsa_context *ctx, op_plan *p, clnsa_status prepared, cl_command_queue queue,
                      cl_uint nwait, const cl_event *wait, cl_event *event);

/* ------------------------------------------------------------------ misc */

/* Returns x's status from the enclosing function unless it is success. */
#define CHECK(x)                              \
    do {                                      \
        clnsa_status st_ = (x);               \
        if (st_ != CLNSA_SUCCESS) return st_; \
    } while (0)

int cx_env_int(const char *name, int fallback);
/* Is a probed limit lowered through the environment (CLNSA_MAX_LOCAL_MEM,
 * CLNSA_MAX_WORK_GROUP, CLNSA_WG_MULTIPLE, CLNSA_MAX_MEM_ALLOC)? */
bool device_limits_from_env(void);
size_t round_up(size_t x, size_t m);

#endif
