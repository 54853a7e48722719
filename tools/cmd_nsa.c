/* cmd_nsa.c: `clnsa nsa`, the NSA forward (and, when do.npy is given, the
 * backward) on .npy files: reads an input folder (see nsa_io.h), runs the
 * chosen branches on a device and writes o.npy, lse_cmp.npy and
 * block_indices.npy, and the gradients dq.npy, dk.npy, dv.npy, dg_*.npy and
 * dk_cmp.npy / dv_cmp.npy. */
#include "cli_common.h"
#include "cmds.h"
#include "npy.h"
#include "nsa_io.h"

#include <stdlib.h>
#include <string.h>

enum { ONLY_CMP, ONLY_SLC, ONLY_SWA, ONLY_TOPK };

typedef struct {
    const char *in, *out, *device;
    int block_size, block_count, window, cmp_block, cmp_stride, init_blocks, local_blocks;
    double scale;
    int dtype, only;
} nsa_opts;

/* M_LSE + GATE_*: lse of each branch; M_DG0 + GATE_*: the gate gradients. */
enum { M_Q, M_K, M_V, M_G0, M_G1, M_G2, M_CU, M_KC, M_VC, M_BI, M_BC, M_O, M_LSE, M_LSE1, M_LSE2, M_BO, M_WS,
       M_DO, M_WB, M_DQ, M_DK, M_DV, M_DG0, M_DG1, M_DG2, M_DKC, M_DVC, M_N };

typedef struct {
    bool on[GATE_N];     /* branches that run */
    bool ones[GATE_N];   /* gate of ones instead of the file's */
    bool topk;           /* block indices computed on the device */
} plan;

static int save(const char *dir, const char *name, npy_dtype dt, int ndim, const int64_t *shape, const void *data)
{
    char path[4096], err[512];
    if (npy_save(cli_path(dir, name, path, sizeof path), dt, ndim, shape, data, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

/* Downloads n floats of `dt` from m and saves them as a float32 file. */
static int fetch_save(const cli_env *env, cl_mem m, size_t n, clnsa_dtype dt, const char *dir, const char *name, int ndim,
                      const int64_t *shape, float *buf, char *wrote, size_t wrote_size)
{
    if (cli_download_f32(env, m, n, dt, buf) || save(dir, name, NPY_F32, ndim, shape, buf)) return -1;
    size_t len = strlen(wrote);
    snprintf(wrote + len, wrote_size - len, " %s", name);
    return 0;
}

/* Which branches run and with which gates; -1 after printing why not. */
static int make_plan(const nsa_opts *o, const nsa_files *f, plan *p)
{
    char path[4096];
    memset(p, 0, sizeof *p);
    if (o->only >= 0) {
        int b = o->only == ONLY_TOPK ? GATE_SLC : o->only;
        p->on[b] = p->ones[b] = true;
        if (o->only == ONLY_SWA && o->window <= 0) {
            fprintf(stderr, "clnsa nsa: --only swa needs --window > 0\n");
            return -1;
        }
        if (o->only == ONLY_TOPK && f->dout) {
            fprintf(stderr, "%s: given, but --only topk has no backward (remove the file)\n",
                    cli_path(f->dir, "do.npy", path, sizeof path));
            return -1;
        }
        if (o->only == ONLY_TOPK && f->bidx) {
            fprintf(stderr, "%s: given, but --only topk computes the selection (remove the file)\n",
                    cli_path(f->dir, "block_indices.npy", path, sizeof path));
            return -1;
        }
    } else if (f->gate[0] || f->gate[1] || f->gate[2]) {
        for (int i = 0; i < GATE_N; ++i) p->on[i] = f->gate[i] != NULL;
        if (p->on[GATE_SWA] && o->window <= 0) {
            fprintf(stderr, "%s: a sliding-window gate needs --window > 0\n",
                    cli_path(f->dir, "g_swa.npy", path, sizeof path));
            return -1;
        }
    } else {
        p->on[GATE_CMP] = p->on[GATE_SLC] = p->ones[GATE_CMP] = p->ones[GATE_SLC] = true;
        p->on[GATE_SWA] = p->ones[GATE_SWA] = o->window > 0;
    }
    p->topk = p->on[GATE_SLC] && !f->bidx;
    return 0;
}

static int run(const nsa_opts *o, const nsa_files *f, const plan *p, int S, cli_env *env)
{
    const clnsa_dtype dt = cli_dtype_from_choice(o->dtype);
    const size_t nq = (size_t)f->B * f->T * f->HQ, nk = (size_t)f->B * f->T * f->H, nbi = nk * (size_t)S;
    const size_t nc = (size_t)f->B * f->NC * f->H;
    cl_mem m[M_N] = {0};
    const bool bwd = f->dout != NULL;
    float *host_o = NULL, *host_lse = NULL, *host_g = NULL;
    int32_t *host_bi = NULL;
    int rc = CLI_FAIL;

    if (!(m[M_Q] = cli_upload_f32(env, f->q, nq * f->DK, dt)) || !(m[M_K] = cli_upload_f32(env, f->k, nk * f->DK, dt)) ||
        !(m[M_V] = cli_upload_f32(env, f->v, nk * f->DV, dt)))
        goto done;
    for (int i = 0; i < GATE_N; ++i)
        if (p->on[i] && !(m[M_G0 + i] = p->ones[i] ? cli_fill(env, nq, dt, 1.0f) : cli_upload_f32(env, f->gate[i], nq, dt)))
            goto done;
    if (f->cu && !(m[M_CU] = cli_upload_i32(env, f->cu, (size_t)f->N + 1))) goto done;
    if (f->k_cmp && (!(m[M_KC] = cli_upload_f32(env, f->k_cmp, nc * f->DK, dt)) ||
                     !(m[M_VC] = cli_upload_f32(env, f->v_cmp, nc * f->DV, dt))))
        goto done;
    if (p->on[GATE_SLC] && f->bidx && !(m[M_BI] = cli_upload_i32(env, f->bidx, nbi))) goto done;
    if (p->on[GATE_SLC] && f->bcnt && !(m[M_BC] = cli_upload_i32(env, f->bcnt, nk))) goto done;
    if (!(m[M_O] = cli_buffer(env, nq * f->DV * clnsa_dtype_size(dt), NULL))) goto done;
    /* lse of every branch that runs: the backward reads them. */
    for (int i = 0; i < GATE_N; ++i)
        if (p->on[i] && (i == GATE_CMP || bwd) && !(m[M_LSE + i] = cli_buffer(env, nq * 4, NULL))) goto done;
    if (p->topk && !(m[M_BO] = cli_buffer(env, nbi * 4, NULL))) goto done;

    clnsa_nsa_config cfg;
    clnsa_nsa_config_init(&cfg);
    cfg.block_size = o->block_size;
    cfg.block_count = S;
    cfg.cmp_block = o->cmp_block;
    cfg.cmp_stride = o->cmp_stride;
    cfg.window = o->window;
    cfg.init_blocks = o->init_blocks;
    cfg.local_blocks = o->local_blocks;
    cfg.scale = (float)o->scale;
    const int64_t sq[4] = {f->B, f->T, f->HQ, f->DK}, sk[4] = {f->B, f->T, f->H, f->DK};
    const int64_t sv[4] = {f->B, f->T, f->H, f->DV}, so[4] = {f->B, f->T, f->HQ, f->DV};
    const int64_t sg[3] = {f->B, f->T, f->HQ}, sc[3] = {f->B, f->T, f->H}, sb[4] = {f->B, f->T, f->H, S};
    const int64_t scu = f->N + 1;
    const int64_t skc[4] = {f->B, f->NC, f->H, f->DK}, svc[4] = {f->B, f->NC, f->H, f->DV};
    clnsa_nsa_inputs in;
    clnsa_nsa_outputs out;
    memset(&in, 0, sizeof in);
    memset(&out, 0, sizeof out);
    in.q = clnsa_tensor_contiguous(m[M_Q], dt, 4, sq);
    in.k = clnsa_tensor_contiguous(m[M_K], dt, 4, sk);
    in.v = clnsa_tensor_contiguous(m[M_V], dt, 4, sv);
    clnsa_tensor *gates[GATE_N] = {&in.g_cmp, &in.g_slc, &in.g_swa};
    for (int i = 0; i < GATE_N; ++i)
        if (m[M_G0 + i]) *gates[i] = clnsa_tensor_contiguous(m[M_G0 + i], dt, 3, sg);
    if (m[M_CU]) in.cu_seqlens = clnsa_tensor_contiguous(m[M_CU], CLNSA_DTYPE_I32, 1, &scu);
    if (m[M_KC]) {
        in.k_cmp = clnsa_tensor_contiguous(m[M_KC], dt, 4, skc);
        in.v_cmp = clnsa_tensor_contiguous(m[M_VC], dt, 4, svc);
    }
    if (m[M_BI]) in.block_indices = clnsa_tensor_contiguous(m[M_BI], CLNSA_DTYPE_I32, 4, sb);
    if (m[M_BC]) in.block_counts = clnsa_tensor_contiguous(m[M_BC], CLNSA_DTYPE_I32, 3, sc);
    out.o = clnsa_tensor_contiguous(m[M_O], dt, 4, so);
    if (m[M_LSE]) out.lse_cmp = clnsa_tensor_contiguous(m[M_LSE], CLNSA_DTYPE_F32, 3, sg);
    if (m[M_LSE1]) out.lse_slc = clnsa_tensor_contiguous(m[M_LSE1], CLNSA_DTYPE_F32, 3, sg);
    if (m[M_LSE2]) out.lse_swa = clnsa_tensor_contiguous(m[M_LSE2], CLNSA_DTYPE_F32, 3, sg);
    if (m[M_BO]) out.block_indices = clnsa_tensor_contiguous(m[M_BO], CLNSA_DTYPE_I32, 4, sb);

    size_t ws_bytes = 0;
    clnsa_status st = clnsa_nsa_forward_workspace_size(env->ctx, env->queue, &cfg, &in, &out, &ws_bytes);
    if (st != CLNSA_SUCCESS) {
        cli_report(env, "clnsa_nsa_forward_workspace_size", st);
        goto done;
    }
    if (ws_bytes && !(m[M_WS] = cli_buffer(env, ws_bytes, NULL))) goto done;
    cli_timer timer;
    if (cli_timer_begin(env, &timer)) goto done;
    cl_event ev = NULL;
    st = clnsa_nsa_forward(env->ctx, env->queue, &cfg, &in, &out, m[M_WS], ws_bytes, 1, &timer.marker, &ev);
    double ms = cli_timer_end(&timer, ev);
    if (ev) clReleaseEvent(ev);
    if (st != CLNSA_SUCCESS) cli_report(env, "clnsa_nsa_forward", st);
    if (st != CLNSA_SUCCESS || ms < 0) goto done;

    char wrote[512] = "";
    if (o->only != ONLY_TOPK) {
        if (!(host_o = cli_malloc(nq * f->DV * sizeof *host_o)) || cli_download_f32(env, m[M_O], nq * f->DV, dt, host_o) ||
            save(o->out, "o.npy", NPY_F32, 4, so, host_o))
            goto done;
        strcat(wrote, " o.npy");
    }
    if (m[M_LSE]) {
        if (!(host_lse = cli_malloc(nq * sizeof *host_lse)) || cli_download_f32(env, m[M_LSE], nq, CLNSA_DTYPE_F32, host_lse) ||
            save(o->out, "lse_cmp.npy", NPY_F32, 3, sg, host_lse))
            goto done;
        strcat(wrote, " lse_cmp.npy");
    }
    if (p->on[GATE_SLC]) {
        const int32_t *bi = f->bidx;
        if (p->topk) {
            if (!(host_bi = cli_malloc(nbi * sizeof *host_bi)) || cli_download_i32(env, m[M_BO], nbi, host_bi)) goto done;
            bi = host_bi;
        }
        if (save(o->out, "block_indices.npy", NPY_I32, 4, sb, bi)) goto done;
        strcat(wrote, p->topk ? " block_indices.npy (top-k)" : " block_indices.npy (given)");
    }

    double bms = 0;
    if (bwd) {
        /* Gradients of the inputs, of the gates of the branches that ran
         * (not with --only: its gate is a constant of ones), and of the given
         * compressed tensors. */
        const size_t ng[] = {nq * f->DK, nk * f->DK, nk * f->DV, nq, nq, nq, nc * f->DK, nc * f->DV};
        for (int i = M_DQ; i <= M_DVC; ++i) {
            const int j = i - M_DQ;
            const bool want = i <= M_DV || (i <= M_DG2 ? p->on[i - M_DG0] && o->only < 0 : f->k_cmp != NULL);
            if (want && !(m[i] = cli_buffer(env, ng[j] * clnsa_dtype_size(dt), NULL))) goto done;
        }
        if (!(m[M_DO] = cli_upload_f32(env, f->dout, nq * f->DV, dt))) goto done;
        clnsa_tensor dout = clnsa_tensor_contiguous(m[M_DO], dt, 4, so);
        clnsa_nsa_grads g;
        memset(&g, 0, sizeof g);
        g.dq = clnsa_tensor_contiguous(m[M_DQ], dt, 4, sq);
        g.dk = clnsa_tensor_contiguous(m[M_DK], dt, 4, sk);
        g.dv = clnsa_tensor_contiguous(m[M_DV], dt, 4, sv);
        clnsa_tensor *dg[GATE_N] = {&g.dg_cmp, &g.dg_slc, &g.dg_swa};
        for (int i = 0; i < GATE_N; ++i)
            if (m[M_DG0 + i]) *dg[i] = clnsa_tensor_contiguous(m[M_DG0 + i], dt, 3, sg);
        if (m[M_DKC]) {
            g.dk_cmp = clnsa_tensor_contiguous(m[M_DKC], dt, 4, skc);
            g.dv_cmp = clnsa_tensor_contiguous(m[M_DVC], dt, 4, svc);
        }
        size_t wb_bytes = 0;
        st = clnsa_nsa_backward_workspace_size(env->ctx, env->queue, &cfg, &in, &out, &dout, &g, &wb_bytes);
        if (st != CLNSA_SUCCESS) {
            cli_report(env, "clnsa_nsa_backward_workspace_size", st);
            goto done;
        }
        if (wb_bytes && !(m[M_WB] = cli_buffer(env, wb_bytes, NULL))) goto done;
        if (cli_timer_begin(env, &timer)) goto done;
        ev = NULL;
        st = clnsa_nsa_backward(env->ctx, env->queue, &cfg, &in, &out, &dout, &g, m[M_WB], wb_bytes, 1, &timer.marker,
                                &ev);
        bms = cli_timer_end(&timer, ev);
        if (ev) clReleaseEvent(ev);
        if (st != CLNSA_SUCCESS) cli_report(env, "clnsa_nsa_backward", st);
        if (st != CLNSA_SUCCESS || bms < 0) goto done;

        static const char *const names[] = {"dq.npy", "dk.npy", "dv.npy", "dg_cmp.npy", "dg_slc.npy", "dg_swa.npy",
                                            "dk_cmp.npy", "dv_cmp.npy"};
        const int64_t *shapes[] = {sq, sk, sv, sg, sg, sg, skc, svc};
        const int ranks[] = {4, 4, 4, 3, 3, 3, 4, 4};
        if (!(host_g = cli_malloc((nq > nk ? nq : nk) * (size_t)(f->DK > f->DV ? f->DK : f->DV) * sizeof *host_g)))
            goto done;
        for (int i = M_DQ; i <= M_DVC; ++i) {
            const int j = i - M_DQ;
            if (m[i] && fetch_save(env, m[i], ng[j], dt, o->out, names[j], ranks[j], shapes[j], host_g, wrote,
                                   sizeof wrote))
                goto done;
        }
    }
    char bwd_time[64] = "";
    if (bwd) snprintf(bwd_time, sizeof bwd_time, ", backward %.1f ms", bms);
    printf("clnsa nsa: B=%d T=%d HQ=%d H=%d DK=%d DV=%d %s%s, branches%s%s%s, device %d:%d (forward %.1f ms%s, one "
           "cold run each); wrote%s to %s\n",
           f->B, f->T, f->HQ, f->H, f->DK, f->DV, clnsa_dtype_name(dt), f->cu ? " varlen" : "",
           p->on[GATE_CMP] ? " cmp" : "", p->on[GATE_SLC] ? " slc" : "", p->on[GATE_SWA] ? " swa" : "", env->plat_index,
           env->dev_index, ms, bwd_time, wrote, o->out);
    rc = CLI_OK;
done:
    free(host_o), free(host_lse), free(host_bi), free(host_g);
    for (int i = 0; i < M_N; ++i)
        if (m[i]) clReleaseMemObject(m[i]);
    return rc;
}

static void usage(const cli_opt *opts, size_t n)
{
    printf("usage: clnsa nsa --in DIR --out DIR [options]\n"
           "Runs the NSA forward on .npy files. DIR (--in) holds q.npy [B,T,HQ,DK], k.npy [B,T,H,DK] and\n"
           "v.npy [B,T,H,DV] (any float dtype; converted to --dtype) and optionally g_cmp.npy, g_slc.npy,\n"
           "g_swa.npy [B,T,HQ], cu_seqlens.npy [N+1] (int32/int64, B=1), block_indices.npy [B,T,H,S] (int;\n"
           "no top-k then), block_counts.npy [B,T,H] and k_cmp.npy/v_cmp.npy [B,NC,H,D] (given compression).\n"
           "Without gate files every branch runs with a gate of 1 (the window branch when --window > 0);\n"
           "with some, exactly the branches that have one run. --only runs one branch with a gate of 1\n"
           "and ignores the gate files.\n"
           "Writes o.npy (float32), lse_cmp.npy (float32, when the cmp branch ran) and block_indices.npy\n"
           "(int32, the selection used, when the slc branch ran) to the --out DIR (created if needed).\n"
           "With do.npy [B,T,HQ,DV] (the output gradient) in DIR, the backward runs too and writes the\n"
           "float32 gradients dq.npy, dk.npy, dv.npy, dg_cmp.npy, dg_slc.npy and dg_swa.npy (of the\n"
           "branches that ran; no dg with --only, whose gate is a constant) and dk_cmp.npy/dv_cmp.npy\n"
           "(when k_cmp.npy/v_cmp.npy were given; else their gradient flows into dk/dv through the mean\n"
           "pooling). --only topk takes no do.npy.\n\n");
    cli_print_opts(stdout, opts, n);
}

int cmd_nsa(int argc, char **argv)
{
    nsa_opts o = {NULL, NULL, NULL, 64, 0, 0, 0, 0, 1, 2, 0.0, 0, -1};
    const cli_opt opts[] = {
        {"--in", OPT_STRING, &o.in, 0, 0, NULL, "DIR", "input folder (required)"},
        {"--out", OPT_STRING, &o.out, 0, 0, NULL, "DIR", "output folder (required)"},
        {"--block-size", OPT_INT, &o.block_size, 1, 1 << 20, NULL, "N", "selection block (64)"},
        {"--block-count", OPT_INT, &o.block_count, 1, 1024, NULL, "N", "selected blocks per query (16, or S of block_indices.npy)"},
        {"--window", OPT_INT, &o.window, 0, 1 << 30, NULL, "N", "sliding window, 0 = off (0)"},
        {"--cmp-block", OPT_INT, &o.cmp_block, 0, 1 << 20, NULL, "N", "compression block (block size)"},
        {"--cmp-stride", OPT_INT, &o.cmp_stride, 0, 1 << 20, NULL, "N", "compression stride (block size)"},
        {"--init-blocks", OPT_INT, &o.init_blocks, 0, 1 << 20, NULL, "N", "forced leading blocks (1)"},
        {"--local-blocks", OPT_INT, &o.local_blocks, 0, 1 << 20, NULL, "N", "forced blocks ending at the query's (2)"},
        {"--scale", OPT_DOUBLE, &o.scale, 0, 0, NULL, "X", "softmax scale (1/sqrt(DK))"},
        {"--dtype", OPT_CHOICE, &o.dtype, 0, 0, "f32|f16|bf16", NULL, "storage type on the device (f32)"},
        {"--only", OPT_CHOICE, &o.only, 0, 0, "cmp|slc|swa|topk", NULL,
         "one branch, ungated (topk: write only block_indices.npy)"},
        {"--device", OPT_STRING, &o.device, 0, 0, NULL, "P:D", "OpenCL platform:device (default: see clnsa devices)"},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];
    int rc = cli_parse("nsa", argc, argv, 2, opts, nopts, NULL);
    if (rc < 0) {
        usage(opts, nopts);
        return CLI_OK;
    }
    if (rc) return rc;
    if (!o.in || !o.out) {
        fprintf(stderr, "clnsa nsa: --in DIR and --out DIR are required (see clnsa nsa --help)\n");
        return CLI_USAGE;
    }
    if (!cli_param_ok("nsa", "scale", o.scale)) return CLI_USAGE;

    nsa_files f;
    plan p;
    cli_env env;
    memset(&env, 0, sizeof env);
    rc = CLI_FAIL;
    if (nsa_files_load(o.in, &f)) goto done;
    int S = o.block_count ? o.block_count : 16; /* 0: not given */
    if (f.bidx) {
        if (o.block_count && o.block_count != f.S) {
            char path[4096];
            fprintf(stderr, "%s: S = %d selected blocks per query, but --block-count is %d\n",
                    cli_path(o.in, "block_indices.npy", path, sizeof path), f.S, o.block_count);
            goto done;
        }
        S = f.S;
    }
    if (nsa_files_check(&f, o.block_size, o.cmp_stride ? o.cmp_stride : o.block_size) || make_plan(&o, &f, &p)) goto done;
    if (cli_mkdirs(o.out) || cli_open(&env, o.device)) goto done;
    rc = run(&o, &f, &p, S, &env);
done:
    cli_close(&env);
    nsa_files_free(&f);
    return rc;
}
