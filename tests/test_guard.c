/* test_guard.c: guard regions around the outputs of every op (issue 8).
 * Each op runs twice on the same inputs: once into plain contiguous outputs,
 * once into outputs placed inside larger pattern-filled buffers (an offset
 * before, a gap after each innermost row, a tail after; guard.h). The second
 * run must write exactly the view, with values bitwise equal to the first
 * (the ops are deterministic), and leave every input buffer byte-identical.
 * Ops: NSA forward (top-k on and given indices, mean / linear / given
 * compression, f32 and bf16; the saved branch outputs too) and backward (every gradient: dq, dk, dv, gates,
 * dk_cmp / dv_cmp, dW / db / dpe), block-sparse forward and backward (o, lse,
 * dq, dk, dv, dsinks), and the block-mask builders (build, combine, host). */
#include "guard.h"
#include "nsa_bwd_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

/* Guarded copies of `n` output views (absent ones stay absent), run through
 * guard_check against the plain run's views, then freed. */
typedef struct {
    guard_view g[16];
    int n;
    size_t guarded;
} guard_set;

static void guards_place(guard_set *s, clnsa_tensor *views, int n, bool gaps)
{
    assert_true(n <= 16);
    s->n = n;
    s->guarded = 0;
    for (int i = 0; i < n; ++i) {
        guard_place(&env, &s->g[i], &views[i], gaps, (unsigned)i);
        views[i] = s->g[i].view;
    }
}

static void guards_check(guard_set *s, const clnsa_tensor *plain, const char *const *names)
{
    for (int i = 0; i < s->n; ++i) {
        s->guarded += guard_check(&env, &s->g[i], &plain[i], names[i]);
        guard_free(&s->g[i]);
    }
}

/* ------------------------------------------------------------- NSA */

static void nsa_forward_guarded(const char *name)
{
    const nsa_case *c = nsa_case_named(name);
    assert_non_null(c);
    nsa_run r;
    nsa_run_setup(&env, &r, c, 4242);
    nsa_run_save_branches(&env, &r);
    nsa_run_forward(&env, &r);

    clnsa_nsa_outputs out = r.out;
    const bool on[3] = {c->cmp, c->slc, c->swa};
    clnsa_tensor *lse[3] = {&out.lse_cmp, &out.lse_slc, &out.lse_swa};
    for (int i = 0; i < 3; ++i) /* a branch that is off writes no lse */
        if (!on[i]) lse[i]->data = NULL;
    if (!r.topk_ran) out.block_indices.data = NULL; /* ignored then */
    const clnsa_nsa_outputs plain = out;
    static const char *const names[] = {"o", "lse_cmp", "lse_slc", "lse_swa", "block_indices", "o_cmp", "o_slc", "o_swa"};
    const int nv = (int)(sizeof out / sizeof(clnsa_tensor));
    assert_int_equal(nv, 8);
    guard_set gs;
    guards_place(&gs, (clnsa_tensor *)&out, nv, true);

    snapshot in = {0};
    snapshot_add(&env, &in, TENSORS_OF(r.in));
    size_t bytes = 0;
    assert_ok(&env, clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &r.cfg, &r.in, &out, &bytes), name);
    cl_event ev = NULL;
    assert_ok(&env, clnsa_nsa_forward(env.ctx, env.queue, &r.cfg, &r.in, &out, r.ws, bytes, 0, NULL, &ev), name);
    wait_release(ev);
    guards_check(&gs, (const clnsa_tensor *)&plain, names);
    const int inputs = in.n;
    snapshot_check(&env, &in, name);
    print_message("  forward  %-36s %7zu guard bytes unchanged, %d inputs identical\n", name, gs.guarded, inputs);
    nsa_run_free(&r);
}

/* saved_branches: the backward reads the forward's saved branch outputs. */
static void nsa_backward_guarded(const char *name, bool saved_branches)
{
    const nsa_case *c = nsa_case_named(name);
    assert_non_null(c);
    nsa_run r;
    nsa_run_setup(&env, &r, c, 99);
    if (saved_branches) nsa_run_save_branches(&env, &r);
    nsa_run_forward(&env, &r);
    bwd_bufs b;
    bwd_setup(&env, &b, &r, 7);
    assert_ok(&env, bwd_enqueue_wait(&env, env.queue, &b, &r, NULL), name);

    const clnsa_nsa_grads plain = b.grads;
    static const char *const names[] = {"dq",    "dk",   "dv",    "dg_cmp", "dg_slc", "dg_swa", "dk_cmp",
                                        "dv_cmp", "dw_k", "db_k", "dpe_k",  "dw_v",   "db_v",   "dpe_v"};
    const int ng = (int)(sizeof plain / sizeof(clnsa_tensor));
    assert_int_equal(ng, 14);
    guard_set gs;
    guards_place(&gs, (clnsa_tensor *)&b.grads, ng, true);

    snapshot in = {0};
    snapshot_add(&env, &in, TENSORS_OF(r.in));
    snapshot_add(&env, &in, TENSORS_OF(r.out));
    snapshot_add(&env, &in, &b.dout, 1);
    /* directly: bwd_enqueue_wait would poison the plain run's buffers */
    cl_event ev = NULL;
    assert_ok(&env, clnsa_nsa_backward(env.ctx, env.queue, &r.cfg, &r.in, &r.out, &b.dout, &b.grads, b.ws, b.ws_bytes, 0, NULL, &ev),
       name);
    wait_release(ev);
    guards_check(&gs, (const clnsa_tensor *)&plain, names);
    const int inputs = in.n;
    snapshot_check(&env, &in, name);
    print_message("  backward %-36s %7zu guard bytes unchanged, %d inputs identical\n", name, gs.guarded, inputs);
    b.grads = plain;
    bwd_free(&b);
    nsa_run_free(&r);
}

static void test_nsa_forward(void **state)
{
    (void)state;
    nsa_forward_guarded("all branches G=1");
    nsa_forward_guarded("varlen short seqs");
    nsa_forward_guarded("given indices and counts");
    nsa_forward_guarded("linear compression");
    nsa_forward_guarded("bf16 all");
}

static void test_nsa_backward(void **state)
{
    (void)state;
    nsa_backward_guarded("all branches G=1", true);
    nsa_backward_guarded("given k_cmp v_cmp", false);
    nsa_backward_guarded("linear compression", false);
    nsa_backward_guarded("bf16 all", true);
}

/* ---------------------------------------------------- block-sparse */

typedef struct {
    int B, Tq, Tk, HQ, H, D, DV, qb, kb;
    clnsa_dtype dt;
    float softcap;
    bool sinks;
} bs_shape;

typedef struct {
    bs_shape s;
    cl_mem bufs[12];
    int nbufs;
    clnsa_blocksparse_config cfg;
    clnsa_blocksparse_inputs in;
    clnsa_blocksparse_outputs out;
    clnsa_blocksparse_grad_inputs gin;
    clnsa_blocksparse_grads grads;
} bs_problem;

static clnsa_tensor bs_rand(bs_problem *p, clnsa_dtype dt, int rank, const int64_t *shape, uint64_t *seed)
{
    size_t n = 1;
    for (int d = 0; d < rank; ++d) n *= (size_t)shape[d];
    double *h = alloc_uniform(n, -1, 1, seed);
    cl_mem m = upload(&env, h, n, dt, false);
    free(h);
    assert_true(p->nbufs < 12);
    p->bufs[p->nbufs++] = m;
    return clnsa_tensor_contiguous(m, dt, rank, shape);
}

static clnsa_tensor bs_poisoned(bs_problem *p, clnsa_dtype dt, int rank, const int64_t *shape)
{
    size_t n = 1;
    for (int d = 0; d < rank; ++d) n *= (size_t)shape[d];
    cl_mem m = poisoned(&env, n, dt);
    p->bufs[p->nbufs++] = m;
    return clnsa_tensor_contiguous(m, dt, rank, shape);
}

/* Causal attention with a left window, a block mask of (window OR global
 * tokens) per head, and optionally sinks and a soft cap; forward run into
 * plain outputs. */
static void bs_make(bs_problem *p, const bs_shape *s, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->s = *s;
    const clnsa_dtype dt = s->dt;
    const int64_t sq[4] = {s->B, s->Tq, s->HQ, s->D}, sk[4] = {s->B, s->Tk, s->H, s->D};
    const int64_t sv[4] = {s->B, s->Tk, s->H, s->DV}, so[4] = {s->B, s->Tq, s->HQ, s->DV};
    const int64_t sl[3] = {s->B, s->Tq, s->HQ}, sh = s->HQ;
    const int64_t sm[3] = {s->HQ, (s->Tq + s->qb - 1) / s->qb, (s->Tk + s->kb - 1) / s->kb};
    clnsa_blocksparse_config_init(&p->cfg);
    p->cfg.causal = 1;
    p->cfg.window_left = 40;
    p->cfg.softcap = s->softcap;
    p->cfg.q_block = s->qb;
    p->cfg.kv_block = s->kb;
    p->in.q = bs_rand(p, dt, 4, sq, &seed);
    p->in.k = bs_rand(p, dt, 4, sk, &seed);
    p->in.v = bs_rand(p, dt, 4, sv, &seed);
    if (s->sinks) p->in.sinks = bs_rand(p, CLNSA_DTYPE_F32, 1, &sh, &seed);
    p->in.block_mask = bs_poisoned(p, CLNSA_DTYPE_I32, 3, sm);
    clnsa_block_mask_desc win, glob;
    clnsa_block_mask_desc_init(&win, CLNSA_BLOCK_MASK_WINDOW, s->Tq, s->Tk);
    clnsa_block_mask_desc_init(&glob, CLNSA_BLOCK_MASK_GLOBAL, s->Tq, s->Tk);
    win.q_block = glob.q_block = s->qb;
    win.kv_block = glob.kv_block = s->kb;
    win.window_left = 30;
    win.window_right = 0;
    glob.global_tokens = 9;
    cl_event ev = NULL;
    assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &win, CLNSA_MASK_SET, &p->in.block_mask, 0, NULL, NULL), "mask");
    assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &glob, CLNSA_MASK_OR, &p->in.block_mask, 0, NULL, &ev), "mask");
    wait_release(ev);
    p->out.o = bs_poisoned(p, dt, 4, so);
    p->out.lse = bs_poisoned(p, CLNSA_DTYPE_F32, 3, sl);
    p->gin.o = p->out.o;
    p->gin.lse = p->out.lse;
    p->gin.dout = bs_rand(p, dt, 4, so, &seed);
    p->grads.dq = bs_poisoned(p, dt, 4, sq);
    p->grads.dk = bs_poisoned(p, dt, 4, sk);
    p->grads.dv = bs_poisoned(p, dt, 4, sv);
    if (s->sinks) p->grads.dsinks = bs_poisoned(p, CLNSA_DTYPE_F32, 1, &sh);
}

static void bs_free(bs_problem *p)
{
    for (int i = 0; i < p->nbufs; ++i) clReleaseMemObject(p->bufs[i]);
}

static cl_mem bs_forward(bs_problem *p, const clnsa_blocksparse_outputs *out, cl_mem ws)
{
    size_t bytes = 0;
    assert_ok(&env, clnsa_blocksparse_forward_workspace_size(env.ctx, &p->cfg, &p->in, out, &bytes), "bs forward ws");
    if (!ws) ws = poisoned(&env, bytes / 4 + 1, CLNSA_DTYPE_F32);
    cl_event ev = NULL;
    assert_ok(&env, clnsa_blocksparse_forward(env.ctx, env.queue, &p->cfg, &p->in, out, ws, bytes, 0, NULL, &ev), "bs forward");
    wait_release(ev);
    return ws;
}

static cl_mem bs_backward(bs_problem *p, const clnsa_blocksparse_grads *grads, cl_mem ws)
{
    size_t bytes = 0;
    assert_ok(&env, clnsa_blocksparse_backward_workspace_size(env.ctx, &p->cfg, &p->in, &p->gin, grads, &bytes), "bs backward ws");
    if (!ws) ws = poisoned(&env, bytes / 4 + 1, CLNSA_DTYPE_F32);
    cl_event ev = NULL;
    assert_ok(&env, clnsa_blocksparse_backward(env.ctx, env.queue, &p->cfg, &p->in, &p->gin, grads, ws, bytes, 0, NULL, &ev),
       "bs backward");
    wait_release(ev);
    return ws;
}

static void blocksparse_guarded(const bs_shape *s, const char *label)
{
    bs_problem p;
    bs_make(&p, s, 31);
    cl_mem fws = bs_forward(&p, &p.out, NULL);
    cl_mem bws = bs_backward(&p, &p.grads, NULL);

    static const char *const fnames[] = {"o", "lse"};
    static const char *const bnames[] = {"dq", "dk", "dv", "dsinks"};
    clnsa_blocksparse_outputs out = p.out;
    clnsa_blocksparse_grads grads = p.grads;
    guard_set fg, bg;
    guards_place(&fg, (clnsa_tensor *)&out, 2, true);
    guards_place(&bg, (clnsa_tensor *)&grads, 4, true);
    snapshot in = {0};
    snapshot_add(&env, &in, TENSORS_OF(p.in));
    snapshot_add(&env, &in, TENSORS_OF(p.gin));
    const int inputs = in.n;
    bs_forward(&p, &out, fws);
    bs_backward(&p, &grads, bws);
    guards_check(&fg, (const clnsa_tensor *)&p.out, fnames);
    guards_check(&bg, (const clnsa_tensor *)&p.grads, bnames);
    snapshot_check(&env, &in, label);
    print_message("  block-sparse %-32s %7zu guard bytes unchanged, %d inputs identical\n", label,
                  fg.guarded + bg.guarded, inputs);
    clReleaseMemObject(fws);
    clReleaseMemObject(bws);
    bs_free(&p);
}

static void test_blocksparse(void **state)
{
    (void)state;
    const bs_shape f32 = {2, 45, 70, 6, 2, 16, 8, 16, 32, CLNSA_DTYPE_F32, 20.f, true};
    const bs_shape bf16 = {1, 37, 37, 4, 4, 16, 16, 32, 16, CLNSA_DTYPE_BF16, 0.f, false};
    blocksparse_guarded(&f32, "f32, sinks, soft cap, G=3");
    blocksparse_guarded(&bf16, "bf16, G=1");
}

/* ------------------------------------------------------ mask builders */

static void test_mask_builders(void **state)
{
    (void)state;
    const int B = 2, HQ = 3, Tq = 50, Tk = 75, qb = 16, kb = 16;
    const int64_t NQB = (Tq + qb - 1) / qb, NKB = (Tk + kb - 1) / kb, sm[4] = {B, HQ, NQB, NKB};
    const size_t n = (size_t)(B * HQ * NQB * NKB);
    cl_mem plain_m[3];
    clnsa_tensor plain[3];
    for (int i = 0; i < 3; ++i) {
        plain_m[i] = poisoned(&env, n, CLNSA_DTYPE_I32);
        plain[i] = clnsa_tensor_contiguous(plain_m[i], CLNSA_DTYPE_I32, 4, sm);
    }
    clnsa_block_mask_desc causal, strided;
    clnsa_block_mask_desc_init(&causal, CLNSA_BLOCK_MASK_CAUSAL, Tq, Tk);
    clnsa_block_mask_desc_init(&strided, CLNSA_BLOCK_MASK_STRIDED, Tq, Tk);
    causal.q_block = strided.q_block = qb;
    causal.kv_block = strided.kv_block = kb;
    strided.stride = 3;
    uint8_t *host = malloc(n);
    for (size_t i = 0; i < n; ++i) host[i] = (uint8_t)((i * 7919u) % 5 == 0);

    /* pass 0 into the plain views, pass 1 into guarded ones; the combine
     * reads the two built masks (guarded in pass 1), which must not change */
    clnsa_tensor views[3] = {plain[0], plain[1], plain[2]};
    guard_set gs;
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) guards_place(&gs, views, 3, true);
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &causal, CLNSA_MASK_SET, &views[0], 0, NULL, NULL), "causal");
        assert_ok(&env, clnsa_block_mask_build(env.ctx, env.queue, &strided, CLNSA_MASK_SET, &views[1], 0, NULL, NULL), "strided");
        assert_int_equal(clFinish(env.queue), CL_SUCCESS);
        snapshot in = {0};
        snapshot_add(&env, &in, views, 2);
        cl_event ev = NULL;
        assert_ok(&env, clnsa_block_mask_combine(env.ctx, env.queue, CLNSA_MASK_AND, &views[0], &views[1], &views[2], 0, NULL, &ev),
           "combine");
        wait_release(ev);
        snapshot_check(&env, &in, "combine");
    }
    static const char *const names[] = {"build causal", "build strided", "combine"};
    guards_check(&gs, plain, names);

    /* a host mask: contiguous views only, so an offset and a tail but no gaps */
    guard_view h;
    guard_place(&env, &h, &plain[2], false, 9);
    cl_event ev = NULL;
    assert_ok(&env, clnsa_block_mask_from_host(env.ctx, env.queue, host, &h.view, 0, NULL, &ev), "from host");
    wait_release(ev);
    assert_ok(&env, clnsa_block_mask_from_host(env.ctx, env.queue, host, &plain[2], 0, NULL, &ev), "from host");
    wait_release(ev);
    const size_t hg = guard_check(&env, &h, &plain[2], "from host");
    guard_free(&h);
    print_message("  mask builders: %zu guard bytes unchanged\n", gs.guarded + hg);
    free(host);
    for (int i = 0; i < 3; ++i) clReleaseMemObject(plain_m[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nsa_forward),
        cmocka_unit_test(test_nsa_backward),
        cmocka_unit_test(test_blocksparse),
        cmocka_unit_test(test_mask_builders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
