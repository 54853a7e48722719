/* npy.c - .npy reader/writer, see npy.h. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include "npy.h"
#include "fp16.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <process.h>
#define npy_getpid_() ((long)_getpid())
#define npy_fseek_(f, o, w) _fseeki64((f), (o), (w))
#define npy_ftell_(f) ((int64_t)_ftelli64(f))
#else
#include <sys/types.h>
#include <unistd.h>
#define npy_getpid_() ((long)getpid())
#define npy_fseek_(f, o, w) fseeko((f), (off_t)(o), (w))
#define npy_ftell_(f) ((int64_t)ftello(f))
#endif

#define NPY_MAGIC_LEN 6
static const unsigned char npy_magic_[NPY_MAGIC_LEN] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

#define NPY_DTYPE_ERR_TAIL "(expected little-endian <f4, <f2, <f8, <i4, <i8 or |u1)"

/* ------------------------------------------------------------------------ */
/* error messages                                                           */

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 4, 5)))
#endif
static void set_err(char *err, size_t errlen, const char *prefix, const char *fmt, ...) {
  size_t off = 0;
  va_list ap;
  if (!err || errlen == 0) return;
  err[0] = '\0';
  if (prefix) {
    int n = snprintf(err, errlen, "%s: ", prefix);
    if (n < 0) n = 0;
    off = (size_t)n < errlen ? (size_t)n : errlen - 1;
  }
  va_start(ap, fmt);
  vsnprintf(err + off, errlen - off, fmt, ap);
  va_end(ap);
  /* Keep it one line even if the path contains control characters. */
  for (char *p = err; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
}

/* Printable, bounded copy of untrusted header text for messages. */
static void sanitize(char *dst, size_t dstlen, const unsigned char *s, size_t n) {
  size_t j = 0;
  const size_t maxshow = 32;
  for (size_t i = 0; i < n && i < maxshow && j + 1 < dstlen; i++)
    dst[j++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
  if (n > maxshow && j + 4 < dstlen) {
    memcpy(dst + j, "...", 3);
    j += 3;
  }
  dst[j] = '\0';
}

/* ------------------------------------------------------------------------ */
/* dtypes                                                                   */

size_t npy_dtype_size(npy_dtype dt) {
  switch (dt) {
  case NPY_F32: return 4;
  case NPY_F16: return 2;
  case NPY_F64: return 8;
  case NPY_I32: return 4;
  case NPY_I64: return 8;
  case NPY_U8: return 1;
  }
  return 0;
}

const char *npy_dtype_name(npy_dtype dt) {
  switch (dt) {
  case NPY_F32: return "float32";
  case NPY_F16: return "float16";
  case NPY_F64: return "float64";
  case NPY_I32: return "int32";
  case NPY_I64: return "int64";
  case NPY_U8: return "uint8";
  }
  return "invalid";
}

static const char *dtype_descr(npy_dtype dt) {
  switch (dt) {
  case NPY_F32: return "<f4";
  case NPY_F16: return "<f2";
  case NPY_F64: return "<f8";
  case NPY_I32: return "<i4";
  case NPY_I64: return "<i8";
  case NPY_U8: return "|u1";
  }
  return NULL;
}

static int descr_lookup(const unsigned char *s, size_t n, npy_dtype *dt) {
  static const struct { const char *d; npy_dtype t; } tab[] = {
    {"<f4", NPY_F32}, {"<f2", NPY_F16}, {"<f8", NPY_F64}, {"<i4", NPY_I32},
    {"<i8", NPY_I64}, {"|u1", NPY_U8},  {"<u1", NPY_U8},  {">u1", NPY_U8},
    {"=u1", NPY_U8},
  };
  if (n != 3) return -1;
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (memcmp(s, tab[i].d, 3) == 0) {
      *dt = tab[i].t;
      return 0;
    }
  return -1;
}

/* numel and byte count of a shape; -1 on a negative dimension or overflow
 * (the product of the non-zero dimensions times the item size must fit in
 * both int64 and size_t, as NumPy requires). */
static int shape_size(int ndim, const int64_t *shape, size_t itemsize, int64_t *numel,
                      size_t *nbytes) {
  uint64_t prod = 1;
  int zero = 0;
  const uint64_t lim = (uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX
                                                                : (uint64_t)SIZE_MAX;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] == 0) {
      zero = 1;
      continue;
    }
    if (prod > lim / (uint64_t)shape[i]) return -1;
    prod *= (uint64_t)shape[i];
  }
  if (itemsize && prod > lim / itemsize) return -1;
  if (zero) prod = 0;
  *numel = (int64_t)prod;
  *nbytes = (size_t)(prod * itemsize);
  return 0;
}

int64_t npy_numel(const npy_array *a) {
  int64_t n;
  size_t nb;
  if (!a) return 0;
  if (a->ndim < 0 || a->ndim > NPY_MAX_DIMS) return -1;
  if (shape_size(a->ndim, a->shape, 1, &n, &nb) != 0) return -1;
  return n;
}

void npy_free(npy_array *a) {
  if (!a) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------------------ */
/* header parsing                                                           */

typedef struct {
  npy_dtype dtype;
  int ndim;
  int64_t shape[NPY_MAX_DIMS];
  int64_t numel;
  size_t nbytes;
} npy_info;

/* Checks the magic string and version of the first len bytes (len may be
 * short). On success *hstart is the offset of the header text (10 or 12) and
 * *hlen its length. */
static int parse_preamble(const unsigned char *b, size_t len, size_t *hstart, size_t *hlen,
                          const char *pfx, char *err, size_t errlen) {
  size_t m = len < NPY_MAGIC_LEN ? len : NPY_MAGIC_LEN;
  if (memcmp(b, npy_magic_, m) != 0) {
    set_err(err, errlen, pfx, "not a .npy file (bad magic string)");
    return -1;
  }
  if (len < 8) {
    set_err(err, errlen, pfx, "truncated file: %zu bytes, too short for a .npy preamble", len);
    return -1;
  }
  if (b[6] == 1 && b[7] == 0) {
    if (len < 10) {
      set_err(err, errlen, pfx, "truncated file: %zu bytes, too short for a .npy preamble",
              len);
      return -1;
    }
    *hstart = 10;
    *hlen = (size_t)b[8] | ((size_t)b[9] << 8);
  } else if ((b[6] == 2 || b[6] == 3) && b[7] == 0) {
    if (len < 12) {
      set_err(err, errlen, pfx, "truncated file: %zu bytes, too short for a .npy preamble",
              len);
      return -1;
    }
    *hstart = 12;
    *hlen = (size_t)b[8] | ((size_t)b[9] << 8) | ((size_t)b[10] << 16) |
            ((size_t)b[11] << 24);
  } else {
    set_err(err, errlen, pfx,
            "unsupported .npy format version %u.%u (expected 1.0, 2.0 or 3.0)",
            (unsigned)b[6], (unsigned)b[7]);
    return -1;
  }
  if (*hlen > NPY_MAX_HEADER_LEN) {
    set_err(err, errlen, pfx, "header too large (%zu bytes, limit %u)", *hlen,
            (unsigned)NPY_MAX_HEADER_LEN);
    return -1;
  }
  return 0;
}

typedef struct {
  const unsigned char *p, *end;
} cursor;

static int cur_peek(const cursor *c) { return c->p < c->end ? *c->p : -1; }

static void cur_ws(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r' ||
                           *c->p == '\f' || *c->p == '\v'))
    c->p++;
}

static int is_ident_char(int ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '_';
}

/* Python string literal without escapes: '...' or "...", optional u prefix. */
static int cur_string(cursor *c, const unsigned char **s, size_t *n) {
  int q;
  if (cur_peek(c) == 'u' && c->p + 1 < c->end && (c->p[1] == '\'' || c->p[1] == '"')) c->p++;
  q = cur_peek(c);
  if (q != '\'' && q != '"') return -1;
  c->p++;
  *s = c->p;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || *c->p == '\n') return -1;
    c->p++;
  }
  if (c->p >= c->end) return -1;
  *n = (size_t)(c->p - *s);
  c->p++;
  return 0;
}

static int cur_word(cursor *c, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return 0;
  if (c->p + n < c->end && is_ident_char(c->p[n])) return 0;
  c->p += n;
  return 1;
}

/* Integer literal: optional sign, decimal digits, optional L suffix.
 * Returns 0 ok, -1 syntax error, -2 magnitude above INT64_MAX. */
static int cur_int(cursor *c, int64_t *v, int *neg) {
  uint64_t acc = 0;
  int ovf = 0, nd = 0;
  *neg = 0;
  if (cur_peek(c) == '-' || cur_peek(c) == '+') {
    *neg = cur_peek(c) == '-';
    c->p++;
    cur_ws(c);
  }
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    unsigned d = (unsigned)(*c->p - '0');
    if (acc > ((uint64_t)INT64_MAX - d) / 10) ovf = 1;
    else acc = acc * 10 + d;
    c->p++;
    nd++;
  }
  if (nd == 0) return -1;
  if (cur_peek(c) == 'L' || cur_peek(c) == 'l') c->p++;
  if (is_ident_char(cur_peek(c))) return -1;
  if (ovf) return -2;
  *v = (int64_t)acc;
  return 0;
}

static int parse_shape(cursor *c, npy_info *info, const char *pfx, char *err, size_t errlen) {
  int count = 0;
  if (cur_peek(c) != '(') {
    set_err(err, errlen, pfx, "malformed header: 'shape' must be a tuple such as (2, 3)");
    return -1;
  }
  c->p++;
  cur_ws(c);
  if (cur_peek(c) == ')') {
    c->p++;
    info->ndim = 0;
    return 0;
  }
  for (;;) {
    int64_t v = 0;
    int neg = 0;
    int r = cur_int(c, &v, &neg);
    if (r == -1) {
      set_err(err, errlen, pfx, "malformed header: bad integer in 'shape'");
      return -1;
    }
    if (r == -2) {
      set_err(err, errlen, pfx, "dimension %d of shape is too large (overflow)", count);
      return -1;
    }
    if (neg && v != 0) {
      set_err(err, errlen, pfx, "negative dimension -%lld in shape", (long long)v);
      return -1;
    }
    if (count < NPY_MAX_DIMS) info->shape[count] = v;
    if (count < INT_MAX) count++;
    cur_ws(c);
    if (cur_peek(c) == ',') {
      c->p++;
      cur_ws(c);
      if (cur_peek(c) == ')') {
        c->p++;
        break;
      }
    } else if (cur_peek(c) == ')') {
      if (count == 1) {
        set_err(err, errlen, pfx,
                "malformed header: 'shape' must be a tuple (a 1-d shape is written (n,))");
        return -1;
      }
      c->p++;
      break;
    } else {
      set_err(err, errlen, pfx, "malformed header: expected ',' or ')' in 'shape'");
      return -1;
    }
  }
  if (count > NPY_MAX_DIMS) {
    set_err(err, errlen, pfx, "too many dimensions (%d > %d)", count, NPY_MAX_DIMS);
    return -1;
  }
  info->ndim = count;
  return 0;
}

/* Parses the header dict text and computes the data size. */
static int parse_header(const unsigned char *h, size_t n, npy_info *info, const char *pfx,
                        char *err, size_t errlen) {
  cursor c = {h, h + n};
  int have_descr = 0, have_fortran = 0, have_shape = 0;
  char shown[48];

  memset(info, 0, sizeof *info);
  cur_ws(&c);
  if (cur_peek(&c) != '{') {
    set_err(err, errlen, pfx, "malformed header: expected a '{' dictionary");
    return -1;
  }
  c.p++;
  cur_ws(&c);
  while (cur_peek(&c) != '}') {
    const unsigned char *key;
    size_t klen;
    if (cur_string(&c, &key, &klen) != 0) {
      set_err(err, errlen, pfx, "malformed header: expected a quoted key or '}'");
      return -1;
    }
    cur_ws(&c);
    if (cur_peek(&c) != ':') {
      set_err(err, errlen, pfx, "malformed header: expected ':' after a key");
      return -1;
    }
    c.p++;
    cur_ws(&c);
    if (klen == 5 && memcmp(key, "descr", 5) == 0) {
      const unsigned char *s;
      size_t sl;
      if (have_descr++) {
        set_err(err, errlen, pfx, "malformed header: duplicate key 'descr'");
        return -1;
      }
      if (cur_peek(&c) == '[') {
        set_err(err, errlen, pfx, "unsupported dtype: structured dtype " NPY_DTYPE_ERR_TAIL);
        return -1;
      }
      if (cur_string(&c, &s, &sl) != 0) {
        set_err(err, errlen, pfx, "malformed header: 'descr' must be a quoted string");
        return -1;
      }
      if (descr_lookup(s, sl, &info->dtype) != 0) {
        sanitize(shown, sizeof shown, s, sl);
        set_err(err, errlen, pfx, "unsupported dtype '%s' " NPY_DTYPE_ERR_TAIL, shown);
        return -1;
      }
    } else if (klen == 13 && memcmp(key, "fortran_order", 13) == 0) {
      if (have_fortran++) {
        set_err(err, errlen, pfx, "malformed header: duplicate key 'fortran_order'");
        return -1;
      }
      if (cur_word(&c, "True")) {
        set_err(err, errlen, pfx, "Fortran order not supported (fortran_order is True)");
        return -1;
      }
      if (!cur_word(&c, "False")) {
        set_err(err, errlen, pfx, "malformed header: 'fortran_order' must be True or False");
        return -1;
      }
    } else if (klen == 5 && memcmp(key, "shape", 5) == 0) {
      if (have_shape++) {
        set_err(err, errlen, pfx, "malformed header: duplicate key 'shape'");
        return -1;
      }
      if (parse_shape(&c, info, pfx, err, errlen) != 0) return -1;
    } else {
      sanitize(shown, sizeof shown, key, klen);
      set_err(err, errlen, pfx, "malformed header: unexpected key '%s'", shown);
      return -1;
    }
    cur_ws(&c);
    if (cur_peek(&c) == ',') {
      c.p++;
      cur_ws(&c);
    } else if (cur_peek(&c) != '}') {
      set_err(err, errlen, pfx, "malformed header: expected ',' or '}' after a value");
      return -1;
    }
  }
  c.p++; /* '}' */
  cur_ws(&c);
  if (c.p != c.end) {
    set_err(err, errlen, pfx, "malformed header: unexpected characters after the dictionary");
    return -1;
  }
  if (!have_descr || !have_fortran || !have_shape) {
    set_err(err, errlen, pfx, "malformed header: missing key '%s'",
            !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    return -1;
  }
  if (shape_size(info->ndim, info->shape, npy_dtype_size(info->dtype), &info->numel,
                 &info->nbytes) != 0) {
    set_err(err, errlen, pfx, "element count overflow: shape too large for %s data",
            npy_dtype_name(info->dtype));
    return -1;
  }
  return 0;
}

static int fill_out(npy_array *out, const npy_info *info, const char *pfx, char *err,
                    size_t errlen) {
  out->data = malloc(info->nbytes ? info->nbytes : 1);
  if (!out->data) {
    set_err(err, errlen, pfx, "out of memory allocating %zu bytes", info->nbytes);
    return -1;
  }
  out->dtype = info->dtype;
  out->ndim = info->ndim;
  memcpy(out->shape, info->shape, sizeof out->shape);
  return 0;
}

int npy_parse(const void *buf, size_t len, npy_array *out, char *err, size_t errlen) {
  const unsigned char *b = (const unsigned char *)buf;
  size_t hstart = 0, hlen = 0, avail;
  npy_info info;

  if (err && errlen) err[0] = '\0';
  if (!out) {
    set_err(err, errlen, NULL, "invalid argument (out is NULL)");
    return -1;
  }
  memset(out, 0, sizeof *out);
  if (!b && len) {
    set_err(err, errlen, NULL, "invalid argument (buffer is NULL)");
    return -1;
  }
  if (!b) b = npy_magic_; /* len == 0: reports a truncated file */
  if (parse_preamble(b, len, &hstart, &hlen, NULL, err, errlen) != 0) return -1;
  if (hlen > len - hstart) {
    set_err(err, errlen, NULL, "truncated header: %zu of %zu header bytes present",
            len - hstart, hlen);
    return -1;
  }
  if (parse_header(b + hstart, hlen, &info, NULL, err, errlen) != 0) return -1;
  avail = len - hstart - hlen;
  if (avail < info.nbytes) {
    set_err(err, errlen, NULL,
            "truncated data: shape needs %zu bytes of %s, only %zu present", info.nbytes,
            npy_dtype_name(info.dtype), avail);
    return -1;
  }
  if (avail > info.nbytes) {
    set_err(err, errlen, NULL, "trailing data: %zu extra byte(s) after the array data",
            avail - info.nbytes);
    return -1;
  }
  if (fill_out(out, &info, NULL, err, errlen) != 0) return -1;
  if (info.nbytes) memcpy(out->data, b + hstart + hlen, info.nbytes);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* file I/O                                                                 */

int npy_load(const char *path, npy_array *out, char *err, size_t errlen) {
  unsigned char pre[12];
  unsigned char *hdr = NULL;
  size_t n, hstart = 0, hlen = 0, got;
  npy_info info;
  FILE *f;
  int64_t pos, end;

  if (err && errlen) err[0] = '\0';
  if (!path) {
    if (out) memset(out, 0, sizeof *out);
    set_err(err, errlen, NULL, "invalid argument (path is NULL)");
    return -1;
  }
  if (!out) {
    set_err(err, errlen, path, "invalid argument (out is NULL)");
    return -1;
  }
  memset(out, 0, sizeof *out);
  f = fopen(path, "rb");
  if (!f) {
    set_err(err, errlen, path, "cannot open for reading: %s", strerror(errno));
    return -1;
  }
  n = fread(pre, 1, 10, f);
  if (n == 10 && (pre[6] == 2 || pre[6] == 3)) n += fread(pre + 10, 1, 2, f);
  if (ferror(f)) {
    set_err(err, errlen, path, "read error: %s", strerror(errno));
    goto fail;
  }
  if (parse_preamble(pre, n, &hstart, &hlen, path, err, errlen) != 0) goto fail;
  hdr = malloc(hlen ? hlen : 1);
  if (!hdr) {
    set_err(err, errlen, path, "out of memory");
    goto fail;
  }
  got = fread(hdr, 1, hlen, f);
  if (got != hlen) {
    if (ferror(f)) set_err(err, errlen, path, "read error: %s", strerror(errno));
    else set_err(err, errlen, path, "truncated header: %zu of %zu header bytes present", got,
                 hlen);
    goto fail;
  }
  if (parse_header(hdr, hlen, &info, path, err, errlen) != 0) goto fail;
  free(hdr);
  hdr = NULL;

  /* Check the size before allocating, where the file is seekable. */
  pos = npy_ftell_(f);
  if (pos >= 0 && npy_fseek_(f, 0, SEEK_END) == 0 && (end = npy_ftell_(f)) >= pos &&
      npy_fseek_(f, pos, SEEK_SET) == 0) {
    uint64_t avail = (uint64_t)(end - pos);
    if (avail < (uint64_t)info.nbytes) {
      set_err(err, errlen, path,
              "truncated data: shape needs %zu bytes of %s, only %llu present", info.nbytes,
              npy_dtype_name(info.dtype), (unsigned long long)avail);
      goto fail;
    }
    if (avail > (uint64_t)info.nbytes) {
      set_err(err, errlen, path, "trailing data: %llu extra byte(s) after the array data",
              (unsigned long long)(avail - (uint64_t)info.nbytes));
      goto fail;
    }
  }
  clearerr(f);
  if (fill_out(out, &info, path, err, errlen) != 0) goto fail;
  got = fread(out->data, 1, info.nbytes, f);
  if (got != info.nbytes) {
    if (ferror(f)) set_err(err, errlen, path, "read error: %s", strerror(errno));
    else set_err(err, errlen, path,
                 "truncated data: shape needs %zu bytes of %s, only %zu present",
                 info.nbytes, npy_dtype_name(info.dtype), got);
    goto fail;
  }
  if (fgetc(f) != EOF) {
    set_err(err, errlen, path, "trailing data after the array data");
    goto fail;
  }
  if (ferror(f)) {
    set_err(err, errlen, path, "read error: %s", strerror(errno));
    goto fail;
  }
  fclose(f);
  return 0;

fail:
  free(hdr);
  npy_free(out);
  fclose(f);
  return -1;
}

int npy_save(const char *path, npy_dtype dt, int ndim, const int64_t *shape, const void *data,
             char *err, size_t errlen) {
  char hdr[512];
  size_t hl, total, pad, nbytes = 0, tmplen;
  int64_t numel = 0;
  const char *descr = dtype_descr(dt);
  char *tmp = NULL;
  FILE *f = NULL;
  unsigned char pre[10];
  int n;

  if (err && errlen) err[0] = '\0';
  if (!path) {
    set_err(err, errlen, NULL, "invalid argument (path is NULL)");
    return -1;
  }
  if (!descr) {
    set_err(err, errlen, path, "invalid dtype %d", (int)dt);
    return -1;
  }
  if (ndim < 0 || ndim > NPY_MAX_DIMS) {
    set_err(err, errlen, path, "invalid ndim %d (expected 0 to %d)", ndim, NPY_MAX_DIMS);
    return -1;
  }
  if (ndim > 0 && !shape) {
    set_err(err, errlen, path, "invalid argument (shape is NULL)");
    return -1;
  }
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) {
      set_err(err, errlen, path, "negative dimension %lld in shape", (long long)shape[i]);
      return -1;
    }
  if (shape_size(ndim, shape, npy_dtype_size(dt), &numel, &nbytes) != 0) {
    set_err(err, errlen, path, "element count overflow: shape too large");
    return -1;
  }
  if (nbytes && !data) {
    set_err(err, errlen, path, "invalid argument (data is NULL)");
    return -1;
  }

  n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < ndim && n > 0 && (size_t)n < sizeof hdr; i++)
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s%lld", i ? ", " : "",
                  (long long)shape[i]);
  if (n > 0 && (size_t)n < sizeof hdr)
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s), }", ndim == 1 ? "," : "");
  if (n <= 0 || (size_t)n >= sizeof hdr - 64) { /* cannot happen: <= ~250 bytes */
    set_err(err, errlen, path, "internal error formatting the header");
    return -1;
  }
  hl = (size_t)n;
  total = sizeof pre + hl + 1; /* + '\n' */
  pad = (64 - total % 64) % 64;
  memset(hdr + hl, ' ', pad);
  hl += pad;
  hdr[hl++] = '\n';

  memcpy(pre, npy_magic_, NPY_MAGIC_LEN);
  pre[6] = 1;
  pre[7] = 0;
  pre[8] = (unsigned char)(hl & 0xff);
  pre[9] = (unsigned char)(hl >> 8);

  tmplen = strlen(path) + 32;
  tmp = malloc(tmplen);
  if (!tmp) {
    set_err(err, errlen, path, "out of memory");
    return -1;
  }
  snprintf(tmp, tmplen, "%s.tmp.%ld", path, npy_getpid_());
  f = fopen(tmp, "wb");
  if (!f) {
    set_err(err, errlen, path, "cannot open '%s' for writing: %s", tmp, strerror(errno));
    free(tmp);
    return -1;
  }
  if (fwrite(pre, 1, sizeof pre, f) != sizeof pre || fwrite(hdr, 1, hl, f) != hl ||
      (nbytes && fwrite(data, 1, nbytes, f) != nbytes) || fflush(f) != 0) {
    set_err(err, errlen, path, "write error on '%s': %s", tmp, strerror(errno));
    fclose(f);
    remove(tmp);
    free(tmp);
    return -1;
  }
  if (fclose(f) != 0) {
    set_err(err, errlen, path, "write error on '%s': %s", tmp, strerror(errno));
    remove(tmp);
    free(tmp);
    return -1;
  }
#ifdef _WIN32
  remove(path); /* rename() does not replace on Windows */
#endif
  if (rename(tmp, path) != 0) {
    set_err(err, errlen, path, "cannot rename '%s' to the destination: %s", tmp,
            strerror(errno));
    remove(tmp);
    free(tmp);
    return -1;
  }
  free(tmp);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* conversions                                                              */

static inline uint16_t ld16(const unsigned char *p) {
  return (uint16_t)((unsigned)p[0] | ((unsigned)p[1] << 8));
}
static inline uint32_t ld32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
         ((uint32_t)p[3] << 24);
}
static inline uint64_t ld64(const unsigned char *p) {
  return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32);
}
static inline float ldf32(const unsigned char *p) {
  uint32_t u = ld32(p);
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline double ldf64(const unsigned char *p) {
  uint64_t u = ld64(p);
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}
static inline int32_t ldi32(const unsigned char *p) {
  uint32_t u = ld32(p);
  int32_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}
static inline int64_t ldi64(const unsigned char *p) {
  uint64_t u = ld64(p);
  int64_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* Validates a and allocates numel * elsize bytes into *out. */
static int conv_prep(const npy_array *a, size_t elsize, void **out, size_t *count, char *err,
                     size_t errlen) {
  int64_t numel;
  *out = NULL;
  if (err && errlen) err[0] = '\0';
  if (!a) {
    set_err(err, errlen, NULL, "invalid argument (array is NULL)");
    return -1;
  }
  if (npy_dtype_size(a->dtype) == 0) {
    set_err(err, errlen, NULL, "invalid dtype %d", (int)a->dtype);
    return -1;
  }
  numel = npy_numel(a);
  if (numel < 0) {
    set_err(err, errlen, NULL, "invalid array shape");
    return -1;
  }
  if ((uint64_t)numel > SIZE_MAX / elsize || (uint64_t)numel > SIZE_MAX / 8) {
    set_err(err, errlen, NULL, "element count overflow");
    return -1;
  }
  if (numel > 0 && !a->data) {
    set_err(err, errlen, NULL, "invalid argument (array data is NULL)");
    return -1;
  }
  *out = malloc(numel ? (size_t)numel * elsize : 1);
  if (!*out) {
    set_err(err, errlen, NULL, "out of memory");
    return -1;
  }
  *count = (size_t)numel;
  return 0;
}

int npy_to_f64(const npy_array *a, double **out, char *err, size_t errlen) {
  void *o;
  size_t n;
  if (!out) {
    set_err(err, errlen, NULL, "invalid argument (out is NULL)");
    return -1;
  }
  if (conv_prep(a, sizeof(double), &o, &n, err, errlen) != 0) {
    *out = NULL;
    return -1;
  }
  double *d = o;
  const unsigned char *s = a->data;
  switch (a->dtype) {
  case NPY_F32: for (size_t i = 0; i < n; i++) d[i] = (double)ldf32(s + 4 * i); break;
  case NPY_F16: for (size_t i = 0; i < n; i++) d[i] = (double)fp16_to_f32(ld16(s + 2 * i)); break;
  case NPY_F64: for (size_t i = 0; i < n; i++) d[i] = ldf64(s + 8 * i); break;
  case NPY_I32: for (size_t i = 0; i < n; i++) d[i] = (double)ldi32(s + 4 * i); break;
  case NPY_I64: for (size_t i = 0; i < n; i++) d[i] = (double)ldi64(s + 8 * i); break;
  case NPY_U8: for (size_t i = 0; i < n; i++) d[i] = (double)s[i]; break;
  }
  *out = d;
  return 0;
}

/* double -> float, round to nearest even, overflow to +-inf without relying
 * on out-of-range conversion behaviour. */
static inline float f64_to_f32(double x) {
  if (fabs(x) >= 0x1.ffffffp127) return x > 0 ? HUGE_VALF : -HUGE_VALF;
  return (float)x;
}

int npy_to_f32(const npy_array *a, float **out, char *err, size_t errlen) {
  void *o;
  size_t n;
  if (!out) {
    set_err(err, errlen, NULL, "invalid argument (out is NULL)");
    return -1;
  }
  if (conv_prep(a, sizeof(float), &o, &n, err, errlen) != 0) {
    *out = NULL;
    return -1;
  }
  float *d = o;
  const unsigned char *s = a->data;
  switch (a->dtype) {
  case NPY_F32: for (size_t i = 0; i < n; i++) d[i] = ldf32(s + 4 * i); break;
  case NPY_F16: for (size_t i = 0; i < n; i++) d[i] = fp16_to_f32(ld16(s + 2 * i)); break;
  case NPY_F64: for (size_t i = 0; i < n; i++) d[i] = f64_to_f32(ldf64(s + 8 * i)); break;
  case NPY_I32: for (size_t i = 0; i < n; i++) d[i] = (float)ldi32(s + 4 * i); break;
  case NPY_I64: for (size_t i = 0; i < n; i++) d[i] = (float)ldi64(s + 8 * i); break;
  case NPY_U8: for (size_t i = 0; i < n; i++) d[i] = (float)s[i]; break;
  }
  *out = d;
  return 0;
}

int npy_to_i32(const npy_array *a, int32_t **out, char *err, size_t errlen) {
  void *o;
  size_t n;
  if (!out) {
    set_err(err, errlen, NULL, "invalid argument (out is NULL)");
    return -1;
  }
  *out = NULL;
  if (a && (a->dtype == NPY_F32 || a->dtype == NPY_F16 || a->dtype == NPY_F64)) {
    set_err(err, errlen, NULL, "cannot convert %s to int32: float input not accepted",
            npy_dtype_name(a->dtype));
    return -1;
  }
  if (conv_prep(a, sizeof(int32_t), &o, &n, err, errlen) != 0) return -1;
  int32_t *d = o;
  const unsigned char *s = a->data;
  switch (a->dtype) {
  case NPY_I32: for (size_t i = 0; i < n; i++) d[i] = ldi32(s + 4 * i); break;
  case NPY_I64:
    for (size_t i = 0; i < n; i++) {
      int64_t v = ldi64(s + 8 * i);
      if (v < INT32_MIN || v > INT32_MAX) {
        set_err(err, errlen, NULL,
                "int64 value %lld at index %zu is out of int32 range", (long long)v, i);
        free(d);
        return -1;
      }
      d[i] = (int32_t)v;
    }
    break;
  case NPY_U8: for (size_t i = 0; i < n; i++) d[i] = (int32_t)s[i]; break;
  default: break; /* floats rejected above */
  }
  *out = d;
  return 0;
}
