/* blocksparse_params.c: tiles and work-group sizes of the block-sparse
 * attention kernels. The tiles are chosen first, from the head dims and the
 * device's local memory only (never from the work-group size, so that
 * CLNSA_TUNE_WG cannot change a gradient's summation order); the work-group
 * size then follows the device's limits. */
#include "ops/blocksparse.h"

static size_t bs_wg(const clnsa_device_info *info)
{
    size_t wg = info->is_gpu ? 128 : 64;
    size_t forced = (size_t)cx_env_int("CLNSA_TUNE_WG", 0);
    if (forced) wg = forced;
    if (wg > info->max_work_group_size) wg = info->max_work_group_size;
    size_t mult = info->preferred_wg_multiple ? info->preferred_wg_multiple : 1;
    if (wg > mult) wg = wg / mult * mult;
    return wg ? wg : 1;
}

size_t tune_blocksparse_aux_wg(const clnsa_device_info *info)
{
    size_t wg = info->max_work_group_size < 64 ? info->max_work_group_size : 64;
    return wg ? wg : 1;
}

static size_t budget(const clnsa_device_info *info)
{
    return info->local_mem_size > 512 ? info->local_mem_size - 512 : 0;
}

/* Forward: qs[BQ*D], ks[BK*(D+1)], vs[BK*DV], ps[BQ*BK], m, l, alpha[BQ],
 * and the int positions / segment ids of both tiles. */
static size_t fwd_bytes(int bq, int bk, int d, int dv)
{
    return sizeof(float) * ((size_t)bq * d + (size_t)bk * (d + 1) + (size_t)bk * dv + (size_t)bq * bk + 3u * bq) +
           sizeof(int) * 2u * (bq + bk);
}

/* Backward: qs[BQ*D], dos[BQ*DV], ks[BK*(D+1)], vs[BK*(DV+1)], ps[BQ*BK],
 * cs[BQ*BK] (soft cap), lse and delta [BQ], and the ints. */
static size_t bwd_bytes(int bq, int bk, int d, int dv, bool softcap)
{
    return sizeof(float) * ((size_t)bq * (d + dv) + (size_t)bk * (d + 1 + dv + 1) + (size_t)bq * bk * (softcap ? 2 : 1) +
                            2u * bq + 1u) +
           sizeof(int) * 2u * (bq + bk);
}

/* Registers: a work-item of the nominal work-group holds at most 64
 * accumulators of a tile (BQ*DV, BK*D or BK*DV over the group). The nominal
 * size is the device's default, not CLNSA_TUNE_WG, so the tiles stay put. */
static int reg_cap(const clnsa_device_info *info) { return (info->is_gpu ? 128 : 64) * 64; }

static clnsa_status fit(const clnsa_device_info *info, int *bq, int *bk, const char *env_q, const char *env_k,
                        size_t (*bytes)(int, int, int, int, bool), int d, int dv, bool softcap, size_t *used)
{
    const int fq = cx_env_int(env_q, 0), fk = cx_env_int(env_k, 0);
    if (fq > 0) *bq = fq;
    if (fk > 0) *bk = fk;
    const int dmax = d > dv ? d : dv;
    while ((size_t)*bq * dmax > (size_t)reg_cap(info) && *bq > 8 && fq <= 0) *bq /= 2;
    while ((size_t)*bk * dmax > (size_t)reg_cap(info) && *bk > 8 && fk <= 0) *bk /= 2;
    for (;;) {
        *used = bytes(*bq, *bk, d, dv, softcap);
        if (*used <= budget(info)) return CLNSA_SUCCESS;
        if (*bk >= *bq && *bk > 4) *bk /= 2;
        else if (*bq > 4) *bq /= 2;
        else if (*bk > 1) *bk /= 2;
        else if (*bq > 1) *bq /= 2;
        else return CLNSA_ERROR_UNSUPPORTED_DEVICE;
    }
}

static size_t fwd_bytes_b(int bq, int bk, int d, int dv, bool softcap)
{
    (void)softcap;
    return fwd_bytes(bq, bk, d, dv);
}

clnsa_status tune_blocksparse_fwd(const clnsa_device_info *info, int D, int DV, bs_tile_params *p)
{
    p->bq = info->is_gpu ? 64 : 32;
    p->bk = info->is_gpu ? 32 : 16;
    clnsa_status st = fit(info, &p->bq, &p->bk, "CLNSA_TUNE_BS_FWD_BQ", "CLNSA_TUNE_BS_FWD_BK", fwd_bytes_b, D, DV, false,
                          &p->local_bytes);
    p->wg = bs_wg(info);
    return st;
}

clnsa_status tune_blocksparse_bwd(const clnsa_device_info *info, int D, int DV, bool softcap, bs_tile_params *p)
{
    p->bq = info->is_gpu ? 32 : 16;
    p->bk = info->is_gpu ? 64 : 32;
    clnsa_status st = fit(info, &p->bq, &p->bk, "CLNSA_TUNE_BS_BWD_BQ", "CLNSA_TUNE_BS_BWD_BK", bwd_bytes, D, DV, softcap,
                          &p->local_bytes);
    p->wg = bs_wg(info);
    return st;
}
