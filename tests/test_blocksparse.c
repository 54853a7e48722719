/* test_blocksparse.c: block-sparse attention, forward and backward, against
 * the double-precision reference (ref/blocksparse_ref.h) on random shapes
 * that are not multiples of the kernel tiles (whose backward tiles differ
 * from the forward's), with every output poisoned (NaN) before each run:
 * each mask builder alone and combined with AND / OR, a custom host mask,
 * windows that are not multiples of the blocks, Tq != Tk, G in {1, 3, 8},
 * soft cap and sinks on and off, padding segments and fully masked rows,
 * custom positions, mask blocks of 16..128, strided (permuted) views, tiles
 * forced to sizes that do not divide the mask blocks; f32 within 1e-5 relative L2,
 * f16 / bf16 within 1e-2. Determinism: two backward runs, and a run with
 * another work-group size, give bitwise equal gradients. test_pv_blocks
 * runs the f32 cases with the forward's P V in 4 x 4 blocks (a tuning file).
 *
 * test_warp_cases runs the tensor-core forward (blocksparse_fwd_warp.cl) on
 * NVIDIA's tensor cores, or emulated elsewhere (the f16 / bf16 cases above
 * take it by themselves on NVIDIA where their head dims allow).
 *
 * The number of distinct kernel configurations (dtype, head dims, causal /
 * window / soft cap / sinks) is kept small: compilation dominates on PoCL. */
#include "blocksparse_ref.h"
#include "programs.h"
#include "testutil.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

enum { M_NONE, M_HOST, M_STRIDED_CAUSAL, M_LONGFORMER, M_SEGMENT_CAUSAL };

typedef struct {
    const char *name;
    int B, Tq, Tk, HQ, H, D, DV;
    clnsa_dtype dt;
    int causal, wl, wr;
    float softcap;
    bool sinks, seg, pos;
    int mask, mb, mh; /* recipe; host-mask extents (1, or B / HQ) */
    int qb, kb;
    double density; /* of the random host mask */
    bool bwd;
    bool permuted;     /* q, k, v, o as [B, heads, T, D] buffers passed with permuted strides */
    const char *tiles; /* "FQ,FK,BQ,BK": forced forward / backward tiles, or NULL */
} bs_case;

typedef struct {
    cl_mem m;
    double *h;
    size_t n;
} dbuf;

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double u01(uint64_t *s) { return (double)(next_u64(s) >> 11) / 9007199254740992.0; }

static dbuf dev_rand(size_t n, double lo, double hi, clnsa_dtype dt, uint64_t *seed)
{
    dbuf b = {NULL, alloc_uniform(n, lo, hi, seed), n};
    b.m = upload(&env, b.h, n, dt, true);
    return b;
}

static void dfree(dbuf *b)
{
    if (b->m) clReleaseMemObject(b->m);
    free(b->h);
    memset(b, 0, sizeof *b);
}

/* f32 cases after test_warp_cases switched the context run in the TF32 mode. */
static bool tf32_ctx;
static double tol(clnsa_dtype dt) { return dt != CLNSA_DTYPE_F32 ? 1e-2 : tf32_ctx ? 5e-3 : 1e-5; }

static clnsa_tensor tensor2(cl_mem m, clnsa_dtype dt, int64_t a, int64_t b)
{
    int64_t s[2] = {a, b};
    return clnsa_tensor_contiguous(m, dt, 2, s);
}

/* Documents of random lengths, ending in padding (-1) per batch row; the
 * queries take the segment of their default position, and a few get an id
 * no key has (rows that see nothing). */
static void make_segments(const bs_case *c, int *sq, int *sk, uint64_t *seed)
{
    for (int b = 0; b < c->B; ++b) {
        int id = 0, left = 3 + (int)(u01(seed) * 20);
        const int pad = c->Tk - c->Tk / 10;
        for (int j = 0; j < c->Tk; ++j) {
            if (left-- == 0) {
                ++id;
                left = 2 + (int)(u01(seed) * 25);
            }
            sk[b * c->Tk + j] = j >= pad ? -1 : id;
        }
        for (int i = 0; i < c->Tq; ++i) {
            int p = i + c->Tk - c->Tq;
            sq[b * c->Tq + i] = p >= 0 && p < c->Tk ? sk[b * c->Tk + p] : -1;
            if (u01(seed) < 0.05) sq[b * c->Tq + i] = 999;
        }
    }
}

/* Key positions out of order (a ring buffer), query positions per row. */
static void make_positions(const bs_case *c, int *pq, int *pk)
{
    for (int b = 0; b < c->B; ++b) {
        for (int j = 0; j < c->Tk; ++j) pk[b * c->Tk + j] = (j * 7 + b) % c->Tk;
        for (int i = 0; i < c->Tq; ++i) pq[b * c->Tq + i] = i + c->Tk - c->Tq - b;
    }
}

/* The case's block mask on the device (mask_m, view *mv) and on the host
 * (ref layout [mb, mh, NQB, NKB]); the device's built mask is compared with
 * the reference builders exactly. */
static int *make_mask(const bs_case *c, const int *sq, const int *sk, cl_mem seg_q_m, cl_mem seg_k_m, uint64_t *seed,
                      cl_mem *mask_m, clnsa_tensor *mv, int *mb, int *mh)
{
    const int nqb = (c->Tq + c->qb - 1) / c->qb, nkb = (c->Tk + c->kb - 1) / c->kb, nbk = nqb * nkb;
    *mb = c->mask == M_HOST ? c->mb : c->mask == M_SEGMENT_CAUSAL ? c->B : 1;
    *mh = c->mask == M_HOST ? c->mh : 1;
    const size_t n = (size_t)*mb * *mh * nbk;
    int *ref = calloc(n, sizeof *ref), *tmp = calloc((size_t)nbk, sizeof *tmp);
    *mask_m = poisoned(&env, n, CLNSA_DTYPE_I32);
    int64_t shape[4] = {*mb, *mh, nqb, nkb};
    *mv = clnsa_tensor_contiguous(*mask_m, CLNSA_DTYPE_I32, 4, shape);
    if (c->mask == M_HOST && *mb == 1) *mv = clnsa_tensor_contiguous(*mask_m, CLNSA_DTYPE_I32, *mh == 1 ? 2 : 3, shape + (*mh == 1 ? 2 : 1));
    clnsa_block_mask_desc d;
    cl_event ev = NULL;
    switch (c->mask) {
    case M_HOST: {
        uint8_t *host = malloc(n);
        for (size_t i = 0; i < n; ++i) ref[i] = host[i] = u01(seed) < c->density ? (uint8_t)(1 + (i % 3)) : 0;
        for (size_t i = 0; i < n; ++i) ref[i] = ref[i] != 0;
        for (size_t i = (size_t)nkb; i < n && c->density > 0.3; i += (size_t)nkb * 5) /* some all-off rows */
            memset(host + i, 0, (size_t)nkb), memset(ref + i, 0, sizeof(int) * (size_t)nkb);
        assert_ok(&env, clnsa_block_mask_from_host(env.ctx, env.queue, host, mv, 0, NULL, &ev), "from_host");
        free(host); /* the library copied it */
        wait_release(ev);
        break;
    }
    case M_STRIDED_CAUSAL:
        clnsa_block_mask_desc_init(&d, CLNSA_BLOCK_MASK_STRIDED, c->Tq, c->Tk);
        d.q_block = c->qb;
        d.kv_block = c->kb;
        d.stride = 3;
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_SET, mv, 0, NULL, &ev), "strided");
        wait_release(ev);
        d.kind = CLNSA_BLOCK_MASK_CAUSAL;
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_AND, mv, 0, NULL, &ev), "causal AND");
        wait_release(ev);
        ref_bs_block_mask(REF_MASK_STRIDED, c->Tq, c->Tk, c->qb, c->kb, -1, -1, 3, 0, NULL, NULL, ref);
        ref_bs_block_mask(REF_MASK_CAUSAL, c->Tq, c->Tk, c->qb, c->kb, -1, -1, 1, 0, NULL, NULL, tmp);
        for (int i = 0; i < nbk; ++i) ref[i] = ref[i] && tmp[i];
        break;
    case M_LONGFORMER: /* OR(WINDOW(wl, wr) of blocks, GLOBAL 5 tokens) */
        clnsa_block_mask_desc_init(&d, CLNSA_BLOCK_MASK_WINDOW, c->Tq, c->Tk);
        d.q_block = c->qb;
        d.kv_block = c->kb;
        d.window_left = 9;
        d.window_right = 2;
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_SET, mv, 0, NULL, &ev), "window");
        wait_release(ev);
        d.kind = CLNSA_BLOCK_MASK_GLOBAL;
        d.global_tokens = 5;
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_OR, mv, 0, NULL, &ev), "global OR");
        wait_release(ev);
        ref_bs_block_mask(REF_MASK_WINDOW, c->Tq, c->Tk, c->qb, c->kb, 9, 2, 1, 0, NULL, NULL, ref);
        ref_bs_block_mask(REF_MASK_GLOBAL, c->Tq, c->Tk, c->qb, c->kb, -1, -1, 1, 5, NULL, NULL, tmp);
        for (int i = 0; i < nbk; ++i) ref[i] = ref[i] || tmp[i];
        break;
    case M_SEGMENT_CAUSAL: { /* SEGMENT [B, 1, ..] AND a shared CAUSAL [NQB, NKB] (combine, broadcast) */
        clnsa_block_mask_desc_init(&d, CLNSA_BLOCK_MASK_SEGMENT, c->Tq, c->Tk);
        d.q_block = c->qb;
        d.kv_block = c->kb;
        d.q_segment_ids = tensor2(seg_q_m, CLNSA_DTYPE_I32, c->B, c->Tq);
        d.kv_segment_ids = tensor2(seg_k_m, CLNSA_DTYPE_I32, c->B, c->Tk);
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_SET, mv, 0, NULL, &ev), "segment");
        wait_release(ev);
        cl_mem cm = poisoned(&env, (size_t)nbk, CLNSA_DTYPE_I32);
        clnsa_tensor cv = tensor2(cm, CLNSA_DTYPE_I32, nqb, nkb);
        clnsa_block_mask_desc_init(&d, CLNSA_BLOCK_MASK_CAUSAL, c->Tq, c->Tk);
        d.q_block = c->qb;
        d.kv_block = c->kb;
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_SET, &cv, 0, NULL, &ev), "causal");
        wait_release(ev);
        assert_ok(&env, clnsa_block_mask_combine(env.ctx, env.queue, CLNSA_MASK_AND, mv, &cv, mv, 0, NULL, &ev), "combine");
        wait_release(ev);
        clReleaseMemObject(cm);
        ref_bs_block_mask(REF_MASK_CAUSAL, c->Tq, c->Tk, c->qb, c->kb, -1, -1, 1, 0, NULL, NULL, tmp);
        for (int b = 0; b < c->B; ++b) {
            ref_bs_block_mask(REF_MASK_SEGMENT, c->Tq, c->Tk, c->qb, c->kb, -1, -1, 1, 0, sq + b * c->Tq, sk + b * c->Tk,
                              ref + (size_t)b * nbk);
            for (int i = 0; i < nbk; ++i) ref[(size_t)b * nbk + i] = ref[(size_t)b * nbk + i] && tmp[i];
        }
        break;
    }
    }
    int32_t *got = malloc(n * sizeof *got);
    download_i32(&env, *mask_m, n, got);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += got[i] != (ref[i] != 0);
    if (bad) print_error("%s: %zu mask blocks differ from the reference builders\n", c->name, bad);
    assert_int_equal(bad, 0);
    free(got);
    free(tmp);
    return ref;
}

typedef struct {
    double *dq, *dk, *dv, *ds; /* device results */
    void *raw[4];              /* their bytes, for memcmp */
    size_t bytes[4];
} grads_out;

static void free_grads(grads_out *g)
{
    free(g->dq); free(g->dk); free(g->dv); free(g->ds);
    for (int i = 0; i < 4; ++i) free(g->raw[i]);
    memset(g, 0, sizeof *g);
}

static void read_raw(cl_mem m, size_t bytes, void **out)
{
    *out = malloc(bytes);
    assert_int_equal(clEnqueueReadBuffer(env.queue, m, CL_TRUE, 0, bytes, *out, 0, NULL, NULL), CL_SUCCESS);
}

/* `want`: bit 0 dq, 1 dk, 2 dv, 3 dsinks (with sinks); absent ones stay NaN. */
static void run_backward(const bs_case *c, const clnsa_blocksparse_config *cfg, const clnsa_blocksparse_inputs *in,
                         const clnsa_tensor *o_t, cl_mem lse_m, cl_mem do_m, int want, grads_out *g)
{
    const clnsa_dtype dt = c->dt;
    const size_t es = clnsa_dtype_size(dt);
    const size_t nq = (size_t)c->B * c->Tq * c->HQ, nk = (size_t)c->B * c->Tk * c->H;
    cl_mem dq_m = poisoned(&env, nq * c->D, dt), dk_m = poisoned(&env, nk * c->D, dt);
    cl_mem dv_m = poisoned(&env, nk * c->DV, dt), ds_m = poisoned(&env, (size_t)c->HQ, CLNSA_DTYPE_F32);
    clnsa_blocksparse_grad_inputs gin;
    memset(&gin, 0, sizeof gin);
    gin.o = *o_t;
    gin.lse = tensor3(lse_m, CLNSA_DTYPE_F32, c->B, c->Tq, c->HQ);
    gin.dout = tensor4(do_m, dt, c->B, c->Tq, c->HQ, c->DV);
    clnsa_blocksparse_grads gr;
    memset(&gr, 0, sizeof gr);
    if (want & 1) gr.dq = tensor4(dq_m, dt, c->B, c->Tq, c->HQ, c->D);
    if (want & 2) gr.dk = tensor4(dk_m, dt, c->B, c->Tk, c->H, c->D);
    if (want & 4) gr.dv = tensor4(dv_m, dt, c->B, c->Tk, c->H, c->DV);
    int64_t hq = c->HQ;
    if (c->sinks && (want & 8)) gr.dsinks = clnsa_tensor_contiguous(ds_m, CLNSA_DTYPE_F32, 1, &hq);
    size_t ws_bytes = 0;
    assert_ok(&env, clnsa_blocksparse_backward_workspace_size(env.ctx, cfg, in, &gin, &gr, &ws_bytes), c->name);
    cl_mem ws = ws_bytes ? poisoned(&env, ws_bytes / 4, CLNSA_DTYPE_F32) : NULL;
    cl_event ev = NULL;
    assert_ok(&env, clnsa_blocksparse_backward(env.ctx, env.queue, cfg, in, &gin, &gr, ws, ws_bytes, 0, NULL, &ev), c->name);
    wait_release(ev);
    memset(g, 0, sizeof *g);
    g->dq = malloc(nq * c->D * sizeof(double));
    g->dk = malloc(nk * c->D * sizeof(double));
    g->dv = malloc(nk * c->DV * sizeof(double));
    g->ds = malloc((size_t)c->HQ * sizeof(double));
    download(&env, dq_m, nq * c->D, dt, g->dq);
    download(&env, dk_m, nk * c->D, dt, g->dk);
    download(&env, dv_m, nk * c->DV, dt, g->dv);
    download(&env, ds_m, (size_t)c->HQ, CLNSA_DTYPE_F32, g->ds);
    cl_mem ms[4] = {dq_m, dk_m, dv_m, ds_m};
    size_t by[4] = {nq * c->D * es, nk * c->D * es, nk * c->DV * es, (size_t)c->HQ * 4};
    for (int i = 0; i < 4; ++i) {
        g->bytes[i] = by[i];
        read_raw(ms[i], by[i], &g->raw[i]);
        clReleaseMemObject(ms[i]);
    }
    if (ws) clReleaseMemObject(ws);
}

static bool same_grads(const grads_out *a, const grads_out *b)
{
    for (int i = 0; i < 4; ++i)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->raw[i], b->raw[i], a->bytes[i])) return false;
    return true;
}

/* A [B, T, Hh, Dd] tensor kept in a [B, Hh, T, Dd] buffer. */
static clnsa_tensor permuted_view(cl_mem m, clnsa_dtype dt, int B, int T, int Hh, int Dd)
{
    clnsa_tensor t = tensor4(m, dt, B, T, Hh, Dd);
    t.strides[0] = (int64_t)Hh * T * Dd;
    t.strides[1] = Dd;
    t.strides[2] = (int64_t)T * Dd;
    t.strides[3] = 1;
    return t;
}

static size_t perm_index(int B, int T, int Hh, int Dd, size_t natural)
{
    (void)B;
    const size_t d = natural % Dd, h = natural / Dd % Hh, t = natural / Dd / Hh % T, b = natural / Dd / Hh / T;
    return ((b * Hh + h) * T + t) * Dd + d;
}

static cl_mem upload_permuted(const double *x, int B, int T, int Hh, int Dd, clnsa_dtype dt)
{
    const size_t n = (size_t)B * T * Hh * Dd;
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; ++i) y[perm_index(B, T, Hh, Dd, i)] = x[i];
    cl_mem m = upload(&env, y, n, dt, false);
    free(y);
    return m;
}

static void set_tiles(const char *tiles)
{
    static const char *const names[4] = {"CLNSA_TUNE_BS_FWD_BQ", "CLNSA_TUNE_BS_FWD_BK", "CLNSA_TUNE_BS_BWD_BQ",
                                         "CLNSA_TUNE_BS_BWD_BK"};
    int v[4] = {0, 0, 0, 0};
    if (tiles) assert_int_equal(sscanf(tiles, "%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3]), 4);
    for (int i = 0; i < 4; ++i) {
        char buf[16];
        snprintf(buf, sizeof buf, "%d", v[i]);
        if (tiles) setenv(names[i], buf, 1);
        else unsetenv(names[i]);
    }
}

static bool sees_nothing(const ref_bs_problem *p, int b, int hq, int i)
{
    for (int j = 0; j < p->Tk; ++j)
        if (ref_bs_visible(p, b, hq, i, j)) return false;
    return true;
}

/* Runs one case; with `determinism`, also reruns the backward (and the
 * forward) twice more, the second time with another work-group size. */
static void run_case(const bs_case *c, uint64_t seed, bool determinism)
{
    const clnsa_dtype dt = c->dt;
    const size_t nq = (size_t)c->B * c->Tq * c->HQ, nk = (size_t)c->B * c->Tk * c->H;
    dbuf q = dev_rand(nq * c->D, -1.5, 1.5, dt, &seed), k = dev_rand(nk * c->D, -1.5, 1.5, dt, &seed);
    dbuf v = dev_rand(nk * c->DV, -1, 1, dt, &seed), dout = dev_rand(nq * c->DV, -1, 1, dt, &seed);
    dbuf sinks = dev_rand((size_t)c->HQ, -1, 2, CLNSA_DTYPE_F32, &seed);
    int *sq = calloc((size_t)c->B * c->Tq, sizeof(int)), *sk = calloc((size_t)c->B * c->Tk, sizeof(int));
    int *pq = calloc((size_t)c->B * c->Tq, sizeof(int)), *pk = calloc((size_t)c->B * c->Tk, sizeof(int));
    make_segments(c, sq, sk, &seed);
    make_positions(c, pq, pk);
    cl_mem sq_m = upload_i32(&env, sq, (size_t)c->B * c->Tq), sk_m = upload_i32(&env, sk, (size_t)c->B * c->Tk);
    cl_mem pq_m = upload_i32(&env, pq, (size_t)c->B * c->Tq), pk_m = upload_i32(&env, pk, (size_t)c->B * c->Tk);

    clnsa_blocksparse_config cfg;
    clnsa_blocksparse_config_init(&cfg);
    cfg.causal = c->causal;
    cfg.window_left = c->wl;
    cfg.window_right = c->wr;
    cfg.softcap = c->softcap;
    cfg.q_block = c->qb;
    cfg.kv_block = c->kb;
    clnsa_blocksparse_inputs in;
    memset(&in, 0, sizeof in);
    in.q = tensor4(q.m, dt, c->B, c->Tq, c->HQ, c->D);
    in.k = tensor4(k.m, dt, c->B, c->Tk, c->H, c->D);
    in.v = tensor4(v.m, dt, c->B, c->Tk, c->H, c->DV);
    if (c->permuted) {
        dbuf *bufs[3] = {&q, &k, &v};
        const int T[3] = {c->Tq, c->Tk, c->Tk}, Hh[3] = {c->HQ, c->H, c->H}, Dd[3] = {c->D, c->D, c->DV};
        clnsa_tensor *views[3] = {&in.q, &in.k, &in.v};
        for (int i = 0; i < 3; ++i) {
            clReleaseMemObject(bufs[i]->m);
            bufs[i]->m = upload_permuted(bufs[i]->h, c->B, T[i], Hh[i], Dd[i], dt);
            *views[i] = permuted_view(bufs[i]->m, dt, c->B, T[i], Hh[i], Dd[i]);
        }
    }
    int64_t hq = c->HQ;
    if (c->sinks) in.sinks = clnsa_tensor_contiguous(sinks.m, CLNSA_DTYPE_F32, 1, &hq);
    if (c->seg) {
        in.q_segment_ids = tensor2(sq_m, CLNSA_DTYPE_I32, c->B, c->Tq);
        in.kv_segment_ids = tensor2(sk_m, CLNSA_DTYPE_I32, c->B, c->Tk);
    }
    if (c->pos) {
        in.q_positions = tensor2(pq_m, CLNSA_DTYPE_I32, c->B, c->Tq);
        in.kv_positions = tensor2(pk_m, CLNSA_DTYPE_I32, c->B, c->Tk);
    }
    cl_mem mask_m = NULL;
    int *ref_mask = NULL, mb = 1, mh = 1;
    if (c->mask != M_NONE) ref_mask = make_mask(c, sq, sk, sq_m, sk_m, &seed, &mask_m, &in.block_mask, &mb, &mh);

    set_tiles(c->tiles);
    /* forward */
    cl_mem o_m = poisoned(&env, nq * c->DV, dt), lse_m = poisoned(&env, nq, CLNSA_DTYPE_F32);
    clnsa_blocksparse_outputs out;
    out.o = c->permuted ? permuted_view(o_m, dt, c->B, c->Tq, c->HQ, c->DV) : tensor4(o_m, dt, c->B, c->Tq, c->HQ, c->DV);
    out.lse = tensor3(lse_m, CLNSA_DTYPE_F32, c->B, c->Tq, c->HQ);
    size_t ws_bytes = 0;
    assert_ok(&env, clnsa_blocksparse_forward_workspace_size(env.ctx, &cfg, &in, &out, &ws_bytes), c->name);
    cl_mem ws = ws_bytes ? poisoned(&env, ws_bytes / 4, CLNSA_DTYPE_F32) : NULL;
    cl_event ev = NULL;
    assert_ok(&env, clnsa_blocksparse_forward(env.ctx, env.queue, &cfg, &in, &out, ws, ws_bytes, 0, NULL, &ev), c->name);
    wait_release(ev);
    double *o = malloc(nq * c->DV * sizeof *o), *lse = malloc(nq * sizeof *lse);
    download(&env, o_m, nq * c->DV, dt, o);
    if (c->permuted) {
        double *nat = malloc(nq * c->DV * sizeof *nat);
        for (size_t i = 0; i < nq * c->DV; ++i) nat[i] = o[perm_index(c->B, c->Tq, c->HQ, c->DV, i)];
        free(o);
        o = nat;
    }
    download(&env, lse_m, nq, CLNSA_DTYPE_F32, lse);

    ref_bs_problem p;
    ref_bs_problem_init(&p, c->B, c->Tq, c->Tk, c->HQ, c->H, c->D, c->DV);
    p.softcap = c->softcap;
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.q_block = c->qb;
    p.kv_block = c->kb;
    if (c->sinks) p.sinks = sinks.h;
    if (c->seg) {
        p.seg_q = sq;
        p.seg_k = sk;
    }
    if (c->pos) {
        p.pos_q = pq;
        p.pos_k = pk;
    }
    if (ref_mask) {
        p.mask = ref_mask;
        p.mask_b = mb;
        p.mask_h = mh;
    }
    double *ro = calloc(nq * c->DV, sizeof *ro), *rl = calloc(nq, sizeof *rl);
    ref_bs_fwd(&p, q.h, k.h, v.h, ro, rl);
    check_err("o", c->name, rel_l2(o, ro, nq * c->DV), tol(dt));
    check_err("lse", c->name, rel_l2_lse(lse, rl, nq), tol(dt));
    /* rows that see nothing: o exactly 0, lse exactly -inf or the sink */
    size_t empty = 0;
    for (size_t r = 0; r < nq; ++r) {
        const int b = (int)(r / c->HQ / c->Tq), i = (int)(r / c->HQ % c->Tq), hqr = (int)(r % c->HQ);
        if (!sees_nothing(&p, b, hqr, i)) continue;
        ++empty;
        assert_true(lse[r] == rl[r]);
        for (int d = 0; d < c->DV; ++d) assert_true(o[r * c->DV + d] == 0.0);
    }
    if (getenv("CLNSA_TEST_VERBOSE")) printf("  %s: %zu rows see nothing\n", c->name, empty);
    assert_true(empty < nq); /* the case compares something */

    if (c->bwd) {
        grads_out g;
        run_backward(c, &cfg, &in, &out.o, lse_m, dout.m, 15, &g);
        double *rdq = calloc(nq * c->D, sizeof(double)), *rdk = calloc(nk * c->D, sizeof(double));
        double *rdv = calloc(nk * c->DV, sizeof(double)), *rds = calloc((size_t)c->HQ, sizeof(double));
        ref_bs_bwd(&p, q.h, k.h, v.h, dout.h, rdq, rdk, rdv, rds);
        check_err("dq", c->name, rel_l2(g.dq, rdq, nq * c->D), tol(dt));
        check_err("dk", c->name, rel_l2(g.dk, rdk, nk * c->D), tol(dt));
        check_err("dv", c->name, rel_l2(g.dv, rdv, nk * c->DV), tol(dt));
        if (c->sinks) check_err("dsinks", c->name, rel_l2(g.ds, rds, (size_t)c->HQ), tol(dt));
        if (determinism) {
            grads_out g2, g3;
            run_backward(c, &cfg, &in, &out.o, lse_m, dout.m, 15, &g2);
            assert_true(same_grads(&g, &g2));
            assert_int_equal(setenv("CLNSA_TUNE_WG", "40", 1), 0);
            run_backward(c, &cfg, &in, &out.o, lse_m, dout.m, 15, &g3);
            unsetenv("CLNSA_TUNE_WG");
            if (!same_grads(&g, &g3)) print_error("%s: gradients differ with CLNSA_TUNE_WG=40\n", c->name);
            assert_true(same_grads(&g, &g3));
            free_grads(&g2);
            free_grads(&g3);
            /* one gradient at a time: the same bytes */
            for (int i = 0; i < 4; ++i) {
                if (i == 3 && !c->sinks) continue;
                run_backward(c, &cfg, &in, &out.o, lse_m, dout.m, 1 << i, &g2);
                assert_memory_equal(g.raw[i], g2.raw[i], g.bytes[i]);
                free_grads(&g2);
            }
        }
        free_grads(&g);
        free(rdq); free(rdk); free(rdv); free(rds);
    }

    set_tiles(NULL);
    free(o); free(lse); free(ro); free(rl); free(ref_mask);
    free(sq); free(sk); free(pq); free(pk);
    clReleaseMemObject(o_m); clReleaseMemObject(lse_m);
    if (ws) clReleaseMemObject(ws);
    if (mask_m) clReleaseMemObject(mask_m);
    cl_mem ints[4] = {sq_m, sk_m, pq_m, pk_m};
    for (int i = 0; i < 4; ++i) clReleaseMemObject(ints[i]);
    dbuf *all[] = {&q, &k, &v, &dout, &sinks};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) dfree(all[i]);
}

#define F32 CLNSA_DTYPE_F32
#define F16 CLNSA_DTYPE_F16
#define BF16 CLNSA_DTYPE_BF16

/* Kernel configurations: A = f32 D16/16 causal; B = f32 D24/8 window, soft
 * cap, sinks; C = f32 D16/16 no rules; D = f32 D32/16 everything; and the
 * f16 (A's rules) and bf16 (B's rules) ones.
 * name, B, Tq, Tk, HQ, H, D, DV, dtype, causal, wl, wr, softcap, sinks, seg, pos, mask, mb, mh, qb, kb, density,
 * bwd, permuted, tiles */
static const bs_case cases[] = {
    {"A causal Tq<Tk G=3", 2, 37, 53, 6, 2, 16, 16, F32, 1, -1, -1, 0, false, false, false, M_NONE, 1, 1, 64, 64, 0, true, false, NULL},
    {"A causal host mask per head 16x24", 1, 45, 45, 2, 2, 16, 16, F32, 1, -1, -1, 0, false, false, false, M_HOST, 1, 2, 16, 24, 0.6, true, false, NULL},
    {"A causal segments padding G=2", 2, 50, 50, 2, 1, 16, 16, F32, 1, -1, -1, 0, false, true, false, M_NONE, 1, 1, 64, 64, 0, true, false, NULL},
    {"A strided AND causal 16x16 Tq>Tk", 1, 70, 50, 1, 1, 16, 16, F32, 1, -1, -1, 0, false, false, false, M_STRIDED_CAUSAL, 1, 1, 16, 16, 0, true, false, NULL},
    {"A segment AND causal mask 24x40", 2, 61, 61, 3, 1, 16, 16, F32, 1, -1, -1, 0, false, true, false, M_SEGMENT_CAUSAL, 1, 1, 24, 40, 0, true, false, NULL},
    {"B window 5,3 softcap sinks G=8 Tq>Tk", 1, 40, 33, 8, 1, 24, 8, F32, 0, 5, 3, 2.5f, true, false, false, M_NONE, 1, 1, 64, 64, 0, true, false, NULL},
    {"B window 17,-1 longformer mask 48x32", 1, 90, 90, 2, 2, 24, 8, F32, 0, 17, -1, 2.5f, true, false, false, M_LONGFORMER, 1, 1, 48, 32, 0, true, false, NULL},
    {"B window positions segments", 2, 29, 47, 2, 1, 24, 8, F32, 0, 6, 4, 1.5f, true, true, true, M_NONE, 1, 1, 64, 64, 0, true, false, NULL},
    {"C dense Tq!=Tk", 2, 19, 41, 3, 3, 16, 16, F32, 0, -1, -1, 0, false, false, false, M_NONE, 1, 1, 64, 64, 0, true, false, NULL},
    {"C 90% sparse mask [B,HQ] 128x64", 2, 150, 270, 2, 1, 16, 16, F32, 0, -1, -1, 0, false, false, false, M_HOST, 2, 2, 128, 64, 0.1, true, false, NULL},
    {"C longformer mask segments 16x16", 1, 77, 77, 1, 1, 16, 16, F32, 0, -1, -1, 0, false, true, false, M_LONGFORMER, 1, 1, 16, 16, 0, true, false, NULL},
    {"D everything", 2, 43, 58, 4, 2, 32, 16, F32, 1, 11, 0, 3.0f, true, true, false, M_HOST, 2, 4, 32, 16, 0.7, true, false, NULL},
    {"f16 causal host mask G=3", 1, 41, 41, 3, 1, 16, 16, F16, 1, -1, -1, 0, false, false, false, M_HOST, 1, 1, 16, 32, 0.7, true, false, NULL},
    {"bf16 window softcap sinks segments", 1, 52, 52, 4, 2, 24, 8, BF16, 0, 9, 2, 2.5f, true, true, false, M_NONE, 1, 1, 64, 64, 0, true, false, NULL},
    {"A permuted views", 2, 33, 47, 4, 2, 16, 16, F32, 1, -1, -1, 0, false, false, false, M_HOST, 1, 1, 16, 16, 0.8, true, true, NULL},
    {"A tiles 24x40 / 40x24", 1, 67, 83, 3, 1, 16, 16, F32, 1, -1, -1, 0, false, true, false, M_HOST, 1, 3, 16, 24, 0.6, true, false, "24,40,40,24"},
};

static void test_cases(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE"); /* run one case by name while debugging */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        if (!only || strcmp(only, cases[i].name) == 0) run_case(&cases[i], 4321 + i, false);
}

/* The outputs in 4 x 4 blocks a work-item: the forward's P V (attn_tile.h's
 * PV_BLOCK, the V tile unpadded; WG = BQ * DV / 16) and the backward's dk/dv
 * and dq (blocksparse_bwd.cl's KV_BLOCK, Q_BLOCK; WG = BK * D / 16 = BQ * D
 * / 16), forced by a tuning file on the f32 cases with DV 16 or 8. */
static void test_pv_blocks(void **state)
{
    (void)state;
    clnsa_context *own = env.ctx;
    env.ctx = test_context_with_tuning(
        &env, NULL, " {\"family\": \"blocksparse_fwd\", \"shape\": {\"dv\": 16}, \"params\": {\"WG\": 16, \"BQ\": 16, \"BK\": 16}},\n"
              " {\"family\": \"blocksparse_fwd\", \"shape\": {\"dv\": 8}, \"params\": {\"WG\": 8, \"BQ\": 16, \"BK\": 8}},\n"
              " {\"family\": \"blocksparse_bwd\", \"shape\": {\"dk\": 16, \"dv\": 16}, \"params\": {\"WG\": 16, \"BQ\": 16, \"BK\": 16}},\n"
              " {\"family\": \"blocksparse_bwd\", \"shape\": {\"dk\": 24, \"dv\": 8}, \"params\": {\"WG\": 24, \"BQ\": 16, \"BK\": 8}}");
    const char *only = getenv("CLNSA_TEST_CASE");
    const char *bwd_built[2] = {"#define WG 16\n#define BQ 16\n", "#define WG 24\n#define BQ 16\n"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const bs_case *c = &cases[i];
        if (c->dt != F32 || (c->DV != 16 && c->DV != 8) || (only && strcmp(only, c->name) != 0)) continue;
        run_case(c, 9753 + i, false);
        if (tune_env_overrides()) continue;
        assert_true(program_built_with(env.ctx, "blocksparse_fwd.cl", "#define GT 16\n", NULL));
        if ((c->D == 16 && c->DV == 16) || (c->D == 24 && c->DV == 8)) /* the backward's two entries */
            assert_true(program_built_with(env.ctx, "blocksparse_bwd.cl", bwd_built[c->DV == 8], NULL));
    }
    clnsa_context_destroy(env.ctx);
    env.ctx = own;
}

/* Each builder alone, then merged into another with AND and OR, against the
 * reference builders, at block sizes that do not divide the lengths. */
static void test_builders(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE");
    if (only && strcmp(only, "builders") != 0) return;
    uint64_t seed = 77;
    const int B = 2, Tq = 83, Tk = 101, qb = 16, kb = 24, nqb = 6, nkb = 5, nbk = nqb * nkb;
    bs_case c = {"builders", B, Tq, Tk, 1, 1, 16, 16, F32, 0, -1, -1, 0, false, true, false, M_NONE, 1, 1, qb, kb, 0, false, false, NULL};
    int *sq = calloc((size_t)B * Tq, sizeof(int)), *sk = calloc((size_t)B * Tk, sizeof(int));
    make_segments(&c, sq, sk, &seed);
    cl_mem sq_m = upload_i32(&env, sq, (size_t)B * Tq), sk_m = upload_i32(&env, sk, (size_t)B * Tk);
    cl_mem m = poisoned(&env, (size_t)B * nbk, CLNSA_DTYPE_I32);
    int64_t shape[4] = {B, 1, nqb, nkb};
    const clnsa_tensor mv = clnsa_tensor_contiguous(m, CLNSA_DTYPE_I32, 4, shape);
    int *ref = calloc((size_t)B * nbk, sizeof(int)), *one = calloc((size_t)nbk, sizeof(int));
    int32_t *got = calloc((size_t)B * nbk, sizeof(int32_t));
    const int kinds[6] = {CLNSA_BLOCK_MASK_ALL, CLNSA_BLOCK_MASK_CAUSAL, CLNSA_BLOCK_MASK_WINDOW,
                          CLNSA_BLOCK_MASK_STRIDED, CLNSA_BLOCK_MASK_GLOBAL, CLNSA_BLOCK_MASK_SEGMENT};
    for (int pass = 0; pass < 3; ++pass) /* SET each alone; then AND, OR each into a WINDOW(20, 0) base */
        for (int ki = 0; ki < 6; ++ki) {
            clnsa_block_mask_desc d;
            cl_event ev = NULL;
            if (pass > 0) {
                clnsa_block_mask_desc_init(&d, CLNSA_BLOCK_MASK_WINDOW, Tq, Tk);
                d.q_block = qb;
                d.kv_block = kb;
                d.window_left = 20;
                d.window_right = 0;
                assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_SET, &mv, 0, NULL, &ev), "base");
                wait_release(ev);
                ref_bs_block_mask(REF_MASK_WINDOW, Tq, Tk, qb, kb, 20, 0, 1, 0, NULL, NULL, one);
                for (int b = 0; b < B; ++b) memcpy(ref + (size_t)b * nbk, one, sizeof(int) * nbk);
            }
            clnsa_block_mask_desc_init(&d, (clnsa_block_mask_kind)kinds[ki], Tq, Tk);
            d.q_block = qb;
            d.kv_block = kb;
            d.window_left = 13;
            d.window_right = 7;
            d.stride = 3;
            d.global_tokens = 29;
            d.q_segment_ids = tensor2(sq_m, CLNSA_DTYPE_I32, B, Tq);
            d.kv_segment_ids = tensor2(sk_m, CLNSA_DTYPE_I32, B, Tk);
            const clnsa_mask_op op = pass == 0 ? CLNSA_MASK_SET : pass == 1 ? CLNSA_MASK_AND : CLNSA_MASK_OR;
            assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &d, op, &mv, 0, NULL, &ev), "builder");
            wait_release(ev);
            for (int b = 0; b < B; ++b) {
                ref_bs_block_mask(kinds[ki], Tq, Tk, qb, kb, 13, 7, 3, 29, sq + b * Tq, sk + b * Tk, one);
                for (int i = 0; i < nbk; ++i) {
                    int *r = ref + (size_t)b * nbk + i;
                    *r = pass == 0 ? one[i] : pass == 1 ? (*r && one[i]) : (*r || one[i]);
                }
            }
            download_i32(&env, m, (size_t)B * nbk, got);
            for (int i = 0; i < B * nbk; ++i) {
                if (got[i] != ref[i]) print_error("builder kind %d pass %d: block %d is %d, expected %d\n", kinds[ki], pass, i, got[i], ref[i]);
                assert_int_equal(got[i], ref[i]);
            }
        }
    free(sq); free(sk); free(ref); free(one); free(got);
    clReleaseMemObject(sq_m); clReleaseMemObject(sk_m); clReleaseMemObject(m);
}

/* Two backward runs, and one with another work-group size: bitwise equal. */
static void test_determinism(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE");
    if (only && strcmp(only, "determinism") != 0) return;
    bs_case c = {"determinism", 2, 57, 57, 4, 2, 16, 16, F32, 1, -1, -1, 0, false, true, false, M_HOST, 1, 4, 16, 24, 0.7, true, false, NULL};
    run_case(&c, 99, true);
    bs_case d = {"determinism with sinks", 1, 41, 50, 4, 2, 24, 8, F32, 0, 5, 3, 2.5f, true, false, false, M_NONE, 1, 1, 64, 64, 0, true, false, NULL};
    run_case(&d, 98, true);
}

/* Bad input: a status and a message, no event, nothing written. */
static void test_errors(void **state)
{
    (void)state;
    uint64_t seed = 5;
    dbuf q = dev_rand(2 * 10 * 2 * 16, -1, 1, F32, &seed), kv = dev_rand(2 * 12 * 1 * 16, -1, 1, F32, &seed);
    cl_mem o_m = poisoned(&env, 2 * 10 * 2 * 16, F32), m_m = poisoned(&env, 64, CLNSA_DTYPE_I32);
    clnsa_blocksparse_config cfg;
    clnsa_blocksparse_config_init(&cfg);
    clnsa_blocksparse_inputs in;
    memset(&in, 0, sizeof in);
    in.q = tensor4(q.m, F32, 2, 10, 2, 16);
    in.k = tensor4(kv.m, F32, 2, 12, 1, 16);
    in.v = tensor4(kv.m, F32, 2, 12, 1, 16);
    clnsa_blocksparse_outputs out = {tensor4(o_m, F32, 2, 10, 2, 16), {0}};
    cfg.q_block = cfg.kv_block = 4;
    in.block_mask = tensor2(m_m, CLNSA_DTYPE_I32, 3, 4); /* needs [3, 3] */
    cl_event ev = (cl_event)1;
    size_t bytes = 1;
    assert_int_equal(clnsa_blocksparse_forward_workspace_size(env.ctx, &cfg, &in, &out, &bytes), CLNSA_ERROR_SHAPE_MISMATCH);
    assert_int_equal(bytes, 0);
    assert_non_null(strstr(clnsa_last_error(env.ctx), "block_mask"));
    assert_int_equal(clnsa_blocksparse_forward(env.ctx, env.queue, &cfg, &in, &out, NULL, 0, 0, NULL, &ev),
                     CLNSA_ERROR_SHAPE_MISMATCH);
    assert_null(ev);
    in.block_mask = tensor2(m_m, CLNSA_DTYPE_I32, 3, 3);
    cfg.window_left = -2;
    assert_int_equal(clnsa_blocksparse_forward(env.ctx, env.queue, &cfg, &in, &out, NULL, 0, 0, NULL, &ev),
                     CLNSA_ERROR_INVALID_ARGUMENT);
    cfg.window_left = -1;
    /* subnormal (flushed to 0 by GPU compilers) or past 1e30: refused, by name */
    const float bad[] = {1e-40f, 1e31f, -1.0f, NAN};
    for (int i = 0; i < 8; ++i) {
        float *param = i < 4 ? &cfg.scale : &cfg.softcap;
        *param = bad[i % 4];
        assert_int_equal(clnsa_blocksparse_forward(env.ctx, env.queue, &cfg, &in, &out, NULL, 0, 0, NULL, &ev),
                         CLNSA_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(clnsa_last_error(env.ctx), i < 4 ? "config.scale" : "config.softcap"));
        *param = 0.0f;
    }
    in.kv_segment_ids = tensor2(m_m, CLNSA_DTYPE_I32, 2, 12);
    assert_int_equal(clnsa_blocksparse_forward(env.ctx, env.queue, &cfg, &in, &out, NULL, 0, 0, NULL, &ev),
                     CLNSA_ERROR_NULL_ARGUMENT);
    memset(&in.kv_segment_ids, 0, sizeof in.kv_segment_ids);
    assert_ok(&env, clnsa_blocksparse_forward_workspace_size(env.ctx, &cfg, &in, &out, &bytes), "workspace");
    if (bytes)
        assert_int_equal(clnsa_blocksparse_forward(env.ctx, env.queue, &cfg, &in, &out, NULL, 0, 0, NULL, &ev),
                         CLNSA_ERROR_WORKSPACE_TOO_SMALL);
    clnsa_block_mask_desc d;
    clnsa_block_mask_desc_init(&d, CLNSA_BLOCK_MASK_CAUSAL, 10, 12);
    clnsa_tensor mv = tensor2(m_m, CLNSA_DTYPE_I32, 3, 3);
    assert_int_equal(clnsa_block_mask_build(env.ctx, env.queue, &d, CLNSA_MASK_SET, &mv, 0, NULL, &ev),
                     CLNSA_ERROR_SHAPE_MISMATCH); /* blocks of 64: [1, 1] */
    assert_null(ev);
    double *o = malloc(sizeof(double) * 640);
    download(&env, o_m, 640, F32, o);
    for (int i = 0; i < 640; ++i) assert_true(isnan(o[i]));
    free(o);
    clReleaseMemObject(o_m);
    clReleaseMemObject(m_m);
    dfree(&q);
    dfree(&kv);
}

/* The tensor-core forward and backward (its dk/dv and dq; delta and dsinks
 * stay portable): every rule at once, run three times for bitwise equal
 * gradients, and the plain causal attention the dense baseline of `clnsa
 * bench` runs, on permuted views, G = 4, DK != DV; rows of 128 and 64
 * elements; a tiny case for Oclgrind. */
static const bs_case warp_cases[] = {
    {"warp bf16 everything", 2, 43, 58, 4, 2, 32, 16, BF16, 1, 11, 0, 3.0f, true, true, true, M_HOST, 2, 4, 32, 16, 0.7, true, false, NULL},
    {"warp f16 causal G=4 permuted", 1, 70, 83, 4, 1, 64, 48, F16, 1, -1, -1, 0, false, false, false, M_NONE, 1, 1, 64, 64, 0, true, true, NULL},
    /* rows of 128 and 64 elements: the swizzled local tiles (warp_attn.h's tile_col) */
    {"warp bf16 causal swizzled tiles", 1, 37, 37, 2, 1, 128, 64, BF16, 1, -1, -1, 0, false, false, false, M_NONE, 1, 1, 64, 64, 0, true, false, NULL},
    /* the first case's rules but sinks (whose gradient, a sum over few rows of
     * bf16-rounded terms, is not within 1e-2 at this size) on a shape small
     * enough for Oclgrind (.ci/matrix.sh) */
    {"warp bf16 tiny", 1, 21, 29, 2, 1, 32, 16, BF16, 1, 11, 0, 3.0f, false, true, true, M_HOST, 1, 2, 8, 16, 0.7, true, false, NULL},
    /* f32 in the TF32 mode (swizzled 64-element rows of 32-byte chunks) */
    {"warp TF32 everything", 1, 37, 45, 2, 1, 64, 32, F32, 1, 11, 0, 3.0f, true, true, true, M_HOST, 1, 2, 8, 16, 0.7, true, false, NULL},
};

/* Last: it switches the context to the warp path (emulated off NVIDIA). */
static void test_warp_cases(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE");
    printf("warp kernels: %s\n", test_env_use_warp_path(&env));
    tf32_ctx = true;
    for (size_t i = 0; i < sizeof warp_cases / sizeof warp_cases[0]; ++i)
        if (!only || strcmp(only, warp_cases[i].name) == 0) run_case(&warp_cases[i], 8765 + i, i == 0);
    if (!only) {
        assert_true(program_built(env.ctx, "blocksparse_fwd_warp.cl"));
        assert_true(program_built(env.ctx, "blocksparse_bwd_warp.cl"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_builders),
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_pv_blocks),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_warp_cases),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
