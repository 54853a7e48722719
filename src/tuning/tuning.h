/* tuning.h: per-device tile and work-group choices of each kernel family. */
#ifndef CLNSA_TUNING_H
#define CLNSA_TUNING_H

#include "internal.h"

/* attn_tile.h kernels: WG work-items, GT query heads and TK keys per tile. */
typedef struct {
    size_t wg;
    int gt, tk;
    size_t local_bytes;
} attn_params;

/* The per-query kernels differ in what they keep in local memory. */
typedef enum { ATTN_FWD, ATTN_BWD_PRE, ATTN_DQ } attn_kind;

clnsa_status tune_nsa_attn(const clnsa_device_info *info, int G, int DK, int DV, attn_kind kind, attn_params *p);

/* nsa_bwd_dkdv.cl: TKK keys per work-group, RQ query rows per chunk. */
typedef struct {
    size_t wg;
    int tkk, rq;
    size_t local_bytes;
} dkdv_params;

clnsa_status tune_nsa_dkdv(const clnsa_device_info *info, int DK, int DV, dkdv_params *p);

/* nsa_topk.cl: as above plus JB selection blocks per chunk and PC_MAX, the
 * compressed keys a chunk can overlap. */
typedef struct {
    size_t wg;
    int gt, tk, jb;
    int64_t pc_max;
    size_t local_bytes;
} topk_params;

clnsa_status tune_nsa_topk(const clnsa_device_info *info, int G, int DK, int S, int block_size,
                           int cmp_block, int cmp_stride, topk_params *p);

#endif
