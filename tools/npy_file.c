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

int npy_file_floats(npy_file *f, float **out)
{
    char err[512];
    if (f->a.dtype != NPY_F32 && f->a.dtype != NPY_F16 && f->a.dtype != NPY_F64)
        return npy_file_fail(f->path, "expected a float array (float16, float32 or float64), got %s", npy_dtype_name(f->a.dtype));
    if (npy_to_f32(&f->a, out, err, sizeof err)) return npy_file_fail(f->path, "%s", err);
    return 0;
}

int npy_file_ints(npy_file *f, int32_t **out)
{
    char err[512];
    if (f->a.dtype != NPY_I32 && f->a.dtype != NPY_I64 && f->a.dtype != NPY_U8)
        return npy_file_fail(f->path, "expected an integer array (int32, int64 or uint8), got %s", npy_dtype_name(f->a.dtype));
    if (npy_to_i32(&f->a, out, err, sizeof err)) return npy_file_fail(f->path, "%s", err);
    return 0;
}

/* Opens, checks and converts dir/name: to floats where `floats`, else ints. */
static int load_converted(const char *dir, const char *name, bool required, int rank, const int64_t *want,
                          const char *names, float **floats, int32_t **ints)
{
    npy_file f;
    int rc = npy_file_open(dir, name, required, &f);
    if (rc > 0)
        rc = npy_file_check_shape(&f, rank, want, names) || (floats ? npy_file_floats(&f, floats) : npy_file_ints(&f, ints))
                 ? -1
                 : 1;
    npy_free(&f.a);
    return rc;
}

int npy_file_load_floats(const char *dir, const char *name, bool required, int rank, const int64_t *want,
                         const char *names, float **out)
{
    return load_converted(dir, name, required, rank, want, names, out, NULL);
}

int npy_file_load_ints(const char *dir, const char *name, bool required, int rank, const int64_t *want,
                       const char *names, int32_t **out)
{
    return load_converted(dir, name, required, rank, want, names, NULL, out);
}

int npy_file_check_head_dim(const npy_file *f, int dim, const char *what)
{
    const int64_t d = f->a.shape[dim];
    if (d < 8 || d > 256 || d % 8)
        return npy_file_fail(f->path, "%s = %lld: expected a multiple of 8 in 8..256", what, (long long)d);
    return 0;
}
