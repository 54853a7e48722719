/* libFuzzer target for the argument validation of every public entry point
 * (issue 8): clnsa_nsa_forward / _workspace_size, clnsa_nsa_backward /
 * _workspace_size, the block-sparse forward / backward and their workspace
 * queries, and the block-mask builders.
 *
 * An input is a template choice and a list of mutations. The template is a
 * valid call on a small problem (so that most inputs get deep into the
 * checks); each mutation changes one thing: a tensor's buffer (NULL, a
 * 4-byte buffer, the shared 1 MiB one), dtype (including invalid ones),
 * rank (including > CLNSA_MAX_RANK), an extent, a stride, the offset; a
 * config field (negative, zero, huge, NaN); the workspace; NULL pointers.
 * Buffers are real cl_mem on the first OpenCL device (PoCL in CI).
 *
 * Checked for every call: no crash and no sanitizer report (the target is
 * built with ASan + UBSan), and a status that is CLNSA_SUCCESS or an error
 * whose message is non-empty and opens with the name of an argument
 * ("q: expected ...", "config.window: ..."). No kernel of the attention ops
 * ever runs: when the workspace query succeeds with a non-zero size, the op
 * is called with a workspace that is too small (it must stop there, after
 * all the argument checks); with a zero size only the query runs. The mask
 * builders need no workspace: they run (small masks) when valid.
 *
 * Build and run: .ci/matrix.sh (stage fuzz), or by hand:
 *   CC=clang meson setup build-fuzz -Db_sanitize=address,undefined -Dtests=false \
 *     -Dc_args=-fsanitize=fuzzer-no-link -Ddefault_library=static && ninja -C build-fuzz
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude tests/fuzz/fuzz_api.c \
 *     build-fuzz/libclnsa.a -lclblast -lOpenCL -lm -lpthread -o fuzz_api
 *   ./fuzz_api tests/fuzz/api_corpus -runs=2000 */
#define CL_TARGET_OPENCL_VERSION 120
#include "clnsa.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* ------------------------------------------------------------ device */

static cl_context cl;
static cl_command_queue queue;
static clnsa_context *ctx;
enum { BUF_NONE, BUF_TINY, BUF_SMALL, BUF_BIG, BUF_COUNT };
static cl_mem bufs[BUF_COUNT]; /* NULL, 4 bytes, 256 bytes, 1 MiB */
static const size_t buf_bytes[BUF_COUNT] = {0, 4, 256, 1 << 20};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    cl_platform_id p[8];
    cl_uint np = 0;
    cl_device_id dev = NULL;
    if (clGetPlatformIDs(8, p, &np) != CL_SUCCESS) np = 0;
    for (cl_uint i = 0; i < np && !dev; ++i)
        if (clGetDeviceIDs(p[i], CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) dev = NULL;
    if (!dev) {
        fprintf(stderr, "fuzz_api: no OpenCL device\n");
        exit(1);
    }
    cl_int err;
    cl = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    if (err != CL_SUCCESS) exit(1);
    queue = clCreateCommandQueue(cl, dev, 0, &err);
    if (err != CL_SUCCESS) exit(1);
    char msg[512];
    if (clnsa_context_create(cl, dev, NULL, &ctx, msg, sizeof msg) != CLNSA_SUCCESS) {
        fprintf(stderr, "fuzz_api: %s\n", msg);
        exit(1);
    }
    for (int i = BUF_TINY; i < BUF_COUNT; ++i) {
        bufs[i] = clCreateBuffer(cl, CL_MEM_READ_WRITE, buf_bytes[i], NULL, &err);
        if (err != CL_SUCCESS) exit(1);
    }
    const uint8_t zero = 0;
    clEnqueueFillBuffer(queue, bufs[BUF_BIG], &zero, 1, 0, buf_bytes[BUF_BIG], 0, NULL, NULL);
    clFinish(queue);
    return 0;
}

/* ------------------------------------------------------------ reader */

typedef struct {
    const uint8_t *p;
    size_t n;
} reader;

static unsigned u8(reader *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static const int64_t extents[] = {0, 1, 2, 3, 4, 5, 7, 8, 16, 17, 20, 24, 33, 64, 257, -1, -2, 1 << 20,
                                  (int64_t)1 << 31, (int64_t)1 << 40, INT64_MAX, INT64_MIN};
static const int64_t strides[] = {0, 1, 2, 3, 16, 64, -1, -16, (int64_t)1 << 31, (int64_t)1 << 62, INT64_MAX, INT64_MIN};
static const size_t offsets[] = {0, 1, 3, 64, 4096, (size_t)1 << 31, SIZE_MAX / 2, SIZE_MAX};
static const int ints[] = {-1, 0, 1, 2, 3, 4, 7, 8, 9, 16, 31, 64, 65, 128, 257, 1000, 1 << 20, INT32_MAX, INT32_MIN, -64};
static const float floats[] = {0.0f, 1.0f, -1.0f, 0.125f, 1e30f, -1e-30f, INFINITY, -INFINITY, NAN};
#define PICK(tab, r) (tab[u8(r) % (sizeof tab / sizeof tab[0])])

/* ------------------------------------------------------------ templates */

static clnsa_tensor TV(clnsa_dtype dt, int rank, int64_t a, int64_t b, int64_t c, int64_t d)
{
    const int64_t s[4] = {a, b, c, d};
    return clnsa_tensor_contiguous(bufs[BUF_BIG], dt, rank, s);
}

/* All the tensors of one call, as arrays of clnsa_tensor (the public
 * structs hold nothing else), and the config as ints / floats. */
typedef struct {
    clnsa_tensor *t[4];
    size_t nt[4];
    int *cfg_i;
    size_t ncfg_i;
    float *cfg_f;
    size_t ncfg_f;
} call_view;

static void mutate_tensor(clnsa_tensor *t, reader *r)
{
    switch (u8(r) % 9) {
    case 0: t->data = bufs[u8(r) % BUF_COUNT]; break;
    case 1: t->dtype = (clnsa_dtype)(u8(r) % 7); break;
    case 2: t->rank = (int)(u8(r) % 7) - 1; break; /* -1 .. 5 */
    case 3: t->shape[u8(r) % CLNSA_MAX_RANK] = PICK(extents, r); break;
    case 4: t->strides[u8(r) % CLNSA_MAX_RANK] = PICK(strides, r); break;
    case 5: t->offset = PICK(offsets, r); break;
    case 6: { /* contiguous again over the current shape, at most rank 4 */
        const int rank = t->rank < 0 ? 0 : t->rank > CLNSA_MAX_RANK ? CLNSA_MAX_RANK : t->rank;
        *t = clnsa_tensor_contiguous(t->data, t->dtype, rank, t->shape);
        break;
    }
    case 7: t->data = NULL; break;
    default: { /* a permuted view: swap two dims with their strides */
        const unsigned a = u8(r) % CLNSA_MAX_RANK, b = u8(r) % CLNSA_MAX_RANK;
        int64_t x = t->shape[a];
        t->shape[a] = t->shape[b];
        t->shape[b] = x;
        x = t->strides[a];
        t->strides[a] = t->strides[b];
        t->strides[b] = x;
    }
    }
}

/* Applies mutations until the input ends. Returns flags for NULL pointers
 * and the workspace choice. */
typedef struct {
    bool null_cfg, null_in, null_out, null_queue, null_bytes;
    unsigned ws_mode;
} call_flags;

static void mutate(call_view *v, call_flags *f, reader *r)
{
    memset(f, 0, sizeof *f);
    for (int steps = 0; r->n > 0 && steps < 64; ++steps) {
        const unsigned kind = u8(r) % 8;
        if (kind <= 3) { /* a tensor of group `kind` (inputs, outputs, ...) */
            if (!v->nt[kind]) continue;
            mutate_tensor(&v->t[kind][u8(r) % v->nt[kind]], r);
        } else if (kind == 4 && v->ncfg_i) {
            v->cfg_i[u8(r) % v->ncfg_i] = PICK(ints, r);
        } else if (kind == 5 && v->ncfg_f) {
            v->cfg_f[u8(r) % v->ncfg_f] = PICK(floats, r);
        } else if (kind == 6) {
            f->ws_mode = u8(r);
        } else {
            switch (u8(r) % 16) { /* rare: NULL pointers */
            case 0: f->null_cfg = true; break;
            case 1: f->null_in = true; break;
            case 2: f->null_out = true; break;
            case 3: f->null_queue = true; break;
            case 4: f->null_bytes = true; break;
            default: break;
            }
        }
    }
}

/* ------------------------------------------------------------ checks */

static const char *op_name;

static void check(clnsa_status st, bool has_ctx)
{
    if (st == CLNSA_SUCCESS || !has_ctx) return;
    if (!strcmp(clnsa_status_string(st), "CLNSA_ERROR_UNKNOWN_STATUS")) {
        fprintf(stderr, "%s: unknown status %d\n", op_name, (int)st);
        abort();
    }
    const char *msg = clnsa_last_error(ctx);
    const char *colon = msg ? strchr(msg, ':') : NULL;
    /* "name: ..." where name is one or more arguments (letters, digits, _ . , [ ] ( ) space) */
    bool ok = msg && msg[0] && colon && colon > msg && colon - msg <= 64;
    for (const char *p = msg; ok && p < colon; ++p)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
             *p == '.' || *p == ',' || *p == '[' || *p == ']' || *p == '(' || *p == ')' || *p == ' ' || *p == '-';
    if (!ok) {
        fprintf(stderr, "%s: %s with a message that names no argument: \"%s\"\n", op_name, clnsa_status_string(st),
                msg ? msg : "(null)");
        abort();
    }
}

/* The op's workspace: always too small when the query asked for some. */
static void pick_workspace(unsigned mode, size_t need, cl_mem *ws, size_t *bytes)
{
    switch (mode % 4) {
    case 0: *ws = NULL; *bytes = need; break;                          /* NULL */
    case 1: *ws = bufs[BUF_TINY]; *bytes = need; break;                /* a buffer too small */
    case 2: *ws = bufs[BUF_BIG]; *bytes = need - 1; break;             /* bytes too small */
    default: *ws = bufs[BUF_SMALL]; *bytes = need < 256 ? need - 1 : need; break;
    }
    size_t have = 0;
    for (int i = 0; i < BUF_COUNT; ++i)
        if (*ws && *ws == bufs[i]) have = buf_bytes[i];
    if (have >= need && *bytes >= need) *bytes = need - 1; /* never enough: no kernel may run */
}

/* ------------------------------------------------------------ NSA */

typedef struct {
    clnsa_nsa_config cfg;
    clnsa_nsa_inputs in;
    clnsa_nsa_outputs out;
    clnsa_tensor dout;
    clnsa_nsa_grads grads;
} nsa_call;

static void nsa_template(nsa_call *c, unsigned variant)
{
    memset(c, 0, sizeof *c);
    const clnsa_dtype dt = variant & 1 ? CLNSA_DTYPE_BF16 : CLNSA_DTYPE_F32;
    const int B = variant & 2 ? 1 : 2, T = 20, HQ = 4, H = 2, D = 16, S = 3, NC = 3;
    clnsa_nsa_config_init(&c->cfg);
    c->cfg.block_size = 8;
    c->cfg.block_count = S;
    c->cfg.window = 4;
    c->in.q = TV(dt, 4, B, T, HQ, D);
    c->in.k = TV(dt, 4, B, T, H, D);
    c->in.v = TV(dt, 4, B, T, H, D);
    c->in.g_cmp = TV(dt, 3, B, T, HQ, 0);
    c->in.g_slc = TV(dt, 3, B, T, HQ, 0);
    c->in.g_swa = TV(dt, 3, B, T, HQ, 0);
    if (variant & 2) c->in.cu_seqlens = TV(CLNSA_DTYPE_I32, 1, 3, 0, 0, 0);
    if (variant & 4) {
        c->in.k_cmp = TV(dt, 4, B, NC + (variant & 2 ? 2 : 0), H, D);
        c->in.v_cmp = TV(dt, 4, B, NC + (variant & 2 ? 2 : 0), H, D);
    } else if (variant & 8) {
        c->in.w_k = TV(dt, 2, 8 * D, D, 0, 0);
        c->in.w_v = TV(dt, 2, 8 * D, D, 0, 0);
        c->in.b_k = TV(dt, 1, D, 0, 0, 0);
        c->in.b_v = TV(dt, 1, D, 0, 0, 0);
        c->in.pe_k = TV(dt, 2, 8, D, 0, 0);
        c->in.pe_v = TV(dt, 2, 8, D, 0, 0);
    }
    if (variant & 16) {
        c->in.block_indices = TV(CLNSA_DTYPE_I32, 4, B, T, H, S);
        c->in.block_counts = TV(CLNSA_DTYPE_I32, 3, B, T, H, 0);
    }
    c->out.o = TV(dt, 4, B, T, HQ, D);
    c->out.lse_cmp = TV(CLNSA_DTYPE_F32, 3, B, T, HQ, 0);
    c->out.lse_slc = TV(CLNSA_DTYPE_F32, 3, B, T, HQ, 0);
    c->out.lse_swa = TV(CLNSA_DTYPE_F32, 3, B, T, HQ, 0);
    c->out.block_indices = TV(CLNSA_DTYPE_I32, 4, B, T, H, S);
    c->dout = TV(dt, 4, B, T, HQ, D);
    c->grads.dq = TV(dt, 4, B, T, HQ, D);
    c->grads.dk = TV(dt, 4, B, T, H, D);
    c->grads.dv = TV(dt, 4, B, T, H, D);
    c->grads.dg_cmp = TV(dt, 3, B, T, HQ, 0);
    c->grads.dg_slc = TV(dt, 3, B, T, HQ, 0);
    c->grads.dg_swa = TV(dt, 3, B, T, HQ, 0);
    if (variant & 4) {
        c->grads.dk_cmp = c->in.k_cmp;
        c->grads.dv_cmp = c->in.v_cmp;
    } else if (variant & 8) {
        c->grads.dw_k = c->in.w_k;
        c->grads.dw_v = c->in.w_v;
        c->grads.db_k = c->in.b_k;
        c->grads.db_v = c->in.b_v;
        c->grads.dpe_k = c->in.pe_k;
        c->grads.dpe_v = c->in.pe_v;
    }
}

static void fuzz_nsa(reader *r, bool backward)
{
    nsa_call c;
    nsa_template(&c, u8(r));
    call_view v = {{(clnsa_tensor *)&c.in, (clnsa_tensor *)&c.out, &c.dout, (clnsa_tensor *)&c.grads},
                   {sizeof c.in / sizeof(clnsa_tensor), sizeof c.out / sizeof(clnsa_tensor), 1,
                    sizeof c.grads / sizeof(clnsa_tensor)},
                   &c.cfg.block_size, 7, &c.cfg.scale, 1};
    call_flags f;
    mutate(&v, &f, r);
    const clnsa_nsa_config *cfg = f.null_cfg ? NULL : &c.cfg;
    const clnsa_nsa_inputs *in = f.null_in ? NULL : &c.in;
    const clnsa_nsa_outputs *out = f.null_out ? NULL : &c.out;
    cl_command_queue q = f.null_queue ? NULL : queue;
    size_t need = 0;
    clnsa_status st;
    if (!backward) {
        op_name = "clnsa_nsa_forward_workspace_size";
        st = clnsa_nsa_forward_workspace_size(ctx, q, cfg, in, out, f.null_bytes ? NULL : &need);
    } else {
        op_name = "clnsa_nsa_backward_workspace_size";
        st = clnsa_nsa_backward_workspace_size(ctx, q, cfg, in, out, &c.dout, &c.grads, f.null_bytes ? NULL : &need);
    }
    check(st, true);
    if (f.null_bytes) { /* that failed on `bytes`: ask again to learn the size */
        st = backward ? clnsa_nsa_backward_workspace_size(ctx, q, cfg, in, out, &c.dout, &c.grads, &need)
                      : clnsa_nsa_forward_workspace_size(ctx, q, cfg, in, out, &need);
        check(st, true);
    }
    if (st == CLNSA_SUCCESS && need == 0) return; /* the op would run kernels */
    if (st != CLNSA_SUCCESS) need = 1 + (u8(r) % 4096);
    cl_mem ws;
    size_t bytes;
    pick_workspace(f.ws_mode, need, &ws, &bytes);
    cl_event ev = (cl_event)(uintptr_t)1;
    if (!backward) {
        op_name = "clnsa_nsa_forward";
        st = clnsa_nsa_forward(ctx, q, cfg, in, out, ws, bytes, 0, NULL, &ev);
    } else {
        op_name = "clnsa_nsa_backward";
        st = clnsa_nsa_backward(ctx, q, cfg, in, out, &c.dout, &c.grads, ws, bytes, 0, NULL, &ev);
    }
    if (st == CLNSA_SUCCESS) { /* must not happen: the workspace was too small */
        fprintf(stderr, "%s: succeeded with a workspace of %zu bytes, %zu needed\n", op_name, bytes, need);
        abort();
    }
    check(st, true);
    if (ev != NULL) {
        fprintf(stderr, "%s: failed but returned an event\n", op_name);
        abort();
    }
}

/* ------------------------------------------------------- block-sparse */

typedef struct {
    clnsa_blocksparse_config cfg;
    clnsa_blocksparse_inputs in;
    clnsa_blocksparse_outputs out;
    clnsa_blocksparse_grad_inputs gin;
    clnsa_blocksparse_grads grads;
} bs_call;

static void bs_template(bs_call *c, unsigned variant)
{
    memset(c, 0, sizeof *c);
    const clnsa_dtype dt = variant & 1 ? CLNSA_DTYPE_F16 : CLNSA_DTYPE_F32;
    const int B = 2, Tq = 20, Tk = 24, HQ = 4, H = 2, D = 16;
    clnsa_blocksparse_config_init(&c->cfg);
    c->cfg.causal = (variant >> 1) & 1;
    c->cfg.q_block = 8;
    c->cfg.kv_block = 8;
    c->in.q = TV(dt, 4, B, Tq, HQ, D);
    c->in.k = TV(dt, 4, B, Tk, H, D);
    c->in.v = TV(dt, 4, B, Tk, H, D);
    if (variant & 4) {
        c->in.q_positions = TV(CLNSA_DTYPE_I32, 2, B, Tq, 0, 0);
        c->in.kv_positions = TV(CLNSA_DTYPE_I32, 2, B, Tk, 0, 0);
    }
    if (variant & 8) {
        c->in.q_segment_ids = TV(CLNSA_DTYPE_I32, 2, B, Tq, 0, 0);
        c->in.kv_segment_ids = TV(CLNSA_DTYPE_I32, 2, B, Tk, 0, 0);
    }
    if (variant & 16) c->in.sinks = TV(CLNSA_DTYPE_F32, 1, HQ, 0, 0, 0);
    if (variant & 32) c->in.block_mask = TV(CLNSA_DTYPE_I32, 4, B, HQ, 3, 3);
    c->out.o = TV(dt, 4, B, Tq, HQ, D);
    c->out.lse = TV(CLNSA_DTYPE_F32, 3, B, Tq, HQ, 0);
    c->gin.o = c->out.o;
    c->gin.lse = c->out.lse;
    c->gin.dout = TV(dt, 4, B, Tq, HQ, D);
    c->grads.dq = TV(dt, 4, B, Tq, HQ, D);
    c->grads.dk = TV(dt, 4, B, Tk, H, D);
    c->grads.dv = TV(dt, 4, B, Tk, H, D);
    if (variant & 16) c->grads.dsinks = TV(CLNSA_DTYPE_F32, 1, HQ, 0, 0, 0);
}

static void fuzz_blocksparse(reader *r, bool backward)
{
    bs_call c;
    bs_template(&c, u8(r));
    call_view v = {{(clnsa_tensor *)&c.in, (clnsa_tensor *)&c.out, (clnsa_tensor *)&c.gin, (clnsa_tensor *)&c.grads},
                   {sizeof c.in / sizeof(clnsa_tensor), sizeof c.out / sizeof(clnsa_tensor),
                    sizeof c.gin / sizeof(clnsa_tensor), sizeof c.grads / sizeof(clnsa_tensor)},
                   &c.cfg.causal, 5, &c.cfg.scale, 2};
    call_flags f;
    mutate(&v, &f, r);
    const clnsa_blocksparse_config *cfg = f.null_cfg ? NULL : &c.cfg;
    const clnsa_blocksparse_inputs *in = f.null_in ? NULL : &c.in;
    size_t need = 0;
    clnsa_status st;
    if (!backward) {
        op_name = "clnsa_blocksparse_forward_workspace_size";
        st = clnsa_blocksparse_forward_workspace_size(ctx, cfg, in, f.null_out ? NULL : &c.out, f.null_bytes ? NULL : &need);
    } else {
        op_name = "clnsa_blocksparse_backward_workspace_size";
        st = clnsa_blocksparse_backward_workspace_size(ctx, cfg, in, f.null_out ? NULL : &c.gin, &c.grads,
                                                       f.null_bytes ? NULL : &need);
    }
    check(st, true);
    if (f.null_bytes) {
        st = backward ? clnsa_blocksparse_backward_workspace_size(ctx, cfg, in, f.null_out ? NULL : &c.gin, &c.grads, &need)
                      : clnsa_blocksparse_forward_workspace_size(ctx, cfg, in, f.null_out ? NULL : &c.out, &need);
        check(st, true);
    }
    if (st == CLNSA_SUCCESS && need == 0) return;
    if (st != CLNSA_SUCCESS) need = 1 + (u8(r) % 4096);
    cl_mem ws;
    size_t bytes;
    pick_workspace(f.ws_mode, need, &ws, &bytes);
    cl_event ev = (cl_event)(uintptr_t)1;
    cl_command_queue q = f.null_queue ? NULL : queue;
    if (!backward) {
        op_name = "clnsa_blocksparse_forward";
        st = clnsa_blocksparse_forward(ctx, q, cfg, in, f.null_out ? NULL : &c.out, ws, bytes, 0, NULL, &ev);
    } else {
        op_name = "clnsa_blocksparse_backward";
        st = clnsa_blocksparse_backward(ctx, q, cfg, in, f.null_out ? NULL : &c.gin, &c.grads, ws, bytes, 0, NULL, &ev);
    }
    if (st == CLNSA_SUCCESS) {
        fprintf(stderr, "%s: succeeded with a workspace of %zu bytes, %zu needed\n", op_name, bytes, need);
        abort();
    }
    check(st, true);
    if (ev != NULL) {
        fprintf(stderr, "%s: failed but returned an event\n", op_name);
        abort();
    }
}

/* ------------------------------------------------------- mask builders */

static void fuzz_masks(reader *r)
{
    const unsigned which = u8(r) % 3;
    clnsa_block_mask_desc d;
    clnsa_block_mask_desc_init(&d, (clnsa_block_mask_kind)(u8(r) % 7), 40, 50);
    d.q_block = 8;
    d.kv_block = 16;
    d.q_segment_ids = TV(CLNSA_DTYPE_I32, 2, 2, 40, 0, 0);
    d.kv_segment_ids = TV(CLNSA_DTYPE_I32, 2, 2, 50, 0, 0);
    clnsa_tensor m[3] = {TV(CLNSA_DTYPE_I32, 4, 2, 1, 5, 4), TV(CLNSA_DTYPE_I32, 2, 5, 4, 0, 0),
                         TV(CLNSA_DTYPE_I32, 3, 1, 5, 4, 0)};
    m[1].offset = 64;
    m[2].offset = 128;
    call_view v = {{m, &d.q_segment_ids, NULL, NULL}, {3, 2, 0, 0}, &d.Tq, 8, NULL, 0};
    call_flags f;
    mutate(&v, &f, r);
    if (u8(r) % 8 == 0) d.kind = (clnsa_block_mask_kind)PICK(ints, r);
    const clnsa_mask_op op = (clnsa_mask_op)((int)(u8(r) % 4) - (f.null_cfg ? 1 : 0));
    cl_command_queue q = f.null_queue ? NULL : queue;
    cl_event ev = NULL;
    clnsa_status st;
    if (which == 0) {
        op_name = "clnsa_block_mask_build";
        st = clnsa_block_mask_build(ctx, q, f.null_in ? NULL : &d, op, f.null_out ? NULL : &m[0], 0, NULL, &ev);
    } else if (which == 1) {
        op_name = "clnsa_block_mask_combine";
        st = clnsa_block_mask_combine(ctx, q, op, f.null_in ? NULL : &m[1], &m[2], f.null_out ? NULL : &m[0], 0, NULL, &ev);
    } else {
        op_name = "clnsa_block_mask_from_host";
        static uint8_t host[1 << 20];
        st = clnsa_block_mask_from_host(ctx, q, f.null_in ? NULL : host, f.null_out ? NULL : &m[0], 0, NULL, &ev);
    }
    check(st, true);
    if (st != CLNSA_SUCCESS && ev) {
        fprintf(stderr, "%s: failed but returned an event\n", op_name);
        abort();
    }
    if (ev) {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
    }
}

/* ------------------------------------------------------------ entry */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    switch (u8(&r) % 5) {
    case 0: fuzz_nsa(&r, false); break;
    case 1: fuzz_nsa(&r, true); break;
    case 2: fuzz_blocksparse(&r, false); break;
    case 3: fuzz_blocksparse(&r, true); break;
    default: fuzz_masks(&r); break;
    }
    return 0;
}
