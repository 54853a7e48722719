/* test_nsa_bwd.c: the NSA backward against the double-precision reference's
 * gradients (themselves checked by finite differences in test_ref), on
 * random shapes, with poisoned outputs; and its determinism: bitwise equal
 * gradients run after run and across work-group sizes. */
#include "nsa_case.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

TEST_ENV_GROUP

/* The gradient tensors of one run, on the device (poisoned) and read back. */
typedef struct {
    const char *name;
    cl_mem m;
    size_t n;
    double *dev, *ref;
} grad_buf;

enum { G_DQ, G_DK, G_DV, G_DGC, G_DGS, G_DGW, G_DKC, G_DVC, G_DWK, G_DBK, G_DPK, G_DWV, G_DBV, G_DPV, G_COUNT };

typedef struct {
    grad_buf g[G_COUNT];
    clnsa_nsa_grads grads;
    clnsa_tensor dout;
    dbuf dO;
} bwd_run;

static void grad_alloc(grad_buf *g, const char *name, size_t n, clnsa_dtype dt)
{
    g->name = name;
    g->n = n;
    g->m = poisoned(&env, n, dt);
    g->dev = calloc(n, sizeof(double));
    g->ref = calloc(n, sizeof(double));
}

static void bwd_setup(bwd_run *b, const nsa_run *r, uint64_t seed)
{
    const nsa_case *c = r->c;
    const clnsa_dtype dt = c->dt;
    const int64_t NC = r->NC, l = r->l;
    memset(b, 0, sizeof *b);
    b->dO = dev_rand(&env, r->nq * c->DV, -1, 1, dt, &seed);
    b->dout = tensor4(b->dO.m, dt, c->B, c->T, c->HQ, c->DV);
    grad_alloc(&b->g[G_DQ], "dq", r->nq * c->DK, dt);
    grad_alloc(&b->g[G_DK], "dk", r->nk * c->DK, dt);
    grad_alloc(&b->g[G_DV], "dv", r->nk * c->DV, dt);
    b->grads.dq = tensor4(b->g[G_DQ].m, dt, c->B, c->T, c->HQ, c->DK);
    b->grads.dk = tensor4(b->g[G_DK].m, dt, c->B, c->T, c->H, c->DK);
    b->grads.dv = tensor4(b->g[G_DV].m, dt, c->B, c->T, c->H, c->DV);
    bool on[3] = {c->cmp, c->slc, c->swa};
    clnsa_tensor *dg[3] = {&b->grads.dg_cmp, &b->grads.dg_slc, &b->grads.dg_swa};
    const char *dgn[3] = {"dg_cmp", "dg_slc", "dg_swa"};
    for (int i = 0; i < 3; ++i)
        if (on[i]) {
            grad_alloc(&b->g[G_DGC + i], dgn[i], r->nq, dt);
            *dg[i] = tensor3(b->g[G_DGC + i].m, dt, c->B, c->T, c->HQ);
        }
    if (c->given_cmp) {
        grad_alloc(&b->g[G_DKC], "dk_cmp", (size_t)c->B * NC * c->H * c->DK, dt);
        grad_alloc(&b->g[G_DVC], "dv_cmp", (size_t)c->B * NC * c->H * c->DV, dt);
        b->grads.dk_cmp = tensor4(b->g[G_DKC].m, dt, c->B, NC, c->H, c->DK);
        b->grads.dv_cmp = tensor4(b->g[G_DVC].m, dt, c->B, NC, c->H, c->DV);
    }
    if (c->linear) {
        int64_t swk[2] = {l * c->DK, c->DK}, swv[2] = {l * c->DV, c->DV}, spk[2] = {l, c->DK}, spv[2] = {l, c->DV};
        int64_t sbk = c->DK, sbv = c->DV;
        grad_alloc(&b->g[G_DWK], "dw_k", (size_t)(l * c->DK * c->DK), dt);
        grad_alloc(&b->g[G_DWV], "dw_v", (size_t)(l * c->DV * c->DV), dt);
        grad_alloc(&b->g[G_DBK], "db_k", (size_t)c->DK, dt);
        grad_alloc(&b->g[G_DBV], "db_v", (size_t)c->DV, dt);
        b->grads.dw_k = clnsa_tensor_contiguous(b->g[G_DWK].m, dt, 2, swk);
        b->grads.dw_v = clnsa_tensor_contiguous(b->g[G_DWV].m, dt, 2, swv);
        b->grads.db_k = clnsa_tensor_contiguous(b->g[G_DBK].m, dt, 1, &sbk);
        b->grads.db_v = clnsa_tensor_contiguous(b->g[G_DBV].m, dt, 1, &sbv);
        if (c->pe) {
            grad_alloc(&b->g[G_DPK], "dpe_k", (size_t)(l * c->DK), dt);
            grad_alloc(&b->g[G_DPV], "dpe_v", (size_t)(l * c->DV), dt);
            b->grads.dpe_k = clnsa_tensor_contiguous(b->g[G_DPK].m, dt, 2, spk);
            b->grads.dpe_v = clnsa_tensor_contiguous(b->g[G_DPV].m, dt, 2, spv);
        }
    }
}

static void bwd_run_device(bwd_run *b, const nsa_run *r)
{
    size_t bytes = 0;
    clnsa_status st = clnsa_nsa_backward_workspace_size(env.ctx, env.queue, &r->cfg, &r->in, &r->out, &b->dout, &b->grads,
                                                        &bytes);
    if (st) print_error("%s: %s\n", r->c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    cl_mem ws = bytes ? poisoned(&env, bytes / 4, CLNSA_DTYPE_F32) : NULL;
    cl_event ev = NULL;
    st = clnsa_nsa_backward(env.ctx, env.queue, &r->cfg, &r->in, &r->out, &b->dout, &b->grads, ws, bytes, 0, NULL, &ev);
    if (st) print_error("%s: %s\n", r->c->name, clnsa_last_error(env.ctx));
    assert_int_equal(st, CLNSA_SUCCESS);
    assert_non_null(ev);
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
    if (ws) clReleaseMemObject(ws);
    for (int i = 0; i < G_COUNT; ++i)
        if (b->g[i].m) download(&env, b->g[i].m, b->g[i].n, r->c->dt, b->g[i].dev);
}

/* Reference gradients: the compressed tensors are given to the reference,
 * and their gradient is carried back through the compression here. */
static void bwd_reference(bwd_run *b, const nsa_run *r)
{
    const nsa_case *c = r->c;
    ref_nsa_inputs rin = nsa_run_ref_inputs(r);
    double *dkc = calloc((size_t)c->B * r->NC * c->H * c->DK, sizeof(double));
    double *dvc = calloc((size_t)c->B * r->NC * c->H * c->DV, sizeof(double));
    ref_nsa_grads rg = {b->g[G_DQ].ref, b->g[G_DK].ref, b->g[G_DV].ref, b->g[G_DGC].ref, b->g[G_DGS].ref,
                        b->g[G_DGW].ref, dkc, dvc};
    ref_nsa_bwd(&r->sh, &rin, b->dO.h, &rg);
    if (c->given_cmp) {
        memcpy(b->g[G_DKC].ref, dkc, b->g[G_DKC].n * sizeof(double));
        memcpy(b->g[G_DVC].ref, dvc, b->g[G_DVC].n * sizeof(double));
    } else if (c->linear) {
        ref_compress_linear_bwd(&r->sh, r->k.h, c->DK, r->wk.h, r->pk.h, dkc, b->g[G_DK].ref, b->g[G_DWK].ref,
                                b->g[G_DBK].ref, b->g[G_DPK].ref);
        ref_compress_linear_bwd(&r->sh, r->v.h, c->DV, r->wv.h, r->pv.h, dvc, b->g[G_DV].ref, b->g[G_DWV].ref,
                                b->g[G_DBV].ref, b->g[G_DPV].ref);
    } else if (c->cmp) {
        ref_compress_mean_bwd(&r->sh, dkc, c->DK, b->g[G_DK].ref);
        ref_compress_mean_bwd(&r->sh, dvc, c->DV, b->g[G_DV].ref);
    }
    free(dkc);
    free(dvc);
}

static double grad_tol(clnsa_dtype dt) { return dt == CLNSA_DTYPE_F32 ? 5e-5 : 2e-2; }

/* Relative L2 against the reference; a gradient that is zero in exact
 * arithmetic (the bias of the compressed keys, under the softmax's shift
 * invariance) is checked by its largest absolute value instead. */
static void bwd_compare(const bwd_run *b, const nsa_case *c)
{
    for (int i = 0; i < G_COUNT; ++i) {
        const grad_buf *g = &b->g[i];
        if (!g->m) continue;
        double ref2 = 0, amax = 0;
        for (size_t j = 0; j < g->n; ++j) {
            ref2 += g->ref[j] * g->ref[j];
            amax = fmax(amax, fabs(g->dev[j]));
        }
        const bool zero = ref2 < 1e-20 * (double)g->n;
        double e = zero ? (isfinite(amax) ? amax : INFINITY) : rel_l2(g->dev, g->ref, g->n);
        const double tol = zero ? 1e-4 : grad_tol(c->dt);
        if (!(e < tol)) print_error("%s: %s %s %.3g\n", c->name, g->name, zero ? "max |x| (exact 0)" : "rel L2", e);
        assert_true(e < tol);
    }
}

static void bwd_free(bwd_run *b)
{
    for (int i = 0; i < G_COUNT; ++i)
        if (b->g[i].m) {
            clReleaseMemObject(b->g[i].m);
            free(b->g[i].dev);
            free(b->g[i].ref);
        }
    dfree(&b->dO);
}

/* CLNSA_TEST_CASE=name runs only the case of that name (in every test). */
static bool selected(const char *name)
{
    const char *only = getenv("CLNSA_TEST_CASE");
    return !only || !*only || strcmp(only, name) == 0;
}

static void run_case(const nsa_case *c, uint64_t seed)
{
    if (!selected(c->name)) return;
    nsa_run r;
    nsa_run_setup(&env, &r, c, seed);
    nsa_run_forward(&env, &r);
    bwd_run b;
    bwd_setup(&b, &r, seed + 99);
    bwd_run_device(&b, &r);
    bwd_reference(&b, &r);
    bwd_compare(&b, c);
    bwd_free(&b);
    nsa_run_free(&r);
}

/* Every case of the shared list; CLNSA_TEST_CASE=name runs one (debugging). */
static void test_cases(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE");
    for (size_t i = 0; i < nsa_case_count; ++i)
        if (!only || strcmp(only, nsa_cases[i].name) == 0) run_case(&nsa_cases[i], 4321 + i);
}

/* Same inputs: bitwise equal gradients twice, and with another work-group size. */
static void test_determinism(void **state)
{
    (void)state;
    const nsa_case *c = nsa_case_named("varlen short seqs");
    assert_non_null(c);
    if (!selected(c->name)) skip();
    nsa_run r;
    nsa_run_setup(&env, &r, c, 7);
    nsa_run_forward(&env, &r);
    bwd_run b[3];
    const char *wg[3] = {NULL, NULL, "32"};
    for (int k = 0; k < 3; ++k) {
        if (wg[k]) setenv("CLNSA_TUNE_WG", wg[k], 1);
        bwd_setup(&b[k], &r, 11);
        bwd_run_device(&b[k], &r);
        unsetenv("CLNSA_TUNE_WG");
    }
    for (int k = 1; k < 3; ++k)
        for (int i = 0; i < G_COUNT; ++i) {
            if (!b[0].g[i].m) continue;
            const bool same = memcmp(b[0].g[i].dev, b[k].g[i].dev, b[0].g[i].n * sizeof(double)) == 0;
            if (!same) print_error("%s differs between run 0 and run %d\n", b[0].g[i].name, k);
            assert_true(same);
        }
    for (int k = 0; k < 3; ++k) bwd_free(&b[k]);
    nsa_run_free(&r);
}



int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
