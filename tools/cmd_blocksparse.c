/* cmd_blocksparse.c: `clnsa blocksparse`, block-sparse attention on .npy
 * files: reads an input folder, runs the forward (and, with do.npy, the
 * backward) on a device, writes o.npy, lse.npy (and dq.npy, dk.npy, dv.npy,
 * dsinks.npy). Every input is checked on the host first: a malformed file
 * gets one line on stderr naming it, and a non-zero exit. */
#include "cli_common.h"
#include "npy_file.h"
#include "cmds.h"
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *in, *out, *device, *window;
    bool causal;
    double softcap, scale;
    int q_block, kv_block, dtype;
    int wl, wr; /* parsed --window */
} bs_opts;

/* The input folder, as float32 / int32 host arrays. */
typedef struct {
    int B, Tq, Tk, HQ, H, D, DV;
    float *q, *k, *v, *sinks, *dout;
    int32_t *seg_q, *seg_k, *pos_q, *pos_k, *mask;
    int mask_rank;
    int64_t mask_shape[4];
} bs_files;

static void files_free(bs_files *f)
{
    free(f->q), free(f->k), free(f->v), free(f->sinks), free(f->dout);
    free(f->seg_q), free(f->seg_k), free(f->pos_q), free(f->pos_k), free(f->mask);
    memset(f, 0, sizeof *f);
}

static int files_load(const char *dir, const bs_opts *o, bs_files *f)
{
    memset(f, 0, sizeof *f);
    npy_file nf;
    const int64_t any4[4] = {-1, -1, -1, -1};
    if (npy_file_open(dir, "q.npy", true, &nf) < 0) return -1;
    if (npy_file_check_shape(&nf, 4, any4, "[B, Tq, HQ, D]")) goto bad;
    for (int i = 0; i < 3; ++i)
        if (nf.a.shape[i] < 1 || nf.a.shape[i] > (i == 1 ? (1 << 30) : 65535)) {
            npy_file_fail(nf.path, "dim %d = %lld: expected B, HQ in 1..65535 and Tq in 1..2^30", i, (long long)nf.a.shape[i]);
            goto bad;
        }
    if (npy_file_check_head_dim(&nf, 3, "D")) goto bad;
    f->B = (int)nf.a.shape[0], f->Tq = (int)nf.a.shape[1], f->HQ = (int)nf.a.shape[2], f->D = (int)nf.a.shape[3];
    if (npy_file_floats(&nf, &f->q)) goto bad;
    npy_free(&nf.a);

    if (npy_file_open(dir, "k.npy", true, &nf) < 0) return -1;
    const int64_t wk[4] = {f->B, -1, -1, f->D};
    if (npy_file_check_shape(&nf, 4, wk, "[B, Tk, H, D]")) goto bad;
    if (nf.a.shape[1] < 1 || nf.a.shape[1] > (1 << 30) || nf.a.shape[2] < 1 || f->HQ % nf.a.shape[2]) {
        npy_file_fail(nf.path, "Tk = %lld, H = %lld: expected Tk in 1..2^30 and H dividing HQ = %d", (long long)nf.a.shape[1],
             (long long)nf.a.shape[2], f->HQ);
        goto bad;
    }
    f->Tk = (int)nf.a.shape[1], f->H = (int)nf.a.shape[2];
    if (npy_file_floats(&nf, &f->k)) goto bad;
    npy_free(&nf.a);

    if (npy_file_open(dir, "v.npy", true, &nf) < 0) return -1;
    const int64_t wv[4] = {f->B, f->Tk, f->H, -1};
    if (npy_file_check_shape(&nf, 4, wv, "[B, Tk, H, DV]") || npy_file_check_head_dim(&nf, 3, "DV")) goto bad;
    f->DV = (int)nf.a.shape[3];
    if (npy_file_floats(&nf, &f->v)) goto bad;
    npy_free(&nf.a);

    const int64_t bq[2] = {f->B, f->Tq}, bk[2] = {f->B, f->Tk}, hq[1] = {f->HQ};
    const int64_t wo[4] = {f->B, f->Tq, f->HQ, f->DV};
    int sq, sk;
    if ((sq = npy_file_load_ints(dir, "q_segment_ids.npy", false, 2, bq, "[B, Tq]", &f->seg_q)) < 0 ||
        (sk = npy_file_load_ints(dir, "kv_segment_ids.npy", false, 2, bk, "[B, Tk]", &f->seg_k)) < 0 ||
        npy_file_load_ints(dir, "q_positions.npy", false, 2, bq, "[B, Tq]", &f->pos_q) < 0 ||
        npy_file_load_ints(dir, "kv_positions.npy", false, 2, bk, "[B, Tk]", &f->pos_k) < 0 ||
        npy_file_load_floats(dir, "sinks.npy", false, 1, hq, "[HQ]", &f->sinks) < 0 ||
        npy_file_load_floats(dir, "do.npy", false, 4, wo, "[B, Tq, HQ, DV]", &f->dout) < 0)
        return -1;
    if (sq != sk) {
        char path[4096];
        return npy_file_fail(cli_path(dir, sq ? "kv_segment_ids.npy" : "q_segment_ids.npy", path, sizeof path),
                    "required file is missing (segment ids come in pairs: %s is given)",
                    sq ? "q_segment_ids.npy" : "kv_segment_ids.npy");
    }

    int rc = npy_file_open(dir, "block_mask.npy", false, &nf);
    if (rc <= 0) return rc;
    const int64_t nqb = (f->Tq + (int64_t)o->q_block - 1) / o->q_block, nkb = (f->Tk + (int64_t)o->kv_block - 1) / o->kv_block;
    const int r = nf.a.ndim;
    if (r < 2 || r > 4 || nf.a.shape[r - 2] != nqb || nf.a.shape[r - 1] != nkb || (r >= 3 && nf.a.shape[r - 3] != f->HQ) ||
        (r == 4 && nf.a.shape[0] != f->B)) {
        char got[128];
        cli_shape_str(r, nf.a.shape, got, sizeof got);
        npy_file_fail(nf.path,
             "expected shape [NQB, NKB], [HQ, NQB, NKB] or [B, HQ, NQB, NKB] with NQB = ceil(Tq/q_block) = %lld, "
             "NKB = ceil(Tk/kv_block) = %lld (--q-block %d, --kv-block %d), HQ = %d, B = %d; got %s",
             (long long)nqb, (long long)nkb, o->q_block, o->kv_block, f->HQ, f->B, got);
        goto bad;
    }
    if (nf.a.dtype != NPY_U8 && nf.a.dtype != NPY_I32) {
        npy_file_fail(nf.path, "expected dtype uint8 or int32, got %s", npy_dtype_name(nf.a.dtype));
        goto bad;
    }
    if (npy_file_ints(&nf, &f->mask)) goto bad;
    f->mask_rank = r;
    for (int i = 0; i < r; ++i) f->mask_shape[i] = nf.a.shape[i];
    npy_free(&nf.a);
    return 0;
bad:
    npy_free(&nf.a);
    return -1;
}

static int save(const char *dir, const char *name, int ndim, const int64_t *shape, const float *data)
{
    char path[4096], err[512];
    if (npy_save(cli_path(dir, name, path, sizeof path), NPY_F32, ndim, shape, data, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int fetch_save(const cli_env *env, cl_mem m, clnsa_dtype dt, const char *dir, const char *name, int ndim,
                      const int64_t *shape)
{
    size_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= (size_t)shape[i];
    float *h = cli_malloc(n * sizeof *h);
    int rc = !h || cli_download_f32(env, m, n, dt, h) || save(dir, name, ndim, shape, h) ? -1 : 0;
    free(h);
    return rc;
}

enum { M_Q, M_K, M_V, M_SQ, M_SK, M_PQ, M_PK, M_SN, M_MASK, M_O, M_LSE, M_DO, M_DQ, M_DK, M_DV, M_DS, M_WS, M_N };

static int run(const bs_opts *o, const bs_files *f, cli_env *env)
{
    const clnsa_dtype dt = cli_dtype_from_choice(o->dtype);
    const size_t nq = (size_t)f->B * f->Tq * f->HQ, nk = (size_t)f->B * f->Tk * f->H;
    cl_mem m[M_N] = {0};
    int rc = CLI_FAIL;
    const int64_t sq4[4] = {f->B, f->Tq, f->HQ, f->D}, sk4[4] = {f->B, f->Tk, f->H, f->D};
    const int64_t sv4[4] = {f->B, f->Tk, f->H, f->DV}, so4[4] = {f->B, f->Tq, f->HQ, f->DV};
    const int64_t sl3[3] = {f->B, f->Tq, f->HQ}, bq[2] = {f->B, f->Tq}, bk[2] = {f->B, f->Tk}, hq = f->HQ;

    if (!(m[M_Q] = cli_upload_f32(env, f->q, nq * f->D, dt)) || !(m[M_K] = cli_upload_f32(env, f->k, nk * f->D, dt)) ||
        !(m[M_V] = cli_upload_f32(env, f->v, nk * f->DV, dt)))
        goto done;
    if (f->seg_q && (!(m[M_SQ] = cli_upload_i32(env, f->seg_q, (size_t)f->B * f->Tq)) ||
                     !(m[M_SK] = cli_upload_i32(env, f->seg_k, (size_t)f->B * f->Tk))))
        goto done;
    if (f->pos_q && !(m[M_PQ] = cli_upload_i32(env, f->pos_q, (size_t)f->B * f->Tq))) goto done;
    if (f->pos_k && !(m[M_PK] = cli_upload_i32(env, f->pos_k, (size_t)f->B * f->Tk))) goto done;
    if (f->sinks && !(m[M_SN] = cli_upload_f32(env, f->sinks, (size_t)f->HQ, CLNSA_DTYPE_F32))) goto done;
    size_t nmask = 1;
    for (int i = 0; i < f->mask_rank; ++i) nmask *= (size_t)f->mask_shape[i];
    if (f->mask && !(m[M_MASK] = cli_upload_i32(env, f->mask, nmask))) goto done;
    if (!(m[M_O] = cli_buffer(env, nq * f->DV * clnsa_dtype_size(dt), NULL)) || !(m[M_LSE] = cli_buffer(env, nq * 4, NULL)))
        goto done;

    clnsa_blocksparse_config cfg;
    clnsa_blocksparse_config_init(&cfg);
    cfg.causal = o->causal;
    cfg.window_left = o->wl;
    cfg.window_right = o->wr;
    cfg.softcap = (float)o->softcap;
    cfg.scale = (float)o->scale;
    cfg.q_block = o->q_block;
    cfg.kv_block = o->kv_block;
    clnsa_blocksparse_inputs in;
    memset(&in, 0, sizeof in);
    in.q = clnsa_tensor_contiguous(m[M_Q], dt, 4, sq4);
    in.k = clnsa_tensor_contiguous(m[M_K], dt, 4, sk4);
    in.v = clnsa_tensor_contiguous(m[M_V], dt, 4, sv4);
    if (m[M_SQ]) {
        in.q_segment_ids = clnsa_tensor_contiguous(m[M_SQ], CLNSA_DTYPE_I32, 2, bq);
        in.kv_segment_ids = clnsa_tensor_contiguous(m[M_SK], CLNSA_DTYPE_I32, 2, bk);
    }
    if (m[M_PQ]) in.q_positions = clnsa_tensor_contiguous(m[M_PQ], CLNSA_DTYPE_I32, 2, bq);
    if (m[M_PK]) in.kv_positions = clnsa_tensor_contiguous(m[M_PK], CLNSA_DTYPE_I32, 2, bk);
    if (m[M_SN]) in.sinks = clnsa_tensor_contiguous(m[M_SN], CLNSA_DTYPE_F32, 1, &hq);
    if (m[M_MASK]) in.block_mask = clnsa_tensor_contiguous(m[M_MASK], CLNSA_DTYPE_I32, f->mask_rank, f->mask_shape);
    clnsa_blocksparse_outputs out = {clnsa_tensor_contiguous(m[M_O], dt, 4, so4),
                                     clnsa_tensor_contiguous(m[M_LSE], CLNSA_DTYPE_F32, 3, sl3)};

    size_t ws_bytes = 0;
    clnsa_status st = clnsa_blocksparse_forward_workspace_size(env->ctx, &cfg, &in, &out, &ws_bytes);
    if (st != CLNSA_SUCCESS) {
        cli_report(env, "clnsa_blocksparse_forward_workspace_size", st);
        goto done;
    }
    clnsa_blocksparse_grad_inputs gin;
    clnsa_blocksparse_grads gr;
    memset(&gin, 0, sizeof gin);
    memset(&gr, 0, sizeof gr);
    size_t bwd_bytes = 0;
    if (f->dout) {
        if (!(m[M_DO] = cli_upload_f32(env, f->dout, nq * f->DV, dt)) ||
            !(m[M_DQ] = cli_buffer(env, nq * f->D * clnsa_dtype_size(dt), NULL)) ||
            !(m[M_DK] = cli_buffer(env, nk * f->D * clnsa_dtype_size(dt), NULL)) ||
            !(m[M_DV] = cli_buffer(env, nk * f->DV * clnsa_dtype_size(dt), NULL)) ||
            (f->sinks && !(m[M_DS] = cli_buffer(env, (size_t)f->HQ * 4, NULL))))
            goto done;
        gin.o = out.o;
        gin.lse = out.lse;
        gin.dout = clnsa_tensor_contiguous(m[M_DO], dt, 4, so4);
        gr.dq = clnsa_tensor_contiguous(m[M_DQ], dt, 4, sq4);
        gr.dk = clnsa_tensor_contiguous(m[M_DK], dt, 4, sk4);
        gr.dv = clnsa_tensor_contiguous(m[M_DV], dt, 4, sv4);
        if (m[M_DS]) gr.dsinks = clnsa_tensor_contiguous(m[M_DS], CLNSA_DTYPE_F32, 1, &hq);
        st = clnsa_blocksparse_backward_workspace_size(env->ctx, &cfg, &in, &gin, &gr, &bwd_bytes);
        if (st != CLNSA_SUCCESS) {
            cli_report(env, "clnsa_blocksparse_backward_workspace_size", st);
            goto done;
        }
    }
    const size_t ws_max = ws_bytes > bwd_bytes ? ws_bytes : bwd_bytes;
    if (ws_max && !(m[M_WS] = cli_buffer(env, ws_max, NULL))) goto done;

    cli_timer timer;
    if (cli_timer_begin(env, &timer)) goto done;
    cl_event ev = NULL;
    st = clnsa_blocksparse_forward(env->ctx, env->queue, &cfg, &in, &out, m[M_WS], ws_max, 1, &timer.marker, &ev);
    double ms_fwd = cli_timer_end(&timer, ev), ms_bwd = 0;
    if (ev) clReleaseEvent(ev);
    if (st != CLNSA_SUCCESS) cli_report(env, "clnsa_blocksparse_forward", st);
    if (st != CLNSA_SUCCESS || ms_fwd < 0) goto done;
    if (f->dout) {
        if (cli_timer_begin(env, &timer)) goto done;
        ev = NULL;
        st = clnsa_blocksparse_backward(env->ctx, env->queue, &cfg, &in, &gin, &gr, m[M_WS], ws_max, 1, &timer.marker, &ev);
        ms_bwd = cli_timer_end(&timer, ev);
        if (ev) clReleaseEvent(ev);
        if (st != CLNSA_SUCCESS) cli_report(env, "clnsa_blocksparse_backward", st);
        if (st != CLNSA_SUCCESS || ms_bwd < 0) goto done;
    }

    if (fetch_save(env, m[M_O], dt, o->out, "o.npy", 4, so4) ||
        fetch_save(env, m[M_LSE], CLNSA_DTYPE_F32, o->out, "lse.npy", 3, sl3))
        goto done;
    if (f->dout && (fetch_save(env, m[M_DQ], dt, o->out, "dq.npy", 4, sq4) ||
                    fetch_save(env, m[M_DK], dt, o->out, "dk.npy", 4, sk4) ||
                    fetch_save(env, m[M_DV], dt, o->out, "dv.npy", 4, sv4) ||
                    (m[M_DS] && fetch_save(env, m[M_DS], CLNSA_DTYPE_F32, o->out, "dsinks.npy", 1, &hq))))
        goto done;
    printf("clnsa blocksparse: B=%d Tq=%d Tk=%d HQ=%d H=%d D=%d DV=%d %s%s%s%s%s%s, device %d:%d; forward %.2f ms",
           f->B, f->Tq, f->Tk, f->HQ, f->H, f->D, f->DV, clnsa_dtype_name(dt), o->causal ? " causal" : "",
           o->wl >= 0 || o->wr >= 0 ? " window" : "", o->softcap > 0 ? " softcap" : "", f->sinks ? " sinks" : "",
           f->mask ? " block_mask" : "", env->plat_index, env->dev_index, ms_fwd);
    if (f->dout) printf(", backward %.2f ms", ms_bwd);
    printf(" (one cold run); wrote o.npy lse.npy%s%s to %s\n", f->dout ? " dq.npy dk.npy dv.npy" : "",
           m[M_DS] ? " dsinks.npy" : "", o->out);
    rc = CLI_OK;
done:
    for (int i = 0; i < M_N; ++i)
        if (m[i]) clReleaseMemObject(m[i]);
    return rc;
}

static void usage(const cli_opt *opts, size_t n)
{
    printf("usage: clnsa blocksparse --in DIR --out DIR [options]\n"
           "Runs block-sparse attention on .npy files. DIR (--in) holds q.npy [B,Tq,HQ,D], k.npy [B,Tk,H,D],\n"
           "v.npy [B,Tk,H,DV] (any float dtype; converted to --dtype) and optionally q_segment_ids.npy\n"
           "[B,Tq] and kv_segment_ids.npy [B,Tk] (int, both or neither; -1 = padding), q_positions.npy\n"
           "[B,Tq] and kv_positions.npy [B,Tk] (int), sinks.npy [HQ] (float), block_mask.npy (uint8 or\n"
           "int32, [NQB,NKB], [HQ,NQB,NKB] or [B,HQ,NQB,NKB] in blocks of --q-block x --kv-block) and\n"
           "do.npy [B,Tq,HQ,DV] (float; runs the backward).\n"
           "Writes o.npy and lse.npy (float32); with do.npy also dq.npy, dk.npy, dv.npy and, with sinks,\n"
           "dsinks.npy, to the --out DIR (created if needed).\n\n");
    cli_print_opts(stdout, opts, n);
}

/* "L,R" with each >= -1. */
static int parse_window(const char *s, int *l, int *r)
{
    char *end;
    long a = strtol(s, &end, 10);
    if (*end != ',') return -1;
    long b = strtol(end + 1, &end, 10);
    if (*end || a < -1 || b < -1 || a > (1L << 30) || b > (1L << 30)) return -1;
    *l = (int)a;
    *r = (int)b;
    return 0;
}

int cmd_blocksparse(int argc, char **argv)
{
    bs_opts o;
    memset(&o, 0, sizeof o);
    o.q_block = o.kv_block = 64;
    o.wl = o.wr = -1;
    const cli_opt opts[] = {
        {"--in", OPT_STRING, &o.in, 0, 0, NULL, "DIR", "input folder (required)"},
        {"--out", OPT_STRING, &o.out, 0, 0, NULL, "DIR", "output folder (required)"},
        {"--causal", OPT_FLAG, &o.causal, 0, 0, NULL, NULL, "key position <= query position"},
        {"--window", OPT_STRING, &o.window, 0, 0, NULL, "L,R",
         "query at p sees keys in [p-L, p+R]; -1 = unbounded side (-1,-1)"},
        {"--softcap", OPT_DOUBLE, &o.softcap, 0, 0, NULL, "X", "soft cap c: z = c*tanh(z/c); 0 = off (0)"},
        {"--scale", OPT_DOUBLE, &o.scale, 0, 0, NULL, "X", "softmax scale (1/sqrt(D))"},
        {"--q-block", OPT_INT, &o.q_block, 1, 1 << 24, NULL, "N", "query tokens per block of block_mask.npy (64)"},
        {"--kv-block", OPT_INT, &o.kv_block, 1, 1 << 24, NULL, "N", "key tokens per block of block_mask.npy (64)"},
        {"--dtype", OPT_CHOICE, &o.dtype, 0, 0, "f32|f16|bf16", NULL, "storage type on the device (f32)"},
        {"--device", OPT_STRING, &o.device, 0, 0, NULL, "P:D", "OpenCL platform:device (default: see clnsa devices)"},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];
    int rc = cli_parse("blocksparse", argc, argv, 2, opts, nopts, NULL);
    if (rc < 0) {
        usage(opts, nopts);
        return CLI_OK;
    }
    if (rc) return rc;
    if (!o.in || !o.out) {
        fprintf(stderr, "clnsa blocksparse: --in DIR and --out DIR are required (see clnsa blocksparse --help)\n");
        return CLI_USAGE;
    }
    if (o.window && parse_window(o.window, &o.wl, &o.wr)) {
        fprintf(stderr, "clnsa blocksparse: --window: expected L,R with each >= -1 (-1 = unbounded), got '%s'\n", o.window);
        return CLI_USAGE;
    }
    if (!cli_param_ok("blocksparse", "scale", o.scale) || !cli_param_ok("blocksparse", "softcap", o.softcap))
        return CLI_USAGE;
    bs_files f;
    cli_env env;
    memset(&env, 0, sizeof env);
    rc = CLI_FAIL;
    if (files_load(o.in, &o, &f)) goto done;
    if (cli_mkdirs(o.out) || cli_open(&env, o.device)) goto done;
    rc = run(&o, &f, &env);
done:
    cli_close(&env);
    files_free(&f);
    return rc;
}
