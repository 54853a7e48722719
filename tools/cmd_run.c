/* cmd_run.c: `clnsa run`, the NSA forward and backward on random inputs (all
 * three branches, random gates, top-k computed on the device, random output
 * gradient): each timed with profiling events and checked against the
 * double-precision reference. */
#include "cli_common.h"
#include "cmds.h"
#include "internal.h"
#include "nsa_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(int) == sizeof(int32_t), "the reference takes int indices");

/* Shapes up to this many B*T*HQ*T*DK multiply-adds are checked. */
#define CHECK_LIMIT 2e9

typedef struct {
    int B, T, HQ, H, DK, DV;
    int block_size, block_count, window, cmp_block, cmp_stride, init_blocks, local_blocks;
    int dtype, repeat, seed;
    bool no_check, no_bwd;
    const char *device;
} run_opts;

enum { X_Q, X_K, X_V, X_GC, X_GS, X_GW, X_N }; /* host inputs */
enum { D_Q, D_K, D_V, D_GC, D_GS, D_GW, D_N }; /* gradients: dq, dk, dv, dg_cmp, dg_slc, dg_swa */
enum { M_Q, M_K, M_V, M_GC, M_GS, M_GW, M_O, M_LC, M_LS, M_LW, M_BI, M_WS, M_DO, M_WB,
       M_D0, M_N = M_D0 + D_N }; /* buffers; M_D0 + D_*: the gradients */

typedef struct {
    size_t n[X_N];
    float *x[X_N];   /* inputs as the device stores them */
    float *o, *lse[3];
    int32_t *bi;
    float *dO;       /* output gradient as the device stores it; NULL: no backward */
    float *d[D_N];   /* the device's gradients (NULL: not computed) */
} run_host;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in the open interval (lo, hi), rounded to the storage dtype. */
static void fill(float *x, size_t n, float lo, float hi, clnsa_dtype dt, uint64_t *seed)
{
    for (size_t i = 0; i < n; ++i) {
        double u = ((double)(splitmix(seed) >> 11) + 0.5) / 9007199254740992.0;
        x[i] = cli_round((float)(lo + (hi - lo) * u), dt);
    }
}

static double *widen(const float *x, size_t n)
{
    double *d = cli_malloc(n * sizeof *d);
    if (d)
        for (size_t i = 0; i < n; ++i) d[i] = x[i];
    return d;
}

/* ||x - ref|| / ||ref||; an infinite entry must match exactly; NaN gives inf. */
static double rel_l2(const float *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (isnan(x[i])) return INFINITY;
        if (isinf(x[i]) || isinf(ref[i])) {
            if ((double)x[i] != ref[i]) return INFINITY;
            continue;
        }
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ||x - ref|| / max(||ref||, floor_rms * sqrt(n)): a gradient that is almost
 * zero everywhere is compared in absolute terms. Any non-finite x gives inf. */
static double rel_l2_floor(const float *x, const double *ref, size_t n, double floor_rms)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(x[i])) return INFINITY;
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    const double fl = floor_rms * floor_rms * (double)n;
    return sqrt(num / (den > fl ? den : fl));
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static size_t rows_differing_as_sets(const int32_t *a, const int *b, size_t rows, int S)
{
    size_t bad = 0;
    int *ra = malloc(2 * (size_t)S * sizeof *ra), *rb = ra + S;
    if (!ra) return rows;
    for (size_t r = 0; r < rows; ++r) {
        memcpy(ra, a + r * S, (size_t)S * sizeof *ra);
        memcpy(rb, b + r * S, (size_t)S * sizeof *rb);
        qsort(ra, (size_t)S, sizeof *ra, cmp_int);
        qsort(rb, (size_t)S, sizeof *rb, cmp_int);
        bad += memcmp(ra, rb, (size_t)S * sizeof *ra) != 0;
    }
    free(ra);
    return bad;
}

/* The backward's reference gradients, done the way tests/test_nsa_bwd.c does
 * it: the compressed K/V are given to the reference, and the gradient they
 * receive is carried back into dk / dv through the mean pooling here. `x` are
 * the widened inputs, `kc` / `vc` the compressed K/V the forward check used.
 * Returns the worst relative L2 error (printed per tensor), -1 on error. */
static double check_bwd(const run_opts *o, const run_host *h, const ref_nsa_shape *sh, const ref_nsa_inputs *rin,
                        size_t nkc, size_t nvc, double tol)
{
    static const char *const names[D_N] = {"dq", "dk", "dv", "dg_cmp", "dg_slc", "dg_swa"};
    const size_t nq = (size_t)o->B * o->T * o->HQ, nk = (size_t)o->B * o->T * o->H;
    const size_t n[D_N] = {nq * o->DK, nk * o->DK, nk * o->DV, nq, nq, nq};
    double *r[D_N] = {0}, *dkc = NULL, *dvc = NULL, *dO = NULL, worst = -1;
    for (int i = 0; i < D_N; ++i)
        if (h->d[i] && !(r[i] = calloc(n[i], sizeof(double)))) {
            fprintf(stderr, "out of host memory\n");
            goto done;
        }
    dkc = calloc(nkc, sizeof *dkc);
    dvc = calloc(nvc, sizeof *dvc);
    if (!dkc || !dvc) {
        fprintf(stderr, "out of host memory\n");
        goto done;
    }
    if (!(dO = widen(h->dO, nq * o->DV))) goto done;
    ref_nsa_grads rg = {r[D_Q], r[D_K], r[D_V], r[D_GC], r[D_GS], r[D_GW], dkc, dvc};
    ref_nsa_bwd(sh, rin, dO, &rg);
    ref_compress_mean_bwd(sh, dkc, o->DK, r[D_K]);
    ref_compress_mean_bwd(sh, dvc, o->DV, r[D_V]);
    worst = 0;
    for (int i = 0; i < D_N; ++i) {
        if (!h->d[i]) continue;
        double e = rel_l2_floor(h->d[i], r[i], n[i], 1e-2);
        printf("  %-8s %.3e%s\n", names[i], e, e <= tol ? "" : "  (over tolerance)");
        if (!(e <= worst)) worst = e;
    }
done:
    for (int i = 0; i < D_N; ++i) free(r[i]);
    free(dkc), free(dvc), free(dO);
    return worst;
}

/* The reference check, done the way tests/test_nsa_fwd.c does it: the
 * compressed K/V are mean-pooled here and rounded to the storage dtype, and
 * the reference is given the device's own top-k. With a backward, its
 * gradients are checked too (check_bwd). Returns 1 on PASS, 0 on FAIL, -1
 * on error. */
static int check(const run_opts *o, const run_host *h, clnsa_dtype dt, bool tf32)
{
    ref_nsa_shape sh;
    ref_nsa_shape_init(&sh, o->B, o->T, o->HQ, o->H, o->DK, o->DV);
    sh.block_size = o->block_size;
    sh.block_count = o->block_count;
    sh.cmp_block = o->cmp_block;
    sh.cmp_stride = o->cmp_stride;
    sh.window = o->window;
    sh.init_blocks = o->init_blocks;
    sh.local_blocks = o->local_blocks;
    const size_t NC = (size_t)ref_total_cmp(&sh);
    const size_t nkc = (size_t)o->B * NC * o->H * o->DK, nvc = (size_t)o->B * NC * o->H * o->DV;
    const size_t nl = h->n[X_GC], no = (size_t)o->B * o->T * o->HQ * o->DV;
    const size_t rows = (size_t)o->B * o->T * o->H;
    double *x[X_N] = {0}, *kc = NULL, *vc = NULL, *ro = NULL, *rl[3] = {0};
    int *rbi = NULL, pass = -1;
    for (int i = 0; i < X_N; ++i)
        if (h->x[i] && !(x[i] = widen(h->x[i], h->n[i]))) goto done;
    kc = cli_malloc(nkc * sizeof *kc);
    vc = cli_malloc(nvc * sizeof *vc);
    ro = cli_malloc(no * sizeof *ro);
    rbi = cli_malloc(rows * o->block_count * sizeof *rbi);
    for (int i = 0; i < 3; ++i) rl[i] = cli_malloc(nl * sizeof(double));
    if (!kc || !vc || !ro || !rbi || !rl[0] || !rl[1] || !rl[2]) goto done;
    ref_compress_mean(&sh, x[X_K], o->DK, kc);
    ref_compress_mean(&sh, x[X_V], o->DV, vc);
    for (size_t i = 0; i < nkc; ++i) kc[i] = cli_round((float)kc[i], dt);
    for (size_t i = 0; i < nvc; ++i) vc[i] = cli_round((float)vc[i], dt);

    ref_nsa_inputs rin = {x[X_Q], x[X_K], x[X_V], x[X_GC], x[X_GS], x[X_GW], kc, vc, h->bi, NULL};
    ref_nsa_outputs rout = {ro, NULL, NULL, NULL, rl[0], rl[1], rl[2], NULL};
    ref_nsa_fwd(&sh, &rin, &rout);

    const bool exact = dt == CLNSA_DTYPE_F32 && !tf32; /* TF32: as test_warp checks it */
    const double tol = exact ? 1e-4 : tf32 ? 2e-3 : 1e-2;
    const double gtol = exact ? 1e-4 : tf32 ? 5e-3 : 2e-2;
    static const char *const names[3] = {"lse_cmp", "lse_slc", "lse_swa"};
    double e = rel_l2(h->o, ro, no), worst = e;
    printf("check: relative L2 error vs reference (forward tolerance %.0e)\n", tol);
    printf("  %-8s %.3e\n", "o", e);
    for (int i = 0; i < 3; ++i) {
        if (!h->lse[i]) continue;
        double el = rel_l2(h->lse[i], rl[i], nl);
        printf("  %-8s %.3e\n", names[i], el);
        if (!(el <= worst)) worst = el;
    }
    ref_topk(&sh, x[X_Q], kc, NULL, rbi);
    size_t bad = rows_differing_as_sets(h->bi, rbi, rows, o->block_count);
    if (bad) printf("  top-k: %zu of %zu rows differ from the reference's as sets (near-ties; not counted)\n", bad, rows);
    else printf("  top-k: all %zu rows match the reference's as sets\n", rows);
    pass = worst <= tol;
    if (h->dO) {
        printf("check: backward, relative L2 error vs reference (tolerance %.0e; norms floored at rms 1e-2)\n", gtol);
        fflush(stdout);
        double g = check_bwd(o, h, &sh, &rin, nkc, nvc, gtol);
        if (g < 0) {
            pass = -1;
            goto done;
        }
        pass = pass && g <= gtol;
    }
    printf("%s\n", pass ? "PASS" : "FAIL");
done:
    for (int i = 0; i < X_N; ++i) free(x[i]);
    free(kc), free(vc), free(ro), free(rbi);
    for (int i = 0; i < 3; ++i) free(rl[i]);
    return pass;
}

/* The NSA's arguments, forward and backward. */
typedef struct {
    clnsa_nsa_config cfg;
    clnsa_nsa_inputs in;
    clnsa_nsa_outputs out; /* also the backward's `saved` */
    clnsa_tensor dout;
    clnsa_nsa_grads grads;
    cl_mem ws, wb;
    size_t ws_bytes, wb_bytes;
} nsa_call;

/* One forward (bwd false) or backward; returns its device time in ms, -1 on
 * error (printed). */
static double once(const cli_env *env, const nsa_call *c, bool bwd)
{
    cli_timer t;
    if (cli_timer_begin(env, &t)) return -1;
    cl_event ev = NULL;
    clnsa_status st =
        bwd ? clnsa_nsa_backward(env->ctx, env->queue, &c->cfg, &c->in, &c->out, &c->dout, &c->grads, c->wb,
                                 c->wb_bytes, 1, &t.marker, &ev)
            : clnsa_nsa_forward(env->ctx, env->queue, &c->cfg, &c->in, &c->out, c->ws, c->ws_bytes, 1, &t.marker, &ev);
    double ms = cli_timer_end(&t, ev);
    if (ev) clReleaseEvent(ev);
    if (st != CLNSA_SUCCESS) {
        cli_report(env, bwd ? "clnsa_nsa_backward" : "clnsa_nsa_forward", st);
        return -1;
    }
    return ms;
}

/* One warm-up call, then --repeat timed ones; prints the median. */
static int timed(const run_opts *o, const cli_env *env, const nsa_call *c, bool bwd, double *times)
{
    const char *what = bwd ? "backward" : "forward";
    double t0 = cli_now_ms();
    if (once(env, c, bwd) < 0) return -1;
    double first = cli_now_ms() - t0;
    for (int r = 0; r < o->repeat; ++r)
        if ((times[r] = once(env, c, bwd)) < 0) return -1;
    cli_sort_doubles(times, (size_t)o->repeat);
    double med = o->repeat % 2 ? times[o->repeat / 2] : 0.5 * (times[o->repeat / 2 - 1] + times[o->repeat / 2]);
    printf("%s workspace: %zu bytes\n", what, bwd ? c->wb_bytes : c->ws_bytes);
    printf("%s: %.3f ms (median of %d after one warm-up; min %.3f, max %.3f; profiling events)\n", what, med,
           o->repeat, times[0], times[o->repeat - 1]);
    printf("%s first call (kernel build + run): %.1f ms (host clock)\n", what, first);
    fflush(stdout);
    return 0;
}

/* -1: error (printed), 0: PASS or not checked, 1: FAIL. */
static int run(const run_opts *o, cli_env *env)
{
    const clnsa_dtype dt = cli_dtype_from_choice(o->dtype);
    const size_t nq = (size_t)o->B * o->T * o->HQ, nk = (size_t)o->B * o->T * o->H;
    const size_t rows_s = nk * (size_t)o->block_count;
    run_host h;
    memset(&h, 0, sizeof h);
    cl_mem m[M_N] = {0};
    double *times = NULL;
    int rc = -1;
    const size_t n[X_N] = {nq * o->DK, nk * o->DK, nk * o->DV, nq, nq, o->window > 0 ? nq : 0};
    const size_t nd[D_N] = {nq * o->DK, nk * o->DK, nk * o->DV, nq, nq, o->window > 0 ? nq : 0};
    const float lo[X_N] = {-1, -1, -1, 0, 0, 0};
    uint64_t seed = (uint64_t)o->seed;
    for (int i = 0; i < X_N; ++i) {
        h.n[i] = n[i];
        if (i == X_GW && !n[i]) continue;
        if (!(h.x[i] = cli_malloc(n[i] * sizeof(float)))) goto done;
        fill(h.x[i], n[i], lo[i], 1, dt, &seed);
        if (!(m[i] = cli_upload_f32(env, h.x[i], n[i], dt))) goto done;
    }
    if (!(m[M_O] = cli_buffer(env, nq * o->DV * clnsa_dtype_size(dt), NULL))) goto done;
    for (int i = 0; i < 3; ++i)
        if ((i < 2 || h.x[X_GW]) && !(m[M_LC + i] = cli_buffer(env, nq * 4, NULL))) goto done;
    if (!(m[M_BI] = cli_buffer(env, rows_s * 4, NULL))) goto done;
    if (!o->no_bwd) {
        if (!(h.dO = cli_malloc(nq * o->DV * sizeof(float)))) goto done;
        fill(h.dO, nq * o->DV, -1, 1, dt, &seed);
        if (!(m[M_DO] = cli_upload_f32(env, h.dO, nq * o->DV, dt))) goto done;
        for (int i = 0; i < D_N; ++i)
            if (nd[i] && !(m[M_D0 + i] = cli_buffer(env, nd[i] * clnsa_dtype_size(dt), NULL))) goto done;
    }

    nsa_call c;
    memset(&c, 0, sizeof c);
    clnsa_nsa_config_init(&c.cfg);
    c.cfg.block_size = o->block_size;
    c.cfg.block_count = o->block_count;
    c.cfg.cmp_block = o->cmp_block;
    c.cfg.cmp_stride = o->cmp_stride;
    c.cfg.window = o->window;
    c.cfg.init_blocks = o->init_blocks;
    c.cfg.local_blocks = o->local_blocks;
    int64_t sq[4] = {o->B, o->T, o->HQ, o->DK}, sk[4] = {o->B, o->T, o->H, o->DK};
    int64_t sv[4] = {o->B, o->T, o->H, o->DV}, so[4] = {o->B, o->T, o->HQ, o->DV};
    int64_t sg[3] = {o->B, o->T, o->HQ}, sb[4] = {o->B, o->T, o->H, o->block_count};
    c.in.q = clnsa_tensor_contiguous(m[M_Q], dt, 4, sq);
    c.in.k = clnsa_tensor_contiguous(m[M_K], dt, 4, sk);
    c.in.v = clnsa_tensor_contiguous(m[M_V], dt, 4, sv);
    c.in.g_cmp = clnsa_tensor_contiguous(m[M_GC], dt, 3, sg);
    c.in.g_slc = clnsa_tensor_contiguous(m[M_GS], dt, 3, sg);
    if (m[M_GW]) c.in.g_swa = clnsa_tensor_contiguous(m[M_GW], dt, 3, sg);
    c.out.o = clnsa_tensor_contiguous(m[M_O], dt, 4, so);
    c.out.lse_cmp = clnsa_tensor_contiguous(m[M_LC], CLNSA_DTYPE_F32, 3, sg);
    c.out.lse_slc = clnsa_tensor_contiguous(m[M_LS], CLNSA_DTYPE_F32, 3, sg);
    if (m[M_LW]) c.out.lse_swa = clnsa_tensor_contiguous(m[M_LW], CLNSA_DTYPE_F32, 3, sg);
    c.out.block_indices = clnsa_tensor_contiguous(m[M_BI], CLNSA_DTYPE_I32, 4, sb);
    if (m[M_DO]) {
        c.dout = clnsa_tensor_contiguous(m[M_DO], dt, 4, so);
        c.grads.dq = clnsa_tensor_contiguous(m[M_D0 + D_Q], dt, 4, sq);
        c.grads.dk = clnsa_tensor_contiguous(m[M_D0 + D_K], dt, 4, sk);
        c.grads.dv = clnsa_tensor_contiguous(m[M_D0 + D_V], dt, 4, sv);
        c.grads.dg_cmp = clnsa_tensor_contiguous(m[M_D0 + D_GC], dt, 3, sg);
        c.grads.dg_slc = clnsa_tensor_contiguous(m[M_D0 + D_GS], dt, 3, sg);
        if (m[M_D0 + D_GW]) c.grads.dg_swa = clnsa_tensor_contiguous(m[M_D0 + D_GW], dt, 3, sg);
    }

    clnsa_status st = clnsa_nsa_forward_workspace_size(env->ctx, env->queue, &c.cfg, &c.in, &c.out, &c.ws_bytes);
    if (st != CLNSA_SUCCESS) {
        cli_report(env, "clnsa_nsa_forward_workspace_size", st);
        goto done;
    }
    if (c.ws_bytes && !(m[M_WS] = c.ws = cli_buffer(env, c.ws_bytes, NULL))) goto done;
    if (m[M_DO]) {
        st = clnsa_nsa_backward_workspace_size(env->ctx, env->queue, &c.cfg, &c.in, &c.out, &c.dout, &c.grads,
                                               &c.wb_bytes);
        if (st != CLNSA_SUCCESS) {
            cli_report(env, "clnsa_nsa_backward_workspace_size", st);
            goto done;
        }
        if (c.wb_bytes && !(m[M_WB] = c.wb = cli_buffer(env, c.wb_bytes, NULL))) goto done;
    }

    if (!(times = cli_malloc((size_t)o->repeat * sizeof *times))) goto done;
    /* The backward reads the forward's saved lse and block indices, which
     * every forward rewrites identically. */
    if (timed(o, env, &c, false, times)) goto done;
    if (m[M_DO] && timed(o, env, &c, true, times)) goto done;
    if (!m[M_DO]) printf("backward: skipped (--no-bwd)\n");

    double work = (double)o->B * o->T * o->HQ * (double)o->T * o->DK;
    if (o->no_check) {
        printf("check: skipped (--no-check)\n");
        rc = 0;
        goto done;
    }
    if (work >= CHECK_LIMIT) {
        printf("check: skipped, shape too large for the reference (B*T*HQ*T*DK = %.3g >= %.0e)\n", work, CHECK_LIMIT);
        rc = 0;
        goto done;
    }
    if (!(h.o = cli_malloc(nq * o->DV * sizeof(float))) || !(h.bi = cli_malloc(rows_s * sizeof(int32_t)))) goto done;
    if (cli_download_f32(env, m[M_O], nq * o->DV, dt, h.o) || cli_download_i32(env, m[M_BI], rows_s, h.bi)) goto done;
    for (int i = 0; i < 3; ++i) {
        if (!m[M_LC + i]) continue;
        if (!(h.lse[i] = cli_malloc(nq * sizeof(float)))) goto done;
        if (cli_download_f32(env, m[M_LC + i], nq, CLNSA_DTYPE_F32, h.lse[i])) goto done;
    }
    for (int i = 0; i < D_N; ++i) {
        if (!m[M_D0 + i]) continue;
        if (!(h.d[i] = cli_malloc(nd[i] * sizeof(float)))) goto done;
        if (cli_download_f32(env, m[M_D0 + i], nd[i], dt, h.d[i])) goto done;
    }
    int pass = check(o, &h, dt, dt == CLNSA_DTYPE_F32 && device_warp_mode(env->ctx, dt) != WARP_OFF);
    rc = pass < 0 ? -1 : pass ? 0 : 1;
done:
    free(times);
    for (int i = 0; i < X_N; ++i) free(h.x[i]);
    free(h.o), free(h.bi), free(h.dO);
    for (int i = 0; i < 3; ++i) free(h.lse[i]);
    for (int i = 0; i < D_N; ++i) free(h.d[i]);
    for (int i = 0; i < M_N; ++i)
        if (m[i]) clReleaseMemObject(m[i]);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    /* The default shape is small (T=256, HQ=8): PoCL builds the kernels without
     * optimisation, and the default run (forward, backward and the reference
     * check) should take about 10 s on a 2-core CPU. */
    run_opts o = {1, 256, 8, 2, 64, 64, 32, 4, 64, 0, 0, 1, 2, 0, 5, 1, false, false, NULL};
    const cli_opt opts[] = {
        {"--device", OPT_STRING, &o.device, 0, 0, NULL, "P:D", "OpenCL platform:device (default: see clnsa devices)"},
        {"--B", OPT_INT, &o.B, 1, 65535, NULL, "N", "batch size (1)"},
        {"--T", OPT_INT, &o.T, 1, 1 << 30, NULL, "N", "sequence length (256)"},
        {"--HQ", OPT_INT, &o.HQ, 1, 65535, NULL, "N", "query heads (8)"},
        {"--H", OPT_INT, &o.H, 1, 65535, NULL, "N", "key/value heads, dividing HQ (2)"},
        {"--DK", OPT_INT, &o.DK, 8, 256, NULL, "N", "query/key head dim, a multiple of 8 (64)"},
        {"--DV", OPT_INT, &o.DV, 8, 256, NULL, "N", "value head dim, a multiple of 8 (64)"},
        {"--block-size", OPT_INT, &o.block_size, 1, 1 << 20, NULL, "N", "selection block (32)"},
        {"--block-count", OPT_INT, &o.block_count, 1, 1024, NULL, "N", "selected blocks per query (4)"},
        {"--window", OPT_INT, &o.window, 0, 1 << 30, NULL, "N", "sliding window, 0 = branch off (64)"},
        {"--cmp-block", OPT_INT, &o.cmp_block, 0, 1 << 20, NULL, "N", "compression block (block size)"},
        {"--cmp-stride", OPT_INT, &o.cmp_stride, 0, 1 << 20, NULL, "N", "compression stride (block size)"},
        {"--init-blocks", OPT_INT, &o.init_blocks, 0, 1 << 20, NULL, "N", "forced leading blocks (1)"},
        {"--local-blocks", OPT_INT, &o.local_blocks, 0, 1 << 20, NULL, "N", "forced blocks ending at the query's (2)"},
        {"--dtype", OPT_CHOICE, &o.dtype, 0, 0, "f32|f16|bf16", NULL, "storage type of the float tensors (f32)"},
        {"--repeat", OPT_INT, &o.repeat, 1, 100000, NULL, "N", "timed runs after one warm-up (5)"},
        {"--seed", OPT_INT, &o.seed, 0, 0x7fffffff, NULL, "N", "random seed (1)"},
        {"--no-check", OPT_FLAG, &o.no_check, 0, 0, NULL, NULL, "skip the check against the reference"},
        {"--no-bwd", OPT_FLAG, &o.no_bwd, 0, 0, NULL, NULL, "run, time and check the forward only"},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];
    bool seen[sizeof opts / sizeof opts[0]] = {false};
    int rc = cli_parse("run", argc, argv, 2, opts, nopts, seen);
    if (rc < 0) {
        printf("usage: clnsa run [options]\n"
               "Runs the NSA forward (compression, top-k, selection and sliding window, random gates)\n"
               "and then its backward (random output gradient) on random inputs, times each and checks\n"
               "o, lse, dq, dk, dv and the gate gradients against the double-precision reference\n"
               "(relative L2 within 1e-4 in f32, 2e-3 / 5e-3 in f32 in the TF32 mode (CLNSA_TF32=1 on\n"
               "the tensor-core path), 1e-2 (forward) / 2e-2 (backward) in f16 and bf16).\n"
               "The default shape is small (T=256, HQ=8) so that the run takes seconds on a CPU device.\n"
               "Exits non-zero on FAIL or any error.\n\n");
        cli_print_opts(stdout, opts, nopts);
        return CLI_OK;
    }
    if (rc) return rc;
    if (o.HQ % o.H) {
        fprintf(stderr, "clnsa run: --H %d must divide --HQ %d\n", o.H, o.HQ);
        return CLI_USAGE;
    }
    bool shape_given = false; /* --T or --HQ */
    for (size_t i = 0; i < nopts; ++i)
        if (seen[i] && (opts[i].dst == &o.T || opts[i].dst == &o.HQ)) shape_given = true;
    cli_env env;
    if (cli_open(&env, o.device)) return CLI_FAIL;
    const clnsa_dtype dt = cli_dtype_from_choice(o.dtype);
    const int l = o.cmp_block ? o.cmp_block : o.block_size, d = o.cmp_stride ? o.cmp_stride : o.block_size;
    printf("device %d:%d: %s (%s)\n", env.plat_index, env.dev_index, env.info->name, env.info->platform_name);
    printf("shape: B=%d T=%d HQ=%d H=%d DK=%d DV=%d dtype=%s%s\n", o.B, o.T, o.HQ, o.H, o.DK, o.DV,
           clnsa_dtype_name(dt),
           shape_given ? ""
                                         : " (small default shape, T and HQ reduced so that the run takes seconds on "
                                           "a CPU device; set --T, --HQ for more)");
    printf("nsa: block_size=%d block_count=%d window=%d cmp_block=%d cmp_stride=%d init_blocks=%d local_blocks=%d "
           "scale=%.6g; branches cmp+slc%s, top-k on the device\n",
           o.block_size, o.block_count, o.window, l, d, o.init_blocks, o.local_blocks, 1.0 / sqrt((double)o.DK),
           o.window > 0 ? "+swa" : "");
    fflush(stdout);
    rc = run(&o, &env);
    cli_close(&env);
    return rc == 0 ? CLI_OK : CLI_FAIL;
}
