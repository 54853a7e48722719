/* bench_clblast.h: `clnsa bench`'s dense baseline on CLBlast's GEMMs
 * (bench_clblast.c). */
#ifndef CLNSA_BENCH_CLBLAST_H
#define CLNSA_BENCH_CLBLAST_H

#include "cli_common.h"

#include <stdbool.h>

/* Whether the f32 score buffer (a chunk of rows x T) fits the device's
 * largest allocation. */
bool clblast_dense_fits(const cli_env *env, int T);
/* The median of `repeat` forwards after a warm-up (ms of device time; -1 on
 * failure), on fresh f32 [T, HQ, D] / [T, H, D] inputs, causal, GQA. */
double clblast_dense_forward_ms(const cli_env *env, int T, int HQ, int H, int D, int repeat);

#endif
