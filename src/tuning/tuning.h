/* tuning.h: per-device tile and work-group choices of each kernel family.
 *
 * params.c declares the families: their tunable parameters, the values the
 * tuner tries, their constraints (local memory, work-group limits, ...) and
 * the safe default. database.c picks the parameters of a call, in this
 * order (the first candidate that fits the device wins):
 *   1. the tuner's forced parameters (tune_hook, this thread only);
 *   2. CLNSA_TUNE_WG / CLNSA_TUNE_TK set (for the block-sparse families:
 *      CLNSA_TUNE_BS_{FWD,BWD}_{BQ,BK}): the safe default grown from them
 *      (the block-sparse families take CLNSA_TUNE_WG as a work-group size
 *      over whatever source 3-5 chose, keeping its tiles);
 *   3. the user file (clnsa_context_options.tuning_file, else
 *      $CLNSA_TUNING_FILE);
 *   4. the built-in database (generated from tuning/ JSON files): the device's
 *      entry, then its architecture's default, then its vendor's;
 *   5. the safe default, which fits any OpenCL 1.2 device.
 * Within one source the entry whose shape class matches the problem on the
 * most fields wins (a field may be a wildcard). Where neither source 3 nor 4
 * has an entry that matches, an f16 problem takes the entries of bf16 and a
 * bf16 one those of f16, through 3 and 4 again (database.c's
 * dtype_sibling). An NSA entry's window ranks instead of matching: all of
 * that runs first over the entries of the problem's window or none named,
 * then over those of the other window (tune_entry's window). */
#ifndef CLNSA_TUNING_H
#define CLNSA_TUNING_H

#include "internal.h"

#define TUNE_MAX_PARAMS 4

typedef enum {
    TF_NSA_FWD,     /* nsa_fwd.cl, the forward (WG, GT, TK) */
    TF_NSA_BWD_PRE, /* nsa_fwd.cl with BWD_PRE, the backward prologue */
    TF_NSA_BWD_DQ,  /* nsa_bwd_dq.cl */
    TF_NSA_TOPK,    /* nsa_topk.cl (WG, GT, TK, JB) */
    TF_NSA_DKDV,    /* nsa_bwd_dkdv.cl (WG, TKK, RQ) */
    TF_BS_FWD,      /* blocksparse_fwd.cl (WG, BQ, BK) */
    TF_BS_BWD,      /* blocksparse_bwd.cl: dk/dv, dq (WG, BQ, BK) */
    TF_NSA_FWD_WARP,  /* nsa_fwd_warp.cl on the tensor cores (WG, KC): the forward given its selection, without the
                         compressed branch */
    TF_NSA_FWD_CMP_WARP,   /* the same with the compressed branch */
    TF_NSA_FWD_CMP_TILE_WARP, /* the forward without the selected branch, whose work-group's warps share a tile of
                                 the compressed rows (CMP_TILE) */
    TF_NSA_FWD_FUSED_WARP, /* the forward that runs the top-k itself (FUSED_TOPK) */
    TF_NSA_BWD_PRE_WARP,   /* nsa_fwd_warp.cl with BWD_PRE, the backward's prologue */
    TF_NSA_TOPK_WARP, /* nsa_topk_warp.cl (WG, KC, JB) */
    TF_NSA_DQ_WARP,   /* nsa_bwd_dq_warp.cl (WG, KC), the compressed branch's dS kept */
    TF_NSA_DQ_RECOMPUTE_WARP, /* the same, where dq recomputes the compressed branch's dS */
    TF_NSA_DKDV_WARP, /* nsa_bwd_dkdv_warp.cl (WG: 16 keys per warp) */
    TF_BS_FWD_WARP,   /* blocksparse_fwd_warp.cl (WG: 16 query rows per warp, BK) */
    TF_BS_BWD_WARP,   /* blocksparse_bwd_warp.cl: dk/dv, dq (WG: square tiles of 16 tokens per warp) */
    TF_NSA_FWD_SPLIT, /* the forward's path (MIN_T: the length from which it splits, nsa_fwd.c's choose_split) */
    TF_COUNT
} tune_family_id;

/* What a choice is made for: the shape class (head dims, GQA group,
 * selection block, dtype) and what else a family's footprint depends on. */
typedef struct {
    int dk, dv, g, block; /* block: the NSA selection block; 0 for block-sparse */
    clnsa_dtype dtype;
    int S, cmp_block, cmp_stride; /* top-k's PC_MAX */
    bool warp_emulated;           /* warp families: emulated matrix operations (one warp per group) */
    int fused_jb; /* nsa_fwd_fused_warp: the top-k's JB, whose PC_MAX scores a warp holds too (0: not known) */
    bool slc;     /* NSA: the selected branch runs (the forward then reads V without a local tile) */
    bool swa;     /* NSA: the sliding window runs (the shape class's "window") */
    int branches; /* NSA forward: the branches it runs; one keeps no sum in local memory (0: not known, counted as more) */
    bool cmp_tile; /* NSA forward: where it stages V without the top-k, its compressed branch reads a work-group's tile (CMP_TILE) */
} tune_problem;

typedef struct {
    const char *name;   /* the kernel's define and the JSON key: "WG" */
    int values[8];      /* the tuner's search space */
    int nvalues;
    bool clamp_to_g;    /* a head tile: values above G act as G */
} tune_param;

/* Constraints beyond local memory and the work-group limits. */
typedef enum {
    TC_LE_PARAM,   /* param a <= param b */
    TC_ACC_LIMIT   /* search only: ceil(param a * dim b / WG) <= limit (registers) */
} tune_constraint_kind;

typedef struct {
    tune_constraint_kind kind;
    int a, b;  /* param indices; for TC_ACC_LIMIT b: 0 = DK, 1 = DV */
    int limit;
} tune_constraint;

/* How the safe default shrinks to fit local memory, step after step. */
typedef enum {
    SHRINK_HALVE,      /* param a /= 2 while above `min` */
    SHRINK_CEIL_HALVE, /* param a = ceil(a / 2) while above `min` */
    SHRINK_LARGER      /* halve the larger of a and b (a on a tie) while either is above `min` */
} tune_shrink_kind;

typedef struct {
    tune_shrink_kind kind;
    int a, b, min;
} tune_shrink;

typedef struct {
    const char *name;   /* "nsa_fwd", as in the JSON files and `clnsa tune --family` */
    const char *kernel; /* the kernels it parameterizes, comma-separated (the tuner times their sum) */
    int nparams;
    tune_param params[TUNE_MAX_PARAMS];
    int nconstraints;
    tune_constraint constraints[3];
    int nshrink;
    tune_shrink shrink[3];
    /* Local memory of one work-group in bytes. */
    size_t (*local_bytes)(const int *v, const tune_problem *pb);
    /* The safe default before shrinking (the work-group size is param 0). */
    void (*start)(int *v, const tune_problem *pb, const clnsa_device_info *info);
    /* Environment variables that force params 1 and 2 (the tiles), or NULL.
     * A family that has them keeps its tiles whatever the work-group size:
     * CLNSA_TUNE_WG then replaces only the chosen work-group size, so that it
     * cannot change a gradient's summation order. */
    const char *tile_env[2];
    /* A choice of the op's path, not a kernel's tiles: param 0 is no
     * work-group size and takes no local memory; the tuner times the whole
     * op ("*" as the kernel) and tries the lengths it times as the values. */
    bool dispatch;
} tune_family;

/* nsa_fwd_split's MIN_T that never splits. */
#define TUNE_SPLIT_NEVER (1 << 30)

extern const tune_family tune_families[TF_COUNT];
/* Index of a family by name, or -1. */
int tune_family_find(const char *name);
/* Index of a parameter of a family by name, or -1. */
int tune_param_find(const tune_family *f, const char *name);
/* The largest value of a family's parameters: 65536, a length
 * (TUNE_SPLIT_NEVER) for a dispatch family. */
int tune_param_max(const tune_family *f);

/* Is this candidate usable on the device? Clamps head tiles to G first.
 * `search` adds the tuner's register heuristics. On false, `why` says what
 * failed ("local memory: 70000 bytes > 49152"). */
bool tune_fits(const clnsa_device_info *info, int family, int *v, const tune_problem *pb, bool search, char *why,
               size_t why_size);
/* The safe default (after CLNSA_TUNE_WG / CLNSA_TUNE_TK): false when even
 * the smallest tiles do not fit. */
bool tune_safe_default(const clnsa_device_info *info, int family, const tune_problem *pb, int *v);
/* The safe default's work-group size: 128 on a GPU, 64 elsewhere, or
 * CLNSA_TUNE_WG; capped by the device and rounded to its preferred multiple. */
int tune_default_wg(const clnsa_device_info *info);

typedef enum {
    TUNE_SRC_FORCED,  /* the tuner's hook */
    TUNE_SRC_ENV,     /* CLNSA_TUNE_WG / CLNSA_TUNE_TK */
    TUNE_SRC_USER,    /* the user file */
    TUNE_SRC_DEVICE,  /* built-in database: this device */
    TUNE_SRC_ARCH,    /* built-in database: the architecture's default */
    TUNE_SRC_VENDOR,  /* built-in database: the vendor's default */
    TUNE_SRC_DEFAULT  /* the safe default */
} tune_source;

typedef struct {
    int v[TUNE_MAX_PARAMS];
    tune_source source;
    char where[320]; /* "user file PATH (pocl/cpu/NAME)", "database pocl/cpu", "safe default" */
} tune_choice;

/* The parameters of `family` for this problem on ctx's device. */
clnsa_status tune_choose(clnsa_context *ctx, int family, const tune_problem *pb, tune_choice *out);
/* Does the environment change what tune_choose takes from a tuning file
 * (CLNSA_TUNE_WG / CLNSA_TUNE_TK, a family's tile variables, or lowered
 * device limits)? Tests that assert a file's kernels hold back then. */
bool tune_env_overrides(void);

/* ----------------------------------------------------- database entries */

/* One entry of a tuning file or the built-in database. NULL strings and
 * zero shape fields are wildcards ("*" and 0 in JSON). */
typedef struct {
    const char *vendor, *arch, *device, *family;
    int dk, dv, g, block;
    clnsa_dtype dtype;
    int nparams;
    const char *names[TUNE_MAX_PARAMS];
    int values[TUNE_MAX_PARAMS];
    /* The shape's "window": TUNE_WINDOW_ANY, _OFF or _ON. Unlike the other
     * fields it does not exclude: an entry of the other window is taken
     * only where no source has one of the problem's window or none named
     * (tuned only with or only without the window, an entry still serves
     * both); among entries that name as many of the other fields, the
     * problem's window comes before none named. */
    int window;
} tune_entry;

enum { TUNE_WINDOW_ANY = -1, TUNE_WINDOW_OFF = 0, TUNE_WINDOW_ON = 1 };

/* The built-in database (generated from tuning/ JSON files by scripts/gen_tuning_db.py). */
extern const tune_entry clnsa_tuning_db[];
extern const size_t clnsa_tuning_db_count;

/* The vendor's name in tuning files: "nvidia", "amd", "intel", "pocl", "mesa", "other". */
const char *tune_vendor_key(clnsa_vendor v);
/* Does the entry apply to this device (vendor, architecture and device
 * name equal or wildcards)? */
bool tune_entry_applies(const tune_entry *e, const clnsa_device_info *info);

/* A parsed tuning file (what the user file and `clnsa tune` hold). */
typedef struct tune_file {
    char *path;
    size_t count;
    tune_entry *entries; /* strings owned by the file */
    char **strings;
    size_t nstrings;
} tune_file;

/* Loads a tuning file ({"clnsa_tuning": 1, "entries": [...]}); entries of
 * unknown families or parameters are an error, so a typo is not silently
 * ignored. */
clnsa_status tune_file_load(const char *path, tune_file **out, char *msg, size_t msg_size);
void tune_file_free(tune_file *f);

/* ------------------------------------------------------- the tuner's hook */

/* While set on a thread (tune_hook_set), calls on `ctx` from that thread use
 * `v` for `family` (validated like any candidate; -1 = none), build only
 * (build_only: programs are built and kernels made, nothing is enqueued),
 * and keep the events of the kernels named in `capture` (a comma-separated
 * list, as tune_family.kernel, or "*"; retained: the tuner releases them);
 * family -1 forces nothing. Thread-local: a background thread building candidates
 * and the timing thread each set their own. */
typedef struct {
    const clnsa_context *ctx;
    int family;
    int v[TUNE_MAX_PARAMS];
    bool build_only;
    const char *capture; /* "*": every kernel (clnsa bench --profile) */
    cl_event events[PLAN_MAX_STEPS];
    const char *event_kernels[PLAN_MAX_STEPS]; /* the kernel of each event */
    int nevents;
} tune_hook;

void tune_hook_set(tune_hook *h); /* NULL clears this thread's hook */
/* This thread's hook when it applies to ctx, else NULL. */
tune_hook *tune_hook_get(const clnsa_context *ctx);

/* --------------------------------------------- what the NSA kernels take */

/* attn_tile.h kernels: WG work-items, GT query heads and TK keys per tile. */
typedef struct {
    size_t wg;
    int gt, tk;
    size_t local_bytes;
} attn_params;

/* The per-query kernels differ in what they keep in local memory. */
typedef enum { ATTN_FWD, ATTN_BWD_PRE, ATTN_DQ } attn_kind;

clnsa_status tune_nsa_attn(clnsa_context *ctx, const tune_problem *pb, attn_kind kind, attn_params *p);

/* nsa_bwd_dkdv.cl: TKK keys per work-group, RQ query rows per chunk. */
typedef struct {
    size_t wg;
    int tkk, rq;
    size_t local_bytes;
} dkdv_params;

clnsa_status tune_nsa_dkdv(clnsa_context *ctx, const tune_problem *pb, dkdv_params *p);

/* nsa_topk.cl: as above plus JB selection blocks per chunk and PC_MAX, the
 * compressed keys a chunk can overlap. */
typedef struct {
    size_t wg;
    int gt, tk, jb;
    int64_t pc_max;
    size_t local_bytes;
} topk_params;

clnsa_status tune_nsa_topk(clnsa_context *ctx, const tune_problem *pb, topk_params *p);

/* The row strides (elements) of the warp kernels' staged key and value
 * tiles (KROW, VROW) for elements of elem_bytes (2, or 4 in the TF32 mode):
 * rows placed against local-memory bank conflicts; both_ways: each tile is
 * read both as products' B operand and as accumulations' (the backward),
 * unpadded rows then being swizzled. */
void tune_warp_rows(int dk, int dv, int elem_bytes, bool both_ways, int *krow, int *vrow);

/* Rows per staged chunk of blocksparse_bwd_warp.cl (its KC): dk/dv 16 (its
 * registers), dq 32 where the tiles' wg/2 tokens hold that many, else 16. */
int tune_bs_bwd_warp_kc(size_t wg, bool dkdv);

/* blocksparse_fwd.cl / blocksparse_bwd.cl: WG work-items, tiles of BQ query
 * rows by BK keys (the warp forward: BQ = 16 * WG / 32; the warp backward:
 * BQ = BK = 16 * WG / 32). */
typedef struct {
    size_t wg;
    int bq, bk;
    size_t local_bytes;
} bs_tile_params;

/* family: TF_BS_FWD, TF_BS_BWD, TF_BS_FWD_WARP or TF_BS_BWD_WARP; pb: D, DV, G, dtype (block 0),
 * warp_emulated. */
clnsa_status tune_blocksparse(clnsa_context *ctx, int family, const tune_problem *pb, bs_tile_params *p);
/* The warp kernels (warp_attn.h): WG = 32 * warps per work-group, KC keys
 * per chunk, and for the top-k JB selection blocks per chunk and PC_MAX. */
typedef struct {
    size_t wg;
    int kc, jb;
    int64_t pc_max;
    size_t local_bytes;
} warp_params;

/* family: one of the TF_NSA_*_WARP. */
clnsa_status tune_nsa_warp(clnsa_context *ctx, int family, const tune_problem *pb, warp_params *p);

/* Work-items of the small layout / mask kernels. */
size_t tune_blocksparse_aux_wg(const clnsa_device_info *info);

#endif
