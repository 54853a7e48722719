/*
 * npy.h - minimal, robust reader/writer for NumPy .npy files (host-side
 * utility of clnsa used by the command-line tool, tests and benchmarks; not
 * part of the public library API).
 *
 * Supported: format versions 1.0, 2.0 and 3.0 (3.0 = 2.0 with a UTF-8
 * header), C-order arrays of the little-endian dtypes
 *     '<f4' float32, '<f2' float16, '<f8' float64,
 *     '<i4' int32,   '<i8' int64,   '|u1' uint8 (also '<u1', '>u1', '=u1'),
 * with 0 to NPY_MAX_DIMS dimensions. A shape of () is a scalar (ndim 0,
 * one element); dimensions of size 0 are allowed (no elements).
 *
 * The header is parsed as the Python dict literal NumPy writes: keys
 * 'descr', 'fortran_order' and 'shape' in any order, single or double quotes,
 * arbitrary whitespace, optional trailing commas, Python-2 style 'L' suffixes
 * on dimensions. Other or duplicate keys, Fortran order, big-endian or other
 * dtypes, more than NPY_MAX_DIMS dimensions, negative dimensions, sizes whose
 * byte count overflows int64/size_t, headers larger than NPY_MAX_HEADER_LEN,
 * and data that is shorter or longer than the shape needs are rejected.
 * The parser never reads outside the given buffer (it is fuzzed).
 *
 * Array data is kept as raw little-endian bytes in C order (that is the
 * native layout on every supported host); the npy_to_* conversions decode
 * explicitly and work on any host.
 *
 * Error reporting: every int-returning function returns 0 on success and -1
 * on error. On error a one-line, NUL-terminated message naming the problem is
 * written to err (truncated to errlen bytes; err may be NULL or errlen 0), e.g.
 *   "q.npy: unsupported dtype '>f4' (expected little-endian <f4, <f2, <f8,
 *    <i4, <i8 or |u1)"
 * Messages of npy_load and npy_save start with "<path>: ". Messages contain
 * a stable keyword: "bad magic", "truncated", "version", "Fortran order",
 * "unsupported dtype", "too many dimensions", "negative dimension",
 * "overflow", "trailing", "malformed header", "missing key", ...
 */
#ifndef CLNSA_UTIL_NPY_H
#define CLNSA_UTIL_NPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { NPY_F32, NPY_F16, NPY_F64, NPY_I32, NPY_I64, NPY_U8 } npy_dtype;

#define NPY_MAX_DIMS 8
/* Largest accepted header (dict text plus padding) in bytes. */
#define NPY_MAX_HEADER_LEN (1u << 20)

typedef struct {
  npy_dtype dtype;
  int ndim;                      /* 0 .. NPY_MAX_DIMS; 0 = scalar */
  int64_t shape[NPY_MAX_DIMS];   /* entries >= ndim are 0 */
  void *data;        /* C order, little-endian, malloc'ed, owned; never NULL
                        after a successful parse/load, even with 0 elements */
} npy_array;

/* Parse a complete .npy image of len bytes from memory into *out (data is
 * copied). On error *out is zeroed (npy_free on it is a no-op). */
int npy_parse(const void *buf, size_t len, npy_array *out, char *err, size_t errlen);

/* Read the .npy file at path into *out. On error *out is zeroed and the
 * message starts with "<path>: ". */
int npy_load(const char *path, npy_array *out, char *err, size_t errlen);

/* Write a version 1.0 .npy file: header padded with spaces and '\n' so that
 * the data starts at a multiple of 64 bytes. data holds numel elements of
 * dt in C order, little-endian (may be NULL when numel is 0); shape may be
 * NULL when ndim is 0. The file is written to "<path>.tmp.<pid>" and then
 * renamed to path, so readers never see a partial file. */
int npy_save(const char *path, npy_dtype dt, int ndim, const int64_t *shape,
             const void *data, char *err, size_t errlen);

/* Free a->data and zero *a. Safe on NULL, on a zeroed or an already freed
 * array. */
void npy_free(npy_array *a);

/* Number of elements: product of the shape (1 for ndim 0, 0 if any
 * dimension is 0). Returns 0 for NULL, -1 for an invalid ndim/shape or if the
 * product overflows int64. */
int64_t npy_numel(const npy_array *a);

/* Bytes per element (4, 2, 8, 4, 8, 1); 0 for an invalid dtype. */
size_t npy_dtype_size(npy_dtype dt);

/* "float32", "float16", "float64", "int32", "int64", "uint8";
 * "invalid" for an invalid dtype. */
const char *npy_dtype_name(npy_dtype dt);

/* Converted copies of all npy_numel(a) elements (malloc'ed, at least one
 * byte, caller frees with free()). *out is set to NULL on error.
 * npy_to_f64 / npy_to_f32: any dtype converts; integers become the nearest
 *   float (exact where representable), float64 -> float32 rounds to nearest
 *   even (overflowing to +-inf), float16 is widened exactly.
 * npy_to_i32: integer dtypes only (float input is rejected); int64 values
 *   outside the int32 range are rejected, naming the first offending index. */
int npy_to_f64(const npy_array *a, double **out, char *err, size_t errlen);
int npy_to_f32(const npy_array *a, float **out, char *err, size_t errlen);
int npy_to_i32(const npy_array *a, int32_t **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* CLNSA_UTIL_NPY_H */
