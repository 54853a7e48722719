/* params.c: the kernel families' tunable parameters, the values the tuner
 * tries, their constraints, and the safe default: the hand-written choice
 * (128 work-items on a GPU, 64 elsewhere; 16 heads and 32 keys per tile)
 * shrunk step by step until it fits the device's local memory, so it fits
 * any OpenCL 1.2 device. CLNSA_TUNE_WG and CLNSA_TUNE_TK change where the
 * safe default starts (its work-group size and key tile). database.c picks
 * among the sources; tune_fits is the one check every candidate passes. */
#include "tuning.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------- local memory */

/* common.h's KPAD: the row stride of a local key tile. */
static size_t kpad(size_t d) { return d + 1; }

/* Floats of local memory each per-query kernel declares (see the .cl):
 * qs[GT*DK], ks[TK*KPAD(DK)], vs[TK*KPAD(DV)], ps[GT*TK], m, l, alpha[GT], and
 * (the prologue) red[GT*DV] or (dq) dos[GT*DV], with ps[GT*2*TK] and 3 floats
 * of padding between ks and vs (nsa_bwd_dq.cl's KEPT_TK, KS_FLOATS). */
static size_t attn_bytes(attn_kind kind, const int *v, const tune_problem *pb)
{
    const size_t gt = (size_t)v[1], tk = (size_t)v[2], dk = (size_t)pb->dk, dv = (size_t)pb->dv;
    size_t f = gt * dk + tk * (kpad(dk) + kpad(dv)) + gt * tk + 3u * gt;
    if (kind != ATTN_FWD) f += gt * dv;
    if (kind == ATTN_DQ) f += gt * tk + 3u;
    return sizeof(float) * f;
}

static size_t fwd_bytes(const int *v, const tune_problem *pb) { return attn_bytes(ATTN_FWD, v, pb); }
static size_t pre_bytes(const int *v, const tune_problem *pb) { return attn_bytes(ATTN_BWD_PRE, v, pb); }
static size_t dq_bytes(const int *v, const tune_problem *pb) { return attn_bytes(ATTN_DQ, v, pb); }

static int64_t topk_pc_max(int jb, const tune_problem *pb)
{
    return ((int64_t)jb * pb->block + pb->cmp_block - 2) / pb->cmp_stride + 2;
}

/* qs[GT*DK], ks[TK*KPAD(DK)], ps[GT*TK], lse[G], pc[PC_MAX], bsc[JB], tv/ti[S]. */
static size_t topk_bytes(const int *v, const tune_problem *pb)
{
    const size_t gt = (size_t)v[1], tk = (size_t)v[2], jb = (size_t)v[3], dk = (size_t)pb->dk;
    return sizeof(float) * (gt * dk + tk * kpad(dk) + gt * tk + (size_t)pb->g + (size_t)topk_pc_max(v[3], pb) + jb +
                            2u * (size_t)pb->S);
}

/* qs[RQ*DK], dos[RQ*DV], ks[TKK*KPAD(DK)], vs[TKK*KPAD(DV)], pp,
 * dss[RQ*TKK], four 4-byte and three 8-byte arrays per row (the third,
 * the kept dS's places, with DS_KEEP; counted always), three per key. */
static size_t dkdv_bytes(const int *v, const tune_problem *pb)
{
    const size_t tkk = (size_t)v[1], rq = (size_t)v[2], dk = (size_t)pb->dk, dv = (size_t)pb->dv;
    return sizeof(float) * (rq * (dk + dv) + tkk * (kpad(dk) + kpad(dv)) + 2u * rq * tkk + 4u * rq + 3u * tkk) +
           3u * sizeof(int64_t) * rq;
}

/* Block-sparse forward: qs[BQ*D], ks[BK*KPAD(D)], vs[BK*KPAD(DV)], ps[BQ*BK], m, l,
 * alpha[BQ], and the int positions / segment ids of both tiles. */
static size_t bs_fwd_bytes(const int *v, const tune_problem *pb)
{
    const size_t bq = (size_t)v[1], bk = (size_t)v[2], d = (size_t)pb->dk, dv = (size_t)pb->dv;
    return sizeof(float) * (bq * d + bk * (kpad(d) + kpad(dv)) + bq * bk + 3u * bq) + sizeof(int) * 2u * (bq + bk);
}

/* Block-sparse backward (dk/dv, the larger): qs[BQ*D], dos[BQ*DV],
 * ks[BK*KPAD(D)], vs[BK*KPAD(DV)], ps and dzs[BQ*BK], lse and delta [BQ],
 * and the ints. */
static size_t bs_bwd_bytes(const int *v, const tune_problem *pb)
{
    const size_t bq = (size_t)v[1], bk = (size_t)v[2], d = (size_t)pb->dk, dv = (size_t)pb->dv;
    return sizeof(float) * (bq * (d + dv) + bk * (kpad(d) + kpad(dv)) + 2u * bq * bk + 2u * bq) +
           sizeof(int) * 2u * (bq + bk);
}

/* Warp kernels: per warp its scratch (WARP_SCRATCH words: (6 * words of
 * a fragment word + 1) * 32 when emulated, else 1) and, in a forward of
 * more than one branch, their gated sum (16 x DV elements of the storage
 * type; floats for f16, whose range a partial sum may leave); in the top-k pc[PC_MAX] and, for S > 32,
 * its list (tv, ti[S]; in registers otherwise). Staged rows hold elements of the storage type:
 * 2 bytes, or 4 for f32 (the TF32 mode). */
static size_t warp_elem_bytes(const tune_problem *pb) { return pb->dtype == CLNSA_DTYPE_F32 ? 4u : 2u; }

/* An element of the forward's sum of the branches (nsa_fwd_warp.cl's
 * sum_word): the storage type's, a float for f16. */
static size_t sum_elem_bytes(const tune_problem *pb) { return pb->dtype == CLNSA_DTYPE_F16 ? 4u : warp_elem_bytes(pb); }

static size_t warp_scratch_bytes(const tune_problem *pb)
{
    return sizeof(cl_uint) * (pb->warp_emulated ? (6u * warp_elem_bytes(pb) / 2u + 1u) * 32u : 1u);
}

/* Row strides of the warp kernels' staged K and V rows, and of dk/dv's
 * Q and dO rows (warp_attn.h's KT_RS, VT_RS): a multiple of 64 elements
 * unpadded (swizzled), others padded by 8. */
static size_t warp_krow(const tune_problem *pb) { return (size_t)pb->dk + (pb->dk % 64 ? 8u : 0u); }
static size_t warp_vrow(const tune_problem *pb) { return (size_t)pb->dv + (pb->dv % 64 ? 8u : 0u); }

/* The warp forward, per warp: the gated outputs' sum where the program
 * runs more than one branch (`sum`), and where it stages V (V_STAGE:
 * nsa_fwd.c's warp defines) its V tile of KC rows; in the same memory, the
 * work-group's compressed tile where `cmp_tile` (CMP_TILE: two chunks of
 * KC K and V rows). */
static size_t warp_fwd_bytes(const int *v, const tune_problem *pb, bool sum, bool v_tile, bool cmp_tile)
{
    const size_t nw = (size_t)(v[0] / 32), e = warp_elem_bytes(pb);
    const size_t vtiles = v_tile ? nw * (size_t)v[1] * warp_vrow(pb) * e : 0u;
    const size_t ctile = cmp_tile ? 2u * (size_t)v[1] * (warp_krow(pb) + warp_vrow(pb)) * e : 0u;
    const size_t outs = sum ? 16u * (size_t)pb->dv * sum_elem_bytes(pb) : 0u;
    return nw * (warp_scratch_bytes(pb) + outs) + (vtiles > ctile ? vtiles : ctile);
}

static bool sums_branches(const tune_problem *pb) { return pb->branches != 1; }

/* The forward given its selection stages V only where no selected branch
 * runs; counting the tile anyway kept WG 128 out of the search where it
 * fits (H100, D 128: 33 KB, not 49). */
static size_t fwd_warp_bytes(const int *v, const tune_problem *pb)
{
    return warp_fwd_bytes(v, pb, sums_branches(pb), !pb->slc, !pb->slc && pb->cmp_tile);
}

/* The backward's prologue never stages V, nor sums the branches. */
static size_t pre_warp_bytes(const int *v, const tune_problem *pb)
{
    return warp_fwd_bytes(v, pb, false, false, false);
}

/* The forward that runs the top-k stages V, and holds the top-k's scores
 * too (PC_MAX floats a warp, from the top-k family's JB), so that a
 * candidate is counted whole: one that fits only without them would make
 * the planner fall back to the separate top-k (choose_fused_topk), and the
 * tuner time that instead. */
static size_t fused_fwd_warp_bytes(const int *v, const tune_problem *pb)
{
    const size_t pc = pb->fused_jb ? (size_t)topk_pc_max(pb->fused_jb, pb) : 0u;
    return warp_fwd_bytes(v, pb, sums_branches(pb), true, false) + (size_t)(v[0] / 32) * sizeof(float) * pc;
}

/* The dq warp kernel: each warp's two tiles of KC K rows (padded as the
 * dk/dv kernel's, below). */
static size_t dq_warp_bytes(const int *v, const tune_problem *pb)
{
    return (size_t)(v[0] / 32) * (warp_scratch_bytes(pb) + 2u * (size_t)v[1] * warp_krow(pb) * warp_elem_bytes(pb));
}

/* The dk/dv warp kernel stages chunks of KC query rows two deep: Q and dO
 * (rows of a multiple of 64 elements unpadded and swizzled, others padded
 * by 8: QPAD, DPAD), four per-row words (lse, D, the gate's word and which
 * half of it) and the selected branch's list entries (counted always);
 * and the tokens three deep, as well as their rows of the kept dS
 * (DS_KEEP; counted always). */
static size_t dkdv_warp_bytes(const int *v, const tune_problem *pb)
{
    const size_t kc = (size_t)v[1], qrow = warp_krow(pb), drow = warp_vrow(pb);
    const size_t entry = sizeof(cl_int), record = 4u * sizeof(cl_uint), ds_place = 2u * sizeof(cl_int);
    return (size_t)(v[0] / 32) * warp_scratch_bytes(pb) + 2u * kc * (warp_elem_bytes(pb) * (qrow + drow) + entry) +
           3u * kc * (record + ds_place); /* a chunk's row records and kept-dS places, three deep */
}

static size_t topk_warp_bytes(const int *v, const tune_problem *pb)
{
    const size_t list = pb->S > 32 ? 2u * (size_t)pb->S : 0u; /* in registers up to 32 entries */
    return (size_t)(v[0] / 32) * (warp_scratch_bytes(pb) + sizeof(float) * (list + (size_t)topk_pc_max(v[2], pb)));
}

/* Element strides of the staged rows (multiples of 8 elements: the kernels
 * read whole chunks of 8). A tile read both ways (as K or Q in a backward:
 * lds_products and lds_accumulate_trans) is unpadded where its rows are a
 * multiple of 64 elements, which the kernels take as the sign to swizzle it
 * (warp_attn.h's tile_col): both reads are then free of bank conflicts
 * (16-bit elements). Otherwise rows are padded for the way each tile is
 * read, and not swizzled: a K row is read by 8 lanes at once (two rows, 16
 * bytes each from 4 lanes): rows 16 words apart modulo 32 banks fall in
 * disjoint banks; a V row by ldmatrix, one 16-byte chunk of 8 consecutive
 * rows at once: rows 4 words apart modulo 16 put the 8 chunks in distinct
 * banks (8 words for 4-byte elements, whose chunks are 32 bytes and which
 * are read element by element). */
void tune_warp_rows(int dk, int dv, int elem_bytes, bool both_ways, int *krow, int *vrow)
{
    const int epw = 4 / elem_bytes;                  /* elements per 4-byte word */
    const int kw = dk / epw, vw = dv / epw, vpad = elem_bytes == 4 ? 8 : 4;
    *krow = both_ways && dk % 64 == 0 ? dk : dk + epw * ((16 - kw % 32 + 32) % 32);
    *vrow = both_ways && dv % 64 == 0 ? dv : dv + epw * ((vpad - vw % 16 + 16) % 16);
}

int tune_bs_bwd_warp_kc(size_t wg, bool dkdv) { return dkdv || wg / 2 < 32 ? 16 : 32; }

/* The block-sparse warp forward: per warp its scratch; two buffers of the
 * staged K and V tiles and the tiles' key positions and segment ids. */
static size_t bs_fwd_warp_bytes(const int *v, const tune_problem *pb)
{
    int krow, vrow;
    tune_warp_rows(pb->dk, pb->dv, (int)warp_elem_bytes(pb), false, &krow, &vrow);
    return (size_t)(v[0] / 32) * warp_scratch_bytes(pb) +
           2u * (size_t)v[1] * (warp_elem_bytes(pb) * (size_t)(krow + vrow) + 2u * sizeof(int));
}

/* The block-sparse warp backward: per warp its scratch; two chunks of KC
 * rows (tune_bs_bwd_warp_kc: dq's, the larger) of DK and of DV elements (dq: K and V, dk/dv: Q and dO) and four words per
 * row (positions, segment ids, lse, delta). */
static size_t bs_bwd_warp_bytes(const int *v, const tune_problem *pb)
{
    int krow, vrow;
    tune_warp_rows(pb->dk, pb->dv, (int)warp_elem_bytes(pb), true, &krow, &vrow);
    const size_t kc = (size_t)tune_bs_bwd_warp_kc((size_t)v[0], false); /* the larger */
    return (size_t)(v[0] / 32) * warp_scratch_bytes(pb) +
           2u * kc * (warp_elem_bytes(pb) * (size_t)(krow + vrow) + 4u * sizeof(int));
}

/* ------------------------------------------------------ safe defaults */

int tune_default_wg(const clnsa_device_info *info)
{
    size_t wg = info->is_gpu ? 128 : 64;
    size_t forced = (size_t)cx_env_int("CLNSA_TUNE_WG", 0);
    if (forced) wg = forced;
    if (wg > info->max_work_group_size) wg = info->max_work_group_size;
    size_t mult = info->preferred_wg_multiple ? info->preferred_wg_multiple : 1;
    if (wg > mult) wg = wg / mult * mult;
    return wg ? (int)wg : 1;
}

static void attn_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    v[0] = tune_default_wg(info);
    v[1] = pb->g < 16 ? pb->g : 16;
    v[2] = cx_env_int("CLNSA_TUNE_TK", 32);
}

/* Pass 1 of the top-k gives each of the GT heads to one work-item: GT <= WG. */
static void topk_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    attn_start(v, pb, info);
    if (v[1] > v[0]) v[1] = v[0];
    v[3] = 32;
}

/* Mesa 22.3's llvmpipe (rusticl, Debian 12) computes wrong dk (NaN in
 * most lanes, wrong values in the first 8) in nsa_bwd_dkdv when a key tile
 * has many query rows (G = 16, T >= 100) and a work-item keeps several
 * accumulators per array (ceil(TKK*D/WG) of 16 and, for some shapes, 8
 * fail; 2 and 4 passed every case tried); PoCL and Oclgrind (with its race
 * and uninitialized-value checks) agree with the reference on the same
 * kernel and inputs. An empirical workaround, not a root cause: on Mesa
 * the work-group grows (up to the device's maximum, 1024 on llvmpipe) or
 * the key tile shrinks until each work-item keeps at most 2. */
#define MESA_DKDV_ACC_MAX 2

static bool mesa_dkdv_ok(const clnsa_device_info *info, const int *v, const tune_problem *pb)
{
    const int64_t dmax = pb->dk > pb->dv ? pb->dk : pb->dv;
    return info->vendor != CLNSA_VENDOR_MESA || ((int64_t)v[1] * dmax + v[0] - 1) / v[0] <= MESA_DKDV_ACC_MAX;
}

static void dkdv_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    v[0] = tune_default_wg(info);
    v[1] = cx_env_int("CLNSA_TUNE_TK", 32);
    v[2] = 16;
    while (!mesa_dkdv_ok(info, v, pb) && (size_t)v[0] * 2 <= info->max_work_group_size) v[0] *= 2;
    while (!mesa_dkdv_ok(info, v, pb) && v[1] > 1) v[1] /= 2;
}

/* Block-sparse tiles (params 1, 2 = BQ, BK): forward 64 x 32, backward
 * 32 x 64 on a GPU, half elsewhere, or as CLNSA_TUNE_BS_* force them; each
 * halved while a work-item of the nominal work-group (128 on a GPU, 64
 * elsewhere: never CLNSA_TUNE_WG, so that the tiles stay put) would keep more
 * than 64 accumulators of a tile row set (BQ*D, BK*D). */
static void bs_start(int *v, const tune_problem *pb, const clnsa_device_info *info, int family, int bq, int bk)
{
    const tune_family *f = &tune_families[family];
    const int fq = cx_env_int(f->tile_env[0], 0), fk = cx_env_int(f->tile_env[1], 0);
    const int dmax = pb->dk > pb->dv ? pb->dk : pb->dv, cap = (info->is_gpu ? 128 : 64) * 64;
    if (!info->is_gpu) bq /= 2, bk /= 2;
    while (fq <= 0 && bq * dmax > cap && bq > 8) bq /= 2;
    while (fk <= 0 && bk * dmax > cap && bk > 8) bk /= 2;
    v[0] = tune_default_wg(info);
    v[1] = fq > 0 ? fq : bq;
    v[2] = fk > 0 ? fk : bk;
}

static void bs_fwd_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    bs_start(v, pb, info, TF_BS_FWD, 64, 32);
}

static void bs_bwd_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    bs_start(v, pb, info, TF_BS_BWD, 32, 64);
}

/* Warp kernels: four warps per work-group on a GPU (emulation: one),
 * chunks of 64 keys, top-k chunks of 64 blocks (the block-sparse forward:
 * 64 query rows by 64 keys). */
static void warp_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    int wg = pb->warp_emulated ? 32 : 128;
    while ((size_t)wg > info->max_work_group_size && wg > 32) wg /= 2;
    v[0] = wg;
    v[1] = 64;
    v[2] = 64;
}

/* dk/dv: chunks of 16 query rows (32 double the score registers). */
static void dkdv_warp_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    warp_start(v, pb, info);
    v[1] = 16;
}

/* The forward given its selection and the backward's prologue: one warp.
 * Their safe default was WG 32 KC 64 while their V tile was counted
 * everywhere (fwd_warp_bytes), and it stays so: on the H100 at 64k that ran
 * 21.1 ms (2026-11-26), WG 128 KC 64 22.1 (2026-11-27). */
static void fwd_warp_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    warp_start(v, pb, info);
    v[0] = 32;
}

/* The forward whose work-group shares a tile of compressed rows: four warps
 * share it, chunks of 16 keys (the tile, two chunks of K and V rows, is 16
 * KB at D 128; KC 64's would not fit 48 KB). */
static void cmp_tile_warp_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    warp_start(v, pb, info);
    v[1] = 16;
}

/* dq keeps two score-sized tiles (P and dP) besides its accumulator: chunks
 * of 32 keys. */
static void dq_warp_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    warp_start(v, pb, info);
    v[1] = 32;
}

/* The forward's path: no local memory. The safe default never splits: the
 * split has been measured ahead only on Hopper, whose crossovers the
 * database holds. */
static size_t no_local_bytes(const int *v, const tune_problem *pb)
{
    (void)v;
    (void)pb;
    return 0;
}

static void split_start(int *v, const tune_problem *pb, const clnsa_device_info *info)
{
    (void)pb;
    (void)info;
    v[0] = TUNE_SPLIT_NEVER;
}

/* ------------------------------------------------------------ the table */

#define WG_PARAM {"WG", {32, 64, 128, 256, 512}, 5, false}
#define GT_PARAM {"GT", {1, 2, 4, 8, 16}, 5, true}
#define TK_PARAM {"TK", {8, 16, 32, 64}, 4, false}
#define BQ_PARAM {"BQ", {8, 16, 32, 64, 128}, 5, false}
#define BK_PARAM {"BK", {8, 16, 32, 64, 128}, 5, false}
#define WARP_WG_PARAM {"WG", {32, 64, 128, 256}, 4, false}
#define KC_PARAM {"KC", {16, 32, 64}, 3, false}
/* Registers: each work-item keeps ceil(GT*D / WG) accumulators (x2 in the
 * forward); the tuner does not try more than 64. */
#define ATTN_FAMILY(name, bytes, acc_dim)                                                          \
    {name, "nsa_fwd", 3, {WG_PARAM, GT_PARAM, TK_PARAM}, 1, {{TC_ACC_LIMIT, 1, acc_dim, 64}}, 2, \
     {{SHRINK_HALVE, 2, 0, 4}, {SHRINK_CEIL_HALVE, 1, 0, 1}}, bytes, attn_start}
/* A warp kernel's family of work-group size and key chunk; the safe default
 * shrinks its warps. */
#define WARP_KC_FAMILY(name, kernel, bytes, start) \
    {name, kernel, 2, {WARP_WG_PARAM, KC_PARAM}, 0, {{0}}, 1, {{SHRINK_HALVE, 0, 0, 32}}, bytes, start}

const tune_family tune_families[TF_COUNT] = {
    [TF_NSA_FWD] = ATTN_FAMILY("nsa_fwd", fwd_bytes, 1),
    [TF_NSA_BWD_PRE] = ATTN_FAMILY("nsa_bwd_pre", pre_bytes, 1),
    [TF_NSA_BWD_DQ] = {"nsa_bwd_dq", "nsa_bwd_dq", 3, {WG_PARAM, GT_PARAM, TK_PARAM}, 1,
                       {{TC_ACC_LIMIT, 1, 0, 64}}, 2, {{SHRINK_HALVE, 2, 0, 4}, {SHRINK_CEIL_HALVE, 1, 0, 1}},
                       dq_bytes, attn_start},
    [TF_NSA_TOPK] = {"nsa_topk", "nsa_topk", 4, {WG_PARAM, GT_PARAM, TK_PARAM, {"JB", {8, 16, 32, 64}, 4, false}}, 1,
                     {{TC_LE_PARAM, 1, 0, 0}}, 3,
                     {{SHRINK_HALVE, 2, 0, 4}, {SHRINK_CEIL_HALVE, 1, 0, 1}, {SHRINK_HALVE, 3, 0, 1}}, topk_bytes,
                     topk_start},
    [TF_NSA_DKDV] = {"nsa_bwd_dkdv", "nsa_bwd_dkdv", 3,
                     {WG_PARAM, {"TKK", {8, 16, 32, 64}, 4, false}, {"RQ", {4, 8, 16, 32}, 4, false}}, 2,
                     {{TC_ACC_LIMIT, 1, 0, 64}, {TC_ACC_LIMIT, 1, 1, 64}}, 1, {{SHRINK_LARGER, 1, 2, 4}},
                     dkdv_bytes, dkdv_start},
    /* Registers: the forward keeps ceil(BQ*DV / WG) accumulators, the
     * backward ceil(BK*D / WG) and ceil(BK*DV / WG) (dk, dv) and
     * ceil(BQ*D / WG) (dq). Local memory: halve the larger tile. */
    [TF_BS_FWD] = {"blocksparse_fwd", "bs_fwd", 3, {WG_PARAM, BQ_PARAM, BK_PARAM}, 1, {{TC_ACC_LIMIT, 1, 1, 64}}, 1,
                   {{SHRINK_LARGER, 2, 1, 1}}, bs_fwd_bytes, bs_fwd_start,
                   {"CLNSA_TUNE_BS_FWD_BQ", "CLNSA_TUNE_BS_FWD_BK"}},
    [TF_BS_BWD] = {"blocksparse_bwd", "bs_bwd_dkdv,bs_bwd_dq", 3, {WG_PARAM, BQ_PARAM, BK_PARAM}, 3,
                   {{TC_ACC_LIMIT, 2, 0, 64}, {TC_ACC_LIMIT, 2, 1, 64}, {TC_ACC_LIMIT, 1, 0, 64}}, 1,
                   {{SHRINK_LARGER, 2, 1, 1}}, bs_bwd_bytes, bs_bwd_start,
                   {"CLNSA_TUNE_BS_BWD_BQ", "CLNSA_TUNE_BS_BWD_BK"}},
    /* Warp kernels: WG is 32 times the warps per work-group; the shrink
     * halves the chunk of keys, then the warps. */
    /* The forward kernel's three uses want different chunks (at 64k on the
     * H200): given its selection, the selected branch alone KC 16 (15.0 ms;
     * KC 32: 15.7), with the compressed branch KC 32 (22.6; KC 16: 24.4;
     * the backward's prologue likewise: 27.4 against 29.0); the forward
     * that runs the top-k, which holds the top-k's state beside its own,
     * KC 16 again (24.9; KC 32: 26.3). The fused one counts the top-k's
     * scores too (fused_fwd_warp_bytes). */
    [TF_NSA_FWD_WARP] = WARP_KC_FAMILY("nsa_fwd_warp", "nsa_fwd", fwd_warp_bytes, fwd_warp_start),
    [TF_NSA_FWD_CMP_WARP] = WARP_KC_FAMILY("nsa_fwd_cmp_warp", "nsa_fwd", fwd_warp_bytes, fwd_warp_start),
    /* Without the selected branch the work-group's warps share a tile of
     * the compressed rows (CMP_TILE), which one warp a work-group shares
     * with nobody: on the H200 at 64k (compressed branch alone) WG 32 KC 32,
     * the pick of the family above, took 10.7 ms, WG 128 KC 16 6.4. Its
     * tile does not shrink with the warps: the safe default halves the
     * chunk first. */
    [TF_NSA_FWD_CMP_TILE_WARP] = {"nsa_fwd_cmp_tile_warp", "nsa_fwd", 2, {WARP_WG_PARAM, KC_PARAM}, 0, {{0}}, 2,
                                  {{SHRINK_HALVE, 1, 0, 16}, {SHRINK_HALVE, 0, 0, 32}}, fwd_warp_bytes, cmp_tile_warp_start},
    [TF_NSA_FWD_FUSED_WARP] = WARP_KC_FAMILY("nsa_fwd_fused_warp", "nsa_fwd", fused_fwd_warp_bytes, warp_start),
    /* The backward's prologue (BWD_PRE: the branch outputs rebuilt where the
     * forward did not save them) is the same kernel at other defines; with
     * the compressed branch it too prefers KC 32 (29.0 -> 27.4 ms, H200,
     * 64k), so it has a family of its own, timed in the backward. */
    [TF_NSA_BWD_PRE_WARP] = WARP_KC_FAMILY("nsa_bwd_pre_warp", "nsa_fwd", pre_warp_bytes, fwd_warp_start),
    [TF_NSA_TOPK_WARP] = {"nsa_topk_warp", "nsa_topk", 3, {WARP_WG_PARAM, KC_PARAM, {"JB", {16, 32, 64, 128}, 4, false}},
                          0, {{0}}, 2, {{SHRINK_HALVE, 2, 0, 8}, {SHRINK_HALVE, 0, 0, 32}}, topk_warp_bytes, warp_start},
    [TF_NSA_DQ_WARP] = WARP_KC_FAMILY("nsa_bwd_dq_warp", "nsa_bwd_dq", dq_warp_bytes, dq_warp_start),
    /* dq's chunks are of one product with the kept dS, of three without:
     * each way has its own best chunk (at 64k on the H200, KC 16 and 32) */
    [TF_NSA_DQ_RECOMPUTE_WARP] = WARP_KC_FAMILY("nsa_bwd_dq_recompute_warp", "nsa_bwd_dq", dq_warp_bytes, dq_warp_start),
    [TF_NSA_DKDV_WARP] = {"nsa_bwd_dkdv_warp", "nsa_bwd_dkdv", 2, {WARP_WG_PARAM, {"KC", {16, 32}, 2, false}}, 0,
                          {{0}}, 2, {{SHRINK_HALVE, 1, 0, 16}, {SHRINK_HALVE, 0, 0, 32}}, dkdv_warp_bytes,
                          dkdv_warp_start},
    [TF_BS_FWD_WARP] = {"blocksparse_fwd_warp", "bs_fwd", 2, {WARP_WG_PARAM, {"BK", {16, 32, 64}, 3, false}}, 0, {{0}}, 1,
                        {{SHRINK_HALVE, 1, 0, 16}}, bs_fwd_warp_bytes, warp_start},
    [TF_BS_BWD_WARP] = {"blocksparse_bwd_warp", "bs_bwd_dkdv,bs_bwd_dq", 1, {WARP_WG_PARAM}, 0, {{0}}, 1,
                        {{SHRINK_HALVE, 0, 0, 32}}, bs_bwd_warp_bytes, warp_start},
    /* MIN_T: the forward splits (the compressed branch and the top-k, then
     * the selected branch) from this length on. No values: the tuner tries
     * the lengths it times, and TUNE_SPLIT_NEVER. With the window the fused
     * forward holds on longer (the H200: 12k without it, 16k with it): the
     * entries' shape names the window. */
    [TF_NSA_FWD_SPLIT] = {"nsa_fwd_split", "*", 1, {{"MIN_T", {0}, 0, false}}, 0, {{0}}, 0, {{0}}, no_local_bytes,
                          split_start, {NULL, NULL}, true},
};

int tune_family_find(const char *name)
{
    for (int i = 0; i < TF_COUNT; ++i)
        if (strcmp(tune_families[i].name, name) == 0) return i;
    return -1;
}

int tune_param_max(const tune_family *f) { return f->dispatch ? TUNE_SPLIT_NEVER : 65536; }

int tune_param_find(const tune_family *f, const char *name)
{
    for (int i = 0; i < f->nparams; ++i)
        if (strcmp(f->params[i].name, name) == 0) return i;
    return -1;
}

/* ----------------------------------------------------------- the check */

static size_t local_budget(const clnsa_device_info *info)
{
    return info->local_mem_size > 512 ? (size_t)info->local_mem_size - 512 : 0;
}

bool tune_fits(const clnsa_device_info *info, int family, int *v, const tune_problem *pb, bool search, char *why,
               size_t why_size)
{
    const tune_family *f = &tune_families[family];
    char dummy[8];
    if (!why) why = dummy, why_size = sizeof dummy;
    const int most = tune_param_max(f);
    for (int i = 0; i < f->nparams; ++i) {
        if (v[i] < 1 || v[i] > most) {
            snprintf(why, why_size, "%s=%d is out of 1..%d", f->params[i].name, v[i], most);
            return false;
        }
        if (f->params[i].clamp_to_g && v[i] > pb->g) v[i] = pb->g;
    }
    if (f->dispatch) return true;
    const size_t wg = (size_t)v[0], mult = info->preferred_wg_multiple;
    if (wg > info->max_work_group_size) {
        snprintf(why, why_size, "work-group size %zu > the device's %zu", wg, info->max_work_group_size);
        return false;
    }
    if (mult > 1 && wg > mult && wg % mult) {
        snprintf(why, why_size, "work-group size %zu is not a multiple of the device's preferred %zu", wg, mult);
        return false;
    }
    if (family >= TF_NSA_FWD_WARP) { /* the warp families */
        if (v[0] % 32 || (pb->warp_emulated && v[0] != 32)) {
            snprintf(why, why_size, "WG=%d: expected %s", v[0], pb->warp_emulated ? "32 (one warp: emulated matrix operations)"
                                                                                   : "a multiple of 32 (whole warps)");
            return false;
        }
        if (f->nparams > 1 && v[1] % 16) {
            snprintf(why, why_size, "%s=%d is not a multiple of 16", f->params[1].name, v[1]);
            return false;
        }
    }
    const size_t bytes = f->local_bytes(v, pb), budget = local_budget(info);
    if (bytes > budget) {
        snprintf(why, why_size, "local memory %zu bytes > the device's %zu (less 512 reserved)", bytes, budget);
        return false;
    }
    for (int i = 0; i < f->nconstraints; ++i) {
        const tune_constraint *c = &f->constraints[i];
        if (c->kind == TC_LE_PARAM && v[c->a] > v[c->b]) {
            snprintf(why, why_size, "%s=%d > %s=%d", f->params[c->a].name, v[c->a], f->params[c->b].name, v[c->b]);
            return false;
        }
        if (family == TF_NSA_DKDV && !mesa_dkdv_ok(info, v, pb)) {
            snprintf(why, why_size, "more than %d accumulators per work-item (Mesa llvmpipe workaround, see dkdv_start)",
                     MESA_DKDV_ACC_MAX);
            return false;
        }
        if (c->kind == TC_ACC_LIMIT && search) {
            const int64_t dim = c->b == 0 ? pb->dk : pb->dv, acc = ((int64_t)v[c->a] * dim + v[0] - 1) / v[0];
            if (acc > c->limit) {
                snprintf(why, why_size, "%lld accumulators per work-item > %d", (long long)acc, c->limit);
                return false;
            }
        }
    }
    return true;
}

bool tune_safe_default(const clnsa_device_info *info, int family, const tune_problem *pb, int *v)
{
    const tune_family *f = &tune_families[family];
    const size_t budget = local_budget(info);
    f->start(v, pb, info);
    for (int i = 0; i < f->nparams; ++i)
        if (f->params[i].clamp_to_g && v[i] > pb->g) v[i] = pb->g;
    for (int s = 0; s < f->nshrink; ++s) {
        const tune_shrink *k = &f->shrink[s];
        while (f->local_bytes(v, pb) > budget) {
            int *a = &v[k->a];
            if (k->kind == SHRINK_LARGER) {
                int *b = &v[k->b];
                if (!(*a > k->min || *b > k->min)) break;
                if (*a >= *b && *a > k->min) *a /= 2;
                else *b /= 2;
            } else {
                if (*a <= k->min) break;
                *a = k->kind == SHRINK_HALVE ? *a / 2 : (*a + 1) / 2;
            }
        }
    }
    return tune_fits(info, family, v, pb, false, NULL, 0);
}

/* ------------------------------------------- what the kernels are given */

/* The chosen values of a family and the local memory they take. */
static clnsa_status choose(clnsa_context *ctx, int family, const tune_problem *pb, int *v, size_t *local_bytes)
{
    tune_choice c;
    clnsa_status st = tune_choose(ctx, family, pb, &c);
    if (st != CLNSA_SUCCESS) return st;
    memcpy(v, c.v, sizeof c.v);
    *local_bytes = tune_families[family].local_bytes(c.v, pb);
    return CLNSA_SUCCESS;
}

clnsa_status tune_nsa_attn(clnsa_context *ctx, const tune_problem *pb, attn_kind kind, attn_params *p)
{
    const int family = kind == ATTN_FWD ? TF_NSA_FWD : kind == ATTN_BWD_PRE ? TF_NSA_BWD_PRE : TF_NSA_BWD_DQ;
    int v[TUNE_MAX_PARAMS] = {0};
    clnsa_status st = choose(ctx, family, pb, v, &p->local_bytes);
    *p = (attn_params){(size_t)v[0], v[1], v[2], p->local_bytes};
    return st;
}

clnsa_status tune_nsa_dkdv(clnsa_context *ctx, const tune_problem *pb, dkdv_params *p)
{
    int v[TUNE_MAX_PARAMS] = {0};
    clnsa_status st = choose(ctx, TF_NSA_DKDV, pb, v, &p->local_bytes);
    *p = (dkdv_params){(size_t)v[0], v[1], v[2], p->local_bytes};
    return st;
}

clnsa_status tune_nsa_topk(clnsa_context *ctx, const tune_problem *pb, topk_params *p)
{
    int v[TUNE_MAX_PARAMS] = {0};
    clnsa_status st = choose(ctx, TF_NSA_TOPK, pb, v, &p->local_bytes);
    *p = (topk_params){(size_t)v[0], v[1], v[2], v[3], topk_pc_max(v[3], pb), p->local_bytes};
    return st;
}

clnsa_status tune_blocksparse(clnsa_context *ctx, int family, const tune_problem *pb, bs_tile_params *p)
{
    int v[TUNE_MAX_PARAMS] = {0};
    clnsa_status st = choose(ctx, family, pb, v, &p->local_bytes);
    if (family == TF_BS_FWD_WARP) /* a warp per 16 query rows */
        *p = (bs_tile_params){(size_t)v[0], v[0] / 2, v[1], p->local_bytes};
    else if (family == TF_BS_BWD_WARP) /* a warp per 16 query rows (dq) or keys (dk/dv) */
        *p = (bs_tile_params){(size_t)v[0], v[0] / 2, v[0] / 2, p->local_bytes};
    else
        *p = (bs_tile_params){(size_t)v[0], v[1], v[2], p->local_bytes};
    return st;
}

size_t tune_blocksparse_aux_wg(const clnsa_device_info *info)
{
    size_t wg = info->max_work_group_size < 64 ? info->max_work_group_size : 64;
    return wg ? wg : 1;
}

clnsa_status tune_nsa_warp(clnsa_context *ctx, int family, const tune_problem *pb, warp_params *p)
{
    int v[TUNE_MAX_PARAMS] = {0};
    clnsa_status st = choose(ctx, family, pb, v, &p->local_bytes);
    const int jb = family == TF_NSA_TOPK_WARP ? v[2] : 0;
    *p = (warp_params){(size_t)v[0], v[1], jb, jb ? topk_pc_max(jb, pb) : 0, p->local_bytes};
    return st;
}
