/* test_select_index.c: the backward's inverse of the selection
 * (cl/nsa_select_index.cl, through nsa_plan_select_index, the backward's
 * own steps) against a host inverse: for each batch row, KV
 * head and block, the (token, slot) entries (token * S + slot) that selected
 * the block, in token order, at
 * list starts that are the running sum of the lists' lengths. The kernels'
 * outputs are poisoned first and their count words filled with garbage
 * (sel_count zeroes its own). The selections are random: negative, future
 * and repeated blocks among them (none of which is listed), block counts
 * that cut the slots short, sequences of several lengths and tokens past
 * the last sequence; chunks of tokens and work-groups that do not divide
 * each other. dk/dv go through these lists (test_nsa_bwd); this test pins
 * down their order, which only the order of dk/dv's additions shows. */
#include "ops/nsa.h"
#include "testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

TEST_ENV_GROUP

typedef struct {
    const char *name;
    int B, T, H, S, BS;
    int chunk, wg;  /* CHUNK tokens a work-group, IDX_WG work-items */
    bool counts;    /* a block_counts tensor */
    const int *cu;  /* cu_seqlens (B = 1), NULL: none */
    int nseq;
} index_case;

static const int cu_a[] = {0, 50, 51, 200, 310}; /* tokens 310.. are in no sequence */

static const index_case cases[] = {
    {"batched, counts", 2, 203, 3, 5, 16, 16, 64, true, NULL, 0},
    {"varlen, odd chunk", 1, 333, 2, 16, 8, 17, 64, false, cu_a, 4},
    {"chunk smaller than a round, varlen, counts", 1, 333, 1, 3, 4, 3, 32, true, cu_a, 4},
    {"paper blocks", 1, 1000, 2, 16, 64, 16, 64, false, NULL, 0},
};

static uint64_t seed = 0x5eedu;
static int rnd(int n) /* 0 .. n-1, through testutil's generator */
{
    double u;
    fill_uniform(&u, 1, 0.0, (double)n, &seed);
    return (int)u < n ? (int)u : n - 1;
}

typedef struct {
    int start, len, id;
} host_seq;

static host_seq seq_at(const index_case *c, int b, int t)
{
    if (!c->cu) return (host_seq){0, c->T, b};
    for (int s = 0; s < c->nseq; ++s)
        if (t >= c->cu[s] && t < c->cu[s + 1]) return (host_seq){c->cu[s], c->cu[s + 1] - c->cu[s], s};
    return (host_seq){0, 0, 0};
}

/* Per sequence, its first block in the row's numbering. */
static void block_offsets(const index_case *c, int *blk_off)
{
    blk_off[0] = 0;
    for (int s = 0; s < c->nseq; ++s) blk_off[s + 1] = blk_off[s] + (c->cu[s + 1] - c->cu[s] + c->BS - 1) / c->BS;
}

/* The host inverse: per (b, h), starts[nblk + 1] and each list's entries,
 * token * S + slot, in token order. */
static void host_inverse(const index_case *c, const int *bidx, int slot_stride, const int *bcnt, const int *blk_off,
                         int nblk, int *starts, int *lst)
{
    const int T = c->T, H = c->H, S = c->S;
    int *len = calloc((size_t)nblk, sizeof *len);
    for (int pass = 0; pass < 2; ++pass)
        for (int b = 0; b < c->B; ++b)
            for (int h = 0; h < H; ++h) {
                int *st = starts + ((size_t)b * H + h) * (nblk + 1);
                memset(len, 0, (size_t)nblk * sizeof *len);
                for (int t = 0; t < T; ++t) {
                    const host_seq sq = seq_at(c, b, t);
                    const int tl = t - sq.start, base = c->cu ? blk_off[sq.id] : 0;
                    const int *row = bidx + (((size_t)b * T + t) * H + h) * slot_stride;
                    int n = sq.len > 0 ? S : 0;
                    if (c->counts && sq.len > 0) {
                        const int k = bcnt[((size_t)b * T + t) * H + h];
                        n = k < 0 ? 0 : k > S ? S : k;
                    }
                    for (int s = 0; s < n; ++s) {
                        bool skip = row[s] < 0 || row[s] > tl / c->BS;
                        for (int e = 0; e < s; ++e) skip = skip || row[e] == row[s];
                        if (skip) continue;
                        const int j = base + row[s];
                        if (pass == 1) lst[((size_t)b * H + h) * T * S + st[j] + len[j]] = t * S + s;
                        len[j]++;
                    }
                }
                if (pass == 0) {
                    st[0] = 0;
                    for (int j = 0; j < nblk; ++j) st[j + 1] = st[j] + len[j];
                }
            }
    free(len);
}

static void run_case(const index_case *c)
{
    const int B = c->B, T = c->T, H = c->H, S = c->S, N = c->cu ? c->nseq : 0;
    const int nblk = (T + c->BS - 1) / c->BS + N, nchunk = (T + c->chunk - 1) / c->chunk, slot_stride = S + 1;
    /* as the library does on a device with smaller work-groups */
    const int wg = env.ctx->info.max_work_group_size < (size_t)c->wg ? (int)env.ctx->info.max_work_group_size : c->wg;
    /* random selections: -1 .. the block after the token's (negative, future, repeats) */
    const size_t nrow = (size_t)B * T * H;
    int *bidx = malloc(nrow * slot_stride * sizeof *bidx), *bcnt = malloc(nrow * sizeof *bcnt);
    for (size_t r = 0; r < nrow; ++r) {
        const int t = (int)(r / H % T), tl = t - seq_at(c, (int)(r / H / T), t).start;
        for (int s = 0; s < slot_stride; ++s) bidx[r * slot_stride + s] = rnd(tl / c->BS + 3) - 1;
        bcnt[r] = rnd(S + 3) - 1;
    }
    int blk_off[8] = {0};
    if (c->cu) block_offsets(c, blk_off);
    const size_t nstart = (size_t)B * H * (nblk + 1), nlst = nrow * S, ncnt = (size_t)B * H * nblk * nchunk;
    int *want_st = malloc(nstart * sizeof(int)), *want = malloc(nlst * sizeof(int));
    int *got_st = malloc(nstart * sizeof(int)), *got = malloc(nlst * sizeof(int)), *garbage = malloc(ncnt * sizeof(int));
    for (size_t i = 0; i < nlst; ++i) want[i] = got[i] = -7; /* where no list reaches */
    for (size_t i = 0; i < nstart; ++i) got_st[i] = -7;
    for (size_t i = 0; i < ncnt; ++i) garbage[i] = rnd(1000) - 500;

    cl_mem m_bidx = upload_i32(&env, bidx, nrow * slot_stride), m_bcnt = upload_i32(&env, bcnt, nrow);
    cl_mem m_cu = c->cu ? upload_i32(&env, c->cu, (size_t)N + 1) : NULL;
    cl_mem m_off = c->cu ? upload_i32(&env, blk_off, (size_t)N + 1) : NULL;
    cl_mem m_cnt = upload_i32(&env, garbage, ncnt), m_st = upload_i32(&env, got_st, nstart);
    cl_mem m_lst = upload_i32(&env, got, nlst);
    int64_t sb[4] = {B, T, H, S}, sc[3] = {B, T, H};
    clnsa_tensor bi = clnsa_tensor_contiguous(m_bidx, CLNSA_DTYPE_I32, 4, sb);
    for (int i = 0; i < 3; ++i) bi.strides[i] = bi.strides[i] / S * slot_stride; /* a padded slot row */
    clnsa_tensor bc = c->counts ? clnsa_tensor_contiguous(m_bcnt, CLNSA_DTYPE_I32, 3, sc) : (clnsa_tensor){0};

    char d[512];
    snprintf(d, sizeof d,
             "#define STORAGE 0\n#define IDX_LONG 0\n#define VARLEN %d\n#define HAS_COUNTS %d\n#define BS %d\n#define S %d\n"
             "#define CMP_L 8\n#define CMP_D 8\n#define WINDOW 1\n#define INIT_BLOCKS 0\n#define LOCAL_BLOCKS 0\n",
             c->cu != NULL, c->counts, c->BS, S);
    const select_index_args args = {
        .bidx = &bi,
        .bcnt = &bc,
        .cu = {m_cu, 0},
        .blk_off = {m_off, 0},
        .nseq = c->nseq,
        .cnt = {m_cnt, 0},
        .lst_start = {m_st, 0},
        .lst = {m_lst, 0},
        .B = B,
        .T = T,
        .H = H,
        .nblk = nblk,
        .chunk = c->chunk,
        .nchunk = nchunk,
        .wg = (size_t)wg,
    };
    op_plan plan = {0};
    const clnsa_status st = nsa_plan_select_index(env.ctx, &plan, d, &args);
    assert_int_equal(plan_run(env.ctx, &plan, st, env.queue, 0, NULL, NULL), CLNSA_SUCCESS);
    download_i32(&env, m_st, nstart, got_st);
    download_i32(&env, m_lst, nlst, got);

    host_inverse(c, bidx, slot_stride, bcnt, blk_off, nblk, want_st, want);
    size_t listed = 0, bad = 0;
    for (size_t i = 0; i < nstart; ++i) bad += got_st[i] != want_st[i];
    for (size_t i = 0; i < nlst; ++i) bad += got[i] != want[i], listed += want[i] >= 0;
    print_message("  %s: %zu tokens listed in %d blocks x %d heads x %d rows, %zu words differ\n", c->name, listed, nblk,
                  H, B, bad);
    assert_true(listed > 0);
    assert_int_equal(bad, 0);

    cl_mem ms[] = {m_bidx, m_bcnt, m_cu, m_off, m_cnt, m_st, m_lst};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; ++i)
        if (ms[i]) clReleaseMemObject(ms[i]);
    free(bidx);
    free(bcnt);
    free(want_st);
    free(want);
    free(got_st);
    free(got);
    free(garbage);
}

static void test_inverse(void **state)
{
    (void)state;
    const char *only = getenv("CLNSA_TEST_CASE");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        if (!only || !*only || strcmp(only, cases[i].name) == 0) run_case(&cases[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inverse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
