/* npy_file.c: see npy_file.h. */
#include "npy_file.h"

#include "cli_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int npy_file_fail(const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", path);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

int npy_file_open(const char *dir, const char *name, bool required, npy_file *f)
{
    struct stat sb;
    memset(&f->a, 0, sizeof f->a);
    cli_path(dir, name, f->path, sizeof f->path);
    if (stat(f->path, &sb) != 0) {
        if (errno == ENOENT && !required) return 0;
        return npy_file_fail(f->path, "%s", errno == ENOENT ? "required file is missing" : strerror(errno));
    }
    char err[512];
    if (npy_load(f->path, &f->a, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 1;
}

int npy_file_check_shape(const npy_file *f, int rank, const int64_t *want, const char *names)
{
    bool ok = f->a.ndim == rank;
    for (int i = 0; ok && i < rank; ++i) ok = want[i] < 0 || f->a.shape[i] == want[i];
    if (ok) return 0;
    char got[128], exp[128] = "[";
    cli_shape_str(f->a.ndim, f->a.shape, got, sizeof got);
    if (f->a.ndim != rank) return npy_file_fail(f->path, "expected %d dims %s, got %d: %s", rank, names, f->a.ndim, got);
    for (int i = 0; i < rank; ++i) {
        size_t n = strlen(exp);
        if (want[i] < 0) snprintf(exp + n, sizeof exp - n, "%s*", i ? ", " : "");
        else snprintf(exp + n, sizeof exp - n, "%s%lld", i ? ", " : "", (long long)want[i]);
    }
    strncat(exp, "]", sizeof exp - strlen(exp) - 1);
    return npy_file_fail(f->path, "expected shape %s = %s, got %s", names, exp, got);
}
