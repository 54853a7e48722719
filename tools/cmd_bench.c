/* cmd_bench.c: `clnsa bench`, the NSA at a sweep of T in the anchor
 * configuration of ../shared/anchors (bf16, B = 1, HQ = 64, H = 4, D = 128,
 * 16 blocks of 64, window 512), forward and forward+backward, per branch and
 * in total, against our own dense causal attention (the block-sparse op with
 * no mask: flash-style, the same tile machinery) in the same run; and the
 * start-up time (context creation to the first result) with the program
 * cache off, cold and warm.
 *
 * Times are device times from OpenCL profiling events (cli_timer: from a
 * held-back command just before the op, behind a short busy kernel so that
 * the op has reached the device when it starts, to the op's last command), the median
 * of --repeat runs after a warm-up on each of the two sets the inputs rotate between,
 * so that caches do not flatter. Prints a table, and writes JSON (--json: the
 * medians, and the fastest and slowest run of each) and
 * an SVG plot of time against T per method (--svg).
 *
 * Methods: cmp (compressed branch only), topk+slc (top-k and selection),
 * slc (selection with given distinct random causal indices, in the order
 * drawn or, --sorted-indices, ascending), swa (sliding window
 * only), nsa (the three branches with top-k; the window only when --window >
 * 0), dense (causal, every key), clblast (dense causal attention in f32 from
 * CLBlast's GEMMs, forward and backward, where its scores fit:
 * bench_clblast.c). */
#include "bench_clblast.h"
#include "cli_common.h"
#include "cmds.h"
#include "tuning/tuning.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { M_CMP, M_TOPK, M_SLC, M_SWA, M_NSA, M_DENSE, M_CLBLAST, M_COUNT };
static const char *const method_names[M_COUNT] = {"cmp", "topk+slc", "slc", "swa", "nsa", "dense", "clblast"};

typedef struct {
    int HQ, H, D, window, repeat, dtype, S, block, keep_ds, chain;
    bool no_bwd, no_dense, no_startup, profile, recompute, sorted_idx;
    const char *Ts, *json, *svg, *device, *methods;
} bench_opts;

/* Inputs (two sets, rotated) and outputs at one T. */
typedef struct {
    cl_mem q, k, v, g, idx, dout;
} input_set;

typedef struct {
    cl_mem o, bi, lse[3], dq, dk, dv;
    cl_mem ob[3]; /* the NSA branch outputs a training forward saves (NULL: --recompute or --no-bwd) */
} output_set;

typedef struct {
    int T;
    double fwd[M_COUNT], bwd[M_COUNT]; /* ms, -1 = not run or failed */
    /* the fastest and slowest timed run of the forward and of the training
     * step (ms; -1: not recorded), so that a run unlike the others shows */
    double fwd_range[M_COUNT][2], step_range[M_COUNT][2];
} bench_row;

/* ---------------------------------------------------------------- buffers */

static void release(cl_mem *m, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if (m[i]) clReleaseMemObject(m[i]);
    memset(m, 0, n * sizeof *m);
}

/* Ascending block order, empty slots (-1) last: fla-org's NSA benchmark
 * sorts its random indices so, with the sequence length as the empty mark. */
static int block_ascending(const void *a, const void *b)
{
    const uint32_t x = (uint32_t)(*(const int32_t *)a), y = (uint32_t)(*(const int32_t *)b);
    return (x > y) - (x < y);
}

static int make_inputs(const cli_env *env, const bench_opts *o, int T, clnsa_dtype dt, uint64_t seed, input_set *s)
{
    memset(s, 0, sizeof *s);
    const size_t nq = (size_t)T * o->HQ, nk = (size_t)T * o->H;
    int32_t *idx = cli_malloc(nk * (size_t)o->S * sizeof *idx);
    if (!idx) return -1;
    for (size_t r = 0; r < nk; ++r) { /* distinct random causal blocks for the selection-only timing */
        int32_t *row = idx + r * o->S;
        cli_causal_selection(row, o->S, (int)(r / (size_t)o->H), o->block, 0, 0, &seed);
        if (o->sorted_idx) qsort(row, (size_t)o->S, sizeof *row, block_ascending);
    }
    const bool ok = (s->q = cli_random(env, nq * o->D, -1, 1, dt, &seed)) && (s->k = cli_random(env, nk * o->D, -1, 1, dt, &seed)) &&
                    (s->v = cli_random(env, nk * o->D, -1, 1, dt, &seed)) && (s->g = cli_random(env, nq, 0, 1, dt, &seed)) &&
                    (s->dout = cli_random(env, nq * o->D, -1, 1, dt, &seed)) && (s->idx = cli_upload_i32(env, idx, nk * o->S));
    free(idx);
    if (!ok) release(&s->q, sizeof *s / sizeof(cl_mem));
    return ok ? 0 : -1;
}

static int make_outputs(const cli_env *env, const bench_opts *o, int T, clnsa_dtype dt, output_set *s)
{
    memset(s, 0, sizeof *s);
    const size_t nq = (size_t)T * o->HQ, nk = (size_t)T * o->H, es = clnsa_dtype_size(dt);
    bool ok = (s->o = cli_buffer(env, nq * o->D * es, NULL)) && (s->bi = cli_buffer(env, nk * o->S * 4, NULL)) &&
              (s->dq = cli_buffer(env, nq * o->D * es, NULL)) && (s->dk = cli_buffer(env, nk * o->D * es, NULL)) &&
              (s->dv = cli_buffer(env, nk * o->D * es, NULL));
    for (int i = 0; ok && i < 3; ++i) ok = (s->lse[i] = cli_buffer(env, nq * 4, NULL)) != NULL;
    for (int i = 0; ok && !o->no_bwd && !o->recompute && i < 3; ++i) ok = (s->ob[i] = cli_buffer(env, nq * o->D * es, NULL)) != NULL;
    if (!ok) release(&s->o, sizeof *s / sizeof(cl_mem));
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------ one method */

/* The calls of one method on one input set. */
typedef struct {
    bool dense;
    clnsa_nsa_config cfg;
    clnsa_nsa_inputs in;
    clnsa_nsa_outputs out, out_train; /* out_train: out and the saved branch outputs */
    clnsa_nsa_grads gr;
    clnsa_tensor dout;
    clnsa_blocksparse_config bcfg;
    clnsa_blocksparse_inputs bin;
    clnsa_blocksparse_outputs bout;
    clnsa_blocksparse_grad_inputs bgin;
    clnsa_blocksparse_grads bgr;
} method_call;

static void describe(const bench_opts *o, int T, clnsa_dtype dt, int m, const input_set *s, const output_set *os,
                     method_call *c)
{
    memset(c, 0, sizeof *c);
    const int64_t HQ = o->HQ, H = o->H, D = o->D;
    const clnsa_tensor q = cli_t4(s->q, dt, 1, T, HQ, D), k = cli_t4(s->k, dt, 1, T, H, D), v = cli_t4(s->v, dt, 1, T, H, D);
    c->dout = cli_t4(s->dout, dt, 1, T, HQ, D);
    const clnsa_tensor o_t = cli_t4(os->o, dt, 1, T, HQ, D), dq = cli_t4(os->dq, dt, 1, T, HQ, D);
    const clnsa_tensor dk = cli_t4(os->dk, dt, 1, T, H, D), dv = cli_t4(os->dv, dt, 1, T, H, D);
    if (m == M_DENSE) {
        c->dense = true;
        clnsa_blocksparse_config_init(&c->bcfg);
        c->bcfg.causal = 1;
        c->bin = (clnsa_blocksparse_inputs){.q = q, .k = k, .v = v};
        c->bout = (clnsa_blocksparse_outputs){o_t, cli_t3(os->lse[0], CLNSA_DTYPE_F32, 1, T, HQ)};
        c->bgin = (clnsa_blocksparse_grad_inputs){c->bout.o, c->bout.lse, c->dout};
        c->bgr = (clnsa_blocksparse_grads){.dq = dq, .dk = dk, .dv = dv};
        return;
    }
    clnsa_nsa_config_init(&c->cfg);
    c->cfg.block_size = c->cfg.cmp_block = c->cfg.cmp_stride = o->block;
    c->cfg.block_count = o->S;
    c->cfg.window = (m == M_SWA || m == M_NSA) ? o->window : 0;
    c->cfg.keep_ds = o->keep_ds;
    c->in.q = q;
    c->in.k = k;
    c->in.v = v;
    const clnsa_tensor g = cli_t3(s->g, dt, 1, T, HQ);
    if (m == M_CMP || m == M_NSA) c->in.g_cmp = g;
    if (m == M_TOPK || m == M_SLC || m == M_NSA) c->in.g_slc = g;
    if (c->cfg.window > 0) c->in.g_swa = g;
    if (m == M_SLC) c->in.block_indices = cli_t4(s->idx, CLNSA_DTYPE_I32, 1, T, H, o->S);
    c->out.o = o_t;
    c->out.block_indices = cli_t4(os->bi, CLNSA_DTYPE_I32, 1, T, H, o->S);
    clnsa_tensor *lse[3] = {&c->out.lse_cmp, &c->out.lse_slc, &c->out.lse_swa};
    for (int i = 0; i < 3; ++i) *lse[i] = cli_t3(os->lse[i], CLNSA_DTYPE_F32, 1, T, HQ);
    c->out_train = c->out;
    const bool on[3] = {c->in.g_cmp.data != NULL, c->in.g_slc.data != NULL, c->in.g_swa.data != NULL};
    clnsa_tensor *ob[3] = {&c->out_train.o_cmp, &c->out_train.o_slc, &c->out_train.o_swa};
    for (int i = 0; i < 3; ++i)
        if (on[i] && os->ob[i]) *ob[i] = cli_t4(os->ob[i], dt, 1, T, HQ, D);
    c->gr.dq = dq;
    c->gr.dk = dk;
    c->gr.dv = dv;
}

static clnsa_status workspace_size(const cli_env *env, method_call *c, bool bwd, size_t *bytes)
{
    size_t f = 0, b = 0;
    clnsa_status st = c->dense ? clnsa_blocksparse_forward_workspace_size(env->ctx, &c->bcfg, &c->bin, &c->bout, &f)
                               : clnsa_nsa_forward_workspace_size(env->ctx, env->queue, &c->cfg, &c->in, &c->out, &f);
    if (st == CLNSA_SUCCESS && bwd)
        st = c->dense ? clnsa_blocksparse_backward_workspace_size(env->ctx, &c->bcfg, &c->bin, &c->bgin, &c->bgr, &b)
                      : clnsa_nsa_backward_workspace_size(env->ctx, env->queue, &c->cfg, &c->in, &c->out_train, &c->dout,
                                                          &c->gr, &b);
    *bytes = f > b ? f : b;
    return st;
}

/* The passes of a timed run: the forward as inference runs it, the forward
 * as training runs it (saving what the backward reads), the backward. */
enum { P_FWD, P_TRAIN_FWD, P_BWD, P_COUNT };

static clnsa_status enqueue(const cli_env *env, method_call *c, int pass, cl_mem ws, size_t bytes, cl_event after,
                            cl_event *done)
{
    const bool bwd = pass == P_BWD;
    if (c->dense && bwd)
        return clnsa_blocksparse_backward(env->ctx, env->queue, &c->bcfg, &c->bin, &c->bgin, &c->bgr, ws, bytes, 1, &after,
                                          done);
    if (c->dense)
        return clnsa_blocksparse_forward(env->ctx, env->queue, &c->bcfg, &c->bin, &c->bout, ws, bytes, 1, &after, done);
    if (bwd)
        return clnsa_nsa_backward(env->ctx, env->queue, &c->cfg, &c->in, &c->out_train, &c->dout, &c->gr, ws, bytes, 1,
                                  &after, done);
    return clnsa_nsa_forward(env->ctx, env->queue, &c->cfg, &c->in, pass == P_TRAIN_FWD ? &c->out_train : &c->out, ws,
                             bytes, 1, &after, done);
}

/* A timed run: the op `chain` times back to back, each waiting for the one
 * before, the input sets alternating from run `it`'s (--chain: the rate
 * of a loop that keeps the device busy, where clocks settle where the
 * device's power lets them). *done: the last one's event. */
static clnsa_status enqueue_chain(const cli_env *env, const bench_opts *o, int T, clnsa_dtype dt, int m,
                                  const input_set sets[2], const output_set *os, method_call *c, int pass, int it,
                                  cl_mem ws, size_t bytes, cl_event after, cl_event *done)
{
    clnsa_status st = CLNSA_SUCCESS;
    *done = NULL;
    for (int k = 0; k < o->chain && st == CLNSA_SUCCESS; ++k) {
        cl_event next = NULL;
        describe(o, T, dt, m, &sets[(it + 2 + k) % 2], os, c);
        st = enqueue(env, c, pass, ws, bytes, *done ? *done : after, &next);
        if (*done) clReleaseEvent(*done);
        *done = next;
    }
    return st;
}

/* One more run of the op with every kernel's event kept: prints each
 * kernel's device time (summed over its launches) on one line. */
static void profile_once(const cli_env *env, method_call *c, int pass, cl_mem ws, size_t bytes, const char *method, int T)
{
    tune_hook h = {.ctx = env->ctx, .family = -1, .capture = "*"};
    cl_event done = NULL, start;
    cl_int err;
    start = clCreateUserEvent(env->cl, &err);
    if (err != CL_SUCCESS) return;
    tune_hook_set(&h);
    const clnsa_status st = enqueue(env, c, pass, ws, bytes, start, &done);
    tune_hook_set(NULL);
    clSetUserEventStatus(start, CL_COMPLETE);
    clReleaseEvent(start);
    if (st == CLNSA_SUCCESS && done) clWaitForEvents(1, &done);
    if (done) clReleaseEvent(done);
    const char *names[PLAN_MAX_STEPS];
    double ms[PLAN_MAX_STEPS], each[PLAN_MAX_STEPS];
    int n = 0, launches[PLAN_MAX_STEPS], kernel_of[PLAN_MAX_STEPS];
    cl_ulong span0 = 0, span1 = 0; /* the first start and the last end of the op's kernels */
    double busy = 0;
    for (int i = 0; i < h.nevents; ++i) {
        cl_ulong t0 = 0, t1 = 0;
        clGetEventProfilingInfo(h.events[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        clGetEventProfilingInfo(h.events[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        clReleaseEvent(h.events[i]);
        if (i == 0 || t0 < span0) span0 = t0;
        if (t1 > span1) span1 = t1;
        int k = 0;
        while (k < n && strcmp(names[k], h.event_kernels[i]) != 0) ++k;
        if (k == n) names[n] = h.event_kernels[i], ms[n] = 0, launches[n++] = 0;
        each[i] = t1 > t0 ? (double)(t1 - t0) * 1e-6 : 0;
        busy += each[i];
        kernel_of[i] = k;
        ms[k] += each[i];
        ++launches[k];
    }
    static const char *const pass_names[P_COUNT] = {"fwd", "training fwd", "bwd"};
    printf("  profile %s %s T=%d (ms):", method, pass_names[pass], T);
    for (int k = 0; k < n; ++k) {
        printf(" %s %.3f", names[k], ms[k]);
        if (launches[k] < 2) continue;
        /* a kernel launched more than once (a pass per branch): each
         * launch in order, to tell them apart */
        for (int i = 0, first = 1; i < h.nevents; ++i)
            if (kernel_of[i] == k) printf("%s%.3f", first ? " [" : " + ", each[i]), first = 0;
        printf("]");
    }
    /* the device's idle time between the kernels (launch gaps), where there are several */
    if (h.nevents > 1 && span1 > span0) printf(" (gaps %.3f)", (double)(span1 - span0) * 1e-6 - busy);
    printf("\n");
}

/* Runs `np` passes in turn, repeat times after two warm-ups (one a set:
 * the first builds the programs, and each set's first use pays for moving
 * its buffers to the device, which NVIDIA's driver does lazily: 0.24 s at
 * 64k on an H200, and with one warm-up a median of two took that run),
 * each pass timed apart: ms[i][it]. Returns the runs completed. */
static int timed_runs(const cli_env *env, const bench_opts *o, int T, clnsa_dtype dt, int m, const input_set sets[2],
                      const output_set *os, method_call *c, const int *passes, int np, cl_mem ws, size_t bytes,
                      double (*ms)[64])
{
    for (int it = -2; it < o->repeat; ++it)
        for (int i = 0; i < np; ++i) {
            cli_timer t;
            cl_event done = NULL;
            if (cli_timer_begin(env, &t)) return it;
            const clnsa_status st = enqueue_chain(env, o, T, dt, m, sets, os, c, passes[i], it, ws, bytes, t.marker, &done);
            if (st != CLNSA_SUCCESS) {
                cli_timer_end(&t, NULL);
                if (done) clReleaseEvent(done);
                cli_report(env, method_names[m], st);
                return it;
            }
            const double x = cli_timer_end(&t, done) / o->chain;
            clReleaseEvent(done);
            if (x < 0) return it;
            if (it >= 0) ms[i][it] = x;
        }
    return o->repeat;
}

/* Median forward and backward ms of one method at one T, and the range of
 * the forward's and the training step's runs; -1 where not asked
 * or failed. The inference forward's runs come first, back to back, as
 * bench/sdpa.py times SDPA's, so that both forwards are timed alike (each
 * used to follow a backward here); then the training steps (with the
 * backward): the training forward, which also saves the NSA branch outputs
 * unless --recompute, and the backward that reads them, each run of the
 * step its sum. bwd_ms is the step's median less the forward's, so that
 * fwd + bwd is the training step. The dense method's forward saves all its
 * backward needs: its step is the forward and the backward. */
static void time_method(const cli_env *env, const bench_opts *o, int T, clnsa_dtype dt, int m, const input_set sets[2],
                        const output_set *os, double *fwd_ms, double *bwd_ms, double fwd_range[2],
                        double step_range[2])
{
    const bool bwd = !o->no_bwd;
    double fwd[1][64], train[2][64];
    *fwd_ms = *bwd_ms = -1;
    method_call c;
    describe(o, T, dt, m, &sets[0], os, &c);
    size_t bytes = 0;
    if (workspace_size(env, &c, bwd, &bytes) != CLNSA_SUCCESS) {
        cli_report(env, method_names[m], CLNSA_ERROR_INVALID_ARGUMENT);
        return;
    }
    cl_mem ws = cli_buffer(env, bytes, NULL);
    if (!ws) return;
    const int fwd_pass[1] = {P_FWD}, step_passes[2] = {c.dense ? P_FWD : P_TRAIN_FWD, P_BWD};
    bool ok = timed_runs(env, o, T, dt, m, sets, os, &c, fwd_pass, 1, ws, bytes, fwd) == o->repeat;
    if (ok && bwd) ok = timed_runs(env, o, T, dt, m, sets, os, &c, step_passes, 2, ws, bytes, train) == o->repeat;
    if (ok && o->profile)
        for (int pass = 0; pass < (bwd ? P_COUNT : 1); ++pass)
            if (pass != P_TRAIN_FWD || !c.dense) profile_once(env, &c, pass, ws, bytes, method_names[m], T);
    clReleaseMemObject(ws);
    if (!ok) return;
    const int runs = o->repeat;
    double step[64]; /* the training step of each run */
    for (int i = 0; bwd && i < runs; ++i) step[i] = train[0][i] + train[1][i];
    /* cli_median sorts: the extremes are then the first and last */
    *fwd_ms = cli_median(fwd[0], (size_t)runs);
    fwd_range[0] = fwd[0][0], fwd_range[1] = fwd[0][runs - 1];
    if (bwd) {
        *bwd_ms = cli_median(step, (size_t)runs) - *fwd_ms;
        step_range[0] = step[0], step_range[1] = step[runs - 1];
    }
}

/* --------------------------------------------------------------- start-up */

typedef struct {
    double off_ms, cold_ms, warm_ms;
    int programs;
} startup_result;

/* One start-up on a fresh cl_context: context creation to the first NSA
 * forward's result (T = 1024, all branches with top-k); -1 on failure. */
static double startup_once(const cli_env *env, const bench_opts *o, clnsa_dtype dt, const char *cache_dir)
{
    const int T = 1024;
    cl_int err;
    cli_env e = *env;
    e.cl = clCreateContext(NULL, 1, &env->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return -1;
    e.queue = clCreateCommandQueue(e.cl, env->device, 0, &err);
    e.ctx = NULL;
    input_set s;
    output_set os;
    double ms = -1;
    bool have_in = false, have_out = false;
    if (err == CL_SUCCESS && !(have_in = make_inputs(&e, o, T, dt, 7, &s) == 0)) goto done;
    if (err != CL_SUCCESS || !(have_out = make_outputs(&e, o, T, dt, &os) == 0)) goto done;
    clFinish(e.queue);
    const double t0 = cli_now_ms();
    clnsa_context_options opt = {0};
    opt.cache_dir = cache_dir;
    char msg[256];
    if (clnsa_context_create(e.cl, e.device, &opt, &e.ctx, msg, sizeof msg) != CLNSA_SUCCESS) {
        fprintf(stderr, "clnsa bench: start-up: %s\n", msg);
        goto done;
    }
    method_call c;
    describe(o, T, dt, M_NSA, &s, &os, &c);
    size_t bytes = 0;
    cl_mem ws = NULL;
    cl_event after = NULL, done_ev = NULL;
    if (workspace_size(&e, &c, false, &bytes) == CLNSA_SUCCESS && (ws = cli_buffer(&e, bytes, NULL)) &&
        clEnqueueMarkerWithWaitList(e.queue, 0, NULL, &after) == CL_SUCCESS &&
        enqueue(&e, &c, false, ws, bytes, after, &done_ev) == CLNSA_SUCCESS && clWaitForEvents(1, &done_ev) == CL_SUCCESS)
        ms = cli_now_ms() - t0;
    else
        cli_report(&e, "start-up", CLNSA_ERROR_OPENCL);
    if (after) clReleaseEvent(after);
    if (done_ev) clReleaseEvent(done_ev);
    if (ws) clReleaseMemObject(ws);
done:
    if (e.ctx) clnsa_context_destroy(e.ctx);
    if (have_in) release(&s.q, sizeof s / sizeof(cl_mem));
    if (have_out) release(&os.o, sizeof os / sizeof(cl_mem));
    if (e.queue) clReleaseCommandQueue(e.queue);
    clReleaseContext(e.cl);
    return ms;
}

static int count_programs(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls %s/*.clbin 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = 0;
        pclose(p);
    }
    return n;
}

/* Off (CLNSA_CACHE=0), cold (an empty folder), warm (the folder the cold
 * run filled): medians of 3, the cold run once. */
static void startup(const cli_env *env, const bench_opts *o, clnsa_dtype dt, startup_result *r)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/clnsa-bench-XXXXXX");
    r->off_ms = r->cold_ms = r->warm_ms = -1;
    if (!mkdtemp(dir)) return;
    double off[3], warm[3];
    setenv("CLNSA_CACHE", "0", 1);
    for (int i = 0; i < 3; ++i) off[i] = startup_once(env, o, dt, dir);
    unsetenv("CLNSA_CACHE");
    r->cold_ms = startup_once(env, o, dt, dir);
    r->programs = count_programs(dir);
    for (int i = 0; i < 3; ++i) warm[i] = startup_once(env, o, dt, dir);
    r->off_ms = cli_median(off, 3);
    r->warm_ms = cli_median(warm, 3);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "clnsa bench: could not remove %s\n", dir);
}

/* ------------------------------------------------------------------ output */

static void write_json(const char *path, const cli_env *env, const bench_opts *o, clnsa_dtype dt, const bench_row *rows,
                       int n, const startup_result *su)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "clnsa bench: %s: cannot write\n", path);
        return;
    }
    const clnsa_device_info *di = env->info;
    /* the path the methods take for the dtype where their shapes allow it */
    const warp_mode wm = device_warp_mode(env->ctx, dt);
    fprintf(f, "{\n  \"device\": \"%s\", \"platform\": \"%s\", \"driver\": \"%s\", \"clnsa\": \"%s\", \"path\": \"%s\",\n",
            di->name, di->platform_name, di->driver_version, clnsa_version(),
            wm == WARP_OFF ? "portable" : dt == CLNSA_DTYPE_F32 ? (wm == WARP_NV ? "tensor cores, TF32" : "emulated, TF32")
            : wm == WARP_NV ? "tensor cores" : "emulated");
    fprintf(f, "  \"config\": {\"dtype\": \"%s\", \"B\": 1, \"HQ\": %d, \"H\": %d, \"D\": %d, \"block\": %d, \"S\": %d, "
               "\"window\": %d, \"repeat\": %d, \"chain\": %d, \"slc_indices\": \"%s\"},\n",
            clnsa_dtype_name(dt), o->HQ, o->H, o->D, o->block, o->S, o->window, o->repeat, o->chain,
            o->sorted_idx ? "ascending" : "drawn order");
    if (su) fprintf(f, "  \"startup_ms\": {\"off\": %.2f, \"cold\": %.2f, \"warm\": %.2f, \"programs\": %d},\n", su->off_ms,
                    su->cold_ms, su->warm_ms, su->programs);
    fprintf(f, "  \"results\": [");
    int k = 0;
    for (int i = 0; i < n; ++i)
        for (int m = 0; m < M_COUNT; ++m) {
            const double fw = rows[i].fwd[m], bw = rows[i].bwd[m];
            if (fw < 0) continue;
            fprintf(f, "%s\n    {\"T\": %d, \"method\": \"%s\", \"fwd_ms\": %.4f", k++ ? "," : "", rows[i].T, method_names[m], fw);
            const double *fr = rows[i].fwd_range[m], *sr = rows[i].step_range[m];
            if (fr[0] >= 0) fprintf(f, ", \"fwd_range_ms\": [%.4f, %.4f]", fr[0], fr[1]);
            if (bw >= 0) fprintf(f, ", \"bwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f", bw, fw + bw);
            if (bw >= 0 && sr[0] >= 0) fprintf(f, ", \"fwd_bwd_range_ms\": [%.4f, %.4f]", sr[0], sr[1]);
            fputc('}', f);
        }
    fprintf(f, "\n  ]\n}\n");
    fclose(f);
}

/* Time against T on log-log axes, one colour per method: forward solid,
 * forward+backward dashed. */
static void write_svg(const char *path, const cli_env *env, const bench_row *rows, int n)
{
    static const char *const colour[M_COUNT] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#444444", "#8c564b"};
    const double W = 720, Hh = 480, L = 70, R = 150, Tp = 40, Bm = 50;
    double tmin = 1e300, tmax = 0, ymin = 1e300, ymax = 0;
    for (int i = 0; i < n; ++i)
        for (int m = 0; m < M_COUNT; ++m) {
            const double v[2] = {rows[i].fwd[m], rows[i].fwd[m] + rows[i].bwd[m]};
            for (int k = 0; k < 2; ++k)
                if (rows[i].fwd[m] > 0 && (k == 0 || rows[i].bwd[m] > 0)) ymin = fmin(ymin, v[k]), ymax = fmax(ymax, v[k]);
            tmin = fmin(tmin, rows[i].T);
            tmax = fmax(tmax, rows[i].T);
        }
    if (ymax <= 0) return;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "clnsa bench: %s: cannot write\n", path);
        return;
    }
    const double lx0 = log10(tmin), lx1 = log10(tmax) + (tmax > tmin ? 0 : 1), ly0 = floor(log10(ymin)), ly1 = ceil(log10(ymax)) + (ymax > ymin ? 0 : 1);
#define PX(T) (L + (log10(T) - lx0) / (lx1 - lx0) * (W - L - R))
#define PY(y) (Hh - Bm - (log10(y) - ly0) / (ly1 - ly0) * (Hh - Tp - Bm))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, Hh);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"20\">clnsa bench on %s: ms vs T "
               "(solid: forward, dashed: forward+backward)</text>\n", L, env->info->name);
    for (double e = ly0; e <= ly1; e += 1)
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                   "text-anchor=\"end\">%g</text>\n", L, W - R, PY(pow(10, e)), PY(pow(10, e)), L - 6, PY(pow(10, e)) + 4, pow(10, e));
    for (int i = 0; i < n; ++i)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%dk</text>\n", PX(rows[i].T), Hh - Bm + 18, rows[i].T / 1024);
    for (int m = 0; m < M_COUNT; ++m)
        for (int k = 0; k < 2; ++k) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", colour[m],
                    k ? " stroke-dasharray=\"6,4\"" : "");
            for (int i = 0; i < n; ++i) {
                const double y = k ? rows[i].fwd[m] + rows[i].bwd[m] : rows[i].fwd[m];
                if (rows[i].fwd[m] > 0 && (k == 0 || rows[i].bwd[m] > 0)) fprintf(f, "%.1f,%.1f ", PX(rows[i].T), PY(y));
            }
            fprintf(f, "\"/>\n");
        }
    for (int m = 0; m < M_COUNT; ++m)
        fprintf(f, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/><text x=\"%.0f\" "
                   "y=\"%d\">%s</text>\n", W - R + 15, W - R + 40, 60 + 20 * m, 60 + 20 * m, colour[m], W - R + 46, 64 + 20 * m,
                method_names[m]);
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    fclose(f);
}

/* ----------------------------------------------------------------- command */

int cmd_bench(int argc, char **argv)
{
    bench_opts o = {64, 4, 128, 512, 5, 2, 16, 64, CLNSA_KEEP_DS_SELECTED | CLNSA_KEEP_DS_COMPRESSED, 1, false, false, false, false, false, false, "4096,8192,16384,32768,65536", NULL, NULL, NULL, NULL};
    const cli_opt opts[] = {
        {"--T", OPT_STRING, &o.Ts, 0, 0, NULL, "LIST", "tokens, comma-separated (default 4096,8192,16384,32768,65536)"},
        {"--HQ", OPT_INT, &o.HQ, 1, 1024, NULL, "N", "query heads (default 64)"},
        {"--H", OPT_INT, &o.H, 1, 1024, NULL, "N", "KV heads (default 4)"},
        {"--D", OPT_INT, &o.D, 8, 256, NULL, "N", "head dim (default 128)"},
        {"--block", OPT_INT, &o.block, 1, 4096, NULL, "N", "selection = compression block and stride (default 64)"},
        {"--S", OPT_INT, &o.S, 1, 256, NULL, "N", "selected blocks per query (default 16)"},
        {"--window", OPT_INT, &o.window, 0, 1 << 20, NULL, "N", "sliding window of the nsa method, 0 = off (default 512)"},
        {"--dtype", OPT_CHOICE, &o.dtype, 0, 0, "f32|f16|bf16", NULL, "storage dtype (default bf16)"},
        {"--repeat", OPT_INT, &o.repeat, 1, 64, NULL, "N", "timed runs after a warm-up on each input set, median taken (default 5)"},
        {"--chain", OPT_INT, &o.chain, 1, 1000, NULL, "N",
         "each timed run enqueues the op N times back to back and counts the mean: the device kept busy, as a loop keeps it (default 1; not the clblast method)"},
        {"--keep-ds", OPT_INT, &o.keep_ds, 0, 3, NULL, "0-3",
         "branches whose dS the NSA backward keeps for dq: 1 selected, 2 compressed, 3 both (config.keep_ds, default 3)"},
        {"--sorted-indices", OPT_FLAG, &o.sorted_idx, 0, 0, NULL, NULL,
         "the slc method's random blocks of each row in ascending order, as fla-org's NSA benchmark gives them (default: in the order drawn)"},
        {"--no-bwd", OPT_FLAG, &o.no_bwd, 0, 0, NULL, NULL, "forward only"},
        {"--recompute", OPT_FLAG, &o.recompute, 0, 0, NULL, NULL,
         "the NSA backward recomputes the branch outputs instead of reading the training forward's saved ones"},
        {"--no-dense", OPT_FLAG, &o.no_dense, 0, 0, NULL, NULL, "skip the dense causal baselines (dense, clblast)"},
        {"--no-startup", OPT_FLAG, &o.no_startup, 0, 0, NULL, NULL, "skip the start-up timing"},
        {"--profile", OPT_FLAG, &o.profile, 0, 0, NULL, NULL, "after each method's timing, one more run: the time of each kernel (of each launch, in brackets, where it runs more than once) and the idle gaps between them"},
        {"--methods", OPT_STRING, &o.methods, 0, 0, NULL, "LIST", "methods to time, comma-separated (default all: cmp,topk+slc,slc,swa,nsa,dense,clblast)"},
        {"--json", OPT_STRING, &o.json, 0, 0, NULL, "FILE", "write the results as JSON"},
        {"--svg", OPT_STRING, &o.svg, 0, 0, NULL, "FILE", "write a plot of ms against T per method"},
        {"--device", OPT_STRING, &o.device, 0, 0, NULL, "P:D", "device (default: as clnsa run)"},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];
    int rc = cli_parse("bench", argc, argv, 2, opts, nopts, NULL);
    if (rc < 0) {
        printf("usage: clnsa bench [options]\n\nTimes the NSA (per branch and in total, forward and backward) and a dense\n"
               "causal attention at a sweep of T, and the start-up with the program cache off, cold and warm.\n\n");
        cli_print_opts(stdout, opts, nopts);
        return CLI_OK;
    }
    if (rc) return rc;
    int Ts[16];
    const int nT = cli_parse_int_list("bench", "--T", o.Ts, 1, 1 << 24, Ts, 16);
    if (nT < 0) return CLI_USAGE;
    bool run[M_COUNT];
    for (int m = 0; m < M_COUNT; ++m) {
        const size_t n = strlen(method_names[m]);
        const char *p = o.methods;
        while (p && (p = strstr(p, method_names[m])) && ((p != o.methods && p[-1] != ',') || (p[n] != ',' && p[n] != '\0'))) p += n;
        run[m] = (!o.methods || p) && !((m == M_DENSE || m == M_CLBLAST) && o.no_dense) && !(m == M_SWA && o.window == 0);
    }
    const clnsa_dtype dt = cli_dtype_from_choice(o.dtype);
    cli_env env;
    if (cli_open(&env, o.device)) return CLI_FAIL;
    const clnsa_device_info *di = env.info;
    printf("device: %s (%s, driver %s); %s, B=1 HQ=%d H=%d D=%d, %d blocks of %d, window %d; median of %d", di->name,
           di->platform_name, di->driver_version, clnsa_dtype_name(dt), o.HQ, o.H, o.D, o.S, o.block, o.window, o.repeat);
    if (o.chain > 1) printf(", each the mean of %d back to back", o.chain);
    printf("\n");
    startup_result su = {-1, -1, -1, 0};
    if (!o.no_startup) {
        startup(&env, &o, dt, &su);
        printf("start-up to the first NSA forward (T=1024): cache off %.1f ms, cold %.1f ms (%d programs written), warm %.1f ms\n",
               su.off_ms, su.cold_ms, su.programs, su.warm_ms);
    }
    printf("%8s", "T");
    for (int m = 0; m < M_COUNT; ++m)
        if (run[m]) printf(" %10s %10s", method_names[m], "+bwd");
    printf("  (ms; +bwd = forward+backward)\n");
    bench_row rows[16];
    int failed = 0;
    for (int i = 0; i < nT; ++i) {
        bench_row *r = &rows[i];
        r->T = Ts[i];
        input_set sets[2];
        output_set os;
        if (make_inputs(&env, &o, r->T, dt, 1, &sets[0]) || make_inputs(&env, &o, r->T, dt, 2, &sets[1]) ||
            make_outputs(&env, &o, r->T, dt, &os)) {
            cli_close(&env);
            return CLI_FAIL;
        }
        bool no_room[M_COUNT] = {false};
        for (int m = 0; m < M_COUNT; ++m) { /* --profile prints its lines here, before the row */
            r->fwd[m] = r->bwd[m] = -1;
            r->fwd_range[m][0] = r->fwd_range[m][1] = r->step_range[m][0] = r->step_range[m][1] = -1;
            if (!run[m]) continue;
            no_room[m] = m == M_CLBLAST && !clblast_dense_fits(&env, r->T); /* not counted as a failure */
            if (no_room[m]) continue;
            if (m == M_CLBLAST)
                clblast_dense_ms(&env, r->T, o.HQ, o.H, o.D, o.repeat, &r->fwd[m], o.no_bwd ? NULL : &r->bwd[m]);
            else
                time_method(&env, &o, r->T, dt, m, sets, &os, &r->fwd[m], &r->bwd[m], r->fwd_range[m], r->step_range[m]);
            failed += r->fwd[m] < 0 || (m == M_CLBLAST && !o.no_bwd && r->bwd[m] < 0);
        }
        printf("%8d", r->T);
        for (int m = 0; m < M_COUNT; ++m) {
            if (!run[m]) continue;
            if (no_room[m]) printf(" %10s", "no room");
            else printf(" %10.3f", r->fwd[m]);
            if (r->bwd[m] >= 0) printf(" %10.3f", r->fwd[m] + r->bwd[m]);
            else printf(" %10s", "-");
        }
        printf("\n");
        fflush(stdout);
        for (int s = 0; s < 2; ++s) release(&sets[s].q, sizeof sets[s] / sizeof(cl_mem));
        release(&os.o, sizeof os / sizeof(cl_mem));
    }
    if (o.json) write_json(o.json, &env, &o, dt, rows, nT, o.no_startup ? NULL : &su);
    if (o.svg) write_svg(o.svg, &env, rows, nT);
    cli_close(&env);
    return failed ? CLI_FAIL : CLI_OK;
}
