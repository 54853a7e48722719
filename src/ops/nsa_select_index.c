/* nsa_select_index.c: the steps that invert the selection into per-block
 * lists of the tokens that selected each block (cl/nsa_select_index.cl),
 * for the backward's dk/dv of the selected branch. One entry point, shared
 * by the backward and by test_select_index, so the kernels' arguments are
 * spelled out in one place. */
#include "nsa.h"

#include <stdio.h>

static const char *const index_files[] = {"common.h", "nsa_ranges.h", "nsa_select_index.cl", NULL};

static void int_array_arg(kargs *a, int_array x)
{
    ka_mem(a, x.mem);
    ka_idx(a, x.off);
}

/* The leading arguments of sel_count and sel_scatter. */
static void selection_args(kargs *a, const select_index_args *x)
{
    ka_tensor(a, x->bidx);
    ka_tensor(a, x->bcnt);
    int_array_arg(a, x->cu);
    ka_int(a, x->nseq);
    int_array_arg(a, x->blk_off);
}

clnsa_status nsa_plan_select_index(clnsa_context *ctx, op_plan *p, const char *defines, const select_index_args *x)
{
    char d[2304];
    snprintf(d, sizeof d, "%s#define CHUNK %d\n#define IDX_WG %zu\n", defines, x->chunk, x->wg);
    cl_program prog;
    CHECK(program_get(ctx, index_files, d, &prog));
    /* a work-group a chunk, a block, or a (batch row, head) */
    const size_t per_chunk[3] = {x->wg * x->nchunk, (size_t)x->H, (size_t)x->B};
    const size_t per_blk[3] = {x->wg * x->nblk, (size_t)x->H, (size_t)x->B}, one[3] = {x->wg, (size_t)x->H, (size_t)x->B};
    kargs a;
    CHECK(plan_add_kernel(ctx, p, prog, "sel_count", per_chunk, x->wg, &a, x->idx_long));
    selection_args(&a, x);
    int_array_arg(&a, x->cnt);
    ka_int(&a, x->nblk);
    ka_int(&a, x->nchunk);
    ka_int(&a, x->T);
    CHECK(plan_args_done(ctx, &a, "sel_count arguments"));
    CHECK(plan_add_kernel(ctx, p, prog, "sel_prefix", per_blk, x->wg, &a, x->idx_long));
    int_array_arg(&a, x->cnt);
    int_array_arg(&a, x->lst_start);
    ka_int(&a, x->nblk);
    ka_int(&a, x->nchunk);
    CHECK(plan_args_done(ctx, &a, "sel_prefix arguments"));
    CHECK(plan_add_kernel(ctx, p, prog, "sel_starts", one, x->wg, &a, x->idx_long));
    int_array_arg(&a, x->lst_start);
    ka_int(&a, x->nblk);
    CHECK(plan_args_done(ctx, &a, "sel_starts arguments"));
    CHECK(plan_add_kernel(ctx, p, prog, "sel_scatter", per_chunk, x->wg, &a, x->idx_long));
    selection_args(&a, x);
    int_array_arg(&a, x->cnt);
    int_array_arg(&a, x->lst_start);
    int_array_arg(&a, x->lst);
    ka_int(&a, x->nblk);
    ka_int(&a, x->nchunk);
    ka_int(&a, x->T);
    return plan_args_done(ctx, &a, "sel_scatter arguments");
}
