/* test_golden.c: the NSA forward and backward against golden cases computed by an
 * independent implementation (fla-org's naive PyTorch reference, f32), read
 * from ../shared/golden as unpacked by tests/meson.build into
 * $CLNSA_GOLDEN_DIR: <case>/<op>/<array>.npy. Every op runs in f32 with
 * poisoned (NaN) outputs. */
#include "npy.h"
#include "testutil.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define F32 CLNSA_DTYPE_F32
#define I32 CLNSA_DTYPE_I32

TEST_ENV_GROUP

/* The cases, as written in their case.json (hardcoded, not parsed). Both use
 * compression block = stride = block_size, init_blocks 1, local_blocks 2. */
typedef struct {
    const char *name;
    int B, T, HQ, H, D, S, block_size, window;
    double scale;
    const int *cu;
    int N;
} golden_case;

static const int varlen_cu[] = {0, 37, 201, 300};
static const golden_case case_basic = {"basic", 2, 160, 16, 1, 32, 4, 16, 32, 0.1767766952966369, NULL, 0};
static const golden_case case_varlen = {"varlen", 1, 300, 32, 2, 40, 5, 16, 24, 0.15811388300841897, varlen_cu, 3};

static const double TOL = 1e-4;
static const double TOPK_MAX_ROW_FRACTION = 0.005;

/* ------------------------------------------------------------ .npy */

static const char *need_golden(void)
{
    const char *dir = golden_dir();
    if (!dir) {
        print_message("golden data absent (CLNSA_GOLDEN_DIR unset: ../shared/golden was not found when "
                      "configuring); skipping\n");
        skip();
    }
    return dir;
}

static npy_array load(const golden_case *c, const char *op, const char *name, size_t want_numel)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s/%s/%s.npy", golden_dir(), c->name, op, name);
    npy_array a;
    if (npy_load(path, &a, err, sizeof err) != 0) {
        print_error("%s\n", err);
        fail();
    }
    if ((size_t)npy_numel(&a) != want_numel) {
        print_error("%s: %lld elements, expected %zu\n", path, (long long)npy_numel(&a), want_numel);
        fail();
    }
    return a;
}

static double *load_f64(const golden_case *c, const char *op, const char *name, size_t n)
{
    npy_array a = load(c, op, name, n);
    double *x = NULL;
    char err[512];
    if (npy_to_f64(&a, &x, err, sizeof err) != 0) {
        print_error("%s/%s/%s: %s\n", c->name, op, name, err);
        fail();
    }
    npy_free(&a);
    return x;
}

static int32_t *load_i32(const golden_case *c, const char *op, const char *name, size_t n)
{
    npy_array a = load(c, op, name, n);
    int32_t *x = NULL;
    char err[512];
    if (npy_to_i32(&a, &x, err, sizeof err) != 0) {
        print_error("%s/%s/%s: %s\n", c->name, op, name, err);
        fail();
    }
    npy_free(&a);
    return x;
}

/* ------------------------------------------------------------ a run */

typedef struct {
    bool g_cmp, g_slc, g_swa; /* the branch is on */
    bool ones;                /* its gate is all ones (else inputs/g_*.npy) */
    const char *indices_op;   /* block_indices.npy of this op is given; NULL: top-k */
    bool window;              /* the case's window (else 0) */
    bool bwd;                 /* also the backward, with inputs/do.npy */
} run_spec;

typedef struct {
    double *o, *lse_cmp;
    int32_t *bi; /* top-k's selection, when it ran */
    double *dq, *dk, *dv, *dg[3]; /* with bwd (dg of branches that are on) */
} run_result;

/* The backward after a forward whose outputs (lse, indices) are in `out`. */
static void run_backward(const golden_case *c, const run_spec *r, const clnsa_nsa_config *cfg,
                         const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *out, run_result *res)
{
    const size_t nq = (size_t)c->B * c->T * c->HQ, nk = (size_t)c->B * c->T * c->H, D = (size_t)c->D;
    double *dO = load_f64(c, "inputs", "do", nq * D);
    cl_mem dom = upload(&env, dO, nq * D, F32, false);
    free(dO);
    cl_mem dqm = poisoned(&env, nq * D, F32), dkm = poisoned(&env, nk * D, F32), dvm = poisoned(&env, nk * D, F32);
    cl_mem dgm[3] = {NULL, NULL, NULL};
    clnsa_nsa_grads gr;
    memset(&gr, 0, sizeof gr);
    gr.dq = tensor4(dqm, F32, c->B, c->T, c->HQ, c->D);
    gr.dk = tensor4(dkm, F32, c->B, c->T, c->H, c->D);
    gr.dv = tensor4(dvm, F32, c->B, c->T, c->H, c->D);
    const bool on[3] = {r->g_cmp, r->g_slc, r->g_swa};
    clnsa_tensor *dgt[3] = {&gr.dg_cmp, &gr.dg_slc, &gr.dg_swa};
    for (int i = 0; i < 3; ++i)
        if (on[i]) {
            dgm[i] = poisoned(&env, nq, F32);
            *dgt[i] = tensor3(dgm[i], F32, c->B, c->T, c->HQ);
        }
    clnsa_tensor dout = tensor4(dom, F32, c->B, c->T, c->HQ, c->D);
    size_t bytes = 0;
    clnsa_status st = clnsa_nsa_backward_workspace_size(env.ctx, env.queue, cfg, in, out, &dout, &gr, &bytes);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    cl_mem ws = bytes ? poisoned(&env, bytes / 4, F32) : NULL;
    cl_event ev = NULL;
    st = clnsa_nsa_backward(env.ctx, env.queue, cfg, in, out, &dout, &gr, ws, bytes, 0, NULL, &ev);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_int_equal(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
    res->dq = malloc(nq * D * sizeof(double));
    res->dk = malloc(nk * D * sizeof(double));
    res->dv = malloc(nk * D * sizeof(double));
    download(&env, dqm, nq * D, F32, res->dq);
    download(&env, dkm, nk * D, F32, res->dk);
    download(&env, dvm, nk * D, F32, res->dv);
    for (int i = 0; i < 3; ++i)
        if (dgm[i]) {
            res->dg[i] = malloc(nq * sizeof(double));
            download(&env, dgm[i], nq, F32, res->dg[i]);
        }
    cl_mem all[] = {dom, dqm, dkm, dvm, dgm[0], dgm[1], dgm[2], ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
}

static run_result run(const golden_case *c, const run_spec *r)
{
    const size_t nq = (size_t)c->B * c->T * c->HQ, nk = (size_t)c->B * c->T * c->H;
    const size_t D = (size_t)c->D;
    double *q = load_f64(c, "inputs", "q", nq * D);
    double *k = load_f64(c, "inputs", "k", nk * D);
    double *v = load_f64(c, "inputs", "v", nk * D);
    cl_mem qm = upload(&env, q, nq * D, F32, false), km = upload(&env, k, nk * D, F32, false);
    cl_mem vm = upload(&env, v, nk * D, F32, false);
    free(q);
    free(k);
    free(v);

    clnsa_nsa_config cfg;
    clnsa_nsa_config_init(&cfg);
    cfg.block_size = c->block_size;
    cfg.block_count = c->S;
    cfg.cmp_block = c->block_size;
    cfg.cmp_stride = c->block_size;
    cfg.init_blocks = 1;
    cfg.local_blocks = 2;
    cfg.window = r->window ? c->window : 0;
    cfg.scale = (float)c->scale;

    clnsa_nsa_inputs in;
    memset(&in, 0, sizeof in);
    in.q = tensor4(qm, F32, c->B, c->T, c->HQ, c->D);
    in.k = tensor4(km, F32, c->B, c->T, c->H, c->D);
    in.v = tensor4(vm, F32, c->B, c->T, c->H, c->D);
    const bool on[3] = {r->g_cmp, r->g_slc, r->g_swa};
    const char *gname[3] = {"g_cmp", "g_slc", "g_swa"};
    clnsa_tensor *gt[3] = {&in.g_cmp, &in.g_slc, &in.g_swa};
    cl_mem gm[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; ++i) {
        if (!on[i]) continue;
        double *g;
        if (r->ones) {
            g = malloc(nq * sizeof *g);
            for (size_t j = 0; j < nq; ++j) g[j] = 1.0;
        } else {
            g = load_f64(c, "inputs", gname[i], nq);
        }
        gm[i] = upload(&env, g, nq, F32, false);
        free(g);
        *gt[i] = tensor3(gm[i], F32, c->B, c->T, c->HQ);
    }
    cl_mem cum = NULL, idxm = NULL;
    if (c->cu) {
        cum = upload_i32(&env, c->cu, (size_t)c->N + 1);
        int64_t n = c->N + 1;
        in.cu_seqlens = clnsa_tensor_contiguous(cum, I32, 1, &n);
    }
    if (r->indices_op) {
        int32_t *idx = load_i32(c, r->indices_op, "block_indices", nk * c->S);
        idxm = upload_i32(&env, idx, nk * c->S);
        free(idx);
        in.block_indices = tensor4(idxm, I32, c->B, c->T, c->H, c->S);
    }

    cl_mem om = poisoned(&env, nq * D, F32), lm = poisoned(&env, nq, F32), bm = poisoned(&env, nk * c->S, I32);
    cl_mem lsm = poisoned(&env, nq, F32), lwm = poisoned(&env, nq, F32);
    clnsa_nsa_outputs out;
    memset(&out, 0, sizeof out);
    out.o = tensor4(om, F32, c->B, c->T, c->HQ, c->D);
    if (r->g_cmp) out.lse_cmp = tensor3(lm, F32, c->B, c->T, c->HQ);
    if (r->g_slc) out.lse_slc = tensor3(lsm, F32, c->B, c->T, c->HQ);
    if (r->g_swa) out.lse_swa = tensor3(lwm, F32, c->B, c->T, c->HQ);
    out.block_indices = tensor4(bm, I32, c->B, c->T, c->H, c->S);

    size_t ws_bytes = 0;
    clnsa_status st = clnsa_nsa_forward_workspace_size(env.ctx, env.queue, &cfg, &in, &out, &ws_bytes);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    cl_mem ws = ws_bytes ? poisoned(&env, ws_bytes / 4, F32) : NULL;
    cl_event ev = NULL;
    st = clnsa_nsa_forward(env.ctx, env.queue, &cfg, &in, &out, ws, ws_bytes, 0, NULL, &ev);
    if (st) print_error("%s: %s\n", c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_int_equal(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);

    run_result res;
    memset(&res, 0, sizeof res);
    if (r->bwd) run_backward(c, r, &cfg, &in, &out, &res);
    res.o = malloc(nq * D * sizeof *res.o);
    download(&env, om, nq * D, F32, res.o);
    if (r->g_cmp) {
        res.lse_cmp = malloc(nq * sizeof *res.lse_cmp);
        download(&env, lm, nq, F32, res.lse_cmp);
    }
    if (r->g_slc && !r->indices_op) {
        res.bi = malloc(nk * c->S * sizeof *res.bi);
        download_i32(&env, bm, nk * c->S, res.bi);
    }
    cl_mem all[] = {qm, km, vm, gm[0], gm[1], gm[2], cum, idxm, om, lm, lsm, lwm, bm, ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
    return res;
}

static void free_result(run_result *r)
{
    free(r->o);
    free(r->lse_cmp);
    free(r->bi);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    for (int i = 0; i < 3; ++i) free(r->dg[i]);
}

static void check(const golden_case *c, const char *what, double err)
{
    print_message("  %-7s %-18s rel L2 %.3g\n", c->name, what, err);
    if (!(err < TOL)) print_error("%s %s: rel L2 %.3g >= %.0e\n", c->name, what, err, TOL);
    assert_true(err < TOL);
}

/* Compares each of the op's gradient files present in the result. */
static void check_grads(const golden_case *c, const char *op, const run_result *res)
{
    const size_t nq = (size_t)c->B * c->T * c->HQ, nk = (size_t)c->B * c->T * c->H, D = (size_t)c->D;
    const struct { const char *name; const double *dev; size_t n; } g[] = {
        {"dq", res->dq, nq * D}, {"dk", res->dk, nk * D}, {"dv", res->dv, nk * D},
        {"dg_cmp", res->dg[0], nq}, {"dg_slc", res->dg[1], nq}, {"dg_swa", res->dg[2], nq},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; ++i) {
        if (!g[i].dev || (i >= 3 && strcmp(op, "nsa") != 0)) continue;
        double *ref = load_f64(c, op, g[i].name, g[i].n);
        char what[64];
        snprintf(what, sizeof what, "%s %s", op, g[i].name);
        check(c, what, rel_l2(g[i].dev, ref, g[i].n));
        free(ref);
    }
}

/* ------------------------------------------------------------ ops */

/* selection/o: ungated selected attention with the given block indices */
static void selection(const golden_case *c)
{
    need_golden();
    const size_t n = (size_t)c->B * c->T * c->HQ * c->D;
    run_spec r = {false, true, false, true, "selection", false, true};
    run_result res = run(c, &r);
    double *ref = load_f64(c, "selection", "o", n);
    check(c, "selection o", rel_l2(res.o, ref, n));
    check_grads(c, "selection", &res);
    free(ref);
    free_result(&res);
}

/* compression/o and lse: ungated compressed attention over mean pooling */
static void compression(const golden_case *c)
{
    need_golden();
    const size_t nq = (size_t)c->B * c->T * c->HQ, n = nq * c->D;
    run_spec r = {true, false, false, true, NULL, false, true};
    run_result res = run(c, &r);
    check_grads(c, "compression", &res);
    double *ref = load_f64(c, "compression", "o", n), *ref_lse = load_f64(c, "compression", "lse", nq);
    size_t ninf = 0;
    for (size_t i = 0; i < nq; ++i) ninf += isinf(ref_lse[i]) && ref_lse[i] < 0;
    check(c, "compression o", rel_l2(res.o, ref, n));
    print_message("  %-7s compression lse: %zu of %zu rows -inf in the reference\n", c->name, ninf, nq);
    check(c, "compression lse", rel_l2_lse(res.lse_cmp, ref_lse, nq));
    free(ref);
    free(ref_lse);
    free_result(&res);
}

/* nsa/o: all three gated branches, the reference's own selection given */
static void full_nsa(const golden_case *c)
{
    need_golden();
    const size_t n = (size_t)c->B * c->T * c->HQ * c->D;
    run_spec r = {true, true, true, false, "nsa", true, true};
    run_result res = run(c, &r);
    double *ref = load_f64(c, "nsa", "o", n);
    check(c, "nsa o", rel_l2(res.o, ref, n));
    check_grads(c, "nsa", &res);
    free(ref);
    free_result(&res);
}

static bool row_has(const int32_t *row, int S, int32_t x)
{
    for (int s = 0; s < S; ++s)
        if (row[s] == x) return true;
    return false;
}

/* topk/block_indices: the online top-k's selection, compared as sets of
 * the valid (>= 0) blocks of each row */
static void topk(const golden_case *c)
{
    need_golden();
    const size_t rows = (size_t)c->B * c->T * c->H;
    run_spec r = {false, true, false, true, NULL, false, false};
    run_result res = run(c, &r);
    int32_t *ref = load_i32(c, "topk", "block_indices", rows * c->S);
    size_t bad = 0, printed = 0;
    for (size_t i = 0; i < rows; ++i) {
        const int32_t *a = res.bi + i * c->S, *b = ref + i * c->S;
        bool same = true;
        for (int s = 0; s < c->S; ++s) {
            if (a[s] >= 0 && !row_has(b, c->S, a[s])) same = false;
            if (b[s] >= 0 && !row_has(a, c->S, b[s])) same = false;
        }
        if (!same) {
            ++bad;
            if (printed++ < 5) {
                char sa[128] = "", sb[128] = "";
                for (int s = 0; s < c->S; ++s) {
                    snprintf(sa + strlen(sa), sizeof sa - strlen(sa), " %d", a[s]);
                    snprintf(sb + strlen(sb), sizeof sb - strlen(sb), " %d", b[s]);
                }
                print_message("    row %zu (t=%zu, h=%zu): clnsa {%s } reference {%s }\n", i, i / c->H % c->T,
                              i % c->H, sa, sb);
            }
        }
    }
    const size_t allowed = (size_t)(TOPK_MAX_ROW_FRACTION * (double)rows);
    print_message("  %-7s top-k              %zu of %zu rows differ as sets (allowed %zu)\n", c->name, bad, rows,
                  allowed);
    assert_true(bad <= allowed);
    free(ref);
    free_result(&res);
}

static void test_basic_selection(void **state) { (void)state; selection(&case_basic); }
static void test_basic_compression(void **state) { (void)state; compression(&case_basic); }
static void test_basic_nsa(void **state) { (void)state; full_nsa(&case_basic); }
static void test_basic_topk(void **state) { (void)state; topk(&case_basic); }
static void test_varlen_selection(void **state) { (void)state; selection(&case_varlen); }
static void test_varlen_compression(void **state) { (void)state; compression(&case_varlen); }
static void test_varlen_nsa(void **state) { (void)state; full_nsa(&case_varlen); }
static void test_varlen_topk(void **state) { (void)state; topk(&case_varlen); }



int main(void)
{
    if (!golden_dir())
        printf("golden data absent: CLNSA_GOLDEN_DIR is not set (../shared/golden was not found when "
               "configuring); every test is skipped\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_selection),  cmocka_unit_test(test_basic_compression),
        cmocka_unit_test(test_basic_nsa),        cmocka_unit_test(test_basic_topk),
        cmocka_unit_test(test_varlen_selection), cmocka_unit_test(test_varlen_compression),
        cmocka_unit_test(test_varlen_nsa),       cmocka_unit_test(test_varlen_topk),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
