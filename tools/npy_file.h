/* npy_file.h: the tool's input files: loading an optional or required .npy
 * from a folder and checking its shape, with one-line errors naming the file. */
#ifndef CLNSA_TOOLS_NPY_FILE_H
#define CLNSA_TOOLS_NPY_FILE_H

#include "npy.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char path[4096];
    npy_array a;
} npy_file;

/* Prints "path: message" on stderr; returns -1. */
int npy_file_fail(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1: loaded, 0: absent (and not required), -1: error (printed). */
int npy_file_open(const char *dir, const char *name, bool required, npy_file *f);
/* 0 when the array has `rank` dims matching `want` (< 0 = any extent), else
 * -1 with a message; `names` describes the dims, e.g. "[B, T, HQ, DK]". */
int npy_file_check_shape(const npy_file *f, int rank, const int64_t *want, const char *names);

/* 0 when dim `dim` (a head dim, named `what`) is a multiple of 8 in 8..256,
 * the library's range, else -1 with a message. */
int npy_file_check_head_dim(const npy_file *f, int dim, const char *what);
/* The array as float32 (from float16, float32 or float64) or int32 (from
 * int32, int64 or uint8) host values, malloc'ed; 0, or -1 with a message
 * naming the file and the dtype it holds. */
int npy_file_floats(npy_file *f, float **out);
int npy_file_ints(npy_file *f, int32_t **out);
/* Opens dir/name (required or optional), checks its shape as
 * npy_file_check_shape and converts it: 1 loaded, 0 absent, -1 error. */
int npy_file_load_floats(const char *dir, const char *name, bool required, int rank, const int64_t *want,
                         const char *names, float **out);
int npy_file_load_ints(const char *dir, const char *name, bool required, int rank, const int64_t *want,
                       const char *names, int32_t **out);

#endif
