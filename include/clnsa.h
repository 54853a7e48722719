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

/* Which kernels compute the attention products. */
typedef enum {
    /* $CLNSA_MMA when set ("0": portable, "emulate": emulated), else the
     * tensor cores where they apply: NVIDIA devices of compute capability 8.0
     * or later, f16/bf16 storage (f32 too with allow_tf32), head dims
     * multiples of 16 up to 128, and
     * the tensors' rows 16-byte aligned with unit dim stride; the portable
     * kernels elsewhere. */
    CLNSA_MATRIX_AUTO = 0,
    /* The portable kernels (FMA units) everywhere. */
    CLNSA_MATRIX_PORTABLE,
    /* The tensor-core path's warp kernels on any device, their matrix and
     * cross-lane operations emulated in local memory: checks that path's
     * logic on a CPU (the tests run it on PoCL); slow. On Mesa's OpenCL the
     * NSA backward refuses it (CLNSA_ERROR_UNSUPPORTED_DEVICE): llvmpipe
     * computes its dk/dv wrong (docs/RELIABILITY.md). */
    CLNSA_MATRIX_EMULATED
} clnsa_matrix_path;

typedef struct clnsa_context_options {
    /* Extra options appended to every kernel build (NULL = none). */
    const char *extra_build_options;
    /* Folder to read kernel sources from instead of the embedded copies
     * (NULL = the CLNSA_KERNEL_DIR environment variable, else embedded). */
    const char *kernel_dir;
    /* A tuning file (JSON, as `clnsa tune` writes) whose entries come before
     * the built-in database (NULL = the CLNSA_TUNING_FILE environment
     * variable, else none). A file that cannot be read fails the creation. */
    const char *tuning_file;
    /* Folder of the on-disk cache of compiled kernels (NULL = the
     * CLNSA_CACHE_DIR environment variable, else $XDG_CACHE_HOME/clnsa, else
     * ~/.cache/clnsa). CLNSA_CACHE=0 turns the cache off. */
    const char *cache_dir;
    /* The tensor-core path (see clnsa_matrix_path; 0 = AUTO). */
    clnsa_matrix_path matrix_path;
    /* 1: f32 inputs may take the tensor-core path in the TF32 mode (0 = off,
     * the exact FMA kernels; the CLNSA_TF32=1 environment variable also turns
     * it on). Where that path applies (as for f16/bf16, see clnsa_matrix_path),
     * every product's operands are rounded to TF32 (f32's range, a 10-bit
     * mantissa, to nearest, ties away from zero: relative error up to 2^-11
     * each) and accumulated in f32, the probabilities and dS too; inputs and
     * outputs stay f32. Results then agree with the f32 reference to about
     * 3e-4 relative L2 (tests check 2e-3 forward, 5e-3 gradients), as
     * PyTorch's allow_tf32 does for matrix products; the selected blocks may
     * differ from the exact path's where block scores nearly tie. */
    int allow_tf32;
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
    cl_ulong max_mem_alloc_size;  /* the largest buffer */
    cl_ulong local_mem_size;      /* after CLNSA_MAX_LOCAL_MEM, if set */
    size_t max_work_group_size;   /* after CLNSA_MAX_WORK_GROUP, if set */
    size_t preferred_wg_multiple; /* from a probe kernel; CLNSA_WG_MULTIPLE overrides */
    int has_fp16, has_fp64, has_subgroups;
    size_t subgroup_sizes[8];
    int num_subgroup_sizes;
} clnsa_device_info;

/* Probes a device (no context needed). The environment variables
 * CLNSA_MAX_LOCAL_MEM, CLNSA_MAX_WORK_GROUP, CLNSA_WG_MULTIPLE and
 * CLNSA_MAX_MEM_ALLOC lower the reported limits, to simulate other vendors'
 * devices. */
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
    float scale;      /* softmax scale; 0 = 1/sqrt(DK) (default), else
                         a normal float up to CLNSA_PARAM_MAX */
    int keep_ds;      /* backward: which branches' dk/dv passes keep dS in
                         the workspace for dq, which then reads it instead
                         of recomputing P and dP (one matrix product there
                         instead of three); a sum of CLNSA_KEEP_DS_*
                         (default both; 0: recomputed, the smallest
                         workspace). The portable path keeps the selected
                         branch's only; the tensor-core path both. Each is
                         left out by itself where the workspace would
                         outgrow the device's largest allocation, the
                         compressed branch's first. */
} clnsa_nsa_config;

/* The configs' float parameters (scale, softcap) other than 0 are normal
 * floats (FLT_MIN and up: a subnormal one is flushed to 0 by GPU compilers)
 * up to CLNSA_PARAM_MAX; others are refused with
 * CLNSA_ERROR_INVALID_ARGUMENT. */
#define CLNSA_PARAM_MAX 1.0e30f

/* The bits of config.keep_ds, each with the workspace it takes, in
 * elements of the storage dtype. The selected branch's dS:
 * B*T*HQ*block_count*round_up(block_size, 16), 8.6 GB at T = 64k, HQ = 64,
 * bf16; linear in T. */
#define CLNSA_KEEP_DS_SELECTED 1
/* The compressed branch's dS: about B*HQ*T^2 / (2*cmp_stride) (each
 * token's visible compressed keys, rounded up to 16), 4.4 GB at T = 64k,
 * HQ = 64, strides of 64, bf16; quadratic in T. Batches without
 * cu_seqlens only (ignored with them). */
#define CLNSA_KEEP_DS_COMPRESSED 2

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
    /* Optional [B, T, HQ, DV], o's dtype: each branch's own output before its
     * gate (o = g_cmp o_cmp + g_slc o_slc + g_swa o_swa), rounded to the
     * dtype. Written by the forward for the branches that are on; given to
     * the backward for every branch that is on, they spare it recomputing
     * the three branches (its prologue: about the cost of the forward's
     * attention) at 3*B*T*HQ*DV elements of memory, as FlashAttention keeps
     * o. A branch that is off leaves its tensor untouched. */
    clnsa_tensor o_cmp, o_slc, o_swa;
} clnsa_nsa_outputs;

/* Bytes of workspace the forward needs for these arguments (0 is possible).
 * `queue` is the queue the forward will run on; it is only used to ask
 * CLBlast for its scratch size when linear compression is on. The size is a
 * function of the shapes: 4*(N+2) bytes of sequence offsets plus, unless the
 * compressed tensors are given, 4*NCmax*H*(DK+DV) bytes of compressed keys and
 * values (NCmax = B*ceil(T/d), or ceil(T/d) + N with varlen), plus for linear
 * compression the gathered blocks, the f32 weights and CLBlast's scratch,
 * plus, on a device and at shapes where the forward may run the compressed
 * branch and top-k on Hopper's warpgroup products (README, "Devices and
 * dtypes"), an image of the compressed keys and values for that kernel's
 * copies: B*H*ceil(NC/32)*16384 bytes for 2-byte storage, NC the compressed
 * rows of a batch row. */
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

/*
 * NSA backward. Takes the forward's inputs (`in`, the same tensors and
 * config), what the forward saved (`saved`: lse_cmp / lse_slc / lse_swa of
 * every branch that is on, and, when the forward ran top-k, its
 * block_indices; `saved->o` is not read) and the output gradient `dout`
 * [B, T, HQ, DV]; writes the gradients in `grads`.
 *
 * It recomputes the compressed K/V, and each branch's output (for the gate
 * gradients and the softmax correction term) unless the forward saved them:
 * saved->o_cmp / o_slc / o_swa, given for every branch that is on or for
 * none (some but not all is an error). The saved outputs are rounded to the
 * dtype, the recomputed ones are not: gradients differ by that rounding.
 * No gradient flows through the top-k choice.
 *
 * Deterministic: the same inputs give bitwise identical gradients run after
 * run and for any work-group size of a configuration. No floating-point
 * atomics: dq is owned by its query, dk/dv by their key (for the selected
 * branch through an on-device inversion of block_indices into per-(block,
 * KV head) lists of the query tokens that selected it, in token order).
 *
 * Workspace (queried with clnsa_nsa_backward_workspace_size), linear in T:
 * the forward's (offsets and compressed K/V), plus 4*3*B*T*HQ bytes of
 * correction terms, 4*B*T*H*(DK+DV) of f32 dk/dv partial sums, 4*NCmax*H*
 * (DK+DV) of compressed-K/V gradients, and for the selected branch
 * 4*B*H*(T*S + (NB+1)*(C+2)) bytes of inverted index (NB selection blocks,
 * C <= 1024 token chunks); linear compression adds its GEMM operands.
 */
typedef struct clnsa_nsa_grads {
    clnsa_tensor dq, dk, dv;          /* required, shapes of q, k, v */
    clnsa_tensor dg_cmp, dg_slc, dg_swa; /* optional, [B, T, HQ], for branches that are on */
    clnsa_tensor dk_cmp, dv_cmp;      /* required when k_cmp / v_cmp were given */
    clnsa_tensor dw_k, db_k, dpe_k;   /* linear compression: dw_k, dw_v required; */
    clnsa_tensor dw_v, db_v, dpe_v;   /* db / dpe required when b / pe were given */
} clnsa_nsa_grads;

CLNSA_API clnsa_status clnsa_nsa_backward_workspace_size(clnsa_context *ctx, cl_command_queue queue,
                                                         const clnsa_nsa_config *config,
                                                         const clnsa_nsa_inputs *in,
                                                         const clnsa_nsa_outputs *saved,
                                                         const clnsa_tensor *dout,
                                                         const clnsa_nsa_grads *grads, size_t *bytes);

CLNSA_API clnsa_status clnsa_nsa_backward(clnsa_context *ctx, cl_command_queue queue,
                                          const clnsa_nsa_config *config,
                                          const clnsa_nsa_inputs *in,
                                          const clnsa_nsa_outputs *saved,
                                          const clnsa_tensor *dout, const clnsa_nsa_grads *grads,
                                          cl_mem workspace, size_t workspace_bytes,
                                          cl_uint num_events_in_wait_list,
                                          const cl_event *wait_list, cl_event *event);

/* ------------------------------------------------- block-sparse attention */

/*
 * Block-sparse attention, forward and backward.
 *
 * Shapes (natural layout, any valid strides accepted):
 *   q [B, Tq, HQ, D], k [B, Tk, H, D], v [B, Tk, H, DV]; HQ = G*H for any
 *   G >= 1 (query head hq reads KV head hq / G); D and DV multiples of 8 up to
 *   256 (D != DV allowed); Tq, Tk >= 1 and Tq != Tk allowed. The float tensors
 *   of one call share one dtype (f32, f16 or bf16); the arithmetic is f32.
 * Scores: z_ij = scale * q_i . k_j (scale 0 = 1/sqrt(D)); with a soft cap
 *   c > 0, z_ij = c * tanh(scale * q_i . k_j / c) (Gemma 2), whose exact
 *   gradient the backward uses.
 * Visibility: key j is visible to query i (batch row b, query head hq) iff
 *   all of these hold:
 *   - a block mask is given: mask[b, hq, i / q_block, j / kv_block] != 0;
 *   - causal: pos_k[j] <= pos_q[i];
 *   - window_left L >= 0: pos_k[j] >= pos_q[i] - L; window_right R >= 0:
 *     pos_k[j] <= pos_q[i] + R (-1 leaves that side unbounded);
 *   - segment ids are given: seg_q[i] == seg_k[j] and seg_q[i] >= 0 (a
 *     negative id marks padding, which attends to nothing and is seen by
 *     nothing).
 *   Positions default to pos_q[b, i] = i + (Tk - Tq) and pos_k[b, j] = j
 *   (bottom-right alignment, as FlashAttention: a chunk of new queries
 *   against a longer cache works); q_positions / kv_positions replace either.
 * Sinks: an optional f32 logit s_h per query head joins the softmax
 *   denominator once and carries no value (gpt-oss):
 *   p_ij = exp(z_ij) / (sum_j' exp(z_ij') + exp(s_h)).
 * Outputs: o [B, Tq, HQ, DV] = sum_j p_ij v_j and lse [B, Tq, HQ] (f32) =
 *   log(sum_j exp(z_ij) [+ exp(s_h)]). A row that sees nothing has o = 0 and
 *   lse = -inf (lse = s_h with a sink); never NaN.
 * Block mask: an int32 map of blocks of q_block x kv_block tokens, nonzero =
 *   on, of shape [NQB, NKB], [HQ', NQB, NKB] or [B', HQ', NQB, NKB] with
 *   NQB = ceil(Tq / q_block), NKB = ceil(Tk / kv_block), B' in {1, B} and
 *   HQ' in {1, HQ}; an extent of 1 (or a stride of 0) is shared by all batch
 *   rows or heads. The clnsa_block_mask_* builders below write such maps.
 * Work: each call derives, on the device and in the workspace, the
 *   block-sparse rows of its kernel tiles (CSR: per query tile the key tiles
 *   to visit, split into full tiles, which need no element mask, and partial
 *   tiles, which do) from the block mask, causal, window, positions and
 *   segments, so the attention work is proportional to the visible tiles
 *   (building the rows classifies every tile pair with a few integer tests);
 *   without a block mask, causal / window / segments alone decide which
 *   tiles are skipped.
 *   The backward builds its own rows and the transposed form (per key tile,
 *   the query tiles) at its own tile sizes, which may differ from the
 *   forward's: a layout is never reused at another granularity.
 * Backward: dq, dk, dv and dsinks (dsink_h = -sum_{b,i} p_sink(i) * sum_d
 *   o_id * do_id, p_sink(i) = exp(s_h - lse_i)) from q, k, v, o, lse and do.
 *   Deterministic: no floating-point atomics; each dq row is owned by its
 *   query tile, each dk / dv row by its key tile (which visits the query
 *   tiles of all G heads of its group in a fixed order), so two runs, and
 *   runs with another work-group size, give bitwise equal gradients.
 */
typedef struct clnsa_blocksparse_config {
    float scale;      /* 0 = 1/sqrt(D) (default), else a normal float up to CLNSA_PARAM_MAX */
    float softcap;    /* c > 0 turns the soft cap on (a normal float up
                         to CLNSA_PARAM_MAX); 0 = off (default) */
    int causal;       /* 0 (default) or 1 */
    int window_left;  /* L >= 0, or -1 = unbounded (default) */
    int window_right; /* R >= 0, or -1 = unbounded (default) */
    int q_block;      /* query tokens per block of the block mask (default 64) */
    int kv_block;     /* key tokens per block of the block mask (default 64) */
} clnsa_blocksparse_config;

/* Fills the defaults: dense, non-causal attention, blocks of 64 x 64. */
CLNSA_API void clnsa_blocksparse_config_init(clnsa_blocksparse_config *config);

typedef struct clnsa_blocksparse_inputs {
    clnsa_tensor q, k, v;                       /* required */
    clnsa_tensor q_positions, kv_positions;     /* optional int32 [B, Tq], [B, Tk] */
    clnsa_tensor q_segment_ids, kv_segment_ids; /* optional int32 [B, Tq], [B, Tk]; both or neither */
    clnsa_tensor sinks;                         /* optional f32 [HQ] */
    clnsa_tensor block_mask;                    /* optional int32, see above */
} clnsa_blocksparse_inputs;

typedef struct clnsa_blocksparse_outputs {
    clnsa_tensor o;   /* required [B, Tq, HQ, DV] */
    clnsa_tensor lse; /* optional f32 [B, Tq, HQ] (the backward needs it) */
} clnsa_blocksparse_outputs;

/* Bytes of workspace the forward needs for these arguments: the tile
 * statistics, row offsets and the kernel tiles' block-sparse rows, whose
 * capacity is the number of tiles causal / window (with default positions)
 * can leave visible, times the distinct layouts (batch rows when positions,
 * segments or a per-row mask are given; heads when the mask is per head). */
CLNSA_API clnsa_status clnsa_blocksparse_forward_workspace_size(clnsa_context *ctx,
                                                                const clnsa_blocksparse_config *config,
                                                                const clnsa_blocksparse_inputs *in,
                                                                const clnsa_blocksparse_outputs *out,
                                                                size_t *bytes);

/* Enqueues the forward on `queue` after `wait_list`; `*event` (if non-NULL)
 * completes when o and lse are written. The caller releases it. */
CLNSA_API clnsa_status clnsa_blocksparse_forward(clnsa_context *ctx, cl_command_queue queue,
                                                 const clnsa_blocksparse_config *config,
                                                 const clnsa_blocksparse_inputs *in,
                                                 const clnsa_blocksparse_outputs *out,
                                                 cl_mem workspace, size_t workspace_bytes,
                                                 cl_uint num_events_in_wait_list,
                                                 const cl_event *wait_list, cl_event *event);

typedef struct clnsa_blocksparse_grad_inputs {
    clnsa_tensor o;    /* required: the forward's o [B, Tq, HQ, DV] */
    clnsa_tensor lse;  /* required: the forward's lse, f32 [B, Tq, HQ] */
    clnsa_tensor dout; /* required: dL/do [B, Tq, HQ, DV] */
} clnsa_blocksparse_grad_inputs;

typedef struct clnsa_blocksparse_grads {
    clnsa_tensor dq;     /* optional [B, Tq, HQ, D] (absent: not computed) */
    clnsa_tensor dk;     /* optional [B, Tk, H, D] */
    clnsa_tensor dv;     /* optional [B, Tk, H, DV] */
    clnsa_tensor dsinks; /* optional f32 [HQ]; only with sinks */
} clnsa_blocksparse_grads;

/* Bytes of workspace the backward needs: as the forward's at the backward's
 * tiles, plus the transposed rows and 4*B*Tq*HQ bytes of row sums
 * delta_i = sum_d o_id * do_id. */
CLNSA_API clnsa_status clnsa_blocksparse_backward_workspace_size(clnsa_context *ctx,
                                                                 const clnsa_blocksparse_config *config,
                                                                 const clnsa_blocksparse_inputs *in,
                                                                 const clnsa_blocksparse_grad_inputs *gin,
                                                                 const clnsa_blocksparse_grads *grads,
                                                                 size_t *bytes);

/* Enqueues the backward: every gradient present is overwritten (not
 * accumulated). The config and inputs must be those of the forward. */
CLNSA_API clnsa_status clnsa_blocksparse_backward(clnsa_context *ctx, cl_command_queue queue,
                                                  const clnsa_blocksparse_config *config,
                                                  const clnsa_blocksparse_inputs *in,
                                                  const clnsa_blocksparse_grad_inputs *gin,
                                                  const clnsa_blocksparse_grads *grads,
                                                  cl_mem workspace, size_t workspace_bytes,
                                                  cl_uint num_events_in_wait_list,
                                                  const cl_event *wait_list, cl_event *event);

/*
 * Block-mask builders. Each writes a block mask (int32, 1 = on, 0 = off; a
 * view of rank 2..4 as described above, each block (qb, kb) in units of
 * q_block x kv_block tokens) on the device, with no workspace. With the
 * default positions pos_q[i] = i + (Tk - Tq), pos_k[j] = j, block (qb, kb)
 * holds the queries i in [qb*q_block, min(Tq, (qb+1)*q_block)) and the keys
 * j in [kb*kv_block, min(Tk, (kb+1)*kv_block)), and is on for:
 *   ALL      every block;
 *   CAUSAL   some (i, j) of the block has j <= pos_q[i];
 *   WINDOW   some (i, j) has pos_q[i] - L <= j <= pos_q[i] + R (L =
 *            window_left, R = window_right, -1 = unbounded side);
 *   STRIDED  (diag(qb) - kb) mod stride == 0 (dilated blocks): every
 *            stride-th key block counted from diag(qb) = floor(pos_q[first
 *            query of qb] / kv_block), the key block on the diagonal, in both
 *            directions (AND with CAUSAL for a causal pattern);
 *   GLOBAL   the key block holds one of the first global_tokens keys
 *            (kb * kv_block < global_tokens): those keys are visible to all;
 *   SEGMENT  some (i, j) has seg_q[b, i] == seg_k[b, j] >= 0 (documents):
 *            the mask must have a batch extent B (or B be 1).
 * The masks are block-granular: combine them with the element rules of the
 * attention call (causal, window, segments), e.g. a causal sliding window
 * with global tokens is OR(WINDOW, GLOBAL) AND CAUSAL with config.causal = 1.
 */
typedef enum clnsa_block_mask_kind {
    CLNSA_BLOCK_MASK_ALL = 0,
    CLNSA_BLOCK_MASK_CAUSAL = 1,
    CLNSA_BLOCK_MASK_WINDOW = 2,
    CLNSA_BLOCK_MASK_STRIDED = 3,
    CLNSA_BLOCK_MASK_GLOBAL = 4,
    CLNSA_BLOCK_MASK_SEGMENT = 5
} clnsa_block_mask_kind;

/* How a builder's result meets what the mask holds: SET overwrites, AND and
 * OR merge elementwise. */
typedef enum clnsa_mask_op {
    CLNSA_MASK_SET = 0,
    CLNSA_MASK_AND = 1,
    CLNSA_MASK_OR = 2
} clnsa_mask_op;

typedef struct clnsa_block_mask_desc {
    clnsa_block_mask_kind kind;
    int Tq, Tk;                 /* tokens (the mask is [.., ceil(Tq/q_block), ceil(Tk/kv_block)]) */
    int q_block, kv_block;      /* block sizes in tokens (default 64, 64) */
    int window_left;            /* WINDOW: L >= 0 or -1 (default -1) */
    int window_right;           /* WINDOW: R >= 0 or -1 (default -1) */
    int stride;                 /* STRIDED: >= 1 (default 1) */
    int global_tokens;          /* GLOBAL: >= 0 (default 0) */
    clnsa_tensor q_segment_ids; /* SEGMENT: int32 [B, Tq] */
    clnsa_tensor kv_segment_ids;/* SEGMENT: int32 [B, Tk] */
} clnsa_block_mask_desc;

/* Fills a descriptor of `kind` for Tq x Tk tokens with the defaults above. */
CLNSA_API void clnsa_block_mask_desc_init(clnsa_block_mask_desc *desc, clnsa_block_mask_kind kind, int Tq,
                                          int Tk);

/* Writes (op SET) or merges (AND, OR) the mask `desc` describes into `mask`. */
CLNSA_API clnsa_status clnsa_block_mask_build(clnsa_context *ctx, cl_command_queue queue,
                                              const clnsa_block_mask_desc *desc, clnsa_mask_op op,
                                              const clnsa_tensor *mask, cl_uint num_events_in_wait_list,
                                              const cl_event *wait_list, cl_event *event);

/* out = a AND b, or a OR b (op), elementwise; a and b may have extents of 1
 * (or be of lower rank) where out has more, and either may be the same view
 * as out. */
CLNSA_API clnsa_status clnsa_block_mask_combine(clnsa_context *ctx, cl_command_queue queue, clnsa_mask_op op,
                                                const clnsa_tensor *a, const clnsa_tensor *b,
                                                const clnsa_tensor *out, cl_uint num_events_in_wait_list,
                                                const cl_event *wait_list, cl_event *event);

/* A custom mask from a host array: `host` holds one byte per block (nonzero =
 * on) in C order of the mask's shape. The mask view must be contiguous (any
 * offset). The bytes are copied before the call returns: the host array may
 * be freed at once. */
CLNSA_API clnsa_status clnsa_block_mask_from_host(clnsa_context *ctx, cl_command_queue queue,
                                                  const uint8_t *host, const clnsa_tensor *mask,
                                                  cl_uint num_events_in_wait_list,
                                                  const cl_event *wait_list, cl_event *event);

#ifdef __cplusplus
}
#endif
#endif /* CLNSA_H */
