/* params.c: tile and work-group choices per device. Every choice is checked
 * against the device's limits (local memory, work-group size), so a device
 * with less than the default gets smaller tiles instead of a failed launch.
 * CLNSA_TUNE_WG and CLNSA_TUNE_TK force a work-group size and key tile. */
#include "tuning.h"

static size_t default_wg(const clnsa_device_info *info)
{
    size_t wg = info->is_gpu ? 128 : 64;
    size_t forced = (size_t)cx_env_int("CLNSA_TUNE_WG", 0);
    if (forced) wg = forced;
    if (wg > info->max_work_group_size) wg = info->max_work_group_size;
    size_t mult = info->preferred_wg_multiple ? info->preferred_wg_multiple : 1;
    if (wg > mult) wg = wg / mult * mult;
    return wg ? wg : 1;
}

/* Floats of local memory each per-query kernel declares (see the .cl). */
static size_t attn_local_bytes(attn_kind kind, int gt, int tk, int dk, int dv)
{
    size_t f = (size_t)gt * dk + (size_t)tk * (dk + 1) + (size_t)gt * tk + 3u * gt;
    if (kind == ATTN_DQ) f += (size_t)gt * dv + (size_t)tk * (dv + 1);
    else f += (size_t)tk * dv + (kind == ATTN_BWD_PRE ? (size_t)gt * dv : 0);
    return sizeof(float) * f;
}

clnsa_status tune_nsa_attn(const clnsa_device_info *info, int G, int DK, int DV, attn_kind kind, attn_params *p)
{
    int tk = cx_env_int("CLNSA_TUNE_TK", 32), gt = G < 16 ? G : 16;
    size_t budget = info->local_mem_size > 512 ? info->local_mem_size - 512 : 0;
    while (attn_local_bytes(kind, gt, tk, DK, DV) > budget && tk > 4) tk /= 2;
    while (attn_local_bytes(kind, gt, tk, DK, DV) > budget && gt > 1) gt = (gt + 1) / 2;
    if (attn_local_bytes(kind, gt, tk, DK, DV) > budget) return CLNSA_ERROR_UNSUPPORTED_DEVICE;
    p->wg = default_wg(info);
    p->gt = gt;
    p->tk = tk;
    p->local_bytes = attn_local_bytes(kind, gt, tk, DK, DV);
    return CLNSA_SUCCESS;
}

static size_t dkdv_local_bytes(int tkk, int rq, int dk, int dv)
{
    return sizeof(float) * ((size_t)rq * (dk + dv) + (size_t)tkk * (dk + dv + 2) + 2u * rq * tkk + 3u * rq + 3u * tkk);
}

clnsa_status tune_nsa_dkdv(const clnsa_device_info *info, int DK, int DV, dkdv_params *p)
{
    int tkk = cx_env_int("CLNSA_TUNE_TK", 32), rq = 16;
    size_t budget = info->local_mem_size > 512 ? info->local_mem_size - 512 : 0;
    while (dkdv_local_bytes(tkk, rq, DK, DV) > budget && (tkk > 4 || rq > 4)) {
        if (tkk >= rq && tkk > 4) tkk /= 2;
        else rq /= 2;
    }
    if (dkdv_local_bytes(tkk, rq, DK, DV) > budget) return CLNSA_ERROR_UNSUPPORTED_DEVICE;
    p->wg = default_wg(info);
    p->tkk = tkk;
    p->rq = rq;
    p->local_bytes = dkdv_local_bytes(tkk, rq, DK, DV);
    return CLNSA_SUCCESS;
}

static size_t topk_local_bytes(const topk_params *p, int G, int DK, int S)
{
    return sizeof(float) * ((size_t)p->gt * DK + (size_t)p->tk * (DK + 1) + (size_t)p->gt * p->tk + G +
                            p->pc_max + p->jb + 2u * S);
}

clnsa_status tune_nsa_topk(const clnsa_device_info *info, int G, int DK, int S, int block_size,
                           int cmp_block, int cmp_stride, topk_params *p)
{
    size_t budget = info->local_mem_size > 512 ? info->local_mem_size - 512 : 0;
    p->wg = default_wg(info);
    p->gt = G < 16 ? G : 16;
    p->tk = cx_env_int("CLNSA_TUNE_TK", 32);
    p->jb = 32;
    for (;;) {
        p->pc_max = ((int64_t)p->jb * block_size + cmp_block - 2) / cmp_stride + 2;
        p->local_bytes = topk_local_bytes(p, G, DK, S);
        if (p->local_bytes <= budget) return CLNSA_SUCCESS;
        if (p->tk > 4) p->tk /= 2;
        else if (p->gt > 1) p->gt = (p->gt + 1) / 2;
        else if (p->jb > 1) p->jb /= 2;
        else return CLNSA_ERROR_UNSUPPORTED_DEVICE;
    }
}
