/* bench_util.c: see bench_util.h. */
#include "bench_util.h"

#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, size_t n)
{
    if (n == 0) return -1.0;
    qsort(v, n, sizeof *v, cmp_double);
    return v[n / 2];
}

double bench_span_ms(cl_event start, cl_event end)
{
    cl_ulong a = 0, b = 0;
    clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_END, sizeof a, &a, NULL);
    clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
    return (double)(b - a) * 1e-6;
}

int bench_parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}
