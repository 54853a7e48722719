/* nsa_fwd.c: the NSA forward: compression, online top-k, then one fused
 * kernel for the three branches. Every kernel is built and given its
 * arguments before the first command is enqueued (op_plan), so a failure
 * enqueues nothing. */
#include "nsa.h"

#include <stdio.h>
#include <stdarg.h>
#include <string.h>

static const char *const topk_files[] = {"common.h", "nsa_ranges.h", "nsa_topk.cl", NULL};
static const char *const topk_warp_files[] = {WARP_KERNEL_HEADERS,
                                              "nsa_ranges.h", "nsa_topk_list.h", "nsa_topk_warp.h", "nsa_topk_warp.cl", NULL};
const char *const nsa_fwd_files[] = {"common.h", "attn_tile.h", "nsa_ranges.h", "nsa_fwd.cl", NULL};
static const char *const fwd_warp_files[] = {WARP_KERNEL_HEADERS, "nsa_ranges.h", "nsa_fwd_warp.cl", NULL};
static const char *const fused_fwd_warp_files[] = {WARP_KERNEL_HEADERS,
                                                   "nsa_ranges.h", "nsa_topk_list.h", "nsa_topk_warp.h", "nsa_fwd_warp.cl", NULL};
static const char *const cmp_topk_wgmma_files[] = {"common.h",     "warp_mma.h",      "warp_softmax.h", "warpgroup_mma.h",
                                                   "nsa_ranges.h", "nsa_topk_list.h", "nsa_cmp_topk_wgmma.cl", NULL};
static const char *const dq_warp_files[] = {WARP_KERNEL_HEADERS, "nsa_ranges.h", "nsa_bwd_dq_warp.cl", NULL};

static size_t append(char *buf, size_t size, size_t n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t append(char *buf, size_t size, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = n < size ? vsnprintf(buf + n, size - n, fmt, ap) : 0;
    va_end(ap);
    return n + (w > 0 ? (size_t)w : 0);
}

void nsa_branch_defines(const nsa_problem *pb, const clnsa_nsa_inputs *in, char *buf, size_t size)
{
    const clnsa_nsa_config *c = &pb->cfg;
    nsa_base_defines(pb, buf, size);
    append(buf, size, strlen(buf),
           "#define G %d\n#define DK %d\n#define DV %d\n#define HAS_CMP %d\n#define HAS_SLC %d\n#define HAS_SWA %d\n"
           "#define HAS_COUNTS %d\n#define BS %d\n#define S %d\n#define CMP_L %d\n#define CMP_D %d\n#define WINDOW %d\n"
           "#define INIT_BLOCKS %d\n#define LOCAL_BLOCKS %d\n",
           pb->G, pb->DK, pb->DV, pb->has_cmp, pb->has_slc, pb->has_swa, tensor_present(&in->block_counts) ? 1 : 0,
           c->block_size, pb->S, c->cmp_block, c->cmp_stride, c->window > 0 ? c->window : 1, c->init_blocks,
           c->local_blocks);
}

/* The warp kernels' defines: warps per group, head tiles, key chunk, how
 * their matrix operations run, and the Q K^T accumulation chains
 * (warp_attn.h's QK_CHAINS: 2 for the forward, its prologue and the top-k,
 * 1 where registers are short). */
static void warp_defines(const nsa_problem *pb, const warp_params *wp, int qk_chains, char *buf, size_t size)
{
    append(buf, size, strlen(buf), "#define NW %zu\n#define NGT %d\n#define KC %d\n#define MMA_NV %d\n#define QK_CHAINS %d\n",
           wp->wg / 32, (pb->G + 15) / 16, wp->kc, pb->warp == WARP_NV ? 1 : 0, qk_chains);
}

/* Whether the selected branch reads its K rows in whole lines (warp_attn.h's
 * K_LINES): in the forward given its selection, 16-bit types, DK a
 * multiple of 64 (the kernel reads fragments otherwise). On the H200
 * at the anchor's shape (2026-11-29) that forward took 1.67 ms at 8k and
 * 14.65 at 64k against 1.74 and 14.85; the forward that runs the top-k
 * lost 2% with it (1.85 against 1.81 at 8k), ptxas keeping fewer of its
 * reads in flight, so it keeps the fragment reads. Not for want of
 * registers: built from its PTX with none capped it took 167, and lost
 * the same (H100, 8k: 1.82 against 1.79-1.81 ms, 2026-12-05). */
static int k_lines(const nsa_problem *pb, bool lean)
{
    return lean && pb->has_slc && pb->dtype != CLNSA_DTYPE_F32 && pb->DK % 64 == 0;
}

/* Whether the forward's warp kernel runs the top-k itself (FUSED_TOPK in
 * nsa_fwd_warp.cl): the compressed branch is on (its log-sum-exp is the
 * top-k's first pass), one head tile (G <= 16), a list in registers
 * (S <= 32), and the top-k's scores fit in local memory beside the
 * forward's (chunks of the top-k family's JB blocks). CLNSA_FUSED_TOPK=0
 * keeps the separate kernel (for comparisons). */
static void choose_fused_topk(clnsa_context *ctx, nsa_problem *pb)
{
    pb->fused_topk = false;
    if (pb->warp == WARP_OFF || !pb->run_topk || !pb->has_cmp || !nsa_topk_fuses(pb->G, pb->S) ||
        cx_env_int("CLNSA_FUSED_TOPK", 1) == 0)
        return;
    tune_problem tpb = nsa_tune_problem(pb);
    warp_params fwd, topk;
    if (tune_nsa_warp(ctx, TF_NSA_TOPK_WARP, &tpb, &topk) != CLNSA_SUCCESS) return;
    tpb.fused_jb = topk.jb; /* the fused family's choice fits with the top-k's scores (nsa_tune_problem then says the same) */
    if (tune_nsa_warp(ctx, TF_NSA_FWD_FUSED_WARP, &tpb, &fwd) != CLNSA_SUCCESS) return;
    pb->fused_topk = true;
    pb->topk_jb = topk.jb;
    pb->topk_pc_max = topk.pc_max;
}

static clnsa_status plan_topk(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                              const clnsa_nsa_outputs *out, const clnsa_tensor *kc, cl_mem ws, const nsa_workspace *lay)
{
    const tune_problem tpb = nsa_tune_problem(pb);
    char defines[2048];
    nsa_branch_defines(pb, in, defines, sizeof defines);
    warp_params wp;
    topk_params tp;
    const bool warp = pb->warp != WARP_OFF;
    if ((warp ? tune_nsa_warp(ctx, TF_NSA_TOPK_WARP, &tpb, &wp) : tune_nsa_topk(ctx, &tpb, &tp)) != CLNSA_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device: top-k needs more local memory than the %llu bytes it has",
                       (unsigned long long)ctx->info.local_mem_size);
    if (warp) {
        warp_defines(pb, &wp, 2, defines, sizeof defines);
        append(defines, sizeof defines, strlen(defines), "#define JB %d\n#define PC_MAX %lld\n", wp.jb, (long long)wp.pc_max);
    } else {
        append(defines, sizeof defines, strlen(defines), "#define WG %zu\n#define GT %d\n#define TK %d\n#define JB %d\n#define PC_MAX %lld\n",
               tp.wg, tp.gt, tp.tk, tp.jb, (long long)tp.pc_max);
    }
    const size_t wg = warp ? wp.wg : tp.wg;
    cl_program prog;
    kargs a;
    /* a work-group per token on the portable path, a warp per token on the warp path */
    const size_t per_token = warp ? 32 : wg;
    clnsa_status st = program_get(ctx, warp ? topk_warp_files : topk_files, defines, &prog);
    if (st == CLNSA_SUCCESS)
        st = plan_add_kernel(ctx, p, prog, "nsa_topk", (size_t[3]){per_token * (size_t)pb->T, (size_t)pb->H, (size_t)pb->B},
                             wg, &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    ka_tensor(&a, &in->q);
    ka_tensor(&a, kc);
    ka_int(&a, pb->nc_rows);
    nsa_seq_args(&a, pb, in, ws, lay->cmp_off);
    ka_tensor(&a, &in->block_counts);
    ka_tensor(&a, &out->block_indices);
    ka_int(&a, pb->T);
    ka_float(&a, pb->cfg.scale);
    return plan_args_done(ctx, &a, "nsa_topk arguments");
}

/* The forward without the selected branch (nor the top-k) whose
 * work-group's warps share a tile of the compressed rows (CMP_TILE). */
static bool cmp_tiled(const nsa_problem *pb, attn_kind kind, bool fused)
{
    return kind == ATTN_FWD && !fused && !pb->has_slc && pb->cmp_tile;
}

/* The tuning family of a per-query warp kernel, tuned apart by use: the
 * forward that runs the top-k; the forward without the selected branch
 * whose work-group shares a compressed tile (cmp_tiled); the
 * backward's prologue; the forward given its selection, with the
 * compressed branch and without it; dq, keeping the compressed branch's dS
 * or recomputing it. */
static int warp_family_of(const nsa_problem *pb, attn_kind kind, bool fused)
{
    if (fused) return TF_NSA_FWD_FUSED_WARP;
    if (cmp_tiled(pb, kind, fused)) return TF_NSA_FWD_CMP_TILE_WARP;
    if (kind == ATTN_BWD_PRE) return TF_NSA_BWD_PRE_WARP;
    if (kind == ATTN_DQ) return pb->has_cmp && !pb->dsc_keep ? TF_NSA_DQ_RECOMPUTE_WARP : TF_NSA_DQ_WARP;
    return pb->has_cmp ? TF_NSA_FWD_CMP_WARP : TF_NSA_FWD_WARP;
}

/* A per-query kernel's leading arguments (nsa_ranges.h's NSA_QUERY_ARGS);
 * bidx NULL: none. */
static void query_args(kargs *a, const nsa_problem *pb, const clnsa_nsa_inputs *in, const clnsa_tensor *kc,
                       const clnsa_tensor *vc, const clnsa_tensor *bidx, cl_mem ws, const nsa_workspace *lay)
{
    const clnsa_tensor none = {0};
    ka_tensor(a, &in->q);
    ka_tensor(a, &in->k);
    ka_tensor(a, &in->v);
    ka_tensor(a, pb->has_cmp ? kc : &none);
    ka_tensor(a, pb->has_cmp ? vc : &none);
    ka_int(a, pb->nc_rows);
    ka_tensor(a, &in->g_cmp);
    ka_tensor(a, &in->g_slc);
    ka_tensor(a, &in->g_swa);
    nsa_seq_args(a, pb, in, ws, lay->cmp_off);
    ka_tensor(a, bidx ? bidx : &none);
    ka_tensor(a, &in->block_counts);
}

/* The forward's arguments after them (NSA_FWD_OUT_ARGS): o, the lse and
 * the saved outputs of the branches the program runs (o_cmp also where
 * the split's second half reads its partial from it). */
static void fwd_out_args(kargs *a, const nsa_problem *pb, const clnsa_nsa_outputs *out)
{
    const clnsa_tensor none = {0};
    const bool on[3] = {pb->has_cmp, pb->has_slc, pb->has_swa};
    const clnsa_tensor *lse[3] = {&out->lse_cmp, &out->lse_slc, &out->lse_swa};
    const clnsa_tensor *saves[3] = {&out->o_cmp, &out->o_slc, &out->o_swa};
    ka_tensor(a, &out->o);
    for (int i = 0; i < 3; ++i) ka_tensor(a, on[i] ? lse[i] : &none);
    ka_int(a, pb->T);
    ka_float(a, pb->cfg.scale);
    for (int i = 0; i < 3; ++i)
        ka_tensor(a, on[i] || (i == 0 && pb->add_partial == PARTIAL_IN_O_CMP) ? saves[i] : &none);
}

clnsa_status nsa_plan_query_kernel(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                                   const char *const *files, const char *name, attn_kind kind, int acc_dim,
                                   const clnsa_tensor *stored, bool saves_aligned, const clnsa_tensor *kc,
                                   const clnsa_tensor *vc, const clnsa_tensor *bidx, cl_mem ws, const nsa_workspace *lay,
                                   kargs *a)
{
    const tune_problem tpb = nsa_tune_problem(pb);
    const bool warp = pb->warp != WARP_OFF;
    const bool fused = kind == ATTN_FWD && pb->fused_topk;
    const int warp_family = warp_family_of(pb, kind, fused);
    char defines[2048];
    nsa_branch_defines(pb, in, defines, sizeof defines);
    size_t g[3] = {0, (size_t)pb->H, (size_t)pb->B}, wg;
    warp_params wp;
    attn_params ap;
    if ((warp ? tune_nsa_warp(ctx, warp_family, &tpb, &wp) : tune_nsa_attn(ctx, &tpb, kind, &ap)) != CLNSA_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_UNSUPPORTED_DEVICE, "device: %s needs more local memory than the %llu bytes it has", name,
                       (unsigned long long)ctx->info.local_mem_size);
    if (warp) { /* one warp per token and head tile */
        warp_defines(pb, &wp, kind == ATTN_DQ ? 1 : 2, defines, sizeof defines);
        append(defines, sizeof defines, strlen(defines),
               "#define BWD_PRE %d\n#define OUT_VEC %d\n#define SAVE_VEC %d\n#define ADD_PARTIAL %d\n#define WRITE_PARTIAL %d\n"
               "#define SLC_SORT %d\n",
               kind == ATTN_BWD_PRE, stored && tensor_rows_aligned(stored), saves_aligned,
               kind == ATTN_FWD ? (int)pb->add_partial : 0, kind == ATTN_FWD && pb->write_partial,
               kind == ATTN_FWD && !fused && cx_env_int("CLNSA_SLC_SORT", 1) != 0);
        if (fused)
            append(defines, sizeof defines, strlen(defines), "#define FUSED_TOPK 1\n#define JB %d\n#define PC_MAX %lld\n",
                   pb->topk_jb, (long long)pb->topk_pc_max);
        /* V rows loaded with K rows (V_EARLY), or copied into a local tile
         * (V_STAGE), and whole chunks unguarded (warp_attn.h): V_EARLY's
         * registers pay only where the top-k does not share the kernel and
         * the selected branch runs; V_STAGE everywhere else; whole chunks in
         * every branch without the top-k, only the selected one's with it */
        const bool lean = kind == ATTN_FWD && !fused;
        const bool staged = kind == ATTN_FWD && (fused || !pb->has_slc);
        append(defines, sizeof defines, strlen(defines),
               "#define K_LINES %d\n#define CMP_TILE %d\n#define V_EARLY %d\n#define V_STAGE %d\n#define ACC_TRANS %d\n"
               "#define WHOLE_SLC %d\n#define WHOLE_CMP_SWA %d\n",
               k_lines(pb, lean), cmp_tiled(pb, kind, fused), lean && !staged, staged,
               staged || kind == ATTN_DQ /* dq: dS K from local K tiles */, lean || fused, lean);
        if (kind == ATTN_DQ) /* the selected and compressed branches' dS from their dk/dv passes */
            append(defines, sizeof defines, strlen(defines), "#define DS_KEEP %d\n#define KSP %d\n#define DSC_KEEP %d\n",
                   pb->ds_keep, nsa_ds_row(pb), pb->dsc_keep);
        files = kind == ATTN_DQ ? dq_warp_files : fused ? fused_fwd_warp_files : fwd_warp_files;
        wg = wp.wg;
        g[0] = 32 * (size_t)pb->T * (size_t)((pb->G + 15) / 16);
    } else {
        const int ngt = (pb->G + ap.gt - 1) / ap.gt, acc_n = (int)((ap.gt * acc_dim + ap.wg - 1) / ap.wg);
        append(defines, sizeof defines, strlen(defines),
               "#define WG %zu\n#define GT %d\n#define NGT %d\n#define TK %d\n#define ACC_N %d\n#define DQ_N %d\n#define BWD_PRE %d\n"
               "#define DS_KEEP %d\n#define KSP %d\n",
               ap.wg, ap.gt, ngt, ap.tk, acc_n, acc_n, kind == ATTN_BWD_PRE, kind == ATTN_DQ && pb->ds_keep, nsa_ds_row(pb));
        wg = ap.wg;
        g[0] = ap.wg * (size_t)pb->T * (size_t)ngt;
    }
    cl_program prog;
    clnsa_status st = program_get(ctx, files, defines, &prog);
    if (st == CLNSA_SUCCESS) st = plan_add_kernel(ctx, p, prog, name, g, wg, a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    query_args(a, pb, in, kc, vc, pb->has_slc ? bidx : NULL, ws, lay);
    return CLNSA_SUCCESS;
}

static clnsa_status plan_attn(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                              const clnsa_nsa_outputs *out, const clnsa_tensor *kc, const clnsa_tensor *vc, cl_mem ws,
                              const nsa_workspace *lay)
{
    const clnsa_tensor *bidx = tensor_present(&in->block_indices) ? &in->block_indices : &out->block_indices;
    const bool on[3] = {pb->has_cmp, pb->has_slc, pb->has_swa};
    const clnsa_tensor *saves[3] = {&out->o_cmp, &out->o_slc, &out->o_swa};
    bool saves_aligned = true;
    for (int i = 0; i < 3; ++i)
        if (on[i] && tensor_present(saves[i]) && !tensor_rows_aligned(saves[i])) saves_aligned = false;
    kargs a;
    clnsa_status st = nsa_plan_query_kernel(ctx, p, pb, in, nsa_fwd_files, "nsa_fwd", ATTN_FWD, pb->DV, &out->o,
                                            saves_aligned, kc, vc, bidx, ws, lay, &a);
    if (st != CLNSA_SUCCESS) return st;
    fwd_out_args(&a, pb, out);
    return plan_args_done(ctx, &a, "nsa_fwd arguments");
}

/* The split forward: the compressed branch alone (writing o_cmp, ungated,
 * into o or the caller's o_cmp: within the storage type's range whatever
 * the gates, f16's too), the top-k, then the forward given the selection,
 * which adds g_cmp times it to its branches (ADD_PARTIAL). On Hopper the
 * first two are one warpgroup kernel (nsa_cmp_topk_wgmma.cl), elsewhere the
 * warp kernels. It loses the overlap of the selected branch with them that
 * the fused kernel has, which wins at short lengths: it runs from the
 * length the tuning database names (nsa_fwd_split's MIN_T: on the H200
 * 12k, and 16k with the window, 2026-12-01, tuning/README.md), never where
 * it names none. CLNSA_SPLIT_FWD=1 forces it at any T, CLNSA_SPLIT_FWD=0
 * turns it off (comparisons). */
typedef enum { SPLIT_NONE, SPLIT_WARP, SPLIT_WGMMA } split_mode;

/* The shapes nsa_cmp_topk_wgmma.cl is written for (its #error line), on a
 * device that runs it, in a forward that runs the compressed branch and
 * the top-k. */
static bool cmp_topk_wgmma_shape(const clnsa_context *ctx, const nsa_problem *pb)
{
    const clnsa_nsa_config *c = &pb->cfg;
    return pb->has_cmp && pb->run_topk && device_wgmma(ctx) && pb->warp == WARP_NV && pb->dtype != CLNSA_DTYPE_F32 &&
           pb->G == 16 && pb->DK == 128 && pb->DV == 128 && pb->S <= 32 && !pb->varlen && c->cmp_block == c->block_size &&
           c->cmp_stride == c->block_size;
}

/* Its stages: WGMMA_KC compressed keys of DK dims, a K and a V stage a
 * chunk in the image (nsa_cmp_topk_wgmma.cl's chunk_tile). */
#define WGMMA_KC 32
size_t nsa_cmp_tiles_bytes(const clnsa_context *ctx, const nsa_problem *pb)
{
    if (!cmp_topk_wgmma_shape(ctx, pb)) return 0;
    const size_t chunks = (size_t)pb->B * (size_t)pb->H * (size_t)((pb->nc_rows + WGMMA_KC - 1) / WGMMA_KC);
    return chunks * 2 * WGMMA_KC * (size_t)pb->DK * nsa_elem_bytes(pb); /* a K stage and a V stage a chunk */
}

/* Whether nsa_cmp_topk_wgmma.cl takes the call: its shapes, and rows it
 * reads and writes in aligned pieces (16 bytes, the fragments' words). */
static bool cmp_topk_wgmma_fits(const clnsa_context *ctx, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                                const clnsa_nsa_outputs *out, const clnsa_tensor *kc, const clnsa_tensor *vc)
{
    const clnsa_tensor *rows[] = {&in->q, kc, vc, &out->o, &out->o_cmp};
    if (!cmp_topk_wgmma_shape(ctx, pb)) return false;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i)
        if (!tensor_rows_aligned(rows[i])) return false;
    return true;
}

static split_mode choose_split(clnsa_context *ctx, const nsa_problem *pb, const clnsa_nsa_inputs *in,
                               const clnsa_nsa_outputs *out, const clnsa_tensor *kc, const clnsa_tensor *vc)
{
    const int asked = cx_env_int("CLNSA_SPLIT_FWD", -1);
    if (!pb->has_cmp || !pb->run_topk || pb->warp == WARP_OFF || asked == 0) return SPLIT_NONE;
    const tune_problem tp = nsa_tune_problem(pb);
    tune_choice from;
    if (asked != 1 && (tune_choose(ctx, TF_NSA_FWD_SPLIT, &tp, &from) != CLNSA_SUCCESS || pb->T < from.v[0]))
        return SPLIT_NONE;
    return cmp_topk_wgmma_fits(ctx, pb, in, out, kc, vc) ? SPLIT_WGMMA : SPLIT_WARP;
}

/* nsa_cmp_topk_wgmma.cl: nsa_cmp_tiles writes the image of the compressed
 * K/V into the workspace, then a persistent grid of a work-group a compute
 * unit (one producer and three consumer warpgroups, stages of 32 keys)
 * copies its stages from it. */
static clnsa_status plan_cmp_topk_wgmma(clnsa_context *ctx, op_plan *p, const nsa_problem *pb,
                                        const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *out,
                                        const clnsa_tensor *kc, const clnsa_tensor *vc, cl_mem ws,
                                        const nsa_workspace *lay)
{
    enum { NCONS = 3, WG = 128 * (NCONS + 1) };
    char defines[2048];
    nsa_branch_defines(pb, in, defines, sizeof defines);
    append(defines, sizeof defines, strlen(defines),
           "#define MMA_NV 1\n#define WGMMA_NV 1\n#define WG_MAXNREG 128\n#define NH %d\n#define NCONS %d\n#define KC %d\n"
           "#define NSTK 3\n#define NSTV 2\n#define FUSED_TOPK 1\n",
           pb->H, NCONS, WGMMA_KC);
    const size_t tiles = (size_t)((pb->T + 4 * NCONS - 1) / (4 * NCONS)) * (size_t)pb->H * (size_t)pb->B;
    const size_t pieces = nsa_cmp_tiles_bytes(ctx, pb) / 16, tiles_at = lay->cmp_tiles / nsa_elem_bytes(pb);
    size_t groups = ctx->info.compute_units ? ctx->info.compute_units : 1;
    if (groups > tiles) groups = tiles;
    cl_program prog;
    kargs a;
    clnsa_status st = program_get(ctx, cmp_topk_wgmma_files, defines, &prog);
    if (st == CLNSA_SUCCESS) st = plan_add_kernel(ctx, p, prog, "nsa_cmp_tiles", (size_t[3]){pieces, 1, 1}, 256, &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    ka_tensor(&a, kc);
    ka_tensor(&a, vc);
    ka_int(&a, pb->nc_rows);
    ka_int(&a, pb->B);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)tiles_at);
    st = plan_args_done(ctx, &a, "nsa_cmp_tiles arguments");
    if (st == CLNSA_SUCCESS)
        st = plan_add_kernel(ctx, p, prog, "nsa_cmp_topk_wgmma", (size_t[3]){WG * groups, 1, 1}, WG, &a, pb->idx_long);
    if (st != CLNSA_SUCCESS) return st;
    query_args(&a, pb, in, kc, vc, &out->block_indices, ws, lay);
    fwd_out_args(&a, pb, out);
    ka_int(&a, pb->B);
    ka_mem(&a, ws);
    ka_idx(&a, (int64_t)tiles_at);
    return plan_args_done(ctx, &a, "nsa_cmp_topk_wgmma arguments");
}

/* The split's steps after the compression. Where the caller saves o_cmp
 * (a training forward) the partial goes there alone, as the first half's
 * o, and the second half reads it from there (ADD_PARTIAL 2), in 16-byte
 * pieces where o_cmp's rows allow them: o is written once, not twice
 * (1 GB less at the anchor's shape at 64k). */
static clnsa_status plan_split(clnsa_context *ctx, op_plan *p, const nsa_problem *pb, split_mode mode,
                               const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *out, const clnsa_tensor *kc,
                               const clnsa_tensor *vc, cl_mem ws, const nsa_workspace *lay)
{
    nsa_problem first = *pb, rest = *pb;
    first.has_slc = first.has_swa = false;
    first.fused_topk = rest.fused_topk = false;
    first.write_partial = true;
    rest.has_cmp = false;
    clnsa_nsa_outputs first_out = *out;
    if (tensor_present(&out->o_cmp) && tensor_rows_aligned(&out->o_cmp)) {
        first_out.o = out->o_cmp;
        first_out.o_cmp = (clnsa_tensor){0};
        rest.add_partial = PARTIAL_IN_O_CMP;
    } else {
        rest.add_partial = PARTIAL_IN_O;
    }
    clnsa_status st;
    if (mode == SPLIT_WGMMA) {
        st = plan_cmp_topk_wgmma(ctx, p, &first, in, &first_out, kc, vc, ws, lay);
    } else {
        st = plan_attn(ctx, p, &first, in, &first_out, kc, vc, ws, lay);
        if (st == CLNSA_SUCCESS) st = plan_topk(ctx, p, pb, in, out, kc, ws, lay);
    }
    return st == CLNSA_SUCCESS ? plan_attn(ctx, p, &rest, in, out, kc, vc, ws, lay) : st;
}

clnsa_status nsa_check_workspace(clnsa_context *ctx, const nsa_workspace *lay, cl_mem ws, size_t ws_bytes)
{
    if (lay->total == 0) return CLNSA_SUCCESS;
    size_t have = 0;
    if (!ws || clGetMemObjectInfo(ws, CL_MEM_SIZE, sizeof have, &have, NULL) != CL_SUCCESS)
        return cx_fail(ctx, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace: expected a buffer of %zu bytes, got %s", lay->total,
                       ws ? "an invalid cl_mem" : "NULL");
    if (ws_bytes < lay->total || have < lay->total)
        return cx_fail(ctx, CLNSA_ERROR_WORKSPACE_TOO_SMALL, "workspace: expected at least %zu bytes, got %zu (buffer holds %zu)",
                       lay->total, ws_bytes, have);
    return CLNSA_SUCCESS;
}

clnsa_status clnsa_nsa_forward_workspace_size(clnsa_context *ctx, cl_command_queue queue, const clnsa_nsa_config *config,
                                              const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *out, size_t *bytes)
{
    CHECK(cx_size_query(ctx, bytes));
    nsa_problem pb;
    nsa_workspace lay;
    clnsa_status st = nsa_validate(ctx, config, in, out, false, &pb);
    if (st == CLNSA_SUCCESS) st = nsa_plan_workspace(ctx, queue, &pb, true, &lay);
    *bytes = st == CLNSA_SUCCESS ? lay.total : 0;
    return st;
}

clnsa_status clnsa_nsa_forward(clnsa_context *ctx, cl_command_queue queue, const clnsa_nsa_config *config,
                               const clnsa_nsa_inputs *in, const clnsa_nsa_outputs *out, cl_mem workspace,
                               size_t workspace_bytes, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    clnsa_status begun = op_begin(ctx, queue, nwait, wait, event);
    if (begun != CLNSA_SUCCESS) return begun;
    nsa_problem pb;
    nsa_workspace lay;
    clnsa_status st = nsa_validate(ctx, config, in, out, false, &pb);
    if (st == CLNSA_SUCCESS) st = nsa_plan_workspace(ctx, queue, &pb, true, &lay);
    if (st == CLNSA_SUCCESS) st = nsa_check_workspace(ctx, &lay, workspace, workspace_bytes);
    if (st != CLNSA_SUCCESS) return st;

    clnsa_tensor kc = {0}, vc = {0};
    if (pb.need_cmp) nsa_cmp_views(&pb, in, workspace, &lay, &kc, &vc);
    op_plan plan = {0};
    pb.cmp_tile = pb.has_cmp && pb.warp != WARP_OFF && nsa_cmp_tile_on();
    const split_mode split = choose_split(ctx, &pb, in, out, &kc, &vc);
    if (split == SPLIT_NONE) choose_fused_topk(ctx, &pb);
    st = nsa_plan_compress(ctx, &plan, &pb, in, workspace, &lay);
    if (st == CLNSA_SUCCESS && split != SPLIT_NONE) {
        st = plan_split(ctx, &plan, &pb, split, in, out, &kc, &vc, workspace, &lay);
    } else {
        if (st == CLNSA_SUCCESS && pb.run_topk && !pb.fused_topk)
            st = plan_topk(ctx, &plan, &pb, in, out, &kc, workspace, &lay);
        if (st == CLNSA_SUCCESS) st = plan_attn(ctx, &plan, &pb, in, out, &kc, &vc, workspace, &lay);
    }
    return plan_run(ctx, &plan, st, queue, nwait, wait, event);
}
