/* bench_clblast.h: `clnsa bench`'s dense baseline on CLBlast's GEMMs
 * (bench_clblast.c). */
#ifndef CLNSA_BENCH_CLBLAST_H
#define CLNSA_BENCH_CLBLAST_H

#include "cli_common.h"

#include <stdbool.h>

/* Whether the f32 score buffer (a chunk of rows x T) fits the device's
 * largest allocation. */
bool clblast_dense_fits(const cli_env *env, int T);
/* The medians of `repeat` forwards and, when bwd_ms is not NULL, backwards
 * (recomputing P; dk and dv zeroed in the pass) after a warm-up, in ms of
 * device time, on fresh f32 [T, HQ, D] / [T, H, D] inputs, causal, GQA,
 * each checked against the host; 0, or -1 (and -1 times) on failure. */
int clblast_dense_ms(const cli_env *env, int T, int HQ, int H, int D, int repeat, double *fwd_ms, double *bwd_ms);

#endif
