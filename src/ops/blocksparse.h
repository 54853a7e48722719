/* blocksparse.h: what the block-sparse attention host code shares between
 * validation, the layouts (block-sparse rows of the kernel tiles), the
 * forward, the backward and the mask builders. */
#ifndef CLNSA_OPS_BLOCKSPARSE_H
#define CLNSA_OPS_BLOCKSPARSE_H

#include "internal.h"
#include "tuning/tuning.h"

/* ------------------------------------------------------------ problem */

/* Ints per tile of the tile statistics (cl/blocksparse.h). */
#define BS_STATS_INTS 5

/* A validated call: sizes, optional inputs, the mask's normalized view. */
typedef struct {
    clnsa_blocksparse_config cfg; /* scale resolved */
    int B, Tq, Tk, HQ, H, G, D, DV;
    clnsa_dtype dtype;
    bool has_pos_q, has_pos_k, has_seg, has_sinks, has_map;
    int NQB, NKB;     /* mask blocks */
    int map_b, map_h; /* mask extents: 1 (shared) or B / HQ */
    size_t map_off;
    int64_t map_st[4]; /* [b, hq, qb, kb]; 0 where shared */
    bool idx_long;
} bs_problem;

/* The tile layout of one kernel family: where its pieces live in the
 * workspace (byte offsets) and how many there are. Slices: one layout per
 * batch row when positions, segments or a per-row mask are given (lb = B),
 * per query head when the mask is per head (lh = HQ). */
typedef struct {
    int BQ, BK, NQT, NKT;
    int lb, lh, sb; /* layout batch rows, layout heads, tile-statistics batch rows */
    int64_t cap;    /* entries of cols (and of rows when transposed) */
    bool transposed;
    size_t qstats, kstats;         /* int [sb][NQT][5], int [sb][NKT][5] */
    size_t row_off, row_full, cols; /* int [S*NQT + 1], int [S*NQT], int [cap] */
    size_t col_off, col_full, rows; /* transposed: int [S*NKT + 1], int [S*NKT], int [cap] */
} bs_layout;

clnsa_status bs_validate(clnsa_context *ctx, const clnsa_blocksparse_config *cfg, const clnsa_blocksparse_inputs *in,
                         bs_problem *pb);
/* Plans a layout at tiles BQ x BK at the byte cursor; fails when the rows
 * cannot be indexed with int32. */
clnsa_status bs_layout_plan(clnsa_context *ctx, const bs_problem *pb, int BQ, int BK, bool transposed, size_t *cursor,
                            bs_layout *lay);
size_t bs_take(size_t *cursor, size_t bytes);
/* "#define STORAGE .. IDX_LONG .." */
void bs_base_defines(const bs_problem *pb, char *buf, size_t size);
/* The shape class the tuning database keys the attention kernels by. */
tune_problem bs_tune_problem(const bs_problem *pb);
/* Checks the caller's workspace against `need` bytes. */
clnsa_status bs_check_workspace(clnsa_context *ctx, cl_mem ws, size_t ws_bytes, size_t need);

/* ------------------------------------------------------------ launches */

/* Launches go through the library's op plan (src/api/plan.c): every kernel
 * is created and given its arguments before the first is enqueued. */
typedef op_plan bs_plan;

/* Creates kernel `name` of the program (files, defines) as the plan's next
 * launch and starts its argument list. */
clnsa_status bs_plan_kernel(clnsa_context *ctx, bs_plan *plan, const char *const *files, const char *defines,
                            const char *name, bool idx_long, kargs *a);
/* Sets the last launch's NDRange (global already rounded to local). */
void bs_plan_range(bs_plan *plan, size_t g0, size_t g1, size_t g2, size_t l0);

/* The int32 [.., N] kernel argument pair (buffer, element offset). */
void ka_ws_int(kargs *a, cl_mem ws, size_t byte_off);
/* The mask: buffer, offset, normalized strides [b, hq, qb, kb]. */
void ka_map(kargs *a, const bs_problem *pb, const clnsa_tensor *mask);

/* Appends the kernels that build `lay` in workspace `ws` (tile statistics,
 * counts, prefix sums, the rows, and with lay->transposed the columns). */
clnsa_status bs_layout_prepare(clnsa_context *ctx, const bs_problem *pb, const clnsa_blocksparse_inputs *in,
                               const bs_layout *lay, cl_mem ws, bs_plan *plan);

/* The program of cl/blocksparse_mask.cl and its defines. */
extern const char *const bs_mask_files[];
void bs_mask_defines(const clnsa_context *ctx, bool idx_long, char *buf, size_t size);

/* The attention kernels' defines: bs_base_defines and the element rules;
 * returns the length written. */
size_t bs_rule_defines(const bs_problem *pb, char *buf, size_t size);
/* The warp kernels' defines (cl/blocksparse_*_warp.cl): bs_rule_defines,
 * warps (wg / 32), the chunk kc, head dims and staged-row strides (bwd:
 * for tiles read both ways, tune_warp_rows), the matrix path; returns the
 * length written. */
size_t bs_warp_defines(const bs_problem *pb, warp_mode warp, size_t wg, int kc, bool bwd, char *buf, size_t size);

#endif
