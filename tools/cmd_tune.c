/* cmd_tune.c: `clnsa tune`, the search of a kernel family's parameters for a
 * device and a shape class.
 *
 * Per family: the candidates are the product of the family's values
 * (src/tuning/params.c), less those that do not fit the device (dropped
 * before anything is compiled), all of them when they are few, else a seeded
 * random sample; the safe default always comes first, as the baseline.
 * Background threads build the candidates' programs (the tuning hook's
 * build-only mode) while the main thread checks and times the ones already
 * built. Each candidate's output is compared with the safe default's before
 * it is timed: the check runs with f32 storage (the arithmetic is f32 in
 * every dtype; in f16/bf16 one rounding flip would be above any useful
 * threshold), on the same shape at --verify-T tokens, and must be bitwise
 * equal or within 1e-5 relative L2 (the selected blocks: equal sets), so a
 * wrong but fast candidate is never chosen. Times are the median over
 * --repeat runs of the family's kernel alone, from OpenCL profiling events.
 * With several lengths (--T 8192,65536) a candidate is timed at each, and
 * its time is the safe default's summed over them times the candidate's
 * mean ratio to the safe default's time at each (weighted_ms): every
 * length counts alike, however long its runs. The result is a tuning file
 * the library reads as it is (CLNSA_TUNING_FILE, or tuning/ through
 * --merge). */
#include "cli_common.h"
#include "cmds.h"
#include "tune_common.h"
#include "ops/nsa.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tune_op.h"

/* ---------------------------------------------------------- candidates */

enum { C_PENDING, C_BUILDING, C_BUILT, C_BUILD_FAILED };
enum { V_UNTESTED, V_OK, V_WRONG, V_RUN_FAILED, V_SKIPPED };

typedef struct {
    int v[TUNE_MAX_PARAMS];
    int state, verdict;
    double ms, err;
    double ms_at[TUNE_MAX_T]; /* the median at each timed length; ms weighs them (weighted_ms) */
    char why[200];
} candidate;

/* The time of a candidate timed at n lengths (ms_at) against the safe
 * default's times there (base_at): the default's sum times the mean of the
 * ratios, so that the default's is its own sum and one length is its time.
 * (A length where the default's kernel read 0 ms counts as a tie.) */
static double weighted_ms(const double *ms_at, const double *base_at, int n)
{
    double sum = 0, ratio = 0;
    for (int i = 0; i < n; ++i) {
        sum += base_at[i];
        ratio += base_at[i] > 0 ? ms_at[i] / base_at[i] : 1.0;
    }
    return n == 1 ? ms_at[0] : sum * ratio / n;
}

static bool same_values(const int *a, const int *b, int n)
{
    for (int i = 0; i < n; ++i)
        if (a[i] != b[i]) return false;
    return true;
}

/* Every combination of the values of f (the family's, or dispatch_values')
 * that fits (head tiles clamped to G, duplicates removed), the safe default
 * first; a seeded random sample of `budget` when there are more. *unfit
 * counts the dropped ones. */
static candidate *make_candidates(const clnsa_device_info *info, int family, const tune_family *f, const tune_problem *pb,
                                  const int *safe, int budget, uint64_t seed, int *count, int *space, int *unfit)
{
    int total = 1;
    for (int i = 0; i < f->nparams; ++i) total *= f->params[i].nvalues;
    candidate *c = calloc((size_t)total + 1, sizeof *c);
    if (!c) return NULL;
    int n = 1;
    memcpy(c[0].v, safe, sizeof c[0].v);
    *unfit = 0;
    for (int k = 0; k < total; ++k) {
        int v[TUNE_MAX_PARAMS] = {0}, rest = k;
        for (int i = 0; i < f->nparams; ++i) {
            v[i] = f->params[i].values[rest % f->params[i].nvalues];
            rest /= f->params[i].nvalues;
        }
        if (!tune_fits(info, family, v, pb, true, NULL, 0)) {
            ++*unfit;
            continue;
        }
        bool dup = false;
        for (int j = 0; j < n && !dup; ++j) dup = same_values(c[j].v, v, f->nparams);
        if (!dup) memcpy(c[n++].v, v, sizeof v);
    }
    *space = n;
    if (budget < 1) budget = 1;
    if (n > budget) { /* Fisher-Yates over the non-default ones, keep budget - 1 */
        for (int i = n - 1; i > 1; --i) {
            int j = 1 + (int)(cli_rng(&seed) % (uint64_t)i);
            candidate t = c[i];
            c[i] = c[j];
            c[j] = t;
        }
        n = budget;
    }
    *count = n;
    return c;
}

/* A dispatch family's values (MIN_T of nsa_fwd_split): each timed length,
 * so that no two candidates choose alike at every length, and never. */
static void dispatch_values(const tune_opts *o, tune_param *p)
{
    p->nvalues = 0;
    for (int i = 0; i < o->nT; ++i) p->values[p->nvalues++] = o->T[i];
    p->values[p->nvalues++] = TUNE_SPLIT_NEVER;
}

/* ------------------------------------------------------- background builds */

typedef struct {
    const cli_env *env;
    op_setup *setups[1 + TUNE_MAX_T]; /* the check, then one a timed length */
    int nsetups, family, n, next;
    candidate *c;
    bool stop;
    pthread_mutex_t m;
    pthread_cond_t cv;
} builder;

/* Builds candidate i's programs (both setups) with the hook's build-only mode. */
static void build_one(builder *b, candidate *c)
{
    tune_hook h = {.ctx = b->env->ctx, .family = b->family, .build_only = true};
    memcpy(h.v, c->v, sizeof h.v);
    tune_hook_set(&h);
    clnsa_status st = CLNSA_SUCCESS;
    for (int i = 0; i < b->nsetups && st == CLNSA_SUCCESS; ++i) st = tune_call_op(b->env, b->setups[i], b->setups[i]->bwd, NULL);
    tune_hook_set(NULL);
    pthread_mutex_lock(&b->m);
    if (st != CLNSA_SUCCESS) {
        snprintf(c->why, sizeof c->why, "%s: %s", clnsa_status_string(st), clnsa_last_error(b->env->ctx));
        char *nl = strchr(c->why, '\n');
        if (nl) *nl = '\0';
    }
    c->state = st == CLNSA_SUCCESS ? C_BUILT : C_BUILD_FAILED;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->m);
}

/* Claims the next candidate not yet built, or NULL. */
static candidate *claim(builder *b)
{
    pthread_mutex_lock(&b->m);
    candidate *c = NULL;
    while (!b->stop && !c && b->next < b->n) {
        c = &b->c[b->next++];
        if (c->state != C_PENDING) c = NULL;
    }
    if (c) c->state = C_BUILDING;
    pthread_mutex_unlock(&b->m);
    return c;
}

static void *builder_main(void *arg)
{
    builder *b = arg;
    for (candidate *c; (c = claim(b));) build_one(b, c);
    return NULL;
}

/* Waits until candidate c is built; without build threads, builds it here. */
static void wait_built(builder *b, candidate *c, bool threads)
{
    pthread_mutex_lock(&b->m);
    const bool mine = !threads && c->state == C_PENDING;
    if (mine) c->state = C_BUILDING;
    pthread_mutex_unlock(&b->m);
    if (mine) build_one(b, c);
    pthread_mutex_lock(&b->m);
    while (c->state == C_PENDING || c->state == C_BUILDING) pthread_cond_wait(&b->cv, &b->m);
    pthread_mutex_unlock(&b->m);
}

static bool family_is_warp(int family) { return family >= TF_NSA_FWD_WARP; }

/* The families timed in the backward (the tuner's backward runs on the
 * forward's saved tensors without the branch outputs, so the prologue runs) */
static bool family_is_bwd(int family)
{
    switch (family) {
    case TF_NSA_BWD_PRE: case TF_NSA_BWD_DQ: case TF_NSA_DKDV: case TF_BS_BWD: case TF_NSA_BWD_PRE_WARP:
    case TF_NSA_DQ_WARP: case TF_NSA_DQ_RECOMPUTE_WARP: case TF_NSA_DKDV_WARP: case TF_BS_BWD_WARP:
        return true;
    default:
        return false;
    }
}

static bool family_is_bs(int family)
{
    return family == TF_BS_FWD || family == TF_BS_BWD || family == TF_BS_FWD_WARP || family == TF_BS_BWD_WARP;
}

/* ------------------------------------------------------- check and time */

/* Runs the op once with the candidate forced; the summed device time of
 * the family's kernel in *ms when ms is non-NULL. */
static int run_forced(const cli_env *env, op_setup *s, int family, const int *v, double *ms)
{
    tune_hook h = {.ctx = env->ctx, .family = family, .capture = ms ? tune_families[family].kernel : NULL};
    memcpy(h.v, v, sizeof h.v);
    cl_event ev = NULL;
    tune_hook_set(&h);
    clnsa_status st = tune_call_op(env, s, s->bwd, &ev);
    tune_hook_set(NULL);
    int rc = tune_finish(env, st, ev, "run");
    double total = 0;
    for (int i = 0; i < h.nevents; ++i) {
        cl_ulong t0 = 0, t1 = 0;
        if (clGetEventProfilingInfo(h.events[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL) != CL_SUCCESS ||
            clGetEventProfilingInfo(h.events[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) != CL_SUCCESS)
            rc = -1;
        total += t1 > t0 ? (double)(t1 - t0) * 1e-6 : 0;
        clReleaseEvent(h.events[i]);
    }
    if (ms && rc == 0 && h.nevents == 0) {
        fprintf(stderr, "clnsa tune: kernel %s did not run\n", tune_families[family].kernel);
        rc = -1;
    }
    if (ms) *ms = total;
    return rc;
}

/* Times candidate c at each of the n lengths (setups s), after a warm-up
 * run at each; base: the safe default's times (c's own for the default). */
static int time_candidate(const cli_env *env, op_setup *const *s, int n, int family, candidate *c, const double *base,
                          int repeat)
{
    double ms[64];
    if (repeat > 64) repeat = 64;
    for (int t = 0; t < n; ++t) {
        if (run_forced(env, s[t], family, c->v, &ms[0])) return -1; /* warm-up */
        for (int i = 0; i < repeat; ++i)
            if (run_forced(env, s[t], family, c->v, &ms[i])) return -1;
        c->ms_at[t] = cli_median(ms, (size_t)repeat);
    }
    c->ms = weighted_ms(c->ms_at, base ? base : c->ms_at, n);
    return 0;
}

/* The workspace can depend on the tiles (the block-sparse rows are per
 * tile): sized once for the largest candidate, before the build threads
 * share the setup. */
static int grow_workspace(const cli_env *env, op_setup *s, int family, const candidate *c, int n)
{
    size_t need = s->ws_bytes;
    for (int i = 0; i < n; ++i) {
        tune_hook h = {.ctx = env->ctx, .family = family, .build_only = true};
        memcpy(h.v, c[i].v, sizeof h.v);
        size_t bytes = 0;
        tune_hook_set(&h);
        const clnsa_status st = tune_workspace_query(env, s, &bytes);
        tune_hook_set(NULL);
        if (st == CLNSA_SUCCESS && bytes > need) need = bytes;
    }
    if (need == s->ws_bytes) return 0;
    clReleaseMemObject(s->ws);
    s->ws_bytes = need;
    return (s->ws = cli_buffer(env, need, NULL)) ? 0 : -1;
}

/* ------------------------------------------------------------ progress */

static void progress(const char *family, int done, int n, double best, double base, double elapsed_s, bool tty)
{
    char bar[25];
    const int w = (int)sizeof bar - 1, fill = n ? done * w / n : w;
    for (int i = 0; i < w; ++i) bar[i] = i < fill ? '#' : '.';
    bar[w] = '\0';
    const double eta = done ? elapsed_s / done * (n - done) : 0;
    char best_s[64] = "best -";
    if (best > 0) snprintf(best_s, sizeof best_s, "best %.4g ms (x%.2f)", best, base > 0 ? base / best : 1.0);
    fprintf(stderr, "%s%-12s [%s] %3d/%-3d %s  ETA %d:%02d   %s", tty ? "\r" : "", family, bar, done, n, best_s,
            (int)eta / 60, (int)eta % 60, tty ? "" : "\n");
    fflush(stderr);
}

/* -------------------------------------------------------------- a family */

typedef struct {
    int family;
    tune_problem pb;
    candidate *c;
    int n, space, unfit, best, wrong, failed;
    int skipped; /* the sample's last ones, not reached before the family's share of --max-seconds ran out */
    double seconds;
} family_result;

/* Is i among the n indices idx? */
static bool listed(const int *idx, int n, int i)
{
    for (int j = 0; j < n; ++j)
        if (idx[j] == i) return true;
    return false;
}

/* The fastest few and the safe default timed again, interleaved run by run
 * (so that a drift of the device's speed hits them alike), their medians
 * replacing the first ones: one lucky first timing cannot win alone. The
 * others keep their first timings' ratios to the safe default, rescaled at
 * each length to its time here: every time in the results is then in this
 * phase's terms, where the merge compares them with the pick's. */
static int confirm(const cli_env *env, op_setup *const *s, int nt, family_result *fr, int repeat)
{
    int idx[4] = {0}, n = 1;
    double base_first[TUNE_MAX_T];
    memcpy(base_first, fr->c[0].ms_at, sizeof base_first);
    for (int k = 0; k < 3; ++k) { /* the three fastest others, by their first timing */
        int pick = -1;
        for (int i = 1; i < fr->n; ++i)
            if (!listed(idx, n, i) && fr->c[i].verdict == V_OK && (pick < 0 || fr->c[i].ms < fr->c[pick].ms)) pick = i;
        if (pick >= 0) idx[n++] = pick;
    }
    double ms[4][TUNE_MAX_T][64];
    if (repeat > 64) repeat = 64;
    for (int r = 0; r < repeat; ++r)
        for (int j = 0; j < n; ++j)
            for (int t = 0; t < nt; ++t)
                if (run_forced(env, s[t], fr->family, fr->c[idx[j]].v, &ms[j][t][r])) return -1;
    for (int j = 0; j < n; ++j)
        for (int t = 0; t < nt; ++t) fr->c[idx[j]].ms_at[t] = cli_median(ms[j][t], (size_t)repeat);
    for (int i = 1; i < fr->n; ++i) {
        if (listed(idx, n, i) || fr->c[i].verdict != V_OK) continue;
        for (int t = 0; t < nt; ++t)
            if (base_first[t] > 0) fr->c[i].ms_at[t] *= fr->c[0].ms_at[t] / base_first[t];
        fr->c[i].ms = weighted_ms(fr->c[i].ms_at, fr->c[0].ms_at, nt);
    }
    fr->best = 0; /* idx[0] */
    for (int j = 0; j < n; ++j) {
        candidate *c = &fr->c[idx[j]];
        c->ms = weighted_ms(c->ms_at, fr->c[0].ms_at, nt);
        if (c->ms < fr->c[fr->best].ms) fr->best = idx[j];
    }
    return 0;
}

/* The length of the check runs: --verify-T, at most the shortest timed one. */
static int verify_length(const tune_opts *o)
{
    int T = o->verify_T;
    for (int i = 0; i < o->nT; ++i) T = o->T[i] < T ? o->T[i] : T;
    return T;
}

static int tune_family_in(const cli_env *env, const tune_opts *o, int family, double deadline, family_result *fr)
{
    const tune_family *f = &tune_families[family];
    const bool bwd = family_is_bwd(family);
    const bool given_idx = family == TF_NSA_FWD || family == TF_NSA_FWD_WARP || family == TF_NSA_FWD_CMP_WARP;
    const bool bs = family_is_bs(family), no_cmp = family == TF_NSA_FWD_WARP;
    const bool no_slc = family == TF_NSA_FWD_CMP_TILE_WARP; /* the compressed tile is in no program with it */
    /* The warp families run only on their path, and in f16 / bf16: they are
     * checked in the timed dtype, within its rounding of the safe default. */
    const bool warp = family_is_warp(family);
    const clnsa_dtype check_dt = warp ? cli_dtype_from_choice(o->dtype) : CLNSA_DTYPE_F32;
    const double tol = warp ? 1e-2 : 1e-5;
    memset(fr, 0, sizeof *fr);
    fr->family = family;
    fr->best = -1;
    if (family == TF_NSA_FWD_FUSED_WARP && !nsa_topk_fuses(o->G, o->S)) {
        fprintf(stderr, "clnsa tune: %s: the forward runs the top-k itself only where G <= 16 and S <= 32 (skipped)\n",
                f->name);
        return 1;
    }
    /* Only the fused forward's family runs the top-k inside the forward; the
     * others time the top-k as its own kernel (its JB comes from that
     * family). Only the dispatch family splits the forward, to time it
     * against the fused one: the split's second half is a kernel of
     * nsa_fwd_warp's named as the fused one, and its first half runs the
     * top-k. Set before this family's build threads start. */
    const bool split = family == TF_NSA_FWD_SPLIT;
    setenv("CLNSA_FUSED_TOPK", family == TF_NSA_FWD_FUSED_WARP || split ? "1" : "0", 1);
    if (split) unsetenv("CLNSA_SPLIT_FWD");
    else setenv("CLNSA_SPLIT_FWD", "0", 1);
    if (no_slc) setenv("CLNSA_CMP_TILE", "1", 1); /* the family of the tiled program only */
    tune_problem pb = {.dk = o->D, .dv = o->DV, .g = o->G, .block = o->block, .dtype = cli_dtype_from_choice(o->dtype), .S = o->S,
                       .cmp_block = o->block, .cmp_stride = o->block, .slc = !no_slc, .swa = o->window > 0, .cmp_tile = no_slc,
                       .branches = !no_slc + !no_cmp + (o->window > 0)};
    if (warp) {
        const warp_mode wm = device_warp_mode(env->ctx, pb.dtype);
        if (wm == WARP_OFF) {
            fprintf(stderr, "clnsa tune: %s: the tensor-core path does not run on this device for --dtype %s (skipped)\n", f->name,
                    clnsa_dtype_name(pb.dtype));
            return 1;
        }
        pb.warp_emulated = wm == WARP_EMULATED;
        warp_params topk; /* the fused forward's candidates are counted with the top-k's scores, as the planner counts them */
        if (family == TF_NSA_FWD_FUSED_WARP && tune_nsa_warp(env->ctx, TF_NSA_TOPK_WARP, &pb, &topk) == CLNSA_SUCCESS)
            pb.fused_jb = topk.jb;
    }
    if (bs) { /* the class of the block-sparse kernels */
        pb.block = pb.S = pb.cmp_block = pb.cmp_stride = 0;
        pb.slc = false;
    }
    fr->pb = pb;
    int safe[TUNE_MAX_PARAMS] = {0};
    if (!tune_safe_default(env->info, family, &pb, safe)) {
        fprintf(stderr, "clnsa tune: %s: even the smallest tiles do not fit this device\n", f->name);
        return -1;
    }
    tune_family values = *f;
    if (f->dispatch) dispatch_values(o, &values.params[0]);
    fr->c = make_candidates(env->info, family, &values, &pb, safe, o->budget, (uint64_t)o->seed * 7919u + (uint64_t)family,
                            &fr->n, &fr->space, &fr->unfit);
    if (!fr->c) return -1;
    /* setups[0]: the check, at --verify-T (at most the shortest length); then one a timed length */
    op_setup setup_mem[1 + TUNE_MAX_T], *setups[1 + TUNE_MAX_T];
    int ns = 0, rc = 0;
    for (int i = 0; i <= o->nT && rc == 0; ++i, ++ns) {
        const int T = i ? o->T[i - 1] : verify_length(o);
        const clnsa_dtype dt = i ? pb.dtype : check_dt;
        setups[i] = &setup_mem[i];
        rc = bs ? tune_bs_setup_make(env, setups[i], o, T, dt, bwd) : tune_setup_make(env, setups[i], o, T, dt, bwd, given_idx, no_cmp, no_slc);
        if (rc) break;
        if (family == TF_NSA_DQ_RECOMPUTE_WARP) /* dq recomputes the compressed branch's dS */
            setups[i]->cfg.keep_ds = CLNSA_KEEP_DS_SELECTED;
        rc = grow_workspace(env, setups[i], family, fr->c, fr->n);
    }
    if (rc) {
        for (int i = 0; i < ns; ++i) tune_setup_free(setups[i]);
        return -1;
    }
    op_setup *check = setups[0], *const *timing = setups + 1;
    const double t0 = cli_now_ms();
    fprintf(stderr, "%s: %d candidates fit (%d dropped before compiling: they do not fit the device), timing %d%s\n",
            f->name, fr->space, fr->unfit, fr->n, fr->n < fr->space ? " (seeded random sample)" : " (all)");

    builder b = {.env = env, .nsetups = ns, .family = family, .n = fr->n, .c = fr->c, .m = PTHREAD_MUTEX_INITIALIZER,
                 .cv = PTHREAD_COND_INITIALIZER};
    memcpy(b.setups, setups, sizeof setups);
    /* On a CPU device the compiler would run on the cores being timed: build
     * in the foreground there unless --jobs says otherwise. */
    pthread_t th[8];
    const int nth = o->jobs >= 0 ? (o->jobs > 8 ? 8 : o->jobs) : env->info->is_gpu ? 2 : 0;
    int started = 0;
    for (int i = 0; i < nth; ++i) started += pthread_create(&th[started], NULL, builder_main, &b) == 0;

    op_result ref = {0};
    const bool tty = isatty(2);
    for (int i = 0; i < fr->n && rc == 0; ++i) {
        candidate *c = &fr->c[i];
        if (i > 0 && cli_now_ms() > deadline) { /* out of time: keep what was measured */
            for (int j = i; j < fr->n; ++j) fr->c[j].verdict = V_SKIPPED;
            fr->skipped = fr->n - i;
            break;
        }
        wait_built(&b, c, started > 0);
        op_result r = {0};
        if (c->state == C_BUILD_FAILED) {
            c->verdict = V_RUN_FAILED;
        } else if (run_forced(env, check, family, c->v, NULL) || tune_result_get(env, check, i ? &r : &ref)) {
            c->verdict = V_RUN_FAILED;
            snprintf(c->why, sizeof c->why, "the check run failed");
        } else if (i > 0 && !((c->err = tune_result_error(&r, &ref, o->S)) <= tol)) {
            c->verdict = V_WRONG;
            snprintf(c->why, sizeof c->why, "output differs from the safe default's (rel L2 %.3g)", c->err);
        } else if (time_candidate(env, timing, o->nT, family, c, i ? fr->c[0].ms_at : NULL, o->repeat)) {
            c->verdict = V_RUN_FAILED;
            snprintf(c->why, sizeof c->why, "the timed run failed");
        } else {
            c->verdict = V_OK;
            if (fr->best < 0 || c->ms < fr->c[fr->best].ms) fr->best = i;
        }
        tune_result_free(&r);
        if (i == 0 && c->verdict != V_OK) {
            fprintf(stderr, "clnsa tune: %s: the safe default failed: %s\n", f->name, c->why);
            rc = -1;
        }
        fr->wrong += c->verdict == V_WRONG;
        fr->failed += c->verdict == V_RUN_FAILED;
        if (c->verdict == V_WRONG || c->verdict == V_RUN_FAILED) {
            char p[96];
            fprintf(stderr, "%s%s: dropped %s: %s\n", tty ? "\n" : "", f->name, tune_params_str(f, c->v, p, sizeof p), c->why);
        }
        progress(f->name, i + 1, fr->n, fr->best >= 0 ? fr->c[fr->best].ms : 0, fr->c[0].verdict == V_OK ? fr->c[0].ms : 0,
                 (cli_now_ms() - t0) * 1e-3, tty);
    }
    if (tty) fputc('\n', stderr);
    pthread_mutex_lock(&b.m);
    b.stop = true;
    pthread_mutex_unlock(&b.m);
    for (int i = 0; i < started; ++i) pthread_join(th[i], NULL);
    if (rc == 0 && fr->best > 0 && confirm(env, timing, o->nT, fr, o->repeat)) rc = -1;
    tune_result_free(&ref);
    for (int i = 0; i < ns; ++i) tune_setup_free(setups[i]);
    fr->seconds = (cli_now_ms() - t0) * 1e-3;
    return rc == 0 && fr->best >= 0 ? 0 : -1;
}

/* A family's search on the path its kernels run on. The portable families'
 * kernels share their names with the tensor-core path's (nsa_fwd, ...), and
 * run where that path does not: where it would take --dtype, the search
 * forces the portable path for the family, or it would time the warp kernels
 * against parameters they do not read. */
static int tune_family_run(const cli_env *env, const tune_opts *o, int family, double deadline, family_result *fr)
{
    const clnsa_matrix_path was = env->ctx->matrix_path;
    if (!family_is_warp(family)) env->ctx->matrix_path = CLNSA_MATRIX_PORTABLE;
    const int rc = tune_family_in(env, o, family, deadline, fr);
    env->ctx->matrix_path = was;
    return rc;
}

/* ------------------------------------------------------------------ JSON */

static int cmp_by_ms(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    return (x->ms > y->ms) - (x->ms < y->ms);
}

/* Sets key to x[0 .. n-1] (rounded to 0.1 us) as an array: the times at
 * each length, where there are several (one is `ms` itself). */
static void set_times(js_value *obj, const char *key, const double *x, int n)
{
    if (n < 2) return;
    js_value a = {.type = JS_ARRAY};
    for (int i = 0; i < n; ++i) js_array_push(&a, js_make_number(round(x[i] * 1e4) / 1e4));
    js_object_set(obj, key, a);
}

static js_value entry_json(const cli_env *env, const tune_opts *o, const family_result *fr)
{
    const tune_family *f = &tune_families[fr->family];
    const clnsa_device_info *info = env->info;
    const candidate *best = &fr->c[fr->best], *base = &fr->c[0];
    js_value e = {.type = JS_OBJECT};
    js_object_set(&e, "vendor", js_make_string(tune_vendor_key(info->vendor)));
    js_object_set(&e, "architecture", js_make_string(info->architecture));
    js_object_set(&e, "device", js_make_string(info->name));
    js_object_set(&e, "family", js_make_string(f->name));
    js_object_set(&e, "shape", tune_shape_json(&fr->pb));
    js_object_set(&e, "params", tune_params_json(f, best->v));
    js_object_set(&e, "time_ms", js_make_number(best->ms));
    set_times(&e, "time_ms_at_T", best->ms_at, o->nT);
    js_value def = {.type = JS_OBJECT};
    js_object_set(&def, "params", tune_params_json(f, base->v));
    js_object_set(&def, "time_ms", js_make_number(base->ms));
    set_times(&def, "time_ms_at_T", base->ms_at, o->nT);
    js_object_set(&e, "safe_default", def);
    js_object_set(&e, "speedup", js_make_number(round(base->ms / best->ms * 1000) / 1000));
    js_object_set(&e, "driver", js_make_string(info->driver_version));
    js_object_set(&e, "platform", js_make_string(info->platform_name));
    js_object_set(&e, "clnsa", js_make_string(clnsa_version()));
    char date[32];
    const time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    js_object_set(&e, "date", js_make_string(date));
    js_value with = {.type = JS_OBJECT};
    if (o->nT == 1) {
        js_object_set(&with, "T", js_make_number(o->T[0]));
    } else { /* the lengths, in the order of the time_ms_at_T arrays */
        js_value Ts = {.type = JS_ARRAY};
        for (int i = 0; i < o->nT; ++i) js_array_push(&Ts, js_make_number(o->T[i]));
        js_object_set(&with, "T", Ts);
    }
    const char *keys[] = {"H",     "S",     "window", "verify_T", "seed",  "repeat",
                          "space", "unfit", "timed",  "skipped",  "wrong", "failed"};
    const int vals[] = {o->H,     o->S,      o->window,   verify_length(o), o->seed,   o->repeat,
                        fr->space, fr->unfit, fr->n - fr->skipped, fr->skipped, fr->wrong, fr->failed};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; ++i) js_object_set(&with, keys[i], js_make_number(vals[i]));
    js_object_set(&e, "tuned_with", with);
    /* every verified timing, fastest first: what --merge compares across devices */
    candidate *ok = calloc((size_t)fr->n, sizeof *ok);
    int nok = 0;
    for (int i = 0; ok && i < fr->n; ++i)
        if (fr->c[i].verdict == V_OK) ok[nok++] = fr->c[i];
    if (ok) qsort(ok, (size_t)nok, sizeof *ok, cmp_by_ms);
    js_value res = {.type = JS_ARRAY};
    for (int i = 0; i < nok; ++i) {
        js_value r = {.type = JS_OBJECT};
        js_object_set(&r, "params", tune_params_json(f, ok[i].v));
        js_object_set(&r, "ms", js_make_number(round(ok[i].ms * 1e4) / 1e4));
        set_times(&r, "ms_at_T", ok[i].ms_at, o->nT);
        js_array_push(&res, r);
    }
    free(ok);
    js_object_set(&e, "results", res);
    return e;
}

/* -------------------------------------------------------------- command */

static const char *const family_names = "nsa_fwd, nsa_bwd_pre, nsa_bwd_dq, nsa_topk, nsa_bwd_dkdv (nsa: these five), "
                                        "blocksparse_fwd, blocksparse_bwd (blocksparse: both), nsa_fwd_warp, "
                                        "nsa_fwd_cmp_warp, nsa_fwd_cmp_tile_warp, nsa_fwd_fused_warp, nsa_bwd_pre_warp, nsa_topk_warp, "
                                        "nsa_bwd_dq_warp, nsa_bwd_dq_recompute_warp, nsa_bwd_dkdv_warp, "
                                        "blocksparse_fwd_warp, blocksparse_bwd_warp, nsa_fwd_split (warp: these twelve, the tensor-core "
                                        "path, where the device runs it for --dtype); all: every one. nsa_fwd_split is no "
                                        "kernel's tiles but the length from which the forward splits (MIN_T): it tries every "
                                        "--T and never, so give lengths around the crossover (--T 8192,10240,12288,16384,24576)";

static void usage(FILE *f, const cli_opt *opts, size_t n)
{
    fprintf(f, "usage: clnsa tune --family F[,F...] [options]\n"
               "       clnsa tune --merge a.json [b.json ...] --into DIR [--partial]\n\n"
               "Searches a kernel family's parameters on a device for a shape class (head dims, GQA group,\n"
               "selection block, dtype; for NSA whether --window is on) and writes the best as a tuning file,\n"
               "which the library reads as it is (CLNSA_TUNING_FILE=FILE, or clnsa_context_options.tuning_file).\n"
               "Every candidate's output is checked against the safe default's before it is timed.\n"
               "Families: %s.\n"
               "--merge folds tuning files into DIR/<vendor>.json (the repo's tuning/), with per-architecture\n"
               "defaults: the configuration of least mean relative time across the architecture's devices.\n"
               "It refuses a result whose search --max-seconds cut short, unless --partial.\n\n",
            family_names);
    cli_print_opts(f, opts, n);
}

static int parse_families(const char *s, bool *on)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const bool all = strcmp(tok, "all") == 0, nsa = strcmp(tok, "nsa") == 0, bs = strcmp(tok, "blocksparse") == 0;
        const bool warp = strcmp(tok, "warp") == 0;
        if (all || nsa || bs || warp) {
            for (int i = 0; i < TF_COUNT; ++i) {
                const bool is_bs = family_is_bs(i), is_warp = family_is_warp(i);
                on[i] = on[i] || all || (bs && is_bs) || (nsa && !is_bs && !is_warp) || (warp && is_warp);
            }
            ++n;
            continue;
        }
        int f = tune_family_find(tok);
        if (f < 0) {
            fprintf(stderr, "clnsa tune: --family: unknown family '%s' (%s)\n", tok, family_names);
            return -1;
        }
        on[f] = true;
        ++n;
    }
    if (!n) fprintf(stderr, "clnsa tune: --family: expected a family (%s)\n", family_names);
    return n ? 0 : -1;
}

int cmd_tune(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[2], "--merge") == 0) return tune_merge(argc, argv);
    tune_opts o = {.D = 128, .G = 16, .H = 4, .block = 64, .S = 16, .dtype = 2, .Ts = "4096", .window = 512, .budget = 24,
                   .seed = 1, .repeat = 5, .verify_T = 1024, .jobs = -1};
    const cli_opt opts[] = {
        {"--family", OPT_STRING, &o.family, 0, 0, NULL, "F", "families to tune, comma-separated (required)"},
        {"--D", OPT_INT, &o.D, 8, 256, NULL, "N", "head dim of q and k (default 128)"},
        {"--DV", OPT_INT, &o.DV, 8, 256, NULL, "N", "head dim of v (default: --D)"},
        {"--G", OPT_INT, &o.G, 1, 256, NULL, "N", "GQA group: query heads per KV head (default 16)"},
        {"--block", OPT_INT, &o.block, 1, 4096, NULL, "N", "selection block = compression block and stride (default 64)"},
        {"--dtype", OPT_CHOICE, &o.dtype, 0, 0, "f32|f16|bf16", NULL, "storage dtype (default bf16)"},
        {"--T", OPT_STRING, &o.Ts, 0, 0, NULL, "LIST", "tokens of the timed runs, comma-separated: at most 6 lengths, each weighed alike (default 4096)"},
        {"--H", OPT_INT, &o.H, 1, 256, NULL, "N", "KV heads of the timed runs (default 4)"},
        {"--S", OPT_INT, &o.S, 1, 256, NULL, "N", "selected blocks per query (default 16)"},
        {"--window", OPT_INT, &o.window, 0, 1 << 20, NULL, "N", "sliding window, 0 = off (default 512)"},
        {"--budget", OPT_INT, &o.budget, 1, 100000, NULL, "N", "candidates timed per family, the safe default included (default 24)"},
        {"--seed", OPT_INT, &o.seed, 0, 1 << 30, NULL, "N", "seed of the sample and the inputs (default 1)"},
        {"--repeat", OPT_INT, &o.repeat, 1, 64, NULL, "N", "timed runs per candidate, median taken (default 5)"},
        {"--verify-T", OPT_INT, &o.verify_T, 1, 1 << 20, NULL, "N", "tokens of the f32 check runs (default 1024, at most the shortest --T)"},
        {"--jobs", OPT_INT, &o.jobs, 0, 8, NULL, "N", "background build threads (default 2 on a GPU, 0 elsewhere: the compiler would share the cores being timed)"},
        {"--max-seconds", OPT_INT, &o.max_seconds, 0, 1 << 30, NULL, "N", "stop searching after N s, shared by the families (default 0 = no limit)"},
        {"--out", OPT_STRING, &o.out, 0, 0, NULL, "FILE", "write the tuning file here (default: print it)"},
        {"--device", OPT_STRING, &o.device, 0, 0, NULL, "P:D", "device (default: as clnsa run)"},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];
    int rc = cli_parse("tune", argc, argv, 2, opts, nopts, NULL);
    if (rc < 0) {
        usage(stdout, opts, nopts);
        return CLI_OK;
    }
    if (rc) return rc;
    bool on[TF_COUNT] = {false};
    if (!o.family) {
        fprintf(stderr, "clnsa tune: --family is required (%s)\n", family_names);
        return CLI_USAGE;
    }
    if (parse_families(o.family, on)) return CLI_USAGE;
    if ((o.nT = cli_parse_int_list("tune", "--T", o.Ts, 1, 1 << 20, o.T, TUNE_MAX_T)) < 0) return CLI_USAGE;
    if (!o.DV) o.DV = o.D;
    if (o.D % 8 || o.DV % 8) {
        fprintf(stderr, "clnsa tune: --D and --DV must be multiples of 8\n");
        return CLI_USAGE;
    }
    cli_env env;
    if (cli_open(&env, o.device)) return CLI_FAIL;
    printf("device: %s (%s, driver %s, %s)\nshape class: D=%d DV=%d G=%d block=%d %s; timed at T=%s H=%d S=%d window=%d%s\n",
           env.info->name, env.info->platform_name, env.info->driver_version, env.info->architecture, o.D, o.DV, o.G,
           o.block, clnsa_dtype_name(cli_dtype_from_choice(o.dtype)), o.Ts, o.H, o.S, o.window,
           o.nT > 1 ? " (ms: the safe default's sum over the lengths, times the mean ratio to it)" : "");
    js_value entries = {.type = JS_ARRAY};
    int nfam = 0, failed = 0;
    for (int f = 0; f < TF_COUNT; ++f) nfam += on[f];
    const double start = cli_now_ms();
    printf("%-13s %-26s %10s   %-26s %10s %7s\n", "family", "safe default", "ms", "tuned", "ms", "gain");
    for (int f = 0, left = nfam; f < TF_COUNT; ++f) {
        if (!on[f]) continue;
        double deadline = 1e300;
        if (o.max_seconds > 0) {
            const double remaining = start + o.max_seconds * 1e3 - cli_now_ms();
            deadline = cli_now_ms() + (remaining > 0 ? remaining / left : 0);
        }
        --left;
        family_result fr;
        const int run = tune_family_run(&env, &o, f, deadline, &fr);
        if (run) { /* 1: does not apply to this device (skipped) */
            failed += run < 0;
            free(fr.c);
            continue;
        }
        const tune_family *fam = &tune_families[f];
        char a[96], b[96];
        const candidate *best = &fr.c[fr.best];
        char skipped[64] = "";
        if (fr.skipped) snprintf(skipped, sizeof skipped, ", %d not reached (--max-seconds)", fr.skipped);
        printf("%-13s %-26s %10.4f   %-26s %10.4f %6.2fx  (%d timed, %d wrong, %d failed%s, %.0f s)\n", fam->name,
               tune_params_str(fam, fr.c[0].v, a, sizeof a), fr.c[0].ms, tune_params_str(fam, best->v, b, sizeof b), best->ms,
               fr.c[0].ms / best->ms, fr.n - fr.skipped, fr.wrong, fr.failed, skipped, fr.seconds);
        fflush(stdout);
        js_array_push(&entries, entry_json(&env, &o, &fr));
        free(fr.c);
        if (o.out && tune_write_file(o.out, &entries)) ++failed; /* after each family: a timeout keeps the rest */
    }
    if (!o.out) {
        js_value doc = {.type = JS_OBJECT};
        js_object_set(&doc, "clnsa_tuning", js_make_number(1));
        js_object_set(&doc, "entries", entries);
        js_write(stdout, &doc, 0);
        fputc('\n', stdout);
        js_free(&doc);
    } else {
        printf("wrote %s\n", o.out);
        js_free(&entries);
    }
    cli_close(&env);
    return failed ? CLI_FAIL : CLI_OK;
}
