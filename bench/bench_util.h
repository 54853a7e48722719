/* bench_util.h: what the benchmarks share: medians, OpenCL event spans and
 * option lists. */
#ifndef CLNSA_BENCH_UTIL_H
#define CLNSA_BENCH_UTIL_H

#include "clnsa.h"

#include <stddef.h>

/* Median of n values (sorts them in place). */
double bench_median(double *v, size_t n);
/* Milliseconds from the end of `start` (a marker enqueued just before an op)
 * to the end of `end` (the op's last command; an op may enqueue several). */
double bench_span_ms(cl_event start, cl_event end);
/* "4096,8192" -> {4096, 8192}; returns the count (at most max). */
int bench_parse_list(const char *s, int *out, int max);

#endif
