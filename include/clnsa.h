/*
 * clnsa.h: the one public header of clnsa, a portable OpenCL library for
 * DeepSeek's Native Sparse Attention (NSA) and block-sparse attention.
 *
 * Ownership rules (they hold for every function below):
 *  - The caller owns OpenCL: the cl_context, the command queues, every buffer
 *    (inputs, outputs and the workspace) and every event it receives.
 *  - An op only enqueues work. It never calls clFinish, never blocks on the
 *    device, and never allocates device memory: scratch memory comes from a
 *    workspace buffer whose size the caller asks for first.
 *  - An op either enqueues all of its work or none of it: arguments are
 *    validated before the first enqueue, and a failed validation returns a
 *    status plus a message (clnsa_last_error) naming the argument, what was
 *    expected and what came.
 *  - One clnsa_context may be used from several threads at once, on the same
 *    or different queues.
 */
#ifndef CLNSA_H
#define CLNSA_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CLNSA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define CLNSA_API __attribute__((visibility("default")))
#else
#define CLNSA_API
#endif

/* ---------------------------------------------------------------- version */

#define CLNSA_VERSION_MAJOR 0
#define CLNSA_VERSION_MINOR 1
#define CLNSA_VERSION_PATCH 0
#define CLNSA_VERSION_NUMBER \
    (CLNSA_VERSION_MAJOR * 10000 + CLNSA_VERSION_MINOR * 100 + CLNSA_VERSION_PATCH)

/* "MAJOR.MINOR.PATCH" of the library actually linked (may differ from the
 * macros above when linking against another build). */
CLNSA_API const char *clnsa_version(void);
CLNSA_API int clnsa_version_number(void);

/* ----------------------------------------------------------------- status */

typedef enum clnsa_status {
    CLNSA_SUCCESS = 0,
    CLNSA_ERROR_NULL_ARGUMENT = -1,       /* a required pointer or buffer was NULL */
    CLNSA_ERROR_INVALID_ARGUMENT = -2,    /* a value out of its allowed range */
    CLNSA_ERROR_INVALID_DTYPE = -3,       /* unknown dtype, or not the one required */
    CLNSA_ERROR_SHAPE_MISMATCH = -4,      /* rank or extents disagree between tensors */
    CLNSA_ERROR_OUT_OF_BOUNDS = -5,       /* a view runs past its buffer (CL_MEM_SIZE) */
    CLNSA_ERROR_UNSUPPORTED_DEVICE = -6,  /* the device lacks a required capability */
    CLNSA_ERROR_BUILD_FAILED = -7,        /* a kernel did not compile; the log is in the message */
    CLNSA_ERROR_OPENCL = -8,              /* an OpenCL call failed; its code is in the message */
    CLNSA_ERROR_OUT_OF_HOST_MEMORY = -9,
    CLNSA_ERROR_WORKSPACE_TOO_SMALL = -10,/* workspace NULL or smaller than the queried size */
    CLNSA_ERROR_INVALID_LAYOUT = -11,     /* negative strides, or an output view that overlaps itself */
    CLNSA_ERROR_BLAS = -12                /* CLBlast returned an error; its code is in the message */
} clnsa_status;

/* A static English name for a status, e.g. "CLNSA_ERROR_SHAPE_MISMATCH". */
CLNSA_API const char *clnsa_status_string(clnsa_status status);

/* ---------------------------------------------------------------- tensors */

typedef enum clnsa_dtype {
    CLNSA_DTYPE_INVALID = 0,
    CLNSA_DTYPE_F32 = 1,
    CLNSA_DTYPE_F16 = 2,  /* IEEE half; needs no cl_khr_fp16 (vload_half/vstore_half) */
    CLNSA_DTYPE_BF16 = 3, /* stored as the top 16 bits of an f32, rounded to nearest even */
    CLNSA_DTYPE_I32 = 4   /* indices, counts, cu_seqlens */
} clnsa_dtype;

/* Bytes per element (0 for an invalid dtype). */
CLNSA_API size_t clnsa_dtype_size(clnsa_dtype dtype);
CLNSA_API const char *clnsa_dtype_name(clnsa_dtype dtype);

#define CLNSA_MAX_RANK 4

/*
 * A view into a caller-owned buffer: element (i0, i1, ...) lives at element
 * index  offset + i0*strides[0] + i1*strides[1] + ...  of `data`.
 * Offsets and strides count elements, not bytes. Strides must be >= 0; an
 * output view must not overlap itself. The whole view must lie inside the
 * buffer (checked against CL_MEM_SIZE).
 * A tensor whose `data` is NULL is "absent" (optional inputs and outputs).
 */
typedef struct clnsa_tensor {
    cl_mem data;
    size_t offset;
    clnsa_dtype dtype;
    int rank;
    int64_t shape[CLNSA_MAX_RANK];
    int64_t strides[CLNSA_MAX_RANK];
} clnsa_tensor;

/* A C-order (row-major, contiguous) view of `rank` dims starting at element 0. */
CLNSA_API clnsa_tensor clnsa_tensor_contiguous(cl_mem data, clnsa_dtype dtype, int rank,
                                               const int64_t *shape);

/* --------------------------------------------------------------- context */

typedef struct clnsa_context clnsa_context;

typedef struct clnsa_context_options {
    /* Extra options appended to every kernel build (NULL = none). */
    const char *extra_build_options;
    /* Folder to read kernel sources from instead of the embedded copies
     * (NULL = the CLNSA_KERNEL_DIR environment variable, else embedded). */
    const char *kernel_dir;
} clnsa_context_options;

/* Creates a context for one device of the caller's cl_context. The library
 * retains the cl_context and device and releases them in destroy. `options`
 * may be NULL. On failure *out is NULL and, when `status_message` is non-NULL,
 * a message of at most `message_size` bytes is written there. */
CLNSA_API clnsa_status clnsa_context_create(cl_context cl_ctx, cl_device_id device,
                                            const clnsa_context_options *options,
                                            clnsa_context **out, char *status_message,
                                            size_t message_size);
CLNSA_API void clnsa_context_destroy(clnsa_context *ctx);

/* The message of the last failed call made by this thread on this context
 * ("" if none). Valid until this thread's next call on the context. */
CLNSA_API const char *clnsa_last_error(const clnsa_context *ctx);

/* ---------------------------------------------------------- device probe */

typedef enum clnsa_vendor {
    CLNSA_VENDOR_OTHER = 0,
    CLNSA_VENDOR_NVIDIA,
    CLNSA_VENDOR_AMD,
    CLNSA_VENDOR_INTEL,
    CLNSA_VENDOR_POCL,  /* PoCL's CPU device */
    CLNSA_VENDOR_MESA   /* Mesa (rusticl, clover) */
} clnsa_vendor;

typedef struct clnsa_device_info {
    char name[256];
    char vendor_name[128];
    char driver_version[128];
    char platform_name[128];
    char device_version[128];   /* "OpenCL 3.0 ..." */
    char opencl_c_version[128]; /* "OpenCL C 1.2 ..." */
    char architecture[64];      /* "sm_90", "gfx90a", "intel-ip-0x...", "cpu", ... */
    clnsa_vendor vendor;
    int opencl_c_major, opencl_c_minor;
    int is_gpu;
    int nv_compute_major, nv_compute_minor; /* 0 when not NVIDIA */
    cl_uint compute_units;
    cl_ulong global_mem_size;
    cl_ulong local_mem_size;      /* after CLNSA_MAX_LOCAL_MEM, if set */
    size_t max_work_group_size;   /* after CLNSA_MAX_WORK_GROUP, if set */
    size_t preferred_wg_multiple; /* from a probe kernel; CLNSA_WG_MULTIPLE overrides */
    int has_fp16, has_fp64, has_subgroups;
    size_t subgroup_sizes[8];
    int num_subgroup_sizes;
} clnsa_device_info;

/* Probes a device (no context needed). The environment variables
 * CLNSA_MAX_LOCAL_MEM, CLNSA_MAX_WORK_GROUP and CLNSA_WG_MULTIPLE lower the
 * reported limits, to simulate other vendors' devices. */
CLNSA_API clnsa_status clnsa_probe_device(cl_device_id device, clnsa_device_info *info);
/* The probe of the context's device. */
CLNSA_API const clnsa_device_info *clnsa_context_device_info(const clnsa_context *ctx);

/* ------------------------------------------------------------------- NSA */

/*
 * Native Sparse Attention (Yuan et al., 2025), forward.
 *
 * Shapes (natural layout, any valid strides accepted):
 *   q [B, T, HQ, DK], k [B, T, H, DK], v [B, T, H, DV]; HQ = G*H for any G >= 1;
 *   DK, DV multiples of 8, at most 256 (DK != DV allowed); T >= 1 any length.
 *   Query head hq reads KV head hq / G.
 * Varlen: `cu_seqlens` int32 [N+1] (B == 1): sequence s is tokens
 *   [cu_seqlens[s], cu_seqlens[s+1]); sequences may be empty or shorter than a
 *   block; nothing crosses a sequence boundary. Without it, each batch row is
 *   one sequence of T tokens. Positions below are local to the sequence.
 * Gates g_cmp, g_slc, g_swa [B, T, HQ]; an absent gate turns its branch off:
 *   o = g_cmp*o_cmp + g_slc*o_slc + g_swa*o_swa.
 * All float tensors of one call share one dtype (f32, f16 or bf16); the
 * arithmetic is f32. lse outputs are always f32; indices and counts int32.
 *
 * 1. Compression: compressed token i of a sequence of length len covers the
 *    positions [i*d, i*d + l) (l = cmp_block, d = cmp_stride); a sequence has
 *    nc(len) = ceil(len/d) of them. Compressed tensors are packed per sequence:
 *    k_cmp [B, NC, H, DK] with NC = ceil(T/d), or with varlen B = 1 and
 *    NC = sum_s ceil(len_s/d), sequence s starting at row sum_{s'<s} nc(len_s').
 *    Mean pooling averages the tokens of the block that exist (a block running
 *    past the sequence end is averaged over its real length). Alternatives:
 *    the caller passes k_cmp / v_cmp (any learned compression), or linear
 *    compression x_i = concat_j (x[i*d + j] + pe[j]), j < l (tokens past the end
 *    contribute zeros and no pe), k_cmp[i] = x_i . W_k + b_k with
 *    W_k [l*DK, DK], b_k [DK], pe_k [l, DK] (b and pe optional), the same for v
 *    with W_v [l*DV, DV]; computed with a CLBlast SGEMM.
 *    Query t sees compressed token i iff i*d + l - 1 <= t. o_cmp = softmax(
 *    scale q.k_cmp) v_cmp; where nothing is visible o_cmp = 0, lse_cmp = -inf.
 * 2. Selection: blocks of l' = block_size tokens; query t's candidates are
 *    blocks 0 .. t/l'. Importance of block j for KV head h = sum over the G
 *    query heads of h, and over the visible compressed tokens whose span
 *    [i*d, i*d+l) overlaps [j*l', (j+1)*l'), of the compressed-attention
 *    probability (paper eq. 9-10 as an overlap rule; with l = d = l' it is the
 *    probability of compressed token j). Forced (count within block_count):
 *    blocks j < init_blocks and the local_blocks blocks ending at t/l'.
 *    The top min(block_count, #candidates) blocks are found online (no score
 *    matrix is stored), ordered forced first (ascending), then by importance
 *    (ties: lower index first); unused slots are -1.
 *    Or the caller passes block_indices [B, T, H, S] (int32; a negative index
 *    is unused; an index above t/l' selects nothing; a duplicate counts once,
 *    so no index can cause an out-of-bounds read) and optionally block_counts
 *    [B, T, H] (only the first block_counts[b,t,h] slots are used, clamped to
 *    [0, S]). Query t attends to the keys s <= t of its selected blocks.
 * 3. Sliding window: query t sees keys s with t - window < s <= t.
 */
typedef struct clnsa_nsa_config {
    int block_size;   /* l', selection block (default 64) */
    int block_count;  /* S, selected blocks per query (default 16); the
                         block_indices tensors' last dim must equal it */
    int cmp_block;    /* l, compression block (default: block_size) */
    int cmp_stride;   /* d, compression stride (default: block_size) */
    int window;       /* sliding window w (default 0 = off; g_swa then must be absent) */
    int init_blocks;  /* forced leading blocks (default 1) */
    int local_blocks; /* forced blocks ending at the query's block (default 2) */
    float scale;      /* softmax scale; 0 = 1/sqrt(DK) (default) */
} clnsa_nsa_config;

/* Fills the defaults, which match fla-org's parallel_nsa. */
CLNSA_API void clnsa_nsa_config_init(clnsa_nsa_config *config);

typedef struct clnsa_nsa_inputs {
    clnsa_tensor q, k, v;             /* required */
    clnsa_tensor g_cmp, g_slc, g_swa; /* optional [B, T, HQ]; absent = branch off */
    clnsa_tensor cu_seqlens;          /* optional int32 [N+1], B must be 1 */
    clnsa_tensor k_cmp, v_cmp;        /* optional, both or neither: given compression */
    clnsa_tensor w_k, b_k, pe_k;      /* optional linear compression (w_k turns it on) */
    clnsa_tensor w_v, b_v, pe_v;      /* with w_k, w_v is required */
    clnsa_tensor block_indices;       /* optional int32 [B, T, H, S]: no top-k then */
    clnsa_tensor block_counts;        /* optional int32 [B, T, H] */
} clnsa_nsa_inputs;

typedef struct clnsa_nsa_outputs {
    clnsa_tensor o;        /* required [B, T, HQ, DV] */
    clnsa_tensor lse_cmp;  /* optional f32 [B, T, HQ]: saved for the backward */
    clnsa_tensor lse_slc;  /* optional f32 [B, T, HQ] */
    clnsa_tensor lse_swa;  /* optional f32 [B, T, HQ] */
    clnsa_tensor block_indices; /* int32 [B, T, H, S]: the selection computed by
                                   top-k; required when top-k runs (g_slc given
                                   and no input block_indices), else ignored */
} clnsa_nsa_outputs;

/* Bytes of workspace the forward needs for these arguments (0 is possible).
 * `queue` is the queue the forward will run on; it is only used to ask
 * CLBlast for its scratch size when linear compression is on. The size is a
 * function of the shapes: 4*(N+2) bytes of sequence offsets plus, unless the
 * compressed tensors are given, 4*NCmax*H*(DK+DV) bytes of compressed keys and
 * values (NCmax = B*ceil(T/d), or ceil(T/d) + N with varlen), plus for linear
 * compression the gathered blocks, the f32 weights and CLBlast's scratch. */
CLNSA_API clnsa_status clnsa_nsa_forward_workspace_size(clnsa_context *ctx, cl_command_queue queue,
                                                        const clnsa_nsa_config *config,
                                                        const clnsa_nsa_inputs *in,
                                                        const clnsa_nsa_outputs *out,
                                                        size_t *bytes);

/* Enqueues the NSA forward on `queue` after the events of `wait_list`; the
 * returned `*event` (if `event` is non-NULL) completes when o and the saved
 * tensors are written. The caller releases it. */
CLNSA_API clnsa_status clnsa_nsa_forward(clnsa_context *ctx, cl_command_queue queue,
                                         const clnsa_nsa_config *config,
                                         const clnsa_nsa_inputs *in,
                                         const clnsa_nsa_outputs *out,
                                         cl_mem workspace, size_t workspace_bytes,
                                         cl_uint num_events_in_wait_list,
                                         const cl_event *wait_list, cl_event *event);

#ifdef __cplusplus
}
#endif
#endif /* CLNSA_H */
